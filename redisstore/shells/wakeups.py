"""Wake-ups: ``claim(..., block=ms)``, ``claim_ready(..., block=ms)`` and
``claim_expired(..., block=ms)`` wait for work instead of polling for it. docs/runs.md
("Waiting for work") is the contract. A ``claim`` waits for either kind (``ANY``).

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
import functools
import logging
import os
import threading
import time
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Hashable,
    Iterable,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

from ..core.driver import Operation, Spread
from ..core.waits import ANY as ANY
from ..core.waits import KINDS as KINDS
from ..core.waits import LEASES as LEASES
from ..core.waits import MAX_BLOCK as MAX_BLOCK
from ..core.waits import READY as READY
from ..core.waits import Refused as Refused
from ..core.waits import check_block as check_block

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A blocked claimer claims again at least this often (s), signalled or not.
REARM = 10.0
#: The token a timer puts on the server for a due time no claim of its store waits for.
DUE_TOKEN = "~due"
#: After a failed ``BZPOPMIN`` (server down, failover, a denied command) the waker tries
#: again after this many seconds, doubling up to REARM.
BACKOFF = 0.05
#: How long a waker per node waits for a message before it looks at its claims and its
#: partitions again (s): a thread that ends or regroups does so within it.
NODE_POLL = 1.0
#: The messages a hub keeps, per kind, for claims that began before them (the newest).
MAX_CREDITS = 256
#: The messages a waker per node reads before it sweeps (each key once for all of them).
MAX_BURST = 1000


#: A source of wake-up tokens: ``next_wakeup(kinds, seconds)`` takes one (or None).
NextWakeup: TypeAlias = Callable[[list[str], float], Operation[tuple[str, str] | None]]
#: ``give_back(kind, token)`` puts back a token no local claim wanted.
GiveBack: TypeAlias = Callable[[str, str], Operation[None]]


class Subscription(Protocol):
    """A waker per node's connection to one cluster node, subscribed to sharded channels
    (a shell makes it: the one piece of I/O outside the operations)."""

    def subscribe(self, channels: Sequence[str]) -> None:
        """``SSUBSCRIBE`` to ``channels`` (of one slot) and read their confirmations; an
        error reply or a broken link raises (:class:`Refused` for good)."""

    def message(self, timeout: float) -> tuple[str, str] | None:
        """The next message's kind (``smessage``, ``sunsubscribe``...) and channel, or None
        after ``timeout`` s; a broken link raises."""

    def close(self) -> None:
        """Disconnect."""


class Sweeps(Protocol):
    """The wake keys of a store's partitions on a cluster (redisstore.core.partitions)."""

    count: int

    def wake_key(self, p: int, kind: str) -> str:
        """Partition ``p``'s wake key of ``kind``, also its channel's name."""

    def take(self, wants: Iterable[tuple[int, str, int]]
             ) -> Spread[Sequence[list[str] | Exception]]:
        """Up to ``count`` tokens of ``kind`` from each ``(p, kind, count)`` (or the error
        of that partition's sweep)."""

    def give_back(self, p: int, kind: str, token: str) -> Operation[None]:
        """Put a token back in partition ``p``."""


@dataclass(frozen=True)
class Nodes:
    """How a shell reaches a cluster's nodes for its wakers per node: ``node_of(key)``, the
    node a key lives on as far as the client knows; ``subscribe(key)``, a new
    :class:`Subscription` to that node; ``relearn()``, have the client learn its slot map
    again (after a moved slot, a failover)."""

    node_of: Callable[[str], Hashable]
    subscribe: Callable[[str], Subscription]
    relearn: Callable[[], None]


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


class _Waiter:
    """One blocked claim. ``notify`` wakes it (from any thread); ``since``: when it began
    to wait (monotonic), which orders the claims of two queues."""

    __slots__ = ("notify", "since", "woken")

    def __init__(self, notify: Callable[[], None]) -> None:
        self.notify = notify
        self.woken = False
        self.since = time.monotonic()


@dataclass(frozen=True)
class _Wait:
    """A step of :func:`_claiming`: wait on ``waker`` for ``kind``, at most ``remaining``
    seconds, for a change since ``since``; the answer is whether one came."""

    waker: Wakeups
    kind: str
    remaining: float
    since: float


#: A step of :func:`_claiming`: claim once; the answer is the claim's runs and wait.
_CLAIM = "claim"


def _claiming(hub: Callable[[], Wakeups], kind: str, block: int
              ) -> Generator[str | _Wait, Any, list[Any]]:
    """The steps of a claim that waits up to ``block`` ms (0: claim once): claim, and while
    it gets nothing and time is left, wait on the store's current ``hub()`` (a store closed
    meanwhile makes a new one), then claim again. Written once: :func:`claim` makes each
    step on this thread, :func:`aclaim` awaits it."""
    deadline = time.monotonic() + block / 1000
    while True:
        since = time.monotonic()
        runs: list[Any]
        runs, wait = yield _CLAIM
        if not block:
            return runs  # nothing to wait for: no waker
        waker = hub()
        waker.due(kind, wait)
        remaining = deadline - time.monotonic()
        if runs or remaining <= 0:
            return runs
        if (wait != 0 and not (yield _Wait(waker, kind, remaining, since))
                and time.monotonic() >= deadline):
            return runs


def claim(hub: Callable[[], Wakeups], kind: str, claim: Callable[[], tuple[list[T], int]],
          block: int) -> list[T]:
    """Claim with ``claim()`` (its runs and wait) until it gets some or ``block`` ms have
    passed (:func:`_claiming`), waiting on this thread."""
    steps = _claiming(hub, kind, block)
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer = (claim() if isinstance(step, str)
                  else step.waker.wait(step.kind, step.remaining, step.since))


async def aclaim(hub: Callable[[], Wakeups], kind: str,
                 claim: Callable[[], Awaitable[tuple[list[T], int]]], block: int) -> list[T]:
    """:func:`claim` for a coroutine ``claim``: the event loop runs on while it waits."""
    steps = _claiming(hub, kind, block)
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer = (await claim() if isinstance(step, str)
                  else await step.waker.await_(step.kind, step.remaining, step.since))


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

    ``sharded``: such a store's partitions and the shell's way to its nodes. Its wakers are
    then one per node instead (both kinds on one connection, subscribed to the sharded
    channels of the partitions on that node): on each message, and after subscribing, a
    waker sweeps the partition's wake key (``ZPOPMIN``, as many tokens as claims wait here)
    and each token wakes one claim, as with ``BZPOPMIN``. A message that finds no claim
    waiting here is kept a while: it wakes at once one claim that began before it and
    waits after it (that claim may have missed the work, whose token nobody swept). A
    server that refuses sharded pub/sub turns the hub to the wakers per partition
    (``also``).
    """

    def __init__(self, drive: Callable[[Operation[Any] | Spread[Any]], Any],
                 next_wakeup: NextWakeup,
                 give_back: GiveBack, close: Callable[[], None] = lambda: None, *,
                 pop_seconds: float | None = None,
                 also: Sequence[tuple[NextWakeup, GiveBack]] = (),
                 sharded: tuple[Sweeps, Nodes] | None = None) -> None:
        self._drive = drive
        self._sources = [(next_wakeup, give_back), *also]
        self._give_back = give_back
        self._close_io = close
        self._pop_cap = pop_seconds
        self._sharded_at_start = sharded
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
            READY: collections.deque(), LEASES: collections.deque(), ANY: collections.deque()}
        self._due: dict[str, float | None] = {READY: None, LEASES: None, ANY: None}
        self._stopped = False
        self._listeners: dict[tuple[str, int], threading.Thread] = {}
        self._timer: threading.Thread | None = None
        #: Wakers per node (None: per partition, or one, as ``also`` says).
        self._sharded = self._sharded_at_start
        #: The partitions of each node, as the client knew them at the last regrouping.
        self._groups: dict[Hashable, list[int]] | None = None
        self._nodes: dict[Hashable, threading.Thread] = {}
        #: The (partition, kind) whose wake key a waker per node failed to sweep last time
        #: (warned once per streak).
        self._unswept: set[tuple[int, str]] = set()
        #: Per kind, when a waker per node had a message while no claim of it waited
        #: (monotonic): each wakes one claim that began before it (see _enter).
        self._credits: dict[str, collections.deque[float]] = {
            READY: collections.deque(maxlen=MAX_CREDITS),
            LEASES: collections.deque(maxlen=MAX_CREDITS)}

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

    def wait(self, kind: str, seconds: float, since: float | None = None,
             event: threading.Event | None = None) -> bool:
        """Block this thread until woken (True), or ``seconds`` (at most REARM) pass.
        ``since``: when the claim before this wait began (monotonic). ``event``: the event
        it waits on (a worker's own, which its stop sets too); a new one by default."""
        event = threading.Event() if event is None else event
        waiter = _Waiter(event.set)
        self._enter(kind, waiter, since)
        try:
            event.wait(min(seconds, REARM))
        finally:
            self._leave(kind, waiter)
        return waiter.woken

    async def await_(self, kind: str, seconds: float, since: float | None = None,
                     future: asyncio.Future[None] | None = None) -> bool:
        """:meth:`wait` for a task: the event loop runs on meanwhile. ``future``: the one it
        waits on (a worker's own, which its stop resolves too); a new one by default."""
        loop = asyncio.get_running_loop()
        future = loop.create_future() if future is None else future

        def notify() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        waiter = _Waiter(notify)
        self._enter(kind, waiter, since)
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

    def _enter(self, kind: str, waiter: _Waiter, since: float | None = None) -> None:
        if self._pid != os.getpid():
            self._fresh()
        with self._cond:
            if self._stopped or (since is not None and any(
                    self._credit(k, since) for k in KINDS[kind])):
                # The store was closed, or a message came while this claim ran, when no
                # claim waited (its token stays on the server, unswept): claim again at
                # once, this claim alone for that message.
                waiter.woken = True
                waiter.notify()
                return
            self._queues[kind].append(waiter)
            # The threads end after REARM s with nothing to do (a store dropped without
            # close() leaves none behind); the next blocked claim starts them again.
            self._start(kind)
            if self._timer is None:
                self._timer = threading.Thread(target=self._time, daemon=True,
                                               name="redisstore-timer")
                self._timer.start()
            self._cond.notify_all()

    def _credit(self, kind: str, since: float) -> bool:
        """Under the lock: use the oldest message kept for ``kind`` that came after
        ``since`` (the newer ones stay for claims that began later)."""
        credits = self._credits[kind]
        for i, at in enumerate(credits):
            if at >= since:
                del credits[i]
                return True
        return False

    def _start(self, kind: str) -> None:
        """Under the lock: start the wakers a blocked claim of ``kind`` needs."""
        if kind == ANY:
            for k in KINDS[ANY]:
                self._start(k)
            return
        if self._sharded is not None:
            if self._groups is None:
                self._regroup()
            assert self._groups is not None
            for node in self._groups:
                if node not in self._nodes:
                    self._nodes[node] = thread = threading.Thread(
                        target=self._listen_node, args=(node, *self._sharded), daemon=True,
                        name="redisstore-waker-node")
                    thread.start()
            return
        for source in range(len(self._sources)):
            if (kind, source) not in self._listeners:
                self._listeners[kind, source] = thread = threading.Thread(
                    target=self._listen, args=(kind, source), daemon=True,
                    name=f"redisstore-waker-{kind}")
                thread.start()

    def _regroup(self) -> None:
        """Under the lock: group the partitions by the node the client says has them, and
        start a waker for a node that has none (one left without partitions ends)."""
        assert self._sharded is not None
        sweeps, nodes = self._sharded
        groups: dict[Hashable, list[int]] = {}
        for p in range(sweeps.count):
            groups.setdefault(nodes.node_of(sweeps.wake_key(p, READY)), []).append(p)
        first = self._groups is None
        self._groups = groups
        if not first:
            for kind in self._queues:
                if self._queues[kind]:
                    self._start(kind)
                    break

    def _leave(self, kind: str, waiter: _Waiter) -> None:
        with self._cond:
            if not waiter.woken:
                with contextlib.suppress(ValueError):
                    self._queues[kind].remove(waiter)

    def _waiting(self, kind: str) -> int:
        """Under the lock: the claims a token of ``kind`` may wake (``claim``'s too)."""
        return len(self._queues[kind]) + (len(self._queues[ANY]) if kind != ANY else 0)

    def _wake_one(self, kind: str) -> bool:
        # Under the lock. The waiter that waited longest goes first: for a token of one
        # kind, of its queue and claim's (which takes either kind).
        own = self._queues[kind]
        both = self._queues[ANY] if kind != ANY else own
        while own or both:
            queue = own if not both or (own and own[0].since <= both[0].since) else both
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
        while not self._stopped and not self._waiting(kind):
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
                self._hand(kind, functools.partial(give_back, kind, got[1]))
        finally:
            self._close_io()

    def _listen_node(self, node: Hashable, sweeps: Sweeps, nodes: Nodes) -> None:
        """The waker of one node (a store of partitions on a cluster): subscribed to the
        channels of its partitions, it sweeps a partition's wake key on its messages (those
        already received at once, each key once), all of them after subscribing, and all of
        them every NODE_POLL s while claims wait (a writer that does not publish: an earlier
        version of this library, a user without the channels). A broken link, a moved slot
        (the server ends the subscription) or a refused subscription to a partition that
        left the node: the client learns its slot map again and the wakers regroup, after a
        back-off. Ends REARM s after the last blocked claim, when the store stops, when its
        node has no partition left, or when the server refuses sharded pub/sub or the
        sweep's ``ZPOPMIN`` (then the wakers per partition take over)."""
        channels = {sweeps.wake_key(p, kind): (p, kind)
                    for p in range(sweeps.count) for kind in (READY, LEASES)}
        sub: Subscription | None = None
        subscribed: list[int] = []
        backoff = BACKOFF
        idle_since: float | None = None
        swept = 0.0
        try:
            while True:
                with self._cond:
                    group = (self._groups or {}).get(node)
                    if any(self._queues.values()):
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    if (self._stopped or self._sharded is None or not group
                            or (idle_since is not None
                                and time.monotonic() - idle_since >= REARM)):
                        # Forgotten under the lock that decided it: a claim that blocks
                        # next starts another.
                        if self._nodes.get(node) is threading.current_thread():
                            del self._nodes[node]
                        return
                every = [(p, kind) for p in group for kind in (READY, LEASES)]
                try:
                    if sub is None or group != subscribed:
                        if sub is not None:
                            sub.close()
                        sub = None
                        sub = nodes.subscribe(sweeps.wake_key(group[0], READY))
                        for p in group:
                            sub.subscribe([sweeps.wake_key(p, READY),
                                           sweeps.wake_key(p, LEASES)])
                        subscribed = group
                        # Tokens pushed before the subscription, or whose message was lost
                        # (a message that came with the confirmations is read as one): for
                        # the claims waiting, a sweep; for one claim running meanwhile, which
                        # may have missed that work, a kept message, as for one that comes.
                        with self._cond:
                            for kind in (READY, LEASES):
                                self._keep(kind)
                        swept = self._sweep(sweeps, every)
                    due = set(self._messages(sub, channels))
                    if time.monotonic() - swept >= NODE_POLL:
                        swept = self._sweep(sweeps, every)
                    elif due:
                        self._sweep(sweeps, sorted(due))
                except Refused as exc:
                    self._fall_back(exc)
                    return
                except Exception as exc:
                    if sub is not None:
                        with contextlib.suppress(Exception):
                            sub.close()
                        sub = None
                    if backoff == BACKOFF:
                        log.info("redisstore: a waker per node lost its subscription (%s); "
                                 "it subscribes again after the slot map", exc)
                    with contextlib.suppress(Exception):
                        nodes.relearn()
                    with self._cond:
                        self._cond.wait(backoff)
                        if not self._stopped and self._sharded is not None:
                            self._regroup()
                    backoff = min(backoff * 2, REARM)
                    continue
                backoff = BACKOFF
        finally:
            with self._cond:
                # Ended by an error: the next blocked claim starts another.
                if self._nodes.get(node) is threading.current_thread():
                    del self._nodes[node]
            if sub is not None:
                with contextlib.suppress(Exception):
                    sub.close()
            self._close_io()

    def _messages(self, sub: Subscription, channels: dict[str, tuple[int, str]]
                  ) -> Iterable[tuple[int, str]]:
        """The (partition, kind) of the messages within NODE_POLL s, and of those already
        received after the first (a burst is swept once per key). A message that finds no
        claim of its kind waiting is kept (see :meth:`_enter`) instead."""
        got = sub.message(NODE_POLL)
        for _ in range(MAX_BURST):
            if got is None:
                return
            if got[0] == "sunsubscribe":
                raise ConnectionError(f"the server ended the subscription to {got[1]} (its "
                                      "slot moved)")
            if got[0] == "smessage" and got[1] in channels:
                p, kind = channels[got[1]]
                with self._cond:
                    waiting = bool(self._waiting(kind))
                    if not waiting:
                        self._keep(kind)
                if waiting:
                    yield p, kind
            got = sub.message(0)

    def _keep(self, kind: str) -> None:
        """Under the lock: keep a message of ``kind`` for a claim that began before it
        (those older than REARM s go: no claim began that long ago)."""
        now = time.monotonic()
        credits = self._credits[kind]
        while credits and credits[0] < now - REARM:
            credits.popleft()
        credits.append(now)

    def _sweep(self, sweeps: Sweeps, wanted: list[tuple[int, str]]) -> float:
        """Take tokens from partitions' wake keys, as many per key as claims of its kind
        wait here: each wakes one; one whose claim left meanwhile is given back. A key
        that cannot be swept is warned of once per streak (its claims' re-arm covers it);
        a denied ``ZPOPMIN`` turns the store to the wakers per partition. When it began."""
        began = time.monotonic()
        with self._cond:
            wants = [(p, kind, self._waiting(kind)) for p, kind in wanted
                     if self._waiting(kind)]
        if not wants:
            return began
        got = self._drive(sweeps.take(wants))
        for (p, kind, _), tokens in zip(wants, got, strict=True):
            if isinstance(tokens, Exception):
                if "NOPERM" in str(tokens):
                    raise Refused(str(tokens))
                if (p, kind) not in self._unswept:
                    self._unswept.add((p, kind))
                    log.warning("redisstore: a waker per node cannot sweep the wake key %s "
                                "(%s); its blocked claims claim again every %s s meanwhile",
                                sweeps.wake_key(p, kind), tokens, REARM)
                continue
            self._unswept.discard((p, kind))
            for token in tokens:
                self._hand(kind, functools.partial(sweeps.give_back, p, kind, token))
        return began

    def _hand(self, kind: str, give_back: Callable[[], Operation[None]]) -> None:
        """A token taken: wake the local claim of ``kind`` that waited longest; with none
        left (its claim left meanwhile), ``give_back()`` the token, for another node's (a
        give-back that fails is covered by the claims' re-arm)."""
        with self._cond:
            self.stats["taken"] += 1
            woke = self._wake_one(kind)
        if woke:
            self.stats["woken"] += 1
            return
        self.stats["given back"] += 1
        with contextlib.suppress(Exception):
            self._drive(give_back())

    def _fall_back(self, exc: Exception) -> None:
        """The server refuses sharded pub/sub: wakers per partition from now on."""
        with self._cond:
            if self._sharded is None:
                return
            # A user without the channels can be given them (a warning); a server without
            # sharded pub/sub (Redis 6.2) is as it is.
            log.log(logging.WARNING if "NOPERM" in str(exc) else logging.INFO,
                    "redisstore: the server refuses sharded pub/sub (%s): the store waits "
                    "for wake-up signals with a connection per partition and kind instead "
                    "of one per node (docs/scale-out.md)", exc)
            self._sharded = None
            self._nodes.clear()
            for kind in self._queues:
                if self._queues[kind]:
                    self._start(kind)
            self._cond.notify_all()

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
                        for k in KINDS[kind]:
                            with contextlib.suppress(Exception):
                                self._drive(self._give_back(k, DUE_TOKEN))
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

    def __init__(self, drive: Callable[[Operation[Any] | Spread[Any]],
                                       Coroutine[Any, Any, Any]],
                 close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._drive = drive
        self._aclose = close
        # One loop per waker thread: a waker that ends closes its own loop, never the
        # next one's.
        self._local = threading.local()

    def __call__(self, op: Operation[Any] | Spread[Any]) -> Any:
        return self.run(self._drive(op))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this thread's loop (a subscription's I/O, too)."""
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
        return loop.run_until_complete(coroutine)

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
