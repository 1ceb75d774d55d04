"""The asyncio transport over ``redis.asyncio`` (or ``FakeAsyncRedis``): ``AsyncTransport``.

The stores on it are :mod:`redisstore.shells.aio_store` (``AsyncRedisRunStore``) and
:mod:`redisstore.shells.repo_aio` (``AsyncRedisRepository``).

Only I/O lives here. Every operation, what it sends and what each reply means, is the same
sans-I/O generator the sync stores drive (:mod:`redisstore.core.driver`,
:mod:`redisstore.repository`); this module awaits the round trips it asks for. The rules of
the sync shell hold (see :mod:`redisstore.shells.sync`): a write is sent exactly once on a
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
import logging
import select
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from ..core import telemetry
from ..core.driver import (
    Batch,
    Done,
    Driver,
    Durability,
    Machine,
    Operation,
    PerNode,
    Spread,
    parsed,
    resume,
)
from ..core.groups import (
    MAX_ROUND_BYTES,
    MAX_ROUND_CALLS,
    Group,
    Spreading,
    Suspects,
    patience,
    straggled,
)
from ..core.outcomes import ErrorReply, Exchange, Lost, Reply
from .clients import (
    _MORE,
    RELEARNING,
    Connections,
    _pack_one,
    _replies,
    attached,
    attached_to,
    check_client,
    describe,
    error_reply,
    is_error_reply,
    lean_error,
    never_evicts,
    next_hop,
    no_node,
    node_name,
    pushed,
    relearn_after,
    subscribe_failed,
)
from .wakeups import LoopDriver, Nodes

try:
    from hiredis import Reader as _Reader
    from hiredis import ReplyError as _ReplyError
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _Reader = _ReplyError = None  # type: ignore[assignment,misc]
try:
    from hiredis import PushNotification as _Push
except ImportError:  # pragma: no cover - hiredis < 3.2: RESP3 is read by its own methods
    _Push = None  # type: ignore[assignment,misc]

T = TypeVar("T")
S = TypeVar("S", bound="_Closes")
log = logging.getLogger("redisstore.core.driver")


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
    """The asyncio twin of :class:`redisstore.shells.sync.Pool`: the store's connections to
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

    def forget(self, conn: Any) -> None:
        """:meth:`discard` from a callback (or a task being cancelled): the connection's
        own ``disconnect`` runs in a task of its own."""
        self._open -= 1
        self._wake()
        _background(_quietly(conn.disconnect(nowait=True)))

    def _wake(self) -> None:
        async def notify() -> None:
            async with self._freed:
                self._freed.notify()
        if self._freed._waiters:
            asyncio.get_running_loop().create_task(notify())


_BACKGROUND: set[asyncio.Task[Any]] = set()


def _background(work: Any) -> None:
    """Run ``work`` in a task kept until it ends (none when the loop is gone)."""
    try:
        task = asyncio.get_running_loop().create_task(work)
    except RuntimeError:
        work.close()
        return
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _quietly(work: Any) -> None:
    with contextlib.suppress(Exception):
        await work


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


def _neutral(reply: Any) -> Reply | ErrorReply:
    """A reply as a line read it (a ``hiredis.Reader``'s, or already neutral on the
    fallback) as a neutral value."""
    kind = type(reply)
    if kind is Reply or kind is ErrorReply:
        return reply  # type: ignore[no-any-return]
    return lean_error(str(reply)) if kind is _ReplyError else Reply(reply)


class _Entry:
    """One call's commands in the multiplexer: ``data`` (packed) expecting ``base``
    replies, then maybe its durability confirmation (``confirm``, packed), which a write
    shares with the other writes of its flush that end with the same one.

    Its ``future`` gets the replies as a line read them: a list (a lean line's, as hiredis
    parsed them, error replies as ``hiredis.ReplyError``), or an :class:`Exchange` (the
    fallback's, a lost exchange, a deadline). ``sent``: written (never again)."""

    __slots__ = ("base", "confirm", "count", "data", "deadline", "future", "replies", "sent",
                 "shared", "timeout")

    def __init__(self, data: bytes, base: int, confirm: bytes | None, deadline: float,
                 timeout: int, future: asyncio.Future[Any]) -> None:
        self.data = data
        self.base = base
        self.confirm = confirm
        self.deadline = deadline
        self.timeout = timeout
        self.future = future
        #: The replies this write expects on its line (base, plus its own confirmation).
        self.count = base
        self.sent = False
        self.replies: list[Any] = []
        #: The confirmation it shares with the other writes of its flush.
        self.shared: _Confirmation | None = None

    def read(self, reply: Any, raw: bool) -> bool:
        """One more of its replies; True when it has all of its own."""
        replies = self.replies
        replies.append(reply)
        if len(replies) < self.count:
            return False
        if self.shared is None:
            self.settle(raw)
        return True

    def settle(self, raw: bool) -> None:
        future = self.future
        if not future.done():
            future.set_result(self.replies if raw else Exchange(tuple(self.replies)))

    def fail(self, lost: Lost) -> None:
        """Answer what became of it (nothing, when its caller gave up already)."""
        if not self.future.done():
            self.future.set_result(Exchange(tuple(map(_neutral, self.replies)), lost))

    def members(self) -> tuple[_Entry, ...]:
        return (self,)


class _Confirmation:
    """The one ``WAIT`` / ``WAITAOF`` sent after the writes of a flush that each end with
    it: its reply is each one's confirmation (it counts every write sent before it on the
    connection)."""

    __slots__ = ("count", "deadline", "sent", "writes")

    def __init__(self, writes: list[_Entry]) -> None:
        self.writes = writes
        self.count = 1
        self.sent = True
        self.deadline = max(w.deadline for w in writes)
        for write in writes:
            write.shared = self

    def read(self, reply: Any, raw: bool) -> bool:
        for write in self.writes:
            write.replies.append(reply)
            write.settle(raw)
        return True

    def fail(self, lost: Lost) -> None:
        for write in self.writes:
            write.fail(lost)

    def members(self) -> list[_Entry]:
        return self.writes


def _round(queue: collections.deque[_Entry]) -> list[_Entry]:
    """The calls of one write, taken from the head of ``queue``: at most MAX_ROUND_CALLS
    and MAX_ROUND_BYTES (but always one), skipping calls already answered (a deadline or a
    cancel before they were written)."""
    take: list[_Entry] = []
    size = 0
    while queue and len(take) < MAX_ROUND_CALLS:
        entry = queue[0]
        if entry.future.done():
            queue.popleft()
            continue
        size += len(entry.data)
        if take and size > MAX_ROUND_BYTES:
            break
        take.append(queue.popleft())
    return take


def _compose(take: list[_Entry]) -> tuple[list[_Entry | _Confirmation], bytes]:
    """The calls of one flush as what a line waits for, in order, and the bytes to write:
    each call's commands, its durability confirmation after it, or, when two or more writes
    end with the same one, that one once after all of them."""
    items: list[_Entry | _Confirmation] = list(take)
    confirms = [entry for entry in take if entry.confirm is not None]
    share = len(confirms) > 1 and all(e.confirm == confirms[0].confirm for e in confirms)
    chunks: list[bytes] = []
    for entry in take:
        entry.sent = True
        chunks.append(entry.data)
        if entry.confirm is not None and not share:
            chunks.append(entry.confirm)
            entry.count = entry.base + 1
    if share:
        chunks.append(confirms[0].confirm)  # type: ignore[arg-type]
        items.append(_Confirmation(confirms))
    return items, chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Line:
    """What a connection of the multiplexer has in flight: the calls of its one write, in
    the order their replies come, and when it wrote and last heard from the server
    (``time.monotonic``)."""

    #: The client's ``socket_timeout``: how long a line may wait for data (None: no limit).
    own: float | None = None

    def __init__(self) -> None:
        self.pending: collections.deque[_Entry | _Confirmation] = collections.deque()
        self.written = 0.0
        self.heard = 0.0


def _dead(timeout: int, sent: bool) -> Lost:
    return Lost(sent, f"deadline of {timeout} ms exceeded", True)


class _LeanLine(_Line, asyncio.Protocol):
    """A connection of the store's pool, connected and handshaken by its own class (TLS,
    credentials, protocol, name), whose transport the multiplexer then reads itself: the
    line is the transport's protocol, each write one ``transport.write`` of the calls
    packed by hiredis, each chunk read fed to a ``hiredis.Reader`` of its own, and each
    reply handed to its call, in order, as it is parsed (no task reads it).

    Its connection's own stream reader learns only that it was closed (so the connection
    closes as usual). A line is never written to while it waits for replies, so a hung
    connection holds the calls of one write only."""

    def __init__(self, mux: Mux, conn: Any, transport: asyncio.Transport,
                 stream: asyncio.BaseProtocol, fd: int) -> None:
        super().__init__()
        self.mux = mux
        self.conn = conn
        self.transport = transport
        self.stream = stream
        self.reader = _Reader(notEnoughData=_MORE)
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN | select.POLLPRI)
        own = getattr(conn, "socket_timeout", None)
        self.own = float(own) if own else None
        #: No more writes: it is being closed, or retires once its replies are read.
        self.closing = False
        #: Why the store closed it (reason, timed_out), for the calls still waiting.
        self.why: tuple[str, bool] | None = None
        self.closed: asyncio.Future[None] = mux.loop.create_future()

    @staticmethod
    def take_over(mux: Mux, conn: Any) -> _LeanLine | None:
        """The line of a connection just connected, or None when its transport cannot be
        read this way (fakeredis, no hiredis, RESP3 without hiredis' push type, no poll)."""
        reader, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
        if _Reader is None or not hasattr(select, "poll") \
                or (_Push is None and str(getattr(conn, "protocol", 2) or 2) != "2") \
                or not isinstance(reader, asyncio.StreamReader) \
                or not isinstance(writer, asyncio.StreamWriter) \
                or len(getattr(reader, "_buffer", b"")):
            return None
        transport = writer.transport
        sock = transport.get_extra_info("socket")
        if sock is None or transport.is_closing() or not isinstance(transport,
                                                                    asyncio.Transport):
            return None
        line = _LeanLine(mux, conn, transport, transport.get_protocol(), sock.fileno())
        transport.set_protocol(line)
        return line

    def usable(self) -> bool:
        """Whether this idle line can take a write: nothing waits in its socket (data: a
        stray reply; EOF: the server closed it, which the loop may not have read yet), so a
        connection the server dropped costs a reconnect, not a write of unknown outcome."""
        if self.closing:
            return False
        try:
            if not self.poller.poll(0):
                return True
        except (OSError, ValueError):
            pass
        self.abort("the idle connection was closed or has data waiting")
        return False

    def write(self, items: list[_Entry | _Confirmation], data: bytes) -> None:
        self.pending.extend(items)
        self.written = _monotonic()
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.heard = _monotonic()
        reader, pending = self.reader, self.pending
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not _MORE:
                if type(reply) is _Push:
                    # RESP3 push (a maintenance notification): the connection's own parser
                    # is not reading; the line retires once its calls are answered.
                    self.closing = True
                    continue
                if not pending:
                    self.abort("a reply that no call waits for")
                    return
                if pending[0].read(reply, True):
                    pending.popleft()
        except Exception as exc:  # hiredis.ProtocolError: the stream is unreadable
            self.abort(describe(exc))
            return
        if not pending:
            self.mux.freed(self)

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself: connection_lost follows

    def abort(self, reason: str, timed_out: bool = False) -> None:
        """Close it now: its calls still waiting are told ``reason``."""
        if self.why is None:
            self.why = (reason, timed_out)
        self.closing = True
        self.transport.abort()

    def close(self) -> None:
        """Close it once what it wrote has gone (it waits for nothing)."""
        self.closing = True
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        reason, timed_out = self.why or (describe(exc) if exc is not None else
                                         "ConnectionError: Connection closed by server.",
                                         False)
        self.closing = True
        pending, self.pending = self.pending, collections.deque()
        lost = Lost(True, reason, timed_out)
        for item in pending:
            item.fail(lost)
        self.mux.gone(self)
        with contextlib.suppress(Exception):
            self.stream.connection_lost(exc)  # the connection's own reader: closed
        if not self.closed.done():
            self.closed.set_result(None)


#: A call queued behind busy lines, one of which has waited this long (s) for its replies,
#: gets one more line, up to MAX_FLUSHES: a write stuck on a hung connection holds only
#: its own calls.
KICK_AFTER = 0.25
MAX_FLUSHES = 32
_monotonic = time.monotonic
_INF = float("inf")


class Mux:
    """Auto-pipelining for one client pool on one event loop: the calls of concurrent
    tasks queued in one iteration of the loop are written in one write on one connection,
    and their replies handed to each, in order.

    A call queues its packed commands (:meth:`send`) and awaits its own future. A flush,
    scheduled once per loop iteration, writes every call queued (at most MAX_ROUND_CALLS
    calls and MAX_ROUND_BYTES a write) on a connection with nothing in flight; up to
    ``flushes`` connections of the store's pool are made for that, more (up to
    MAX_FLUSHES) only while one has waited KICK_AFTER for its replies. A connection made
    by its own class is then read by the multiplexer (:class:`_LeanLine`); one that
    cannot be (fakeredis) is written and read through its own methods by flusher tasks,
    as before. Every rule of one call holds:

    - a call goes out once; a call whose caller gave up (its deadline, a cancel) before
      its flush was written is never sent (``not_applied``); after, its reply is still read
      and dropped (the write's outcome is unknown), and the connection stays in use;
    - a connection lost mid-flush: a call whose replies were all read has its answer; the
      others of that write get a lost exchange that says it was sent (a write: unknown);
      calls not written yet are written on another connection;
    - each call keeps its own deadline: one timer for the multiplexer, armed at the
      earliest deadline of the calls it holds, answers a call whose deadline passed and
      drops a connection once every call it waits for is past its deadline (or the client's
      ``socket_timeout`` passed with no data).
    """

    def __init__(self, pool: AsyncPool, flushes: int = 4) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self._max = flushes
        self._queue: collections.deque[_Entry] = collections.deque()
        #: The connections read by the multiplexer, connected.
        self._lines: list[_LeanLine] = []
        #: The fallback's flushes in flight (flusher tasks on connections read by their
        #: own methods).
        self._flushing: set[_Line] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._connecting = 0
        self._connect_started = 0.0
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _INF
        #: Whether the pool's connections are read by the multiplexer (None: none made yet).
        self.lean: bool | None = None
        #: The loop's callbacks to run before it polls again (asyncio's own loop keeps
        #: them there; None for another loop, whose calls always wait for the next turn).
        self._ready: collections.deque[Any] | None = getattr(self.loop, "_ready", None)

    # -------------------------------------------------------------- calls

    def send(self, data: bytes, count: int, deadline: float, timeout: int,
             confirm: bytes | None = None) -> asyncio.Future[Any]:
        """Queue ``data`` (``count`` commands packed) for the next flush; the future gets
        what came back (see :class:`_Entry`). ``timeout``: the caller's, in ms, for the
        reason of a deadline that passed."""
        future = self.loop.create_future()
        self._queue.append(_Entry(data, count, confirm, deadline, timeout, future))
        if not self._scheduled:
            if self.lean and self._ready is not None and not self._ready:
                # Nothing else runs before the loop polls: no call could join this one.
                self._flush()
            else:
                self._scheduled = True
                self.loop.call_soon(self._flush)
        if deadline < self._timer_at:
            self._arm(deadline)
        return future

    async def exchange(self, batch: Batch, deadline: float, timeout: int) -> Exchange:
        """Send ``batch`` with the next flush; what came back for it."""
        commands = batch.commands
        confirm = None
        if batch.write and len(commands) > 1 and commands[-1][0] in (b"WAIT", b"WAITAOF"):
            confirm = _pack_one(commands[-1])
            commands = commands[:-1]
        data = b"".join([_pack_one(command) for command in commands])
        got = await self.send(data, len(commands), deadline, timeout, confirm)
        return got if type(got) is Exchange else Exchange(_replies(got))

    async def aclose(self) -> None:
        """Close the idle connections now, the busy ones once their replies are read."""
        closed = []
        for line in list(self._lines):
            if line.pending:
                line.closing = True
            else:
                line.close()
                closed.append(line.closed)
        await self.pool.aclose()
        if closed:
            await asyncio.gather(*closed)

    # -------------------------------------------------------------- flushing

    def _schedule(self) -> None:
        if not self._scheduled and self._live():
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def _live(self) -> bool:
        """Whether a queued call still waits (and drop the ones that do not, at its head)."""
        queue = self._queue
        while queue and queue[0].future.done():
            queue.popleft()  # cancelled or past its deadline: never sent
        return bool(queue)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._live():
            return
        if self.lean is False:
            self._fallback()
            return
        for line in self._lines:
            if not line.pending and line.usable():
                self._write(line)
                if not self._live():
                    return
        self._grow()

    def _write(self, line: _LeanLine) -> None:
        take = _round(self._queue)
        items, data = _compose(take)
        line.write(items, data)
        if line.own is not None and line.written + line.own < self._timer_at:
            self._arm(line.written + line.own)

    def _grow(self) -> None:
        """No line is free for the queued calls: connect one more when fewer than
        ``flushes`` are (up to MAX_FLUSHES while one is stuck) and the pool has room; else
        look again when a busy one would count as stuck."""
        now = _monotonic()
        busy = [line.written for line in self._lines if line.pending]
        if self._connecting:
            busy.append(self._connect_started)
        stuck = any(now - since >= KICK_AFTER for since in busy)
        pool = self.pool
        if len(self._lines) + self._connecting < (MAX_FLUSHES if stuck else self._max) \
                and (not self._connecting or stuck) \
                and (pool._idle or pool._open < pool._max):
            self._start(self._connect())
        else:
            self._kick_later(busy, now)

    def _kick_later(self, busy: list[float], now: float) -> None:
        """Look again when the next of the ``busy`` (since when) would count as stuck; one
        stuck already changes nothing until a line frees, goes or a deadline passes."""
        kicks = [since + KICK_AFTER for since in busy if since + KICK_AFTER > now]
        if kicks:
            self._arm(min(kicks))

    def _start(self, work: Any) -> None:
        task = self.loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> None:
        """One more line for the queued calls, within the latest of their deadlines. A
        connection that cannot be read by the multiplexer turns it to the fallback."""
        self._connecting += 1
        self._connect_started = _monotonic()
        pool = self.pool
        conn: Any = None
        try:
            if not self._live():
                return
            until = max(entry.deadline for entry in self._queue)
            async with asyncio.timeout(until - _monotonic()):
                conn, fresh = await pool.acquire()
                if not fresh and await _stale(conn):
                    stale, conn = conn, None
                    await pool.discard(stale)
                    conn, fresh = await pool.acquire()
                if fresh:
                    await conn.connect()
            line = None if self.lean is False else _LeanLine.take_over(self, conn)
            if line is None:
                self.lean = False
                pool.release(conn)
            else:
                self.lean = True
                self._lines.append(line)
            conn = None
        except BaseException as exc:
            if conn is not None:  # closed now, not by a task the loop's end may never run
                await pool.discard(conn)
            if isinstance(exc, TimeoutError):  # the latest deadline passed
                self._expire(_monotonic())
            elif isinstance(exc, Exception):
                # Nothing could be sent: each call waiting for a connection learns why.
                lost = Lost(False, describe(exc), False,
                            error_reply(exc).code if is_error_reply(exc) else None)
                for entry in self._queue:
                    entry.fail(lost)
            else:
                raise
        finally:
            self._connecting -= 1
            self._schedule()

    def freed(self, line: _LeanLine) -> None:
        """Every call of ``line``'s write has its replies."""
        if line.closing:
            line.close()
        elif self._queue:
            self._schedule()

    def gone(self, line: _LeanLine) -> None:
        """``line``'s connection closed."""
        with contextlib.suppress(ValueError):
            self._lines.remove(line)
        self.pool.forget(line.conn)
        self._schedule()

    # -------------------------------------------------------------- deadlines

    def _arm(self, when: float) -> None:
        """Have the timer fire by ``when`` (it keeps an earlier time)."""
        if when >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_later(max(0.0, when - _monotonic()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = _INF
        now = _monotonic()
        due = self._expire(now)
        if due < _INF:
            self._arm(due)

    def _expire(self, now: float) -> float:
        """Answer each call whose deadline passed; drop a line every call of which is past
        its deadline, or that heard nothing for the client's ``socket_timeout``; a queued
        call behind a stuck line gets another. When to look next."""
        due = _INF
        waiting = False
        for entry in self._queue:
            if entry.future.done():
                continue
            if entry.deadline <= now:
                entry.fail(_dead(entry.timeout, False))
            else:
                waiting = True
                due = min(due, entry.deadline)
        lines: list[_Line] = [*self._lines, *self._flushing]
        for line in lines:
            if not line.pending:
                continue
            latest = 0.0
            for item in line.pending:
                for entry in item.members():
                    latest = max(latest, entry.deadline)
                    if entry.deadline <= now:
                        entry.fail(_dead(entry.timeout, entry.sent))
                    else:
                        due = min(due, entry.deadline)
            if type(line) is _LeanLine:
                if latest <= now:  # every reply it waits for is late: it is hung
                    line.abort("the flush's deadline passed", True)
                    continue
                if line.own is not None:
                    quiet = max(line.written, line.heard) + line.own
                    if quiet <= now:
                        line.abort("TimeoutError: Timeout reading from socket")
                        continue
                    due = min(due, quiet)
            if waiting:
                kick = line.written + KICK_AFTER
                if kick <= now:
                    self._schedule()
                else:
                    due = min(due, kick)
        if waiting and self._connecting:
            kick = self._connect_started + KICK_AFTER
            if kick <= now:
                self._schedule()
            else:
                due = min(due, kick)
        return due

    # -------------------------------------------------------------- the fallback

    def _fallback(self) -> None:
        """Flusher tasks, each on a connection read by its own methods: at most
        ``flushes`` (MAX_FLUSHES while one has run KICK_AFTER)."""
        now = _monotonic()
        busy = [line.written for line in self._flushing]
        stuck = any(now - since >= KICK_AFTER for since in busy)
        if len(self._tasks) < (MAX_FLUSHES if stuck else self._max):
            task = self.loop.create_task(self._flush_all())
            self._tasks.add(task)
            task.add_done_callback(self._ended)
        else:
            self._kick_later(busy, now)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.get_loop().is_closed():
            self._schedule()  # calls still queued: someone must send them

    async def _flush_all(self) -> None:
        queue = self._queue
        while queue:
            take = _round(queue)
            if take:
                await self._flush_on_a_connection(take)

    async def _flush_on_a_connection(self, take: list[_Entry]) -> None:
        pool = self.pool
        line = _Line()
        line.written = _monotonic()
        line.pending.extend(take)  # not sent yet: the deadlines still hold
        self._flushing.add(line)
        conn: Any = None
        try:
            async with asyncio.timeout(max(e.deadline for e in take) - _monotonic()):
                conn, fresh = await pool.acquire()
                if not fresh and await _stale(conn):
                    stale, conn = conn, None
                    await pool.discard(stale)
                    conn, fresh = await pool.acquire()
                if fresh:
                    await conn.connect()
                line.pending.clear()
                live = [e for e in take if not e.future.done()]  # gave up: never sent
                if not live:
                    pool.release(conn)
                    return
                items, data = _compose(live)
                line.pending.extend(items)
                await conn.send_packed_command(data)
                pending = line.pending
                while pending:
                    if pending[0].read(await _read(conn), False):
                        pending.popleft()
        except BaseException as exc:
            # Cut, timed out, or this flusher cancelled (the loop is closing): the
            # connection may still receive replies, which would answer the next write on
            # it. Drop it; every call without its answer learns what became of it.
            if conn is not None:
                await pool.discard(conn)
            timed_out = isinstance(exc, TimeoutError)
            reason = "the flush's deadline passed" if timed_out else describe(exc)
            code = error_reply(exc).code if is_error_reply(exc) else None
            for item in line.pending:
                item.fail(Lost(item.sent, reason, timed_out, code))
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._flushing.discard(line)
        pool.release(conn)


async def _read(conn: Any) -> Reply | ErrorReply:
    try:
        return Reply(await conn.read_response(disable_decoding=True))
    except Exception as exc:
        if not is_error_reply(exc):
            raise
        return error_reply(exc)


# An asyncio connection belongs to the loop that opened it, and a client may outlive its
# loop (``asyncio.run`` twice with one client, or a test runner's loop per test): one Mux,
# with its pool, per client pool and running loop, so no call ever gets a connection of
# another loop.
def mux_for(source: Any) -> Mux:
    """The :class:`Mux` of a client's connection pool on the running loop (the muxes are
    kept on the pool: see :func:`~redisstore.shells.clients.attached`)."""
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
    see :func:`~redisstore.shells.clients.attached`)."""
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
        self._mux_loop: asyncio.AbstractEventLoop | None = None
        self._muxed: Mux | None = None

    async def aclose(self) -> None:
        """Disconnect the store's connections on the running loop (shared by every store
        on this client: the others connect again on their next call). The client itself
        is not closed."""
        if not self.cluster:
            await mux_for(self.client.connection_pool).aclose()
            return
        for source in list((attached_to(self.client, "_redisstore_nodes") or {}).values()):
            await mux_for(source).aclose()

    async def drive(self, op: Operation[T] | Spread[T]) -> T:
        """Run an operation to its end: send each batch it makes, report what came back."""
        if type(op) is Spread:
            return await self._spread(op)
        recording = telemetry.recording()
        if not self.cluster and not recording:
            return await self._lean_drive(op)  # type: ignore[arg-type]
        driver = Driver(op, self.durability)  # type: ignore[arg-type]
        if not recording:
            await self.run(driver)
            return driver.result()
        with telemetry.operation(driver.telemetry) as call:
            await self.run(driver)
            call.result = driver.result()
            return call.result  # type: ignore[no-any-return]

    def _mux(self) -> Mux:
        """The multiplexer of the client's pool on the running loop (kept for the loop)."""
        loop = asyncio.get_running_loop()
        if self._mux_loop is not loop:
            self._muxed = mux_for(self.client.connection_pool)
            self._mux_loop = loop
        assert self._muxed is not None
        return self._muxed

    async def _lean_drive(self, op: Operation[T]) -> T:
        """:meth:`drive` with few frames between the store's method and the multiplexer
        (the asyncio twin of ``Transport._lean_drive``): each call the operation yields is
        packed by hiredis and queued (:meth:`Mux.send`), and a plain reply parsed and sent
        back into the operation here, with no Driver, Batch or Exchange made. Anything else
        (an error reply such as NOSCRIPT, a lost exchange, a write to confirm by
        ``durability``, a pool read by its connections' own methods) goes to a
        :class:`~redisstore.core.driver.Driver` resumed at that call, which decides what it
        means as on the full path."""
        try:
            call = next(op)  # the argument checks: a bad argument raises, nothing is sent
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        deadline = _monotonic() + self.timeout / 1000
        durability = self.durability
        mux = self._mux()
        while not (call.write and durability is not None) and mux.lean is not False:
            got = await mux.send(_pack_one(call.wire()), 1, deadline, self.timeout)
            if type(got) is not list or type(got[0]) is _ReplyError:
                driver = Driver.resumed(op, call, durability)
                driver.receive(got if type(got) is Exchange else Exchange(_replies(got)))
                await self.run(driver, deadline)
                return driver.result()
            step = resume(op, parsed(call, got[0]))
            if isinstance(step, Done):
                return step.value
            call = step
            if call.fresh:  # a round trip with a deadline of its own (Call.fresh)
                deadline = _monotonic() + self.timeout / 1000
        driver = Driver.resumed(op, call, durability)
        await self.run(driver, deadline)
        return driver.result()

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
        """Send each batch of ``machine`` (a driver, a pipeline), within one deadline; a
        ``fresh`` batch (:class:`~redisstore.core.driver.Call`'s ``fresh``) within one of its
        own, from when it is sent."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout / 1000
        while (batch := machine.next_batch()) is not None:
            if batch.fresh:
                deadline = time.monotonic() + self.timeout / 1000
            machine.receive(await self._send(batch, deadline))

    async def _send(self, batch: Batch, deadline: float) -> Exchange:
        if not self.cluster:
            return await self._mux().exchange(batch, deadline, self.timeout)
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
    (a patient fan's, see :class:`~redisstore.core.driver.Fan`): once one group is over, each
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
    (see :func:`redisstore.shells.sync.relearn_later`), on its ``home`` loop when the caller
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
    """A waker per node's connection (:class:`~redisstore.shells.wakeups.Subscription`) to the
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
