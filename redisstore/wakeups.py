"""Wake-ups: ``claim_ready(..., block=ms)`` and ``claim_expired(..., block=ms)`` wait for
work instead of polling for it. docs/runs.md ("Waiting for work") is the contract.

Two things make a run claimable, and each has its own path to a blocked claimer:

- **Events** (an insert, a write or release that makes a run claimable now, a dependency
  written). The script that does it adds a token to the namespace's wake key
  (``wake-ready`` / ``wake-leases``, a sorted set in the namespace's slot, at most
  ``MAX_WAKE`` tokens). Tokens are level-triggered: one added while nobody waits stays
  until someone takes it, so a signal between a claimer's empty claim and its wait is never
  missed. Each store that has blocked claimers keeps one waker thread on a connection of its
  own, outside the pool, blocked in ``BZPOPMIN`` on the wake keys; each token it takes wakes
  one local blocked claimer (the one that waited longest), or goes back to the server when
  none is left. A claim removes the tokens of the runs it takes and, when it leaves claimable
  work behind, adds one: a burst of ready runs wakes claimers one per run, never all of them.
- **Due times** (``At``, ``Poll``, deadlines, lease expiries). A blocking command's own
  timeout fires on the server's tick (about 100 ms late at the default ``hz 10``; under
  2 ms it blocked forever before Redis 7.0.8), so due times are kept here: every claim
  answers how long until its index's next entry is due, and one timer thread per store
  wakes one blocked claimer at the earliest of those.

Whatever a signal misses (a token taken by a node that then died, writers of a library
version that never signals, a wake key a foreign write gave another type), every blocked
claimer claims again at least every ``REARM`` seconds: an idle claimer costs at most one
server call per ``REARM``, and the waker one ``BZPOPMIN``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeAlias, TypeVar

from .protocol import Operation
from .runs import check_int

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The two kinds of work a claimer waits for: ``claim_ready``'s and ``claim_expired``'s.
READY, LEASES = "ready", "leases"
#: A blocked claimer claims again at least this often (s), signalled or not.
REARM = 10.0
#: The longest ``block`` (ms): one day.
MAX_BLOCK = 86_400_000
#: The token a timer puts on the server for a due time no claim of its store waits for.
DUE_TOKEN = "~due"
#: After a failed ``BZPOPMIN`` (server down, failover, a denied command) the waker tries
#: again after this many seconds, doubling up to REARM.
BACKOFF = 0.05


#: A source of wake-up tokens: ``next_wakeup(kinds, seconds)`` takes one (or None).
NextWakeup: TypeAlias = Callable[[list[str], float], Operation[tuple[str, str] | None]]
#: ``give_back(kind, token)`` puts back a token no local claim wanted.
GiveBack: TypeAlias = Callable[[str, str], Operation[None]]


def waker_timeout(timeout: int) -> int:
    """The deadline (ms) of a waker's call: a whole ``BZPOPMIN``, which the server answers
    on its tick (up to ~100 ms late at ``hz 10``, later when it is loaded), plus the store's
    own ``timeout`` and at least 2 s."""
    return int(REARM * 1000) + max(timeout, 2000)


def pop_cap(client: Any) -> float | None:
    """The longest ``BZPOPMIN`` (s) the client's connections can wait for: 1 s under their
    ``socket_timeout`` (redis-py's default is 5 s), at least half of it (None: no socket
    timeout). The server answers a ``BZPOPMIN`` that timed out on its next tick."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:  # RedisCluster
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", {})
    timeout = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    if not timeout:
        return None
    return max(float(timeout) - 1.0, float(timeout) / 2)


def check_block(block: object) -> int:
    """``block``: None (do not wait) or an int of ms in [0, MAX_BLOCK]."""
    return 0 if block is None else check_int("block", block, minimum=0, maximum=MAX_BLOCK)


class _Waiter:
    """One blocked claim. ``notify`` wakes it (from any thread)."""

    __slots__ = ("notify", "woken")

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify
        self.woken = False


def claim(hub: Callable[[], Wakeups], kind: str, claim: Callable[[], tuple[list[T], int]],
          block: int) -> list[T]:
    """Claim with ``claim()`` (its runs and wait) until it gets some or ``block`` ms have
    passed, waiting between claims on the store's current ``hub()`` (a store closed
    meanwhile makes a new one)."""
    deadline = time.monotonic() + block / 1000
    while True:
        runs, wait = claim()
        waker = hub()
        waker.due(kind, wait)
        remaining = deadline - time.monotonic()
        if runs or remaining <= 0:
            return runs
        if wait != 0 and not waker.wait(kind, remaining) and time.monotonic() >= deadline:
            return runs


async def aclaim(hub: Callable[[], Wakeups], kind: str,
                 claim: Callable[[], Awaitable[tuple[list[T], int]]], block: int) -> list[T]:
    """:func:`claim` for a coroutine ``claim``: the event loop runs on while it waits."""
    deadline = time.monotonic() + block / 1000
    while True:
        runs, wait = await claim()
        waker = hub()
        waker.due(kind, wait)
        remaining = deadline - time.monotonic()
        if runs or remaining <= 0:
            return runs
        if (wait != 0 and not await waker.await_(kind, remaining)
                and time.monotonic() >= deadline):
            return runs


class Wakeups:
    """The blocked claims of one store: per kind of claim, a queue of them, a waker thread
    (each on a connection of its own: a waker blocked on one kind's key never delays the
    other kind) and a due time; one timer thread.

    ``drive(op)`` runs an operation on the calling thread, on connections of the waker's own
    (the store makes it; safe from several threads). ``pop_seconds`` is how long one
    ``BZPOPMIN`` may block: under the connections' socket timeout. Threads start with the
    first blocked claim of their kind and end REARM s after the last.

    ``also``: more sources of tokens (``next_wakeup``, ``give_back``), each with a waker of
    its own per kind: a store spread over partitions on a cluster, whose ``BZPOPMIN`` takes
    the keys of one slot.
    """

    def __init__(self, drive: Callable[[Operation[Any]], Any], next_wakeup: NextWakeup,
                 give_back: GiveBack, close: Callable[[], None] = lambda: None, *,
                 pop_seconds: float | None = None,
                 also: Sequence[tuple[NextWakeup, GiveBack]] = ()) -> None:
        self._drive = drive
        self._sources = [(next_wakeup, give_back), *also]
        self._give_back = give_back
        self._close_io = close
        self._pop_cap = pop_seconds
        self._fresh()
        #: Counts, for tests and benchmarks: tokens taken, claims woken by a token, by the
        #: timer, tokens given back, due times relayed to other nodes.
        self.stats: collections.Counter[str] = collections.Counter()

    def _fresh(self) -> None:
        """The state of a new hub (again in a forked child: the parent's threads are not
        there, and its lock may have been held by one of them)."""
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._queues: dict[str, collections.deque[_Waiter]] = {
            READY: collections.deque(), LEASES: collections.deque()}
        self._due: dict[str, float | None] = {READY: None, LEASES: None}
        self._stopped = False
        self._listeners: dict[tuple[str, int], threading.Thread] = {}
        self._timer: threading.Thread | None = None

    # ------------------------------------------------------------------ the claims

    def due(self, kind: str, wait: int) -> None:
        """A claim said its index's next entry is due in ``wait`` ms (-1: none, 0: now)."""
        if wait <= 0:
            return
        at = time.monotonic() + wait / 1000
        with self._cond:
            current = self._due[kind]
            if current is None or at < current:
                self._due[kind] = at
                self._cond.notify_all()

    def wait(self, kind: str, seconds: float) -> bool:
        """Block this thread until woken (True), or ``seconds`` (at most REARM) pass."""
        event = threading.Event()
        waiter = _Waiter(event.set)
        self._enter(kind, waiter)
        try:
            event.wait(min(seconds, REARM))
        finally:
            self._leave(kind, waiter)
        return waiter.woken

    async def await_(self, kind: str, seconds: float) -> bool:
        """:meth:`wait` for a task: the event loop runs on meanwhile."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def notify() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        waiter = _Waiter(notify)
        self._enter(kind, waiter)
        try:
            await asyncio.wait([future], timeout=min(seconds, REARM))
        except asyncio.CancelledError:
            with self._cond:
                if waiter.woken:  # its wake-up goes to the next local claim, if any
                    self._wake_one(kind)
            raise
        finally:
            self._leave(kind, waiter)
        return waiter.woken

    def stop(self) -> None:
        """Stop the threads (a waker ends with its ``BZPOPMIN``) and wake every blocked
        claim: each claims again, and waits on its store's next hub."""
        with self._cond:
            self._stopped = True
            for kind in self._queues:
                while self._wake_one(kind):
                    pass
            self._cond.notify_all()

    # ------------------------------------------------------------------ the queues

    def _enter(self, kind: str, waiter: _Waiter) -> None:
        if self._pid != os.getpid():
            self._fresh()
        with self._cond:
            if self._stopped:
                waiter.woken = True  # the store was closed: claim again at once
                return
            self._queues[kind].append(waiter)
            # The threads end after REARM s with nothing to do (a store dropped without
            # close() leaves none behind); the next blocked claim starts them again.
            for source in range(len(self._sources)):
                if (kind, source) not in self._listeners:
                    self._listeners[kind, source] = thread = threading.Thread(
                        target=self._listen, args=(kind, source), daemon=True,
                        name=f"redisstore-waker-{kind}")
                    thread.start()
            if self._timer is None:
                self._timer = threading.Thread(target=self._time, daemon=True,
                                               name="redisstore-timer")
                self._timer.start()
            self._cond.notify_all()

    def _leave(self, kind: str, waiter: _Waiter) -> None:
        with self._cond:
            if not waiter.woken:
                with contextlib.suppress(ValueError):
                    self._queues[kind].remove(waiter)

    def _wake_one(self, kind: str) -> bool:
        # Under the lock. The waiter that waited longest goes first.
        queue = self._queues[kind]
        while queue:
            waiter = queue.popleft()
            try:
                waiter.notify()
            except RuntimeError:  # its event loop is closed: it will never claim
                continue
            waiter.woken = True
            return True
        return False

    # ------------------------------------------------------------------ the threads

    def _idle(self, kind: str, source: int) -> bool:
        """Under the lock: wait while no claim of ``kind`` is blocked; True when its waker
        should end (stopped, or idle for REARM s: its thread is then forgotten)."""
        since = time.monotonic()
        while not self._stopped and not self._queues[kind]:
            left = REARM - (time.monotonic() - since)
            if left <= 0:
                del self._listeners[kind, source]
                return True
            self._cond.wait(left)
        return self._stopped

    def pop_seconds(self) -> float:
        """How long one ``BZPOPMIN`` blocks: REARM, or less under a short socket timeout
        (the server answers on its tick, up to ~100 ms late, and must beat the timeout)."""
        return REARM if self._pop_cap is None else max(min(REARM, self._pop_cap), 0.05)

    def _listen(self, kind: str, source: int) -> None:
        """The waker of one kind (of one source): take its tokens while a claim of it
        waits; each token wakes one claim."""
        backoff = BACKOFF
        next_wakeup, give_back = self._sources[source]
        try:
            while True:
                with self._cond:
                    if self._idle(kind, source):
                        return
                try:
                    got = self._drive(next_wakeup([kind], self.pop_seconds()))
                except Exception as exc:
                    if backoff == BACKOFF:
                        log.warning("redisstore: the waker cannot wait for signals (%s); "
                                    "blocked claims claim again every %s s meanwhile",
                                    exc, REARM)
                    with self._cond:
                        self._cond.wait(backoff)
                    backoff = min(backoff * 2, REARM)
                    continue
                backoff = BACKOFF
                if got is None:
                    continue
                token = got[1]
                with self._cond:
                    self.stats["taken"] += 1
                    woke = self._wake_one(kind)
                if woke:
                    self.stats["woken"] += 1
                    continue
                # Its claim left meanwhile: another node's may still wait for it (a
                # give-back that fails is covered by the claims' re-arm).
                self.stats["given back"] += 1
                with contextlib.suppress(Exception):
                    self._drive(give_back(kind, token))
        finally:
            self._close_io()

    def _time(self) -> None:
        """The timer: at the earliest due time a claim reported, wake one claim; with none
        blocked here, relay it to the server as a token, for a claim of another node. Ends
        after REARM s with neither a due time nor a blocked claim."""
        try:
            with self._cond:
                idle_since: float | None = None
                while not self._stopped:
                    now = time.monotonic()
                    pending = [(at, kind) for kind, at in self._due.items() if at is not None]
                    if not pending:
                        if any(self._queues.values()):
                            idle_since = None
                        elif idle_since is None:
                            idle_since = now
                        elif now - idle_since >= REARM:
                            break
                        self._cond.wait(REARM)
                        continue
                    idle_since = None
                    at, kind = min(pending)
                    if at > now:
                        self._cond.wait(at - now)
                        continue
                    self._due[kind] = None
                    if self._wake_one(kind):
                        self.stats["timer"] += 1
                        continue
                    self.stats["relayed"] += 1
                    self._cond.release()
                    try:
                        with contextlib.suppress(Exception):
                            self._drive(self._give_back(kind, DUE_TOKEN))
                    finally:
                        self._cond.acquire()
                self._timer = None
        finally:
            self._close_io()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LoopDriver:
    """Runs the operations of an asyncio store's waker on an event loop of the waker
    thread's own (connections are per event loop: that loop's are the waker's own)."""

    def __init__(self, drive: Callable[[Operation[Any]], Coroutine[Any, Any, Any]],
                 close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._drive = drive
        self._aclose = close
        # One loop per waker thread: a waker that ends closes its own loop, never the
        # next one's.
        self._local = threading.local()

    def __call__(self, op: Operation[Any]) -> Any:
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
        return loop.run_until_complete(self._drive(op))

    def close(self) -> None:
        """Close this thread's loop and its connections."""
        loop = getattr(self._local, "loop", None)
        self._local.loop = None
        if loop is not None:
            try:
                loop.run_until_complete(self._aclose())
            except Exception:
                pass
            finally:
                loop.close()
