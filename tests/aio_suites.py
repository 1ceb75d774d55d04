"""The asyncio stores driven from the sync conformance suites: an event loop in a thread
(``LoopThread``, the ``loop_thread`` fixture), ``Synced`` (an async object called as a
sync one), and the suites on them (``AsyncRunSuite``, ``AsyncRepositorySuite``), which
tests/conformance/test_conformance_async.py runs on every backend and other tests reuse."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar, cast

import pytest
from servers import SUITE_TIMEOUT, FeedOnNextStore, unique_namespace

from redisstore import (
    AsyncJob,
    AsyncRedisRepository,
    AsyncRedisRunStore,
    AsyncSession,
    AsyncWorker,
    Job,
    Repository,
    Retry,
    RunStore,
)
from redisstore.conformance import RepositoryConformance, RunStoreConformance
from redisstore.conformance.working import NODE, TTL, Running
from redisstore.runs import Discover

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="async-stores",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or exception) in this thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Synced:
    """A sync view of an async store: coroutine methods run on the loop; the rest (such as
    ``namespace``) passes through. Threads may call it concurrently, as the suites do."""

    def __init__(self, store: Any, loop: LoopThread) -> None:
        self.store = store
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.store, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute
        method = cast(Callable[..., Awaitable[Any]], attribute)

        def call(*args: Any, **kwargs: Any) -> Any:
            got = self._loop.run(_awaited(method(*args, **kwargs)))
            return SyncedSession(got, self._loop) if isinstance(got, AsyncSession) else got

        return call


class SyncedSession(Synced):
    """A sync view of an ``AsyncSession`` (``with`` closes it, as ``Session``'s does)."""

    def __enter__(self) -> SyncedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


class AsyncBackend:
    """Makes one async client per test on the loop thread, closes it afterwards."""

    loop: LoopThread
    client: Any

    def connect(self, loop: LoopThread, make: Callable[[], Any]) -> Iterator[None]:
        self.loop = loop

        async def create() -> Any:  # clients are made on the loop that will use them
            return make()

        self.client = loop.run(create())
        yield
        loop.run(self.client.aclose())


# ---------------------------------------------------------------------------- run store


class AsyncRunSuite(FeedOnNextStore, RunStoreConformance, AsyncBackend):
    #: The store's partitions (one logical store over that many hash tags).
    partitions = 1

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        store = AsyncRedisRunStore(self.client, namespace=unique_namespace(), discover=discover,
                                   partitions=self.partitions, feed=self.feed,
                                   timeout=SUITE_TIMEOUT)
        synced = Synced(store, self.loop)
        synced.migrate()  # the newest layout, as README's start-up does
        return cast(RunStore, synced)

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        assert isinstance(store, Synced)
        other = AsyncRedisRunStore(self.client, namespace=store.namespace, discover=discover,
                                   projection_version=projection_version,
                                   partitions=self.partitions, timeout=SUITE_TIMEOUT)
        return cast(RunStore, Synced(other, self.loop))


    def start_worker(self, store: RunStore, handler: Callable[[Job], bytes | None], *,
                     concurrency: int = 1, max_takeovers: int | None = None,
                     retry: Retry | None = None) -> Running:
        """An ``AsyncWorker`` on the loop thread, whose async handler runs the rule's sync
        one in a thread, with a sync view of its job."""
        assert isinstance(store, Synced)
        loop = self.loop

        async def run(job: AsyncJob) -> bytes | None:
            return await asyncio.to_thread(handler, cast(Job, SyncedJob(job, loop)))

        async def start() -> AsyncWorker:
            return AsyncWorker(store.store, NODE, run, ttl=TTL, concurrency=concurrency,
                               max_takeovers=max_takeovers, poll=100, retry=retry).start()

        return StartedAsync(loop.run(start()), loop)


class SyncedJob:
    """A sync view of an :class:`AsyncJob`, for a rule's handler in a thread."""

    def __init__(self, job: AsyncJob, loop: LoopThread) -> None:
        self._job, self._loop = job, loop
        self.run = job.run

    @property
    def current(self) -> Any:
        return self._job.current

    @property
    def lost(self) -> bool:
        return self._job.lost

    @property
    def stopping(self) -> bool:
        return self._job.stopping

    def write(self, record: bytes) -> None:
        self._loop.run(self._job.write(record))


class StartedAsync:
    """A started ``AsyncWorker``, stopped from the rule's thread."""

    def __init__(self, worker: AsyncWorker, loop: LoopThread) -> None:
        self.worker, self._loop = worker, loop
        self.stats = worker.stats

    def stop(self) -> None:
        self._loop.run(self.worker.stop())


class AsyncRepositorySuite(RepositoryConformance, AsyncBackend):
    #: The repository's partitions (one logical repository over that many hash tags).
    partitions = 1

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        repo = AsyncRedisRepository(self.client, namespace=unique_namespace(),
                                    max_terminal=max_terminal, logger=logger,
                                    partitions=self.partitions, timeout=SUITE_TIMEOUT)
        return cast(Repository, Synced(repo, self.loop))
