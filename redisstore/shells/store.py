"""``RedisRunStore``: the run backend on Redis, Valkey or fakeredis (sync), and its ``Pipeline``.

The instance repository is :mod:`redisstore.shells.repo_store`, so a store of runs does
not stand on the repository's operations over partitions (docs/design/house.md)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..core.driver import Operation, Spread, next_step
from ..core.errors import StoreError
from ..core.partitions import PartitionedOps, run_ops
from ..core.pipeline import Drive, Pipelined, SendGroups, SendStep
from ..core.runops import RunOps
from ..core.runs import SessionInfo, check_listing_limit
from ..sessions import Session, check_session
from . import wakeups
from .sessions import SessionSteps
from .shell import RunShell
from .store_ops import StoreOps
from .sync import Transport, _Drives, node_wakers
from .wakeups import Wakeups, check_block

T = TypeVar("T")


class Pipeline(Pipelined):
    """Calls of one :class:`RedisRunStore` sent together in one round trip, at the end of
    its ``with`` block (or by :meth:`send`): see :meth:`RedisRunStore.pipeline`."""

    def __init__(self, io: Transport, ops: RunOps | PartitionedOps,
                 claim: Callable[[str, int, int | None, Callable[[], Any]], list[Any]]
                 | None = None) -> None:
        super().__init__(ops, io.durability)
        self._io = io
        self._claim = claim

    def send(self) -> None:
        """Send the queued calls; each :class:`Pending` then holds its answer (one round
        trip per node their partitions are on). A claim queued with ``block`` that got
        nothing then waits for work, as the store's does (the calls after it in the
        pipeline have their answers already)."""
        started = time.monotonic()
        if (lone := self._lone()) is not None:  # a worker's unit: one script, no steps
            try:
                self._settle_lone(self._io.drive(lone))
            except StoreError as refused:
                self._settle_lone(error=refused)
            return
        steps = self._sending(self._io.node_of, started)
        value: Any = None
        error: StoreError | None = None
        while (step := next_step(steps, value, error)) is not None:
            try:
                value, error = self._make(step), None
            except StoreError as exc:  # the call's answer: the steps decide
                value, error = None, exc

    def _make(self, step: SendStep) -> Any:
        """One step of :meth:`send`, on this thread."""
        if isinstance(step, Drive):
            return self._io.drive(step.op)
        if isinstance(step, SendGroups):
            try:
                for group in step.groups:
                    self._io.run(group)
            except BaseException as exc:  # cancelled, interrupted: every call gets an answer
                for group in step.groups:
                    group.interrupted(type(exc).__name__)
                raise
            return None
        assert self._claim is not None, "a store's pipeline blocks with the store"
        blocked = step.blocked
        return self._claim(blocked.index, blocked.limit, step.left, blocked.claim)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            self._abandon()
        elif not self._sent:
            self.send()


class RedisRunStore(_Drives, SessionSteps, StoreOps, RunShell[Transport]):
    """The leased run backend on a ``redis.Redis``-compatible client.

    Every method is one server-side Lua script, one round trip (``refresh`` reads, then
    writes). Leases and readiness are judged by the server's clock. ``namespace`` isolates
    stores that share a server; all of its keys share the hash tag ``{namespace}``.
    ``discover`` derives each record's wait for :meth:`claim_ready`; ``projection_version``
    marks metadata derived by an older ``discover`` as stale.

    Failures that are not an answer of the contract raise ``Unavailable``; a write whose
    reply was lost is never re-sent (see :func:`redisstore.confirm_write`). With
    ``durability``, each write is confirmed by ``WAIT`` / ``WAITAOF`` before it counts.

    ``partitions=N`` (1 to 256) spreads one logical store over N hash tags, hence over a
    cluster's primaries: a run is in the partition of its id's ``{family}`` part (else of
    its id); calls of one run stay one round trip, ``renew`` / ``release`` go one round
    trip per node, claims two (every partition's head, then each one's share). The count
    is recorded in the namespace; a store opened with another is refused
    (``Misconfigured``). A ``Changed`` dependency in another partition costs its waiter's
    write a round trip more, and claims deliver its writes. See docs/scale-out.md.
    """

    #: Its operations (the mixin types them by the generated ``PartitionOps`` alone).
    _ops: RunOps | PartitionedOps
    _transport = Transport
    _run_ops = staticmethod(run_ops)

    def close(self) -> None:
        """Stop the store's waker (if a claim ever blocked) and disconnect its connections
        (see :meth:`RedisRepository.close`); the store stays usable."""
        with self._wake_lock:
            wake, self._wake = self._wake, None
        if wake is not None:
            wake.stop()
        super().close()

    def _wakeups(self) -> Wakeups:
        """The store's blocked claims, made with the first (see :mod:`redisstore.shells.wakeups`):
        the wakers' connections are their own (on a cluster, the client's node connections,
        which they must not close)."""
        with self._wake_lock:
            if self._wake is None:
                io = Transport(self._io.client, None, wakeups.waker_timeout(self._io.timeout),
                               dedicated=True)
                (first, *also) = self._ops.wake_sources(io.cluster)
                sweeps = self._ops.sweeps(io.cluster)
                self._wake = Wakeups(
                    io.drive, *first, (lambda: None) if io.cluster else io.close,
                    pop_seconds=wakeups.pop_cap(self._io.client), also=also,
                    sharded=None if sweeps is None else (
                        sweeps, node_wakers(io, self._io.timeout)))
            return self._wake

    #: Whether a keeper closes this store when it ends (not a cluster's twin, whose node
    #: connections are every store's on its client).
    _keeper_closes = True

    def _dedicated(self, timeout: int) -> RedisRunStore:
        """This store on connections of its own (a Keeper's), with a deadline of at most
        ``timeout`` ms; close it when done. On a cluster client, with the client's node
        connections (closing them would disconnect every other store): the keeper does not
        close it, and its deadline is capped all the same (a hung node costs a renewal
        ``timeout`` at most)."""
        twin = copy.copy(self)
        io = self._io
        twin._io = Transport(io.client, io.durability, min(timeout, io.timeout),
                             dedicated=not io.cluster)
        twin._wake, twin._wake_lock = None, threading.Lock()
        twin._keeper_closes = not io.cluster
        return twin

    def pipeline(self) -> Pipeline:
        """Queue calls and send them in one round trip::

            with store.pipeline() as pipe:
                done = pipe.compare_and_set(run, revision, record, Release())
                nxt = pipe.claim("node-a", 30_000, records=True, block=5_000)
            done.result()          # None, or raises this call's own error
            claimed = nxt.result()

        Each queued method takes the arguments of the store method of its name and returns
        a :class:`~redisstore.core.pipeline.Pending`. The calls run in the order queued, each
        on its own (not a transaction: other clients' calls may run between them, and one
        call's error does not stop the next); each write is sent exactly once. A block that
        raises sends nothing. docs/runs.md has the rules.
        """
        return Pipeline(self._io, self._ops, self._claim)

    # The primitives of the operations (StoreOps, generated from the core: store_ops.py).

    def open_session(self, owner: str, ttl: int) -> Session:
        """A new session of ``owner``, live ``ttl`` ms from now (docs/contract.md,
        "Sessions"); on a store of partitions, in every partition at once."""
        owner, ttl = check_session(owner, ttl)
        return Session(self, self._session_open(owner, ttl), owner, ttl)

    def sessions(self, limit: int = 1000) -> list[SessionInfo]:
        """Up to ``limit`` sessions: live ones, and lapsed ones that still hold runs, by
        expiry, read a page of ``MAX_RENEW`` at a time (on a store of partitions, from each
        partition at once: a session once, its runs summed)."""
        return self._sessions(check_listing_limit(limit))  # type: ignore[no-any-return]

    def _claim(self, index: str, limit: int, block: int | None,
               claim: Callable[[], Operation[tuple[list[Any], int]]
                               | Spread[tuple[list[Any], int]]]) -> list[Any]:
        wait = check_block(block)
        wait = wait if limit else 0  # limit 0: nothing could be claimed, nothing to wait for
        return wakeups.claim(self._wakeups, index, lambda: self._write(claim()), wait)
