"""Pipelines: many calls of one run store in one round trip (``store.pipeline()``).

Each queued call gets its own answer or its own error, exactly what the same call alone
would give; the whole pipeline is one round trip (counted at the shell); a write goes out
exactly once, even when the replies of the round are lost; a bad argument raises where the
call is queued; a block that raises sends nothing; ``NOSCRIPT`` costs a second round trip
and nothing else; with ``Durability`` one ``WAIT`` covers the writes of a round.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from faultproxy import FaultProxy
from servers import Server, unique_namespace

from redisstore import (
    AlreadyExists,
    AsyncRedisRunStore,
    At,
    Claim,
    Claimed,
    Conflict,
    Durability,
    Failure,
    Fenced,
    Free,
    Held,
    Hold,
    LeaseRefused,
    Misconfigured,
    NotFound,
    RedisRunStore,
    Release,
    Unavailable,
)
from redisstore.core import scripts
from redisstore.core.pipeline import Pending
from redisstore.shells.sync import Transport

LONG = 600_000


def ready(record: bytes) -> At | None:
    """Every run is ready at once, until its record says it is done."""
    return None if record == b"done" else At(0)


def loaded(client: Any) -> Any:
    """``client`` with every run script in its server's cache, so a round trip counted is
    a pipeline's own, not a first load (a test of NOSCRIPT flushes them)."""
    for script in scripts.RUN_SCRIPTS:
        client.script_load(script.source)
    return client


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of commands of each batch the sync shell sends on the test's thread (by
    its full path, or by its lean one: a pipeline of one call, or of one fused pair, goes
    as the store's call). Another thread's sends are not the test's: a keeper or a waker
    an earlier test of the process left running renewed once inside a count."""
    sent: list[int] = []
    send, lean = Transport._send, Transport._lean_send
    inside = threading.local()  # the full path sends by the lean one too: counted once
    mine = threading.get_ident()

    def counting(self: Transport, batch: Any, deadline: float) -> Any:
        if threading.get_ident() == mine:
            sent.append(len(batch.commands))
        inside.send = True
        try:
            return send(self, batch, deadline)
        finally:
            inside.send = False

    def lean_counting(self: Transport, pool: Any, conn: Any, data: bytes, count: int,
                      deadline: float) -> Any:
        if not getattr(inside, "send", False) and threading.get_ident() == mine:
            sent.append(count)
        return lean(self, pool, conn, data, count, deadline)

    monkeypatch.setattr(Transport, "_send", counting)
    monkeypatch.setattr(Transport, "_lean_send", lean_counting)
    return sent


def test_every_call_gets_its_own_answer_in_one_round_trip(
        client: redis.Redis, round_trips: list[int]) -> None:
    store = RedisRunStore(loaded(client), namespace=unique_namespace(), discover=ready)
    store.insert("held", b"h1", Claim("other", LONG))
    store.insert("free", b"f1", Release())
    store.insert("done", b"d1", Claim("me", LONG))
    round_trips.clear()

    with store.pipeline() as pipe:
        new = pipe.insert("new", b"n1", Claim("me", LONG))
        again = pipe.insert("held", b"x", Release())
        stale = pipe.compare_and_set("free", 7, b"x", Release())
        refused = pipe.compare_and_set("held", 1, b"x", Hold("me"))
        absent = pipe.get("absent")
        release = pipe.compare_and_set("done", 1, b"d2", Release())
        claim = pipe.claim_ready("me", LONG, 10, records=True)
        renewed = pipe.renew("me", ["new", "held"], LONG)
        read = pipe.get("new")
        now = pipe.now()
        many = pipe.get_many(["held", "absent", "new"])
        assert len(pipe) == 11 and not new.done()
    # One batch, one command per call, but the write of "done" and the claim queued right
    # after it: one script (run_cas_claim) runs both.
    assert round_trips == [10]

    assert new.result() == 1 and new.done()
    with pytest.raises(AlreadyExists):
        again.result()
    with pytest.raises(Conflict) as conflict:
        stale.result()
    assert conflict.value.current == 1
    with pytest.raises(LeaseRefused):
        refused.result()
    with pytest.raises(NotFound):
        absent.result()
    assert release.result() is None
    claimed = claim.result()
    # "done" was released earlier in the same pipeline: the claim sees it.
    assert sorted(c.run for c in claimed) == ["done", "free"]
    assert all(isinstance(c, Claimed) and c.current == store.get(c.run) for c in claimed)
    assert renewed.result() == ["new"]
    assert read.result().holder == Held("me", True)
    assert isinstance(now.result(), int)
    assert many.result() == {"held": store.get("held"), "new": store.get("new")}
    assert store.get("held").record == b"h1"  # every refusal wrote nothing


# ---------------------------------------------------- a finish and the next claim: one script
#: Script names by SHA1 (what an EVALSHA carries).
NAMES = {script.sha.encode(): script.name for script in scripts.RUN_SCRIPTS}


def labels(batch: Any) -> list[str]:
    """What a batch carries: each EVALSHA's script name, else the command's name."""
    out = []
    for command in batch.commands:
        name = bytes(command[0]).decode().upper() if not isinstance(command[0], int) else ""
        if name == "EVALSHA":
            sha = command[1] if isinstance(command[1], bytes) else str(command[1]).encode()
            out.append(NAMES.get(sha, "?"))
        else:
            out.append(name + (" " + bytes(command[1]).decode().upper()
                               if name == "SCRIPT" else ""))
    return out


@pytest.fixture
def full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call and pipeline sent by the shells' full path, one ``Transport._send`` per
    batch: the lean paths (a store's plain call packed straight onto a socket, which a
    pipeline of one call or of one fused pair may take too) are turned off, so that a spy or
    a fault at ``_send`` sees every round trip. What a reply means is decided by the same
    Driver either way."""
    from redisstore.core.driver import Driver
    from redisstore.shells.aio import AsyncTransport
    from redisstore.shells.sync import Pool

    async def full(self: AsyncTransport, op: Any) -> Any:
        driver = Driver(op, self.durability)
        await self.run(driver)
        return driver.result()

    monkeypatch.setattr(Pool, "take_lean", lambda self: None)
    monkeypatch.setattr(AsyncTransport, "_lean_drive", full)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch, full_path: None) -> list[list[str]]:
    """What each batch the sync and asyncio shells send carries (:func:`labels`)."""
    from redisstore.shells.aio import AsyncTransport

    sent: list[list[str]] = []
    send, asend = Transport._send, AsyncTransport._send

    def spying(self: Transport, batch: Any, deadline: float) -> Any:
        sent.append(labels(batch))
        return send(self, batch, deadline)

    async def aspying(self: AsyncTransport, batch: Any, deadline: float) -> Any:
        sent.append(labels(batch))
        return await asend(self, batch, deadline)

    monkeypatch.setattr(Transport, "_send", spying)
    monkeypatch.setattr(AsyncTransport, "_send", aspying)
    return sent


def unit_of_work(client: Any) -> RedisRunStore:
    """A namespace with a run "job" held by "w" (grant 1), a ready run "next" and an
    expired lease "dead" of another owner: what a worker's finish and next claim meet."""
    store = RedisRunStore(loaded(client), namespace=unique_namespace(), discover=ready)
    store.insert("job", b"todo", Claim("w", LONG))
    store.insert("next", b"todo", Release())
    store.insert("dead", b"todo", Claim("other", 1))
    time.sleep(0.005)  # its 1 ms lease runs out
    return store


def state(store: RedisRunStore) -> dict[str, Any]:
    """Every run as read, its times (claimed at, not before) as whether it has one."""
    out = {}
    for run in ("job", "next", "dead"):
        current = store.get(run)
        claim = current.claim
        out[run] = (current.revision, current.record, current.holder, current.token,
                    current.takeovers, current.attempts, current.not_before is not None,
                    current.quarantined, claim and (claim.key, claim.dependency_revision))
    return out


#: A first call of each kind a claim fuses with, and a claim of each kind after it:
#: (name, the first call, the claim), each a function of a store or a pipeline.
FUSABLE: list[tuple[str, Any, Any]] = [
    ("finish-record-claim", lambda s: s.finish("job", 1, Fenced("w", 1), record=b"done"),
     lambda s: s.claim("w", LONG, 10)),
    ("finish-free-claim_ready", lambda s: s.finish("job", 1, Fenced("w", 1)),
     lambda s: s.claim_ready("w", LONG, 10, records=True)),
    ("finish-failure-claim_expired",
     lambda s: s.finish("job", 1, Fenced("w", 1), failure=Failure("boom", delay=LONG)),
     lambda s: s.claim_expired("w", LONG, 10)),
    ("finish-final-claim", lambda s: s.finish("job", 1, Fenced("w", 1),
                                              failure=Failure("boom", final=True)),
     lambda s: s.claim("w", LONG, 10, records=True)),
    ("cas-claim_ready", lambda s: s.compare_and_set("job", 1, b"todo", Release()),
     lambda s: s.claim_ready("w", LONG, 10)),
    ("cas-hold-claim_expired", lambda s: s.compare_and_set("job", 1, b"done", Hold("w")),
     lambda s: s.claim_expired("w", LONG, 10, max_takeovers=0)),
    ("release-claim", lambda s: s.release("w", ["job"]), lambda s: s.claim("w", LONG, 10)),
]


def claimed_runs(result: Any) -> list[str]:
    return [c.run if isinstance(c, Claimed) else c for c in result]


@pytest.mark.parametrize(("kind", "first", "claim"), FUSABLE,
                         ids=[kind for kind, _, _ in FUSABLE])
def test_a_finish_write_or_release_and_the_next_claim_are_one_script(
        client: redis.Redis, batches: list[list[str]], kind: str, first: Any,
        claim: Any) -> None:
    """A claim queued right after a finish, a compare_and_set or a release is sent with it
    as one EVALSHA of the fused script (run_finish_claim, run_cas_claim,
    run_release_claim), and each Pending answers what its call alone would: the same value,
    the same runs claimed, the same state left, as the two calls made one after the other
    on a twin namespace."""
    fused_store, alone = unit_of_work(client), unit_of_work(client)
    fused_store.now()  # the one-time server check, not in the pipeline's batch
    batches.clear()
    with fused_store.pipeline() as pipe:
        one = first(pipe)
        two = claim(pipe)
    script = {"finish": "run_finish_claim", "cas": "run_cas_claim",
              "release": "run_release_claim"}[kind.split("-")[0]]
    assert batches == [[script]]  # one round trip, one command: the fused script
    expected_one, expected_two = first(alone), claim(alone)
    assert one.result() == expected_one
    got = two.result()
    assert claimed_runs(got) == claimed_runs(expected_two)
    if got and isinstance(got[0], Claimed):
        assert [c.current.record for c in got] == [c.current.record for c in expected_two]
    assert state(fused_store) == state(alone)
    assert fused_store.quarantined() == alone.quarantined()


@pytest.mark.parametrize(("refusal", "script", "first"), [
    (LeaseRefused, "run_finish_claim",
     lambda s: s.finish("job", 1, Fenced("w", 2), record=b"done")),  # another grant's
    (Conflict, "run_finish_claim", lambda s: s.finish("job", 5, Fenced("w", 1))),
    (NotFound, "run_finish_claim",
     lambda s: s.finish("absent", 1, Fenced("w", 1), failure=Failure("boom"))),
    (Conflict, "run_cas_claim", lambda s: s.compare_and_set("job", 5, b"x", Release())),
    (LeaseRefused, "run_cas_claim", lambda s: s.compare_and_set("job", 1, b"x", Hold("me"))),
], ids=["finish-refused", "finish-conflict", "finish-absent", "cas-conflict", "cas-refused"])
def test_a_refused_first_call_still_gives_the_claim_its_own_answer(
        client: redis.Redis, batches: list[list[str]], refusal: type[Exception], script: str,
        first: Any) -> None:
    """The fused script runs no claim after a first call it refuses (nothing written): the
    claim is then sent alone, right after, and answers as it would have; the first call
    raises its own refusal."""
    store = unit_of_work(client)
    store.now()
    before = store.get("job")
    batches.clear()
    with store.pipeline() as pipe:
        one = first(pipe)
        two = pipe.claim("w", LONG, 10)
    with pytest.raises(refusal):
        one.result()
    assert sorted(two.result()) == ["dead", "next"]
    assert batches == [[script], ["run_claim"]]
    assert store.get("job") == before  # nothing of the refused call was written


def test_noscript_of_the_fused_script_loads_it_and_sends_it_again(
        client: redis.Redis, batches: list[list[str]]) -> None:
    store = unit_of_work(client)
    client.script_flush()
    batches.clear()
    with store.pipeline() as pipe:
        done = pipe.finish("job", 1, Fenced("w", 1), record=b"done")
        nxt = pipe.claim("w", LONG, 10)
    assert batches == [["run_finish_claim"], ["SCRIPT LOAD", "run_finish_claim"]]
    assert done.result() is None and sorted(nxt.result()) == ["dead", "next"]
    assert store.get("job").record == b"done" and store.get("job").holder == Free()


def test_a_lost_reply_of_the_fused_script_leaves_both_calls_unknown(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch, full_path: None) -> None:
    """The fused script ran, its reply was lost: neither call can know what it did (each
    ``Unavailable``, outcome ``unknown``), and neither is sent again: each applied once."""
    from redisstore.core.outcomes import Exchange, Lost

    store = unit_of_work(client)
    store.now()
    send = Transport._send

    def losing(self: Transport, batch: Any, deadline: float) -> Any:
        got = send(self, batch, deadline)
        if "run_finish_claim" in labels(batch):
            return Exchange((), Lost(True, "the test's fault"))
        return got

    monkeypatch.setattr(Transport, "_send", losing)
    with store.pipeline() as pipe:
        done = pipe.finish("job", 1, Fenced("w", 1), record=b"done")
        nxt = pipe.claim("w", LONG, 10)
    for pending in (done, nxt):
        with pytest.raises(Unavailable) as caught:
            pending.result()
        assert caught.value.outcome == "unknown"
    assert (store.get("job").revision, store.get("job").record) == (2, b"done")  # once
    assert store.get("next").holder == Held("w", True)
    assert store.get("next").token == 1  # claimed once: its first grant


@pytest.mark.server
def test_an_unconfirmed_fused_call_leaves_a_refused_first_call_its_refusal(
        redis7: Server) -> None:
    """With ``Durability`` the fused script's confirmation covers both calls: a first call
    the script refused wrote nothing and keeps its own refusal, and its claim, sent alone,
    is unconfirmed as a write alone is; both applied, both are unconfirmed."""
    namespace = unique_namespace()
    plain = RedisRunStore(loaded(redis7.client()), namespace=namespace, discover=ready)
    plain.insert("job", b"todo", Claim("w", LONG))
    plain.insert("next", b"todo", Release())
    # No replica answers: every write is applied and unconfirmed.
    durable = RedisRunStore(redis7.client(), namespace=namespace, discover=ready,
                            durability=Durability(replicas=1, timeout=50))
    with durable.pipeline() as pipe:
        refused = pipe.finish("job", 5, Fenced("w", 1), record=b"done")
        nxt = pipe.claim("w", LONG, 10)
    with pytest.raises(Conflict):
        refused.result()
    with pytest.raises(Unavailable) as caught:
        nxt.result()
    assert caught.value.outcome == "applied_unconfirmed"
    assert plain.get("next").holder == Held("w", True)  # the claim ran, alone
    assert plain.get("job").revision == 1
    with durable.pipeline() as pipe:
        done = pipe.finish("job", 1, Fenced("w", 1), record=b"done")
        again = pipe.claim("w", LONG, 10)
    for pending in (done, again):
        with pytest.raises(Unavailable) as caught:
            pending.result()
        assert caught.value.outcome == "applied_unconfirmed"
    assert plain.get("job").record == b"done"


def test_an_asyncio_pipeline_fuses_a_finish_and_the_next_claim(
        batches: list[list[str]]) -> None:
    async def main() -> None:
        client = fakeredis.FakeAsyncRedis()
        for script in scripts.RUN_SCRIPTS:
            await client.script_load(script.source)
        store = AsyncRedisRunStore(client, namespace=unique_namespace(), discover=ready)
        await store.insert("job", b"todo", Claim("w", LONG))
        await store.insert("held", b"todo", Claim("w", LONG))
        await store.insert("next", b"todo", Release())
        batches.clear()
        async with store.pipeline() as pipe:
            done = pipe.finish("job", 1, Fenced("w", 1), record=b"done")
            nxt = pipe.claim("w", LONG, 10, records=True)
        assert batches == [["run_finish_claim"]]
        assert done.result() is None and [c.run for c in nxt.result()] == ["next"]
        assert (await store.get("job")).record == b"done"
        batches.clear()
        async with store.pipeline() as pipe:  # another grant's finish: refused
            refused = pipe.finish("held", 1, Fenced("w", 7))
            released = pipe.release("w", ["job", "held"])
            after = pipe.claim_ready("w", LONG, 10)
        assert batches == [["run_finish", "run_release_claim"]]
        with pytest.raises(LeaseRefused):
            refused.result()
        assert released.result() == ["held"] and after.result() == ["held"]
        await store.aclose()

    asyncio.run(main())


def test_the_worker_step_is_one_round_trip(client: redis.Redis,
                                           round_trips: list[int]) -> None:
    # Write-and-release the run just finished, claim the next with its record.
    store = RedisRunStore(loaded(client), namespace=unique_namespace(), discover=ready)
    for i in range(3):
        store.insert(f"job-{i}", b"todo", Release())
    current = store.claim_ready("w", LONG, 1, records=True)[0]
    round_trips.clear()
    done = 0
    while True:
        with store.pipeline() as pipe:
            pipe.compare_and_set(current.run, current.current.revision, b"done", Release())
            nxt = pipe.claim_ready("w", LONG, 1, records=True)
        done += 1
        got = nxt.result()
        if not got:
            break
        current = got[0]
        assert done <= 3, "a job came back"
    assert done == 3 and len(round_trips) == 3
    # A released run with no wait left: none is claimable again, each was done once.
    assert all(store.get(f"job-{i}").record == b"done" for i in range(3))


def test_finish_and_wait_for_the_next_is_one_round_trip_when_work_is_there(
        client: redis.Redis, round_trips: list[int]) -> None:
    store = RedisRunStore(loaded(client), namespace=unique_namespace(), discover=ready)
    store.insert("done-now", b"todo", Claim("w", LONG))
    store.insert("next", b"todo", Release())
    round_trips.clear()
    started = time.monotonic()
    with store.pipeline() as pipe:
        pipe.compare_and_set("done-now", 1, b"done", Release())
        nxt = pipe.claim("w", LONG, records=True, block=5_000)
    assert [c.run for c in nxt.result()] == ["next"]
    assert len(round_trips) == 1 and time.monotonic() - started < 2.5


def test_a_blocked_claim_in_a_pipeline_waits_for_work_after_the_round_trip(
        client: redis.Redis) -> None:
    store = RedisRunStore(loaded(client), namespace=unique_namespace(), discover=ready)
    store.insert("done-now", b"todo", Claim("w", LONG))
    store.insert("dead", b"todo", Claim("other", 300))  # its holder dies: taken over
    started = time.monotonic()
    with store.pipeline() as pipe:
        finished = pipe.compare_and_set("done-now", 1, b"done", Release())
        nxt = pipe.claim("w", LONG, block=5_000)
        read = pipe.get("done-now")
    assert finished.result() is None and read.result().record == b"done"
    assert nxt.result() == ["dead"]
    assert 0.2 < time.monotonic() - started < 2.5  # woken by the expiry, not the block's end
    assert store.get("dead").holder == Held("w", True)


def test_a_blocked_claim_in_a_pipeline_runs_out_empty(client: redis.Redis) -> None:
    store = RedisRunStore(loaded(client), namespace=unique_namespace(), discover=ready)
    started = time.monotonic()
    with store.pipeline() as pipe:
        nxt = pipe.claim_ready("w", LONG, block=200)
        gone = pipe.claim_expired("w", LONG, block=0)
    assert nxt.result() == [] and gone.result() == []
    assert 0.2 <= time.monotonic() - started < 2.5
    with pytest.raises(ValueError), store.pipeline() as pipe:
        pipe.claim("w", LONG, block=-1)


def test_an_asyncio_pipeline_claim_blocks_too() -> None:
    async def main() -> None:
        client = fakeredis.FakeAsyncRedis()
        store = AsyncRedisRunStore(client, namespace=unique_namespace(), discover=ready)
        await store.insert("a", b"1", Claim("w", LONG))

        async def later() -> None:
            await asyncio.sleep(0.2)
            await store.insert("b", b"1", Release())

        task = asyncio.create_task(later())
        started = time.monotonic()
        async with store.pipeline() as pipe:
            cas = pipe.compare_and_set("a", 1, b"done", Release())
            nxt = pipe.claim("w", LONG, block=5_000)
        assert cas.result() is None and nxt.result() == ["b"]
        assert time.monotonic() - started < 2.5
        await task
        await store.aclose()

    asyncio.run(main())


def test_release_delete_and_a_poison_bound_in_one_round_trip(
        client: redis.Redis, round_trips: list[int]) -> None:
    store = RedisRunStore(loaded(client), namespace=unique_namespace())
    store.migrate()
    store.insert("mine", b"m1", Claim("me", LONG))
    store.insert("retired", b"r1", Release())
    store.insert("crashed", b"c1", Claim("other", 1))
    time.sleep(0.005)  # its 1 ms lease runs out
    round_trips.clear()
    with store.pipeline() as pipe:
        released = pipe.release("me", ["mine", "retired"])
        deleted = pipe.delete("retired", 1, Release())
        stale = pipe.delete("mine", 5, Release())
        claimed = pipe.claim_expired("me", LONG, 10, max_takeovers=0)
    assert len(round_trips) == 1
    assert released.result() == ["mine"]
    assert deleted.result() is None
    with pytest.raises(Conflict):
        stale.result()
    assert claimed.result() == []  # taking over "crashed" would pass the bound of 0
    assert [(q.index, q.run) for q in store.quarantined()] == [("poison", "crashed")]
    with pytest.raises(NotFound):
        store.get("retired")
    assert store.get("mine").holder == Free()


def test_a_bad_argument_raises_where_it_is_queued(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    with store.pipeline() as pipe:
        first = pipe.insert("a", b"1", Release())
        with pytest.raises(ValueError):
            pipe.insert("", b"1", Release())
        with pytest.raises(TypeError):
            pipe.claim_ready("me", LONG, 1, records=1)  # type: ignore[call-overload]
        assert len(pipe) == 1
    assert first.result() == 1
    assert store.get("a").revision == 1


def test_a_block_that_raises_sends_nothing(client: redis.Redis,
                                           round_trips: list[int]) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.now()
    round_trips.clear()
    queued: list[Pending[Any]] = []
    with pytest.raises(KeyError), store.pipeline() as pipe:
        queued.append(pipe.insert("a", b"1", Release()))
        raise KeyError("the caller's own error")
    assert round_trips == []
    with pytest.raises(Unavailable) as caught:
        queued[0].result()
    assert caught.value.outcome == "not_applied"
    with pytest.raises(NotFound):
        store.get("a")


def test_a_pipeline_is_sent_once(client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    pipe = store.pipeline()
    pending = pipe.insert("a", b"1", Release())
    with pytest.raises(RuntimeError):
        pending.result()  # not sent yet
    pipe.send()
    assert pending.result() == 1
    with pytest.raises(RuntimeError):
        pipe.insert("b", b"1", Release())
    with pytest.raises(RuntimeError):
        pipe.send()
    empty = store.pipeline()
    empty.send()  # nothing queued: nothing sent


def test_noscript_costs_a_round_trip_and_nothing_else(client: redis.Redis,
                                                      round_trips: list[int]) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("a", b"1", Release())
    client.script_flush()
    round_trips.clear()
    with store.pipeline() as pipe:
        cas = pipe.compare_and_set("a", 1, b"2", Release())
        new = pipe.insert("b", b"1", Release())
        read = pipe.get("a")
    assert round_trips == [3, 6]  # then SCRIPT LOAD and the call again, for each call
    assert cas.result() is None and new.result() == 1
    assert read.result().revision in (1, 2)  # the read may run before the reloaded write
    assert (store.get("a").revision, store.get("b").revision) == (2, 1)


@pytest.mark.server
def test_one_confirmation_covers_the_writes_of_a_round(redis7: Server) -> None:
    admin = redis7.client()
    store = RedisRunStore(redis7.client(), namespace=unique_namespace(),
                          durability=Durability(replicas=0, timeout=100))
    store.insert("first", b"1", Release())  # the one-time server check

    def waits() -> int:
        stats = admin.info("commandstats").get("cmdstat_wait", {})
        return int(stats.get("calls", 0))

    before = waits()
    with store.pipeline() as pipe:
        writes = [pipe.insert(f"run-{i}", b"1", Release()) for i in range(5)]
        read = pipe.get("first")
        refused = pipe.insert("first", b"x", Release())
    assert waits() == before + 1
    assert all(w.result() == 1 for w in writes)
    assert read.result().revision == 1
    with pytest.raises(AlreadyExists):
        refused.result()


@pytest.mark.server
def test_lost_replies_leave_each_write_unknown_and_applied_once(redis7: Server) -> None:
    namespace = unique_namespace()
    direct = RedisRunStore(redis7.client(), namespace=namespace)
    direct.insert("a", b"1", Release())
    with FaultProxy(redis7.port) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=0.3)
        store = RedisRunStore(client, namespace=namespace)
        store.get("a")  # connected, scripts loaded, server checked
        store.insert("warm", b"1", Release())
        proxy.drop_replies(1)
        with store.pipeline() as pipe:
            cas = pipe.compare_and_set("a", 1, b"2", Release())
            new = pipe.insert("b", b"1", Release())
            read = pipe.get("a")
        for write in (cas, new):
            with pytest.raises(Unavailable) as caught:
                write.result()
            assert caught.value.outcome == "unknown"
        assert read.result().revision == 2  # a read is sent again, on a new connection
        assert proxy.replies_dropped == 1
    assert (direct.get("a").revision, direct.get("b").revision) == (2, 1)  # once each


def test_asyncio_pipeline(round_trips: list[int]) -> None:
    async def main() -> None:
        client = fakeredis.FakeAsyncRedis()
        store = AsyncRedisRunStore(client, namespace=unique_namespace(), discover=ready)
        await store.insert("a", b"1", Release())
        async with store.pipeline() as pipe:
            cas = pipe.compare_and_set("a", 1, b"2", Release())
            stale = pipe.compare_and_set("a", 1, b"3", Release())
            claim = pipe.claim_ready("me", LONG, 5, records=True)
        assert cas.result() is None
        with pytest.raises(Conflict):
            stale.result()
        assert [(c.run, c.current.record) for c in claim.result()] == [("a", b"2")]

    asyncio.run(main())


@pytest.mark.server
@pytest.mark.parametrize("explicit", [True, False], ids=["send", "async-with"])
def test_a_cancelled_pipeline_answers_every_call(redis7: Server, explicit: bool) -> None:
    async def main() -> None:
        namespace = unique_namespace()
        with FaultProxy(redis7.port) as proxy:
            client = redis.asyncio.Redis(host=proxy.host, port=proxy.port)
            store = AsyncRedisRunStore(client, namespace=namespace)
            await store.insert("warm", b"1", Release())
            proxy.drop_replies(1, hang=True)
            pipe = store.pipeline()
            write = pipe.insert("a", b"1", Release())
            read = pipe.get("warm")

            async def send() -> None:
                if explicit:
                    await pipe.send()
                else:
                    async with pipe:  # sent as the block ends, and cancelled there
                        pass

            task = asyncio.ensure_future(send())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(Unavailable) as caught:
                write.result()
            assert caught.value.outcome == "unknown"
            with pytest.raises(Unavailable) as caught:
                read.result()
            assert caught.value.outcome == "not_applied"
            await client.aclose()

    asyncio.run(main())


@pytest.fixture
def cluster_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    nodes = request.getfixturevalue("cluster")
    client = redis.RedisCluster(host="127.0.0.1", port=nodes[0].port)
    yield client
    client.close()


def test_answers_that_came_back_stand_when_the_block_raises_after_send(
        client: redis.Redis) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    with pytest.raises(RuntimeError), store.pipeline() as pipe:
        new = pipe.insert("a", b"1", Release())
        absent = pipe.get("absent")
        pipe.send()
        pipe.insert("late", b"1", Release())  # queued after send: RuntimeError
    assert new.result() == 1  # applied, and said so: not "not_applied"
    with pytest.raises(NotFound):
        absent.result()
    assert store.get("a").revision == 1


def test_a_discover_that_raises_in_refresh_fails_only_that_call(client: redis.Redis) -> None:
    namespace = unique_namespace()
    RedisRunStore(client, namespace=namespace).insert("bad", b"not json", Release())
    RedisRunStore(client, namespace=namespace).insert("good", b"1", Release())

    def picky(record: bytes) -> At | None:
        if record == b"not json":
            raise ValueError("cannot read this record")
        return None

    store = RedisRunStore(client, namespace=namespace, discover=picky)
    with store.pipeline() as pipe:
        refresh = pipe.refresh("bad")
        cas = pipe.compare_and_set("good", 1, b"2", Release())
        stale = pipe.compare_and_set("good", 1, b"3", Release())
        now = pipe.now()
    with pytest.raises(ValueError):
        refresh.result()
    assert cas.result() is None
    with pytest.raises(Conflict):
        stale.result()
    assert isinstance(now.result(), int)
    assert store.get("good").revision == 2


def test_a_long_pipeline_goes_in_round_trips_of_at_most_100_calls(
        client: redis.Redis, round_trips: list[int]) -> None:
    store = RedisRunStore(loaded(client), namespace=unique_namespace())
    store.insert("warm", b"1", Release())  # the one-time server check
    round_trips.clear()
    with store.pipeline() as pipe:
        inserted = [pipe.insert(f"run-{i:03d}", b"1", Release()) for i in range(250)]
        again = [pipe.insert(f"run-{i:03d}", b"x", Release()) for i in range(0, 250, 50)]
    assert round_trips == [100, 100, 55]
    assert all(p.result() == 1 for p in inserted)
    for p in again:  # queued after the inserts of the same runs: they ran after them
        with pytest.raises(AlreadyExists):
            p.result()


def test_after_noscript_each_script_is_loaded_once_per_round_trip(
        client: redis.Redis, round_trips: list[int]) -> None:
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("warm", b"1", Release())
    client.script_flush()
    round_trips.clear()
    with store.pipeline() as pipe:
        inserted = [pipe.insert(f"run-{i}", b"1", Release()) for i in range(10)]
        reads = [pipe.get(f"run-{i}") for i in range(3)]
    # Then one SCRIPT LOAD per script (insert, get) and every call again.
    assert round_trips == [13, 15]
    assert all(p.result() == 1 for p in inserted)
    assert all(r.result().revision == 1 for r in reads)


@pytest.mark.server
def test_on_an_evicting_server_the_writes_are_refused_and_the_reads_answered(
        redis7: Server) -> None:
    admin = redis7.client()
    admin.config_set("maxmemory-policy", "allkeys-lru")
    try:
        store = RedisRunStore(redis7.client(), namespace=unique_namespace())
        with store.pipeline() as pipe:
            write = pipe.insert("a", b"1", Release())
            now = pipe.now()
            absent = pipe.get("a")
        with pytest.raises(Misconfigured):
            write.result()
        assert isinstance(now.result(), int)
        with pytest.raises(NotFound):
            absent.result()
    finally:
        admin.config_set("maxmemory-policy", "noeviction")


def test_a_node_a_patient_fan_cut_is_left_out_for_a_while_then_probed() -> None:
    from redisstore.core.driver import Driver, Pending
    from redisstore.core.groups import PROBE, SUSPECT_FOR, Group, Suspects
    from redisstore.core.runops import RunOps

    def groups() -> tuple[list[Group], list[Pending[Any]]]:
        pending = [Pending(Driver(RunOps("n", None, 1).get(f"r{i}"))) for i in range(3)]
        return [Group([p], None, node=n) for p, n in zip(pending, "abc", strict=True)], pending

    suspects = Suspects()
    sent, pending = groups()
    assert suspects.plan(sent, 0.5, 100.0) == (sent, [0.5, 0.5, 0.5])
    suspects.heard(sent, [False, True, False], 100.0)  # b was cut
    # Within SUSPECT_FOR, b is answered at once (not_applied), not sent.
    sent, pending = groups()
    send, graces = suspects.plan(sent, 0.5, 100.0 + SUSPECT_FOR / 2)
    assert [g.node for g in send] == ["a", "c"] and graces == [0.5, 0.5]
    with pytest.raises(Unavailable, match="left out of this call") as caught:
        pending[1].result()
    assert caught.value.outcome == "not_applied"
    # Then b is probed, waited for a shorter while; an answer clears it.
    sent, _ = groups()
    send, graces = suspects.plan(sent, 0.5, 100.0 + SUSPECT_FOR)
    assert send == sent and graces == [0.5, 0.5 * PROBE, 0.5]
    suspects.heard(send, [False, False, False], 100.0 + SUSPECT_FOR)
    sent, _ = groups()
    assert suspects.plan(sent, 0.5, 100.0 + SUSPECT_FOR) == (sent, [0.5, 0.5, 0.5])
    # Every node a suspect: the fan is sent whole, as if none were.
    suspects.heard(sent, [True, True, True], 200.0)
    sent, _ = groups()
    assert suspects.plan(sent, 0.5, 200.1) == (sent, [0.5, 0.5, 0.5])


def test_a_forked_child_makes_fan_threads_of_its_own() -> None:
    """The parent's fan threads are not in a forked child: work queued on its executor
    would wait for nobody."""
    import os

    from redisstore.shells import sync as transport

    parent = transport._fans()
    assert parent.submit(lambda: 1).result(timeout=5) == 1
    pid = os.fork()
    if pid == 0:  # the child
        ok = False
        try:
            fresh = transport._FANS is None and transport._fans() is not parent
            ok = fresh and transport._fans().submit(lambda: 2).result(timeout=5) == 2
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_cut_ends_a_group_whose_connect_hangs() -> None:
    """A node whose connects hang (its accept queue full: SYNs dropped, as a node hung long
    enough has) holds a patient fan's group only its grace, not the call's deadline: the
    watchdog cannot end a connect, so a cut caps it."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from redisstore.core.driver import Batch
    from redisstore.shells.sync import _SENDING, Cut, Transport

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # the queue is full now
            io = Transport(redis.Redis(port=port), timeout=3000)
            assert io._pool is not None
            pool = io._pool
            cut = Cut(connect_within=0.3)

            def send() -> Any:
                _SENDING.cut = cut
                try:
                    return io.exchange(pool, Batch(((b"PING",),), False), time.monotonic() + 3)
                finally:
                    _SENDING.cut = None

            with ThreadPoolExecutor(1) as threads:
                since = time.monotonic()
                sending = threads.submit(send)
                time.sleep(0.1)
                cut.fire("cut: no answer in time")
                got = sending.result(timeout=10)
                took = time.monotonic() - since
    assert got.lost is not None and got.lost.timed_out and not got.lost.sent
    assert got.lost.reason == "cut: no answer in time"
    assert took < 2, took  # the deadline was 3 s
