"""What the store's Python costs beyond the socket: ``compare_and_set`` beside the same
script sent over a raw socket, through redis-py, and the ``EVALSHA return 1`` floor.

    python benchmarks/bench_client.py [--calls 3000] [--rounds 5] [--port N]
    python benchmarks/bench_client.py --async [--calls 20000] [--tasks 64] [--rounds 5]

Rows, each one call after the other on one thread (µs per call, wall time):

- ``raw floor``: ``EVALSHA <sha of return 1> 0`` on a plain socket, the command packed
  once, the reply parsed by a ``hiredis.Reader``;
- ``raw compare_and_set``: the very command ``store.compare_and_set`` sends (its script,
  keys and arguments, ``Hold``), packed per call by ``hiredis.pack_command``, on a plain
  socket with a ``hiredis.Reader``: what the server and the kernel cost;
- ``store.compare_and_set``: ``RedisRunStore.compare_and_set(run, rev, record,
  Hold(owner))``, the next revision of one held run;
- ``redis-py evalsha``: ``client.evalsha`` of the same command (no store).

Rows are interleaved: every round runs each row for ``--calls`` calls, in a rotated order;
the table gives the median over ``--rounds`` and the spread (min-max). ``beyond raw`` is a
row's median minus the raw compare_and_set's: the client's own Python. A cProfile of
``store.compare_and_set`` follows (functions by cumulative time, calls per call).

With ``--async``, the asyncio shell instead: throughput (calls/s) of ``--tasks`` tasks and
of 1 task, each calling in a loop, interleaved over the rounds the same way:

- ``redis.asyncio EVALSHA return 1``: each task ``await client.evalsha(sha, 0)`` of
  ``return 1`` on a ``redis.asyncio.Redis`` (its own pool: a connection per task): the floor;
- ``async store.compare_and_set``: ``AsyncRedisRunStore.compare_and_set(run, rev, record,
  Hold(owner))``, each task the next revision of a run of its own, on another client;

and the ratio of the store's median to the floor's, for ``--tasks`` tasks and for 1.
``--calls`` calls per row and round, shared by the tasks. ``CPU µs`` is this process's CPU
time per call (the client's cost), ``server µs`` the server's per EVALSHA (``INFO
commandstats``): a row the server's CPU bounds gains nothing from a cheaper client.

The server is its own (``redis-server`` from PATH on a free loopback port, nothing on disk),
or ``--port`` of a running loopback server (a fresh namespace, deleted at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import socket
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import hiredis
import redis
import redis.asyncio
from common import check_loopback, drop_namespace, own_server, server_binary

from redisstore import AsyncRedisRunStore, Claim, Hold, RedisRunStore
from redisstore.core import scripts
from redisstore.core.runops import RunOps

RECORD = b"x" * 128
OWNER = "bench-owner"


class Raw:
    """A plain socket and a hiredis.Reader: send bytes, read one reply."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def call(self, data: bytes) -> object:
        self.sock.sendall(data)
        reader = self.reader
        while (reply := reader.gets()) is False:
            reader.feed(self.sock.recv(65536))
        return reply


def raw_cas_commands(namespace: str, run: str) -> Callable[[int], tuple[bytes | int, ...]]:
    """The command compare_and_set of ``run`` at ``expected`` sends, as a function of it."""
    ops = RunOps(namespace, None, 1)
    template = next(ops.compare_and_set(run, 1, RECORD, Hold(OWNER))).command()
    at = 3 + int(template[2]) + 2  # EVALSHA sha numkeys keys... prefix run expected
    assert template[at] == 1
    head, tail = template[:at], template[at + 1:]
    return lambda expected: (*head, expected, *tail)


def timed(calls: int, step: Callable[[], None]) -> tuple[float, float]:
    """Wall and CPU (this process: Python and its syscalls) µs per call."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        step()
    return ((time.perf_counter() - start) / calls * 1e6,
            (time.process_time() - cpu) / calls * 1e6)


@contextlib.contextmanager
def server(port: int | None) -> Iterator[int]:
    if port is not None:
        check_loopback("127.0.0.1")
        yield port
        return
    with own_server(server_binary()) as own:
        yield own


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--profile-calls", type=int, default=3000)
    parser.add_argument("--async", dest="asyncio", action="store_true",
                        help="the asyncio shell: throughput of many tasks and of one")
    parser.add_argument("--tasks", type=int, default=64)
    args = parser.parse_args(argv)
    if args.asyncio:
        with server(args.port) as port:
            asyncio.run(async_main(port, args.calls if args.calls != 3000 else 20000,
                                   args.tasks, args.rounds, args.port is not None))
        return
    namespace = f"bench-client-{uuid.uuid4().hex[:8]}"
    with server(args.port) as port:
        client = redis.Redis(host="127.0.0.1", port=port)
        store = RedisRunStore(client, namespace=namespace)
        hold = Hold(OWNER)
        revs = {run: store.insert(run, RECORD, Claim(OWNER, 10**8))
                for run in ("store", "raw", "redispy")}
        floor_sha = client.script_load("return 1")
        client.script_load(scripts.RUN_COMPARE_AND_SET.source)  # the raw rows send EVALSHA
        raw = Raw(port)
        floor_data = hiredis.pack_command(("EVALSHA", floor_sha, 0))
        raw_cas = raw_cas_commands(namespace, "raw")
        py_cas = raw_cas_commands(namespace, "redispy")

        def store_step() -> None:
            store.compare_and_set("store", revs["store"], RECORD, hold)
            revs["store"] += 1

        def raw_step() -> None:
            reply = raw.call(hiredis.pack_command(raw_cas(revs["raw"])))  # type: ignore[arg-type]
            assert isinstance(reply, list) and reply[0] == 0, reply
            revs["raw"] += 1

        def redispy_step() -> None:
            command = py_cas(revs["redispy"])
            reply = client.evalsha(*command[1:])  # type: ignore[arg-type]
            assert reply[0] == 0, reply  # type: ignore[index]
            revs["redispy"] += 1

        def floor_step() -> None:
            raw.call(floor_data)

        rows: dict[str, Callable[[], None]] = {
            "raw floor: EVALSHA return 1": floor_step,
            "raw compare_and_set (hiredis)": raw_step,
            "store.compare_and_set (Hold)": store_step,
            "redis-py evalsha of the same": redispy_step,
        }
        for step in rows.values():  # warm up: scripts loaded, connections made
            for _ in range(200):
                step()
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        names = list(rows)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                figures[name].append(timed(args.calls, rows[name]))

        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.profile_calls):
            store_step()
        profile.disable()
        if args.port is not None:
            drop_namespace(client, namespace)
        raw.sock.close()
        store.close()
        client.close()

    raw_row = figures["raw compare_and_set (hiredis)"]
    base = statistics.median(v[0] for v in raw_row)
    base_cpu = statistics.median(v[1] for v in raw_row)
    print(f"{'row':31} {'wall µs':>7} {'spread':>13} {'beyond raw':>10} {'CPU µs':>7} "
          f"{'spread':>13} {'beyond raw':>10}")
    for name, values in figures.items():
        wall = [v[0] for v in values]
        cpu = [v[1] for v in values]
        median, median_cpu = statistics.median(wall), statistics.median(cpu)
        beyond = f"{median - base:+10.1f}" if "floor" not in name else f"{'':10}"
        beyond_cpu = f"{median_cpu - base_cpu:+10.1f}" if "floor" not in name else f"{'':10}"
        print(f"{name:31} {median:7.1f} {min(wall):6.1f}-{max(wall):<6.1f} {beyond} "
              f"{median_cpu:7.1f} {min(cpu):6.1f}-{max(cpu):<6.1f} {beyond_cpu}")
    stats = pstats.Stats(profile, stream=(out := io.StringIO()))
    total_calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
    functions = len(stats.stats)  # type: ignore[attr-defined]
    modules = {key[0] for key in stats.stats if key[0].endswith(".py")}  # type: ignore[attr-defined]
    print(f"\ncProfile of store.compare_and_set, {args.profile_calls} calls: "
          f"{total_calls / args.profile_calls:.1f} function calls per call, {functions} "
          f"functions in {len(modules)} Python files")
    stats.sort_stats("cumulative").print_stats(18)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    print("\n".join(line for line in lines[start:] if line))


async def async_main(port: int, calls: int, tasks: int, rounds: int, shared: bool) -> None:
    """The --async rows (see the module)."""
    namespace = f"bench-client-{uuid.uuid4().hex[:8]}"
    floor_client = redis.asyncio.Redis(host="127.0.0.1", port=port)
    store_client = redis.asyncio.Redis(host="127.0.0.1", port=port)
    store = AsyncRedisRunStore(store_client, namespace=namespace)
    hold = Hold(OWNER)
    sha = await floor_client.script_load("return 1")
    revs = {f"run-{i}": await store.insert(f"run-{i}", RECORD, Claim(OWNER, 10**8))
            for i in range(tasks)}

    async def floor_task(n: int, _: int) -> None:
        for _ in range(n):
            await floor_client.evalsha(sha, 0)  # type: ignore[misc]

    async def store_task(n: int, i: int) -> None:
        run = f"run-{i}"
        for _ in range(n):
            await store.compare_and_set(run, revs[run], RECORD, hold)
            revs[run] += 1

    admin = redis.Redis(host="127.0.0.1", port=port)

    def evalsha() -> tuple[int, int]:
        stats = admin.info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0)), int(stats.get("usec", 0))

    async def rate(step: Callable[[int, int], Awaitable[None]], width: int
                   ) -> tuple[float, float, float]:
        """calls/s, this process's CPU µs per call, the server's µs per EVALSHA."""
        each = max(1, calls // width)
        before = evalsha()
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(step(each, i) for i in range(width)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        after = evalsha()
        server = (after[1] - before[1]) / max(1, after[0] - before[0])
        return each * width / wall, cpu / (each * width) * 1e6, server

    rows: dict[str, tuple[Callable[[int, int], Awaitable[None]], int]] = {
        f"redis.asyncio EVALSHA return 1, {tasks} tasks": (floor_task, tasks),
        f"async store.compare_and_set, {tasks} tasks": (store_task, tasks),
        "redis.asyncio EVALSHA return 1, 1 task": (floor_task, 1),
        "async store.compare_and_set, 1 task": (store_task, 1),
    }
    for step, width in rows.values():  # warm up: connections made, scripts loaded
        await rate(step, width)
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in rows}
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            step, width = rows[name]
            figures[name].append(await rate(step, width))
    if shared:
        drop_namespace(admin, namespace)
    admin.close()
    await store.aclose()
    await floor_client.aclose()
    await store_client.aclose()

    print(f"{'row':42} {'calls/s':>8} {'spread':>17} {'CPU µs':>7} {'server µs':>9}")
    for name, values in figures.items():
        ops = [v[0] for v in values]
        print(f"{name:42} {statistics.median(ops):8,.0f} "
              f"{min(ops):8,.0f}-{max(ops):<8,.0f} "
              f"{statistics.median(v[1] for v in values):7.1f} "
              f"{statistics.median(v[2] for v in values):9.1f}")
    for width in (tasks, 1):
        label = f"{width} task{'s' if width > 1 else ''}"
        ours = statistics.median(v[0] for v in figures[
            f"async store.compare_and_set, {label}"])
        floor = statistics.median(v[0] for v in figures[
            f"redis.asyncio EVALSHA return 1, {label}"])
        print(f"ratio, {label}: store / floor = {ours / floor:.2f}")


if __name__ == "__main__":
    main()
