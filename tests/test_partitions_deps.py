"""Dependencies across partitions (a run waiting ``Changed(dep)`` with dep in another
partition): every announcement delivered or a token left for the next claim, watches and
mirror entries that go with their last waiter, damage that is quarantined or logged and
never loses an announcement, and keys bounded before they are read."""

from __future__ import annotations

import json
import logging
from typing import Any

import fakeredis
import pytest
from servers import unique_namespace

from redisstore import RedisRunStore, Release
from redisstore.discovery import json_wait
from redisstore.keys import Keyspace
from redisstore.partitions import partition_of

LONG = 600_000


def rec(wait: dict[str, Any] | None) -> bytes:
    return json.dumps({"wait": wait}).encode()


def in_partition(prefix: str, p: int, n: int, skip: int = 0) -> str:
    """A run id of partition ``p`` of ``n`` (the ``skip``-th one found)."""
    found = [f"{prefix}{i}" for i in range(10_000) if partition_of(f"{prefix}{i}", n) == p]
    return found[skip]


# ---------------------------------------------------------------- foreign outbox entries


@pytest.mark.parametrize("dependency", ["x" * 2049, "\u00e9" * 1025])
def test_an_outbox_entry_naming_no_possible_run_is_removed_and_warned_once(
        dependency: str, caplog: pytest.LogCaptureFixture) -> None:
    """An entry whose dependency fails the run-id checks (over MAX_TEXT bytes of UTF-8) can
    never be a run of ours: the first claim removes it, warning once and naming it; the
    next claims pay nothing for it."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    store.insert("seed", rec(None), Release())
    home = Keyspace(ns, 0)
    client.zadd(home.prefix + "outbox", {f"1|{dependency}".encode(): 4})
    with caplog.at_level(logging.WARNING, logger="redisstore"):
        for _ in range(3):
            assert store.claim_ready("a", LONG, 10) == []
    assert client.zcard(home.prefix + "outbox") == 0
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "outbox" in warned[0].getMessage()
