"""What only the Redis store has: namespaces, script loading, clients, failure basics."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from faultproxy import FaultProxy
from servers import Server, free_port, unique_namespace, warm

from redisstore import (
    At,
    Changed,
    Claim,
    Conflict,
    Fenced,
    Held,
    Hold,
    NotFound,
    RedisRunStore,
    Release,
    Unavailable,
    confirm_write,
    drop_namespace,
)
from redisstore.core import scripts
from redisstore.core.caps import Cap
from redisstore.core.keys import Keyspace

LONG = 600_000


def test_namespaces_never_see_each_other(client: redis.Redis) -> None:
    a = RedisRunStore(client, namespace=unique_namespace())
    b = RedisRunStore(client, namespace=unique_namespace())
    a.insert("run", b"a", Claim("n", 1))
    with pytest.raises(NotFound):
        b.get("run")
    b.insert("run", b"b", Release())
    assert a.get("run").record == b"a" and b.get("run").record == b"b"
    assert b.claim_expired("n", LONG, 10) == []
    assert b.renew("n", ["run"], LONG) == []


def test_every_key_shares_the_namespace_hash_tag(client: redis.Redis) -> None:
    namespace = unique_namespace()
    store = RedisRunStore(client, namespace=namespace)
    store.insert("a:b{c}", b"r", Claim("n", LONG))
    store.insert("other", b"r", Release())
    keys = [k.decode() for k in client.scan_iter(match="{" + namespace + "}:*")]
    assert keys and all(k.startswith("{" + namespace + "}:") for k in keys)
    assert Keyspace(namespace).run("a:b{c}") in keys
    # The scripts build per-run and per-dependency names themselves: they match keys.py.
    waiter = RedisRunStore(client, namespace=namespace, discover=lambda r: Changed("dep"))
    waiter.insert("waiter", b"r", Release())
    assert client.smembers(Keyspace(namespace).dependents("dep")) == {b"waiter"}


def test_script_flush_is_reloaded_transparently(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("run", b"r1", Claim("n", LONG))
    client.script_flush()
    store.compare_and_set("run", 1, b"r2", Hold("n"))  # a write after NOSCRIPT
    client.script_flush()
    assert store.get("run").revision == 2  # a read after NOSCRIPT


def test_decoding_clients_still_get_bytes(client: redis.Redis) -> None:
    pool_kwargs = client.connection_pool.connection_kwargs
    if isinstance(client, fakeredis.FakeRedis):
        decoding = fakeredis.FakeRedis(server=client.connection_pool.connection_kwargs["server"],
                                       decode_responses=True)
    else:
        decoding = redis.Redis(host=pool_kwargs["host"], port=pool_kwargs["port"],
                               decode_responses=True)
    store = RedisRunStore(decoding, namespace=unique_namespace())
    store.insert("run", b"\xff\x00binary", Claim("\u00e9l\u00e8ve", LONG))
    current = store.get("run")
    assert current.record == b"\xff\x00binary"
    assert current.holder == Held("\u00e9l\u00e8ve", True)
    assert store.renew("\u00e9l\u00e8ve", ["run"], LONG) == ["run"]


@pytest.mark.parametrize("bad", ["", "a{b", "c}d", None])
def test_bad_namespace_is_refused(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        RedisRunStore(fakeredis.FakeRedis(), namespace=bad)  # type: ignore[arg-type]


def test_every_script_is_headed_by_keys_argv_and_reply() -> None:
    folder = scripts.lua_dir()
    names = [s.name for s in scripts.RUN_SCRIPTS]
    for name in names:
        head = (folder / f"{name}.lua").read_text().split("\n\n")[0]
        assert head.startswith(f"-- {name}:"), name
        for word in ("KEYS[1]", "ARGV[1]", "Reply"):
            assert word in head, (name, word)
        # Every ARGV the body reads is documented in the header.
        body = (folder / f"{name}.lua").read_text()
        used = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", body)}
        for n in used:
            assert re.search(rf"ARGV\[{n}(\]|\.\.)", head) or any(
                lo <= n <= hi for lo, hi in _ranges(head)), (name, n)


def _ranges(head: str) -> list[tuple[int, int]]:
    return [(int(a), int(b) if b else 10**6)
            for a, b in re.findall(r"ARGV\[(\d+)\.\.(\d*)\]", head)]


# ---------------------------------------------------------------------------- failures


def test_refused_connection_is_unavailable() -> None:
    store = RedisRunStore(redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=1),
                          namespace=unique_namespace())
    with pytest.raises(Unavailable):
        store.get("run")
    with pytest.raises(Unavailable) as caught:
        store.insert("run", b"r", Claim("n", LONG))
    # Nothing could be sent: not a write of unknown outcome.
    assert caught.value.outcome == "not_applied" and caught.value.code is None
    with pytest.raises(Unavailable):
        store.now()


@pytest.fixture
def proxy(redis7: Server) -> Iterator[FaultProxy]:
    with FaultProxy(redis7.port) as p:
        yield p


def _through(proxy: FaultProxy, **options: object) -> redis.Redis:
    client = redis.Redis(host=proxy.host, port=proxy.port, **options)  # type: ignore[arg-type]
    client.ping()  # the handshake must not be the reply a test drops
    # Nor a NOSCRIPT reply: with the scripts loaded, the dropped reply is the script's own.
    for script in scripts.RUN_SCRIPTS:
        client.script_load(script.source)
    warm(client)
    return client


@pytest.mark.server
def test_timeout_is_unavailable(proxy: FaultProxy, redis7: Server) -> None:
    namespace = unique_namespace()
    direct = RedisRunStore(redis7.client(), namespace=namespace)
    direct.insert("run", b"r1", Claim("n", LONG))
    store = RedisRunStore(_through(proxy, socket_timeout=0.3), namespace=namespace)
    proxy.set_delay(1.0)
    with pytest.raises(Unavailable) as caught:
        store.compare_and_set("run", 1, b"r2", Hold("n"))
    assert "Timeout" in caught.value.reason
    proxy.pass_through()
    # The delayed write still reached the server: its outcome was unknown, not "failed".
    assert confirm_write(direct, "run", 2, b"r2")


@pytest.mark.server
@pytest.mark.parametrize("hang", [False, True])
def test_lost_reply_of_a_committed_write_is_unavailable_and_applied_once(
        proxy: FaultProxy, redis7: Server, hang: bool) -> None:
    """The client keeps redis-py's default retry: the store must not let it replay."""
    namespace = unique_namespace()
    direct = RedisRunStore(redis7.client(), namespace=namespace)
    direct.insert("run", b"r1", Claim("n", LONG))
    store = RedisRunStore(_through(proxy, socket_timeout=0.5), namespace=namespace)
    proxy.drop_replies(1, hang=hang)
    with pytest.raises(Unavailable) as caught:
        store.compare_and_set("run", 1, b"r2-token", Hold("n"))
    assert caught.value.outcome == "unknown"
    assert proxy.replies_dropped == 1
    current = direct.get("run")
    assert (current.revision, current.record) == (2, b"r2-token")  # applied exactly once
    assert confirm_write(store, "run", 2, b"r2-token")
    assert not confirm_write(store, "run", 2, b"someone else's")
    with pytest.raises(Conflict):  # the caller's stale retry is fenced
        store.compare_and_set("run", 1, b"r2-token", Hold("n"))


@pytest.mark.server
def test_redis_py_retry_would_have_replayed_the_write(proxy: FaultProxy, redis7: Server) -> None:
    """Why writes bypass the client's retry: the same call through execute_command runs twice."""
    namespace = unique_namespace()
    client = _through(proxy, socket_timeout=0.5)
    if client.get_retry() is None or client.get_retry().get_retries() == 0:  # type: ignore[union-attr]
        pytest.skip("this redis-py does not retry by default")
    counter = "{" + namespace + "}:counter"
    proxy.drop_replies(1)
    client.execute_command("EVAL", "return redis.call('INCR', KEYS[1])", 1, counter)
    assert int(redis7.client().get(counter) or 0) == 2
    redis7.client().delete(counter)


@pytest.mark.server
def test_lost_reply_of_claims_leaves_them_held_until_ttl(proxy: FaultProxy, redis7: Server) -> None:
    namespace = unique_namespace()
    direct = RedisRunStore(redis7.client(), namespace=namespace)
    for i in range(3):
        direct.insert(f"run-{i}", b"r", Claim("dead", 1))
    store = RedisRunStore(_through(proxy, socket_timeout=0.5), namespace=namespace)
    import time
    time.sleep(0.01)
    proxy.drop_replies(1)
    with pytest.raises(Unavailable):
        store.claim_expired("me", 200, 10)
    # The claim happened once; nobody else can claim those runs until its ttl runs out.
    assert direct.claim_expired("other", LONG, 10) == []
    assert {direct.get(f"run-{i}").holder for i in range(3)} == {Held("me", True)}
    time.sleep(0.25)
    assert sorted(direct.claim_expired("other", LONG, 10)) == ["run-0", "run-1", "run-2"]


def test_a_lapsed_sessions_sweep_is_bounded_by_runs_and_by_id_bytes(
        client: redis.Redis) -> None:
    """The first claim after a session lapses puts its runs into the leases index in SSCAN
    steps: short ids about SESSION_SWEEP of them (not the whole set), long ids one step (not
    SESSION_SWEEP of them); the claims after it take the rest, every run once."""
    sweep, budget = int(Cap.SESSION_SWEEP), int(Cap.SESSION_SWEEP_BYTES)
    for width, n in ((8, sweep + 600), (2048, 400)):
        namespace = unique_namespace()
        store = RedisRunStore(client, namespace=namespace)
        keys = Keyspace(namespace)
        session = store.open_session("dead", 60_000)
        ids = [f"{i:06d}".ljust(width, "x") for i in range(n)]
        for run in ids:
            store.insert(run, b"x", session.lease)
        client.hset(keys.sessions, session.id, "1000,60000,,dead")  # lapsed long ago
        client.zadd(keys.session_leases, {session.id: 1000})
        taken = store.claim_expired("x", 60_000, 1)
        swept = client.zcard(keys.leases) + 1
        if width == 8:
            assert sweep <= swept < n, swept
        else:
            assert width * swept <= budget + width * 200 and swept < sweep, swept
        while got := store.claim_expired("x", 60_000, 100):
            taken += got
        assert sorted(taken) == ids
        assert store.sessions() == []
        drop_namespace(client, namespace)


def test_a_lapsed_session_is_listed_while_a_fused_finish_and_claim_leave_it_a_run(
        client: redis.Redis) -> None:
    """A finish fenced by a lapsed session's grant, then a claim that takes another of its
    runs, in one script (run_finish_claim): the finish's part is written before the claim
    runs, and the session's count of runs must not count it twice. Its third run still
    holds it: the session stays listed (and its record, and the sweep's entry) until that
    run leaves too."""
    namespace = unique_namespace()
    store = RedisRunStore(client, namespace=namespace,
                          discover=lambda record: At(0) if record == b"todo" else None)
    for run in ("a", "b", "c"):
        store.insert(run, b"todo", Release())
    session = store.open_session("node-a", 200)
    assert sorted(session.claim_ready(3)) == ["a", "b", "c"]
    while store.get("a").holder != Held("node-a", False):
        time.sleep(0.02)
    first = store.get("a")
    assert first.token is not None
    with store.pipeline() as pipe:
        finished = pipe.finish("a", first.revision, Fenced("node-a", first.token),
                               record=b"done")
        claimed = pipe.claim("node-b", 60_000)
    finished.result()
    (taken,) = claimed.result()
    left = ({"b", "c"} - {taken}).pop()
    assert store.get(left).holder == Held("node-a", False)
    assert [(s.id, s.runs) for s in store.sessions()] == [(session.id, 1)]
    assert store.claim_expired("node-c", 60_000, 5) == [left]
    assert store.sessions() == []  # its last run left: gone
    drop_namespace(client, namespace)
