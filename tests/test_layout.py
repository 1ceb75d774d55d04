"""Run layouts: a namespace starts at layout 1 (one hash per run) and ``migrate()`` moves it
to layout 3 (one string per run: record, header, trailer; deletes and poison runs), in
bounded steps, while the store is in use; a library that knows only layout 1 or 2 then
refuses the namespace; a damaged string is corrupt, never misread."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from servers import at_layout, redis_binary, start, unique_namespace

from redisstore import (
    At,
    Changed,
    Claim,
    Conflict,
    Corrupt,
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
    scripts,
)
from redisstore.core.keys import Keyspace

LONG = 600_000


def dump(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    return {key: client.dump(key) for key in client.scan_iter(match=f"{{{namespace}}}:*")}


def kinds(client: redis.Redis, namespace: str) -> set[bytes]:
    """The key types of the namespace's runs."""
    keys = Keyspace(namespace)
    return {client.type(k) for k in client.scan_iter(match=keys.run("*"))}


def populated(client: redis.Redis, runs: int = 12) -> RedisRunStore:
    """A layout 1 namespace with runs in every state: held, free, ready, waiting."""
    store = RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1),
                          discover=lambda r: At(0) if r.startswith(b"ready") else None)
    for i in range(runs):
        if i % 3 == 0:
            store.insert(f"r{i}", f"held {i}".encode(), Claim("node-a", LONG))
        elif i % 3 == 1:
            store.insert(f"r{i}", f"ready {i}".encode(), Release())
        else:
            store.insert(f"r{i}", f"free {i}".encode(), Release())
    return store


def test_a_new_namespace_starts_at_the_newest_layout(client: redis.Redis) -> None:
    """No migrate() call: the first write records layout 4, runs are strings, indexes are
    buckets, and delete and max_takeovers work at once."""
    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: At(0) if r.startswith(b"ready") else None)
    keys = Keyspace(store.namespace)
    store.insert("held", b"held", Claim("node-a", LONG))
    store.insert("ready", b"ready", Release())
    assert client.hget(keys.meta, "layout") == b"4"
    assert kinds(client, store.namespace) == {b"string"}
    assert client.exists(keys.leases, keys.ready) == 0  # layout 1-3's index keys
    store.delete("held", 1, Hold("node-a"))
    assert store.claim_expired("node-b", LONG, 10, max_takeovers=3) == []
    assert store.claim_ready("node-b", LONG, 10) == ["ready"]
    assert store.migrate() == Migrated(0, 0, 1)  # nothing to do, in one step


def test_a_namespace_of_an_older_layout_with_no_layout_recorded_is_read_as_layout_1(
        client: redis.Redis) -> None:
    """Written before layouts were recorded (or its meta key deleted): its layout 1 index
    keys say what it is, so its leases and ready runs are still claimed, and migrate()
    moves it, rather than it being taken for a new namespace at layout 4."""
    store = populated(client)
    keys = Keyspace(store.namespace)
    time.sleep(0.01)
    client.delete(keys.meta)
    held = sorted(f"r{i}" for i in range(0, 12, 3))
    assert sorted(store.claim_expired("node-b", LONG, 10)) == []  # live leases: none due
    assert sorted(store.claim_ready("node-b", LONG, 10)) == ["r1", "r10", "r4", "r7"]
    assert all(store.get(run).holder == Held("node-a", True) for run in held)
    assert store.migrate().moved == 12
    assert kinds(client, store.namespace) == {b"string"}
    assert client.hget(keys.meta, "layout") == b"4"


def test_a_namespace_stays_at_layout_1_until_migrated(client: redis.Redis) -> None:
    """A namespace an older library started at layout 1 is read and written as it is."""
    store = populated(client)
    assert kinds(client, store.namespace) == {b"hash"}
    before = {f"r{i}": store.get(f"r{i}") for i in range(12)}
    report = store.migrate()
    assert (report.moved, report.damaged) == (12, 0)
    assert kinds(client, store.namespace) == {b"string"}
    assert {f"r{i}": store.get(f"r{i}") for i in range(12)} == before
    # Done: a second call is one step that moves nothing.
    assert store.migrate() == Migrated(0, 0, 1)
    assert sorted(store.claim_ready("node-b", LONG, 10)) == ["r1", "r10", "r4", "r7"]


def test_migration_goes_in_bounded_steps(client: redis.Redis) -> None:
    store = populated(client, runs=30)
    report = store.migrate(count=1)
    assert report.moved == 30
    assert report.steps > 1
    assert kinds(client, store.namespace) == {b"string"}


def test_a_step_moves_at_most_512_kib_of_records_but_always_one_run(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1),
                          max_record_bytes=2 * 1024 * 1024)
    big = b"x" * (300 * 1024)
    for i in range(3):
        store.insert(f"big{i}", big + bytes([i]), Release())
    store.insert("huge", b"h" * (2 * 1024 * 1024), Release())  # over the budget alone
    report = store.migrate()
    assert report.moved == 4
    assert report.steps >= 4  # 300 KiB + 300 KiB is over one step's 512 KiB
    assert store.get("big2").record == big + b"\x02"


def test_a_library_that_knows_only_layout_1_refuses_a_migrated_namespace(
        client: redis.Redis) -> None:
    store = populated(client)
    keys = Keyspace(store.namespace)
    # The same script as a library of layout 1 sends it: its check_layout refuses newer.
    old = scripts.Script("run_get_v1", scripts.RUN_GET.source.replace(
        b"\nLAYOUT = 4", b"\nLAYOUT = 1"), "")
    assert old.source != scripts.RUN_GET.source

    def old_get(run: str) -> Any:
        return client.eval(old.source, 2, keys.run(run), keys.meta, keys.prefix, run)

    assert old_get("r2")[0] == 0  # layout 1: read as before
    store.migrate(count=1)
    assert old_get("r2")[:2] == [8, 4]  # TOO_NEW, layout 4: refused, never misread


def test_a_layout_2_namespace_moves_to_layout_4(client: redis.Redis) -> None:
    """A namespace an earlier version moved to layout 2 (strings) moves to layout 4 (its
    index entries go to buckets); until then a library that knows only layout 2 reads it,
    and delete and max_takeovers are refused with nothing written."""
    store = populated(client)
    keys = Keyspace(store.namespace)
    client.hset(keys.meta, "layout", "2")  # what that version's migrate() leaves
    store.compare_and_set("r0", 1, b"held 0", Hold("node-a"))  # written as a string
    assert client.type(keys.run("r0")) == b"string"
    v2 = scripts.Script("run_get_v2", scripts.RUN_GET.source.replace(
        b"\nLAYOUT = 4", b"\nLAYOUT = 2"), "")
    assert client.eval(v2.source, 2, keys.run("r0"), keys.meta, keys.prefix, "r0")[0] == 0
    before = dump(client, store.namespace)
    with pytest.raises(Misconfigured, match="need layout 3"):
        store.delete("r0", 2, Hold("node-a"))
    with pytest.raises(Misconfigured, match="need layout 3"):
        store.claim_expired("node-b", LONG, 10, max_takeovers=1)
    assert dump(client, store.namespace) == before
    client.hdel(keys.meta, "migrate-cursor", "migrate-moved")  # that migration had ended
    report = store.migrate()
    assert (report.damaged, report.entries) == (0, 8)  # 4 leases, 4 ready runs
    assert client.hget(keys.meta, "layout") == b"4"
    assert not client.exists(keys.leases, keys.ready)
    assert client.eval(v2.source, 2, keys.run("r0"), keys.meta, keys.prefix, "r0")[:2] == [8, 4]
    assert sorted(store.claim_ready("node-b", LONG, 10)) == ["r1", "r10", "r4", "r7"]
    store.delete("r0", 2, Hold("node-a"))
    store.insert("r0", b"again", Release())
    assert store.get("r0").revision == 3


def test_a_damaged_run_is_left_and_listed_and_the_others_move(client: redis.Redis) -> None:
    store = populated(client)
    keys = Keyspace(store.namespace)
    client.hset(keys.run("r5"), "rev", "nan")
    report = store.migrate()
    assert (report.moved, report.damaged) == (11, 1)
    assert Quarantined("migrate", "r5", "rev") in store.quarantined()
    assert client.type(keys.run("r5")) == b"hash"
    with pytest.raises(Corrupt):
        store.get("r5")
    assert store.get("r4").record == b"ready 4"


def test_only_the_namespaces_own_keys_move_even_with_glob_characters(
        client: redis.Redis) -> None:
    base = unique_namespace()
    tricky = RedisRunStore(client, namespace=at_layout(client, base + "*[ab]?\\", 1))
    other = RedisRunStore(client, namespace=at_layout(client, base + "Xa?\\", 1))
    tricky.insert("r", b"mine", Release())
    other.insert("r", b"theirs", Release())
    assert tricky.migrate().moved == 1
    assert client.type(Keyspace(other.namespace).run("r")) == b"hash"
    assert client.type(Keyspace(tricky.namespace).run("r")) == b"string"


@pytest.mark.parametrize("owner_length", [1, 150, 400, 2048])
def test_headers_that_grow_and_shrink_read_back_exactly(client: redis.Redis,
                                                        owner_length: int) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: At(0) if r == b"ready" else None)
    store.migrate()
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


def with_fields(value: bytes, fields: bytes) -> bytes:
    """A one-byte record's string with ``fields`` added to the end of its header."""
    digits = int(value[-1:])
    header = value[1:-1 - digits] + fields
    size = str(len(header)).encode()
    return value[:1] + header + size + str(len(size)).encode()


DAMAGES = {
    "truncated": lambda v: v[:-1],
    "no trailer": lambda v: v[:-3],
    "trailer digits": lambda v: v[:-1] + b"7",
    "region too long": lambda v: v[:-3] + b"992",
    "empty": lambda v: b"",
    "revision nan": lambda v: v.replace(b"\x001,", b"\x00nan,"),
    "text overruns": lambda v: v.replace(b",6:node-a,", b",9:node-a,"),
    "junk in a number": lambda v: v.replace(b",6:node-a,", b",6:node-a,zz"),
    "takeovers nan": lambda v: with_fields(v, b",,,,,,,,,,,nan,"),
    "takeovers over the cap": lambda v: with_fields(v, b",,,,,,,,,,,2147483649,"),
    "poison mark 2": lambda v: with_fields(v, b",,,,,,,,,,,,2,"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_string_is_corrupt_and_never_stops_the_others(client: redis.Redis,
                                                                 damage: str) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.migrate()
    keys = Keyspace(store.namespace)
    for run in ("bad", "good"):
        store.insert(run, b"\x00", Claim("node-a", 1))
    value = client.get(keys.run("bad"))
    assert value is not None
    damaged = DAMAGES[damage](value)
    assert damaged != value
    client.set(keys.run("bad"), damaged)
    before = dump(client, store.namespace)
    for call in (lambda: store.get("bad"),
                 lambda: store.compare_and_set("bad", 1, b"z", Hold("node-a")),
                 lambda: store.insert("bad", b"z", Release()),
                 lambda: store.delete("bad", 1, Release()),
                 lambda: store.refresh("bad")):
        with pytest.raises(StoreError):
            call()
        assert dump(client, store.namespace) == before
    assert store.renew("node-a", ["bad"], LONG) == []
    assert store.release("node-a", ["bad"]) == []
    assert dump(client, store.namespace) == before
    time.sleep(0.01)  # both leases (1 ms) expire
    # The expired good run is claimed; the damaged one is quarantined, not a wall.
    claimed: list[str] = []
    for _ in range(50):
        claimed += store.claim_expired("node-b", LONG, 10)
        if claimed:
            break
    assert claimed == ["good"]
    assert [q.run for q in store.quarantined()] == ["bad"]


def test_migration_under_load_loses_no_write(client: redis.Redis) -> None:
    """Writers chain compare-and-sets on their own runs while a migrator moves the namespace
    one key per step: every acknowledged write is the run's state at the end."""
    store = populated(client, runs=0)
    writers, per_writer, rounds = 4, 5, 25
    for w in range(writers):
        for j in range(per_writer):
            store.insert(f"w{w}-{j}", b"0", Claim(f"node-{w}", LONG))
    errors: list[BaseException] = []
    acked: dict[str, tuple[int, bytes]] = {}

    def write(w: int) -> None:
        try:
            for n in range(1, rounds + 1):
                for j in range(per_writer):
                    run = f"w{w}-{j}"
                    record = f"{w}:{j}:{n}".encode()
                    store.compare_and_set(run, n, record, Hold(f"node-{w}"))
                    acked[run] = (n + 1, record)
                    if n % 5 == 0:
                        assert store.renew(f"node-{w}", [run], LONG) == [run]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    steps = 0
    while any(t.is_alive() for t in threads):
        store.migrate(count=1)
        steps += 1
    for t in threads:
        t.join()
    assert not errors, errors
    store.migrate()
    assert kinds(client, store.namespace) == {b"string"}
    for run, (revision, record) in acked.items():
        current = store.get(run)
        assert (current.revision, current.record) == (revision, record)
        assert current.holder == Held(f"node-{run[1]}", True)
    with pytest.raises(Conflict):
        store.compare_and_set("w0-0", 1, b"stale", Hold("node-0"))
    assert steps > 0


def test_names_over_the_cap_are_refused_in_python_and_in_the_script(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.migrate()
    keys = Keyspace(store.namespace)
    huge = "o" * 2049
    for call in (lambda: store.insert("r", b"x", Claim(huge, LONG)),
                 lambda: store.insert(huge, b"x", Release()),
                 lambda: store.insert("\ud800", b"x", Release())):
        with pytest.raises(ValueError):
            call()
    # A tenant with EVALSHA is refused by the script itself, before it writes.
    client.script_load(scripts.RUN_INSERT.source)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        client.evalsha(scripts.RUN_INSERT.sha, 4, keys.run("r"), keys.leases, keys.ready,
                       keys.meta, keys.prefix, "r", b"x", "c", huge, LONG, "", "", "", "", 1)
    assert client.exists(keys.run("r")) == 0
    store.insert("r", b"x", Claim("o" * 2048, LONG))  # at the cap: stored and read back
    assert store.get("r").holder == Held("o" * 2048, True)


@pytest.mark.server
def test_out_of_memory_refuses_every_write_before_it_writes(tmp_path: Path) -> None:
    """Redis checks maxmemory only at a script's first write, and only if that write can
    grow memory: a script whose first write was an HDEL or a ZREM wrote on past the limit."""
    server = start(redis_binary(), "redis-server", tmp_path,
                   ("--save", "", "--appendonly", "no", "--maxmemory", "3mb",
                    "--maxmemory-policy", "noeviction"))
    try:
        client = server.client()
        store = RedisRunStore(client, namespace=unique_namespace(),
                              discover=lambda r: At(0))
        store.migrate()
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
        for call in (lambda: store.insert("late", b"x", Release()),
                     lambda: store.compare_and_set("free", 1, b"y", Claim("n", LONG)),
                     lambda: store.claim_ready("node-b", LONG, 10),
                     lambda: store.renew("node-a", ["held"], LONG)):
            with pytest.raises(StoreError, match="OOM"):
                call()
            assert dump(client, store.namespace) == before
    finally:
        server.kill()


NASTY = ["a,", ",", "1:", "0:,", " ,", "9", "x,,", "é,", ",,,"]


@pytest.mark.parametrize("text", NASTY)
def test_text_fields_of_any_bytes_read_back_in_both_layouts_and_through_migrate(
        client: redis.Redis, text: str) -> None:
    """A text field is length-prefixed: its own bytes may be commas, colons, digits or
    spaces, also at the end of the header (the poll key is its last text field)."""
    def discover(record: bytes) -> Any:
        kind, _, key = record.decode().partition("|")
        return Poll(key, 1000) if kind == "poll" else Changed(key, seen=5)

    store = RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1),
                          discover=discover)
    store.insert("p", f"poll|{text}".encode(), Release())
    store.insert("c", f"dep|{text}".encode(), Claim(text, LONG))
    expected = {run: store.get(run) for run in ("p", "c")}
    assert store.migrate().moved == 2
    assert {run: store.get(run) for run in ("p", "c")} == expected
    assert store.claim_ready(text, LONG, 10) == ["p"]  # the poll key's first claim
    claimed = store.get("p")
    assert claimed.holder == Held(text, True) and claimed.claim is not None
    assert claimed.claim.key == text
    store.compare_and_set("c", 1, f"poll|{text}".encode(), Release())
    assert store.get("c").revision == 2
    assert store.quarantined() == []


def test_a_resumed_migration_with_a_cursor_from_elsewhere_still_moves_every_run(
        client: redis.Redis) -> None:
    """A SCAN cursor means something only to the server process that made it (a restart or
    a failover changes the hash seed): only a whole pass that moves nothing ends."""
    store = populated(client, runs=40)
    keys = Keyspace(store.namespace)
    store._io.drive(store._ops.migrate_step(1))  # layout 2 and a cursor recorded
    client.hset(keys.meta, "migrate-cursor", str(2**40 + 12345))  # a cursor of another life
    store.migrate()
    assert kinds(client, store.namespace) == {b"string"}
    assert client.hget(keys.meta, "migrate-cursor") is None


def test_damaged_runs_are_counted_once_though_a_page_is_visited_again(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=at_layout(client, unique_namespace(), 1))
    keys = Keyspace(store.namespace)
    for i in range(4):
        store.insert(f"big{i}", b"x" * (300 * 1024), Release())
    for i in range(6):
        store.insert(f"bad{i}", b"x", Release())
        client.hset(keys.run(f"bad{i}"), "rev", "nan")
    report = store.migrate()
    assert (report.moved, report.damaged) == (4, 6)
    assert len([q for q in store.quarantined() if q.index == "migrate"]) == 6


def test_damaged_index_keys_a_write_would_touch_refuse_it_before_it_writes(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: Changed(r.decode(), seen=0) if r else None)
    store.migrate()
    keys = Keyspace(store.namespace)
    store.insert("w", b"old-dep", Claim("n1", LONG))
    store.insert("gone", b"", Claim("n1", 1))
    old_dep = keys.buckets("d:old-dep")[1]  # the first bucket of its waiters
    client.delete(old_dep)
    client.set(old_dep, "not a set")
    before = dump(client, store.namespace)
    with pytest.raises(Corrupt, match="index:d"):  # leaving the old dependency's waiters
        store.compare_and_set("w", 1, b"", Release())
    assert dump(client, store.namespace) == before
    client.delete(old_dep)
    client.set(keys.quarantine, "not a hash")
    client.set(keys.run("gone"), "damaged")  # a claim would quarantine its entry
    before = dump(client, store.namespace)
    time.sleep(0.01)
    with pytest.raises(Corrupt, match="quarantine"):
        store.claim_expired("n2", LONG, 10)
    assert dump(client, store.namespace) == before
    client.delete(keys.quarantine)
    client.set(keys.prefix + "fanout-cursor", "not a hash")
    # A claim that neither reads nor writes the damaged key is not refused for it...
    assert store.claim_ready("n2", LONG, 10) == []
    # ...one that would resume a pending fan-out is, before it writes.
    client.zadd(keys.prefix + "fanout", {"w": 1})
    client.zadd(keys.buckets("d:w")[1], {"x": 0})
    before = dump(client, store.namespace)
    with pytest.raises(Corrupt, match="fanout-cursor"):
        store.claim_ready("n2", LONG, 10)
    assert dump(client, store.namespace) == before


def test_a_pending_fan_out_whose_waiters_set_was_replaced_is_dropped_not_a_wall(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: Changed("dep", seen=0) if r == b"w" else At(0))
    store.migrate()
    keys = Keyspace(store.namespace)
    for i in range(150):  # more than one write re-indexes: the rest is deferred
        store.insert(f"w{i:03}", b"w", Release())
    store.insert("dep", b"d", Release())
    assert client.zcard(keys.fanout) == 1
    directory, first = keys.buckets("d:dep")
    client.delete(directory, first)
    client.set(first, "not a set")
    claimed = store.claim_ready("n", LONG, 100)
    assert len(claimed) == 100  # the re-indexed waiters are claimed; no wall
    assert client.zcard(keys.fanout) == 0
    assert Quarantined("fanout", "dep", "type") in store.quarantined()


def test_a_claims_wait_is_the_time_to_the_earliest_entry_whatever_its_score(
        client: redis.Redis) -> None:
    """A claim answers how long until its index's head is due (blocked claimers set their
    timer from it): a fractional score counts rounded up, an infinite one never."""
    from redisstore.core.runops import RunOps

    store = RedisRunStore(client, namespace=unique_namespace())
    store.migrate()
    keys = Keyspace(store.namespace)
    store.insert("a", b"x", Claim("n", LONG))
    store.insert("b", b"x", Claim("n", 2 * LONG))
    leases = keys.buckets("leases")[1]  # the first bucket holds them all
    expiry = int(client.zscore(leases, "a") or 0)
    client.zadd(leases, {"ghost": expiry - 0.5, "ghost2": float("inf")})

    def wait() -> int:
        call = next(RunOps(store.namespace, None, 1).claim_expired("me", LONG, 10))
        assert call.script is not None
        client.script_load(call.script.source)
        before = store.now()
        reply = client.execute_command(*call.command())
        after = store.now()
        assert reply[1] == []
        assert expiry - after <= reply[3] <= expiry - before
        return int(reply[3])

    wait()
    client.zrem(leases, "a", "b", "ghost")
    call = next(RunOps(store.namespace, None, 1).claim_expired("me", LONG, 10))
    assert client.execute_command(*call.command())[3] == -1  # only +inf: never due


@pytest.mark.parametrize("layout", [1, 4])
def test_a_run_id_that_is_not_utf8_never_breaks_a_claim_and_round_trips(
        client: redis.Redis, layout: int) -> None:
    """A tenant with EVALSHA can store any bytes as a run id or owner; a claim that takes
    such a run still answers (the name decodes with surrogateescape) and that name, sent
    back, names the same run."""
    store = RedisRunStore(client, namespace=unique_namespace())
    if layout != 1:
        store.migrate()
    keys = Keyspace(store.namespace)
    raw = b"\xff\xfe"
    client.script_load(scripts.RUN_INSERT.source)
    for run, owner in ((raw, b"n"), (b"odd-owner", b"\xfa")):
        client.evalsha(scripts.RUN_INSERT.sha, 4, keys.prefix.encode() + b"r:" + run,
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


def test_the_library_names_the_layout_its_scripts_write() -> None:
    """The refusal a node gives names its own newest layout: the scripts' LAYOUT."""
    from redisstore.core.runops import LAYOUT

    assert f"local LAYOUT = {LAYOUT}\n" in (scripts.lua_dir() / "_lib" / "keys.lua").read_text()
