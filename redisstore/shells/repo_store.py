"""``RedisRepository``: the instance repository on Redis, Valkey or fakeredis (sync)."""

from __future__ import annotations

from ..core.partitioned_repository import PartitionedRepositoryOps, repository_ops
from ..core.repository_ops import RepositoryOps
from .repo_store_ops import RepositoryStoreOps
from .shell import RepositoryShell
from .sync import Transport, _Closes


# The shell first: its _send and _settings are the primitives the generated mixin declares.
class RedisRepository(_Closes,
                      RepositoryShell[RepositoryOps | PartitionedRepositoryOps, Transport],
                      RepositoryStoreOps):
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
    _transport = Transport
    _repository_ops = staticmethod(repository_ops)
