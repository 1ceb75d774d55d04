"""The instance repository conformance suite on every backend: memory, fakeredis, Redis 7.0,
Redis 6.2 (also with ``lua-replicate-commands no``), Valkey 8.1 and the machine's own Redis at
127.0.0.1:6379 (in throwaway namespaces); on fakeredis and Redis 7.0 also as one logical
repository over 6 partitions."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
import redis
from servers import SUITE_TIMEOUT, Server, unique_namespace

from redisstore import MemoryRepository, RedisRepository, Repository
from redisstore.conformance import RepositoryConformance


class TestMemoryRepository(RepositoryConformance):
    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        return MemoryRepository(max_terminal=max_terminal, logger=logger)


class TestFakeRedisRepository(RepositoryConformance):
    #: The repository's partitions (one logical repository over that many hash tags).
    partitions = 1

    @pytest.fixture(autouse=True)
    def _backend(self) -> None:
        self.client = fakeredis.FakeRedis()

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        return RedisRepository(self.client, namespace=unique_namespace(),
                               max_terminal=max_terminal, logger=logger,
                               partitions=self.partitions, timeout=SUITE_TIMEOUT)


class TestFakeRedisRepositoryPartitioned(TestFakeRedisRepository):
    partitions = 6


@pytest.mark.server
class TestRedis7Repository(TestFakeRedisRepository):
    @pytest.fixture(autouse=True)
    def _backend(self, redis7: Server) -> None:  # type: ignore[override]
        self.client = redis7.client()


@pytest.mark.server
class TestRedis7RepositoryPartitioned(TestRedis7Repository):
    partitions = 6


@pytest.mark.server
class TestRedis62Repository(TestRedis7Repository):
    @pytest.fixture(autouse=True)
    def _backend(self, redis62: Server) -> None:  # type: ignore[override]
        self.client = redis62.client()


@pytest.mark.server
class TestRedis62NoReplicateRepository(TestRedis7Repository):
    @pytest.fixture(autouse=True)
    def _backend(self, redis62_noreplicate: Server) -> None:  # type: ignore[override]
        self.client = redis62_noreplicate.client()


@pytest.mark.server
class TestValkey8Repository(TestRedis7Repository):
    @pytest.fixture(autouse=True)
    def _backend(self, valkey8: Server) -> None:  # type: ignore[override]
        self.client = valkey8.client()


@pytest.mark.server
class TestSharedRedisRepository(RepositoryConformance):
    @pytest.fixture(autouse=True)
    def _backend(self, shared_redis: redis.Redis, namespaces: list[str]) -> None:
        self.client = shared_redis
        self.namespaces = namespaces

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        namespace = unique_namespace()
        self.namespaces.append(namespace)
        return RedisRepository(self.client, namespace=namespace,
                               max_terminal=max_terminal, logger=logger, timeout=SUITE_TIMEOUT)
