"""The worker loop: claim, keep, work, finish and claim the next, lose the lease, stop;
written once here so that an engine does not write it (docs/worker.md).

``Worker(store, owner, handler, ttl=...)`` runs ``concurrency`` loops on threads of its
own; ``AsyncWorker`` runs them as tasks, with an async handler. Each loop claims one run
at a time with :meth:`~redisstore.RedisRunStore.claim` (ready runs and expired leases,
blocked until there is one), has the worker's keeper hold its lease (the one ``ttl``,
given once), and hands the handler a :class:`Job`. What the handler returns finishes the
run (written with ``Release()``, or released without a write), in the round trip that
claims the next run where the store has pipelines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import telemetry
from .core.pipeline import Pending
from .errors import Closed, Conflict, LeaseRefused, NotFound, StoreError
from .keeper import AsyncKeeper, Keeper, Lost
from .runs import (
    Claimed,
    Current,
    Held,
    Hold,
    Release,
    check_max_takeovers,
    check_owner,
    check_record,
    check_ttl,
)

log = logging.getLogger(__name__)

#: How long one claim of a loop blocks (ms): a stopping worker's loops end within it. A
#: run that becomes claimable wakes the claim at once, whatever this is.
POLL = 500
#: How long ``AsyncWorker`` lets a handler run on after its lease was lost before it
#: cancels the handler's task (s, by default).
GRACE = 1.0

#: What became of a run a handler had (``Worker.stats`` keys, the telemetry's outcome).
DONE = "done"  # the handler returned bytes: written with Release()
RELEASED = "released"  # the handler returned None: released without a write
FAILED = "failed"  # the handler raised: released, logged
LOST = "lost"  # the lease was lost: another node may carry on; nothing written after
STOPPED = "stopped"  # the worker stopped first: released


class Job:
    """A run a worker's handler has: ``run``, ``current`` (its record, revision and holder
    as claimed, then as the handler's own writes left it), :meth:`write` for a checkpoint
    and ``lost`` (the lease is gone: stop, nothing more of this run's will land)."""

    def __init__(self, claimed: Claimed, owner: str, store: Any) -> None:
        self.run = claimed.run
        self.current: Current = claimed.current
        self._owner = owner
        self._store = store
        self._lost = threading.Event()
        self._stopping: Callable[[], bool] = lambda: False

    @property
    def lost(self) -> bool:
        """Whether the lease was lost (the keeper could not renew it in time, or a write
        was refused): the run may be another node's now, and no write of this job lands."""
        return self._lost.is_set()

    @property
    def stopping(self) -> bool:
        """Whether the worker is stopping: a long handler may write a checkpoint and return
        ``None`` (the run is released and claimed again later, from the checkpoint)."""
        return self._stopping()

    def _written(self, record: bytes) -> None:
        # A write by the holder: the next revision, takeovers counted from 0 again.
        self.current = dataclasses.replace(
            self.current, revision=self.current.revision + 1, record=record,
            holder=Held(self._owner, True), takeovers=0)

    def _refused(self, error: StoreError) -> None:
        if isinstance(error, (Conflict, LeaseRefused, NotFound)):
            self._lost.set()  # fenced out: another node wrote or holds it

    def write(self, record: bytes) -> None:
        """Write ``record`` as the run's next revision, keeping the lease (``Hold``): a
        checkpoint. The revision is tracked: the handler never counts. Raises
        ``LeaseRefused`` or ``Conflict`` when the run is no longer this worker's (then
        :attr:`lost` is true and nothing was written)."""
        record = check_record(record)
        try:
            self._store.compare_and_set(self.run, self.current.revision, record,
                                        Hold(self._owner))
        except StoreError as error:
            self._refused(error)
            raise
        self._written(record)


class AsyncJob(Job):
    """:class:`Job` of an :class:`AsyncWorker`: ``await job.write(record)``."""

    async def write(self, record: bytes) -> None:  # type: ignore[override]
        """:meth:`Job.write` without blocking the event loop."""
        record = check_record(record)
        try:
            await self._store.compare_and_set(self.run, self.current.revision, record,
                                              Hold(self._owner))
        except StoreError as error:
            self._refused(error)
            raise
        self._written(record)


def _pipelined(store: Any) -> bool:
    """Whether the store finishes a run and claims the next in one round trip: a Redis
    store of one partition (a claim over partitions spans nodes; memory has no pipeline)."""
    from .core.partitions import PartitionedOps

    return hasattr(store, "pipeline") and not isinstance(getattr(store, "_ops", None),
                                                         PartitionedOps)


class _Core:
    """What both workers share: the arguments, the jobs held, the outcome of a handler."""

    def __init__(self, store: Any, owner: str, handler: Callable[[Any], Any], *, ttl: int,
                 concurrency: int, max_takeovers: int | None, poll: int) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r}")
        if type(concurrency) is not int or not 1 <= concurrency <= 1000:
            raise ValueError(f"concurrency must be an int in [1, 1000], got {concurrency!r}")
        if type(poll) is not int or not 1 <= poll <= 60_000:
            raise ValueError(f"poll must be an int of ms in [1, 60000], got {poll!r}")
        self.store = store
        self.owner, self.ttl = check_owner(owner), check_ttl(ttl)
        self.handler = handler
        self.concurrency = concurrency
        self.max_takeovers = check_max_takeovers(max_takeovers)
        self.poll = poll
        self.one_trip = _pipelined(store)
        #: How many runs ended each way: ``done``, ``released``, ``failed``, ``lost``,
        #: ``stopped``; and ``claimed``.
        self.stats: collections.Counter[str] = collections.Counter()
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._namespace = str(getattr(store, "namespace", ""))
        #: The first error that ended a loop (a store failing is retried, not this).
        self.failure: BaseException | None = None

    @property
    def held(self) -> list[str]:
        """The runs whose handlers are running now."""
        with self._lock:
            return list(self._jobs)

    def _abandon(self) -> None:
        """What a crash does to the jobs: every one is lost to this worker."""
        self._stopping.set()
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job._lost.set()

    @staticmethod
    def _kept(keeper: Keeper, job: Job, since: float) -> bool:
        """Have ``keeper`` hold ``job``'s lease; False when the keeper is closed (the
        worker was killed as the claim came back): the job is lost, never handled."""
        try:
            keeper.add(job.run, since=since)
        except Closed:
            job._lost.set()
            return False
        return True

    def _lost(self, lost: Lost) -> None:
        """The keeper gave ``lost.run`` up: its job is told."""
        with self._lock:
            job = self._jobs.get(lost.run)
        if job is not None:
            job._lost.set()
        log.warning("redisstore: worker %r lost the lease of %r (%s)", self.owner, lost.run,
                    lost.reason)

    def _took(self, job: Job) -> None:
        job._stopping = self._stopping.is_set
        with self._lock:
            self._jobs[job.run] = job
            self.stats["claimed"] += 1

    def _ended(self, job: Job, outcome: str) -> None:
        with self._lock:
            self._jobs.pop(job.run, None)
            self.stats[outcome] += 1
        telemetry.worker_run(self._namespace, outcome)

    def _outcome(self, job: Job, result: Any, error: BaseException | None
                 ) -> tuple[str, bytes | None]:
        """What the handler's answer means: (outcome, record to write or None)."""
        if job.lost:
            return LOST, None
        if error is not None:
            log.error("redisstore: worker %r: the handler failed on %r; the run is released",
                      self.owner, job.run, exc_info=error)
            return FAILED, None
        if result is None:
            return (STOPPED if self._stopping.is_set() else RELEASED), None
        try:
            return DONE, check_record(result)
        except (TypeError, ValueError) as bad:
            log.error("redisstore: worker %r: the handler of %r returned %r, not bytes or "
                      "None; the run is released", self.owner, job.run, type(result).__name__,
                      exc_info=bad)
            return FAILED, None

    def _claim_failed(self, error: StoreError) -> float:
        """A claim failed: say so; how long to pause (s) before the next."""
        log.warning("redisstore: worker %r: a claim failed (%r); trying again", self.owner,
                    error)
        return min(self.poll, 1000) / 1000

    def _loop_ended(self, error: BaseException) -> None:
        """A bug ended a loop: keep the first such error, say so."""
        self.failure = self.failure or error
        log.error("redisstore: worker %r: a loop ended", self.owner, exc_info=error)

    def _queue_step(self, pipe: Any, finish: tuple[Job, str, bytes | None]
                    ) -> Callable[[], list[Any]]:
        """Queue in ``pipe`` the finish of the last run and the claim of the next; what
        settles the finish and answers the claim."""
        job, outcome, record = finish
        answer = self._queue_finish(pipe, job, outcome, record)
        nxt = pipe.claim(self.owner, self.ttl, records=True, block=self.poll,
                         max_takeovers=self.max_takeovers)

        def settled() -> list[Any]:
            self._settled(job, outcome, answer)
            got: list[Any] = nxt.result()
            return got

        return settled

    def _queue_finish(self, pipe: Any, job: Job, outcome: str, record: bytes | None
                      ) -> Callable[[], Any]:
        """Queue the run's finish in ``pipe``; what answers it."""
        if outcome == LOST:
            return lambda: None  # nothing of this run's: it may be another node's now
        queued: Pending[Any] = (
            pipe.compare_and_set(job.run, job.current.revision, record, Release())
            if record is not None else pipe.release(self.owner, [job.run]))
        return queued.result

    def _settled(self, job: Job, outcome: str, answer: Callable[[], Any]) -> None:
        """Count the run's end by the answer of its finish."""
        try:
            answer()
        except StoreError as error:
            self._finished(job, outcome, error)
        else:
            self._finished(job, outcome, None)

    def _finish(self, job: Job, outcome: str, record: bytes | None) -> Any:
        """Finish the run alone (no pipeline): the store's call (a coroutine, on an
        asyncio store), or None for a lost lease (nothing of it is the worker's now)."""
        if outcome == LOST:
            return None
        if record is not None:
            return self.store.compare_and_set(job.run, job.current.revision, record,
                                              Release())
        return self.store.release(self.owner, [job.run])

    def _finished(self, job: Job, outcome: str, error: BaseException | None) -> None:
        """Count the run's end; a finish the store refused means the lease was lost."""
        if isinstance(error, (Conflict, LeaseRefused, NotFound)):
            outcome = LOST
            log.info("redisstore: worker %r: %r was taken over before it finished (%s)",
                     self.owner, job.run, type(error).__name__)
        elif error is not None:
            log.warning("redisstore: worker %r: finishing %r failed (%r); its lease runs out "
                        "and another claim takes it", self.owner, job.run, error)
        self._ended(job, outcome)


class Worker(_Core):
    """Runs ``handler(job)`` for each run it claims, ``concurrency`` at a time, on threads
    of its own (docs/worker.md).

    - It claims with :meth:`~redisstore.RedisRunStore.claim` (ready runs and expired
      leases, in due order; ``max_takeovers`` quarantines a poison run), one run per loop,
      blocked until there is one.
    - A :class:`~redisstore.Keeper` of its own holds each lease for ``ttl`` ms (the only
      TTL: the claims use it too). A lease the keeper loses sets ``job.lost``.
    - ``handler(job)`` returns bytes (written with ``Release()``: the new record's wait
      decides when the run is ready again) or ``None`` (released, no write). An exception
      releases the run, is logged and counted. The finish and the next claim go in one
      round trip (a pipeline) on a Redis store of one partition.
    - :meth:`stop` (or leaving ``with``) lets the running handlers return (``job.stopping``
      says so), releases every lease held and closes the keeper.

    ``stats`` counts the runs by how they ended; with OpenTelemetry, the counter
    ``redisstore.worker.runs`` does too.
    """

    def __init__(self, store: Any, owner: str, handler: Callable[[Job], bytes | None], *,
                 ttl: int, concurrency: int = 1, max_takeovers: int | None = None,
                 poll: int = POLL) -> None:
        super().__init__(store, owner, handler, ttl=ttl, concurrency=concurrency,
                         max_takeovers=max_takeovers, poll=poll)
        self._keeper: Keeper | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> Worker:
        """Start the loops (once)."""
        if self._keeper is not None:
            raise RuntimeError("this worker was started already")
        self._keeper = Keeper(self.store, self.owner, self.ttl, on_lost=self._lost)
        self._threads = [threading.Thread(target=self._loop, daemon=True,
                                          name=f"redisstore-worker-{self.owner}-{i}")
                         for i in range(self.concurrency)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, wait up to ``timeout`` s (None: as long as it takes) for the
        running handlers to return and their runs to be finished, then release every lease
        still held and close the keeper."""
        self._stopping.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        if self._keeper is not None:
            self._keeper.close(release=True)

    def kill(self) -> None:
        """Do what a crash does, for tests and demonstrations: stop claiming and renewing
        at once and release nothing. Each running handler sees ``job.lost``; its leases
        run out and other nodes' claims take its runs over (a write of its handlers after
        that is fenced by the revision)."""
        self._abandon()
        if self._keeper is not None:
            self._keeper.close(release=False)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ one loop

    def _loop(self) -> None:
        finish: tuple[Job, str, bytes | None] | None = None
        while True:
            try:
                claimed, since = self._next(finish)
            except StoreError as error:
                self._stopping.wait(self._claim_failed(error))
                claimed = None
            except BaseException as error:  # a bug: the loop ends, the worker says why
                self._loop_ended(error)
                return
            finish = None  # sent once, whatever came of it
            if claimed is None:
                if self._stopping.is_set():
                    return
                continue
            finish = self._work(claimed, since)

    def _next(self, finish: tuple[Job, str, bytes | None] | None
              ) -> tuple[Claimed | None, float]:
        """Finish the last run (if any) and, unless stopping, claim the next; both in one
        round trip where the store pipelines."""
        assert self._keeper is not None
        stopping = self._stopping.is_set()
        since = time.monotonic()
        if finish is not None:
            self._keeper.discard(finish[0].run)  # never renewed once its finish is sent
        if finish is not None and self.one_trip and not stopping:
            with self.store.pipeline() as pipe:
                step = self._queue_step(pipe, finish)
            got = step()
        else:
            if finish is not None:
                job, outcome, record = finish
                self._settled(job, outcome, lambda: self._finish(job, outcome, record))
            if stopping:
                return None, since
            got = self.store.claim(self.owner, self.ttl, records=True, block=self.poll,
                                   max_takeovers=self.max_takeovers)
        return (got[0] if got else None), since

    def _work(self, claimed: Claimed, since: float) -> tuple[Job, str, bytes | None]:
        assert self._keeper is not None
        job = Job(claimed, self.owner, self.store)
        self._took(job)
        if not self._kept(self._keeper, job, since):
            return job, LOST, None
        result: Any = None
        error: BaseException | None = None
        try:
            result = self.handler(job)
        except Exception as exc:
            error = exc
        outcome, record = self._outcome(job, result, error)
        return job, outcome, record


class AsyncWorker(_Core):
    """:class:`Worker` for an :class:`~redisstore.AsyncRedisRunStore`: ``await
    handler(job)`` in ``concurrency`` tasks, with an :class:`AsyncJob` (``await
    job.write(record)``) and an :class:`~redisstore.AsyncKeeper`. When a lease is lost,
    ``job.lost`` turns true at once, and the handler's task is cancelled ``grace`` seconds
    later if it is still running, so that work outside the store has time to reach a
    clean point. ``start()`` on a running event loop; ``await stop()``; ``async with``.
    """

    def __init__(self, store: Any, owner: str,
                 handler: Callable[[AsyncJob], Awaitable[bytes | None]], *, ttl: int,
                 concurrency: int = 1, max_takeovers: int | None = None, poll: int = POLL,
                 grace: float = GRACE) -> None:
        super().__init__(store, owner, handler, ttl=ttl, concurrency=concurrency,
                         max_takeovers=max_takeovers, poll=poll)
        if type(grace) not in (int, float) or not 0 <= grace <= 3600:
            raise ValueError(f"grace must be seconds in [0, 3600], got {grace!r}")
        self.grace = float(grace)
        self._keeper: AsyncKeeper | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._handlers: dict[str, asyncio.Task[Any]] = {}

    def start(self) -> AsyncWorker:
        """Start the loops as tasks of the running event loop (once)."""
        if self._keeper is not None:
            raise RuntimeError("this worker was started already")
        self._keeper = AsyncKeeper(self.store, self.owner, self.ttl, on_lost=self._lost)
        self._tasks = [asyncio.get_running_loop().create_task(self._loop())
                       for _ in range(self.concurrency)]
        return self

    async def stop(self, timeout: float | None = None) -> None:
        """:meth:`Worker.stop` without blocking the event loop; a handler still running
        after ``timeout`` s is cancelled."""
        self._stopping.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._keeper is not None:
            await self._keeper.aclose(release=True)

    def kill(self) -> None:
        """:meth:`Worker.kill`: the loops and the handlers' tasks are cancelled at once."""
        self._abandon()
        for task in (*self._tasks, *self._handlers.values()):
            task.cancel()
        if self._keeper is not None:
            self._keeper._stop(False)  # its thread ends on its own; nothing is released

    async def __aenter__(self) -> AsyncWorker:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _lost(self, lost: Lost) -> None:
        super()._lost(lost)
        task = self._handlers.get(lost.run)
        if task is not None and not task.done():
            # Time for the handler to reach a clean point first: its side effects outside
            # the store are its own; its writes to the store are fenced already.
            asyncio.get_running_loop().call_later(self.grace, task.cancel)

    async def _loop(self) -> None:
        finish: tuple[Job, str, bytes | None] | None = None
        while True:
            try:
                claimed, since = await self._next(finish)
            except StoreError as error:
                await asyncio.sleep(self._claim_failed(error))
                claimed = None
            except Exception as error:  # a bug: the loop ends, the worker says why
                self._loop_ended(error)
                return
            finish = None  # sent once, whatever came of it
            if claimed is None:
                if self._stopping.is_set():
                    return
                continue
            finish = await self._work(claimed, since)

    async def _next(self, finish: tuple[Job, str, bytes | None] | None
                    ) -> tuple[Claimed | None, float]:
        assert self._keeper is not None
        stopping = self._stopping.is_set()
        since = time.monotonic()
        if finish is not None:
            self._keeper.discard(finish[0].run)
        if finish is not None and self.one_trip and not stopping:
            async with self.store.pipeline() as pipe:
                step = self._queue_step(pipe, finish)
            got = step()
        else:
            if finish is not None:
                job, outcome, record = finish
                try:
                    call = self._finish(job, outcome, record)
                    if call is not None:
                        await call
                except StoreError as error:
                    self._finished(job, outcome, error)
                else:
                    self._finished(job, outcome, None)
            if stopping:
                return None, since
            got = await self.store.claim(self.owner, self.ttl, records=True, block=self.poll,
                                         max_takeovers=self.max_takeovers)
        return (got[0] if got else None), since

    async def _work(self, claimed: Claimed, since: float) -> tuple[Job, str, bytes | None]:
        assert self._keeper is not None
        job = AsyncJob(claimed, self.owner, self.store)
        self._took(job)
        if not self._kept(self._keeper, job, since):
            return job, LOST, None
        task = asyncio.get_running_loop().create_task(self.handler(job))
        self._handlers[job.run] = task
        result: Any = None
        error: BaseException | None = None
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():  # this loop was cancelled (stop's timeout): pass it on
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise
            job._lost.set()  # cancelled after its lease was lost
        except Exception as exc:
            error = exc
        finally:
            self._handlers.pop(job.run, None)
        return (job, *self._outcome(job, result, error))
