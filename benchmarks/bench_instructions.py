"""Server instructions per call of each run script, counted by valgrind's callgrind.

Wall time on a shared 2-CPU VM moves by 15% between runs; instructions do not. For each row
this starts ``redis-server`` (from PATH) under ``valgrind --tool=callgrind`` on a free
loopback port, prepares the data, then makes ``--calls`` calls; and once more, preparing the
same data but making no call. (Instructions of the first - of the second) / calls is what one
call costs the server: reading the command, running the script, writing the reply. Rows:

- ``EVALSHA return 1``: the floor, a script that does nothing;
- ``compare_and_set's fragments, then return 1``: what a script pays before its own body
  runs: defining the lib fragments it is sent, on every call (Lua 5.1 creates each closure
  anew, and finds each of its upvalues in a list as long as the locals captured so far);
- ``compare_and_set (Hold)`` sent the same way, then each operation through the public API
  (``RedisRunStore``): ``get``, ``insert`` (with a lease), ``compare_and_set`` (Hold and
  Release), ``renew`` of one run, and ``claim_expired(100)`` / ``claim_ready(100)`` per run
  claimed.

Nothing is asserted; the figures are printed (``--json`` for a machine)::

    .venv/bin/python benchmarks/bench_instructions.py [--calls 300] [--json]

About 2 minutes (valgrind runs the server about 50 times slower).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from common import own_server, server_binary

from redisstore import At, Claim, Hold, RedisRunStore, Release, scripts

RECORD = b"x" * 100

#: Prepare for ``calls`` calls on the client, then make them if the flag says so.
Workload = Callable[[redis.Redis, int, bool], Any]


def instructions(work: Workload, calls: int, measured: bool) -> int:
    """Instructions the server ran for the whole life of one private server doing ``work``."""
    with tempfile.TemporaryDirectory(prefix="redisstore-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")
        with own_server(server_binary(), timeout=60, wrapper=wrapper) as port:
            client = redis.Redis(port=port)
            work(client, calls, measured)
            client.close()
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit("callgrind wrote no totals")


def per_call(work: Workload, calls: int) -> float:
    return (instructions(work, calls, True) - instructions(work, calls, False)) / calls


def raw(source: str) -> Workload:
    """EVALSHA of ``source`` with compare_and_set's keys and arguments (a Hold write of a
    run held by its writer, revision by revision)."""

    def work(client: redis.Redis, calls: int, measured: bool) -> None:
        sha = client.script_load(source)
        prefix = "{i}:"
        keys = [prefix + "r:a", prefix + "leases", prefix + "ready", prefix + "meta"]
        store = RedisRunStore(client, namespace="i")
        store.migrate()
        store.insert("a", RECORD, Claim("n", 3_600_000))
        for k in range(calls if measured else 0):
            client.evalsha(sha, len(keys), *keys, prefix, "a", str(k + 1), RECORD, "h", "n",
                           "0", "", "", "", "", "0")

    return work


def api(operation: str, partitions: int = 1) -> Workload:
    """``operation`` through the public API, after the same preparation every row makes (a
    store of ``partitions``, on the one server)."""

    def work(client: redis.Redis, calls: int, measured: bool) -> None:
        store = RedisRunStore(client, namespace="i", partitions=partitions,
                              discover=lambda r: At(0) if r == b"ready" else None)
        store.migrate()
        rng = random.Random(1)
        ids = [f"{rng.getrandbits(128):032x}" for _ in range(calls)]
        # Every script once (loaded and warm), then the data each row needs.
        store.insert("w", RECORD, Claim("n", 3_600_000))
        store.compare_and_set("w", 1, RECORD, Hold("n"))
        store.renew("n", ["w"], 3_600_000)
        store.claim_expired("m", 60_000, 1)
        store.claim_ready("m", 60_000, 1)
        store.get("w")
        for run in ids:
            store.insert(run, RECORD, Claim("n", 3_600_000) if operation != "claim_expired"
                         else Claim("n", 1))
            if operation == "claim_ready":
                store.compare_and_set(run, 1, b"ready", Release())
        time.sleep(0.05)  # the 1 ms leases have expired
        if not measured:
            return
        if operation == "get":
            for run in ids:
                store.get(run)
        elif operation == "insert":
            for run in ids:
                store.insert("new" + run, RECORD, Claim("n", 3_600_000))
        elif operation == "compare_and_set (Hold)":
            for run in ids:
                store.compare_and_set(run, 1, RECORD, Hold("n"))
        elif operation == "compare_and_set (Release)":
            for run in ids:
                store.compare_and_set(run, 1, RECORD, Release())
        elif operation == "renew (one run)":
            for run in ids:
                store.renew("n", [run], 3_600_000)
        elif operation in ("claim_expired", "claim_ready"):
            claim = getattr(store, operation)
            claimed = sum(len(claim("m", 60_000, 100)) for _ in range(calls // 100))
            assert claimed == calls // 100 * 100, (operation, claimed)
        else:
            raise ValueError(operation)

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300,
                        help="calls per row (a multiple of 100; default 300)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--partitions", type=int, default=1,
                        help="the API rows' store spreads over this many partitions")
    parser.add_argument("--only", default="", help="the rows whose name holds this text")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH")
    if args.calls < 100 or args.calls % 100:
        raise SystemExit("--calls must be a positive multiple of 100")
    cas = scripts.RUN_COMPARE_AND_SET.source.decode()
    body = cas.index("local run = arg_text(2)")
    rows: list[tuple[str, Workload, int]] = [
        ("EVALSHA return 1", raw("return 1"), args.calls),
        ("compare_and_set's fragments, then return 1", raw(cas[:body] + "return 1"),
         args.calls),
        ("compare_and_set (Hold), EVALSHA", raw(cas), args.calls),
        *((op, api(op, args.partitions), args.calls) for op in (
            "get", "insert", "compare_and_set (Hold)", "compare_and_set (Release)",
            "renew (one run)")),
        ("claim_expired(100), per run", api("claim_expired", args.partitions), args.calls),
        ("claim_ready(100), per run", api("claim_ready", args.partitions), args.calls),
    ]
    figures: dict[str, float] = {}
    for name, work, calls in rows:
        if args.only not in name:
            continue
        figures[name] = per_call(work, calls)
        if not args.json:
            print(f"{name:48} {figures[name]:>10,.0f} instructions", flush=True)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
