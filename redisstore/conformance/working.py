"""The worker loop, as docs/worker.md gives it: what a handler's answer does to its run, a
checkpoint with the revision tracked, a lost lease fenced (by another owner, and by another
grant of the worker's own owner), takeovers, poison runs, retries with back-off and the
quarantine, a clean stop, concurrency.

The rules drive a :class:`~redisstore.Worker` through :meth:`WorkerRules.start_worker`; a
backend whose stores are asyncio overrides it to run an ``AsyncWorker`` instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..discovery import json_wait
from ..engine.worker import Job, Retry, Unrecoverable, Worker
from ..errors import Conflict, LeaseRefused
from ..runs import Claim, Free, Held, Quarantined, Release, RunStore, Seize
from .base import LONG, OTHER, RunSuite, rec

#: The worker's owner in these rules, and its lease.
NODE, TTL = "worker-node", 5_000
#: The most seconds a rule waits for the worker to get somewhere.
PATIENCE = 10.0


class Running(Protocol):
    """A started worker, as the rules see it."""

    stats: Any

    def stop(self) -> None: ...


class WorkerRules(RunSuite):
    """``Worker`` over the backend's store."""

    def start_worker(self, store: RunStore, handler: Callable[[Job], bytes | None], *,
                     concurrency: int = 1, max_takeovers: int | None = None,
                     retry: Retry | None = None) -> Running:
        """A worker of ``NODE`` over ``store``, started, running ``handler`` (sync: the
        rules' handlers call ``job.write`` as a plain method)."""
        return Worker(store, NODE, handler, ttl=TTL, concurrency=concurrency,
                      max_takeovers=max_takeovers, poll=100, retry=retry).start()

    def _until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + PATIENCE
        while not done():
            assert time.monotonic() < deadline, f"the worker never {what}"
            time.sleep(0.01)

    def test_a_worker_writes_what_its_handler_returns_with_checkpoints_between(
            self) -> None:
        store = self.make_store(discover=json_wait)
        for i in range(3):
            store.insert(f"run-{i}", rec({"at": 0}, step=0), Release())
        store.insert("dead", rec({"at": 0}, step=0), Claim(OTHER, self.short_ttl))
        self.expire(store)
        seen: dict[str, tuple[int, int]] = {}

        def handler(job: Job) -> bytes:
            first = job.current
            job.write(rec({"at": 0}, step=1))  # a checkpoint: the revision is tracked
            assert job.current.revision == first.revision + 1 and not job.lost
            seen[job.run] = (first.revision, first.takeovers)
            return rec(None, step=2)  # done: no wait, never ready again

        worker = self.start_worker(store, handler)
        try:
            self._until(lambda: worker.stats["done"] == 4, "finished the four runs")
        finally:
            worker.stop()
        for run in ("run-0", "run-1", "run-2", "dead"):
            current = store.get(run)
            assert (current.record, current.revision, current.holder) == (
                rec(None, step=2), seen[run][0] + 2, Free())
        assert seen["dead"][1] == 1
        assert worker.stats["claimed"] == 4 and worker.stats["failed"] == 0

    def test_none_releases_without_a_write_and_an_error_releases_too(self) -> None:
        store = self.make_store(discover=json_wait)
        # Expired leases without a wait: claimed once, never ready once released.
        for run in ("quiet", "broken"):
            store.insert(run, rec(None), Claim(OTHER, self.short_ttl))
        self.expire(store)

        def handler(job: Job) -> bytes | None:
            if job.run == "broken":
                raise RuntimeError("the handler's own failure")
            return None

        worker = self.start_worker(store, handler)
        try:
            self._until(lambda: worker.stats["released"] + worker.stats["failed"] == 2,
                        "ended both runs")
        finally:
            worker.stop()
        assert (worker.stats["released"], worker.stats["failed"]) == (1, 1)
        for run in ("quiet", "broken"):
            current = store.get(run)
            assert (current.revision, current.record, current.holder) == (1, rec(None), Free())

    def test_a_lost_lease_is_fenced_and_counted(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("run", rec({"at": 0}), Release())
        taken, seized = threading.Event(), threading.Event()
        refused: list[bool] = []

        def handler(job: Job) -> bytes:
            taken.set()
            assert seized.wait(PATIENCE)
            try:
                job.write(rec(None, by="zombie"))
            except (Conflict, LeaseRefused):
                refused.append(job.lost)
            return rec(None, by="zombie")  # never lands: the lease is another's

        worker = self.start_worker(store, handler)
        try:
            assert taken.wait(PATIENCE)
            store.compare_and_set("run", 1, rec(None, by="other"), Seize(OTHER, LONG))
            seized.set()
            self._until(lambda: worker.stats["lost"] == 1, "counted the lost lease")
        finally:
            worker.stop()
        assert refused == [True]
        current = store.get("run")
        assert (current.record, current.holder) == (rec(None, by="other"), Held(OTHER, True))

    def test_stop_lets_a_handler_return_and_releases_what_it_holds(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("long", rec({"at": 0}, step=0), Release())
        taken = threading.Event()

        def handler(job: Job) -> bytes | None:
            taken.set()
            while not job.stopping:
                time.sleep(0.01)
            job.write(rec({"at": 0}, step=1))  # a checkpoint to carry on from
            return None

        worker = self.start_worker(store, handler)
        assert taken.wait(PATIENCE)
        worker.stop()
        current = store.get("long")
        assert (current.record, current.holder) == (rec({"at": 0}, step=1), Free())
        assert worker.stats["stopped"] == 1

    def test_a_poison_run_is_quarantined_not_handled(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("poison", rec({"at": 0}), Claim(OTHER, self.short_ttl))
        store.insert("fine", rec({"at": 0}), Release())
        self.expire(store)
        handled: list[str] = []

        def handler(job: Job) -> bytes:
            handled.append(job.run)
            return rec(None)

        worker = self.start_worker(store, handler, max_takeovers=0)
        try:
            self._until(lambda: worker.stats["done"] == 1, "handled the healthy run")
            time.sleep(0.05)
        finally:
            worker.stop()
        assert handled == ["fine"]
        assert store.quarantined() == [Quarantined("poison", "poison", "takeovers=0")]

    def test_concurrency_runs_handlers_side_by_side(self) -> None:
        store = self.make_store(discover=json_wait)
        for i in range(3):
            store.insert(f"run-{i}", rec({"at": 0}), Release())
        together = threading.Barrier(3, timeout=PATIENCE)

        def handler(job: Job) -> bytes:
            together.wait()  # breaks unless three handlers run at once
            return rec(None)

        worker = self.start_worker(store, handler, concurrency=3)
        try:
            self._until(lambda: worker.stats["done"] == 3, "ran three handlers at once")
        finally:
            worker.stop()
        assert worker.stats["failed"] == 0

    def test_a_result_never_lands_over_a_grant_of_the_same_owner(self) -> None:
        """Another grant of the worker's own owner (another loop, the node restarted) takes
        the run while the handler runs: the handler's checkpoint and result are refused,
        counted lost, and the new grant's work stands."""
        store = self.make_store(discover=json_wait)
        store.insert("run", rec({"at": 0}), Release())
        taken, regranted = threading.Event(), threading.Event()
        refused: list[bool] = []

        def handler(job: Job) -> bytes:
            taken.set()
            assert regranted.wait(PATIENCE)
            try:
                job.write(rec({"at": 0}, by="zombie"))
            except (Conflict, LeaseRefused):
                refused.append(job.lost)
            return rec(None, by="zombie")

        worker = self.start_worker(store, handler)
        try:
            assert taken.wait(PATIENCE)
            # A grant of the same owner: the token changes, the revision too (a write).
            store.compare_and_set("run", 1, rec(None, by="new grant"), Seize(NODE, LONG))
            regranted.set()
            self._until(lambda: worker.stats["lost"] == 1, "counted the lost grant")
        finally:
            worker.stop()
        assert refused == [True]
        current = store.get("run")
        assert current.record == rec(None, by="new grant")

    def test_a_failed_try_is_held_back_then_retried_then_quarantined(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("flaky", rec({"at": 0}), Release())
        tries: list[int] = []

        def handler(job: Job) -> bytes:
            tries.append(job.current.attempts)
            raise RuntimeError(f"try {len(tries)}")

        # Three tries in all, each held back 4 short ttls (far longer than a claim takes).
        back_off = 4 * self.short_ttl
        worker = self.start_worker(store, handler, retry=Retry(attempts=3, base=back_off,
                                                               factor=1, jitter=0))
        try:
            for attempt in (1, 2):
                self._until(lambda a=attempt: store.get("flaky").attempts == a,  # type: ignore[misc]
                            f"finished try {attempt}")
                held_back = store.get("flaky")
                assert held_back.holder == Free() and held_back.not_before is not None
                assert store.claim(OTHER, LONG) == []  # held back: its wait is due now
                assert tries == list(range(attempt))
                self.advance(store, back_off)
            self._until(lambda: worker.stats["quarantined"] == 1, "quarantined the run")
        finally:
            worker.stop()
        assert tries == [0, 1, 2]  # each try saw the failed ones before it
        assert worker.stats["failed"] == 3
        [entry] = store.quarantined()
        assert (entry.index, entry.run, entry.reason) == ("failed", "flaky", "attempts=3")
        assert entry.error == "RuntimeError: try 3"
        current = store.get("flaky")
        assert (current.quarantined, current.holder, current.revision) == ("failed", Free(), 1)
        assert store.claim(OTHER, LONG) == []
        assert store.restore("flaky")
        assert store.claim(OTHER, LONG) == ["flaky"]

    def test_an_unrecoverable_failure_quarantines_at_once(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("broken", rec({"at": 0}), Release())

        def handler(job: Job) -> bytes:
            raise Unrecoverable("the input can never be read")

        worker = self.start_worker(store, handler)
        try:
            self._until(lambda: worker.stats["quarantined"] == 1, "quarantined the run")
        finally:
            worker.stop()
        assert store.quarantined() == [Quarantined(
            "failed", "broken", "final", "Unrecoverable: the input can never be read")]

    def test_a_result_the_store_refuses_is_a_failed_try_and_the_loop_goes_on(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("bad", rec({"at": 0}), Release())
        store.insert("good", rec({"at": 0}), Release())

        def handler(job: Job) -> Any:
            if job.run == "bad":
                return b'{"wait": 5}'  # json_wait refuses it: not a wait
            return rec(None)

        worker = self.start_worker(store, handler, retry=Retry(attempts=1))
        try:
            self._until(lambda: worker.stats["done"] == 1 and
                        worker.stats["quarantined"] == 1, "ended both runs")
        finally:
            worker.stop()
        assert store.get("good").record == rec(None)
        bad = store.get("bad")
        assert (bad.record, bad.quarantined, bad.revision) == (rec({"at": 0}), "failed", 1)
