"""A node's liveness bill: one session ``keepalive`` beside ``renew`` of the same runs, at
1k, 10k and 100k runs held (docs/design/sessions.md, "Budgets").

For each size N the same node holds N runs twice, in two namespaces of one server: under
one session (``store.open_session`` then ``insert(run, record, session.lease)``), and with a
lease per run (``Claim``). Then:

- **instructions** (callgrind, as ``bench_instructions.py`` counts them): a server under
  ``valgrind --tool=callgrind`` at ``hz 1`` loads the data (an RDB written by a plain server
  that prepared it, so the 100k rows need no hours under valgrind), is sent one keepalive
  and one renew of 150 runs to warm the scripts, then ``--keepalives`` keepalives, or
  ``--batches`` renews of 150 runs (batches of the N runs, in order), or nothing; the
  difference to the server that did nothing, per call, is what one call cost. The renewal
  bill of the N runs is a batch's figure times N / 150 batches.
- **µs** (``--rounds``, default 5): on the plain server that prepared the data,
  ``--keepalives`` keepalives and a full renewal of the N runs (every run, in batches of
  150), interleaved round by round: ``INFO commandstats`` µs of EVALSHA per call (the
  server's), and the caller's wall µs per call. Medians and spread (min-max) over rounds.

The target: a keepalive's instructions at 100k runs within 5% of those at 1k. Nothing is
asserted; the figures are printed side by side (``--json`` too)::

    .venv/bin/python benchmarks/bench_sessions.py                    # ~2.5 min, needs valgrind
    .venv/bin/python benchmarks/bench_sessions.py --sizes 1000,10000 --ins-rounds 1
    .venv/bin/python benchmarks/bench_sessions.py --no-instructions  # µs only
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from common import own_server, server_binary

from redisstore import Claim, RedisRunStore, Session
from redisstore.runs import MAX_RENEW

RECORD = b"x" * 100
OWNER = "node-a"
LONG = 3_600_000  # the session's ttl and the per-run leases': outlive the measurement
TIMEOUT = 120_000  # under valgrind a call is about 50 times slower
SESSIONS_NS, LEASES_NS = "sess", "lease"


def run_ids(n: int) -> list[str]:
    """N run ids of 36 characters (the size of a uuid)."""
    return [f"run-{i:032d}" for i in range(n)]


def stores(client: redis.Redis) -> tuple[RedisRunStore, RedisRunStore]:
    return (RedisRunStore(client, namespace=SESSIONS_NS, timeout=TIMEOUT),
            RedisRunStore(client, namespace=LEASES_NS, timeout=TIMEOUT))


def fill(client: redis.Redis, n: int) -> str:
    """N runs held under one session of OWNER, and N runs with a lease each: the
    session's id."""
    held, leased = stores(client)
    session = held.open_session(OWNER, LONG)
    ids = run_ids(n)
    for start in range(0, n, 500):
        with held.pipeline() as pipe:
            for run in ids[start:start + 500]:
                pipe.insert(run, RECORD, session.lease)
        with leased.pipeline() as pipe:
            for run in ids[start:start + 500]:
                pipe.insert(run, RECORD, Claim(OWNER, LONG))
    (info,) = held.sessions()
    assert info.runs == n, info
    return session.id


def batches(n: int) -> list[list[str]]:
    ids = run_ids(n)
    return [ids[i:i + MAX_RENEW] for i in range(0, n, MAX_RENEW)]


# ---------------------------------------------------------------------------- callgrind

#: Calls made on a loaded server: returns how many were made.
Work = Callable[[RedisRunStore, RedisRunStore, Session], int]


def warm(held: RedisRunStore, leased: RedisRunStore, session: Session) -> None:
    """Every variant sends these first: each script loaded and run once."""
    session.keepalive()
    leased.renew(OWNER, run_ids(MAX_RENEW), LONG)


def instructions(rdb: Path, sid: str, work: Work) -> tuple[int, int]:
    """(Instructions a callgrind server ran over its life, loading ``rdb`` then doing
    ``work``; the calls it made.)"""
    with tempfile.TemporaryDirectory(prefix="redisstore-callgrind-") as folder:
        shutil.copy(rdb, Path(folder) / "dump.rdb")
        out = Path(folder) / "callgrind.out"
        wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")
        # hz 1 (bench_instructions.py): the timer's ticks over a server's life were the
        # main noise. The later --dir wins: the server loads the prepared dump.rdb.
        with own_server(server_binary(), timeout=600, wrapper=wrapper,
                        args=("--hz", "1", "--dir", folder, "--dbfilename", "dump.rdb")) as port:
            client = redis.Redis(port=port, socket_timeout=TIMEOUT / 1000)
            held, leased = stores(client)
            session = Session(held, sid, OWNER, LONG)
            warm(held, leased, session)
            calls = work(held, leased, session)
            client.close()
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1]), calls
    raise SystemExit("callgrind wrote no totals")


def keepalives(k: int) -> Work:
    def work(held: RedisRunStore, leased: RedisRunStore, session: Session) -> int:
        for _ in range(k):
            session.keepalive()
        return k
    return work


def renewals(n: int, k: int) -> Work:
    def work(held: RedisRunStore, leased: RedisRunStore, session: Session) -> int:
        chosen = batches(n)[:k]
        for batch in chosen:
            assert len(leased.renew(OWNER, batch, LONG)) == len(batch)
        return len(chosen)
    return work


def nothing(held: RedisRunStore, leased: RedisRunStore, session: Session) -> int:
    return 0


# ---------------------------------------------------------------------------- µs


def evalsha(client: redis.Redis) -> tuple[int, int]:
    """(usec, calls) of EVALSHA so far (INFO commandstats)."""
    entry = client.info("commandstats").get("cmdstat_evalsha", {"usec": 0, "calls": 0})
    return int(entry["usec"]), int(entry["calls"])


def timed(client: redis.Redis, work: Work, held: RedisRunStore, leased: RedisRunStore,
          session: Session) -> tuple[float, float, int]:
    """(server µs, wall µs, EVALSHAs) of ``work``."""
    usec0, calls0 = evalsha(client)
    start = time.perf_counter()
    work(held, leased, session)
    wall = (time.perf_counter() - start) * 1e6
    usec1, calls1 = evalsha(client)
    return usec1 - usec0, wall, calls1 - calls0


def usec(client: redis.Redis, n: int, sid: str, k: int, rounds: int) -> dict[str, list[float]]:
    """Rounds of k keepalives and of a renewal of all n runs, interleaved (the other order
    in odd rounds): server and wall µs per keepalive, and of the whole renewal."""
    held, leased = stores(client)
    session = Session(held, sid, OWNER, LONG)
    warm(held, leased, session)
    us: dict[str, list[float]] = {k: [] for k in (
        "keepalive server", "keepalive wall", "renew server", "renew wall")}
    order: tuple[tuple[str, Work], ...] = (("keepalive", keepalives(k)),
                                           ("renew", renewals(n, len(batches(n)))))
    for r in range(rounds):
        for name, work in (order if r % 2 == 0 else order[::-1]):
            server, wall, calls = timed(client, work, held, leased, session)
            per = calls if name == "keepalive" else 1
            us[f"{name} server"].append(server / per)
            us[f"{name} wall"].append(wall / per)
    return us


def spread(values: list[float], fmt: str = ",.1f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def med(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="runs held, comma-separated (default 1000,10000,100000)")
    parser.add_argument("--keepalives", type=int, default=1000,
                        help="keepalives per callgrind server and per µs round (1000)")
    parser.add_argument("--batches", type=int, default=20,
                        help="renews of 150 runs per callgrind server (default 20)")
    parser.add_argument("--ins-rounds", type=int, default=2,
                        help="callgrind servers per variant and size (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="µs rounds (default 5)")
    parser.add_argument("--no-instructions", action="store_true", help="µs only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not args.no_instructions and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH (or --no-instructions)")
    figures: dict[str, Any] = {"keepalives": args.keepalives, "batches": args.batches,
                               "rounds": args.rounds, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="redisstore-sessions-") as keep:
        for n in sizes:
            row: dict[str, Any] = {}
            figures["sizes"][n] = row
            with own_server(server_binary()) as port:
                client = redis.Redis(port=port)
                started = time.monotonic()
                sid = fill(client, n)
                row["fill_s"] = time.monotonic() - started
                us = usec(client, n, sid, args.keepalives, args.rounds)
                row["usec"] = us
                row["renew_calls"] = len(batches(n))
                if not args.no_instructions:
                    client.save()
                    folder = str(client.config_get("dir")["dir"])
                    rdb = Path(keep) / f"{n}.rdb"
                    shutil.copy(Path(folder) / "dump.rdb", rdb)
                client.close()
            if not args.json:
                print(f"{n:>7,} runs: filled in {row['fill_s']:.1f} s; keepalive "
                      f"{med(us['keepalive server']):.1f} µs server, "
                      f"{med(us['keepalive wall']):.1f} µs wall; renewal of all "
                      f"{med(us['renew server']) / 1000:,.1f} ms server, "
                      f"{med(us['renew wall']) / 1000:,.1f} ms wall", flush=True)
            if args.no_instructions:
                continue
            ins: dict[str, list[float]] = {"keepalive": [], "renew batch": []}
            for _ in range(args.ins_rounds):
                base, _ = instructions(rdb, sid, nothing)
                total, calls = instructions(rdb, sid, keepalives(args.keepalives))
                ins["keepalive"].append((total - base) / calls)
                total, calls = instructions(rdb, sid, renewals(n, args.batches))
                ins["renew batch"].append((total - base) / calls)
            row["instructions"] = ins
            if not args.json:
                print(f"{'':>7}  keepalive {med(ins['keepalive']):,.0f} instructions "
                      f"({spread(ins['keepalive'], ',.0f')}), renew of 150 "
                      f"{med(ins['renew batch']):,.0f} ({spread(ins['renew batch'], ',.0f')})",
                      flush=True)
    if args.json:
        print(json.dumps(figures))
        return
    print()
    print(table(figures))


def table(figures: dict[str, Any]) -> str:
    """The sizes side by side (markdown, for benchmarks/README.md)."""
    sizes = figures["sizes"]
    first = next(iter(sizes.values()))
    lines = ["| runs held | keepalive instructions (spread) | vs the first size | keepalive "
             "server µs (spread) | keepalive client µs (spread) | renew of 150: instructions "
             "(spread) | renewal of all: instructions (calls) | renewal of all: server ms "
             "(spread) | client ms (spread) | renewal / keepalive, server µs |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, row in sizes.items():
        us = row["usec"]
        ins = row.get("instructions")
        k_ins = first_k = ""
        b_ins = bill = ""
        if ins:
            k = med(ins["keepalive"])
            k_ins = f"{k:,.0f} ({spread(ins['keepalive'], ',.0f')})"
            k0 = med(first["instructions"]["keepalive"])
            first_k = f"{(k / k0 - 1) * 100:+.1f}%"
            b = med(ins["renew batch"])
            b_ins = f"{b:,.0f} ({spread(ins['renew batch'], ',.0f')})"
            bill = f"{b * n / MAX_RENEW:,.0f} ({row['renew_calls']:,})"
        ks, kw = us["keepalive server"], us["keepalive wall"]
        rs, rw = us["renew server"], us["renew wall"]
        lines.append(
            f"| {n:,} | {k_ins} | {first_k} | {med(ks):.1f} ({spread(ks)}) | "
            f"{med(kw):.1f} ({spread(kw)}) | {b_ins} | {bill} | "
            f"{med(rs) / 1000:,.1f} ({spread([x / 1000 for x in rs])}) | "
            f"{med(rw) / 1000:,.1f} ({spread([x / 1000 for x in rw])}) | "
            f"{med(rs) / med(ks):,.0f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
