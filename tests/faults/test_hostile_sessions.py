"""Damage to the session keys (docs/design/sessions.md): each is planted by raw commands,
then every operation is called. Each answers on the sound part, or refuses with a contract
error (``Corrupt``, ``SessionLapsed``, ``LeaseRefused``...) having written nothing, or sets
the damaged key aside into the quarantine (``store.quarantined()`` lists it): never a raw
script error, never a damaged session read as live, never a write of a damaged key's value.

Then the raw scripts' session arguments: ARGV[9] of every claim script, the ``j`` lease kind
and the session scripts' ids, each bad, refused with BADARG, nothing written; a forged
owner refused with SESSION_LAPSED, nothing written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from servers import unique_namespace
from test_hostile import CLAIM, LONG, evalsha, plant, script_keys

from redisstore import (
    At,
    Claim,
    Corrupt,
    Fenced,
    LeaseRefused,
    NotFound,
    RedisRunStore,
    Release,
    SessionLapsed,
    StoreError,
)
from redisstore.core import scripts
from redisstore.core.keys import Keyspace
from redisstore.core.runops import fused

MAX_TEXT = scripts.Cap.MAX_TEXT

#: The errors a call on damaged session keys may raise: the contract's refusals.
REFUSALS = (Corrupt, SessionLapsed, LeaseRefused, NotFound)


def namespace_with_a_session(client: redis.Redis) -> tuple[RedisRunStore, Keyspace, Any]:
    """A store whose session 1 (owner "me") holds r0 (claimed) and r1 (InSession insert),
    beside a free run r2, a run r3 held by a per-run lease of another owner, and r5 by one
    of "me"."""
    # A finished run (b"done") waits for nothing: a Worker's finish, as the fused fast path
    # takes it.
    store = RedisRunStore(client, namespace=unique_namespace(),
                          discover=lambda r: None if r == b"done" else At(0))
    session = store.open_session("me", LONG)
    assert session.id == "1"
    store.insert("r0", b"x", Release())
    assert session.claim_ready(1) == ["r0"]
    store.insert("r1", b"x", session.lease)
    store.insert("r2", b"x", Release())
    store.insert("r3", b"x", Claim("other", LONG))
    store.insert("r5", b"x", Claim("me", LONG))
    return store, Keyspace(store.namespace), session


def contents(client: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace with its type and contents (a big value by its hash):
    equal, nothing written. Not DUMP: fakeredis may reorder a set a read sampled."""
    found: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{{{namespace}}}:*"):
        kind = client.type(key)
        value: Any
        if kind == b"string":
            value = hash(client.get(key))
        elif kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"list":
            value = hash(tuple(client.lrange(key, 0, -1)))
        elif kind == b"set":
            value = frozenset(client.smembers(key))
        else:
            value = client.zrange(key, 0, -1, withscores=True)
        found[key] = (kind, value)
    return found


def huge(n: int) -> str:
    return "a" * n


#: name: (how it damages the namespace, whether session 1 may still be live after it: only
#: when its record and the keys it is read by stay sound).
DAMAGES: dict[str, tuple[Callable[[redis.Redis, Keyspace], Any], bool]] = {
    "record not exp,ttl,cursor,owner": (
        lambda c, k: c.hset(k.sessions, "1", "garbage"), False),
    "record of 3 fields": (lambda c, k: c.hset(k.sessions, "1", "1,2,me"), False),
    "record huge": (
        lambda c, k: c.hset(k.sessions, "1", f"{2**50},{LONG},,{huge(MAX_TEXT + 100)}"),
        False),
    "record leading-zero expiry": (
        lambda c, k: c.hset(k.sessions, "1", f"0{2**45},{LONG},,me"), False),
    "record expiry 2**60": (lambda c, k: c.hset(k.sessions, "1", f"{2**60},{LONG},,me"),
                            False),
    "record ttl 0": (lambda c, k: c.hset(k.sessions, "1", f"{2**45},0,,me"), False),
    "record cursor not digits": (
        lambda c, k: c.hset(k.sessions, "1", f"{2**45},{LONG},x1,me"), False),
    "record missing": (lambda c, k: c.hdel(k.sessions, "1"), False),
    "sessions a string": (lambda c, k: (c.delete(k.sessions), c.set(k.sessions, "x")), False),
    "session-leases a set": (
        lambda c, k: (c.delete(k.session_leases), c.sadd(k.session_leases, "1")), True),
    "s:1 a string": (lambda c, k: (c.delete(k.session_runs("1")),
                                   c.set(k.session_runs("1"), "x")), True),
    "s:1 a hash": (lambda c, k: (c.delete(k.session_runs("1")),
                                 c.hset(k.session_runs("1"), "r0", "x")), True),
    "st:1 a set": (lambda c, k: c.sadd(k.session_told("1"), "r9"), True),
    "st:1 huge": (lambda c, k: c.rpush(k.session_told("1"), *[f"r{i}" for i in range(5000)]),
                  True),
    "st:1 of a 10 MB element": (
        lambda c, k: c.rpush(k.session_told("1"), huge(10 << 20)), True),
    "session-seq a hash": (
        lambda c, k: (c.delete(k.session_seq), c.hset(k.session_seq, "a", "1")), True),
    "session-seq abc": (lambda c, k: c.set(k.session_seq, "abc"), True),
    "session-seq 2**63": (lambda c, k: c.set(k.session_seq, str(2**63)), True),
    "session-leases entry of no session": (
        lambda c, k: c.zadd(k.session_leases, {"999": 5}), True),
    "session-leases entry not an id": (
        lambda c, k: c.zadd(k.session_leases, {"abc": 5, "01": 6, huge(300): 7}), True),
    "held run's sid of no session": (lambda c, k: plant(c, k.run("r3"), sid="77"), True),
    "held run's sid of session 1": (lambda c, k: plant(c, k.run("r3"), sid="1"), True),
    "free run with a sid": (lambda c, k: plant(c, k.run("r2"), sid="77", lo="2",
                                               texts=b"me"), True),
}


def operations(store: RedisRunStore, session: Any) -> dict[str, Callable[[], Any]]:
    """Every call that reads or writes a session key, on the damaged namespace."""
    def current(run: str) -> int:
        try:
            return store.get(run).revision
        except StoreError:
            return 1

    def finish_and_claim(run: str) -> Any:
        """The finish of ``run`` and the session's claim of the next, one script, as a
        Worker on the session sends them: two operations, each answered (the finish may
        land and the claim be refused); any other error of either is raised."""
        got = store.get(run)
        ops = store._ops
        first = ops.finish(run, got.revision, Fenced("me", got.token or 1), record=b"done")
        then = ops.session_claim("any", session.id, "me", LONG, 5, True, None)
        done, claimed = store._write(fused((first, next(first)), (then, next(then))))
        for part in (done, claimed):
            if part.error is not None and not isinstance(part.error, REFUSALS):
                raise part.error
        return done, claimed

    def finish_alone(run: str) -> Any:
        """The finish of ``run`` sent alone, as an AsyncWorker's loops send theirs."""
        got = store.get(run)
        return store.finish(run, got.revision, Fenced("me", got.token or 1), record=b"done")

    return {
        "open_session": lambda: store.open_session("me", LONG),
        "keepalive": session.keepalive,
        "session claim": lambda: session.claim(5),
        "session claim_ready": lambda: session.claim_ready(5),
        "session claim_expired": lambda: session.claim_expired(5),
        "store claim": lambda: store.claim("x", LONG, 5),
        "store claim_expired": lambda: store.claim_expired("x", LONG, 5),
        "close": session.close,
        "sessions": store.sessions,
        "get": lambda: [store.get(run) for run in ("r0", "r1", "r2")],
        "renew": lambda: store.renew("me", ["r0", "r1", "r2"], LONG),
        "release": lambda: store.release("me", ["r0", "r1", "r2"]),
        "insert InSession": lambda: store.insert("new", b"y", session.lease),
        "compare_and_set InSession": lambda: store.compare_and_set(
            "r2", current("r2"), b"y", session.lease),
        "compare_and_set of its run": lambda: store.compare_and_set(
            "r0", current("r0"), b"y", Claim("me", LONG)),
        "delete of its run": lambda: store.delete("r1", current("r1"), Claim("me", LONG)),
        "finish of its run and session claim": lambda: finish_and_claim("r0"),
        "finish of a lease and session claim": lambda: finish_and_claim("r5"),
        "finish of its run alone": lambda: finish_alone("r0"),
    }


#: The operations' names, as operations() gives them.
OPERATIONS = ["open_session", "keepalive", "session claim", "session claim_ready",
              "session claim_expired", "store claim", "store claim_expired", "close",
              "sessions", "get", "renew", "release", "insert InSession",
              "compare_and_set InSession", "compare_and_set of its run", "delete of its run",
              "finish of its run and session claim", "finish of a lease and session claim",
              "finish of its run alone"]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_session_keys_are_refused_or_quarantined_never_silent(
        client: redis.Redis, damage: str) -> None:
    plant_it, may_live = DAMAGES[damage]
    wrong: list[str] = []
    for name in OPERATIONS:
        store, keys, session = namespace_with_a_session(client)
        plant_it(client, keys)
        before = contents(client, store.namespace)
        quarantine_before = client.hgetall(keys.quarantine)
        call = operations(store, session)[name]
        try:
            call()
        except REFUSALS:
            if contents(client, store.namespace) != before:
                wrong.append(f"{name}: refused, but it wrote")
        except (StoreError, redis.RedisError) as exc:
            wrong.append(f"{name}: {type(exc).__name__}: {str(exc)[:160]}")
        else:
            pass  # answered: on the sound part, or having set the damage aside
        if client.hgetall(keys.quarantine) != quarantine_before:
            assert store.quarantined(), f"{damage}, {name}: a quarantine it does not list"
        # Never a damaged session read as live: its keepalive refuses, or it was sound.
        if not may_live:
            try:
                session.keepalive()
            except SessionLapsed:
                pass
            except (StoreError, redis.RedisError) as exc:
                wrong.append(f"{name}, then keepalive: {type(exc).__name__}: {exc}"[:200])
            else:
                wrong.append(f"{name}, then keepalive: a damaged session kept alive")
        store.close()
    assert wrong == [], damage


@pytest.mark.parametrize("damage", ["garbage", "missing", f"0{2**45},1,,me"])
def test_a_damaged_record_leaves_its_runs_expired_and_claimable(client: redis.Redis,
                                                                damage: str) -> None:
    """A session whose record is damaged is lapsed: its runs read as expired, and once its
    entry in session-leases is due, a claim hands them out (its entry quarantined)."""
    store, keys, session = namespace_with_a_session(client)
    if damage == "missing":
        client.hdel(keys.sessions, "1")
    else:
        client.hset(keys.sessions, "1", damage)
    assert not store.get("r0").holder.live and not store.get("r1").holder.live
    client.zadd(keys.session_leases, {"1": 5})  # its entry due
    assert sorted(store.claim_expired("x", LONG, 10)) == ["r0", "r1"]
    assert "session|1" in {f"{q.index}|{q.run}" for q in store.quarantined()}
    with pytest.raises(SessionLapsed):
        session.keepalive()
    store.close()


def test_a_damaged_told_list_is_quarantined_and_the_keepalive_stands(
        client: redis.Redis) -> None:
    """A told list holding a 10 MB entry is sized before it is read (MEMORY USAGE): set
    aside; a server without the command (fakeredis) reads it, but tells no such entry."""
    store, keys, session = namespace_with_a_session(client)
    client.rpush(keys.session_told("1"), huge(10 << 20))
    assert session.keepalive() == []
    assert not client.exists(keys.session_told("1"))
    try:
        client.memory_usage(keys.sessions)
    except redis.ResponseError:
        pass  # no MEMORY USAGE: the guard is skipped (lua/_lib/runs.lua's within)
    else:
        assert "session-told|1" in {f"{q.index}|{q.run}" for q in store.quarantined()}
    assert store.get("r0").holder.live
    store.close()


def test_a_told_list_of_another_type_is_set_aside_by_the_write_that_tells(
        client: redis.Redis) -> None:
    """A release of a session's run by its owner tells the session: its told list of
    another type is set aside (listed), a fresh one holds the run, the release stands."""
    store, keys, session = namespace_with_a_session(client)
    client.sadd(keys.session_told("1"), "junk")
    assert store.release("me", ["r0"]) == ["r0"]
    assert "session-told|1" in {f"{q.index}|{q.run}" for q in store.quarantined()}
    assert session.keepalive() == ["r0"]
    store.close()


def test_a_held_runs_sid_of_no_session_reads_expired(client: redis.Redis) -> None:
    """A run whose header names a session that is not there, or another owner's, is held
    by no live session: expired (never live), its renew refused; a free run with a sid is
    Corrupt."""
    store, keys, _ = namespace_with_a_session(client)
    plant(client, keys.run("r3"), sid="77")
    current = store.get("r3")
    assert current.session == "77" and not current.holder.live
    assert store.renew("other", ["r3"], LONG) == []
    plant(client, keys.run("r3"), sid="1")  # "me"'s live session, not "other"'s
    assert not store.get("r3").holder.live
    plant(client, keys.run("r2"), sid="77", lo="2", texts=b"me")
    with pytest.raises(Corrupt):
        store.get("r2")
    store.close()


# ------------------------------------------------------------------ raw session ARGV
#: Session ids a raw call may not give: not 1 to 20 decimal digits without a leading zero.
BAD_IDS = ["0", "01", "-1", "1.5", "abc", " 1", "1 ", "1" * 21, "1e3", "0x10", "nan"]

#: The claim scripts and their KEYS (test_hostile's ARGVS), ARGV[9] the session id.
CLAIMS = {
    "run_claim": ("ready", "leases", "meta", "fanout"),
    "run_claim_ready": ("ready", "leases", "meta", "fanout"),
    "run_claim_expired": ("leases", "meta"),
}


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_a_raw_claim_with_a_bad_session_id_is_refused(client: redis.Redis, name: str) -> None:
    store, keys, _ = namespace_with_a_session(client)
    script = getattr(scripts, name.upper())
    names = script_keys(store.namespace, CLAIMS[name])
    before = contents(client, store.namespace)
    for bad in BAD_IDS:
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, script, names, keys.prefix, *CLAIM, bad)
        assert contents(client, store.namespace) == before, bad
    store.close()


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_a_raw_claim_under_another_owners_or_no_session_is_lapsed(client: redis.Redis,
                                                                  name: str) -> None:
    store, keys, _ = namespace_with_a_session(client)
    store.insert("r4", b"x", Release())
    script = getattr(scripts, name.upper())
    names = script_keys(store.namespace, CLAIMS[name])
    before = contents(client, store.namespace)
    for sid, owner in [("1", "forged"), ("2", "me"), ("99999999999999999999", "me")]:
        reply = evalsha(client, script, names, keys.prefix, owner, *CLAIM[1:], sid)
        assert reply[0] == scripts.Code.SESSION_LAPSED, (sid, owner, reply)
        assert contents(client, store.namespace) == before, (sid, owner)
    store.close()


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_raw_insession_write_with_a_bad_id_is_refused(client: redis.Redis, bad: str) -> None:
    """The 'j' lease kind takes its session id as its 'key' (ARGV of insert and
    compare_and_set): a bad one is BADARG, a forged owner SESSION_LAPSED, nothing written."""
    store, keys, _ = namespace_with_a_session(client)
    before = contents(client, store.namespace)
    insert = script_keys(store.namespace, ("run:new", "leases", "ready", "meta"))
    cas = script_keys(store.namespace, ("run:r2", "leases", "ready", "meta"))
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_INSERT, insert, keys.prefix, "new", b"x", "j", "me", bad,
                "", "", "", "", 1)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        evalsha(client, scripts.RUN_COMPARE_AND_SET, cas, keys.prefix, "r2", 1, b"x", "j",
                "me", bad, "", "", "", "", 1)
    assert contents(client, store.namespace) == before
    for sid, owner in [("1", "forged"), ("2", "me")]:
        reply = evalsha(client, scripts.RUN_INSERT, insert, keys.prefix, "new", b"x", "j",
                        owner, sid, "", "", "", "", 1)
        assert reply[0] == scripts.Code.SESSION_LAPSED, reply
        reply = evalsha(client, scripts.RUN_COMPARE_AND_SET, cas, keys.prefix, "r2", 1, b"x",
                        "j", owner, sid, "", "", "", "", 1)
        assert reply[0] == scripts.Code.SESSION_LAPSED, reply
        assert contents(client, store.namespace) == before
    store.close()


@pytest.mark.parametrize("name", ["run_session_keepalive", "run_session_close"])
def test_a_raw_session_call_with_a_bad_id_is_refused(client: redis.Redis, name: str) -> None:
    store, keys, _ = namespace_with_a_session(client)
    script = getattr(scripts, name.upper())
    names = (script_keys(store.namespace, ("sessions", "session_leases", "meta"))
             if name == "run_session_keepalive" else
             script_keys(store.namespace, ("sessions", "session_leases", "leases", "ready",
                                           "meta")))
    rest = () if name == "run_session_keepalive" else (10, 1)
    before = contents(client, store.namespace)
    for bad in ["", *BAD_IDS]:
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, script, names, keys.prefix, bad, "me", *rest)
        assert contents(client, store.namespace) == before, bad
    # A forged owner: the keepalive is lapsed, the close closes nothing; nothing written.
    reply = evalsha(client, script, names, keys.prefix, "1", "forged", *rest)
    assert reply[0] == (scripts.Code.SESSION_LAPSED if name == "run_session_keepalive"
                        else scripts.Code.OK), reply
    assert contents(client, store.namespace) == before
    assert store.get("r0").holder.live
    store.close()


def test_a_raw_open_with_a_bad_id_is_refused(client: redis.Redis) -> None:
    """ARGV[4] of run_session_open (the id a store of partitions opens partition 0's under
    in the others): a bad one is BADARG, nothing written."""
    store, keys, _ = namespace_with_a_session(client)
    names = script_keys(store.namespace, ("sessions", "session_leases", "session_seq", "meta"))
    before = contents(client, store.namespace)
    for bad in BAD_IDS:
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, scripts.RUN_SESSION_OPEN, names, keys.prefix, "me", LONG, bad)
        assert contents(client, store.namespace) == before, bad
    store.close()


def test_a_raw_open_under_an_id_known_here_never_revives_it(client: redis.Redis) -> None:
    """An id the namespace knows in any form (a session's record, its entry, its runs, its
    told list, even damaged or left behind) is refused, SESSION_LAPSED, nothing written: a
    forged open never brings a lapsed session back, nor takes another's runs."""
    store, keys, session = namespace_with_a_session(client)
    names = script_keys(store.namespace, ("sessions", "session_leases", "session_seq", "meta"))
    p = keys.prefix
    plants: list[Callable[[], Any]] = [
        lambda: None,  # session 1 itself, live
        lambda: client.hset(p + "sessions", "7", "garbage"),
        lambda: client.zadd(p + "session-leases", {"8": 1}),
        lambda: client.sadd(p + "s:9", "r2"),
        lambda: client.rpush(p + "st:10", "r2"),
        lambda: client.set(p + "s:11", "not a set"),
    ]
    for sid, planted in zip(["1", "7", "8", "9", "10", "11"], plants, strict=True):
        planted()
        before = contents(client, store.namespace)
        for owner in ("me", "forged"):
            reply = evalsha(client, scripts.RUN_SESSION_OPEN, names, p, owner, LONG, sid)
            assert reply[0] == scripts.Code.SESSION_LAPSED, (sid, owner, reply)
            assert contents(client, store.namespace) == before, (sid, owner)
    # A new id there is opened as asked, session-seq untouched (partition 0 gives ids).
    seq = client.get(p + "session-seq")
    assert evalsha(client, scripts.RUN_SESSION_OPEN, names, p, "me", LONG, "12")[:2] == [
        scripts.Code.OK, b"12"]
    assert client.get(p + "session-seq") == seq
    assert session.keepalive() == []
    store.close()


def test_a_raw_sessions_page_past_the_cap_is_refused(client: redis.Redis) -> None:
    store, keys, _ = namespace_with_a_session(client)
    names = script_keys(store.namespace, ("session_leases", "sessions"))
    for offset, count in [(0, 0), (0, 10**6), (-1, 10), ("x", 10), (0, "1.5")]:
        with pytest.raises(redis.ResponseError, match="BADARG"):
            evalsha(client, scripts.RUN_SESSIONS, names, keys.prefix, offset, count)
    store.close()


def test_a_lapsed_session_holding_no_run_is_gone(client: redis.Redis) -> None:
    """Not listed once lapsed, and the next claim's sweep removes its keys."""
    store = RedisRunStore(client, namespace=unique_namespace(), discover=lambda r: At(0))
    keys = Keyspace(store.namespace)
    session = store.open_session("me", LONG)
    client.hset(keys.sessions, session.id, f"5,{LONG},,me")  # lapsed long ago
    client.zadd(keys.session_leases, {session.id: 5})
    assert store.sessions() == []
    assert store.claim("x", LONG, 1) == []
    assert not client.hexists(keys.sessions, session.id)
    assert client.zscore(keys.session_leases, session.id) is None
    assert store.quarantined() == []
    with pytest.raises(SessionLapsed):
        session.keepalive()
    store.close()


@pytest.mark.parametrize("score", ["-inf", 1.5, -5, 5])
def test_a_big_session_without_its_record_is_handed_out_in_bounded_steps(
        client: redis.Redis, score: Any) -> None:
    """Its record gone, its entry due at any score: every run is taken over, each claim a
    bounded step (the sweep's cursor kept in the record it writes), then it is gone."""
    store, keys, session = namespace_with_a_session(client)
    # Ids of 200 bytes: a claim's sweep stops once SESSION_SWEEP_BYTES of them went in.
    ids = [f"m{i}".ljust(200, "x") for i in range(300)]
    for run in ids:
        store.insert(run, b"x", session.lease)
    client.hdel(keys.sessions, "1")
    client.zadd(keys.session_leases, {"1": score})
    taken = store.claim_expired("x", LONG, 1)
    assert len(taken) == 1
    assert client.zcard(keys.leases) < 300  # bounded steps, not the whole set
    while got := store.claim_expired("x", LONG, 100):
        taken += got
    assert sorted(taken) == sorted(["r0", "r1", *ids])
    assert store.sessions() == [] and not client.hexists(keys.sessions, "1")
    assert [(q.index, q.run) for q in store.quarantined()] == [("session", "1")]
    store.close()
