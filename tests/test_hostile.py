"""Hostile tenants and damaged namespaces: a foreign write or a raw EVALSHA never hangs the
server, never half-applies, and never stops the claim of the undamaged runs."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from servers import at_layout, unique_namespace

from redisstore import (
    At,
    Claim,
    Corrupt,
    Hold,
    Misconfigured,
    Quarantined,
    RedisRunStore,
    Release,
    StoreError,
    scripts,
)
from redisstore.core.keys import Keyspace

LONG = 600_000


def dump(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace with its DUMP: equal dumps, nothing changed."""
    return {key: client.dump(key) for key in client.scan_iter(match=f"{{{namespace}}}:*")}


def ready_store(client: redis.Redis) -> RedisRunStore:
    return RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1),
                         discover=lambda r: At(0))


def evalsha(client: redis.Redis, script: scripts.Script, keys: tuple[str, ...],
            *args: Any) -> Any:
    client.script_load(script.source)
    return client.evalsha(script.sha, len(keys), *keys, *args)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "1.5", "", "0x10", " 5 ", "1e3",
                                 str(2**63)])
def test_a_damaged_wait_never_hangs_a_claim_and_is_quarantined(client: redis.Redis,
                                                                bad: str) -> None:
    store = ready_store(client)
    keys = Keyspace(store.namespace)
    for i in range(5):
        store.insert(f"r{i}", b"x", Release())
    client.hset(keys.run("r2"), "wn", bad)
    claimed = store.claim_ready("me", LONG, 10)
    assert sorted(claimed) == ["r0", "r1", "r3", "r4"]
    assert store.quarantined() == [Quarantined("ready", "r2", "wn")]
    with pytest.raises(Corrupt) as caught:
        store.get("r2")
    assert caught.value.field == "wn"


@pytest.mark.parametrize("wait", [("a", "", "nan", ""), ("p", "k", "0", ""),
                                  ("c", "", "1", ""), ("a", "", "1", "1.5"), ("x", "", "", "")])
def test_a_raw_insert_with_a_bad_wait_is_refused_and_writes_nothing(
        client: redis.Redis, wait: tuple[str, ...]) -> None:
    namespace = unique_namespace()
    keys = Keyspace(namespace)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_INSERT, (keys.run("r"), keys.leases, keys.ready, keys.meta),
                keys.prefix, "r", b"x", "c", "me", 1000, *wait, 1)
    assert dump(client, namespace) == {}


@pytest.mark.parametrize(("index", "args"), [
    ("ttl", ("c", "me", "soon")), ("ttl", ("c", "me", "nan")), ("owner", ("c", "", 1000)),
    ("kind", ("z", "me", 1000)),
])
def test_a_raw_insert_with_a_bad_lease_writes_nothing(client: redis.Redis, index: str,
                                                      args: tuple[Any, ...]) -> None:
    namespace = unique_namespace()
    keys = Keyspace(namespace)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_INSERT, (keys.run("r"), keys.leases, keys.ready, keys.meta),
                keys.prefix, "r", b"x", *args, "", "", "", "", 1)
    assert dump(client, namespace) == {}


def test_a_raw_claim_over_the_cap_is_refused(client: redis.Redis) -> None:
    keys = Keyspace(unique_namespace())
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_CLAIM_READY, (keys.ready, keys.leases, keys.meta,
                                                  keys.fanout),
                keys.prefix, "me", 1000, 1_000_000, 1)


@pytest.mark.parametrize("argv", [("me", 1000, 1_000_000, 1, 0, ""), ("me", 1000, 1, 1, 0, "-1"),
                                  ("me", 1000, 1, 1, 0, "1.5"), ("", 1000, 1, 1, 0, ""),
                                  ("me", 0, 1, 1, 0, ""), ("me", 1000, 1, 1, 3 << 20, "")])
def test_a_raw_claim_of_both_kinds_with_a_bad_argument_is_refused(
        client: redis.Redis, argv: tuple[Any, ...]) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("run", b"x", Claim("dead", 1))
    keys = Keyspace(store.namespace)
    before = dump(client, store.namespace)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_CLAIM, (keys.ready, keys.leases, keys.meta, keys.fanout),
                keys.prefix, *argv)
    assert dump(client, store.namespace) == before


def test_a_run_of_the_wrong_type_never_blocks_claim_expired(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1))
    keys = Keyspace(store.namespace)
    for i in range(20):
        store.insert(f"r{i:02}", b"x", Claim("dead", 1))
    client.delete(keys.run("r00"))
    client.set(keys.run("r00"), "not a hash")
    import time
    time.sleep(0.01)
    claimed = store.claim_expired("me", LONG, 100)
    assert sorted(claimed) == [f"r{i:02}" for i in range(1, 20)]
    assert store.quarantined() == [Quarantined("leases", "r00", "type")]
    assert store.claim_expired("me", LONG, 100) == []


def test_claim_expired_trusts_the_run_not_the_index_score(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    store.insert("live", b"x", Claim("owner", LONG))
    client.zadd(keys.leases, {"live": 0})  # a stale score: the lease is live
    assert store.claim_expired("me", LONG, 10) == []
    assert store.get("live").holder.owner == "owner"  # type: ignore[union-attr]


@pytest.mark.parametrize(("field", "bad"), [("rev", "nan"), ("rev", "0"), ("exp", "inf"),
                                            ("exp", ""), ("wpv", "1.5"), ("rev", "1e3")])
def test_every_operation_on_a_corrupt_run_raises_and_changes_nothing(
        client: redis.Redis, field: str, bad: str) -> None:
    store = ready_store(client)
    keys = Keyspace(store.namespace)
    store.insert("bad", b"x", Claim("me", LONG))
    store.insert("good", b"y", Claim("me", LONG))
    client.hset(keys.run("bad"), field, bad)
    before = dump(client, store.namespace)
    for call in (lambda: store.get("bad"),
                 lambda: store.compare_and_set("bad", 1, b"z", Hold("me")),
                 lambda: store.insert("bad", b"z", Release()),
                 lambda: store.refresh("bad")):
        with pytest.raises(StoreError):
            call()
        assert dump(client, store.namespace) == before
    # A corrupt run among many is not renewed; the others are.
    assert store.renew("me", ["good", "bad"], LONG) == ["good"]


def test_a_damaged_index_key_refuses_writes_before_writing(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1))
    keys = Keyspace(store.namespace)
    client.set(keys.leases, "not a sorted set")
    with pytest.raises(Corrupt):
        store.insert("r", b"x", Claim("me", LONG))
    assert client.exists(keys.run("r")) == 0  # not left half-written as {rev: 1}
    client.delete(keys.leases)
    store.insert("r", b"x", Claim("me", LONG))
    assert store.get("r").revision == 1


def test_a_namespace_of_a_newer_layout_is_refused(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    client.hset(Keyspace(store.namespace).meta, "layout", "99")
    with pytest.raises(Misconfigured, match="newer"):
        store.insert("r", b"x", Release())
    with pytest.raises(Misconfigured):
        store.get("r")


def test_caps_are_refused_before_anything_is_sent(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(), max_record_bytes=100)
    with pytest.raises(ValueError, match="100"):
        store.claim_ready("me", 1000, 101)
    with pytest.raises(ValueError, match="150"):
        store.renew("me", [f"r{i}" for i in range(151)], 1000)
    with pytest.raises(ValueError, match="max_record_bytes"):
        store.insert("r", b"x" * 101, Release())
    with pytest.raises(ValueError):
        store.compare_and_set("r", 2**53 - 1, b"x", Release())
    assert dump(client, store.namespace) == {}


def test_a_dependency_with_many_waiters_is_reindexed_in_bounded_steps(
        client: redis.Redis) -> None:
    from redisstore import Changed

    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: Changed("dep", 0) if r == b"w" else None)
    keys = Keyspace(store.namespace)
    waiters = 250
    for i in range(waiters):  # the dependency is absent (revision 0 == seen): not eligible
        store.insert(f"w{i:04}", b"w", Release())
    assert store.claim_ready("me", LONG, 100) == []
    store.insert("dep", b"d", Release())  # re-indexes 100 waiters, defers the rest
    assert client.zcard(keys.fanout) == 1
    claimed: list[str] = []
    for _ in range(10):
        claimed += store.claim_ready("me", LONG, 100)
    assert sorted(claimed) == [f"w{i:04}" for i in range(waiters)]
    assert client.zcard(keys.fanout) == 0


@pytest.mark.parametrize("bad", ["nan", "inf", "1.5", "", "0x10", " 5 ", "1e3", "-1",
                                 str(2**63)])
def test_raw_release_delete_and_poison_bounds_with_bad_numbers_write_nothing(
        client: redis.Redis, bad: str) -> None:
    """EVALSHA of the layout 3 scripts with a damaged number: BADARG, nothing written."""
    store = RedisRunStore(client, namespace=unique_namespace())
    store.migrate()
    store.insert("run", b"r1", Claim("me", 1))
    keys = Keyspace(store.namespace)
    before = dump(client, store.namespace)
    calls = [
        (scripts.RUN_RELEASE, (keys.leases, keys.ready, keys.meta), ("me", bad, "run")),
        (scripts.RUN_DELETE, (keys.run("run"), keys.leases, keys.ready, keys.meta),
         ("run", bad, "r", "", 0, 1)),
        (scripts.RUN_DELETE, (keys.run("run"), keys.leases, keys.ready, keys.meta),
         ("run", 1, "r", "", 0, bad)),
        (scripts.RUN_CLAIM_EXPIRED, (keys.leases, keys.meta), ("other", LONG, 10, 0, bad)),
    ]
    for script, script_keys, args in calls:
        if script is scripts.RUN_CLAIM_EXPIRED and bad == "":
            continue  # '' is "no bound"
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, script, script_keys, keys.prefix, *args)
        assert dump(client, store.namespace) == before


def test_a_damaged_deleted_revision_refuses_insert_and_delete(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.migrate()
    store.insert("run", b"r1", Release())
    keys = Keyspace(store.namespace)
    for damage in ("nan", "1.5", "-1", str(2**53)):
        client.hset(keys.meta, "deleted-rev", damage)
        before = dump(client, store.namespace)
        with pytest.raises(Corrupt) as caught:
            store.insert("new", b"n1", Release())
        assert caught.value.field == "meta.deleted-rev"
        with pytest.raises(Corrupt):
            store.delete("run", 1, Release())
        assert dump(client, store.namespace) == before
    client.hset(keys.meta, "deleted-rev", "41")  # repaired by hand: inserts go on above it
    store.insert("new", b"n1", Release())
    assert store.get("new").revision == 42


def test_release_of_more_runs_than_the_cap_is_refused_by_the_script(
        client: redis.Redis) -> None:
    keys = Keyspace(unique_namespace())
    runs = [f"r{i}" for i in range(scripts.Cap.MAX_RENEW + 1)]
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_RELEASE, (keys.leases, keys.ready, keys.meta),
                keys.prefix, "me", 1, *runs)


@pytest.mark.parametrize("prefix", ["{other}:", "other:", "{a}", "", "{a{b}:", "{a}b}:"])
def test_a_forged_key_prefix_is_refused_before_anything_is_read(
        client: redis.Redis, prefix: str) -> None:
    """Scripts derive the keys they touch beyond KEYS from ARGV[1]: one that is not the
    prefix of every declared key (another tenant's) is refused, by every script."""
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("run", b"r1", Claim("me", LONG))
    keys = Keyspace(store.namespace)
    before = dump(client, store.namespace)
    for script, script_keys, args in (
            (scripts.RUN_GET, (keys.run("run"), keys.meta), ("run",)),
            (scripts.RUN_RENEW, (keys.leases, keys.meta), ("me", LONG, "run")),
            (scripts.RUN_CLAIM_EXPIRED, (keys.leases, keys.meta), ("me", LONG, 10, 0, ""))):
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, script, script_keys, prefix, *args)
    assert dump(client, store.namespace) == before


@pytest.mark.parametrize("damage", ["string", "hash", "full"])
def test_a_damaged_wake_key_turns_signals_off_and_fails_no_write(
        client: redis.Redis, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wake keys only carry signals: one of another type (or full of foreign tokens) never
    makes a write, release or claim fail, and a blocked claim still gets its run (by its
    re-arm, here 0.3 s)."""
    from redisstore import Release
    from redisstore.conformance.readiness import rec
    from redisstore.conformance.wakeups import Blocked
    from redisstore.discovery import json_wait
    from redisstore.shells import wakeups

    monkeypatch.setattr(wakeups, "REARM", 0.3)
    store = RedisRunStore(client, namespace=unique_namespace(), discover=json_wait)
    keys = Keyspace(store.namespace)
    for kind in ("ready", "leases"):
        if damage == "string":
            client.set(keys.wake(kind), "foreign")
        elif damage == "hash":
            client.hset(keys.wake(kind), "f", "v")
        else:
            client.zadd(keys.wake(kind), {f"junk-{i}": i for i in range(300)})
    before = {kind: client.dump(keys.wake(kind)) for kind in ("ready", "leases")}
    store.insert("a", rec({"at": 0}), Claim("me", 60_000))
    store.compare_and_set("a", 1, rec({"at": 0}), Claim("me", 60_000))
    assert store.release("me", ["a"]) == ["a"]
    assert store.claim_ready("me", 60_000, 10) == ["a"]
    store.insert("b", rec(None), Claim("x", 1))
    time.sleep(0.01)
    assert store.claim_expired("me", 60_000, 10) == ["b"]
    if damage != "full":  # a key of another type is left as it was
        assert {kind: client.dump(keys.wake(kind)) for kind in ("ready", "leases")} == before
    blocked = Blocked(lambda: store.claim_ready("me", 60_000, 1, block=5000))
    time.sleep(0.1)
    store.insert("c", rec({"at": 0}), Release())
    assert blocked.get() == ["c"]
    store.close()
