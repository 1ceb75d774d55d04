"""docs/readiness.md as tests: discovery, claim_ready, dependencies, schedules, claim info,
staleness.

Records are JSON read by :data:`redisstore.discovery.json_wait`; each test makes the waits
it needs (``{"wait": {"at": due}}`` and so on). Most rules name a dependency in its waiter's
family (``"{run}dep"`` for the waiter ``"run"``), so that a store spread over partitions
keeps the two in one partition; the rules "of another family" put them apart.
"""

from __future__ import annotations

import pytest

from ..discovery import json_wait
from ..errors import NotFound
from ..runs import Claim, Claimed, ClaimInfo, Free, Held, Hold, Release, RunStore, Seize
from .base import LONG, ME, OTHER, RunSuite, rec


class ReadinessRules(RunSuite):
    """claim_ready and everything it depends on (docs/readiness.md)."""

    #: On a real clock: how far ahead a test puts a time that must not be reached yet.
    ahead: int = 80

    def ready_store(self) -> RunStore:
        return self.make_store(discover=json_wait)

    def release(self, store: RunStore, run: str) -> None:
        """Release run, rewriting its record as it is (same wait)."""
        current = store.get(run)
        store.compare_and_set(run, current.revision, current.record, Release())

    # ------------------------------------------------------------------ basics

    def test_without_discover_nothing_is_ready(self) -> None:
        store = self.make_store()
        store.insert("run", rec({"at": 0}), Release())
        store.insert("dep-waiter", rec({"changed": "x"}), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        assert store.refresh("run") is False
        assert store.claim_ready(ME, LONG, 10) == []

    def test_a_record_without_a_wait_is_never_ready(self) -> None:
        store = self.ready_store()
        store.insert("run", rec(None), Release())
        store.insert("not-json", b"\x00\xff", Release())
        assert store.claim_ready(ME, LONG, 10) == []
        assert store.refresh("run") is False

    def test_limit_zero_and_bounded(self) -> None:
        store = self.ready_store()
        for i in range(5):
            store.insert(f"run-{i}", rec({"at": 0}), Release())
        assert store.claim_ready(ME, LONG, 0) == []
        first = store.claim_ready(ME, LONG, 2)
        second = store.claim_ready(OTHER, LONG, 2)
        third = store.claim_ready(ME, LONG, 2)
        assert len(first) == 2 and len(second) == 2 and len(third) == 1
        assert sorted(first + second + third) == [f"run-{i}" for i in range(5)]
        assert store.claim_ready(OTHER, LONG, 10) == []

    def test_claim_ready_changes_no_record_or_revision(self) -> None:
        store = self.ready_store()
        store.insert("run", rec({"at": 0}), Claim(ME, LONG))
        store.compare_and_set("run", 1, rec({"at": 0}, step=2), Release())
        before = store.get("run")
        assert store.claim_ready(OTHER, LONG, 1) == ["run"]
        after = store.get("run")
        assert (after.revision, after.record) == (before.revision, before.record)
        assert after.holder == Held(OTHER, True)
        store.compare_and_set("run", 2, rec(None), Hold(OTHER))  # the claimer writes on

    def test_held_runs_are_never_ready(self) -> None:
        store = self.ready_store()
        store.insert("live", rec({"at": 0}), Claim(OTHER, LONG))
        store.insert("expired", rec({"at": 0}), Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_ready(ME, LONG, 10) == []  # expired is claim_expired's work
        assert store.claim_expired(ME, LONG, 10) == ["expired"]
        assert store.claim_ready(ME, LONG, 10) == []

    def test_discover_that_fails_refuses_the_write(self) -> None:
        store = self.ready_store()
        with pytest.raises(ValueError):
            store.insert("run", rec({"poll": "k"}), Release())  # no interval
        with pytest.raises(NotFound):
            store.get("run")
        store.insert("run", rec({"at": 0}), Release())
        with pytest.raises(ValueError):
            store.compare_and_set("run", 1, rec({"at": "soon"}), Release())
        assert store.get("run").revision == 1

    def test_discover_returning_a_wrong_type_is_refused(self) -> None:
        store = self.make_store(discover=lambda record: "soon")  # type: ignore[arg-type,return-value]
        with pytest.raises(TypeError):
            store.insert("run", b"r", Release())
        with pytest.raises(NotFound):
            store.get("run")

    # ------------------------------------------------------------------ At

    def test_at_is_eligible_from_due_on(self) -> None:
        store = self.ready_store()
        due = store.now() + (1_000 if self.clock_is_controlled else self.ahead)
        store.insert("run", rec({"at": due}), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        if self.clock_is_controlled:
            self.advance(store, 999)
            assert store.claim_ready(ME, LONG, 10) == []
            self.advance(store, 1)  # now == due
        else:
            self.advance(store, self.ahead)
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == (None, None)
        assert claim.claimed_at >= due

    def test_at_is_not_consumed_by_a_claim(self) -> None:
        store = self.ready_store()
        store.insert("run", rec({"at": 0}), Release())
        assert store.claim_ready(ME, self.short_ttl, 10) == ["run"]
        assert store.claim_ready(OTHER, LONG, 10) == []
        self.expire(store)
        assert store.claim_ready(OTHER, LONG, 10) == []  # held, though expired
        self.release(store, "run")
        assert store.claim_ready(OTHER, LONG, 10) == ["run"]
        store.compare_and_set("run", 2, rec(None), Release())  # the run leaves the wait
        assert store.claim_ready(OTHER, LONG, 10) == []

    def test_earliest_eligible_first(self) -> None:
        store = self.ready_store()
        now = store.now()
        for run, due in [("c", now - 10), ("a", now - 30), ("d", now - 5), ("b", now - 20)]:
            store.insert(run, rec({"at": due}), Release())
        assert store.claim_ready(ME, LONG, 1) == ["a"]
        assert store.claim_ready(ME, LONG, 2) == ["b", "c"]
        assert store.claim_ready(ME, LONG, 5) == ["d"]

    # ------------------------------------------------------------------ Changed

    def test_unseen_dependency_is_ready_at_once(self) -> None:
        store = self.ready_store()
        store.insert("{run}dep", rec(None), Release())
        store.compare_and_set("{run}dep", 1, rec(None), Release())
        store.insert("run", rec({"changed": "{run}dep"}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        claim = store.get("run").claim
        assert claim is not None
        assert (claim.key, claim.dependency_revision) == ("{run}dep", 2)

    def test_seen_dependency_waits_for_its_next_write(self) -> None:
        store = self.ready_store()
        store.insert("{run}dep", rec(None), Release())
        store.insert("run", rec({"changed": "{run}dep", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        store.compare_and_set("{run}dep", 1, rec(None, v=2), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == ("{run}dep", 2)
        # The engine handles the change and waits again from revision 2.
        store.compare_and_set("run", 1, rec({"changed": "{run}dep", "seen": 2}), Release())
        assert store.claim_ready(ME, LONG, 10) == []

    def test_absent_dependency_counts_as_revision_zero(self) -> None:
        store = self.ready_store()
        store.insert("{absent}zero", rec({"changed": "absent", "seen": 0}), Release())
        store.insert("{absent}one", rec({"changed": "absent", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["{absent}one"]
        store.insert("absent", rec(None), Release())  # now at revision 1
        assert store.claim_ready(ME, LONG, 10) == ["{absent}zero"]
        claim = store.get("{absent}zero").claim
        assert claim is not None and claim == ClaimInfo("absent", 1, claim.claimed_at)

    def test_a_run_waiting_on_itself_sees_its_own_write(self) -> None:
        # Its own insert is revision 1, past the seen 0: changed, ready at once.
        store = self.ready_store()
        store.insert("self", rec({"changed": "self", "seen": 0}), Release())
        store.insert("later", rec({"changed": "later", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["self"]
        store.compare_and_set("later", 1, rec({"changed": "later", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["later"]  # its revision 2 is past 1

    def test_dependency_written_while_held_stays_discoverable(self) -> None:
        store = self.ready_store()
        store.insert("{run}dep", rec(None), Release())
        store.insert("run", rec({"changed": "{run}dep", "seen": 1}), Claim(OTHER, LONG))
        store.compare_and_set("{run}dep", 1, rec(None, v=2), Release())
        assert store.claim_ready(ME, LONG, 10) == []  # held
        store.compare_and_set("run", 1, rec({"changed": "{run}dep", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    def test_dependency_written_while_stale_stays_discoverable(self) -> None:
        store = self.ready_store()
        store.insert("{run}dep", rec(None), Release())
        store.insert("run", rec({"changed": "{run}dep", "seen": 1}), Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_expired(ME, LONG, 1) == ["run"]
        store.compare_and_set("{run}dep", 1, rec(None, v=2), Release())
        store.compare_and_set("run", 1, rec({"changed": "{run}dep", "seen": 1}), Release())
        assert store.claim_ready(OTHER, LONG, 10) == ["run"]

    def test_changed_deadline_makes_it_eligible_alone(self) -> None:
        store = self.ready_store()
        store.insert("{run}dep", rec(None), Release())
        deadline = store.now() + (500 if self.clock_is_controlled else self.ahead)
        store.insert("run", rec({"changed": "{run}dep", "seen": 1, "deadline": deadline}),
                     Release())
        assert store.claim_ready(ME, LONG, 10) == []
        self.advance(store, 500 if self.clock_is_controlled else self.ahead)
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == ("{run}dep", 1)

    # Across families: in a store of partitions "dep" and "run" are in two partitions, whose
    # scripts never see each other's keys (the dependency is watched, and its writes are
    # delivered by claims: docs/scale-out.md).

    def test_a_dependency_of_another_family_already_changed_is_ready_at_once(self) -> None:
        store = self.ready_store()
        store.insert("dep", rec(None), Release())
        store.compare_and_set("dep", 1, rec(None), Release())
        store.insert("run", rec({"changed": "dep"}), Release())
        store.insert("late", rec({"changed": "dep", "seen": 1}), Release())
        assert sorted(store.claim_ready(ME, LONG, 10)) == ["late", "run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == ("dep", 2)

    def test_a_dependency_of_another_family_wakes_its_waiter_on_its_next_write(self) -> None:
        store = self.ready_store()
        store.insert("dep", rec(None), Release())
        store.insert("run", rec({"changed": "dep", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        store.compare_and_set("dep", 1, rec(None, v=2), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == ("dep", 2)
        store.compare_and_set("run", 1, rec({"changed": "dep", "seen": 2}), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        store.compare_and_set("dep", 2, rec(None, v=3), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    def test_a_dependency_of_another_family_written_while_held_stays_discoverable(
            self) -> None:
        store = self.ready_store()
        store.insert("dep", rec(None), Release())
        store.insert("run", rec({"changed": "dep", "seen": 1}), Claim(OTHER, LONG))
        store.compare_and_set("dep", 1, rec(None, v=2), Release())
        assert store.claim_ready(ME, LONG, 10) == []  # held
        store.compare_and_set("run", 1, rec({"changed": "dep", "seen": 1}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    def test_changing_the_dependency_moves_the_wait(self) -> None:
        store = self.ready_store()
        store.insert("{run}old", rec(None), Release())
        store.insert("{run}new", rec(None), Release())
        store.insert("run", rec({"changed": "{run}old", "seen": 1}), Release())
        store.compare_and_set("run", 1, rec({"changed": "{run}new", "seen": 1}), Release())
        store.compare_and_set("{run}old", 1, rec(None, v=2), Release())
        assert store.claim_ready(ME, LONG, 10) == []  # no longer waits for "{run}old"
        store.compare_and_set("{run}new", 1, rec(None, v=2), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    # ------------------------------------------------------------------ Poll

    def test_poll_is_due_at_once_then_interval_after_each_claim(self) -> None:
        store = self.ready_store()
        interval = 1_000 if self.clock_is_controlled else self.ahead
        store.insert("run", rec({"poll": "inbox", "interval": interval}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        claim = store.get("run").claim
        assert claim is not None and (claim.key, claim.dependency_revision) == ("inbox", None)
        self.release(store, "run")
        assert store.claim_ready(ME, LONG, 10) == []
        if self.clock_is_controlled:
            self.advance(store, interval - 1)
            assert store.claim_ready(ME, LONG, 10) == []
            self.advance(store, 1)
        else:
            self.advance(store, interval)
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        second = store.get("run").claim
        assert second is not None and second.claimed_at >= claim.claimed_at + interval

    def test_poll_time_survives_same_key_writes_and_refresh(self) -> None:
        store = self.ready_store()
        interval = 1_000 if self.clock_is_controlled else 4 * self.ahead
        store.insert("run", rec({"poll": "inbox", "interval": interval}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        store.compare_and_set("run", 1, rec({"poll": "inbox", "interval": interval}, n=2),
                              Release())
        assert store.refresh("run") is True
        assert store.claim_ready(ME, LONG, 10) == []
        # A new key starts over: due at once.
        store.compare_and_set("run", 2, rec({"poll": "outbox", "interval": interval}),
                              Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    def test_poll_deadline_makes_it_eligible_alone(self) -> None:
        store = self.ready_store()
        step = 500 if self.clock_is_controlled else self.ahead
        store.insert("run", rec({"poll": "inbox", "interval": LONG}), Release())
        assert store.claim_ready(ME, LONG, 10) == ["run"]
        deadline = store.now() + step
        store.compare_and_set("run", 1, rec({"poll": "inbox", "interval": LONG,
                                             "deadline": deadline}), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        self.advance(store, step)
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    # ------------------------------------------------------------------ claim info

    def test_claim_info_lasts_until_release_or_another_owner(self) -> None:
        store = self.ready_store()
        store.insert("run", rec({"at": 0}), Release())
        assert store.claim_ready(ME, self.short_ttl, 1) == ["run"]
        info = store.get("run").claim
        assert info is not None
        store.compare_and_set("run", 1, rec({"at": 0}, step=2), Hold(ME))
        assert store.renew(ME, ["run"], self.short_ttl) == ["run"]
        store.compare_and_set("run", 2, rec({"at": 0}, step=3), Claim(ME, self.short_ttl))
        assert store.get("run").claim == info  # same owner: kept
        self.expire(store)
        assert store.claim_expired(OTHER, LONG, 1) == ["run"]
        assert store.get("run").claim is None  # passed to another owner

        store.insert("seized", rec({"at": 0}), Release())
        assert store.claim_ready(ME, LONG, 1) == ["seized"]
        store.compare_and_set("seized", 1, rec({"at": 0}), Seize(OTHER, LONG))
        assert store.get("seized").claim is None

        store.insert("released", rec({"at": 0}), Release())
        assert store.claim_ready(ME, LONG, 1) == ["released"]
        self.release(store, "released")
        current = store.get("released")
        assert (current.holder, current.claim) == (Free(), None)

    def test_claim_ready_with_records_hands_back_runs_with_their_claim_info(self) -> None:
        store = self.ready_store()
        store.insert("{waiter}dep", rec(None), Release())
        store.insert("waiter", rec({"changed": "{waiter}dep"}, n=1), Release())
        store.insert("poller", rec({"poll": "k", "interval": 60_000}), Release())
        store.insert("timer", rec({"at": 0}), Claim(OTHER, LONG))
        store.compare_and_set("timer", 1, rec({"at": 0}, n=2), Release())
        claimed = store.claim_ready(ME, LONG, 10, records=True)
        assert sorted(c.run for c in claimed) == ["poller", "timer", "waiter"]
        for c in claimed:
            assert isinstance(c, Claimed)
            assert c.current == store.get(c.run)
            assert c.current.holder == Held(ME, True) and c.current.claim is not None
        by_run = {c.run: c.current for c in claimed}
        assert by_run["timer"].revision == 2 and by_run["timer"].record == rec({"at": 0}, n=2)
        waiter = by_run["waiter"].claim
        assert waiter is not None
        assert (waiter.key, waiter.dependency_revision) == ("{waiter}dep", 1)
        poller = by_run["poller"].claim
        assert poller is not None and poller.key == "k"
        assert store.claim_ready(OTHER, LONG, 10, records=True) == []

    # ------------------------------------------------------------------ staleness

    def test_lower_projection_version_is_stale_until_refreshed(self) -> None:
        old = self.ready_store()
        new = self.reopen(old, discover=json_wait, projection_version=2)
        old.insert("run", rec({"at": 0}), Release())
        assert new.claim_ready(ME, LONG, 10) == []  # derived by version 1
        assert new.refresh("run") is True
        assert new.get("run").revision == 1
        assert new.claim_ready(ME, LONG, 10) == ["run"]

    def test_metadata_from_another_revision_is_stale(self) -> None:
        store = self.ready_store()
        blind = self.reopen(store, discover=None, projection_version=1)
        store.insert("run", rec({"at": 0}), Release())
        blind.compare_and_set("run", 1, rec({"at": 0}, step=2), Release())
        assert store.claim_ready(ME, LONG, 10) == []
        assert store.refresh("run") is True
        assert store.claim_ready(ME, LONG, 10) == ["run"]

    def test_refresh_keeps_revision_and_reports_the_wait(self) -> None:
        store = self.ready_store()
        with pytest.raises(NotFound):
            store.refresh("absent")
        store.insert("run", rec({"at": 0}), Claim(ME, LONG))
        before = store.get("run")
        assert store.refresh("run") is True
        assert store.get("run") == before
        assert store.claim_ready(OTHER, LONG, 10) == []  # held
        other = self.reopen(store, discover=lambda record: None, projection_version=1)
        assert other.refresh("run") is False
        store.compare_and_set("run", 1, rec({"at": 0}), Release())
        other_before = store.get("run")
        assert other.refresh("run") is False
        assert store.get("run") == other_before
        assert store.claim_ready(ME, LONG, 10) == []  # refreshed to "no wait"
