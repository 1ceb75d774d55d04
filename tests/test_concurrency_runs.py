"""Concurrent claimers on a real server: a run is never handed to two of them."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter

import pytest
import redis
from servers import Server, unique_namespace

from redisstore import Claim, Held, RedisRunStore

pytestmark = [pytest.mark.server, pytest.mark.slow]

RUNS = 10_000
WORKERS = 8
LONG = 600_000


def _claim_all(port: int, namespace: str, owner: str, start: float) -> list[str]:
    store = RedisRunStore(redis.Redis(host="127.0.0.1", port=port), namespace=namespace)
    while time.time() < start:  # line the workers up so they really race
        time.sleep(0.001)
    claimed: list[str] = []
    while batch := store.claim_expired(owner, LONG, 37):
        claimed.extend(batch)
    return claimed


def test_eight_processes_claim_ten_thousand_expired_runs_once_each(redis7: Server) -> None:
    namespace = unique_namespace()
    store = RedisRunStore(redis7.client(), namespace=namespace)
    runs = [f"run-{i:05d}" for i in range(RUNS)]
    for run in runs:
        store.insert(run, b"record", Claim("crashed-node", 1))
    time.sleep(0.01)
    start = time.time() + 1.0
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WORKERS) as pool:
        results = pool.starmap(_claim_all, [(redis7.port, namespace, f"worker-{w}", start)
                                            for w in range(WORKERS)])
    counts = Counter(run for claimed in results for run in claimed)
    assert sorted(counts) == runs  # every run claimed
    assert max(counts.values()) == 1  # by exactly one worker
    assert sum(1 for claimed in results if claimed) >= 2  # the workers did race
    for w, claimed in enumerate(results):
        for run in claimed[:: max(1, len(claimed) // 50)]:
            assert store.get(run).holder == Held(f"worker-{w}", True)
