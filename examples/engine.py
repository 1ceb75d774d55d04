"""A small engine on redisstore: three nodes share 30 runs of 3 steps each. Each node waits
for work with ``block=``, keeps its leases with a ``Keeper``, and writes each step under
its lease (``Hold``). Node C dies in the middle (it stops, keeping its leases); once they
expire, the others take its runs over with ``claim_expired`` and finish them. No step is
done twice: each is written by a compare-and-set on the revision the node read.

Run it (fakeredis, no server needed)::

    python examples/engine.py            # or REDISSTORE_URL=redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import fakeredis
import redis

from redisstore import Claimed, Hold, Keeper, LeaseRefused, RedisRunStore, Release
from redisstore.discovery import json_wait

TTL = 600  # ms: short, so the dead node's runs come back quickly
RUNS, STEPS = 30, 3


def connect() -> redis.Redis:
    url = os.environ.get("REDISSTORE_URL")
    return redis.Redis.from_url(url) if url else fakeredis.FakeRedis()


class Node:
    def __init__(self, name: str, store: RedisRunStore) -> None:
        self.name, self.store = name, store
        self.keeper = Keeper(store, name, TTL)
        self.stop = threading.Event()
        self.done_steps = 0
        self.thread = threading.Thread(target=self.run, name=name)

    def run(self) -> None:
        while not self.stop.is_set():
            since = time.monotonic()
            jobs = (self.store.claim_ready(self.name, TTL, 1, records=True, block=200)
                    or self.store.claim_expired(self.name, TTL, 1, records=True))
            for job in jobs:
                self.keeper.add(job.run, since=since)
                self.work(job)

    def work(self, job: Claimed) -> None:
        record, revision = json.loads(job.current.record), job.current.revision
        while record["step"] < STEPS and not self.stop.is_set():
            time.sleep(0.01)  # the step's work
            if not self.keeper.valid(job.run):
                return  # the lease may be gone: another node carries on
            record = {**record, "step": record["step"] + 1, "by": record["by"] + [self.name]}
            done = record["step"] == STEPS
            if done:
                record["wait"] = None
            try:
                self.store.compare_and_set(job.run, revision, json.dumps(record).encode(),
                                           Release() if done else Hold(self.name))
            except LeaseRefused:
                return  # taken over: not ours any more
            revision += 1
            self.done_steps += 1
        self.keeper.discard(job.run)

    def die(self) -> None:
        """Stop at once, keeping every lease: they expire and others take the runs."""
        self.stop.set()
        self.keeper.close(release=False)


def main() -> int:
    namespace = f"example-{uuid.uuid4().hex[:8]}"
    client = connect()

    def store() -> RedisRunStore:  # one per node, as separate processes would have
        return RedisRunStore(client, namespace=namespace, discover=json_wait)

    admin = store()
    for i in range(RUNS):
        admin.insert(f"run-{i:02d}", json.dumps({"wait": {"at": 0}, "step": 0, "by": []})
                     .encode(), Release())
    nodes = [Node(name, store()) for name in ("A", "B", "C")]
    for node in nodes:
        node.thread.start()
    time.sleep(0.15)
    holding = nodes[2].keeper.runs
    nodes[2].die()
    print(f"node C died holding {holding}")
    deadline = time.monotonic() + 20
    finished: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        finished = [json.loads(admin.get(f"run-{i:02d}").record) for i in range(RUNS)]
        if all(r["step"] == STEPS for r in finished):
            break
        time.sleep(0.1)
    for node in nodes[:2]:
        node.stop.set()
        node.thread.join()
        node.keeper.close(release=True)
    nodes[2].thread.join()
    steps = {n.name: n.done_steps for n in nodes}
    by_run = {f"run-{i:02d}": r for i, r in enumerate(finished)}
    taken_over = [run for run in holding if by_run[run]["by"][-1] != "C"]  # type: ignore[index]
    print(f"steps written per node: {steps}; C's runs finished by A and B: {taken_over}")
    ok = all(r["step"] == STEPS for r in finished) and sum(steps.values()) == RUNS * STEPS
    print("all 30 runs finished, every step written once" if ok else "NOT FINISHED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
