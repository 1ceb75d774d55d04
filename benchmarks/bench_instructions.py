"""Server cost per call of each run script beside its minimal script: callgrind
instructions, and ``INFO commandstats`` µs on a plain server.

A **minimal script** (``benchmarks/minimal/<op>.lua``) does only the commands its
operation cannot do without on layout 4, with the real script's KEYS and ARGV, and leaves
the data as the real operation does (``--check`` shows it). The budget
(docs/design/hot-path.md): every operation's server time at most 2x its minimal script's.

**Instructions** (steady on a shared VM, where wall time moves by 15% between runs). For
each operation this starts ``redis-server`` (from PATH) under ``valgrind --tool=callgrind``
on a free loopback port three times, each preparing the same data through the public API
(``RedisRunStore``, migrated to layout 4; the minimal script loaded too), then making
``--calls`` calls: through the API (the real script), or by EVALSHA of the minimal script
with the same keys and arguments, or none. (Instructions of a run with calls - of the run
with none) / calls is what one call costs the server: reading it, the script, the reply.
These servers run at ``hz 1`` (their timer ticks once a second), so that the run with calls
and the one without count nearly the same ticks.
Three rows more, EVALSHA with compare_and_set's arguments: ``return 1`` (the floor),
compare_and_set's lib fragments then ``return 1`` (what a script pays before its body:
defining its fragments, on every call), and compare_and_set (Hold) itself.

Operations: ``get``, ``insert`` (with a lease), ``compare_and_set`` (Hold and Release),
``renew`` and ``release`` of one run, and ``claim_expired(100)`` / ``claim_ready(100)``
(per run claimed).

**µs** (``--rounds``, default 5; ``--stat-calls`` per row, default 1,000): on one plain
``redis-server`` (not under valgrind), each round prepares the same data afresh
(``FLUSHALL``: the server is this script's) for the real and then the minimal script (the
other way round in odd rounds), and reads ``INFO commandstats`` ``cmdstat_evalsha`` usec
before and after the calls: µs per call (per run claimed for the claims). The table gives
medians over rounds and the spread (min-max), and the commands the scripts called per call
(every command's calls in ``INFO commandstats`` but EVALSHA's and INFO's), real / minimal.

Nothing is asserted; the figures are printed (``--json`` for a machine)::

    .venv/bin/python benchmarks/bench_instructions.py [--calls 300] [--rounds 5] [--json]
    .venv/bin/python benchmarks/bench_instructions.py --only get,claim-ready   # a subset
    .venv/bin/python benchmarks/bench_instructions.py --check   # minimal scripts' data
    .venv/bin/python benchmarks/bench_instructions.py --no-instructions   # µs only
    .venv/bin/python benchmarks/bench_instructions.py --rounds 0   # instructions only
    .venv/bin/python benchmarks/bench_instructions.py --partitions 6   # real rows only

About 4 minutes at 200 calls (valgrind runs the server about 50 times slower).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from common import own_server, server_binary

from redisstore import At, Claim, Hold, RedisRunStore, Release, scripts

RECORD = b"x" * 100
MINIMAL = Path(__file__).resolve().parent / "minimal"
NS = "i"
LONG = 3_600_000


@dataclass
class Prepared:
    """What a row's preparation made: the store, the runs each call works on, and the SHA
    of the minimal script (loaded)."""

    client: redis.Redis
    store: RedisRunStore
    ids: list[str]
    sha: str
    P: str  # the key prefix, {ns}:

    def key(self, run: str) -> str:
        return f"{self.P}r:{run}"

    @property
    def keys(self) -> tuple[str, str, str, str]:
        """leases, ready, meta, fanout"""
        return (self.P + "leases", self.P + "ready", self.P + "meta", self.P + "fanout")


@dataclass
class Op:
    """One operation: its key for ``--only``, its row name, its minimal script, and its
    calls through the API and through the minimal script (each returns the units done:
    calls, or runs claimed)."""

    key: str
    name: str
    script: str
    real: Callable[[Prepared], int]
    minimal: Callable[[Prepared], int]
    expired: bool = False  # its runs' leases are left to expire
    ready: bool = False  # its runs are made ready (a Release write with a wait)


def ok(reply: Any) -> None:
    if reply[0] != 0:
        raise RuntimeError(f"a minimal script answered {reply!r}")


def each(p: Prepared, call: Callable[[str], Any]) -> int:
    for run in p.ids:
        call(run)
    return len(p.ids)


def claims(p: Prepared, call: Callable[[], int]) -> int:
    claimed = sum(call() for _ in range(len(p.ids) // 100))
    assert claimed == len(p.ids) // 100 * 100, claimed
    return claimed


def minimal_claimed(p: Prepared, *keys_args: Any) -> int:
    reply = p.client.evalsha(p.sha, *keys_args)
    ok(reply)
    return len(reply[1])


def write_args(p: Prepared, run: str, *rest: Any) -> tuple[Any, ...]:
    """run_insert's or run_compare_and_set's keys and arguments."""
    leases, ready, meta, _ = p.keys
    return (4, p.key(run), leases, ready, meta, p.P, run, *rest, "", "", "", "", 0)


def expired_floor(p: Prepared) -> int:
    """The minimal claim_expired(100) over p's expired leases, per run claimed."""
    return claims(p, lambda: minimal_claimed(p, 2, p.keys[0], p.keys[2], p.P, "m", 60_000,
                                             100, 0, ""))


def ready_floor(p: Prepared) -> int:
    """The minimal claim_ready(100) over p's ready runs, per run claimed."""
    return claims(p, lambda: minimal_claimed(p, 4, p.keys[1], p.keys[0], p.keys[2], p.keys[3],
                                             p.P, "m", 60_000, 100, 0, 0))


OPS: list[Op] = [
    Op("get", "get", "get",
       lambda p: each(p, p.store.get),
       lambda p: each(p, lambda r: ok(p.client.evalsha(p.sha, 2, p.key(r), p.keys[2], p.P,
                                                      r)))),
    Op("insert", "insert (with a lease)", "insert",
       lambda p: each(p, lambda r: p.store.insert("new" + r, RECORD, Claim("n", LONG))),
       lambda p: each(p, lambda r: ok(p.client.evalsha(
           p.sha, *write_args(p, "new" + r, RECORD, "c", "n", LONG))))),
    Op("cas-hold", "compare_and_set (Hold)", "compare_and_set_hold",
       lambda p: each(p, lambda r: p.store.compare_and_set(r, 1, RECORD, Hold("n"))),
       lambda p: each(p, lambda r: ok(p.client.evalsha(
           p.sha, *write_args(p, r, 1, RECORD, "h", "n", 0))))),
    Op("cas-release", "compare_and_set (Release)", "compare_and_set_release",
       lambda p: each(p, lambda r: p.store.compare_and_set(r, 1, RECORD, Release())),
       lambda p: each(p, lambda r: ok(p.client.evalsha(
           p.sha, *write_args(p, r, 1, RECORD, "r", "", 0))))),
    Op("renew", "renew (one run)", "renew",
       lambda p: each(p, lambda r: p.store.renew("n", [r], LONG)),
       lambda p: each(p, lambda r: ok(p.client.evalsha(p.sha, 2, p.keys[0], p.keys[2], p.P,
                                                      "n", LONG, r)))),
    Op("release", "release (one run)", "release",
       lambda p: each(p, lambda r: p.store.release("n", [r])),
       lambda p: each(p, lambda r: ok(p.client.evalsha(p.sha, 3, *p.keys[:3], p.P, "n", 0,
                                                      r)))),
    Op("claim-expired", "claim_expired(100), per run", "claim_expired",
       lambda p: claims(p, lambda: len(p.store.claim_expired("m", 60_000, 100))),
       expired_floor,
       expired=True),
    Op("claim-ready", "claim_ready(100), per run", "claim_ready",
       lambda p: claims(p, lambda: len(p.store.claim_ready("m", 60_000, 100))),
       ready_floor,
       ready=True),
    # claim takes both kinds: over a population of one kind, its floor is that kind's.
    Op("claim-both-expired", "claim(100) of expired leases, per run", "claim_expired",
       lambda p: claims(p, lambda: len(p.store.claim("m", 60_000, 100))),
       expired_floor,
       expired=True),
    Op("claim-both-ready", "claim(100) of ready runs, per run", "claim_ready",
       lambda p: claims(p, lambda: len(p.store.claim("m", 60_000, 100))),
       ready_floor,
       ready=True),
]


def minimal_source(op: Op) -> str:
    return (MINIMAL / f"{op.script}.lua").read_text()


def prepare(client: redis.Redis, op: Op, calls: int, namespace: str = NS,
            partitions: int = 1) -> Prepared:
    """The data every variant of ``op`` starts from: a layout 4 store, every real script
    called once (loaded and warm), the minimal script loaded, and ``calls`` runs (ids from
    a seeded generator) held by ``n``: for an hour, or 1 ms for claim_expired (then
    expired), or made ready (a Release write whose wait is At(0)) for claim_ready. With
    ``partitions`` the store spreads over that many (on the one server): only the real
    operation's calls then apply (the minimal scripts name one partition's keys)."""
    # Under valgrind the server runs about 50 times slower: a script's first load alone
    # can pass the default 5 s deadline.
    store = RedisRunStore(client, namespace=namespace, partitions=partitions,
                          discover=lambda r: At(0) if r == b"ready" else None,
                          timeout=60_000)
    store.migrate()
    sha = client.script_load(minimal_source(op))
    rng = random.Random(1)
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(calls)]
    store.insert("w", RECORD, Claim("n", LONG))
    store.compare_and_set("w", 1, RECORD, Hold("n"))
    store.renew("n", ["w"], LONG)
    store.release("n", ["absent"])
    store.claim_expired("m", 60_000, 1)
    store.claim_ready("m", 60_000, 1)
    store.claim("m", 60_000, 1)
    store.get("w")
    for run in ids:
        store.insert(run, RECORD, Claim("n", 1) if op.expired else Claim("n", LONG))
        if op.ready:
            store.compare_and_set(run, 1, b"ready", Release())
    time.sleep(0.05)  # the 1 ms leases have expired
    return Prepared(client, store, ids, sha, "{" + namespace + "}:")


# ---------------------------------------------------------------------------- callgrind

#: Prepare on the client, then make the calls (or none): returns the units done.
Workload = Callable[[redis.Redis], int]


def instructions(work: Workload) -> tuple[int, int]:
    """(Instructions the server ran for the whole life of one private server doing
    ``work``, the units ``work`` did.)"""
    with tempfile.TemporaryDirectory(prefix="redisstore-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")
        # hz 1: the server's timer (serverCron) runs once a second instead of ten times;
        # its ticks, counted over the whole life of the server, were the main noise
        # (floor at 100 calls, three runs each: 31.0-33.4k at hz 10, 32.0-32.3k at hz 1).
        with own_server(server_binary(), timeout=60, wrapper=wrapper,
                        args=("--hz", "1")) as port:
            client = redis.Redis(port=port)
            units = work(client)
            client.close()
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1]), units
    raise SystemExit("callgrind wrote no totals")


def op_work(op: Op, calls: int, variant: str, partitions: int = 1) -> Workload:
    def work(client: redis.Redis) -> int:
        p = prepare(client, op, calls, partitions=partitions)
        if variant == "none":
            return 0
        return op.real(p) if variant == "real" else op.minimal(p)
    return work


def raw(source: str) -> Callable[[int], Workload]:
    """EVALSHA of ``source`` with compare_and_set's keys and arguments (a Hold write of a
    run held by its writer, revision by revision)."""

    def make(calls: int) -> Workload:
        def work(client: redis.Redis) -> int:
            sha = client.script_load(source)
            keys = ["{i}:r:a", "{i}:leases", "{i}:ready", "{i}:meta"]
            store = RedisRunStore(client, namespace=NS)
            store.migrate()
            store.insert("a", RECORD, Claim("n", LONG))
            for k in range(calls):
                client.evalsha(sha, len(keys), *keys, "{i}:", "a", str(k + 1), RECORD, "h", "n",
                               "0", "", "", "", "", "0")
            return calls
        return work
    return make


def per_call(make: Callable[[int], Workload], calls: int) -> float:
    with_calls, units = instructions(make(calls))
    without, _ = instructions(make(0))
    return (with_calls - without) / units


def op_instructions(op: Op, calls: int, partitions: int = 1) -> tuple[float, float]:
    """(real, minimal) instructions per unit of ``op``, against one run without calls
    (minimal: nan over partitions)."""
    base, _ = instructions(op_work(op, calls, "none", partitions))
    real, units = instructions(op_work(op, calls, "real", partitions))
    if partitions > 1:
        return (real - base) / units, float("nan")
    minimal, units_min = instructions(op_work(op, calls, "minimal"))
    return (real - base) / units, (minimal - base) / units_min


# ---------------------------------------------------------------------------- commandstats


def evalsha_usec(client: redis.Redis) -> tuple[int, int]:
    """(usec of EVALSHA, calls of every other command but INFO) so far (INFO
    commandstats): the commands a script calls are counted there too."""
    stats = client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {"usec": 0})
    inner = sum(int(v["calls"]) for k, v in stats.items()
                if k not in ("cmdstat_evalsha", "cmdstat_info"))
    return int(evalsha["usec"]), inner


def op_usec(client: redis.Redis, op: Op, calls: int, variant: str) -> tuple[float, float]:
    """(Server µs per unit (EVALSHA usec / units), commands its scripts called per unit) of
    ``calls`` calls of ``op``'s variant, on data prepared afresh."""
    client.flushall()
    p = prepare(client, op, calls)
    before, inner = evalsha_usec(client)
    units = op.real(p) if variant == "real" else op.minimal(p)
    after, inner_after = evalsha_usec(client)
    return (after - before) / units, (inner_after - inner) / units


# ---------------------------------------------------------------------------- check


def layout_ok(client: redis.Redis, base: str) -> list[str]:
    """Problems of one layout 4 index (``{ns}:L`` or ``{ns}:Q``): a bucket over 128
    entries or empty in the directory, an entry outside its bucket's range."""
    problems = []
    bounds = [b"", *client.zrangebylex(base + "/", "-", "+")]
    for i, bound in enumerate(bounds):
        entries = client.zrange(base + "|" + bound.decode(), 0, -1, withscores=True)
        if len(entries) > 128 or (bound and not entries):
            problems.append(f"{base}|{bound!r}: {len(entries)} entries")
        for member, score in entries:
            c = b"%016d" % int(score) + member
            if c < bound or (i + 1 < len(bounds) and c >= bounds[i + 1]):
                problems.append(f"{base}|{bound!r}: {member!r} out of range")
    return problems


def members(client: redis.Redis, base: str) -> set[bytes]:
    bounds = [b"", *client.zrangebylex(base + "/", "-", "+")]
    return {m for b in bounds for m in client.zrange(base + "|" + b.decode(), 0, -1)}


TIMES = re.compile(rb"\d{13}")


def check(port: int, calls: int, ops: list[Op]) -> bool:
    """Each minimal script on a namespace prepared by the real store: the runs read back by
    the real ``store.get`` with the expected revision and holder, the same as after the
    real operation on the same data (run strings byte for byte but for their 13-digit
    times, the index entries), every index bucket in its range, nothing quarantined."""
    client = redis.Redis(host="127.0.0.1", port=port)
    good = True
    expect: dict[str, tuple[int, str | None]] = {
        "get": (1, "n"), "insert": (1, "n"), "cas-hold": (2, "n"), "cas-release": (2, None),
        "renew": (1, "n"), "release": (1, None), "claim-expired": (1, "m"),
        "claim-ready": (2, "m"),
    }
    for op in ops:
        client.flushall()
        states = {}
        for variant in ("real", "minimal"):
            namespace = f"{NS}-{variant}"
            p = prepare(client, op, calls, namespace=namespace)
            units = op.real(p) if variant == "real" else op.minimal(p)
            runs = ["new" + r for r in p.ids] if op.key == "insert" else p.ids
            problems = []
            rev, holder = expect[op.key]
            for run in runs:
                current = p.store.get(run)
                owner = getattr(current.holder, "owner", None)
                live = getattr(current.holder, "live", None)
                if (current.revision, owner, live) != (rev, holder, holder and True):
                    problems.append(f"{run}: revision {current.revision}, holder "
                                    f"{current.holder} (expected {rev}, {holder}, live)")
            prefix = "{" + namespace + "}:"
            for base in ("L", "Q"):
                problems += layout_ok(client, prefix + base)
            if p.store.quarantined():
                problems.append(f"quarantined: {p.store.quarantined()}")
            states[variant] = (
                {run: TIMES.sub(b"T", client.get(prefix + "r:" + run) or b"") for run in runs},
                members(client, prefix + "L"), members(client, prefix + "Q"))
            if op.key == "get" and variant == "minimal":
                real_sha = client.script_load(scripts.RUN_GET.source)
                for run in runs:
                    keys_args = (2, prefix + "r:" + run, prefix + "meta", prefix, run)
                    a, b = client.evalsha(real_sha, *keys_args), client.evalsha(p.sha, *keys_args)
                    if a != b:
                        problems.append(f"get {run}: {b!r}, the real script {a!r}")
            if units != len(p.ids):
                problems.append(f"{units} units, expected {len(p.ids)}")
            for problem in problems[:5]:
                print(f"  {op.key} ({variant}): {problem}")
            good = good and not problems
        real, minimal = states["real"], states["minimal"]
        same = real == minimal
        if not same:
            good = False
            differ = [r for r in real[0] if real[0][r] != minimal[0].get(r)][:3]
            for r in differ:
                print(f"  {op.key}: {r} real {real[0][r]!r}\n    minimal {minimal[0][r]!r}")
            if real[1:] != minimal[1:]:
                print(f"  {op.key}: index entries differ")
        print(f"{op.key:14} {'ok' if same else 'DIFFERS'}", flush=True)
    client.close()
    return good


# ---------------------------------------------------------------------------- main


def spread(values: list[float]) -> str:
    return f"{min(values):,.1f}-{max(values):,.1f}"


def body_start(script: scripts.Script) -> int:
    """Where the body the server runs first begins in ``script``'s source: after its
    fragments, and after its slow path (``--- @slow``), whose fragments it defines only
    when it runs."""
    lines = script.source.decode().split("\n")
    marks = [i for i, (file, line) in enumerate(script.lines) if file == "<slow path>"]
    first = marks[-1] + 1 if marks else next(
        i for i, (file, _) in enumerate(script.lines) if file == f"{script.name}.lua")
    return sum(len(line) + 1 for line in lines[:first])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300,
                        help="calls per callgrind row (a multiple of 100; default 300)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of µs rows (default 5; 0: none)")
    parser.add_argument("--stat-calls", type=int, default=1000,
                        help="calls per µs row and round (a multiple of 100; default 1000)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--partitions", type=int, default=1,
                        help="the real operations' store spreads over this many partitions "
                             "(on the one server); the minimal scripts are then left out")
    parser.add_argument("--only", default="",
                        help="comma-separated rows: a row's key (get, insert, cas-hold, "
                             "cas-release, renew, release, claim-expired, claim-ready, "
                             "floor, fragments, cas-raw) or text of its name")
    parser.add_argument("--no-instructions", action="store_true",
                        help="only the µs rows (no valgrind)")
    parser.add_argument("--check", action="store_true",
                        help="check that each minimal script leaves the data as the real "
                             "operation does, then exit")
    args = parser.parse_args()
    for name in ("calls", "stat_calls"):
        value = getattr(args, name)
        if value < 100 or value % 100:
            raise SystemExit(f"--{name.replace('_', '-')} must be a positive multiple of 100")
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]

    def chosen(row_key: str, name: str) -> bool:
        return not wanted or any(w == row_key or w in name for w in wanted)

    ops = [op for op in OPS if chosen(op.key, op.name)]
    if args.check:
        with own_server(server_binary()) as port:
            raise SystemExit(0 if check(port, 300, ops) else 1)

    cas = scripts.RUN_COMPARE_AND_SET.source.decode()
    body = body_start(scripts.RUN_COMPARE_AND_SET)
    raw_rows = [("floor", "EVALSHA return 1", raw("return 1")),
                ("fragments", "compare_and_set's fragments, then return 1",
                 raw(cas[:body] + "return 1")),
                ("cas-raw", "compare_and_set (Hold), EVALSHA", raw(cas))]
    figures: dict[str, Any] = {"calls": args.calls, "rounds": args.rounds,
                               "stat_calls": args.stat_calls, "raw": {}, "ops": {}}
    if not args.no_instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind is not on PATH (or --no-instructions)")
        for row_key, name, make in raw_rows:
            if chosen(row_key, name):
                figures["raw"][name] = per_call(make, args.calls)
                if not args.json:
                    print(f"{name:44} {figures['raw'][name]:>10,.0f} instructions", flush=True)
        if ops and not args.json:
            print(f"\n{'instructions per call':44} {'real':>10} {'minimal':>10} {'ratio':>7}")
        for op in ops:
            real, minimal = op_instructions(op, args.calls, args.partitions)
            figures["ops"][op.name] = {"instructions": {"real": real, "minimal": minimal}}
            if not args.json:
                if minimal != minimal:  # nan: over partitions, no minimal script
                    print(f"{op.name:44} {real:>10,.0f} {'-':>10}", flush=True)
                else:
                    print(f"{op.name:44} {real:>10,.0f} {minimal:>10,.0f} "
                          f"{real / minimal:>6.2f}x", flush=True)
    if ops and args.partitions == 1 and args.rounds > 0:
        usec: dict[str, dict[str, list[float]]] = {op.name: {"real": [], "minimal": []}
                                                   for op in ops}
        commands: dict[str, dict[str, float]] = {op.name: {} for op in ops}
        with own_server(server_binary()) as port:
            client = redis.Redis(host="127.0.0.1", port=port)
            for r in range(args.rounds):
                for op in ops:
                    order = ("real", "minimal") if r % 2 == 0 else ("minimal", "real")
                    for variant in order:
                        us, inner = op_usec(client, op, args.stat_calls, variant)
                        usec[op.name][variant].append(us)
                        commands[op.name][variant] = inner
            client.close()
        if not args.json:
            print(f"\n{'INFO commandstats µs per call':44} {'real':>7} {'(spread)':>13} "
                  f"{'minimal':>8} {'(spread)':>11} {'ratio':>7} {'commands':>9}")
        for op in ops:
            real, minimal = usec[op.name]["real"], usec[op.name]["minimal"]
            figures["ops"].setdefault(op.name, {})["usec"] = {
                "real": real, "minimal": minimal,
                "ratio": statistics.median(real) / statistics.median(minimal)}
            figures["ops"][op.name]["commands"] = commands[op.name]
            if not args.json:
                inner = (f"{commands[op.name]['real']:.1f} / "
                         f"{commands[op.name]['minimal']:.1f}")
                print(f"{op.name:44} {statistics.median(real):>7.1f} {spread(real):>13} "
                      f"{statistics.median(minimal):>8.1f} {spread(minimal):>11} "
                      f"{statistics.median(real) / statistics.median(minimal):>6.2f}x "
                      f"{inner:>13}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
