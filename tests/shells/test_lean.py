"""The sync shell's lean path (redisstore.shells.sync.Lean): an established plain connection
sends with hiredis on its socket and reads with a hiredis.Reader of its own, no watchdog.
Its guarantees are the full path's: the call's deadline ends a hung or trickling reply, a
connection the server closed while idle costs a reconnect (not a write of unknown outcome),
error replies read as the client's parser reads them, a forked child never uses the
parent's connections."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from faultproxy import FaultProxy
from servers import Server, unique_namespace

from redisstore import Claim, Hold, RedisRunStore, Unavailable
from redisstore.shells.clients import error_reply, lean_error
from redisstore.shells.sync import pool_for


def lean_connections(client: redis.Redis) -> int:
    pool = pool_for(client.connection_pool)
    return sum(1 for conn in pool._idle if getattr(conn, "_redisstore_lean", None))


@pytest.mark.parametrize("text", [
    "NOSCRIPT No matching script. Please use EVAL.",
    "ERR unknown command 'EVALSHA', with args beginning with: ",
    "ERR Error running script (call to f_1): @user_script:91: -READONLY You can't write",
    "ERR user_script:12: BADARG ttl must be an int script: 0123, on @user_script:12.",
    "READONLY You can't write against a read only replica.",
    "BUSY Redis is busy running a script.",
    "MOVED 3999 127.0.0.1:6381",
    "NOPERM this user has no permissions to run the 'evalsha' command",
    "LOADING Redis is loading the dataset in memory",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "WRONGTYPE Operation against a key holding the wrong kind of value",
])
def test_error_replies_read_as_the_clients_parser_reads_them(text: str) -> None:
    from redis._parsers.base import BaseParser

    assert lean_error(text) == error_reply(BaseParser.parse_error(text))


@pytest.fixture(params=[2, 3])
def client(request: pytest.FixtureRequest, redis7: Server) -> Iterator[redis.Redis]:
    c = redis7.client(socket_timeout=None, protocol=request.param)
    yield c
    c.close()


@pytest.mark.server
def test_calls_on_an_established_connection_take_the_lean_path(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    rev = store.insert("r", b"x", Claim("me", 60_000))
    store.compare_and_set("r", rev, b"y", Hold("me"))
    assert pool_for(client.connection_pool).lean is True
    assert lean_connections(client) == 1
    assert store.get("r").record == b"y" and store.get("r").revision == rev + 1
    odd = "r\udcff"  # a name that came back from the server as bytes that are not UTF-8
    first = store.insert(odd, b"x", Claim("me", 60_000))
    store.compare_and_set(odd, first, b"z", Hold("me"))
    assert store.get(odd).record == b"z"


@pytest.mark.server
def test_script_flush_between_calls_is_loaded_again(redis7: Server, client: redis.Redis
                                                    ) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    rev = store.insert("r", b"x", Claim("me", 60_000))
    redis7.client().script_flush()
    store.compare_and_set("r", rev, b"y", Hold("me"))
    assert store.get("r").revision == rev + 1
    assert lean_connections(client) == 1


@pytest.mark.server
def test_a_connection_the_server_closed_while_idle_costs_a_reconnect(
        redis7: Server) -> None:
    name = f"lean-{os.getpid()}-{time.monotonic_ns()}"
    client = redis7.client(socket_timeout=None, client_name=name)
    store = RedisRunStore(client, namespace=unique_namespace())
    rev = store.insert("r", b"x", Claim("me", 60_000))
    assert lean_connections(client) == 1
    admin = redis7.client()
    killed = [admin.client_kill_filter(_id=c["id"]) for c in admin.client_list()
              if c.get("name") == name]
    assert killed == [1]
    time.sleep(0.05)
    store.compare_and_set("r", rev, b"y", Hold("me"))  # not Unavailable: a new connection
    assert store.get("r").revision == rev + 1
    admin.close()
    client.close()


@pytest.mark.server
def test_a_hung_reply_on_a_lean_connection_ends_at_the_deadline(redis7: Server) -> None:
    with FaultProxy(redis7.port) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        store = RedisRunStore(client, namespace=unique_namespace(), timeout=300)
        rev = store.insert("r", b"x", Claim("me", 60_000))
        store.compare_and_set("r", rev, b"x", Hold("me"))  # its script is loaded now
        rev += 1
        assert lean_connections(client) == 1
        proxy.drop_replies(1, hang=True)
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            store.compare_and_set("r", rev, b"y", Hold("me"))
        elapsed = time.monotonic() - started
        assert caught.value.outcome == "unknown"
        assert "deadline of 300 ms exceeded" in caught.value.reason
        assert 0.28 <= elapsed < 1.0, elapsed
        assert proxy.wait_dropped(1)
        assert store.get("r").revision == rev + 1  # the write ran, once
        client.close()


@pytest.mark.server
def test_a_shorter_socket_timeout_of_the_client_still_ends_a_read(redis7: Server) -> None:
    with FaultProxy(redis7.port) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.2)
        store = RedisRunStore(client, namespace=unique_namespace(), timeout=3000)
        rev = store.insert("r", b"x", Claim("me", 60_000))
        proxy.drop_replies(1, hang=True)
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            store.compare_and_set("r", rev, b"y", Hold("me"))
        assert caught.value.outcome == "unknown"
        assert "Timeout" in caught.value.reason
        assert time.monotonic() - started < 1.0
        client.close()


class Trickle:
    """A proxy that forwards requests at once and, while ``on``, the server's replies one
    byte at a time, ``pause`` s apart: a server that keeps a reply coming but never ends it
    in time."""

    def __init__(self, upstream: int, pause: float = 0.03) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream, self.pause, self.on = upstream, pause, False
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if replies and self.on:
                    for i in range(len(data)):
                        dst.sendall(data[i:i + 1])
                        time.sleep(self.pause)
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closing = True
        self.listener.close()


@pytest.mark.server
def test_a_trickling_reply_ends_at_the_deadline(redis7: Server) -> None:
    trickle = Trickle(redis7.port)
    try:
        client = redis.Redis(host="127.0.0.1", port=trickle.port)
        store = RedisRunStore(client, namespace=unique_namespace(), timeout=300)
        rev = store.insert("r", b"x" * 50, Claim("me", 60_000))
        assert lean_connections(client) == 1
        trickle.on = True
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            store.get("r")  # a reply of some 100 bytes, 30 ms each
        elapsed = time.monotonic() - started
        assert "deadline of 300 ms exceeded" in caught.value.reason
        assert elapsed < 0.6, elapsed
        trickle.on = False
        assert store.get("r").revision == rev
        client.close()
    finally:
        trickle.close()


@pytest.mark.server
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_connects_on_its_own(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    rev = store.insert("r", b"x", Claim("me", 60_000))
    parent = pool_for(client.connection_pool)._idle[0]
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection is never used
        code = 1
        try:
            got = store.get("r")
            pool = pool_for(client.connection_pool)
            code = 0 if got.revision == rev and parent not in pool._idle else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.compare_and_set("r", rev, b"y", Hold("me"))  # the parent's still works
    assert store.get("r").revision == rev + 1
