"""The asyncio multiplexer's lean lines (redisstore.shells.aio.Mux, _LeanLine), against a scripted
RESP server on loopback whose every move a test chooses: the calls queued in one loop turn
go out in one write, each gets its own reply in order, and a cancel, a deadline, a cut
connection, an error reply or a RESP3 push mid-flush touch only the calls they concern.

The server answers the handshake (HELLO, CLIENT, SELECT...) with OK, and then, per
command: ``ECHO x`` -> x; ``FAIL text`` -> the error reply ``text``; ``SLEEP ms`` -> OK
after ms; ``CLOSE`` -> closes the connection; ``PUSH`` -> a RESP3 push, then OK; ``HANG``
-> nothing more on that connection, ever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import hiredis
import pytest
import redis.asyncio

from redisstore.core import outcomes
from redisstore.core.driver import Batch
from redisstore.core.outcomes import ErrorReply, Exchange, Reply
from redisstore.shells.aio import Mux, _LeanLine, mux_for

# serial: deadlines timed in flight
pytestmark = pytest.mark.serial
#: hiredis >= 3.2 parses RESP3 pushes as such; with an older one a RESP3 connection is read
#: by its own methods (the multiplexer's fallback), which must answer the same.
PUSHES = hasattr(hiredis, "PushNotification")


class Scripted:
    """The scripted server: counts the connections it accepted and the commands it read
    (after the handshake), and how many reads brought them."""

    def __init__(self) -> None:
        self.connections = 0
        self.commands: list[list[bytes]] = []
        self.reads = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        self.connections += 1
        parser = hiredis.Reader()
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                counted = False
                while (command := parser.gets()) is not False:
                    name = command[0].upper()
                    if name in (b"HELLO", b"CLIENT", b"SELECT", b"AUTH", b"PING"):
                        writer.write(b"%1\r\n$5\r\nproto\r\n:3\r\n" if name == b"HELLO"
                                     else b"+OK\r\n")
                        continue
                    if not counted:
                        self.reads += 1
                        counted = True
                    self.commands.append(command)
                    if name == b"ECHO":
                        writer.write(b"$%d\r\n%s\r\n" % (len(command[1]), command[1]))
                    elif name == b"FAIL":
                        writer.write(b"-" + command[1] + b"\r\n")
                    elif name == b"SLEEP":
                        await writer.drain()
                        await asyncio.sleep(int(command[1]) / 1000)
                        writer.write(b"+OK\r\n")
                    elif name == b"PUSH":
                        writer.write(b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n+OK\r\n")
                    elif name == b"CLOSE":
                        await writer.drain()
                        writer.close()
                        return
                    elif name == b"HANG":
                        await writer.drain()
                        await asyncio.sleep(3600)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def run(main: Callable[[Scripted], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        async with Scripted() as server:
            await main(server)

    asyncio.run(wrapped())


def call(mux: Mux, *commands: tuple[bytes, ...], timeout: float = 2.0,
         write: bool = True) -> Awaitable[Exchange]:
    return mux.exchange(Batch(tuple(commands), write), time.monotonic() + timeout,
                        int(timeout * 1000))


def replies(got: Exchange) -> list[Any]:
    return [r.value if isinstance(r, Reply) else r for r in got.replies]


async def connected(server: Scripted, **options: Any) -> tuple[Any, Mux]:
    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, **options)
    mux = mux_for(client.connection_pool)
    got = await call(mux, (b"ECHO", b"warm"))
    assert replies(got) == [b"warm"]
    assert mux.lean is (PUSHES or options.get("protocol", 2) == 2)
    server.commands.clear()
    server.reads = 0
    return client, mux


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_calls_of_one_loop_turn_go_out_in_one_write(protocol: int) -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server, protocol=protocol)
        got = await asyncio.gather(*(call(mux, (b"ECHO", b"%d" % i)) for i in range(50)))
        assert [replies(g) for g in got] == [[b"%d" % i] for i in range(50)]
        assert server.reads == 1 and server.connections == 1
        await client.aclose()

    run(main)


@pytest.mark.parametrize("protocol", [2, 3])
def test_error_replies_answer_their_own_call_only(protocol: int) -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server, protocol=protocol)
        first, refused, last = await asyncio.gather(
            call(mux, (b"ECHO", b"a")),
            call(mux, (b"FAIL", b"READONLY You can't write against a read only replica.")),
            call(mux, (b"ECHO", b"b"), (b"FAIL", b"ERR unknown command 'X'"), (b"ECHO", b"c")))
        assert replies(first) == [b"a"] and first.lost is None
        assert replies(refused) == [ErrorReply("READONLY",
                                               "You can't write against a read only replica.")]
        assert replies(last) == [b"b", ErrorReply("ERR", "unknown command 'X'"), b"c"]
        assert replies(await call(mux, (b"ECHO", b"after"))) == [b"after"]
        assert server.connections == 1
        await client.aclose()

    run(main)


def test_a_connection_lost_mid_flush_fails_only_the_calls_on_it() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server)
        # One flush on the warm connection: answered, answered late, then cut.
        on_a = [asyncio.ensure_future(call(mux, (b"ECHO", b"a1"))),
                asyncio.ensure_future(call(mux, (b"SLEEP", b"200"))),
                asyncio.ensure_future(call(mux, (b"CLOSE",))),
                asyncio.ensure_future(call(mux, (b"ECHO", b"a4")))]
        await asyncio.sleep(0.05)
        # The next turn's calls: that connection is busy, so they go on a new one.
        on_b = await asyncio.gather(call(mux, (b"ECHO", b"b1")), call(mux, (b"ECHO", b"b2")))
        assert [replies(g) for g in on_b] == [[b"b1"], [b"b2"]]
        a1, slept, cut, a4 = await asyncio.gather(*on_a)
        assert replies(a1) == [b"a1"] and replies(slept) == [b"OK"]
        for lost in (cut, a4):
            assert lost.replies == () and lost.lost is not None and lost.lost.sent
            assert not lost.lost.timed_out
            assert outcomes.lost(lost.lost, write=True).outcome == "unknown"
            assert outcomes.lost(lost.lost, write=False).outcome == "not_applied"
        assert replies(await call(mux, (b"ECHO", b"after"))) == [b"after"]
        assert server.connections == 2
        await client.aclose()

    run(main)


def test_a_call_cancelled_mid_flush_has_its_reply_read_and_dropped() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server)
        slow = asyncio.ensure_future(call(mux, (b"SLEEP", b"100")))
        cancelled = asyncio.ensure_future(call(mux, (b"ECHO", b"cancelled")))
        kept = asyncio.ensure_future(call(mux, (b"ECHO", b"kept")))
        await asyncio.sleep(0.03)  # written, the replies held back by the SLEEP
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert replies(await slow) == [b"OK"]
        assert replies(await kept) == [b"kept"]  # not the cancelled call's reply
        for i in range(20):  # the same connection, in step
            assert replies(await call(mux, (b"ECHO", b"%d" % i))) == [b"%d" % i]
        assert server.connections == 1
        assert [c[0] for c in server.commands].count(b"ECHO") == 22  # each sent once
        await client.aclose()

    run(main)


def test_a_call_cancelled_before_its_flush_is_written_is_never_sent() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server, max_connections=1)
        # The slow call read by the server (not a sleep: a loaded machine may take longer
        # to write it, and the next call would then share its flush), and slow enough that
        # the one connection is still busy when the queued call is cancelled.
        slow = asyncio.ensure_future(call(mux, (b"SLEEP", b"1000"), timeout=5.0))
        while [b"SLEEP", b"1000"] not in server.commands:
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(call(mux, (b"ECHO", b"never")))
        await asyncio.sleep(0.02)  # waits for the one connection
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        await slow
        assert replies(await call(mux, (b"ECHO", b"next"))) == [b"next"]
        assert [b"ECHO", b"never"] not in server.commands
        await client.aclose()

    run(main)


def test_each_call_keeps_its_deadline_and_a_hung_connection_is_dropped() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server)
        loop = asyncio.get_running_loop()
        started = loop.time()
        short = asyncio.ensure_future(call(mux, (b"HANG",), timeout=0.1))
        behind = asyncio.ensure_future(call(mux, (b"ECHO", b"x"), timeout=0.3))
        got = await short
        assert 0.09 <= loop.time() - started < 0.25
        assert got.lost is not None and got.lost.timed_out and got.lost.sent
        assert "deadline of 100 ms exceeded" in got.lost.reason
        assert not behind.done()  # its own deadline is later
        got = await behind
        assert 0.29 <= loop.time() - started < 0.45
        assert got.lost is not None and got.lost.timed_out
        await asyncio.sleep(0.01)
        assert all(not line.pending for line in mux._lines)  # the hung one was dropped
        assert replies(await call(mux, (b"ECHO", b"after"))) == [b"after"]
        assert server.connections == 2
        await client.aclose()

    run(main)


def test_the_clients_socket_timeout_ends_a_silent_read() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server, socket_timeout=0.1)
        started = time.monotonic()
        got = await call(mux, (b"HANG",), timeout=3.0)
        assert time.monotonic() - started < 0.5
        assert got.lost is not None and got.lost.sent and not got.lost.timed_out
        assert "Timeout" in got.lost.reason
        await client.aclose()

    run(main)


@pytest.mark.skipif(not PUSHES, reason="hiredis < 3.2: RESP3 takes the fallback")
def test_a_resp3_push_mid_flush_retires_the_connection_after_its_replies() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server, protocol=3)
        pushed, after = await asyncio.gather(call(mux, (b"PUSH",)), call(mux, (b"ECHO", b"y")))
        assert replies(pushed) == [b"OK"] and replies(after) == [b"y"]
        assert replies(await call(mux, (b"ECHO", b"z"))) == [b"z"]
        assert server.connections == 2  # the one that got a push is not reused
        await client.aclose()

    run(main)


def test_a_connection_the_server_closed_while_idle_costs_a_reconnect() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server)
        (line,) = mux._lines
        assert isinstance(line, _LeanLine)
        got = await call(mux, (b"CLOSE",))
        assert got.lost is not None and got.lost.sent  # it was sent: the server closed
        assert replies(await call(mux, (b"ECHO", b"again"))) == [b"again"]
        assert server.connections == 2
        await client.aclose()

    run(main)


def test_aclose_closes_the_idle_connections_and_the_next_call_connects_again() -> None:
    async def main(server: Scripted) -> None:
        client, mux = await connected(server)
        (line,) = mux._lines
        await mux.aclose()
        assert line.transport.is_closing() and line.closed.done()
        assert replies(await call(mux, (b"ECHO", b"again"))) == [b"again"]
        assert server.connections == 2 and mux.pool._open == 1
        await client.aclose()

    run(main)
