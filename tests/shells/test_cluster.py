"""Both ports on a real Redis Cluster (three primaries started by a fixture) through
``redis.cluster.RedisCluster`` and ``redis.asyncio.RedisCluster``: each namespace lives in
one slot, on one node, and its scripts, clock and indexes are that node's."""

from __future__ import annotations

import asyncio
import collections
import gc
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from aio_suites import (
    AsyncRepositorySuite,
    AsyncRunSuite,
    LoopThread,
)
from conftest import RedisSuite
from redis.cluster import RedisCluster
from servers import (
    SUITE_TIMEOUT,
    Server,
    finish_migration,
    migrate_keys,
    redis62_binary,
    redis_binary,
    start_cluster,
    start_migration,
    unique_namespace,
    valkey_binary,
)

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    Hold,
    RedisRepository,
    RedisRunStore,
    Release,
    Repository,
    Unavailable,
)
from redisstore.conformance import RepositoryConformance
from redisstore.core.keys import Keyspace

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    servers = start_cluster(redis_binary(), tmp_path_factory.mktemp("cluster"))
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture
def cluster_client(cluster: list[Server]) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=10)
    yield client
    client.close()  # its connections to every node, now rather than at exit


class TestClusterRunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, cluster_client: RedisCluster) -> None:
        self.client = cluster_client


class TestClusterRunStorePartitioned(TestClusterRunStore):
    """One logical store over 6 partitions, hence over the three primaries."""

    partitions = 6


class TestClusterRepository(RepositoryConformance):
    partitions = 1

    @pytest.fixture(autouse=True)
    def _backend(self, cluster_client: RedisCluster) -> None:
        self.client = cluster_client

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        return RedisRepository(self.client, namespace=unique_namespace(),
                               max_terminal=max_terminal, logger=logger,
                               partitions=self.partitions, timeout=SUITE_TIMEOUT)


class TestClusterRepositoryPartitioned(TestClusterRepository):
    """One logical repository over 6 partitions, hence over the three primaries."""

    partitions = 6


def async_cluster(cluster: list[Server]) -> Any:
    return redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=10)


class TestAsyncClusterRunStore(AsyncRunSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, cluster: list[Server]) -> Iterator[None]:
        yield from self.connect(loop_thread, lambda: async_cluster(cluster))


class TestAsyncClusterRunStorePartitioned(TestAsyncClusterRunStore):
    partitions = 6


class TestAsyncClusterRepository(AsyncRepositorySuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, cluster: list[Server]) -> Iterator[None]:
        yield from self.connect(loop_thread, lambda: async_cluster(cluster))


class TestAsyncClusterRepositoryPartitioned(TestAsyncClusterRepository):
    partitions = 6


def test_namespaces_spread_over_the_nodes_and_keep_to_their_slot(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    holders: set[int] = set()
    for i in range(12):
        namespace = f"spread-{i}"
        store = RedisRunStore(cluster_client, namespace=namespace)
        store.insert("run", b"r1", Claim("me", 60_000))
        store.compare_and_set("run", 1, b"r2", Hold("me"))
        slot = cluster_client.keyslot(Keyspace(namespace).leases)
        node = cluster_client.get_node_from_key(Keyspace(namespace).leases)
        holders.add(node.port)
        # Every key of the namespace is on that node, in that slot.
        keys = cluster_client.get_redis_connection(node).keys("{" + namespace + "}:*")
        assert keys and all(cluster_client.keyslot(k) == slot for k in keys)
    assert len(holders) >= 2  # namespaces did land on different nodes


@pytest.mark.parametrize("partitions", [1, 6])
def test_a_closed_cluster_client_is_collected_after_its_stores_used_it(
        cluster: list[Server], partitions: int) -> None:
    """The stores' per-client state (pools, muxes, node sources) lives on the client: a
    module-level table keyed by it kept every cluster client alive, with its sockets (its
    connection settings refer back to it), so a process making clients leaked each one.
    (A blocked claim's waker thread holds the client until its BZPOPMIN ends: not here.)"""

    def sync_use() -> weakref.ref[Any]:
        client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
        store = RedisRunStore(client, namespace=unique_namespace(), partitions=partitions)
        store.insert("run", b"r", Claim("me", 60_000))
        store.renew("me", ["run"], 60_000)
        assert store.claim_ready("me", 1000, 5) == []
        store.close()
        client.close()
        return weakref.ref(client)

    async def async_use() -> weakref.ref[Any]:
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster[0].port)
        store = AsyncRedisRunStore(client, namespace=unique_namespace(),
                                   partitions=partitions)
        await store.insert("run", b"r", Claim("me", 60_000))
        await store.renew("me", ["run"], 60_000)
        assert await store.claim_ready("me", 1000, 5) == []
        await store.aclose()
        await client.aclose()
        return weakref.ref(client)

    refs = [sync_use(), asyncio.run(async_use())]
    gc.collect()
    assert [ref() is None for ref in refs] == [True, True]


@pytest.mark.parametrize("kind", ["store", "repository", "async store"])
def test_the_eviction_check_asks_the_node_of_the_namespace(
        cluster: list[Server], cluster_client: RedisCluster, kind: str) -> None:
    """On a cluster the server check reads the settings of the namespace's own node (it
    asked the node of slot 0, whatever the namespace: an evicting node went unseen)."""
    from redisstore import Misconfigured

    zero = cluster_client.get_node_from_key("")  # the node a keyless INFO went to
    namespace = next(ns for ns in (unique_namespace() for _ in range(100))
                     if cluster_client.get_node_from_key(Keyspace(ns).leases).port
                     != zero.port)
    node = cluster_client.get_node_from_key(Keyspace(namespace).leases)
    direct = redis.Redis(host="127.0.0.1", port=node.port)
    direct.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(Misconfigured, match="allkeys-lru"):
            if kind == "store":
                RedisRunStore(RedisCluster(host="127.0.0.1", port=cluster[0].port),
                              namespace=namespace).insert("r", b"x", Release())
            elif kind == "repository":
                RedisRepository(RedisCluster(host="127.0.0.1", port=cluster[0].port),
                                namespace=namespace).migrate()
            else:
                async def insert() -> None:
                    client = async_cluster(cluster)
                    try:
                        await AsyncRedisRunStore(client, namespace=namespace).insert(
                            "r", b"x", Release())
                    finally:
                        await client.aclose()
                asyncio.run(insert())
    finally:
        direct.config_set("maxmemory-policy", "noeviction")
        direct.close()


def movable_namespace(cluster_client: RedisCluster) -> tuple[str, int, Any]:
    """A namespace whose slot holds no keys, its slot and the node that has it: SETSLOT
    moves only an empty slot, and other tests' namespaces may share a random one."""
    while True:
        namespace = unique_namespace("moving")
        key = Keyspace(namespace).leases
        slot = cluster_client.keyslot(key)
        owner = cluster_client.get_node_from_key(key)
        if cluster_client.get_redis_connection(owner).execute_command(
                "CLUSTER", "COUNTKEYSINSLOT", slot) == 0:
            return namespace, slot, owner


def move_slot(cluster: list[Server], slot: int, owner: Any) -> Server:
    """Give the (empty) slot to another node; return that node."""
    target = next(s for s in cluster if s.port != owner.port)
    target_id = target.client().execute_command("CLUSTER", "MYID")
    for server in cluster:
        server.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return target


def test_a_moved_slot_is_followed_within_the_call(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    namespace, slot, owner = movable_namespace(cluster_client)
    store = RedisRunStore(cluster_client, namespace=namespace)
    assert store.now() > 0  # the client knows where the slot is
    target = move_slot(cluster, slot, owner)
    # MOVED: nothing ran on the old owner, so the call goes to the new one, once.
    assert store.insert("run", b"r1", Claim("me", 60_000)) == 1
    assert target.client().exists(Keyspace(namespace).run("run")) == 1
    assert store.get("run").revision == 1
    # The client learns the new layout in the background (the call kept its deadline).
    deadline = time.monotonic() + 5
    while cluster_client.get_node_from_key(Keyspace(namespace).leases).port != target.port:
        assert time.monotonic() < deadline, "the client never learnt the slot's new node"
        time.sleep(0.05)


def test_an_async_store_follows_a_moved_slot_as_the_sync_one(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    namespace, slot, owner = movable_namespace(cluster_client)

    async def main() -> Server:
        client = async_cluster(cluster)
        try:
            store = AsyncRedisRunStore(client, namespace=namespace)
            assert await store.now() > 0  # the client knows where the slot is
            target = move_slot(cluster, slot, owner)
            assert await store.insert("run", b"r1", Claim("me", 60_000)) == 1
            assert await store.renew("me", ["run"], 60_000) == ["run"]
            await store.aclose()
            return target
        finally:
            await client.aclose()

    target = asyncio.run(main())
    assert target.client().exists(Keyspace(namespace).run("run")) == 1


def slot_dump(servers: list[Server], slot: int) -> dict[tuple[int, bytes], bytes]:
    """Every key of ``slot`` on each server, with its serialized value."""
    out: dict[tuple[int, bytes], bytes] = {}
    for server in servers:
        client = server.client(single_connection_client=True)
        for key in client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100_000):
            client.execute_command("ASKING")  # the importing node serves it behind ASKING
            out[(server.port, key)] = client.dump(key)
        client.close()
    return out


def test_calls_on_a_migrating_slot_are_not_applied_until_it_has_moved(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    """Mid-migration a namespace's keys are split between two nodes, and no script can run
    safely on either: the old owner answers TRYAGAIN (some keys a call names are gone, or
    were never there) or ASK (all gone), and ASK is not followed (the importing node lacks
    the keys still to come). Each such call is Unavailable, not applied, nothing written
    anywhere; a read whose keys are all still there runs. Once the slot has moved, MOVED is
    followed and the calls go on."""
    namespace, slot, owner = movable_namespace(cluster_client)
    keys = Keyspace(namespace)
    store = RedisRunStore(cluster_client, namespace=namespace)
    for run in ("a", "b"):
        store.insert(run, b"1", Claim("me", 60_000))
    source, target = start_migration(cluster, slot, owner)

    def refused(call: Any, code: str) -> None:
        before = slot_dump(cluster, slot)
        with pytest.raises(Unavailable) as caught:
            call()
        assert caught.value.outcome == "not_applied", caught.value
        assert code in caught.value.reason, caught.value.reason
        assert slot_dump(cluster, slot) == before

    try:
        assert store.get("a").record == b"1"  # its keys are all on the old owner
        # compare_and_set names the layout 3 indexes, which layout 4 never made: the old
        # owner cannot tell them from moved keys.
        refused(lambda: store.compare_and_set("a", 1, b"2", Hold("me")), "TRYAGAIN")
        migrate_keys(source, target, [keys.run("a").encode()])
        refused(lambda: store.get("a"), "TRYAGAIN")  # its hash moved, the meta not
        assert store.get("b").record == b"1"
        rest = source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        migrate_keys(source, target, list(rest))
        refused(lambda: store.get("b"), "ASK")
        refused(lambda: store.renew("me", ["a", "b"], 60_000), "ASK")
    finally:
        finish_migration(cluster, slot, target)
    store.compare_and_set("a", 1, b"2", Hold("me"))  # MOVED, followed
    assert store.renew("me", ["a", "b"], 60_000) == ["a", "b"]
    assert target.client().exists(keys.run("a"), keys.run("b")) == 2


def test_a_store_refuses_a_cluster_client_of_the_other_kind(cluster: list[Server],
                                                             cluster_client: RedisCluster
                                                             ) -> None:
    with pytest.raises(TypeError, match="sync cluster client: use RedisRunStore"):
        AsyncRedisRunStore(cluster_client)

    async def main() -> None:
        client = async_cluster(cluster)
        try:
            with pytest.raises(TypeError, match="asyncio cluster client: use AsyncRedisRunStore"):
                RedisRunStore(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_pipelines_go_to_the_namespace_node(cluster: list[Server],
                                            cluster_client: RedisCluster) -> None:
    stores = [RedisRunStore(cluster_client, namespace=f"piped-{i}") for i in range(6)]
    for i, store in enumerate(stores):
        with store.pipeline() as pipe:
            inserted = [pipe.insert(f"run-{n}", f"{i}/{n}".encode(), Claim("me", 60_000))
                        for n in range(4)]
            read = pipe.get("run-0")
        assert all(p.result() == 1 for p in inserted)
        assert read.result().record == f"{i}/0".encode()
        assert store.renew("me", [f"run-{n}" for n in range(4)], 60_000) == [
            f"run-{n}" for n in range(4)]
    nodes = {cluster_client.get_node_from_key(Keyspace(s.namespace).leases).port
             for s in stores}
    assert len(nodes) >= 2  # the pipelines did go to different nodes


def test_a_blocked_claim_follows_its_slot_to_another_node(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    """A slot moved while a claim is blocked on it: the waker's BZPOPMIN is redirected
    (MOVED), it waits on the new node, and a run made ready there wakes the claim."""
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import SLACK, Blocked
    from redisstore.discovery import json_wait

    namespace, slot, owner = movable_namespace(cluster_client)
    store = RedisRunStore(cluster_client, namespace=namespace, discover=json_wait)
    blocked = Blocked(lambda: store.claim_ready("me", 60_000, 1, block=10_000))
    time.sleep(0.3)
    target = move_slot(cluster, slot, owner)
    for _ in range(3):  # the first call after the move may answer MOVED
        try:
            store.insert("run", rec({"at": 0}), Release())
            break
        except Unavailable:
            time.sleep(0.1)
    since = time.monotonic()
    assert blocked.get() == ["run"]
    assert blocked.returned - since < SLACK + 1.0  # the server's tick redirects the waker
    assert target.client().exists(Keyspace(namespace).run("run")) == 1


def test_doctor_on_a_cluster_node_checks_the_namespace_on_its_slot_and_the_clocks(
        cluster: list[Server], capsys: pytest.CaptureFixture[str]) -> None:
    from redisstore import __main__ as cli

    namespace = unique_namespace("doctor")
    # Whichever node the URL names, the namespace's calls go to its slot's node.
    for server in cluster:
        code = cli.main(["doctor", "--url", f"redis://127.0.0.1:{server.port}/0",
                         "--namespace", namespace])
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"namespace '{namespace}': the store runs" in out
        assert "the 3 primaries' clocks are" in out, out


def test_valkey_py_cluster_clients_serve_a_store(cluster: list[Server]) -> None:
    """valkey-py's ValkeyCluster (sync: it names its node clients get_valkey_connection) and
    its asyncio one, on the same cluster."""
    from valkey.asyncio import ValkeyCluster as AsyncValkeyCluster
    from valkey.cluster import ValkeyCluster

    sync_client = ValkeyCluster(host="127.0.0.1", port=cluster[0].port)
    store = RedisRunStore(sync_client, namespace=unique_namespace("valkey-py"))
    assert store.insert("run", b"r1", Claim("me", 60_000)) == 1
    store.compare_and_set("run", 1, b"r2", Hold("me"))
    assert store.get("run").record == b"r2"
    assert store.renew("me", ["run"], 60_000) == ["run"]

    async def main() -> bytes:
        client = AsyncValkeyCluster(host="127.0.0.1", port=cluster[0].port)
        try:
            astore = AsyncRedisRunStore(client, namespace=unique_namespace("valkey-py"))
            assert await astore.insert("run", b"a1", Claim("me", 60_000)) == 1
            record = (await astore.get("run")).record
            await astore.aclose()
            return record
        finally:
            await client.aclose()

    assert asyncio.run(main()) == b"a1"


def test_two_nodes_naming_each_other_mid_setslot_are_each_tried_once(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    """The old owner was told the slot is the target's before the target was: the old
    owner answers MOVED to the target, the target (still importing) MOVED back. The call
    tries each node once and is not applied; once the target knows, it goes there."""
    from servers import node_id

    namespace, slot, owner = movable_namespace(cluster_client)
    store = RedisRunStore(cluster_client, namespace=namespace)
    store.insert("run", b"r1", Claim("me", 60_000))
    source, target = start_migration(cluster, slot, owner)
    keys = source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    migrate_keys(source, target, list(keys))
    source.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
    def evalsha(server: Server) -> int:  # run or turned away (MOVED counts as rejected)
        stats = server.client().info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0)) + int(stats.get("rejected_calls", 0))

    before = {s.port: evalsha(s) for s in (source, target)}
    with pytest.raises(Unavailable) as caught:
        store.get("run")
    assert caught.value.outcome == "not_applied" and "MOVED" in caught.value.reason
    sent = {s.port: evalsha(s) - before[s.port] for s in (source, target)}
    assert sent == {source.port: 1, target.port: 1}, sent
    finish_migration(cluster, slot, target)
    assert store.get("run").record == b"r1"


def test_a_store_of_partitions_spreads_over_the_primaries_one_round_trip_per_node(
        cluster_client: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from redisstore.shells.sync import Transport

    namespace = unique_namespace()
    store = RedisRunStore(cluster_client, namespace=namespace, partitions=6)
    runs = [f"run-{i}" for i in range(60)]
    for run in runs:
        store.insert(run, b"r", Claim("a", 600_000))
    nodes = {cluster_client.get_node_from_key(Keyspace(namespace, p).leases).name
             for p in range(6)}
    assert len(nodes) >= 2, "6 hash tags on one of three primaries"
    # Each script once on each node first (a node's first call of it is a NOSCRIPT).
    store.renew("a", runs, 600_000)
    store.release("a", [f"absent-{i}" for i in range(12)])
    store.claim_ready("b", 600_000, 10)
    sent: list[Any] = []
    real = Transport.exchange

    def exchange(self: Transport, pool: Any, batch: Any, deadline: float) -> Any:
        sent.append(batch)
        return real(self, pool, batch, deadline)

    monkeypatch.setattr(Transport, "exchange", exchange)
    assert store.renew("a", runs, 600_000) == runs
    assert len(sent) == len(nodes)  # one pipelined round trip per node
    sent.clear()
    assert store.release("a", runs) == runs
    assert len(sent) == len(nodes)
    sent.clear()
    assert sorted(store.claim_ready("b", 600_000, 10)) == []
    assert len(sent) == len(nodes)  # the heads; nothing due, no second round trip


def test_repartition_spreads_a_namespace_over_the_primaries(
        cluster_client: RedisCluster) -> None:
    from redisstore import Misconfigured, repartition
    from redisstore.conformance.readiness import rec
    from redisstore.discovery import json_wait

    namespace = unique_namespace()
    one = RedisRunStore(cluster_client, namespace=namespace, discover=json_wait)
    one.migrate()
    runs = {f"run-{i}": rec({"at": 0}, n=i) for i in range(30)}
    for run, record in runs.items():
        one.insert(run, record, Claim("old", 600_000))
    done = repartition(cluster_client, namespace, 6, discover=json_wait)
    assert (done.moved, done.before, done.after) == (30, 1, 6)
    with pytest.raises(Misconfigured):
        one.insert("late", b"x", Release())
    store = RedisRunStore(cluster_client, namespace=namespace, discover=json_wait,
                          partitions=6)
    assert sorted(store.claim_ready("new", 600_000, 100)) == sorted(runs)
    nodes = {cluster_client.get_node_from_key(Keyspace(namespace, p).meta).name
             for p in range(6)}
    assert len(nodes) >= 2
    for run, record in runs.items():
        assert store.get(run).record == record


# ---------------------------------------------------------------- wakers per node


def _one_run_per_partition(count: int) -> list[str]:
    """Run ids, the i-th in partition i of a store of ``count``."""
    from redisstore.core.partitions import partition_of

    found: dict[int, str] = {}
    n = 0
    while len(found) < count:
        found.setdefault(partition_of(f"w{n}", count), f"w{n}")
        n += 1
    return [found[p] for p in range(count)]


def _wakers(store: Any) -> collections.Counter[str]:
    """The store's own waker threads alive, by name (other tests' may still be ending)."""
    hub = store._wake
    if hub is None:  # no claim blocked yet
        return collections.Counter()
    with hub._cond:
        threads = [*hub._nodes.values(), *hub._listeners.values()]
    return collections.Counter(t.name for t in threads if t.is_alive())


def _subscribers(cluster_client: RedisCluster, channel: str) -> int:
    node = cluster_client.get_node_from_key(channel)
    reply = cluster_client.get_redis_connection(node).execute_command(
        "PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


def _wait_for(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Shell:
    """A store of 6 partitions on the cluster through the sync or the asyncio client, with
    sync calls (the asyncio store's run on a loop thread of its own)."""

    def __init__(self, shell: str, cluster: list[Server], cluster_client: RedisCluster,
                 namespace: str) -> None:
        from redisstore.discovery import json_wait

        self.loop: LoopThread | None = None
        if shell == "sync":
            self.store: Any = RedisRunStore(cluster_client, namespace=namespace,
                                            discover=json_wait, partitions=6)
        else:
            self.loop = LoopThread()
            self.client = self.loop.run(asyncio.sleep(0, async_cluster(cluster)))
            self.store = AsyncRedisRunStore(self.client, namespace=namespace,
                                            discover=json_wait, partitions=6)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(self.store, name)(*args, **kwargs)
        return got if self.loop is None else self.loop.run(got)

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
            return
        self.loop.run(self.store.aclose())
        self.loop.run(self.client.aclose())
        self.loop.stop()


@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_store_of_partitions_waits_with_one_waker_per_node(
        cluster: list[Server], cluster_client: RedisCluster, shell: str) -> None:
    """Six partitions on three primaries: the blocked claims' wakers are one per node, each
    subscribed to the sharded channels of its node's partitions (one connection per node
    where the waker per partition held 12), and a run made ready in any partition wakes one
    claim at once."""
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import SLACK, Blocked

    runs = _one_run_per_partition(6)
    io = Shell(shell, cluster, cluster_client, unique_namespace("per-node"))
    try:
        assert io.call("claim_ready", "me", 60_000, 1) == []  # the count recorded
        blocked = [Blocked(lambda: io.call("claim_ready", "me", 60_000, 1, block=20_000))
                   for _ in range(6)]
        ready = [io.store._ops.sweeps(True).wake_key(p, "ready") for p in range(6)]
        assert _wait_for(lambda: all(_subscribers(cluster_client, c) == 1 for c in ready))
        threads = _wakers(io.store)
        assert threads == {"redisstore-waker-node": 3}, threads
        since = time.monotonic()
        for run in runs:
            io.call("insert", run, rec({"at": 0}), Release())
        got = sorted(run for b in blocked for run in b.get())
        assert got == sorted(runs)  # each run woke one claim, and each claim got one
        assert max(b.returned for b in blocked) - since < SLACK
        assert io.store._wake.stats["taken"] >= 1
    finally:
        io.close()


def test_a_store_of_partitions_falls_back_to_a_waker_per_partition_without_channels(
        cluster: list[Server], caplog: pytest.LogCaptureFixture) -> None:
    """A user whose rule grants no channels (an older acl_rule) cannot subscribe: the
    store's wakers become one per partition and kind, on BZPOPMIN, and still wake claims
    at once; its scripts' refused publishes fail no write."""
    from redisstore.admin.security import acl_rule
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import SLACK, Blocked
    from redisstore.discovery import json_wait

    namespace = unique_namespace("no-channels")
    rule = acl_rule(namespace, cluster=True, partitions=6) + " resetchannels"
    for server in cluster:
        server.client().execute_command("ACL", "SETUSER", "no-channels", "on", ">pw",
                                        *rule.split())
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port, username="no-channels",
                          password="pw", socket_timeout=10)
    store = RedisRunStore(client, namespace=namespace, discover=json_wait, partitions=6)
    try:
        assert store.claim_ready("me", 60_000, 1) == []
        blocked = Blocked(lambda: store.claim_ready("me", 60_000, 1, block=20_000))
        assert _wait_for(lambda: _wakers(store)["redisstore-waker-ready"] == 6)
        since = time.monotonic()
        run = _one_run_per_partition(6)[4]
        assert store.insert(run, rec({"at": 0}), Release()) == 1
        assert blocked.get() == [run]
        assert blocked.returned - since < SLACK
        assert _wakers(store)["redisstore-waker-node"] == 0
        assert "refuses sharded pub/sub (NOPERM" in caplog.text
    finally:
        store.close()
        client.close()


@pytest.mark.parametrize("server", ["valkey8", "redis62"])
def test_a_store_of_partitions_wakes_claims_on_a_valkey_or_redis62_cluster(
        tmp_path: Path, server: str) -> None:
    """Valkey 8 has sharded pub/sub: wakers per node. Redis 6.2 has none: its scripts'
    publishes fail alone (every write stands) and the store waits per partition."""
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import SLACK, Blocked
    from redisstore.discovery import json_wait

    binary = valkey_binary() if server == "valkey8" else redis62_binary()
    servers = start_cluster(binary, tmp_path)
    client = RedisCluster(host="127.0.0.1", port=servers[0].port, socket_timeout=10)
    store = RedisRunStore(client, namespace=unique_namespace(), discover=json_wait,
                          partitions=6)
    try:
        assert store.claim_ready("me", 60_000, 1) == []
        blocked = [Blocked(lambda: store.claim_ready("me", 60_000, 1, block=20_000))
                   for _ in range(6)]
        time.sleep(0.5)
        since = time.monotonic()
        runs = _one_run_per_partition(6)
        for run in runs:
            assert store.insert(run, rec({"at": 0}), Release()) == 1
        assert sorted(r for b in blocked for r in b.get()) == sorted(runs)
        assert max(b.returned for b in blocked) - since < SLACK
        threads = _wakers(store)
        if server == "valkey8":
            assert threads == {"redisstore-waker-node": 3}, threads
        else:
            assert threads["redisstore-waker-node"] == 0
            assert threads["redisstore-waker-ready"] == 6, threads
    finally:
        store.close()
        client.close()
        for node in servers:
            node.kill()


@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_waker_per_node_follows_a_partition_whose_slot_moves(
        cluster: list[Server], cluster_client: RedisCluster, shell: str) -> None:
    """A partition's slot moves to another node while claims are blocked: the server ends
    the subscription there, the wakers regroup on the new map, and a run made ready in the
    moved partition wakes a claim at once."""
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import SLACK, Blocked
    from redisstore.core.partitions import partition_of

    runs = _one_run_per_partition(6)
    while True:  # a partition whose slot holds no keys (SETSLOT moves only an empty slot)
        namespace = unique_namespace("moving-part")
        moved = 3
        key = Keyspace(namespace, moved).leases
        slot = cluster_client.keyslot(key)
        owner = cluster_client.get_node_from_key(key)
        if cluster_client.get_redis_connection(owner).execute_command(
                "CLUSTER", "COUNTKEYSINSLOT", slot) == 0:
            break
    io = Shell(shell, cluster, cluster_client, namespace)
    try:
        assert io.call("claim_ready", "me", 60_000, 1) == []
        blocked = Blocked(lambda: io.call("claim_ready", "me", 60_000, 1, block=30_000))
        channel = Keyspace(namespace, moved).wake("ready")
        assert _wait_for(lambda: _subscribers(cluster_client, channel) == 1)
        target = move_slot(cluster, slot, owner)
        # The old owner ended the subscription; the new one gets it once the wakers regroup.
        assert _wait_for(lambda: target.client().execute_command(
            "PUBSUB", "SHARDNUMSUB", channel)[1] == 1, 10.0)
        assert partition_of(runs[moved], 6) == moved
        since = time.monotonic()
        for _ in range(3):  # the first call after the move may answer MOVED
            try:
                io.call("insert", runs[moved], rec({"at": 0}), Release())
                break
            except Unavailable:
                time.sleep(0.1)
        assert blocked.get() == [runs[moved]]
        assert blocked.returned - since < SLACK
    finally:
        io.close()


def test_a_waker_per_node_subscribes_again_after_its_connections_are_killed(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    """Every node drops its sharded subscribers (CLIENT KILL TYPE pubsub): the wakers
    subscribe again, sweep, and a run made ready later wakes a blocked claim at once; one
    made ready while they were away is found by the sweep."""
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import SLACK, Blocked

    runs = _one_run_per_partition(6)
    io = Shell("sync", cluster, cluster_client, unique_namespace("killed-sub"))
    ready = [io.store._ops.sweeps(True).wake_key(p, "ready") for p in range(6)]
    try:
        assert io.call("claim_ready", "me", 60_000, 1) == []
        blocked = [Blocked(lambda: io.call("claim_ready", "me", 60_000, 1, block=30_000))
                   for _ in range(2)]
        assert _wait_for(lambda: all(_subscribers(cluster_client, c) == 1 for c in ready))
        for server in cluster:
            server.client().execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        io.call("insert", runs[0], rec({"at": 0}), Release())  # its message is lost
        assert _wait_for(lambda: all(_subscribers(cluster_client, c) == 1 for c in ready))
        since = time.monotonic()
        io.call("insert", runs[5], rec({"at": 0}), Release())
        assert sorted(r for b in blocked for r in b.get()) == sorted([runs[0], runs[5]])
        assert max(b.returned for b in blocked) - since < SLACK
    finally:
        io.close()


def test_writes_of_a_user_without_channels_reach_blocked_claims_within_a_second(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    """The writer's rule grants no channels (an older acl_rule; a writer of an earlier
    version during a rolling upgrade publishes nothing either): its tokens are found by the
    wakers' sweep once a second, not at the claims' 10 s re-arm."""
    from redisstore.admin.security import acl_rule
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import Blocked
    from redisstore.discovery import json_wait

    namespace = unique_namespace("mute-writer")
    rule = acl_rule(namespace, cluster=True, partitions=6) + " resetchannels"
    for server in cluster:
        server.client().execute_command("ACL", "SETUSER", "mute-writer", "on", ">pw",
                                        *rule.split())
    writer_client = RedisCluster(host="127.0.0.1", port=cluster[0].port,
                                 username="mute-writer", password="pw")
    writer = RedisRunStore(writer_client, namespace=namespace, discover=json_wait,
                           partitions=6)
    io = Shell("sync", cluster, cluster_client, namespace)
    try:
        assert io.call("claim_ready", "me", 60_000, 1) == []
        blocked = Blocked(lambda: io.call("claim_ready", "me", 60_000, 1, block=20_000))
        time.sleep(0.5)
        since = time.monotonic()
        run = _one_run_per_partition(6)[2]
        assert writer.insert(run, rec({"at": 0}), Release()) == 1
        assert blocked.get() == [run]
        assert blocked.returned - since < 2.0  # a sweep within NODE_POLL (1 s)
    finally:
        io.close()
        writer.close()
        writer_client.close()


def test_repartition_repository_on_the_cluster_moves_records_across_nodes(
        cluster_client: RedisCluster) -> None:
    """1 -> 6 -> 3 partitions of a repository on the three primaries: each record loads
    with its version from its new partition, wherever its node."""
    from datetime import UTC, datetime

    from redisstore import InstanceLease, InstanceRecord, repartition_repository

    namespace = unique_namespace("repo-move")
    one = RedisRepository(cluster_client, namespace=namespace)
    one.register_group("g")
    ids = [f"i{i}" for i in range(40)]
    for n, id in enumerate(ids):
        version = one.save(InstanceRecord(id=id, group="g", payload=b"p"))
        if n % 2:
            one.save(InstanceRecord(id=id, group="g", payload=b"q", rec_version=version,
                                    lease=InstanceLease(datetime(2030, 1, 1, tzinfo=UTC),
                                                        "node", 3)))
    stored = {id: one.load(id) for id in ids}
    for count, before in ((6, 1), (3, 6)):
        done = repartition_repository(cluster_client, namespace, count)
        assert (done.before, done.after, done.damaged) == (before, count, 0)
        spread = RedisRepository(cluster_client, namespace=namespace, partitions=count)
        assert {id: spread.load(id) for id in ids} == stored
        assert spread.group_exists("g")
    nodes = {cluster_client.get_node_from_key(Keyspace(namespace, p).groups).port
             for p in range(3)}
    assert len(nodes) >= 2  # the records did cross nodes


@pytest.mark.parametrize("layout", [1, 4])
def test_migrate_on_a_cluster_scans_the_namespaces_node(cluster_client: RedisCluster,
                                                         layout: int) -> None:
    """A namespace an earlier version wrote lives on one node: migrate()'s scripts go there
    by its slot and SCAN that node's keys; every run and index entry moves."""
    import old_layouts

    namespace = unique_namespace()
    runs = {f"r{i}": old_layouts.OldRun(rev=i + 1, record=b"%d" % i, own="n", exp=2**42)
            for i in range(20)}
    runs["ready"] = old_layouts.OldRun(record=b"x", wk="a", wn=0, wrev=1, wpv=1, ready=0)
    old_layouts.write(cluster_client, namespace, layout, runs, bucket=3)
    store = RedisRunStore(cluster_client, namespace=namespace)
    assert store.migrate().moved == len(runs)
    now = store.now()
    assert store.get_many(list(runs)) == {r: old.expected(now) for r, old in runs.items()}
    assert cluster_client.zcard(Keyspace(namespace).leases) == 20
    assert store.claim_ready("me", 600_000, 10) == ["ready"]
