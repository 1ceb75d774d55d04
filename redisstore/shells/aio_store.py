"""``AsyncRedisRunStore``: the run backend on ``redis.asyncio`` (or ``FakeAsyncRedis``), and
its ``AsyncPipeline``: the asyncio twin of :mod:`redisstore.shells.store`.

They send on the asyncio transport (:mod:`redisstore.shells.aio`, which says what a
cancelled call means); a module of their own, so the repository on the same transport
(:mod:`redisstore.shells.repo_aio`) does not stand on the run store (docs/design/house.md).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ..core.driver import Operation, Spread, next_step
from ..core.errors import NotFound, StoreError
from ..core.partitions import PartitionedOps, run_ops
from ..core.pipeline import Drive, Pipelined, SendGroups, SendStep
from ..core.runops import RunOps
from ..core.runs import Current, SessionInfo, _is_the_write, check_listing_limit
from ..sessions import AsyncSession, check_session
from . import wakeups
from .aio import AsyncTransport, _Closes, node_wakers, run_all
from .aio_ops import AsyncStoreOps
from .sessions import SessionSteps
from .shell import RunShell
from .wakeups import LoopDriver, Wakeups, check_block

T = TypeVar("T")


class _AsyncReader(Protocol):
    async def get(self, run: str) -> Current: ...


async def aconfirm_write(store: _AsyncReader, run: str, revision: int | None,
                         record: bytes) -> bool:
    """The asyncio twin of :func:`redisstore.confirm_write`, for ``AsyncRedisRunStore``:
    after an ``Unavailable`` (or cancelled) insert or compare_and_set, whether it is the one
    stored. Here, with the store it reads, so the core never awaits (docs/design/house.md)."""
    try:
        current = await store.get(run)
    except NotFound:
        return False
    return _is_the_write(current, revision, record)


class AsyncPipeline(Pipelined):
    """Calls of one :class:`AsyncRedisRunStore` sent together in one round trip, at the end
    of its ``async with`` block (or by :meth:`send`): the asyncio twin of
    :class:`redisstore.shells.store.Pipeline`."""

    def __init__(self, io: AsyncTransport, ops: RunOps | PartitionedOps,
                 claim: Callable[[str, int, int | None, Callable[[], Any]],
                                 Awaitable[list[Any]]] | None = None) -> None:
        super().__init__(ops, io.durability)
        self._io = io
        self._claim = claim

    async def send(self) -> None:
        """Send the queued calls; each :class:`Pending` then holds its answer. A claim
        queued with ``block`` that got nothing then waits, as the store's does."""
        started = time.monotonic()
        if self._io.cluster:
            await self._io.client.initialize()  # once: it learns the layout on first use
        elif (lone := self._lone()) is not None:  # a worker's unit: one script, no steps
            try:
                self._settle_lone(await self._io.drive(lone))
            except StoreError as refused:
                self._settle_lone(error=refused)
            return
        steps = self._sending(self._io.node_of, started, alone=not self._io.cluster)
        value: Any = None
        error: StoreError | None = None
        while (step := next_step(steps, value, error)) is not None:
            try:
                value, error = await self._make(step), None
            except StoreError as exc:  # the call's answer: the steps decide
                value, error = None, exc

    async def _make(self, step: SendStep) -> Any:
        """One step of :meth:`send`, awaited (every group at once)."""
        if isinstance(step, Drive):
            return await self._io.drive(step.op)
        if isinstance(step, SendGroups):
            await run_all(self._io, step.groups)
            return None
        assert self._claim is not None, "a store's pipeline blocks with the store"
        blocked = step.blocked
        return await self._claim(blocked.index, blocked.limit, step.left, blocked.claim)

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            self._abandon()
        elif not self._sent:
            await self.send()


class AsyncRedisRunStore(_Closes, SessionSteps, AsyncStoreOps, RunShell[AsyncTransport]):
    """The leased run backend on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRunStore`, with the same options, methods (``async def``),
    errors and semantics. A cancelled write is of unknown outcome (see the module)."""

    #: Its operations (the mixin types them by the generated ``PartitionOps`` alone).
    _ops: RunOps | PartitionedOps
    _transport = AsyncTransport
    _run_ops = staticmethod(run_ops)

    async def aclose(self) -> None:
        """Stop the store's waker (if a claim ever blocked) and disconnect its
        connections (see :meth:`redisstore.RedisRunStore.close`)."""
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.stop()
        await super().aclose()

    def _wakeups(self) -> Wakeups:
        """The store's blocked claims (see :mod:`redisstore.shells.wakeups`): each waker thread
        runs an event loop of its own, so its connections are its own."""
        if self._wake is None:
            io = AsyncTransport(self._io.client, None, wakeups.waker_timeout(self._io.timeout),
                                home=asyncio.get_running_loop())
            driver = LoopDriver(io.drive, io.aclose)
            (first, *also) = self._ops.wake_sources(io.cluster)
            sweeps = self._ops.sweeps(io.cluster)
            self._wake = Wakeups(driver, *first, driver.close,
                                 pop_seconds=wakeups.pop_cap(self._io.client), also=also,
                                 sharded=None if sweeps is None else (
                                     sweeps, node_wakers(io, driver, self._io.timeout)))
        return self._wake

    def _dedicated(self, timeout: int) -> AsyncRedisRunStore:
        """This store with a deadline of at most ``timeout`` ms, for a keeper's event loop
        (connections are per event loop: that loop's are the keeper's own)."""
        twin = copy.copy(self)
        io = self._io
        twin._io = AsyncTransport(io.client, io.durability, min(timeout, io.timeout))
        twin._wake = None
        return twin

    def pipeline(self) -> AsyncPipeline:
        """Queue calls and send them in one round trip (see
        :meth:`redisstore.RedisRunStore.pipeline`)::

            async with store.pipeline() as pipe:
                done = pipe.compare_and_set(run, revision, record, Release())
                nxt = pipe.claim("node-a", 30_000, records=True, block=5_000)
            claimed = nxt.result()

        A task cancelled while the pipeline is in flight leaves each write in it of
        unknown outcome, as one cancelled write is.
        """
        return AsyncPipeline(self._io, self._ops, self._claim)

    # The primitives of the operations (AsyncStoreOps, generated from the core:
    # redisstore/shells/aio_ops.py).

    async def open_session(self, owner: str, ttl: int) -> AsyncSession:
        """:meth:`RedisRunStore.open_session`."""
        owner, ttl = check_session(owner, ttl)
        return AsyncSession(self, await self._session_open(owner, ttl), owner, ttl)

    async def sessions(self, limit: int = 1000) -> list[SessionInfo]:
        """:meth:`RedisRunStore.sessions`."""
        return await self._sessions(check_listing_limit(limit))  # type: ignore[no-any-return]

    async def _read(self, op: Operation[T] | Spread[T]) -> T:
        return await self._io.drive(self._ops.counting(op))

    async def _write(self, op: Operation[T] | Spread[T]) -> T:
        # The one-time server check runs before the store's first write (after the
        # write's own argument checks).
        return await self._io.drive(self._ops.guarded(op))

    async def _claim(self, index: str, limit: int, block: int | None,
                     claim: Callable[[], Operation[tuple[list[Any], int]]
                                     | Spread[tuple[list[Any], int]]]) -> list[Any]:
        wait = check_block(block)
        wait = wait if limit else 0  # limit 0: nothing could be claimed, nothing to wait for
        return await wakeups.aclaim(self._wakeups, index, lambda: self._write(claim()), wait)
