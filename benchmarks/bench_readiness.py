"""claim_ready and claim_expired latency against the number of stored runs.

Both claims take runs from the head of a sorted set, so a claim of 100 runs should cost
about the same with 10,000 or with 1,000,000 runs stored, most of them not eligible. This
script stores each population in its own namespace on a private server (held runs with a
live lease, and free runs waiting for a far-off time: both indexes hold every one of them),
adds the eligible runs the timed calls take, and times claim_ready(limit=100) and
claim_expired(limit=100) with a trivial EVALSHA interleaved (the machine's own drift).
It also reports the server memory per stored run (INFO used_memory, 100-byte records)::

    python benchmarks/bench_readiness.py [--sizes 10000 1000000] [--calls 30] [--valkey]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable

import redis
from common import own_server, pct, server_binary

from redisstore import At, Claim, RedisRunStore, Release
from redisstore.core import scripts
from redisstore.core.runops import RunOps
from redisstore.discovery import json_wait

LIMIT = 100
LONG = 3_600_000_000  # ms: far beyond the benchmark
PAD = "x" * 60


def record(wait: At | None) -> bytes:
    """A 100-byte JSON record with the given wait."""
    body = {"wait": None if wait is None else {"at": wait.due}, "pad": PAD}
    raw = json.dumps(body).encode()
    return raw + b" " * max(0, 100 - len(raw))


def fill(client: redis.Redis, namespace: str, n: int, far: int, batch: int = 2000) -> None:
    """n runs that no claim takes: half held live, half free waiting until ``far``."""
    ops = RunOps(namespace, json_wait, 1)
    client.script_load(scripts.RUN_INSERT.source)
    held, waiting = record(None), record(At(far))
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        if i % 2:
            call = next(ops.insert(f"bg-{i}", held, Claim("busy", LONG)))
        else:
            call = next(ops.insert(f"bg-{i}", waiting, Release()))
        pipe.execute_command(*call.command())  # type: ignore[no-untyped-call]
        if i % batch == batch - 1:
            pipe.execute()
    pipe.execute()


def timed(call: Callable[[], object], base: Callable[[], object], n: int,
          ) -> tuple[list[float], list[float]]:
    """Latencies (µs) of n calls, each followed by one trivial call (the drift yardstick)."""
    mine: list[float] = []
    trivial: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        middle = time.perf_counter()
        base()
        mine.append((middle - start) * 1e6)
        trivial.append((time.perf_counter() - middle) * 1e6)
    return mine, trivial


def measure(client: redis.Redis, size: int, calls: int) -> dict[str, float]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(client, namespace=namespace, discover=json_wait)
    far = store.now() + LONG
    before = int(client.info("memory")["used_memory"])
    started = time.perf_counter()
    fill(client, namespace, size, far)
    fill_s = time.perf_counter() - started
    per_run = (int(client.info("memory")["used_memory"]) - before) / size
    for i in range(calls * LIMIT):
        store.insert(f"ready-{i}", record(At(0)), Release())
        store.insert(f"expired-{i}", record(None), Claim("dead", 1))
    time.sleep(0.01)
    sha = str(client.script_load("return 1"))

    def trivial() -> object:
        return client.evalsha(sha, 0)

    def ready() -> object:
        assert len(store.claim_ready("me", LONG, LIMIT)) == LIMIT
        return None

    def expired() -> object:
        assert len(store.claim_expired("me", LONG, LIMIT)) == LIMIT
        return None

    ready_us, base_ready = timed(ready, trivial, calls)
    expired_us, base_expired = timed(expired, trivial, calls)
    return {"size": size, "fill_s": fill_s, "bytes_per_run": per_run,
            "ready_p50": statistics.median(ready_us), "ready_p99": pct(ready_us, .99),
            "expired_p50": statistics.median(expired_us), "expired_p99": pct(expired_us, .99),
            "trivial_p50": statistics.median(base_ready + base_expired)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--calls", type=int, default=30, help="timed calls of each claim")
    parser.add_argument("--valkey", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    binary = server_binary(args.valkey)
    with own_server(binary) as port:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=120)
        print(f"server {client.info('server')['redis_version']} ({binary}), "
              f"limit={LIMIT}, {args.calls} timed calls per claim and size")
        rows = [measure(client, size, args.calls) for size in args.sizes]
    print(f"{'stored runs':>12} {'fill s':>7} {'B/run':>7} {'claim_ready p50/p99 µs':>24} "
          f"{'claim_expired p50/p99 µs':>26} {'trivial p50 µs':>15}")
    for r in rows:
        print(f"{r['size']:>12,} {r['fill_s']:>7.1f} {r['bytes_per_run']:>7.0f} "
              f"{r['ready_p50']:>13.0f} / {r['ready_p99']:<8.0f} "
              f"{r['expired_p50']:>15.0f} / {r['expired_p99']:<8.0f} {r['trivial_p50']:>15.0f}")
    small, large = rows[0], rows[-1]
    for name in ("ready", "expired"):
        raw = large[f"{name}_p50"] / small[f"{name}_p50"]
        drift = large["trivial_p50"] / small["trivial_p50"]
        verdict = "ok" if raw <= 1.5 else "MISSED"
        print(f"claim_{name}: p50 {large['size']:,} / {small['size']:,} = {raw:.2f} "
              f"(target <= 1.5: {verdict}); the trivial call moved {drift:.2f}x meanwhile")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
