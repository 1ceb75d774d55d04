"""A workflow engine's checkpoints in the instance repository: engine A runs an instance and
saves a checkpoint per step under its lease; it dies; engine B finds the instance in the
recovery listing once A's lease has expired, takes it over (a new incarnation), and a late
save of A's is refused by the compare-and-set. B finishes it; the finished record leaves
the listing.

Run it (fakeredis, no server needed)::

    python examples/repository.py        # or REDISSTORE_URL=redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import fakeredis
import redis

from redisstore import (
    ConcurrentUpdate,
    InstanceLease,
    InstanceRecord,
    RedisRepository,
    Status,
    drop_namespace,
)

GROUP = "engines-eu"


def connect() -> redis.Redis:
    url = os.environ.get("REDISSTORE_URL")
    return redis.Redis.from_url(url) if url else fakeredis.FakeRedis()


def main() -> int:
    client = connect()
    namespace = f"example-{uuid.uuid4().hex[:8]}"
    repo = RedisRepository(client, namespace=namespace)
    try:
        return run(repo)
    finally:
        repo.close()
        drop_namespace(client, namespace)  # an example: its keys go (an engine's stay)


def run(repo: RedisRepository) -> int:
    repo.migrate()
    repo.register_group(GROUP)
    start = datetime.now(UTC)

    # Engine A starts order-42 and checkpoints step 1 under a 30 s lease.
    lease_a = InstanceLease(start + timedelta(seconds=30), "engine-A", 1)
    first = InstanceRecord("order-42", b'{"step": 1}', GROUP, lease=lease_a)
    version = repo.save(first)
    print(f"engine A saved step 1 (version {version}); in flight for recovery now: "
          f"{repo.list_in_flight(GROUP)}")

    # A dies. 31 s later (a listing may say when "now" is) the instance is claimable.
    later = start + timedelta(seconds=31)
    claimable = repo.list_in_flight(GROUP, now=later)
    print(f"31 s later, claimable: {claimable}")

    # Engine B takes it over: its own lease, the next incarnation, the version it read.
    current = repo.load("order-42")
    assert current is not None
    lease_b = InstanceLease(later + timedelta(seconds=30), "engine-B", 2)
    version = repo.save(replace(current, payload=b'{"step": 2}', lease=lease_b))
    print(f"engine B took it over and saved step 2 (version {version})")

    # A comes back and saves what it had: refused, B's save came first.
    try:
        repo.save(replace(first, payload=b'{"step": 2, "by": "A"}', rec_version=1))
        print("engine A's late save went through: WRONG")
        return 1
    except ConcurrentUpdate as refused:
        print(f"engine A's late save is refused: {refused}")

    # B finishes: a terminal status takes it out of the listing.
    current = repo.load("order-42")
    assert current is not None
    repo.save(replace(current, payload=b'{"step": 3}', status=Status.COMPLETED))
    left = repo.list_in_flight(GROUP, now=later + timedelta(minutes=5))
    print(f"completed; in flight now: {left}")
    return 0 if claimable == ["order-42"] and left == [] else 1


if __name__ == "__main__":
    raise SystemExit(main())
