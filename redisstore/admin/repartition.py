"""Change the partition count of a namespace (``partitions=N``), offline: with every engine
of the namespace stopped, move each run to its partition under the new count, then record
the count. docs/scale-out.md ("Changing the count") is the guide.

Each run is read where it is and written where it belongs through the run store's own
operations, so every rule holds as for any write: its wait is derived again by
``discover``, a dependency in another partition is watched, its indexes are the scripts'.

- A run that stays in its partition is written again as it is (compare_and_set, Release):
  its lease is dropped (its engine is stopped) and its revision goes up by one.
- A run that moves is inserted in its new partition above its revision and its last grant
  token (the partition's ``deleted-rev`` and ``deleted-tok`` are raised to them first, so a
  stale revision never matches again and no token is given twice), then deleted where it
  was.
- Before the moves, the derived state of dependencies across partitions (mirrors, watches,
  outboxes) is cleared in every partition: the writes rebuild it for the new count.
- After them, the sessions of the stopped engines end in every partition of the old count;
  the new count's partition 0 gives the ids on from the highest given.

Stopped anywhere, it can be run again with the same arguments: a run already inserted in
its new partition (same record) is only deleted where it was, one already rewritten is
rewritten again. Waiters may become claimable once after it (their dependencies' revisions
changed): an engine that finds nothing changed waits again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..core.driver import Durability, check_io, text
from ..core.errors import AlreadyExists, ConcurrentUpdate, Corrupt, Misconfigured, NotFound
from ..core.keys import Keyspace
from ..core.partitioned_repository import PartitionedRepositoryOps
from ..core.partitions import PartitionedOps, check_partitions, partition_of
from ..core.repository_ops import RepositoryOps
from ..core.runops import RunOps
from ..core.runs import MIGRATE_COUNT, Discover, Release
from ..shells.sync import Transport
from .security import glob_escape


@dataclass(frozen=True)
class Repartitioned:
    """What :func:`repartition` (or :func:`repartition_repository`) did: runs (records)
    moved to another partition, runs written again in theirs (records that stay are not
    touched: 0), damaged ones left where they were (``quarantined()`` lists nothing for
    them: find them by ``redisstore inspect``), and the count before and after."""

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
                          partitions=count).repartitioning().parts


def _record(client: Any, namespace: str, span: int, count: int) -> None:
    """Record ``count`` in the meta of partitions 0 to ``span - 1``: every script of a store
    of partitions compares its own with it (0: being repartitioned, every store refused;
    1: the namespace's own keys hold the runs)."""
    for p in range(span):
        client.hset(Keyspace(namespace, p).meta, "partitions", count)


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
    moves runs: the namespace's instance repository keeps its own count and records
    (:func:`repartition_repository` changes those)."""
    to = check_partitions(to)
    durability, timeout = check_io(durability, timeout)
    before, under_way = recorded_count(client, namespace)
    if _done(f"namespace {namespace!r}", "repartition", before, under_way, to):
        return Repartitioned(0, 0, 0, before, to)
    meta = Keyspace(namespace).meta
    # Under way until the end: stores of partitions refuse the namespace meanwhile (their
    # count check reads it), and a run of this step stopped anywhere resumes from here.
    client.hset(meta, mapping={"repartition-from": before, "repartition-to": to})
    # The namespace's own meta says "layout 5, one partition" by its field v5 (the one
    # read a store of one partition makes): not once it is spread over partitions.
    client.hdel(meta, "v5")
    # Every partition of either count is marked too: a store opened before the step, whose
    # calls never read the namespace's own meta again, is refused by each partition's.
    span = max(before, to) if max(before, to) > 1 else 0
    _record(client, namespace, span, 0)
    if to == 1:
        # The namespace's own keys take the runs back, whose scripts refuse a recorded
        # count.
        client.hdel(meta, "partitions")
    io = Transport(client, durability, timeout)
    old = _ops(namespace, before, discover, projection_version, durability)
    new = _ops(namespace, to, discover, projection_version, durability)
    for ops in (*old, *new):
        ops.checks = io.checks
        while not io.drive(ops.migrate_step(MIGRATE_COUNT))[1]:
            pass  # an older layout moved to 5 first (the scripts refuse it)
    for ops in {o.keys.prefix: o for o in (*old, *new)}.values():
        _clear_dependencies(client, ops.keys)
    floors: dict[str, tuple[int, int]] = {}
    arrived: set[str] = set()  # moved in earlier in this step: not written twice
    moved = rewritten = damaged = 0
    for source in old:
        stem = source.keys.run("")
        for key in list(_scan(client, source.keys.meta, glob_escape(stem) + "*")):
            run = key.decode("utf-8", "surrogateescape")[len(stem):]
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
            token = current.token or _last_token(client, source.keys.run(run))
            _raise_floor(client, target.keys, current.revision, token, floors)
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
    _end_sessions(client, [o.keys for o in old], new[0].keys)
    _record(client, namespace, span, to)
    if to > 1:
        client.hset(meta, "partitions", to)
        # The moves wrote through the namespace's own keys too, which record v5 again: it
        # says "one partition" to a store of one, which then reads no count.
        client.hdel(meta, "v5")
    client.hdel(meta, "repartition-from", "repartition-to")
    return Repartitioned(moved, rewritten, damaged, before, to)


def _done(what: str, step: str, before: int, under_way: int | None, to: int) -> bool:
    """Whether ``what`` is at ``to`` already; refuse another count than the one a stopped
    ``step`` moves it to."""
    if under_way is not None and under_way != to:
        raise Misconfigured(
            f"{what} is being repartitioned from {before} to {under_way} partitions (a "
            f"{step} stopped before its end): finish it first, {step}(..., {under_way}); "
            "nothing was moved")
    return before == to and under_way is None


def _raise_floor(client: Any, keys: Keyspace, revision: int, token: int,
                 floors: dict[str, tuple[int, int]]) -> None:
    """Raise the partition's ``deleted-rev`` to ``revision`` and ``deleted-tok`` to
    ``token``: an insert there starts above both, so a run moved in never goes back to a
    revision it had, nor gives a grant token it gave (a zombie's fenced write would land)."""
    got = floors.get(keys.prefix)
    if got is None:
        rev, tok = client.hmget(keys.meta, "deleted-rev", "deleted-tok")
        got = (int(rev or 0), int(tok or 0))
    if revision > got[0]:
        client.hset(keys.meta, "deleted-rev", revision)
    if token > got[1]:
        client.hset(keys.meta, "deleted-tok", token)
    floors[keys.prefix] = (max(revision, got[0]), max(token, got[1]))


def _last_token(client: Any, key: str) -> int:
    """The last grant token of the run at ``key`` (0: none), which ``get`` gives only
    while the run is held: the third number of its layout 5 header (lua/_lib/keys.lua).
    The run was just read whole by the script, so its header is sound."""
    size = client.strlen(key)
    end = client.getrange(key, max(size - 7, 0), size - 1)
    digits = int(end[-1:])
    region = int(end[-1 - digits:-1])
    start = size - 1 - digits - region
    numbers = client.getrange(key, start, start + min(region, 64) - 1).split(b",", 3)
    return int(numbers[2]) if numbers[2] else 0


def _end_sessions(client: Any, old: list[Keyspace], first: Keyspace) -> None:
    """End the sessions of the stopped engines, whose runs the moves freed: their records,
    entries, run sets and told lists go from every partition of the old count (the new
    count's partitions are of it, or hold none), and the new count's partition 0, which
    gives the ids from now on, goes on from the highest id given (a session id is never
    given twice)."""
    given = max(int(client.get(keys.session_seq) or 0) for keys in (*old, first))
    for keys in old:
        stale = [keys.sessions, keys.session_leases,
                 *_scan(client, keys.meta, glob_escape(keys.session_runs("")) + "*"),
                 *_scan(client, keys.meta, glob_escape(keys.session_told("")) + "*")]
        for start in range(0, len(stale), 500):
            client.delete(*stale[start:start + 500])
    if given:
        client.set(first.session_seq, given)


def _clear_dependencies(client: Any, keys: Keyspace) -> None:
    """Drop a partition's mirrors, outbox and watches (with their numbers, and the unwatches
    begun there): the moves rebuild them."""
    client.delete(keys.depv, keys.outbox, keys.unwatched, keys.unwatch, keys.watch_seq)
    watches = list(_scan(client, keys.meta, glob_escape(keys.watch("")) + "*"))
    for start in range(0, len(watches), 500):
        client.delete(*watches[start:start + 500])


# ---------------------------------------------------------------------------- the repository


def repository_count(client: Any, namespace: str) -> tuple[int, int | None]:
    """The partition count of the namespace's instance repository as recorded (1 when none
    is), and the count :func:`repartition_repository` moves it to (None: none is under
    way; then the first is the count it moves from)."""
    keys = Keyspace(namespace)
    moving, got = client.get(keys.repo_repartition), client.get(keys.repo_partitions)
    try:
        # As the scripts read it: a recorded count is never 1 (one partition records none).
        count = None if got is None else _count(got, 2)
        if moving is None:
            return (1 if count is None else count), None
        started, target = (_count(part, 1) for part in text(moving).split(" "))
        # What the step itself writes: two counts that differ, and the count it started
        # from still recorded (until it ends), or none (from one, or to one once deleted).
        if started == target or (count is not None and count != started) or (
                count is None and started > 1 and target > 1):
            raise ValueError("not a step's")
        return started, target
    except (TypeError, ValueError):
        raise Corrupt("", f"{keys.repo_repartition} or {keys.repo_partitions} holds no "
                          f"partition count this step wrote ({moving!r}, {got!r}); nothing "
                          "was moved") from None


def _count(raw: bytes | str, lowest: int) -> int:
    """A partition count in decimal, ``lowest`` to the highest (else ValueError)."""
    value = text(raw)
    if not value.isdigit() or value != str(int(value)):
        raise ValueError(value)
    count = check_partitions(int(value))
    if count < lowest:
        raise ValueError(value)
    return count


def _ids(client: Any, source: RepositoryOps) -> Iterator[str]:
    """The ids of a partition's records: the terminal ones first, oldest first (they join
    their new partition's eviction order as they arrive), then the others."""
    stem = source.keys.instance("")
    first = [text(id) for id in client.zrange(source.keys.terminal, 0, -1)] \
        if client.type(source.keys.terminal) in (b"zset", "zset") else []
    yield from first
    seen = set(first)
    for key in list(_scan(client, source.keys.groups, glob_escape(stem) + "*")):
        id = text(key)[len(stem):]
        if id not in seen:
            yield id


def _repository_ops(namespace: str, count: int) -> list[RepositoryOps]:
    """The operations of each partition of a repository of ``count``."""
    if count == 1:
        return [RepositoryOps(namespace)]
    return PartitionedRepositoryOps(namespace, partitions=count).repartitioning().parts


def repartition_repository(client: Any, namespace: str, to: int, *,
                           timeout: int = 5000) -> Repartitioned:
    """Spread ``namespace``'s instance repository over ``to`` partitions (1: one, the
    namespace's own keys), with every engine of it stopped; the repositories then open it
    with ``partitions=to``. Each record whose partition changes is written in its new one
    with its ``rec_version`` (an engine's next save, or a fenced delete, still matches)
    and then deleted where it was; a record that stays is not touched. Every registered
    group is registered in every new partition first. Safe to run again after it stopped
    (a record already moved, same version, is only deleted where it was); a namespace
    already at ``to`` is left alone. Repositories of partitions refuse the namespace while
    it runs (a repository of one partition is not stopped by it: stop the engines). Terminal
    records join their new partition's eviction order as they arrive; ``max_terminal`` is
    applied by the engines' next saves. The run store's count is apart
    (:func:`repartition`)."""
    to = check_partitions(to)
    _, timeout = check_io(None, timeout)
    before, under_way = repository_count(client, namespace)
    if _done(f"namespace {namespace!r}'s repository", "repartition_repository", before,
             under_way, to):
        return Repartitioned(0, 0, 0, before, to)
    keys = Keyspace(namespace)
    # Under way until the end: repositories of partitions refuse the namespace meanwhile
    # (their count check reads it), and a run of this step stopped anywhere resumes.
    client.set(keys.repo_repartition, f"{before} {to}")
    # Every partition of either count is marked too: a repository opened before the step,
    # which never reads the namespace's own count again, is refused by each partition.
    span = max(before, to) if max(before, to) > 1 else 0
    for p in range(span):
        client.set(Keyspace(namespace, p).repo_partitions, 0)
    if to == 1:
        # The namespace's own keys take the records back, whose scripts refuse a count.
        client.delete(keys.repo_partitions)
    io = Transport(client, None, timeout)
    old = _repository_ops(namespace, before)
    new = _repository_ops(namespace, to)
    groups: set[str] = set()
    for ops in old:
        groups |= {text(group) for group in client.smembers(ops.keys.groups)}
    for ops in new:
        io.drive(ops.record_layout())  # a newer layout anywhere stops the step here
        for group in sorted(groups):
            try:
                io.drive(ops.register_group(group))
            except ValueError:  # no group's name (a foreign write): no record is in it
                continue
    moved = damaged = 0
    for source in old:
        for id in _ids(client, source):
            target = new[partition_of(id, to)]
            if target.keys.prefix == source.keys.prefix:
                continue  # it stays where it is, as it is
            try:
                record = io.drive(source.load(id))
            except (Corrupt, ValueError):  # a damaged record, a key no id names
                damaged += 1
                continue
            if record is None:
                continue
            try:
                io.drive(target.place(record))
            except ValueError:  # loads, but no save could write it (at the top version)
                damaged += 1
                continue
            except ConcurrentUpdate:
                raise Misconfigured(
                    f"record {id!r} is in partition {source.keys.prefix} and, with another "
                    f"version, in {target.keys.prefix}: not a copy this step made (the "
                    "engines must be stopped); nothing more was moved") from None
            # The same version there may still be another record (foreign data, an engine
            # that ran): only a copy of this one lets this one go.
            if io.drive(target.load(id)) != record:
                raise Misconfigured(
                    f"record {id!r} is in partition {source.keys.prefix} and, with other "
                    f"contents, in {target.keys.prefix}: not a copy this step made (the "
                    "engines must be stopped); nothing more was moved")
            io.drive(source.delete(id, expected_version=record.rec_version))
            moved += 1
    for p in range(span):
        client.set(Keyspace(namespace, p).repo_partitions, to)
    if to > 1:
        client.set(keys.repo_partitions, to)
    client.delete(keys.repo_repartition)
    return Repartitioned(moved, 0, damaged, before, to)
