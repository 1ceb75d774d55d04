"""Hostile tenants and damaged namespaces: a foreign write or a raw EVALSHA never hangs the
server, never half-applies, and never stops the claim of the undamaged runs.

Damage is planted in layout 5 (lua/_lib/keys.lua): a run is one string, its record, its
header and a trailer; the header's numbers are read by one ``string.match``
(lua/_lib/codec.lua's ``HEADER``, in ``stored``), then checked field by field. So a value
the pattern does not take (``nan``, ``1.5``, ``0x10``, `` 5 ``, ``1e3``, a sign, a
non-digit where a digit must be) makes the whole header unreadable: CORRUPT ``header``;
digits it takes but the field does not (a leading zero, more than 16 digits, above 2**53 - 1,
a field that contradicts another) name the field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis
from servers import unique_namespace

from redisstore import (
    AlreadyExists,
    At,
    Changed,
    Claim,
    Corrupt,
    Failure,
    Fenced,
    Hold,
    Misconfigured,
    Quarantined,
    RedisRunStore,
    Release,
)
from redisstore.core import scripts
from redisstore.core.keys import Keyspace

LONG = 600_000

# ------------------------------------------------------------------ planting damage
#: The header's fields in the order layout 5 stores them (lua/_lib/keys.lua): its numbers
#: (wk and px are a letter or ''), then the lengths of its three texts (lo own, lc ck,
#: lw wa), after which come ':' and the texts.
FIELDS = ("rev", "exp", "tok", "cdr", "cat", "wk", "wn", "wdl", "wrev", "wpv", "pt", "tk",
          "at", "nb", "px", "sid", "lo", "lc", "lw")


@dataclass(frozen=True)
class Stored:
    """A run's value taken apart: its record, header fields (as stored, bytes), its texts
    and the spaces a header that shrank in place left."""

    record: bytes
    fields: dict[str, bytes]
    texts: bytes
    pad: bytes

    def value(self) -> bytes:
        """The value again: record, header region, trailer (the region's length in
        decimal, then the count of those digits)."""
        region = b",".join(self.fields[f] for f in FIELDS) + b":" + self.texts + self.pad
        size = str(len(region)).encode()
        return self.record + region + size + str(len(size)).encode()


def read_run(client: redis.Redis, key: str) -> Stored:
    """The run at ``key``, taken apart as codec.lua's ``stored`` reads it."""
    value = client.get(key)
    assert value is not None, key
    digits = value[-1] - ord("0")
    size = int(value[-1 - digits:-1])
    region = value[-1 - digits - size:-1 - digits]
    numbers, colon, rest = region.partition(b":")
    assert colon, region
    fields = dict(zip(FIELDS, numbers.split(b","), strict=True))
    texts = sum(int(fields[f]) for f in ("lo", "lc", "lw"))
    return Stored(value[:-1 - digits - size], fields, rest[:texts], rest[texts:])


def plant(client: redis.Redis, key: str, texts: bytes | None = None, **damage: str) -> None:
    """Rewrite the run at ``key`` with the header fields given replaced, and its texts
    when given (the trailer kept right: the damage is the fields')."""
    stored = read_run(client, key)
    fields = {**stored.fields, **{f: v.encode() for f, v in damage.items()}}
    assert set(fields) == set(FIELDS), damage
    client.set(key, replace(stored, fields=fields,
                            texts=stored.texts if texts is None else texts).value())


def dump(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace with its DUMP: equal dumps, nothing changed."""
    return {key: client.dump(key) for key in client.scan_iter(match=f"{{{namespace}}}:*")}


def ready_store(client: redis.Redis) -> RedisRunStore:
    return RedisRunStore(client, namespace=unique_namespace(), discover=lambda r: At(0))


def evalsha(client: redis.Redis, script: scripts.Script, keys: tuple[str, ...],
            *args: Any) -> Any:
    client.script_load(script.source)
    return client.evalsha(script.sha, len(keys), *keys, *args)


def test_the_planting_helpers_read_back_what_the_store_wrote(client: redis.Redis) -> None:
    """The helpers take a run apart as codec.lua does: planted unchanged, every operation
    still reads it."""
    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: Changed("dep", 3))
    keys = Keyspace(store.namespace)
    store.insert("run", b"a,record:with 12 separators", Claim("me", LONG))
    stored = read_run(client, keys.run("run"))
    assert stored.record == b"a,record:with 12 separators"
    assert stored.fields["rev"] == b"1" and stored.fields["tok"] == b"1"
    assert (stored.fields["wk"], stored.fields["wn"]) == (b"c", b"3")
    assert stored.texts == b"medep" and stored.pad == b""
    plant(client, keys.run("run"))
    assert client.get(keys.run("run")) == stored.value()
    assert store.get("run").revision == 1


#: A damaged At wait's due (wn), and the field CORRUPT names: "header" where the header's
#: pattern does not take the value at all, "wn" where it takes the digits but the field does
#: not (an At wait needs its due; no leading zero; at most 16 digits, at most 2**53 - 1).
DAMAGED_DUE = [("nan", "header"), ("inf", "header"), ("-inf", "header"), ("1.5", "header"),
               ("0x10", "header"), (" 5 ", "header"), ("1e3", "header"), ("-1", "header"),
               ("", "wn"), ("05", "wn"), ("00", "wn"), (str(2**53), "wn"),
               (str(2**63), "wn"), ("1" * 17, "wn")]


@pytest.mark.parametrize(("bad", "field"), DAMAGED_DUE)
def test_a_damaged_wait_never_hangs_a_claim_and_is_quarantined(client: redis.Redis,
                                                                bad: str, field: str) -> None:
    store = ready_store(client)
    keys = Keyspace(store.namespace)
    for i in range(5):
        store.insert(f"r{i}", b"x", Release())
    plant(client, keys.run("r2"), wn=bad)
    before = client.get(keys.run("r2"))
    claimed = store.claim_ready("me", LONG, 10)
    assert sorted(claimed) == ["r0", "r1", "r3", "r4"]
    assert store.quarantined() == [Quarantined("ready", "r2", field)]
    assert client.zscore(keys.ready, "r2") is None  # out of the index, the run untouched
    assert client.get(keys.run("r2")) == before
    with pytest.raises(Corrupt) as caught:
        store.get("r2")
    assert caught.value.field == field
    assert store.claim("me", LONG, 10) == []  # never met again


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
                keys.prefix, "me", 1000, 1_000_000, 1, 0)


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


@pytest.mark.parametrize(("kind", "reason"), [("hash", "type"), ("list", "type"),
                                            ("zset", "type"), ("string", "header")])
def test_a_run_of_the_wrong_type_never_blocks_claim_expired(client: redis.Redis, kind: str,
                                                            reason: str) -> None:
    """A run's key replaced by another type (WRONGTYPE: "type"), or by a string that is no
    run (no trailer: "header"), is quarantined; the claim takes the others."""
    store = RedisRunStore(client, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    for i in range(20):
        store.insert(f"r{i:02}", b"x", Claim("dead", 1))
    client.delete(keys.run("r00"))
    {"hash": lambda k: client.hset(k, "rev", "1"), "list": lambda k: client.rpush(k, "1"),
     "zset": lambda k: client.zadd(k, {"1": 1}),
     "string": lambda k: client.set(k, "not a run")}[kind](keys.run("r00"))
    time.sleep(0.01)
    claimed = store.claim_expired("me", LONG, 100)
    assert sorted(claimed) == [f"r{i:02}" for i in range(1, 20)]
    assert store.quarantined() == [Quarantined("leases", "r00", reason)]
    assert store.claim_expired("me", LONG, 100) == []
    assert client.type(keys.run("r00")).decode() == kind  # left as it was found


def test_claim_expired_trusts_the_run_not_the_index_score(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    keys = Keyspace(store.namespace)
    store.insert("live", b"x", Claim("owner", LONG))
    client.zadd(keys.leases, {"live": 0})  # a stale score: the lease is live
    assert store.claim_expired("me", LONG, 10) == []
    assert store.get("live").holder.owner == "owner"  # type: ignore[union-attr]


#: A malformed value in each field of a held run's header (its lease "me", token 1, an At(0)
#: wait), and the field CORRUPT names: "header" where the header's pattern does not take
#: it (a text length that overruns the header counts so too), else the field that fails its
#: check (some name the field the value contradicts: a claim's dependency revision without
#: its claim time is a bad "cat").
CORRUPT_FIELDS = [
    ("rev", "nan", "header"), ("rev", "", "header"), ("rev", "1e3", "header"),
    ("rev", "0", "rev"), ("rev", "01", "rev"), ("rev", str(2**53), "rev"),
    ("exp", "inf", "header"), ("exp", "-1", "header"), ("exp", "", "exp"),
    ("exp", "007", "exp"), ("exp", str(2**63), "exp"),
    ("tok", "0x10", "header"), ("tok", "01", "tok"), ("tok", str(2**53), "tok"),
    ("cdr", "5", "cat"), ("cdr", "x", "header"),
    ("cat", "01", "cat"), ("cat", "1.5", "header"), ("cat", str(2**53), "cat"),
    ("wk", "x", "header"), ("wk", "ac", "header"), ("wk", "c", "wa"), ("wk", "", "wk"),
    ("wn", " 5 ", "header"), ("wn", "", "wn"), ("wn", "007", "wn"),
    ("wdl", "1.5", "header"), ("wdl", "00", "wdl"), ("wdl", "1" * 17, "wdl"),
    ("wrev", "nan", "header"), ("wrev", "", "wrev"), ("wrev", "01", "wrev"),
    ("wpv", "1.5", "header"), ("wpv", "", "wpv"), ("wpv", "01", "wpv"),
    ("pt", "5", "pt"), ("pt", "1e3", "header"),
    ("tk", "01", "tk"), ("tk", str(2**31 + 1), "tk"), ("tk", "-1", "header"),
    ("at", "01", "at"), ("at", "1e3", "header"), ("at", str(2**63), "at"),
    ("nb", "01", "nb"), ("nb", str(2**63), "nb"), ("nb", "inf", "header"),
    ("px", "x", "header"), ("px", "pf", "header"),
    ("sid", "0", "sid"), ("sid", "01", "sid"), ("sid", "nan", "header"),
    ("lo", "3", "header"), ("lo", "99", "header"), ("lo", "02", "header"),
    ("lo", "", "header"), ("lo", "0", "header"),  # "me" is then junk after the texts
    ("lc", "5", "header"), ("lc", "x", "header"), ("lw", "1", "header"),
    ("lw", str(2**63), "header"),
    # Consistent lengths, contradicting fields: a lease expiry without its owner, an At
    # wait with a dependency (a Changed one without: ("wk", "c") above).
    ("lo", ("0", b""), "exp"), ("lw", ("3", b"medep"), "wa"),
]


@pytest.mark.parametrize(("field", "bad", "named"), CORRUPT_FIELDS)
def test_every_operation_on_a_corrupt_run_raises_and_changes_nothing(
        client: redis.Redis, field: str, bad: str | tuple[str, bytes], named: str) -> None:
    store = ready_store(client)
    keys = Keyspace(store.namespace)
    store.insert("bad", b"x", Claim("me", LONG))
    store.insert("good", b"y", Claim("me", LONG))
    if isinstance(bad, tuple):  # the field and the texts, which its length measures
        plant(client, keys.run("bad"), texts=bad[1], **{field: bad[0]})
    else:
        plant(client, keys.run("bad"), **{field: bad})
    before = dump(client, store.namespace)
    fence = Fenced("me", 1)
    for call in (lambda: store.get("bad"),
                 lambda: store.get_many(["good", "bad"]),
                 lambda: store.compare_and_set("bad", 1, b"z", Hold("me")),
                 lambda: store.compare_and_set("bad", 1, b"z", Release()),
                 lambda: store.delete("bad", 1, Release()),
                 lambda: store.finish("bad", 1, fence, record=b"z"),
                 lambda: store.finish("bad", 1, fence),
                 lambda: store.finish("bad", 1, fence, failure=Failure("boom")),
                 lambda: store.restore("bad"),
                 lambda: store.refresh("bad")):
        with pytest.raises(Corrupt) as caught:
            call()
        assert (caught.value.run, caught.value.field) == ("bad", named)
        assert dump(client, store.namespace) == before
    with pytest.raises(AlreadyExists):  # a key there, even a damaged one, is never overwritten
        store.insert("bad", b"z", Release())
    assert dump(client, store.namespace) == before
    # A corrupt run among many is not renewed or released; the others are.
    assert store.renew("me", ["good", "bad"], LONG) == ["good"]
    assert store.release("me", ["good", "bad"]) == ["good"]
    assert client.dump(keys.run("bad")) == before[keys.run("bad").encode()]
    # Due in both indexes, it is quarantined from each by one claim, which takes the rest.
    client.zadd(keys.ready, {"bad": 0})
    client.zadd(keys.leases, {"bad": 0})
    assert store.claim("other", LONG, 10) == ["good"]
    assert store.quarantined() == [Quarantined("leases", "bad", named),
                                   Quarantined("ready", "bad", named)]
    assert client.dump(keys.run("bad")) == before[keys.run("bad").encode()]


@pytest.mark.parametrize("damage", ["count", "size", "zero", "leading zero", "short",
                                    "long", "no trailer", "empty"])
def test_a_damaged_trailer_is_a_corrupt_header(client: redis.Redis, damage: str) -> None:
    """The trailer says where the header starts: one that is not a size in range (its digit
    count, the size, or a size that cuts into the record or past the value's start) makes
    the header unreadable, CORRUPT "header", and a claim quarantines the run."""
    store = ready_store(client)
    keys = Keyspace(store.namespace)
    store.insert("bad", b"record", Release())
    store.insert("good", b"record", Release())
    value = client.get(keys.run("bad"))
    assert value is not None
    digits = value[-1] - ord("0")
    body, size = value[:-1 - digits], value[-1 - digits:-1]
    client.set(keys.run("bad"), {
        "count": body + size + b"7",  # 7 digits: more than a header region has
        "size": body + b"9999" + b"4",  # longer than the value
        "zero": body + b"0" + b"1",
        "leading zero": body + b"0" + size + str(digits + 1).encode(),
        "short": body + str(int(size) - 3).encode() + str(digits).encode(),
        "long": body + str(int(size) + 3).encode() + str(digits).encode(),
        "no trailer": body,
        "empty": b"",
    }[damage])
    with pytest.raises(Corrupt) as caught:
        store.get("bad")
    assert caught.value.field == "header"
    assert store.claim_ready("me", LONG, 10) == ["good"]
    assert store.quarantined() == [Quarantined("ready", "bad", "header")]


def test_damaged_index_entries_are_quarantined_and_the_others_claimed(
        client: redis.Redis) -> None:
    """Entries of both indexes that name a missing run, a run of another type or a corrupt
    one (each reason its own) are quarantined by one claim of both kinds, which takes the
    runs they do not damage; an entry whose score lies (a live lease scored 0) is only
    re-scored."""
    store = ready_store(client)
    keys = Keyspace(store.namespace)
    store.insert("ready", b"x", Release())
    store.insert("expired", b"x", Claim("dead", 1))
    store.insert("live", b"x", Claim("owner", LONG))
    store.insert("bad-ready", b"x", Release())
    store.insert("bad-lease", b"x", Claim("dead", 1))
    plant(client, keys.run("bad-ready"), wpv="1.5")
    plant(client, keys.run("bad-lease"), tok="01")
    client.zadd(keys.ready, {"ghost": 0})
    client.zadd(keys.leases, {"live": 0, "ghost": 0})
    client.hset(keys.run("typed"), "rev", "1")
    client.zadd(keys.leases, {"typed": 0})
    time.sleep(0.01)
    assert sorted(store.claim("me", LONG, 10)) == ["expired", "ready"]
    assert store.quarantined() == [
        Quarantined("leases", "bad-lease", "tok"), Quarantined("leases", "ghost", "missing"),
        Quarantined("leases", "typed", "type"), Quarantined("ready", "bad-ready", "header"),
        Quarantined("ready", "ghost", "missing")]
    assert (client.zscore(keys.leases, "live") or 0) > 0  # re-scored by its own expiry
    assert store.claim("me", LONG, 10) == []


def by_record(record: bytes) -> At | Changed | None:
    """A wait by the record: b"at" ready now, b"dep" waiting on "dep", else none."""
    return {b"at": At(0), b"dep": Changed("dep")}.get(record)


#: An index key of the namespace replaced by a string, the call that writes it, and the
#: field CORRUPT names.
DAMAGED_INDEXES = [
    ("leases", lambda s: s.insert("r", b"x", Claim("me", LONG)), "index:leases"),
    ("ready", lambda s: s.insert("r", b"at", Release()), "index:ready"),
    ("d:dep", lambda s: s.insert("r", b"dep", Release()), "index:d"),
    ("leases", lambda s: s.compare_and_set("free", 1, b"x", Claim("me", LONG)),
     "index:leases"),
    ("ready", lambda s: s.finish("held", 1, Fenced("me", 1), record=b"at"), "index:ready"),
    ("ready", lambda s: s.release("me", ["held"]) and None, "index:ready"),
    ("fanout", lambda s: s.claim_ready("me", LONG, 10), "index:fanout"),
    ("quarantine", lambda s: s.claim("me", LONG, 10), "quarantine"),
]


@pytest.mark.parametrize(("key", "call", "field"), DAMAGED_INDEXES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(DAMAGED_INDEXES)])
def test_a_damaged_index_key_refuses_writes_before_writing(
        client: redis.Redis, key: str, call: Any, field: str) -> None:
    """A write, release or claim whose writes name an index key of another type answers
    CORRUPT naming it before its first write: the whole namespace is as it was (no run left
    half-written, no other index written); once the key is repaired the call goes on."""
    store = RedisRunStore(client, namespace=unique_namespace(), discover=by_record)
    keys = Keyspace(store.namespace)
    store.insert("free", b"x", Release())
    store.insert("held", b"at", Claim("me", LONG))  # released: ready
    store.insert("waiting", b"at", Release())
    client.zadd(keys.ready, {"ghost": 0})  # a claim quarantines it
    name = keys.prefix + key
    client.delete(name)
    client.set(name, "not an index")
    before = dump(client, store.namespace)
    with pytest.raises(Corrupt) as caught:
        call(store)
    assert caught.value.field == field
    assert dump(client, store.namespace) == before
    client.delete(name)
    call(store)


def test_a_namespace_of_a_newer_layout_is_refused(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    client.hset(Keyspace(store.namespace).meta, "layout", "99")
    with pytest.raises(Misconfigured, match="newer"):
        store.insert("r", b"x", Release())
    with pytest.raises(Misconfigured):
        store.get("r")


@pytest.mark.parametrize(("field", "value", "named"), [
    ("layout", "nan", "meta.layout"), ("layout", "1" * 17, "meta.layout"),
    ("layout", "05", "meta.layout"), ("partitions", "x", "meta.partitions"),
    ("partitions", "1" * 17, "meta.partitions"), ("partitions", "1", "meta.partitions")])
def test_a_damaged_meta_field_is_corrupt_and_nothing_is_written(
        client: redis.Redis, field: str, value: str, named: str) -> None:
    """The namespace's meta key is read field by field, each sized first: a damaged one is
    CORRUPT naming it (a namespace that records layout 5 asks only its mark, v5), and a
    meta key of another type is CORRUPT "meta"."""
    store = RedisRunStore(client, namespace=unique_namespace())
    meta = Keyspace(store.namespace).meta
    client.hset(meta, field, value)
    before = dump(client, store.namespace)
    for call in (lambda: store.insert("r", b"x", Release()), lambda: store.get("r"),
                 lambda: store.claim("me", LONG, 10)):
        with pytest.raises(Corrupt) as caught:
            call()
        assert caught.value.field == named
    assert dump(client, store.namespace) == before
    client.delete(meta)
    client.set(meta, "not a hash")
    with pytest.raises(Corrupt) as caught:
        store.insert("r", b"x", Release())
    assert caught.value.field == "meta"
    assert client.get(meta) == b"not a hash" and client.exists(Keyspace(store.namespace)
                                                               .run("r")) == 0


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
    """EVALSHA of the scripts with a damaged number, in each number they take (a finish's
    expected revision, token, delay, max attempts, and a fused script's claim among them):
    BADARG, nothing written, the first operation of a fused script neither."""
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("run", b"r1", Claim("me", 1))
    keys = Keyspace(store.namespace)
    before = dump(client, store.namespace)
    run_keys = (keys.run("run"), keys.leases, keys.ready, keys.meta)

    def finish(*changes: tuple[int, Any]) -> tuple[Any, ...]:
        argv: list[Any] = ["run", 1, "me", 1, "x", b"", "boom", 0, "", "", "", "", "", "", 1]
        for at, value in changes:
            argv[at - 2] = value  # ARGV[at]
        return tuple(argv)

    calls = [
        (scripts.RUN_RELEASE, (keys.leases, keys.ready, keys.meta), ("me", bad, "run")),
        (scripts.RUN_DELETE, run_keys, ("run", bad, "r", "", 0, 1)),
        (scripts.RUN_DELETE, run_keys, ("run", 1, "r", "", 0, bad)),
        (scripts.RUN_DELETE, run_keys, ("run", 1, "f", "me", bad, 1)),
        (scripts.RUN_CLAIM_EXPIRED, (keys.leases, keys.meta), ("other", LONG, 10, 0, 0, bad)),
        (scripts.RUN_FINISH, run_keys, finish((3, bad))),
        (scripts.RUN_FINISH, run_keys, finish((5, bad))),
        (scripts.RUN_FINISH, run_keys, finish((9, bad))),
        (scripts.RUN_FINISH, run_keys, finish((10, bad))),
        (scripts.RUN_FINISH, run_keys, finish((16, bad))),
        (scripts.RUN_RESTORE, run_keys, ("run", bad)),
        (scripts.RUN_RELEASE_CLAIM, (keys.leases, keys.ready, keys.meta, keys.fanout),
         (3, "me", 1, "run", "any", "me", bad, 10, 1, 0)),
        (scripts.RUN_FINISH_CLAIM, (*run_keys, keys.fanout),
         (15, *finish(), "leases", "me", LONG, 10, 1, 0, bad)),
    ]
    for script, script_keys, args in calls:
        if bad == "" and (script is scripts.RUN_CLAIM_EXPIRED or args == finish((10, bad))
                          or script is scripts.RUN_FINISH_CLAIM):
            continue  # '' is "no bound" (max takeovers, max attempts)
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, script, script_keys, keys.prefix, *args)
        assert dump(client, store.namespace) == before


@pytest.mark.parametrize("field", ["deleted-rev", "deleted-tok"])
def test_a_damaged_deleted_revision_refuses_insert_and_delete(client: redis.Redis,
                                                              field: str) -> None:
    """meta's deleted-rev and deleted-tok (the highest revision and grant token a deleted
    run had: an insert starts above both) are read by insert and delete, each sized first:
    damaged, both answer CORRUPT naming it, nothing written."""
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("run", b"r1", Release())
    keys = Keyspace(store.namespace)
    for damage in ("nan", "1.5", "-1", "07", str(2**53), "1" * 17, ""):
        client.hset(keys.meta, field, damage)
        before = dump(client, store.namespace)
        with pytest.raises(Corrupt) as caught:
            store.insert("new", b"n1", Claim("me", LONG))
        assert caught.value.field == f"meta.{field}"
        with pytest.raises(Corrupt) as caught:
            store.delete("run", 1, Release())
        assert caught.value.field == f"meta.{field}"
        assert dump(client, store.namespace) == before
    client.hset(keys.meta, field, "41")  # repaired by hand: inserts go on above it
    store.insert("new", b"n1", Claim("me", LONG))
    current = store.get("new")
    assert (current.revision, current.token) == ((42, 1) if field == "deleted-rev" else (1, 42))


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
            (scripts.RUN_CLAIM_EXPIRED, (keys.leases, keys.meta), CLAIM)):
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


# ------------------------------------------------------------------ every run script's ARGV
# Each run script as its header documents it: its KEYS, a valid ARGV after the prefix
# (ARGV[2..]), how many ARGV it needs at least (the prefix counted: the rest are optional),
# and which of them are text (ids, owners, dependencies: at most MAX_TEXT bytes). A raw
# EVALSHA missing a needed ARGV, or with a text argument over MAX_TEXT bytes, is refused
# with BADARG before anything is written, whatever the script does inside.

#: A claim's ARGV[2..]: owner, ttl, limit, projection version, budget, max takeovers, strict.
CLAIM = ("me", LONG, 10, 1, 0, "", "")

#: name: (keys of the namespace's Keyspace, or of partition 0's with "p:"), ARGV[2..],
#: ARGV needed (with ARGV[1]), the ARGV positions of text.
ARGVS: dict[str, tuple[tuple[str, ...], tuple[Any, ...], int, tuple[int, ...]]] = {
    "run_get": (("run", "meta"), ("run",), 2, (2,)),
    "run_get_many": (("meta",), (2 << 20, "run"), 2, (3,)),
    "run_insert": (("run:new", "leases", "ready", "meta"),
                   ("new", b"x", "c", "me", LONG, "c", "dep", "", "", 1), 11, (2, 5, 8)),
    "run_compare_and_set": (("run", "leases", "ready", "meta"),
                            ("run", 1, b"x", "c", "me", LONG, "c", "dep", "", "", 1), 12,
                            (2, 6, 9)),
    "run_delete": (("run", "leases", "ready", "meta"), ("run", 1, "c", "me", LONG, 1), 7,
                   (2, 5)),
    "run_renew": (("leases", "meta"), ("me", LONG, "run"), 3, (2, 4)),
    "run_release": (("leases", "ready", "meta"), ("me", 1, "run"), 3, (2, 4)),
    # The claims share one ARGV (run_claim's header): owner, ttl, limit, projection version,
    # record budget, then the optional max takeovers and strict flag.
    "run_claim_expired": (("leases", "meta"), CLAIM, 6, (2,)),
    "run_claim_ready": (("ready", "leases", "meta", "fanout"), CLAIM, 6, (2,)),
    "run_claim": (("ready", "leases", "meta", "fanout"), CLAIM, 6, (2,)),
    # A failure (x) reads every argument finish takes: the error text (at most MAX_ERROR
    # bytes, below MAX_TEXT), its delay, max attempts, final, and the wait of a record.
    "run_finish": (("run", "leases", "ready", "meta"),
                   ("run", 1, "me", 1, "x", b"", "boom", 0, "", "", "c", "dep", "", "", 1), 16,
                   (2, 4, 8, 13)),
    "run_restore": (("run", "leases", "ready", "meta"), ("run", 1), 3, (2,)),
    "run_refresh": (("run", "ready", "meta"), ("run", 1, "c", "dep", "", "", 1), 8, (2, 5)),
    "run_migrate": (("meta",), (10,), 2, ()),
    "run_quarantined": (("quarantine",), ("0",), 2, ()),
    "run_rates": (("rates",), (60,), 2, ()),
    "run_partitions": (("meta", "leases"), (2,), 2, ()),
    "run_heads": (("p:ready", "p:leases", "p:meta", "p:fanout"), ("ready", 10), 3, ()),
    "run_watch": (("p:meta",), ("dep", 1), 3, (2,)),
    "run_notify": (("p:meta", "p:fanout"), ("dep", 2, 1), 4, (2,)),
    "run_unwatch": (("p:meta",), ("dep", 1, 1), 4, (2,)),
    # Its entries are not ids: a claim sends back every entry a queue holds, a foreign one
    # of any length too, to remove it (never a wall); they are only compared.
    "run_delivered": (("p:outbox",), ("outbox", "1|dep", 2), 2, ()),
    "run_session_open": (("sessions", "session_leases", "session_seq", "meta"), ("me", LONG),
                         3, (2,)),
    "run_session_keepalive": (("sessions", "session_leases", "meta"), ("1", "me"), 3, (3,)),
    "run_session_close": (("sessions", "session_leases", "leases", "ready", "meta"),
                          ("1", "me", 10, 1), 5, (3,)),
    "run_sessions": (("session_leases", "sessions"), (0, 10), 3, ()),
}


def fused(first: str, keys: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[Any, ...], int,
                                                       tuple[int, ...]]:
    """The entry of a script that runs ``first`` and then a claim (ops.lua's two_ops):
    ARGV[2] how many arguments the first takes, those (``first``'s ARGV[2..]), the claim's
    kind, then the claim's (run_claim's ARGV[2..]); every one the claim needs is needed."""
    _, argv, _, texts = ARGVS[first]
    n = len(argv)
    return keys, (n, *argv, "any", *CLAIM), n + 8, (*(at + 1 for at in texts), n + 4)


ARGVS["run_finish_claim"] = fused("run_finish", ("run", "leases", "ready", "meta", "fanout"))
ARGVS["run_cas_claim"] = fused("run_compare_and_set",
                               ("run", "leases", "ready", "meta", "fanout"))
ARGVS["run_release_claim"] = fused("run_release", ("leases", "ready", "meta", "fanout"))


def everything(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace and of its partitions, with its DUMP."""
    return {key: client.dump(key) for key in client.scan_iter(match=f"{{{namespace}*")}


def script_keys(namespace: str, names: tuple[str, ...]) -> tuple[str, ...]:
    own, part = Keyspace(namespace), Keyspace(namespace, 0)
    found = []
    for name in names:
        keys = part if name.startswith("p:") else own
        name = name.removeprefix("p:")
        if name.startswith("run"):
            found.append(keys.run(name.partition(":")[2] or "run"))
        else:
            found.append(getattr(keys, name))
    return tuple(found)


def test_the_argv_table_names_every_run_script_but_run_now() -> None:
    assert set(ARGVS) == set(scripts.RUN_NAMES) - {"run_now"}


@pytest.mark.parametrize("name", sorted(ARGVS))
def test_a_raw_call_missing_argv_or_with_text_over_the_cap_is_refused(
        client: redis.Redis, name: str) -> None:
    script = getattr(scripts, name.upper())
    names, argv, needed, texts = ARGVS[name]
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("run", b"r1", Claim("me", LONG))  # what a call that slipped through writes
    namespace = store.namespace
    keys = script_keys(namespace, names)
    prefix = (Keyspace(namespace, 0) if names[0].startswith("p:")
              else Keyspace(namespace)).prefix
    full = (prefix, *argv)
    cases = [(f"ARGV[{n + 1}..] missing", full[:n]) for n in range(1, needed)]
    for at in texts:
        for size in (scripts.Cap.MAX_TEXT + 1, 1 << 20):
            cases.append((f"ARGV[{at}] of {size} bytes",
                          (*full[:at - 1], "x" * size, *full[at:])))
    before = everything(client, namespace)
    not_refused = []
    for case, args in cases:
        try:
            evalsha(client, script, keys, *args)
        except redis.ResponseError as exc:
            if "BADARG" not in str(exc):
                not_refused.append(f"{case}: {str(exc)[:200]}")
        else:
            not_refused.append(f"{case}: answered")
        assert everything(client, namespace) == before, f"{name}, {case}: it wrote"
    assert not_refused == [], name
    store.close()
