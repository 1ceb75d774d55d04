"""Both conformance suites on the asyncio stores: fakeredis (``FakeAsyncRedis``), Redis 7.0
and Valkey 8.1.

The rules are written once, as sync suites. A small adapter drives an async store from
them: an event loop runs in a background thread and each method call is one
``asyncio.run_coroutine_threadsafe(...).result()``. So no async memory reference is needed
(the memory references already pass the same suites directly)."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest
import redis.asyncio
from aio_suites import AsyncRepositorySuite, AsyncRunSuite, LoopThread
from conftest import Clock
from servers import Server

from redisstore import (
    RunStore,
)


class TestFakeRedisAsyncRunStore(AsyncRunSuite):
    clock_is_controlled = True

    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, fake_clock: Clock) -> Iterator[None]:
        self.clock = fake_clock
        yield from self.connect(loop_thread, fakeredis.FakeAsyncRedis)

    def advance(self, store: RunStore, ms: int) -> None:
        self.clock.advance(ms)

    def test_the_fake_clock_drives_the_async_fake(self) -> None:
        """The fake_clock fixture patches what fakeredis answers TIME with: the async fake too."""
        store = self.make_store()
        assert store.now() == self.clock.ms
        self.clock.advance(1234)
        assert store.now() == self.clock.ms


class TestFakeRedisAsyncRunStorePartitioned(TestFakeRedisAsyncRunStore):
    """One logical asyncio store over 6 partitions (hash tags) of one server: its sessions
    are fanned by the same core as the sync store's."""

    partitions = 6


@pytest.mark.server
class TestRedis7AsyncRunStore(AsyncRunSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, redis7: Server) -> Iterator[None]:
        yield from self.connect(
            loop_thread, lambda: redis.asyncio.Redis(host="127.0.0.1", port=redis7.port))


@pytest.mark.server
class TestValkey8AsyncRunStore(AsyncRunSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, valkey8: Server) -> Iterator[None]:
        yield from self.connect(
            loop_thread, lambda: redis.asyncio.Redis(host="127.0.0.1", port=valkey8.port))



# ---------------------------------------------------------------------------- repository


class TestFakeRedisAsyncRepository(AsyncRepositorySuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread) -> Iterator[None]:
        yield from self.connect(loop_thread, fakeredis.FakeAsyncRedis)


@pytest.mark.server
class TestRedis7AsyncRepository(AsyncRepositorySuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, redis7: Server) -> Iterator[None]:
        yield from self.connect(
            loop_thread, lambda: redis.asyncio.Redis(host="127.0.0.1", port=redis7.port))


@pytest.mark.server
class TestValkey8AsyncRepository(AsyncRepositorySuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, valkey8: Server) -> Iterator[None]:
        yield from self.connect(
            loop_thread, lambda: redis.asyncio.Redis(host="127.0.0.1", port=valkey8.port))
