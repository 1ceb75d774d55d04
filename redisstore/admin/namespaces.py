"""A namespace's keys on a server as a whole: finding them and dropping them (what
``redisstore drop`` does), for tools, tests and examples that must leave nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..core.caps import Cap
from ..core.keys import Keyspace, check_namespace
from .security import glob_escape

#: Keys one ``DEL`` takes.
BATCH = 500


def namespace_keys(client: Any, namespace: str) -> Iterator[bytes]:
    """The keys of ``namespace``, its own (``{ns}:``) and its partitions' (``{ns#p}:``; no
    other namespace has a ``#``), by SCAN (bounded steps; never KEYS). A name no namespace
    can have (empty, braces, ``#``: ``"ns#0"`` would be partition 0 of ``ns``) raises
    ``ValueError`` before anything is read."""
    own = glob_escape("{" + check_namespace(namespace))
    for pattern in (own + "}:*", own + "#*}:*"):
        yield from client.scan_iter(match=pattern, count=1000)


def drop_namespace(client: Any, namespace: str) -> int:
    """Delete every key of ``namespace`` (runs, repository, partitions, meta) on the server
    of ``client`` (a sync redis-py, valkey-py, fakeredis or cluster client), in batches of
    ``BATCH``; how many were deleted. Offline: a store still running there writes again.
    Nothing outside the namespace is touched: a name no namespace can have (empty, with
    braces or ``#``; ``"ns#0"`` names partition 0 of ``ns``) raises ``ValueError`` (a
    non-str ``TypeError``) and deletes nothing."""
    check_namespace(namespace)
    batch: list[bytes] = []
    deleted = 0
    for key in namespace_keys(client, namespace):
        batch.append(key)
        if len(batch) == BATCH:
            deleted += client.delete(*batch)
            batch = []
    if batch:
        deleted += client.delete(*batch)
    return int(deleted)


def _count(got: bytes | None) -> int:
    """A recorded partition count as it is read (1: none, or one that is not a count)."""
    count = int(got) if got is not None and got.isdigit() else 1
    return count if 1 < count <= Cap.MAX_PARTITIONS else 1


def repository_partitions(client: Any, namespace: str) -> int:
    """The partition count of ``namespace``'s instance repository."""
    return _count(client.get(Keyspace(namespace).repo_partitions))


def spaces_of(client: Any, namespace: str) -> list[Keyspace]:
    """The keyspaces ``namespace``'s runs are in: its own, or each of its partitions' when
    its meta key records a count (read as it is: a damaged count is one partition)."""
    count = _count(client.hget(Keyspace(namespace).meta, "partitions"))
    if count == 1:
        return [Keyspace(namespace)]
    return [Keyspace(namespace, p) for p in range(count)]
