"""Throughput side by side: the run store's work unit beside BullMQ's job cycle, the Python
EVALSHA floors and a Postgres lease table, in one run on servers it starts itself.

    python benchmarks/bench_throughput.py [--jobs N] [--rounds R] [--no-peers] [--json]

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

- ``EVALSHA floor, sequential``: ``evalsha`` of ``return 1`` in a loop (sync client);
- ``EVALSHA floor, 50 tasks`` / ``64 tasks``: the same from that many asyncio tasks on a
  default ``redis.asyncio.Redis()`` (and on coredis, which multiplexes by design, when it
  is installed);
- ``async compare_and_set, 64 tasks``: each task writes the next revision of its own run;
- ``compare_and_set, sync`` and ``claim_expired(100)`` (leases/s), on Redis with AOF off
  and with ``appendfsync always``, beside a private Postgres 15 cluster's lease table
  (``UPDATE ... WHERE rev = $3``; ``FOR UPDATE SKIP LOCKED`` batches of 100, from 1 and 4
  connections) with ``synchronous_commit`` on and fsync on, and both off.

Rows are interleaved: every round runs each row once, and the table gives the median over
rounds with the spread (min-max). ``server µs`` is the server's CPU time per unit (``INFO
commandstats`` usec of the commands sent, EVALSHA and the like, over the row / units: the
commands a script calls are inside its time); ``client µs`` is wall time per unit
divided by nothing (concurrency 1 rows) — for the concurrent rows it is the time per unit
of the whole, not of one task. The servers are its own (``redis-server`` from PATH, on free
loopback ports, nothing kept on disk but the ``appendfsync always`` one's AOF in a temporary
folder), stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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
    note: str = ""

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


def timed(admin: redis.Redis, work: Callable[[], int]) -> tuple[float, float, float]:
    """(units/s, server µs per unit, client µs per unit) of ``work``, which returns units."""
    before = server_usec(admin)
    started = time.perf_counter()
    units = work()
    wall = time.perf_counter() - started
    server = server_usec(admin) - before
    if units == 0:
        return 0.0, float("nan"), float("nan")
    return units / wall, server / units, wall * 1e6 / units


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


def table(rows: list[Row]) -> str:
    lines = [f"{'row':<52} {'median':>10} {'spread':>19} {'server µs':>10} {'client µs':>10}",
             "-" * 105]
    for row in rows:
        if not row.rates:
            lines.append(f"{row.name:<52} {'-':>10}   {row.note}")
            continue
        spread = f"{min(row.rates):,.0f}-{max(row.rates):,.0f}"
        server = (f"{statistics.median(row.server_us):,.1f}" if row.server_us else "")
        client = (f"{statistics.median(row.client_us):,.1f}" if row.client_us else "")
        lines.append(f"{row.name:<52} {row.median():>10,.0f} {spread:>19} {server:>10} "
                     f"{client:>10}  {row.unit}")
    return "\n".join(lines)


def ratio(rows: dict[str, Row], a: str, b: str) -> str:
    if a not in rows or b not in rows or not rows[a].rates or not rows[b].rates:
        return "n/a"
    return f"{rows[a].median() / rows[b].median():.2f}x"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000, help="runs (jobs) per drain row")
    parser.add_argument("--seconds", type=float, default=2.0, help="per timed row")
    parser.add_argument("--rounds", type=int, default=3)
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
            own_server(binary, args=("--appendonly", "yes", "--appendfsync", "always")) \
            as aof_port:
        admin = redis.Redis(host="127.0.0.1", port=port)
        aof = redis.Redis(host="127.0.0.1", port=aof_port)
        version = admin.info("server")["redis_version"]
        bullmq = "--no-peers" if args.no_peers else peers.bullmq_available()
        pg = "--no-peers" if args.no_peers else peers.postgres_available()
        print(f"Redis {version} on 127.0.0.1:{port} (and {aof_port}: appendfsync always); "
              f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; "
              f"redis-py {redis.__version__}; Python {platform.python_version()}")
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", flush=True)
            tag = f"r{r}-{time.monotonic_ns()}"

            def drain(name: str, how: Callable[[RedisRunStore], int], tag: str = tag) -> None:
                store = fill(admin, f"tp-{name[:8]}-{tag}", args.jobs)
                rate, server, client = timed(admin, lambda: how(store))
                x = row(name, "units/s")
                x.rates.append(rate)
                x.server_us.append(server)
                x.client_us.append(client)

            drain("unit, 3 round trips (claim, get, cas)", drain_three)
            drain("unit, concurrency 1 (records + pipeline)", drain_one)
            namespace = f"tp-async-{tag}"
            fill(admin, namespace, args.jobs)
            rate, server, client = timed(
                admin, lambda ns=namespace: asyncio.run(drain_async(port, ns, 50)))
            x = row("unit, concurrency 50 (asyncio, default client)", "units/s")
            x.rates.append(rate)
            x.server_us.append(server)
            x.client_us.append(client)
            drain("batched 100 (claim 100 + pipeline of 100)", drain_batched)

            extra = coredis_floor(port, args.seconds, 64)
            if extra is not None:
                rate, server, client = timed(admin, extra)
                x = row("EVALSHA floor, 64 tasks, coredis", "calls/s")
                x.rates.append(rate)
                x.server_us.append(server)
                x.client_us.append(client)
            for name, work, unit in [
                ("EVALSHA floor, sequential", evalsha_floor(port, args.seconds), "calls/s"),
                ("EVALSHA floor, 50 tasks", async_floor(port, args.seconds, 50), "calls/s"),
                ("EVALSHA floor, 64 tasks", async_floor(port, args.seconds, 64), "calls/s"),
                ("async compare_and_set, 64 tasks",
                 async_cas(port, args.seconds, 64, f"tp-acas-{tag}"), "ops/s"),
                ("compare_and_set, sync, AOF off",
                 sync_cas(admin, f"tp-cas-{tag}", args.seconds), "ops/s"),
                ("compare_and_set, sync, appendfsync always",
                 sync_cas(aof, f"tp-cas-{tag}", args.seconds), "ops/s"),
                ("claim_expired(100), AOF off", claim_expired(admin, f"tp-ce-{tag}", 20_000),
                 "leases/s"),
                ("claim_expired(100), appendfsync always",
                 claim_expired(aof, f"tp-ce-{tag}", 20_000), "leases/s"),
            ]:
                target = aof if "always" in name else admin
                rate, server, client = timed(target, work)
                x = row(name, unit)
                x.rates.append(rate)
                x.server_us.append(server)
                x.client_us.append(client)

            if bullmq is None:
                for concurrency in (1, 50):
                    started = time.perf_counter()
                    result = peers.bullmq_cycle(port, concurrency, args.jobs)
                    x = row(f"BullMQ job cycle, concurrency {concurrency}", "jobs/s")
                    x.rates.append(result)
                    x.note = f"{time.perf_counter() - started:.1f} s with npm"
            if pg is None:
                for fsync in (True, False):
                    label = "sync commit + fsync on" if fsync else "both off"
                    with peers.own_postgres(fsync) as info:
                        x = row(f"Postgres CAS, 1 connection, {label}", "ops/s")
                        x.rates.append(peers.pg_cas(info, args.seconds))
                        for conns in (1, 4):
                            x = row(f"Postgres SKIP LOCKED claim 100, {conns} conn, {label}",
                                    "leases/s")
                            x.rates.append(peers.pg_claim_expired(info, 100, args.seconds,
                                                                  conns))
        if bullmq is not None:
            row("BullMQ job cycle", "").note = f"not run: {bullmq}"
        if pg is not None:
            row("Postgres lease table", "").note = f"not run: {pg}"

    print()
    print(table(list(rows.values())))
    print()
    targets = [
        ("work unit c=1 vs BullMQ c=1 (target >= 1.5x)",
         "unit, concurrency 1 (records + pipeline)", "BullMQ job cycle, concurrency 1"),
        ("work unit c=1 vs sequential EVALSHA floor (target >= 0.8x)",
         "unit, concurrency 1 (records + pipeline)", "EVALSHA floor, sequential"),
        ("work unit c=50 vs BullMQ c=50 (target >= 1.0x)",
         "unit, concurrency 50 (asyncio, default client)", "BullMQ job cycle, concurrency 50"),
        ("async CAS 64 tasks vs 64-task floor (target >= 0.8x)",
         "async compare_and_set, 64 tasks", "EVALSHA floor, 64 tasks"),
        ("claim_expired(100) vs Postgres SKIP LOCKED 1 conn (target >= 5x)",
         "claim_expired(100), AOF off", "Postgres SKIP LOCKED claim 100, 1 conn, both off"),
        ("claim_expired(100) vs Postgres, fsync always vs on (target >= 5x)",
         "claim_expired(100), appendfsync always",
         "Postgres SKIP LOCKED claim 100, 1 conn, sync commit + fsync on"),
        ("CAS vs Postgres CAS, AOF/fsync off (target >= 3x)",
         "compare_and_set, sync, AOF off", "Postgres CAS, 1 connection, both off"),
        ("CAS vs Postgres CAS, fsync always vs on (target >= 3x)",
         "compare_and_set, sync, appendfsync always",
         "Postgres CAS, 1 connection, sync commit + fsync on"),
        ("unit c=1: records + pipeline vs 3 round trips",
         "unit, concurrency 1 (records + pipeline)", "unit, 3 round trips (claim, get, cas)"),
    ]
    for label, a, b in targets:
        print(f"{label:<70} {ratio(rows, a, b):>8}")
    if args.json:
        print(json.dumps({name: {"unit": r.unit, "rates": r.rates, "server_us": r.server_us,
                                 "client_us": r.client_us, "note": r.note}
                          for name, r in rows.items()}))


if __name__ == "__main__":
    main()
