"""``AsyncRedisRepository``: the instance repository on ``redis.asyncio`` (or fakeredis)."""

from __future__ import annotations

from typing import Any, TypeVar

from ..core.driver import Durability, Operation, Spread, check_io
from ..core.partitioned_repository import PartitionedRepositoryOps, repository_ops
from ..core.repository import Logger
from ..core.repository_ops import RepositoryOps
from .aio import AsyncTransport, _Closes
from .repo_aio_ops import AsyncRepositoryStoreOps
from .shell import Shell

T = TypeVar("T")


class AsyncRedisRepository(_Closes, AsyncRepositoryStoreOps,
                           Shell[RepositoryOps | PartitionedRepositoryOps]):
    """The instance repository on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRepository`, with the same options, methods (``async def``),
    errors and semantics. A cancelled ``save`` or ``delete`` is of unknown outcome: load
    the record to find out."""

    #: Its operations (the mixin types them by the generated ``RepositoryCalls``).
    _ops: RepositoryOps | PartitionedRepositoryOps

    def __init__(self, client: Any, *, namespace: str = "redisstore", max_terminal: int = 1024,
                 logger: Logger | None = None, durability: Durability | None = None,
                 timeout: int = 5000, partitions: int = 1) -> None:
        self._ops = repository_ops(namespace, max_terminal, logger, partitions)
        self._io = AsyncTransport(client, *check_io(durability, timeout))

    # The primitives of the methods (AsyncRepositoryStoreOps, generated from the core:
    # redisstore/shells/repo_aio_ops.py).

    async def _send(self, op: Operation[T] | Spread[T]) -> T:
        return await self._io.drive(op)

    def _settings(self) -> bool:
        return not self._io.fake
