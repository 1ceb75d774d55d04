"""The run store conformance suite on every backend: memory, fakeredis, Redis 7.0, Redis 6.2
(also with ``lua-replicate-commands no``), Valkey 8.1 and the machine's own Redis at
127.0.0.1:6379 (in throwaway namespaces)."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest
import redis
from conftest import Clock, RedisSuite
from servers import Server

from redisstore import MemoryRunStore, RedisRunStore, RunStore
from redisstore.conformance import RunStoreConformance
from redisstore.feed import Feed
from redisstore.runs import Discover


class TestMemoryRunStore(RunStoreConformance):
    clock_is_controlled = True

    @pytest.fixture(autouse=True)
    def _clock(self, clock: Clock) -> None:
        self.clock = clock

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        return MemoryRunStore(clock=self.clock, discover=discover)

    def make_feed_store(self, feed: Feed, *, discover: Discover | None = None) -> RunStore:
        return MemoryRunStore(clock=self.clock, discover=discover, feed=feed)

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        assert isinstance(store, MemoryRunStore)
        return store.sharing(discover=discover, projection_version=projection_version)

    def advance(self, store: RunStore, ms: int) -> None:
        self.clock.advance(ms)


class TestFakeRedisRunStore(RedisSuite):
    clock_is_controlled = True

    @pytest.fixture(autouse=True)
    def _backend(self, fake_clock: Clock) -> None:
        self.clock = fake_clock
        self.client = fakeredis.FakeRedis()

    def advance(self, store: RunStore, ms: int) -> None:
        self.clock.advance(ms)


class TestFakeRedisRunStorePartitioned(TestFakeRedisRunStore):
    """One logical store over 6 partitions (hash tags) of one server."""

    partitions = 6


@pytest.mark.server
class TestRedis7RunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, redis7: Server) -> None:
        self.client = redis7.client()


@pytest.mark.server
class TestRedis62RunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, redis62: Server) -> None:
        self.client = redis62.client()


@pytest.mark.server
class TestRedis62NoReplicateRunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, redis62_noreplicate: Server) -> None:
        self.client = redis62_noreplicate.client()


@pytest.mark.server
class TestValkey8RunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, valkey8: Server) -> None:
        self.client = valkey8.client()


@pytest.mark.server
class TestSharedRedisRunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, shared_redis: redis.Redis, namespaces: list[str]) -> Iterator[None]:
        self.client = shared_redis
        self.namespaces = namespaces
        self.stores: list[RedisRunStore] = []
        yield
        # Before the namespaces are dropped: a store's waker relays a due time it was told
        # of to the server as a token when no claim of its own waits for it, which would
        # leave a wake key behind in a dropped namespace of someone else's server.
        for store in self.stores:
            store.close()

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        store = super().make_store(discover=discover)
        assert isinstance(store, RedisRunStore)
        self.namespaces.append(store.namespace)
        self.stores.append(store)
        return store

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        again = super().reopen(store, discover=discover, projection_version=projection_version)
        assert isinstance(again, RedisRunStore)
        self.stores.append(again)
        return again


@pytest.mark.server
class TestRedis7RunStorePartitioned(TestRedis7RunStore):
    partitions = 6

