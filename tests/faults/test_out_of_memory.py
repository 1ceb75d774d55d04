"""Under maxmemory (noeviction) a write that would grow memory is refused before it writes.

Redis checks maxmemory only at a script's first write, and only if that write is one that
can grow memory; after any write it lets the rest through. A script whose first write was a
DEL or a ZREM (an eviction) went on past the limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from servers import redis_binary, start, unique_namespace

from redisstore import InstanceRecord, RedisRepository, StoreError, Unavailable

pytestmark = pytest.mark.server


def dump(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    return {key: client.dump(key) for key in client.scan_iter(match=f"{{{namespace}}}:*")}


def test_a_terminal_save_that_evicts_is_refused_whole_when_memory_is_full(
        tmp_path: Path) -> None:
    server = start(redis_binary(), "redis-server", tmp_path,
                   ("--save", "", "--appendonly", "no", "--maxmemory", "3mb",
                    "--maxmemory-policy", "noeviction"))
    try:
        client = server.client()
        repo = RedisRepository(client, namespace=unique_namespace(), max_terminal=1000)
        repo.register_group("g")
        for i in range(5):  # terminal records, to be evicted once max_terminal is lowered
            repo.save(InstanceRecord(f"done-{i}", b"x", "g", status="completed"))
        with pytest.raises(Unavailable) as caught:
            for i in range(10_000):
                repo.save(InstanceRecord(f"fill-{i}", b"x" * 2048, "g"))
        assert caught.value.outcome == "not_applied" and "OOM" in caught.value.reason
        # Used memory hovers at the limit (a refused call frees its buffers): put the limit
        # well below it, so that the save below meets it.
        client.config_set("maxmemory", "1mb")
        lowered = RedisRepository(client, namespace=repo.namespace, max_terminal=1)
        before = dump(client, repo.namespace)
        with pytest.raises(StoreError, match="OOM"):
            lowered.save(InstanceRecord("late", b"y" * 2048, "g", status="completed"))
        assert dump(client, repo.namespace) == before  # no eviction went through
        assert repo.load("done-0") is not None
    finally:
        server.kill()
