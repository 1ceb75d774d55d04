"""The end of a lease and of a run, as docs/runs.md gives them: ``release`` (give a lease up
without a write), ``delete`` (with its revision fence against ABA) and poison runs
(``Current.takeovers``, ``claim_expired(..., max_takeovers=N)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ..discovery import json_wait
from ..errors import Conflict, LeaseRefused, NotFound
from ..runs import (
    MAX_RENEW,
    Claim,
    Free,
    Held,
    Hold,
    Quarantined,
    Release,
    RunStore,
    Seize,
    confirm_write,
)
from .base import ACCEPTS, LONG, ME, OTHER, STATES, RunSuite, lease_of, rec

THIRD = "node-c"


class LifecycleRules(RunSuite):
    """release, delete and poison runs."""

    def _states(self, store: RunStore) -> list[str]:
        """One run per holder state, named for it, the short leases expired."""
        for state in STATES:
            self.given(store, state, state)
        self.expire(store)
        return list(STATES)

    # ------------------------------------------------------------------ release

    def test_release_frees_the_owners_leases_live_or_expired(self) -> None:
        store = self.make_store()
        runs = self._states(store)
        before = {run: store.get(run) for run in runs}
        assert store.release(ME, reversed(runs)) == ["mine-expired", "mine-live"]
        for run in runs:
            after = store.get(run)
            assert (after.revision, after.record) == (before[run].revision, before[run].record)
            if run.startswith("mine"):
                assert after.holder == Free()
            else:
                assert after == before[run]

    def test_a_released_lease_is_gone_for_its_owner(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, LONG))
        assert store.release(ME, ["run"]) == ["run"]
        assert store.release(ME, ["run"]) == []  # nothing left to give up
        assert store.renew(ME, ["run"], LONG) == []
        with pytest.raises(LeaseRefused) as refused:
            store.compare_and_set("run", 1, b"r2", Hold(ME))
        assert refused.value.holder == Free()
        store.compare_and_set("run", 1, b"r2", Claim(OTHER, LONG))  # anyone may claim it
        assert self.held(store, "run") == Held(OTHER, True)

    def test_release_of_nothing(self) -> None:
        store = self.make_store()
        assert store.release(ME, []) == []
        assert store.release(ME, iter(())) == []
        assert store.release(ME, ["absent", "absent"]) == []

    def test_release_drops_claim_info_and_makes_a_due_run_claimable(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("run", rec({"at": 0}), Release())
        assert store.claim_ready(ME, LONG, 1) == ["run"]
        assert store.get("run").claim is not None
        assert store.claim_ready(OTHER, LONG, 1) == []  # held
        assert store.release(ME, ["run"]) == ["run"]
        current = store.get("run")
        assert (current.revision, current.holder, current.claim) == (1, Free(), None)
        assert store.claim_ready(OTHER, LONG, 1) == ["run"]  # due at once, no write

    def test_a_released_waiter_stays_waiting_for_its_dependency(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("{run}dep", rec(None), Release())
        store.insert("run", rec({"changed": "{run}dep", "seen": 1}), Claim(ME, LONG))
        assert store.release(ME, ["run"]) == ["run"]
        assert store.claim_ready(OTHER, LONG, 1) == []  # its dependency has not changed
        store.compare_and_set("{run}dep", 1, rec(None, v=2), Release())
        assert store.claim_ready(OTHER, LONG, 1) == ["run"]

    # ------------------------------------------------------------------ delete

    def test_delete_removes_the_run(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, LONG))
        store.compare_and_set("run", 1, b"r2", Hold(ME))
        store.delete("run", 2, Hold(ME))
        with pytest.raises(NotFound):
            store.get("run")
        with pytest.raises(NotFound):
            store.delete("run", 2, Release())
        assert store.renew(ME, ["run"], LONG) == []
        assert store.release(ME, ["run"]) == []

    def test_delete_checks_the_revision_first_and_writes_nothing_when_refused(self) -> None:
        store = self.make_store()
        with pytest.raises(NotFound):
            store.delete("absent", 1, Release())
        store.insert("run", b"r1", Claim(OTHER, LONG))
        before = store.get("run")
        with pytest.raises(Conflict) as conflict:
            store.delete("run", 2, Hold(ME))  # both wrong: the revision is reported
        assert conflict.value.current == 1
        assert store.get("run") == before

    @pytest.mark.parametrize("kind", ["hold", "claim", "seize", "release"])
    @pytest.mark.parametrize("state", STATES)
    def test_delete_lease_condition(self, kind: str, state: str) -> None:
        store = self.make_store()
        self.given(store, "run", state)
        if state.endswith("expired"):
            self.expire(store)
        before = store.get("run")
        if ACCEPTS[(kind, state)]:
            store.delete("run", 1, lease_of(kind, ME, LONG))
            with pytest.raises(NotFound):
                store.get("run")
        else:
            with pytest.raises(LeaseRefused) as refused:
                store.delete("run", 1, lease_of(kind, ME, LONG))
            assert refused.value.holder == before.holder
            assert store.get("run") == before

    def test_a_run_inserted_again_never_reuses_a_revision(self) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Release())
        store.compare_and_set("run", 1, b"r2", Release())
        store.compare_and_set("run", 2, b"r3", Release())
        stale = store.get("run").revision  # a zombie read revision 3 ...
        store.delete("run", 3, Release())
        assert store.insert("run", b"new", Release()) == 4  # ... the id comes back above it
        assert store.get("run").revision == 4
        # So does every insert after it (of its partition, in a store of partitions: one
        # family is always one partition).
        assert store.insert("{run}other", b"o1", Release()) == 4
        assert store.get("{run}other").revision == 4
        assert confirm_write(store, "{run}other", None, b"o1")  # an insert's, whatever revision
        with pytest.raises(Conflict):
            store.compare_and_set("run", stale, b"zombie", Seize(ME, LONG))
        assert store.get("run").record == b"new"
        store.delete("{run}other", 4, Release())
        store.delete("run", 4, Release())
        store.insert("run", b"again", Release())
        assert store.get("run").revision == 5

    def test_deleted_runs_leave_the_indexes(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("held", rec(None), Claim(OTHER, self.short_ttl))
        store.insert("ready", rec({"at": 0}), Release())
        store.insert("{waiting}dep", rec(None), Release())
        store.insert("waiting", rec({"changed": "{waiting}dep", "seen": 1}), Release())
        self.expire(store)
        store.delete("held", 1, Release())
        store.delete("ready", 1, Release())
        store.delete("waiting", 1, Release())
        store.compare_and_set("{waiting}dep", 1, rec(None, v=2), Release())
        assert store.claim_expired(ME, LONG, 10) == []
        assert store.claim_ready(ME, LONG, 10) == []
        assert store.quarantined() == []

    # The dependency in the waiter's family, and in another (another partition, in a
    # store of partitions).
    @pytest.mark.parametrize("dep", ["{run}dep", "dep"])
    def test_deleting_a_dependency_wakes_its_waiters(self, dep: str) -> None:
        store = self.make_store(discover=json_wait)
        store.insert(dep, rec(None), Release())
        store.insert("run", rec({"changed": dep, "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 1) == []
        store.delete(dep, 1, Release())
        assert store.claim_ready(ME, LONG, 1) == ["run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == (dep, 0)
        store.compare_and_set("run", 1, rec({"changed": dep, "seen": 0}), Release())
        store.insert(dep, rec(None), Release())  # back, above its old revision
        assert store.claim_ready(ME, LONG, 1) == ["run"]

    # ------------------------------------------------------------------ poison runs

    def _taken_over(self, store: RunStore, run: str, owners: list[str]) -> None:
        """Insert ``run`` held by owners[0], then let each next owner take it over."""
        store.insert(run, b"r1", Claim(owners[0], self.short_ttl))
        for owner in owners[1:]:
            self.expire(store)
            assert store.claim_expired(owner, self.short_ttl, 10) == [run]

    def test_takeovers_count_handoffs_after_expiry_until_a_finishing_write(self) -> None:
        store = self.make_store()
        self._taken_over(store, "run", [OTHER, ME, ME, THIRD])
        assert store.get("run").takeovers == 2  # ME reclaiming its own lease is not one
        store.renew(THIRD, ["run"], LONG)
        assert store.get("run").takeovers == 2
        # A checkpoint keeps the count (a run that checkpoints, then crashes, is still
        # counted toward max_takeovers); a write that ends or takes the lease starts it again.
        store.compare_and_set("run", 1, b"r2", Hold(THIRD))
        assert store.get("run").takeovers == 2
        store.compare_and_set("run", 2, b"r3", Release())
        assert store.get("run").takeovers == 0

    @pytest.mark.parametrize("bound", [0, 2])
    def test_max_takeovers_quarantines_a_poison_run(self, bound: int) -> None:
        store = self.make_store()
        owners = [ME, OTHER] * 2
        self._taken_over(store, "poison", owners[:bound + 1])
        holder = owners[bound]
        claimer = THIRD
        store.insert("healthy", b"h1", Claim(claimer, self.short_ttl))  # its own: no takeover
        self.expire(store)
        assert store.claim_expired(claimer, LONG, 10, max_takeovers=bound) == ["healthy"]
        assert store.quarantined() == [Quarantined("poison", "poison", f"takeovers={bound}")]
        current = store.get("poison")
        assert (current.holder, current.takeovers, current.record) == (
            Held(holder, False), bound, b"r1")
        assert store.claim_expired(claimer, LONG, 10) == []  # out of every claim
        # Not even its holder's claims hand it out.
        assert store.claim_expired(holder, LONG, 10, max_takeovers=bound) == []
        # Put back by a write: in the claims again, counted from 0.
        store.compare_and_set("poison", 1, b"fixed", Claim(claimer, self.short_ttl))
        assert store.quarantined() == []
        assert store.get("poison").takeovers == 0
        self.expire(store)
        assert store.claim_expired(ME, LONG, 10, max_takeovers=bound + 1) == ["poison"]

    def test_a_poison_run_put_back_by_release(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("poison", rec({"at": 0}), Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_expired(ME, LONG, 10, max_takeovers=0) == []
        assert [q.index for q in store.quarantined()] == ["poison"]
        assert store.claim_ready(ME, LONG, 10) == []  # held, if expired
        assert store.release(OTHER, ["poison"]) == ["poison"]
        assert store.quarantined() == []
        current = store.get("poison")
        assert (current.holder, current.takeovers) == (Free(), 0)
        assert store.claim_ready(ME, LONG, 10) == ["poison"]

    def test_a_deleted_poison_run_leaves_the_quarantine(self) -> None:
        store = self.make_store()
        store.insert("poison", b"r1", Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_expired(ME, LONG, 10, max_takeovers=0) == []
        store.delete("poison", 1, Seize(ME, LONG))
        assert store.quarantined() == []

    # ------------------------------------------------------------------ arguments

    @pytest.mark.parametrize("call", [
        lambda s: s.release("", ["run"]),
        lambda s: s.release(ME, "run"),
        lambda s: s.release(ME, [""]),
        lambda s: s.release(ME, [f"r{i}" for i in range(MAX_RENEW + 1)]),
        lambda s: s.delete("", 1, Release()),
        lambda s: s.delete("run", -1, Release()),
        lambda s: s.delete("run", True, Release()),
        lambda s: s.delete("run", 1, "release"),
        lambda s: s.claim_expired(ME, LONG, 1, max_takeovers=-1),
        lambda s: s.claim_expired(ME, LONG, 1, max_takeovers=True),
        lambda s: s.claim_expired(ME, LONG, 1, max_takeovers="1"),
    ])
    def test_bad_lifecycle_arguments_raise_and_write_nothing(
            self, call: Callable[[Any], Any]) -> None:
        store = self.make_store()
        store.insert("run", b"r1", Claim(ME, LONG))
        before = store.get("run")
        with pytest.raises((ValueError, TypeError)):
            call(store)
        assert store.get("run") == before
