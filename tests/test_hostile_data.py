"""Hostile data: a namespace of both ports damaged one key at a time (the tier follows), and
the snapshot helper the repository tests share."""

from __future__ import annotations

from typing import Any

import redis


def snapshot(client: redis.Redis, namespace: str) -> dict[bytes, tuple[bytes, Any]]:
    """Every key of the namespace read by its type (no DUMP: its bytes differ across
    servers and fakeredis lacks it): equal snapshots, nothing changed."""
    out: dict[bytes, tuple[bytes, Any]] = {}
    for key in client.scan_iter(match="{" + namespace + "}:*", count=1000):
        kind = client.type(key)
        value: Any
        if kind == b"string":
            value = client.get(key)
        elif kind == b"hash":
            value = sorted(client.hgetall(key).items())
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            value = sorted(client.smembers(key))
        elif kind == b"list":
            value = client.lrange(key, 0, -1)
        else:
            value = None
        out[key] = (kind, value)
    return out
