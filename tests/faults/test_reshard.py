"""Resharding under load: a namespace's slot migrates from node to node of a three-primary
Redis Cluster (``CLUSTER SETSLOT`` + ``MIGRATE``, a few keys at a time) while engines write,
claim and renew on it, sync stores and asyncio ones (their multiplexer) alike. Every call
is logged; :mod:`history` checks the log against the final state: nothing acknowledged is
lost, no lease is given twice, and each call refused during a migration (TRYAGAIN, ASK) was
not applied.

``REDISSTORE_RESHARD_SECONDS`` sets how long the load runs (default 12 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from engine import OnLoop, Worker, final_state, seed
from history import check, load
from redis.cluster import RedisCluster
from servers import (
    Server,
    finish_migration,
    migrate_keys,
    redis_binary,
    start_cluster,
    start_migration,
    unique_namespace,
)

from redisstore import AsyncRedisRunStore, RedisRunStore
from redisstore.core.keys import Keyspace
from redisstore.discovery import json_wait

pytestmark = [pytest.mark.server, pytest.mark.slow]

SECONDS = float(os.environ.get("REDISSTORE_RESHARD_SECONDS", "12"))
RUNS = 50
SYNC_WORKERS = 3
ASYNC_WORKERS = 3
#: Keys per MIGRATE, and the pause between two: a migration takes long enough that calls
#: meet it halfway.
KEYS_PER_STEP, STEP_PAUSE = 8, 0.01


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    servers = start_cluster(redis_binary(), tmp_path_factory.mktemp("reshard"))
    try:
        yield servers
    finally:
        for server in servers:
            server.kill()


def migrate_slot(cluster: list[Server], slot: int, owner: Server) -> tuple[Server, int, float]:
    """Move ``slot`` from ``owner`` to the next primary, a few keys at a time; the new owner,
    the keys moved and the seconds it took."""
    began = time.monotonic()
    source, target = start_migration(cluster, slot, owner)
    moved = 0
    while keys := source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot,
                                                  KEYS_PER_STEP):
        migrate_keys(source, target, list(keys))
        moved += len(keys)
        time.sleep(STEP_PAUSE)
    finish_migration(cluster, slot, target)
    return target, moved, time.monotonic() - began


def test_resharding_under_load_loses_nothing_acknowledged(cluster: list[Server],
                                                          tmp_path: Path) -> None:
    namespace = unique_namespace("reshard")
    client = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    slot = client.keyslot(Keyspace(namespace).meta)
    setup = RedisRunStore(client, namespace=namespace, discover=json_wait)
    setup.migrate()
    runs = [f"run-{i:02d}" for i in range(RUNS)]
    lines = seed(setup, runs)
    deadline = time.monotonic() + SECONDS
    rng = random.Random(os.environ.get("REDISSTORE_RESHARD_SEED", "reshard"))
    logs: list[Path] = []
    threads: list[threading.Thread] = []

    def worker(store: Any, name: str) -> None:
        path = tmp_path / f"{name}.jsonl"
        logs.append(path)
        log = path.open("w", buffering=1)
        engine = Worker(store, name, log, random.Random(rng.random()))

        def loop() -> None:
            try:
                engine.loop(deadline, runs)
            finally:
                log.close()
        threads.append(threading.Thread(target=loop, name=name))

    for k in range(SYNC_WORKERS):
        own = RedisCluster(host="127.0.0.1", port=cluster[0].port, socket_timeout=2,
                           socket_connect_timeout=2)
        worker(RedisRunStore(own, namespace=namespace, discover=json_wait), f"sync{k}")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def connect() -> Any:
        return redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster[0].port,
                                          socket_timeout=2, socket_connect_timeout=2)

    aclient = asyncio.run_coroutine_threadsafe(connect(), loop).result(10)
    shared = OnLoop(AsyncRedisRunStore(aclient, namespace=namespace, discover=json_wait), loop)
    for k in range(ASYNC_WORKERS):
        worker(shared, f"async{k}")
    for thread in threads:
        thread.start()
    migrations: list[tuple[int, float]] = []
    time.sleep(1)
    owner = next(s for s in cluster
                 if s.port == client.get_node_from_key(Keyspace(namespace).meta).port)
    while time.monotonic() < deadline - 1.5:
        owner, keys, seconds = migrate_slot(cluster, slot, owner)
        migrations.append((keys, seconds))
        time.sleep(0.5)
    for thread in threads:
        thread.join(SECONDS + 60)
    assert not any(thread.is_alive() for thread in threads)
    asyncio.run_coroutine_threadsafe(aclient.aclose(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)

    final = final_state(setup, runs)
    for path in logs:
        lines += path.read_text().splitlines()
    events = load(lines)
    report = check(events, final)
    logged = [json.loads(line) for line in lines if line.strip()]
    unavailable = [e for e in logged if e["outcome"] == "unavailable"]
    reasons = Counter(next((code for code in ("TRYAGAIN", "ASK", "MOVED")
                            if code in e["reason"]), "other") for e in unavailable)
    counts = report.counts
    print(f"\nresharding: {len(threads)} engines x {SECONDS:.0f} s over {RUNS} runs; "
          f"{len(migrations)} migrations of the slot: "
          + ", ".join(f"{keys} keys in {seconds * 1000:.0f} ms" for keys, seconds in migrations))
    print(f"  operations={counts['operations']} successful writes="
          f"{counts['successful_writes']} unavailable={dict(reasons)} "
          f"(writes {counts['unavailable_writes']}, confirmed by readback "
          f"{counts['confirmed_by_readback']})")
    print(f"  violations={len(report.violations)}")
    for violation in report.violations[:20]:
        print("   ", violation)

    assert report.violations == []
    assert len(migrations) >= 3
    assert all(keys >= RUNS for keys, _ in migrations)  # every run's key went each time
    assert reasons["TRYAGAIN"] + reasons["ASK"] > 0  # calls did meet the migrations
    assert counts["successful_writes"] > 100
    # Every call a migration refused said so: not applied.
    refused = [e for e in unavailable if any(code in e["reason"] for code in ("TRYAGAIN", "ASK"))]
    assert all(e["applied"] == "not_applied" for e in refused), refused[:3]
