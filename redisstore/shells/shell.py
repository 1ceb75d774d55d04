"""``Shell``, the base of the store classes; ``RunShell``, what the sync and asyncio run
stores share, and ``RepositoryShell``, what the two repositories share: written once for
both."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ..core.driver import Durability, Operation, Spread, check_io
from ..core.feed import Feed
from ..core.keys import Keyspace
from ..core.partition_ops import PartitionOps
from ..core.repository import Logger
from ..core.runops import RunOps
from ..core.runs import MAX_RECORD, Discover
from .wakeups import Wakeups


class _Ops(Protocol):
    keys: Keyspace


OpsT = TypeVar("OpsT", bound=_Ops)


class Shell(Generic[OpsT]):
    """Base of the store classes, sync and async: each holds its operations (``_ops``, a
    :class:`RunOps` or a ``RepositoryOps``) and a transport that sends them."""

    _ops: OpsT

    @property
    def namespace(self) -> str:
        """The namespace the store's keys live in (they share the hash tag ``{namespace}``)."""
        return self._ops.keys.namespace


class _Io(Protocol):
    checks: set[str]


IoT = TypeVar("IoT", bound=_Io)


class RunShell(Shell[RunOps | PartitionOps], Generic[IoT]):
    """What ``RedisRunStore`` and ``AsyncRedisRunStore`` share, one source for both: the
    options they are opened with, their operations (one partition's or a store of
    partitions'), their waker (made with the first blocked claim) and a run's partition.
    Each names the transport it sends on (``_transport``: ``Transport`` or
    ``AsyncTransport``); the sync store's docstring says what the options mean."""

    _ops: RunOps | PartitionOps
    _io: IoT
    _wake: Wakeups | None
    #: The store's transport class, made of the client, durability and timeout.
    _transport: Callable[[Any, Durability | None, int], IoT]
    #: What makes its operations (``core.partitions.run_ops``): named by each store, so
    #: this base stands below the partitions, on the ``PartitionOps`` they declare.
    _run_ops: Callable[..., RunOps | PartitionOps]

    def __init__(self, client: Any, *, namespace: str = "redisstore",
                 discover: Discover | None = None, projection_version: int = 1,
                 durability: Durability | None = None, timeout: int = 5000,
                 max_record_bytes: int = MAX_RECORD, partitions: int = 1,
                 feed: Feed | None = None) -> None:
        durability, timeout = check_io(durability, timeout)
        self._ops = self._run_ops(namespace, discover, projection_version,
                                  durability=durability, max_record_bytes=max_record_bytes,
                                  partitions=partitions)
        self._ops.set_feed(feed)
        self._io = self._transport(client, durability, timeout)
        self._ops.checks = self._io.checks
        self._wake = None
        # The sync store makes its waker under it (the asyncio one, on its loop's thread).
        self._wake_lock = threading.Lock()

    def _place(self, run: str) -> int:
        """The partition of ``run`` (0 in a store of one partition): a keeper leaves a failed
        partition's runs out of the rest of its round."""
        return self._ops.place(run) if isinstance(self._ops, PartitionOps) else 0


class _Drives(Protocol):
    fake: bool

    def drive(self, op: Any) -> Any: ...


DrivesT = TypeVar("DrivesT", bound=_Drives)
T = TypeVar("T")


class RepositoryShell(Shell[OpsT], Generic[OpsT, DrivesT]):
    """What ``RedisRepository`` and ``AsyncRedisRepository`` share, one source for both:
    the options they are opened with, and the primitives their generated methods hand an
    operation to (``_send``, ``_settings``). Each names the transport it sends on
    (``_transport``) and what makes its operations (``_repository_ops``: one partition's
    or a repository of partitions'); the sync repository's docstring says what the options
    mean."""

    _io: DrivesT
    #: The repository's transport class, made of the client, durability and timeout.
    _transport: Callable[[Any, Durability | None, int], DrivesT]
    #: What makes its operations (``core.partitioned_repository.repository_ops``).
    _repository_ops: Callable[..., OpsT]

    def __init__(self, client: Any, *, namespace: str = "redisstore", max_terminal: int = 1024,
                 logger: Logger | None = None, durability: Durability | None = None,
                 timeout: int = 5000, partitions: int = 1) -> None:
        self._ops = self._repository_ops(namespace, max_terminal, logger, partitions)
        self._io = self._transport(client, *check_io(durability, timeout))

    def _send(self, op: Operation[T] | Spread[T]) -> Any:
        """Send ``op``: its answer (the asyncio transport's: an awaitable of it, which the
        generated method awaits)."""
        return self._io.drive(op)

    def _settings(self) -> bool:
        """Whether ``migrate()`` checks the server's settings (fakeredis has none)."""
        return not self._io.fake
