"""Least privilege: the ACL rule that confines a Redis or Valkey user to one namespace.

The rule is derived from the scripts the package ships (every command they call) and from
what the stores send besides them, so it grows with the library and never lags behind it.
docs/security.md says how to use it.
"""

from __future__ import annotations

import re

from . import scripts
from .keys import Keyspace

# Every command a shipped script calls: redis.call('X'), redis.pcall('X'), and the writes
# it queues with later('X') / first('X') (commit() runs them with redis.call).
_CALLED = re.compile(rb"(?:redis\.p?call|later|first)\('([A-Z]+)'")

# Glob characters of an ACL key pattern (and of SCAN MATCH): escaped, a namespace such as
# "a*" matches only itself, never "abc".
_GLOB = re.compile(r"([*?\[\]\\])")


def script_commands() -> frozenset[str]:
    """The commands the shipped run and repository scripts call, lower case."""
    found: set[str] = set()
    for script in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS):
        found.update(name.decode().lower() for name in _CALLED.findall(script.source))
    return frozenset(found)


def glob_escape(text: str) -> str:
    """``text`` as a glob pattern that matches exactly it (``*?[]\\`` escaped)."""
    return _GLOB.sub(r"\\\1", text)


def acl_rule(namespace: str, *, durability: bool = False, server_checks: bool = False) -> str:
    """The ``ACL SETUSER`` rules that let a user run every operation of both ports (run
    store and instance repository, ``migrate`` included) on ``namespace`` and nothing else::

        ACL SETUSER tenant-a on >password <acl_rule("tenant-a")>

    The keys are those of the namespace (the pattern escaped: a namespace with ``*`` or
    ``?`` matches only itself); the commands are ``EVALSHA``, ``EVAL`` and ``SCRIPT LOAD``
    (the script cache empties on every restart and failover: without it the store stops
    working there) and the commands the scripts call inside, ``TIME`` among them.
    ``durability`` adds ``WAIT`` and ``WAITAOF`` (for ``Durability``); ``server_checks``
    adds ``CONFIG GET`` and ``COMMAND INFO`` (without them the store logs once that it
    cannot check the server's eviction policy, and goes on). A client that selects a
    database other than 0 needs ``+select`` as well.
    """
    prefix = Keyspace(namespace).prefix  # checks the namespace
    commands = {"evalsha", "eval", "script|load", "time", *script_commands()}
    if durability:
        commands |= {"wait", "waitaof"}
    if server_checks:
        commands |= {"config|get", "command|info"}
    allowed = " ".join(f"+{name}" for name in sorted(commands))
    return f"resetkeys ~{glob_escape(prefix)}* resetchannels -@all {allowed}"
