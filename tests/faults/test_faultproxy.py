"""Tests of the fault-injection proxy itself, against a private redis-server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.backoff
import redis.exceptions
import redis.retry
from faultproxy import FaultProxy
from servers import Server, free_port

# serial: the proxy's cuts and delays are timed
pytestmark = [pytest.mark.server, pytest.mark.serial]


def _client(port: int, timeout: float = 2.0) -> redis.Redis:
    # No retries: a retry would hide exactly the faults under test (and could
    # re-execute a request whose reply was dropped).
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )


@pytest.fixture(scope="module")
def upstream_port(redis7: Server) -> int:
    """The tests' private redis-server (never the shared 6379)."""
    return redis7.port


@pytest.fixture
def direct(upstream_port: int) -> Iterator[redis.Redis]:
    """A client talking straight to the upstream, bypassing the proxy."""
    client = _client(upstream_port)
    client.delete("k", "big")  # the keys these tests use, on a server other tests share
    yield client
    client.close()


@pytest.fixture
def proxy(upstream_port: int) -> Iterator[FaultProxy]:
    """A started proxy in front of the private upstream."""
    with FaultProxy(upstream_port) as p:
        yield p


def _proxy_threads(p: FaultProxy) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(p.thread_prefix)]


def _connected(p: FaultProxy, timeout: float = 2.0) -> redis.Redis:
    # Connect and finish the handshake (HELLO etc.) first, so that faults armed
    # afterwards hit the command under test rather than the handshake.
    client = _client(p.port, timeout)
    assert client.ping() is True
    return client


def test_rejects_non_loopback_upstream() -> None:
    for host in ("10.0.0.1", "192.168.1.1", "0.0.0.0", "example.com", ""):
        with pytest.raises(ValueError):
            FaultProxy(6379, upstream_host=host)
    # Loopback spellings are accepted (nothing is bound until start()).
    FaultProxy(6379, upstream_host="127.0.0.2")
    FaultProxy(6379, upstream_host="::1")
    FaultProxy(6379, upstream_host="localhost")


def test_listens_on_loopback(proxy: FaultProxy) -> None:
    assert proxy.host == "127.0.0.1"
    assert proxy.port > 0
    assert proxy.port != 6379


def test_pass_through(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = _client(proxy.port)
    assert client.ping() is True
    assert client.set("k", "v") is True
    assert client.get("k") == b"v"
    assert direct.get("k") == b"v"
    # A reply larger than one forwarded chunk arrives intact.
    big = b"x" * 1_000_000
    client.set("big", big)
    assert client.get("big") == big
    assert proxy.replies_dropped == 0
    assert proxy.connections_cut == 0
    client.close()


def test_delay_adds_at_least_the_delay(proxy: FaultProxy) -> None:
    client = _connected(proxy)
    proxy.set_delay(0.3)
    start = time.monotonic()
    assert client.ping() is True
    elapsed = time.monotonic() - start
    assert elapsed >= 0.3
    proxy.pass_through()
    start = time.monotonic()
    assert client.ping() is True
    assert time.monotonic() - start < 0.3
    client.close()


def test_set_delay_rejects_negative(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        proxy.set_delay(-1)


def test_cut_all_breaks_idle_connection(proxy: FaultProxy) -> None:
    # single_connection_client, because the pool notices an idle connection that
    # became readable (EOF) and silently reconnects before sending the command.
    client = redis.Redis(
        host=proxy.host,
        port=proxy.port,
        socket_timeout=2.0,
        single_connection_client=True,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    assert client.ping() is True
    proxy.cut_all()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    assert proxy.connections_cut == 1
    client.close()


def test_cut_all_closes_raw_socket(proxy: FaultProxy) -> None:
    with socket.create_connection((proxy.host, proxy.port), timeout=2.0) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
        proxy.cut_all()
        assert sock.recv(100) == b""  # EOF: the proxy closed the client side


def test_cut_all_breaks_in_flight_command(proxy: FaultProxy) -> None:
    client = _connected(proxy)
    proxy.set_delay(5)  # hold the reply inside the proxy
    timer = threading.Timer(0.2, proxy.cut_all)
    timer.start()
    start = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    assert time.monotonic() - start < 2.0
    timer.join()
    assert proxy.connections_cut == 1
    # The proxy keeps accepting: the client reconnects on the next call.
    proxy.pass_through()
    assert client.ping() is True
    client.close()


def test_refuse_fails_new_connections_only(proxy: FaultProxy) -> None:
    established = _connected(proxy)
    proxy.refuse()
    with pytest.raises(redis.exceptions.ConnectionError):
        _client(proxy.port).ping()
    assert proxy.connections_refused >= 1
    assert established.ping() is True
    proxy.refuse(False)
    fresh = _client(proxy.port)
    assert fresh.ping() is True
    fresh.close()
    established.close()


def test_drop_reply_closes_after_commit(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = _connected(proxy)
    proxy.drop_replies(1)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.incr("k")
    assert proxy.wait_dropped(1)
    assert direct.get("k") == b"1"  # executed exactly once
    assert proxy.replies_dropped == 1
    assert proxy.connections_cut == 1
    # Only one drop was armed: the next reply gets through.
    assert client.incr("k") == 2
    assert proxy.replies_dropped == 1
    client.close()


def test_drop_reply_hang_times_out(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = _connected(proxy, timeout=0.3)
    proxy.drop_replies(1, hang=True)
    with pytest.raises(redis.exceptions.TimeoutError):
        client.incr("k")
    assert direct.get("k") == b"1"
    assert proxy.replies_dropped == 1
    # A hang is not a deliberate close.
    assert proxy.connections_cut == 0
    client.close()


def test_drop_replies_never_exceeds_count_under_concurrency(
    proxy: FaultProxy, direct: redis.Redis
) -> None:
    clients = [_connected(proxy) for _ in range(8)]
    proxy.drop_replies(3)
    barrier = threading.Barrier(len(clients))
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker(c: redis.Redis) -> None:
        barrier.wait()
        try:
            c.incr("k")
        except redis.exceptions.ConnectionError as exc:
            with lock:
                failures.append(exc)

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(failures) == 3
    assert proxy.replies_dropped == 3
    assert direct.get("k") == b"8"  # every request executed, 3 replies lost
    for c in clients:
        c.close()


def test_pass_through_disarms_drops(proxy: FaultProxy, direct: redis.Redis) -> None:
    client = _connected(proxy)
    proxy.drop_replies(5)
    proxy.set_delay(5)
    proxy.refuse()
    proxy.pass_through()
    assert client.incr("k") == 1
    fresh = _client(proxy.port)
    assert fresh.ping() is True
    assert proxy.replies_dropped == 0
    fresh.close()
    client.close()


def test_wait_dropped_times_out(proxy: FaultProxy) -> None:
    start = time.monotonic()
    assert proxy.wait_dropped(1, timeout=0.2) is False
    assert time.monotonic() - start >= 0.2


def test_upstream_connect_failure_closes_client() -> None:
    dead_port = free_port()  # nothing listens here
    with FaultProxy(dead_port) as p, pytest.raises(redis.exceptions.ConnectionError):
        _client(p.port).ping()


def test_stop_leaves_no_threads_or_listener(upstream_port: int) -> None:
    p = FaultProxy(upstream_port).start()
    clients = [_connected(p) for _ in range(3)]
    p.set_delay(10)  # a pending long delay must not hold up stop()
    assert _proxy_threads(p)
    start = time.monotonic()
    p.stop()
    assert time.monotonic() - start < 2.0
    assert _proxy_threads(p) == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((p.host, p.port), timeout=1).close()
    for c in clients:
        with pytest.raises(redis.exceptions.ConnectionError):
            c.ping()
        c.close()
    p.stop()  # idempotent


def test_stop_while_delay_pending(upstream_port: int) -> None:
    p = FaultProxy(upstream_port).start()
    client = _connected(p)
    p.set_delay(10)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.ping()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.2)  # let the reply reach the proxy and sit in the delay
    p.stop()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], redis.exceptions.ConnectionError)
    assert _proxy_threads(p) == []
    client.close()
