"""Dependencies across partitions (a run waiting ``Changed(dep)`` with dep in another
partition): every announcement delivered or a token left for the next claim, watches and
mirror entries that go with their last waiter, damage that is quarantined or logged and
never loses an announcement, and keys bounded before they are read."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from aio_suites import LoopThread
from redis.cluster import RedisCluster
from servers import Server, redis_binary, start, start_cluster, unique_namespace
from test_partitions import _step, _wait_rec

from redisstore import AsyncRedisRunStore, RedisRunStore, Release
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.discovery import json_wait
from redisstore.runs import MAX_RENEW

LONG = 600_000


def rec(wait: dict[str, Any] | None) -> bytes:
    return json.dumps({"wait": wait}).encode()


def in_partition(prefix: str, p: int, n: int, skip: int = 0) -> str:
    """A run id of partition ``p`` of ``n`` (the ``skip``-th one found)."""
    found = [f"{prefix}{i}" for i in range(10_000) if partition_of(f"{prefix}{i}", n) == p]
    return found[skip]


# ---------------------------------------------------------------- foreign outbox entries


@pytest.mark.parametrize("dependency", ["x" * 2049, "\u00e9" * 1025])
def test_an_outbox_entry_naming_no_possible_run_is_removed_and_warned_once(
        dependency: str, caplog: pytest.LogCaptureFixture) -> None:
    """An entry whose dependency fails the run-id checks (over MAX_TEXT bytes of UTF-8) can
    never be a run of ours: the first claim removes it, warning once and naming it; the
    next claims pay nothing for it."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    store.insert("seed", rec(None), Release())
    home = Keyspace(ns, 0)
    client.zadd(home.prefix + "outbox", {f"1|{dependency}".encode(): 4})
    with caplog.at_level(logging.WARNING, logger="redisstore"):
        for _ in range(3):
            assert store.claim_ready("a", LONG, 10) == []
    assert client.zcard(home.prefix + "outbox") == 0
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "outbox" in warned[0].getMessage()


# ---------------------------------------------------------------- servers: blocked claims


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Server]]]:
    """One server and a three-primary cluster, for the module."""
    single = start(redis_binary(), "redis-server", tmp_path_factory.mktemp("one"))
    cluster: list[Server] = []
    try:
        cluster = start_cluster(redis_binary(), tmp_path_factory.mktemp("cluster"))
        yield {"server": [single], "cluster": cluster}
    finally:
        for server in [single, *cluster]:
            server.kill()


class Shell:
    """A store of 3 partitions through the sync or the asyncio client, on one server or the
    cluster, with sync calls (the asyncio store's on a loop thread of its own)."""

    def __init__(self, shell: str, where: str, servers: list[Server], namespace: str) -> None:
        port = servers[0].port
        self.loop: LoopThread | None = None
        self.raw: Any = (RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
                         if where == "cluster" else redis.Redis(port=port, socket_timeout=10))
        if shell == "sync":
            self.client: Any = self.raw
            self.store: Any = RedisRunStore(self.raw, namespace=namespace, discover=json_wait,
                                            partitions=3)
        else:
            self.loop = LoopThread()

            async def make() -> Any:
                if where == "cluster":
                    return redis.asyncio.RedisCluster(host="127.0.0.1", port=port,
                                                      socket_timeout=10)
                return redis.asyncio.Redis(port=port, socket_timeout=10)

            self.client = self.loop.run(make())
            self.store = AsyncRedisRunStore(self.client, namespace=namespace,
                                            discover=json_wait, partitions=3)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(self.store, name)(*args, **kwargs)
        return got if self.loop is None else self.loop.run(got)

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
        else:
            self.loop.run(self.store.aclose())
            self.loop.run(self.client.aclose())
            self.loop.stop()
        self.raw.close()


@pytest.mark.server
@pytest.mark.parametrize("shell", ["sync", "asyncio"])
@pytest.mark.parametrize("where", ["server", "cluster"])
def test_a_blocked_claim_finds_a_waiter_behind_a_big_outbox_at_once(
        backends: dict[str, list[Server]], where: str, shell: str) -> None:
    """An outbox of more entries than a claim reads (2,000 deliveries that make nothing
    claimable), then a waiter's dependency written in another partition: a claim blocked
    before that write is woken with the waiter well before its block (9 s) ends, where it
    slept its whole re-arm (10 s) once its one claim's 100 entries missed it. Twice, each a
    fresh pair. (The bound is the block's, not a speed: the outbox takes 20 claims' reads,
    which a loaded machine stretches; 2 s failed at 4.2 s under load.)"""
    from redisstore.conformance.wakeups import Blocked

    ns = unique_namespace("deps-wake")
    io = Shell(shell, where, backends[where], ns)
    try:
        home = Keyspace(ns, 0)
        for round_ in range(2):
            dep = in_partition("dep", 0, 3, round_)
            waiter = in_partition("waiter", 1, 3, round_)
            io.call("insert", dep, rec(None), Release())
            io.call("insert", waiter, rec({"changed": dep, "seen": 1}), Release())
            assert io.call("claim_ready", "me", LONG, 10) == []
            blocked = Blocked(lambda: io.call("claim_ready", "me", LONG, 1, block=9000))
            time.sleep(0.5)  # the claim is blocked
            # Deliveries that make nothing claimable: their dependencies have no waiter.
            io.raw.zadd(home.prefix + "outbox",
                        {f"1|ghost-{round_}-{i}": 2 for i in range(2000)})
            since = time.monotonic()
            io.call("compare_and_set", dep, 1, rec(None), Release())
            assert blocked.get() == [waiter]
            # Woken, not answered by the claim its block's end makes.
            assert blocked.returned - since < 8.0, blocked.returned - since
            io.raw.delete(home.prefix + "outbox")
    finally:
        io.close()


@pytest.mark.parametrize("deliverable", [True, False])
def test_a_claim_leaves_a_token_for_an_outbox_it_could_not_read_whole(
        deliverable: bool) -> None:
    """A claim that delivered some of a bigger outbox leaves a wake-up token there (the
    next blocked claim goes on); one whose deliveries all failed (the waiters' partition
    unreachable: here its fanout of another type) leaves none, so no claim loops on it."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    store.insert("seed", rec(None), Release())
    home = Keyspace(ns, 0)
    client.zadd(home.prefix + "outbox", {f"1|ghost-{i}": 2 for i in range(150)})
    if not deliverable:
        client.set(Keyspace(ns, 1).fanout, "not a sorted set")
    client.delete(home.wake("ready"))
    assert store.claim_ready("a", LONG, 10) == []
    tokens = {t.decode() for t in client.zrange(home.wake("ready"), 0, -1)}
    assert ("~outbox" in tokens) is deliverable
    assert client.zcard(home.prefix + "outbox") == (50 if deliverable else 150)


# ---------------------------------------------------------------- watches go with waiters


def finished_pairs(store: Any, pairs: int) -> list[str]:
    """``pairs`` waiter/dependency pairs across partitions, each run to its end: the
    waiter watches, its dependency is written, a claim delivers and hands the waiter out,
    both are deleted, and claims go on until nothing is left to send. The dependencies."""
    n = store._ops.n
    deps = [f"dep-{i}" for i in range(pairs)]
    waiters = [next(f"w{i}-{j}" for j in range(100)
                    if partition_of(f"w{i}-{j}", n) != partition_of(deps[i], n))
               for i in range(pairs)]
    for dep, waiter in zip(deps, waiters, strict=True):
        store.insert(dep, rec(None), Release())
        store.insert(waiter, rec({"changed": dep, "seen": 1}), Release())
        store.compare_and_set(dep, 1, rec(None), Release())
    claimed: list[str] = []
    for _ in range(pairs):
        got = store.claim_ready("a", LONG, 100)
        claimed += got
        if not got and len(claimed) == pairs:
            break
    assert sorted(claimed) == sorted(waiters)
    for i in range(0, pairs, MAX_RENEW):
        store.release("a", waiters[i:i + MAX_RENEW])
    for dep, waiter in zip(deps, waiters, strict=True):
        store.delete(waiter, 1, Release())
        store.delete(dep, 2, Release())
    for _ in range(pairs // 50 + 5):
        store.claim_ready("a", LONG, 100)
    return deps


def per_dependency_keys(client: Any, ns: str, n: int) -> dict[str, int]:
    """The keys the dependencies across partitions left, by kind (counted per member for
    the queues and mirrors): what finished pairs must not leave behind."""
    left: dict[str, int] = {}
    for p in range(n):
        k = Keyspace(ns, p)
        watches = list(client.scan_iter(match=k.prefix.replace("{", "[{]") + "watch:*"))
        if watches:
            left["watch"] = left.get("watch", 0) + len(watches)
        for name, size in (("depv", client.hlen), ("outbox", client.zcard),
                           ("unwatch", client.zcard)):
            if client.exists(k.prefix + name):
                left[name] = left.get(name, 0) + size(k.prefix + name)
    return left


def test_watches_and_mirror_entries_go_with_their_last_waiter() -> None:
    """Finished pairs leave no watch, mirror entry, outbox or unwatch entry (they left one
    watch and one mirror entry per dependency, forever); a later write of a once-watched
    id announces nothing."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    deps = finished_pairs(store, 300)
    assert per_dependency_keys(client, ns, 3) == {}
    store.insert(deps[0], rec(None), Release())
    store.compare_and_set(deps[0], 3, rec(None), Release())
    assert per_dependency_keys(client, ns, 3) == {}


def test_a_waiter_that_moves_to_another_dependency_unwatches_the_first() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    a, b = in_partition("a", 0, 3), in_partition("b", 2, 3)
    waiter = in_partition("w", 1, 3)
    store.insert(a, rec(None), Release())
    store.insert(b, rec(None), Release())
    store.insert(waiter, rec({"changed": a, "seen": 1}), Release())
    store.compare_and_set(waiter, 1, rec({"changed": b, "seen": 1}), Release())
    store.claim_ready("x", LONG, 10)  # sends the unwatch of a
    assert not client.exists(Keyspace(ns, 0).prefix + f"watch:{a}")
    assert client.exists(Keyspace(ns, 2).prefix + f"watch:{b}")
    store.compare_and_set(a, 1, rec(None), Release())
    assert client.zcard(Keyspace(ns, 0).prefix + "outbox") == 0  # a announces nothing
    store.compare_and_set(b, 1, rec(None), Release())
    assert store.claim_ready("x", LONG, 10) == [waiter]


def test_a_waiter_between_its_watch_and_its_write_survives_an_unwatch() -> None:
    """The race an unwatch must survive: a new waiter has watched (in the dependency's
    partition) but not yet written (in its own) while its partition, with no waiter left,
    unwatches, and the dependency is written meanwhile, its delivery dropped for want of a
    waiter. The waiter's write then carries a stale version over a removed watch: it is
    answered REWATCH, watches again and reads the new version (claimable at once), and the
    dependency's later writes reach it."""
    from redisstore.core.partitions import PartitionedOps

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    other = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    dep = in_partition("dep", 0, 3)
    first, late = in_partition("y", 1, 3), in_partition("x", 1, 3)
    store.insert(dep, rec(None), Release())
    store.insert(first, rec({"changed": dep, "seen": 1}), Release())
    store.delete(first, 1, Release())  # no waiter left: the unwatch begins
    ops = store._ops
    assert isinstance(ops, PartitionedOps)
    real = ops.parts[1].watcher
    assert real is not None
    watches: list[tuple[int, int, int]] = []

    def raced(dependency: str, watcher: int, floor: int) -> Any:
        got = yield from real(dependency, watcher, floor)
        watches.append(got)
        if len(watches) == 1:  # between the watch and the write
            other.compare_and_set(dep, 1, rec(None), Release())
            for _ in range(2):  # delivered to nobody, unwatched; the unwatch sent
                assert other.claim_ready("o", LONG, 10) == []
            assert not client.exists(Keyspace(ns, 0).prefix + f"watch:{dep}")
        return got

    ops.parts[1].watcher = raced
    store.insert(late, rec({"changed": dep, "seen": 1}), Release())
    assert [w[0] for w in watches] == [2, 4]  # watched again: the new version
    assert watches[1][1] > watches[0][1]
    assert store.claim_ready("a", LONG, 10) == [late]
    store.compare_and_set(late, store.get(late).revision, rec({"changed": dep, "seen": 2}),
                          Release())
    assert store.claim_ready("a", LONG, 10) == []
    store.compare_and_set(dep, 2, rec(None), Release())
    assert store.claim_ready("a", LONG, 10) == [late]


# ---------------------------------------------------------------- damage


@pytest.mark.parametrize("damage", ["watch of another type", "watch field not ours",
                                    "outbox of another type", "mirror of another type"])
def test_damage_to_a_dependency_key_is_quarantined_and_loses_no_announcement(
        damage: str) -> None:
    """A damaged watch key, outbox or mirror hash lost the dependency's write silently (the
    write acknowledged, nothing announced, logged or quarantined). Now the key is set aside
    and listed by quarantined(), and the waiter is claimable after the write; a damaged
    watch is replaced by "every partition watches", which the next write prunes to the
    partitions that wait."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    dep, waiter = in_partition("dep", 0, 3), in_partition("w", 1, 3)
    d, w = Keyspace(ns, 0), Keyspace(ns, 1)
    store.insert(dep, rec(None), Release())
    store.insert(waiter, rec({"changed": dep, "seen": 1}), Release())
    key, name = {
        "watch of another type": (d.prefix + f"watch:{dep}", f"watch:{dep}"),
        "watch field not ours": (d.prefix + f"watch:{dep}", f"watch:{dep}"),
        "outbox of another type": (d.prefix + "outbox", "outbox"),
        "mirror of another type": (w.prefix + "depv", "depv")}[damage]
    if damage == "watch field not ours":
        client.hset(key, "junk", "1")
    else:
        client.delete(key)
        client.set(key, "x")
    store.compare_and_set(dep, 1, rec(None), Release())
    got: list[str] = []
    for _ in range(3):
        got += store.claim_ready("a", LONG, 10)
    assert got == [waiter]
    assert ("damaged", name) in {(q.index, q.run) for q in store.quarantined()}
    assert client.type(key) in (b"none", b"hash", b"zset")
    store.release("a", [waiter])
    store.compare_and_set(waiter, 1, rec({"changed": dep, "seen": 2}), Release())
    store.compare_and_set(dep, 2, rec(None), Release())
    got = []
    for _ in range(3):
        got += store.claim_ready("a", LONG, 10)
    assert got == [waiter]  # the next write too
    if damage.startswith("watch"):
        # "Every partition" became a watch of each; partition 2, with no waiter, unwatched.
        assert set(client.hkeys(key)) == {b"1"}


@pytest.mark.server
@pytest.mark.parametrize("case", ["watch set", "watch hash", "outbox", "mirror entry",
                                  "outbox, one big member", "watch hash, one big field"])
def test_a_big_value_planted_in_a_dependency_key_is_not_read_whole(
        backends: dict[str, list[Server]], case: str) -> None:
    """8 MB planted in a watch key, an outbox or a mirror entry was read whole by the
    scripts (50-60 ms on Redis 7, 180-370 ms at 32 MB). Each is bounded before it is read
    (HLEN/ZCARD, HSTRLEN, MEMORY USAGE) and set aside as damage: every script of the call
    stays under 10 ms (SLOWLOG of this test's own server)."""
    c = redis.Redis(port=backends["server"][0].port)
    c.config_set("slowlog-log-slower-than", 0)
    c.config_set("slowlog-max-len", 10000)
    ns = unique_namespace("deps-big")
    store = RedisRunStore(c, namespace=ns, discover=json_wait, partitions=3)
    dep, waiter = in_partition("dep", 0, 3), in_partition("w", 1, 3)
    d, w = Keyspace(ns, 0), Keyspace(ns, 1)
    store.insert(dep, rec(None), Release())
    size = 8 << 20
    if case == "watch set":
        c.sadd(d.prefix + f"watch:{dep}", *[b"%d" % i + b"x" * (size // 200) for i in range(200)])
    elif case == "watch hash":
        c.hset(d.prefix + f"watch:{dep}",
               mapping={b"%d" % i + b"x" * (size // 200): 1 for i in range(200)})
    elif case == "outbox":
        c.zadd(d.prefix + "outbox", {b"1|%d" % i + b"y" * (size // 100): 2 for i in range(100)})
    elif case == "outbox, one big member":
        # A sample of 5 members (MEMORY USAGE's default) would miss it among 40 small ones.
        c.zadd(d.prefix + "outbox", {b"1|small-%d" % i + b"z" * 80: 1 for i in range(40)})
        c.zadd(d.prefix + "outbox", {b"1|" + b"y" * size: 2})
    elif case == "watch hash, one big field":
        c.hset(d.prefix + f"watch:{dep}", mapping={b"%d" % i: 1 for i in range(3)})
        c.hset(d.prefix + f"watch:{dep}", b"x" * size, 1)
        c.hset(d.prefix + f"watch:{dep}", mapping={b"p%d" % i + b"q" * 80: 1 for i in range(40)})
    else:
        c.hset(w.prefix + "depv", dep, b"9" * size)
    c.slowlog_reset()
    if case == "mirror entry":
        store.insert(waiter, rec({"changed": dep, "seen": 1}), Release())
    elif case.startswith("outbox"):
        store.claim_ready("a", LONG, 10)
    else:
        store.compare_and_set(dep, 1, rec(None), Release())
    took = [e["duration"] / 1000 for e in c.slowlog_get(10000)
            if e["command"].split()[0].upper() in (b"EVALSHA", b"EVAL")]
    assert took and max(took) < 10, took
    if case != "mirror entry":
        assert any(q.index == "damaged" for q in store.quarantined())
    store.close()


def test_a_damaged_unwatched_key_costs_a_second_watch_and_never_a_wall(
        caplog: pytest.LogCaptureFixture) -> None:
    """The unwatched key of a waiter's partition of another type: its writes watch twice
    (the second watch is newer than any unwatch begun there) and go through, warned once;
    nothing is unwatched meanwhile, so no watch is lost."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    dep, waiters = in_partition("dep", 0, 3), [in_partition("w", 1, 3, i) for i in range(2)]
    store.insert(dep, rec(None), Release())
    client.set(Keyspace(ns, 1).prefix + "unwatched", "x")
    with caplog.at_level(logging.WARNING, logger="redisstore"):
        for waiter in waiters:
            store.insert(waiter, rec({"changed": dep, "seen": 1}), Release())
            # No unwatch begins: the watch stays.
            store.delete(waiter, store.get(waiter).revision, Release())
        store.insert(waiters[0], rec({"changed": dep, "seen": 1}), Release())
    assert len([r for r in caplog.records if "unwatched" in r.getMessage()]) == 1
    store.compare_and_set(dep, 1, rec(None), Release())
    assert store.claim_ready("a", LONG, 10) == [waiters[0]]


# ---------------------------------------------------------------- the race, at random


def _random_op(rng: random.Random, runs: list[str], exclude: str | None = None
               ) -> tuple[Any, ...]:
    pool = [r for r in runs if r != exclude]
    k = rng.random()
    if k < 0.35:
        return ("write", rng.choice(pool), rng.choice([*runs, None]),
                rng.choice(["current", "current", "unseen", "ahead"]),
                rng.choice(["release"] * 3 + ["seize"]))
    if k < 0.55:
        return ("delete", rng.choice(pool))
    if k < 0.62:
        return ("refresh", rng.choice(pool))
    if k < 0.67:
        return ("release", rng.choice(pool))
    return ("claim",)


def _record_for(store: Any, op: tuple[Any, ...]) -> bytes:
    """The record a history's write writes, its ``seen`` read from ``store`` now."""
    from redisstore import NotFound

    _, _, dep, mode, _ = op
    seen = None
    if dep is not None and mode != "unseen":
        try:
            seen = store.get(dep).revision if mode == "current" else 10**9
        except NotFound:
            seen = 0 if mode == "current" else 10**9
    return _wait_rec(dep, seen)


def _write(store: Any, op: tuple[Any, ...], record: bytes) -> None:
    from redisstore import NotFound, Seize

    run, lease = op[1], op[4]
    condition = Release() if lease == "release" else Seize("x", LONG)
    try:
        now = store.get(run)
    except NotFound:
        store.insert(run, record, condition)
    else:
        store.compare_and_set(run, now.revision, record, condition)


@pytest.mark.parametrize("seed", range(30))
def test_histories_raced_between_watch_and_write_answer_as_the_memory_reference(
        seed: int) -> None:
    """Random histories in which other calls (writes, deletes, refreshes, releases, claims
    of other runs, through another store) run between a write's watch and the write itself,
    as they may on a server shared by many engines: the store of 3 partitions claims what
    the memory reference claims with those calls run just before the write, step by step.
    Without REWATCH, 9 of 150 seeds miss a waiter."""
    from redisstore import MemoryRunStore
    from redisstore.core.partitions import PartitionedOps

    rng = random.Random(seed)
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    other = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    reference = MemoryRunStore(discover=json_wait)
    ops = store._ops
    assert isinstance(ops, PartitionedOps)
    runs = ["a", "b", "c", "{a}x", "{b}y", "d", "e", "f"]
    pending: list[list[tuple[Any, ...]]] = []
    history: list[Any] = []

    def racing(real: Any) -> Any:
        def raced(dependency: str, watcher: int, floor: int) -> Any:
            got = yield from real(dependency, watcher, floor)
            for op in pending.pop() if pending else []:
                history.append(("between", op))
                assert _step(other, op) == _step(reference, op), history
            return got
        return raced

    for part in ops.parts:
        part.watcher = racing(part.watcher)
    for _ in range(80):
        op = _random_op(rng, runs)
        history.append(op)
        if op[0] != "write":
            assert _step(store, op) == _step(reference, op), history
            continue
        if rng.random() < 0.6:
            pending[:] = [[_random_op(rng, runs, exclude=op[1])
                           for _ in range(rng.randint(1, 4))]]
        later = _record_for(reference, op)  # as of before the calls that race it
        _write(store, op, _record_for(store, op))
        pending.clear()
        _write(reference, op, later)


@pytest.mark.server
def test_an_outbox_of_entries_of_the_longest_ids_is_not_taken_for_damage(
        backends: dict[str, list[Server]]) -> None:
    """The byte bound of an outbox leaves room for entries of the longest run ids (2,052
    bytes each, about 2,660 bytes of memory in a skiplist): 1,000 of them are read."""
    c = redis.Redis(port=backends["server"][0].port)
    ns = unique_namespace("deps-long")
    store = RedisRunStore(c, namespace=ns, discover=json_wait, partitions=3)
    store.insert("seed", rec(None), Release())
    home = Keyspace(ns, 0)
    c.zadd(home.prefix + "outbox", {f"1|{i:06d}{'x' * 2042}": 2 for i in range(1000)})
    heads = store._io.drive(store._ops.parts[0].heads("ready", 10))
    assert heads[4] == 1000 and len(heads[3]) == 100
    store.close()
