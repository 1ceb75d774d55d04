"""Each partition of a store of partitions records the count, and every script compares it
with the store's: a store opened before a repartition is refused within its next call, a
new store needs no single node to open (not the one of the namespace's own count key), and
the meta fields every call reads are bounded before they are read."""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis.asyncio
from redis.cluster import RedisCluster
from servers import Server, redis_binary, start, start_cluster, unique_namespace

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    Corrupt,
    Hold,
    InstanceRecord,
    Misconfigured,
    RedisRepository,
    RedisRunStore,
    Release,
    repartition,
    repartition_repository,
)
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of

LONG = 600_000


def keys_of(client: Any) -> dict[bytes, Any]:
    """Every key and its dump: to show that nothing was written."""
    return {key: client.dump(key) for key in client.keys("*")}


def in_partitions(count: int, wanted: set[int], prefix: str = "r") -> list[str]:
    """Run ids, one in each partition of ``wanted`` of a store of ``count``."""
    found: dict[int, str] = {}
    i = 0
    while set(found) != wanted:
        p = partition_of(f"{prefix}{i}", count)
        if p in wanted:
            found.setdefault(p, f"{prefix}{i}")
        i += 1
    return [found[p] for p in sorted(wanted)]


# ---------------------------------------------------------------------------- defect: stale


@pytest.mark.parametrize("counts", [(6, 3), (3, 6), (4, 1)])
def test_a_store_opened_before_a_repartition_is_refused_within_its_next_call(
        counts: tuple[int, int]) -> None:
    """The misuse the docs forbid (an engine left running through the step): its store,
    which checked the namespace's count once, is refused by the partition it calls next,
    with nothing written, instead of writing a second record of an id beside the new
    store's."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    before, to = counts
    stale = RedisRunStore(client, namespace=ns, partitions=before)
    for run in in_partitions(before, set(range(before)), "old"):
        stale.insert(run, b"r", Release())  # counted: it never reads the count key again
    repartition(client, ns, to)
    fresh = RedisRunStore(client, namespace=ns, partitions=to)
    fresh.insert("x", b"new", Claim("fresh", LONG))
    written = keys_of(client)
    with pytest.raises(Misconfigured, match=f"partitions={before}.*partitions={to}"):
        stale.insert("x", b"stale", Claim("stale", LONG))
    for call in (lambda: stale.get("x"), lambda: stale.claim_ready("stale", LONG, 10),
                 lambda: stale.renew("stale", ["x"], LONG),
                 lambda: stale.compare_and_set("old0", 1, b"r", Release())):
        with pytest.raises(Misconfigured):
            call()
    assert keys_of(client) == written
    assert fresh.get("x").record == b"new"


def test_an_async_store_opened_before_a_repartition_is_refused_too() -> None:
    async def main() -> None:
        shared = fakeredis.FakeServer()
        client = fakeredis.FakeAsyncRedis(server=shared)
        ns = unique_namespace()
        stale = AsyncRedisRunStore(client, namespace=ns, partitions=6)
        for run in in_partitions(6, set(range(6)), "old"):
            await stale.insert(run, b"r", Release())
        repartition(fakeredis.FakeRedis(server=shared), ns, 3)
        fresh = AsyncRedisRunStore(client, namespace=ns, partitions=3)
        await fresh.insert("x", b"new", Release())
        with pytest.raises(Misconfigured, match="partitions=3"):
            await stale.insert("x", b"stale", Release())
        assert (await fresh.get("x")).record == b"new"

    asyncio.run(main())


def test_a_repartition_under_way_refuses_stores_in_every_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from redisstore.core.runops import RunOps

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    stale = RedisRunStore(client, namespace=ns, partitions=3)
    for run in in_partitions(3, {0, 1, 2}):
        stale.insert(run, b"r", Release())
    real = RunOps.delete

    def dies(self: RunOps, run: str, expected: int, lease: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(RunOps, "delete", dies)
    with pytest.raises(KeyboardInterrupt):
        repartition(client, ns, 5)
    monkeypatch.setattr(RunOps, "delete", real)
    for count in (3, 5):
        store = RedisRunStore(client, namespace=ns, partitions=count)
        with pytest.raises(Misconfigured, match="being repartitioned"):
            store.get("r0")
    with pytest.raises(Misconfigured, match="being repartitioned"):
        stale.insert("new", b"r", Release())
    repartition(client, ns, 5)
    store = RedisRunStore(client, namespace=ns, partitions=5)
    assert store.get("r0").record == b"r"


def test_partitions_record_the_count_on_their_first_write_after_the_check() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, partitions=4)
    (run,) = in_partitions(4, {2})
    store.insert(run, b"r", Release())
    assert client.hget(Keyspace(ns).meta, "partitions") == b"4"
    assert client.hget(Keyspace(ns, 2).meta, "partitions") == b"4"
    assert client.hget(Keyspace(ns, 1).meta, "partitions") is None
    # A store of another count: refused by the partition alone, the count key unread.
    client.hset(Keyspace(ns).meta, "partitions", "x")  # would be Corrupt if it were read
    with pytest.raises(Misconfigured, match=r"spread over 4 partitions.*partitions=3"):
        RedisRunStore(client, namespace=ns, partitions=3).get(in_partitions(3, {2})[0])
    assert RedisRunStore(client, namespace=ns, partitions=4).get(run).record == b"r"


@pytest.mark.parametrize("counts", [(3, 6), (6, 2), (4, 1)])
def test_a_repository_opened_before_its_repartition_is_refused_within_its_next_call(
        counts: tuple[int, int]) -> None:
    """The repository's partitions record its count as the run store's do: a repository
    left open through repartition_repository is refused by its next call, nothing written,
    instead of saving a second record of an id beside the new repository's."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    before, to = counts
    stale = RedisRepository(client, namespace=ns, partitions=before)
    stale.register_group("g")
    for id in in_partitions(before, set(range(before)), "old"):
        stale.save(InstanceRecord(id=id, group="g", payload=b"p"))
    repartition_repository(client, ns, to)
    fresh = RedisRepository(client, namespace=ns, partitions=to)
    fresh.save(InstanceRecord(id="x", group="g", payload=b"new"))
    written = keys_of(client)
    with pytest.raises(Misconfigured, match=f"partitions={before}.*partitions={to}"):
        stale.save(InstanceRecord(id="x", group="g", payload=b"stale"))
    for call in (lambda: stale.load("x"), lambda: stale.delete("old0"),
                 lambda: stale.list_in_flight("g"), lambda: stale.register_group("h")):
        with pytest.raises(Misconfigured):
            call()
    assert keys_of(client) == written
    loaded = fresh.load("x")
    assert loaded is not None and loaded.payload == b"new"


# ---------------------------------------------------------------------------- meta bounded


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    own = start(redis_binary(), "redis-server", tmp_path_factory.mktemp("count"))
    yield own
    own.kill()


@pytest.mark.server
@pytest.mark.parametrize("field", ["layout", "layout-without-v5", "old-ix", "partitions"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_a_planted_big_meta_field_answers_corrupt_at_once(server: Server, field: str,
                                                          partitions: int) -> None:
    """A planted 32 MB value in a meta field a call reads is bounded (HSTRLEN) before it
    is read, so the call answers Corrupt without stalling the server. A field it does not
    read costs nothing: ``layout`` once ``v5`` marks the meta key (one HEXISTS decides),
    ``partitions`` in a namespace of one partition marked ``v5`` (a repartition takes the
    mark away first), and ``old-ix`` of layouts before 5 (only migrate() reads those)."""
    client = server.client()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, partitions=partitions)
    store.insert("r", b"r", Release())
    meta = store._ops.part("r").keys.meta if partitions > 1 else Keyspace(ns).meta
    name = field.removesuffix("-without-v5")
    if name != field:
        assert client.hdel(meta, "v5") == 1
    client.hset(meta, name, b"1" * (32 << 20))
    read = field == "layout-without-v5" or (field == "partitions" and partitions > 1)
    times = []
    for _ in range(5):
        start_at = time.perf_counter()
        if read:
            with pytest.raises(Corrupt, match=f"meta.{name}"):
                store.get("r")
        else:
            assert store.get("r").record == b"r"
        times.append(time.perf_counter() - start_at)
    print(f"planted 32 MB meta.{field}, partitions={partitions}: get answers in "
          f"{statistics.median(times) * 1000:.2f} ms (median of 5)")
    assert statistics.median(times) < 0.015  # reading it whole took 130 ms
    client.delete(meta)


# ---------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    # Healthy nodes serve their slots while one is hung (past the node timeout too).
    coverage = ("--cluster-require-full-coverage", "no")
    servers = start_cluster(redis_binary(), Path(tmp_path_factory.mktemp("cluster")),
                            extra={i: coverage for i in range(3)})
    yield servers
    for one in servers:
        one.kill()


def _node_of(client: RedisCluster, key: str) -> int:
    port: int = client.get_node_from_key(key).port
    return port


@pytest.mark.server
@pytest.mark.slow
def test_a_stale_async_store_is_refused_on_the_cluster(cluster: list[Server]) -> None:
    sync = RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=10)
    ns = unique_namespace()

    async def main() -> None:
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster[1].port)
        try:
            stale = AsyncRedisRunStore(client, namespace=ns, partitions=3)
            for run in in_partitions(3, {0, 1, 2}, "old"):
                await stale.insert(run, b"r", Release())
            repartition(sync, ns, 6)
            fresh = AsyncRedisRunStore(client, namespace=ns, partitions=6)
            await fresh.insert("x", b"new", Release())
            with pytest.raises(Misconfigured, match=r"partitions=3.*partitions=6"):
                await stale.insert("x", b"stale", Release())
            assert (await fresh.get("x")).record == b"new"
        finally:
            await client.aclose()

    asyncio.run(main())
    holders = [p for p in range(6) if sync.exists(Keyspace(ns, p).run("x"))]
    assert holders == [partition_of("x", 6)]


@pytest.mark.server
@pytest.mark.slow
def test_a_stale_store_is_refused_on_the_cluster(cluster: list[Server]) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=10)
    ns = unique_namespace()
    stale = RedisRunStore(client, namespace=ns, partitions=6)
    for run in in_partitions(6, set(range(6)), "old"):
        stale.insert(run, b"r", Release())
    repartition(client, ns, 3)
    fresh = RedisRunStore(client, namespace=ns, partitions=3)
    fresh.insert("x", b"new", Claim("fresh", LONG))
    with pytest.raises(Misconfigured, match=r"partitions=6.*partitions=3"):
        stale.insert("x", b"stale", Claim("stale", LONG))
    holders = [p for p in range(6) if client.exists(Keyspace(ns, p).run("x"))]
    assert holders == [partition_of("x", 3)]
    assert fresh.get("x").record == b"new"


@pytest.mark.server
@pytest.mark.slow
def test_a_new_store_opens_while_the_count_keys_node_hangs(cluster: list[Server]) -> None:
    """The node of the namespace's own key ({ns}, its count) stopped: a store (and a
    repository) opened now reads and writes runs (records) in the partitions of the other
    nodes, which record the count."""
    ports = [one.port for one in cluster[:3]]
    probe = RedisCluster(host="127.0.0.1", port=ports[0], socket_timeout=10)
    ns = ""
    for _ in range(100):
        ns = unique_namespace()
        hung = _node_of(probe, Keyspace(ns).meta)
        healthy = {p for p in range(6) if _node_of(probe, Keyspace(ns, p).meta) != hung}
        if len(healthy) >= 2:
            break
    old = RedisRunStore(probe, namespace=ns, partitions=6)
    runs = in_partitions(6, set(range(6)))
    for run in runs:
        old.insert(run, b"r", Claim("a", LONG))
    records = RedisRepository(probe, namespace=ns, partitions=6)
    records.register_group("g")
    for id in runs:
        records.save(InstanceRecord(id=id, group="g", payload=b"p"))
    victim = next(one for one in cluster if one.port == hung)
    started = next(p for p in ports if p != hung)
    client = RedisCluster(host="127.0.0.1", port=started, socket_timeout=10)
    new = in_partitions(6, healthy, "n")
    victim.process.send_signal(signal.SIGSTOP)
    try:
        store = RedisRunStore(client, namespace=ns, partitions=6, timeout=1000)
        took = time.perf_counter()
        for p in sorted(healthy):
            run = runs[p]
            assert store.get(run).revision == 1
            store.compare_and_set(run, 1, b"r2", Hold("a"))
            assert store.get(run).record == b"r2"
        for run in new:
            assert store.insert(run, b"n", Release()) == 1
        repository = RedisRepository(client, namespace=ns, partitions=6, timeout=1000)
        for p in sorted(healthy):
            loaded = repository.load(runs[p])
            assert loaded is not None
            repository.save(InstanceRecord(id=runs[p], group="g", payload=b"p2",
                                           rec_version=loaded.rec_version))
        took = time.perf_counter() - took
        calls = 3 * len(healthy) + len(new) + 2 * len(healthy)
        print(f"count key's node hung: {calls} calls in {len(healthy)} healthy partitions "
              f"took {took * 1000:.0f} ms in all")
        assert took < 2.0, took  # not one call waited for the hung node
    finally:
        victim.process.send_signal(signal.SIGCONT)


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["store", "async store"])
def test_each_partitions_node_is_checked_before_its_first_write(cluster: list[Server],
                                                                kind: str) -> None:
    """The eviction check of a store of partitions on a cluster asks the node of the
    partition written (it asked partition 0's node only: an evicting node went unseen)."""
    probe = RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=10)
    ns = unique_namespace()
    zero = _node_of(probe, Keyspace(ns, 0).meta)
    evicting = next(one.port for one in cluster[:3] if one.port != zero)
    p = next(p for p in range(6) if _node_of(probe, Keyspace(ns, p).meta) == evicting)
    (run,) = in_partitions(6, {p})
    (safe,) = in_partitions(6, {0})
    direct = redis.Redis(host="127.0.0.1", port=evicting)
    direct.config_set("maxmemory-policy", "allkeys-lru")
    try:
        if kind == "store":
            store = RedisRunStore(probe, namespace=ns, partitions=6)
            store.insert(safe, b"x", Release())
            with pytest.raises(Misconfigured, match="allkeys-lru"):
                store.insert(run, b"x", Release())
        else:
            async def insert() -> None:
                client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster[0].port)
                try:
                    store = AsyncRedisRunStore(client, namespace=ns, partitions=6)
                    await store.insert(safe, b"x", Release())
                    with pytest.raises(Misconfigured, match="allkeys-lru"):
                        await store.insert(run, b"x", Release())
                finally:
                    await client.aclose()
            asyncio.run(insert())
        assert not probe.exists(Keyspace(ns, p).run(run))
    finally:
        direct.config_set("maxmemory-policy", "noeviction")
        direct.close()
