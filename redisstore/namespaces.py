"""A namespace's keys on a server as a whole: finding them and dropping them (what
``redisstore drop`` does), for tools, tests and examples that must leave nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .security import glob_escape

#: Keys one ``DEL`` takes.
BATCH = 500


def namespace_keys(client: Any, namespace: str) -> Iterator[bytes]:
    """The keys of ``namespace``, its own (``{ns}:``) and its partitions' (``{ns#p}:``; no
    other namespace has a ``#``), by SCAN (bounded steps; never KEYS)."""
    own = glob_escape("{" + namespace)
    for pattern in (own + "}:*", own + "#*}:*"):
        yield from client.scan_iter(match=pattern, count=1000)


def drop_namespace(client: Any, namespace: str) -> int:
    """Delete every key of ``namespace`` (runs, repository, partitions, meta) on the server
    of ``client`` (a sync redis-py, valkey-py, fakeredis or cluster client), in batches of
    ``BATCH``; how many were deleted. Offline: a store still running there writes again.
    Nothing outside the namespace is touched."""
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"namespace must be a non-empty str, got {namespace!r}")
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
