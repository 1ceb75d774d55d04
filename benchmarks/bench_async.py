"""compare_and_set throughput of ``AsyncRedisRunStore``: 64 tasks over one async client,
beside 1 task, beside the sync store from one thread, beside the server's own limit for the
same script (``redis-benchmark``, 64 clients, the same EVALSHA), in one run:

    python benchmarks/bench_async.py [--seconds S] [--rounds R]
                                                      [--tasks N] [--record-size B]

It starts its own ``redis-server`` (from PATH) on a free loopback port, with nothing on
disk, and stops it at the end; it never touches 127.0.0.1:6379.

Every store call is one ``compare_and_set(run, expected, record, Release())`` that
succeeds: each task (or the sync loop) writes the next revision of a run of its own, so
nothing conflicts. ``redis-benchmark`` cannot track revisions, so it sends the same EVALSHA
(same script, same key layout, same arguments: ``Release``, expected revision 1, a record
of the same size) to a random run among many runs inserted at revision 1 (``-r``,
``__rand_int__``): a run's first hit is a successful compare_and_set, a later one takes
the cheaper conflict path. The share of successful calls is counted afterwards and shown.
The server's CPU time per call (``INFO commandstats``, µs per EVALSHA) is shown for every
row: ``1e6 / µs`` is what one server thread could do if it did nothing else.

Rows are measured in rounds, interleaved (throughput on a shared machine drifts); the
table shows medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

# Run from a checkout without installing: ``import redisstore`` finds the repository's.
import redis
import redis.asyncio
from common import own_server

from redisstore import AsyncRedisRunStore, RedisRunStore, Release
from redisstore.core import scripts
from redisstore.core.keys import Keyspace
from redisstore.core.runops import RunOps


@dataclass
class Row:
    """One measurement: ops/s and the server's µs of CPU per EVALSHA."""

    ops: float
    usec: float
    note: str = ""


def evalsha_usec(client: redis.Redis) -> float:
    """µs per EVALSHA call since the last CONFIG RESETSTAT (the server's own accounting)."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", 0.0))


def fresh_runs(client: redis.Redis, namespace: str, names: list[str], record: bytes) -> None:
    """Insert ``names`` at revision 1, free, through the store's own insert script."""
    ops = RunOps(namespace, None, 1)
    for start in range(0, len(names), 2000):
        pipe = client.pipeline(transaction=False)
        for name in names[start:start + 2000]:
            call = next(ops.insert(name, record, Release()))
            pipe.execute_command(*call.command())  # type: ignore[no-untyped-call]
        pipe.execute()


# ---------------------------------------------------------------------------- rows


def sync_row(client: redis.Redis, seconds: float, record: bytes) -> Row:
    """The sync store, one thread, sequential calls."""
    namespace = f"bench-{uuid.uuid4().hex}"
    store = RedisRunStore(client, namespace=namespace)
    store.insert("run", record, Release())
    client.config_resetstat()
    revision, done = 1, 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            store.compare_and_set("run", revision, record, Release())
            revision += 1
        done += 50
    elapsed = time.perf_counter() - started
    return Row(done / elapsed, evalsha_usec(client))


async def async_row(port: int, tasks: int, seconds: float, record: bytes,
                    stats: redis.Redis) -> Row:
    """``tasks`` asyncio tasks over one ``redis.asyncio`` client, each on its own run."""
    client = redis.asyncio.Redis(host="127.0.0.1", port=port,
                                 max_connections=max(tasks, 1) + 8)
    namespace = f"bench-{uuid.uuid4().hex}"
    store = AsyncRedisRunStore(client, namespace=namespace)
    for n in range(tasks):
        await store.insert(f"run-{n}", record, Release())
    revisions = [1] * tasks  # each task's run, at the revision it last wrote
    loop = asyncio.get_running_loop()

    async def writer(n: int, deadline: float) -> None:
        while loop.time() < deadline:
            await store.compare_and_set(f"run-{n}", revisions[n], record, Release())
            revisions[n] += 1

    # Warm the pool (one connection per task) outside the timed part.
    await asyncio.gather(*(writer(n, loop.time() + 0.2) for n in range(tasks)))
    before = sum(revisions)
    stats.config_resetstat()
    started = loop.time()
    await asyncio.gather(*(writer(n, started + seconds) for n in range(tasks)))
    elapsed = loop.time() - started
    usec = evalsha_usec(stats)
    await client.aclose()
    return Row((sum(revisions) - before) / elapsed, usec)


def server_row(client: redis.Redis, port: int, clients: int, requests: int, runs: int,
               record: bytes) -> Row:
    """``redis-benchmark -c clients -n requests EVALSHA`` of compare_and_set."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return Row(float("nan"), float("nan"), "no redis-benchmark on PATH")
    namespace = f"bench-{uuid.uuid4().hex}"
    names = [f"{i:012d}" for i in range(runs)]  # what __rand_int__ expands to
    fresh_runs(client, namespace, names, record)
    keys = Keyspace(namespace)
    sha = client.script_load(scripts.RUN_COMPARE_AND_SET.source)
    # KEYS: run, leases, ready; ARGV: prefix, run, expected, record, lease kind, owner, ttl,
    # wait (kind, key, number, deadline: none), projection version. Each __rand_int__ is
    # drawn on its own: the run id in ARGV[2] names index entries only, of the same cost.
    command = ["EVALSHA", sha, "3", keys.run("__rand_int__"), keys.leases, keys.ready,
               keys.prefix, "__rand_int__", "1", record.decode(), "r", "", "0",
               "", "", "", "", "1"]
    client.config_resetstat()
    out = subprocess.run(
        [binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-n", str(requests),
         "-r", str(runs), "-q", *command],
        capture_output=True, text=True, check=True).stdout
    usec = evalsha_usec(client)
    found = re.search(r"([\d.]+) requests per second", out)
    if found is None:
        raise SystemExit(f"could not read redis-benchmark's output: {out!r}")
    # Successful compare_and_sets: runs that reached revision 2.
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hget(keys.run(name), "rev")
    succeeded = sum(1 for rev in pipe.execute() if rev == b"2")
    return Row(float(found.group(1)), usec,
               f"{succeeded / requests:.0%} of calls were successful CAS, the rest conflicts")


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=2.0, help="per row per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--record-size", type=int, default=128)
    parser.add_argument("--requests", type=int, default=100_000,
                        help="redis-benchmark requests per round")
    args = parser.parse_args(argv)
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("no redis-server on PATH")
    record = b"x" * args.record_size  # ASCII: redis-benchmark takes it as an argument
    rows: dict[str, list[Row]] = {}
    with own_server(binary) as port:
        client = redis.Redis(host="127.0.0.1", port=port)
        version = client.info("server")["redis_version"]
        for _ in range(args.rounds):
            rows.setdefault("sync store, 1 thread", []).append(
                sync_row(client, args.seconds, record))
            rows.setdefault("async store, 1 task", []).append(
                asyncio.run(async_row(port, 1, args.seconds, record, client)))
            rows.setdefault(f"async store, {args.tasks} tasks, 1 client", []).append(
                asyncio.run(async_row(port, args.tasks, args.seconds, record, client)))
            rows.setdefault(f"redis-benchmark -c {args.tasks}, same EVALSHA", []).append(
                server_row(client, port, args.tasks, args.requests, 3 * args.requests,
                           record))
        client.close()
    hiredis = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python parser"
    print(f"compare_and_set(Release), {args.record_size}-byte records; Redis {version} on "
          f"127.0.0.1:{port}; redis-py {redis.__version__} ({hiredis}); Python "
          f"{sys.version.split()[0]}; median of {args.rounds} rounds x {args.seconds:g} s")
    names = list(rows)
    medians = {name: statistics.median(r.ops for r in rows[name]) for name in names}
    base = medians[names[0]]
    limit = medians[names[-1]]
    print(f"{'':44} {'ops/s':>9} {'x sync':>7} {'x server':>9} {'server µs/call':>15}")
    for name in names:
        usec = statistics.median(r.usec for r in rows[name])
        print(f"{name:44} {medians[name]:9.0f} {medians[name] / base:7.2f} "
              f"{medians[name] / limit:9.2f} {usec:15.2f}")
    notes = {r.note for r in rows[names[-1]] if r.note}
    for note in sorted(notes):
        print(f"  redis-benchmark: {note}")
    per_round = ", ".join(f"{r.ops:.0f}" for r in rows[names[2]])
    print(f"  {names[2]} per round: {per_round}")


if __name__ == "__main__":
    main()
