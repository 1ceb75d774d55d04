"""The sync I/O shell: sends the :class:`~redisstore.core.driver.Batch` values of an operation
and reports what happened as neutral :class:`~redisstore.core.outcomes.Exchange` values.

Every batch goes out exactly once, on a connection of the store's own pool, never through
the client's command retry. That retry re-sends a command after a lost reply, and a script
that committed would run twice (redis/redis-py#3554): a CAS that succeeded would come back
as a Conflict, a claim would be taken twice. What a reply means, and whether anything is
sent again (after NOSCRIPT, nothing ran), is decided in :mod:`redisstore.core.driver`.

The pool's connections are made like the client's own (same class and settings: address,
TLS, credentials, protocol), one pool per client pool, so stores sharing a client share
connections, and no connection is ever used by two threads at once. A call has one
deadline (the store's ``timeout``) across the wait for a connection, connect, handshake,
send and read: a watchdog shuts the socket of a call that passes it.

An established plain connection takes the lean path (:class:`Lean`): the commands packed by
hiredis are written on its socket and the replies parsed by a ``hiredis.Reader`` of its
own, a plain reply sent straight back into the operation (:meth:`Transport._lean_drive`),
and the kernel's socket timeouts keep the deadline instead of the watchdog. Anything else
(an error reply, a lost exchange, a write to confirm, TLS, a new connection, a fan's group
that may be cut) takes the full path above.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
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
from ..core.groups import MIN_PATIENCE, Spreading, Suspects, patience, straggled
from ..core.outcomes import Exchange, Lost, Reply
from ..core.partition_ops import PartitionOps
from ..core.runops import RunOps
from .clients import (
    _MORE,
    RELEARNING,
    Connections,
    _pack_one,
    _replies,
    attached,
    check_client,
    describe,
    error_reply,
    is_error_reply,
    never_evicts,
    next_hop,
    no_node,
    node_client,
    node_name,
    pack,
    pushed,
    relearn_after,
    subscribe_failed,
)
from .wakeups import Nodes

try:
    from hiredis import Reader as _Reader
    from hiredis import ReplyError as _ReplyError
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _Reader = _ReplyError = None  # type: ignore[assignment,misc]
try:
    from hiredis import PushNotification as _Push
except ImportError:  # pragma: no cover - hiredis < 3.2: RESP3 takes the full path
    _Push = None  # type: ignore[assignment,misc]

T = TypeVar("T")
S = TypeVar("S", bound="_Closes")
log = logging.getLogger("redisstore.core.driver")
_monotonic = time.monotonic
#: Bytes asked of the socket per read on the lean path.
_CHUNK = 65536
#: A look at an idle socket that never blocks and consumes nothing.
_PEEK = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)
#: The platforms whose struct timeval the lean path writes (SO_RCVTIMEO / SO_SNDTIMEO).
_LEAN_OS = sys.platform.startswith(("linux", "darwin")) and _PEEK != socket.MSG_PEEK
_TIMEVAL = struct.Struct("ll")
#: How far the kernel's timeouts of a lean socket may be from what is left of the deadline
#: before they are set again (a syscall): at most this late (or early, and the read goes
#: on); the watchdog's own granularity.
_SLACK = 0.001


class Lean:
    """What the lean path of :meth:`Transport.exchange` keeps of a connection: its plain
    socket, a ``hiredis.Reader`` of its own, and the socket's own timeout (the client's
    ``socket_timeout``, which the connection's own methods get back before they use it).

    On the lean path the socket is blocking, and the kernel bounds each send and receive
    (``SO_SNDTIMEO`` / ``SO_RCVTIMEO``, set to what is left of the call's deadline only
    when that moved by more than _SLACK since the last call set them): the steady state
    costs no syscall beyond the send, the receive and the non-blocking look for a stale
    connection. Only plain TCP / Unix sockets on Linux or macOS take it; TLS keeps the
    connection's own methods."""

    __slots__ = ("generation", "limit", "own", "reader", "sock")

    def __init__(self, sock: socket.socket, own: float | None, generation: int | None
                 ) -> None:
        self.sock = sock
        self.reader = _Reader(notEnoughData=_MORE)
        self.own = own
        #: The pool generation the connection was made in (see Connections._keep).
        self.generation = generation
        #: The kernel timeouts set on the socket, s (0: none, it blocks for good).
        self.limit = 0.0

    @staticmethod
    def of(conn: Any, generation: int | None) -> Lean | None:
        """The lean state for a connection just connected, or None when it cannot have
        one (no hiredis, TLS, RESP3 without hiredis' push type, another platform)."""
        sock = getattr(conn, "_sock", None)
        if not _LEAN_OS or _Reader is None or type(sock) is not socket.socket \
                or (_Push is None and str(getattr(conn, "protocol", 2) or 2) != "2"):
            return None
        return Lean(sock, sock.gettimeout(), generation)

    def bound(self, limit: float) -> None:
        """Have the kernel end each send and receive of the socket after ``limit`` s (0:
        never)."""
        whole = int(limit)
        value = _TIMEVAL.pack(whole, max(1, int((limit - whole) * 1e6)) if limit else 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self.limit = limit

    def usable(self, conn: Any) -> bool:
        """Whether the idle ``conn`` can take a call: its socket is still this one and has
        nothing waiting (data: a stray reply; EOF: the server closed it), so a connection
        the server dropped costs a reconnect, not a write of unknown outcome."""
        if conn._sock is not self.sock:
            return False
        try:
            self.sock.recv(1, _PEEK)
        except BlockingIOError:
            return True  # nothing to read: the connection is clean
        except OSError:
            return False
        return False

    @staticmethod
    def restore(conn: Any) -> None:
        """Give the socket its own timeout back (and no kernel timeouts) before the
        connection's own methods use it."""
        lean: Lean | None = getattr(conn, "_redisstore_lean", None)
        if lean is not None:
            if lean.limit:
                lean.bound(0.0)
            lean.sock.settimeout(lean.own)

    @staticmethod
    def park(conn: Any) -> None:
        """Make the socket blocking again as the connection goes back idle."""
        lean: Lean | None = getattr(conn, "_redisstore_lean", None)
        if lean is not None:
            lean.sock.settimeout(None)

    @staticmethod
    def drop(conn: Any) -> None:
        """The connection leaves the lean path (its own parser handled a push message,
        which may have changed its socket's timeout): its socket gets back the timeout the
        connection has now, and its calls go the full way."""
        lean: Lean | None = getattr(conn, "_redisstore_lean", None)
        if lean is not None:
            del conn._redisstore_lean
            if lean.limit:
                lean.bound(0.0)
            lean.sock.settimeout(getattr(conn, "socket_timeout", lean.own))


class _Deadline(Exception):
    """The call's deadline passed before a connection could be had."""


class _NoRetry:
    """Stands for redis-py's Retry on our connections: connect once, within the deadline."""

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return do()
        except Exception as exc:
            # redis-py 8 passes the failure count to ``fail``; older ones and valkey-py don't.
            fail(exc, 1) if kwargs.get("with_failure_count") else fail(exc)
            raise

    def update_supported_errors(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is retried, so no error list to extend."""

    def get_retries(self) -> int:
        """None (redis-py 8 asks when a health check fails)."""
        return 0


class Watchdog:
    """Shuts the socket of a call that passed its deadline, so a hung or trickling server
    never holds a thread past it. One thread for the process, asleep while no call is armed.

    Only ``shutdown`` is called, never ``close``: the blocked thread's file descriptor stays
    valid (no reuse race), its read returns at once, and it drops the connection itself.
    """

    def __init__(self) -> None:
        self._armed: dict[int, tuple[float, Any]] = {}
        self._fired: set[int] = set()
        self._next = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, conn: Any, deadline: float) -> int:
        """Watch ``conn`` until :meth:`disarm`; returns a token."""
        with self._cond:
            self._next += 1
            token = self._next
            self._armed[token] = (deadline, conn)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="redisstore-watchdog",
                                                daemon=True)
                self._thread.start()
            elif len(self._armed) == 1:
                self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Stop watching; True when the deadline had fired for this token."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def fire(self, token: int) -> None:
        """End the call of ``token`` now, as if its deadline had passed (a patient fan's
        straggler: see :class:`Cut`)."""
        with self._cond:
            armed = self._armed.pop(token, None)
            if armed is None:
                return  # disarmed already: its call is over
            self._fired.add(token)
            _shutdown(armed[1])

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._armed:
                    self._cond.wait()
                now = time.monotonic()
                due = [t for t, (d, _) in self._armed.items() if d <= now]
                for token in due:
                    _, conn = self._armed.pop(token)
                    self._fired.add(token)
                    _shutdown(conn)
                if self._armed:
                    earliest = min(d for d, _ in self._armed.values())
                    # Re-check at least every 50 ms: an earlier deadline armed meanwhile
                    # fires at most that late.
                    self._cond.wait(min(max(earliest - now, 0.001), 0.05))


def _shutdown(conn: Any) -> None:
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        # Whatever a socket-like object raises (fakeredis's raises ValueError while its
        # reader runs), the one watchdog thread must live on for the other calls: this call
        # is then left to its socket timeout.
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()


class Cut:
    """What ends the round trips of one node's group of a patient fan (see
    :class:`~redisstore.core.driver.Fan`) that the caller stopped waiting for: the thread that
    sends the group holds it (:data:`_SENDING`); :meth:`fire` shuts the socket of its
    exchange in flight (through the watchdog) and any later exchange of the group is not
    sent. Either way the exchange ends as one whose deadline passed, with ``reason``.

    The watchdog cannot end a connect (the socket is not the connection's until it is up):
    a new connection of the group connects within ``connect_within`` s, so a node whose
    connects hang (SYNs dropped: a full accept queue, a link that drops packets) holds its
    group no longer than that."""

    def __init__(self, connect_within: float | None = None) -> None:
        self._lock = threading.Lock()
        self._tokens: list[int] = []
        self.reason: str | None = None
        self.connect_within = connect_within

    def watch(self, token: int) -> bool:
        """Fire ``token`` with the cut; False when the cut has fired already."""
        with self._lock:
            if self.reason is not None:
                return False
            self._tokens.append(token)
            return True

    def fire(self, reason: str) -> None:
        with self._lock:
            self.reason = reason
            tokens = list(self._tokens)
        for token in tokens:
            WATCHDOG.fire(token)


#: The Cut of the group the current thread sends, if it sends one of a fan's groups.
_SENDING = threading.local()
#: A fan's groups go out on threads of one executor for the process (made on first use),
#: a thread per node of the fan, reused; the caller waits for them.
FAN_THREADS = 64
_FANS: ThreadPoolExecutor | None = None
_FANS_LOCK = threading.Lock()


def _fans() -> ThreadPoolExecutor:
    global _FANS
    with _FANS_LOCK:
        if _FANS is None:
            _FANS = ThreadPoolExecutor(FAN_THREADS, thread_name_prefix="redisstore-fan")
        return _FANS


def _forget_fans() -> None:
    """In a forked child: the parent's fan threads are not there (its executor would queue
    work for nobody); the child makes its own on first use. The pools' lean path sees the
    new process id (without a getpid per call)."""
    global _FANS, _FANS_LOCK
    _FANS, _FANS_LOCK = None, threading.Lock()
    _PID[0] = os.getpid()


#: This process's id, kept up to date across forks (see _forget_fans).
_PID = [os.getpid()]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_fans)


class Pool(Connections):
    """The store's connections to one server, made like the client pool's own.

    At most the client pool's ``max_connections`` are open; a call waits for one within its
    deadline. A connection is used by one call at a time, and dropped (not reused) after any
    failure, so a late reply can never answer the next call.
    """

    def __init__(self, source: Any) -> None:
        super().__init__(source, _NoRetry())
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # callers waiting for a connection (none: no notify to make)
        #: Whether its connections take the lean path (None: none connected yet; the
        #: connections of a pool are all made alike).
        self.lean: bool | None = None

    def take_lean(self) -> Any:
        """An idle connection of the lean path, checked (see :meth:`Lean.usable`), or None:
        none idle, or the idle one is not lean (the caller goes the full way)."""
        while True:
            with self._lock:
                if not self._idle or self._pid != _PID[0]:
                    return None  # forked: _take forgets the parent's connections
                conn = self._idle[-1]
                lean: Lean | None = getattr(conn, "_redisstore_lean", None)
                if lean is None:
                    return None
                self._idle.pop()
            if lean.usable(conn):
                return conn
            self.discard(conn)

    def release_lean(self, conn: Any, lean: Lean) -> None:
        """:meth:`release` of a lean connection (its generation kept on it)."""
        with self._lock:
            if lean.generation == self._generation:
                self._idle.append(conn)
                if self._waiting:
                    self._cond.notify()
                return
        self.discard(conn)

    def made(self, conn: Any) -> None:
        """A new connection served its first call cleanly: from now on it takes the lean
        path, when it can (see :class:`Lean`)."""
        lean = Lean.of(conn, self._made.get(conn))
        if lean is None:
            self.lean = False
            return
        if _stale(conn):
            return  # something waits in it already: the next call drops it
        try:
            conn._redisstore_lean = lean
        except AttributeError:  # a connection class with __slots__: the full path
            self.lean = False
            return
        lean.sock.settimeout(None)
        self.lean = True

    def acquire(self, deadline: float) -> tuple[Any, bool]:
        """A connection and whether it is new (not connected yet)."""
        with self._cond:
            while (got := self._take()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Deadline(f"no free connection within the deadline ({self._max} "
                                    "in use)")
                self._waiting += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
            return got

    def release(self, conn: Any) -> None:
        """Give back a connection that is clean (every reply read)."""
        if not self._keep(conn):
            self.discard(conn)
            return
        with self._cond:
            self._idle.append(conn)
            if self._waiting:
                self._cond.notify()

    def close(self) -> None:
        """Disconnect the idle connections now and the busy ones as their calls end. The
        pool stays usable: the next call connects again."""
        with self._cond:
            idle = self._close_idle()
            self._cond.notify_all()
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.disconnect()

    def discard(self, conn: Any) -> None:
        """Drop a connection after a failure: it may still receive a late reply."""
        with contextlib.suppress(Exception):
            conn.disconnect()
        with self._cond:
            self._open -= 1
            self._cond.notify()


_POOLS_LOCK = threading.Lock()


def pool_for(source: Any) -> Pool:
    """The one :class:`Pool` for a client's connection pool (kept on it: see
    :func:`~redisstore.shells.clients.attached`)."""
    with _POOLS_LOCK:
        return attached(source, "_redisstore_pool", lambda: Pool(source))


def _stale(conn: Any) -> bool:
    """Whether an idle connection has data or EOF waiting: the server closed it (restart,
    idle timeout) or it holds a stray reply. Checked before sending, so such a connection
    costs a reconnect, not a write of unknown outcome."""
    try:
        return bool(conn.can_read(timeout=0))
    except Exception:
        return True


def relearn_later(client: Any, timeout: int) -> None:
    """Have the cluster ``client`` learn its slot map again on a thread of its own (see
    :class:`~redisstore.shells.clients.Relearning`): a call must not wait past its deadline for the
    nodes the client asks, one of which may hang."""
    token = RELEARNING.begin(client, timeout)
    if token is None:
        return

    def relearn() -> None:
        try:
            client.nodes_manager.initialize()
        except Exception:  # the next call that needs it tries again
            pass
        finally:
            RELEARNING.end(client, token)

    try:
        threading.Thread(target=relearn, name="redisstore-cluster-relearn",
                         daemon=True).start()
    except RuntimeError:  # no new thread (the interpreter is shutting down)
        RELEARNING.end(client, token)


class Transport:
    """Runs operations on a ``redis.Redis`` (or valkey-py, fakeredis, ``RedisCluster``)
    client. ``timeout`` is each operation's deadline, in ms."""

    def __init__(self, client: Any, durability: Durability | None = None,
                 timeout: int = 5000, *, dedicated: bool = False) -> None:
        check_client(client, asynchronous=False)
        self.client = client
        self.durability = durability
        self.timeout = timeout
        #: Whether the client is a RedisCluster (the store talks to its node pools).
        self.cluster = hasattr(client, "get_node_from_key")
        # dedicated: connections of this transport's own (a Keeper's), not the client's
        # shared store pool, so that calls that saturate that one cannot starve it.
        self._pool = None
        if not self.cluster:
            source = client.connection_pool
            self._pool = Pool(source) if dedicated else pool_for(source)
        #: The one-time server checks done for this client, shared by its stores.
        self.checks: set[str] = PerNode() if self._pool is None else self._pool.checks
        #: fakeredis: no maxmemory, no persistence settings, nothing to check on the server.
        self.fake = never_evicts(client)
        if self.fake:
            self.checks.add("eviction")
        self._used: weakref.WeakSet[Pool] = weakref.WeakSet()  # a cluster's node pools
        #: The nodes this transport's patient fans cut lately (see Suspects).
        self.suspects = Suspects()

    def close(self) -> None:
        """Disconnect the store's connections (shared by every store on this client: the
        others connect again on their next call). The client itself is not closed."""
        for pool in [self._pool] if self._pool is not None else list(self._used):
            pool.close()

    def drive(self, op: Operation[T] | Spread[T]) -> T:
        """Run an operation to its end: send each batch it makes, report what came back."""
        if type(op) is Spread:
            return self._spread(op)
        pool = self._pool
        recording = telemetry.recording()
        if pool is not None and pool.lean and not recording:
            return self._lean_drive(pool, op)  # type: ignore[arg-type]
        driver = Driver(op, self.durability)  # type: ignore[arg-type]
        if not recording:
            self.run(driver)
            return driver.result()
        with telemetry.operation(driver.telemetry) as call:
            self.run(driver)
            call.result = driver.result()
            return call.result  # type: ignore[no-any-return]

    def _lean_drive(self, pool: Pool, op: Operation[T]) -> T:
        """:meth:`drive` with few frames between the store's method and the socket: each
        call the operation yields is packed by hiredis and sent on a lean connection
        (:meth:`_lean_send`), and a plain reply is parsed and sent back into the operation
        here, with no Driver, Batch or Exchange made. Anything else (an error reply such as
        NOSCRIPT, a lost exchange, a write to confirm by ``durability``, no lean connection
        idle) goes to a :class:`~redisstore.core.driver.Driver` resumed at that call: what a
        reply means is decided there, as on the full path."""
        try:
            call = next(op)  # the argument checks: a bad argument raises, nothing is sent
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        deadline = _monotonic() + self.timeout / 1000
        durability = self.durability
        while True:
            if call.write and durability is not None:
                break
            conn = pool.take_lean()
            if conn is None:
                break
            got = self._lean_send(pool, conn, _pack_one(call.wire()), 1, deadline)
            if type(got) is not list or type(got[0]) is _ReplyError:
                driver = Driver.resumed(op, call, durability)
                driver.receive(got if type(got) is Exchange
                               else Exchange(_replies(got)))  # type: ignore[arg-type]
                return self._finish(driver, deadline)
            step = resume(op, parsed(call, got[0]))
            if isinstance(step, Done):
                return step.value
            call = step
            if call.fresh:  # a round trip with a deadline of its own (Call.fresh)
                deadline = _monotonic() + self.timeout / 1000
        return self._finish(Driver.resumed(op, call, durability), deadline)

    def _finish(self, driver: Driver[T], deadline: float) -> T:
        self.run(driver, deadline)
        return driver.result()

    def _spread(self, spread: Spread[T]) -> T:
        """Run a call over partitions: each fan's operations grouped by node, the nodes at
        once (a fan of one node on the caller's thread), within one deadline."""
        deadline = time.monotonic() + self.timeout / 1000
        spreading = Spreading(spread, self.durability, self.node_of)
        while (groups := spreading.next_groups()) is not None:
            if not groups:
                # Each operation of the fan answered without a call (a count check another
                # thread's call has made since): nothing to send.
                continue
            if len(groups) == 1:
                self.run(groups[0], deadline)
            elif not spreading.patient:
                self.run_all(groups, deadline)
            else:
                send, graces = self.suspects.plan(groups, patience(self.timeout),
                                                  time.monotonic())
                cut = self.run_all(send, deadline, graces)
                self.suspects.heard(send, cut, time.monotonic())
        return spreading.result  # type: ignore[return-value]

    def run_all(self, groups: Sequence[Machine], deadline: float,
                graces: Sequence[float] | None = None) -> list[bool]:
        """Send ``groups`` (one per node) at once, each on a thread of the shared executor
        (the first on this one, unless some may be cut), and wait for every one. With
        ``graces`` (a patient fan's): once one group is over,
        each other gets its grace (s) more, then is cut (:class:`Cut`): its calls end as
        reads whose deadline passed, ``not_applied``. Which groups were cut."""
        cuts = [Cut(None if graces is None else graces[i] + MIN_PATIENCE)
                for i in range(len(groups))]
        cut = [False] * len(groups)
        # Without graces nothing is cut: the first group goes out on this thread.
        inline = groups[0] if graces is None else None
        futures: list[Future[None]] = []
        for group, one in zip(groups, cuts, strict=True):
            if group is inline:
                continue
            try:
                futures.append(_fans().submit(self._run_cut, group, deadline, one))
            except RuntimeError:  # no new threads at interpreter shutdown: on this one
                self.run(group, deadline)
                futures.append(Future())
                futures[-1].set_result(None)
        if inline is not None:
            self.run(inline, deadline)
        if graces is not None and len(groups) > 1:
            done, waiting = futures_wait(futures, max(0.0, deadline - time.monotonic()),
                                         FIRST_COMPLETED)
            if done and waiting:
                since = time.monotonic()
                for i in sorted(range(len(groups)), key=lambda i: graces[i]):
                    until = min(since + graces[i], deadline)
                    if futures_wait([futures[i]], max(0.0, until - time.monotonic())).not_done:
                        cuts[i].fire(straggled(graces[i]))
                        cut[i] = True
        for future in futures:
            future.result()
        return cut

    def _run_cut(self, group: Machine, deadline: float, cut: Cut) -> None:
        _SENDING.cut = cut
        try:
            self.run(group, deadline)
        finally:
            _SENDING.cut = None

    def node_of(self, key: str) -> Hashable:
        """The node ``key`` lives on, as far as the client knows (None: one server)."""
        return node_name(self.client, key)

    def run(self, machine: Machine, deadline: float | None = None) -> None:
        """Send each batch of ``machine`` (a driver, a pipeline), within one deadline; a
        ``fresh`` batch (:class:`~redisstore.core.driver.Call`'s ``fresh``) within one of its
        own, from when it is sent."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout / 1000
        while (batch := machine.next_batch()) is not None:
            if batch.fresh:
                deadline = time.monotonic() + self.timeout / 1000
            machine.receive(self._send(batch, deadline))

    def _send(self, batch: Batch, deadline: float) -> Exchange:
        if not self.cluster:
            assert self._pool is not None
            return self.exchange(self._pool, batch, deadline)
        # RedisCluster: every key of a namespace is in one slot; talk to its node.
        try:
            node = self.client.get_node_from_key(batch.keys[0] if batch.keys else "")
            pool = pool_for(node_client(self.client, node).connection_pool)
            self._used.add(pool)
        except Exception as exc:
            return no_node(exc)
        got = self.exchange(pool, batch, deadline)
        tried = {node.name}
        # MOVED: no script ran, the slot has a new owner; the batch goes there.
        while (node := next_hop(self.client, batch, got, tried)) is not None:
            try:
                pool = pool_for(node_client(self.client, node).connection_pool)
                self._used.add(pool)
            except Exception:
                break
            got = self.exchange(pool, batch, deadline)
        if relearn_after(got, len(tried) - 1):
            # The slot moved (followed or not), or the node may have failed and a replica
            # taken its slots: the next calls should go to the slot's node now. Learnt in
            # the background: this call keeps its deadline.
            relearn_later(self.client, self.timeout)
        return got

    def exchange(self, pool: Pool, batch: Batch, deadline: float) -> Exchange:
        """Send one batch once, read a reply per command; report what happened."""
        cut: Cut | None = getattr(_SENDING, "cut", None)
        if cut is None and pool.lean is not False:
            conn = pool.take_lean()
            if conn is not None:
                return self._lean_exchange(pool, conn, batch, deadline)
        return self._exchange(pool, batch, deadline, cut)

    def _lean_exchange(self, pool: Pool, conn: Any, batch: Batch, deadline: float
                       ) -> Exchange:
        """:meth:`exchange` on a connected plain socket (see :meth:`_lean_send`)."""
        commands = batch.commands
        got = self._lean_send(pool, conn, _pack_one(commands[0]) if len(commands) == 1 else
                              b"".join([_pack_one(command) for command in commands]),
                              len(commands), deadline)
        if type(got) is Exchange:
            return got
        return Exchange(_replies(got))  # type: ignore[arg-type]

    def _lean_send(self, pool: Pool, conn: Any, data: bytes, count: int, deadline: float
                   ) -> list[Any] | Exchange:
        """Send ``data`` (``count`` commands packed) on the lean connection ``conn`` (taken
        from ``pool``; see :class:`Lean`) with one ``send`` (more only when the socket
        takes part of it), and parse ``count`` replies with its own ``hiredis.Reader``: the
        replies as the reader gives them (an error reply as a ``hiredis.ReplyError``), or
        the :class:`Exchange` of a broken exchange. The connection goes back to ``pool`` or
        is dropped.

        Every send and receive is bounded by what is left of the deadline (the kernel's
        timeouts, see :meth:`Lean.bound`, checked before each receive), so no watchdog is
        armed: a hung or trickling server ends the call at its deadline all the same, and a
        timeout that fires up to _SLACK early only makes the call read on until then."""
        lean: Lean = conn._redisstore_lean
        sock, reader, own = lean.sock, lean.reader, lean.own
        replies: list[Any] = []
        sent = False
        by_deadline = True  # whether the kernel's timeout is the deadline's
        pushed = False
        try:
            left = deadline - _monotonic()
            if left <= 0:
                raise _Deadline("the deadline passed before sending")
            limit = lean.limit
            if own is not None and own < left:
                by_deadline = False  # the client's socket_timeout is shorter
                if limit != own:
                    lean.bound(own)
            elif not left - _SLACK <= limit <= left + _SLACK:
                lean.bound(left)
            sent = True
            try:
                done = sock.send(data)
            except BlockingIOError:  # the kernel's timeout, nothing taken
                done = 0
            if done < len(data):
                self._send_rest(lean, memoryview(data)[done:], deadline, by_deadline)
            while count:
                reply = reader.gets()
                if reply is _MORE:
                    # Each receive ends by the deadline (a server that trickles its reply
                    # gets no longer than one that is silent).
                    left = deadline - _monotonic()
                    if left <= 0:
                        raise _Deadline("the deadline passed while reading")
                    if lean.limit > left + _SLACK:
                        lean.bound(left)
                        by_deadline = True
                    try:
                        chunk = sock.recv(_CHUNK)
                    except BlockingIOError:  # the kernel's timeout
                        if not by_deadline:
                            raise TimeoutError("Timeout reading from socket") from None
                        # It may end up to _SLACK early: read on until the deadline.
                        left = deadline - _monotonic()
                        if left <= 0:
                            raise _Deadline("the deadline passed while reading") from None
                        lean.bound(left)
                        continue
                    if not chunk:
                        raise ConnectionError("Connection closed by server.")
                    reader.feed(chunk)
                elif type(reply) is _Push:
                    # RESP3 push (a maintenance notification): the connection's own parser
                    # handles it, as it would have.
                    handle = getattr(getattr(conn, "_parser", None), "handle_push_response",
                                     None)
                    if handle is not None:
                        handle(reply)
                    pushed = True
                else:
                    replies.append(reply)
                    count -= 1
        except BaseException as exc:
            pool.discard(conn)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt and the like: the caller's, not ours
            timed_out = isinstance(exc, _Deadline)
            reason = f"deadline of {self.timeout} ms exceeded" if timed_out else describe(exc)
            return Exchange(_replies(replies), Lost(sent, reason, timed_out))
        if reader.has_data():
            pool.discard(conn)  # more than the replies came: a stray reply, never reused
        elif pushed:
            Lean.drop(conn)
            pool.release(conn)
        else:
            pool.release_lean(conn, lean)
        return replies

    @staticmethod
    def _send_rest(lean: Lean, rest: memoryview, deadline: float, by_deadline: bool
                   ) -> None:
        """The rest of a batch the socket did not take at once, each send bounded by what
        is left of the deadline (or by the client's shorter ``socket_timeout``)."""
        while rest:
            left = deadline - _monotonic()
            if left <= 0:
                raise _Deadline("the deadline passed while sending")
            if lean.limit > left + _SLACK:
                lean.bound(left)
                by_deadline = True
            try:
                rest = rest[lean.sock.send(rest):]
            except BlockingIOError:  # the kernel's timeout
                if not by_deadline:
                    raise TimeoutError("Timeout writing to socket") from None
                left = deadline - _monotonic()
                if left > 0:
                    lean.bound(left)  # it may end up to _SLACK early: send on until then

    def _exchange(self, pool: Pool, batch: Batch, deadline: float, cut: Cut | None
                  ) -> Exchange:
        """:meth:`exchange` through the connection's own methods, the watchdog armed: a new
        connection (connect, handshake), TLS, RESP3, a fan's group that may be cut."""
        replies: list[Any] = []
        sent = False
        conn: Any = None
        token = 0
        fresh = False
        try:
            if cut is not None and cut.reason is not None:
                raise _Deadline("cut")  # a straggler's group: nothing more is sent
            conn, fresh = pool.acquire(deadline)
            if not fresh and _stale(conn):
                stale, conn = conn, None
                pool.discard(stale)
                conn, fresh = pool.acquire(deadline)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Deadline("the deadline passed before sending")
            token = WATCHDOG.arm(conn, deadline)
            if cut is not None and not cut.watch(token):
                raise _Deadline("cut")
            if fresh:
                _cap_connect_timeout(conn, remaining if cut is None or cut.connect_within
                                     is None else min(remaining, cut.connect_within))
                conn.connect()
            else:
                Lean.restore(conn)
            data = pack(conn, batch.commands)
            sent = True
            conn.send_packed_command(data)
            for _ in batch.commands:
                try:
                    replies.append(Reply(conn.read_response(disable_decoding=True)))
                except Exception as exc:
                    if not is_error_reply(exc):
                        raise
                    replies.append(error_reply(exc))
        except BaseException as exc:
            fired = WATCHDOG.disarm(token) if token else False
            if conn is not None:
                pool.discard(conn)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt and the like: the caller's, not ours
            timed_out = fired or isinstance(exc, _Deadline)
            reason = ((cut.reason if cut is not None and cut.reason is not None
                       else f"deadline of {self.timeout} ms exceeded") if timed_out
                      else describe(exc))
            code = error_reply(exc).code if is_error_reply(exc) else None
            return Exchange(tuple(replies), Lost(sent, reason, timed_out, code))
        if WATCHDOG.disarm(token):
            # Fired just as the last reply arrived: every reply was read, yet the socket
            # is shut. The replies stand; the connection goes.
            pool.discard(conn)
        else:
            if fresh:
                pool.made(conn)
            else:
                Lean.park(conn)
            pool.release(conn)
        return Exchange(tuple(replies))


def _cap_connect_timeout(conn: Any, remaining: float) -> None:
    # A new connection connects within what is left of the call's deadline (the watchdog
    # cannot interrupt a connect: the socket is not the connection's until it is up).
    configured = getattr(conn, "socket_connect_timeout", None)
    if hasattr(conn, "socket_connect_timeout"):
        conn.socket_connect_timeout = remaining if configured is None \
            else min(configured, remaining)


class NodeSubscription:
    """A waker per node's connection (:class:`~redisstore.shells.wakeups.Subscription`) to the
    node of ``key`` on the cluster ``client``, made like that node's pool's own (same class
    and settings: TLS, credentials, protocol); replies within ``timeout`` s."""

    def __init__(self, client: Any, key: str, timeout: float) -> None:
        source = node_client(client, client.get_node_from_key(key)).connection_pool
        self._conn = source.connection_class(**source.connection_kwargs)
        self._conn.retry = _NoRetry()
        self._timeout = timeout

    def subscribe(self, channels: Sequence[str]) -> None:
        try:
            self._conn.send_command("SSUBSCRIBE", *channels)
            for _ in channels:
                if not self._conn.can_read(timeout=self._timeout):
                    raise TimeoutError("no answer to SSUBSCRIBE within the store's timeout")
                self._conn.read_response(push_request=True)
        except Exception as exc:
            raise subscribe_failed(exc) from exc

    def message(self, timeout: float) -> tuple[str, str] | None:
        if not self._conn.can_read(timeout=timeout):
            return None
        return pushed(self._conn.read_response(push_request=True))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.disconnect()


def node_wakers(io: Transport, timeout: int) -> Nodes:
    """How the wakers per node of a store on the cluster client of ``io`` reach its nodes
    (``timeout``: the store's, in ms)."""
    return Nodes(io.node_of, lambda key: NodeSubscription(io.client, key, timeout / 1000),
                 lambda: relearn_later(io.client, timeout))


# Here, with the transport it closes: the run store and the repository share it, and the
# repository does not stand on the run store (docs/design/house.md).
class _Closes:
    """``close()`` and ``with``: the store's own connections are given back to the server."""

    _io: Transport

    def close(self) -> None:
        """Disconnect the store's own connections to the server: the idle ones now, the
        busy ones as their calls end. They are shared by every store on the same client,
        and any of them connects again on its next call, so closing is always safe. The
        client is yours: close it too when you are done with it."""
        self._io.close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Drives(_Closes):
    """What a sync run store hands its operations to (the primitives ``_read`` and
    ``_write`` of the generated ``StoreOps``): the run store's and the dashboard's reader's,
    written once."""

    _ops: RunOps | PartitionOps

    def _read(self, op: Operation[T] | Spread[T]) -> T:
        return self._io.drive(self._ops.counting(op))

    def _write(self, op: Operation[T] | Spread[T]) -> T:
        # The one-time server check runs before the store's first write (after the
        # write's own argument checks).
        return self._io.drive(self._ops.guarded(op))
