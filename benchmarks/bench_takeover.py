"""A dead node's runs taken over: a node holding 10k runs is killed (SIGKILL) while three
other Workers run; how soon its runs are claimable, how fast they drain, and that each is
finished exactly once (docs/design/sessions.md, "Budgets"). Then the bare claims:
``claim_expired(100)`` draining 10k runs of a lapsed session beside 10k expired per-run
leases.

**Takeover** (``--rounds`` of each mode, interleaved). On its own Redis 7 server: N ready
runs (``--runs``, 10,000); a **holder** process takes all of them, then keeps them alive,
every ttl / 3:

- ``session``: under one session (``session.claim_ready(100)``), one keepalive;
- ``leases``: with a lease per run (``claim_ready(owner, ttl, 100)``), ``renew`` in batches
  of 150: the world before sessions.

Three Worker processes start (``sessions=True`` beside the session holder, a lease per run
beside the per-run holder), find nothing to claim, and wait; the holder is SIGKILLed. Their
handler notes the time it got each run (the run's takeover) and returns at once: the run
is finished by the Worker's fused finish and next claim. Figures, from the kill (wall
clock, one machine):

- ``expired``: when the dead node's runs expired: the session's expiry (``sessions()``,
  the server's clock), or the last per-run lease's;
- ``all claimable`` (session): when the last of its runs went into the leases index, where
  every claim meets it as an expired lease (a thread reads the session's ``session-leases``
  score every 2 ms: it turns ``inf`` once the sweep is done); target: TTL + 100 ms;
- ``first`` and ``last`` takeover, and the drain: (last - first) / (N - 1) per run;
- exactly once: every run's record is a Worker's result, the Workers' ``done`` add up to
  N, and no run was handed to two handlers.

**Bare claims** (``--drain-rounds``): 10k runs of a session left to lapse (ttl 3 s after
the fill), drained by ``claim_expired(100)`` (a plain owner, and under a live session, as
a Worker on sessions takes them), beside 10k leases inserted with ``Claim(dead, 1)``:
``INFO commandstats`` µs of EVALSHA per run claimed and the caller's wall µs per run.

Nothing is asserted (tests/worker/test_worker_sessions.py holds the contract's bound with
300 runs); figures are printed, with medians and spread over the rounds::

    .venv/bin/python benchmarks/bench_takeover.py              # ~2 min
    .venv/bin/python benchmarks/bench_takeover.py --runs 2000 --rounds 1 --drain-rounds 1
    .venv/bin/python benchmarks/bench_takeover.py --instructions 2000   # + callgrind
    .venv/bin/python benchmarks/bench_takeover.py --cluster    # 3 primaries, no bare drains
    .venv/bin/python benchmarks/bench_takeover.py --cluster --partitions 6

``--instructions N`` adds callgrind instructions per run of each bare drain (as
bench_instructions.py counts them), over N runs prepared under valgrind (the session's
lapse planted: its record's expiry set a second in the past). ``--cluster`` runs the
takeover on a local cluster of three primaries (``bench_partitions.py``'s), every process
a ``RedisCluster`` client; the store of one partition on one of them, or with
``--partitions N`` of N partitions spread over them (the session kept in each).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from common import ROOT, own_server, server_binary
from redis.cluster import RedisCluster

from redisstore import At, Claim, Held, RedisRunStore, Release
from redisstore.admin.namespaces import spaces_of
from redisstore.core.keys import Keyspace
from redisstore.runs import MAX_CLAIM

LONG = 3_600_000
WORKERS = 3

HOLDER = r"""
import sys, time
import redis, redis.cluster
from redisstore import At, RedisRunStore
from redisstore.runs import MAX_RENEW

port, namespace, n, ttl, mode, cluster, partitions = (
    int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
    sys.argv[6] == "1", int(sys.argv[7]))
client = (redis.cluster.RedisCluster(host="127.0.0.1", port=port) if cluster
          else redis.Redis(host="127.0.0.1", port=port))
store = RedisRunStore(client, namespace=namespace, partitions=partitions,
                      discover=lambda record: None if record.startswith(b"done") else At(0))
held = []
if mode == "session":
    session = store.open_session("dead-node", ttl)
    while len(held) < n:
        got = session.claim_ready(100)
        assert got, len(held)
        held += got
    session.keepalive()  # the first runs' time from now (taking 10k can take seconds)
    print("held", session.id, flush=True)
    while True:
        time.sleep(ttl / 3000)
        session.keepalive()
else:
    while len(held) < n:
        got = store.claim_ready("dead-node", ttl, 100)
        assert got, len(held)
        held += got
    for i in range(0, len(held), MAX_RENEW):  # the first runs' leases from now
        store.renew("dead-node", held[i:i + MAX_RENEW], ttl)
    print("held -", flush=True)
    while True:
        time.sleep(ttl / 3000)
        for i in range(0, len(held), MAX_RENEW):
            store.renew("dead-node", held[i:i + MAX_RENEW], ttl)
"""

WORKER = r"""
import json, sys, threading, time
import redis, redis.cluster
from redisstore import At, RedisRunStore, Worker

port, namespace, name, ttl, sessions, concurrency, out, cluster, partitions = (
    int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1",
    int(sys.argv[6]), sys.argv[7], sys.argv[8] == "1", int(sys.argv[9]))
client = (redis.cluster.RedisCluster(host="127.0.0.1", port=port) if cluster
          else redis.Redis(host="127.0.0.1", port=port))
store = RedisRunStore(client, namespace=namespace, partitions=partitions,
                      discover=lambda record: None if record.startswith(b"done") else At(0))
taken = []
result = ("done-by-" + name).encode()

def handler(job):
    taken.append((job.run, time.time()))
    return result

worker = Worker(store, name, handler, ttl=ttl, concurrency=concurrency, sessions=sessions,
                poll=500).start()
print("started", flush=True)
stop = threading.Event()

def report():
    while not stop.wait(0.05):
        print(worker.stats["done"], flush=True)

threading.Thread(target=report, daemon=True).start()
sys.stdin.readline()
stop.set()
worker.stop()
with open(out, "w") as f:
    json.dump({"stats": dict(worker.stats), "taken": taken}, f)
print("stopped", flush=True)
"""


def connect(port: int, cluster: bool) -> Any:
    """A client of the server (or of the cluster, through one of its primaries)."""
    if cluster:
        return RedisCluster(host="127.0.0.1", port=port)
    return redis.Redis(port=port)


def ready(record: bytes) -> At | None:
    return None if record.startswith(b"done") else At(0)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


class Child:
    """A process of ours running ``source``, its stdout lines in a queue."""

    def __init__(self, source: str, *args: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", source, *map(str, args)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=child_env())
        self.lines: queue.Queue[str] = queue.Queue()
        out = self.process.stdout
        assert out is not None

        def read() -> None:
            for line in out:
                self.lines.put(line.decode().strip())

        threading.Thread(target=read, daemon=True).start()

    def line(self, timeout: float = 120) -> str:
        return self.lines.get(timeout=timeout)

    def latest(self) -> str | None:
        last = None
        while True:
            try:
                last = self.lines.get_nowait()
            except queue.Empty:
                return last

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


class SweepWatch(threading.Thread):
    """Reads the dead session's score in session-leases (each partition's) every 2 ms: the
    wall time it was first ``inf`` (all its runs in the leases index) or gone in all."""

    def __init__(self, port: int, namespace: str, sid: str, cluster: bool) -> None:
        super().__init__(daemon=True)
        self.client = connect(port, cluster)
        self.keys = [k.session_leases for k in spaces_of(self.client, namespace)]
        self.sid = sid
        self.done: float | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        left = list(self.keys)
        while not self.stopped.is_set():
            left = [key for key in left
                    if self.client.zscore(key, self.sid) not in (None, float("inf"))]
            if not left:
                self.done = time.time()
                return
            time.sleep(0.002)

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)
        self.client.close()


def takeover(port: int, mode: str, n: int, ttl: int, concurrency: int, folder: Path,
             round_no: int, cluster: bool = False, partitions: int = 1) -> dict[str, Any]:
    """One kill and drain: the figures of it (ms from the kill, µs a run)."""
    namespace = f"takeover-{mode}-{round_no}"
    client = connect(port, cluster)
    store = RedisRunStore(client, namespace=namespace, discover=ready, partitions=partitions)
    for start in range(0, n, 500):
        with store.pipeline() as pipe:
            for i in range(start, min(n, start + 500)):
                pipe.insert(f"run-{i:032d}", b"todo", Release())
    holder = Child(HOLDER, port, namespace, n, ttl, mode, int(cluster), partitions)
    workers: list[Child] = []
    try:
        held = holder.line()
        assert held.startswith("held"), held
        sid = held.split()[1]
        outs = [folder / f"{namespace}-w{k}.json" for k in range(WORKERS)]
        workers = [Child(WORKER, port, namespace, f"w{k}", ttl, int(mode == "session"),
                         concurrency, outs[k], int(cluster), partitions)
                   for k in range(WORKERS)]
        for w in workers:
            assert w.line() == "started"
        time.sleep(0.3)
        watch = SweepWatch(port, namespace, sid, cluster) if mode == "session" else None
        if mode == "session":
            (info,) = [s for s in store.sessions() if s.id == sid]
            assert info.runs == n, info
        killed = time.time()
        holder.process.kill()
        holder.process.wait(10)
        expires_ms: float
        if mode == "session":
            expires_ms = next(s.expires for s in store.sessions() if s.id == sid)
        else:
            expires_ms = max(float(entries[0][1]) for keys in spaces_of(client, namespace)
                             if (entries := client.zrange(keys.leases, -1, -1,
                                                          withscores=True)))
        if watch is not None:
            watch.start()
        done = [0] * WORKERS
        deadline = time.monotonic() + 300
        while sum(done) < n:
            assert time.monotonic() < deadline, f"drained {sum(done)} of {n}"
            time.sleep(0.05)
            for k, w in enumerate(workers):
                latest = w.latest()
                if latest is not None and latest.isdigit():
                    done[k] = int(latest)
        for w in workers:
            assert w.process.stdin is not None
            w.process.stdin.write(b"stop\n")
            w.process.stdin.flush()
        for w in workers:
            while w.line() != "stopped":
                pass
        if watch is not None:
            watch.stop()
        reports = [json.loads(out.read_text()) for out in outs]
    finally:
        holder.end()
        for w in workers:
            w.end()
    taken = [(run, at) for r in reports for run, at in r["taken"]]
    times = sorted(at for _, at in taken)
    runs = [run for run, _ in taken]
    records = {}
    ids = [f"run-{i:032d}" for i in range(n)]
    for start in range(0, n, 150):
        got = store.get_many(ids[start:start + 150])
        records.update({run: c.record for run, c in got.items()})
    finished = sum(r["stats"].get("done", 0) for r in reports)
    once = (len(runs) == len(set(runs)) == n and finished == n
            and all(rec.startswith(b"done-by-w") for rec in records.values())
            and len(records) == n)
    client.close()
    return {
        "expired_ms": expires_ms - killed * 1000,
        "all_claimable_ms": ((watch.done - killed) * 1000
                             if watch is not None and watch.done is not None else None),
        "first_ms": (times[0] - killed) * 1000,
        "last_ms": (times[-1] - killed) * 1000,
        "drain_us_per_run": (times[-1] - times[0]) / max(1, n - 1) * 1e6,
        "exactly_once": once,
        "handed": len(runs), "distinct": len(set(runs)), "finished": finished,
        "stats": [r["stats"] for r in reports],
    }


# ---------------------------------------------------------------------------- bare claims


def evalsha(client: redis.Redis) -> int:
    entry = client.info("commandstats").get("cmdstat_evalsha", {"usec": 0})
    return int(entry["usec"])


#: The bare drains: what the dead node held, and who claims.
KINDS = ("session", "session-claim", "leases-beside", "leases")


def drain_prepare(client: redis.Redis, kind: str, n: int, namespace: str,
                  lapse: float | None = 3.0) -> tuple[RedisRunStore, Any]:
    """n expired runs in ``namespace``: ``session``, ``session-claim``: n runs of a session
    that lapsed (opened live for ``lapse`` s, filled, then waited out; ``lapse`` None: its
    record's expiry and score set a second in the past, as if its node died then, for a
    fill under valgrind that outlasts any short ttl); ``leases``: leases inserted with
    Claim(dead, 1); ``leases-beside``: the same in a namespace that also holds a live
    session (whose expiry a claim reads, as beside any Worker on sessions). The store, and
    for ``session-claim`` the live session the runs are claimed under (else None)."""
    store = RedisRunStore(client, namespace=namespace, discover=None, timeout=600_000)
    ids = [f"run-{i:032d}" for i in range(n)]
    if kind.startswith("leases"):
        if kind == "leases-beside":
            store.open_session("bystander", LONG)
        for start in range(0, n, 500):
            with store.pipeline() as pipe:
                for run in ids[start:start + 500]:
                    pipe.insert(run, b"todo", Claim("dead", 1))
        time.sleep(0.01)
    else:
        dead = store.open_session("dead", int((lapse or 3600) * 1000))
        opened = time.monotonic()
        for start in range(0, n, 500):
            with store.pipeline() as pipe:
                for run in ids[start:start + 500]:
                    pipe.insert(run, b"todo", dead.lease)
        if lapse is None:
            keys = Keyspace(namespace)
            past = int(client.time()[0]) * 1000 - 1000
            client.hset(keys.sessions, dead.id, f"{past},{dead.ttl},,dead")
            client.zadd(keys.session_leases, {dead.id: past})
        else:
            left = lapse - (time.monotonic() - opened)
            assert left > 0, "the fill outlived the session"
            time.sleep(left + 0.05)
        assert store.get(ids[0]).holder == Held("dead", False)
    taker = store.open_session("taker", LONG) if kind == "session-claim" else None
    return store, taker


def drain(store: RedisRunStore, taker: Any, n: int) -> int:
    """claim_expired(100) until n runs are claimed: n."""
    got = 0
    while got < n:
        batch = (taker.claim_expired(MAX_CLAIM) if taker is not None
                 else store.claim_expired("taker", LONG, MAX_CLAIM))
        assert batch, f"claimed {got} of {n}"
        got += len(batch)
    return got


def bare_drain(port: int, kind: str, n: int, round_no: int) -> tuple[float, float]:
    """(server µs, wall µs) per run of draining n expired runs of ``kind``
    (:func:`drain_prepare`) by claim_expired(100)."""
    client = redis.Redis(port=port)
    store, taker = drain_prepare(client, kind, n, f"drain-{kind}-{round_no}")
    before = evalsha(client)
    start_t = time.perf_counter()
    drain(store, taker, n)
    wall = (time.perf_counter() - start_t) * 1e6
    server = evalsha(client) - before
    client.close()
    return server / n, wall / n


def drain_instructions(kind: str, n: int) -> float:
    """Callgrind instructions per run claimed of the drain of n runs of ``kind``: a server
    under callgrind prepared alike (the session's lapse planted) with and without the
    drain (bench_instructions.py's ``instructions``)."""
    from bench_instructions import instructions

    def work(with_drain: bool) -> Callable[[redis.Redis], int]:
        def run(client: redis.Redis) -> int:
            store, taker = drain_prepare(client, kind, n, "i", lapse=None)
            return drain(store, taker, n) if with_drain else 0
        return run

    base, _ = instructions(work(False))
    total, units = instructions(work(True))
    return (total - base) / units


def med(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], fmt: str = ",.1f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--ttl", type=int, default=2_000, help="ms (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="kills of each mode (3)")
    parser.add_argument("--drain-rounds", type=int, default=3, help="bare drains (3)")
    parser.add_argument("--concurrency", type=int, default=1, help="each Worker's loops")
    parser.add_argument("--modes", default="session,leases")
    parser.add_argument("--instructions", type=int, default=0, metavar="N",
                        help="also callgrind instructions per run of the bare drains of N "
                             "runs (needs valgrind; 0: none, the default)")
    parser.add_argument("--cluster", action="store_true",
                        help="the takeover on a local cluster of three primaries (the store "
                             "of one partition on one of them); no bare drains")
    parser.add_argument("--partitions", type=int, default=1,
                        help="the store's partitions (with --cluster: spread over the "
                             "primaries; the session kept in each)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    figures: dict[str, Any] = {"runs": args.runs, "ttl": args.ttl, "takeover": {},
                               "drain": {}, "load": [os.getloadavg()],
                               "cluster": args.cluster, "partitions": args.partitions}
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="redisstore-takeover-"))
        if args.cluster:
            from bench_partitions import start_cluster
            port = start_cluster(stack)[0]
            args.drain_rounds, args.instructions = 0, 0
        else:
            port = stack.enter_context(own_server(server_binary()))
        takes: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                got = takeover(port, mode, args.runs, args.ttl, args.concurrency,
                               Path(folder), r, args.cluster, args.partitions)
                takes[mode].append(got)
                if not args.json:
                    print(f"{mode:8} round {r + 1}: " + ", ".join(
                        f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in got.items() if k != "stats"), flush=True)
                if not args.cluster:
                    redis.Redis(port=port).flushall()
        figures["takeover"] = takes
        drains: dict[str, dict[str, Any]] = {k: {"server": [], "wall": []} for k in KINDS}
        for r in range(args.drain_rounds):
            for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
                server, wall = bare_drain(port, kind, args.runs, r)
                drains[kind]["server"].append(server)
                drains[kind]["wall"].append(wall)
            redis.Redis(port=port).flushall()
        figures["drain"] = drains
    if args.instructions:
        for kind in KINDS:
            drains[kind]["instructions"] = drain_instructions(kind, args.instructions)
            if not args.json:
                print(f"{kind}: {drains[kind]['instructions']:,.0f} instructions a run",
                      flush=True)
    figures["load"].append(os.getloadavg())
    if args.json:
        print(json.dumps(figures))
        return
    print()
    print(tables(figures))


def tables(figures: dict[str, Any]) -> str:
    n, ttl = figures["runs"], figures["ttl"]
    where = "a 3-primary cluster" if figures.get("cluster") else "one server"
    lines = [f"Takeover of {n:,} runs on {where}, TTL {ttl} ms, {WORKERS} Workers; ms from "
             "the SIGKILL, median (spread) over the rounds:", "",
             "| dead node held them | expired | all claimable | first takeover | last "
             "takeover | drain µs/run | exactly once |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    names = {"session": "under one session", "leases": "a lease per run"}

    def cell(rounds: list[dict[str, Any]], key: str, fmt: str = ",.0f") -> str:
        values = [r[key] for r in rounds if r[key] is not None]
        return f"{med(values):{fmt}} ({spread(values, fmt)})" if values else "-"

    for mode, rounds in figures["takeover"].items():
        once = all(r["exactly_once"] for r in rounds)
        lines.append(f"| {names.get(mode, mode)} | {cell(rounds, 'expired_ms')} | "
                     f"{cell(rounds, 'all_claimable_ms')} | {cell(rounds, 'first_ms')} | "
                     f"{cell(rounds, 'last_ms')} | {cell(rounds, 'drain_us_per_run', ',.1f')} | "
                     f"{'yes' if once else 'NO'} ({len(rounds)} rounds) |")
    lines += ["", f"claim_expired({MAX_CLAIM}) draining {n:,} expired runs, µs per run "
              "claimed, median (spread):", "",
              "| runs | server µs/run | client µs/run | server vs per-run leases | "
              "instructions/run | vs per-run leases |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    drains = figures["drain"]
    base = med(drains["leases"]["server"]) if drains.get("leases", {}).get("server") else 0
    base_ins = drains.get("leases", {}).get("instructions")
    names = {"session": "of a lapsed session, a plain owner's claim",
             "session-claim": "of a lapsed session, claimed under a live session",
             "leases-beside": "per-run leases, expired, beside a live session",
             "leases": "per-run leases, expired (no session in the namespace)"}
    for kind, d in drains.items():
        if not d["server"]:
            continue
        ratio = f"{med(d['server']) / base:.2f}x" if base else "-"
        ins = d.get("instructions")
        ins_cells = (f"{ins:,.0f} | {ins / base_ins:.2f}x" if ins and base_ins
                     else f"{ins:,.0f} | -" if ins else " | ")
        lines.append(f"| {names[kind]} | {med(d['server']):.2f} ({spread(d['server'], '.2f')}) "
                     f"| {med(d['wall']):.2f} ({spread(d['wall'], '.2f')}) | {ratio} | "
                     f"{ins_cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
