"""What both I/O shells share: turning a client library's exceptions into the neutral values
of :mod:`redisstore.core.outcomes`, checking the client a store is given, and packing commands.

redis-py and valkey-py (a fork with the same shapes) are both served: exceptions are matched
by class name, never imported, so neither library is needed by the other's users.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ..core.driver import Batch, text
from ..core.outcomes import ErrorReply, Exchange, Lost, Reply, split_error
from ..core.waits import Refused

try:
    from hiredis import ReplyError as _ReplyError
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _ReplyError = _hiredis_pack = None  # type: ignore[assignment,misc]

T = TypeVar("T")

# Owners without a __dict__ (a pool class with __slots__): their state is kept here, by a
# weak key, and may live as long as the process if it refers back to its owner.
_SLOTTED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def attached(owner: Any, name: str, make: Callable[[], T]) -> T:
    """Our state ``name`` for ``owner`` (a client, a client's connection pool), made by
    ``make`` on first use and kept in the owner's own ``__dict__``: it lives as long as the
    owner and no longer. A module-level WeakKeyDictionary does not do that here: the state
    holds the owner's connection settings, which refer back to the owner (a cluster
    client's ``on_connect``, redis-py 8's maintenance handler), so such an entry kept every
    cluster client, with its pools and sockets, alive for good. Callers that share an
    owner across threads hold a lock around this."""
    try:
        state = vars(owner)
    except TypeError:
        state = _SLOTTED.setdefault(owner, {})
    found = state.get(name)
    if found is None:
        found = state[name] = make()
    return found  # type: ignore[no-any-return]


def attached_to(owner: Any, name: str) -> Any:
    """The state ``name`` of ``owner`` made by :func:`attached`, or None."""
    try:
        return vars(owner).get(name)
    except TypeError:
        return _SLOTTED.get(owner, {}).get(name)


# redis-py and valkey-py turn some codes into classes and strip the code from the message.
_CODES_BY_CLASS = {
    "ReadOnlyError": "READONLY", "BusyLoadingError": "LOADING", "OutOfMemoryError": "OOM",
    "ClusterDownError": "CLUSTERDOWN", "TryAgainError": "TRYAGAIN",
    "MasterDownError": "MASTERDOWN", "MovedError": "MOVED", "AskError": "ASK",
    "NoScriptError": "NOSCRIPT", "NoPermissionError": "NOPERM", "ExecAbortError": "EXECABORT",
}


def _classes(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def is_error_reply(exc: BaseException) -> bool:
    """Whether the exception is the client's rendering of an error reply (the server
    answered), not a failure of the link."""
    # redis-py derives LOADING's class from ConnectionError, yet it is the server's answer.
    return any(name == "ResponseError" or name in _CODES_BY_CLASS for name in _classes(exc))


def error_reply(exc: BaseException) -> ErrorReply:
    """An error reply exception as a neutral :class:`ErrorReply` with its code restored."""
    text = str(exc)
    for name in _classes(exc):
        code = _CODES_BY_CLASS.get(name)
        if code is not None:
            return ErrorReply(code, text)
    reply = split_error(text)
    # The clients strip the generic "ERR " prefix: an error reply without a code is ERR.
    return reply if reply.code else ErrorReply("ERR", text)


def describe(exc: BaseException) -> str:
    """A short reason for a failure of the link."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def no_node(exc: BaseException) -> Exchange:
    """A RedisCluster call that found no node for its slot: nothing was sent."""
    return Exchange((), Lost(False, f"no cluster node for the slot: {describe(exc)}"))


def relearn_after(got: Exchange, hops: int) -> bool:
    """Whether a cluster shell has the client learn its slot map again after a call that
    followed ``hops`` MOVED and ended with ``got``: the slot moved (followed or not, ASK
    too: nothing of those ran), or the node was lost (it may have failed and a replica taken
    its slots), so the next calls should go to the slot's node now."""
    return (hops > 0 or got.lost is not None
            or any(getattr(r, "code", "") in ("MOVED", "ASK") for r in got.replies))


#: How many times a call follows MOVED before it reports it (the slot moved twice).
MAX_REDIRECTS = 3

# The scripts' commands: the only ones a cluster node redirects (SCRIPT LOAD, WAIT, WAITAOF
# and CONFIG GET name no key, and the node runs them).
#: The commands a cluster shell sends with keys of one slot: the scripts, and a waker's
#: BZPOPMIN and ZADD (its wait, its give-back). A MOVED answer to any of them ran nothing.
_KEYED = (b"EVALSHA", b"EVAL", b"BZPOPMIN", b"ZADD")


def moved_to(batch: Batch, got: Exchange) -> tuple[str, int] | None:
    """The node a cluster shell sends ``batch`` to again, ``(host, port)``: when every
    script of the batch (or a waker's keyed command) was answered MOVED to one node. None
    of them ran (a node checks the slot before it runs a command), so sending the whole
    batch there runs each exactly once. A waker's BZPOPMIN blocked on a slot that moved is
    answered MOVED by the server's tick: it then waits on the new node at once.

    ASK is never followed: it means the slot is migrating and the keys a script named have
    gone to the importing node, but the namespace's other keys (its meta, its index
    buckets) may not have: a script run there behind ``ASKING`` would read them as absent
    and answer wrongly, or write keys the migration then collides with. Until the slot's
    migration ends (MOVED), such a call is not applied (docs/faults.md).
    """
    if got.lost is not None:
        return None
    found: set[tuple[str, int]] = set()
    for command, reply in zip(batch.commands, got.replies, strict=False):
        if command[0] not in _KEYED:
            continue
        if getattr(reply, "code", "") != "MOVED":
            return None
        host, _, port = str(getattr(reply, "message", "")).split(" ")[-1].rpartition(":")
        if not host or not port.isdigit():
            return None
        found.add((host, int(port)))
    return found.pop() if len(found) == 1 else None


def next_hop(client: Any, batch: Batch, got: Exchange, tried: set[str]) -> Any:
    """The node of the cluster ``client`` to send ``batch`` to next, after ``got``: the one
    every script was MOVED to (:func:`moved_to`), when the client knows it and it is not
    among the names ``tried`` (two nodes that each name the other are mid-way through a
    ``SETSLOT``: each is tried once); None to stop. Adds the node to ``tried``."""
    where = moved_to(batch, got)
    if where is None or len(tried) > MAX_REDIRECTS:
        return None
    try:
        node = client.get_node(host=where[0], port=where[1])
    except Exception:
        return None
    if node is None or node.name in tried:
        return None
    tried.add(node.name)
    return node


class Relearning:
    """The cluster clients learning their slot map again, and since when: one relearn at a
    time per client, and another once that one has run past the store's timeout (a relearn
    stuck on a frozen node, whose client has no socket timeout, must not keep the client on
    a dead map for good). Shared by the sync and asyncio shells."""

    def __init__(self) -> None:
        self._since: dict[int, tuple[float, object]] = {}
        self._lock = threading.Lock()

    def begin(self, client: Any, timeout: int) -> object | None:
        """A token for a relearn of ``client`` to start now, or None: one is under way and
        has run less than the store's ``timeout`` (ms, at least a second)."""
        now = time.monotonic()
        stale = max(timeout / 1000, 1.0)
        with self._lock:
            started = self._since.get(id(client))
            if started is not None and now - started[0] < stale:
                return None
            token = object()
            self._since[id(client)] = (now, token)
            return token

    def end(self, client: Any, token: object) -> None:
        """The relearn of ``token`` is over (a later one, started while it was stuck, stays)."""
        with self._lock:
            started = self._since.get(id(client))
            if started is not None and started[1] is token:
                del self._since[id(client)]


RELEARNING = Relearning()


def node_client(client: Any, node: Any) -> Any:
    """The client of one node of a sync cluster client (redis-py's ``get_redis_connection``,
    valkey-py's ``get_valkey_connection``)."""
    get = getattr(client, "get_redis_connection", None) or client.get_valkey_connection
    return get(node)


def pack(conn: Any, commands: tuple[tuple[bytes | int, ...], ...]) -> list[bytes]:
    """Commands as the bytes to send. hiredis packs in C (redis-py's asyncio client and
    valkey-py pack in pure Python, a quarter of a write's CPU with 64 tasks)."""
    if _hiredis_pack is None:  # pragma: no cover
        return conn.pack_commands(commands)
    return [b"".join(_hiredis_pack(command) for command in commands)]  # type: ignore[arg-type]


def never_evicts(client: object) -> bool:
    """Whether the client is fakeredis: its data lives in the process, with no
    ``maxmemory``, so nothing is evicted (and there is no policy to read: without this the
    store would warn that it cannot check one)."""
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    return getattr(cls, "__module__", "").startswith("fakeredis")


def check_client(client: object, *, asynchronous: bool) -> None:
    """Refuse what is not a client of the right kind, saying what to pass instead."""
    want = "redis.asyncio.Redis" if asynchronous else "redis.Redis"
    store = "AsyncRedisRunStore / AsyncRedisRepository" if asynchronous \
        else "RedisRunStore / RedisRepository"
    if isinstance(client, str | bytes):
        raise TypeError(f"{store} takes a client, not a URL: pass {want}.from_url(url)")
    if client is None:
        raise TypeError(f"{store} needs a client: pass a {want} (or a fakeredis client)")
    if hasattr(client, "nodes_manager") and hasattr(client, "get_node_from_key"):
        # A RedisCluster: its nodes' settings are read as it calls (the transports).
        made = getattr(client, "execute_command", None)
        want = "redis.asyncio.RedisCluster" if asynchronous else "redis.cluster.RedisCluster"
        kind = " cluster"
    else:
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            if hasattr(client, "connection_class") and hasattr(client, "connection_kwargs"):
                raise TypeError(f"{store} takes a client, not a connection pool: pass "
                                f"{want}(connection_pool=pool)")
            raise TypeError(f"{store} needs a {want} (or valkey, or fakeredis) client, not "
                            f"{type(client).__name__}")
        made = getattr(getattr(pool, "connection_class", None), "connect", None)
        if made is None or not hasattr(pool, "connection_kwargs"):
            raise TypeError(f"{store} needs a {want} client; its pool "
                            f"{type(pool).__name__} makes no connections it can use")
        kind = ""
    if inspect.iscoroutinefunction(made) != asynchronous:
        other = "RedisRunStore / RedisRepository" if asynchronous \
            else "AsyncRedisRunStore / AsyncRedisRepository"
        made_as = "an asyncio" if not asynchronous else "a sync"
        raise TypeError(f"{type(client).__name__} is {made_as}{kind} client: use {other} "
                        f"with it, or pass a {want}")

class Connections:
    """What the sync and asyncio pools share: the state of a store's connections to one
    server, made like the client pool's own (same class and settings), at most its
    ``max_connections`` open. The shells add only how a caller waits for one."""

    def __init__(self, source: Any, no_retry: Any, checks: set[str] | None = None) -> None:
        self._cls = source.connection_class
        self._kwargs = dict(source.connection_kwargs)
        self._max = getattr(source, "max_connections", None) or 2**31
        self._no_retry = no_retry
        self._idle: list[Any] = []
        self._open = 0
        self._pid = os.getpid()
        # Bumped by close(): a connection made before it is dropped when its call ends.
        self._generation = 0
        self._made: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        #: The one-time server checks done on this server (redisstore.core.runops.RunOps).
        self.checks: set[str] = set() if checks is None else checks

    def _take(self) -> tuple[Any, bool] | None:
        """An idle connection, or a new one (not connected yet), or None when
        ``max_connections`` are in use."""
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours
            self._idle, self._open, self._pid = [], 0, os.getpid()
        if self._idle:
            return self._idle.pop(), False
        if self._open >= self._max:
            return None
        self._open += 1
        conn = self._cls(**self._kwargs)
        conn.retry = self._no_retry  # connect once, within the call's deadline
        self._made[conn] = self._generation
        return conn, True

    def _keep(self, conn: Any) -> bool:
        """Whether a connection whose call ended cleanly goes back to the idle list (it
        does unless the pool was closed since it was made)."""
        return self._made.get(conn) == self._generation

    def _close_idle(self) -> list[Any]:
        """Start a new generation and hand over the idle connections to disconnect."""
        self._generation += 1
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        return idle


def node_name(client: Any, key: str) -> Hashable:
    """The node ``key`` lives on as far as the cluster ``client`` knows (None: ``client`` is
    one server), for grouping a call's commands per node."""
    if not hasattr(client, "get_node_from_key"):
        return None
    try:
        name: Hashable = client.get_node_from_key(key).name
        return name
    except Exception:
        return key  # sent alone; its send reports what is wrong


def pushed(reply: Any) -> tuple[str, str] | None:
    """A pub/sub push (``[kind, channel, ...]``) as its kind and channel, text either way
    the client decodes; None for anything else."""
    if not isinstance(reply, list) or len(reply) < 2:
        return None
    return text(reply[0]), text(reply[1])


# The lean paths' readers (a hiredis.Reader of their own), the sync and the asyncio one's.
#: What a lean reader answers while a reply is incomplete (False and None are replies).
_MORE = object()


def _pack_one(command: tuple[str | bytes | int, ...]) -> bytes:
    """One command as RESP, packed in C. Text that is not UTF-8 (a name that came back from
    the server as such bytes: see protocol.text) goes as the same bytes."""
    try:
        return _hiredis_pack(command)  # type: ignore[arg-type,no-any-return]
    except UnicodeEncodeError:
        return _hiredis_pack(tuple(a.encode("utf-8", "surrogateescape")  # type: ignore[arg-type,no-any-return]
                                   if isinstance(a, str) else a for a in command))


def lean_error(text: str) -> ErrorReply:
    """An error reply read by a ``hiredis.Reader`` as the :class:`ErrorReply` the client's
    parser gives (see :func:`~redisstore.shells.clients.error_reply`): the generic ``ERR`` prefix
    stripped, a wrapped code (Redis 6.2, the scripts' BADARG / ABORTED) read out of it."""
    code, _, rest = text.partition(" ")
    if code == "ERR":
        reply = split_error(rest)
        return reply if reply.code else ErrorReply("ERR", rest)
    reply = split_error(text)
    return reply if reply.code else ErrorReply("ERR", text)


def _replies(got: list[Any]) -> tuple[Reply | ErrorReply, ...]:
    """Replies read by a lean reader as neutral values."""
    return tuple([lean_error(str(r)) if type(r) is _ReplyError else Reply(r) for r in got])


def subscribe_failed(exc: BaseException) -> BaseException:
    """What a refused ``SSUBSCRIBE`` raises: :class:`~redisstore.shells.wakeups.Refused` when the
    server will keep refusing it (no such command: Redis 6.2; NOPERM: a user without it or
    the channels), else ``exc`` (a moved slot, a broken link: subscribe again later)."""
    if is_error_reply(exc):
        reply = error_reply(exc)
        if reply.code == "NOPERM" or "unknown command" in reply.message.lower():
            return Refused(str(reply))
    return exc
