"""The run store's argument and lease rules: ``LeaseRules``, one suite of the contract.

:class:`redisstore.conformance.RunStoreConformance` puts it together with the others.

A backend whose clock the test controls overrides :meth:`RunStoreConformance.advance` and
sets ``clock_is_controlled = True``; the suite then checks exact boundaries (a lease whose
expiry equals now is expired). On a real clock it sleeps instead and checks the same rules
with margins. Needs pytest (the ``test`` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ..errors import AlreadyExists, Conflict, LeaseRefused, NotFound
from ..runs import (
    MAX_CLAIM_BYTES,
    MAX_RENEW,
    At,
    Changed,
    Claim,
    Claimed,
    Free,
    Held,
    Hold,
    Holder,
    Poll,
    Release,
    Seize,
)
from .base import ACCEPTS, LONG, ME, OTHER, STATES, RunSuite, lease_of


class LeaseRules(RunSuite):
    """The argument rules of docs/runs.md: records, revisions, leases, renew, claim_expired."""

    # ------------------------------------------------------------------ get / now

    def test_now_is_backend_ms(self) -> None:
        store = self.make_store()
        first = store.now()
        assert isinstance(first, int) and not isinstance(first, bool)
        assert first > 1_500_000_000_000  # UTC Unix ms, not seconds
        self.advance(store, 5)
        second = store.now()
        if self.clock_is_controlled:
            assert second == first + 5
        else:
            assert second >= first + 5

    def test_get_absent_is_not_found(self) -> None:
        store = self.make_store()
        with pytest.raises(NotFound):
            store.get("absent")

    # ------------------------------------------------------------------ get_many

    def test_get_many_answers_get_for_each_run_that_exists_in_the_given_order(self) -> None:
        store = self.make_store()
        for run, state in (("c", "free"), ("a", "mine live"), ("b", "theirs live")):
            self.given(store, run, state, record=run.encode() * 3)
        store.compare_and_set("a", 1, b"aa", Hold(ME))
        many = store.get_many(["b", "absent", "a", "c", "b"])
        assert list(many) == ["b", "a", "c"]  # the given order; absent left out; b once
        assert many == {run: store.get(run) for run in ("b", "a", "c")}
        assert many["a"].revision == 2 and many["a"].record == b"aa"
        assert many["b"].holder == Held(OTHER, True) and many["c"].holder == Free()

    def test_get_many_of_no_runs_or_only_absent_ones_is_empty(self) -> None:
        store = self.make_store()
        assert store.get_many([]) == {}
        assert store.get_many(iter(["x", "y"])) == {}

    def test_get_many_refuses_bad_arguments_before_reading(self) -> None:
        store = self.make_store()
        with pytest.raises(TypeError):
            store.get_many("run")  # a str is one value, not runs
        with pytest.raises(ValueError):
            store.get_many(["ok", ""])
        with pytest.raises(ValueError, match="cap"):
            store.get_many([f"r{i}" for i in range(MAX_RENEW + 1)])

    def test_get_many_reads_as_many_runs_as_the_cap(self) -> None:
        store = self.make_store()
        runs = [f"r{i}" for i in range(MAX_RENEW)]
        for run in runs[::3]:
            store.insert(run, run.encode(), Release())
        many = store.get_many(runs)
        assert list(many) == runs[::3]
        assert all(current.record == run.encode() for run, current in many.items())

    def test_get_many_reads_every_record_however_much_they_weigh(self) -> None:
        # Past MAX_CLAIM_BYTES (2 MiB) of records a Redis store reads the rest in further
        # calls: the answer is the same.
        store = self.make_store()
        size = 1 << 20  # the default max_record_bytes
        runs = [f"big-{i}" for i in range(MAX_CLAIM_BYTES // size + 2)]
        for i, run in enumerate(runs):
            store.insert(run, bytes([i]) * size, Release())
        many = store.get_many(runs)
        assert list(many) == runs
        assert all(many[run].record == bytes([i]) * size for i, run in enumerate(runs))

    # ------------------------------------------------------------------ insert

    @pytest.mark.parametrize("kind", ["hold", "claim", "seize", "release"])
    def test_insert_creates_revision_one(self, kind: str) -> None:
        store = self.make_store()
        assert store.insert("run", b"first", lease_of(kind, ME, LONG)) == 1
        current = store.get("run")
        assert current.revision == 1
        assert current.record == b"first"
        expected: Holder = Held(ME, True) if kind in ("claim", "seize") else Free()
        assert current.holder == expected
        assert current.claim is None

    @pytest.mark.parametrize("state", STATES)
    def test_insert_existing_is_refused_and_writes_nothing(self, state: str) -> None:
        store = self.make_store()
        self.given(store, "run", state)
        if state.endswith("expired"):
            self.expire(store)
        before = store.get("run")
        with pytest.raises(AlreadyExists):
            store.insert("run", b"second", Seize(ME, LONG))
        assert store.get("run") == before

    def test_insert_lease_lasts_ttl(self) -> None:
        store = self.make_store()
        store.insert("run", b"r", Claim(ME, self.short_ttl))
        assert self.held(store, "run") == Held(ME, True)
        self.expire(store)
        assert self.held(store, "run") == Held(ME, False)

    # ------------------------------------------------------------------ compare_and_set

    def test_compare_and_set_absent_is_not_found(self) -> None:
        store = self.make_store()
        with pytest.raises(NotFound):
            store.compare_and_set("absent", 1, b"r", Seize(ME, LONG))
        with pytest.raises(NotFound):
            store.get("absent")

    @pytest.mark.parametrize("expected", [0, 2, 3, 100])
    def test_compare_and_set_stale_revision_conflicts(self, expected: int) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, LONG))
        before = store.get("run")
        with pytest.raises(Conflict) as caught:
            store.compare_and_set("run", expected, b"r2", Seize(ME, LONG))
        assert caught.value.current == 1
        assert store.get("run") == before

    def test_compare_and_set_checks_revision_beforelease_of(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(OTHER, LONG))
        with pytest.raises(Conflict):
            store.compare_and_set("run", 5, b"r2", Hold(ME))

    def test_revisions_advance_by_one(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, LONG))
        for revision in range(1, 6):
            store.compare_and_set("run", revision, b"r%d" % (revision + 1), Hold(ME))
            current = store.get("run")
            assert (current.revision, current.record) == (revision + 1, b"r%d" % (revision + 1))

    @pytest.mark.parametrize("state", STATES)
    @pytest.mark.parametrize("kind", ["hold", "claim", "seize", "release"])
    def test_lease_condition(self, kind: str, state: str) -> None:
        store = self.make_store()
        self.given(store, "run", state)
        if state.endswith("expired"):
            self.expire(store)
        before = store.get("run")
        lease = lease_of(kind, ME, LONG)
        if not ACCEPTS[(kind, state)]:
            with pytest.raises(LeaseRefused) as caught:
                store.compare_and_set("run", 1, b"r2", lease)
            assert caught.value.holder == before.holder
            assert store.get("run") == before
            return
        store.compare_and_set("run", 1, b"r2", lease)
        after = store.get("run")
        assert (after.revision, after.record) == (2, b"r2")
        if kind == "hold":
            assert after.holder == before.holder  # the lease is left as it is
        elif kind == "release":
            assert after.holder == Free()
        else:
            assert after.holder == Held(ME, True)

    def test_hold_does_not_extend_thelease_of(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, self.short_ttl))
        store.compare_and_set("run", 1, b"r2", Hold(ME))
        self.expire(store)
        assert self.held(store, "run") == Held(ME, False)
        store.compare_and_set("run", 2, b"r3", Hold(ME))  # still mine, expired
        assert self.held(store, "run") == Held(ME, False)

    @pytest.mark.parametrize("kind", ["claim", "seize"])
    def test_claim_and_seize_hold_for_ttl_from_now(self, kind: str) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(OTHER, self.short_ttl))
        self.expire(store)
        store.compare_and_set("run", 1, b"r2", lease_of(kind, ME, self.short_ttl))
        assert self.held(store, "run") == Held(ME, True)
        self.expire(store)
        assert self.held(store, "run") == Held(ME, False)

    def test_release_then_claim_by_another(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, LONG))
        store.compare_and_set("run", 1, b"r2", Release())
        store.compare_and_set("run", 2, b"r3", Claim(OTHER, LONG))
        assert self.held(store, "run") == Held(OTHER, True)
        with pytest.raises(LeaseRefused) as caught:
            store.compare_and_set("run", 3, b"r4", Hold(ME))
        assert caught.value.holder == Held(OTHER, True)

    def test_expiry_boundary(self) -> None:
        """A lease is live while expiry > now; at now == expiry it is expired."""
        store = self.make_store()
        ttl = 1_000 if self.clock_is_controlled else self.short_ttl
        store.insert("run", b"r1", Claim(ME, ttl))
        if self.clock_is_controlled:
            self.advance(store, ttl - 1)
            assert self.held(store, "run") == Held(ME, True)
            assert store.renew(ME, ["run"], ttl) == ["run"]  # expiry is now + ttl again
            self.advance(store, ttl - 1)
            assert self.held(store, "run") == Held(ME, True)
            assert store.claim_expired(OTHER, LONG, 10) == []
            self.advance(store, 1)  # now == expiry
        else:
            assert self.held(store, "run") == Held(ME, True)
            self.expire(store)
        assert self.held(store, "run") == Held(ME, False)
        assert store.renew(ME, ["run"], LONG) == []
        with pytest.raises(LeaseRefused):
            store.compare_and_set("run", 1, b"r2", Hold(OTHER))
        store.compare_and_set("run", 1, b"r2", Claim(OTHER, LONG))
        assert self.held(store, "run") == Held(OTHER, True)

    # ------------------------------------------------------------------ renew

    def test_renew_extends_only_live_leases_of_owner(self) -> None:
        store = self.make_store()
        store.insert("mine-live", b"r", Claim(ME, LONG))
        store.insert("mine-short", b"r", Claim(ME, self.short_ttl))
        store.insert("other-live", b"r", Claim(OTHER, LONG))
        store.insert("free", b"r", Release())
        self.expire(store)
        store.insert("mine-late", b"r", Claim(ME, LONG))
        before = {run: store.get(run) for run in
                  ("mine-live", "mine-short", "other-live", "free", "mine-late")}
        runs = ["mine-late", "absent", "mine-short", "other-live", "free", "mine-live",
                "mine-late"]
        assert store.renew(ME, runs, LONG) == ["mine-late", "mine-live"]
        for run, current in before.items():
            assert store.get(run) == current  # no revision, record or holder changes
        assert self.held(store, "mine-short") == Held(ME, False)

    def test_renew_moves_expiry_to_ttl_from_now(self) -> None:
        store = self.make_store()
        store.insert("run", b"r", Claim(ME, self.short_ttl))
        # On a real server short_ttl passes on the server's clock, and a loaded machine may
        # let it pass between the two calls: then the renew rightly refused an expired
        # lease, and the run is claimed short again (a few tries, not a longer ttl: the
        # renew must be seen to lengthen a lease that would have expired).
        for revision in range(1, 6):
            if store.renew(ME, ["run"], LONG) == ["run"]:
                break
            assert self.held(store, "run") == Held(ME, False)
            store.compare_and_set("run", revision, b"r", Claim(ME, self.short_ttl))
        else:
            raise AssertionError("renew refused a live lease five times")
        self.expire(store)
        assert self.held(store, "run") == Held(ME, True)
        assert store.renew(ME, ["run"], self.short_ttl) == ["run"]  # may shorten, too
        self.expire(store)
        assert self.held(store, "run") == Held(ME, False)

    def test_renew_never_revives_an_expiredlease_of(self) -> None:
        store = self.make_store()
        store.insert("run", b"r", Claim(ME, self.short_ttl))
        self.expire(store)
        assert store.renew(ME, ["run"], LONG) == []
        assert self.held(store, "run") == Held(ME, False)
        # After a handoff the old owner's late renewal changes nothing either.
        assert store.claim_expired(OTHER, LONG, 1) == ["run"]
        assert store.renew(ME, ["run"], LONG) == []
        assert self.held(store, "run") == Held(OTHER, True)

    def test_renew_of_nothing(self) -> None:
        store = self.make_store()
        assert store.renew(ME, [], LONG) == []
        assert store.renew(ME, iter(()), LONG) == []
        assert store.renew(ME, ["absent"], LONG) == []

    # ------------------------------------------------------------------ claim_expired

    def test_claim_expired_takes_held_expired_only(self) -> None:
        store = self.make_store()
        for run, state in [("free", "free"), ("live", "other-live"), ("e1", "other-expired"),
                           ("e2", "mine-expired")]:
            self.given(store, run, state)
        self.expire(store)
        claimed = store.claim_expired(ME, LONG, 10)
        assert sorted(claimed) == ["e1", "e2"]
        for run in claimed:
            current = store.get(run)
            assert (current.revision, current.holder) == (1, Held(ME, True))
        assert self.held(store, "free") == Free()
        assert self.held(store, "live") == Held(OTHER, True)
        assert store.claim_expired(OTHER, LONG, 10) == []  # never the same run twice

    def test_claim_expired_oldest_first_and_bounded(self) -> None:
        store = self.make_store()
        for i in range(5):
            store.insert(f"run-{i}", b"r", Claim(OTHER, self.short_ttl))
            self.advance(store, 3)
        self.expire(store)
        assert store.claim_expired(ME, LONG, 2) == ["run-0", "run-1"]
        assert store.claim_expired(ME, LONG, 2) == ["run-2", "run-3"]
        assert store.claim_expired(ME, LONG, 2) == ["run-4"]
        assert store.claim_expired(ME, LONG, 2) == []

    def test_claim_expired_changes_no_revision_or_record(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(OTHER, LONG))
        store.compare_and_set("run", 1, b"r2", Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_expired(ME, LONG, 1) == ["run"]
        current = store.get("run")
        assert (current.revision, current.record, current.holder) == (2, b"r2", Held(ME, True))
        store.compare_and_set("run", 2, b"r3", Hold(ME))  # the claimer can write on

    def test_claim_expired_limit_zero(self) -> None:
        store = self.make_store()
        self.given(store, "run", "other-expired")
        self.expire(store)
        assert store.claim_expired(ME, LONG, 0) == []
        assert self.held(store, "run") == Held(OTHER, False)

    def test_claim_expired_lease_lasts_ttl(self) -> None:
        store = self.make_store()
        self.given(store, "run", "other-expired")
        self.expire(store)
        assert store.claim_expired(ME, self.short_ttl, 1) == ["run"]
        assert self.held(store, "run") == Held(ME, True)
        self.expire(store)
        assert store.claim_expired(OTHER, LONG, 1) == ["run"]

    # ------------------------------------------------------------------ claims with records

    def test_claim_expired_with_records_hands_back_each_run_as_stored(self) -> None:
        store = self.make_store()
        store.insert("a", b"record-a", Claim(OTHER, self.short_ttl))
        store.insert("b", b"\x00b", Claim(OTHER, self.short_ttl))
        store.compare_and_set("b", 1, b"record-b2", Hold(OTHER))
        store.insert("live", b"live", Claim(OTHER, LONG))
        self.expire(store)
        claimed = store.claim_expired(ME, LONG, 10, records=True)
        assert sorted(c.run for c in claimed) == ["a", "b"]
        for c in claimed:
            assert isinstance(c, Claimed)
            assert c.current == store.get(c.run)  # exactly what a get says after the claim
            assert c.current.holder == Held(ME, True)
        by_run = {c.run: c.current for c in claimed}
        assert (by_run["a"].revision, by_run["a"].record) == (1, b"record-a")
        assert (by_run["b"].revision, by_run["b"].record) == (2, b"record-b2")
        assert store.claim_expired(OTHER, LONG, 10, records=True) == []
        assert store.claim_expired(OTHER, LONG, 10) == []  # without records: ids, as ever

    def test_a_claim_with_records_stops_before_passing_its_byte_budget(self) -> None:
        # MAX_CLAIM_BYTES (2 MiB) of records at most; the run that would pass it waits for
        # the next claim. (One family: in a store of partitions, one partition's claim; a
        # claim over several shares the budget and each partition's hands back one run at
        # least.)
        store = self.make_store()
        size = 1 << 20  # the default max_record_bytes
        fits = MAX_CLAIM_BYTES // size
        for i in range(fits + 1):
            store.insert(f"{{b}}run-{i}", bytes([i]) * size, Claim(OTHER, self.short_ttl))
            self.advance(store, 2)
        self.expire(store)
        first = store.claim_expired(ME, LONG, 10, records=True)
        assert [c.run for c in first] == [f"{{b}}run-{i}" for i in range(fits)]
        assert all(c.current.record == bytes([i]) * size for i, c in enumerate(first))
        rest = store.claim_expired(ME, LONG, 10, records=True)
        assert [(c.run, c.current.record) for c in rest] == [
            (f"{{b}}run-{fits}", bytes([fits]) * size)]
        assert self.held(store, f"{{b}}run-{fits}") == Held(ME, True)

    # ------------------------------------------------------------------ records

    @pytest.mark.parametrize("record", [
        b"", b"\x00", b"a\x00b\x00", bytes(range(256)), b"\xff" * 3, "é✓".encode(),
    ])
    def test_records_are_binary_safe(self, record: bytes) -> None:
        store = self.make_store()
        store.insert("run", record, Claim(ME, LONG))
        assert store.get("run").record == record
        store.compare_and_set("run", 1, record + b"\x00", Hold(ME))
        assert store.get("run").record == record + b"\x00"

    def test_one_mebibyte_record(self) -> None:
        store = self.make_store()
        record = bytes(range(256)) * 4096
        store.insert("run", record, Release())
        assert store.get("run").record == record

    def test_run_ids_are_any_text(self) -> None:
        store = self.make_store()
        for run in ["a:b:c", "{braces}", "ünï cödé", " spaced ", "r" * 300]:
            store.insert(run, run.encode(), Claim(ME, LONG))
            assert store.get(run).record == run.encode()
            assert store.renew(ME, [run], LONG) == [run]

    # ------------------------------------------------------------------ bad input

    @pytest.mark.parametrize("call", [
        lambda s: s.insert("", b"r", Release()),
        lambda s: s.insert(None, b"r", Release()),
        lambda s: s.insert("run", "text", Release()),
        lambda s: s.insert("run", bytearray(b"r"), Release()),
        lambda s: s.insert("run", b"r", None),
        lambda s: s.insert("run", b"r", "claim"),
        lambda s: s.insert("run", b"r", Claim),
        lambda s: s.compare_and_set("run", -1, b"r", Release()),
        lambda s: s.compare_and_set("run", "1", b"r", Release()),
        lambda s: s.compare_and_set("run", 1, "text", Release()),
        lambda s: s.compare_and_set("", 1, b"r", Release()),
        lambda s: s.renew("", ["run"], 10),
        lambda s: s.renew("me", ["run"], 0),
        lambda s: s.renew("me", ["run"], -5),
        lambda s: s.renew("me", "run", 10),
        lambda s: s.renew("me", [""], 10),
        lambda s: s.claim_expired("me", 10, -1),
        lambda s: s.claim_expired("me", 0, 1),
        lambda s: s.claim_expired("", 10, 1),
        lambda s: s.claim_expired("me", 10, 1.5),
        lambda s: s.claim_ready("me", 10, -1),
        lambda s: s.claim_ready("me", -1, 1),
        lambda s: s.claim_expired("me", 10, 1, records=1),
        lambda s: s.claim_expired("me", 10, 1, records="yes"),
        lambda s: s.claim_ready("me", 10, 1, records=None),
        lambda s: s.get(""),
        lambda s: s.refresh(""),
    ])
    def test_bad_arguments_raise_and_write_nothing(self, call: Callable[[Any], Any]) -> None:
        store = self.make_store()
        store.insert("other", b"keep", Claim(OTHER, self.short_ttl))
        self.expire(store)
        before = store.get("other")
        with pytest.raises((ValueError, TypeError)):
            call(store)
        with pytest.raises(NotFound):
            store.get("run")
        assert store.get("other") == before

    @pytest.mark.parametrize("make", [
        lambda: Claim("", 10), lambda: Claim("me", 0), lambda: Seize("me", -1),
        lambda: Hold(""), lambda: Claim("me", True), lambda: Claim("me", 1.0),  # type: ignore[arg-type]
        lambda: Poll("k", 0), lambda: Changed(""), lambda: At(-1),
    ])
    def test_bad_values_are_refused_where_made(self, make: Callable[[], Any]) -> None:
        with pytest.raises((ValueError, TypeError)):
            make()

