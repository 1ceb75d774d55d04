"""The change feed on the Redis stores, beyond the conformance rules (which every store kind
runs): what the stream holds, the cost rule of one entry per call, a pipeline's events in
order, a damaged stream key refused, a feed off costing nothing. On fakeredis, and on a
real Redis 7 (``server`` tier)."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from servers import unique_namespace

from redisstore import (
    At,
    Claim,
    Corrupt,
    Feed,
    Fenced,
    Free,
    Hold,
    LeaseRefused,
    Misconfigured,
    RedisRunStore,
    Release,
)
from redisstore.feed import Event


def ready(record: bytes) -> At | None:
    return At(0) if record.startswith(b"ready") else None


@pytest.fixture(params=["fakeredis", pytest.param("redis7", marks=pytest.mark.server)])
def client(request: pytest.FixtureRequest) -> Any:
    if request.param == "fakeredis":
        return fakeredis.FakeRedis()
    return request.getfixturevalue("redis7").client()


def store_of(client: Any, **options: Any) -> RedisRunStore:
    store = RedisRunStore(client, namespace=unique_namespace(), discover=ready,
                          feed=Feed(), **options)
    store.migrate()
    return store


def kinds(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.run, e.kind) for e in events]


def test_a_claim_of_100_runs_is_one_entry(client: Any) -> None:
    store = store_of(client)
    for n in range(100):
        store.insert(f"r{n:03}", b"ready", Release())
    before = client.xlen(f"{{{store.namespace}}}:feed")
    assert len(store.claim("me", 60_000, 100)) == 100
    assert client.xlen(f"{{{store.namespace}}}:feed") == before + 1
    (_entry_id, fields), = client.xrevrange(f"{{{store.namespace}}}:feed", count=1)
    assert fields[b"o"] == b"me" and fields[b"e"].count(b":r") == 100


def test_a_pipelines_events_are_in_its_order(client: Any) -> None:
    store = store_of(client)
    store.insert("a", b"x", Claim("me", 60_000))
    # Every script loaded first: a call answered NOSCRIPT is sent again after the others
    # of its round trip (which the feed then shows as the server applied them).
    with store.pipeline() as p:
        p.compare_and_set("a", 1, b"x1", Hold("me"))
        p.release("me", ["absent"])
        p.claim("you", 60_000, 0)
        p.insert("warm", b"x", Release())
    cursor = store.changes().cursor
    with store.pipeline() as p:
        p.compare_and_set("a", 2, b"x2", Hold("me"))
        p.insert("b", b"ready", Release())
        p.compare_and_set("a", 7, b"x3", Hold("me"))  # refused: no event
        p.release("me", ["a"])
        p.claim("you", 60_000, 1)
    assert kinds(store.changes(after=cursor).events) == [
        ("a", "written"), ("b", "inserted"), ("a", "released"), ("b", "claimed")]


def test_a_finish_and_the_next_claim_in_one_script_are_an_entry_each(client: Any) -> None:
    """One entry per call: the pipeline's finish and claim, sent as one script, are two."""
    store = store_of(client)
    store.insert("a", b"done", Claim("me", 60_000))
    store.insert("b", b"ready", Release())
    current = store.get("a")
    assert current.token is not None
    key = f"{{{store.namespace}}}:feed"
    before = client.xlen(key)
    with store.pipeline() as p:
        p.finish("a", 1, Fenced("me", current.token), record=b"done2")
        claim = p.claim("me", 60_000, 1)
    assert claim.result() == ["b"]
    assert client.xlen(key) == before + 2
    assert kinds(store.changes().events)[-2:] == [("a", "written"), ("b", "claimed")]


def test_a_namespace_with_a_feed_leaves_its_writes_to_the_general_code(client: Any) -> None:
    """The fast paths read only meta's v5, which a namespace with a feed does not record:
    they cost a namespace without one nothing, and never write past a feed."""
    store = store_of(client)
    store.insert("a", b"x", Release())
    meta = f"{{{store.namespace}}}:meta"
    assert client.hget(meta, "v5") is None and client.hget(meta, "layout") == b"5"
    plain = RedisRunStore(client, namespace=unique_namespace(), discover=ready)
    plain.insert("a", b"x", Release())
    assert client.hget(f"{{{plain.namespace}}}:meta", "v5") == b"1"


def test_a_damaged_stream_key_refuses_every_write_and_every_read(client: Any) -> None:
    store = store_of(client)
    store.insert("a", b"x", Claim("me", 60_000))
    store.insert("r", b"ready", Release())
    key = f"{{{store.namespace}}}:feed"
    client.delete(key)
    client.set(key, "not a stream")
    for write in (lambda: store.insert("b", b"x", Release()),
                  lambda: store.compare_and_set("a", 1, b"y", Hold("me")),
                  lambda: store.release("me", ["a"]),
                  lambda: store.claim("me", 60_000, 1)):
        with pytest.raises(Corrupt) as refused:
            write()
        assert refused.value.field == "feed"
    assert store.get("a").revision == 1 and store.get("r").holder == Free()
    with pytest.raises(Corrupt):
        store.changes()


def test_a_refused_write_leaves_no_entry(client: Any) -> None:
    store = store_of(client)
    store.insert("a", b"x", Claim("other", 60_000))
    key = f"{{{store.namespace}}}:feed"
    before = client.xlen(key)
    with pytest.raises(LeaseRefused):
        store.compare_and_set("a", 1, b"y", Hold("me"))
    assert store.renew("other", ["a"], 60_000) == ["a"]
    assert client.xlen(key) == before


def test_a_store_without_a_feed_writes_none_and_says_so(client: Any) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(), discover=ready)
    store.insert("a", b"ready", Release())
    store.claim("me", 60_000, 1)
    assert client.exists(f"{{{store.namespace}}}:feed") == 0
    with pytest.raises(Misconfigured):
        store.changes()


def test_a_feed_dropped_under_its_readers_is_compacted(client: Any) -> None:
    """The stream deleted (set aside as damaged, or by hand): meta's count stays, so a
    reader behind its end is told, and one that had read it all goes on."""
    from redisstore import Compacted

    store = store_of(client)
    store.insert("a", b"x", Release())
    behind = store.changes().cursor
    store.insert("b", b"x", Release())
    caught_up = store.changes(after=behind).cursor
    client.delete(f"{{{store.namespace}}}:feed")
    assert store.changes(after=caught_up).events == []
    with pytest.raises(Compacted):
        store.changes(after=behind)
    store.insert("c", b"x", Release())
    assert kinds(store.changes(after=caught_up).events) == [("c", "inserted")]


def test_an_entry_after_a_dropped_feed_comes_after_every_cursor_given(client: Any) -> None:
    """The stream deleted, the next entry's id is past every entry's the feed ever had, even
    in the same millisecond as the last (an id the server makes, time-sequence, starts again
    at the millisecond's 0 in a new stream: a caught-up reader then read nothing, or was
    told Compacted). Rounds of write, drop, write, read, a few milliseconds each: many meet
    the same millisecond."""
    store = store_of(client)
    store.insert("first", b"x", Release())
    caught_up = store.changes().cursor
    for i in range(40):
        client.delete(f"{{{store.namespace}}}:feed")
        store.insert(f"after-{i}", b"x", Release())
        got = store.changes(after=caught_up)
        assert kinds(got.events) == [(f"after-{i}", "inserted")], i
        caught_up = got.cursor


# ---------------------------------------------------------------------------- per-minute counts


def rates_key(store: RedisRunStore) -> str:
    return f"{{{store.namespace}}}:rates"


def totals(store: RedisRunStore) -> tuple[int, int, int]:
    rates = store.rates(60)
    return (sum(r.claims for r in rates), sum(r.finishes for r in rates),
            sum(r.takeovers for r in rates))


def test_the_finish_and_the_claim_of_one_script_count_both(client: Any) -> None:
    store = store_of(client)
    store.insert("a", b"done", Claim("me", 60_000))
    store.insert("b", b"ready", Release())
    current = store.get("a")
    assert current.token is not None
    with store.pipeline() as p:
        p.finish("a", 1, Fenced("me", current.token), record=b"done2")
        claim = p.claim("me", 60_000, 1)
    assert claim.result() == ["b"]
    assert totals(store) == (1, 1, 0)


def test_a_namespace_without_a_feed_keeps_no_counts(client: Any) -> None:
    store = RedisRunStore(client, namespace=unique_namespace(), discover=ready)
    store.insert("a", b"ready", Claim("other", 1))
    store.insert("b", b"ready", Release())
    while store.get("a").holder.live:  # type: ignore[union-attr]
        pass
    assert len(store.claim("me", 60_000, 2)) == 2
    assert client.exists(rates_key(store)) == 0
    with pytest.raises(Misconfigured):
        store.rates()


def test_a_slot_of_an_older_minute_starts_again(client: Any) -> None:
    """A minute's slot is reused 61 minutes later: a count of the older minute there is
    replaced, never added to, and the key keeps at most 3 fields a slot."""
    store = store_of(client)
    minute = store.now() // 60_000
    for m in range(minute - 70, minute + 2):  # every slot, of the minute 61 before
        client.hset(rates_key(store), f"c{m % 61}", (m - 61) * 2**24 + 5)
    store.insert("a", b"ready", Release())
    assert store.claim("me", 60_000, 1) == ["a"]
    # Counted afresh in its minute (added to the old count, it would read as that older
    # minute's, and so 0); the old counts read as nothing.
    assert totals(store) == (1, 0, 0)
    assert client.hlen(rates_key(store)) <= 3 * 61


@pytest.mark.parametrize("damage", ["type", "value", "overflow"])
def test_a_damaged_counter_key_is_set_aside_never_an_error(client: Any, damage: str) -> None:
    store = store_of(client)
    store.insert("a", b"ready", Release())
    store.insert("b", b"ready", Release())
    key = rates_key(store)
    if damage == "type":
        client.set(key, "not a hash")
    else:  # every slot's claims: whatever minute the claim below falls in
        for slot in range(61):
            client.hset(key, f"c{slot}", "x" * 100_000 if damage == "value"  # big
                        else str(2**63 - 1))  # HINCRBY would overflow
    assert totals(store) == (0, 0, 0)  # read: sized first, a damaged field reads 0
    assert store.claim("me", 60_000, 1) == ["a"]  # the claim is made, and counted
    assert store.get("a").holder != Free()
    assert totals(store) == (1, 0, 0)
    aside = [k for k in client.scan_iter(match=f"{{{store.namespace}}}:damaged:rates:*")]
    assert len(aside) == 1
    assert [q.index + "|" + q.run for q in store.quarantined()] == ["damaged|rates"]
    assert store.claim("me", 60_000, 1) == ["b"]
    assert totals(store) == (2, 0, 0)


def test_a_hostile_call_cannot_inflate_the_counts(client: Any) -> None:
    """The counts are what the script did, never what its arguments say: a claim asking
    for 100 runs where one is ready counts one; a finish refused counts none; the read
    takes no count and refuses a span past an hour."""
    import redis as redis_py

    from redisstore.core import scripts

    store = store_of(client)
    store.insert("a", b"ready", Release())
    k = store._ops.keys  # type: ignore[union-attr]
    for script in (scripts.RUN_CLAIM_READY, scripts.RUN_FINISH, scripts.RUN_RATES):
        client.script_load(script.source)
    got = client.evalsha(scripts.RUN_CLAIM_READY.sha, 4, k.ready, k.leases, k.meta, k.fanout,
                         k.prefix, "me", 60_000, 100, 1, 0, "", "")
    assert got[1] == [b"a"]
    assert totals(store) == (1, 0, 0)
    token = store.get("a").token
    assert token is not None
    for wrong in ((1, "me", token + 1), (1, "other", token), (2, "me", token)):
        rev, owner, tok = wrong
        reply = client.evalsha(scripts.RUN_FINISH.sha, 4, k.run("a"), k.leases, k.ready, k.meta,
                               k.prefix, "a", rev, owner, tok, "r", "", "-", 0, "", "", "",
                               "", "", "", 1)
        assert reply[0] != 0
    assert totals(store) == (1, 0, 0)
    for minutes in (0, 61, "1e3", "-1"):
        with pytest.raises(redis_py.ResponseError, match="BADARG"):
            client.evalsha(scripts.RUN_RATES.sha, 1, k.rates, k.prefix, minutes)
    with pytest.raises(redis_py.ResponseError, match="BADARG"):
        client.evalsha(scripts.RUN_RATES.sha, 1, k.rates, "{elsewhere}:", 5)
    assert totals(store) == (1, 0, 0)
