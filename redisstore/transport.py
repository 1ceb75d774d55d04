"""The sync I/O shell: sends the :class:`~redisstore.protocol.Batch` values of an operation.

Writes bypass redis-py's command retry. That retry re-sends a command after a lost reply,
and a script that committed would run twice (redis/redis-py#3554): a CAS that succeeded
would come back as a Conflict, a claim would be taken twice. So a write takes a connection
from the pool, sends once, reads once; any failure other than an error reply drops the
connection and surfaces as Unavailable. The one replay is after NOSCRIPT, when nothing ran.
Reads (no data changed) go through the client and its retry policy.

What to send and what a reply means is decided in :mod:`redisstore.protocol`, shared with
the asyncio shell (:mod:`redisstore.aio`); this module only moves bytes.
"""

from __future__ import annotations

from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError

from .errors import error_code
from .protocol import (
    UNDECODED,
    Batch,
    Call,
    Conversation,
    Durability,
    Operation,
    Outcome,
    single,
)

T = TypeVar("T")


class Transport:
    """Runs operations on a ``redis.Redis`` (or fakeredis, or ``RedisCluster``) client."""

    def __init__(self, client: Any, durability: Durability | None = None) -> None:
        self.client = client
        self.durability = durability

    def drive(self, op: Operation[T]) -> T:
        """Run an operation to its end: send each batch it makes, hand back what came back."""
        conversation = Conversation(op, self.durability)
        for batch in conversation:
            conversation.reply(self._send(batch))
        return conversation.result

    def run(self, call: Call[T]) -> T:
        """One call: EVALSHA, loading the script after a NOSCRIPT; errors become StoreErrors."""
        return self.drive(single(call))

    def _send(self, batch: Batch) -> Outcome:
        try:
            if not batch.write:
                return [self.client.execute_command(*command, **UNDECODED)
                        for command in batch.commands]
            cluster = self.client
            if not hasattr(cluster, "get_node_from_key"):
                return _send_once(cluster, batch.commands)
            # RedisCluster: every key of a namespace is in one slot; talk to its node.
            node = cluster.get_node_from_key(batch.keys[0] if batch.keys else "")
            replies = _send_once(cluster.get_redis_connection(node), batch.commands)
            if any(error_code(reply) in ("MOVED", "ASK") for reply in replies
                   if isinstance(reply, BaseException)):
                # The slot moved: nothing ran. Learn the new layout so the caller's next
                # call goes to the right node; this one is Unavailable (nothing applied).
                cluster.nodes_manager.initialize()
            return replies
        except (RedisError, OSError) as exc:
            return exc


def _send_once(client: Any, commands: tuple[tuple[Any, ...], ...]) -> list[Any]:
    """Send commands exactly once, pipelined on one connection, bypassing the client's retry.

    Returns every reply, error replies as exception values: each reply is read, so the
    connection goes back to the pool with nothing pending.
    """
    pool = client.connection_pool
    shared = client.connection  # a single_connection_client keeps one connection
    conn = shared or pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        return [_reply_or_error(conn) for _ in commands]
    except BaseException:
        # The connection may hold a late reply that would answer the next command.
        conn.disconnect()
        raise
    finally:
        if shared is None:
            pool.release(conn)


def _reply_or_error(conn: Any) -> Any:
    try:
        return conn.read_response(disable_decoding=True)
    except ResponseError as exc:
        return exc
