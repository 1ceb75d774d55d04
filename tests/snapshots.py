"""A namespace's keys as they stand, to compare before and after (tests of damaged data)."""

from __future__ import annotations

from typing import Any

import redis


def snapshot(client: redis.Redis, namespace: str) -> dict[bytes, tuple[bytes, Any]]:
    """Every key of the namespace read by its type (no DUMP: its bytes differ across
    servers and fakeredis lacks it): equal snapshots, nothing changed. Three round trips:
    the keys, their types, their contents."""
    keys = sorted(client.scan_iter(match="{" + namespace + "}:*", count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    reads = {b"string": lambda k: pipe.get(k), b"hash": lambda k: pipe.hgetall(k),
             b"zset": lambda k: pipe.zrange(k, 0, -1, withscores=True),
             b"set": lambda k: pipe.smembers(k), b"list": lambda k: pipe.lrange(k, 0, -1)}
    for key, kind in zip(keys, kinds, strict=True):
        reads.get(kind, lambda k: pipe.exists(k))(key)
    values = pipe.execute()
    out: dict[bytes, tuple[bytes, Any]] = {}
    for key, kind, value in zip(keys, kinds, values, strict=True):
        if kind == b"hash":
            value = sorted(value.items())
        elif kind == b"set":
            value = sorted(value)
        out[key] = (kind, value)
    return out
