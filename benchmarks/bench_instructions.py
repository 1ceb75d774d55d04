"""Server cost per call of each run script beside its minimal script: callgrind
instructions, and ``INFO commandstats`` µs on a plain server, each row marked against its
budget.

A **minimal script** (``benchmarks/minimal/<op>.lua``) does only the commands its
operation cannot do without on layout 5, with the real script's KEYS and ARGV, and leaves
the data as the real operation does (``--check`` proves it). The job cycle's budgets
(the 2x rule is docs/design/hot-path.md's): at limit 1, ``claim``, ``claim_ready`` and
``claim_expired`` each cost at most 2x their minimal script, in instructions and in µs; at
limit 100, at most 1.3x per run; every other operation (the unit too) at most 2x.

**Instructions** (steady on a shared VM, where wall time moves by 15% between runs). For
each operation this starts ``redis-server`` (from PATH) under ``valgrind --tool=callgrind``
on a free loopback port three times, each preparing the same data through the public API
(``RedisRunStore`` with a ``discover`` that makes a record ``b"ready"`` ready at once; the
minimal script loaded too), then making ``--calls`` calls: through the API (the real
script), or by EVALSHA of the minimal script with the same keys and arguments, or none.
(Instructions of a run with calls - of the run with none) / units is what one unit costs
the server: reading the call, the script, the reply. A unit is a call, or for the claims
at limit 100 a run claimed. These servers run at ``hz 1`` (their timer ticks once a
second), so that the run with calls and the one without count nearly the same ticks.
Three rows more, EVALSHA with compare_and_set's arguments: ``return 1`` (the floor),
compare_and_set's lib fragments then ``return 1`` (what a script pays before its body:
defining its fragments, on every call), and compare_and_set (Hold) itself.

Operations: ``get``, ``insert`` (with a lease), ``compare_and_set`` (Hold and Release),
``renew`` and ``release`` of one run; ``claim`` (over ready runs, and over expired
leases), ``claim_ready`` and ``claim_expired``, each at limit 1 and at limit 100 (per run);
``finish`` with a record sent alone (an ``AsyncWorker``'s at concurrency), of a run of its
own lease and of a session's run, beside ``minimal/finish.lua``; and the job cycle's
**unit**: ``pipeline()`` of ``finish(run, rev, Fenced(owner, token),
record=...)`` then ``claim(owner, ttl, records=True)``, which the store sends as one
script (run_finish_claim), beside ``minimal/finish_claim.lua``.

**µs** (``--rounds``, default 5; ``--stat-calls`` per row, default 1,000): on one plain
``redis-server`` (not under valgrind), each round prepares the same data afresh
(``FLUSHALL``: the server is this script's) for the real and then the minimal script (the
other way round in odd rounds), and reads ``INFO commandstats`` ``cmdstat_evalsha`` usec
before and after the calls: µs per unit. The table gives medians over rounds and the
spread (min-max), and the commands the scripts called per unit (every command's calls in
``INFO commandstats`` but EVALSHA's and INFO's), real / minimal.

Nothing is asserted; the figures are printed (``--json`` for a machine, ``--markdown`` for
benchmarks/README.md)::

    .venv/bin/python benchmarks/bench_instructions.py [--calls 200] [--rounds 5] [--json]
    .venv/bin/python benchmarks/bench_instructions.py --only get,claim-1-ready   # a subset
    .venv/bin/python benchmarks/bench_instructions.py --check   # minimal scripts' data
    .venv/bin/python benchmarks/bench_instructions.py --no-instructions   # µs only
    .venv/bin/python benchmarks/bench_instructions.py --rounds 0   # instructions only
    .venv/bin/python benchmarks/bench_instructions.py --partitions 6   # real rows only

About 15 minutes at 200 calls (valgrind runs the server about 50 times slower).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from common import own_server, server_binary

from redisstore import At, Claim, Feed, Fenced, Hold, LeaseRefused, RedisRunStore, Release
from redisstore.core import scripts
from redisstore.core.runops import fused
from redisstore.runs import MAX_CLAIM_BYTES

RECORD = b"x" * 100
MINIMAL = Path(__file__).resolve().parent / "minimal"
NS = "i"
LONG = 3_600_000
TTL = 60_000  # the claims' lease
PV = 1  # the store's projection version (its default): every script is sent it
#: The real operations' store keeps a change feed (``--feed``): None, it keeps none.
FEED: Feed | None = None


def discover(record: bytes) -> At | None:
    """The benchmark's discovery: a record ``b"ready"`` is ready at once (At(0)), any other
    waits for nothing."""
    return At(0) if record == b"ready" else None


@dataclass
class Prepared:
    """What a row's preparation made: the store, the runs each call works on, the SHA of
    the script the minimal calls send (loaded), and for the unit the run held to start
    with (run, revision, token). With ``replies`` a list, those calls' replies go there."""

    client: redis.Redis
    store: RedisRunStore
    ids: list[str]
    sha: str
    P: str  # the key prefix, {ns}:
    held: tuple[str, int, int] | None = None
    session: str | None = None  # the session the session unit's runs are held under
    replies: list[Any] | None = None
    tokens: dict[str, int] = field(default_factory=dict)  # the grants a finish row ends

    def key(self, run: str) -> str:
        return f"{self.P}r:{run}"

    @property
    def leases(self) -> str:
        return self.P + "leases"

    @property
    def ready(self) -> str:
        return self.P + "ready"

    @property
    def meta(self) -> str:
        return self.P + "meta"

    @property
    def fanout(self) -> str:
        return self.P + "fanout"

    def call(self, *keys_args: Any) -> Any:
        """EVALSHA of the loaded script with these keys and arguments; its reply."""
        reply = self.client.evalsha(self.sha, *keys_args)
        if self.replies is not None:
            self.replies.append(reply)
        return reply


@dataclass
class Op:
    """One row: its key for ``--only``, its name, its minimal script, the real script (what
    ``--check`` also sends the minimal's arguments to), its calls through the API and
    through the minimal script (each returns the units done: calls, or for a claim at limit
    100 runs claimed), the runs it starts from, and its budget (the most real / minimal)."""

    key: str
    name: str
    script: str
    real_script: scripts.Script
    real: Callable[[Prepared], int]
    minimal: Callable[[Prepared], int]
    runs: str = "held"  # held by n for an hour; "session-held" (under n's session);
    # "expired" (1 ms); "ready"; "unit";
    # "session-unit" (the unit's runs, m's claims under a session)
    budget: float = 2.0
    claim: bool = False  # its reply ends with a wait (the minimal scripts' is not read)


def ok(reply: Any) -> None:
    if reply[0] != 0:
        raise RuntimeError(f"a script answered {reply!r}")


def each(p: Prepared, call: Callable[[str], Any]) -> int:
    for run in p.ids:
        call(run)
    return len(p.ids)


def write_args(p: Prepared, run: str, *rest: Any) -> tuple[Any, ...]:
    """run_insert's or run_compare_and_set's keys and arguments (no wait)."""
    return (4, p.key(run), p.leases, p.ready, p.meta, p.P, run, *rest, "", "", "", "", PV)


def claim_argv(p: Prepared, limit: int, budget: int = 0) -> tuple[Any, ...]:
    """A claim script's ARGV (every kind's, run_claim's header): ids only, no bound."""
    return (p.P, "m", TTL, limit, PV, budget, "", "")


#: Each claim: its store method and its script's keys.
CLAIMS: dict[str, tuple[str, Callable[[Prepared], tuple[Any, ...]]]] = {
    "claim": ("claim", lambda p: (4, p.ready, p.leases, p.meta, p.fanout)),
    "claim_ready": ("claim_ready", lambda p: (4, p.ready, p.leases, p.meta, p.fanout)),
    "claim_expired": ("claim_expired", lambda p: (2, p.leases, p.meta)),
}


def claims(p: Prepared, limit: int, call: Callable[[], int]) -> int:
    """Claims of ``limit`` runs until every prepared run is claimed: the runs claimed."""
    claimed = sum(call() for _ in range(len(p.ids) // limit))
    assert claimed == len(p.ids) // limit * limit, claimed
    return claimed


def claim_op(kind: str, limit: int, over: str) -> Op:
    """The row of claim ``kind`` at ``limit`` over ready runs or expired leases."""
    method, keys = CLAIMS[kind]
    per = ", per run" if limit > 1 else ""
    name = (f"{kind}({limit}){per}" if kind != "claim" else
            f"claim({limit}) of {'ready runs' if over == 'ready' else 'expired leases'}{per}")
    key = f"{kind.replace('_', '-')}-{limit}" + (f"-{over}" if kind == "claim" else "")

    def real(p: Prepared) -> int:
        claim = getattr(p.store, method)
        return claims(p, limit, lambda: len(claim("m", TTL, limit)))

    def minimal(p: Prepared) -> int:
        def one() -> int:
            reply = p.call(*keys(p), *claim_argv(p, limit))
            ok(reply)
            return len(reply[1])
        return claims(p, limit, one)

    script = {"claim": scripts.RUN_CLAIM, "claim_ready": scripts.RUN_CLAIM_READY,
              "claim_expired": scripts.RUN_CLAIM_EXPIRED}[kind]
    return Op(key, name, kind, script, real, minimal, runs=over,
              budget=2.0 if limit == 1 else 1.3, claim=True)


def finish_argv(run: str, revision: int, token: int) -> tuple[Any, ...]:
    """run_finish's ARGV[2..]: a finish of m's grant ``token`` with RECORD (no failure, no
    wait: RECORD discovers none)."""
    return (run, revision, "m", token, "w", RECORD, "-", 0, "", "", "", "", "", "", PV)


def unit_real(p: Prepared) -> int:
    """The unit through the API: a pipeline of finish (with a record) and claim(records)."""
    assert p.held is not None
    run, revision, token = p.held
    for _ in range(len(p.ids) - 1):
        with p.store.pipeline() as pipe:
            done = pipe.finish(run, revision, Fenced("m", token), record=RECORD)
            nxt = pipe.claim("m", TTL, records=True)
        done.result()
        (got,) = nxt.result()
        assert got.current.token is not None
        run, revision, token = got.run, got.current.revision, got.current.token
    return len(p.ids) - 1


def session_unit_real(p: Prepared) -> int:
    """The unit as the ``Worker`` on a session sends it: the finish of the session's run
    and the session's claim of the next, one script (``run_finish_claim``)."""
    assert p.held is not None and p.session is not None
    ops, run, revision, token = p.store._ops, *p.held
    for _ in range(len(p.ids) - 1):
        first = ops.finish(run, revision, Fenced("m", token), record=RECORD)
        then = ops.session_claim("any", p.session, "m", TTL, 1, True, None)
        done, got = p.store._write(fused((first, next(first)), (then, next(then))))
        assert done.error is None and got.error is None, (done, got)
        (claimed,) = got.value[0]
        assert claimed.current.token is not None
        run, revision, token = claimed.run, claimed.current.revision, claimed.current.token
    return len(p.ids) - 1


def unit_minimal(p: Prepared) -> int:
    """The unit by EVALSHA, with run_finish_claim's keys and arguments."""
    assert p.held is not None
    run, revision, token = p.held
    for _ in range(len(p.ids) - 1):
        first = finish_argv(run, revision, token)
        reply = p.call(5, p.key(run), p.leases, p.ready, p.meta, p.fanout, p.P, len(first),
                       *first, "any", *claim_argv(p, 1, MAX_CLAIM_BYTES)[1:])
        ok(reply[0])
        ok(reply[1])
        (entry,) = reply[1][1]
        run, revision, token = entry[0].decode(), entry[1][0], entry[1][8]
    return len(p.ids) - 1


def finish_real(p: Prepared) -> int:
    """finish through the API, alone (an AsyncWorker's at concurrency): each held run's
    record written and the run freed, under its grant."""
    return each(p, lambda r: p.store.finish(r, 1, Fenced("n", p.tokens[r]), record=RECORD))


def finish_minimal(p: Prepared) -> int:
    """The finish by EVALSHA, with run_finish's keys and arguments."""
    return each(p, lambda r: ok(p.call(4, p.key(r), p.leases, p.ready, p.meta, p.P, r, 1,
                                       "n", p.tokens[r], "w", RECORD, "-", 0, "", "", "",
                                       "", "", "", PV)))


OPS: list[Op] = [
    Op("get", "get", "get", scripts.RUN_GET,
       lambda p: each(p, p.store.get),
       lambda p: each(p, lambda r: ok(p.call(2, p.key(r), p.meta, p.P, r)))),
    Op("insert", "insert (with a lease)", "insert", scripts.RUN_INSERT,
       lambda p: each(p, lambda r: p.store.insert("new" + r, RECORD, Claim("n", LONG))),
       lambda p: each(p, lambda r: ok(p.call(*write_args(p, "new" + r, RECORD, "c", "n",
                                                          LONG))))),
    Op("cas-hold", "compare_and_set (Hold)", "compare_and_set_hold",
       scripts.RUN_COMPARE_AND_SET,
       lambda p: each(p, lambda r: p.store.compare_and_set(r, 1, RECORD, Hold("n"))),
       lambda p: each(p, lambda r: ok(p.call(*write_args(p, r, 1, RECORD, "h", "n", 0))))),
    Op("cas-release", "compare_and_set (Release)", "compare_and_set_release",
       scripts.RUN_COMPARE_AND_SET,
       lambda p: each(p, lambda r: p.store.compare_and_set(r, 1, RECORD, Release())),
       lambda p: each(p, lambda r: ok(p.call(*write_args(p, r, 1, RECORD, "r", "", 0))))),
    Op("renew", "renew (one run)", "renew", scripts.RUN_RENEW,
       lambda p: each(p, lambda r: p.store.renew("n", [r], LONG)),
       lambda p: each(p, lambda r: ok(p.call(2, p.leases, p.meta, p.P, "n", LONG, r)))),
    Op("release", "release (one run)", "release", scripts.RUN_RELEASE,
       lambda p: each(p, lambda r: p.store.release("n", [r])),
       lambda p: each(p, lambda r: ok(p.call(3, p.leases, p.ready, p.meta, p.P, "n", PV,
                                             r)))),
    *(claim_op(kind, limit, over) for limit in (1, 100)
      for kind, over in (("claim", "ready"), ("claim", "expired"), ("claim_ready", "ready"),
                         ("claim_expired", "expired"))),
    Op("finish", "finish (record), alone", "finish", scripts.RUN_FINISH, finish_real,
       finish_minimal),
    Op("session-finish", "finish (record) of a session's run, alone", "finish",
       scripts.RUN_FINISH, finish_real, finish_minimal, runs="session-held"),
    Op("unit", "unit: finish (record) + claim(1, records)", "finish_claim",
       scripts.RUN_FINISH_CLAIM, unit_real, unit_minimal, runs="unit"),
    Op("session-unit", "unit on a session: finish + the session's claim(1, records)",
       "finish_claim", scripts.RUN_FINISH_CLAIM, session_unit_real, unit_minimal,
       runs="session-unit"),
]


def minimal_source(op: Op) -> str:
    return (MINIMAL / f"{op.script}.lua").read_text()


def prepare(client: redis.Redis, op: Op, calls: int, namespace: str = NS,
            partitions: int = 1, source: str | bytes | None = None) -> Prepared:
    """The data every variant of ``op`` starts from: a store (``discover``), every real
    script called once (loaded and warm), the minimal script (or ``source``) loaded, and
    ``calls`` runs (ids from a seeded generator): held by ``n`` for an hour, or for 1 ms
    (then expired), or ready (inserted free with the record ``b"ready"``: ready at once);
    for the unit ``calls + 1`` ready runs, the first claimed by ``m`` with its record (the
    run the first unit finishes). With ``partitions`` the store spreads over that many (on
    the one server): only the real operation's calls then apply (the minimal scripts name
    one partition's keys)."""
    # Under valgrind the server runs about 50 times slower: a script's first load alone
    # can pass the default 5 s deadline.
    store = RedisRunStore(client, namespace=namespace, partitions=partitions,
                          discover=discover, projection_version=PV, timeout=60_000,
                          feed=FEED)
    sha = client.script_load(source if source is not None else minimal_source(op))
    rng = random.Random(1)
    unit = op.runs in ("unit", "session-unit")
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(calls + unit)]
    store.insert("w", RECORD, Claim("n", LONG))
    store.compare_and_set("w", 1, RECORD, Hold("n"))
    store.renew("n", ["w"], LONG)
    store.release("n", ["absent"])
    store.claim_expired("m", TTL, 1)
    store.claim_ready("m", TTL, 1)
    store.claim("m", TTL, 1)
    store.get("w")
    # run_finish_claim (its finish refused, "w" is not m's: nothing written).
    with store.pipeline() as pipe:
        refused = pipe.finish("w", 2, Fenced("m", 1), record=RECORD)
        pipe.claim("m", TTL, records=True)
    with contextlib.suppress(LeaseRefused):
        refused.result()
    if op.script == "finish":
        # run_finish, refused alike: loaded only for its rows, as before it had rows (one
        # more script in the server's Lua heap costs every later call's collector: 80.6k
        # instructions a run of claim_expired(100) became 94.9k, the minimal's alike).
        with contextlib.suppress(LeaseRefused):
            store.finish("w", 2, Fenced("m", 1), record=RECORD)
    lease: Any = Claim("n", LONG)
    if op.runs == "session-held":
        lease = store.open_session("n", LONG).lease
    for run in ids:
        if op.runs == "expired":
            store.insert(run, RECORD, Claim("n", 1))
        elif op.runs == "ready" or unit:
            store.insert(run, b"ready", Release())
        else:
            store.insert(run, RECORD, lease)
    time.sleep(0.05)  # the 1 ms leases have expired
    held, session = None, None
    if unit:
        if op.runs == "session-unit":
            opened = store.open_session("m", LONG)
            session = opened.id
            (got,) = opened.claim(records=True)
        else:
            (got,) = store.claim("m", TTL, records=True)
        assert got.current.token is not None
        held = (got.run, got.current.revision, got.current.token)
    tokens = ({run: store.get(run).token or 1 for run in ids} if op.script == "finish"
              else {})
    return Prepared(client, store, ids, sha, "{" + namespace + "}:", held, session,
                    tokens=tokens)


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
            store.insert("a", RECORD, Claim("n", LONG))
            for k in range(calls):
                client.evalsha(sha, len(keys), *keys, "{i}:", "a", str(k + 1), RECORD, "h", "n",
                               "0", "", "", "", "", str(PV))
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

TIMES = re.compile(rb"\d{13}")
#: Advice, not data: the minimal scripts send no wake-up signals.
SIGNAL_KEYS = ("wake-ready", "wake-leases")


def dump(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key of the namespace with prefix ``prefix`` but its wake keys, by name after
    the prefix: its value, 13-digit times (expiries, claim times) written T."""
    def score(x: float) -> Any:
        return "T" if x >= 1e12 else x

    out: dict[str, Any] = {}
    for raw_key in client.scan_iter(match=prefix + "*", count=1000):
        key = raw_key.decode()
        name = key[len(prefix):]
        if name in SIGNAL_KEYS:
            continue
        kind = client.type(key).decode()
        if kind == "string":
            out[name] = TIMES.sub(b"T", client.get(key) or b"")
        elif kind == "zset":
            out[name] = {m: score(s) for m, s in client.zrange(key, 0, -1, withscores=True)}
        elif kind == "hash":
            out[name] = {f: TIMES.sub(b"T", v) for f, v in client.hgetall(key).items()}
        elif kind == "set":
            out[name] = client.smembers(key)
        else:
            out[name] = kind
    return out


def comparable(op: Op, reply: Any) -> Any:
    """A reply with 13-digit times written T, and a claim's wait left out (the minimal
    scripts answer 0 or -1 without reading the index)."""
    def norm(x: Any) -> Any:
        if isinstance(x, list):
            return [norm(y) for y in x]
        if isinstance(x, bytes):
            return TIMES.sub(b"T", x)
        if isinstance(x, int) and x >= 10**12:
            return "T"
        return x

    reply = norm(reply)
    if op.runs == "unit" and isinstance(reply[1], list):
        reply[1] = reply[1][:3]
    elif op.claim:
        reply = reply[:3]
    return reply


def differ(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys whose values differ between two dumps (at most 3, with both values)."""
    names = sorted(set(a) | set(b))
    return [f"{n}: {a.get(n)!r}\n      vs {b.get(n)!r}" for n in names
            if a.get(n) != b.get(n)][:3]


def same_start(client: redis.Redis, source: Prepared, target: Prepared) -> None:
    """Make ``target``'s namespace a copy of ``source``'s (its keys replaced)."""
    for key in list(client.scan_iter(match=target.P + "*", count=1000)):
        client.delete(key)
    for key in list(client.scan_iter(match=source.P + "*", count=1000)):
        client.copy(key, target.P + key.decode()[len(source.P):])
    target.held = source.held


def check(port: int, calls: int, ops: list[Op]) -> bool:
    """Each minimal script on a namespace prepared by the real store, beside the real
    operation through the API on another prepared alike, and the real script sent the
    minimal script's keys and arguments on a third: every key of the namespace (the wake
    keys but) the same in all three, run strings byte for byte and index entries with their
    scores, but for their 13-digit times; the replies of the minimal script and of the real
    script to the same arguments the same (but for times, and a claim's wait); the same
    units done; nothing quarantined."""
    client = redis.Redis(host="127.0.0.1", port=port)
    good = True
    for op in ops:
        client.flushall()
        states, replies, units = {}, {}, {}
        made = {variant: prepare(client, op, calls, namespace=f"{NS}-{variant}",
                                 source=op.real_script.source if variant == "raw" else None)
                for variant in ("real", "minimal", "raw")}
        # The real script's namespace starts as a copy of the minimal script's: the same
        # scores (expiries a millisecond apart order the claims), so the same replies.
        same_start(client, made["minimal"], made["raw"])
        for variant, p in made.items():
            p.replies = []
            units[variant] = op.real(p) if variant == "real" else op.minimal(p)
            replies[variant] = [comparable(op, r) for r in p.replies]
            if p.store.quarantined():
                print(f"  {op.key} ({variant}): quarantined {p.store.quarantined()}")
                good = False
            states[variant] = dump(client, p.P)
        problems = []
        if len(set(units.values())) != 1 or not units["real"]:
            problems.append(f"units {units}")
        for variant in ("minimal", "raw"):
            for line in differ(states["real"], states[variant]):
                problems.append(f"data, real vs {variant}: {line}")
        if replies["minimal"] != replies["raw"]:
            pairs = [(a, b) for a, b in zip(replies["minimal"], replies["raw"], strict=False)
                     if a != b] or [(len(replies["minimal"]), len(replies["raw"]))]
            problems.append(f"replies: minimal {pairs[0][0]!r}\n"
                            f"      real script {pairs[0][1]!r}")
        for problem in problems[:6]:
            print(f"  {op.key}: {problem}")
        good = good and not problems
        print(f"{op.key:20} {'ok' if not problems else 'DIFFERS'} ({units['real']} units, "
              f"{len(states['real'])} keys)", flush=True)
    client.close()
    return good


# ---------------------------------------------------------------------------- main


def spread(values: list[float]) -> str:
    return f"{min(values):,.1f}-{max(values):,.1f}"


def body_start(script: scripts.Script) -> int:
    """Where the body the server runs first begins in ``script``'s source: after the
    fragments it defines on every call. (Its slow path, ``--- @slow``, comes after that
    body, inside a function made only when the fast path leaves the call to it.)"""
    lines = script.source.decode().split("\n")
    first = next(i for i, (file, _) in enumerate(script.lines)
                 if file == f"{script.name}.lua")
    return sum(len(line) + 1 for line in lines[:first])


def verdict(ratio: float, budget: float) -> str:
    """A ratio against its budget: "ok", or "MISS" and by how much it passes it."""
    if ratio != ratio:  # nan: no minimal figure
        return "-"
    if ratio <= budget:
        return "ok"
    return f"MISS +{(ratio / budget - 1) * 100:.0f}%"


def markdown(ops: list[Op], figures: dict[str, Any]) -> str:
    """The rows as a table for benchmarks/README.md."""
    lines = ["| operation | budget | real instructions | minimal | ratio | | real µs (spread) "
             "| minimal µs (spread) | ratio | | commands real / minimal |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: |"]
    for op in ops:
        row = figures["ops"].get(op.name, {})
        cells = [f"`{op.name}`", f"{op.budget:.1f}x"]
        ins = row.get("instructions")
        if ins:
            ratio = ins["real"] / ins["minimal"]
            cells += [f"{ins['real']:,.0f}", f"{ins['minimal']:,.0f}", f"{ratio:.2f}x",
                      verdict(ratio, op.budget)]
        else:
            cells += ["", "", "", ""]
        us = row.get("usec")
        if us:
            real, minimal = us["real"], us["minimal"]
            cells += [f"{statistics.median(real):.1f} ({spread(real)})",
                      f"{statistics.median(minimal):.1f} ({spread(minimal)})",
                      f"{us['ratio']:.2f}x", verdict(us["ratio"], op.budget),
                      f"{row['commands']['real']:.1f} / {row['commands']['minimal']:.1f}"]
        else:
            cells += ["", "", "", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200,
                        help="calls per callgrind row (a multiple of 100; default 200)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of µs rows (default 5; 0: none)")
    parser.add_argument("--stat-calls", type=int, default=1000,
                        help="calls per µs row and round (a multiple of 100; default 1000)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the rows as one table for benchmarks/README.md")
    parser.add_argument("--partitions", type=int, default=1,
                        help="the real operations' store spreads over this many partitions "
                             "(on the one server); the minimal scripts are then left out")
    parser.add_argument("--feed", action="store_true",
                        help="the real operations' namespace keeps a change feed (Feed()): "
                             "its scripts take the general code, write the feed's entries "
                             "and count claims, finishes and takeovers per minute")
    parser.add_argument("--only", default="",
                        help="comma-separated rows: a row's key (get, insert, cas-hold, "
                             "cas-release, renew, release, claim-1-ready, claim-1-expired, "
                             "claim-ready-1, claim-expired-1, the same at 100, unit, floor, "
                             "fragments, cas-raw) or text of its name")
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
    if args.feed:
        global FEED
        FEED = Feed()

    def chosen(row_key: str, name: str) -> bool:
        return not wanted or any(w == row_key or w in name for w in wanted)

    ops = [op for op in OPS if chosen(op.key, op.name)]
    if args.check:
        with own_server(server_binary()) as port:
            # A session's rows' minimal scripts are the plain rows': no copy of their data.
            raise SystemExit(0 if check(port, 300, [op for op in ops
                                                    if not op.runs.startswith("session")])
                            else 1)

    cas = scripts.RUN_COMPARE_AND_SET.source.decode()
    body = body_start(scripts.RUN_COMPARE_AND_SET)
    raw_rows = [("floor", "EVALSHA return 1", raw("return 1")),
                ("fragments", "compare_and_set's fragments, then return 1",
                 raw(cas[:body] + "return 1")),
                ("cas-raw", "compare_and_set (Hold), EVALSHA", raw(cas))]
    figures: dict[str, Any] = {"calls": args.calls, "rounds": args.rounds,
                               "stat_calls": args.stat_calls, "raw": {}, "ops": {}}
    width = max([44, *(len(op.name) + 1 for op in ops)])
    if not args.no_instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind is not on PATH (or --no-instructions)")
        for row_key, name, make in raw_rows:
            if chosen(row_key, name):
                figures["raw"][name] = per_call(make, args.calls)
                if not args.json:
                    print(f"{name:{width}} {figures['raw'][name]:>10,.0f} instructions",
                          flush=True)
        if ops and not args.json:
            print(f"\n{'instructions per unit':{width}} {'real':>10} {'minimal':>10} "
                  f"{'ratio':>7} {'budget':>7}")
        for op in ops:
            real, minimal = op_instructions(op, args.calls, args.partitions)
            figures["ops"][op.name] = {"instructions": {"real": real, "minimal": minimal},
                                       "budget": op.budget}
            if not args.json:
                if minimal != minimal:  # nan: over partitions, no minimal script
                    print(f"{op.name:{width}} {real:>10,.0f} {'-':>10}", flush=True)
                else:
                    print(f"{op.name:{width}} {real:>10,.0f} {minimal:>10,.0f} "
                          f"{real / minimal:>6.2f}x {op.budget:>6.1f}x "
                          f"{verdict(real / minimal, op.budget)}", flush=True)
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
            print(f"\n{'INFO commandstats µs per unit':{width}} {'real':>7} {'(spread)':>13} "
                  f"{'minimal':>8} {'(spread)':>11} {'ratio':>7} {'budget':>7} "
                  f"{'commands':>13}")
        for op in ops:
            real, minimal = usec[op.name]["real"], usec[op.name]["minimal"]
            ratio = statistics.median(real) / statistics.median(minimal)
            figures["ops"].setdefault(op.name, {"budget": op.budget})["usec"] = {
                "real": real, "minimal": minimal, "ratio": ratio}
            figures["ops"][op.name]["commands"] = commands[op.name]
            if not args.json:
                inner = (f"{commands[op.name]['real']:.1f} / "
                         f"{commands[op.name]['minimal']:.1f}")
                print(f"{op.name:{width}} {statistics.median(real):>7.1f} {spread(real):>13} "
                      f"{statistics.median(minimal):>8.1f} {spread(minimal):>11} "
                      f"{ratio:>6.2f}x {op.budget:>6.1f}x {inner:>13} "
                      f"{verdict(ratio, op.budget)}")
    if args.json:
        print(json.dumps(figures))
    elif args.markdown and ops:
        print()
        print(markdown(ops, figures))


if __name__ == "__main__":
    main()
