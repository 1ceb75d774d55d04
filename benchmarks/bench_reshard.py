"""How long a namespace's keys take to migrate to another server (what a cluster's slot
migration does, ``MIGRATE`` key by key), and how long each ``MIGRATE`` blocks the server.

Two private ``redis-server``s (from PATH) on loopback. The source gets one namespace of
``--runs`` runs (100-byte records; a quarter held, a quarter ready, a quarter waiting on
one of 8 dependencies, a quarter free) at layout 4, plus one run with a 2 MiB record.
Then, each timed with its own ``MIGRATE`` (wall µs, loopback):

- the biggest keys, one at a time: the 2 MiB record, the biggest index bucket, the
  biggest index directory, the meta hash (COPY: they stay, the next row moves them);
- the whole namespace, ``--batch`` keys a ``MIGRATE`` (SCAN order): keys per second, and
  the longest ``MIGRATE`` (the longest the source was blocked).

Nothing is asserted; the figures are printed::

    .venv/bin/python benchmarks/bench_reshard.py [--runs 20000] [--batch 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis
from common import own_server, server_binary

from redisstore import At, Changed, Claim, RedisRunStore, Release
from redisstore.core.keys import Keyspace


def discover(record: bytes) -> object:
    if record.startswith(b"ready"):
        return At(0)
    if record.startswith(b"dep"):
        return Changed(record.decode().split()[1])
    return None


def timed_migrate(source: redis.Redis, port: int, keys: list[bytes], copy: bool) -> float:
    """Seconds one MIGRATE of ``keys`` to the server on ``port`` took."""
    began = time.perf_counter()
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 60_000,
                           *(("COPY", "REPLACE") if copy else ()), "KEYS", *keys)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10, help="keys per MIGRATE")
    args = parser.parse_args()
    binary = server_binary()
    with own_server(binary) as src_port, own_server(binary) as dst_port:
        source = redis.Redis(port=src_port)
        store = RedisRunStore(source, namespace="m", discover=discover,
                              max_record_bytes=2 * 1024 * 1024)
        store.migrate()
        keys = Keyspace("m")
        for i in range(args.runs):
            kind = i % 4
            run = f"run-{i:08d}"
            if kind == 0:
                store.insert(run, b"x" * 100, Claim("node", 3_600_000))
            elif kind == 1:
                store.insert(run, b"ready" + b"x" * 95, Release())
            elif kind == 2:
                store.insert(run, f"dep d{i % 8} ".encode().ljust(100, b"x"), Release())
            else:
                store.insert(run, b"x" * 100, Release())
        store.insert("big", b"y" * (2 * 1024 * 1024), Release())
        everything = sorted(source.scan_iter(match="{m}:*", count=1000))
        sizes = {k: source.memory_usage(k) or 0 for k in everything}
        buckets = [k for k in everything if b"|" in k]
        directories = [k for k in everything if k.endswith(b"/")]
        biggest_bucket = max(buckets, key=lambda k: source.zcard(k))
        biggest_dir = max(directories, key=lambda k: source.zcard(k))
        rows = [
            ("record of 2 MiB", keys.run("big").encode()),
            (f"biggest bucket ({source.zcard(biggest_bucket)} entries)", biggest_bucket),
            (f"biggest directory ({source.zcard(biggest_dir)} buckets)", biggest_dir),
            ("meta", keys.meta.encode()),
        ]
        print(f"{binary}: {args.runs:,} runs, {len(everything):,} keys, "
              f"{sum(sizes.values()) / 1e6:.1f} MB by MEMORY USAGE")
        for name, key in rows:
            took = [timed_migrate(source, dst_port, [key], copy=True) for _ in range(5)]
            redis.Redis(port=dst_port).delete(key)
            print(f"  {name:36} {sizes.get(key, 0) / 1024:>9,.1f} KiB  "
                  f"median {statistics.median(took) * 1e6:>8,.0f} µs  "
                  f"max {max(took) * 1e6:>8,.0f} µs")
        calls: list[float] = []
        began = time.perf_counter()
        for i in range(0, len(everything), args.batch):
            calls.append(timed_migrate(source, dst_port, everything[i:i + args.batch],
                                       copy=False))
        total = time.perf_counter() - began
        print(f"  whole namespace, {args.batch} keys a MIGRATE: {len(everything):,} keys in "
              f"{total:.2f} s ({len(everything) / total:,.0f} keys/s, "
              f"{args.runs / total:,.0f} runs/s); MIGRATE median "
              f"{statistics.median(calls) * 1e6:,.0f} µs, max {max(calls) * 1e6:,.0f} µs")
        print(f"  at that rate a namespace of 1,000,000 runs migrates in about "
              f"{1_000_000 / (args.runs / total):,.0f} s")
        assert source.dbsize() == 0 or not list(source.scan_iter(match="{m}:*"))


if __name__ == "__main__":
    main()
