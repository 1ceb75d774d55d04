"""Dependencies across partitions under faults on one node of a three-primary cluster: the
node announces a fault proxy as its address (the clients reach it through the proxy), which
cuts connections and loses replies while dependencies are written and claims deliver them.
No write of a dependency is ever missed: once the faults stop, every waiter whose
dependency's revision differs from its ``seen`` is claimable."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from faultproxy import FaultProxy
from redis.cluster import RedisCluster
from servers import cluster_ports, redis_binary, start_cluster, unique_namespace

from redisstore import Conflict, Held, RedisRunStore, Release, Unavailable
from redisstore.core.groups import SUSPECT_FOR
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.discovery import json_wait

pytestmark = pytest.mark.server

LONG = 600_000
PAIRS = 24
SECONDS = 8.0


def rec(wait: dict[str, Any] | None, **fields: Any) -> bytes:
    return json.dumps({"wait": wait, **fields}, sort_keys=True).encode()


def pairs_across(client: RedisCluster, namespace: str, faulty: int) -> list[tuple[str, str]]:
    """(dependency, waiter) ids in partitions on different nodes, one of them the faulty
    node's, both ways round."""
    def node(run: str) -> int:
        tag = Keyspace(namespace, partition_of(run, 6)).meta
        port: int = client.get_node_from_key(tag).port
        return port

    pairs: list[tuple[str, str]] = []
    i = 0
    while len(pairs) < PAIRS:
        dep, waiter = f"dep-{i}", f"waiter-{i}"
        i += 1
        a, b = node(dep), node(waiter)
        if a != b and faulty in (a, b):
            pairs.append((dep, waiter))
    return pairs


def test_no_dependency_write_is_missed_with_faults_on_one_node(tmp_path: Path) -> None:
    ports = cluster_ports(3)
    with FaultProxy(ports[0]) as proxy:
        servers = start_cluster(redis_binary(), tmp_path / "cluster", ports=ports, extra={0: (
            "--cluster-announce-port", str(proxy.port),
            "--cluster-announce-bus-port", str(ports[0] + 10000))})
        try:
            client = RedisCluster(host="127.0.0.1", port=servers[1].port, socket_timeout=2)
            namespace = unique_namespace("deps-faults")
            store = RedisRunStore(client, namespace=namespace, discover=json_wait,
                                  partitions=6, timeout=2000)
            store.migrate()
            pairs = pairs_across(client, namespace, proxy.port)
            for dep, waiter in pairs:
                store.insert(dep, rec(None), Release())
                store.insert(waiter, rec({"changed": dep, "seen": 1}), Release())
            stop = threading.Event()
            counts = {"writes": 0, "unavailable": 0, "claimed": 0, "faults": 0}

            def faults() -> None:
                rng = random.Random(7)
                while not stop.wait(rng.uniform(0.05, 0.25)):
                    counts["faults"] += 1
                    if rng.random() < 0.5:
                        proxy.drop_replies(1, hang=rng.random() < 0.3)
                    else:
                        proxy.cut_all()

            def writer() -> None:
                rng = random.Random(11)
                while not stop.is_set():
                    dep, _ = rng.choice(pairs)
                    try:
                        current = store.get(dep)
                        store.compare_and_set(dep, current.revision, rec(None),
                                              Release())
                        counts["writes"] += 1
                    except (Unavailable, Conflict):
                        counts["unavailable"] += 1

            def claimer() -> None:
                # Claims deliver; a claimed waiter waits again from its dependency's
                # revision as the engine read it (a later write of it must wake it again).
                while not stop.is_set():
                    try:
                        for waiter in store.claim_ready("engine", LONG, 5):
                            counts["claimed"] += 1
                            current = store.get(waiter)
                            dep = json.loads(current.record)["wait"]["changed"]
                            assert current.claim is not None
                            seen = current.claim.dependency_revision
                            store.compare_and_set(waiter, current.revision,
                                                  rec({"changed": dep, "seen": seen}),
                                                  Release())
                    except Unavailable:
                        counts["unavailable"] += 1

            threads = [threading.Thread(target=f) for f in (faults, writer, claimer)]
            for thread in threads:
                thread.start()
            time.sleep(SECONDS)
            stop.set()
            for thread in threads:
                thread.join(30)
            proxy.drop_replies(0)
            # A lost reply may have left a waiter held by "engine" (its claim ran): free
            # those as an engine's restart would, keeping their wait.
            for _, waiter in pairs:
                current = store.get(waiter)
                if isinstance(current.holder, Held):
                    store.compare_and_set(waiter, current.revision, current.record,
                                          Release())
            # Faults over: claims deliver what is left, then every waiter is either
            # claimed or waits on the revision its dependency has.
            # A claim may leave out a node that answered late (a loaded machine) and skip
            # it for SUSPECT_FOR s: an empty claim is the end only once that has passed.
            claimed: set[str] = set()
            empty = 0
            for _ in range(20):
                got = store.claim_ready("after", LONG, 100)
                claimed |= set(got)
                if got:
                    empty = 0
                    continue
                empty += 1
                if empty == 2:
                    break
                time.sleep(SUSPECT_FOR + 0.2)
            missed = []
            for dep, waiter in pairs:
                if waiter in claimed:
                    continue
                seen = json.loads(store.get(waiter).record)["wait"]["seen"]
                if store.get(dep).revision != seen:
                    missed.append((dep, waiter, seen, store.get(dep).revision))
            print(f"\n{counts}; claimed after the faults: {len(claimed)}")
            assert counts["writes"] > 20 and counts["faults"] > 10 and counts["claimed"] > 5
            assert counts["unavailable"] > 0, "the faults hit nothing"
            assert missed == []
        finally:
            for server in servers:
                server.kill()
