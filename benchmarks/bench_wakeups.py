"""From "a run becomes claimable" to "a blocked claimer has it", and what idle claimers cost.

On a private Redis (or Valkey) server on loopback, with 1, 8 and 64 claimer threads on one
sync store, each looping on ``claim_ready(..., limit=1, block=...)`` (``claim_expired`` for
lease expiries), this script makes one run claimable at a time and measures, by the
client's monotonic clock, from just before the write is sent (events) or from the due time
(due times, mapped from the server's clock) to the moment a claimer's call returned it:

- events: ``insert`` of a ready run, ``compare_and_set`` of a dependency (its waiter
  becomes ready), ``release`` of a held ready run;
- due times: an ``At`` 30 ms ahead, a lease of 30 ms expiring;
- beside the same claimers polling (no ``block``) every 100 ms and every 10 ms.

The kinds are interleaved round by round; it prints p50 and p99 of each, with the spread
(min-max) of the per-round medians, and the round trip of one ``now()`` for scale. Then it
leaves 8 claimers idle for ``--idle`` seconds, blocked and polling, and prints the server
calls (``INFO commandstats``) and server CPU (``INFO cpu``) they cost::

    python benchmarks/bench_wakeups.py [--rounds 5] [--samples 20] [--idle 20] [--valkey]

``--cluster``: a store of 6 partitions on a local 3-primary cluster, its blocked claimers
woken by wakers per node (sharded pub/sub) beside wakers per partition (``BZPOPMIN``, what
a server without sharded pub/sub gets), interleaved: latency, threads and connections.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
import uuid

import redis
from bench_partitions import start_cluster
from common import own_server, pct, server_binary
from redis.cluster import RedisCluster

from redisstore import (
    Claim,
    Hold,
    RedisRunStore,
    Release,
)
from redisstore.conformance.readiness import rec
from redisstore.core.keys import Keyspace
from redisstore.discovery import json_wait
from redisstore.shells import wakeups

LONG = 600_000


class Claimers:
    """``count`` threads claiming from ``store``, blocked (``block`` ms) or polling every
    ``poll`` s; each run claimed is stamped with the monotonic time its claim returned."""

    def __init__(self, store: RedisRunStore, count: int, *, expired: bool = False,
                 block: int | None = 2000, poll: float = 0.0) -> None:
        self.store, self.expired, self.block, self.poll = store, expired, block, poll
        self.got: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(f"c{i}",), daemon=True)
                        for i in range(count)]
        for thread in self.threads:
            thread.start()

    def _run(self, name: str) -> None:
        claim = self.store.claim_expired if self.expired else self.store.claim_ready
        while not self.stop.is_set():
            runs = claim(name, LONG, 1, block=self.block)
            now = time.monotonic()
            if runs:
                with self.cond:
                    for run in runs:
                        self.got[run] = now
                    self.cond.notify_all()
            elif self.poll:
                time.sleep(self.poll)

    def wait_for(self, run: str, timeout: float = 15.0) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: run in self.got, timeout):
                raise RuntimeError(f"{run} was never claimed")
            return self.got[run]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


def offset_ms(store: RedisRunStore) -> float:
    """Server ms minus client monotonic ms (the midpoint of the best of 20 now() calls)."""
    best = None
    for _ in range(20):
        t0 = time.monotonic()
        now = store.now()
        t1 = time.monotonic()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, now - (t0 + t1) / 2 * 1000)
    assert best is not None
    return best[1]


def measure(client: redis.Redis, kind: str, claimers: int, samples: int,
            block: int | None, poll: float) -> list[float]:
    """Latencies (ms) of ``samples`` runs made claimable one at a time."""
    namespace = f"bench-wake-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(client, namespace=namespace, discover=json_wait)
    store.migrate()
    expired = kind == "lease expiry"
    pool = Claimers(store, claimers, expired=expired, block=block, poll=poll)
    offset = offset_ms(store)
    keys = Keyspace(namespace)
    out: list[float] = []
    time.sleep(0.2)  # let the claimers settle into their wait
    try:
        for i in range(samples):
            run = f"run-{i}"
            if kind == "insert":
                start = time.monotonic()
                store.insert(run, rec({"at": 0}), Release())
            elif kind == "dependency write":
                store.insert(f"dep-{i}", rec(None), Claim("writer", LONG))
                store.insert(run, rec({"changed": f"dep-{i}", "seen": 1}), Release())
                time.sleep(0.02)
                start = time.monotonic()
                store.compare_and_set(f"dep-{i}", 1, rec(None, v=2), Hold("writer"))
            elif kind == "release":
                store.insert(run, rec({"at": 0}), Claim("writer", LONG))
                time.sleep(0.02)
                start = time.monotonic()
                store.release("writer", [run])
            elif kind == "At due":
                due = store.now() + 30
                store.insert(run, rec({"at": due}), Release())
                start = (due - offset) / 1000
            else:  # lease expiry
                store.insert(run, rec(None), Claim("writer", 30))
                expiry = client.zscore(keys.leases, run)
                assert expiry is not None
                start = (expiry - offset) / 1000
            out.append((pool.wait_for(run) - start) * 1000)
            time.sleep(0.005)
    finally:
        pool.close()
        store.close()
    return out


def idle_cost(client: redis.Redis, seconds: float, block: int | None,
              poll: float) -> tuple[float, float, float]:
    """Server calls per claimer per second, BZPOPMIN per second, and server CPU ms per
    second, of 8 idle claimers."""
    namespace = f"bench-wake-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(client, namespace=namespace, discover=json_wait)
    store.now()

    def counters() -> tuple[int, int, float]:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
        return (int(stats.get("cmdstat_evalsha", {}).get("calls", 0)),
                int(stats.get("cmdstat_bzpopmin", {}).get("calls", 0)),
                float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))

    pool = Claimers(store, 8, block=block, poll=poll)
    time.sleep(1.0)
    before = counters()
    time.sleep(seconds)
    after = counters()
    pool.stop.set()
    pool.close()
    store.close()
    return ((after[0] - before[0]) / 8 / seconds, (after[1] - before[1]) / seconds,
            (after[2] - before[2]) * 1000 / seconds)


def cluster_latency(client: RedisCluster, per_node: bool, claimers: int,
                    samples: int) -> tuple[list[float], int, int]:
    """On a store of 6 partitions over the cluster's 3 primaries: latencies (ms) of runs
    inserted one at a time (ids at random, so partitions at random), the store's waker
    threads, and its wakers' connections (every node's clients subscribed to a sharded
    channel or blocked in a command, while the claimers wait)."""
    namespace = f"bench-wake-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(client, namespace=namespace, discover=json_wait, partitions=6)
    if not per_node:  # what a server without sharded pub/sub gets: a waker per partition
        store._ops.sweeps = lambda cluster: None  # type: ignore[method-assign,union-attr]
    store.migrate()
    nodes = client.get_primaries()

    def connections() -> int:
        return sum(1 for n in nodes for c in client.get_redis_connection(n).client_list()
                   if int(c.get("ssub", 0)) > 0 or "b" in c["flags"])

    # The wakers of the stores measured before end first (a BZPOPMIN within the client's
    # socket timeout, a subscription within a second), so the connections counted are ours.
    deadline = time.monotonic() + 15
    while (any(t.name.startswith("redisstore-waker") for t in threading.enumerate())
           and time.monotonic() < deadline):
        time.sleep(0.1)
    threads_before = {t for t in threading.enumerate() if t.name.startswith("redisstore-wak")}
    pool = Claimers(store, claimers)
    out: list[float] = []
    time.sleep(0.3)
    wakers = len({t for t in threading.enumerate()
                  if t.name.startswith("redisstore-wak")} - threads_before)
    opened = connections()
    try:
        for i in range(samples):
            run = f"run-{uuid.uuid4().hex[:6]}-{i}"
            start = time.monotonic()
            store.insert(run, rec({"at": 0}), Release())
            out.append((pool.wait_for(run) - start) * 1000)
            time.sleep(0.005)
    finally:
        pool.close()
        store.close()
    return out, wakers, opened


def cluster_main(args: argparse.Namespace) -> None:
    """--cluster: wakers per node (sharded pub/sub) beside wakers per partition."""
    with contextlib.ExitStack() as stack:
        ports = start_cluster(stack)
        # A socket timeout of 2 s makes a waker's BZPOPMIN 1 s (see wakeups.pop_cap).
        client = RedisCluster(host="127.0.0.1", port=ports[0], socket_timeout=2)
        modes = {"per node": True, "per partition": False}
        results: dict[tuple[str, int], list[list[float]]] = {}
        shape: dict[tuple[str, int], tuple[int, int]] = {}
        for _ in range(args.rounds):
            for claimers in args.claimers:
                for mode, per_node in modes.items():
                    got, wakers, opened = cluster_latency(client, per_node, claimers,
                                                          args.samples)
                    results.setdefault((mode, claimers), []).append(got)
                    shape[mode, claimers] = (wakers, opened)
        print(f"a store of 6 partitions on a 3-primary cluster: ms from insert to claimed "
              f"({args.rounds} rounds x {args.samples}, interleaved)")
        print(f"{'wakers':<15}{'claimers':>9}{'threads':>9}{'conns':>7}{'p50':>8}{'p99':>8}"
              f"{'max':>8}   {'spread of p50':>15}")
        for (mode, claimers), rounds in sorted(results.items(), key=lambda kv: kv[0][1]):
            flat = sorted(v for r in rounds for v in r)
            medians = [statistics.median(r) for r in rounds]
            wakers, opened = shape[mode, claimers]
            print(f"{mode:<15}{claimers:>9}{wakers:>9}{opened:>7}{pct(flat, 0.5):>8.2f}"
                  f"{pct(flat, 0.99):>8.2f}{flat[-1]:>8.2f}   "
                  f"{min(medians):>7.2f}-{max(medians):<7.2f}")
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20, help="per kind and round")
    parser.add_argument("--claimers", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--idle", type=float, default=20.0, help="s of idle measurement")
    parser.add_argument("--valkey", action="store_true")
    parser.add_argument("--cluster", action="store_true",
                        help="a store of 6 partitions on a local 3-primary cluster: wakers "
                             "per node beside wakers per partition")
    args = parser.parse_args()
    if args.cluster:
        cluster_main(args)
        return

    with own_server(server_binary(args.valkey)) as port:
        client = redis.Redis(port=port)
        version = client.info("server").get("valkey_version") or client.info("server")[
            "redis_version"]
        rtt = []
        probe = RedisRunStore(client, namespace="bench-wake-rtt")
        for _ in range(200):
            t0 = time.monotonic()
            probe.now()
            rtt.append((time.monotonic() - t0) * 1000)
        print(f"server {version} on loopback; one now() round trip: p50 "
              f"{statistics.median(rtt):.3f} ms")
        kinds = ["insert", "dependency write", "release", "At due", "lease expiry"]
        modes: list[tuple[str, int | None, float]] = [
            ("block", 2000, 0.0), ("poll 10 ms", None, 0.01), ("poll 100 ms", None, 0.1)]
        results: dict[tuple[str, str, int], list[list[float]]] = {}
        for _ in range(args.rounds):
            for claimers in args.claimers:
                for mode, block, poll in modes:
                    for kind in kinds:
                        if mode != "block" and kind not in ("insert", "At due"):
                            continue
                        got = measure(client, kind, claimers, args.samples, block, poll)
                        results.setdefault((kind, mode, claimers), []).append(got)
        print(f"\nms from claimable to claimed ({args.rounds} rounds x {args.samples}; "
              "spread: min-max of the rounds' medians)")
        print(f"{'kind':<18}{'claimers':>9}  {'mode':<12}{'p50':>8}{'p99':>8}{'max':>8}"
              f"   {'spread of p50':>15}")
        for (kind, mode, claimers), rounds in sorted(
                results.items(), key=lambda kv: (kinds.index(kv[0][0]), kv[0][2], kv[0][1])):
            flat = sorted(v for r in rounds for v in r)
            medians = [statistics.median(r) for r in rounds]
            p50, p99 = pct(flat, 0.5), pct(flat, 0.99)
            print(f"{kind:<18}{claimers:>9}  {mode:<12}{p50:>8.2f}{p99:>8.2f}"
                  f"{flat[-1]:>8.2f}   {min(medians):>7.2f}-{max(medians):<7.2f}")
        # The stores measured above let their wakers' last BZPOPMIN end (REARM s) first:
        # the server counts a blocking command when it returns.
        time.sleep(wakeups.REARM + 1)
        print(f"\n8 idle claimers for {args.idle:g} s:")
        print(f"{'mode':<14}{'claims/claimer/s':>18}{'BZPOPMIN/s':>12}{'server CPU ms/s':>17}")
        for mode, block, poll in [("block 60 s", 60_000, 0.0), *modes[1:]]:
            calls, pops, cpu = idle_cost(client, args.idle, block, poll)
            print(f"{mode:<14}{calls:>18.3f}{pops:>12.3f}{cpu:>17.2f}")


if __name__ == "__main__":
    main()
