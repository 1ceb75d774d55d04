"""The worker loop: claim, keep, work, finish and claim the next, retry, lose the lease, stop;
written once here so that an engine does not write it (docs/worker.md).

``Worker(store, owner, handler, ttl=...)`` runs ``concurrency`` loops on threads of its
own; ``AsyncWorker`` runs them as tasks, with an async handler. The loop itself is written
once, as a generator of the steps it takes (:meth:`_Core._loop`: a store call, a handler
to run, a wait for work): the sync worker takes each step on its thread, the asyncio one
awaits it. Each loop claims one run at a time with ``claim`` (ready runs and expired
leases; an asyncio worker's loops at concurrency, together: one claim for as many runs as
loops wait, :class:`_Claims`), has the worker's keeper hold its lease (the one ``ttl``,
given once), and hands the handler a :class:`Job`. Every write of a job is fenced by its
grant: the lease token its claim took (``Fenced``) and its revision, so a job whose run was
claimed again (a worker paused past its TTL, a stop that gave up waiting) never lands
anything. What the handler returns finishes the run in the script that claims the next
(a store of one partition; alone where the claims go together), and the finish is counted
as the server answered it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..core import telemetry
from ..core.driver import Settled, next_step
from ..core.errors import Closed, Conflict, LeaseRefused, NotFound, SessionLapsed, StoreError
from ..core.runops import fusable, fused
from ..core.runs import (
    MAX_CLAIM,
    MAX_ERROR,
    MAX_RECORD,
    Claimed,
    Current,
    Failure,
    Fenced,
    Held,
    check_flag,
    check_int,
    check_max_takeovers,
    check_owner,
    check_record,
    check_ttl,
)
from .keeper import AsyncKeeper, Keeper, Lost

log = logging.getLogger("redisstore.worker")  # the name it always had

#: How long (ms) an idle loop waits for work before it claims again on its own (a run that
#: becomes claimable wakes it at once, and so does stop()).
POLL = 500
#: How long ``AsyncWorker`` lets a handler run on after its lease was lost before it
#: cancels the handler (s, by default).
GRACE = 1.0

#: How long (s) an asyncio worker's stop waits for the tasks it cancelled at its timeout:
#: a handler that ignores the cancel is left behind (its lease released: nothing of it lands).
CANCELLED = 0.1

#: What became of a run a handler had (``Worker.stats`` keys, the telemetry's outcome).
DONE = "done"  # the handler returned bytes: written, the run freed
RELEASED = "released"  # the handler returned None: freed without a write
STOPPED = "stopped"  # the same while the worker was stopping
FAILED = "failed"  # a failed try (the handler raised, or returned what the store refuses)
QUARANTINED = "quarantined"  # a failed try that quarantined the run (its last, or final)
LOST = "lost"  # the grant was lost: nothing of the job landed after
UNKNOWN = "unknown"  # the finish was sent and its answer lost: the lease runs out


class Unrecoverable(Exception):
    """Raise it from a handler to fail its run for good: no retry, the run goes to the
    quarantine at once (``quarantined()`` lists it under ``failed``, reason ``final``), as
    BullMQ's ``UnrecoverableError`` and River's ``JobCancel`` do."""


class _Expired(Exception):
    """Why a run whose every try ran out of its lease is quarantined."""


@dataclass(frozen=True, slots=True)
class Retry:
    """How a worker retries a run whose handler failed: up to ``attempts`` tries in all
    (None: no end), each failed one held back from the claims (the run's ``not_before``)
    for an exponential back-off: ``base`` ms, times ``factor`` for each try before, at most
    ``cap`` ms, less up to ``jitter`` of it at random (so that runs that failed together do
    not come back together). After the last try the run goes to the quarantine. Expired
    leases count as tries too (``Current.attempts``)."""

    attempts: int | None = 10
    base: int = 1_000
    factor: float = 2.0
    cap: int = 600_000
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.attempts is not None:
            check_int("attempts", self.attempts, minimum=1, maximum=2**31)
        check_int("base", self.base, minimum=0)
        check_int("cap", self.cap, minimum=0)
        if type(self.factor) not in (int, float) or not 1 <= self.factor <= 1000:
            raise ValueError(f"factor must be a number in [1, 1000], got {self.factor!r}")
        if type(self.jitter) not in (int, float) or not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be a fraction in [0, 1], got {self.jitter!r}")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> int:
        """The back-off (ms) after failed try number ``attempt`` (1 for the first)."""
        exponent = min(max(attempt - 1, 0), 200)  # base * factor**200 passes any cap
        delay = min(self.base * self.factor ** exponent, self.cap)
        return int(delay * (1 - self.jitter * rand()))


def _error_text(error: BaseException) -> str:
    """An error as the quarantine keeps it: its type and message, at most MAX_ERROR bytes
    of UTF-8 (cut at a character)."""
    text = str(error) if isinstance(error, _Expired) else f"{type(error).__name__}: {error}"
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_ERROR:
        return text
    return raw[:MAX_ERROR].decode("utf-8", "ignore")


class Job:
    """A run a worker's handler has: ``run``, ``current`` (its record, revision, holder,
    token and attempts as claimed, then as the handler's own writes left it),
    :meth:`write` for a checkpoint, ``lost`` (the grant is gone: nothing more of the job
    lands, nothing more is sent) and ``stopping``."""

    def __init__(self, claimed: Claimed, owner: str, store: Any, since: float) -> None:
        self.run = claimed.run
        self.current: Current = claimed.current
        #: The grant the claim took: every write of the job is fenced by it.
        self.fence = Fenced(owner, claimed.current.token or 1)
        self._owner = owner
        self._store = store
        self._since = since
        self._lost = threading.Event()
        self._stopping: Callable[[], bool] = lambda: False
        #: Its key among the worker's jobs (one per claim), and whether the asyncio worker
        #: cancelled its handler because the lease was lost.
        self._key = -1
        self._cancelled = False

    @property
    def token(self) -> int:
        """The lease token of the claim that took the run (``Current.token``)."""
        return self.fence.token

    @property
    def lost(self) -> bool:
        """Whether the grant was lost (the keeper could not renew it in time, a write was
        refused, or the worker was killed): the run may be another's now, and nothing of
        this job is sent any more."""
        return self._lost.is_set()

    @property
    def stopping(self) -> bool:
        """Whether the worker is stopping: a long handler may write a checkpoint and return
        ``None`` (the run is released and claimed again later, from the checkpoint)."""
        return self._stopping()

    def _refusal(self) -> LeaseRefused:
        """Why a write of a lost job is refused without being sent."""
        return LeaseRefused(Held(self._owner, False))

    def _written(self, record: bytes) -> None:
        # A checkpoint: the next revision; the lease, its grant and the counters stay.
        self.current = dataclasses.replace(self.current, revision=self.current.revision + 1,
                                           record=record, holder=Held(self._owner, True))

    def _refused(self, error: StoreError) -> None:
        if isinstance(error, Conflict | LeaseRefused | NotFound):
            self._lost.set()  # fenced out: another grant or another write came

    def _checkpoint(self, record: bytes) -> Generator[_Call, Any, None]:
        """:meth:`write` as the one step it takes (the store's call), for both jobs: a lost
        job's write is refused unsent, a refused one marks the job lost."""
        if self.lost:
            raise self._refusal()
        try:
            yield _Call(functools.partial(self._store.compare_and_set, self.run,
                                          self.current.revision, record, self.fence))
        except StoreError as error:
            self._refused(error)
            raise
        self._written(record)

    def write(self, record: bytes) -> None:
        """Write ``record`` as the run's next revision under the job's grant, keeping the
        lease (``Fenced``): a checkpoint; the revision is tracked. Raises ``LeaseRefused``
        or ``Conflict`` when the run is no longer this job's (then :attr:`lost` is true and
        nothing was written); once :attr:`lost`, raises ``LeaseRefused`` without sending."""
        _calls(self._checkpoint(record))


class _Claims:
    """The claims of an :class:`AsyncWorker`'s loops, sent together: one in flight at a
    time; the loops that come meanwhile wait for the next, which takes as many runs as they
    are, up to a claim's limit (MAX_CLAIM; a loop past it waits one more), under the
    worker's session as it is when the claim goes (a loop that came under a session since
    replaced claims under the new one: the keeper keeps the runs of that one).
    Each loop gets one run or none, with the claim's wait, or the claim's error. Once the
    worker stops, no claim is sent: the loops waiting get none. A run no loop is left to
    take (its loop cancelled while the claim was in flight) is given back at once, under
    its own grant; after kill(), nothing is."""

    def __init__(self, worker: AsyncWorker) -> None:
        self._worker = worker
        self._waiting: list[asyncio.Future[tuple[list[Claimed], int]]] = []
        self._task: asyncio.Task[None] | None = None
        #: Runs being given back (their loops gone), for settle() to wait for.
        self._giving: set[asyncio.Task[None]] = set()
        self._killed = False

    async def take(self) -> tuple[list[Claimed], int]:
        """One run (or none, and the wait), from the next claim."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[list[Claimed], int]] = loop.create_future()
        self._waiting.append(future)
        if self._task is None:
            self._task = loop.create_task(self._send())
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelled as its run came (stop's timeout): no handler will have it.
            if future.done() and not future.cancelled() and future.exception() is None:
                self._give_back(future.result()[0])
            raise

    async def settle(self, timeout: float | None) -> None:
        """Until the claim in flight was answered, its runs handed out, and every run no
        loop took given back; or ``timeout`` s (None: no bound), after which they finish on
        their own (stop returns by its timeout; a claim's reply may come later than that)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._task is not None or self._giving:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            await asyncio.wait([t for t in (self._task, *self._giving) if t is not None],
                               timeout=left)

    def cancel(self) -> None:
        """Stop sending and giving back (the worker was killed): a claim in flight is
        abandoned, its runs' leases run out."""
        self._killed = True
        for task in (self._task, *self._giving):
            if task is not None:
                task.cancel()

    def _give_back(self, runs: list[Claimed]) -> None:
        if self._killed:
            return
        for claimed in runs:
            task = asyncio.get_running_loop().create_task(
                _acalls(self._worker._give_back(claimed)))
            self._giving.add(task)
            task.add_done_callback(self._giving.discard)

    async def _send(self) -> None:
        try:
            while self._waiting:
                if self._worker._stopping.is_set():
                    # No claim once the worker stops: the loops waiting see it and end.
                    for future in self._waiting:
                        if not future.done():
                            future.set_result(([], 0))
                    self._waiting = []
                    return
                # At most a claim's limit of them (a worker may run 1,000 loops).
                waiting = [future for future in self._waiting if not future.done()]
                batch, self._waiting = waiting[:MAX_CLAIM], waiting[MAX_CLAIM:]
                keeper = self._worker._keeper
                if batch:
                    await self._one(None if keeper is None else keeper.session, batch)
        except BaseException as error:
            # A bug here (or the worker killed): no loop waits for this claim forever.
            for future in self._waiting:
                if not future.done():
                    future.set_exception(error if isinstance(error, Exception)
                                         else RuntimeError("the worker's claims stopped"))
            self._waiting = []
            raise
        finally:
            self._task = None

    async def _one(self, session: str | None,
                   batch: list[asyncio.Future[tuple[list[Claimed], int]]]) -> None:
        try:
            runs, wait = await self._worker._claim_many(session, len(batch))
        except Exception as error:  # each loop decides, as it does of its own claim's
            for future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        runs = list(runs)
        for future in batch:
            if not future.done():
                future.set_result(([runs.pop(0)] if runs else [], wait))
        self._give_back(runs)  # their loops were cancelled meanwhile


class AsyncJob(Job):
    """:class:`Job` of an :class:`AsyncWorker`: ``await job.write(record)``."""

    async def write(self, record: bytes) -> None:  # type: ignore[override]
        """:meth:`Job.write` without blocking the event loop."""
        await _acalls(self._checkpoint(record))


@dataclass(slots=True)
class _Finish:
    """How a job ends, once its handler returned: ``outcome`` (a stats key), the record to
    write (``DONE``) or the failure to report (``FAILED``); ``LOST`` sends nothing."""

    job: Job
    outcome: str
    record: bytes | None = None
    failure: Failure | None = None


# The steps the loop asks its driver to take (what _Core._loop yields).
@dataclass(frozen=True, slots=True)
class _Call:
    """Run a store call (``call()`` builds it: on an asyncio store, a coroutine)."""

    call: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class _Handle:
    """Run the handler on ``job``; answers (result, error)."""

    job: Job


@dataclass(frozen=True, slots=True)
class _Wait:
    """Wait for work: a wake-up, ``wait`` ms (the claim's: -1, none due), POLL, or stop."""

    wait: int
    since: float


@dataclass(frozen=True, slots=True)
class _Sleep:
    """Pause ``seconds`` (after a failed claim), or less if the worker stops."""

    seconds: float


_Step: TypeAlias = _Call | _Handle | _Wait | _Sleep
_Loop: TypeAlias = Generator[_Step, Any, None]
def _calls(steps: Generator[_Call, Any, None]) -> None:
    """Make each call ``steps`` yields, on this thread; its answer (or error) sent back."""
    value, error = None, None
    while (step := next_step(steps, value, error)) is not None:
        try:
            value, error = step.call(), None
        except Exception as exc:  # the store's answer: the steps decide
            value, error = None, exc


async def _acalls(steps: Generator[_Call, Any, None]) -> None:
    """:func:`_calls` of an asyncio store: each call awaited."""
    value, error = None, None
    while (step := next_step(steps, value, error)) is not None:
        try:
            value, error = await step.call(), None
        except Exception as exc:  # the store's answer: the steps decide
            value, error = None, exc


def _scripted(store: Any) -> bool:
    """Whether the store is a Redis store, whose claims answer their wait (the ms until the
    next run is due) beside their runs (memory's claims wait on its condition)."""
    return hasattr(store, "_ops") and hasattr(store, "_write")


def _one_trip(store: Any) -> bool:
    """Whether the store finishes a run and claims the next in one script: a Redis store of
    one partition (a claim over partitions spans nodes; memory has no scripts)."""
    from ..core.runops import RunOps

    # One partition's operations are a RunOps; a store of partitions' are not (they stand
    # beside it, on the same generated declarations).
    ops = getattr(store, "_ops", None)
    return _scripted(store) and isinstance(ops, RunOps)


class _Core:
    """What both workers share: the arguments, the jobs, the loop (as a generator of
    steps) and what each outcome counts."""

    def __init__(self, store: Any, owner: str, handler: Callable[[Any], Any], *, ttl: int,
                 concurrency: int, max_takeovers: int | None, poll: int,
                 retry: Retry | None, sessions: bool = True) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r}")
        if type(concurrency) is not int or not 1 <= concurrency <= 1000:
            raise ValueError(f"concurrency must be an int in [1, 1000], got {concurrency!r}")
        if type(poll) is not int or not 1 <= poll <= 60_000:
            raise ValueError(f"poll must be an int of ms in [1, 60000], got {poll!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"retry must be a Retry or None, not {type(retry).__name__}")
        self.store = store
        self.owner, self.ttl = check_owner(owner), check_ttl(ttl)
        self.handler = handler
        self.concurrency = concurrency
        self.max_takeovers = check_max_takeovers(max_takeovers)
        self.poll = poll
        #: The retry policy (None: ``Retry()``, a bounded back-off).
        self.retry = Retry() if retry is None else retry
        #: Whether the worker holds its runs under one session (where the store keeps
        #: them): one keepalive a period, whatever the number of runs.
        self.sessions = check_flag("sessions", sessions)
        self.scripted = _scripted(store)
        #: Whether a run's finish goes in the script that claims the next (a Redis store of
        #: one partition; not where the loops' claims are sent together, below).
        self.one_trip = _one_trip(store)
        self._fuse = self.one_trip
        #: The store's cap on a record: a result over it is a failed try, not a crash.
        ops = getattr(store, "_ops", None)
        self.max_record_bytes: int = getattr(ops, "max_record_bytes", MAX_RECORD)
        #: How many runs ended each way (``done``, ``released``, ``stopped``, ``failed``,
        #: ``quarantined``, ``lost``, ``unknown``), and ``claimed``.
        self.stats: collections.Counter[str] = collections.Counter()
        self._jobs: dict[int, Job] = {}
        #: Jobs whose finish is out (see _finishing).
        self._unfinished: dict[int, Job] = {}
        self._latest: dict[str, Job] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._reopening = threading.Lock()
        self._stopping = threading.Event()
        #: When a worker whose session lapsed in some partitions tries again to open a new
        #: one, after a try that failed (monotonic).
        self._reopen_after = 0.0
        self._namespace = str(getattr(store, "namespace", ""))
        #: The first error that stopped the worker: a handler's ``BaseException`` that is not
        #: an ``Exception`` (``SystemExit``...), or a bug of a loop. None while it runs.
        self.failure: BaseException | None = None

    @property
    def held(self) -> list[str]:
        """The runs whose handlers are running now (a lease the worker still holds for a
        run whose handler returned is not listed)."""
        with self._lock:
            return sorted({job.run for job in self._jobs.values()})

    # ------------------------------------------------------------------ the loop

    def _loop(self, keeper: Keeper) -> _Loop:
        """One loop of the worker, as the steps it takes: claim (with the last run's finish,
        in one script where the store allows), work, finish; wait when there is no work.
        Any outcome of a run is counted and the loop goes on; it ends once stopping."""
        finish: _Finish | None = None
        while True:
            if finish is not None and finish.outcome == LOST:
                self._count(finish.job, LOST)  # nothing of it is sent
                finish = None
            if self._stopping.is_set():
                if finish is not None:
                    yield from self._finish_alone(finish)
                return
            session = keeper.session
            if session is not None and keeper.lapsed_in \
                    and time.monotonic() >= self._reopen_after:
                # Its session lapsed in some partitions (their node was away past the ttl):
                # its claims leave those out, so a new session for the claims to come; the
                # keeper keeps the old one alive while it holds runs of it. Not opened (the
                # node of partition 0 away): the old one serves on, tried again a keeper's
                # period later (each try may wait for that node its deadline).
                try:
                    self._reopen(keeper, session)
                except StoreError:
                    self._reopen_after = time.monotonic() + keeper.renew_every / 1000
            since = time.monotonic()
            try:
                if finish is not None and self._fuse:
                    try:
                        claim = self._fused(finish, keeper.session)
                    except Exception as bad:
                        # The result's own checks refused it (over the store's cap, a
                        # record discover refuses): a failed try, finished as one.
                        finish = self._failed(finish.job, bad)
                        continue
                    settled, got = yield from self._finishing(finish.job, claim)
                    self._settled(finish, settled)
                    finish = None
                    claimed, wait = got.unwrap()
                else:
                    if finish is not None:
                        yield from self._finish_alone(finish)
                        finish = None
                        if self._stopping.is_set():
                            return
                    since = time.monotonic()
                    claimed, wait = yield _Call(functools.partial(self._claim,
                                                                  keeper.session))
            except SessionLapsed as lapsed:
                # The worker's session lapsed (its node paused past the ttl): its runs were
                # reported lost; a new session, and on.
                self._reopen(keeper, lapsed.session)
                continue
            except StoreError as failed:
                yield _Sleep(self._claim_failed(failed))
                continue
            if not claimed:
                yield _Wait(wait, since)
                continue
            if self._stopping.is_set():
                # The claim crossed stop() (sent as it came): the run goes back at once,
                # never handed to a handler.
                yield from self._give_back(claimed[0])
                return
            job = self._took(claimed[0], keeper, since)
            if job is None:
                continue
            tries = self.retry.attempts
            if tries is not None and job.current.attempts >= tries:
                # Every try ran out of its lease (a handler that takes its process down,
                # or hangs it): this claim is past the last one, never handed out again.
                self._drop(job)
                keeper.discard(job.run)
                finish = self._failed(job, _Expired(
                    f"the lease ran out on each of {job.current.attempts} tries"))
                continue
            result, raised = yield _Handle(job)
            finish = self._ended(job, keeper, result, raised)

    def _start_session(self, keeper: Keeper) -> None:
        """Open the worker's session where it wants one and the store keeps them (every
        store of this library, of one partition or many)."""
        if self.sessions and hasattr(self.store, "_session_open"):
            keeper.open_session()

    def _reopen(self, keeper: Keeper, lapsed: str) -> None:
        """A new session after ``lapsed`` (once, whichever loop saw it first). Not under
        the worker's lock: the keeper's thread may be reporting lost runs (which takes it)
        before it answers the opening."""
        with self._reopening:
            if keeper.session == lapsed:
                keeper.open_session()

    def _claim(self, session: str | None, limit: int = 1) -> Any:
        """A claim of up to ``limit`` runs, with their records, under the worker's session if
        it has one: (runs, wait). A Redis store's, of one partition or many, answers its
        wait, which the loop sleeps until when nothing came (a dead node's lease or session
        expiring); memory's answers -1 (its claims wait on its condition)."""
        if self.scripted:
            if session is not None:
                return self.store._write(self.store._ops.session_claim(
                    "any", session, self.owner, self.ttl, limit, True, self.max_takeovers))
            return self.store._write(self.store._ops.claim(
                self.owner, self.ttl, limit, records=True, max_takeovers=self.max_takeovers))
        if session is not None:
            runs = self.store._session_claim("any", session, self.owner, self.ttl, limit, True,
                                             0, self.max_takeovers)
        else:
            runs = self.store.claim(self.owner, self.ttl, limit, records=True,
                                    max_takeovers=self.max_takeovers)
        return runs, -1

    def _claim_many(self, session: str | None, limit: int) -> Any:
        """:meth:`_claim` of up to ``limit`` runs, past any batching of the claims."""
        return _Core._claim(self, session, limit)

    def _fused(self, finish: _Finish, session: str | None) -> Callable[[], Any]:
        """The finish of the last run and the claim of the next, as one script. Building it
        checks the finish's arguments and runs discover on its record: either may raise."""
        ops = self.store._ops
        job = finish.job
        first = ops.finish(job.run, job.current.revision, job.fence, record=finish.record,
                           failure=finish.failure)
        call = next(first)
        if session is not None:
            then = ops.session_claim("any", session, self.owner, self.ttl, 1, True,
                                     self.max_takeovers)
        else:
            then = ops.claim(self.owner, self.ttl, records=True,
                             max_takeovers=self.max_takeovers)
        then_call = next(then)
        assert fusable(call, then_call)
        op = fused((first, call), (then, then_call))
        return lambda: self.store._write(op)

    def _finishing(self, job: Job, call: Callable[[], Any]) -> Generator[_Call, Any, Any]:
        """The call that finishes ``job``, with the job listed as finishing while it is out:
        a loop cut off there (its task cancelled by stop's timeout, the finish perhaps never
        sent) leaves it listed, and stop gives its run up as a running handler's."""
        with self._lock:
            self._unfinished[job._key] = job
        try:
            value = yield _Call(call)
        except GeneratorExit:
            raise  # the loop was cut off here: the job stays listed
        except BaseException:
            with self._lock:
                self._unfinished.pop(job._key, None)
            raise
        with self._lock:
            self._unfinished.pop(job._key, None)
        return value

    def _finish_alone(self, finish: _Finish) -> _Loop:
        """Send the finish of ``finish.job`` by itself (no claim after it)."""
        job = finish.job

        def call() -> Any:
            return self.store.finish(job.run, job.current.revision, job.fence,
                                     record=finish.record, failure=finish.failure)

        try:
            yield from self._finishing(job, call)
        except StoreError as error:
            self._settled(finish, Settled(error=error))
        except Exception as bad:
            yield from self._finish_alone(self._failed(job, bad))
        else:
            self._settled(finish, Settled(None))

    def _give_back(self, claimed: Claimed) -> Generator[_Call, Any, None]:
        """Free a run a claim took as the worker stopped, under that claim's grant."""
        job = self._job(claimed, time.monotonic())
        with contextlib.suppress(StoreError):
            yield _Call(lambda: self.store.finish(job.run, job.current.revision, job.fence))

    def _give_up(self) -> _Loop:
        """After stop's timeout: end the grant of every job whose handler still runs,
        each marked lost first (nothing more of it is sent), each fenced by its own grant:
        a lease another grant of the owner holds now (a process of the same node that took
        the run over) stays. A checkpoint that was in flight moved the revision: the finish
        goes again on the revision the refusal names, fenced all the same."""
        jobs = self._given_up()
        for job in jobs:
            job._lost.set()
        for job in jobs:
            revision = job.current.revision
            for _ in range(3):
                try:
                    yield _Call(functools.partial(self.store.finish, job.run, revision,
                                                  job.fence))
                except Conflict as moved:
                    revision = moved.current
                    continue
                except StoreError:
                    pass  # not this grant's any more, or unanswered: its lease runs out
                break

    def _given_up(self) -> list[Job]:
        """The jobs stop's timeout gives up: those whose handlers still run. (A sync loop
        in its finish goes on to its answer: it is not given up.)"""
        with self._lock:
            return list(self._jobs.values())

    # ------------------------------------------------------------------ bookkeeping

    def _took(self, claimed: Claimed, keeper: Keeper, since: float) -> Job | None:
        """A claimed run's job, held by the keeper from ``since`` (when the claim that took
        it was sent); None when the keeper is closed (the worker was killed as the claim came
        back): the run's lease runs out."""
        job = self._job(claimed, since)
        job._stopping = self._stopping.is_set
        with self._lock:
            self.stats["claimed"] += 1
            older = self._latest.get(job.run)
            if older is not None:
                older._lost.set()  # claimed again: that grant is over
            self._latest[job.run] = job
            job._key = next(self._ids)
            self._jobs[job._key] = job
        try:
            keeper.add(job.run, since=since)
        except Closed:
            job._lost.set()
            self._drop(job)
            return None
        return job

    def _job(self, claimed: Claimed, since: float) -> Job:
        return Job(claimed, self.owner, self.store, since)

    def _drop(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job._key, None)
            if self._latest.get(job.run) is job:
                del self._latest[job.run]

    def _ended(self, job: Job, keeper: Keeper, result: Any, error: BaseException | None
               ) -> _Finish:
        """The handler returned (or raised): what finishes the run."""
        self._drop(job)
        with self._lock:
            if self._latest.get(job.run) is None:
                keeper.discard(job.run)  # its finish goes now: no renewal after it
        if job.lost:
            return _Finish(job, LOST)
        if error is not None and not isinstance(error, Exception):
            # SystemExit, KeyboardInterrupt...: the worker stops as stop() does; the run is
            # released for another node.
            self.failure = self.failure or error
            self._stopping.set()
            log.error("redisstore: worker %r: a handler raised %r on %r: the worker stops",
                      self.owner, error, job.run)
            return _Finish(job, STOPPED)
        if error is not None:
            return self._failed(job, error)
        if result is None:
            return _Finish(job, STOPPED if self._stopping.is_set() else RELEASED)
        try:
            record = check_record(result, self.max_record_bytes)
        except (TypeError, ValueError) as bad:
            return self._failed(job, bad)
        return _Finish(job, DONE, record=record)

    def _failed(self, job: Job, error: BaseException) -> _Finish:
        outcome, failure = self._failure(job, error)
        return _Finish(job, outcome, failure=failure)

    def _failure(self, job: Job, error: BaseException) -> tuple[str, Failure]:
        """A failed try of ``job``: logged once with the run named; the Failure its finish
        reports (the back-off of its try, its last try quarantines)."""
        final = isinstance(error, Unrecoverable | _Expired)
        attempt = job.current.attempts + 1
        attempts = self.retry.attempts
        last = final or (attempts is not None and attempt >= attempts)
        log.error("redisstore: worker %r: run %r failed (try %d%s): %s", self.owner, job.run,
                  attempt, ", for good" if final else
                  "" if attempts is None else f" of {attempts}",
                  "quarantined" if last else "retried later", exc_info=error)
        return (QUARANTINED if last else FAILED), Failure(
            _error_text(error), self.retry.delay(attempt), attempts, final)

    def _settled(self, finish: _Finish, settled: Settled[Any]) -> None:
        """Count the run's end by the answer of its finish."""
        job, outcome = finish.job, finish.outcome
        error = settled.error
        if isinstance(error, Conflict | LeaseRefused | NotFound):
            job._lost.set()
            log.info("redisstore: worker %r: %r was taken before it finished (%s)",
                     self.owner, job.run, type(error).__name__)
            outcome = LOST
        elif error is not None:
            log.warning("redisstore: worker %r: finishing %r failed (%r); its lease runs out "
                        "and another claim takes it", self.owner, job.run, error)
            outcome = UNKNOWN
        self._count(job, outcome)

    def _count(self, job: Job, outcome: str) -> None:
        with self._lock:
            self.stats[outcome] += 1
            if outcome == QUARANTINED:
                self.stats[FAILED] += 1
        telemetry.worker_run(self._namespace, outcome)

    def _lost(self, lost: Lost) -> None:
        """The keeper gave ``lost.run`` up: its job is told."""
        with self._lock:
            job = self._latest.get(lost.run)
        if job is not None:
            job._lost.set()
        log.warning("redisstore: worker %r lost the lease of %r (%s)", self.owner, lost.run,
                    lost.reason)

    def _claim_failed(self, error: StoreError) -> float:
        """A claim failed: say so; how long to pause (s) before the next."""
        log.warning("redisstore: worker %r: a claim failed (%r); trying again", self.owner,
                    error)
        return min(self.poll, 1000) / 1000

    def _abandon(self) -> None:
        """What a crash does to the jobs: every one is lost to this worker."""
        self._stopping.set()
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job._lost.set()

    def _advance(self, loop: _Loop, value: Any, error: Exception | None) -> _Step | None:
        """The next step of ``loop``, given the last one's ``value`` or ``error`` (thrown
        in); None once it ended, or died of a bug (then the worker stops and says why).
        The bookkeeping of both workers' loops: each only takes the step, sync or awaited."""
        try:
            return next_step(loop, value, error)
        except BaseException as bug:  # a bug of the loop: the worker stops, says why
            self._loop_died(bug)
            return None

    def _loop_died(self, error: BaseException) -> None:
        """A bug ended a loop: the worker says so and stops (its leases are released by
        stop(), or run out)."""
        self.failure = self.failure or error
        self._stopping.set()
        log.error("redisstore: worker %r: a loop ended; the worker stops", self.owner,
                  exc_info=error)


class Worker(_Core):
    """Runs ``handler(job)`` for each run it claims, ``concurrency`` at a time, on threads
    of its own (docs/worker.md).

    - It claims with :meth:`~redisstore.RedisRunStore.claim` (ready runs and expired
      leases, in due order; ``max_takeovers`` quarantines a poison run), one run per loop.
    - Its runs are held under one :class:`~redisstore.Session` of its own, kept alive by a
      :class:`~redisstore.Keeper` of its own (one keepalive a period, whatever the number
      of runs; ``ttl``, the only TTL, is the session's); a run taken from the session, or
      every run once it lapsed, sets ``job.lost``, and a lapsed session is replaced. On a
      store of partitions, a session that lapsed in some partitions only costs the jobs
      held there, and is replaced for the claims to come. ``sessions=False`` holds a lease
      per run, renewed by the keeper.
    - Every write of a job is fenced by its grant (``Fenced(owner, job.token)``): after a
      takeover, nothing of it lands.
    - ``handler(job)`` returns bytes (written, the run freed: its new record's wait decides
      when it is ready again) or ``None`` (freed, no write). An exception, or an answer the
      store refuses, is a failed try: logged, counted, the run held back by ``retry``'s
      back-off and quarantined after its last try (``Unrecoverable``: at once). The finish
      and the next claim are one script on a Redis store of one partition.
    - :meth:`stop` (or leaving ``with``) stops claiming at once, lets the running handlers
      return (``job.stopping`` says so), releases every lease held and closes the keeper.

    ``stats`` counts the runs by how they ended; with OpenTelemetry, the counter
    ``redisstore.worker.runs`` does too.
    """

    def __init__(self, store: Any, owner: str, handler: Callable[[Job], bytes | None], *,
                 ttl: int, concurrency: int = 1, max_takeovers: int | None = None,
                 poll: int = POLL, retry: Retry | None = None, sessions: bool = True) -> None:
        super().__init__(store, owner, handler, ttl=ttl, concurrency=concurrency,
                         max_takeovers=max_takeovers, poll=poll, retry=retry,
                         sessions=sessions)
        self._keeper: Keeper | None = None
        self._threads: list[threading.Thread] = []
        self._events: list[threading.Event] = []

    def start(self) -> Worker:
        """Start the loops (once)."""
        if self._keeper is not None:
            raise RuntimeError("this worker was started already")
        self._keeper = Keeper(self.store, self.owner, self.ttl, on_lost=self._lost)
        self._start_session(self._keeper)
        self._events = [threading.Event() for _ in range(self.concurrency)]
        self._threads = [threading.Thread(target=self._drive, args=(event,), daemon=True,
                                          name=f"redisstore-worker-{self.owner}-{i}")
                         for i, event in enumerate(self._events)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming at once, wait up to ``timeout`` s (None: as long as it takes) for
        the running handlers to return and their runs to be finished, then give up the run
        of each handler still running (under its own grant: a lease a newer grant of the
        owner holds stays) and close the keeper. Such a handler is left to its thread,
        its job lost: nothing of it lands."""
        self._halt()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        if self._keeper is not None:
            self._run(self._give_up(), None)
            # A session's close frees what is left in it (this worker's grants alone).
            self._keeper.close(release=self._keeper.session is not None)

    def kill(self) -> None:
        """Do what a crash does, for tests and demonstrations: stop claiming and renewing
        at once and release nothing. Each running handler sees ``job.lost``; its leases
        run out and other nodes' claims take its runs over (a write of its handlers after
        that is fenced by its grant)."""
        self._abandon()
        self._wake_all()
        if self._keeper is not None:
            self._keeper.close(release=False)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _halt(self) -> None:
        self._stopping.set()
        self._wake_all()

    def _wake_all(self) -> None:
        for event in self._events:
            event.set()
        nudge = getattr(self.store, "_nudge", None)
        if nudge is not None:
            nudge()

    # ------------------------------------------------------------------ the steps, taken

    def _drive(self, event: threading.Event) -> None:
        """Run one loop on this thread."""
        assert self._keeper is not None
        self._run(self._loop(self._keeper), event)

    def _run(self, loop: _Loop, event: threading.Event | None) -> None:
        """Take each step ``loop`` yields, on this thread (``event``: the loop's wake-up;
        None for steps that are calls only)."""
        value: Any = None
        error: Exception | None = None
        while (step := self._advance(loop, value, error)) is not None:
            value, error = None, None
            try:
                value = self._take(step, event)
            except Exception as exc:  # a store's answer: the loop decides
                error = exc

    def _take(self, step: _Step, event: threading.Event | None) -> Any:
        if isinstance(step, _Call):
            return step.call()
        assert event is not None
        if isinstance(step, _Handle):
            try:
                return self.handler(step.job), None
            except BaseException as exc:  # every outcome of a run is the loop's to finish
                return None, exc
        if isinstance(step, _Wait):
            self._wait(step, event)
            return None
        self._stopping.wait(step.seconds)
        return None

    def _wait(self, step: _Wait, event: threading.Event) -> None:
        """Until a wake-up, the claim's next due time, POLL ms, or stop."""
        if step.wait == 0:
            return
        event.clear()
        if self._stopping.is_set():
            return
        seconds = self.poll / 1000 if step.wait < 0 else min(step.wait, self.poll) / 1000
        hub = getattr(self.store, "_wakeups", None)
        if hub is None:  # the memory reference: its claims wait on its condition
            self.store._wait_for_work(seconds, event)
            return
        waker = hub()
        waker.due("any", step.wait)
        waker.wait("any", seconds, step.since, event)


class AsyncWorker(_Core):
    """:class:`Worker` for an :class:`~redisstore.AsyncRedisRunStore`: ``await
    handler(job)`` in ``concurrency`` tasks, with an :class:`AsyncJob` (``await
    job.write(record)``) and an :class:`~redisstore.AsyncKeeper`. The loop is the sync
    worker's, its steps awaited. When a lease is lost, ``job.lost`` turns true at once, and
    the handler is cancelled ``grace`` seconds later if it is still running, so that work
    outside the store has time to reach a clean point. ``start()`` on a running event
    loop; ``await stop()``; ``async with``.
    """

    def __init__(self, store: Any, owner: str,
                 handler: Callable[[AsyncJob], Awaitable[bytes | None]], *, ttl: int,
                 concurrency: int = 1, max_takeovers: int | None = None, poll: int = POLL,
                 grace: float = GRACE, retry: Retry | None = None,
                 sessions: bool = True) -> None:
        super().__init__(store, owner, handler, ttl=ttl, concurrency=concurrency,
                         max_takeovers=max_takeovers, poll=poll, retry=retry,
                         sessions=sessions)
        if type(grace) not in (int, float) or not 0 <= grace <= 3600:
            raise ValueError(f"grace must be seconds in [0, 3600], got {grace!r}")
        self.grace = float(grace)
        self._keeper: AsyncKeeper | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Each loop's future while it waits (for work, or after a failed claim): stop
        #: resolves them.
        self._futures: dict[int, asyncio.Future[None]] = {}
        self._handling: dict[str, tuple[asyncio.Task[Any], Job]] = {}
        self._loop_of: asyncio.AbstractEventLoop | None = None
        #: Loops that come to claim while a claim is in flight wait for the next, which
        #: takes as many runs as they are: at concurrency, one claim script for many runs
        #: (most of a claim's server time is what it costs at any limit), and each finish
        #: goes alone, beside the others' in the transport's pipelines.
        self._claims = _Claims(self) if concurrency > 1 else None
        if self._claims is not None:
            self._fuse = False

    def start(self) -> AsyncWorker:
        """Start the loops as tasks of the running event loop (once)."""
        if self._keeper is not None:
            raise RuntimeError("this worker was started already")
        self._loop_of = asyncio.get_running_loop()
        self._keeper = AsyncKeeper(self.store, self.owner, self.ttl, on_lost=self._lost)
        self._start_session(self._keeper)  # on the keeper's own connections: a round trip
        self._tasks = [self._loop_of.create_task(self._drive(i))
                       for i in range(self.concurrency)]
        return self

    async def stop(self, timeout: float | None = None) -> None:
        """:meth:`Worker.stop` without blocking the event loop: stop claiming at once; after
        ``timeout`` s a handler still running is cancelled, and stop returns within a grace
        of that even if the handler ignores it; the run of each is given up under its own
        grant."""
        self._halt()
        started = time.monotonic()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                # A handler that swallows its cancellation is left behind: its lease is
                # released below, so nothing of it lands.
                await asyncio.wait(pending, timeout=CANCELLED)
        if self._claims is not None:
            # A claim in flight: the runs no loop took go back (within the timeout).
            await self._claims.settle(None if timeout is None else
                                      max(CANCELLED, timeout - (time.monotonic() - started)))
        if self._keeper is not None:
            await self._run(self._give_up(), 0)
            await self._keeper.aclose(release=self._keeper.session is not None)

    def kill(self) -> None:
        """:meth:`Worker.kill`: the loops and the handlers are cancelled at once."""
        self._abandon()
        for task in self._tasks:
            task.cancel()
        if self._claims is not None:
            self._claims.cancel()
        if self._keeper is not None:
            self._keeper._stop(False)  # its thread ends on its own; nothing is released

    async def __aenter__(self) -> AsyncWorker:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _halt(self) -> None:
        self._stopping.set()
        for future in self._futures.values():
            if not future.done():
                future.set_result(None)

    def _job(self, claimed: Claimed, since: float) -> Job:
        return AsyncJob(claimed, self.owner, self.store, since)

    def _given_up(self) -> list[Job]:
        # And the jobs whose loops stop's timeout cut off in their finish (cancelled: the
        # finish may never have been sent): fenced, a finish that did land refuses it.
        with self._lock:
            return [*self._jobs.values(), *self._unfinished.values()]

    def _claim(self, session: str | None, limit: int = 1) -> Any:
        # A loop's claim of one (the claims together take the session as they go).
        if self._claims is None:
            return super()._claim(session, limit)
        return self._claims.take()

    def _lost(self, lost: Lost) -> None:
        super()._lost(lost)
        handling = self._handling.get(lost.run)
        if handling is not None and self._loop_of is not None:
            task, job = handling
            # Time for the handler to reach a clean point first: its side effects outside
            # the store are its own; its writes to the store are fenced already.
            self._loop_of.call_later(self.grace, self._cancel_lost, task, job)

    def _cancel_lost(self, task: asyncio.Task[Any], job: Job) -> None:
        # Only while that job's handler runs (its entry goes when it returns).
        if self._handling.get(job.run, (None, None))[1] is job and not task.done():
            job._cancelled = True
            task.cancel()

    # ------------------------------------------------------------------ the steps, awaited

    async def _drive(self, slot: int) -> None:
        """Run one loop in this task."""
        assert self._keeper is not None
        await self._run(self._loop(self._keeper), slot)

    async def _run(self, loop: _Loop, slot: int) -> None:
        """Await each step ``loop`` yields, in this task."""
        value: Any = None
        error: Exception | None = None
        while (step := self._advance(loop, value, error)) is not None:
            value, error = None, None
            try:
                value = await self._take(step, slot)
            except asyncio.CancelledError:
                raise  # stop()'s timeout, or kill()
            except Exception as exc:  # a store's answer: the loop decides
                error = exc

    async def _take(self, step: _Step, slot: int) -> Any:
        if isinstance(step, _Call):
            return await step.call()
        if isinstance(step, _Handle):
            return await self._handle(step.job)
        if isinstance(step, _Wait):
            await self._wait(step, slot)
            return None
        await self._pause(slot, step.seconds, None)
        return None

    async def _handle(self, job: Job) -> tuple[Any, BaseException | None]:
        """The handler on ``job``, in this task: cancelled (after ``grace``) when its lease
        is lost, which ends it as lost, not the loop."""
        task = asyncio.current_task()
        assert task is not None
        self._handling[job.run] = (task, job)
        try:
            return await self.handler(job), None
        except asyncio.CancelledError:
            if not job._cancelled:
                raise  # stop()'s timeout, or kill(): the loop ends
            task.uncancel()  # the lost lease's own cancel: the job ends lost, the loop goes on
            job._lost.set()
            return None, None
        except BaseException as exc:  # every outcome of a run is the loop's to finish
            return None, exc
        finally:
            if self._handling.get(job.run, (None, None))[1] is job:
                del self._handling[job.run]

    async def _wait(self, step: _Wait, slot: int) -> None:
        """Until a wake-up, the claim's next due time, POLL ms, or stop."""
        if step.wait == 0:
            return
        seconds = self.poll / 1000 if step.wait < 0 else min(step.wait, self.poll) / 1000
        await self._pause(slot, seconds, step)

    async def _pause(self, slot: int, seconds: float, step: _Wait | None) -> None:
        """Wait ``seconds`` on this loop's future (stop resolves it), and with ``step`` on
        the store's wake-ups too."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures[slot] = future
        try:
            if self._stopping.is_set():
                return
            if step is None:
                await asyncio.wait([future], timeout=seconds)
                return
            waker = self.store._wakeups()
            waker.due("any", step.wait)
            await waker.await_("any", seconds, step.since, future)
        finally:
            self._futures.pop(slot, None)
