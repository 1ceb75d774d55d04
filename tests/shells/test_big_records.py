"""Records at the cap (``max_record_bytes=2 << 20``): a call that reads many of them takes
several round trips, and each gets the store's whole ``timeout``."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio
from servers import Server, drop_namespace, unique_namespace

from redisstore import AsyncRedisRunStore, RedisRunStore, Release
from redisstore.runs import MAX_RECORD_CEILING, MAX_RENEW

pytestmark = [pytest.mark.server, pytest.mark.serial]

#: The bytes of each record that say whose it is; the rest is filler.
TAG = 16


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_get_many_of_150_records_at_the_cap_gives_each_round_trip_its_deadline(
        redis7: Server, kind: str) -> None:
    """150 runs of 2 MiB (the cap): get_many reads them in about one round trip per
    record (its 2 MiB budget), 150 in all, each well within the store's ``timeout=300``
    ms, all of them together not. Each round trip has the deadline, not the whole call:
    the call answers every run. Memory: one record is made at a time, and the server
    holds the 300 MiB, the client only the answer."""
    namespace = unique_namespace("big")
    client = redis7.client()
    runs = [f"run-{i:03}" for i in range(MAX_RENEW)]
    filler = b"." * (MAX_RECORD_CEILING - TAG)
    try:
        with RedisRunStore(client, namespace=namespace, max_record_bytes=MAX_RECORD_CEILING,
                           timeout=30_000) as writer:
            for run in runs:
                writer.insert(run, run.encode().ljust(TAG) + filler, Release())
        calls = evalsha_calls(client)
        started = time.monotonic()
        if kind == "sync":
            with RedisRunStore(client, namespace=namespace, timeout=300,
                               max_record_bytes=MAX_RECORD_CEILING) as store:
                got = {run: c.record for run, c in store.get_many(runs).items()}
        else:
            async def read() -> dict[str, bytes]:
                aclient = redis.asyncio.Redis(host="127.0.0.1", port=redis7.port)
                store = AsyncRedisRunStore(aclient, namespace=namespace, timeout=300,
                                           max_record_bytes=MAX_RECORD_CEILING)
                try:
                    return {run: c.record for run, c in (await store.get_many(runs)).items()}
                finally:
                    await store.aclose()
                    await aclient.aclose()

            got = asyncio.run(read())
        took = time.monotonic() - started
        # Several round trips (about one per record), as many as it takes.
        assert evalsha_calls(client) - calls >= MAX_RENEW // 2, took
        assert list(got) == runs
        for run, record in got.items():
            assert len(record) == MAX_RECORD_CEILING and record[:TAG] == run.encode().ljust(TAG)
        del got
    finally:
        drop_namespace(client, namespace)
