"""The peers a lease store is weighed against: BullMQ's job cycle on the same Redis, and
the lease table a PostgreSQL application would keep instead.

A throughput figure for redisstore means little alone; next to it, this module measures
what people would otherwise use, on the same machine at the same moment:

* ``bullmq_cycle``: BullMQ (Node), the most used Redis job queue, pinned at 6.7.0 with
  ioredis 5.11.1 (``NPM_PACKAGES``). Its Worker's cycle (take a job, run it, mark it
  completed and fetch the next) is what the redisstore ``Worker`` does with
  ``claim``/``compare_and_set``. BullMQ 6 no longer depends on ioredis: ioredis is an
  optional peer (``>=5.0.0``) that it loads when given connection options, as here; 5.11.1
  is the version bullmq 6.7.0 itself is developed and tested against (its
  devDependencies). 6.7.0 is what the project's review measured (6.x spends more server
  CPU per job than 5.x); the registry has newer 6.7.x patch releases, and a figure is cited
  with the versions ``bullmq_versions()`` reports. Conditions, all set in
  ``peers_bullmq.mjs``: each job has ``removeOnComplete: true, removeOnFail: true`` (the
  job's hash is deleted when it ends, as a lease store keeps nothing it is done with) and
  data of 100 bytes as JSON (the size of bench_throughput.py's records); the processor is
  an ``async`` function that returns at once (no-op); the Worker has ``autorun: false``,
  so that its clock starts when ``run()`` is called, after its connection is ready, not
  while Node connects, and stops at the last ``'completed'`` event. Everything else is
  BullMQ's default (connection options, not a shared ioredis instance). Adding the jobs
  (``addBulk``, 1,000 a call) is not timed. Over the timed window the script also reads
  the Redis process's CPU (``INFO cpu``), the commandstats time of the commands sent
  (EVALSHA and the blocking pops) and Node's own CPU (``process.cpuUsage``), on an
  ioredis connection of its own. Node runs ``peers_bullmq.mjs`` beside this file; the
  packages are npm-installed once per process into a temporary folder.
  ``bullmq_add`` leaves jobs in a queue (waiting, or delayed) for bench_memory.py, which
  weighs the server's memory per job against a run's.
* ``pg_cas`` and ``pg_claim_expired``: PostgreSQL 15 doing the two things a lease store
  does most, a revision compare-and-set and a batch claim of expired leases (the classic
  ``FOR UPDATE SKIP LOCKED``), on a private cluster that ``own_postgres`` starts with
  the durability asked for. The table has an index on ``expiry`` (without it every claim
  sorts the whole table, which no real lease table would do) and records of 128 bytes,
  the default of bench_runs.py. Connections go over TCP to 127.0.0.1, like the Redis
  clients, not over the unix socket.

Run ``python benchmarks/peers.py`` for a quick check of every figure (a few seconds).
Everything here talks to 127.0.0.1 only, and to servers it started itself or was handed;
the PostgreSQL functions refuse port 5432 (the machine's own cluster is not ours).
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib import util
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
BULLMQ_SCRIPT = HERE / "peers_bullmq.mjs"
#: Pinned: BullMQ 6.7.0 (what the review measured) and the ioredis its own tests use.
NPM_PACKAGES = ("bullmq@6.7.0", "ioredis@5.11.1")
RECORD = b"x" * 128  # bytes per record, as bench_runs.py's default --record-size
CAS_ROWS = 1_000
CLAIM_ROWS = 200_000  # at least this many expired leases for pg_claim_expired...
CLAIM_ROWS_PER_S = 400_000  # ...and this many per second of window (4 conns, fsync off: 150k+)
CLAIM_TTL = 3_600_000  # ms: a claimed lease stays live for the rest of the run
PG_BIN_DIRS = (Path("/usr/lib/postgresql/15/bin"), Path("/usr/local/bin"))
PG_OS_USER = "postgres"  # who runs initdb and the server when we are root
PG_ROLE = "bench"  # the private cluster's superuser
FOREIGN_PG_PORT = 5432  # the machine's own PostgreSQL: never ours


# ---------------------------------------------------------------------------- BullMQ

_node_lock = threading.Lock()
_node_dir: Path | None = None


def bullmq_available() -> str | None:
    """None when BullMQ can be measured here, else why not (``node`` or ``npm`` missing)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH"
    return None


def node_modules() -> Path:
    """The folder where bullmq and ioredis are installed, installing them on first use.

    npm runs once per process (a few seconds), into a temporary folder removed at exit, so
    the benchmark leaves no node_modules in the checkout; the versions are pinned
    (``NPM_PACKAGES``), so every run measures the same BullMQ."""
    global _node_dir
    with _node_lock:
        if _node_dir is not None:
            return _node_dir
        reason = bullmq_available()
        if reason is not None:
            raise RuntimeError(f"BullMQ cannot run: {reason}")
        folder = Path(tempfile.mkdtemp(prefix="redisstore-peers-npm-"))
        atexit.register(shutil.rmtree, folder, True)
        (folder / "package.json").write_text('{"name": "redisstore-peers", "private": true}\n')
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", *NPM_PACKAGES],
            cwd=folder, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"npm install failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")
        _node_dir = folder
        return folder


def _run_node(args: list[str], timeout: float) -> dict[str, Any]:
    """Run peers_bullmq.mjs and parse the JSON line it prints last."""
    done = subprocess.run(
        ["node", str(BULLMQ_SCRIPT), "--modules", str(node_modules()), *args],
        capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"peers_bullmq.mjs failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def bullmq_versions() -> dict[str, str]:
    """The versions that bullmq_cycle measures: ``bullmq``, the ``ioredis`` that bullmq
    itself loads, and ``node``, as Node resolves them (so a figure can be cited with them)."""
    return {str(k): str(v) for k, v in _run_node(["--versions"], timeout=60).items()}


def bullmq_cycle(port: int, concurrency: int, jobs: int, data_bytes: int = 100) -> float:
    """Jobs per second of one BullMQ Worker of ``concurrency`` draining ``jobs`` no-op jobs
    from a fresh queue on the Redis at 127.0.0.1:``port`` (see the module's docstring for
    what is timed and every option set). The queue is obliterated afterwards."""
    return float(bullmq_run(port, concurrency, jobs, data_bytes)["jobs_per_s"])


def bullmq_run(port: int, concurrency: int, jobs: int, data_bytes: int = 100
               ) -> dict[str, Any]:
    """:func:`bullmq_cycle`'s whole result, over the timed drain (from ``run()`` to the last
    ``'completed'``): ``jobs_per_s``; ``server_cpu_s``, the Redis process's CPU time
    (``INFO cpu`` used_cpu_sys + used_cpu_user); ``server_usec``, the ``INFO
    commandstats`` usec of the commands sent (EVALSHA, the blocking pops); ``client_cpu_s``,
    the Node process's CPU time; and the rest peers_bullmq.mjs prints. Each job's data is
    ``data_bytes`` long as JSON."""
    if concurrency <= 0 or jobs <= 0 or data_bytes <= 0:
        raise ValueError("concurrency, jobs and data_bytes must be positive")
    probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        probe.ping()  # fail here, clearly, rather than in Node's endless reconnects
    except (redis.RedisError, OSError) as exc:
        raise RuntimeError(f"no Redis answers on 127.0.0.1:{port}: {exc}") from exc
    finally:
        probe.close()
    timeout = 120 + jobs / 100  # generous: even 100 jobs/s finishes
    result = _run_node(
        ["--port", str(port), "--concurrency", str(concurrency), "--jobs", str(jobs),
         "--timeout", str(int(timeout)), "--data-bytes", str(data_bytes)],
        timeout=timeout + 60)
    if result.get("failed"):
        raise RuntimeError(f"{result['failed']} BullMQ no-op jobs failed: {result}")
    return result


def bullmq_add(port: int, queue: str, jobs: int, delay: int = 0, data_bytes: int = 100
               ) -> dict[str, Any]:
    """Add ``jobs`` jobs to BullMQ queue ``queue`` on the Redis at 127.0.0.1:``port`` and
    leave them there (peers_bullmq.mjs ``--add``), for bench_memory.py to weigh: each job's
    ``jobId`` a fresh uuid4 string, its data ``data_bytes`` long as JSON, ``removeOnComplete``
    and ``removeOnFail`` as :func:`bullmq_cycle`'s, and ``delay`` ms (0: a waiting job, else
    a delayed one); ``addBulk``, 1,000 a call; BullMQ's defaults otherwise. The Node
    process has closed its connections when this returns; the queue is the caller's to
    remove. Returns what the script prints (``jobs``, ``state``, ``counted``: the queue's
    own count of jobs in that state, and the versions)."""
    if jobs <= 0 or data_bytes <= 0 or delay < 0:
        raise ValueError("jobs and data_bytes must be positive, delay at least 0")
    timeout = 120 + jobs / 500
    return _run_node(
        ["--add", "--port", str(port), "--queue", queue, "--jobs", str(jobs),
         "--delay", str(delay), "--data-bytes", str(data_bytes),
         "--timeout", str(int(timeout))],
        timeout=timeout + 60)


# ---------------------------------------------------------------------------- PostgreSQL


def _pg_binary(name: str) -> str | None:
    """initdb, pg_ctl...: from PostgreSQL 15's folder, else /usr/local/bin, else PATH."""
    for folder in PG_BIN_DIRS:
        if (folder / name).exists():
            return str(folder / name)
    return shutil.which(name)


def _as_root() -> bool:
    return os.geteuid() == 0


def postgres_available() -> str | None:
    """None when own_postgres and the pg_* figures can run here, else why not."""
    if util.find_spec("psycopg") is None:
        return "psycopg (v3) is not installed (pip install 'psycopg[binary]')"
    for name in ("initdb", "pg_ctl", "postgres"):
        if _pg_binary(name) is None:
            return f"{name} not found in {', '.join(map(str, PG_BIN_DIRS))} nor on PATH"
    if _as_root():
        try:
            pwd.getpwnam(PG_OS_USER)
        except KeyError:
            return f"running as root, and there is no {PG_OS_USER!r} user to run initdb as"
        if shutil.which("runuser") is None:
            return "running as root, and runuser (to run initdb as postgres) is missing"
    return None


def _pg_env() -> dict[str, str]:
    """The environment without PG* variables, so nothing points pg_ctl or psql elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _pg_run(command: list[str], folder: Path, timeout: float = 120) -> None:
    """Run a PostgreSQL tool, as the postgres user when we are root (initdb and the server
    refuse root); fail with its output."""
    prefix = ["runuser", "-u", PG_OS_USER, "--"] if _as_root() else []
    done = subprocess.run([*prefix, *command], cwd=folder, env=_pg_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")


@contextmanager
def own_postgres(fsync: bool, synchronous_commit: bool | None = None) -> Iterator[str]:
    """Run a private PostgreSQL 15 cluster on a free loopback port in a temporary folder;
    yield its conninfo; stop it (``-m immediate``) and delete the folder afterwards.

    ``fsync=True`` is ``fsync=on, synchronous_commit=on``: a commit returns once its WAL is
    on disk, the durability of Redis with ``appendfsync always``. ``fsync=False`` is both
    off: commits may be lost on a crash, as with ``appendfsync no``. ``fsync=True,
    synchronous_commit=False``: a commit returns before its WAL is flushed, which the WAL
    writer does within 200 ms (``wal_writer_delay``): the last moments may be lost on a
    crash, never the database's consistency, as with Redis's ``appendfsync everysec``.
    Compare figures only at equal durability."""
    if synchronous_commit is None:
        synchronous_commit = fsync
    reason = postgres_available()
    if reason is not None:
        raise RuntimeError(f"PostgreSQL cannot run: {reason}")
    from common import free_port  # the benchmarks folder is on sys.path

    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    assert initdb is not None and pg_ctl is not None
    folder = Path(tempfile.mkdtemp(prefix="redisstore-peers-pg-"))
    try:
        if _as_root():
            owner = pwd.getpwnam(PG_OS_USER)
            os.chown(folder, owner.pw_uid, owner.pw_gid)
        data, log = folder / "data", folder / "server.log"
        port = free_port()
        while port == FOREIGN_PG_PORT:
            port = free_port()
        _pg_run([initdb, "-D", str(data), "-U", PG_ROLE, "--auth=trust", "-E", "UTF8",
                 "--locale=C", "--no-sync", "--no-instructions"], folder)
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(port),
            "unix_socket_directories": f"'{folder}'",
            "fsync": "on" if fsync else "off",
            "synchronous_commit": "on" if synchronous_commit else "off",
        }
        # Appending keeps the file's owner; the last setting of a name wins.
        with open(data / "postgresql.conf", "a") as conf:
            conf.write("\n# redisstore benchmarks/peers.py\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        try:
            _pg_run([pg_ctl, "-D", str(data), "-l", str(log), "-w", "-t", "60", "start"],
                    folder)
        except RuntimeError as exc:
            text = log.read_text(errors="replace") if log.exists() else "(no log)"
            with suppress(RuntimeError, subprocess.TimeoutExpired):  # half started?
                _pg_run([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], folder)
            raise RuntimeError(f"{exc}\nserver log:\n{text}") from exc
        try:
            yield f"host=127.0.0.1 port={port} user={PG_ROLE} dbname=postgres"
        finally:
            _pg_run([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _connect(conn_info: str) -> Any:
    """An autocommit psycopg connection, refusing anything but a private loopback server:
    the functions below drop and refill a table named ``runs``."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(conn_info)
    if params.get("host") != "127.0.0.1" or str(params.get("port")) == str(FOREIGN_PG_PORT):
        raise ValueError(f"refusing {conn_info!r}: host must be 127.0.0.1, port not "
                         f"{FOREIGN_PG_PORT} (use own_postgres)")
    return psycopg.connect(conn_info, autocommit=True)


def _fill_runs(conn: Any, rows: int, expiry_sql: str) -> None:
    """(Re)create the lease table with ``rows`` runs ``run-1``.. at revision 1, unowned,
    their expiry given as SQL of ``g`` (the row's number); analyze and checkpoint it so
    the timed window neither plans blind nor meets the load's checkpoint."""
    conn.execute("DROP TABLE IF EXISTS runs")
    conn.execute("CREATE TABLE runs (id text PRIMARY KEY, rev bigint, owner text, "
                 "expiry bigint, record bytea)")
    conn.execute(f"INSERT INTO runs SELECT 'run-' || g, 1, NULL, {expiry_sql}, %s "
                 "FROM generate_series(1, %s) AS g", (RECORD, rows))
    conn.execute("CREATE INDEX runs_expiry ON runs (expiry)")
    conn.execute("VACUUM ANALYZE runs")
    conn.execute("CHECKPOINT")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def pg_cas(conn_info: str, seconds: float = 2.0) -> float:
    """Compare-and-set operations per second from one autocommit connection: the revision
    CAS a lease store does, round-robin over 1,000 rows, each expected to apply (a miss is
    a bug here, not contention, and raises)."""
    update = "UPDATE runs SET rev = rev + 1, record = %s WHERE id = %s AND rev = %s"
    with _connect(conn_info) as conn:
        _fill_runs(conn, CAS_ROWS, "0")
        ids = [f"run-{i}" for i in range(1, CAS_ROWS + 1)]
        revs = [1] * CAS_ROWS
        cur = conn.cursor()

        def cas(i: int) -> None:
            slot = i % CAS_ROWS
            cur.execute(update, (RECORD, ids[slot], revs[slot]), prepare=True)
            if cur.rowcount != 1:
                raise RuntimeError(f"CAS of {ids[slot]} at rev {revs[slot]} did not apply")
            revs[slot] += 1

        for i in range(200):  # warm-up: the prepared statement, the caches
            cas(i)
        done, clock = 200, time.perf_counter
        started = clock()
        deadline = started + seconds
        while clock() < deadline:
            cas(done)
            done += 1
        return (done - 200) / (clock() - started)


def pg_claim_expired(conn_info: str, batch: int = 100, seconds: float = 2.0,
                     connections: int = 1, *, rows: int | None = None) -> float:
    """Leases claimed per second by ``connections`` threads, each with its own autocommit
    connection, each repeating the classic ``FOR UPDATE SKIP LOCKED`` claim of ``batch``
    expired leases, over ``rows`` leases that are all expired at the start (by default
    200,000, or 400,000 per second of window if more).

    Claimed leases get an expiry an hour away, so nothing is claimed twice; the rate
    counts every row returned, over the time from the common start to the last thread's
    end. A claim that finds nothing means the table ran dry inside the window, which would
    make the figure a lie: it raises (pass more ``rows``)."""
    if batch <= 0 or connections <= 0:
        raise ValueError("batch and connections must be positive")
    if rows is None:
        rows = max(CLAIM_ROWS, int(seconds * CLAIM_ROWS_PER_S))
    claim = ("UPDATE runs SET owner = %s, expiry = %s WHERE id IN (SELECT id FROM runs "
             "WHERE expiry <= %s ORDER BY expiry LIMIT %s FOR UPDATE SKIP LOCKED) "
             "RETURNING id")
    with _connect(conn_info) as setup:
        # Expiry in the past, one distinct ms per row, so ORDER BY expiry has an order.
        _fill_runs(setup, rows, f"{_now_ms() - 60_000 - rows} + g")

    conns = [_connect(conn_info) for _ in range(connections)]
    window: dict[str, float] = {}
    # The last thread to arrive starts the clock, before any thread is released.
    barrier = threading.Barrier(
        connections, action=lambda: window.__setitem__("start", time.perf_counter()))
    claimed = [0] * connections
    errors: list[BaseException] = []

    def work(index: int) -> None:
        conn, owner = conns[index], f"peer-{index}"
        cur = conn.cursor()
        try:
            # Warm-up outside the window, one claim each (its rows are not counted).
            cur.execute(claim, (owner, _now_ms() + CLAIM_TTL, _now_ms(), batch), prepare=True)
            cur.fetchall()
            barrier.wait()
            deadline = window["start"] + seconds
            while time.perf_counter() < deadline:
                now = _now_ms()
                cur.execute(claim, (owner, now + CLAIM_TTL, now, batch), prepare=True)
                got = len(cur.fetchall())
                if got == 0:
                    raise RuntimeError(f"the table ran dry: {rows} rows are not enough")
                claimed[index] += got
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(connections)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ended = time.perf_counter()
    finally:
        for conn in conns:
            conn.close()
    if errors:
        raise RuntimeError(f"a claiming thread failed: {errors[0]!r}") from errors[0]
    return sum(claimed) / (ended - window["start"])


# ---------------------------------------------------------------------------- check


def main() -> None:
    """Every figure once, quickly, so a person can see that the peers run here."""
    from common import own_server, server_binary

    reason = bullmq_available()
    if reason is not None:
        print(f"BullMQ: skipped, {reason}")
    else:
        with own_server(server_binary()) as port:
            print(f"BullMQ: {bullmq_versions()}")
            for concurrency in (1, 50):
                rate = bullmq_cycle(port, concurrency, 2000)
                print(f"  cycle, concurrency {concurrency:>2}, 2000 jobs: {rate:8.0f} jobs/s")

    reason = postgres_available()
    if reason is not None:
        print(f"PostgreSQL: skipped, {reason}")
        return
    import psycopg

    for fsync in (True, False):
        with own_postgres(fsync) as conn_info:
            with _connect(conn_info) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]
            print(f"PostgreSQL {version}, psycopg {psycopg.__version__}, "
                  f"fsync and synchronous_commit {'on' if fsync else 'off'}:")
            print(f"  CAS, 1 connection:              {pg_cas(conn_info, 1.0):8.0f} ops/s")
            for connections in (1, 4):
                rate = pg_claim_expired(conn_info, 100, 1.0, connections)
                print(f"  claim_expired(100), {connections} conn(s): {rate:8.0f} leases/s")


if __name__ == "__main__":
    main()
