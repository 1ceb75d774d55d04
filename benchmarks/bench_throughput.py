"""Throughput side by side: the run store's work unit beside BullMQ's job cycle, the Python
EVALSHA floors and a Postgres lease table, in one run on servers it starts itself.

    python benchmarks/bench_throughput.py [--jobs N] [--rounds 5] [--seconds S] [--no-peers]
        [--json]

A **work unit** is what a worker does per run: take it with its record, work (nothing
here), write its final record and release it. Rows (each drains its own ``--jobs`` ready
runs, untimed to fill, timed to drain; units/s = jobs / drain time):

- ``unit, 3 round trips``: ``claim_ready(limit=1)``, ``get``, ``compare_and_set(done,
  Release())``: the unit as it had to be written before claims handed back records;
- ``unit, concurrency 1``: ``claim_ready(1, records=True)`` once, then per run one
  pipeline of ``compare_and_set(done, Release())`` + the next ``claim_ready(1,
  records=True)``: one round trip per unit, sync, one thread;
- ``unit, concurrency 50``: the same loop in 50 asyncio tasks sharing one
  ``AsyncRedisRunStore`` on a default ``redis.asyncio.Redis()``;
- ``batched 100``: ``claim_ready(100, records=True)``, then one pipeline of the 100
  ``compare_and_set`` releases;
- BullMQ's job cycle at concurrency 1 and 50 (``benchmarks/peers.py``: no-op processor,
  jobs removed on completion), when ``node`` and ``npm`` are there.

Floors and single operations (timed for ``--seconds``):

- ``EVALSHA floor, raw socket + hiredis, sequential``: ``EVALSHA`` of ``return 1`` written
  to a plain socket and its reply parsed by ``hiredis.Reader``, one call at a time: the
  round trip with no client library around it;
- ``EVALSHA floor, sequential``: ``evalsha`` of ``return 1`` in a loop (sync redis-py);
- ``EVALSHA floor, 50 tasks`` / ``64 tasks``: the same from that many asyncio tasks on a
  default ``redis.asyncio.Redis()`` (and on coredis, which multiplexes by design, when it
  is installed);
- ``async compare_and_set, 64 tasks``: each task writes the next revision of its own run;
- ``compare_and_set, sync`` and ``claim_expired(100)`` (leases/s), on Redis with AOF off,
  with ``appendfsync everysec`` and with ``appendfsync always``, beside a private Postgres
  15 cluster's lease table (``UPDATE ... WHERE rev = $3``; ``FOR UPDATE SKIP LOCKED``
  batches of 100, from 1 and 4 connections) with ``synchronous_commit`` and fsync on,
  with ``synchronous_commit`` off (fsync on: a commit may lose its last 200 ms on a crash,
  as ``everysec`` may lose its last second), and with both off.

Rows are interleaved: every round (``--rounds``, default 5) runs each row once, and the
table gives the median over rounds with the spread (min-max). ``server µs`` is the server's
time per unit in the commands sent (``INFO commandstats`` usec of EVALSHA and the like, over
the row / units: the commands a script calls are inside its time); ``CPU µs`` is the server
process's CPU per unit (``INFO cpu`` used_cpu_sys + used_cpu_user before and after the row:
every thread, the event loop and I/O too), for BullMQ read by its script from the Redis
its Worker drains, over the timed drain; ``client µs`` is wall time per unit (for the
concurrent rows the time per unit of the whole, not of one task). The ratios table divides
medians (throughput, or CPU per unit for the CPU rows) and gives the spread of the same
ratio taken round by round (the two rows of a round ran a minute apart at most). The
servers are its own (``redis-server`` from PATH, on free loopback ports, nothing kept on
disk but the AOF servers' files in temporary folders), stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from common import ROOT, own_server, server_binary

sys.path.insert(0, str(ROOT))
from redisstore import (
    AsyncRedisRunStore,
    At,
    Claim,
    RedisRunStore,
    Release,
)

LONG = 600_000
DONE = b'{"done": true}'
TODO = b'{"step": 1, "pad": "' + b"x" * 70 + b'"}'  # 100 bytes, like BullMQ's small job data


def discover(record: bytes) -> At | None:
    """Ready at once until done."""
    return None if record == DONE else At(0)


@dataclass
class Row:
    name: str
    unit: str
    rates: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    client_us: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    note: str = ""

    def add(self, rate: float, server: float = float("nan"), client: float = float("nan"),
            cpu: float = float("nan")) -> None:
        self.rates.append(rate)
        for values, value in ((self.server_us, server), (self.client_us, client),
                              (self.cpu_us, cpu)):
            if value == value:  # not nan
                values.append(value)

    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


#: The commands clients send here. The commands a script calls are counted in their own
#: commandstats too, inside the script's time: summing every row would count them twice.
TOP_LEVEL = ("evalsha", "eval", "script", "wait", "waitaof", "config", "command", "ping")


def server_usec(client: redis.Redis) -> int:
    """The server's CPU µs spent in the commands clients sent (INFO commandstats)."""
    return sum(int(v["usec"]) for k, v in client.info("commandstats").items()
               if k.startswith("cmdstat_")
               and k.removeprefix("cmdstat_").split("|")[0] in TOP_LEVEL)


def server_cpu(client: redis.Redis) -> float:
    """The server process's CPU seconds so far (INFO cpu: used_cpu_sys + used_cpu_user,
    every thread of it)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def fill(client: redis.Redis, namespace: str, jobs: int) -> RedisRunStore:
    """``jobs`` ready runs, inserted in pipelines (untimed)."""
    store = RedisRunStore(client, namespace=namespace, discover=discover)
    store.migrate()
    for start in range(0, jobs, 100):
        with store.pipeline() as pipe:
            for i in range(start, min(start + 100, jobs)):
                pipe.insert(f"job-{i:07d}", TODO, Release())
    return store


def drain_three(store: RedisRunStore) -> int:
    done = 0
    while claimed := store.claim_ready("w", LONG, 1):
        current = store.get(claimed[0])
        store.compare_and_set(claimed[0], current.revision, DONE, Release())
        done += 1
    return done


def drain_one(store: RedisRunStore) -> int:
    done = 0
    got = store.claim_ready("w", LONG, 1, records=True)
    while got:
        run = got[0]
        with store.pipeline() as pipe:
            pipe.compare_and_set(run.run, run.current.revision, DONE, Release())
            nxt = pipe.claim_ready("w", LONG, 1, records=True)
        done += 1
        got = nxt.result()
    return done


def drain_batched(store: RedisRunStore) -> int:
    done = 0
    while got := store.claim_ready("w", LONG, 100, records=True):
        with store.pipeline() as pipe:
            for run in got:
                pipe.compare_and_set(run.run, run.current.revision, DONE, Release())
        done += len(got)
    return done


async def drain_async(port: int, namespace: str, tasks: int) -> int:
    client = redis.asyncio.Redis(host="127.0.0.1", port=port)
    store = AsyncRedisRunStore(client, namespace=namespace, discover=discover)
    done = 0

    async def worker(me: str) -> None:
        nonlocal done
        got = await store.claim_ready(me, LONG, 1, records=True)
        while got:
            run = got[0]
            async with store.pipeline() as pipe:
                pipe.compare_and_set(run.run, run.current.revision, DONE, Release())
                nxt = pipe.claim_ready(me, LONG, 1, records=True)
            done += 1
            got = nxt.result()

    await asyncio.gather(*(worker(f"w{i}") for i in range(tasks)))
    await store.aclose()
    await client.aclose()
    return done


def timed(admin: redis.Redis, work: Callable[[], int]) -> tuple[float, float, float, float]:
    """(units/s, server µs per unit in commands, client µs per unit, server process CPU µs
    per unit) of ``work``, which returns units."""
    before, cpu = server_usec(admin), server_cpu(admin)
    started = time.perf_counter()
    units = work()
    wall = time.perf_counter() - started
    server, cpu = server_usec(admin) - before, server_cpu(admin) - cpu
    if units == 0:
        return 0.0, float("nan"), float("nan"), float("nan")
    return units / wall, server / units, wall * 1e6 / units, cpu * 1e6 / units


def for_seconds(seconds: float, step: Callable[[], int]) -> int:
    end = time.perf_counter() + seconds
    units = 0
    while time.perf_counter() < end:
        units += step()
    return units


async def async_for_seconds(seconds: float, tasks: int,
                            step: Callable[[int], Any]) -> int:
    end = time.perf_counter() + seconds
    counts = [0] * tasks

    async def one(i: int) -> None:
        while time.perf_counter() < end:
            await step(i)
            counts[i] += 1

    await asyncio.gather(*(one(i) for i in range(tasks)))
    return sum(counts)


def evalsha_floor(port: int, seconds: float) -> Callable[[], int]:
    client = redis.Redis(host="127.0.0.1", port=port)
    sha = client.script_load("return 1")
    return lambda: for_seconds(seconds, lambda: client.evalsha(sha, 0) and 1)


def raw_floor(port: int, seconds: float) -> Callable[[], int]:
    """EVALSHA of ``return 1`` over a raw socket, parsed by ``hiredis.Reader``, one call at a
    time: the round trip with no client library around it (the floor under every client)."""
    import hiredis

    def command(*parts: bytes) -> bytes:
        out = [b"*%d\r\n" % len(parts)]
        for part in parts:
            out.append(b"$%d\r\n%s\r\n" % (len(part), part))
        return b"".join(out)

    def run() -> int:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = hiredis.Reader()

            def call(packed: bytes) -> Any:
                sock.sendall(packed)
                while (reply := reader.gets()) is False:
                    reader.feed(sock.recv(65536))
                return reply

            sha = call(command(b"SCRIPT", b"LOAD", b"return 1"))
            packed = command(b"EVALSHA", sha, b"0")
            return for_seconds(seconds, lambda: call(packed))
    return run


def async_floor(port: int, seconds: float, tasks: int) -> Callable[[], int]:
    def run() -> int:
        async def main() -> int:
            client = redis.asyncio.Redis(host="127.0.0.1", port=port)
            sha = await client.script_load("return 1")
            n = await async_for_seconds(seconds, tasks, lambda i: client.evalsha(sha, 0))
            await client.aclose()
            return n
        return asyncio.run(main())
    return run


def coredis_floor(port: int, seconds: float, tasks: int) -> Callable[[], int] | None:
    """The EVALSHA floor through coredis, which multiplexes by design (None: not
    installed): what a client kind that pipelines for us would give at the floor."""
    try:
        import coredis
    except ImportError:
        return None

    def run() -> int:
        async def main() -> int:
            client = coredis.Redis(host="127.0.0.1", port=port)
            async with client:
                sha = await client.script_load("return 1")
                return await async_for_seconds(seconds, tasks, lambda i: client.evalsha(sha))
        return asyncio.run(main())
    return run


def async_cas(port: int, seconds: float, tasks: int, namespace: str) -> Callable[[], int]:
    def run() -> int:
        async def main() -> int:
            client = redis.asyncio.Redis(host="127.0.0.1", port=port)
            store = AsyncRedisRunStore(client, namespace=namespace)
            await store.migrate()  # layout 2, as README's start-up does
            revisions = [1] * tasks
            for i in range(tasks):
                await store.insert(f"cas-{i}", TODO, Release())

            async def step(i: int) -> None:
                await store.compare_and_set(f"cas-{i}", revisions[i], TODO, Release())
                revisions[i] += 1

            n = await async_for_seconds(seconds, tasks, step)
            await store.aclose()
            await client.aclose()
            return n
        return asyncio.run(main())
    return run


def sync_cas(client: redis.Redis, namespace: str, seconds: float) -> Callable[[], int]:
    store = RedisRunStore(client, namespace=namespace)
    store.migrate()  # layout 2, as README's start-up does
    runs = [f"cas-{i}" for i in range(1000)]
    with store.pipeline() as pipe:
        for run in runs:
            pipe.insert(run, TODO, Release())
    revisions = dict.fromkeys(runs, 1)
    i = 0

    def step() -> int:
        nonlocal i
        run = runs[i % len(runs)]
        i += 1
        store.compare_and_set(run, revisions[run], TODO, Release())
        revisions[run] += 1
        return 1

    return lambda: for_seconds(seconds, step)


def claim_expired(client: redis.Redis, namespace: str, leases: int) -> Callable[[], int]:
    """Fill ``leases`` expired leases now (untimed); the work claims them all, 100 a call."""
    store = RedisRunStore(client, namespace=namespace)
    store.migrate()
    for start in range(0, leases, 100):
        with store.pipeline() as pipe:
            for i in range(start, min(start + 100, leases)):
                pipe.insert(f"l-{i:07d}", TODO, Claim("dead", 1))
    time.sleep(0.01)

    def run() -> int:
        n = 0
        while got := store.claim_expired("me", LONG, 100):
            n += len(got)
        return n
    return run


def med(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f}" if values else ""


def table(rows: list[Row]) -> str:
    lines = [f"{'row':<58} {'median':>10} {'spread':>17} {'server µs':>9} {'CPU µs':>8} "
             f"{'client µs':>9}", "-" * 116]
    for row in rows:
        if not row.rates:
            lines.append(f"{row.name:<58} {'-':>10}   {row.note}")
            continue
        spread = f"{min(row.rates):,.0f}-{max(row.rates):,.0f}"
        lines.append(f"{row.name:<58} {row.median():>10,.0f} {spread:>17} "
                     f"{med(row.server_us):>9} {med(row.cpu_us):>8} {med(row.client_us):>9}"
                     f"  {row.unit}")
    return "\n".join(lines)


@dataclass
class Ratio:
    label: str
    a: str
    b: str
    target: str = ""
    cpu: bool = False  # server CPU per unit (a / b), else throughput (a / b)

    def values(self, rows: dict[str, Row]) -> tuple[float, list[float]] | None:
        """(ratio of the medians, the per-round ratios), or None when a row is missing."""
        if self.a not in rows or self.b not in rows:
            return None
        a, b = rows[self.a], rows[self.b]
        va, vb = (a.cpu_us, b.cpu_us) if self.cpu else (a.rates, b.rates)
        if not va or not vb:
            return None
        rounds = [x / y for x, y in zip(va, vb, strict=False) if y] if len(va) == len(vb) \
            else []
        return statistics.median(va) / statistics.median(vb), rounds


RATIOS = [
    Ratio("compare_and_set sync (AOF off) / raw-socket EVALSHA floor",
          "compare_and_set, sync, AOF off", "EVALSHA floor, raw socket + hiredis, sequential"),
    Ratio("compare_and_set / Postgres CAS: everysec vs sync commit off",
          "compare_and_set, sync, appendfsync everysec",
          "Postgres CAS, 1 connection, sync commit off (fsync on)", ">= 3x"),
    Ratio("compare_and_set / Postgres CAS: AOF off vs both off",
          "compare_and_set, sync, AOF off", "Postgres CAS, 1 connection, both off", ">= 3x"),
    Ratio("compare_and_set / Postgres CAS: always vs fsync on",
          "compare_and_set, sync, appendfsync always",
          "Postgres CAS, 1 connection, sync commit + fsync on", ">= 3x"),
    Ratio("work unit c=1 / BullMQ c=1", "unit, concurrency 1 (records + pipeline)",
          "BullMQ job cycle, concurrency 1", ">= 1.5x"),
    Ratio("work unit c=1 / sequential EVALSHA floor (redis-py)",
          "unit, concurrency 1 (records + pipeline)", "EVALSHA floor, sequential", ">= 0.8x"),
    Ratio("work unit 50 tasks / BullMQ c=50", "unit, concurrency 50 (asyncio, default client)",
          "BullMQ job cycle, concurrency 50", ">= 1.0x"),
    Ratio("server CPU per unit c=1 / BullMQ per job c=1",
          "unit, concurrency 1 (records + pipeline)", "BullMQ job cycle, concurrency 1",
          cpu=True),
    Ratio("server CPU per unit 50 tasks / BullMQ per job c=50",
          "unit, concurrency 50 (asyncio, default client)", "BullMQ job cycle, concurrency 50",
          cpu=True),
    Ratio("claim_expired(100) / Postgres SKIP LOCKED 1 conn: AOF off vs both off",
          "claim_expired(100), AOF off", "Postgres SKIP LOCKED claim 100, 1 conn, both off",
          ">= 5x"),
    Ratio("claim_expired(100) / Postgres SKIP LOCKED 1 conn: everysec vs sync commit off",
          "claim_expired(100), appendfsync everysec",
          "Postgres SKIP LOCKED claim 100, 1 conn, sync commit off (fsync on)", ">= 5x"),
    Ratio("async compare_and_set 64 tasks / 64-task redis.asyncio floor",
          "async compare_and_set, 64 tasks", "EVALSHA floor, 64 tasks", ">= 0.8x"),
    Ratio("unit c=1: records + pipeline / 3 round trips",
          "unit, concurrency 1 (records + pipeline)", "unit, 3 round trips (claim, get, cas)"),
]


def ratio_table(rows: dict[str, Row]) -> tuple[str, dict[str, Any]]:
    lines = [f"{'ratio (CPU rows: server CPU per unit, a / b)':<78} {'median':>7} "
             f"{'rounds':>12} {'target':>8}", "-" * 108]
    out: dict[str, Any] = {}
    for r in RATIOS:
        got = r.values(rows)
        if got is None:
            lines.append(f"{r.label:<78} {'n/a':>7}")
            continue
        value, rounds = got
        spread = f"{min(rounds):.2f}-{max(rounds):.2f}" if rounds else ""
        lines.append(f"{r.label:<78} {value:>6.2f}x {spread:>12} {r.target:>8}")
        out[r.label] = {"median": value, "rounds": rounds, "target": r.target}
    return "\n".join(lines), out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000, help="runs (jobs) per drain row")
    parser.add_argument("--seconds", type=float, default=2.0, help="per timed row")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-peers", action="store_true", help="skip BullMQ and Postgres")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    peers: Any = None
    if not args.no_peers:
        import peers  # beside this file

    rows: dict[str, Row] = {}

    def row(name: str, unit: str) -> Row:
        return rows.setdefault(name, Row(name, unit))

    binary = server_binary(False)
    with own_server(binary) as port, \
            own_server(binary, args=("--appendonly", "yes", "--appendfsync", "everysec")) \
            as everysec_port, \
            own_server(binary, args=("--appendonly", "yes", "--appendfsync", "always")) \
            as aof_port:
        admin = redis.Redis(host="127.0.0.1", port=port)
        everysec = redis.Redis(host="127.0.0.1", port=everysec_port)
        aof = redis.Redis(host="127.0.0.1", port=aof_port)
        version = admin.info("server")["redis_version"]
        bullmq = "--no-peers" if args.no_peers else peers.bullmq_available()
        pg = "--no-peers" if args.no_peers else peers.postgres_available()
        print(f"Redis {version} on 127.0.0.1:{port} (and {everysec_port}: appendfsync "
              f"everysec, {aof_port}: appendfsync always); {os.cpu_count()} CPUs; "
              f"load {os.getloadavg()[0]:.2f}; redis-py {redis.__version__}; "
              f"Python {platform.python_version()}")
        if bullmq is None:
            print(f"BullMQ: {peers.bullmq_versions()}")
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", flush=True)
            tag = f"r{r}-{time.monotonic_ns()}"

            def drain(name: str, how: Callable[[RedisRunStore], int], tag: str = tag) -> None:
                store = fill(admin, f"tp-{name[:8]}-{tag}", args.jobs)
                row(name, "units/s").add(*timed(admin, lambda: how(store)))

            drain("unit, 3 round trips (claim, get, cas)", drain_three)
            drain("unit, concurrency 1 (records + pipeline)", drain_one)
            namespace = f"tp-async-{tag}"
            fill(admin, namespace, args.jobs)
            row("unit, concurrency 50 (asyncio, default client)", "units/s").add(*timed(
                admin, lambda ns=namespace: asyncio.run(drain_async(port, ns, 50))))
            drain("batched 100 (claim 100 + pipeline of 100)", drain_batched)

            extra = coredis_floor(port, args.seconds, 64)
            if extra is not None:
                row("EVALSHA floor, 64 tasks, coredis", "calls/s").add(*timed(admin, extra))
            for name, target, work, unit in [
                ("EVALSHA floor, raw socket + hiredis, sequential", admin,
                 raw_floor(port, args.seconds), "calls/s"),
                ("EVALSHA floor, sequential", admin, evalsha_floor(port, args.seconds),
                 "calls/s"),
                ("EVALSHA floor, 50 tasks", admin, async_floor(port, args.seconds, 50),
                 "calls/s"),
                ("EVALSHA floor, 64 tasks", admin, async_floor(port, args.seconds, 64),
                 "calls/s"),
                ("async compare_and_set, 64 tasks", admin,
                 async_cas(port, args.seconds, 64, f"tp-acas-{tag}"), "ops/s"),
                ("compare_and_set, sync, AOF off", admin,
                 sync_cas(admin, f"tp-cas-{tag}", args.seconds), "ops/s"),
                ("compare_and_set, sync, appendfsync everysec", everysec,
                 sync_cas(everysec, f"tp-cas-{tag}", args.seconds), "ops/s"),
                ("compare_and_set, sync, appendfsync always", aof,
                 sync_cas(aof, f"tp-cas-{tag}", args.seconds), "ops/s"),
                ("claim_expired(100), AOF off", admin,
                 claim_expired(admin, f"tp-ce-{tag}", 20_000), "leases/s"),
                ("claim_expired(100), appendfsync everysec", everysec,
                 claim_expired(everysec, f"tp-ce-{tag}", 20_000), "leases/s"),
                ("claim_expired(100), appendfsync always", aof,
                 claim_expired(aof, f"tp-ce-{tag}", 20_000), "leases/s"),
            ]:
                row(name, unit).add(*timed(target, work))

            if bullmq is None:
                for concurrency in (1, 50):
                    started = time.perf_counter()
                    result = peers.bullmq_run(port, concurrency, args.jobs)
                    x = row(f"BullMQ job cycle, concurrency {concurrency}", "jobs/s")
                    x.add(float(result["jobs_per_s"]),
                          cpu=float(result["server_cpu_s"]) * 1e6 / args.jobs)
                    x.note = f"{time.perf_counter() - started:.1f} s with npm"
            if pg is None:
                for fsync, sync_commit, label, conns_list in (
                        (True, True, "sync commit + fsync on", (1, 4)),
                        (True, False, "sync commit off (fsync on)", (1,)),
                        (False, False, "both off", (1, 4))):
                    with peers.own_postgres(fsync, sync_commit) as info:
                        row(f"Postgres CAS, 1 connection, {label}", "ops/s").add(
                            peers.pg_cas(info, args.seconds))
                        for conns in conns_list:
                            row(f"Postgres SKIP LOCKED claim 100, {conns} conn, {label}",
                                "leases/s").add(peers.pg_claim_expired(
                                    info, 100, args.seconds, conns))
        if bullmq is not None:
            row("BullMQ job cycle", "").note = f"not run: {bullmq}"
        if pg is not None:
            row("Postgres lease table", "").note = f"not run: {pg}"

    print()
    print(table(list(rows.values())))
    print()
    text, ratios = ratio_table(rows)
    print(text)
    if args.json:
        print(json.dumps({"rows": {name: {"unit": r.unit, "rates": r.rates,
                                          "server_us": r.server_us, "cpu_us": r.cpu_us,
                                          "client_us": r.client_us, "note": r.note}
                                   for name, r in rows.items()},
                          "ratios": ratios}))


if __name__ == "__main__":
    main()
