"""Concurrent claimers on a real server: a run is never handed to two of them."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import Counter
from typing import Any

import pytest
import redis
from servers import Server, unique_namespace

from redisstore import Claim, Held, RedisRunStore, Release
from redisstore.discovery import json_wait

# serial: processes racing claims load the machine
pytestmark = [pytest.mark.server, pytest.mark.serial, pytest.mark.slow]

RUNS = 10_000
WORKERS = 8
LONG = 600_000


def _claim_all(port: int, namespace: str, owner: str, ready: bool, barrier: Any,
               results: Any, partitions: int) -> None:
    store = RedisRunStore(redis.Redis(host="127.0.0.1", port=port), namespace=namespace,
                          discover=json_wait, partitions=partitions)
    claim = store.claim_ready if ready else store.claim_expired
    store.now()  # connected before the race starts
    barrier.wait(60)  # every worker is up: they really race
    claimed: list[str] = []
    while batch := claim(owner, LONG, 37):
        claimed.extend(batch)
    results.put((owner, claimed))


def _race(port: int, namespace: str, ready: bool, partitions: int) -> list[list[str]]:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    workers = [ctx.Process(target=_claim_all, args=(port, namespace, f"worker-{w}", ready,
                                                    barrier, results, partitions))
               for w in range(WORKERS)]
    for worker in workers:
        worker.start()
    by_owner = dict(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(10)
    return [by_owner[f"worker-{w}"] for w in range(WORKERS)]


def _check_disjoint(store: RedisRunStore, runs: list[str], results: list[list[str]]) -> None:
    counts = Counter(run for claimed in results for run in claimed)
    assert sorted(counts) == runs  # every run claimed
    assert max(counts.values()) == 1  # by exactly one worker
    assert sum(1 for claimed in results if claimed) >= 2  # the workers did race
    for w, claimed in enumerate(results):
        for run in claimed[:: max(1, len(claimed) // 50)]:
            assert store.get(run).holder == Held(f"worker-{w}", True)


# partitions=6: one logical store over 6 hash tags, each claim a read of every partition's
# head and a claim of each one's share, racing the other workers' between the two.
@pytest.mark.parametrize("partitions", [1, 6])
def test_eight_processes_claim_ten_thousand_expired_runs_once_each(redis7: Server,
                                                                   partitions: int) -> None:
    namespace = unique_namespace()
    store = RedisRunStore(redis7.client(), namespace=namespace, partitions=partitions)
    runs = [f"run-{i:05d}" for i in range(RUNS)]
    for run in runs:
        store.insert(run, b"record", Claim("crashed-node", 1))
    time.sleep(0.01)
    _check_disjoint(store, runs, _race(redis7.port, namespace, False, partitions))


@pytest.mark.parametrize("partitions", [1, 6])
def test_eight_processes_claim_ready_runs_once_each(redis7: Server, partitions: int) -> None:
    namespace = unique_namespace()
    store = RedisRunStore(redis7.client(), namespace=namespace, discover=json_wait,
                          partitions=partitions)
    runs = [f"{{f{i % 12}}}run-{i:05d}" for i in range(3_000)]  # 12 families
    for family in range(12):
        store.insert(f"{{f{family}}}dep", b"{}", Release())
    for i, run in enumerate(runs):
        wait = [{"at": 0}, {"changed": f"{{f{i % 12}}}dep"},
                {"poll": "inbox", "interval": LONG}][i % 3]
        store.insert(run, json.dumps({"wait": wait}).encode(), Release())
    _check_disjoint(store, sorted(runs), _race(redis7.port, namespace, True, partitions))
    assert store.claim_ready("late", LONG, 10) == []
