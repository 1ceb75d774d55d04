"""Waiting for work, as docs/runs.md ("Waiting for work") gives it: ``claim_ready(...,
block=ms)`` and ``claim_expired(..., block=ms)``.

Each rule blocks a claim in a thread of its own, makes something claimable from the test's
thread, and checks that the blocked claim took it long before its ``block`` ran out (so it
was woken, not timed out). Bounds are generous: these rules say *what* wakes a claim; the
latency benchmark says how fast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from ..runs import Claim, Claimed, Free, Held, Hold, Release, RunStore
from .base import LONG, ME, OTHER, RunSuite, rec

#: How long a rule's claim blocks: far longer than any wake-up may take.
BLOCK = 5000
#: The most seconds a wake-up may take here (a loaded CI machine included).
SLACK = 2.5
#: How long a rule lets a claim settle into its wait before it acts (s).
SETTLE = 0.05


class Blocked:
    """A claim running in a thread of its own: its result, error and when it returned."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned = 0.0
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as exc:  # reported by get()
            self.error = exc
        self.returned = time.monotonic()

    def get(self, timeout: float = BLOCK / 1000 + 10) -> Any:
        """Its result (or raise its error), waiting up to ``timeout`` s."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the blocked claim never returned"
        if self.error is not None:
            raise self.error
        return self.result


class WakeupRules(RunSuite):
    """Blocking claims: what wakes them, what they return, and that one run wakes one."""

    def _woken(self, blocked: Blocked, since: float, expected: Any) -> None:
        """``blocked`` returned ``expected``, within SLACK of ``since``."""
        assert blocked.get() == expected
        assert blocked.returned - since < SLACK, (
            f"woken {blocked.returned - since:.3f} s after the event")

    def _ready_store(self) -> RunStore:
        from ..discovery import json_wait

        return self.make_store(discover=json_wait)

    # ------------------------------------------------------------------ values

    @pytest.mark.parametrize("block", [-1, 1.5, True, "10", 86_400_001, float("nan")])
    def test_a_bad_block_is_refused_before_anything_is_claimed(self, block: Any) -> None:
        store = self._ready_store()
        store.insert("run", rec({"at": 0}), Release())
        with pytest.raises((ValueError, TypeError)):
            store.claim_ready(ME, LONG, 1, block=block)
        with pytest.raises((ValueError, TypeError)):
            store.claim_expired(ME, LONG, 1, block=block)
        assert store.get("run").holder == Free()

    def test_no_block_and_block_zero_return_at_once(self) -> None:
        store = self._ready_store()
        for block in (None, 0):
            started = time.monotonic()
            assert store.claim_ready(ME, LONG, 1, block=block) == []
            assert store.claim_expired(ME, LONG, 1, block=block) == []
            assert time.monotonic() - started < SLACK

    def test_a_claim_that_gets_runs_never_waits(self) -> None:
        store = self._ready_store()
        store.insert("run", rec({"at": 0}), Release())
        started = time.monotonic()
        assert store.claim_ready(ME, LONG, 10, block=BLOCK) == ["run"]
        assert time.monotonic() - started < SLACK

    def test_limit_zero_never_waits(self) -> None:
        store = self._ready_store()
        started = time.monotonic()
        assert store.claim_ready(ME, LONG, 0, block=BLOCK) == []
        assert store.claim_expired(ME, LONG, 0, block=BLOCK) == []
        assert time.monotonic() - started < SLACK

    def test_with_nothing_claimable_the_block_runs_out_empty(self) -> None:
        store = self._ready_store()
        store.insert("later", rec({"at": store.now() + LONG}), Release())
        store.insert("held", rec(None), Claim(OTHER, LONG))
        for claim in (store.claim_ready, store.claim_expired):
            started = time.monotonic()
            assert claim(ME, LONG, 10, block=100) == []
            assert 0.1 <= time.monotonic() - started < 0.1 + SLACK
        assert store.get("later").holder == Free()

    # ------------------------------------------------------------------ events

    def test_an_insert_wakes_a_blocked_claim_ready(self) -> None:
        store = self._ready_store()
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, block=BLOCK))
        time.sleep(SETTLE)
        since = time.monotonic()
        store.insert("run", rec({"at": 0}), Release())
        self._woken(blocked, since, ["run"])
        assert store.get("run").holder == Held(ME, True)

    def test_a_release_wakes_a_blocked_claim_ready(self) -> None:
        store = self._ready_store()
        store.insert("run", rec({"at": 0}), Claim(OTHER, LONG))
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, block=BLOCK))
        time.sleep(SETTLE)
        since = time.monotonic()
        assert store.release(OTHER, ["run"]) == ["run"]
        self._woken(blocked, since, ["run"])

    def test_a_write_that_frees_a_due_run_wakes_a_blocked_claim_ready(self) -> None:
        store = self._ready_store()
        store.insert("run", rec(None), Claim(OTHER, LONG))
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, block=BLOCK))
        time.sleep(SETTLE)
        since = time.monotonic()
        store.compare_and_set("run", 1, rec({"at": 0}), Release())
        self._woken(blocked, since, ["run"])

    # The dependency in the waiter's family, and in another (in a store of partitions,
    # another partition: its write reaches the waiter through a claim's delivery).
    @pytest.mark.parametrize("dep", ["{waiter}dep", "dep"])
    def test_a_dependency_write_wakes_its_blocked_waiter(self, dep: str) -> None:
        store = self._ready_store()
        store.insert(dep, rec(None), Claim(OTHER, LONG))
        store.insert("waiter", rec({"changed": dep, "seen": 1}), Release())
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, block=BLOCK))
        time.sleep(SETTLE)
        since = time.monotonic()
        store.compare_and_set(dep, 1, rec(None, step=2), Hold(OTHER))
        self._woken(blocked, since, ["waiter"])

    def test_a_blocked_claim_hands_back_records_when_asked(self) -> None:
        store = self._ready_store()
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, records=True, block=BLOCK))
        time.sleep(SETTLE)
        store.insert("run", rec({"at": 0}), Release())
        got = blocked.get()
        assert [c.run for c in got] == ["run"] and isinstance(got[0], Claimed)
        assert got[0].current == store.get("run")

    # ------------------------------------------------------------------ due times

    def test_an_at_wait_wakes_a_blocked_claim_when_due(self) -> None:
        store = self._ready_store()
        due = store.now() + 150
        store.insert("run", rec({"at": due}), Release())
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, block=BLOCK))
        self.advance_soon(store, 150)
        assert blocked.get() == ["run"]
        claim = store.get("run").claim
        assert claim is not None and claim.claimed_at >= due  # not early
        assert blocked.returned - blocked.started < 0.3 + SLACK  # nor at the block's end

    def test_an_expiring_lease_wakes_a_blocked_claim_expired(self) -> None:
        store = self.make_store()
        expiry = store.now() + 150  # at or before the lease's own expiry (judged at insert)
        store.insert("run", b"r", Claim(OTHER, 150))
        blocked = Blocked(lambda: store.claim_expired(ME, LONG, 10, block=BLOCK))
        self.advance_soon(store, 150)
        assert blocked.get() == ["run"]
        assert store.get("run").holder == Held(ME, True)
        assert store.now() >= expiry
        assert blocked.returned - blocked.started < 0.3 + SLACK

    def test_a_run_due_earlier_than_what_a_claim_waits_for_wakes_it(self) -> None:
        store = self._ready_store()
        store.insert("far", rec({"at": store.now() + LONG}), Release())
        blocked = Blocked(lambda: store.claim_ready(ME, LONG, 10, block=BLOCK))
        time.sleep(SETTLE)
        store.insert("near", rec({"at": store.now() + 200}), Release())
        self.advance_soon(store, 200)
        assert blocked.get() == ["near"]
        assert blocked.returned - blocked.started < SETTLE + 0.2 + SLACK

    # ------------------------------------------------------------------ many claimers

    def test_each_run_goes_to_one_blocked_claimer_and_wakes_no_other(self) -> None:
        store = self._ready_store()
        claimers = [Blocked(lambda: store.claim_ready(ME, LONG, 1, block=BLOCK))
                    for _ in range(4)]
        time.sleep(SETTLE)
        since = time.monotonic()
        for i in range(3):
            store.insert(f"run-{i}", rec({"at": 0}), Release())
        deadline = time.monotonic() + BLOCK / 1000
        while sum(c.returned > 0 for c in claimers) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        done = [c for c in claimers if c.returned]
        assert len(done) == 3, "three runs, three claimers woken"
        assert sorted(c.get()[0] for c in done) == ["run-0", "run-1", "run-2"]
        assert max(c.returned for c in done) - since < SLACK
        time.sleep(SETTLE)
        waiting = [c for c in claimers if not c.returned]
        assert len(waiting) == 1, "the fourth claimer got nothing and still waits"
        store.insert("run-3", rec({"at": 0}), Release())
        assert waiting[0].get() == ["run-3"]
