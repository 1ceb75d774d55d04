"""What only the asyncio stores have to prove beyond the conformance suites: many tasks on one
client, cancellation in flight, the failure model through redis.asyncio, NOSCRIPT, decoding
clients, the pipelined durability confirmation."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from faultproxy import FaultProxy
from servers import Server, awarm, unique_namespace

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    Conflict,
    Current,
    Durability,
    Free,
    Held,
    Hold,
    LeaseRefused,
    NotFound,
    RedisRunStore,
    Release,
    StoreError,
    Unavailable,
    aconfirm_write,
)
from redisstore.core import scripts
from redisstore.shells.aio import AsyncTransport

# serial: timeouts and cancellations timed in flight
pytestmark = pytest.mark.serial

LONG = 600_000


def _async_client(server: Server, **options: Any) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, **options)


@pytest.fixture(params=["fakeredis", pytest.param("redis7", marks=pytest.mark.server),
                        pytest.param("valkey8", marks=pytest.mark.server)])
def backend(request: pytest.FixtureRequest) -> Any:
    """A factory of async clients of one server (fakeredis: one shared fake server)."""
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()
        return lambda **options: fakeredis.FakeAsyncRedis(server=server, **options)
    real: Server = request.getfixturevalue(request.param)
    return lambda **options: _async_client(real, **options)


# ---------------------------------------------------------------------------- many tasks


@pytest.mark.server
@pytest.mark.parametrize("pool", ["blocking-50", "default"])
def test_200_tasks_racing_compare_and_set_have_one_winner_per_revision(
        redis7: Server, pool: str) -> None:
    tasks, runs, attempts = 200, 4, 6
    outcomes: collections.Counter[str] = collections.Counter()
    winners: dict[tuple[str, int], list[str]] = collections.defaultdict(list)

    async def main() -> dict[str, Current]:
        # 200 tasks, 50 connections (or the default pool's 100): a task waits for a free
        # connection, never refused.
        if pool == "default":
            client = redis.asyncio.Redis(host="127.0.0.1", port=redis7.port)
        else:
            client = redis.asyncio.Redis(connection_pool=redis.asyncio.BlockingConnectionPool(
                host="127.0.0.1", port=redis7.port, max_connections=50))
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        names = [f"run-{i}" for i in range(runs)]
        for name in names:
            await store.insert(name, b"start", Release())
        start = asyncio.Event()

        async def contender(n: int) -> None:
            me = f"task-{n}"
            await start.wait()
            for attempt in range(attempts):
                run = names[(n + attempt) % runs]
                current = await store.get(run)
                try:
                    await store.compare_and_set(run, current.revision, f"{me}/{attempt}".encode(),
                                                Claim(me, LONG))
                except (Conflict, LeaseRefused) as exc:
                    outcomes[type(exc).__name__] += 1
                    continue
                except StoreError as exc:  # anything else breaks the contract
                    outcomes[f"unexpected {exc!r}"] += 1
                    continue
                winners[(run, current.revision)].append(me)
                outcomes["won"] += 1
                # Let the others in again: only the holder can write the next revision.
                await store.compare_and_set(run, current.revision + 1, f"{me}/free".encode(),
                                            Release())
                winners[(run, current.revision + 1)].append(me)

        racing = [asyncio.create_task(contender(n)) for n in range(tasks)]
        await asyncio.sleep(0.05)
        start.set()
        await asyncio.gather(*racing)
        final = {name: await store.get(name) for name in names}
        await client.aclose()
        return final

    final = asyncio.run(main())
    assert sum(outcomes.values()) == tasks * attempts
    assert set(outcomes) <= {"won", "Conflict", "LeaseRefused"}, outcomes
    assert outcomes["won"] >= runs and outcomes["Conflict"] + outcomes["LeaseRefused"] > 0
    # Exactly one winner per revision, and every revision of every run was won by someone.
    assert all(len(names) == 1 for names in winners.values())
    for name, current in final.items():
        revisions = sorted(expected for run, expected in winners if run == name)
        assert revisions == list(range(1, current.revision))
        if current.revision > 1:  # the last write was its winner's Release
            assert current.holder == Free() and current.record.endswith(b"/free")


def test_a_single_connection_client_serves_concurrent_tasks() -> None:
    """Writes take their own pooled connection: tasks never interleave on the client's one."""

    async def main() -> None:
        client = fakeredis.FakeAsyncRedis(single_connection_client=True)
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        await asyncio.gather(*(store.insert(f"r{i}", b"x", Claim("n", LONG)) for i in range(50)))
        renewed = await asyncio.gather(*(store.renew("n", [f"r{i}"], LONG) for i in range(50)))
        assert renewed == [[f"r{i}"] for i in range(50)]
        await client.aclose()

    asyncio.run(main())


def test_a_client_without_a_pool_is_refused() -> None:
    with pytest.raises(TypeError):
        AsyncTransport(object())


# ---------------------------------------------------------------------------- cancellation


@pytest.fixture
def proxy(redis7: Server) -> Iterator[FaultProxy]:
    with FaultProxy(redis7.port) as p:
        yield p


@pytest.fixture
def direct(redis7: Server) -> RedisRunStore:
    """A sync store on Redis 7 (not through the proxy), with "run" at revision 1 held by n."""
    store = RedisRunStore(redis7.client(), namespace=unique_namespace())
    store.insert("run", b"r1", Claim("n", LONG))
    return store


async def _through(proxy: FaultProxy, **options: Any) -> redis.asyncio.Redis:
    client = redis.asyncio.Redis(host=proxy.host, port=proxy.port, **options)
    await client.ping()  # the handshake must not be what a test delays or drops
    for script in scripts.RUN_SCRIPTS:  # nor a NOSCRIPT reply
        await client.script_load(script.source)
    await awarm(client)
    return client


@pytest.mark.server
@pytest.mark.parametrize("cancel_after", [0.0, 0.01, 0.3])
def test_a_write_cancelled_in_flight_leaves_the_pool_usable_and_is_applied_or_not(
        proxy: FaultProxy, direct: RedisRunStore, cancel_after: float) -> None:
    namespace = direct.namespace

    async def main() -> bool:
        client = await _through(proxy, socket_timeout=10)
        store = AsyncRedisRunStore(client, namespace=namespace)
        proxy.set_delay(1.0)  # the reply is held back: the write is in flight when cancelled
        task = asyncio.create_task(store.compare_and_set("run", 1, b"r2-token", Hold("n")))
        await asyncio.sleep(cancel_after)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.pass_through()
        # The same client, many more calls, sequential and concurrent: every reply is the
        # one its own command asked for (a late reply left on a pooled connection would
        # answer the next command instead).
        current = await store.get("run")
        await store.insert("other", b"o1", Claim("n", LONG))
        for revision in range(1, 30):
            await store.compare_and_set("other", revision, b"o%d" % (revision + 1), Hold("n"))
            assert (await store.get("other")).record == b"o%d" % (revision + 1)
        now = await asyncio.gather(*(store.now() for _ in range(20)))
        assert all(isinstance(ms, int) for ms in now)
        applied = await aconfirm_write(store, "run", 2, b"r2-token")
        assert applied == (current.revision == 2)
        await client.aclose()
        return applied

    applied = asyncio.run(main())
    current = direct.get("run")
    # Applied entirely or not at all, and at most once.
    if applied:
        assert (current.revision, current.record) == (2, b"r2-token")
    else:
        assert (current.revision, current.record) == (1, b"r1")
    if cancel_after >= 0.3:  # the request had long reached the server: the script ran
        assert applied


@pytest.mark.server
def test_a_timeout_around_a_write_in_flight_fires_on_time(proxy: FaultProxy,
                                                          direct: RedisRunStore) -> None:
    """asyncio.timeout cancels the call; the cancel is not lost in redis-py's send (whose
    asyncio.wait_for swallows a cancel on Python 3.11) and the caller waits no longer. Each
    cancelled write is applied once or not at all: the revision moved at most that often."""
    namespace = direct.namespace

    async def main() -> None:
        client = await _through(proxy, socket_timeout=10)
        store = AsyncRedisRunStore(client, namespace=namespace)
        loop = asyncio.get_running_loop()
        for attempt in range(5):
            # Reconnect the store's connection the last attempt dropped before slowing the
            # link: redis-py's own handshake (on Python 3.11, its wait_for) is not under test.
            proxy.pass_through()
            await awarm(client)
            proxy.set_delay(2.0)
            started = loop.time()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.001 * attempt):
                    await store.compare_and_set("run", 1 + attempt, b"r-%d" % attempt,
                                                Hold("n"))
            assert loop.time() - started < 1.0
        proxy.pass_through()
        current = await store.get("run")
        # Attempt k writes revision k + 2, so it only applies after every earlier one did.
        assert 1 <= current.revision <= 6 and current.holder == Held("n", True)
        if current.revision > 1:
            assert current.record == b"r-%d" % (current.revision - 2)
        await client.aclose()

    asyncio.run(main())


# ---------------------------------------------------------------------------- failures


@pytest.mark.server
@pytest.mark.parametrize("hang", [False, True])
def test_lost_reply_of_a_committed_write_is_unavailable_and_applied_once(
        proxy: FaultProxy, direct: RedisRunStore, hang: bool) -> None:
    """The async client keeps redis-py's default retry: the store must not let it replay."""
    namespace = direct.namespace

    async def main() -> None:
        client = await _through(proxy, socket_timeout=0.5)
        store = AsyncRedisRunStore(client, namespace=namespace)
        proxy.drop_replies(1, hang=hang)
        with pytest.raises(Unavailable) as caught:
            await store.compare_and_set("run", 1, b"r2-token", Hold("n"))
        assert caught.value.outcome == "unknown"
        assert proxy.replies_dropped == 1
        current = direct.get("run")
        assert (current.revision, current.record) == (2, b"r2-token")  # applied exactly once
        assert await aconfirm_write(store, "run", 2, b"r2-token")
        assert not await aconfirm_write(store, "run", 2, b"someone else's")
        assert not await aconfirm_write(store, "absent", 1, b"r2-token")
        with pytest.raises(Conflict):  # the caller's stale retry is fenced
            await store.compare_and_set("run", 1, b"r2-token", Hold("n"))
        await client.aclose()

    asyncio.run(main())


def test_refused_connection_is_unavailable() -> None:
    from servers import free_port

    async def main() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=free_port(), socket_timeout=1)
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        with pytest.raises(Unavailable):
            await store.get("run")
        with pytest.raises(Unavailable) as caught:
            await store.insert("run", b"r", Claim("n", LONG))
        # Nothing could be sent: not a write of unknown outcome.
        assert caught.value.outcome == "not_applied" and caught.value.code is None
        await client.aclose()

    asyncio.run(main())


def test_script_flush_is_reloaded_transparently(backend: Any) -> None:
    async def main() -> None:
        client = backend()
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        await store.insert("run", b"r1", Claim("n", LONG))
        await client.script_flush()
        await store.compare_and_set("run", 1, b"r2", Hold("n"))  # a write after NOSCRIPT
        await client.script_flush()
        assert (await store.get("run")).revision == 2  # a read after NOSCRIPT
        await client.aclose()

    asyncio.run(main())


def test_decoding_clients_still_get_bytes(backend: Any) -> None:
    async def main() -> None:
        client = backend(decode_responses=True)
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        await store.insert("run", b"\xff\x00binary", Claim("\u00e9l\u00e8ve", LONG))
        current = await store.get("run")
        assert current.record == b"\xff\x00binary"
        assert current.holder == Held("\u00e9l\u00e8ve", True)
        assert await store.renew("\u00e9l\u00e8ve", ["run"], LONG) == ["run"]
        await client.aclose()

    asyncio.run(main())


@pytest.mark.server
def test_durability_confirmation_is_pipelined_behind_each_write(redis7: Server) -> None:
    """A lone server has no replica: WAIT 0 confirms, WAIT 1 cannot (applied all the same)."""

    async def main() -> None:
        client = _async_client(redis7)
        namespace = unique_namespace()
        confirmed = AsyncRedisRunStore(client, namespace=namespace,
                                       durability=Durability(replicas=0, timeout=100))
        await confirmed.insert("run", b"r1", Claim("n", LONG))
        with pytest.raises(LeaseRefused):  # an answer, not Unavailable
            await confirmed.compare_and_set("run", 1, b"r2", Hold("other"))
        strict = AsyncRedisRunStore(client, namespace=namespace,
                                    durability=Durability(replicas=1, timeout=50))
        with pytest.raises(Unavailable) as caught:
            await strict.compare_and_set("run", 1, b"r2-token", Hold("n"))
        assert "not confirmed" in caught.value.reason
        assert await aconfirm_write(confirmed, "run", 2, b"r2-token")
        await client.aclose()

    asyncio.run(main())


def test_bad_arguments_raise_before_anything_is_sent() -> None:
    async def main() -> None:
        client = fakeredis.FakeAsyncRedis()
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        with pytest.raises(ValueError):
            await store.insert("", b"r", Release())
        with pytest.raises(TypeError):
            await store.compare_and_set("run", 0, "text", Release())  # type: ignore[arg-type]
        assert await client.keys("*") == []
        await client.aclose()

    asyncio.run(main())


# ---------------------------------------------------------------------------- multiplexing


@pytest.mark.server
def test_many_tasks_share_a_few_connections(redis7: Server) -> None:
    """500 tasks at once on a default client: their calls are pipelined on at most four
    connections of the store's pool (one flush each), and each gets its own answer."""
    name = f"mux-{unique_namespace()}"
    admin = redis7.client()

    async def main() -> int:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis7.port, client_name=name)
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        await store.insert("warm", b"x", Release())
        results = await asyncio.gather(*(store.insert(f"r{i}", f"{i}".encode(), Release())
                                         for i in range(500)))
        assert results == [1] * 500  # each insert answers its revision
        reads = await asyncio.gather(*(store.get(f"r{i}") for i in range(500)))
        assert [r.record for r in reads] == [f"{i}".encode() for i in range(500)]
        seen = sum(1 for c in admin.client_list() if c.get("name") == name)
        await store.aclose()
        await client.aclose()
        return seen

    assert 1 <= asyncio.run(main()) <= 8  # four flushers (more only behind a stuck one)


@pytest.mark.server
def test_a_call_cancelled_before_its_flush_is_written_is_never_sent(redis7: Server) -> None:
    async def main() -> None:
        namespace = unique_namespace()
        with FaultProxy(redis7.port) as proxy:
            # One connection: a second flush waits for it while the first one's replies
            # are held back by the proxy.
            client = redis.asyncio.Redis(host=proxy.host, port=proxy.port, max_connections=1)
            store = AsyncRedisRunStore(client, namespace=namespace)
            await store.insert("warm", b"x", Release())
            direct = redis.asyncio.Redis(host="127.0.0.1", port=redis7.port)
            proxy.set_delay(1.0)
            first = asyncio.ensure_future(store.insert("first", b"1", Release()))
            # The first flush is written and applied, its reply held back (awaited, not
            # slept for: on a loaded machine the next call would share its flush).
            while not await direct.exists(f"{{{namespace}}}:r:first"):
                await asyncio.sleep(0.005)
            queued = asyncio.ensure_future(store.insert("never", b"1", Release()))
            await asyncio.sleep(0.05)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            await first
            proxy.set_delay(0)
            with pytest.raises(NotFound):
                await store.get("never")
            assert (await store.get("first")).revision == 1
            await client.aclose()
            await direct.aclose()

    asyncio.run(main())


@pytest.mark.server
def test_cancelling_every_task_leaves_the_store_usable(redis7: Server) -> None:
    """A shutdown that cancels every other task cancels the multiplexer's flushers too;
    the next call must still be sent (it used to wait for flushers that never ran)."""
    async def main() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis7.port)
        store = AsyncRedisRunStore(client, namespace=unique_namespace(), timeout=1000)
        await store.insert("warm", b"x", Release())
        tasks = [asyncio.ensure_future(store.insert(f"r{i}", b"1", Release()))
                 for i in range(8)]
        await asyncio.sleep(0)  # queued, flushers created, none has run yet
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.insert("after", b"1", Release())
        assert (await store.get("after")).revision == 1
        await client.aclose()

    asyncio.run(main())


@pytest.mark.server
def test_flushes_stuck_on_hung_connections_hold_only_their_own_calls(redis7: Server) -> None:
    async def main() -> None:
        with FaultProxy(redis7.port) as proxy:
            client = redis.asyncio.Redis(host=proxy.host, port=proxy.port)
            slow = AsyncRedisRunStore(client, namespace=unique_namespace(), timeout=3000)
            quick = AsyncRedisRunStore(client, namespace=slow.namespace, timeout=1000)
            await slow.insert("warm", b"x", Release())
            proxy.drop_replies(4, hang=True)
            stuck = []
            for _ in range(4):  # four flushes, each on its own connection, all hung
                stuck.append(asyncio.ensure_future(slow.get("warm")))
                await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            assert (await quick.get("warm")).revision == 1  # another flusher takes it
            assert asyncio.get_running_loop().time() - started < 0.95
            results = await asyncio.gather(*stuck, return_exceptions=True)
            assert all(isinstance(r, (Current, Unavailable)) for r in results)
            await client.aclose()

    asyncio.run(main())
