"""The Worker on sessions (the default, docs/worker.md): its runs are held under one session
of its own, kept alive by one keepalive a period whatever their number; a run taken from
the session is lost to its handler; a session that lapsed is replaced; stop closes it.
With ``sessions=False``, a lease per run."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from test_worker_promises import PATIENCE, fake_astore, fake_store, ready, run_async, until

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
)


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


def test_a_run_taken_from_its_session_is_lost_to_its_handler() -> None:
    store = fake_store()
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


def test_an_async_worker_holds_its_runs_under_one_session() -> None:
    async def main() -> None:
        store: AsyncRedisRunStore = fake_astore()
        await store.insert("run", b"todo", Release())
        seen: list[Any] = []

        async def handler(job: AsyncJob) -> bytes:
            seen.append(await store.get(job.run))
            await asyncio.sleep(0.05)
            return b"done"

        worker = AsyncWorker(store, "node-a", handler, ttl=600, poll=50,
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
