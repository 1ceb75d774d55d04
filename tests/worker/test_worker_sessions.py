"""The Worker on sessions (the default, docs/worker.md): its runs are held under one session
of its own, kept alive by one keepalive a period whatever their number; a run taken from
the session is lost to its handler; a session that lapsed is replaced; stop closes it.
With ``sessions=False``, a lease per run."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from servers import Server, unique_namespace
from test_worker_promises import (
    PATIENCE,
    ROOT,
    fake_astore,
    fake_store,
    ready,
    run_async,
    until,
)

from redisstore import (
    AsyncJob,
    AsyncRedisRunStore,
    AsyncWorker,
    Held,
    Job,
    MemoryRunStore,
    RedisRunStore,
    Release,
    Seize,
    Unavailable,
    Worker,
    drop_namespace,
)
from redisstore.core.driver import Call, ask
from redisstore.core.partitions import partition_of
from redisstore.core.runops import RunOps


def counting(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """Count the calls of ``cls.name`` (the keeper's store is a copy of the same class)."""
    calls: list[int] = []
    real = getattr(cls, name)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return calls


@pytest.mark.parametrize("kind", ["memory", "fakeredis"])
def test_the_worker_holds_its_runs_under_one_session(monkeypatch: pytest.MonkeyPatch,
                                                      kind: str) -> None:
    store: Any = MemoryRunStore(discover=ready) if kind == "memory" else fake_store()
    cls = type(store)
    renewals = counting(monkeypatch, cls, "renew")
    keepalives = counting(monkeypatch, cls, "_session_keepalive")
    for run in ("a", "b", "c"):
        store.insert(run, b"todo", Release())
    holding, go = threading.Barrier(4), threading.Event()
    seen: list[Any] = []

    def handler(job: Job) -> bytes:
        seen.append(store.get(job.run))
        holding.wait(PATIENCE)
        assert go.wait(PATIENCE)
        return b"done"

    worker = Worker(store, "node-a", handler, ttl=300, concurrency=3, poll=50,
                    sessions=True).start()
    try:
        holding.wait(PATIENCE)
        assert worker._keeper is not None
        session = worker._keeper.session
        assert session is not None
        assert {c.session for c in seen} == {session}
        assert all(c.holder == Held("node-a", True) for c in seen)
        # Past three ttls: kept alive by keepalives alone, not one renewal of a run.
        until(lambda: len(keepalives) >= 9, "kept the session alive for three ttls")
        assert renewals == []
        assert all(store.get(run).holder == Held("node-a", True) for run in "abc")
        assert [(s.id, s.runs) for s in store.sessions()] == [(session, 3)]
        go.set()
        until(lambda: worker.stats["done"] == 3, "finished the runs")
    finally:
        go.set()
        worker.stop()
    assert all(store.get(run).record == b"done" for run in "abc")
    assert store.sessions() == []  # stop closed it


@pytest.mark.parametrize("partitions", [1, 6])
def test_a_run_taken_from_its_session_is_lost_to_its_handler(partitions: int) -> None:
    store = fake_store(partitions=partitions)
    store.insert("run", b"todo", Release())
    taken, outcome = threading.Event(), []

    def handler(job: Job) -> bytes:
        taken.set()
        deadline = PATIENCE
        while not job.lost and deadline > 0:
            threading.Event().wait(0.01)
            deadline -= 0.01
        outcome.append(job.lost)
        return b"done-by-a"

    worker = Worker(store, "node-a", handler, ttl=600, poll=50, sessions=True).start()
    try:
        assert taken.wait(PATIENCE)
        current = store.get("run")
        assert current.session is not None  # a store of partitions too: under its session
        store.compare_and_set("run", current.revision, b"mine", Seize("node-b", 60_000))
        until(lambda: outcome, "told the handler")
        until(lambda: worker.stats["lost"] == 1, "counted the run lost")
    finally:
        worker.stop()
    assert outcome == [True]
    current = store.get("run")
    assert (current.record, current.holder) == (b"mine", Held("node-b", True))


def test_a_worker_whose_session_lapsed_opens_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keepalives cut off past the ttl (a paused node): the session lapses, its job is
    lost and nothing of it lands; once they come back, the worker opens a new session and
    finishes the run under it."""
    store = fake_store()
    store.insert("run", b"todo", Release())
    cut = threading.Event()
    real = RedisRunStore._session_keepalive

    def keepalive(self: Any, *args: Any) -> Any:
        if cut.is_set():
            raise Unavailable("keepalives cut off (the test's fault)", outcome="not_applied")
        return real(self, *args)

    monkeypatch.setattr(RedisRunStore, "_session_keepalive", keepalive)
    tries: list[bool] = []

    def handler(job: Job) -> bytes | None:
        if not tries:
            cut.set()
            until(lambda: job.lost, "lost the run")
            tries.append(job.lost)
            cut.clear()
            return b"done-by-the-lapsed-session"
        tries.append(job.lost)
        return b"done"

    worker = Worker(store, "node-a", handler, ttl=300, poll=50, sessions=True).start()
    try:
        until(lambda: worker.stats["done"] == 1, "finished the run under a new session")
    finally:
        worker.stop()
    assert tries == [True, False]
    assert store.get("run").record == b"done"
    assert store.sessions() == []


def test_without_sessions_each_run_keeps_a_lease_of_its_own() -> None:
    store = fake_store()
    store.insert("run", b"todo", Release())
    seen: list[Any] = []
    worker = Worker(store, "node-a", lambda job: seen.append(store.get(job.run)) or b"done",
                    ttl=600, poll=50, sessions=False).start()
    try:
        until(lambda: worker.stats["done"] == 1, "finished the run")
    finally:
        worker.stop()
    assert seen[0].session is None and seen[0].holder == Held("node-a", True)
    assert store.sessions() == []


@pytest.mark.parametrize("partitions", [1, 6])
def test_an_async_worker_holds_its_runs_under_one_session(partitions: int) -> None:
    async def main() -> None:
        store: AsyncRedisRunStore = fake_astore(partitions=partitions)
        await store.insert("run", b"todo", Release())
        seen: list[Any] = []

        async def handler(job: AsyncJob) -> bytes:
            seen.append(await store.get(job.run))
            await asyncio.sleep(0.05)
            return b"done"

        # A ttl of 3 s: the keeper's calls have a period (ttl / 3) each, and its first,
        # the session's opening in 6 partitions, loads the scripts (600 ms left 200 ms,
        # which fakeredis on a loaded machine once passed).
        worker = AsyncWorker(store, "node-a", handler, ttl=3_000, poll=50,
                             sessions=True).start()
        try:
            deadline = asyncio.get_running_loop().time() + PATIENCE
            while worker.stats["done"] < 1:
                assert asyncio.get_running_loop().time() < deadline, "never finished"
                await asyncio.sleep(0.01)
        finally:
            await worker.stop()
        assert seen[0].session is not None and seen[0].holder == Held("node-a", True)
        assert (await store.get("run")).record == b"done"
        assert await store.sessions() == []

    run_async(main)


# ------------------------------------------------ waking at an expiry, over partitions

#: A poll far past the test's patience: a worker that took the run only at its poll
#: would fail the test, one that slept until the claim's wait passes.
NEVER = 60_000


@pytest.mark.parametrize("held", ["lease", "session"])
@pytest.mark.parametrize("partitions", [1, 6])
def test_a_worker_wakes_at_an_expiry_not_at_its_poll(partitions: int, held: str) -> None:
    """A worker with nothing to claim waits until its claim's wait (the next expiry), on a
    store of partitions too: a dead node's lease or session is taken over at its expiry."""
    store = fake_store(partitions=partitions)
    store.insert("run", b"todo", Release())
    if held == "lease":
        assert store.claim_ready("dead-node", 300, 1) == ["run"]
    else:
        assert store.open_session("dead-node", 300).claim_ready(1) == ["run"]
    taken = threading.Event()

    def handler(job: Job) -> bytes:
        taken.set()
        return b"done"

    worker = Worker(store, "node-a", handler, ttl=5_000, poll=NEVER).start()
    try:
        assert taken.wait(PATIENCE), "the run was not taken at its expiry"
    finally:
        worker.stop()


@pytest.mark.parametrize("held", ["lease", "session"])
@pytest.mark.parametrize("partitions", [1, 6])
def test_an_async_worker_wakes_at_an_expiry_not_at_its_poll(partitions: int,
                                                            held: str) -> None:
    async def main() -> None:
        store = fake_astore(partitions=partitions)
        await store.insert("run", b"todo", Release())
        if held == "lease":
            assert await store.claim_ready("dead-node", 300, 1) == ["run"]
        else:
            session = await store.open_session("dead-node", 300)
            assert await session.claim_ready(1) == ["run"]
        taken = asyncio.Event()

        async def handler(job: AsyncJob) -> bytes:
            taken.set()
            return b"done"

        worker = AsyncWorker(store, "node-a", handler, ttl=5_000, poll=NEVER).start()
        try:
            await asyncio.wait_for(taken.wait(), PATIENCE)
        finally:
            await worker.stop()

    run_async(main)


# ---------------------------------------------------------------- a dead node's session

# A node holding its runs under one session, in a process of its own: it takes every ready
# run under the session, says so, then keeps the session alive (ttl / 3) until it is killed.
SESSION_HOLDER = r"""
import sys, time
import redis
from redisstore import At, RedisRunStore

port, namespace, n, ttl = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = RedisRunStore(redis.Redis(host="127.0.0.1", port=port), namespace=namespace,
                      discover=lambda record: None if record.startswith(b"done") else At(0))
session = store.open_session("dead-node", ttl)
held = []
while len(held) < n:
    got = session.claim_ready(100)
    assert got, len(held)
    held += got
session.keepalive()
print("held", session.id, flush=True)
while True:
    time.sleep(ttl / 3000)
    session.keepalive()
"""


@pytest.mark.server
@pytest.mark.serial
@pytest.mark.slow
def test_a_killed_nodes_session_runs_are_taken_over_and_finished_once(
        redis7: Server) -> None:
    """A dead node's takeover (docs/design/sessions.md, "Budgets"), at 300 runs
    (benchmarks/bench_takeover.py measures 10k): a node holding every run under one session
    is SIGKILLed while three Workers on sessions run.
    The session expires at most TTL after the kill; from TTL + 100 ms on (the server's
    clock) no run reads live for the dead node: every one is claimable, taken or done; the
    Workers finish each run exactly once, and the dead session is gone once its last run
    left it. No bound on how fast they drain (the benchmark's figure)."""
    n, ttl, margin = 300, 1_000, 100
    client = redis7.client()
    namespace = unique_namespace()
    store = RedisRunStore(client, namespace=namespace, discover=ready)
    runs = [f"run-{i:03d}" for i in range(n)]
    with store.pipeline() as pipe:
        for run in runs:
            pipe.insert(run, b"todo", Release())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    holder = subprocess.Popen(
        [sys.executable, "-c", SESSION_HOLDER, str(redis7.port), namespace, str(n), str(ttl)],
        stdout=subprocess.PIPE, env=env)
    assert holder.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    out = holder.stdout
    threading.Thread(target=lambda: [lines.put(line.decode().strip()) for line in out],
                     daemon=True).start()
    handed: list[str] = []
    workers: list[Worker] = []
    try:
        held = lines.get(timeout=30)
        assert held.startswith("held "), held
        dead = held.split()[1]

        def handler_of(owner: str) -> Any:
            def handler(job: Job) -> bytes:
                handed.append(job.run)
                return f"done-by-{owner}".encode()
            return handler

        for k in range(3):
            workers.append(Worker(RedisRunStore(redis7.client(), namespace=namespace,
                                                discover=ready),
                                  f"node-{k}", handler_of(f"node-{k}"), ttl=ttl, poll=100,
                                  sessions=True).start())
        time.sleep(0.2)
        assert handed == [], "a Worker took a run of the live session"
        holder.kill()  # SIGKILL: no close, no last keepalive
        holder.wait(10)
        killed = store.now()
        (info,) = [s for s in store.sessions() if s.id == dead]
        assert info.owner == "dead-node" and info.expires <= killed + ttl
        while store.now() < killed + ttl + margin:
            time.sleep(0.005)
        for start in range(0, n, 150):
            for run, current in store.get_many(runs[start:start + 150]).items():
                assert current.holder != Held("dead-node", True), (
                    f"{run} still live for the dead node {ttl + margin} ms after the kill")
        until(lambda: sum(w.stats["done"] for w in workers) >= n, "finished every run",
              patience=120)
    finally:
        holder.kill()
        holder.wait(10)
        for worker in workers:
            worker.stop()
    try:
        assert sorted(handed) == runs, "a run handed to two handlers, or to none"
        assert sum(w.stats["done"] for w in workers) == n
        assert not any(w.stats[k] for w in workers for k in ("failed", "lost", "unknown"))
        for start in range(0, n, 150):
            got = store.get_many(runs[start:start + 150])
            assert len(got) == len(runs[start:start + 150])
            assert all(c.record.startswith(b"done-by-node-") for c in got.values())
        assert store.sessions() == []  # the dead one went with its last run
    finally:
        drop_namespace(client, namespace)


def test_a_partition_that_lapsed_costs_the_worker_its_runs_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a store of partitions, the keepalives of one partition cut off past the ttl (its
    node away): the session lapses there alone. The run held there is lost to its handler
    (nothing of it lands); the run of another partition is finished under the old session,
    which the keeper keeps alive meanwhile; the worker opens a new session, whose claim
    takes the lost run over and finishes it."""
    store = fake_store(partitions=6)
    away = partition_of("x", 6)
    other = next(r for r in (f"y{i}" for i in range(100)) if partition_of(r, 6) != away)
    for run in ("x", other):
        store.insert(run, b"todo", Release())
    cut, go = threading.Event(), threading.Event()
    real = RunOps.session_keepalive

    def keepalive(self: RunOps, session: str, owner: str) -> Any:
        if cut.is_set() and self.keys.partition == away:
            yield from ask(Call(None, (self.keys.meta,), ("EXISTS", self.keys.meta),
                                lambda r: r, write=False))
            raise Unavailable("keepalives cut off (the test's fault)", outcome="not_applied")
        return (yield from real(self, session, owner))

    monkeypatch.setattr(RunOps, "session_keepalive", keepalive)
    tries: dict[str, list[bool]] = {"x": [], other: []}
    sessions: dict[str, list[str | None]] = {"x": [], other: []}

    def handler(job: Job) -> bytes:
        sessions[job.run].append(store.get(job.run).session)
        if not tries["x"] and job.run == "x":
            cut.set()
            until(lambda: job.lost, "lost the run of the partition cut off")
            cut.clear()
            go.set()
        elif not tries[other] and job.run == other:
            assert go.wait(PATIENCE)
            # Past a few ttls after the new session opened: the old one is kept alive
            # for this job (else it would lapse and the job be lost).
            time.sleep(3 * 0.3)
        tries[job.run].append(job.lost)
        return b"done"

    worker = Worker(store, "node-a", handler, ttl=300, concurrency=2, poll=50,
                    sessions=True).start()
    try:
        until(lambda: worker.stats["done"] == 2, "finished both runs")
    finally:
        worker.stop()
    assert tries == {"x": [True, False], other: [False]}
    assert worker.stats["lost"] == 1
    first, second = sessions["x"]
    assert sessions[other] == [first] and second not in (None, first)
    assert [store.get(run).record for run in ("x", other)] == [b"done", b"done"]
    until(lambda: store.sessions() == [], "ended both sessions")
