"""Least privilege: the ACL rule that confines a Redis or Valkey user to one namespace.

The rule is derived from the scripts the package ships (every command they call) and from
what the stores send besides them, so it grows with the library and never lags behind it.
docs/security.md says how to use it.
"""

from __future__ import annotations

import re

from ..core import scripts
from ..core.caps import Cap
from ..core.keys import Keyspace
from ..core.runs import check_int

# Every command a shipped script calls: redis.call('X'), redis.pcall('X'), and the writes
# it queues with later('X') / first('X') (commit() runs them with redis.call).
_CALLED = re.compile(rb"(?:redis\.p?call|later|first)\('([A-Z]+)'")

# Glob characters of an ACL key pattern (and of SCAN MATCH): escaped, a namespace such as
# "a*" matches only itself, never "abc".
_GLOB = re.compile(r"([*?\[\]\\])")


#: Commands a script calls only in a partition, each a pcall whose refusal costs nothing
#: but a message: granted with the channels (Redis 6.2 knows no SPUBLISH and would refuse
#: a rule that names it).
_PARTITIONS_ONLY = frozenset({"spublish"})


def script_commands() -> frozenset[str]:
    """The commands the shipped run and repository scripts call, lower case (but those
    only a store of partitions needs: see :func:`acl_rule`)."""
    found: set[str] = set()
    for script in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS):
        found.update(name.decode().lower() for name in _CALLED.findall(script.source))
    if "memory" in found:  # MEMORY USAGE only (a byte bound before a read), no other
        found = (found - {"memory"}) | {"memory|usage"}
    return frozenset(found - _PARTITIONS_ONLY)


def glob_escape(text: str) -> str:
    """``text`` as a glob pattern that matches exactly it (``*?[]\\`` escaped)."""
    return _GLOB.sub(r"\\\1", text)


def acl_rule(namespace: str, *, durability: bool = False, server_checks: bool = False,
             aof: bool = False, migrate: bool = True, cluster: bool = False,
             partitions: int = 1) -> str:
    """The ``ACL SETUSER`` rules that let a user run every operation of both ports (run
    store and instance repository, ``migrate`` included) on ``namespace`` and nothing else::

        ACL SETUSER tenant-a on >password <acl_rule("tenant-a")>

    The keys are those of the namespace (the pattern escaped: a namespace with ``*`` or
    ``?`` matches only itself); the commands are ``EVALSHA``, ``EVAL`` and ``SCRIPT LOAD``
    (the script cache empties on every restart and failover: without it the store stops
    working there), the commands the scripts call inside, ``TIME`` among them, and
    ``BZPOPMIN`` and ``ZADD``, with which a store's waker waits for the namespace's wake-up
    signals (``claim_ready(..., block=ms)``).

    - ``durability``: ``WAIT`` and ``COMMAND INFO`` (for ``Durability``); ``aof`` adds
      ``WAITAOF`` (``Durability(aof=True)``; Redis >= 7.2 and Valkey >= 8 know it, an older
      server refuses the whole rule).
    - ``server_checks``: ``INFO`` (and ``COMMAND INFO``), from which the store reads the
      eviction policy. ``CONFIG GET`` is never granted: it reads the server's passwords.
    - ``migrate=False`` leaves out ``SCAN``, which lists every key name on the server (not
      their values; Redis does not filter SCAN by key pattern); ``migrate()`` then needs
      another user. Only ``migrate()`` scans.
    - ``cluster``: what redis-py's ``RedisCluster`` asks at start-up (``CLUSTER SLOTS``,
      ``CLUSTER SHARDS``, ``COMMAND``).
    - ``partitions``: the keys of every partition of a store or repository opened with
      ``partitions=N`` (``{namespace#0}`` to ``{namespace#N-1}``, besides the namespace's
      own, which hold the count), and each partition's two wake-up channels (named as its
      wake keys) with the pub/sub commands (``+@pubsub -pubsub``: ``SPUBLISH`` from the
      scripts, ``SSUBSCRIBE`` for the wakers per node on a cluster, on those channels
      only; ``PUBSUB``, which lists every channel, is not granted) and ``ZPOPMIN``.

    A client that selects a database other than 0 needs ``+select`` as well. A namespace
    with whitespace or control characters cannot be one word of an ACL rule: ValueError.
    """
    # The store's check of its option (core.partitions.check_partitions), on the cap itself:
    # the rule stands on the ports, not on the store of partitions.
    count = check_int("partitions", partitions, minimum=1, maximum=Cap.MAX_PARTITIONS)
    prefixes = [Keyspace(namespace).prefix,  # checks the namespace
                *(Keyspace(namespace, p).prefix for p in range(count if count > 1 else 0))]
    if any(c.isspace() or not c.isprintable() for c in namespace):
        raise ValueError(f"namespace {namespace!r} has whitespace or control characters: it "
                         "cannot be one word of an ACL rule (choose one without them)")
    commands = {"evalsha", "eval", "script|load", "time", "bzpopmin", "zadd",
                "xrange", "xread", "hget", "hset", *script_commands()}
    if not migrate:
        commands.discard("scan")
    if durability or aof:
        commands |= {"wait", "command|info"}
    if aof:
        commands.add("waitaof")
    if server_checks:
        commands |= {"info", "command|info"}
    if cluster:
        commands |= {"cluster|slots", "cluster|shards", "command"}
    allowed = " ".join(f"+{name}" for name in sorted(commands))
    keys = " ".join(f"~{glob_escape(prefix)}*" for prefix in prefixes)
    if count == 1:
        return f"resetkeys {keys} resetchannels -@all {allowed}"
    channels = " ".join(f"&{glob_escape(Keyspace(namespace, p).wake(kind))}"
                        for p in range(count) for kind in ("ready", "leases"))
    return (f"resetkeys {keys} resetchannels {channels} -@all +@pubsub -pubsub {allowed} "
            "+zpopmin")
