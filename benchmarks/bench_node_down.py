"""What one node down does to each call of a store of partitions: a local three-primary Redis
Cluster (``cluster-node-timeout`` 10 min: the node is never failed over, no CLUSTERDOWN),
a store of 6 partitions with ``timeout=2000``, one primary killed (SIGKILL) or hung
(SIGSTOP); the sync and the asyncio store. The victim is the node holding the namespace's
own key (the partition count), with 1 to 3 of the 6 partitions; ``now()`` reads
partition 0's node (the table says whether that is the victim's).

Each row is ``--repeats`` calls, one after the other: median and max latency (ms) and what
they answered (a value, or the error and its outcome). Nothing is asserted::

    .venv/bin/python benchmarks/bench_node_down.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from common import ROOT

sys.path.insert(0, str(ROOT / "tests"))
import redis.asyncio
from redis.cluster import RedisCluster
from servers import Server, redis_binary, start_cluster, unique_namespace

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    Hold,
    RedisRunStore,
    Release,
    StoreError,
    Unavailable,
)
from redisstore.conformance.readiness import rec
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.discovery import json_wait

N = 6
TIMEOUT = 2000
LONG = 600_000


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Shell:
    def __init__(self, shell: str, port: int, namespace: str) -> None:
        self.loop: Loop | None = None
        if shell == "sync":
            self.client: Any = RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
        else:
            self.loop = Loop()
            self.client = self.loop.run(_client(port))
        self.namespace = namespace
        self.store = self.open()

    def open(self) -> Any:
        kind = RedisRunStore if self.loop is None else AsyncRedisRunStore
        return kind(self.client, namespace=self.namespace, discover=json_wait, partitions=N,
                    timeout=TIMEOUT)

    def call(self, store: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(store, name)(*args, **kwargs)
        return got if self.loop is None else self.loop.run(got)

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
            self.client.close()
            return
        self.loop.run(self.store.aclose())
        self.loop.run(self.client.aclose())
        self.loop.stop()


async def _client(port: int) -> Any:
    return redis.asyncio.RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)


def runs_in(partitions: set[int], each: int, prefix: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {p: [] for p in partitions}
    n = 0
    while any(len(v) < each for v in found.values()):
        run = f"{prefix}{n}"
        p = partition_of(run, N)
        if p in found and len(found[p]) < each:
            found[p].append(run)
        n += 1
    return found


def shown(got: Any) -> str:
    if isinstance(got, Unavailable):
        return f"Unavailable({got.outcome})"
    if isinstance(got, StoreError):
        return type(got).__name__
    if isinstance(got, Exception):
        return f"{type(got).__name__}!"
    if isinstance(got, list):
        return f"{len(got)} runs"
    if hasattr(got, "revision"):
        return "a run"
    if got is None:
        return "ok"
    if isinstance(got, int) and got > 10**12:
        return "a time"
    return type(got).__name__ if not isinstance(got, int | bool) else f"ok ({got})"


def node_port(cluster: list[Server], key: str) -> int:
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    try:
        return int(client.get_node_from_key(key).port)
    finally:
        client.close()


def scenario(cluster: list[Server], shell: str, fault: str, repeats: int) -> dict[str, Any]:
    for _ in range(200):  # the count's node holds some partitions, not all
        namespace = unique_namespace("down")
        home = node_port(cluster, Keyspace(namespace).meta)
        ports = {p: node_port(cluster, Keyspace(namespace, p).leases) for p in range(N)}
        if 0 < sum(1 for q in ports.values() if q == home) <= N // 2:
            break
    victim = next(s for s in cluster if s.port == home)
    down = {p for p, q in ports.items() if q == home}
    up = set(range(N)) - down
    io = Shell(shell, cluster[0].port, namespace)
    store = io.store
    every = set(range(N))
    held = runs_in(every, 1, "held-")
    dels = runs_in(every, repeats, "del-")
    cas = runs_in(every, 1, "cas-")
    ready = runs_in(every, 40, "ready-")
    expired = runs_in(every, 40, "gone-")
    for group in (held, dels, cas):
        for runs in group.values():
            for run in runs:
                io.call(store, "insert", run, rec(None), Claim("me", LONG))
    for runs in ready.values():
        for run in runs:
            io.call(store, "insert", run, rec({"at": 0}), Release())
    for runs in expired.values():
        for run in runs:
            io.call(store, "insert", run, rec(None), Claim("old", 1))
    io.call(store, "quarantined")
    time.sleep(0.05)
    h, f = min(up), min(down)
    fresh = runs_in({h, f}, repeats, "new-")
    spread = [runs[0] for runs in held.values()]
    rows: list[tuple[str, Callable[[int], Any]]] = [
        ("get, healthy partition", lambda i: io.call(store, "get", held[h][0])),
        ("get, failed partition", lambda i: io.call(store, "get", held[f][0])),
        ("insert, healthy", lambda i: io.call(store, "insert", fresh[h][i], rec(None),
                                              Claim("me", LONG))),
        ("insert, failed", lambda i: io.call(store, "insert", fresh[f][i], rec(None),
                                             Claim("me", LONG))),
        ("compare_and_set, healthy", lambda i: io.call(store, "compare_and_set", cas[h][0],
                                                      i + 1, rec(None), Hold("me"))),
        ("compare_and_set, failed", lambda i: io.call(store, "compare_and_set", cas[f][0], 1,
                                                     rec(None), Hold("me"))),
        ("delete, healthy", lambda i: io.call(store, "delete", dels[h][i], 1, Hold("me"))),
        ("delete, failed", lambda i: io.call(store, "delete", dels[f][i], 1, Hold("me"))),
        ("renew, runs in all 6", lambda i: io.call(store, "renew", "me", spread, LONG)),
        ("release, runs in all 6", lambda i: io.call(store, "release", "me", spread)),
        ("claim_ready(10)", lambda i: io.call(store, "claim_ready", "c", LONG, 10)),
        ("claim_expired(10)", lambda i: io.call(store, "claim_expired", "c", LONG, 10)),
        ("claim_ready(10, block=1000)", lambda i: io.call(store, "claim_ready", "c", LONG, 10,
                                                          block=1000)),
        ("claim_expired(10, block=1000)", lambda i: io.call(store, "claim_expired", "c",
                                                            LONG, 10, block=1000)),
        ("claim_ready(10), 1.2 s apart", lambda i: (time.sleep(1.2), since.__setitem__(
            0, time.monotonic()), io.call(store, "claim_ready", "c", LONG, 10))[2]),
        ("now()" + (" (partition 0 failed)" if 0 in down else " (partition 0 healthy)"),
         lambda i: io.call(store, "now")),
        ("quarantined()", lambda i: io.call(store, "quarantined")),
        ("migrate()", lambda i: io.call(store, "migrate")),
        ("a new store's first get, healthy", lambda i: io.call(io.open(), "get",
                                                               held[h][0])),
    ]
    assert victim.process is not None
    pid = victim.process.pid
    if fault == "hung":
        os.kill(pid, signal.SIGSTOP)
    else:
        victim.kill()
    table: dict[str, Any] = {}
    since = [0.0]
    try:
        for name, call in rows:
            times, answers = [], []
            for i in range(repeats):
                since[0] = time.monotonic()  # a row that pauses first sets it after
                try:
                    got = call(i)
                except Exception as exc:
                    got = exc
                times.append((time.monotonic() - since[0]) * 1000)
                answers.append(shown(got))
            table[name] = {"median_ms": statistics.median(times), "max_ms": max(times),
                           "answers": sorted(set(answers))}
            print(f"{shell:7} {fault:6} {name:36} {statistics.median(times):7.1f} "
                  f"{max(times):7.1f}  {', '.join(sorted(set(answers)))}", flush=True)
    finally:
        if fault == "hung":
            os.kill(pid, signal.SIGCONT)
        else:
            victim.start()
        wait_ok(cluster)
        io.close()
    return {"shell": shell, "fault": fault, "down": sorted(down), "rows": table}


def wait_ok(cluster: list[Server]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if all(b"cluster_state:ok" in s.client(socket_timeout=1).execute_command(
                    "CLUSTER", "INFO") for s in cluster):
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("the cluster did not come back")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--shells", default="sync,asyncio")
    parser.add_argument("--faults", default="killed,hung")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench-node-down-"))
    never = ("--cluster-node-timeout", "600000")
    cluster = start_cluster(redis_binary(), folder, extra={i: never for i in range(3)})
    results = []
    try:
        print(f"redis {cluster[0].version()}, {os.cpu_count()} cores; "
              f"shell fault call median max (ms) answers")
        for fault in args.faults.split(","):
            for shell in args.shells.split(","):
                results.append(scenario(cluster, shell, fault, args.repeats))
    finally:
        for server in cluster:
            server.kill()
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
