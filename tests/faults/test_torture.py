"""Torture: engine processes work a shared set of runs through a fault proxy while the
server is cut off, loses replies and is killed -9 and restarted (AOF, fsync always); half
the processes run their engines as threads sharing one asyncio store, whose multiplexer
pipelines their calls. Every call is logged; :mod:`history` then checks the log against the
final state.

It runs once on Redis 7 and once on Valkey 8, and once on a three-primary Redis Cluster
whose namespace's node is behind the proxy (faults on that node only).
``REDISSTORE_TORTURE_SECONDS`` sets how long the load runs (default 12 s per server, about
17-20 s each in all: CI's half-hour holds the four of them);
``REDISSTORE_TORTURE_WORKERS`` how many processes (default 6).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from engine import TTL, OnLoop, Worker, final_state, seed
from faultproxy import FaultProxy
from history import Event, Final, check, load
from redis.cluster import RedisCluster
from servers import (
    Server,
    cluster_ports,
    redis_binary,
    start,
    start_cluster,
    unique_namespace,
    valkey_binary,
)

from redisstore import (
    AsyncRedisRunStore,
    RedisRunStore,
    Unavailable,
)
from redisstore.core.keys import Keyspace
from redisstore.discovery import json_wait

# serial: processes under faults load the machine
pytestmark = [pytest.mark.server, pytest.mark.serial, pytest.mark.slow]

SECONDS = float(os.environ.get("REDISSTORE_TORTURE_SECONDS", "12"))
WORKERS = int(os.environ.get("REDISSTORE_TORTURE_WORKERS", "6"))
RUNS = 50
FAULT_EVERY = (0.3, 1.2)  # seconds between faults
#: Workers sharing one asyncio store in each of the odd-numbered processes.
ASYNC_TASKS = 3
DURABLE = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")


def _work(port: int, namespace: str, owner: str, seconds: float, log_path: str,
          runs: list[str], seed: int, tasks: int, cluster: bool, partitions: int) -> None:
    """One engine process: a sync store, or (``tasks`` > 0) that many workers, each logged as
    its own process, sharing one multiplexed asyncio store; on a cluster client when
    ``cluster`` (``port`` is then a node it learns the others from)."""
    deadline = time.monotonic() + seconds
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": port, "socket_timeout": 2,
                                "socket_connect_timeout": 2}
    if not tasks:
        client = RedisCluster(**settings) if cluster else redis.Redis(**settings)
        store = RedisRunStore(client, namespace=namespace, discover=json_wait,
                              partitions=partitions)
        with open(log_path, "w", buffering=1) as log:
            Worker(store, owner, log, random.Random(seed)).loop(deadline, runs)
        return
    loop = asyncio.new_event_loop()
    looping = threading.Thread(target=loop.run_forever, daemon=True)
    looping.start()

    async def connect() -> Any:
        return (redis.asyncio.RedisCluster(**settings) if cluster
                else redis.asyncio.Redis(**settings))

    aclient = asyncio.run_coroutine_threadsafe(connect(), loop).result(10)
    shared: Any = OnLoop(AsyncRedisRunStore(aclient, namespace=namespace, discover=json_wait,
                                            partitions=partitions), loop)
    rng = random.Random(seed)
    with open(log_path, "w", buffering=1) as log:
        lock = threading.Lock()

        class Lines:  # one line at a time from every thread
            def write(self, line: str) -> None:
                with lock:
                    log.write(line)

        threads = [threading.Thread(target=Worker(shared, f"{owner}t{k}", Lines(),
                                                  random.Random(rng.random())).loop,
                                    args=(deadline, runs)) for k in range(tasks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    asyncio.run_coroutine_threadsafe(aclient.aclose(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


class Faults:
    """The parent's fault thread: cut connections, lose replies, kill -9 and restart."""

    KINDS = ("cut", "drop", "hang", "restart")

    def __init__(self, proxy: FaultProxy, server: Server, rng: random.Random) -> None:
        self.proxy, self.server, self.rng = proxy, server, rng
        self.counts: Counter[str] = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="torture-faults", daemon=True)
        self.restart_downtime: list[float] = []

    def _run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*FAULT_EVERY)):
            kinds = list(self.KINDS)
            self.rng.shuffle(kinds)
            for kind in kinds:
                if self.stop.wait(self.rng.uniform(*FAULT_EVERY)):
                    return
                self.inject(kind)

    def inject(self, kind: str) -> None:
        if kind == "cut":
            self.proxy.cut_all()
        elif kind == "drop":
            self.proxy.drop_replies(self.rng.randint(1, 3))
        elif kind == "hang":
            self.proxy.drop_replies(1, hang=True)
        else:
            began = time.monotonic()
            self.server.kill()
            time.sleep(self.rng.uniform(0.05, 0.5))
            self.server.start()
            self.restart_downtime.append(time.monotonic() - began)
        self.counts[kind] += 1


@pytest.fixture(params=["redis", "valkey"])
def durable_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    binary = redis_binary() if request.param == "redis" else valkey_binary()
    server = start(binary, request.param, tmp_path / "server", DURABLE)
    try:
        yield server
    finally:
        server.kill()


def test_torture_history_is_linearizable_enough(durable_server: Server,
                                                 tmp_path: Path) -> None:
    namespace = unique_namespace("torture")
    setup = RedisRunStore(durable_server.client(), namespace=namespace, discover=json_wait)
    with FaultProxy(durable_server.port) as proxy:
        _torture(setup, setup, durable_server, proxy, proxy.port, False, tmp_path, "torture")


@pytest.mark.parametrize("partitions", [1, 6])
def test_torture_on_a_cluster_with_faults_on_one_node(tmp_path: Path, partitions: int) -> None:
    """The same load on a namespace of a three-primary cluster whose node announces a fault
    proxy as its address (so the clients reach it through the proxy, the other nodes over
    the bus): cuts, lost and hung replies, kill -9 and restarts of that node only. With
    ``partitions=6``, one store over six partitions on the three primaries, some of them on
    that node: its claims, renewals and releases span the faulty node and the others."""
    ports = cluster_ports(3)
    with FaultProxy(ports[0]) as proxy:
        servers = start_cluster(redis_binary(), tmp_path / "cluster", args=DURABLE,
                                ports=ports, extra={0: (
                                    "--cluster-announce-port", str(proxy.port),
                                    "--cluster-announce-bus-port", str(ports[0] + 10000))})
        try:
            client = RedisCluster(host="127.0.0.1", port=servers[1].port)
            namespace = unique_namespace("torture-cluster")
            while not on_the_faulty_node(client, namespace, partitions, proxy.port):
                namespace = unique_namespace("torture-cluster")
            setup = RedisRunStore(client, namespace=namespace, discover=json_wait,
                                  partitions=partitions)
            # The end state is read from the node itself, not through the proxy (a reply
            # drop may still be armed there); a store of partitions reads through the
            # cluster once the proxy passes everything through.
            direct = RedisRunStore(servers[0].client(), namespace=namespace) \
                if partitions == 1 else setup
            _torture(setup, direct, servers[0], proxy, servers[1].port, True, tmp_path,
                     f"torture on a cluster, faults on one node, partitions={partitions}",
                     partitions)
        finally:
            for server in servers:
                server.kill()


def _final(reader: RedisRunStore, runs: list[str]) -> dict[str, Final]:
    """The end state; a node restarted last may answer CLUSTERDOWN for a moment."""
    for _ in range(100):
        try:
            return final_state(reader, runs)
        except Unavailable:
            time.sleep(0.1)
    return final_state(reader, runs)


def on_the_faulty_node(client: RedisCluster, namespace: str, partitions: int,
                       port: int) -> bool:
    """Whether the namespace (one partition) is on the node at ``port``; with partitions,
    some of its partitions are and some are not."""
    if partitions == 1:
        return bool(client.get_node_from_key(Keyspace(namespace).meta).port == port)
    here = [client.get_node_from_key(Keyspace(namespace, p).meta).port == port
            for p in range(partitions)]
    return any(here) and not all(here)


def _torture(setup: RedisRunStore, reader: RedisRunStore, server: Server, proxy: FaultProxy,
             port: int, cluster: bool, tmp_path: Path, label: str,
             partitions: int = 1) -> None:
    """Seed the runs through ``setup``; run the engines (on ``port``) while the faults hit
    ``proxy`` and ``server``; read the end state through ``reader``; check the history
    against it, and that the checker sees what it must."""
    namespace = setup.namespace
    runs = [f"run-{i:02d}" for i in range(RUNS)]
    setup_lines = seed(setup, runs)
    rng = random.Random(os.environ.get("REDISSTORE_TORTURE_SEED", "torture"))
    faults = Faults(proxy, server, rng)
    ctx = multiprocessing.get_context("spawn")
    logs = [tmp_path / f"w{w}.jsonl" for w in range(WORKERS)]
    # Half the processes are engines on a sync store each, half run ASYNC_TASKS
    # workers on one shared asyncio store (its multiplexer under the same faults).
    workers = [ctx.Process(target=_work, args=(port, namespace, f"w{w}", SECONDS,
                                               str(logs[w]), runs, rng.randrange(2**32),
                                               ASYNC_TASKS if w % 2 else 0, cluster,
                                               partitions))
               for w in range(WORKERS)]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    time.sleep(2)  # the spawned interpreters start before the faults do
    faults.thread.start()
    for worker in workers:
        worker.join(SECONDS + 120)
    faults.stop.set()
    faults.thread.join(30)
    assert all(worker.exitcode == 0 for worker in workers), \
        [worker.exitcode for worker in workers]
    dropped, cut = proxy.replies_dropped, proxy.connections_cut
    elapsed = time.monotonic() - began

    proxy.pass_through()
    final = _final(reader, runs)
    lines = list(setup_lines)
    for path in logs:
        lines += path.read_text().splitlines()
    events = load(lines)
    report = check(events, final)

    counts = report.counts
    print(f"\n{label}: {WORKERS} processes x {SECONDS:.0f} s over {RUNS} runs "
          f"({elapsed:.0f} s wall)")
    print(f"  operations={counts['operations']} "
          + " ".join(f"{k[3:]}={v}" for k, v in sorted(counts.items()) if k.startswith("op.")))
    print(f"  faults injected: {dict(faults.counts)}; replies dropped={dropped} "
          f"connections cut={cut}; restart downtime "
          f"max={max(faults.restart_downtime, default=0):.2f} s")
    print(f"  unavailable={counts['unavailable']} (writes {counts['unavailable_writes']}: "
          f"resolved by readback {counts['resolved_by_readback']}, of which confirmed "
          f"{counts['confirmed_by_readback']}); successful writes="
          f"{counts['successful_writes']}; refusals="
          + str({k[8:]: v for k, v in counts.items() if k.startswith("refused.")}))
    reasons = Counter(re.sub(r"\d+", "N", json.loads(line)["reason"])[:60] for line in lines
                      if '"unavailable"' in line and json.loads(line).get("reason"))
    print(f"  unavailable, by reason: {dict(reasons.most_common(6))}")
    print(f"  violations={len(report.violations)}")
    for violation in report.violations[:20]:
        print("   ", violation)

    assert report.violations == []
    assert all(faults.counts[kind] > 0 for kind in Faults.KINDS), faults.counts
    assert dropped > 0
    assert counts["unavailable"] > 0
    assert counts["operations"] > 50 * SECONDS
    assert counts["successful_writes"] > 50
    # The asyncio stores' workers wrote too, and met the faults.
    shared = [e for e in events if re.fullmatch(r"w\d+t\d+", e.proc)]
    assert sum(e.op == "cas" and e.outcome == "ok" for e in shared) > 20, len(shared)
    assert any(e.outcome == "unavailable" for e in shared)
    _assert_the_checker_bites(events, final)


def _assert_the_checker_bites(events: list[Event], final: dict[str, Final]) -> None:
    """The same real history, doctored, must fail: the checks are not vacuous."""
    run = max(final, key=lambda r: final[r].revision)
    rolled_back = {**final, run: Final(1, f"seed-{run}")}
    assert "lost" in {v.kind for v in check(events, rolled_back).violations}
    claim = next(e for e in events if e.op == "claim_ready" and e.outcome == "ok"
                 and e.value and e.b0 is not None and e.b1 is not None
                 and e.b1 - e.b0 < TTL // 4)
    assert claim.b1 is not None
    intruder = Event(proc="intruder", seq=0, op="claim_expired", outcome="ok",
                     value=(claim.value[0],), ttl=TTL, b0=claim.b1 + 1, b1=claim.b1 + 2)
    # Without the releases and seizures that might have ended that lease first:
    unended = [e for e in events
               if not (e.run == claim.value[0] and e.lease in ("release", "seize"))]
    kinds = {v.kind for v in check([*unended, intruder], final).violations}
    assert "overlap" in kinds
    late = Event(proc=claim.proc, seq=claim.seq, op="renew", outcome="ok",
                 runs=(claim.value[0],), value=(claim.value[0],), ttl=TTL,
                 b0=claim.b1 + 3 * TTL, b1=claim.b1 + 3 * TTL + 1)
    only_claim = [e for e in events if e.proc != claim.proc or e.seq < claim.seq]
    assert "revival" in {v.kind for v in check([*only_claim, late], final).violations}
