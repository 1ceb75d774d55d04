"""One logical store over partitions on a local three-primary Redis Cluster: compare_and_set,
the work unit and claim_ready of one store with ``partitions`` = 1, 3 and 6, beside three
separate namespaces (one per primary), driven by several client processes.

This machine has 2 cores for the three servers and the clients, so throughput says little;
what the figures show is where the server work goes: each primary's CPU µs per operation
(``INFO commandstats``, EVALSHA and friends), i.e. how the work splits over the shards, and
what a claim's fan-out costs as N grows. Configurations are interleaved, ``--rounds`` times;
each cell is the median, with the spread (min-max) of throughput.

- ``cas``: compare_and_set of a held run (each process its own runs, distinct families);
- ``unit``: claim_ready(1, records=True), then compare_and_set(Release) with a final record;
- ``claim``: claim_ready(10), runs claimed per second (a second per claim is reported too).

Nothing is asserted; the figures are printed::

    .venv/bin/python benchmarks/bench_partitions.py [--seconds 3] [--procs 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import random
import socket
import statistics
import subprocess
import time
from typing import Any

import redis
from common import own_server, server_binary
from redis.cluster import RedisCluster

from redisstore import At, Claim, Hold, RedisRunStore, Release
from redisstore.core.keys import Keyspace

LONG = 600_000
READY = b"ready"
CONFIGS = ("N=1", "N=3", "N=6", "3 namespaces")
OPS = ("cas", "unit", "claim")
TOP_LEVEL = ("evalsha", "eval", "script")


def discover(record: bytes) -> At | None:
    return At(0) if record == READY else None


def start_cluster(stack: contextlib.ExitStack) -> list[int]:
    """Three empty primaries on loopback, every slot assigned."""
    binary = server_binary()
    ports = [stack.enter_context(own_server(binary, port=port, args=(
        "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf")))
        for i, port in enumerate(cluster_ports(3))]
    subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                    "--cluster-replicas", "0", "--cluster-yes"], check=True,
                   capture_output=True, timeout=60)
    for port in ports:
        client = redis.Redis(port=port)
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            time.sleep(0.1)
    return ports


def cluster_ports(count: int) -> list[int]:
    """Free loopback ports whose cluster bus ports (10,000 above) are free too: below the
    kernel's ephemeral range, where a server's bus port fits."""
    rng = random.Random()
    found: list[int] = []
    while len(found) < count:
        port = rng.randrange(20_000, 30_000)
        if port in found:
            continue
        try:
            for p in (port, port + 10_000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        found.append(port)
    return found


def spread_namespaces(client: RedisCluster, prefix: str) -> list[str]:
    """Three namespaces whose slots are on three different primaries."""
    chosen: dict[str, str] = {}
    i = 0
    while len(chosen) < 3:
        name = f"{prefix}-{i}"
        node = client.get_node_from_key(Keyspace(name).leases).name
        chosen.setdefault(node, name)
        i += 1
    return list(chosen.values())


def stores_of(client: RedisCluster, config: str, tag: str) -> list[RedisRunStore]:
    """The stores of a configuration: one logical store, or three namespaces."""
    if config == "3 namespaces":
        return [RedisRunStore(client, namespace=ns, discover=discover)
                for ns in spread_namespaces(client, f"three-{tag}")]
    n = int(config.split("=")[1])
    return [RedisRunStore(client, namespace=f"part{n}-{tag}", discover=discover, partitions=n)]


def fill(store: RedisRunStore, runs: int, tag: str) -> None:
    """``runs`` ready runs, each its own family, inserted in pipelines (untimed)."""
    for start in range(0, runs, 200):
        with store.pipeline() as pipe:
            for i in range(start, min(runs, start + 200)):
                pipe.insert(f"{tag}-{i:07d}", READY, Release())


def worker(ports: list[int], config: str, tag: str, op: str, w: int, seconds: float,
           barrier: Any, results: Any) -> None:
    client = RedisCluster(host="127.0.0.1", port=ports[0])
    stores = stores_of(client, config, tag)
    store = stores[w % len(stores)]
    owner = f"w{w}"
    revisions: dict[str, int] = {}
    if op == "cas":
        for i in range(50):
            run = f"cas-{w}-{i}"
            store.insert(run, b"held", Claim(owner, LONG))
            revisions[run] = 1
    store.now()
    barrier.wait(60)
    done = calls = 0
    runs = list(revisions)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if op == "cas":
            run = runs[done % len(runs)]
            store.compare_and_set(run, revisions[run], b"held", Hold(owner))
            revisions[run] += 1
            done += 1
        elif op == "unit":
            got = store.claim_ready(owner, LONG, 1, records=True)
            calls += 1
            for claimed in got:
                store.compare_and_set(claimed.run, claimed.current.revision, b"done",
                                      Release())
                done += 1
        else:
            got_ids = store.claim_ready(owner, LONG, 10)
            calls += 1
            done += len(got_ids)
    results.put((w, done, calls))


def server_usec(ports: list[int]) -> list[int]:
    """Each primary's CPU µs in scripts so far (INFO commandstats)."""
    usec = []
    for port in ports:
        stats = redis.Redis(port=port).info("commandstats")
        usec.append(sum(int(v["usec"]) for k, v in stats.items()
                        if k.removeprefix("cmdstat_").split("|")[0] in TOP_LEVEL))
    return usec


def measure(ports: list[int], config: str, op: str, tag: str, procs: int,
            seconds: float) -> tuple[float, list[float], float]:
    """(operations a second, each primary's µs per operation, calls per operation)."""
    client = RedisCluster(host="127.0.0.1", port=ports[0])
    if op in ("unit", "claim"):
        per = int(seconds * (3000 if op == "unit" else 20000)) + 1000
        stores = stores_of(client, config, tag)
        for i, store in enumerate(stores):
            fill(store, per // len(stores), f"{tag}-{i}")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(ports, config, tag, op, w, seconds, barrier,
                                                results)) for w in range(procs)]
    for process in workers:
        process.start()
    barrier.wait(120)
    before, began = server_usec(ports), time.monotonic()
    got = [results.get(timeout=seconds + 120) for _ in workers]
    elapsed = time.monotonic() - began
    after = server_usec(ports)
    for process in workers:
        process.join(10)
    done = sum(d for _, d, _ in got)
    calls = sum(c for _, _, c in got)
    # Busiest primary first: which node a namespace lands on differs from round to round.
    per_node = sorted(((a - b) / max(done, 1) for a, b in zip(after, before, strict=True)),
                      reverse=True)
    return done / elapsed, per_node, calls / max(done, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        ports = start_cluster(stack)
        cells: dict[tuple[str, str], list[tuple[float, list[float], float]]] = {}
        for r in range(args.rounds):
            for op in OPS:
                order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
                for config in order:
                    tag = f"r{r}{op}{config.replace(' ', '').replace('=', '')}"
                    cells.setdefault((op, config), []).append(
                        measure(ports, config, op, tag, args.procs, args.seconds))
        print(f"{args.procs} client processes, {args.seconds:g} s a cell, {args.rounds} "
              "interleaved rounds; a primary's µs: its CPU in scripts per operation "
              "(claim: per run claimed), busiest primary first")
        print(f"{'op':6} {'config':13} {'ops/s (min-max)':>22} {'µs/op by primary':>22} "
              f"{'total µs':>9} {'calls/op':>8}")
        for op in OPS:
            for config in CONFIGS:
                rows = cells[(op, config)]
                rates = [row[0] for row in rows]
                nodes = [statistics.median(row[1][i] for row in rows) for i in range(3)]
                calls = statistics.median(row[2] for row in rows)
                spread = f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
                shares = "/".join(f"{n:.0f}" for n in nodes)
                print(f"{op:6} {config:13} {spread:>22} {shares:>22} {sum(nodes):9.0f} "
                      f"{calls:8.2f}")


if __name__ == "__main__":
    main()
