"""Sessions over partitions on fakeredis (docs/design/sessions.md, "Over partitions"): what
SessionRules cannot say, as the memory reference has one partition. A session is one over
every partition; one that a partition could not take is not live there, its keepalive
names that partition and goes on with the others, its claims leave it out and its runs
there are left to others. (A session that lapsed in the partitions of a node away past the
ttl: tests/faults/test_hung_node.py, on the cluster.)"""

from __future__ import annotations

import fakeredis
import pytest
from conftest import Clock
from servers import unique_namespace

from redisstore import Held, Kept, RedisRunStore, Release, Seize, Session, SessionLapsed
from redisstore.conformance.readiness import rec
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.discovery import json_wait

N = 4
LONG = 600_000
READY = rec({"at": 0})


def runs_in(partitions: set[int], prefix: str) -> dict[int, str]:
    """One run id in each of ``partitions``."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(partitions):
        run = f"{prefix}{i}"
        p = partition_of(run, N)
        if p in partitions and p not in found:
            found[p] = run
        i += 1
    return found


@pytest.fixture
def client(fake_clock: Clock) -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def store_of(client: fakeredis.FakeRedis) -> RedisRunStore:
    return RedisRunStore(client, namespace=unique_namespace(), discover=json_wait,
                         partitions=N)


def test_one_session_over_every_partition_listed_once(client: fakeredis.FakeRedis) -> None:
    store = store_of(client)
    runs = runs_in(set(range(N)), "r")
    for run in runs.values():
        store.insert(run, READY, Release())
    session = store.open_session("me", LONG)
    other = store.open_session("me", LONG)
    assert (session.id, other.id) == ("1", "2")  # partition 0 gives the ids
    assert sorted(session.claim(N)) == sorted(runs.values())
    assert {store.get(run).session for run in runs.values()} == {session.id}
    listed = store.sessions()
    assert [(s.id, s.owner, s.runs) for s in listed] == [("1", "me", N), ("2", "me", 0)]
    kept = session.keepalive()
    assert isinstance(kept, Kept)
    assert (kept, kept.lapsed, kept.unanswered) == ([], frozenset(), frozenset())


def test_keepalive_merges_what_each_partition_tells(client: fakeredis.FakeRedis) -> None:
    store = store_of(client)
    runs = runs_in({0, 1, 2, 3}, "t")
    for run in runs.values():
        store.insert(run, READY, Release())
    session = store.open_session("me", LONG)
    assert len(session.claim(N)) == N
    taken = [runs[1], runs[3]]
    for run in taken:
        store.compare_and_set(run, store.get(run).revision, READY, Seize("thief", LONG))
    assert sorted(session.keepalive()) == sorted(taken)
    assert session.keepalive() == []  # each once
    assert session.close() == N - 2


def test_a_partition_that_could_not_take_the_session_is_left_out(
        client: fakeredis.FakeRedis) -> None:
    """Partition 2 knows id 1 already (a run set left behind): the opening there is
    refused, nothing written, and the session is not live there."""
    store = store_of(client)
    planted = Keyspace(store.namespace, 2).prefix + "s:1"
    client.sadd(planted, "stranger")
    runs = runs_in(set(range(N)), "u")
    for run in runs.values():
        store.insert(run, READY, Release())
    session = store.open_session("me", LONG)
    assert session.id == "1"
    assert client.smembers(planted) == {b"stranger"}
    kept = session.keepalive()
    assert (kept, kept.lapsed) == ([], frozenset({2}))
    # Its claims leave partition 2 out; another owner's claim takes that run.
    assert sorted(session.claim(N)) == sorted(r for p, r in runs.items() if p != 2)
    assert session.claim(N) == []
    assert store.claim("other", LONG, N) == [runs[2]]
    assert store.get(runs[0]).holder == Held("me", True)
    # A store that did not open it learns the same from the partitions' answers.
    again = RedisRunStore(client, namespace=store.namespace, partitions=N)
    assert Session(again, session.id, "me", LONG).keepalive().lapsed == frozenset({2})
    assert session.close() == N - 1


def test_a_session_lapsed_everywhere_is_refused(client: fakeredis.FakeRedis,
                                               fake_clock: Clock) -> None:
    store = store_of(client)
    runs = runs_in(set(range(N)), "v")
    for run in runs.values():
        store.insert(run, READY, Release())
    session = store.open_session("me", 1000)
    assert len(session.claim(N)) == N
    fake_clock.advance(1000)
    with pytest.raises(SessionLapsed):
        session.keepalive()
    with pytest.raises(SessionLapsed):
        session.claim(1)
    # Its runs, in every partition, are due at its expiry: one claim of all.
    assert sorted(store.claim_expired("other", LONG, N)) == sorted(runs.values())


@pytest.mark.parametrize("kind", ["claim", "claim_expired"])
def test_one_claim_past_a_lapse_sweeps_the_session_in_every_partition(
        client: fakeredis.FakeRedis, fake_clock: Clock, kind: str) -> None:
    """A lapsed session's runs enter each partition's leases index at the first claim that
    meets them there. A claim of one run takes it from one partition; the others, whose
    heads answered the session's runs as due, claim none but sweep theirs in, so that every
    run of a dead node is claimable at once, not when the merge of due runs reaches its
    partition."""
    store = store_of(client)
    runs = [run for k in range(3) for run in runs_in(set(range(N)), f"s{k}-").values()]
    for run in runs:
        store.insert(run, READY, Release())
    session = store.open_session("dead", 1000)
    assert len(session.claim(len(runs))) == len(runs)
    fake_clock.advance(1000)
    assert len(getattr(store, kind)("other", LONG, 1)) == 1
    unswept = [p for p, part in enumerate(store._ops.parts)
               if client.zscore(part.keys.session_leases, session.id) not in (None, float("inf"))]
    assert unswept == []
    assert len(store.claim_expired("other", LONG, len(runs))) == len(runs) - 1
