"""The core's side of the failure model, without a server: the driver fed scripted
exchanges, the outcome table, error codes of every server version, and the client checks."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import fakeredis
import pytest
import redis
import redis.asyncio
from servers import Server, unique_namespace

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    Conflict,
    Durability,
    Hold,
    RedisRepository,
    RedisRunStore,
    Unavailable,
)
from redisstore.core import scripts
from redisstore.core.driver import MAX_RELOADS, Driver
from redisstore.core.outcomes import ErrorReply, Exchange, Lost, Reply, error_outcome, split_error
from redisstore.core.runops import RunOps

# serial: deadlines measured
pytestmark = pytest.mark.serial

OK = Reply([0, False, 0, -1])


def driver(durability: Durability | None = None) -> Driver[None]:
    ops = RunOps("ns", None, 1)
    return Driver(ops.compare_and_set("r", 1, b"x", Hold("me")), durability)


def test_noscript_loads_and_sends_again_then_evals_then_gives_up_as_not_applied() -> None:
    d = driver()
    first = d.next_batch()
    assert first is not None and first.commands[0][0] == b"EVALSHA"
    d.receive(Exchange((ErrorReply("NOSCRIPT", "No matching script"),)))
    # SCRIPT LOAD and the same call, pipelined: a script the server will not load is
    # refused there, and the two usually run back to back.
    again = d.next_batch()
    assert again is not None and again.write
    assert again.commands == (
        (b"SCRIPT", b"LOAD", scripts.RUN_COMPARE_AND_SET.source), first.commands[0])
    d.receive(Exchange((Reply(b"sha"), ErrorReply("NOSCRIPT", "No matching script"))))
    for _ in range(MAX_RELOADS - 1):
        # A flush came between them: EVAL runs and caches the script in one command.
        again = d.next_batch()
        assert again is not None and again.write
        assert again.commands == ((b"EVAL", scripts.RUN_COMPARE_AND_SET.source,
                                   *first.commands[0][2:]),)
        d.receive(Exchange((ErrorReply("NOSCRIPT", "No matching script"),)))
    assert d.next_batch() is None
    with pytest.raises(Unavailable) as caught:
        d.result()
    assert (caught.value.outcome, caught.value.code) == ("not_applied", "NOSCRIPT")


def test_a_lost_reply_to_the_eval_resend_is_unknown_for_a_write() -> None:
    d = driver()
    d.receive(Exchange((ErrorReply("NOSCRIPT", "x"),)))
    d.receive(Exchange((Reply(b"sha"), ErrorReply("NOSCRIPT", "x"))))
    d.receive(Exchange((), Lost(True, "cut")))  # the EVAL ran, or not
    with pytest.raises(Unavailable) as caught:
        d.result()
    assert caught.value.outcome == "unknown"


def test_noscript_then_success_is_invisible() -> None:
    d = driver(Durability(replicas=1, timeout=100))
    d.receive(Exchange((ErrorReply("NOSCRIPT", "x"), ErrorReply("ERR", "not run"))))
    again = d.next_batch()
    assert again is not None
    assert [c[0] for c in again.commands] == [b"SCRIPT", b"EVALSHA", b"WAIT"]  # confirmed
    d.receive(Exchange((Reply(b"sha"), OK, Reply(1))))
    assert d.next_batch() is None
    assert d.result() is None


def test_a_lost_reply_after_noscript_is_the_calls_own() -> None:
    """The call went out behind SCRIPT LOAD: a write whose reply was lost is unknown."""
    for replies in ((), (Reply(b"sha"),)):
        d = driver()
        d.receive(Exchange((ErrorReply("NOSCRIPT", "x"),)))
        d.receive(Exchange(replies, Lost(True, "cut")))
        with pytest.raises(Unavailable) as caught:
            d.result()
        assert caught.value.outcome == "unknown"


def test_a_refused_load_is_not_applied() -> None:
    """A script the server will not load (a compile error, no right to load) never ran."""
    d = driver()
    d.receive(Exchange((ErrorReply("NOSCRIPT", "x"),)))
    d.receive(Exchange((ErrorReply("ERR", "Error compiling script (new function): "
                                          "user_script:6: unexpected symbol near '='"),
                        ErrorReply("NOSCRIPT", "x"))))
    with pytest.raises(Unavailable) as caught:
        d.result()
    assert caught.value.outcome == "not_applied"
    assert caught.value.reason.startswith("SCRIPT LOAD")


@pytest.mark.parametrize(("lost", "outcome"), [
    (Lost(sent=False, reason="refused"), "not_applied"),
    (Lost(sent=True, reason="cut"), "unknown"),
    (Lost(sent=True, reason="deadline", timed_out=True), "unknown"),
])
def test_a_lost_write_is_not_applied_only_when_nothing_was_sent(lost: Lost,
                                                                 outcome: str) -> None:
    d = driver()
    d.receive(Exchange((), lost))
    with pytest.raises(Unavailable) as caught:
        d.result()
    assert caught.value.outcome == outcome


def test_a_refusal_under_durability_is_the_contract_answer_not_unavailable() -> None:
    d = driver(Durability(replicas=1, timeout=100))
    batch = d.next_batch()
    assert batch is not None and batch.commands[1][0] == b"WAIT"
    d.receive(Exchange((Reply([3, 7, 0, -1]), Reply(0))))  # conflict; WAIT saw no replica
    with pytest.raises(Conflict) as caught:
        d.result()
    assert caught.value.current == 7


@pytest.mark.parametrize("confirmation", [Reply(0), ErrorReply("ERR", "x"), None])
def test_an_applied_write_without_confirmation_is_applied_unconfirmed(
        confirmation: Reply | ErrorReply | None) -> None:
    d = driver(Durability(replicas=1, timeout=100))
    if confirmation is None:  # the link broke between the write's reply and WAIT's
        d.receive(Exchange((OK,), Lost(True, "cut")))
    else:
        d.receive(Exchange((OK, confirmation)))
    with pytest.raises(Unavailable) as caught:
        d.result()
    assert caught.value.outcome == "applied_unconfirmed"


def test_a_broken_read_is_sent_again_once() -> None:
    ops = RunOps("ns", None, 1)
    d = Driver(ops.now())
    d.receive(Exchange((), Lost(True, "cut")))
    assert d.next_batch() is not None
    d.receive(Exchange((), Lost(True, "cut")))
    with pytest.raises(Unavailable) as caught:
        d.result()
    assert caught.value.outcome == "not_applied"


@pytest.mark.parametrize(("text", "code"), [
    # Redis 6.2 wraps an error raised inside a script; the code follows the dash.
    ("ERR Error running script (call to f_0a): @user_script:91: @user_script: 91: "
     "-READONLY You can't write against a read only replica.", "READONLY"),
    ("READONLY You can't write against a read only replica. script: "
     "0123456789012345678901234567890123456789, on @user_script:1.", "READONLY"),
    ("ERR user_script:12: BADARG ARGV[3] must be an integer script: "
     "0123456789012345678901234567890123456789, on @user_script:12.", "BADARG"),
    ("ERR Error running script (call to f_0a): @user_script:12: user_script:12: BADARG x",
     "BADARG"),
    ("NOSCRIPT No matching script.", "NOSCRIPT"),
])
def test_error_codes_of_every_server_version_are_read(text: str, code: str) -> None:
    assert split_error(text).code == code
    assert error_outcome(split_error(text), write=True) == "not_applied"


def test_an_error_inside_a_script_after_its_checks_is_unknown_for_a_write() -> None:
    denied = split_error("ERR The user executing the script can't run this command or "
                         "subcommand script: 0123456789012345678901234567890123456789, on "
                         "@user_script:1.")
    assert error_outcome(denied, write=True) == "unknown"
    assert error_outcome(denied, write=False) == "not_applied"


def test_fakeredis_without_lua_says_what_to_install() -> None:
    from redisstore.core.outcomes import refused

    error = refused(ErrorReply("ERR", "unknown command 'evalsha', with args beginning with:"),
                    write=True)
    assert error.outcome == "not_applied" and "fakeredis[lua]" in error.reason


# ---------------------------------------------------------------------------- clients


@pytest.mark.parametrize("bad", ["redis://127.0.0.1:6379", None, object(),
                                 redis.ConnectionPool(), redis.asyncio.Redis(),
                                 fakeredis.FakeAsyncRedis()])
def test_wrong_clients_are_refused_with_what_to_pass(bad: object) -> None:
    with pytest.raises(TypeError, match=r"redis\.Redis"):
        RedisRunStore(bad)
    with pytest.raises(TypeError, match=r"redis\.Redis"):
        RedisRepository(bad)


@pytest.mark.parametrize("bad", [redis.Redis(), fakeredis.FakeRedis(), "redis://x"])
def test_sync_clients_are_refused_by_the_async_store(bad: object) -> None:
    with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis"):
        AsyncRedisRunStore(bad)


@pytest.mark.parametrize(("options", "error"), [
    ({"durability": 1}, TypeError), ({"timeout": True}, TypeError),
    ({"timeout": 0}, ValueError), ({"durability": Durability(timeout=5000)}, ValueError),
    ({"max_record_bytes": 0}, ValueError), ({"max_record_bytes": 9 << 20}, ValueError),
])
def test_bad_options_are_refused(options: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RedisRunStore(fakeredis.FakeRedis(), **options)  # type: ignore[arg-type]


def test_int_subclasses_and_bools_are_refused_where_an_int_is_required() -> None:
    import enum

    class Ttl(enum.IntEnum):
        LONG = 1000

    store = RedisRunStore(fakeredis.FakeRedis())
    with pytest.raises(TypeError):
        store.claim_ready("me", Ttl.LONG, 1)
    with pytest.raises(TypeError):
        store.claim_ready("me", 1000, True)


@pytest.mark.server
def test_valkey_py_clients_work_sync_and_async(valkey8: Server) -> None:
    valkey = pytest.importorskip("valkey")
    valkey_asyncio = pytest.importorskip("valkey.asyncio")

    # valkey-py's pool has another get_connection signature and its own exception classes.
    store = RedisRunStore(valkey.Valkey(port=valkey8.port, decode_responses=True),
                          namespace=unique_namespace())
    store.insert("r", b"r1", Claim("me", 60_000))
    store.compare_and_set("r", 1, b"r2", Hold("me"))
    with pytest.raises(Conflict):
        store.compare_and_set("r", 1, b"r3", Hold("me"))
    assert store.get("r").record == b"r2"

    async def main() -> bytes:
        client = valkey_asyncio.Valkey(port=valkey8.port)
        astore = AsyncRedisRunStore(client, namespace=store.namespace)
        await astore.compare_and_set("r", 2, b"r3", Hold("me"))
        with pytest.raises(Conflict):
            await astore.compare_and_set("r", 2, b"r4", Hold("me"))
        record = (await astore.get("r")).record
        await client.aclose()
        return record

    assert asyncio.run(main()) == b"r3"


# ---------------------------------------------------------------------------- deadlines


@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                accepted.append(conn)
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], accepted
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


@pytest.fixture
def trickling_server() -> Iterator[int]:
    """A server that answers every connection one byte every 500 ms, forever."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                try:
                    conn.sendall(b"*")
                except OSError:
                    return
                stop.wait(0.5)

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed at teardown
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()


def _timed(call: object) -> tuple[float, Unavailable]:
    start = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        call()  # type: ignore[operator]
    return time.monotonic() - start, caught.value


@pytest.mark.parametrize("socket_timeout", [None, 30])
def test_a_hung_server_costs_one_deadline_per_call(
        silent_server: tuple[int, list[socket.socket]], socket_timeout: float | None) -> None:
    port, _ = silent_server
    client = redis.Redis(port=port, socket_timeout=socket_timeout)
    store = RedisRunStore(client, namespace="hung", timeout=300)
    for call in (lambda: store.get("r"), lambda: store.insert("r", b"x", Claim("me", 1000))):
        elapsed, error = _timed(call)
        # One deadline (not socket_timeout's 30 s, nor forever): the deadline, the watchdog's
        # 50 ms tick, and room for a loaded CI machine.
        assert elapsed < 0.3 + 0.5, elapsed
        assert "deadline" in error.reason


def test_a_trickling_server_costs_one_deadline_per_call(trickling_server: int) -> None:
    client = redis.Redis(port=trickling_server, socket_timeout=2)
    store = RedisRunStore(client, namespace="trickle", timeout=1200)
    elapsed, error = _timed(lambda: store.insert("r", b"x", Claim("me", 1000)))
    assert elapsed < 1.2 + 0.5, elapsed
    assert error.outcome in ("not_applied", "unknown")


def test_a_hung_server_costs_one_deadline_per_async_call(
        silent_server: tuple[int, list[socket.socket]]) -> None:
    port, _ = silent_server

    async def main() -> tuple[float, Unavailable]:
        client = redis.asyncio.Redis(port=port, socket_timeout=None)
        store = AsyncRedisRunStore(client, namespace="hung", timeout=300)
        start = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            await store.insert("r", b"x", Claim("me", 1000))
        return time.monotonic() - start, caught.value

    elapsed, error = asyncio.run(main())
    assert elapsed < 0.3 + 0.5, elapsed  # one deadline, with room for a loaded machine
    assert "deadline" in error.reason


# ---------------------------------------------------------------------------- cluster redirects


def test_a_batch_is_sent_to_the_new_owner_only_when_every_script_was_moved_there() -> None:
    from redisstore.core.driver import Batch
    from redisstore.shells.clients import moved_to

    script = (b"EVALSHA", b"0" * 40, 1, b"{ns}:meta")
    batch = Batch((script, script, (b"WAIT", 1, 100)), write=True, keys=("{ns}:meta",))
    moved = ErrorReply("MOVED", "12 127.0.0.1:7001")
    waited = Reply(1)  # WAIT names no key: the old node ran it, harmlessly
    assert moved_to(batch, Exchange((moved, moved, waited))) == ("127.0.0.1", 7001)
    # One script ran: sending the batch again would run it twice.
    assert moved_to(batch, Exchange((moved, Reply([0]), waited))) is None
    # ASK: the slot is migrating, the namespace's keys split between two nodes.
    asked = ErrorReply("ASK", "12 127.0.0.1:7001")
    assert moved_to(batch, Exchange((asked, asked, waited))) is None
    assert moved_to(batch, Exchange((moved, ErrorReply("MOVED", "12 127.0.0.1:7002"),
                                     waited))) is None
    assert moved_to(batch, Exchange((moved,), Lost(True, "cut"))) is None
    assert moved_to(batch, Exchange((ErrorReply("MOVED", "garbled"),) * 2 + (waited,))) is None
