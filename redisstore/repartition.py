"""Change the partition count of a namespace (``partitions=N``), offline: with every engine
of the namespace stopped, move each run to its partition under the new count, then record
the count. docs/scale-out.md ("Changing the count") is the guide.

Each run is read where it is and written where it belongs through the run store's own
operations, so every rule holds as for any write: its wait is derived again by
``discover``, a dependency in another partition is watched, its indexes are the scripts'.

- A run that stays in its partition is written again as it is (compare_and_set, Release):
  its lease is dropped (its engine is stopped) and its revision goes up by one.
- A run that moves is inserted in its new partition above its revision (the partition's
  ``deleted-rev`` is raised to it first, so a stale revision never matches again), then
  deleted where it was.
- Before the moves, the derived state of dependencies across partitions (mirrors, watches,
  outboxes) is cleared in every partition: the writes rebuild it for the new count.

Stopped anywhere, it can be run again with the same arguments: a run already inserted in
its new partition (same record) is only deleted where it was, one already rewritten is
rewritten again. Waiters may become claimable once after it (their dependencies' revisions
changed): an engine that finds nothing changed waits again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import AlreadyExists, Corrupt, Misconfigured, NotFound
from .keys import Keyspace
from .partitions import PartitionedOps, check_partitions, partition_of
from .protocol import Durability, check_io
from .runops import RunOps
from .runs import Discover, Release
from .security import glob_escape
from .transport import Transport


@dataclass(frozen=True)
class Repartitioned:
    """What :func:`repartition` did: runs moved to another partition, runs written again
    in theirs, damaged runs left where they were (``quarantined()`` lists nothing for them:
    find them by ``redisstore inspect``), and the count before and after."""

    moved: int
    rewritten: int
    damaged: int
    before: int
    after: int


def recorded_count(client: Any, namespace: str) -> tuple[int, int | None]:
    """The namespace's partition count as recorded (1 when none is), and the count a
    repartition under way moves it to (None: none is): while one is, the count it started
    from is kept apart (``repartition-from``, ``repartition-to``)."""
    started, target, got = client.hmget(Keyspace(namespace).meta, "repartition-from",
                                        "repartition-to", "partitions")
    if started is not None and target is not None:
        return int(started), int(target)
    return (1 if got is None else int(got)), None


def _ops(namespace: str, count: int, discover: Discover | None,
         projection_version: int, durability: Durability | None) -> list[RunOps]:
    """The operations of each partition of a store of ``count`` (one: the namespace's own)."""
    if count == 1:
        return [RunOps(namespace, discover, projection_version, durability=durability)]
    return PartitionedOps(namespace, discover, projection_version, durability=durability,
                          partitions=count).parts


def _scan(client: Any, key: str, match: str) -> Iterator[bytes]:
    """The keys matching ``match`` on the node of ``key`` (every key of one partition is on
    one node)."""
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(key)
        yield from client.scan_iter(match=match, count=1000, target_nodes=node)
    else:
        yield from client.scan_iter(match=match, count=1000)


def repartition(client: Any, namespace: str, to: int, *, discover: Discover | None = None,
                projection_version: int = 1, durability: Durability | None = None,
                timeout: int = 5000) -> Repartitioned:
    """Spread ``namespace`` over ``to`` partitions (1: one, the namespace's own keys), with
    every engine of it stopped; the stores then open it with ``partitions=to``. ``discover``
    and ``projection_version``: the engines' own (every run's wait is derived again).
    Safe to run again after it stopped; a namespace already at ``to`` is left alone. It
    moves runs: the namespace's instance repository keeps its own count and records."""
    to = check_partitions(to)
    durability, timeout = check_io(durability, timeout)
    before, under_way = recorded_count(client, namespace)
    if under_way is not None and under_way != to:
        raise Misconfigured(
            f"namespace {namespace!r} is being repartitioned from {before} to {under_way} "
            f"partitions (a repartition stopped before its end): finish it first, "
            f"repartition(..., {under_way}); nothing was moved")
    if before == to:
        return Repartitioned(0, 0, 0, before, to)
    meta = Keyspace(namespace).meta
    # Under way until the end: stores of partitions refuse the namespace meanwhile (their
    # count check reads it), and a run of this step stopped anywhere resumes from here.
    client.hset(meta, mapping={"repartition-from": before, "repartition-to": to})
    if to == 1:
        # The namespace's own keys take the runs back, whose scripts refuse a recorded
        # count.
        client.hdel(meta, "partitions")
    io = Transport(client, durability, timeout)
    old = _ops(namespace, before, discover, projection_version, durability)
    new = _ops(namespace, to, discover, projection_version, durability)
    for ops in (*old, *new):
        ops.checks = io.checks
        while not io.drive(ops.migrate_step(200))[1]:
            pass  # every partition at the newest layout: delete needs it
    for ops in {o.keys.prefix: o for o in (*old, *new)}.values():
        _clear_dependencies(client, ops.keys)
    floors: dict[str, int] = {}
    arrived: set[str] = set()  # moved in earlier in this step: not written twice
    moved = rewritten = damaged = 0
    for source in old:
        pattern = glob_escape(source.keys.prefix) + "r:*"
        for key in list(_scan(client, source.keys.meta, pattern)):
            run = key.decode("utf-8", "surrogateescape")[len(source.keys.prefix) + 2:]
            if run in arrived:
                continue
            try:
                current = io.drive(source.get(run))
            except NotFound:
                continue
            except Corrupt:
                damaged += 1
                continue
            target = new[partition_of(run, to)]
            if target.keys.prefix == source.keys.prefix:
                io.drive(target.compare_and_set(run, current.revision, current.record,
                                                Release()))
                rewritten += 1
                continue
            _raise_floor(client, target.keys, current.revision, floors)
            try:
                io.drive(target.insert(run, current.record, Release()))
            except AlreadyExists:
                there = io.drive(target.get(run))
                if there.record != current.record:
                    raise Misconfigured(
                        f"run {run!r} is in partition {source.keys.prefix} and, with another "
                        f"record, in {target.keys.prefix}: not a copy this step made (the "
                        "engines must be stopped); nothing more was moved") from None
            io.drive(source.delete(run, current.revision, Release()))
            arrived.add(run)
            moved += 1
    if to > 1:
        client.hset(meta, "partitions", to)
    client.hdel(meta, "repartition-from", "repartition-to")
    return Repartitioned(moved, rewritten, damaged, before, to)


def _raise_floor(client: Any, keys: Keyspace, revision: int, floors: dict[str, int]) -> None:
    """Raise the partition's ``deleted-rev`` to ``revision``: an insert there starts above
    it, so a run moved in never goes back to a revision it had."""
    floor = floors.get(keys.prefix)
    if floor is None:
        floor = int(client.hget(keys.meta, "deleted-rev") or 0)
    if revision > floor:
        client.hset(keys.meta, "deleted-rev", revision)
        floor = revision
    floors[keys.prefix] = floor


def _clear_dependencies(client: Any, keys: Keyspace) -> None:
    """Drop a partition's mirrors, outbox and watches: the moves rebuild them."""
    client.delete(keys.prefix + "depv", keys.prefix + "outbox")
    watches = list(_scan(client, keys.meta, glob_escape(keys.prefix) + "watch:*"))
    for start in range(0, len(watches), 500):
        client.delete(*watches[start:start + 500])
