"""Loopback TCP fault-injection proxy for tests.

A :class:`FaultProxy` sits between a client and a real server on 127.0.0.1 and
lets a test inject network faults (latency, cut connections, refused
connections, replies lost after the server executed the request) without any
privileges or third-party tools.  Only the standard library is used.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from types import TracebackType

__all__ = ["FaultProxy"]

_LISTEN_HOST = "127.0.0.1"
_CHUNK = 65536
# How often the accept loop re-checks the stop flag.  Polling with a timeout is
# used because closing a listening socket does not portably wake a thread that
# is blocked in accept().
_ACCEPT_POLL = 0.05
# Bounded so a black-holed upstream cannot pin a handler thread forever.
_CONNECT_TIMEOUT = 5.0
# Upper bound on how long stop() waits for each thread; pumps are woken by
# shutdown() so in practice they exit immediately.
_JOIN_TIMEOUT = 5.0


def _check_loopback(host: str) -> None:
    """Raise ValueError unless *host* names a loopback address."""
    if host == "localhost":
        return
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        # Resolving arbitrary names could reach a non-loopback address, so only
        # literal IPs (plus "localhost") are accepted.
        raise ValueError(f"upstream_host must be a loopback address, got {host!r}") from None
    if not addr.is_loopback:
        raise ValueError(f"upstream_host must be a loopback address, got {host!r}")


def _quiet_shutdown(sock: socket.socket | None) -> None:
    """Shut down both directions of *sock*, ignoring already-dead sockets."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _quiet_close(sock: socket.socket | None) -> None:
    """Close *sock*, ignoring errors."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.close()


def count_commands(data: bytes) -> int:
    """How many RESP commands (arrays of bulk strings, or inline lines) a chunk holds."""
    count, i = 0, 0
    while i < len(data):
        if data[i:i + 1] != b"*":
            end = data.find(b"\r\n", i)
            i = len(data) if end < 0 else end + 2
            count += 1
            continue
        end = data.find(b"\r\n", i)
        items = int(data[i + 1:end])
        i = end + 2
        for _ in range(items):
            end = data.find(b"\r\n", i)
            length = int(data[i + 1:end])
            i = end + 2 + length + 2
        count += 1
    return max(count, 1)


class _Connection:
    """One proxied client connection and its upstream counterpart.

    The handler thread owns both sockets and is the only one that closes them.
    Other threads (cut_all, stop, the opposite pump) only ever call
    ``shutdown()``, under ``_lock``: that wakes blocked ``recv``/``sendall``
    calls without the file-descriptor-reuse hazard of closing a socket that
    another thread is still using.
    """

    def __init__(self, proxy: FaultProxy, client: socket.socket, ident: int) -> None:
        self._proxy = proxy
        self._client = client
        self._upstream: socket.socket | None = None
        self._lock = threading.Lock()
        self._closed = False
        # Set once the connection is being torn down; also interrupts delays.
        self.closing = threading.Event()
        # Once a reply was swallowed in hang mode, the link is a black hole.
        self.hung = threading.Event()
        self._name = f"{proxy.thread_prefix}-conn{ident}"
        self.thread = threading.Thread(target=self._run, name=f"{self._name}-s2c", daemon=True)

    def shutdown(self) -> None:
        """Wake both pumps so they exit; safe from any thread, idempotent."""
        self.closing.set()
        with self._lock:
            if self._closed:
                return
            _quiet_shutdown(self._client)
            _quiet_shutdown(self._upstream)

    def _close_sockets(self) -> None:
        with self._lock:
            self._closed = True
            _quiet_close(self._client)
            _quiet_close(self._upstream)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self.closing.set()
            self._close_sockets()
            self._proxy._forget(self)

    def _serve(self) -> None:
        try:
            upstream = socket.create_connection(
                (self._proxy.upstream_host, self._proxy.upstream_port),
                timeout=_CONNECT_TIMEOUT,
            )
        except OSError:
            # Like a dead upstream: the client just sees its connection close.
            return
        upstream.settimeout(None)
        with self._lock:
            self._upstream = upstream
        # cut_all()/stop() may have run while we were connecting, before the
        # upstream socket was visible to shutdown().
        if self.closing.is_set():
            return
        c2s = threading.Thread(
            target=self._pump_client_to_server, name=f"{self._name}-c2s", daemon=True
        )
        c2s.start()
        try:
            self._pump_server_to_client(upstream)
        finally:
            self.shutdown()
            c2s.join(_JOIN_TIMEOUT)

    def _pump_client_to_server(self) -> None:
        upstream = self._upstream
        assert upstream is not None
        try:
            while True:
                data = self._client.recv(_CHUNK)
                if not data:
                    break
                if self.hung.is_set():
                    # Black-holed link: the server must not see anything more.
                    continue
                error = self._proxy._take_answer()
                if error is not None:
                    # The server never sees this request: answer each command in it with
                    # the error, as a server that refuses it would.
                    self._client.sendall((b"-" + error + b"\r\n") * count_commands(data))
                    continue
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            self.shutdown()

    def _pump_server_to_client(self, upstream: socket.socket) -> None:
        try:
            while True:
                data = upstream.recv(_CHUNK)
                if not data:
                    break
                if self.hung.is_set():
                    continue
                action = self._proxy._take_drop()
                if action == "close":
                    return
                if action == "hang":
                    self.hung.set()
                    continue
                delay = self._proxy._current_delay()
                # Event.wait instead of sleep so stop()/cut_all() are not held
                # up by a long delay.
                if delay > 0 and self.closing.wait(delay):
                    break
                self._client.sendall(data)
        except OSError:
            pass


class FaultProxy:
    """Listens on 127.0.0.1:<free port>, forwards each accepted connection to upstream.

    Each accepted client connection gets its own upstream connection and two
    daemon threads (one per direction).  Faults are switched on and off at
    any time from the test thread; they apply to data forwarded afterwards.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        """Prepare a proxy for ``upstream_host:upstream_port`` (loopback only).

        Raises ValueError if *upstream_host* is not a loopback address or the
        port is out of range.  Nothing is bound until :meth:`start`.
        """
        _check_loopback(upstream_host)
        if not 0 < upstream_port < 65536:
            raise ValueError(f"invalid upstream_port {upstream_port!r}")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._lock = threading.Lock()
        # Signalled whenever replies_dropped grows, for wait_dropped().
        self._dropped_cond = threading.Condition(self._lock)
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = False
        self._conns: set[_Connection] = set()
        self._next_ident = 0
        self._port = 0
        # Fault state, all guarded by _lock.
        self._delay = 0.0
        self._refusing = False
        self._drops_left = 0
        self._drop_hang = False
        self._replies_dropped = 0
        self._connections_cut = 0
        self._connections_refused = 0
        self._answer = b""
        self._answers_left = 0
        self._answered = 0

    # -- lifecycle -------------------------------------------------------

    def start(self) -> FaultProxy:
        """Bind 127.0.0.1 on a free port and start accepting; returns self."""
        if self._started:
            raise RuntimeError("FaultProxy can only be started once")
        self._started = True
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((_LISTEN_HOST, 0))
            listener.listen(128)
            listener.settimeout(_ACCEPT_POLL)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"{self.thread_prefix}-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and every live connection, then join all threads.

        Idempotent; a stopped proxy cannot be restarted.
        """
        self._stopping.set()
        if self._accept_thread is not None:
            self._accept_thread.join(_JOIN_TIMEOUT)
        _quiet_close(self._listener)
        # The accept thread has exited, so no new connection can appear now.
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.shutdown()
        for conn in conns:
            conn.thread.join(_JOIN_TIMEOUT)

    def __enter__(self) -> FaultProxy:
        """Start the proxy (see :meth:`start`)."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the proxy (see :meth:`stop`)."""
        self.stop()

    # -- addressing ------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on; only valid after :meth:`start`."""
        if not self._port:
            raise RuntimeError("FaultProxy is not started")
        return self._port

    @property
    def host(self) -> str:
        """The address the proxy listens on (always ``"127.0.0.1"``)."""
        return _LISTEN_HOST

    @property
    def thread_prefix(self) -> str:
        """Name prefix of every thread this proxy runs (for leak checks)."""
        return f"faultproxy-{id(self):x}"

    # -- faults ----------------------------------------------------------

    def pass_through(self) -> None:
        """Clear every fault: no delay, no refusing, no armed reply drops.

        Connections already black-holed by ``drop_replies(hang=True)`` stay
        that way: bytes were lost on them, so resuming would desynchronise
        the protocol stream.
        """
        with self._lock:
            self._delay = 0.0
            self._refusing = False
            self._drops_left = 0
            self._drop_hang = False

    def set_delay(self, seconds: float) -> None:
        """Delay each chunk forwarded server->client by *seconds* (0 disables)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        with self._lock:
            self._delay = float(seconds)

    def cut_all(self) -> None:
        """Close every live connection now, on both the client and server side."""
        with self._lock:
            conns = list(self._conns)
            self._connections_cut += len(conns)
        for conn in conns:
            conn.shutdown()

    def refuse(self, on: bool = True) -> None:
        """While on, newly accepted connections are closed at once (a dead server).

        Connections that are already established are not affected.
        """
        with self._lock:
            self._refusing = on

    def drop_replies(self, count: int = 1, *, hang: bool = False) -> None:
        """Arm the loss of the next *count* server replies.

        Each of the next *count* times any connection receives bytes from the
        server, those bytes are swallowed and then that client connection is
        closed (``hang=False``) or kept open but silent in both directions
        (``hang=True``, so the client times out).  The request itself was
        forwarded, so the server did execute it: this models "reply lost after
        commit".  Replaces any previously armed drops; ``count=0`` disarms.
        """
        if count < 0:
            raise ValueError("count must be >= 0")
        with self._lock:
            self._drops_left = count
            self._drop_hang = hang

    def answer_errors(self, error: str, count: int = 1) -> None:
        """Arm: the next ``count`` requests are not forwarded; the proxy answers each
        command in them with the error reply ``-<error>`` (e.g. ``"LOADING Redis is loading
        the dataset in memory"``), as a server that turns them away would."""
        if count < 0:
            raise ValueError("count must be >= 0")
        with self._lock:
            self._answer = error.encode()
            self._answers_left = count

    @property
    def errors_answered(self) -> int:
        """How many requests the proxy answered with an armed error."""
        with self._lock:
            return self._answered

    # -- observation -----------------------------------------------------

    @property
    def replies_dropped(self) -> int:
        """How many server replies have been swallowed so far."""
        with self._lock:
            return self._replies_dropped

    @property
    def connections_cut(self) -> int:
        """How many connections the proxy closed deliberately (cut_all / drops)."""
        with self._lock:
            return self._connections_cut

    @property
    def connections_refused(self) -> int:
        """How many incoming connections were closed because of :meth:`refuse`."""
        with self._lock:
            return self._connections_refused

    def wait_dropped(self, n: int, timeout: float = 5.0) -> bool:
        """Wait until ``replies_dropped >= n``; False if *timeout* expires first."""
        with self._dropped_cond:
            return self._dropped_cond.wait_for(lambda: self._replies_dropped >= n, timeout)

    # -- internals -------------------------------------------------------

    def _take_drop(self) -> str | None:
        """Consume one armed drop, if any; returns "close", "hang" or None.

        The check and decrement happen under one lock so that concurrent
        connections can never drop more than the armed count between them.
        Counters are bumped before the fault becomes visible to the client,
        so a test that observes the error can rely on them already.
        """
        with self._lock:
            if self._drops_left <= 0:
                return None
            self._drops_left -= 1
            self._replies_dropped += 1
            hang = self._drop_hang
            if not hang:
                self._connections_cut += 1
            self._dropped_cond.notify_all()
        return "hang" if hang else "close"

    def _take_answer(self) -> bytes | None:
        with self._lock:
            if self._answers_left <= 0:
                return None
            self._answers_left -= 1
            self._answered += 1
            return self._answer

    def _current_delay(self) -> float:
        with self._lock:
            return self._delay

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    break
                continue
            client.settimeout(None)
            conn = self._register(client)
            if conn is None:
                _quiet_close(client)
            else:
                conn.thread.start()

    def _register(self, client: socket.socket) -> _Connection | None:
        """Track a new client connection, or return None if refusing."""
        with self._lock:
            if self._refusing:
                self._connections_refused += 1
                return None
            self._next_ident += 1
            conn = _Connection(self, client, self._next_ident)
            self._conns.add(conn)
            return conn
