"""Throughput side by side: the redisstore ``Worker`` and its work unit beside BullMQ's
Worker, each claim alone, the Python EVALSHA floors and a Postgres lease table, in one run
on servers it starts itself.

    python benchmarks/bench_throughput.py [--jobs N] [--rounds 5] [--seconds S] [--no-peers]
        [--json]

Servers: three ``redis-server`` of its own (from PATH, free loopback ports): AOF off,
``appendonly yes`` with ``appendfsync everysec``, and with ``appendfsync always``. The
work units, the Workers, BullMQ and the claim rows run on the **everysec** one (the
durability the headline ratios are judged at, beside Postgres with ``synchronous_commit``
off); the floors on the AOF-off one; compare_and_set and claim_expired(100) on all three.
Every server is flushed between rounds; the number of AOF rewrites the everysec server did
(its defaults: at 64 MB and 100% growth) is printed at the end.

A **work unit** is what a worker does per run: take it with its record, work (nothing
here), write its final record and release it. Drain rows (each drains its own ``--jobs``
ready runs with 100-byte records, ``discover`` making them ready until they hold ``DONE``;
untimed to fill, timed to drain; units/s = jobs / drain time):

- ``unit, 3 round trips``: ``claim_ready(limit=1)``, ``get``, ``compare_and_set(done,
  Release())``: the unit as it had to be written before claims handed back records;
- ``unit, concurrency 1``: ``claim_ready(1, records=True)`` once, then per run one
  pipeline of ``compare_and_set(done, Release())`` + the next ``claim_ready(1,
  records=True)``: one round trip per unit, sync, one thread (the "pipeline unit");
- ``unit, concurrency 50``: the same loop in 50 asyncio tasks sharing one
  ``AsyncRedisRunStore`` on a default ``redis.asyncio.Redis()``;
- ``batched 100``: ``claim_ready(100, records=True)``, then one pipeline of the 100
  ``compare_and_set`` releases;
- ``Worker, concurrency 1``: what users run, the ``redisstore.Worker`` (a sync store, one
  loop thread, its keeper; ``ttl`` 30 s, default ``poll``) with a handler that returns the
  done record at once, timed from ``start()`` until ``stats["done"]`` reaches ``--jobs``.
  The Worker counts a run done once the reply to its finish is back, and has no event for
  it: the row looks at ``stats`` every 0.2-20 ms (half the time the rest should take at
  the rate so far), so the clock stops at most about 0.2 ms after the last acknowledged
  finish. It finishes a run in the round trip of its next claim, which blocks ``poll``
  (500 ms) when nothing is left to claim: the namespace holds one more ready run per loop
  than the row is timed on (``worker_tail``), worked on after the window. ``stop()`` is
  untimed;
- ``AsyncWorker, concurrency 50``: the same with ``AsyncWorker`` (50 tasks, an async
  handler) on an ``AsyncRedisRunStore`` over a default ``redis.asyncio.Redis()``;
- BullMQ's Worker at concurrency 1 and 50 (``benchmarks/peers.py``: BullMQ 6.7.0 with
  ioredis 5.11.1, a no-op async processor, jobs of 100 bytes of JSON with
  ``removeOnComplete``/``removeOnFail``, ``autorun: false``, timed from ``run()`` to the
  last ``'completed'``), when ``node`` and ``npm`` are there.

The headline pairs run back to back, the first of the pair alternating by round: the
pipeline unit and the Worker at concurrency 1, then BullMQ at 1; the unit and the
AsyncWorker at 50, then BullMQ at 50.

Each claim alone, at limit 1 and per run of a batch of 100 (drained like the rows above,
nothing finished; a fixed cost per call hides in the per-run figure of a batch, and the
Worker claims one run a call): ``claim(1, records=True)`` and ``claim(100,
records=True)`` over ready runs (the call the Worker makes, without its ``block``),
``claim_ready(1, records=True)`` and ``claim_ready(100, records=True)``, and
``claim_expired(1)`` beside the ``claim_expired(100)`` rows below. At limit 1 ``server
µs`` is the script's time per call; the batches drain 20,000 runs.

Floors and single operations (timed for ``--seconds``):

- ``EVALSHA floor, raw socket + hiredis, sequential``: ``EVALSHA`` of ``return 1`` written
  to a plain socket and its reply parsed by ``hiredis.Reader``, one call at a time: the
  round trip with no client library around it;
- ``EVALSHA floor, sequential``: ``evalsha`` of ``return 1`` in a loop (sync redis-py);
- ``EVALSHA floor, 50 tasks`` / ``64 tasks``: the same from that many asyncio tasks on a
  default ``redis.asyncio.Redis()`` (and on coredis, which multiplexes by design, when it
  is installed);
- ``minimal unit script``: the unit by ``EVALSHA`` of ``minimal/finish_claim.lua`` (the
  commands a finish and the claim of the next run cannot do without, nothing checked),
  one call at a time on the everysec server: the floor of the server's CPU per unit,
  beside the pipeline unit's and BullMQ's per job;
- ``async compare_and_set, 64 tasks``: each task writes the next revision of its own run;
- ``compare_and_set, sync`` and ``claim_expired(100)`` (leases/s), on Redis with AOF off,
  with ``appendfsync everysec`` and with ``appendfsync always``, beside a private Postgres
  15 cluster's lease table (``UPDATE ... WHERE rev = $3``; ``FOR UPDATE SKIP LOCKED``
  batches of 100, from 1 and 4 connections) with ``synchronous_commit`` and fsync on,
  with ``synchronous_commit`` off (fsync on: a commit may lose its last 200 ms on a crash,
  as ``everysec`` may lose its last second), and with both off.

Rows are interleaved: every round (``--rounds``, default 5) runs each row once, and the
table gives the median over rounds with the spread (min-max). Per unit: ``server µs`` is
the server's time in the commands sent (``INFO commandstats`` usec of EVALSHA and the
like over the row: the commands a script calls are inside its time; for BullMQ, EVALSHA
and the blocking pops its Worker sends); ``CPU µs`` is the server process's CPU (``INFO
cpu`` used_cpu_sys + used_cpu_user before and after the row: every thread, the event loop
and I/O too; for BullMQ read by peers_bullmq.mjs over its timed drain); ``client µs`` is
wall time (for the concurrent rows the time per unit of the whole, not of one task);
``cli CPU µs`` is the client process's CPU (``time.process_time`` deltas over the row:
every thread of this process, the Python client's whole cost; for BullMQ the Node
process's ``process.cpuUsage``). The client's clocks are read inside the server's, so
the INFO calls stay out of them. The ratios table divides medians (throughput, or the
per-unit figure it names) and gives the spread of the same ratio taken round by round;
the targets table checks a per-unit median against a bound (the client CPU per unit at 50
tasks: at most 60 µs). Nothing is kept on disk but the AOF servers' files in temporary
folders; every server is stopped at the end.
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
    AsyncWorker,
    At,
    Claim,
    RedisRunStore,
    Release,
    Worker,
)

LONG = 600_000
#: The Worker rows' lease TTL (ms), docs/worker.md's: its keeper renews every ttl // 3,
#: never within a row.
WORKER_TTL = 30_000
#: How often a Worker row looks at ``stats["done"]`` (s): half the time the rest should
#: take at the rate so far, within these bounds, so the clock stops at most POLL_MIN
#: late near the end and the poll wakes seldom before it.
POLL_MIN, POLL_MAX = 0.0002, 0.02
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
    client_cpu_us: list[float] = field(default_factory=list)
    note: str = ""

    def add(self, rate: float, server: float = float("nan"), client: float = float("nan"),
            cpu: float = float("nan"), client_cpu: float = float("nan")) -> None:
        self.rates.append(rate)
        for values, value in ((self.server_us, server), (self.client_us, client),
                              (self.cpu_us, cpu), (self.client_cpu_us, client_cpu)):
            if value == value:  # not nan
                values.append(value)

    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


#: The commands clients send here, and the blocking pops a waker sends (BullMQ's Worker
#: waits on BZPOPMIN too: peers_bullmq.mjs counts the same). The commands a script calls
#: are counted in their own commandstats too, inside the script's time: summing every row
#: would count them twice.
TOP_LEVEL = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "script", "wait",
             "waitaof", "config", "command", "ping", "bzpopmin", "bzpopmax", "blmove",
             "brpoplpush")


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


def finish_at_once(job: Any) -> bytes:
    """The Worker rows' handler: each run done at once (``discover`` makes DONE final)."""
    return DONE


async def finish_at_once_async(job: Any) -> bytes:
    return DONE


def poll_pause(done: int, jobs: int, started: float) -> float:
    """How long to wait before looking at ``stats["done"]`` again (s)."""
    if done <= 0:
        return POLL_MAX / 4
    left = (jobs - done) * (time.perf_counter() - started) / done
    return min(max(left / 2, POLL_MIN), POLL_MAX)


def worker_failed(worker: Worker | AsyncWorker, jobs: int, started: float,
                  deadline: float) -> None:
    """Raise when the worker cannot get to ``jobs`` done: a loop ended, or too long."""
    if worker.failure is not None:
        raise RuntimeError(f"a worker loop ended: {worker.failure!r}") from worker.failure
    if time.perf_counter() - started > deadline:
        raise RuntimeError(f"{worker.stats['done']} of {jobs} runs done after "
                           f"{deadline:.0f} s: {dict(worker.stats)}")


def check_stats(stats: Any, jobs: int) -> None:
    """At least ``jobs`` runs done, none failed or lost: the row measured what it says."""
    if stats["done"] < jobs or stats["failed"] or stats["lost"]:
        raise RuntimeError(f"the worker did not finish {jobs} runs cleanly: {dict(stats)}")


def worker_drain(store: RedisRunStore, jobs: int, concurrency: int) -> Callable[[Window], int]:
    """The sync ``Worker`` finishing ``jobs`` of the ready runs of ``store``, which holds
    ``jobs + concurrency`` (filled already: see :func:`worker_tail`). The window opens just
    before ``start()`` and closes at the first look at ``stats["done"]`` that sees
    ``jobs``: the Worker counts a run done once the reply to its finish has come back and
    exposes no event for it, so this polls (:func:`poll_pause`). ``stop()`` and closing the
    store are outside the window."""

    def run(window: Window) -> int:
        worker = Worker(store, "w", finish_at_once, ttl=WORKER_TTL, concurrency=concurrency)
        deadline = 120 + jobs / 100
        try:
            window.begin()
            started = time.perf_counter()
            worker.start()
            try:
                while (done := worker.stats["done"]) < jobs:
                    worker_failed(worker, jobs, started, deadline)
                    time.sleep(poll_pause(done, jobs, started))
                window.end()
            finally:
                worker.stop(timeout=10)
        finally:
            store.close()  # its waker thread too
        check_stats(worker.stats, jobs)
        return jobs
    return run


def worker_tail(concurrency: int) -> int:
    """How many ready runs a Worker row has beyond the ``jobs`` it is timed on: one per
    loop. The Worker sends a run's finish in the round trip of its next claim, and counts
    the run done when that round trip's reply comes back; with nothing left to claim, the
    claim blocks ``poll`` ms (500) before the reply comes, and ``stats`` would count the
    last runs half a second after the server acknowledged them. With one more run per loop,
    every loop's claim still finds a run when the ``jobs``-th finish goes out, so the
    count reaches ``jobs`` as the acknowledgement arrives (as BullMQ's last
    ``moveToFinished`` does not wait either). The loops work on the tail after the window."""
    return concurrency


def async_worker_drain(port: int, namespace: str, jobs: int, concurrency: int
                       ) -> Callable[[Window], int]:
    """:func:`worker_drain` for ``AsyncWorker`` on an ``AsyncRedisRunStore`` over a default
    ``redis.asyncio.Redis()``: the window from ``start()`` to the first look (an
    ``asyncio.sleep`` apart) that sees ``stats["done"] == jobs``."""

    def run(window: Window) -> int:
        async def main() -> Any:
            client = redis.asyncio.Redis(host="127.0.0.1", port=port)
            store = AsyncRedisRunStore(client, namespace=namespace, discover=discover)
            worker = AsyncWorker(store, "w", finish_at_once_async, ttl=WORKER_TTL,
                                 concurrency=concurrency)
            deadline = 120 + jobs / 100
            try:
                window.begin()
                started = time.perf_counter()
                worker.start()
                try:
                    while (done := worker.stats["done"]) < jobs:
                        worker_failed(worker, jobs, started, deadline)
                        await asyncio.sleep(poll_pause(done, jobs, started))
                    window.end()
                finally:
                    await worker.stop(timeout=10)
            finally:
                await store.aclose()
                await client.aclose()
            return worker.stats

        check_stats(asyncio.run(main()), jobs)
        return jobs
    return run


class Window:
    """One row's timed window: :meth:`begin` and :meth:`end` read the server's commandstats
    time and process CPU, this process's CPU (``time.process_time``: every thread of it)
    and the wall clock. The client's clocks are read inside the server's, so the INFO
    calls themselves are not in the client's figures."""

    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin
        self.start: tuple[float, float, float, float] | None = None
        self.stop: tuple[float, float, float, float] | None = None

    def begin(self) -> None:
        server, cpu = server_usec(self.admin), server_cpu(self.admin)
        self.start = (server, cpu, time.process_time(), time.perf_counter())

    def end(self) -> None:
        wall, client_cpu = time.perf_counter(), time.process_time()
        self.stop = (server_usec(self.admin), server_cpu(self.admin), client_cpu, wall)

    def figures(self, units: int) -> tuple[float, float, float, float, float]:
        """(units/s, server µs per unit in commands, client wall µs per unit, server
        process CPU µs per unit, client process CPU µs per unit)."""
        assert self.start is not None and self.stop is not None, "begin() and end() first"
        server, cpu, client_cpu, wall = (b - a for a, b in zip(self.start, self.stop,
                                                                strict=True))
        if units == 0:
            return 0.0, float("nan"), float("nan"), float("nan"), float("nan")
        return (units / wall, server / units, wall * 1e6 / units, cpu * 1e6 / units,
                client_cpu * 1e6 / units)


def timed(admin: redis.Redis, work: Callable[[], int]
          ) -> tuple[float, float, float, float, float]:
    """:meth:`Window.figures` of ``work``, which returns units, timed around the call."""
    window = Window(admin)
    window.begin()
    units = work()
    window.end()
    return window.figures(units)


def timed_inside(admin: redis.Redis, work: Callable[[Window], int]
                 ) -> tuple[float, float, float, float, float]:
    """:meth:`Window.figures` of ``work``, which opens and closes the window itself (set-up
    and tear-down outside it) and returns units."""
    window = Window(admin)
    units = work(window)
    return window.figures(units)


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


def minimal_unit(client: redis.Redis, namespace: str, jobs: int) -> Callable[[], int]:
    """The job cycle's unit by EVALSHA of its minimal script (``minimal/finish_claim.lua``:
    only the commands a finish and the claim of the next cannot do without, no checks),
    one call at a time, with run_finish_claim's keys and arguments
    (``bench_instructions.py`` prepares the runs, untimed): the server's floor for a unit."""
    import bench_instructions  # beside this file

    op = next(o for o in bench_instructions.OPS if o.key == "unit")
    prepared = bench_instructions.prepare(client, op, jobs, namespace=namespace)
    return lambda: op.minimal(prepared)


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


def claim_expired(client: redis.Redis, namespace: str, leases: int, limit: int = 100
                  ) -> Callable[[], int]:
    """Fill ``leases`` expired leases now (untimed); the work claims them all, ``limit`` a
    call."""
    store = RedisRunStore(client, namespace=namespace)
    store.migrate()
    for start in range(0, leases, 100):
        with store.pipeline() as pipe:
            for i in range(start, min(start + 100, leases)):
                pipe.insert(f"l-{i:07d}", TODO, Claim("dead", 1))
    time.sleep(0.01)

    def run() -> int:
        n = 0
        while got := store.claim_expired("me", LONG, limit):
            n += len(got)
        return n
    return run


def claim_ready_runs(client: redis.Redis, namespace: str, runs: int, how: str, limit: int
                     ) -> Callable[[], int]:
    """Fill ``runs`` ready runs (untimed, as the unit rows); the work claims them all with
    ``store.<how>(..., limit, records=True)`` (``claim`` or ``claim_ready``), nothing
    finished: the claim's own cost, per run (a claim of 1: per call)."""
    store = fill(client, namespace, runs)
    call = getattr(store, how)

    def run() -> int:
        n = 0
        while got := call("me", LONG, limit, records=True):
            n += len(got)
        return n
    return run


def med(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f}" if values else ""


def table(rows: list[Row]) -> str:
    lines = [f"{'row':<58} {'median':>10} {'spread':>17} {'server µs':>9} {'CPU µs':>8} "
             f"{'client µs':>9} {'cli CPU µs':>10}", "-" * 136]
    for row in rows:
        if not row.rates:
            lines.append(f"{row.name:<58} {'-':>10}   {row.note}")
            continue
        spread = f"{min(row.rates):,.0f}-{max(row.rates):,.0f}"
        lines.append(f"{row.name:<58} {row.median():>10,.0f} {spread:>17} "
                     f"{med(row.server_us):>9} {med(row.cpu_us):>8} {med(row.client_us):>9}"
                     f" {med(row.client_cpu_us):>10}  {row.unit}")
    return "\n".join(lines)


#: What a Ratio divides: throughput, or per unit the server's CPU, the client's CPU or the
#: server's time in the commands sent (commandstats).
RATES, SERVER_CPU, CLIENT_CPU, SERVER_US = "rates", "cpu_us", "client_cpu_us", "server_us"


@dataclass
class Ratio:
    label: str
    a: str
    b: str
    target: str = ""
    metric: str = RATES  # RATES, SERVER_CPU, CLIENT_CPU or SERVER_US (a / b)

    def values(self, rows: dict[str, Row]) -> tuple[float, list[float]] | None:
        """(ratio of the medians, the per-round ratios), or None when a row is missing."""
        if self.a not in rows or self.b not in rows:
            return None
        va, vb = getattr(rows[self.a], self.metric), getattr(rows[self.b], self.metric)
        if not va or not vb:
            return None
        rounds = [x / y for x, y in zip(va, vb, strict=False) if y] if len(va) == len(vb) \
            else []
        return statistics.median(va) / statistics.median(vb), rounds


@dataclass
class Bound:
    """A target on one row's figure per unit: its median must be at most ``most``."""

    label: str
    row: str
    metric: str  # a Row attribute: "client_cpu_us", "cpu_us"...
    most: float

    def value(self, rows: dict[str, Row]) -> float | None:
        values = getattr(rows[self.row], self.metric) if self.row in rows else []
        return statistics.median(values) if values else None


WORKER_1 = "Worker, concurrency 1 (threads, sync store)"
MINIMAL_UNIT = "minimal unit script (finish + claim of one), sequential, everysec"
ASYNC_WORKER_50 = "AsyncWorker, concurrency 50 (asyncio, default client)"

RATIOS = [
    Ratio("sync compare_and_set (AOF off) / raw-socket EVALSHA floor",
          "compare_and_set, sync, AOF off", "EVALSHA floor, raw socket + hiredis, sequential",
          ">= 0.5x"),
    Ratio("sync compare_and_set / Postgres CAS: everysec vs sync commit off",
          "compare_and_set, sync, appendfsync everysec",
          "Postgres CAS, 1 connection, sync commit off (fsync on)", ">= 0.8x"),
    Ratio("sync compare_and_set / Postgres CAS: AOF off vs both off",
          "compare_and_set, sync, AOF off", "Postgres CAS, 1 connection, both off"),
    Ratio("sync compare_and_set / Postgres CAS: always vs fsync on",
          "compare_and_set, sync, appendfsync always",
          "Postgres CAS, 1 connection, sync commit + fsync on"),
    Ratio("Worker c=1 / BullMQ c=1", WORKER_1, "BullMQ job cycle, concurrency 1", ">= 1.0x"),
    Ratio("AsyncWorker c=50 / BullMQ c=50", ASYNC_WORKER_50, "BullMQ job cycle, concurrency 50",
          ">= 1.0x"),
    Ratio("server CPU per run: Worker c=1 / BullMQ per job c=1", WORKER_1,
          "BullMQ job cycle, concurrency 1", "<= 0.6x", metric=SERVER_CPU),
    Ratio("server CPU per run: AsyncWorker c=50 / BullMQ per job c=50", ASYNC_WORKER_50,
          "BullMQ job cycle, concurrency 50", "<= 1.0x", metric=SERVER_CPU),
    Ratio("client CPU per run: AsyncWorker c=50 / BullMQ's Node per job c=50",
          ASYNC_WORKER_50, "BullMQ job cycle, concurrency 50", metric=CLIENT_CPU),
    # The Worker's own cost: its wall time per run at most 1.25x the unit's (throughput at
    # least 0.8x); the AsyncWorker within 15% of the unit's throughput.
    Ratio("Worker c=1 / pipeline unit, one thread", WORKER_1,
          "unit, concurrency 1 (records + pipeline)", ">= 0.8x"),
    Ratio("AsyncWorker c=50 / pipeline unit, 50 tasks", ASYNC_WORKER_50,
          "unit, concurrency 50 (asyncio, default client)", ">= 0.85x"),
    Ratio("pipeline unit, one thread / BullMQ c=1", "unit, concurrency 1 (records + pipeline)",
          "BullMQ job cycle, concurrency 1", ">= 1.3x"),
    Ratio("pipeline unit, one thread / sequential EVALSHA floor (redis-py)",
          "unit, concurrency 1 (records + pipeline)", "EVALSHA floor, sequential"),
    Ratio("pipeline unit, 50 tasks / BullMQ c=50",
          "unit, concurrency 50 (asyncio, default client)", "BullMQ job cycle, concurrency 50",
          ">= 1.2x"),
    Ratio("server CPU per unit: pipeline unit, one thread / BullMQ per job c=1",
          "unit, concurrency 1 (records + pipeline)", "BullMQ job cycle, concurrency 1",
          "<= 0.6x", metric=SERVER_CPU),
    # The floor under the row above: the unit's minimal script, which checks nothing.
    Ratio("server CPU per unit: minimal unit script / BullMQ per job c=1", MINIMAL_UNIT,
          "BullMQ job cycle, concurrency 1", metric=SERVER_CPU),
    Ratio("server CPU per unit: pipeline unit, one thread / minimal unit script",
          "unit, concurrency 1 (records + pipeline)", MINIMAL_UNIT, metric=SERVER_CPU),
    Ratio("server CPU per unit: pipeline unit, 50 tasks / BullMQ per job c=50",
          "unit, concurrency 50 (asyncio, default client)", "BullMQ job cycle, concurrency 50",
          "<= 1.0x", metric=SERVER_CPU),
    Ratio("claim_expired(100) / Postgres SKIP LOCKED 1 conn: AOF off vs both off",
          "claim_expired(100), AOF off", "Postgres SKIP LOCKED claim 100, 1 conn, both off",
          ">= 1.0x"),
    Ratio("claim_expired(100) / Postgres SKIP LOCKED 1 conn: everysec vs sync commit off",
          "claim_expired(100), appendfsync everysec",
          "Postgres SKIP LOCKED claim 100, 1 conn, sync commit off (fsync on)", ">= 1.0x"),
    Ratio("async compare_and_set 64 tasks / 64-task redis.asyncio floor",
          "async compare_and_set, 64 tasks", "EVALSHA floor, 64 tasks", ">= 1.0x"),
    Ratio("unit c=1: records + pipeline / 3 round trips",
          "unit, concurrency 1 (records + pipeline)", "unit, 3 round trips (claim, get, cas)"),
    Ratio("server µs: claim(1) per call / claim(100) per run (records, ready)",
          "claim(1, records=True), ready, everysec", "claim(100, records=True), ready, everysec",
          metric=SERVER_US),
    Ratio("server µs: claim_ready(1) per call / claim_ready(100) per run (records)",
          "claim_ready(1, records=True), everysec", "claim_ready(100, records=True), everysec",
          metric=SERVER_US),
    Ratio("server µs: claim_expired(1) per call / claim_expired(100) per lease",
          "claim_expired(1), appendfsync everysec", "claim_expired(100), appendfsync everysec",
          metric=SERVER_US),
]

BOUNDS = [
    Bound("client CPU per unit, pipeline unit, 50 tasks",
          "unit, concurrency 50 (asyncio, default client)", CLIENT_CPU, 60.0),
    Bound("client CPU per run, AsyncWorker c=50", ASYNC_WORKER_50, CLIENT_CPU, 60.0),
]


def ratio_table(rows: dict[str, Row]) -> tuple[str, dict[str, Any]]:
    lines = [f"{'ratio (a / b: throughput, or the per-unit figure named)':<78} {'median':>7} "
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
    lines += ["", f"{'target per unit (median)':<78} {'µs':>7} {'target':>21}", "-" * 108]
    for b in BOUNDS:
        got = b.value(rows)
        shown = f"{got:>7.1f}" if got is not None else f"{'n/a':>7}"
        lines.append(f"{b.label:<78} {shown} {'<= ' + format(b.most, 'g') + ' µs':>21}")
        out[b.label] = {"median": got, "target": f"<= {b.most:g} µs"}
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
        bullmq_reason = "--no-peers" if args.no_peers else peers.bullmq_available()
        pg = "--no-peers" if args.no_peers else peers.postgres_available()
        print(f"Redis {version} on 127.0.0.1:{port} (and {everysec_port}: appendfsync "
              f"everysec, where the units, the Workers, BullMQ and the claims run; "
              f"{aof_port}: appendfsync always); {os.cpu_count()} CPUs; "
              f"load {os.getloadavg()[0]:.2f}; redis-py {redis.__version__}; "
              f"Python {platform.python_version()}")
        if bullmq_reason is None:
            print(f"BullMQ: {peers.bullmq_versions()}", flush=True)
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", flush=True)
            tag = f"r{r}-{time.monotonic_ns()}"

            # The work units, the Workers and BullMQ's: on the appendfsync everysec server.
            def drain(name: str, how: Callable[[RedisRunStore], int], tag: str = tag) -> None:
                store = fill(everysec, f"tp-{name[:8]}-{tag}", args.jobs)
                row(name, "units/s").add(*timed(everysec, lambda: how(store)))

            def bullmq(concurrency: int) -> None:
                if bullmq_reason is not None:
                    return
                started = time.perf_counter()
                result = peers.bullmq_run(everysec_port, concurrency, args.jobs, len(TODO))
                x = row(f"BullMQ job cycle, concurrency {concurrency}", "jobs/s")
                x.add(float(result["jobs_per_s"]),
                      server=float(result["server_usec"]) / args.jobs,
                      client=float(result["seconds"]) * 1e6 / args.jobs,
                      cpu=float(result["server_cpu_s"]) * 1e6 / args.jobs,
                      client_cpu=float(result["client_cpu_s"]) * 1e6 / args.jobs)
                x.note = f"{time.perf_counter() - started:.1f} s with Node"

            def worker_1(tag: str = tag) -> None:
                store = fill(everysec, f"tp-worker-{tag}", args.jobs + worker_tail(1))
                row(WORKER_1, "runs/s").add(*timed_inside(
                    everysec, worker_drain(store, args.jobs, 1)))

            def async_worker_50(tag: str = tag) -> None:
                namespace = f"tp-aworker-{tag}"
                fill(everysec, namespace, args.jobs + worker_tail(50))
                row(ASYNC_WORKER_50, "runs/s").add(*timed_inside(
                    everysec, async_worker_drain(everysec_port, namespace, args.jobs, 50)))

            def unit_50(tag: str = tag) -> None:
                namespace = f"tp-async-{tag}"
                fill(everysec, namespace, args.jobs)
                row("unit, concurrency 50 (asyncio, default client)", "units/s").add(*timed(
                    everysec, lambda: asyncio.run(drain_async(everysec_port, namespace, 50))))

            # Each headline pair back to back, which goes first alternating by round.
            def pair(first: Callable[[], None], second: Callable[[], None], r: int = r
                     ) -> None:
                for step in ((first, second) if r % 2 == 0 else (second, first)):
                    step()

            drain("unit, 3 round trips (claim, get, cas)", drain_three)
            pair(lambda: drain("unit, concurrency 1 (records + pipeline)", drain_one),
                 worker_1)
            bullmq(1)
            pair(unit_50, async_worker_50)
            bullmq(50)
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
                ("claim_expired(1), appendfsync everysec", everysec,
                 claim_expired(everysec, f"tp-ce1-{tag}", args.jobs, 1), "leases/s"),
                ("claim(1, records=True), ready, everysec", everysec,
                 claim_ready_runs(everysec, f"tp-c1-{tag}", args.jobs, "claim", 1), "runs/s"),
                ("claim(100, records=True), ready, everysec", everysec,
                 claim_ready_runs(everysec, f"tp-c100-{tag}", 20_000, "claim", 100),
                 "runs/s"),
                ("claim_ready(1, records=True), everysec", everysec,
                 claim_ready_runs(everysec, f"tp-cr1-{tag}", args.jobs, "claim_ready", 1),
                 "runs/s"),
                ("claim_ready(100, records=True), everysec", everysec,
                 claim_ready_runs(everysec, f"tp-cr100-{tag}", 20_000, "claim_ready", 100),
                 "runs/s"),
                (MINIMAL_UNIT, everysec,
                 minimal_unit(everysec, f"tp-mu-{tag}", args.jobs), "units/s"),
            ]:
                row(name, unit).add(*timed(target, work))

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
            # Every round on empty servers (ours alone): the AOF servers' datasets, and the
            # cost of a rewrite's fork, do not grow round by round.
            for client in (admin, everysec, aof):
                client.flushall()
        persistence = everysec.info("persistence")
        print(f"everysec server: {persistence['aof_rewrites']} AOF rewrites during the run; "
              f"load {os.getloadavg()[0]:.2f} at the end", flush=True)
        if bullmq_reason is not None:
            row("BullMQ job cycle", "").note = f"not run: {bullmq_reason}"
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
                                          "client_us": r.client_us,
                                          "client_cpu_us": r.client_cpu_us, "note": r.note}
                                   for name, r in rows.items()},
                          "ratios": ratios}))


if __name__ == "__main__":
    main()
