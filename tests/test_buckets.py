"""Layout 4's bucketed indexes: each run index (the leases, the ready runs, each dependency's
waiters) is a chain of sorted sets of at most 128 entries, which the server keeps as
listpacks, ordered by a directory of lower bounds. Order holds across buckets, buckets
split and vanish as entries come and go, damaged buckets never wall a claim, and
``migrate()`` moves a layout 3 namespace's index entries in bounded steps while the store
is in use."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import redis
from servers import unique_namespace
from test_layout import dump

from redisstore import (
    At,
    Changed,
    Claim,
    Corrupt,
    Quarantined,
    RedisRunStore,
    Release,
)
from redisstore.core.keys import Keyspace

LONG = 600_000


def bucket_keys(client: redis.Redis, keys: Keyspace, index: str) -> list[bytes]:
    """The buckets of ``index`` in order (the first, then the directory's)."""
    directory, prefix = keys.buckets(index)
    bounds = client.zrangebylex(directory, "-", "+")
    return [prefix.encode()] + [prefix.encode() + b for b in bounds]


def check_buckets(client: redis.Redis, keys: Keyspace, index: str) -> int:
    """Every bucket of ``index`` holds at most 128 entries, kept as a listpack (real
    servers), and every directory entry has its bucket; returns the entries in all."""
    total = 0
    found = bucket_keys(client, keys, index)
    for i, key in enumerate(found):
        n = client.zcard(key)
        assert n <= 128, (key, n)
        if i > 0:
            assert n > 0, f"{key!r} is in the directory but empty"
        if n and not isinstance(client, _fake()):
            assert client.object("encoding", key) in (b"listpack", b"ziplist"), key  # 6.2: ziplist
        total += n
    return total


def _fake() -> type:
    import fakeredis

    return fakeredis.FakeRedis


def migrated(client: redis.Redis, **options: Any) -> tuple[RedisRunStore, Keyspace]:
    """A store of a fresh namespace moved to the newest layout, and its keys."""
    store = RedisRunStore(client, namespace=unique_namespace(), **options)
    store.migrate()
    return store, Keyspace(store.namespace)


def holding(client: redis.Redis, n: int, ttl: int) -> tuple[RedisRunStore, Keyspace, list[str]]:
    """A migrated store with n runs held by "a" for ttl ms."""
    store, keys = migrated(client)
    runs = [f"r{i:04}" for i in range(n)]
    for run in runs:
        store.insert(run, b"x", Claim("a", ttl))
    return store, keys, runs


def test_ready_runs_are_claimed_in_order_across_many_buckets(client: redis.Redis) -> None:
    """500 ready runs with tied due times fill several buckets; claims take them by due
    time, ties by run id, exactly as one sorted set would."""
    store, keys = migrated(client, discover=lambda r: At(int(r)))
    runs = {f"run-{random.getrandbits(48):012x}": i % 7 for i in range(500)}
    order = list(runs)
    random.shuffle(order)
    for run in order:
        store.insert(run, str(runs[run]).encode(), Release())
    assert check_buckets(client, keys, "ready") == 500
    assert len(bucket_keys(client, keys, "ready")) >= 4
    claimed: list[str] = []
    while batch := store.claim_ready("n", LONG, 100):
        claimed += batch
        check_buckets(client, keys, "ready")
    assert claimed == sorted(runs, key=lambda r: (runs[r], r))
    assert bucket_keys(client, keys, "ready") == [keys.buckets("ready")[1].encode()]
    assert not client.exists(keys.buckets("ready")[1])


def test_leases_move_between_buckets_as_they_are_renewed_and_released(
        client: redis.Redis) -> None:
    store, keys, runs = holding(client, 400, LONG)
    assert check_buckets(client, keys, "leases") == 400
    # In calls of 100 (renew and release take at most MAX_RENEW runs each).
    assert store.renew("a", runs[:100], 2 * LONG) == runs[:100]
    assert store.renew("a", runs[100:200], 2 * LONG) == runs[100:200]
    assert store.release("a", runs[100:200]) == runs[100:200]
    assert store.release("a", runs[200:300]) == runs[200:300]
    assert check_buckets(client, keys, "leases") == 200
    # Those left: r0000-r0099 (renewed, later) and r0300-r0399; make them all expire.
    assert store.renew("a", runs[:100], 1) == runs[:100]
    assert store.renew("a", runs[300:], 1) == runs[300:]
    time.sleep(0.01)
    claimed = store.claim_expired("b", LONG, 100) + store.claim_expired("b", LONG, 100)
    assert sorted(claimed) == runs[:100] + runs[300:]
    assert store.claim_expired("b", LONG, 100) == []
    assert check_buckets(client, keys, "leases") == 200


def test_every_waiter_of_a_dependency_with_many_buckets_becomes_ready(
        client: redis.Redis) -> None:
    store, keys = migrated(client, discover=lambda r: Changed("dep", seen=0) if r == b"w" else None)
    waiters = [f"w{i:04}" for i in range(700)]
    for run in waiters:
        store.insert(run, b"w", Release())
    assert check_buckets(client, keys, "d:dep") == 700
    assert store.claim_ready("n", LONG, 100) == []
    store.compare_and_set(waiters[5], 1, b"free", Release())  # leaves the waiters
    assert check_buckets(client, keys, "d:dep") == 699
    store.insert("dep", b"changed", Release())  # re-indexes some now, the rest deferred
    claimed: list[str] = []
    for _ in range(40):  # each re-indexes MAX_CLAIM_FANOUT (25) more, buckets counted
        claimed += store.claim_ready("n", LONG, 100)
    assert sorted(claimed) == [w for w in waiters if w != waiters[5]]


def test_a_damaged_bucket_is_dropped_and_quarantined_never_a_wall(
        client: redis.Redis) -> None:
    store, keys, runs = holding(client, 300, 1)
    found = bucket_keys(client, keys, "leases")
    assert len(found) >= 3
    lost = {r.decode() for r in client.zrange(found[1], 0, -1)}
    client.delete(found[1])
    client.set(found[1], "foreign")  # a foreign write over the second bucket
    bound = found[1][len(keys.buckets("leases")[1]):].decode()
    time.sleep(0.01)
    claimed: list[str] = []
    for _ in range(5):
        claimed += store.claim_expired("b", LONG, 100)
    assert sorted(claimed) == sorted(set(runs) - lost)
    assert Quarantined("bucket:leases", bound, "type") in store.quarantined()
    assert client.get(found[1]) == b"foreign"  # left for the operator, out of the index
    # The entries of its range now go to the buckets around it.
    renewed = store.renew("b", claimed[:100], 1) + store.renew("b", claimed[100:], 1)
    assert sorted(renewed) == sorted(claimed)
    time.sleep(0.01)
    again: list[str] = []
    for _ in range(5):
        again += store.claim_expired("c", LONG, 100)
    assert sorted(again) == sorted(claimed)
    check_buckets(client, keys, "leases")


def test_a_damaged_first_bucket_or_directory_refuses_before_writing(
        client: redis.Redis) -> None:
    store, keys = migrated(client, discover=lambda r: At(0) if r == b"ready" else None)
    store.insert("a", b"x", Claim("n", LONG))
    for key in keys.buckets("leases"):
        saved = client.dump(key)
        client.delete(key)
        client.set(key, "foreign")
        before = dump(client, store.namespace)
        with pytest.raises(Corrupt, match="index:leases"):
            store.insert("b", b"x", Claim("n", LONG))
        with pytest.raises(Corrupt, match="index:leases"):
            store.claim_expired("m", LONG, 10)
        assert dump(client, store.namespace) == before
        client.delete(key)
        if saved is not None:
            client.restore(key, 0, saved)
    client.hset(keys.meta, "old-ix", "yes")
    with pytest.raises(Corrupt, match=r"meta\.old-ix"):
        store.get("a")
    client.hdel(keys.meta, "old-ix")
    assert store.claim_ready("n", LONG, 10) == []


def test_a_foreign_key_where_a_split_would_go_leaves_the_bucket_whole(
        client: redis.Redis) -> None:
    """The split of the first bucket at 129 entries would name its new bucket after its
    65th entry: a key already there (foreign) keeps the bucket whole, still in order."""
    store, keys = migrated(client, discover=lambda r: At(0))
    runs = [f"r{i:04}" for i in range(129)]
    squatted = keys.buckets("ready")[1] + "0" * 16 + runs[64]
    client.set(squatted, "foreign")
    for run in runs:
        store.insert(run, b"x", Release())
    assert client.zcard(keys.buckets("ready")[1]) == 129
    assert client.get(squatted) == b"foreign"
    claimed = store.claim_ready("n", LONG, 100) + store.claim_ready("n", LONG, 100)
    assert claimed == runs


def test_a_layout_3_namespace_moves_its_index_entries_while_in_use(
        client: redis.Redis) -> None:
    """A layout 3 namespace (its indexes one sorted set each, one set per dependency) moves
    to layout 4 in small steps while claims and writes go on: claims meet the entries
    still in the old keys (in order with the buckets'), a dependency written mid-way
    finds every waiter, and at the end the old keys are gone and every run was claimed
    exactly once."""
    def discover(record: bytes) -> Any:
        if record == b"w":
            return Changed("dep", seen=0)
        return At(0) if record == b"r" else None

    store = RedisRunStore(client, namespace=unique_namespace(), discover=discover)
    keys = Keyspace(store.namespace)
    client.hset(keys.meta, "layout", "3")  # as the previous version's migrate() left it
    held = [f"h{i:03}" for i in range(150)]
    ready = [f"r{i:03}" for i in range(150)]
    waiting = [f"w{i:03}" for i in range(150)]
    for i in range(150):
        store.insert(held[i], b"h", Claim("a", 1))
        store.insert(ready[i], b"r", Release())
        store.insert(waiting[i], b"w", Release())
    assert client.zcard(keys.leases) == 150 and client.zcard(keys.ready) == 150
    assert client.scard(keys.dependents("dep")) == 150
    time.sleep(0.01)
    claimed_leases: list[str] = []
    claimed_ready: list[str] = []
    steps = 0
    done = False
    while not done:
        # Small steps while the old index keys empty; then the SCAN pass, which visits every
        # key of the server (other tests' too), in steps of the default size.
        count = 20 if steps < 40 else 200
        _, done, damaged, _ = store._write(store._ops.migrate_step(count))
        assert damaged == 0
        steps += 1
        claimed_leases += store.claim_expired("b", LONG, 7)
        claimed_ready += store.claim_ready("b", LONG, 7)
        if steps == 12:
            store.insert("dep", b"d", Release())  # every waiter becomes ready
        assert steps < 100 + 3 * client.dbsize() // 200
    assert client.hget(keys.meta, "layout") == b"4"
    assert not client.hexists(keys.meta, "old-ix")
    assert not client.exists(keys.leases, keys.ready, keys.dependents("dep"))
    for _ in range(10):
        claimed_leases += store.claim_expired("b", LONG, 100)
        claimed_ready += store.claim_ready("b", LONG, 100)
    assert sorted(claimed_leases) == held
    assert sorted(claimed_ready) == ready + waiting
    check_buckets(client, keys, "leases")
    # The claims before the migration ended took ready runs in order (ties by run id).
    assert claimed_ready[:7] == ready[:7]


def test_a_bucket_grown_by_foreign_writes_is_never_split_in_one_script(
        client: redis.Redis) -> None:
    """A bucket far past what one script adds (a tenant's ZADD of 3,000 members) is left
    whole: splitting it would copy it all in one script. Claims still page through it."""
    store, keys = migrated(client, discover=lambda r: At(0))
    first = keys.buckets("ready")[1]
    client.zadd(first, {f"--foreign-{i:05}": 0 for i in range(3000)})
    store.insert("mine", b"x", Release())
    assert client.zcard(first) == 3001
    assert client.zcard(keys.buckets("ready")[0]) == 0  # no split: no directory entry
    claimed: list[str] = []
    for _ in range(20):
        claimed += store.claim_ready("n", LONG, 100)
    assert claimed == ["mine"]  # the foreign members lead nowhere: quarantined on the way


def test_a_fan_out_walks_past_empty_and_foreign_waiter_buckets_never_a_wall(
        client: redis.Redis) -> None:
    """A tenant's directory entries with no bucket behind them (or one of another type)
    count as visited waiters: the re-indexing goes past them, so it finishes instead of
    walking the same empty buckets on every claim."""
    store, keys = migrated(client, discover=lambda r: Changed("dep", seen=0) if r == b"w" else None)
    for run in ("w1", "w2", "w3"):
        store.insert(run, b"w", Release())
    directory, prefix = keys.buckets("d:dep")
    client.zadd(directory, {f"zz{i:03}": 0 for i in range(150)})
    client.set(prefix + "zz007", "foreign")
    store.insert("dep", b"d", Release())  # the write re-indexes the first 100 "waiters"
    claimed: list[str] = []
    for _ in range(4):
        claimed += store.claim_ready("n", LONG, 100)
    assert sorted(claimed) == ["w1", "w2", "w3"]
    assert client.zcard(keys.fanout) == 0  # the pending re-indexing finished
    assert Quarantined("bucket:d:dep", "zz007", "type") in store.quarantined()


def test_while_migrating_ties_between_old_and_bucketed_entries_go_by_run_id(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(), discover=lambda r: At(0))
    keys = Keyspace(store.namespace)
    client.hset(keys.meta, "layout", "3")
    store.insert("a", b"x", Release())
    store.insert("b", b"x", Release())  # both in layout 3's ready index, at 0
    store._write(store._ops.migrate_step(1))  # layout 4; "a" moves to a bucket
    assert client.zrange(keys.ready, 0, -1) == [b"b"]
    store.insert("c", b"x", Release())  # in a bucket, at 0
    assert store.claim_ready("n", LONG, 3) == ["a", "b", "c"]
