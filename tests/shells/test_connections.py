"""The store's own connections: ``close()`` / ``aclose()`` give them back to the server, a
connection busy at close is dropped when its call ends, and an asyncio client outlives its
event loop (``asyncio.run`` twice with one client).

Connections are counted on the server (``CLIENT LIST``, by the client name each test gives
its client, which the store's connections carry too), from an admin connection of its own,
so the tests see what an operator would see.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
import warnings
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from servers import Server, unique_namespace

from redisstore import (
    AsyncRedisRepository,
    AsyncRedisRunStore,
    MemoryRepository,
    MemoryRunStore,
    RedisRepository,
    RedisRunStore,
    Release,
)
from redisstore.shells.sync import pool_for

# serial: waits for the server's count of connections to settle
pytestmark = [pytest.mark.server, pytest.mark.serial]


@pytest.fixture(params=["redis7", "valkey8"])
def server(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def admin(server: Server) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def name() -> str:
    return f"conn-test-{uuid.uuid4().hex[:12]}"


def connected(admin: redis.Redis, name: str) -> int:
    """How many connections named ``name`` the server has."""
    return sum(1 for c in admin.client_list() if c.get("name") == name)


def settles_at(admin: redis.Redis, name: str, expected: int, timeout: float = 5.0) -> int:
    """The count of ``name``'s connections once it reaches ``expected`` (or the last seen)."""
    end = time.monotonic() + timeout
    while (seen := connected(admin, name)) != expected and time.monotonic() < end:
        time.sleep(0.02)
    return seen


def test_close_gives_every_connection_back_and_the_store_stays_usable(
        server: Server, admin: redis.Redis, name: str) -> None:
    client = server.client(max_connections=8, client_name=name)
    store = RedisRunStore(client, namespace=unique_namespace())
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        for n in range(20):
            store.insert(f"run-{i}-{n}", b"{}", Release())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert connected(admin, name) > 0  # the four threads left connections idle

    store.close()
    assert settles_at(admin, name, 0) == 0

    assert store.get("run-0-0").revision == 1  # it connects again
    store.close()
    assert settles_at(admin, name, 0) == 0


def test_with_closes_and_stores_sharing_a_client_share_the_connections(
        server: Server, admin: redis.Redis, name: str) -> None:
    client = server.client(client_name=name)
    namespace = unique_namespace()
    other = RedisRunStore(client, namespace=namespace)
    with RedisRunStore(client, namespace=namespace) as store, \
            RedisRepository(client, namespace=namespace) as repo:
        store.insert("a", b"{}", Release())
        assert repo.load("nothing") is None
        assert other.get("a").revision == 1
        assert connected(admin, name) == 1  # one connection served all three
    assert settles_at(admin, name, 0) == 0
    assert other.get("a").revision == 1  # closing one store never breaks another


def test_a_connection_busy_at_close_is_dropped_when_its_call_ends(server: Server) -> None:
    pool = pool_for(server.client().connection_pool)
    busy, fresh = pool.acquire(time.monotonic() + 5)
    assert fresh
    busy.connect()
    idle, _ = pool.acquire(time.monotonic() + 5)
    idle.connect()
    pool.release(idle)

    pool.close()
    assert idle._sock is None  # idle: disconnected at once
    assert busy._sock is not None  # busy: its call goes on
    pool.release(busy)
    assert busy._sock is None  # ... and it is dropped, not kept idle

    again, fresh = pool.acquire(time.monotonic() + 5)
    assert fresh and again is not busy and again is not idle
    pool.release(again)


def test_memory_stores_close_too() -> None:
    with MemoryRunStore() as store, MemoryRepository() as repo:
        store.insert("a", b"{}", Release())
        assert repo.load("a") is None
    store.close()
    assert store.get("a").revision == 1


def test_aclose_and_async_with_give_the_connections_back(
        server: Server, admin: redis.Redis, name: str) -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, client_name=name)
    namespace = unique_namespace()

    async def main() -> int:
        async with AsyncRedisRunStore(client, namespace=namespace) as store, \
                AsyncRedisRepository(client, namespace=namespace) as repo:
            await asyncio.gather(*(store.insert(f"r{i}", b"{}", Release())
                                   for i in range(8)))
            assert await repo.load("nothing") is None
            during = connected(admin, name)
        await client.aclose()
        return during

    assert asyncio.run(main()) > 0
    assert settles_at(admin, name, 0) == 0


def test_one_async_client_serves_one_event_loop_after_another(server: Server) -> None:
    # asyncio.run twice with one client (a script, or a test runner's loop per test): an
    # idle connection of the first loop must never be handed to a call on the second.
    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    store = AsyncRedisRunStore(client, namespace=unique_namespace())

    async def insert(prefix: str) -> None:
        await asyncio.gather(*(store.insert(f"{prefix}{i}", b"{}", Release())
                               for i in range(4)))

    async def read(prefix: str) -> list[int]:
        return [(await store.get(f"{prefix}{i}")).revision for i in range(4)]

    for round_ in range(3):
        asyncio.run(insert(f"loop{round_}-"))
        assert asyncio.run(read(f"loop{round_}-")) == [1, 1, 1, 1]


def test_pools_of_closed_loops_are_let_go(server: Server, admin: redis.Redis,
                                          name: str) -> None:
    # asyncio.run after asyncio.run with one client, never aclose(): each loop's pool is
    # dropped once the loop is closed and another runs, and its connections with it.
    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, client_name=name)
    store = AsyncRedisRunStore(client, namespace=unique_namespace())

    async def insert(prefix: str) -> None:
        await asyncio.gather(*(store.insert(f"{prefix}{i}", b"{}", Release())
                               for i in range(4)))

    for round_ in range(10):
        asyncio.run(insert(f"loop{round_}-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    # The last loop's four, not forty (at most two loops' worth while the collector runs).
    assert connected(admin, name) <= 8
    assert settles_at(admin, name, 4) <= 8


def test_a_socket_whose_shutdown_raises_leaves_the_watchdog_running() -> None:
    from redisstore.shells.sync import Watchdog

    class Sock:
        def __init__(self, error: Exception | None) -> None:
            self.error, self.shut = error, False

        def shutdown(self, how: int) -> None:
            self.shut = True
            if self.error is not None:
                raise self.error

    class Conn:
        def __init__(self, error: Exception | None) -> None:
            self._sock = Sock(error)

    dog = Watchdog()
    bad, good = Conn(ValueError("generator already executing")), Conn(None)
    # Both armed before the first fires: the second must fire after the first raised.
    dog.arm(good, time.monotonic() + 0.1)
    dog.arm(bad, time.monotonic())
    deadline = time.monotonic() + 5
    while not good._sock.shut and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bad._sock.shut and good._sock.shut
    assert dog._thread is not None and dog._thread.is_alive()
