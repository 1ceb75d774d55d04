"""Both ports on a real Redis Cluster (three primaries started by a fixture) through
``redis.cluster.RedisCluster``: each namespace lives in one slot, on one node, and its
scripts, clock and indexes are that node's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import RedisSuite
from redis.cluster import RedisCluster
from servers import Server, redis_binary, start_cluster, unique_namespace

from redisstore import (
    Claim,
    Hold,
    RedisRepository,
    RedisRunStore,
    Release,
    Repository,
    Unavailable,
)
from redisstore.conformance import RepositoryConformance
from redisstore.keys import Keyspace

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    servers = start_cluster(redis_binary(), tmp_path_factory.mktemp("cluster"))
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture
def cluster_client(cluster: list[Server]) -> RedisCluster:
    return RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=10)


class TestClusterRunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, cluster_client: RedisCluster) -> None:
        self.client = cluster_client


class TestClusterRepository(RepositoryConformance):
    @pytest.fixture(autouse=True)
    def _backend(self, cluster_client: RedisCluster) -> None:
        self.client = cluster_client

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        return RedisRepository(self.client, namespace=unique_namespace(),
                               max_terminal=max_terminal, logger=logger)


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


def test_a_moved_slot_is_unavailable_once_then_followed(
        cluster: list[Server], cluster_client: RedisCluster) -> None:
    # SETSLOT refuses to move a slot that holds keys, and other tests' namespaces
    # may share a random one: take a namespace whose slot is empty.
    while True:
        namespace = unique_namespace("moving")
        key = Keyspace(namespace).leases
        slot = cluster_client.keyslot(key)
        owner = cluster_client.get_node_from_key(key)
        held = cluster_client.get_redis_connection(owner).execute_command(
            "CLUSTER", "COUNTKEYSINSLOT", slot)
        if held == 0:
            break
    store = RedisRunStore(cluster_client, namespace=namespace)
    assert store.now() > 0  # the client knows where the slot is
    target = next(s for s in cluster if s.port != owner.port)
    target_id = target.client().execute_command("CLUSTER", "MYID")
    for server in cluster:  # the slot is empty: reassigning it moves it
        server.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    with pytest.raises(Unavailable) as caught:
        store.insert("run", b"r1", Claim("me", 60_000))
    assert "MOVED" in caught.value.reason and caught.value.outcome == "not_applied"
    store.insert("run", b"r1", Claim("me", 60_000))  # the next call goes to the new node
    assert target.client().exists(Keyspace(namespace).run("run")) == 1


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

    while True:  # a namespace whose slot holds no keys (SETSLOT moves only those)
        namespace = unique_namespace("moving")
        key = Keyspace(namespace).leases
        slot = cluster_client.keyslot(key)
        owner = cluster_client.get_node_from_key(key)
        if cluster_client.get_redis_connection(owner).execute_command(
                "CLUSTER", "COUNTKEYSINSLOT", slot) == 0:
            break
    store = RedisRunStore(cluster_client, namespace=namespace, discover=json_wait)
    blocked = Blocked(lambda: store.claim_ready("me", 60_000, 1, block=10_000))
    time.sleep(0.3)
    target = next(s for s in cluster if s.port != owner.port)
    target_id = target.client().execute_command("CLUSTER", "MYID")
    for server in cluster:
        server.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
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
