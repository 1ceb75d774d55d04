"""The asyncio I/O shell: ``AsyncRedisRunStore`` and ``AsyncRedisRepository`` over
``redis.asyncio`` (or ``fakeredis.FakeAsyncRedis``).

Only I/O lives here. Every operation, what it sends and what each reply means, is the same
sans-I/O generator the sync stores drive (:mod:`redisstore.protocol`,
:mod:`redisstore.repository`); this module awaits the round trips it asks for. The rules of
the sync shell hold (see :mod:`redisstore.transport`): a write is sent exactly once on a
connection of the store's own pool, bypassing the client's retry; NOSCRIPT loads the script
and sends again; the durability confirmation is pipelined behind the write. Concurrent
calls are pipelined together on a few connections (:class:`Mux`).

Cancellation: a task cancelled while its write is in flight re-raises ``CancelledError``;
its reply is still read, in order, and dropped (a call cancelled before its batch was
written is never sent). The write is then of unknown outcome, exactly like an ``Unavailable``
write: one script is atomic, so it was applied entirely or not at all, and
:func:`redisstore.aconfirm_write` tells which. See docs/async.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import select
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from . import telemetry, wakeups
from ._aio_ops import AsyncStoreOps
from .outcomes import ErrorReply, Exchange, Lost, Reply
from .partitioned_repository import PartitionedRepositoryOps, repository_ops
from .partitions import PartitionedOps, run_ops
from .pipeline import (
    MAX_ROUND_BYTES,
    MAX_ROUND_CALLS,
    Group,
    Pipelined,
    Spreading,
    Suspects,
    batch_size,
    patience,
    straggled,
)
from .protocol import (
    Batch,
    Driver,
    Durability,
    Machine,
    Operation,
    PerNode,
    Shell,
    Spread,
    check_io,
)
from .repository import MAX_PAGE, InFlightPage, InstanceRecord, Logger, RepositoryOps
from .runops import RunOps
from .runs import (
    MAX_RECORD,
    MIGRATE_COUNT,
    Discover,
    Migrated,
)
from .wakeups import LoopDriver, Nodes, Wakeups, check_block
from .wire import (
    RELEARNING,
    Connections,
    attached,
    attached_to,
    check_client,
    describe,
    error_reply,
    is_error_reply,
    never_evicts,
    next_hop,
    no_node,
    node_name,
    pack,
    pushed,
    relearn_after,
    subscribe_failed,
)

T = TypeVar("T")
S = TypeVar("S", bound="_Closes")


class _NoRetry:
    """Stands for redis-py's Retry on our connections: connect once, within the deadline."""

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await do()
        except Exception as exc:
            # redis-py 8 passes the failure count to ``fail``; older ones and valkey-py don't.
            await (fail(exc, 1) if kwargs.get("with_failure_count") else fail(exc))
            raise

    def update_supported_errors(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is retried, so no error list to extend."""

    def get_retries(self) -> int:
        """None (redis-py 8 asks when a health check fails)."""
        return 0


class AsyncPool(Connections):
    """The asyncio twin of :class:`redisstore.transport.Pool`: the store's connections to
    one server, made like the client pool's own, one call at a time on each."""

    def __init__(self, source: Any, checks: set[str]) -> None:
        super().__init__(source, _NoRetry(), checks)
        self._freed = asyncio.Condition()

    async def acquire(self) -> tuple[Any, bool]:
        """A connection and whether it is new (not connected yet); waits for one while
        ``max_connections`` are in use (the caller's deadline bounds the wait)."""
        while (got := self._take()) is None:
            async with self._freed:
                if (got := self._take()) is not None:  # freed while we took the lock
                    return got
                try:
                    await self._freed.wait()
                except asyncio.CancelledError:
                    # A wakeup meant for us may have come with the cancel: pass it on, or
                    # the next waiter would sleep beside an idle connection.
                    self._freed.notify()
                    raise
        return got

    def release(self, conn: Any) -> None:
        """Give back a clean connection (or drop it, if the pool was closed meanwhile)."""
        if not self._keep(conn):
            self._open -= 1
            self._wake()
            asyncio.get_running_loop().create_task(conn.disconnect(nowait=True))
            return
        self._idle.append(conn)
        self._wake()

    async def aclose(self) -> None:
        """Disconnect the idle connections now and the busy ones as their calls end."""
        idle = self._close_idle()
        self._wake()
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    async def discard(self, conn: Any) -> None:
        """Drop a connection after a failure (without waiting on it: we may be cancelled)."""
        self._open -= 1
        self._wake()
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)

    def _wake(self) -> None:
        async def notify() -> None:
            async with self._freed:
                self._freed.notify()
        if self._freed._waiters:
            asyncio.get_running_loop().create_task(notify())


_CHECKS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def checks_for(source: Any) -> set[str]:
    """The one-time server checks done for a client's connection pool (they hold for the
    server, whatever the event loop)."""
    return _CHECKS.setdefault(source, set())


def _readable(fd: int) -> bool:
    """Whether the socket has data, EOF or an error waiting, without blocking. poll, not
    select: select refuses descriptors >= 1024, which a busy process has."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)  # POLLHUP/POLLERR come anyway
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - no poll (Windows)


async def _stale(conn: Any) -> bool:
    """Whether an idle connection has data or EOF waiting (see transport._stale)."""
    # Ask the socket first. The clients' probes read the stream, which learns of an EOF
    # only once the loop has run the socket's read callback: right after a cut, the probe
    # of redis-py 6 and 8 alike still said "idle", and a write went out on a closed
    # connection (an unknown outcome instead of a reconnect).
    extra = getattr(getattr(conn, "_writer", None), "get_extra_info", None)
    sock = extra("socket") if callable(extra) else None
    if sock is not None:
        try:
            if _readable(sock.fileno()):
                return True
        except (OSError, ValueError):
            return True
    # redis-py 8 renamed can_read_destructive to can_read; valkey-py keeps the old name.
    probe = getattr(conn, "can_read", None) or conn.can_read_destructive
    try:
        return bool(await probe())
    except Exception:
        return True


class _Waiter:
    """One call's batch in the multiplexer: sent, dropped (its caller gave up before it was
    sent: it never will be), and the replies read so far."""

    __slots__ = ("batch", "deadline", "dropped", "future", "replies", "sent")

    def __init__(self, batch: Batch, deadline: float, future: asyncio.Future[Exchange]) -> None:
        self.batch = batch
        self.deadline = deadline
        self.future = future
        self.sent = False
        self.dropped = False
        self.replies: list[Reply | ErrorReply] = []

    def answer(self, got: Exchange) -> None:
        if not self.future.done():
            self.future.set_result(got)


#: A call queued behind busy flushers, one of which has been on its flush this long (s),
#: gets one more flusher, up to MAX_FLUSHES: a flush stuck on a hung connection holds only
#: its own calls.
KICK_AFTER = 0.25
MAX_FLUSHES = 32


class Mux:
    """Auto-pipelining for one client pool on one event loop: the batches of concurrent
    calls are coalesced into one write on one connection, and their replies read in order.

    A call queues its batch and waits for its own :class:`Exchange`. A flusher takes every
    batch queued (at most MAX_ROUND_CALLS calls and MAX_ROUND_BYTES of arguments), sends
    them in one write and hands each its replies; at most ``flushes`` flushers run at once,
    each on one connection of the store's pool, so any number of tasks needs a few
    connections. Every rule of one call holds:

    - a batch goes out once; a call that gives up (its deadline, a cancel) before its batch
      was sent is never sent (``not_applied``); after, its reply is read and dropped (the
      write's outcome is unknown), and the connection stays in use;
    - a connection lost mid-flush: a call whose replies were all read has its answer; the
      others of that write get a lost exchange that says it was sent (a write: unknown);
      one lost before anything was written says nothing was sent;
    - a flush is bounded by the latest deadline of its calls; each call by its own.
    """

    def __init__(self, pool: AsyncPool, flushes: int = 4) -> None:
        self.pool = pool
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._max = flushes
        self._tasks: set[asyncio.Task[None]] = set()
        #: When each flush in flight started (loop time), by flush.
        self._flushes: dict[int, float] = {}
        self._kicking = False  # a _kick is due

    def _start(self, limit: int) -> None:
        """Start a flusher if fewer than ``limit`` run. A flusher counts while its task
        lives, so one cancelled (a shutdown that cancels every task) frees its place."""
        if len(self._tasks) < limit:
            task = asyncio.get_running_loop().create_task(self._flush_all())
            self._tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if any(not w.dropped for w in self._queue) and not task.get_loop().is_closed():
            self._start(self._max)  # calls still queued: someone must send them

    def _kick(self) -> None:
        """A call waited behind busy flushers: if one of them has been on its flush for
        KICK_AFTER already (stuck on a hung connection, most likely: a flush under load
        takes milliseconds), let one more flusher take the queue, on another connection."""
        self._kicking = False
        if not any(not w.dropped for w in self._queue):
            return
        loop = asyncio.get_running_loop()
        if any(loop.time() - since >= KICK_AFTER for since in self._flushes.values()):
            self._start(MAX_FLUSHES)
        else:
            self._arm()  # look again while calls wait

    def _arm(self) -> None:
        if not self._kicking:
            self._kicking = True
            asyncio.get_running_loop().call_later(KICK_AFTER / 2, self._kick)

    async def exchange(self, batch: Batch, deadline: float, timeout: int) -> Exchange:
        """Send ``batch`` with the next flush; what came back for it."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(batch, deadline, loop.create_future())
        self._queue.append(waiter)
        if len(self._tasks) < self._max:
            self._start(self._max)
        else:
            self._arm()
        try:
            async with asyncio.timeout_at(_loop_deadline(deadline)):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            if waiter.future.done():
                return waiter.future.result()
            waiter.dropped = True
            return Exchange(tuple(waiter.replies), Lost(waiter.sent,
                                                        f"deadline of {timeout} ms exceeded",
                                                        True))
        except asyncio.CancelledError:
            waiter.dropped = True  # not sent: never will be; sent: its reply is dropped
            raise

    async def _flush_all(self) -> None:
        while self._queue:
            take: list[_Waiter] = []
            size = 0
            while self._queue and len(take) < MAX_ROUND_CALLS:
                waiter = self._queue[0]
                if waiter.dropped:
                    self._queue.popleft()
                    continue
                size += batch_size(waiter.batch)
                if take and size > MAX_ROUND_BYTES:
                    break
                take.append(self._queue.popleft())
            if take:
                await self._flush(take)

    async def _flush(self, take: list[_Waiter]) -> None:
        self._flushes[id(take)] = asyncio.get_running_loop().time()
        try:
            await self._flush_on_a_connection(take)
        finally:
            del self._flushes[id(take)]

    async def _flush_on_a_connection(self, take: list[_Waiter]) -> None:
        pool = self.pool
        conn: Any = None
        try:
            async with asyncio.timeout_at(_loop_deadline(max(w.deadline for w in take))):
                conn, fresh = await pool.acquire()
                if not fresh and await _stale(conn):
                    stale, conn = conn, None
                    await pool.discard(stale)
                    conn, fresh = await pool.acquire()
                if fresh:
                    await conn.connect()
                live = [w for w in take if not w.dropped]  # gave up waiting: never sent
                if not live:
                    pool.release(conn)
                    return
                confirm = _one_confirmation(live)
                commands: list[tuple[bytes | int, ...]] = []
                for waiter in live:
                    waiter.sent = True
                    commands.extend(waiter.batch.commands[:-1] if waiter in confirm
                                    else waiter.batch.commands)
                if confirm:  # the one confirmation they share, after all of them
                    commands.append(next(iter(confirm)).batch.commands[-1])
                await conn.send_packed_command(pack(conn, tuple(commands)))
                for waiter in live:
                    own = len(waiter.batch.commands) - (waiter in confirm)
                    for _ in range(own):
                        waiter.replies.append(await _read(conn))
                    if waiter not in confirm:
                        waiter.answer(Exchange(tuple(waiter.replies)))
                if confirm:
                    confirmation = await _read(conn)
                    for waiter in confirm:
                        waiter.replies.append(confirmation)
                        waiter.answer(Exchange(tuple(waiter.replies)))
        except BaseException as exc:
            # Cut, timed out, or this flusher cancelled (the loop is closing): the
            # connection may still receive replies, which would answer the next write on
            # it. Drop it; every call without its answer learns what became of it.
            if conn is not None:
                await pool.discard(conn)
            timed_out = isinstance(exc, TimeoutError)
            reason = "the flush's deadline passed" if timed_out else describe(exc)
            code = error_reply(exc).code if is_error_reply(exc) else None
            for waiter in take:
                waiter.answer(Exchange(tuple(waiter.replies),
                                       Lost(waiter.sent, reason, timed_out, code)))
            if not isinstance(exc, Exception):
                raise
            return
        pool.release(conn)


async def _read(conn: Any) -> Reply | ErrorReply:
    try:
        return Reply(await conn.read_response(disable_decoding=True))
    except Exception as exc:
        if not is_error_reply(exc):
            raise
        return error_reply(exc)


def _one_confirmation(live: list[_Waiter]) -> set[_Waiter]:
    """The writes of a flush whose durability confirmations one can replace: when two or
    more writes end with the same ``WAIT`` / ``WAITAOF``, one at the end of the flush covers
    them all (it counts every write sent before it on the connection)."""
    ends: dict[tuple[bytes | int, ...], set[_Waiter]] = {}
    for waiter in live:
        last = waiter.batch.commands[-1] if waiter.batch.write else None
        if last is not None and last[0] in (b"WAIT", b"WAITAOF") \
                and len(waiter.batch.commands) > 1:
            ends.setdefault(last, set()).add(waiter)
    if len(ends) != 1:
        return set()  # none, or stores of several durabilities: each keeps its own
    (group,) = ends.values()
    return group if len(group) > 1 else set()


# An asyncio connection belongs to the loop that opened it, and a client may outlive its
# loop (``asyncio.run`` twice with one client, or a test runner's loop per test): one Mux,
# with its pool, per client pool and running loop, so no call ever gets a connection of
# another loop.
def mux_for(source: Any) -> Mux:
    """The :class:`Mux` of a client's connection pool on the running loop (the muxes are
    kept on the pool: see :func:`~redisstore.wire.attached`)."""
    loop = asyncio.get_running_loop()
    muxes: dict[asyncio.AbstractEventLoop, Mux] = attached(source, "_redisstore_muxes", dict)
    mux = muxes.get(loop)
    if mux is None:
        # A new loop: forget the muxes (and pools) of loops that are closed. Their
        # connections cannot be closed cleanly any more (``aclose()`` before a loop ends
        # does that); dropped, they are closed as they are collected. A pool holds its loop
        # (its connections' streams do), so without this every asyncio.run would leave one
        # behind.
        for gone in [other for other in muxes if other.is_closed()]:
            del muxes[gone]
        mux = muxes[loop] = Mux(AsyncPool(source, checks_for(source)))
    return mux


def pool_for(source: Any) -> AsyncPool:
    """The :class:`AsyncPool` of a client's connection pool on the running loop."""
    return mux_for(source).pool


class _NodeSource:
    """The settings of one node of a ``redis.asyncio.RedisCluster``, as a pool source: its
    ``ClusterNode`` cannot be weakly referenced (slots) and is replaced when the client
    learns the cluster's layout again."""

    def __init__(self, node: Any) -> None:
        self.connection_class = node.connection_class
        self.connection_kwargs = node.connection_kwargs
        self.max_connections = node.max_connections


def node_source(client: Any, node: Any) -> _NodeSource:
    """The pool source of ``node`` of the cluster ``client``: one per node name, so a
    node's connections outlive the client's relearning of the layout (kept on the client:
    see :func:`~redisstore.wire.attached`)."""
    sources: dict[str, _NodeSource] = attached(client, "_redisstore_nodes", dict)
    found = sources.get(node.name)
    if found is None:
        found = sources[node.name] = _NodeSource(node)
    return found


class AsyncTransport:
    """Runs operations on a ``redis.asyncio.Redis`` client (or valkey-py's, or
    ``FakeAsyncRedis``, or a ``redis.asyncio.RedisCluster``). ``timeout`` is each
    operation's deadline, in ms.

    Any number of tasks share a store: their calls are pipelined together on a few
    connections of the store's pool (made like the client's), each call's replies read in
    order and handed to it alone (:class:`Mux`).
    """

    def __init__(self, client: Any, durability: Durability | None = None,
                 timeout: int = 5000, *, home: asyncio.AbstractEventLoop | None = None
                 ) -> None:
        check_client(client, asynchronous=True)
        self.client = client
        self.durability = durability
        self.timeout = timeout
        #: The loop the client's own connections live on, when this transport runs on
        #: another (a waker thread's): the cluster client learns its slot map there.
        self.home = home
        #: Whether the client is a RedisCluster (the store talks to its nodes).
        self.cluster = hasattr(client, "get_node_from_key")
        #: The one-time server checks done for this client, shared by its stores.
        self.checks = PerNode() if self.cluster else checks_for(client.connection_pool)
        #: fakeredis: no maxmemory, no persistence settings, nothing to check on the server.
        self.fake = never_evicts(client)
        if self.fake:
            self.checks.add("eviction")
        #: The nodes this transport's patient fans cut lately (see Suspects).
        self.suspects = Suspects()

    async def aclose(self) -> None:
        """Disconnect the store's connections on the running loop (shared by every store
        on this client: the others connect again on their next call). The client itself
        is not closed."""
        if not self.cluster:
            await pool_for(self.client.connection_pool).aclose()
            return
        for source in list((attached_to(self.client, "_redisstore_nodes") or {}).values()):
            await pool_for(source).aclose()

    async def drive(self, op: Operation[T] | Spread[T]) -> T:
        """Run an operation to its end: send each batch it makes, report what came back."""
        if isinstance(op, Spread):
            return await self._spread(op)
        driver = Driver(op, self.durability)
        if not telemetry.recording():
            await self.run(driver)
            return driver.result()
        with telemetry.operation(driver.telemetry) as call:
            await self.run(driver)
            call.result = driver.result()
            return call.result  # type: ignore[no-any-return]

    async def _spread(self, spread: Spread[T]) -> T:
        """Run a call over partitions: each fan's operations grouped by node, the nodes at
        once, within one deadline."""
        deadline = time.monotonic() + self.timeout / 1000
        if self.cluster:
            await self.client.initialize()  # once: it learns the layout on first use
        spreading = Spreading(spread, self.durability, self.node_of)
        while (groups := spreading.next_groups()) is not None:
            if not spreading.patient or len(groups) < 2:
                await run_all(self, groups, deadline)
                continue
            send, graces = self.suspects.plan(groups, patience(self.timeout),
                                              time.monotonic())
            cut = await run_all(self, send, deadline, graces)
            self.suspects.heard(send, cut, time.monotonic())
        return spreading.result  # type: ignore[return-value]

    def node_of(self, key: str) -> Hashable:
        """The node ``key`` lives on, as far as the client knows (None: one server)."""
        return node_name(self.client, key)

    async def run(self, machine: Machine, deadline: float | None = None) -> None:
        """Send each batch of ``machine`` (a driver, a pipeline), within one deadline."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout / 1000
        while (batch := machine.next_batch()) is not None:
            machine.receive(await self._send(batch, deadline))

    async def _send(self, batch: Batch, deadline: float) -> Exchange:
        if not self.cluster:
            return await mux_for(self.client.connection_pool).exchange(batch, deadline,
                                                                       self.timeout)
        # RedisCluster: every key of a namespace is in one slot; talk to its node.
        try:
            await self.client.initialize()  # once: it learns the layout on first use
            node = self.client.get_node_from_key(batch.keys[0] if batch.keys else "")
            source = node_source(self.client, node)
        except Exception as exc:
            return no_node(exc)
        got = await mux_for(source).exchange(batch, deadline, self.timeout)
        tried = {node.name}
        # MOVED: no script ran, the slot has a new owner (see Transport._send).
        while (node := next_hop(self.client, batch, got, tried)) is not None:
            try:
                mux = mux_for(node_source(self.client, node))
            except Exception:
                break
            got = await mux.exchange(batch, deadline, self.timeout)
        if relearn_after(got, len(tried) - 1):
            _relearn_later(self.client, self.timeout, self.home)
        return got


async def run_all(io: AsyncTransport, groups: list[Group], deadline: float | None = None,
                  graces: Sequence[float] | None = None) -> list[bool]:
    """Send ``groups`` (one per node) at once. If this task is cancelled, or a send raises,
    every call still without its answer gets one (see Group.interrupted). With ``graces``
    (a patient fan's, see :class:`~redisstore.protocol.Fan`): once one group is over, each
    other gets its grace (s) more; then it is cancelled and its calls answer
    ``not_applied`` (Group.cut). Which groups were cut."""
    tasks = [asyncio.ensure_future(io.run(group, deadline)) for group in groups]
    cut = [False] * len(groups)
    try:
        if graces is not None and len(tasks) > 1:
            _, waiting = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if waiting:
                since = time.monotonic()
                for i in sorted(range(len(tasks)), key=lambda i: graces[i]):
                    until = since + graces[i] if deadline is None \
                        else min(since + graces[i], deadline)
                    if not tasks[i].done():
                        await asyncio.wait([tasks[i]],
                                           timeout=max(0.0, until - time.monotonic()))
                    if not tasks[i].done():
                        tasks[i].cancel()
                        cut[i] = True
                await asyncio.gather(*(t for t, c in zip(tasks, cut, strict=True) if c),
                                     return_exceptions=True)
                for i, group in enumerate(groups):
                    if cut[i]:
                        group.cut(f"{straggled(graces[i])}; nothing was changed (a read)")
        await asyncio.gather(*(t for t, c in zip(tasks, cut, strict=True) if not c))
    except BaseException as exc:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in groups:
            group.interrupted(type(exc).__name__)
        raise
    return cut


_RELEARN_TASKS: set[asyncio.Task[None]] = set()


def _relearn_later(client: Any, timeout: int,
                   home: asyncio.AbstractEventLoop | None = None) -> None:
    """Have the asyncio cluster ``client`` learn its slot map again in a task of its own
    (see :func:`redisstore.transport.relearn_later`), on its ``home`` loop when the caller
    runs on another: the connections a relearn makes belong to the loop it runs on, and
    the client's must stay on the client's (else closing it fails: another loop's futures)."""
    if home is not None and home is not _running_loop():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nothing to relearn
            home.call_soon_threadsafe(_relearn_later, client, timeout)
        return
    task = asyncio.get_running_loop().create_task(_relearn(client, timeout))
    _RELEARN_TASKS.add(task)
    task.add_done_callback(_RELEARN_TASKS.discard)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _relearn(client: Any, timeout: int) -> None:
    """Learn the slot map of ``client`` again, unless a relearn is under way."""
    token = RELEARNING.begin(client, timeout)
    if token is None:
        return
    try:
        await asyncio.wait_for(client.nodes_manager.initialize(), max(timeout / 1000, 1.0))
    except Exception:  # the next call that needs it tries again
        pass
    finally:
        RELEARNING.end(client, token)


class AsyncNodeSubscription:
    """A waker per node's connection (:class:`~redisstore.wakeups.Subscription`) to the
    node of ``key`` on the asyncio cluster ``client``, made like that node's own; its I/O
    runs on the waker thread's loop (``run``); replies within ``timeout`` s."""

    def __init__(self, client: Any, key: str, run: Callable[[Any], Any],
                 timeout: float) -> None:
        source = node_source(client, client.get_node_from_key(key))
        self._conn = source.connection_class(**source.connection_kwargs)
        self._run = run
        self._timeout = timeout

    async def _subscribe(self, channels: Sequence[str]) -> None:
        await self._conn.send_command("SSUBSCRIBE", *channels)
        for _ in channels:
            if await self._conn.read_response(timeout=self._timeout,
                                              push_request=True) is None:
                raise TimeoutError("no answer to SSUBSCRIBE within the store's timeout")

    def subscribe(self, channels: Sequence[str]) -> None:
        try:
            self._run(self._subscribe(channels))
        except Exception as exc:
            raise subscribe_failed(exc) from exc

    def message(self, timeout: float) -> tuple[str, str] | None:
        reply = self._run(self._conn.read_response(timeout=timeout, push_request=True))
        return None if reply is None else pushed(reply)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._run(self._conn.disconnect())


def node_wakers(io: AsyncTransport, driver: LoopDriver, timeout: int) -> Nodes:
    """How the wakers per node of a store on the asyncio cluster client of ``io`` reach its
    nodes, on their threads' loops (``driver``; ``timeout``: the store's, in ms)."""
    return Nodes(io.node_of,
                 lambda key: AsyncNodeSubscription(io.client, key, driver.run, timeout / 1000),
                 lambda: _relearn_later(io.client, timeout, io.home))


def _loop_deadline(deadline: float) -> float:
    # asyncio.timeout_at takes the loop's clock; ours is time.monotonic (the same clock on
    # CPython's default loop, but say so rather than rely on it).
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())


class _Closes:
    """``aclose()`` and ``async with``: see :class:`redisstore.RedisRunStore.close`."""

    _io: AsyncTransport

    async def aclose(self) -> None:
        """Disconnect the store's own connections opened on the running loop: the idle ones
        now, the busy ones as their calls end. Shared by every store on the same client,
        they connect again on the next call. The client is yours to close."""
        await self._io.aclose()

    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncPipeline(Pipelined):
    """Calls of one :class:`AsyncRedisRunStore` sent together in one round trip, at the end
    of its ``async with`` block (or by :meth:`send`): the asyncio twin of
    :class:`redisstore.store.Pipeline`."""

    def __init__(self, io: AsyncTransport, ops: RunOps | PartitionedOps) -> None:
        super().__init__(ops, io.durability)
        self._io = io

    async def send(self) -> None:
        """Send the queued calls; each :class:`Pending` then holds its answer."""
        if self._io.cluster:
            await self._io.client.initialize()  # once: it learns the layout on first use
        groups = self._groups(self._io.node_of)
        if groups:
            await run_all(self._io, groups)

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            self._abandon()
        elif not self._sent:
            await self.send()


class AsyncRedisRunStore(_Closes, AsyncStoreOps, Shell[RunOps | PartitionedOps]):
    """The leased run backend on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRunStore`, with the same options, methods (``async def``),
    errors and semantics. A cancelled write is of unknown outcome (see the module)."""

    def __init__(self, client: Any, *, namespace: str = "redisstore",
                 discover: Discover | None = None, projection_version: int = 1,
                 durability: Durability | None = None, timeout: int = 5000,
                 max_record_bytes: int = MAX_RECORD, partitions: int = 1) -> None:
        durability, timeout = check_io(durability, timeout)
        self._ops = run_ops(namespace, discover, projection_version, durability=durability,
                            max_record_bytes=max_record_bytes, partitions=partitions)
        self._io = AsyncTransport(client, durability, timeout)
        self._ops.checks = self._io.checks
        self._wake: Wakeups | None = None

    async def aclose(self) -> None:
        """Stop the store's waker (if a claim ever blocked) and disconnect its
        connections (see :meth:`redisstore.RedisRunStore.close`)."""
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.stop()
        await super().aclose()

    def _wakeups(self) -> Wakeups:
        """The store's blocked claims (see :mod:`redisstore.wakeups`): each waker thread
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

    def _place(self, run: str) -> int:
        """The partition of ``run`` (0 in a store of one partition): a keeper leaves a failed
        partition's runs out of the rest of its round."""
        return self._ops.place(run) if isinstance(self._ops, PartitionedOps) else 0

    def pipeline(self) -> AsyncPipeline:
        """Queue calls and send them in one round trip (see
        :meth:`redisstore.RedisRunStore.pipeline`)::

            async with store.pipeline() as pipe:
                done = pipe.compare_and_set(run, revision, record, Release())
                nxt = pipe.claim_ready("node-a", 30_000, 1, records=True)
            claimed = nxt.result()

        A task cancelled while the pipeline is in flight leaves each write in it of
        unknown outcome, as one cancelled write is.
        """
        return AsyncPipeline(self._io, self._ops)

    async def migrate(self, *, count: int = MIGRATE_COUNT) -> Migrated:
        """See :meth:`redisstore.RedisRunStore.migrate`."""
        report = Migrated()
        while True:
            step = await self._write(self._ops.migrate_step(count))
            report = report.then(step)
            if step[1]:
                return report

    # The primitives of the operations (AsyncStoreOps, generated from the core:
    # redisstore/_aio_ops.py).

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
        if limit == 0:
            wait = 0  # nothing could be claimed: nothing to wait for

        async def once() -> tuple[list[Any], int]:
            return await self._write(claim())

        if not wait:
            return (await once())[0]
        return await wakeups.aclaim(self._wakeups, index, once, wait)


class AsyncRedisRepository(_Closes, Shell[RepositoryOps | PartitionedRepositoryOps]):
    """The instance repository on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRepository`, with the same options, methods (``async def``),
    errors and semantics. A cancelled ``save`` or ``delete`` is of unknown outcome: load
    the record to find out."""

    def __init__(self, client: Any, *, namespace: str = "redisstore", max_terminal: int = 1024,
                 logger: Logger | None = None, durability: Durability | None = None,
                 timeout: int = 5000, partitions: int = 1) -> None:
        self._ops = repository_ops(namespace, max_terminal, logger, partitions)
        self._io = AsyncTransport(client, *check_io(durability, timeout))

    async def save(self, rec: InstanceRecord) -> int:
        """See :meth:`redisstore.RedisRepository.save`."""
        return await self._io.drive(self._ops.save(rec))

    async def load(self, id: str) -> InstanceRecord | None:
        """See :meth:`redisstore.RedisRepository.load`."""
        return await self._io.drive(self._ops.load(id))

    async def delete(self, id: str, *, expected_version: int | None = None) -> None:
        """See :meth:`redisstore.RedisRepository.delete`."""
        await self._io.drive(self._ops.delete(id, expected_version))

    async def list_in_flight(self, group: str, now: datetime | None = None) -> list[str]:
        """See :meth:`redisstore.RedisRepository.list_in_flight`."""
        return await self._io.drive(self._ops.list_in_flight(group, now))

    async def list_in_flight_page(self, group: str, now: datetime | None = None, *,
                                  cursor: str | None = None,
                                  limit: int = MAX_PAGE) -> InFlightPage:
        """See :meth:`redisstore.RedisRepository.list_in_flight_page`."""
        return await self._io.drive(self._ops.list_in_flight_page(group, now, cursor=cursor,
                                                                  limit=limit))

    async def register_group(self, group: str) -> None:
        """See :meth:`redisstore.RedisRepository.register_group`."""
        await self._io.drive(self._ops.register_group(group))

    async def group_exists(self, group: str) -> bool:
        """See :meth:`redisstore.RedisRepository.group_exists`."""
        return await self._io.drive(self._ops.group_exists(group))

    async def migrate(self) -> None:
        """See :meth:`redisstore.RedisRepository.migrate`."""
        await self._io.drive(self._ops.migrate(settings=not self._io.fake))

    async def cluster_compatibility(self) -> tuple[bool, str]:
        """See :meth:`redisstore.RedisRepository.cluster_compatibility`."""
        return self._ops.cluster_compatibility()
