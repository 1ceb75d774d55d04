"""A small engine on redisstore: three nodes share 30 runs of 3 steps each, each node a
``Worker`` with two handlers at a time. A handler does one step, writes it as a checkpoint
(``job.write``, under its lease) and finishes the run after the last. Node C crashes in
the middle of its runs (``Worker.kill``: no renewal, no release); once their leases
expire, A and B take them over and finish them from C's last checkpoint. No step is
written twice: every write is a compare-and-set on the revision the node read.

Run it (fakeredis, no server needed)::

    python examples/engine.py            # or REDISSTORE_URL=redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable

import fakeredis
import redis

from redisstore import Job, RedisRunStore, Release, Worker, drop_namespace
from redisstore.discovery import json_wait

TTL = 600  # ms: short, so the crashed node's runs come back quickly
RUNS, STEPS = 30, 3


def connect() -> redis.Redis:
    url = os.environ.get("REDISSTORE_URL")
    return redis.Redis.from_url(url) if url else fakeredis.FakeRedis()


#: The runs another node took over, and the checkpoints each node wrote.
taken_over: list[str] = []
checkpoints: dict[str, int] = {"A": 0, "B": 0, "C": 0}


def handler_of(name: str) -> Callable[[Job], bytes | None]:
    def handle(job: Job) -> bytes | None:
        record = json.loads(job.current.record)
        if job.current.takeovers:  # claimed from a node whose lease expired
            taken_over.append(job.run)
            print(f"{job.run} taken over by {name} at step {record['step']} "
                  f"(after {record['by'][-1] if record['by'] else 'nobody'})")
        while record["step"] < STEPS:
            time.sleep(0.02)  # the step's work
            if job.lost:
                return None  # the lease is gone: another node carries on
            record = {**record, "step": record["step"] + 1, "by": [*record["by"], name]}
            if record["step"] < STEPS:
                job.write(json.dumps(record).encode())  # a checkpoint, still held
                checkpoints[name] += 1
        return json.dumps({**record, "wait": None}).encode()  # done: never ready again
    return handle


def main() -> int:
    namespace = f"example-{uuid.uuid4().hex[:8]}"
    client = connect()
    store = RedisRunStore(client, namespace=namespace, discover=json_wait)
    try:
        for i in range(RUNS):
            store.insert(f"run-{i:02d}", json.dumps({"wait": {"at": 0}, "step": 0, "by": []})
                         .encode(), Release())
        # One store per node, as separate processes would have.
        workers = {name: Worker(RedisRunStore(client, namespace=namespace, discover=json_wait),
                                name, handler_of(name), ttl=TTL, concurrency=2)
                   for name in ("A", "B", "C")}
        for worker in workers.values():
            worker.start()
        crashed = workers["C"]
        # Crash in the middle of a run: C holds one and has written a checkpoint.
        while not (crashed.held and checkpoints["C"]):
            time.sleep(0.002)
        crashed.kill()
        holding = crashed.held
        print(f"node C crashed holding {holding}")
        deadline = time.monotonic() + 30
        finished: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            finished = [json.loads(store.get(f"run-{i:02d}").record) for i in range(RUNS)]
            if all(r["step"] == STEPS for r in finished):
                break
            time.sleep(0.05)
        for name in ("A", "B"):
            workers[name].stop()
        once = all(len(r["by"]) == STEPS for r in finished)  # type: ignore[arg-type]
        print(f"runs finished per node: { {n: w.stats['done'] for n, w in workers.items()} }; "
              f"C's runs finished by A and B: {sorted(taken_over)}")
        ok = (all(r["step"] == STEPS for r in finished) and once
              and set(holding) <= set(taken_over))
        print("all 30 runs finished, every step written once" if ok else "NOT FINISHED")
        return 0 if ok else 1
    finally:
        drop_namespace(client, namespace)


if __name__ == "__main__":
    raise SystemExit(main())
