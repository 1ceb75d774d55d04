"""Dependencies across partitions (a run waiting ``Changed(dep)`` with dep in another
partition): every announcement delivered or a token left for the next claim, watches and
mirror entries that go with their last waiter, damage that is quarantined or logged and
never loses an announcement, and keys bounded before they are read."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.cluster import RedisCluster
from servers import Server, redis_binary, start, start_cluster, unique_namespace
from test_conformance_async import LoopThread

from redisstore import AsyncRedisRunStore, RedisRunStore, Release
from redisstore.discovery import json_wait
from redisstore.keys import Keyspace
from redisstore.partitions import partition_of

LONG = 600_000


def rec(wait: dict[str, Any] | None) -> bytes:
    return json.dumps({"wait": wait}).encode()


def in_partition(prefix: str, p: int, n: int, skip: int = 0) -> str:
    """A run id of partition ``p`` of ``n`` (the ``skip``-th one found)."""
    found = [f"{prefix}{i}" for i in range(10_000) if partition_of(f"{prefix}{i}", n) == p]
    return found[skip]


# ---------------------------------------------------------------- foreign outbox entries


@pytest.mark.parametrize("dependency", ["x" * 2049, "\u00e9" * 1025])
def test_an_outbox_entry_naming_no_possible_run_is_removed_and_warned_once(
        dependency: str, caplog: pytest.LogCaptureFixture) -> None:
    """An entry whose dependency fails the run-id checks (over MAX_TEXT bytes of UTF-8) can
    never be a run of ours: the first claim removes it, warning once and naming it; the
    next claims pay nothing for it."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    store.insert("seed", rec(None), Release())
    home = Keyspace(ns, 0)
    client.zadd(home.prefix + "outbox", {f"1|{dependency}".encode(): 4})
    with caplog.at_level(logging.WARNING, logger="redisstore"):
        for _ in range(3):
            assert store.claim_ready("a", LONG, 10) == []
    assert client.zcard(home.prefix + "outbox") == 0
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "outbox" in warned[0].getMessage()


# ---------------------------------------------------------------- servers: blocked claims


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Server]]]:
    """One server and a three-primary cluster, for the module."""
    single = start(redis_binary(), "redis-server", tmp_path_factory.mktemp("one"))
    cluster: list[Server] = []
    try:
        cluster = start_cluster(redis_binary(), tmp_path_factory.mktemp("cluster"))
        yield {"server": [single], "cluster": cluster}
    finally:
        for server in [single, *cluster]:
            server.kill()


class Shell:
    """A store of 3 partitions through the sync or the asyncio client, on one server or the
    cluster, with sync calls (the asyncio store's on a loop thread of its own)."""

    def __init__(self, shell: str, where: str, servers: list[Server], namespace: str) -> None:
        port = servers[0].port
        self.loop: LoopThread | None = None
        self.raw: Any = (RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
                         if where == "cluster" else redis.Redis(port=port, socket_timeout=10))
        if shell == "sync":
            self.client: Any = self.raw
            self.store: Any = RedisRunStore(self.raw, namespace=namespace, discover=json_wait,
                                            partitions=3)
        else:
            self.loop = LoopThread()

            async def make() -> Any:
                if where == "cluster":
                    return redis.asyncio.RedisCluster(host="127.0.0.1", port=port,
                                                      socket_timeout=10)
                return redis.asyncio.Redis(port=port, socket_timeout=10)

            self.client = self.loop.run(make())
            self.store = AsyncRedisRunStore(self.client, namespace=namespace,
                                            discover=json_wait, partitions=3)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(self.store, name)(*args, **kwargs)
        return got if self.loop is None else self.loop.run(got)

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
        else:
            self.loop.run(self.store.aclose())
            self.loop.run(self.client.aclose())
            self.loop.stop()
        self.raw.close()


@pytest.mark.server
@pytest.mark.parametrize("shell", ["sync", "asyncio"])
@pytest.mark.parametrize("where", ["server", "cluster"])
def test_a_blocked_claim_finds_a_waiter_behind_a_big_outbox_at_once(
        backends: dict[str, list[Server]], where: str, shell: str) -> None:
    """An outbox of more entries than a claim reads (2,000 deliveries that make nothing
    claimable), then a waiter's dependency written in another partition: a claim blocked
    before that write gets the waiter within 2 s, where it slept its whole re-arm (10 s)
    once its one claim's 100 entries missed it. Twice, each a fresh pair."""
    from redisstore.conformance.wakeups import Blocked

    ns = unique_namespace("deps-wake")
    io = Shell(shell, where, backends[where], ns)
    try:
        home = Keyspace(ns, 0)
        for round_ in range(2):
            dep = in_partition("dep", 0, 3, round_)
            waiter = in_partition("waiter", 1, 3, round_)
            io.call("insert", dep, rec(None), Release())
            io.call("insert", waiter, rec({"changed": dep, "seen": 1}), Release())
            assert io.call("claim_ready", "me", LONG, 10) == []
            # Deliveries that make nothing claimable: their dependencies have no waiter.
            io.raw.zadd(home.prefix + "outbox",
                        {f"1|ghost-{round_}-{i}": 2 for i in range(2000)})
            blocked = Blocked(lambda: io.call("claim_ready", "me", LONG, 1, block=5000))
            time.sleep(0.5)  # the claim is blocked
            since = time.monotonic()
            io.call("compare_and_set", dep, 1, rec(None), Release())
            assert blocked.get() == [waiter]
            assert blocked.returned - since < 2.0, blocked.returned - since
            io.raw.delete(home.prefix + "outbox")
    finally:
        io.close()


@pytest.mark.parametrize("deliverable", [True, False])
def test_a_claim_leaves_a_token_for_an_outbox_it_could_not_read_whole(
        deliverable: bool) -> None:
    """A claim that delivered some of a bigger outbox leaves a wake-up token there (the
    next blocked claim goes on); one whose deliveries all failed (the waiters' partition
    unreachable: here its fanout of another type) leaves none, so no claim loops on it."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    store.insert("seed", rec(None), Release())
    home = Keyspace(ns, 0)
    client.zadd(home.prefix + "outbox", {f"1|ghost-{i}": 2 for i in range(150)})
    if not deliverable:
        client.set(Keyspace(ns, 1).fanout, "not a sorted set")
    client.delete(home.wake("ready"))
    assert store.claim_ready("a", LONG, 10) == []
    tokens = {t.decode() for t in client.zrange(home.wake("ready"), 0, -1)}
    assert ("~outbox" in tokens) is deliverable
    assert client.zcard(home.prefix + "outbox") == (50 if deliverable else 150)
