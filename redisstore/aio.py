"""The asyncio I/O shell: ``AsyncRedisRunStore`` and ``AsyncRedisRepository`` over
``redis.asyncio`` (or ``fakeredis.FakeAsyncRedis``).

Only I/O lives here. Every operation, what it sends and what each reply means, is the same
sans-I/O generator the sync stores drive (:mod:`redisstore.protocol`,
:mod:`redisstore.repository`); this module awaits the round trips it asks for. The rules of
the sync shell hold (see :mod:`redisstore.transport`): a write is sent exactly once on one
pooled connection, bypassing the client's retry; reads go through the client; NOSCRIPT
loads the script and sends again; the durability confirmation is pipelined behind the write.

Cancellation: a task cancelled while its write is in flight drops that connection (it may
still receive the write's reply, which would answer the next command) and re-raises
``CancelledError``. The write is then of unknown outcome, exactly like an ``Unavailable``
write: one script is atomic, so it was applied entirely or not at all, and
:func:`redisstore.aconfirm_write` tells which. See docs/async.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

try:
    from hiredis import pack_command
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    pack_command = None  # type: ignore[assignment]

from redis.exceptions import RedisError, ResponseError

from .protocol import UNDECODED, Batch, Conversation, Durability, Operation, Outcome, RunOps, Shell
from .repository import InstanceRecord, Logger, RepositoryOps
from .runs import Current, Discover, Lease

T = TypeVar("T")


class AsyncTransport:
    """Runs operations on a ``redis.asyncio.Redis`` client (or ``FakeAsyncRedis``).

    Writes always take their own connection from the client's pool, even on a
    ``single_connection_client``: concurrent tasks must never interleave on one connection.
    Cluster clients (``redis.asyncio.RedisCluster``) are not supported yet.
    """

    def __init__(self, client: Any, durability: Durability | None = None) -> None:
        if not hasattr(client, "connection_pool"):
            raise TypeError("AsyncTransport needs a redis.asyncio.Redis client (with a "
                            f"connection pool), not {type(client).__name__}")
        self.client = client
        self.durability = durability

    async def drive(self, op: Operation[T]) -> T:
        """Run an operation to its end: send each batch it makes, hand back what came back."""
        conversation = Conversation(op, self.durability)
        for batch in conversation:
            conversation.reply(await self._send(batch))
        return conversation.result

    async def _send(self, batch: Batch) -> Outcome:
        cancels = _Cancels()
        try:
            if batch.write:
                return await _send_once(self.client.connection_pool, batch.commands, cancels)
            replies = [await self.client.execute_command(*command, **UNDECODED)
                       for command in batch.commands]
            cancels.deliver()
            return replies
        except (RedisError, OSError) as exc:
            return exc


class _Cancels:
    """Delivers a cancellation that redis-py swallowed.

    With a ``socket_timeout``, redis-py sends through ``asyncio.wait_for``, which on Python
    3.11 returns the inner result when a cancel arrives as the send completes (CPython
    gh-86296; 3.12 rewrote ``wait_for``): the cancel is lost, and a caller's
    ``asyncio.timeout`` would wait for the whole round trip. ``Task.cancelling()`` still
    counts that cancel, so it can be raised where it would have landed.
    """

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.before = self.task.cancelling() if self.task is not None else 0

    def deliver(self) -> None:
        """Raise CancelledError if the task was cancelled since this object was made."""
        if self.task is not None and self.task.cancelling() > self.before:
            raise asyncio.CancelledError


async def _send_once(pool: Any, commands: tuple[tuple[Any, ...], ...],
                     cancels: _Cancels) -> list[Any]:
    """Send commands exactly once, pipelined on one pooled connection, bypassing the
    client's retry; every reply is read (error replies as exception values)."""
    conn = await pool.get_connection()
    try:
        cancels.deliver()  # before anything is sent: the write is surely not applied
        await conn.send_packed_command(_pack(conn, commands))
        cancels.deliver()  # sent: from here on a cancel leaves the outcome unknown
        return [await _reply_or_error(conn) for _ in commands]
    except BaseException:
        # Cancelled, timed out or cut: the connection may still receive this write's reply,
        # which would answer the next command sent on it. Close it (without waiting, we may
        # be cancelled); the pool reconnects it on next use.
        await conn.disconnect(nowait=True)
        raise
    finally:
        await pool.release(conn)


def _pack(conn: Any, commands: tuple[tuple[Any, ...], ...]) -> Any:
    # redis.asyncio packs commands in pure Python (about a quarter of a write's CPU time with
    # 64 tasks); hiredis, a dependency of ours, does the same in C.
    if pack_command is None:
        return conn.pack_commands(commands)
    return b"".join(pack_command(command) for command in commands)


async def _reply_or_error(conn: Any) -> Any:
    try:
        return await conn.read_response(disable_decoding=True)
    except ResponseError as exc:
        return exc


class AsyncRedisRunStore(Shell[RunOps]):
    """The leased run backend (SPEC §1) on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRunStore`, with the same options, methods (``async def``),
    errors and semantics. A cancelled write is of unknown outcome (see the module)."""

    def __init__(self, client: Any, *, namespace: str = "redisstore",
                 discover: Discover | None = None, projection_version: int = 1,
                 durability: Durability | None = None) -> None:
        self._ops = RunOps(namespace, discover, projection_version)
        self._io = AsyncTransport(client, durability)

    async def now(self) -> int:
        """See :meth:`redisstore.RedisRunStore.now`."""
        return await self._io.drive(self._ops.now())

    async def get(self, run: str) -> Current:
        """See :meth:`redisstore.RedisRunStore.get`."""
        return await self._io.drive(self._ops.get(run))

    async def insert(self, run: str, record: bytes, lease: Lease) -> None:
        """See :meth:`redisstore.RedisRunStore.insert`."""
        await self._io.drive(self._ops.insert(run, record, lease))

    async def compare_and_set(self, run: str, expected: int, record: bytes,
                              lease: Lease) -> None:
        """See :meth:`redisstore.RedisRunStore.compare_and_set`."""
        await self._io.drive(self._ops.compare_and_set(run, expected, record, lease))

    async def renew(self, owner: str, runs: Iterable[str], ttl: int) -> list[str]:
        """See :meth:`redisstore.RedisRunStore.renew`."""
        return await self._io.drive(self._ops.renew(owner, runs, ttl))

    async def claim_expired(self, owner: str, ttl: int, limit: int) -> list[str]:
        """See :meth:`redisstore.RedisRunStore.claim_expired`."""
        return await self._io.drive(self._ops.claim_expired(owner, ttl, limit))

    async def claim_ready(self, owner: str, ttl: int, limit: int) -> list[str]:
        """See :meth:`redisstore.RedisRunStore.claim_ready`."""
        return await self._io.drive(self._ops.claim_ready(owner, ttl, limit))

    async def refresh(self, run: str) -> bool:
        """See :meth:`redisstore.RedisRunStore.refresh`."""
        return await self._io.drive(self._ops.refresh(run))


class AsyncRedisRepository(Shell[RepositoryOps]):
    """The instance repository (SPEC §2) on a ``redis.asyncio`` client: the asyncio twin of
    :class:`redisstore.RedisRepository`, with the same options, methods (``async def``),
    errors and semantics. A cancelled ``save`` or ``delete`` is of unknown outcome: load
    the record to find out."""

    def __init__(self, client: Any, *, namespace: str = "redisstore", max_terminal: int = 1024,
                 logger: Logger | None = None, durability: Durability | None = None) -> None:
        self._ops = RepositoryOps(namespace, max_terminal, logger)
        self._io = AsyncTransport(client, durability)

    async def save(self, rec: InstanceRecord) -> int:
        """See :meth:`redisstore.RedisRepository.save`."""
        return await self._io.drive(self._ops.save(rec))

    async def load(self, id: str) -> InstanceRecord | None:
        """See :meth:`redisstore.RedisRepository.load`."""
        return await self._io.drive(self._ops.load(id))

    async def delete(self, id: str) -> None:
        """See :meth:`redisstore.RedisRepository.delete`."""
        await self._io.drive(self._ops.delete(id))

    async def list_in_flight(self, group: str, now: datetime | None = None) -> list[str]:
        """See :meth:`redisstore.RedisRepository.list_in_flight`."""
        return await self._io.drive(self._ops.list_in_flight(group, now))

    async def register_group(self, group: str) -> None:
        """See :meth:`redisstore.RedisRepository.register_group`."""
        await self._io.drive(self._ops.register_group(group))

    async def group_exists(self, group: str) -> bool:
        """See :meth:`redisstore.RedisRepository.group_exists`."""
        return await self._io.drive(self._ops.group_exists(group))

    async def migrate(self) -> None:
        """See :meth:`redisstore.RedisRepository.migrate`."""
        await self._io.drive(self._ops.migrate())

    async def cluster_compatibility(self) -> tuple[bool, str]:
        """See :meth:`redisstore.RedisRepository.cluster_compatibility`."""
        return self._ops.cluster_compatibility()
