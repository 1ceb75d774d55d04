"""Run layouts. This library reads and writes layout 5 only (one string per run: record,
header, trailer; flat indexes). A namespace an earlier library wrote (layouts 1 to 4, written
here by tests/old_layouts.py with plain Redis commands) is refused by every operation until
``migrate()``, an offline step, moves it: every run, index entry and mark, in bounded
steps, resumable and safe to run twice at once; damaged runs are left and listed. A damaged
layout 5 string is corrupt, never misread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import old_layouts
import pytest
import redis
from old_layouts import OldRun, decoded, encoded, header5, wait5, wait_of, with_field5
from servers import Server, redis_binary, start, unique_namespace

from redisstore import (
    At,
    Changed,
    Claim,
    Corrupt,
    Failure,
    Fenced,
    Free,
    Held,
    Hold,
    Migrated,
    Misconfigured,
    Poll,
    Quarantined,
    RedisRunStore,
    Release,
    StoreError,
)
from redisstore.core import scripts
from redisstore.core.keys import Keyspace
from redisstore.core.runops import RunOps
from redisstore.discovery import json_wait
from redisstore.runs import Cap

LONG = 600_000
ME = "node-m"


@pytest.fixture(params=["fakeredis", pytest.param("redis7", marks=pytest.mark.server)])
def backend(request: pytest.FixtureRequest) -> redis.Redis:
    """fakeredis and Redis 7 (the migration's own tests; ``client`` adds 6.2 and Valkey)."""
    if request.param == "fakeredis":
        return fakeredis.FakeRedis()
    server: Server = request.getfixturevalue(request.param)
    return server.client()


def dump(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    return {key: client.dump(key) for key in client.scan_iter(match=f"{{{namespace}}}:*")}


def now_of(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def population(now: int, layout: int) -> dict[str, OldRun]:
    """A run in every state an old library left: held (with a ready claim's info), expired
    (taken over), poison (layout 3 on), ready (At, Poll), waiting on a dependency (with and
    without a deadline), a stale wait, records of any bytes and sizes, a header longer than
    a script's first read."""
    runs = {
        "held": OldRun(rev=4, record=b"held", own="node-a", exp=now + LONG, ck="dep", cdr=3,
                       cat=now - 1000),
        "expired": OldRun(rev=2, record=b"\x00\xff,:x", own="node-b", exp=now - 1000,
                          tk=2 if layout >= 3 else 0),
        "at": OldRun(rev=1, record=b"", wk="a", wn=0, wrev=1, wpv=1, ready=0),
        "poll": OldRun(rev=3, record=b"p" * 300, wk="p", wa="key", wn=1000, wrev=3, wpv=1,
                       pk="key", pt=now - 5000, ready=now - 4000, ck="key", cat=now - 5000),
        # Its poll time was taken for another key: not kept (its first claim is due now).
        "poll-moved": OldRun(rev=2, record=b"q", wk="p", wa="new-key", wn=LONG, wrev=2,
                             wpv=1, pk="old-key", pt=now - 10, ready=now),
        "waiting": OldRun(rev=1, record=b"w", wk="c", wa="dep", wn=1, wrev=1, wpv=1),
        "deadline": OldRun(rev=1, record=b"d", wk="c", wa="dep", wn=1, wdl=now + LONG,
                           wrev=1, wpv=1, ready=now + LONG),
        "dep": OldRun(rev=1, record=b"dep"),
        "stale": OldRun(rev=2, record=b"s", wk="a", wn=0, wrev=1, wpv=1),
        "big": OldRun(rev=1, record=bytes(range(256)) * 80, own="o" * 2048, exp=now + LONG),
    }
    if layout >= 3:
        runs["poison"] = OldRun(rev=1, record=b"x", own="node-c", exp=now - 1000, tk=3,
                                px=True)
    return runs


def old_namespace(client: redis.Redis, layout: int, **options: Any
                  ) -> tuple[RedisRunStore, dict[str, OldRun], old_layouts.Written]:
    """A namespace of ``layout`` holding :func:`population` (layout 4: buckets of 2), its
    store, its runs and what was written."""
    namespace = unique_namespace()
    runs = population(now_of(client), layout)
    if layout >= 3:
        options.setdefault("deleted_rev", 7)
    if layout == 4:
        options.setdefault("bucket", 2)
    written = old_layouts.write(client, namespace, layout, runs, **options)
    return RedisRunStore(client, namespace=namespace, discover=json_wait), runs, written


def runtime_calls(store: RedisRunStore) -> dict[str, Callable[[], Any]]:
    """Every operation of the store but migrate(), quarantined() and now()."""
    return {
        "get": lambda: store.get("held"),
        "get_many": lambda: store.get_many(["held", "at"]),
        "insert": lambda: store.insert("new", b"x", Release()),
        "compare_and_set": lambda: store.compare_and_set("held", 4, b"x", Hold("node-a")),
        "delete": lambda: store.delete("at", 1, Release()),
        "renew": lambda: store.renew("node-a", ["held"], LONG),
        "release": lambda: store.release("node-a", ["held"]),
        "finish": lambda: store.finish("held", 4, Fenced("node-a", 1), failure=Failure("x")),
        "restore": lambda: store.restore("poison"),
        "refresh": lambda: store.refresh("at"),
        "claim_ready": lambda: store.claim_ready(ME, LONG, 10),
        "claim_expired": lambda: store.claim_expired(ME, LONG, 10, max_takeovers=1),
        "claim": lambda: store.claim(ME, LONG, 10),
        "blocked claim": lambda: store.claim(ME, LONG, 10, block=50),
    }


def assert_migrated(client: redis.Redis, store: RedisRunStore, runs: dict[str, OldRun],
                    written: old_layouts.Written) -> None:
    """Every run reads back as it was (its wait and poll time too), every index entry is in
    its flat index, no bucket is left, and meta says layout 5."""
    keys = written.keys
    now = store.now()
    got = store.get_many(list(runs))
    assert got == {run: old.expected(now) for run, old in runs.items()}
    for run, old in runs.items():
        assert wait5(client, keys, run) == wait_of(old), run
    assert {decoded(k): int(s) for k, s in client.zrange(keys.leases, 0, -1, withscores=True)
            } == written.leases
    assert {decoded(k): int(s) for k, s in client.zrange(keys.ready, 0, -1, withscores=True)
            } == written.ready
    for dep, waiters in written.waiters.items():
        assert {decoded(w) for w in client.smembers(encoded(keys.dependents(dep)))} == waiters
    assert old_layouts.bucket_keys(client, keys) == []
    meta = client.hgetall(keys.meta)
    assert (meta[b"layout"], meta[b"v5"]) == (b"5", b"1")
    assert not {b"migrate-cursor", b"migrate-pass", b"migrate-moved", b"old-ix"} & set(meta)


# ---------------------------------------------------------------------------- layout 5


def test_a_new_namespace_starts_at_layout_5(backend: redis.Redis) -> None:
    """No migrate() call: the first write records layout 5; runs are strings, indexes flat
    sorted sets; migrate() on it is one step that scans nothing."""
    store = RedisRunStore(backend, namespace=unique_namespace(),
                          discover=lambda r: At(0) if r.startswith(b"ready") else None)
    keys = Keyspace(store.namespace)
    store.insert("held", b"held", Claim("node-a", LONG))
    store.insert("ready", b"ready", Release())
    assert backend.hgetall(keys.meta) == {b"layout": b"5", b"v5": b"1"}
    assert {backend.type(k) for k in backend.scan_iter(match=keys.run("*"))} == {b"string"}
    assert backend.type(keys.leases) == backend.type(keys.ready) == b"zset"
    store.delete("held", 1, Hold("node-a"))
    assert store.claim_ready("node-b", LONG, 10) == ["ready"]
    assert store.migrate() == Migrated(0, 0, 1)


def test_the_library_names_the_layout_its_scripts_write() -> None:
    """The refusal a node gives names its own layout: the scripts' LAYOUT."""
    from redisstore.core.runops import LAYOUT

    assert LAYOUT == 5
    assert f"local LAYOUT = {LAYOUT}\n" in (scripts.lua_dir() / "_lib" / "keys.lua").read_text()


def test_a_newer_layout_is_refused_and_migrate_leaves_it(backend: redis.Redis) -> None:
    """A namespace a newer library moved on (it records another layout, and no v5)."""
    store = RedisRunStore(backend, namespace=unique_namespace())
    store.insert("r", b"x", Release())
    keys = Keyspace(store.namespace)
    backend.hdel(keys.meta, "v5")
    backend.hset(keys.meta, "layout", 6)
    before = dump(backend, store.namespace)
    for call in (lambda: store.get("r"), store.migrate):
        with pytest.raises(Misconfigured, match="newer"):
            call()
    assert dump(backend, store.namespace) == before


@pytest.mark.parametrize("owner_length", [1, 150, 400, 2048])
def test_headers_that_grow_and_shrink_read_back_exactly(backend: redis.Redis,
                                                        owner_length: int) -> None:
    store = RedisRunStore(backend, namespace=unique_namespace(),
                          discover=lambda r: At(0) if r == b"ready" else None)
    owner = "o" * owner_length
    store.insert("r", b"ready", Release())
    assert store.claim_ready(owner, LONG, 1) == ["r"]  # the header grows
    current = store.get("r")
    assert current.holder == Held(owner, True) and current.claim is not None
    assert store.renew(owner, ["r"], LONG) == ["r"]
    store.compare_and_set("r", 1, b"ready", Release())  # record rewritten, header shrinks
    assert store.claim_ready("p", LONG, 1) == ["r"]
    store.compare_and_set("r", 2, b"", Hold("p"))  # an empty record
    assert store.get("r").record == b""
    assert store.claim_expired("q", LONG, 1) == []
    store.compare_and_set("r", 3, b"x" * 300, Release())
    assert store.get("r").record == b"x" * 300
    assert store.get("r").holder == Free()


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda v: v[:-1],
    "no trailer": lambda v: v[:-3],
    "trailer digits": lambda v: v[:-1] + b"7",
    "region too long": lambda v: v[:-3] + b"992",
    "empty": lambda v: b"",
    "revision nan": lambda v: with_field5(v, "rev", b"nan"),
    "revision 0": lambda v: with_field5(v, "rev", b"0"),
    "text overruns": lambda v: v.replace(b",6,0,0:node-a", b",9,0,0:node-a"),
    "junk after the texts": lambda v: with_field5(v.replace(b":node-a", b":node-azz"),
                                                  "rev", b"1"),
    "takeovers over the cap": lambda v: with_field5(v, "tk", b"2147483649"),
    "a token that is not a number": lambda v: with_field5(v, "tok", b"x"),
    "a session id that is no number": lambda v: with_field5(v, "sid", b"x"),
    "a session id of 0": lambda v: with_field5(v, "sid", b"0"),
    "a number with a leading zero": lambda v: with_field5(v, "at", b"01"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_string_is_corrupt_and_never_stops_the_others(backend: redis.Redis,
                                                                 damage: str) -> None:
    store = RedisRunStore(backend, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    for run in ("bad", "good"):
        store.insert(run, b"\x00", Claim("node-a", 1))
    value = backend.get(keys.run("bad"))
    assert value is not None
    damaged = DAMAGES[damage](value)
    assert damaged != value
    backend.set(keys.run("bad"), damaged)
    before = dump(backend, store.namespace)
    for call in (lambda: store.get("bad"),
                 lambda: store.compare_and_set("bad", 1, b"z", Hold("node-a")),
                 lambda: store.insert("bad", b"z", Release()),
                 lambda: store.delete("bad", 1, Release()),
                 lambda: store.refresh("bad")):
        with pytest.raises(StoreError):
            call()
        assert dump(backend, store.namespace) == before
    assert store.renew("node-a", ["bad"], LONG) == []
    assert store.release("node-a", ["bad"]) == []
    assert dump(backend, store.namespace) == before
    time.sleep(0.01)  # both leases (1 ms) expire
    # The expired good run is claimed; the damaged one is quarantined, not a wall.
    claimed: list[str] = []
    for _ in range(50):
        claimed += store.claim_expired("node-b", LONG, 10)
        if claimed:
            break
    assert claimed == ["good"]
    assert [q.run for q in store.quarantined()] == ["bad"]


def test_names_over_the_cap_are_refused_in_python_and_in_the_script(
        backend: redis.Redis) -> None:
    store = RedisRunStore(backend, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    huge = "o" * 2049
    for call in (lambda: store.insert("r", b"x", Claim(huge, LONG)),
                 lambda: store.insert(huge, b"x", Release()),
                 lambda: store.insert("\ud800", b"x", Release())):
        with pytest.raises(ValueError):
            call()
    # A tenant with EVALSHA is refused by the script itself, before it writes.
    backend.script_load(scripts.RUN_INSERT.source)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        backend.evalsha(scripts.RUN_INSERT.sha, 4, keys.run("r"), keys.leases, keys.ready,
                        keys.meta, keys.prefix, "r", b"x", "c", huge, LONG, "", "", "", "", 1)
    assert backend.exists(keys.run("r")) == 0
    store.insert("r", b"x", Claim("o" * 2048, LONG))  # at the cap: stored and read back
    assert store.get("r").holder == Held("o" * 2048, True)


def test_damaged_index_keys_a_write_would_touch_refuse_it_before_it_writes(
        backend: redis.Redis) -> None:
    store = RedisRunStore(backend, namespace=unique_namespace(),
                          discover=lambda r: Changed(r.decode(), seen=0) if r else None)
    keys = Keyspace(store.namespace)
    store.insert("w", b"old-dep", Claim("n1", LONG))
    store.insert("gone", b"", Claim("n1", 1))
    old_dep = keys.dependents("old-dep")
    backend.delete(old_dep)
    backend.set(old_dep, "not a set")
    before = dump(backend, store.namespace)
    with pytest.raises(Corrupt, match="index:d"):  # leaving the old dependency's waiters
        store.compare_and_set("w", 1, b"", Release())
    assert dump(backend, store.namespace) == before
    backend.delete(old_dep)
    backend.set(keys.quarantine, "not a hash")
    backend.set(keys.run("gone"), "damaged")  # a claim would quarantine its entry
    before = dump(backend, store.namespace)
    time.sleep(0.01)
    with pytest.raises(Corrupt, match="quarantine"):
        store.claim_expired("n2", LONG, 10)
    assert dump(backend, store.namespace) == before
    backend.delete(keys.quarantine)
    backend.set(keys.fanout_cursor, "not a hash")
    # A claim that neither reads nor writes the damaged key is not refused for it...
    assert store.claim_ready("n2", LONG, 10) == []
    # ...one that would resume a pending fan-out is, before it writes.
    backend.zadd(keys.fanout, {"w": 1})
    backend.sadd(keys.dependents("w"), "x")
    before = dump(backend, store.namespace)
    with pytest.raises(Corrupt, match="fanout-cursor"):
        store.claim_ready("n2", LONG, 10)
    assert dump(backend, store.namespace) == before


def test_a_pending_fan_out_whose_waiters_set_was_replaced_is_dropped_not_a_wall(
        backend: redis.Redis) -> None:
    store = RedisRunStore(backend, namespace=unique_namespace(),
                          discover=lambda r: Changed("dep", seen=0) if r == b"w" else At(0))
    keys = Keyspace(store.namespace)
    for i in range(150):  # more than one write re-indexes: the rest is deferred
        store.insert(f"w{i:03}", b"w", Release())
    store.insert("dep", b"d", Release())
    assert backend.zcard(keys.fanout) == 1
    backend.delete(keys.dependents("dep"))
    backend.set(keys.dependents("dep"), "not a set")
    claimed = store.claim_ready("n", LONG, 100)
    assert len(claimed) == 100  # the re-indexed waiters are claimed; no wall
    assert backend.zcard(keys.fanout) == 0
    assert Quarantined("fanout", "dep", "type") in store.quarantined()


def test_a_claims_wait_is_the_time_to_the_earliest_entry_whatever_its_score(
        backend: redis.Redis) -> None:
    """A claim answers how long until its index's head is due (blocked claimers set their
    timer from it): a fractional score counts rounded up, an infinite one never."""
    store = RedisRunStore(backend, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    store.insert("a", b"x", Claim("n", LONG))
    store.insert("b", b"x", Claim("n", 2 * LONG))
    expiry = int(backend.zscore(keys.leases, "a") or 0)
    backend.zadd(keys.leases, {"ghost": expiry - 0.5, "ghost2": float("inf")})
    call = next(RunOps(store.namespace, None, 1).claim_expired("me", LONG, 10))
    assert call.script is not None
    backend.script_load(call.script.source)
    before = store.now()
    reply = backend.execute_command(*call.command())
    after = store.now()
    assert reply[1] == []
    assert expiry - after <= reply[3] <= expiry - before
    backend.zrem(keys.leases, "a", "b", "ghost")
    call = next(RunOps(store.namespace, None, 1).claim_expired("me", LONG, 10))
    assert backend.execute_command(*call.command())[3] == -1  # only +inf: never due


def test_a_run_id_that_is_not_utf8_never_breaks_a_claim_and_round_trips(
        backend: redis.Redis) -> None:
    """A tenant with EVALSHA can store any bytes as a run id or owner; a claim that takes
    such a run still answers (the name decodes with surrogateescape) and that name, sent
    back, names the same run."""
    store = RedisRunStore(backend, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    raw = b"\xff\xfe"
    backend.script_load(scripts.RUN_INSERT.source)
    for run, owner in ((raw, b"n"), (b"odd-owner", b"\xfa")):
        backend.evalsha(scripts.RUN_INSERT.sha, 4, keys.prefix.encode() + b"r:" + run,
                        keys.leases, keys.ready, keys.meta, keys.prefix, run, b"x", "c",
                        owner, 1, "", "", "", "", 1)
    store.insert("good", b"x", Claim("n", 1))
    time.sleep(0.01)
    name = raw.decode("utf-8", "surrogateescape")
    assert store.get("odd-owner").holder == Held(b"\xfa".decode("utf-8", "surrogateescape"),
                                                 False)
    claimed = store.claim_expired("me", LONG, 10)
    assert sorted(claimed) == sorted(["good", name, "odd-owner"])
    assert store.renew("me", [name], LONG) == [name]
    assert store.get(name).holder == Held("me", True)


@pytest.mark.server
def test_out_of_memory_refuses_every_write_before_it_writes(tmp_path: Path) -> None:
    """Redis checks maxmemory only at a script's first write, and only if that write can
    grow memory: a script whose first write was an HDEL or a ZREM wrote on past the limit.
    A migration step's first write is its meta's."""
    server = start(redis_binary(), "redis-server", tmp_path,
                   ("--save", "", "--appendonly", "no", "--maxmemory", "3mb",
                    "--maxmemory-policy", "noeviction"))
    try:
        client = server.client()
        old = unique_namespace()
        old_layouts.write(client, old, 4, {f"o{i}": OldRun(record=b"x", own="n", exp=1)
                                           for i in range(20)}, bucket=4)
        store = RedisRunStore(client, namespace=unique_namespace(),
                              discover=lambda r: At(0))
        store.insert("held", b"x", Claim("node-a", LONG))
        store.insert("free", b"x", Release())
        with pytest.raises(StoreError) as caught:
            for i in range(10_000):
                store.insert(f"run-{i}", b"x" * 2048, Release())
        assert getattr(caught.value, "outcome", None) == "not_applied"
        assert "OOM" in str(caught.value)
        # Used memory hovers at the limit (a refused call frees its buffers): put the limit
        # well below it, so that every write below meets it.
        client.config_set("maxmemory", "1mb")
        before = dump(client, store.namespace)
        old_before = dump(client, old)
        migrating = RedisRunStore(client, namespace=old)
        for call in (lambda: store.insert("late", b"x", Release()),
                     lambda: store.compare_and_set("free", 1, b"y", Claim("n", LONG)),
                     lambda: store.claim_ready("node-b", LONG, 10),
                     lambda: store.renew("node-a", ["held"], LONG),
                     migrating.migrate):
            with pytest.raises(StoreError, match="OOM"):
                call()
            assert dump(client, store.namespace) == before
            assert dump(client, old) == old_before
    finally:
        server.kill()


# ---------------------------------------------------------------------------- migrate()


@pytest.mark.parametrize("layout", [1, 2, 3, 4])
def test_every_operation_on_an_older_layout_is_refused_and_writes_nothing(
        client: redis.Redis, layout: int) -> None:
    store, _, _ = old_namespace(client, layout)
    before = dump(client, store.namespace)
    for name, call in runtime_calls(store).items():
        with pytest.raises(Misconfigured, match=f"layout version {layout}.*store.migrate()"):
            call()
        assert dump(client, store.namespace) == before, name
    assert isinstance(store.now(), int)  # the clock needs no layout


def test_a_namespace_with_no_layout_recorded_but_old_index_keys_is_layout_1(
        backend: redis.Redis) -> None:
    """Written before layouts were recorded (or its meta key deleted): its index keys say
    it is layout 1, so it is refused, and migrate() records that first, then moves it."""
    store, runs, written = old_namespace(backend, 1, record_layout=False)
    assert not backend.exists(written.keys.meta)
    with pytest.raises(Misconfigured, match="layout version 1"):
        store.get("held")
    store._io.drive(store._ops.migrate_step(1))  # a step of a pass (it moves something)
    assert backend.hget(written.keys.meta, "layout") == b"1"
    store.migrate()
    assert_migrated(backend, store, runs, written)


@pytest.mark.parametrize("layout", [1, 2, 3, 4])
def test_migrate_moves_every_run_and_index_entry(client: redis.Redis, layout: int) -> None:
    store, runs, written = old_namespace(client, layout)
    report = store.migrate()
    entries = (len(written.leases) + len(written.ready)
               + sum(len(w) for w in written.waiters.values())) if layout == 4 else 0
    assert (report.moved, report.damaged, report.entries) == (len(runs), 0, entries)
    assert report.steps >= 2  # a pass that moved runs, then one that finds none
    assert_migrated(client, store, runs, written)
    if layout >= 3:
        assert client.hget(written.keys.meta, "deleted-rev") == b"7"
        assert store.quarantined() == [Quarantined("poison", "poison", "takeovers=3")]
    assert store.migrate() == Migrated(0, 0, 1)  # done: one step, no scan


@pytest.mark.parametrize("layout", [1, 2, 3, 4])
def test_claims_fan_out_and_poison_runs_work_after_migrate(backend: redis.Redis,
                                                           layout: int) -> None:
    store, runs, _ = old_namespace(backend, layout)
    store.migrate()
    # Ready runs in the order of their wait (an At of 0, a poll due 4 s ago, a poll whose
    # time went with its old key: due now); the waiters' dependency has not changed.
    assert store.claim_ready(ME, LONG, 10) == ["at", "poll", "poll-moved"]
    # The expired lease is taken over (the poison run is out of the index).
    assert store.claim_expired(ME, LONG, 10, max_takeovers=5) == ["expired"]
    taken = store.get("expired")
    assert (taken.holder, taken.token, taken.attempts) == (Held(ME, True), 2, 1)
    assert taken.takeovers == runs["expired"].tk + 1
    # A held run's grant is token 1: a fenced write under it lands; the next grant is 2.
    store.compare_and_set("held", 4, b"held 2", Fenced("node-a", 1))
    store.compare_and_set("held", 5, b"held 3", Claim("node-a", LONG))
    assert store.get("held").token == 2
    # The dependency is written: both its waiters are re-indexed and claimed.
    store.compare_and_set("dep", 1, b"dep 2", Release())
    assert sorted(store.claim_ready(ME, LONG, 10)) == ["deadline", "waiting"]
    claim = store.get("waiting").claim
    assert claim is not None and (claim.key, claim.dependency_revision) == ("dep", 2)
    # Deleted and inserted again, a run starts above every revision it or another had.
    store.delete("dep", 2, Release())
    assert store.insert("dep", b"again", Release()) == (8 if layout >= 3 else 3)
    if layout >= 3:
        assert store.get("poison").quarantined == "poison"
        assert store.release("node-c", ["poison"]) == ["poison"]
        assert store.quarantined() == []
        assert (store.get("poison").holder, store.get("poison").takeovers) == (Free(), 0)


def test_a_pending_fan_out_of_layout_4_is_finished_after_migrate(
        backend: redis.Redis) -> None:
    """Layout 4's fan-out cursors walked buckets ("b" and a waiter); the flat set's SSCAN
    starts over: every waiter is re-indexed, none missed."""
    now = now_of(backend)
    runs = {f"w{i:03}": OldRun(record=b"w", wk="c", wa="dep", wn=1, wrev=1, wpv=1)
            for i in range(300)}
    runs["dep"] = OldRun(rev=2, record=b"dep")
    namespace = unique_namespace()
    written = old_layouts.write(backend, namespace, 4, runs, bucket=64,
                                fanout={"dep": b"bw150"}, flat={"w001", "w002"})
    keys = written.keys
    assert now > 0 and backend.hget(keys.meta, "old-ix") == b"1"
    store = RedisRunStore(backend, namespace=namespace, discover=json_wait)
    assert store.migrate().entries == 298
    assert not backend.exists(keys.fanout_cursor)
    assert backend.scard(keys.dependents("dep")) == 300
    claimed: set[str] = set()
    for _ in range(20):
        claimed |= set(store.claim_ready(ME, LONG, 100))
    assert claimed == {f"w{i:03}" for i in range(300)}


@pytest.mark.parametrize("layout", [1, 2, 3, 4])
def test_damaged_runs_are_left_and_listed_and_the_others_move(backend: redis.Redis,
                                                              layout: int) -> None:
    store, runs, written = old_namespace(backend, layout)
    keys = written.keys
    damaged: dict[str, str] = {}
    if layout == 1:
        backend.hset(keys.run("at"), "rev", "nan")
        backend.hdel(keys.run("poll"), "rec")
        backend.hset(keys.run("stale"), "wk", "x")
        backend.hset(keys.run("dep"), "exp", "9" * 100)  # longer than any the library wrote
        damaged = {"at": "rev", "poll": "rec", "stale": "wk", "dep": "exp"}
    else:
        value = backend.get(keys.run("at"))
        backend.set(keys.run("at"), value[:-1])  # a trailer cut short
        backend.setrange(keys.run("poll"), 300, b"x")  # the revision
        value = backend.get(keys.run("stale"))
        backend.set(keys.run("stale"), value.replace(b",a,", b",z,"))
        backend.set(keys.run("dep"), b"no header at all")
        damaged = {"at": "header", "poll": "rev", "stale": "wk", "dep": "header"}
    backend.rpush(keys.run("list"), "a run key of another type")
    damaged["list"] = "type"
    before = {run: backend.dump(keys.run(run)) for run in damaged}
    report = store.migrate()
    assert (report.moved, report.damaged) == (len(runs) + 1 - len(damaged), len(damaged))
    assert {q.run: q.reason for q in store.quarantined() if q.index == "migrate"} == damaged
    assert {run: backend.dump(keys.run(run)) for run in damaged} == before  # left as is
    with pytest.raises(Corrupt):
        store.get("at")
    now = store.now()
    assert store.get("held") == runs["held"].expected(now)
    assert store.migrate().steps == 1  # done, though they stay


@pytest.mark.parametrize("layout", [1, 2, 3, 4])
def test_a_migration_stopped_midway_resumes_to_the_same_end(
        backend: redis.Redis, layout: int, monkeypatch: pytest.MonkeyPatch) -> None:
    store, runs, written = old_namespace(backend, layout)
    real, calls = RunOps.migrate_step, []

    def dies(self: RunOps, count: int) -> Any:
        calls.append(count)
        if len(calls) == 4:  # three steps done: the process is killed
            raise KeyboardInterrupt
        return real(self, count)

    monkeypatch.setattr(RunOps, "migrate_step", dies)
    with pytest.raises(KeyboardInterrupt):
        store.migrate(count=2)
    monkeypatch.setattr(RunOps, "migrate_step", real)
    with pytest.raises(Misconfigured, match="migrate"):  # still refused halfway
        store.get("held")
    assert backend.hget(written.keys.meta, "migrate-cursor") is not None
    store.migrate(count=2)
    assert_migrated(backend, store, runs, written)


def test_two_migrating_at_once_reach_the_same_end(backend: redis.Redis) -> None:
    """Two processes migrate the same namespace at once: the steps share the work (each
    run moved once), and both end when it is done."""
    runs = {f"r{i:03}": OldRun(rev=i + 1, record=b"%d" % i, own="n" if i % 2 else None,
                               exp=LONG if i % 2 else None) for i in range(120)}
    namespace = unique_namespace()
    written = old_layouts.write(backend, namespace, 4, runs, bucket=4)
    reports: list[Migrated] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            reports.append(RedisRunStore(backend, namespace=namespace).migrate(count=5))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(r.moved for r in reports) == len(runs)
    assert sum(r.entries for r in reports) == len(written.leases)
    assert_migrated(backend, RedisRunStore(backend, namespace=namespace), runs, written)


def test_the_step_caps_hold(backend: redis.Redis) -> None:
    """Keys per page (SCAN COUNT), 512 KiB of records a step but always one run (one 2 MiB
    layout 1 run a step), at most MAX_MIGRATE_ENTRIES entries out of layout 4's buckets."""
    namespace = unique_namespace()
    sizes = {f"big{i}": 2 << 20 for i in range(3)} | {f"mid{i}": 300 << 10 for i in range(3)}
    sizes |= {f"small{i}": 100 for i in range(20)}
    runs = {run: OldRun(record=bytes([i % 256]) * size)
            for i, (run, size) in enumerate(sizes.items())}
    old_layouts.write(backend, namespace, 1, runs)
    store = RedisRunStore(backend, namespace=namespace, max_record_bytes=2 << 20)
    keys = Keyspace(namespace)
    steps: list[tuple[int, bool, int, int]] = []
    while not steps or not steps[-1][1]:
        types = {run: backend.type(keys.run(run)) for run in runs}
        step = store._io.drive(store._ops.migrate_step(int(Cap.MAX_MIGRATE)))
        moved = [run for run in runs
                 if types[run] == b"hash" and backend.type(keys.run(run)) == b"string"]
        assert step[0] == len(moved)
        assert len(moved) == 1 or sum(sizes[run] for run in moved) <= Cap.MAX_MIGRATE_BYTES
        steps.append(step)
    assert sum(s[0] for s in steps) == len(runs)
    assert {run: store.get(run).record for run in runs} == {
        run: old.record for run, old in runs.items()}
    # A bucket a foreign write grew past what a step moves: moved over several.
    namespace = unique_namespace()
    grown = {f"r{i:05}": OldRun(record=b"r", own="n", exp=LONG + i) for i in range(3000)}
    written = old_layouts.write(backend, namespace, 4, grown, bucket=3000)
    store = RedisRunStore(backend, namespace=namespace)
    entries = []
    while True:
        step = store._io.drive(store._ops.migrate_step(int(Cap.MAX_MIGRATE)))
        entries.append(step[3])
        if step[1]:
            break
    assert max(entries) <= Cap.MAX_MIGRATE_ENTRIES and sum(entries) == 3000
    assert backend.zcard(written.keys.leases) == 3000


NASTY = ["a,", ",", "1:", "0:,", " ,", "9", "x,,", "é,", ",,,", "\udcff"]


@pytest.mark.parametrize("layout", [1, 2, 4])
@pytest.mark.parametrize("text", NASTY)
def test_text_fields_of_any_bytes_read_back_through_migrate(backend: redis.Redis,
                                                            layout: int, text: str) -> None:
    """A text field is length-prefixed in every layout but 1: its own bytes may be commas,
    colons, digits or spaces, also at the end of the header (the poll key is layout 4's last
    text field), and not UTF-8 at all."""
    now = now_of(backend)
    runs = {"p": OldRun(rev=2, record=f"poll|{text}".encode("utf-8", "surrogateescape"),
                        wk="p", wa=text, wn=1000, wrev=2, wpv=1, pk=text, pt=now - 2000,
                        ready=now - 1000, ck=text, cat=now - 2000),
            "c": OldRun(rev=1, record=b"c", own=text, exp=now + LONG, wk="c", wa=text, wn=0,
                        wrev=1, wpv=1),
            text: OldRun(rev=3, record=b"named")}
    namespace = unique_namespace()
    written = old_layouts.write(backend, namespace, layout, runs, room=3)
    store = RedisRunStore(backend, namespace=namespace)
    assert store.migrate().moved == 3
    assert_migrated(backend, store, runs, written)
    assert store.claim_ready(ME, LONG, 10) == ["p"]  # due: its poll time was kept
    claimed = store.get("p")
    assert claimed.claim is not None and claimed.claim.key == text
    assert store.quarantined() == []


def test_only_the_namespaces_own_keys_move_even_with_glob_characters(
        backend: redis.Redis) -> None:
    base = unique_namespace()
    tricky, other = base + "*[ab]?\\", base + "Xa?\\"
    for namespace, record in ((tricky, b"mine"), (other, b"theirs")):
        old_layouts.write(backend, namespace, 4, {"r": OldRun(record=record, own="n",
                                                              exp=LONG)})
    before = dump(backend, other)
    assert RedisRunStore(backend, namespace=tricky).migrate().moved == 1
    assert dump(backend, other) == before
    assert header5(backend.get(Keyspace(tricky).run("r")))["record"] == b"mine"


def test_damaged_runs_are_counted_once_though_a_page_is_visited_again(
        backend: redis.Redis) -> None:
    runs = {f"big{i}": OldRun(record=b"x" * (300 << 10)) for i in range(4)}
    runs |= {f"bad{i}": OldRun(record=b"x") for i in range(6)}
    namespace = unique_namespace()
    written = old_layouts.write(backend, namespace, 1, runs)
    for i in range(6):
        backend.hset(written.keys.run(f"bad{i}"), "rev", "nan")
    store = RedisRunStore(backend, namespace=namespace)
    report = store.migrate()
    assert (report.moved, report.damaged) == (4, 6)
    assert len([q for q in store.quarantined() if q.index == "migrate"]) == 6


def test_a_cursor_from_another_server_life_still_moves_every_run(
        backend: redis.Redis) -> None:
    """A SCAN cursor means something only to the server process that made it (a restart or
    a failover changes the hash seed): a pass that moved anything is followed by another,
    and only a whole pass that moves nothing ends."""
    store, runs, written = old_namespace(backend, 3)
    while store._io.drive(store._ops.migrate_step(5))[0] == 0:
        pass
    backend.hset(written.keys.meta, "migrate-cursor", str(2**40 + 12345))
    store.migrate()
    assert_migrated(backend, store, runs, written)


def test_a_cursor_an_earlier_librarys_migration_left_is_not_resumed(
        backend: redis.Redis) -> None:
    """Resumed, its pass could end at once (fakeredis: a cursor past the last key) having
    moved nothing, and so the migration, with every run still to move."""
    store, runs, written = old_namespace(backend, 3)
    backend.hset(written.keys.meta, mapping={"migrate-cursor": 2**40 + 12345,
                                             "migrate-moved": 0})
    store.migrate()
    assert_migrated(backend, store, runs, written)


@pytest.mark.parametrize("layout", [3, 4])
def test_a_namespace_of_partitions_migrates_every_partition(backend: redis.Redis,
                                                             layout: int) -> None:
    now = now_of(backend)
    runs = {f"{name}-{i}": run for i in range(3)
            for name, run in population(now, layout).items() if name not in (
                "waiting", "deadline", "dep", "held")}
    namespace = unique_namespace()
    written = old_layouts.write_partitioned(backend, namespace, layout, runs, 3, bucket=2)
    store = RedisRunStore(backend, namespace=namespace, discover=json_wait, partitions=3)
    with pytest.raises(Misconfigured, match="migrate"):
        store.get("at-0")
    report = store.migrate()
    assert (report.moved, report.damaged) == (len(runs), 0)
    now = store.now()
    assert store.get_many(list(runs)) == {run: old.expected(now) for run, old in runs.items()}
    for part in written:
        assert old_layouts.bucket_keys(backend, part.keys) == []
        assert backend.hget(part.keys.meta, "layout") == b"5"
    assert sorted(store.claim_ready(ME, LONG, 20)) == sorted(
        f"{name}-{i}" for i in range(3) for name in ("at", "poll", "poll-moved"))
    assert store.migrate().steps == 1


def test_a_memory_store_has_nothing_to_migrate() -> None:
    from redisstore import MemoryRunStore

    assert MemoryRunStore().migrate() == Migrated()
    with pytest.raises(ValueError):
        MemoryRunStore().migrate(count=0)


def test_a_poll_wait_keeps_its_time_only_for_its_own_key(backend: redis.Redis) -> None:
    """Layout 1 kept the poll key its last claim was for (pk) beside the wait's key: the
    time goes with a key that is not the wait's."""
    now = now_of(backend)
    runs = {"same": OldRun(record=b"s", wk="p", wa="k", wn=LONG, wrev=1, wpv=1, pk="k",
                           pt=now, ready=now + LONG),
            "other": OldRun(record=b"o", wk="p", wa="k", wn=LONG, wrev=1, wpv=1, pk="j",
                            pt=now, ready=now + LONG),
            "none": OldRun(record=b"n", wk="p", wa="k", wn=LONG, wrev=1, wpv=1,
                           ready=now)}
    namespace = unique_namespace()
    written = old_layouts.write(backend, namespace, 1, runs)
    store = RedisRunStore(backend, namespace=namespace, discover=lambda r: Poll("k", LONG))
    store.migrate()
    assert [wait5(backend, written.keys, run)[-1] for run in runs] == [now, None, None]
    # Its entry stays where the old library put it (at its old poll time) until a write
    # or a refresh places it again: due now, as a poll key never claimed.
    assert store.claim_ready(ME, LONG, 10) == ["none"]
    assert store.refresh("other")
    assert store.claim_ready(ME, LONG, 10) == ["other"]


def test_a_layout_1_record_longer_than_any_store_writes_is_left(
        backend: redis.Redis) -> None:
    namespace = unique_namespace()
    huge = b"h" * (Cap.MAX_RECORD_CEILING + 1)
    written = old_layouts.write(backend, namespace, 1, {"huge": OldRun(record=huge),
                                                        "fine": OldRun(record=b"f")})
    store = RedisRunStore(backend, namespace=namespace)
    assert (store.migrate().moved, store.quarantined()) == (
        1, [Quarantined("migrate", "huge", "record")])
    assert backend.type(written.keys.run("huge")) == b"hash"


def test_a_poll_discovered_after_migrate_uses_the_new_layout(backend: redis.Redis) -> None:
    """A write after migrate() derives the wait again, as any write does."""
    namespace = unique_namespace()
    old_layouts.write(backend, namespace, 2, {"r": OldRun(record=b"x")})
    store = RedisRunStore(backend, namespace=namespace,
                          discover=lambda r: Poll("key", 1000) if r == b"poll" else None)
    store.migrate()
    store.compare_and_set("r", 1, b"poll", Release())
    assert store.claim_ready(ME, LONG, 1) == ["r"]


@pytest.mark.parametrize("kind", ["fakeredis", pytest.param("redis7", marks=pytest.mark.server)])
def test_an_asyncio_store_migrates_alike(kind: str, request: pytest.FixtureRequest) -> None:
    import asyncio

    import redis.asyncio

    from redisstore import AsyncRedisRunStore

    if kind == "fakeredis":
        fake = fakeredis.FakeServer()
        sync: redis.Redis = fakeredis.FakeRedis(server=fake)
        aclient: Any = fakeredis.FakeAsyncRedis(server=fake)
    else:
        server: Server = request.getfixturevalue(kind)
        sync, aclient = server.client(), redis.asyncio.Redis(port=server.port)
    store, runs, written = old_namespace(sync, 4)

    async def main() -> Migrated:
        astore = AsyncRedisRunStore(aclient, namespace=store.namespace)
        with pytest.raises(Misconfigured, match="migrate"):
            await astore.get("held")
        report = await astore.migrate(count=3)
        await astore.aclose()
        return report

    report = asyncio.run(main())
    assert (report.moved, report.damaged) == (len(runs), 0) and report.steps > 2
    assert_migrated(sync, store, runs, written)
