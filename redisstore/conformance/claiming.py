"""One claim for all work, as docs/runs.md ("One claim for all work") gives it: ``claim``
takes ready runs and expired leases, in due order across both, each as the claim of its
kind takes it; blocked, it wakes at whichever comes first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from ..discovery import json_wait
from ..runs import Claim, Claimed, Free, Held, Quarantined, Release, RunStore
from .base import LONG, ME, OTHER, RunSuite, rec
from .wakeups import BLOCK, SETTLE, SLACK, Blocked


class ClaimRules(RunSuite):
    """``claim``: both kinds of work in one call."""

    def _mixed(self) -> tuple[RunStore, list[str]]:
        """A store holding, in due order: a ready run due long ago, an expired lease, a ready
        run due at or after that expiry; and a run due later, a live lease, a free run
        without a wait (none of them claimable). The claimable ones, in due order."""
        store = self.make_store(discover=json_wait)
        start = store.now()
        store.insert("c-expired", rec(None), Claim(OTHER, self.short_ttl))
        store.insert("b-early", rec({"at": start - 1000}), Release())
        store.insert("a-future", rec({"at": start + LONG}), Release())
        store.insert("a-live", rec({"at": 0}), Claim(OTHER, LONG))
        store.insert("a-idle", rec(None), Release())
        self.expire(store)
        # Due at the lease's expiry or after it (exactly at it on a controlled clock: the
        # tie goes by run id, and "c-expired" sorts first).
        store.insert("d-late", rec({"at": store.now()}), Release())
        return store, ["b-early", "c-expired", "d-late"]

    def test_claim_takes_ready_runs_and_expired_leases_in_due_order(self) -> None:
        store, due = self._mixed()
        assert store.claim(ME, LONG, 10) == due
        for run in due:
            assert store.get(run).holder == Held(ME, True)
        # Each as the claim of its kind takes it: claim info for a ready run, a takeover
        # counted for the lease taken from another owner.
        assert store.get("b-early").claim is not None
        assert store.get("d-late").claim is not None
        expired = store.get("c-expired")
        assert expired.claim is None
        assert expired.takeovers == 1
        assert store.get("a-future").holder == Free()
        assert store.get("a-live").holder == Held(OTHER, True)
        assert store.get("a-idle").holder == Free()
        assert store.claim(OTHER, LONG, 10) == []

    def test_claim_takes_one_by_default_and_limit_bounds_it(self) -> None:
        store, due = self._mixed()
        assert store.claim(ME, LONG) == due[:1]
        assert store.claim(OTHER, LONG, 0) == []
        assert store.claim(OTHER, LONG, 1) == due[1:2]
        assert store.claim(ME, LONG, 5) == due[2:]

    def test_the_single_kind_claims_take_one_by_default(self) -> None:
        store, _ = self._mixed()
        assert store.claim_ready(ME, LONG) == ["b-early"]
        assert store.claim_expired(ME, LONG) == ["c-expired"]

    def test_claim_changes_no_record_or_revision_and_hands_back_records(self) -> None:
        store, due = self._mixed()
        before = {run: store.get(run) for run in due}
        got = store.claim(ME, LONG, 10, records=True)
        assert [c.run for c in got] == due and all(isinstance(c, Claimed) for c in got)
        for claimed in got:
            assert claimed.current == store.get(claimed.run)
            old = before[claimed.run]
            assert (claimed.current.revision, claimed.current.record) == (
                old.revision, old.record)

    def test_claim_quarantines_a_poison_lease_and_still_takes_ready_runs(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("poison", rec(None), Claim(OTHER, self.short_ttl))
        store.insert("ready", rec({"at": 0}), Release())
        self.expire(store)
        assert store.claim(ME, LONG, 10, max_takeovers=0) == ["ready"]
        assert store.quarantined() == [Quarantined("poison", "poison", "takeovers=0")]
        assert store.get("poison").holder == Held(OTHER, False)
        # Its own holder may take back its own lease: that is no takeover.
        assert store.claim(OTHER, LONG, 10, max_takeovers=0) == []
        assert store.release(OTHER, ["poison"]) == ["poison"]
        assert store.quarantined() == []

    def test_claims_never_hand_out_the_same_run_twice(self) -> None:
        store = self.make_store(discover=json_wait)
        for i in range(6):
            store.insert(f"lease-{i}", rec(None), Claim(OTHER, self.short_ttl))
            store.insert(f"ready-{i}", rec({"at": 0}), Release())
        self.expire(store)
        taken = [run for owner in (ME, OTHER, ME) for run in store.claim(owner, LONG, 5)]
        assert len(taken) == len(set(taken)) == 12
        assert store.claim(OTHER, LONG, 5) == []

    @pytest.mark.parametrize("call", [
        lambda s: s.claim("", LONG),
        lambda s: s.claim(ME, 0),
        lambda s: s.claim(ME, LONG, -1),
        lambda s: s.claim(ME, LONG, True),
        lambda s: s.claim(ME, LONG, 1, records="yes"),
        lambda s: s.claim(ME, LONG, 1, max_takeovers=-1),
        lambda s: s.claim(ME, LONG, 1, block=-1),
        lambda s: s.claim(ME, LONG, 1, block=1.5),
    ])
    def test_bad_claim_arguments_raise_and_claim_nothing(
            self, call: Callable[[Any], Any]) -> None:
        store, due = self._mixed()
        with pytest.raises((ValueError, TypeError)):
            call(store)
        assert all(store.get(run).holder != Held(ME, True) for run in due)
        assert store.claim(ME, LONG, 10) == due

    # ------------------------------------------------------------------ blocked

    def test_a_blocked_claim_is_woken_by_an_insert(self) -> None:
        store = self.make_store(discover=json_wait)
        blocked = Blocked(lambda: store.claim(ME, LONG, 10, block=BLOCK))
        time.sleep(SETTLE)
        since = time.monotonic()
        store.insert("run", rec({"at": 0}), Release())
        assert blocked.get() == ["run"]
        assert blocked.returned - since < SLACK

    def test_a_blocked_claim_is_woken_by_a_lease_expiring(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("far", rec({"at": store.now() + LONG}), Release())
        expiry = store.now() + 150
        store.insert("dead", rec(None), Claim(OTHER, 150))
        blocked = Blocked(lambda: store.claim(ME, LONG, 10, block=BLOCK))
        self.advance_soon(store, 150)
        assert blocked.get() == ["dead"]
        assert store.now() >= expiry
        assert store.get("dead").holder == Held(ME, True)
        assert blocked.returned - blocked.started < 0.3 + SLACK  # not at the block's end

    def test_a_blocked_claim_is_woken_by_a_run_due(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("held", rec(None), Claim(OTHER, LONG))
        due = store.now() + 150
        store.insert("run", rec({"at": due}), Release())
        blocked = Blocked(lambda: store.claim(ME, LONG, 10, block=BLOCK))
        self.advance_soon(store, 150)
        assert blocked.get() == ["run"]
        claim = store.get("run").claim
        assert claim is not None and claim.claimed_at >= due
        assert blocked.returned - blocked.started < 0.3 + SLACK

    def test_a_blocked_claim_with_nothing_to_take_runs_out_empty(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("later", rec({"at": store.now() + LONG}), Release())
        store.insert("held", rec(None), Claim(OTHER, LONG))
        started = time.monotonic()
        assert store.claim(ME, LONG, 10, block=100) == []
        assert 0.1 <= time.monotonic() - started < 0.1 + SLACK
