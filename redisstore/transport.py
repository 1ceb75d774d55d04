"""The sync I/O shell: sends a :class:`~redisstore.protocol.Call` and drives operations.

Writes bypass redis-py's command retry. That retry re-sends a command after a lost reply,
and a script that committed would run twice (redis/redis-py#3554): a CAS that succeeded
would come back as a Conflict, a claim would be taken twice. So a write takes a connection
from the pool, sends once, reads once; any failure other than an error reply drops the
connection and surfaces as Unavailable. The one replay is after NOSCRIPT, when nothing ran.
Reads (no data changed) go through the client and its retry policy.
"""

from __future__ import annotations

from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError, ResponseError

from .errors import StoreError, unavailable
from .protocol import Call, Durability, Operation

T = TypeVar("T")

# Replies come undecoded whatever the client's decode_responses says: records are bytes.
_RAW = {"NEVER_DECODE": True}


class Transport:
    """Runs calls on a ``redis.Redis`` (or fakeredis, or ``RedisCluster``) client."""

    def __init__(self, client: Any, durability: Durability | None = None) -> None:
        self.client = client
        self.durability = durability

    def drive(self, op: Operation[T]) -> T:
        """Run an operation to its end, feeding each call's reply (or error) back into it."""
        value: Any = None
        error: StoreError | None = None
        while True:
            try:
                call = op.throw(error) if error is not None else op.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                value, error = self.run(call), None
            except StoreError as exc:
                value, error = None, exc

    def run(self, call: Call[T]) -> T:
        """One call: EVALSHA, loading the script after a NOSCRIPT; errors become StoreErrors."""
        try:
            try:
                reply = self._send(call)
            except NoScriptError:
                assert call.script is not None
                self.client.execute_command("SCRIPT", "LOAD", call.script.source)
                reply = self._send(call)
        except ResponseError as exc:
            raise unavailable(exc, write=call.write) from exc
        except (RedisError, OSError) as exc:
            raise unavailable(exc, write=call.write) from exc
        return call.parse(reply)

    def _send(self, call: Call[Any]) -> Any:
        command = call.command()
        if not call.write:
            return self.client.execute_command(*command, **_RAW)
        client = self.client
        if hasattr(client, "get_node_from_key"):
            # RedisCluster: every key of a namespace is in one slot; talk to its node.
            client = client.get_redis_connection(
                client.get_node_from_key(call.keys[0] if call.keys else ""))
        if self.durability is None:
            return _send_once(client, command)
        reply, confirmation = _send_once(client, command, self.durability.command())
        if isinstance(reply, ResponseError):
            raise reply
        self.durability.check(confirmation)
        return reply


def _send_once(client: Any, command: tuple[Any, ...], then: tuple[Any, ...] = ()) -> Any:
    """Send a command exactly once on one connection, bypassing the client's retry.

    With ``then``, that command is pipelined right behind it and both replies are returned
    (error replies as exception values, so the second reply is always read).
    """
    pool = client.connection_pool
    shared = client.connection  # a single_connection_client keeps one connection
    conn = shared or pool.get_connection()
    try:
        if not then:
            conn.send_command(*command)
            return conn.read_response(disable_decoding=True)
        conn.send_packed_command(conn.pack_commands([command, then]))
        first = _reply_or_error(conn)
        return first, _reply_or_error(conn)
    except ResponseError:
        raise
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
