"""Promises of docs/worker.md and README.md that the ``Worker`` and ``AsyncWorker`` broke,
each written as a test of the promise through the public API (a reviewer's findings: a
zombie's result, a result the store refuses, a claim late in a long wait, two loops of one
run, the store's record cap, job.lost, stop, the documented loops, the bookkeeping).

Each failed on the Worker it was written against (committed first, marked xfail) and
passes on the one that fixed it. Each asserts what the docs promise, never that some code
ran. Each runs on fakeredis and on Redis 7 (the ``backend`` fixture) where it can: those
that move the server's clock (``fake_clock``) on fakeredis alone, the frozen worker's on
Redis 7 alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from faultproxy import FaultProxy
from servers import Server, allowed, unique_namespace

from redisstore import (
    AsyncJob,
    AsyncRedisRunStore,
    AsyncWorker,
    At,
    Claim,
    Claimed,
    Conflict,
    Fenced,
    Free,
    Held,
    Hold,
    Job,
    LeaseRefused,
    Quarantined,
    RedisRunStore,
    Release,
    Retry,
    Seize,
    StoreError,
    Unavailable,
    Worker,
    drop_namespace,
)
from redisstore.core import scripts
from redisstore.core.outcomes import ErrorReply, Exchange, Lost
from redisstore.discovery import json_wait
from redisstore.pytest_plugin import Clock
from redisstore.shells.aio import AsyncTransport
from redisstore.shells.sync import Transport

ROOT = Path(__file__).resolve().parents[2]
#: The most seconds a test waits for something the worker does at once.
PATIENCE = 5.0
#: How a run a worker had can end (``Worker.stats`` keys besides ``claimed``).
OUTCOMES = ("done", "released", "failed", "lost", "stopped")


def ended(worker: Worker | AsyncWorker) -> int:
    """How many runs the worker has counted as ended, whichever way."""
    return sum(worker.stats[outcome] for outcome in OUTCOMES)


def ready(record: bytes) -> At | None:
    """Every run is ready at once, until its record says it is done."""
    return None if record.startswith(b"done") else At(0)


def until(check: Callable[[], object], what: str, patience: float = PATIENCE) -> None:
    deadline = time.monotonic() + patience
    while not check():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.005)


async def auntil(check: Callable[[], object], what: str, patience: float = PATIENCE) -> None:
    deadline = time.monotonic() + patience
    while not check():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.005)


async def aget_until(check: Callable[[], Awaitable[bool]], what: str,
                     patience: float = PATIENCE) -> None:
    deadline = time.monotonic() + patience
    while not await check():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.005)


def fake_store(**options: Any) -> RedisRunStore:
    options.setdefault("discover", ready)
    return RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace(), **options)


def fake_astore(**options: Any) -> AsyncRedisRunStore:
    options.setdefault("discover", ready)
    return AsyncRedisRunStore(fakeredis.FakeAsyncRedis(), namespace=unique_namespace(),
                              **options)


def run_async(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


class Backend:
    """Stores of one backend for one test, each in a new namespace (unless given one):
    fakeredis, or this session's Redis 7 (``server``). Afterwards (:meth:`close`) the stores
    are closed and, on Redis 7, their namespaces dropped."""

    def __init__(self, server: Server | None) -> None:
        self.server = server
        self._stores: list[RedisRunStore] = []
        self._astores: list[tuple[AsyncRedisRunStore, Any]] = []
        self._namespaces: set[str] = set()
        self._cleanups: list[Callable[[], None]] = []
        #: fakeredis: one server for the test's stores (a namespace's stores share it).
        self._fake = fakeredis.FakeServer()

    def _namespace(self, options: dict[str, Any]) -> None:
        options.setdefault("discover", ready)
        options.setdefault("namespace", unique_namespace())
        self._namespaces.add(options["namespace"])

    def store(self, *, port: int | None = None, **options: Any) -> RedisRunStore:
        """A store (on Redis 7: of a client of ``port``, the server's unless given)."""
        self._namespace(options)
        if self.server is None:
            client: Any = fakeredis.FakeRedis(server=self._fake)
        else:
            allowed()
            client = redis.Redis(host="127.0.0.1", port=port or self.server.port,
                                 socket_timeout=10)
        store = RedisRunStore(client, **options)
        self._stores.append(store)
        return store

    def astore(self, *, port: int | None = None, **options: Any) -> AsyncRedisRunStore:
        """An asyncio store (see :meth:`store`), to be made inside :meth:`run`'s loop."""
        self._namespace(options)
        if self.server is None:
            client: Any = fakeredis.FakeAsyncRedis(server=self._fake)
        else:
            allowed()
            client = redis.asyncio.Redis(host="127.0.0.1", port=port or self.server.port,
                                         socket_timeout=10)
        store = AsyncRedisRunStore(client, **options)
        self._astores.append((store, client))
        return store

    def run(self, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``main`` in an event loop of its own; its asyncio stores and their clients
        are closed in it afterwards."""
        async def closing() -> None:
            try:
                await main()
            finally:
                made, self._astores = self._astores, []
                for store, client in made:
                    await store.aclose()
                    await client.aclose()

        asyncio.run(closing())

    def later(self, cleanup: Callable[[], None]) -> None:
        """Call ``cleanup`` afterwards, before the stores are closed."""
        self._cleanups.append(cleanup)

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()
        for store in self._stores:
            store.close()
        if self.server is not None:
            client = self.server.client()
            for namespace in self._namespaces:
                drop_namespace(client, namespace)
            client.close()


@pytest.fixture(params=["fakeredis", pytest.param("redis7", marks=pytest.mark.server)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Stores of fakeredis, or of the session's Redis 7: every promise is tried on both,
    where the test applies (not where it moves fakeredis's clock)."""
    server: Server | None = None
    if request.param == "redis7":
        server = request.getfixturevalue("redis7")
    made = Backend(server)
    yield made
    made.close()


# ---------------------------------------------------------------- a zombie's result

# node-a's worker, in a process of its own on Redis 7, frozen past its TTL: every thread
# of it stalled, as by SIGSTOP or a long pause of the runtime. Its handler freezes the
# process by holding the GIL in a C call (ctypes.PyDLL does not release it) until the test
# writes a byte, then returns at once. After a SIGSTOP/SIGCONT the handler's thread and the
# keeper's wake together and race: when the keeper runs first it marks the job lost and
# the worker writes nothing, so the test would pass or fail by scheduling. The held GIL
# and a long switch interval (the keeper, waiting for the GIL, is not handed it before the
# handler's thread lets it go) make the handler return first, as it may in a real pause.
FROZEN_WORKER = r"""
import ctypes, json, os, sys, time
import redis
from redisstore import At, RedisRunStore, Worker

sys.setswitchinterval(30.0)
libc = ctypes.PyDLL(None)
port, namespace, ttl = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
store = RedisRunStore(redis.Redis(host="127.0.0.1", port=port), namespace=namespace,
                      discover=lambda record: None if record.startswith(b"done") else At(0))

def handler(job):
    print("taken", flush=True)
    os.read(0, 1)                                     # the cue to freeze
    libc.read(0, ctypes.create_string_buffer(1), 1)   # frozen, GIL held, until a byte comes
    return b"done-by-node-a"

worker = Worker(store, "node-a", handler, ttl=ttl, poll=100).start()
while not any(worker.stats[k] for k in ("done", "released", "failed", "lost", "stopped")):
    time.sleep(0.01)
print(json.dumps(dict(worker.stats)), flush=True)
worker.stop()
"""


@pytest.mark.server
def test_a_worker_frozen_past_its_ttl_never_writes_over_the_new_holder(
        redis7: Server) -> None:
    """node-a's worker takes the run and freezes past its TTL; node-b takes the run over
    and holds it live; node-a wakes and its handler returns a result. docs/worker.md: "a
    zombie's checkpoint or result never lands": node-b's lease and record stand."""
    client = redis7.client()
    namespace = unique_namespace()
    store = RedisRunStore(client, namespace=namespace, discover=ready)
    store.insert("run", b"todo", Release())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    child = subprocess.Popen(
        [sys.executable, "-c", FROZEN_WORKER, str(redis7.port), namespace, "500"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert child.stdin is not None and child.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    out = child.stdout

    def read() -> None:
        for line in out:
            lines.put(line.decode().strip())

    threading.Thread(target=read, daemon=True).start()
    try:
        assert lines.get(timeout=15) == "taken"
        child.stdin.write(b"f")  # node-a freezes, its lease in hand
        child.stdin.flush()
        until(lambda: store.get("run").holder == Held("node-a", False),
              "saw node-a's lease run out")
        assert store.claim("node-b", ttl=60_000) == ["run"]  # node-b takes it over
        child.stdin.write(b"g")  # node-a wakes up; its handler returns its result
        child.stdin.flush()
        stats = json.loads(lines.get(timeout=PATIENCE))
        current = store.get("run")
        assert (current.record, current.holder) == (b"todo", Held("node-b", True)), (
            f"node-a (stats {stats}) wrote over node-b's live lease: {current}")
        # node-b's own writes stand.
        store.compare_and_set("run", current.revision, b"done-by-node-b", Hold("node-b"))
    finally:
        child.kill()
        child.wait(10)
        drop_namespace(client, namespace)


def test_a_result_of_a_handler_that_outlived_stop_never_lands(backend: Backend) -> None:
    """``A.stop(timeout=0.2)`` gives A's lease up while A's handler still runs; B's worker
    takes the run and holds it; then A's handler returns. Nothing of A's lands: B's lease,
    B's checkpoint and B's result stand."""
    store = backend.store()
    store.insert("run", b"todo", Release())
    a_taken, a_go, b_taken, b_go = (threading.Event() for _ in range(4))
    b_wrote: list[object] = []

    def a_handler(job: Job) -> bytes:
        a_taken.set()
        assert a_go.wait(PATIENCE)
        return b"done-by-a"

    def b_handler(job: Job) -> bytes:
        b_taken.set()
        assert b_go.wait(PATIENCE)
        try:
            job.write(b"checkpoint-by-b")
            b_wrote.append("written")
        except StoreError as error:
            b_wrote.append(error)
        return b"done-by-b"

    a = Worker(store, "node-a", a_handler, ttl=5_000, poll=100).start()
    b: Worker | None = None
    try:
        assert a_taken.wait(PATIENCE)
        a.stop(timeout=0.2)  # A's handler runs on; its lease is released
        b = Worker(store, "node-b", b_handler, ttl=5_000, poll=100).start()
        assert b_taken.wait(PATIENCE)
        a_go.set()  # A's handler returns its result now
        a.stop()  # and A's loop has done with the run once this returns
        after_a = store.get("run")
        b_go.set()
        until(lambda: ended(b) == 1, "ended B's run")
    finally:
        a_go.set()
        b_go.set()
        if b is not None:
            b.stop()
    assert (after_a.record, after_a.holder) == (b"todo", Held("node-b", True)), (
        f"A's result landed on B's run: {after_a}")
    assert b_wrote == ["written"]
    assert store.get("run").record == b"done-by-b"


def test_a_stop_never_releases_a_lease_another_grant_of_its_owner_holds(
        fake_clock: Clock) -> None:
    """Two processes of one node share its owner name. A's handler hangs; A's lease runs
    out and B (same owner) claims the run: a new grant. ``A.stop(timeout=0.1)`` gives up
    what A still holds, under A's grant only: B's lease stands."""
    store = fake_store()
    store.insert("X", b"todo", Release())
    a_taken, b_taken, go = threading.Event(), threading.Event(), threading.Event()
    tokens: list[int | None] = []

    def handler(taken: threading.Event) -> Callable[[Job], bytes | None]:
        def handle(job: Job) -> bytes | None:
            tokens.append(job.token)
            taken.set()
            assert go.wait(PATIENCE)
            return None
        return handle

    a = Worker(store, "node", handler(a_taken), ttl=30_000, poll=100).start()
    b: Worker | None = None
    try:
        assert a_taken.wait(PATIENCE)
        fake_clock.advance(30_001)  # A's lease ran out (its keeper renews 10 s later)
        b = Worker(store, "node", handler(b_taken), ttl=30_000, poll=100).start()
        assert b_taken.wait(PATIENCE)
        a.stop(timeout=0.1)  # A's handler still hangs: A gives its run up
        after = store.get("X")
    finally:
        go.set()
        a.stop()
        if b is not None:
            b.stop()
    assert (after.holder, after.token) == (Held("node", True), tokens[1]), (
        f"A's stop released B's grant: {after}")


def test_an_asyncio_stop_never_releases_a_lease_another_grant_of_its_owner_holds(
        fake_clock: Clock) -> None:
    """:func:`test_a_stop_never_releases_a_lease_another_grant_of_its_owner_holds`,
    asyncio."""
    async def main() -> None:
        store = fake_astore()
        await store.insert("X", b"todo", Release())
        a_taken, b_taken, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tokens: list[int | None] = []

        def handler(taken: asyncio.Event) -> Callable[[AsyncJob], Awaitable[bytes | None]]:
            async def handle(job: AsyncJob) -> bytes | None:
                tokens.append(job.token)
                taken.set()
                await go.wait()
                return None
            return handle

        a = AsyncWorker(store, "node", handler(a_taken), ttl=30_000, poll=100, grace=60)
        a.start()
        b = AsyncWorker(store, "node", handler(b_taken), ttl=30_000, poll=100, grace=60)
        try:
            await asyncio.wait_for(a_taken.wait(), PATIENCE)
            fake_clock.advance(30_001)
            b.start()
            await asyncio.wait_for(b_taken.wait(), PATIENCE)
            await a.stop(timeout=0.1)
            after = await store.get("X")
        finally:
            go.set()
            await a.stop()
            await b.stop()
        assert (after.holder, after.token) == (Held("node", True), tokens[1]), (
            f"A's stop released B's grant: {after}")

    run_async(main)


def _tried(store: RedisRunStore, calls: list[int], before: int) -> bool:
    """Whether the handler was called once more than ``before`` times, or the run was
    quarantined. (A worker that claimed the run may not have called the handler yet: killed
    then, its try would count without a call.)"""
    return len(calls) > before or store.get("crasher").quarantined is not None


def test_a_run_that_crashes_its_process_every_try_is_quarantined(fake_clock: Clock) -> None:
    """A run whose handler takes its process down on every try (a segfault, an OOM kill)
    under one owner, restarted each time: each expired lease counts as a lost try, and
    the claim after the last one quarantines the run instead of handing it out again."""
    store = fake_store()
    store.insert("crasher", b"todo", Release())
    calls: list[int] = []

    def handler(job: Job) -> bytes | None:
        calls.append(job.current.attempts)
        while not job.lost:  # the process "dies" here: kill() below
            time.sleep(0.005)
        return None

    for _ in range(4):
        before = len(calls)  # read before the start: the handler may be called at once
        worker = Worker(store, "node", handler, ttl=30_000, poll=100,
                        retry=Retry(attempts=3, base=1, jitter=0)).start()
        try:
            until(functools.partial(_tried, store, calls, before), "claimed the run")
            quarantined = store.get("crasher").quarantined
        finally:
            worker.kill()
        if quarantined:
            break
        fake_clock.advance(30_001)  # the "dead" process's lease runs out
    assert calls == [0, 1, 2], f"handled on tries {calls}"
    assert store.quarantined() == [Quarantined(
        "failed", "crasher", "final", "the lease ran out on each of 3 tries")]


def test_a_result_after_the_lease_ran_out_by_the_servers_clock_never_lands(
        fake_clock: Clock) -> None:
    """The server's clock passes node-a's lease while its handler runs (a pause of node-a's
    process, as the server sees it; its keeper has not renewed yet); node-b takes the run
    over. node-a's result never lands."""
    store = fake_store()
    store.insert("run", b"todo", Release())
    taken, go = threading.Event(), threading.Event()

    def handler(job: Job) -> bytes:
        taken.set()
        assert go.wait(PATIENCE)
        return b"done-by-node-a"

    worker = Worker(store, "node-a", handler, ttl=30_000, poll=100).start()
    try:
        assert taken.wait(PATIENCE)
        fake_clock.advance(30_001)  # node-a's lease ran out
        assert store.claim("node-b", ttl=60_000) == ["run"]
        go.set()
        until(lambda: ended(worker) == 1, "ended node-a's run")
        current = store.get("run")
    finally:
        go.set()
        worker.stop()
    assert (current.record, current.holder) == (b"todo", Held("node-b", True)), (
        f"node-a's result landed over node-b's live lease: {current}")
    store.compare_and_set("run", current.revision, b"done-by-node-b", Hold("node-b"))


def test_an_asyncio_result_after_the_lease_ran_out_by_the_servers_clock_never_lands(
        fake_clock: Clock) -> None:
    """:func:`test_a_result_after_the_lease_ran_out_by_the_servers_clock_never_lands` for
    ``AsyncWorker``."""

    async def main() -> None:
        store = fake_astore()
        await store.insert("run", b"todo", Release())
        taken, go = asyncio.Event(), asyncio.Event()

        async def handler(job: AsyncJob) -> bytes:
            taken.set()
            await asyncio.wait_for(go.wait(), PATIENCE)
            return b"done-by-node-a"

        worker = AsyncWorker(store, "node-a", handler, ttl=30_000, poll=100).start()
        try:
            await asyncio.wait_for(taken.wait(), PATIENCE)
            fake_clock.advance(30_001)
            assert await store.claim("node-b", ttl=60_000) == ["run"]
            go.set()
            await auntil(lambda: ended(worker) == 1, "ended node-a's run")
            current = await store.get("run")
        finally:
            go.set()
            await worker.stop()
        assert (current.record, current.holder) == (b"todo", Held("node-b", True)), (
            f"node-a's result landed over node-b's live lease: {current}")
        await store.compare_and_set("run", current.revision, b"done-by-node-b",
                                    Hold("node-b"))

    run_async(main)


# ---------------------------------------------------------------- a bad handler result

#: Handler results the store refuses to write: a wait ``json_wait`` refuses, and a record
#: over the store's ``max_record_bytes`` (1024 here).
BAD_RESULTS = [
    pytest.param(b'{"wait": 5}', id="a wait discover refuses"),
    pytest.param(b'{"wait": null, "pad": "' + b"x" * 2000 + b'"}', id="over max_record_bytes"),
]
#: The bad run: an expired lease without a wait (claimed once; once released, never ready).
BAD_RUN = b'{"wait": null, "kind": "bad"}'
GOOD_RUN = b'{"wait": {"at": 0}, "kind": "good"}'
GOOD_RESULT = b'{"wait": null, "kind": "good", "done": true}'


@pytest.mark.parametrize("bad", BAD_RESULTS)
def test_a_result_the_store_refuses_fails_the_run_not_the_worker(
        backend: Backend, bad: bytes) -> None:
    """docs/worker.md: a handler's answer that cannot be written releases the run, logged,
    counted ``failed``; the worker goes on (its one loop does the next run)."""
    store = backend.store(discover=json_wait, max_record_bytes=1024)
    store.insert("bad", BAD_RUN, Claim("dead-node", 1))
    time.sleep(0.01)  # dead-node's 1 ms lease is over: the worker takes it over

    def handler(job: Job) -> bytes:
        return bad if b'"bad"' in job.current.record else GOOD_RESULT

    worker = Worker(store, "w", handler, ttl=5_000, poll=100).start()
    try:
        until(lambda: worker.failure or (
            worker.stats["failed"] == 1 and store.get("bad").holder == Free()),
              "failed and released the bad run")
        assert worker.failure is None, f"a loop ended: {worker.failure!r}"
        store.insert("good", GOOD_RUN, Release())
        until(lambda: worker.stats["done"] == 1, "did the good run")
    finally:
        worker.stop()
    assert store.get("good").record == GOOD_RESULT


@pytest.mark.parametrize("bad", BAD_RESULTS)
def test_an_asyncio_result_the_store_refuses_fails_the_run_not_the_worker(
        backend: Backend, bad: bytes) -> None:
    """:func:`test_a_result_the_store_refuses_fails_the_run_not_the_worker`, asyncio."""

    async def main() -> None:
        store = backend.astore(discover=json_wait, max_record_bytes=1024)
        await store.insert("bad", BAD_RUN, Claim("dead-node", 1))
        await asyncio.sleep(0.01)

        async def handler(job: AsyncJob) -> bytes:
            return bad if b'"bad"' in job.current.record else GOOD_RESULT

        worker = AsyncWorker(store, "w", handler, ttl=5_000, poll=100).start()
        deadline = time.monotonic() + PATIENCE
        try:
            while not worker.failure and not (
                    worker.stats["failed"] == 1 and (await store.get("bad")).holder == Free()):
                assert time.monotonic() < deadline, "never failed and released the bad run"
                await asyncio.sleep(0.005)
            assert worker.failure is None, f"a loop ended: {worker.failure!r}"
            await store.insert("good", GOOD_RUN, Release())
            await auntil(lambda: worker.stats["done"] == 1, "did the good run")
        finally:
            await worker.stop()
        assert (await store.get("good")).record == GOOD_RESULT

    backend.run(main)


# ---------------------------------------------------------------- a late claim


def test_a_run_claimed_late_in_a_long_blocked_claim_is_handled_once(backend: Backend) -> None:
    """ttl 2000, poll 6000: the loop's claim blocks; a run comes 2.3 s into the wait (past
    the ttl). Its lease is fresh: the handler runs once, never sees ``job.lost``, its result
    lands. (A ttl of 1000 left a loaded machine too little margin: a keepalive 1.3 s late
    lapsed the worker's session, a loss the test did not mean to try.)"""
    store = backend.store()
    lost_seen: list[bool] = []

    def handler(job: Job) -> bytes:
        deadline = time.monotonic() + 0.3  # some work, watching for a lost lease
        while time.monotonic() < deadline and not job.lost:
            time.sleep(0.01)
        lost_seen.append(job.lost)
        return b"done"

    worker = Worker(store, "w", handler, ttl=2_000, poll=6_000).start()
    try:
        time.sleep(2.3)  # the loop waits in its claim; the run comes late in the wait
        store.insert("run", b"todo", Release())
        until(lambda: ended(worker) >= 1, "ended the run")
    finally:
        worker.stop()
    assert lost_seen == [False]
    current = store.get("run")
    assert (current.record, current.holder) == (b"done", Free())
    assert (worker.stats["done"], worker.stats["lost"]) == (1, 0)


def test_an_asyncio_run_claimed_late_in_a_long_blocked_claim_is_handled_once(
        backend: Backend) -> None:
    """:func:`test_a_run_claimed_late_in_a_long_blocked_claim_is_handled_once`, asyncio."""

    async def main() -> None:
        store = backend.astore()
        lost_seen: list[bool] = []

        async def handler(job: AsyncJob) -> bytes:
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline and not job.lost:
                await asyncio.sleep(0.01)
            lost_seen.append(job.lost)
            return b"done"

        worker = AsyncWorker(store, "w", handler, ttl=2_000, poll=6_000, grace=5).start()
        try:
            await asyncio.sleep(2.3)
            await store.insert("run", b"todo", Release())
            await auntil(lambda: ended(worker) >= 1, "ended the run")
        finally:
            await worker.stop()
        assert lost_seen == [False]
        current = await store.get("run")
        assert (current.record, current.holder) == (b"done", Free())
        assert (worker.stats["done"], worker.stats["lost"]) == (1, 0)

    backend.run(main)


# ---------------------------------------------------------------- one run, two loops


def test_held_and_kill_see_every_handler_of_a_run_two_loops_took(fake_clock: Clock) -> None:
    """Loop 1 handles X; X's lease runs out and loop 2 of the same worker claims X while
    loop 1's handler still runs. When loop 1's handler returns, X is still ``held`` (loop
    2's handler runs on), and ``kill()`` tells loop 2's handler ``job.lost``."""
    store = fake_store()
    store.insert("X", b"todo", Release())
    started = [threading.Event(), threading.Event()]
    first_go, killed = threading.Event(), threading.Event()
    seen: list[bool] = []  # job.lost, as the second handler saw it after kill()
    calls: list[Job] = []

    def handler(job: Job) -> bytes:
        calls.append(job)
        started[len(calls) - 1].set()
        if len(calls) == 1:
            assert first_go.wait(PATIENCE)
            return b"done-by-loop-1"
        assert killed.wait(PATIENCE)
        deadline = time.monotonic() + 1.0
        while not job.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(job.lost)
        return b"done-by-loop-2"

    worker = Worker(store, "w", handler, ttl=30_000, concurrency=2, poll=100).start()
    try:
        assert started[0].wait(PATIENCE)
        fake_clock.advance(30_001)  # loop 1's lease ran out; loop 2's next claim takes X
        assert started[1].wait(PATIENCE)
        assert worker.held == ["X"]
        first_go.set()
        until(lambda: ended(worker) == 1, "ended loop 1's run")
        held = worker.held  # loop 2's handler of X still runs
        worker.kill()
        killed.set()
        until(lambda: seen, "heard from loop 2's handler")
    finally:
        first_go.set()
        killed.set()
        worker.kill()
    assert (held, seen) == (["X"], [True])


def test_asyncio_held_and_kill_see_every_handler_of_a_run_two_loops_took(
        fake_clock: Clock) -> None:
    """:func:`test_held_and_kill_see_every_handler_of_a_run_two_loops_took`, asyncio: after
    ``kill()`` loop 2's handler sees ``job.lost`` (or is cancelled with it set)."""

    async def main() -> None:
        store = fake_astore()
        await store.insert("X", b"todo", Release())
        started = [asyncio.Event(), asyncio.Event()]
        first_go, killed = asyncio.Event(), asyncio.Event()
        seen: list[bool] = []
        calls: list[AsyncJob] = []

        async def handler(job: AsyncJob) -> bytes:
            calls.append(job)
            started[len(calls) - 1].set()
            if len(calls) == 1:
                await asyncio.wait_for(first_go.wait(), PATIENCE)
                return b"done-by-loop-1"
            try:
                await asyncio.wait_for(killed.wait(), PATIENCE)
                deadline = time.monotonic() + 1.0
                while not job.lost and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                seen.append(job.lost)  # cancelled by kill() counts too
            return b"done-by-loop-2"

        worker = AsyncWorker(store, "w", handler, ttl=30_000, concurrency=2, poll=100,
                             grace=5).start()
        try:
            await asyncio.wait_for(started[0].wait(), PATIENCE)
            fake_clock.advance(30_001)
            await asyncio.wait_for(started[1].wait(), PATIENCE)
            assert worker.held == ["X"]
            first_go.set()
            await auntil(lambda: ended(worker) == 1, "ended loop 1's run")
            held = worker.held
            worker.kill()
            killed.set()
            await auntil(lambda: seen, "heard from loop 2's handler")
        finally:
            first_go.set()
            killed.set()
            worker.kill()
        assert (held, seen) == (["X"], [True])

    run_async(main)


# ---------------------------------------------------------------- max_record_bytes

BIG = b"done" + b"x" * 1_500_000  # over 1 MiB, under the store's 2 MiB


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_result_up_to_the_stores_max_record_bytes_is_written(backend: Backend,
                                                               partitions: int) -> None:
    """What a handler returns is "written with Release()": any record the store takes, up
    to its ``max_record_bytes`` (2 MiB here), not only up to the default 1 MiB; over
    partitions too (the cap is the store's, whatever its layout)."""
    store = backend.store(max_record_bytes=2 << 20, partitions=partitions)
    store.insert("run", b"todo", Release())
    worker = Worker(store, "w", lambda job: BIG, ttl=5_000, poll=100).start()
    try:
        until(lambda: ended(worker) >= 1, "ended the run")
    finally:
        worker.stop()
    assert (worker.stats["done"], worker.stats["failed"]) == (1, 0)
    assert store.get("run").record == BIG


@pytest.mark.parametrize("partitions", [1, 3])
def test_an_asyncio_result_up_to_the_stores_max_record_bytes_is_written(
        backend: Backend, partitions: int) -> None:
    async def main() -> None:
        store = backend.astore(max_record_bytes=2 << 20, partitions=partitions)
        await store.insert("run", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            return BIG

        worker = AsyncWorker(store, "w", handler, ttl=5_000, poll=100).start()
        try:
            await auntil(lambda: ended(worker) >= 1, "ended the run")
        finally:
            await worker.stop()
        assert (worker.stats["done"], worker.stats["failed"]) == (1, 0)
        assert (await store.get("run")).record == BIG

    backend.run(main)


# ---------------------------------------------------------------- job.lost fences writes


def _renewals_fail(*args: Any, **kwargs: Any) -> Any:
    raise Unavailable("renewals cut off (the test's fault)", outcome="not_applied")


async def _arenewals_fail(*args: Any, **kwargs: Any) -> Any:
    _renewals_fail()


def test_once_job_lost_is_true_no_write_of_the_job_lands(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keeper cannot renew (its renewals fail), so the job is told ``job.lost``.
    README: a lost lease "fences every later write of the job": ``job.write`` raises and
    writes nothing."""
    monkeypatch.setattr(RedisRunStore, "renew", _renewals_fail)
    monkeypatch.setattr(RedisRunStore, "_session_keepalive", _renewals_fail)
    store = backend.store()
    store.insert("run", b"todo", Release())
    wrote: list[object] = []

    def handler(job: Job) -> None:
        if wrote:
            return None  # taken again after the lost lease ran out: nothing to do
        deadline = time.monotonic() + PATIENCE
        while not job.lost and time.monotonic() < deadline:
            time.sleep(0.005)
        try:
            job.write(b"written-after-lost")
            wrote.append(("written", job.lost))
        except StoreError as error:
            wrote.append(error)
        return None

    worker = Worker(store, "w", handler, ttl=300, poll=100).start()
    try:
        until(lambda: wrote, "tried the write")
    finally:
        worker.stop()
    assert isinstance(wrote[0], StoreError), f"a write after job.lost: {wrote[0]}"
    assert store.get("run").record == b"todo"


def test_once_an_asyncio_job_lost_is_true_no_write_of_the_job_lands(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/worker.md (asyncio): in the grace after a lost lease, the handler's "writes to
    the store are fenced already"."""
    monkeypatch.setattr(AsyncRedisRunStore, "renew", _arenewals_fail)
    monkeypatch.setattr(AsyncRedisRunStore, "_session_keepalive", _arenewals_fail)

    async def main() -> None:
        store = backend.astore()
        await store.insert("run", b"todo", Release())
        wrote: list[object] = []

        async def handler(job: AsyncJob) -> None:
            if wrote:
                return None
            deadline = time.monotonic() + PATIENCE
            while not job.lost and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            try:
                await job.write(b"written-after-lost")
                wrote.append(("written", job.lost))
            except StoreError as error:
                wrote.append(error)
            return None

        worker = AsyncWorker(store, "w", handler, ttl=300, poll=100, grace=5).start()
        try:
            await auntil(lambda: wrote, "tried the write")
        finally:
            await worker.stop()
        assert isinstance(wrote[0], StoreError), f"a write after job.lost: {wrote[0]}"
        assert (await store.get("run")).record == b"todo"

    backend.run(main)


# ---------------------------------------------------------------- asyncio stop(timeout)

SLACK = 0.5  # s: what stop(timeout) may take beyond its timeout


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_an_asyncio_stop_returns_by_its_timeout_and_releases_the_lease(backend: Backend) -> None:
    """A handler that will not be cancelled (it swallows ``CancelledError``):
    ``stop(timeout=1.0)`` returns within its timeout (and a little), and the lease is
    released, as stop promises."""

    async def main() -> None:
        store = backend.astore()
        await store.insert("run", b"todo", Release())
        taken, escape = asyncio.Event(), asyncio.Event()

        async def handler(job: AsyncJob) -> None:
            taken.set()
            while not escape.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)
            return None

        worker = AsyncWorker(store, "w", handler, ttl=5_000, poll=100).start()
        await asyncio.wait_for(taken.wait(), PATIENCE)
        started = time.monotonic()
        stopping = asyncio.ensure_future(worker.stop(timeout=1.0))
        done, _ = await asyncio.wait({stopping}, timeout=1.0 + SLACK)
        took = time.monotonic() - started
        holder = (await store.get("run")).holder
        escape.set()  # the handler gives in: whatever stop is doing ends
        await asyncio.wait_for(stopping, PATIENCE)
        assert done, f"stop(timeout=1.0) had not returned after {took:.1f} s"
        assert holder == Free()

    backend.run(main)


# ------------------------------------------------ an AsyncWorker's loops claim together

def _slow_claims(monkeypatch: pytest.MonkeyPatch, seconds: float,
                 fail: list[StoreError] | None = None) -> list[int]:
    """Each claim the AsyncWorker's loops send together answers ``seconds`` late (a slow
    server), and raises the errors of ``fail`` first, one a claim: the limits sent."""
    limits: list[int] = []
    real = AsyncWorker._claim_many

    async def slow(self: AsyncWorker, session: str | None, limit: int) -> Any:
        limits.append(limit)
        await asyncio.sleep(seconds)
        if fail:
            raise fail.pop(0)
        return await real(self, session, limit)

    monkeypatch.setattr(AsyncWorker, "_claim_many", slow)
    return limits


def _none_handled_each_freed(backend: Backend, runs: int, sessions: bool,
                             stopping: Callable[[AsyncWorker], Awaitable[None]]) -> None:
    """``runs`` ready runs and an AsyncWorker of as many loops, which ``stopping`` stops:
    no handler had a run, and each is free and as it was."""

    async def main() -> None:
        store = backend.astore()
        for i in range(runs):
            await store.insert(f"run-{i}", b"todo", Release())
        handled: list[str] = []

        async def handler(job: AsyncJob) -> bytes:
            handled.append(job.run)
            return b"done"

        worker = AsyncWorker(store, "w", handler, ttl=30_000, concurrency=runs, poll=100,
                             sessions=sessions).start()
        await stopping(worker)
        assert handled == [] and worker.stats["claimed"] == 0
        for i in range(runs):
            current = await store.get(f"run-{i}")
            assert (current.record, current.holder) == (b"todo", Free()), current

    backend.run(main)


async def _working(backend: Backend, runs: int, **options: Any
                   ) -> tuple[AsyncRedisRunStore, AsyncWorker]:
    """``runs`` ready runs (run-0...), and an AsyncWorker started on them whose handler
    finishes each at once."""
    store = backend.astore()
    for i in range(runs):
        await store.insert(f"run-{i}", b"todo", Release())

    async def handler(job: AsyncJob) -> bytes:
        return b"done"

    return store, AsyncWorker(store, "w", handler, ttl=30_000, poll=100, **options).start()


@pytest.mark.parametrize("sessions", [True, False], ids=["session", "leases"])
def test_an_asyncio_stop_gives_back_the_runs_of_a_claim_in_flight(
        backend: Backend, monkeypatch: pytest.MonkeyPatch, sessions: bool) -> None:
    """The loops of an AsyncWorker at concurrency wait for one claim together; stop's
    timeout cancels them while it is in flight. The runs it took when it came back are
    given to no handler and freed at once, under their own grant (with a lease per run,
    nothing else would free them before their ttl)."""
    limits = _slow_claims(monkeypatch, 0.3)

    async def stopping(worker: AsyncWorker) -> None:
        await auntil(lambda: limits, "sent a claim")
        await worker.stop(timeout=0)

    _none_handled_each_freed(backend, 4, sessions, stopping)
    assert limits[0] == 4  # the four loops' claims, one


def test_an_asyncio_loop_cancelled_as_its_claimed_run_comes_gives_it_back(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrowest window: the claim answered, each loop's run set aside for it, and the
    loops cancelled (stop's timeout) before they run again. No handler gets a run, and
    each is freed under its grant at once (a lease per run: nothing else would free it
    before its ttl)."""
    real = AsyncWorker._claim_many

    async def then_cancelled(self: AsyncWorker, session: str | None, limit: int) -> Any:
        got = await real(self, session, limit)
        # Before the loops wake with their runs: as stop's timeout cancels them.
        asyncio.get_running_loop().call_soon(lambda: [t.cancel() for t in self._tasks])
        return got

    monkeypatch.setattr(AsyncWorker, "_claim_many", then_cancelled)

    async def stopping(worker: AsyncWorker) -> None:
        await asyncio.wait(worker._tasks, timeout=PATIENCE)
        await worker.stop()

    _none_handled_each_freed(backend, 3, False, stopping)


@pytest.mark.parametrize("partitions", [1, 3])
def test_an_asyncio_workers_loops_claiming_together_finish_each_run_once(
        backend: Backend, partitions: int) -> None:
    """Loops that claim together, with handlers of uneven lengths (so the claims take
    different numbers of runs), over one partition and three: each run handled and
    finished once, nothing held afterwards."""

    async def main() -> None:
        store = backend.astore(partitions=partitions)
        for i in range(60):
            await store.insert(f"run-{i:02d}", b"todo", Release())
        handled: list[str] = []

        async def handler(job: AsyncJob) -> bytes:
            handled.append(job.run)
            await asyncio.sleep(0.002 * (int(job.run[-1]) % 4))
            return b"done"

        worker = AsyncWorker(store, "w", handler, ttl=30_000, concurrency=8,
                             poll=100).start()
        try:
            await auntil(lambda: worker.stats["done"] == 60, "finished every run")
        finally:
            await worker.stop()
        assert sorted(handled) == [f"run-{i:02d}" for i in range(60)]
        assert worker.stats["claimed"] == 60 and worker.stats["done"] == 60
        for i in range(60):
            current = await store.get(f"run-{i:02d}")
            assert (current.record, current.holder) == (b"done", Free()), current

    backend.run(main)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_asyncio_stop_gives_up_the_runs_whose_finish_its_timeout_cut_off(
        backend: Backend, concurrency: int) -> None:
    """Each loop's finish waits its turn (a busy pipeline ahead of it) past stop's timeout,
    which cancels the loops before their finishes were sent. With a lease per run, nothing
    else would free the runs before their ttl: stop gives them up under their grants, as
    it does a running handler's."""

    async def main() -> None:
        store = backend.astore()
        for i in range(concurrency):
            await store.insert(f"run-{i}", b"todo", Release())
        handled: list[str] = []
        finish, write = store.finish, store._write

        async def late_finish(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.3)
            return await finish(*args, **kwargs)

        async def late_write(op: Any) -> Any:  # the fused finish and claim (concurrency 1)
            if len(handled) >= concurrency:
                await asyncio.sleep(0.3)
            return await write(op)

        async def handler(job: AsyncJob) -> bytes:
            handled.append(job.run)
            return b"done"

        worker = AsyncWorker(store, "w", handler, ttl=60_000, concurrency=concurrency,
                             poll=50, sessions=False)
        store.finish, store._write = late_finish, late_write  # type: ignore[method-assign]
        worker.start()
        await auntil(lambda: len(handled) == concurrency, "handled every run")
        await asyncio.sleep(0.05)  # each loop in its finish
        store.finish, store._write = finish, write  # type: ignore[method-assign]
        await worker.stop(timeout=0.1)
        for i in range(concurrency):
            assert (await store.get(f"run-{i}")).holder == Free(), f"run-{i} still held"

    backend.run(main)


def test_an_asyncio_stop_returns_by_its_timeout_while_a_claim_is_slow(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loops at concurrency waiting for a claim the server answers 3 s late: stop(timeout=
    0.2) returns by its timeout (and a little), not when the claim comes back."""
    limits = _slow_claims(monkeypatch, 3.0)

    async def main() -> None:
        _, worker = await _working(backend, 4, concurrency=4)
        await auntil(lambda: limits, "sent a claim")
        started = time.monotonic()
        await worker.stop(timeout=0.2)
        took = time.monotonic() - started
        assert took < 0.2 + SLACK, f"stop(timeout=0.2) took {took:.2f} s"

    backend.run(main)


def test_no_claim_is_sent_once_an_asyncio_stop_was_called(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loops at concurrency, one waiting behind the claim in flight as stop() is called:
    no claim goes after it (the waiting loop gets none and ends)."""
    limits = _slow_claims(monkeypatch, 0.3)
    sent: list[float] = []
    slow = AsyncWorker._claim_many

    def timed(self: AsyncWorker, session: str | None, limit: int) -> Any:
        sent.append(time.monotonic())
        return slow(self, session, limit)

    monkeypatch.setattr(AsyncWorker, "_claim_many", timed)

    async def main() -> None:
        store = backend.astore()
        for i in range(4):
            await store.insert(f"run-{i}", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            # Uneven: one loop's next claim goes out while the other's waits behind it.
            await asyncio.sleep(0.01 if job.run == "run-0" else 0.1)
            return b"done"

        worker = AsyncWorker(store, "w", handler, ttl=30_000, concurrency=2,
                             poll=100).start()
        assert worker._claims is not None
        claims = worker._claims
        await auntil(lambda: len(limits) >= 2 and bool(claims._waiting),
                     "a loop waiting behind a claim in flight")
        stopped = time.monotonic()
        await worker.stop()
        assert [t for t in sent if t > stopped] == [], "a claim after stop"

    backend.run(main)


def test_an_asyncio_kill_gives_back_nothing_a_claim_took(backend: Backend) -> None:
    """kill() as a claim's runs were set aside for the loops, before they ran again: as a
    crash, nothing more is sent (no give-back): the runs stay held until their leases run
    out."""

    async def main() -> None:
        store = backend.astore()
        for i in range(3):
            await store.insert(f"run-{i}", b"todo", Release())
        sent: list[str] = []
        finish = store.finish
        killed: list[bool] = []

        async def spying(*args: Any, **kwargs: Any) -> Any:
            if killed:
                sent.append(args[0])
            return await finish(*args, **kwargs)

        store.finish = spying  # type: ignore[method-assign]

        async def handler(job: AsyncJob) -> bytes:
            return b"done"

        worker = AsyncWorker(store, "w", handler, ttl=30_000, concurrency=3, poll=100,
                             sessions=False)
        real = worker._claim_many

        async def then_killed(session: str | None, limit: int) -> Any:
            got = await real(session, limit)

            def kill() -> None:
                killed.append(True)
                worker.kill()

            asyncio.get_running_loop().call_soon(kill)  # before the loops wake
            return got

        worker._claim_many = then_killed  # type: ignore[method-assign]
        worker.start()
        await auntil(lambda: killed, "killed")
        await asyncio.sleep(0.2)
        assert sent == [], "sent after kill"
        for i in range(3):
            assert (await store.get(f"run-{i}")).holder == Held("w", True)

    backend.run(main)


def test_a_failed_claim_fails_each_asyncio_loop_that_waited_for_it(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim sent for several loops fails (the server away): each loop pauses and claims
    again, none dies, and every run is then done once."""
    _slow_claims(monkeypatch, 0.0, fail=[Unavailable("away", outcome="not_applied")])

    async def main() -> None:
        store, worker = await _working(backend, 12, concurrency=4)
        try:
            await auntil(lambda: worker.stats["done"] == 12, "finished every run")
        finally:
            await worker.stop()
        assert worker.failure is None
        assert worker.stats["claimed"] == 12 and worker.stats["done"] == 12
        for i in range(12):
            assert (await store.get(f"run-{i}")).record == b"done"

    backend.run(main)


# ---------------------------------------------------------------- stop() stops claiming


def test_no_run_is_claimed_once_stop_was_called(backend: Backend) -> None:
    """Two loops: one handles a long run, the other waits in its claim. ``stop()`` is called
    (it waits for the long handler); a run inserted then is not claimed."""
    store = backend.store()
    store.insert("long", b"todo", Release())
    long_taken, saw_stopping, long_go = (threading.Event() for _ in range(3))
    handled: list[str] = []

    def handler(job: Job) -> bytes | None:
        handled.append(job.run)
        if job.run != "long":
            return b"done-" + job.run.encode()
        long_taken.set()
        deadline = time.monotonic() + PATIENCE
        while not job.stopping and time.monotonic() < deadline:
            time.sleep(0.005)
        saw_stopping.set()
        assert long_go.wait(PATIENCE)
        return None

    worker = Worker(store, "w", handler, ttl=5_000, concurrency=2, poll=5_000).start()
    stopper = threading.Thread(target=worker.stop)
    try:
        assert long_taken.wait(PATIENCE)
        # A run for the other loop: once its result is stored, that loop has sent its
        # next claim (the finish and the claim go together) and waits in it.
        store.insert("probe", b"todo", Release())
        until(lambda: store.get("probe").record == b"done-probe", "finished the probe")
        stopper.start()
        assert saw_stopping.wait(PATIENCE)  # stop() was called
        store.insert("late", b"todo", Release())
        time.sleep(0.1)
        long_go.set()
        stopper.join(PATIENCE * 2)
        assert not stopper.is_alive()
    finally:
        long_go.set()
        if stopper.is_alive() or stopper.ident is None:
            worker.kill()  # stop() is stuck, or was never called
    assert handled == ["long", "probe"]
    late = store.get("late")
    assert (late.revision, late.record, late.holder) == (1, b"todo", Free())
    assert worker.stats["claimed"] == 2


def test_no_run_is_claimed_once_an_asyncio_stop_was_called(backend: Backend) -> None:
    """:func:`test_no_run_is_claimed_once_stop_was_called`, asyncio."""

    async def main() -> None:
        store = backend.astore()
        await store.insert("long", b"todo", Release())
        long_taken, saw_stopping, long_go = (asyncio.Event() for _ in range(3))
        handled: list[str] = []

        async def handler(job: AsyncJob) -> bytes | None:
            handled.append(job.run)
            if job.run != "long":
                return b"done-" + job.run.encode()
            long_taken.set()
            await auntil(lambda: job.stopping, "saw stopping")
            saw_stopping.set()
            await asyncio.wait_for(long_go.wait(), PATIENCE)
            return None

        worker = AsyncWorker(store, "w", handler, ttl=5_000, concurrency=2,
                             poll=5_000).start()
        stopping: asyncio.Future[None] | None = None
        try:
            await asyncio.wait_for(long_taken.wait(), PATIENCE)
            await store.insert("probe", b"todo", Release())

            async def probe_done() -> bool:
                return (await store.get("probe")).record == b"done-probe"

            await aget_until(probe_done, "finished the probe")
            stopping = asyncio.ensure_future(worker.stop())
            await asyncio.wait_for(saw_stopping.wait(), PATIENCE)
            await store.insert("late", b"todo", Release())
            await asyncio.sleep(0.1)
            long_go.set()
            await asyncio.wait_for(stopping, PATIENCE * 2)
        finally:
            long_go.set()
            if stopping is None or not stopping.done():
                worker.kill()
        assert handled == ["long", "probe"]
        late = await store.get("late")
        assert (late.revision, late.record, late.holder) == (1, b"todo", Free())
        assert worker.stats["claimed"] == 2

    backend.run(main)


# ---------------------------------------------------------------- the documented loop

# The finish-and-claim loop as docs/runs.md ("Pipelines") shows it, and README.md's
# pipeline example ("A worker's loop"), copied exactly: run as written. If the docs' loop
# changes (as its fix will change it), change these to what the docs then show.
RUNS_MD_CLAIM = 'got = store.claim("node-a", ttl=30_000, records=True)\n'
RUNS_MD_LOOP = """\
while got:
    job = got[0]                         # Claimed(run, current): the record and its grant
    with store.pipeline() as pipe:       # finish this one and take the next: one script
        done = pipe.finish(job.run, job.current.revision,
                           Fenced("node-a", job.current.token), record=b"done")
        nxt = pipe.claim("node-a", ttl=30_000, records=True)
    got = nxt.result()                   # first: what the claim took is ours to work
    try:
        done.result()                    # None, or this finish's own error
    except (Conflict, LeaseRefused):
        pass                             # taken over meanwhile: nothing of ours landed
"""
README_STEP = """\
with store.pipeline() as pipe:
    done = pipe.finish(job.run, job.current.revision, Fenced("node-a", job.current.token),
                       record=b'{"done": true}')
    nxt = pipe.claim("node-a", ttl=30_000, records=True)   # block=ms: wait for one
print(nxt.result())                       # [Claimed(run, current), ...]: the next job, if any
try:
    done.result()                         # None, or raises this finish's own error
except (Conflict, LeaseRefused):          # another node took job-7 over: ours never landed
    pass
"""


def _held_by_node_a(store: RedisRunStore, runs: list[str]) -> list[str]:
    return [run for run in runs if store.get(run).holder == Held("node-a", True)]


def test_the_documented_loop_leaves_no_run_claimed_unworked_when_a_finish_is_refused(
        backend: Backend) -> None:
    """docs/runs.md's loop: node-a claims job-0; node-b takes job-0 over and writes it
    before node-a's finish; the finish is refused. The loop may stop there (its error
    raised), but no run it claimed is left held by node-a, unworked, for its TTL."""
    assert RUNS_MD_CLAIM + RUNS_MD_LOOP in (ROOT / "docs" / "runs.md").read_text(), (
        "docs/runs.md's loop changed: copy the new one here")
    store = backend.store(discover=lambda record: None if record == b"done" else At(0))
    runs = [f"job-{i}" for i in range(3)]
    for run in runs:
        store.insert(run, b"todo", Release())
    names: dict[str, Any] = {"store": store, "Release": Release, "Fenced": Fenced,
                             "Conflict": Conflict, "LeaseRefused": LeaseRefused}
    exec(RUNS_MD_CLAIM, names)
    first = names["got"][0]
    # node-b takes node-a's run over (node-a looked dead) and writes it.
    store.compare_and_set(first.run, first.current.revision, b"node-b's",
                          Seize("node-b", 30_000))
    with contextlib.suppress(StoreError):  # the loop may end with the finish's error
        exec(RUNS_MD_LOOP, names)
    assert _held_by_node_a(store, runs) == [], "claimed by node-a and never worked"


def test_the_readme_pipeline_leaves_no_run_claimed_unworked_when_its_finish_is_refused(
        backend: Backend) -> None:
    """README.md's finish-and-claim step, its finish refused (node-b took job-7 over and
    wrote it: a ``Conflict``, the revision moved): the run its claim took is not left held
    by node-a, unworked. The step goes on (a loop around it works what it printed): the
    refusal its ``except`` stands for, "another node took job-7 over", does not escape it,
    as an error escaping after the claim would end the loop with job-8 claimed."""
    assert README_STEP in (ROOT / "README.md").read_text(), (
        "README.md's pipeline example changed: copy the new one here")
    store = backend.store(discover=json_wait)
    store.insert("job-7", b'{"wait": {"at": 0}}', Release())
    job = store.claim("node-a", ttl=30_000, records=True)[0]
    store.insert("job-8", b'{"wait": {"at": 0}}', Release())  # the next job
    store.compare_and_set("job-7", 1, b'{"todo": 1, "by": "node-b"}',
                          Seize("node-b", 30_000))
    printed: list[Any] = []
    names: dict[str, Any] = {"store": store, "Fenced": Fenced, "job": job,
                             "Conflict": Conflict, "LeaseRefused": LeaseRefused,
                             "print": printed.append}
    escaped: StoreError | None = None
    try:
        exec(README_STEP, names)
    except StoreError as error:
        escaped = error
    handed = {claimed.run for answer in printed for claimed in answer
              if isinstance(claimed, Claimed)}
    assert set(_held_by_node_a(store, ["job-7", "job-8"])) <= handed, (
        "claimed by node-a and never handed to it")
    assert escaped is None, (
        f"the step raised {escaped!r} after its claim took {sorted(handed)}: a loop "
        "around it ends there, leaving them claimed and unworked")


# ---------------------------------------------------------------- bookkeeping lag

#: How long after a finish is acknowledged ``stats`` and ``held`` may take to show it
#: (the promise is "at once"; this is room for a loaded machine, far under the poll).
PROMPT = 0.25


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_done_is_counted_when_the_finish_is_acknowledged_not_a_poll_later(backend: Backend) -> None:
    """``stats`` counts a run once its finish is answered, not when the claim that went
    with it (blocked up to ``poll``, 2 s here) returns."""
    store = backend.store()
    store.insert("run", b"todo", Release())
    worker = Worker(store, "w", lambda job: b"done", ttl=5_000, poll=2_000).start()
    try:
        until(lambda: store.get("run").record == b"done", "wrote the result")
        written = time.monotonic()
        until(lambda: worker.stats["done"] == 1, "counted it done", patience=1.0)
        took = time.monotonic() - written
    finally:
        worker.stop()
    assert took < PROMPT, f"counted {took:.2f} s after the write"


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_asyncio_done_is_counted_when_the_finish_is_acknowledged_not_a_poll_later(
        backend: Backend) -> None:
    async def main() -> None:
        store = backend.astore()
        await store.insert("run", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            return b"done"

        async def written() -> bool:
            return (await store.get("run")).record == b"done"

        worker = AsyncWorker(store, "w", handler, ttl=5_000, poll=2_000).start()
        try:
            await aget_until(written, "wrote the result")
            at = time.monotonic()
            await auntil(lambda: worker.stats["done"] == 1, "counted it done", patience=1.0)
            took = time.monotonic() - at
        finally:
            await worker.stop()
        assert took < PROMPT, f"counted {took:.2f} s after the write"

    backend.run(main)


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_held_drops_a_run_once_its_finish_is_acknowledged(backend: Backend) -> None:
    """``held`` lists "the runs whose handlers run now": not a run the server freed."""
    store = backend.store()
    store.insert("run", b"todo", Release())
    worker = Worker(store, "w", lambda job: b"done", ttl=5_000, poll=2_000).start()
    try:
        until(lambda: store.get("run").record == b"done", "finished the run")
        until(lambda: worker.held == [], "dropped the run from held", patience=PROMPT)
    finally:
        worker.stop()


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_asyncio_held_drops_a_run_once_its_finish_is_acknowledged(backend: Backend) -> None:
    async def main() -> None:
        store = backend.astore()
        await store.insert("run", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            return b"done"

        async def freed() -> bool:
            return (await store.get("run")).record == b"done"

        worker = AsyncWorker(store, "w", handler, ttl=5_000, poll=2_000).start()
        try:
            await aget_until(freed, "finished the run")
            await auntil(lambda: worker.held == [], "dropped the run from held",
                         patience=PROMPT)
        finally:
            await worker.stop()

    backend.run(main)


#: The scripts that carry a worker's finish: alone, or with the next claim.
FINISHES = {scripts.RUN_FINISH.sha.encode(), scripts.RUN_FINISH_CLAIM.sha.encode()}


def _carries_a_finish(batch: Any, got: Exchange) -> bool:
    """Whether ``batch`` carries a finish that ran (not one the server did not have yet:
    NOSCRIPT, nothing ran, the store loads it and sends it again)."""
    noscript = any(isinstance(r, ErrorReply) and r.code == "NOSCRIPT" for r in got.replies)
    return not noscript and any(bytes(c[1]) in FINISHES for c in batch.commands if len(c) > 1)


def _lose_the_finishs_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch that carries a finish is sent and applied, and its reply lost (a broken
    link): the worker cannot know whether the run was written."""
    sync_send, async_send = Transport._send, AsyncTransport._send

    def send(self: Transport, batch: Any, deadline: float) -> Exchange:
        got = sync_send(self, batch, deadline)
        lost = _carries_a_finish(batch, got)
        return Exchange((), Lost(True, "the test's fault")) if lost else got

    async def asend(self: AsyncTransport, batch: Any, deadline: float) -> Exchange:
        got = await async_send(self, batch, deadline)
        lost = _carries_a_finish(batch, got)
        return Exchange((), Lost(True, "the test's fault")) if lost else got

    monkeypatch.setattr(Transport, "_send", send)
    monkeypatch.setattr(AsyncTransport, "_send", asend)


def _losing(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> tuple[int | None,
                                                                         Callable[[], None]]:
    """How the worker's store loses its finish's reply: the port of its client (None: the
    backend's own) and what its handler calls before it returns. On fakeredis the store's
    transport loses it (:func:`_lose_the_finishs_reply`); on Redis 7, whose replies take
    the lean path the transport's ``_send`` never sees, a fault proxy between the worker
    and the server drops the next reply: the finish's, which the handler's return sends
    (the keeper's first keepalive is a third of the TTL away; the test reads the run
    around the proxy). The finish's scripts are loaded first: a NOSCRIPT reply lost would
    be a finish that never ran."""
    if backend.server is None:
        _lose_the_finishs_reply(monkeypatch)
        return None, lambda: None
    client = backend.server.client()
    for script in (scripts.RUN_FINISH, scripts.RUN_FINISH_CLAIM):
        client.script_load(script.source)
    client.close()
    proxy = FaultProxy(backend.server.port).start()
    backend.later(proxy.stop)
    return proxy.port, proxy.drop_replies


def test_a_finish_whose_reply_was_lost_is_not_counted_done(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finish's write is applied but its reply is lost (``Unavailable``, outcome
    ``unknown``): the worker does not know the run was written, and does not count it
    ``done``."""
    store = backend.store()
    store.insert("run", b"todo", Release())
    port, lose = _losing(backend, monkeypatch)

    def handler(job: Job) -> bytes:
        lose()
        return b"done"

    worker = Worker(backend.store(namespace=store.namespace, port=port), "w", handler,
                    ttl=5_000, poll=100).start()
    try:
        until(lambda: store.get("run").record == b"done", "sent the finish")
        until(lambda: worker.stats["unknown"] == 1, "counted the finish unknown")
    finally:
        worker.stop()  # once it returns, the worker has counted what it will
    assert worker.stats["done"] == 0, f"counted done: {dict(worker.stats)}"


def test_an_asyncio_finish_whose_reply_was_lost_is_not_counted_done(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    port, lose = _losing(backend, monkeypatch)

    async def main() -> None:
        store = backend.astore()
        await store.insert("run", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            lose()
            return b"done"

        async def sent() -> bool:
            return (await store.get("run")).record == b"done"

        worker = AsyncWorker(backend.astore(namespace=store.namespace, port=port), "w",
                             handler, ttl=5_000, poll=100).start()
        try:
            await aget_until(sent, "sent the finish")
            await auntil(lambda: worker.stats["unknown"] == 1, "counted the finish unknown")
        finally:
            await worker.stop()
        assert worker.stats["done"] == 0, f"counted done: {dict(worker.stats)}"

    backend.run(main)


# ---------------------------------------------------------------- stop() when idle

IDLE_STOP = 0.2  # s: far under the poll


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_stop_of_an_idle_worker_returns_at_once(backend: Backend) -> None:
    """docs/worker.md: "``poll`` only bounds how long ``stop()`` waits for an idle loop" —
    but nothing needs to wait: the loop has nothing to finish."""
    store = backend.store()
    store.insert("probe", b"todo", Release())
    worker = Worker(store, "w", lambda job: b"done", ttl=5_000, poll=3_000).start()
    try:
        # Once the probe's result is stored, the loop has sent its next claim (they go
        # together) and waits in it: idle.
        until(lambda: store.get("probe").record == b"done", "finished the probe")
    finally:
        started = time.monotonic()
        worker.stop()
        took = time.monotonic() - started
    assert took < IDLE_STOP, f"stop() took {took:.2f} s"


@pytest.mark.serial  # measures a latency: run alone (docs/testing.md)
def test_stop_of_an_idle_asyncio_worker_returns_at_once(backend: Backend) -> None:
    async def main() -> None:
        store = backend.astore()
        await store.insert("probe", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            return b"done"

        async def finished() -> bool:
            return (await store.get("probe")).record == b"done"

        worker = AsyncWorker(store, "w", handler, ttl=5_000, poll=3_000).start()
        try:
            await aget_until(finished, "finished the probe")
        finally:
            started = time.monotonic()
            await worker.stop()
            took = time.monotonic() - started
        assert took < IDLE_STOP, f"stop() took {took:.2f} s"

    backend.run(main)


# ---------------------------------------------------------------- BaseException


class Bail(BaseException):
    """Not an ``Exception``: as ``SystemExit`` or ``KeyboardInterrupt`` are not."""


@pytest.mark.parametrize("error", [Bail, SystemExit])
def test_a_handler_raising_a_base_exception_stops_the_worker(
        backend: Backend, error: type[BaseException]) -> None:
    """A ``BaseException`` that is not an ``Exception`` is no run's failure: the worker
    stops (it claims no more), releases what it holds and keeps the error in
    ``worker.failure``; the same as ``AsyncWorker`` does."""
    store = backend.store()
    store.insert("first", b"todo", Release())

    def handler(job: Job) -> bytes:
        if job.run == "first":
            raise error()
        return b"done"

    worker = Worker(store, "w", handler, ttl=5_000, concurrency=2, poll=100).start()
    try:
        until(lambda: worker.stats["claimed"] == 1, "claimed the run")
        until(lambda: worker.failure is not None and store.get("first").holder == Free(),
              "recorded the failure and released the run", patience=2.0)
        assert isinstance(worker.failure, error)
        store.insert("second", b"todo", Release())
        time.sleep(0.3)  # a worker that still claimed would have taken it by now
        assert store.get("second").holder == Free()
        assert worker.stats["claimed"] == 1
    finally:
        worker.stop()


def test_an_asyncio_handler_raising_a_base_exception_stops_the_worker(backend: Backend) -> None:
    """:func:`test_a_handler_raising_a_base_exception_stops_the_worker`, asyncio (with
    ``Bail`` only: a ``SystemExit`` that escaped the loop's task would end the test's event
    loop, not just the worker)."""

    async def main() -> None:
        store = backend.astore()
        await store.insert("first", b"todo", Release())

        async def handler(job: AsyncJob) -> bytes:
            if job.run == "first":
                raise Bail()
            return b"done"

        async def released() -> bool:
            return (await store.get("first")).holder == Free()

        worker = AsyncWorker(store, "w", handler, ttl=5_000, concurrency=2,
                             poll=100).start()
        try:
            await auntil(lambda: worker.stats["claimed"] == 1, "claimed the run")
            deadline = time.monotonic() + 2.0
            while worker.failure is None or not await released():
                assert time.monotonic() < deadline, (
                    "never recorded the failure and released the run")
                await asyncio.sleep(0.005)
            assert isinstance(worker.failure, Bail)
            await store.insert("second", b"todo", Release())
            await asyncio.sleep(0.3)
            assert (await store.get("second")).holder == Free()
            assert worker.stats["claimed"] == 1
        finally:
            await worker.stop()

    backend.run(main)
