"""``AsyncRedisRepository``: the instance repository on ``redis.asyncio`` (or fakeredis)."""

from __future__ import annotations

from ..core.partitioned_repository import PartitionedRepositoryOps, repository_ops
from ..core.repository_ops import RepositoryOps
from .aio import AsyncTransport, _Closes
from .repo_aio_ops import AsyncRepositoryStoreOps
from .shell import RepositoryShell


# The shell first: its _send and _settings are the primitives the generated mixin declares.
class AsyncRedisRepository(_Closes,
                           RepositoryShell[RepositoryOps | PartitionedRepositoryOps,
                                           AsyncTransport],
                           AsyncRepositoryStoreOps):
    """The instance repository on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRepository`, with the same options, methods (``async def``),
    errors and semantics. A cancelled ``save`` or ``delete`` is of unknown outcome: load
    the record to find out."""

    #: Its operations (the mixin types them by the generated ``RepositoryCalls``).
    _ops: RepositoryOps | PartitionedRepositoryOps
    _transport = AsyncTransport
    _repository_ops = staticmethod(repository_ops)
