"""``RedisRepository``: the instance repository on Redis, Valkey or fakeredis (sync)."""

from __future__ import annotations

from typing import Any, TypeVar

from ..core.driver import Durability, Operation, Spread, check_io
from ..core.partitioned_repository import PartitionedRepositoryOps, repository_ops
from ..core.repository import Logger
from ..core.repository_ops import RepositoryOps
from .repo_store_ops import RepositoryStoreOps
from .shell import Shell
from .sync import Transport, _Closes

T = TypeVar("T")


class RedisRepository(_Closes, RepositoryStoreOps, Shell[RepositoryOps | PartitionedRepositoryOps]):
    """The instance repository on a ``redis.Redis``-compatible client.

    Every method is one server-side Lua script, one round trip. ``save`` is a
    compare-and-set on ``rec_version`` that keeps, in the same atomic step, the indexes
    right: a per-group sorted set of claimable in-flight records scored by lease expiry
    (``list_in_flight`` is a range query), the terminal records in the order they became
    terminal (capped at ``max_terminal``, oldest evicted first, a warning to ``logger``),
    and the group registry. ``namespace`` isolates repositories sharing a server; all of
    its keys share the hash tag ``{namespace}``.

    ``partitions=N`` (1 to 256) spreads one logical repository over N hash tags
    ``{namespace#p}`` (docs/scale-out.md): a record's calls go to its id's partition, one
    round trip; ``register_group``, ``group_exists`` and the listings span every partition;
    ``max_terminal`` holds in each partition. The count is recorded in the namespace (apart
    from its run store's); another is refused (``Misconfigured``).

    Failures that are not an answer of the contract raise ``Unavailable``; a ``save`` or
    ``delete`` whose reply was lost is never re-sent (load the record to find out).
    """

    #: Its operations (the mixin types them by the generated ``RepositoryCalls``).
    _ops: RepositoryOps | PartitionedRepositoryOps

    def __init__(self, client: Any, *, namespace: str = "redisstore", max_terminal: int = 1024,
                 logger: Logger | None = None, durability: Durability | None = None,
                 timeout: int = 5000, partitions: int = 1) -> None:
        self._ops = repository_ops(namespace, max_terminal, logger, partitions)
        self._io = Transport(client, *check_io(durability, timeout))

    # The primitives of the methods (RepositoryStoreOps, generated from the core:
    # redisstore/shells/repo_store_ops.py).

    def _send(self, op: Operation[T] | Spread[T]) -> T:
        return self._io.drive(op)

    def _settings(self) -> bool:
        return not self._io.fake
