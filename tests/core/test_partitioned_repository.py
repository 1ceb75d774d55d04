"""The instance repository over partitions (``partitions=N``): where records go, the count it
shares with the run store, the calls over every partition, the cap in each partition, and
what a cut-short call leaves. The conformance suite runs on it too (test_conformance_*)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
from servers import Server, unique_namespace
from test_partitions import keys_of

from redisstore import (
    ConcurrentUpdate,
    Corrupt,
    InstanceLease,
    InstanceRecord,
    Misconfigured,
    RedisRepository,
    RedisRunStore,
    Release,
    Unavailable,
    UnknownGroup,
    repartition,
)
from redisstore.core.keys import Keyspace
from redisstore.core.partitioned_repository import PartitionedRepositoryOps
from redisstore.core.partitions import partition_of

GROUP = "engines"
T0 = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def record(id: str, **fields: Any) -> InstanceRecord:
    return InstanceRecord(id=id, group=GROUP, payload=b"p", **fields)


def repo(client: Any, ns: str, n: int = 4, **options: Any) -> RedisRepository:
    made = RedisRepository(client, namespace=ns, partitions=n, **options)
    made.register_group(GROUP)
    return made


def test_a_record_is_in_its_ids_partition_beside_the_run_of_that_id() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    records = repo(client, ns)
    runs = RedisRunStore(client, namespace=ns, partitions=4)
    ids = [f"i{i}" for i in range(40)] + ["{fam}a", "{fam}b"]
    for id in ids:
        records.save(record(id))
        runs.insert(id, b"r", Release())
    for id in ids:
        keys = Keyspace(ns, partition_of(id, 4))
        assert client.exists(keys.instance(id)) and client.exists(keys.run(id))
    assert len({partition_of(id, 4) for id in ids}) == 4  # every partition holds some
    assert partition_of("{fam}a", 4) == partition_of("{fam}b", 4)
    assert sorted(records.list_in_flight(GROUP, T0)) == sorted(ids)


def test_the_count_is_recorded_and_another_is_refused_with_nothing_written() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    repo(client, ns, 4).save(record("i1"))
    assert client.get(Keyspace(ns).repo_partitions) == b"4"
    before = keys_of(client)
    for count in (2, 6):
        with pytest.raises(Misconfigured, match="partitions=4") as refused:
            RedisRepository(client, namespace=ns, partitions=count).load("i1")
        assert "repartition_repository changes it" in str(refused.value)
    # A repository of one partition is refused by every script (it reads the count).
    one = RedisRepository(client, namespace=ns)
    for call in (lambda: one.load("i1"), lambda: one.save(record("i1")),
                 lambda: one.delete("i1"), lambda: one.register_group("other"),
                 lambda: one.group_exists(GROUP), lambda: one.list_in_flight(GROUP, T0),
                 lambda: one.list_in_flight_page(GROUP, T0), one.migrate):
        with pytest.raises(Misconfigured, match="spread over 4 partitions"):
            call()
    assert keys_of(client) == before
    assert RedisRepository(client, namespace=ns, partitions=4).load("i1") is not None


def test_the_run_store_and_the_repository_of_a_namespace_keep_their_own_counts() -> None:
    """A run store of 6 partitions beside a repository of one (as earlier versions laid a
    namespace out), and a repository of 3 beside runs of one: each keeps its own count, and
    each is refused only by its own."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    runs = RedisRunStore(client, namespace=ns, partitions=6)
    runs.insert("r", b"x", Release())
    records = repo(client, ns, 1)
    records.save(record("i1"))
    assert records.load("i1") is not None and runs.get("r").revision == 1
    with pytest.raises(Misconfigured, match="used by a repository of one partition"):
        RedisRepository(client, namespace=ns, partitions=6).load("i1")
    other = unique_namespace()
    RedisRunStore(client, namespace=other).insert("r", b"x", Release())
    three = repo(client, other, 3)
    three.save(record("i1"))
    assert RedisRunStore(client, namespace=other).get("r").revision == 1
    with pytest.raises(Misconfigured, match="used by a store of one partition"):
        RedisRunStore(client, namespace=other, partitions=3).get("r")
    assert three.load("i1") is not None


def test_a_namespace_used_by_a_repository_of_one_partition_stays_one() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    RedisRepository(client, namespace=ns).register_group(GROUP)  # not a single record yet
    before = keys_of(client)
    with pytest.raises(Misconfigured, match="used by a repository of one"):
        RedisRepository(client, namespace=ns, partitions=3).register_group(GROUP)
    assert keys_of(client) == before


@pytest.mark.parametrize("value", ["1", "x", "257", "04"])
def test_a_damaged_count_is_corrupt_and_nothing_is_written(value: str) -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    client.set(Keyspace(ns).repo_partitions, value)
    before = keys_of(client)
    for count in (1, 3):
        with pytest.raises(Corrupt, match="repo-partitions"):
            RedisRepository(client, namespace=ns, partitions=count).register_group(GROUP)
    assert keys_of(client) == before
    client.delete(Keyspace(ns).repo_partitions)
    client.hset(Keyspace(ns).repo_partitions, "a", "b")  # another type
    for count in (1, 3):
        with pytest.raises(Corrupt, match="repo-partitions"):
            RedisRepository(client, namespace=ns, partitions=count).load("i")


PLANTED = 8 << 20  # bytes of a value planted in a key a script reads


def script_us(server: Server, call: Any) -> int:
    """The fastest of three runs of ``call()`` (which must raise Corrupt), in SLOWLOG's µs
    of its EVALSHA: the least of three, so another process's load cannot make it slow."""
    admin = server.client()
    admin.config_set("slowlog-log-slower-than", 0)
    best = None
    for _ in range(3):
        admin.slowlog_reset()
        with pytest.raises(Corrupt) as raised:
            call()
        assert "repo-" in str(raised.value), raised.value
        spent = [int(e["duration"]) for e in admin.slowlog_get(128)
                 if bytes(e["command"]).upper().startswith(b"EVALSHA")]
        assert spent, "SLOWLOG has no EVALSHA"
        best = max(spent) if best is None else min(best, max(spent))
    assert best is not None
    return best


@pytest.mark.server
def test_a_big_value_planted_as_the_count_is_corrupt_at_once(own_redis7: Server) -> None:
    """An 8 MB value in {ns}:repo-partitions (or repo-layout) is Corrupt, unread: the
    scripts ask its length first (reading it whole took 34 ms of the server's time)."""
    client = own_redis7.client()
    ns = unique_namespace()
    client.set(Keyspace(ns).repo_partitions, b"9" * PLANTED)
    before = keys_of(client)
    spent = {
        "repo_partitions": script_us(own_redis7, lambda: RedisRepository(
            client, namespace=ns, partitions=3).register_group(GROUP)),
        "spread (repo_load)": script_us(own_redis7, lambda: RedisRepository(
            client, namespace=ns).load("i1")),
        "spread (repo_save)": script_us(own_redis7, lambda: RedisRepository(
            client, namespace=ns).save(record("i1"))),
    }
    assert keys_of(client) == before
    other = unique_namespace()
    client.set(Keyspace(other).layout, b"1" * PLANTED)
    before = keys_of(client)
    spent["repo_migrate (repo-layout)"] = script_us(
        own_redis7, lambda: RedisRepository(client, namespace=other).migrate())
    assert keys_of(client) == before
    slow = {name: us for name, us in spent.items() if us >= 5_000}
    assert slow == {}, f"µs of SLOWLOG per script: {spent}"
    client.delete(Keyspace(ns).repo_partitions, Keyspace(other).layout)


def test_a_damaged_run_store_meta_never_reaches_the_repository() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    records = repo(client, ns, 1)
    records.save(record("i1"))
    client.set(Keyspace(ns).meta, "not a hash")
    assert records.load("i1") is not None
    assert repo(client, unique_namespace(), 3).load("i1") is None


def test_a_count_planted_in_a_partitions_meta_walls_nothing() -> None:
    """Foreign data: a count in a partition's own meta (no script records one there) is
    ignored by the run and repository scripts of that partition."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    three = repo(client, ns, 3)
    store = RedisRunStore(client, namespace=ns, partitions=3)
    for p in range(3):
        client.hset(Keyspace(ns, p).meta, "partitions", 3)
        client.set(Keyspace(ns, p).repo_partitions, 3)
    for i in range(9):
        three.save(record(f"i{i}"))
        store.insert(f"r{i}", b"x", Release())
    assert len(three.list_in_flight(GROUP, T0)) == 9 and store.get("r1").revision == 1


def test_bad_arguments_raise_before_the_count_is_recorded() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    fresh = RedisRepository(client, namespace=ns, partitions=3)
    for call in (lambda: fresh.save("not a record"), lambda: fresh.load(""),
                 lambda: fresh.delete("i", expected_version=-1),
                 lambda: fresh.register_group(""), lambda: fresh.group_exists(""),
                 lambda: fresh.list_in_flight(GROUP, datetime(2031, 1, 1)),
                 lambda: fresh.list_in_flight_page(GROUP, cursor="0|x|y"),
                 lambda: fresh.list_in_flight_page(GROUP, limit=0)):
        with pytest.raises((ValueError, TypeError)):
            call()
    assert keys_of(client) == {}


@pytest.mark.parametrize("cursor", ["P3|0||", "P-1|0||", "P01|0||", "0|1|i", "P0|x||",
                                    "P0|0|1|", "P0|0||i", "Q0|0||"])
def test_a_cursor_that_no_page_of_this_repository_gave_is_refused(cursor: str) -> None:
    with pytest.raises(ValueError, match="cursor"):
        repo(fakeredis.FakeRedis(), unique_namespace(), 3).list_in_flight_page(
            GROUP, T0, cursor=cursor)


def test_the_cap_holds_in_each_partition_and_never_evicts_sooner_than_one() -> None:
    """max_terminal=2 over 3 partitions: each partition keeps its 2 newest terminal records,
    so a record goes only once 2 newer ones of its own partition are terminal, which a
    repository of one partition would have evicted it for too."""
    client = fakeredis.FakeRedis()
    warnings: list[str] = []

    class Recording(logging.Logger):
        def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
            warnings.append(str(msg) % args)

    many = repo(client, unique_namespace(), 3, max_terminal=2, logger=Recording("r"))
    one = repo(client, unique_namespace(), 1, max_terminal=2)
    ids = [f"t{i}" for i in range(12)]
    for id in ids:
        for r in (many, one):
            r.save(record(id, status="completed"))
    kept_many = {id for id in ids if many.load(id) is not None}
    kept_one = {id for id in ids if one.load(id) is not None}
    assert kept_one <= kept_many and len(kept_many) == 6
    for p in range(3):  # the 2 newest of each partition
        mine = [id for id in ids if partition_of(id, 3) == p]
        assert {id for id in mine if id in kept_many} == set(mine[-2:])
    assert len(warnings) == 6 and all("in its partition" in w for w in warnings)


def test_a_registration_cut_short_reads_as_absent_and_is_completed_by_registering_again(
        ) -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    three = RedisRepository(client, namespace=ns, partitions=3)
    three.register_group(GROUP)
    client.srem(Keyspace(ns, 2).groups, GROUP)  # as if partition 2's node missed it
    assert three.group_exists(GROUP) is False
    absent = next(f"i{i}" for i in range(50) if partition_of(f"i{i}", 3) == 2)
    present = next(f"i{i}" for i in range(50) if partition_of(f"i{i}", 3) == 0)
    three.save(record(present))
    with pytest.raises(UnknownGroup):
        three.save(record(absent))
    assert three.load(absent) is None
    three.register_group(GROUP)
    assert three.group_exists(GROUP) is True
    assert three.save(record(absent)) == 1


def test_a_listing_with_the_servers_clock_uses_partition_zeros_for_every_partition() -> None:
    """now=None: the first page (partition 0's) reads the clock, the others use it; with a
    lease that ends between the two, the record is listed by the clock of the first."""
    client = fakeredis.FakeRedis()
    three = repo(client, unique_namespace(), 3)
    ops = three._ops
    assert isinstance(ops, PartitionedRepositoryOps)
    calls: list[tuple[int | None, str]] = []
    real = type(ops.parts[0]).page

    def page(self: Any, group: str, at: str, limit: int, after: Any) -> Any:
        calls.append((self.keys.partition, at))
        return (yield from real(self, group, at, limit, after))

    type(ops.parts[0]).page = page  # type: ignore[method-assign]
    try:
        three.save(record("i1", lease=InstanceLease(datetime.now(UTC) - timedelta(days=1),
                                                     "n", 1)))
        assert three.list_in_flight(GROUP) == ["i1"]
    finally:
        type(ops.parts[0]).page = real  # type: ignore[method-assign]
    assert calls[0] == (0, "") and len(calls) == 3
    assert {at for _, at in calls[1:]} == {calls[1][1]} and calls[1][1] != ""


def test_pages_span_partitions_and_list_what_the_whole_listing_lists() -> None:
    client = fakeredis.FakeRedis()
    five = repo(client, unique_namespace(), 5)
    ids = [f"i{i:02}" for i in range(23)]
    for id in ids:
        five.save(record(id))
    for limit in (1, 4, 30):
        flat, cursor, pages = [], None, 0
        while True:
            page = five.list_in_flight_page(GROUP, T0, cursor=cursor, limit=limit)
            assert len(page.ids) <= limit
            flat += page.ids
            pages += 1
            if page.cursor is None:
                break
            cursor = page.cursor
        assert flat == five.list_in_flight(GROUP, T0) and sorted(flat) == ids
        if limit == 30:
            assert pages == 1  # a page goes on into the next partitions
    assert repo(client, unique_namespace(), 5).list_in_flight_page(GROUP, T0).cursor is None


def test_a_listing_whose_partition_fails_raises_rather_than_answer_part_of_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = fakeredis.FakeRedis()
    three = repo(client, unique_namespace(), 3)
    for i in range(20):
        three.save(record(f"i{i}"))
    client.delete(Keyspace(three.namespace, 1).inflight(GROUP))
    client.set(Keyspace(three.namespace, 1).inflight(GROUP), "damaged")
    with pytest.raises(Corrupt):
        three.list_in_flight(GROUP, T0)


def test_a_registration_that_one_partition_misses_is_of_unknown_outcome() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    three = RedisRepository(client, namespace=ns, partitions=3)
    three.migrate()
    client.set(Keyspace(ns, 1).groups, "damaged")  # partition 1 refuses, the others add
    with pytest.raises(Unavailable) as raised:
        three.register_group(GROUP)
    assert raised.value.outcome == "unknown"
    assert client.sismember(Keyspace(ns, 0).groups, GROUP)


def test_repartition_moves_runs_and_leaves_the_repository_as_it_is() -> None:
    client = fakeredis.FakeRedis()
    for count in (1, 3):
        ns = unique_namespace()
        records = repo(client, ns, count)
        records.save(record("i1"))
        RedisRunStore(client, namespace=ns).insert("r", b"x", Release())
        done = repartition(client, ns, 4)
        assert done.after == 4
        again = RedisRepository(client, namespace=ns, partitions=count)
        assert again.load("i1") is not None and again.list_in_flight(GROUP, T0) == ["i1"]
        assert RedisRunStore(client, namespace=ns, partitions=4).get("r").record == b"x"


def test_a_record_planted_in_another_partition_is_never_listed() -> None:
    """Foreign data: a copy of a record in a partition that is not its id's (listed twice,
    and, once the real one is deleted, listed with no call able to load or delete it)."""
    client = fakeredis.FakeRedis()
    three = repo(client, unique_namespace(), 3)
    id = next(f"i{i}" for i in range(99) if partition_of(f"i{i}", 3) == 2)
    three.save(record(id))
    wrong = Keyspace(three.namespace, 1)
    client.hset(wrong.instance(id), mapping={"v": 1, "pl": b"x", "g": GROUP, "t": "", "x": "",
                                             "xo": 0, "o": "", "n": 0, "s": "active", "k": "c"})
    client.zadd(wrong.inflight(GROUP), {id: "-inf"})
    assert three.list_in_flight(GROUP, T0) == [id]
    assert three.list_in_flight_page(GROUP, T0).ids == (id,)
    three.delete(id)
    assert three.list_in_flight(GROUP, T0) == [] and three.load(id) is None


@pytest.mark.parametrize("partition", [0, 2])
def test_migrate_stops_on_a_newer_layout_in_any_partition(partition: int) -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    client.set(Keyspace(ns, partition).layout, "2")
    with pytest.raises(Misconfigured, match="newer than this library's"):
        RedisRepository(client, namespace=ns, partitions=3).migrate()


@pytest.mark.parametrize("ids", ["one family", "many", "mixed"])
@pytest.mark.parametrize("max_terminal", [10**6, 2])
@pytest.mark.parametrize("seed", range(8))
def test_a_repository_of_partitions_answers_as_a_memory_reference_per_partition(
        seed: int, max_terminal: int, ids: str) -> None:
    """Random histories of saves (any group, status, lease, version), fenced and unfenced
    deletes, loads and listings (whole and in pages of any limit): a repository of 3
    partitions answers as one MemoryRepository per partition does (the cap holds in each),
    and, without a cap, as one MemoryRepository."""
    import random

    from redisstore import ConcurrentUpdate, MemoryRepository

    rng = random.Random(seed)
    names = {"one family": [f"{{fam}}i{i}" for i in range(10)],
             "many": [f"i{i}" for i in range(10)],
             "mixed": [f"{{f{i % 3}}}x{i}" for i in range(10)] + ["a|b", "é|{x"]}[ids]
    logging.disable(logging.WARNING)
    try:
        store = RedisRepository(fakeredis.FakeRedis(), namespace=unique_namespace(),
                                partitions=3, max_terminal=max_terminal)
        parts = [MemoryRepository(max_terminal=max_terminal) for _ in range(3)]
        whole = MemoryRepository(max_terminal=max_terminal)
        models = [*parts, whole] if max_terminal > 100 else parts

        def outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return call(*args, **kwargs)
            except (ConcurrentUpdate, UnknownGroup) as refused:
                return type(refused).__name__

        for group in ("g1", "g2"):
            store.register_group(group)
            for model in models:
                model.register_group(group)
        for _ in range(80):
            id, k = rng.choice(names), rng.random()
            mine = parts[partition_of(id, 3)]
            if k < 0.5:
                now = mine.load(id)
                version = now.rec_version if now else 0
                if rng.random() < 0.15:
                    version = rng.choice([0, 1, 2, version + 1])
                expiry = (None if rng.random() < 0.3
                          else T0 + timedelta(seconds=rng.randrange(-100, 100)))
                rec = InstanceRecord(id, bytes([rng.randrange(256)]),
                                     rng.choice(["g1", "g2", "unregistered"]),
                                     lease=InstanceLease(expiry, "o", 1), rec_version=version,
                                     status=rng.choice(["active", "suspended", "completed",
                                                        "terminated", "custom"]))
                got = outcome(store.save, rec)
                assert got == outcome(mine.save, rec)
                if max_terminal > 100:
                    assert got == outcome(whole.save, rec)
            elif k < 0.6:
                now = mine.load(id)
                fence = None if rng.random() < 0.5 else (now.rec_version if now else 1)
                got = outcome(store.delete, id, expected_version=fence)
                for model in ([mine, whole] if max_terminal > 100 else [mine]):
                    assert got == outcome(model.delete, id, expected_version=fence)
            elif k < 0.75:
                assert store.load(id) == mine.load(id)
            else:
                group = rng.choice(["g1", "g2", "unregistered"])
                at = T0 + timedelta(seconds=rng.randrange(-120, 120))
                listed = store.list_in_flight(group, at)
                assert sorted(listed) == sorted(x for m in parts
                                                for x in m.list_in_flight(group, at))
                if max_terminal > 100:
                    assert sorted(listed) == sorted(whole.list_in_flight(group, at))
                limit, paged, cursor = rng.choice([1, 2, 5, 1000]), [], None
                while True:
                    page = store.list_in_flight_page(group, at, cursor=cursor, limit=limit)
                    assert len(page.ids) <= limit
                    paged += page.ids
                    if page.cursor is None:
                        break
                    cursor = page.cursor
                assert paged == listed
    finally:
        logging.disable(logging.NOTSET)


# ---------------------------------------------------------------------------- changing the count


def _history(records: RedisRepository, ids: list[str]) -> dict[str, InstanceRecord]:
    """Records of every class at versions 1 to 3: leased, unleased, suspended, terminal;
    two groups; families; the stored records."""
    from redisstore import Status

    records.register_group("other")
    for n, id in enumerate(ids):
        rec = InstanceRecord(id=id, group=GROUP if n % 3 else "other", payload=f"{n}".encode())
        for _ in range(n % 3):  # versions 1, 2, 3
            rec = InstanceRecord(id=id, group=rec.group, payload=rec.payload + b"+",
                                 rec_version=records.save(rec))
        status = [Status.ACTIVE, Status.SUSPENDED, Status.COMPLETED, Status.ACTIVE][n % 4]
        lease = InstanceLease(T0 + timedelta(seconds=n), f"node-{n}", n) if n % 2 else \
            InstanceLease()
        records.save(InstanceRecord(id=id, group=rec.group, payload=rec.payload,
                                    status=status, lease=lease, rec_version=rec.rec_version))
    return {id: got for id in ids if (got := records.load(id)) is not None}


@pytest.mark.parametrize(("before", "to"), [(1, 4), (4, 1), (4, 6), (6, 3)])
def test_repartition_repository_moves_every_record_with_its_version(before: int,
                                                                    to: int) -> None:
    from redisstore import repartition_repository

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    old = repo(client, ns, before)
    ids = [f"i{i}" for i in range(30)] + ["{fam}a", "{fam}b", "ü|x"]
    stored = _history(old, ids)
    listed = {g: sorted(old.list_in_flight(g, T0)) for g in (GROUP, "other")}
    done = repartition_repository(client, ns, to)
    assert (done.before, done.after, done.damaged) == (before, to, 0)
    assert done.moved == sum(partition_of(id, before) != partition_of(id, to)
                             or (before == 1) != (to == 1) for id in ids)
    new = RedisRepository(client, namespace=ns, partitions=to)
    assert {id: new.load(id) for id in ids} == stored  # versions, leases, payloads
    assert {g: sorted(new.list_in_flight(g, T0)) for g in (GROUP, "other")} == listed
    assert new.group_exists(GROUP) and new.group_exists("other")
    # An engine's next save, with the version it had, matches; a stale one does not.
    rec = stored["i5"]
    assert new.save(rec) == rec.rec_version + 1
    with pytest.raises(ConcurrentUpdate):
        new.save(rec)
    spaces = [Keyspace(ns), *(Keyspace(ns, p) for p in range(max(before, to)))]
    for id in ids:  # each record in its new partition only: nothing left where it was
        home = Keyspace(ns, partition_of(id, to) if to > 1 else None)
        assert [k.prefix for k in spaces if client.exists(k.instance(id))] == [home.prefix]
    with pytest.raises(Misconfigured):
        RedisRepository(client, namespace=ns, partitions=before).load("i1")
    assert repartition_repository(client, ns, to).moved == 0  # already there


@pytest.mark.parametrize("stop", ["place", "delete"])
def test_repartition_repository_stopped_halfway_is_refused_meanwhile_and_finishes_again(
        monkeypatch: pytest.MonkeyPatch, stop: str) -> None:
    """Stopped after some moves (or between a record's copy and the delete of where it
    was): repositories of partitions refuse the namespace, another count is refused, and
    the same step run again finishes with every record once, at its version."""
    from redisstore import repartition_repository
    from redisstore.core.repository_ops import RepositoryOps

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    ids = [f"i{i}" for i in range(24)]
    stored = _history(repo(client, ns, 3), ids)
    real = getattr(RepositoryOps, stop)
    calls = {"n": 0}

    def failing(self: RepositoryOps, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("the step's process died")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RepositoryOps, stop, failing)
    with pytest.raises(RuntimeError):
        repartition_repository(client, ns, 5)
    monkeypatch.setattr(RepositoryOps, stop, real)
    for count in (3, 5):
        with pytest.raises(Misconfigured, match="being repartitioned"):
            RedisRepository(client, namespace=ns, partitions=count).load("i1")
    with pytest.raises(Misconfigured, match="finish it first"):
        repartition_repository(client, ns, 4)
    repartition_repository(client, ns, 5)
    new = RedisRepository(client, namespace=ns, partitions=5)
    assert {id: new.load(id) for id in ids} == stored
    assert not client.exists(Keyspace(ns).repo_repartition)


def test_a_record_of_another_version_where_one_moves_stops_the_step() -> None:
    """A record already in the new partition with another version is not a copy the step
    made (an engine ran meanwhile, or foreign data): the step stops, that record stays
    where it was, nothing is overwritten."""
    from redisstore import repartition_repository
    from redisstore.core.repository_ops import RepositoryOps
    from redisstore.shells.sync import Transport

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    ids = [f"i{i}" for i in range(12)]
    stored = _history(repo(client, ns, 2), ids)
    moving = next(id for id in ids if partition_of(id, 2) != partition_of(id, 3))
    there = RepositoryOps(ns, partition=partition_of(moving, 3))
    io = Transport(client)
    io.drive(there.register_group(stored[moving].group))
    io.drive(there.place(InstanceRecord(id=moving, group=stored[moving].group,
                                        payload=b"foreign", rec_version=77)))
    with pytest.raises(Misconfigured, match="another version"):
        repartition_repository(client, ns, 3)
    source = RepositoryOps(ns, partition=partition_of(moving, 2))
    assert io.drive(source.load(moving)) == stored[moving]
    assert io.drive(there.load(moving)).payload == b"foreign"


def test_repartition_repository_leaves_damaged_records_and_refuses_a_damaged_count() -> None:
    from redisstore import repartition_repository

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    ids = [f"i{i}" for i in range(10)]
    stored = _history(repo(client, ns, 2), ids)
    bad = next(id for id in ids if partition_of(id, 2) != partition_of(id, 3))
    client.hset(Keyspace(ns, partition_of(bad, 2)).instance(bad), "v", "x")  # damaged
    foreign = Keyspace(ns, 0).prefix + "inst:"
    client.set(foreign, "no id")  # a key that names no record
    done = repartition_repository(client, ns, 3)
    # The foreign key is damaged where it would move (it stays, as it is, where it is).
    assert done.damaged == 1 + (partition_of("", 3) != 0)
    assert client.get(foreign) == b"no id"
    new = RedisRepository(client, namespace=ns, partitions=3)
    assert {id: new.load(id) for id in ids if id != bad} == {
        id: rec for id, rec in stored.items() if id != bad}
    client.set(Keyspace(ns).repo_partitions, "lots")
    with pytest.raises(Corrupt, match="no partition count"):
        repartition_repository(client, ns, 4)


def test_a_copy_of_the_same_version_with_other_contents_stops_the_step() -> None:
    """Found by review: a record of the same id and version but other contents where one
    moves was taken for the step's own copy, and the real one deleted."""
    from redisstore import repartition_repository
    from redisstore.core.repository_ops import RepositoryOps
    from redisstore.shells.sync import Transport

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    stored = _history(repo(client, ns, 2), [f"i{i}" for i in range(12)])
    moving = next(id for id in stored if partition_of(id, 2) != partition_of(id, 3))
    there = RepositoryOps(ns, partition=partition_of(moving, 3))
    io = Transport(client)
    io.drive(there.register_group(stored[moving].group))
    io.drive(there.place(InstanceRecord(id=moving, group=stored[moving].group,
                                        payload=b"forged",
                                        rec_version=stored[moving].rec_version)))
    with pytest.raises(Misconfigured, match="other contents"):
        repartition_repository(client, ns, 3)
    source = RepositoryOps(ns, partition=partition_of(moving, 2))
    assert io.drive(source.load(moving)) == stored[moving]  # not deleted


@pytest.mark.parametrize(("marker", "count"), [
    ("2 6", "4"),   # the count it started from is not the one recorded
    ("1 1", None),  # no move
    ("4 6", None),  # between partitions, yet no count recorded
    ("x 6", "4"), ("04 6", "4"), ("4 6 8", "4"), ("4  6", "4"),
    (None, "1"),    # a count of one is never recorded (the scripts call it corrupt)
    (None, "0"), (None, "lots"),
])
def test_a_damaged_count_or_marker_is_corrupt_and_nothing_moves(
        marker: str | None, count: str | None) -> None:
    """Found by review: damaged keys were read as a step's, and records left behind."""
    from redisstore import repartition_repository

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    stored = _history(repo(client, ns, 4), [f"i{i}" for i in range(8)])
    before = {k: client.dump(k) for k in client.keys(f"{{{ns}#*")}
    if marker is not None:
        client.set(Keyspace(ns).repo_repartition, marker)
    if count is None:
        client.delete(Keyspace(ns).repo_partitions)
    else:
        client.set(Keyspace(ns).repo_partitions, count)
    with pytest.raises(Corrupt, match="no partition count this step wrote"):
        repartition_repository(client, ns, 1)
    assert {k: client.dump(k) for k in client.keys(f"{{{ns}#*")} == before
    assert len(stored) == 8


def test_a_record_at_the_top_version_is_left_as_damaged_not_a_wall() -> None:
    """Found by review: a record no save could write again stopped every run of the step."""
    from redisstore import repartition_repository

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    stored = _history(repo(client, ns, 2), [f"i{i}" for i in range(8)])
    top = next(id for id in stored if partition_of(id, 2) != partition_of(id, 3))
    client.hset(Keyspace(ns, partition_of(top, 2)).instance(top), "v", str(2**53 - 1))
    done = repartition_repository(client, ns, 3)
    assert done.damaged == 1 and not client.exists(Keyspace(ns).repo_repartition)
    new = RedisRepository(client, namespace=ns, partitions=3)
    assert {id: new.load(id) for id in stored if id != top} == {
        id: rec for id, rec in stored.items() if id != top}
