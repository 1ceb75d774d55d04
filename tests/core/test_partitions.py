"""Stores spread over partitions (``partitions=N``): where a run goes, the recorded count,
the refusals, fairness of claims across partitions. The conformance suites run on
partitioned stores too (test_conformance_runs, test_conformance_async, test_cluster)."""

from __future__ import annotations

import json
import random
import threading
import zlib
from collections import Counter
from typing import Any

import fakeredis
import old_layouts
import pytest
from servers import unique_namespace

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    Corrupt,
    Free,
    Held,
    Misconfigured,
    NotFound,
    RedisRunStore,
    Release,
    Unavailable,
)
from redisstore.core.keys import Keyspace, check_namespace
from redisstore.core.partitions import MAX_PARTITIONS, PartitionedOps, family_of, partition_of
from redisstore.discovery import json_wait

LONG = 600_000


def keys_of(client: Any) -> dict[bytes, Any]:
    """Every key and its dump: to show that nothing was written."""
    return {key: client.dump(key) for key in client.keys("*")}


def rec(wait: dict[str, Any] | None) -> bytes:
    return json.dumps({"wait": wait}).encode()


def test_a_family_is_the_first_braced_part_of_an_id_else_the_id() -> None:
    assert family_of("wf-1") == "wf-1"
    assert family_of("{wf-1}child-3") == "wf-1"
    assert family_of("step/{wf-1}/{x}") == "wf-1"
    assert family_of("{}a{b}") == "{}a{b}"  # an empty tag names no family, as in a cluster
    assert family_of("a{b") == "a{b"


def test_the_partition_is_crc32_of_the_family_modulo_the_count() -> None:
    # Stable across processes, versions and platforms: pinned values.
    assert partition_of("wf-1", 1) == 0
    assert partition_of("wf-1", 6) == zlib.crc32(b"wf-1") % 6
    assert partition_of("{wf-1}child", 6) == partition_of("wf-1", 6)
    spread = Counter(partition_of(f"run-{i}", 6) for i in range(6000))
    assert set(spread) == set(range(6)) and min(spread.values()) > 900


def test_the_partition_count_is_checked() -> None:
    client = fakeredis.FakeRedis()
    for bad in (0, -1, MAX_PARTITIONS + 1, "6", 2.0, True):
        with pytest.raises((TypeError, ValueError)):
            RedisRunStore(client, namespace="n", partitions=bad)  # type: ignore[arg-type]
    assert keys_of(client) == {}


def test_hash_signs_are_reserved_for_partitions() -> None:
    with pytest.raises(ValueError, match="#"):
        check_namespace("a#1")
    assert Keyspace("a", 3).prefix == "{a#3}:"
    assert Keyspace("a", 0).prefix == "{a#0}:"
    assert Keyspace("a").prefix == "{a}:"


def test_runs_spread_over_the_partitions_and_each_call_finds_its_own() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, partitions=6)
    runs = [f"run-{i}" for i in range(60)]
    for run in runs:
        store.insert(run, run.encode(), Claim("a", LONG))
    for run in runs:
        p = partition_of(run, 6)
        assert client.exists(Keyspace(ns, p).run(run)) == 1
        assert store.get(run).record == run.encode()
    tags = {key.split(b"}")[0] for key in client.keys(f"{{{ns}*")}
    assert len(tags) == 7  # 6 partitions, and the namespace's own meta key (the count)
    assert store.renew("a", reversed(runs), LONG) == list(reversed(runs))  # caller's order
    assert store.release("a", [*runs[::2], "absent"]) == runs[::2]
    assert sorted(store.claim_ready("b", LONG, 100)) == []


def test_the_count_is_recorded_and_another_is_refused_with_nothing_written() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    six = RedisRunStore(client, namespace=ns, partitions=6)
    six.insert("run", b"r", Release())
    assert client.hget(Keyspace(ns).meta, "partitions") == b"6"
    before = keys_of(client)
    for count in (1, 3):
        other = RedisRunStore(client, namespace=ns, partitions=count)
        with pytest.raises(Misconfigured, match="partitions=6"):
            other.insert("new", b"r", Release())
        with pytest.raises(Misconfigured, match="partitions=6"):  # reads too
            RedisRunStore(client, namespace=ns, partitions=count).get("run")
        with pytest.raises(Misconfigured, match="partitions=6"):
            other.claim_ready("a", LONG, 10)
    assert keys_of(client) == before
    assert RedisRunStore(client, namespace=ns, partitions=6).get("run").revision == 1


def test_a_namespace_in_use_by_one_partition_is_not_repartitioned_by_opening_it() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    RedisRunStore(client, namespace=ns).insert("run", b"r", Release())
    before = keys_of(client)
    with pytest.raises(Misconfigured, match="used by a store of one partition"):
        RedisRunStore(client, namespace=ns, partitions=4).get("run")
    assert keys_of(client) == before


@pytest.mark.parametrize("meta", [{"partitions": "x"}, {"partitions": "0"},
                                  {"partitions": "01"}, {"partitions": "257"}])
def test_a_damaged_count_is_corrupt_and_nothing_is_written(meta: dict[str, str]) -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    client.hset(Keyspace(ns).meta, mapping=meta)
    before = keys_of(client)
    for count in (1, 6):
        with pytest.raises(Corrupt):
            RedisRunStore(client, namespace=ns, partitions=count).insert("r", b"r", Release())
    client.delete(Keyspace(ns).meta)
    client.set(Keyspace(ns).meta, "not a hash")
    with pytest.raises(Corrupt):
        RedisRunStore(client, namespace=ns, partitions=6).get("r")
    assert set(keys_of(client)) == set(before)


def outbox(client: Any, ns: str, run: str) -> list[tuple[bytes, float]]:
    """The outbox of ``run``'s partition."""
    return client.zrange(Keyspace(ns, partition_of(run, 6)).prefix + "outbox", 0, -1,
                         withscores=True)


def test_a_dependency_across_partitions_is_watched_announced_delivered_and_acknowledged(
        ) -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=6)
    assert partition_of("dep", 6) != partition_of("run", 6)
    store.insert("dep", rec(None), Release())
    store.insert("run", rec({"changed": "dep", "seen": 1}), Release())
    d, w = Keyspace(ns, partition_of("dep", 6)), Keyspace(ns, partition_of("run", 6))
    assert set(client.hkeys(d.prefix + "watch:dep")) == {str(w.partition).encode()}
    # revision 1, as its watch read (version|watch number|dependency's partition)
    assert client.hget(w.prefix + "depv", "dep") == f"2|1|{d.partition}".encode()
    store.compare_and_set("dep", 1, rec(None), Release())
    assert outbox(client, ns, "dep") == [(f"{w.partition}|dep".encode(), 4.0)]
    assert store.claim_ready("a", LONG, 10) == ["run"]  # delivered, then claimed
    assert outbox(client, ns, "dep") == []
    assert client.hget(w.prefix + "depv", "dep") == f"4|1|{d.partition}".encode()


def test_a_crash_between_watch_and_write_leaves_a_watch_that_costs_nothing() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=6)
    store.insert("dep", rec(None), Release())
    ops = store._ops
    assert isinstance(ops, PartitionedOps)
    # The watch of "run" ran; its write never did (the node died between the two).
    assert store._io.drive(ops._watch("dep", partition_of("run", 6)))[0] == 2
    store.compare_and_set("dep", 1, rec(None), Release())
    assert store.claim_ready("a", LONG, 10) == []  # delivered to no waiter
    assert outbox(client, ns, "dep") == []
    store.insert("run", rec({"changed": "dep", "seen": 2}), Release())
    assert store.claim_ready("a", LONG, 10) == []
    store.compare_and_set("dep", 2, rec(None), Release())
    assert store.claim_ready("a", LONG, 10) == ["run"]


def test_a_crash_between_delivery_and_acknowledgement_delivers_again_harmlessly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from redisstore.core.driver import Call, ask
    from redisstore.core.runops import RunOps

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=6)
    store.insert("dep", rec(None), Release())
    store.insert("run", rec({"changed": "dep", "seen": 1}), Release())
    store.compare_and_set("dep", 1, rec(None), Release())
    real = RunOps.delivered

    def lost(self: RunOps, entries: list[tuple[str, int]], queue: str = "outbox") -> Any:
        yield from ask(Call(None, (self.keys.meta,), ("NO-SUCH-COMMAND",), lambda r: r))
        return 0

    monkeypatch.setattr(RunOps, "delivered", lost)
    assert store.claim_ready("a", LONG, 10) == ["run"]
    assert len(outbox(client, ns, "dep")) == 1  # delivered, not acknowledged
    # The engine handles the change and waits from revision 2 on.
    store.compare_and_set("run", 1, rec({"changed": "dep", "seen": 2}), Release())
    monkeypatch.setattr(RunOps, "delivered", real)
    assert store.claim_ready("b", LONG, 10) == []  # delivered again: nothing new
    assert outbox(client, ns, "dep") == []
    store.compare_and_set("dep", 2, rec(None), Release())
    assert store.claim_ready("b", LONG, 10) == ["run"]


def test_foreign_data_in_the_outbox_watch_and_mirror_is_never_a_wall() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=6)
    store.insert("dep", rec(None), Release())
    store.insert("run", rec({"changed": "dep", "seen": 1}), Release())
    d = Keyspace(ns, partition_of("dep", 6))
    w = Keyspace(ns, partition_of("run", 6))
    # 150 entries that name no partition of this store, ahead of the real one.
    client.zadd(d.prefix + "outbox", {f"junk-{i}": 0 for i in range(100)})
    client.zadd(d.prefix + "outbox", {f"99|x{i}": 1 for i in range(50)})
    client.hset(w.prefix + "depv", "other", "not a number")
    store.compare_and_set("dep", 1, rec(None), Release())
    got: list[str] = []
    for _ in range(3):
        got += store.claim_ready("a", LONG, 10)
    assert got == ["run"]
    assert outbox(client, ns, "dep") == []
    # A watch key of another type: set aside (quarantined), and the write announced to
    # every partition (tests/core/test_partitions_deps.py follows it further).
    client.delete(d.prefix + "watch:dep")
    client.set(d.prefix + "watch:dep", "x")
    store.compare_and_set("dep", 2, rec(None), Release())
    assert outbox(client, ns, "dep") == [(b"*|dep", 6.0)]
    assert ("damaged", "watch:dep") in {(q.index, q.run) for q in store.quarantined()}


def test_a_pipeline_of_partitions_takes_one_run_calls_and_refuses_the_others() -> None:
    store = RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace(), partitions=6)
    with store.pipeline() as pipe:
        inserted = [pipe.insert(f"run-{i}", b"r", Claim("a", LONG)) for i in range(12)]
        for call in (lambda: pipe.renew("a", ["run-1"], LONG),
                     lambda: pipe.release("a", ["run-1"]),
                     lambda: pipe.claim_ready("a", LONG, 1),
                     lambda: pipe.claim_expired("a", LONG, 1)):
            with pytest.raises(TypeError, match="one run"):
                call()
    assert [call.result() for call in inserted] == [1] * 12
    assert store.renew("a", [f"run-{i}" for i in range(12)], LONG) == [
        f"run-{i}" for i in range(12)]


def test_claims_take_work_in_due_order_across_partitions_under_a_skewed_load() -> None:
    # 100:1: a hot family of 1,000 runs beside 10 cold ones, due one ms apart, the cold
    # ones spread among the hot. A claim of 10 at a time takes them in due order: no cold
    # run waits for a hot run due after it (the starvation bound: the work due before it).
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace=unique_namespace(), discover=json_wait,
                          partitions=6)
    now = store.now()
    due: list[tuple[int, str]] = []
    for i in range(1010):
        run = f"{{cold}}c{i}" if i % 101 == 50 else f"{{hot}}h{i}"
        due.append((now - 2000 + i, run))
        store.insert(run, rec({"at": now - 2000 + i}), Release())
    assert partition_of("{cold}", 6) != partition_of("{hot}", 6)
    taken: list[str] = []
    while batch := store.claim_ready("a", LONG, 10):
        taken.extend(batch)
    assert taken == [run for _, run in sorted(due)]


def test_racing_claimers_starve_no_partition() -> None:
    # Two threads claim 10 at a time while the 100:1 load is due: every cold run is taken
    # within the claims of the runs due before it, give or take one round of each claimer.
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace=unique_namespace(), discover=json_wait,
                          partitions=6)
    now = store.now()
    rank: dict[str, int] = {}
    for i in range(1010):
        run = f"{{cold}}c{i}" if i % 101 == 50 else f"{{hot}}h{i}"
        rank[run] = i
        store.insert(run, rec({"at": now - 2000 + i}), Release())
    order: list[str] = []
    lock = threading.Lock()

    def claimer(owner: str) -> None:
        while batch := store.claim_ready(owner, LONG, 10):
            with lock:
                order.extend(batch)

    threads = [threading.Thread(target=claimer, args=(f"n{t}",)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(order) == sorted(rank)
    late = max(order.index(run) - rank[run] for run in rank if run.startswith("{cold}"))
    assert late <= 2 * 10, f"a cold run was taken {late} places after its due rank"


def test_an_async_store_of_partitions_shares_the_core() -> None:
    import asyncio

    async def main() -> list[str]:
        store = AsyncRedisRunStore(fakeredis.FakeAsyncRedis(), namespace=unique_namespace(),
                                   partitions=3)
        for i in range(9):
            await store.insert(f"run-{i}", b"r", Claim("a", 1))
        await asyncio.sleep(0.01)
        return await store.claim_expired("b", LONG, 100)

    assert sorted(asyncio.run(main())) == [f"run-{i}" for i in range(9)]


def test_the_acl_rule_of_a_store_of_partitions_names_every_partition() -> None:
    from redisstore.admin.security import acl_rule

    rule = acl_rule("t*a", partitions=3)
    assert rule.startswith(
        r"resetkeys ~{t\*a}:* ~{t\*a#0}:* ~{t\*a#1}:* ~{t\*a#2}:* resetchannels")
    assert "#3" not in rule
    assert acl_rule("t").startswith("resetkeys ~{t}:* resetchannels")
    with pytest.raises(ValueError):
        acl_rule("t", partitions=0)


def test_a_store_of_one_partition_that_checked_early_is_refused_once_partitions_are_recorded(
        ) -> None:
    # The store of one passes its first call on an empty namespace; a store of 6 then
    # records its count; the store of one's next write must not land beside the partitions.
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    one = RedisRunStore(client, namespace=ns)
    assert one.release("a", ["r0"]) == []
    six = RedisRunStore(client, namespace=ns, partitions=6)
    six.insert("r1", b"r", Claim("a", 1))
    before = keys_of(client)
    with pytest.raises(Misconfigured, match="partitions=6"):
        one.insert("r0", b"r", Claim("a", 1))
    with pytest.raises(Misconfigured, match="partitions=6"):
        one.claim_expired("b", LONG, 10)
    assert keys_of(client) == before


def test_a_partial_renew_or_release_is_of_unknown_outcome() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, partitions=3)
    runs = [f"r{i}" for i in range(12)]
    for run in runs:
        store.insert(run, b"r", Claim("w", LONG))
    broken = partition_of("r0", 3)
    newer = Keyspace(ns, broken).meta
    client.hdel(newer, "v5")
    client.hset(newer, "layout", 99)  # a newer library's layout (it reads no v5)
    only = [run for run in runs if partition_of(run, 3) == broken]
    for call in (lambda: store.renew("w", runs, LONG), lambda: store.release("w", runs)):
        with pytest.raises(Unavailable) as caught:
            call()
        assert caught.value.outcome == "unknown"
        assert isinstance(caught.value.__cause__, Misconfigured)
        # What the other partitions did, and which runs were not answered for.
        assert caught.value.unanswered == only
        assert caught.value.done == [run for run in runs if run not in only]
    client.hset(newer, mapping={"layout": 5, "v5": 1})
    freed = [run for run in runs if partition_of(run, 3) != broken]
    assert all(store.get(run).holder == Free() for run in freed)  # the others applied it
    client.hdel(newer, "v5")
    client.hset(newer, "layout", 99)
    with pytest.raises(Misconfigured):  # nothing applied anywhere: the answer itself
        store.release("w", only)


def test_a_renew_or_release_with_a_partition_unreachable_says_what_the_others_did() -> None:
    """Per-partition answers: the runs the answering partitions renewed (or released) in
    ``done``, the unreachable one's in ``unanswered``; a run they answered without is in
    neither. Nothing answered: the partition's own error, every run unanswered."""
    from redisstore.core.driver import Settled

    ops = PartitionedOps("n", None, 1, partitions=3)
    ops.counted = True
    runs = [f"r{i}" for i in range(12)]
    down = partition_of("r0", 3)
    gone = "r1" if partition_of("r1", 3) != down else "r2"

    def answer(op: Any) -> Settled[Any]:
        call = next(op)
        if call.keys[0].startswith(f"{{n#{down}}}"):
            return Settled(error=Unavailable("Connection refused", outcome="not_applied"))
        names = [run for run in runs if f"{{n#{partition_of(run, 3)}}}" == call.keys[0][:5]]
        return Settled([run for run in names if run != gone])

    for make in (lambda names: ops.renew("me", names, LONG),
                 lambda names: ops.release("me", names)):
        with pytest.raises(Unavailable) as caught:
            _drive(make(runs), answer)
        assert caught.value.outcome == "unknown"  # the others applied it
        assert caught.value.unanswered == [r for r in runs if partition_of(r, 3) == down]
        assert caught.value.done == [r for r in runs
                                     if partition_of(r, 3) != down and r != gone]
        only = [r for r in runs if partition_of(r, 3) == down]
        with pytest.raises(Unavailable) as caught:
            _drive(make(only), answer)
        assert caught.value.outcome == "not_applied"
        assert caught.value.done == [] and caught.value.unanswered == only
    assert Unavailable("x").done is None and Unavailable("x").unanswered is None


@pytest.mark.parametrize("partitions", [1, 3])
def test_get_many_answers_a_corrupt_run_as_corrupt_over_partitions_too(
        partitions: int) -> None:
    """get_many raises ``Corrupt`` for a run whose stored data fails its checks (its
    docstring, docs/contract.md): over partitions as on one. It is a read: no partition
    applied anything, so its outcome is never "unknown" (which asks the caller to read
    back a write that never was, and to retry a read that will fail the same way)."""
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, partitions=partitions)
    runs = [f"r{i}" for i in range(12)]
    for run in runs:
        store.insert(run, b"r", Release())
    client.set(Keyspace(ns, partition_of("r0", partitions) if partitions > 1 else None)
               .run("r0"), b"garbage")
    with pytest.raises(Corrupt) as one:
        store.get("r0")
    with pytest.raises(Corrupt) as many:
        store.get_many(runs)
    assert (many.value.run, many.value.field) == (one.value.run, one.value.field)


def _drive(spread: Any, answer: Any) -> Any:
    """Run a Spread by hand: ``answer(op)`` settles each operation of each fan."""
    steps, answers = spread.steps, None
    while True:
        try:
            fan = next(steps) if answers is None else steps.send(answers)
        except StopIteration as stop:
            return stop.value
        answers = [answer(op) for op in fan.ops]


def test_a_claim_whose_partition_may_have_run_is_of_unknown_outcome() -> None:
    from redisstore.core import partitions
    from redisstore.core.driver import Settled
    from redisstore.core.partitions import PartitionedOps

    ops = PartitionedOps("n", None, 1, partitions=3)
    ops.counted, ops.checks = True, {"eviction"}  # the checks passed

    def answer(op: Any) -> Settled[Any]:
        call = next(op)
        if call.script.name == "run_heads":
            p = int(call.keys[0].split("#")[1].split("}")[0])
            return Settled(([(p, f"r{p}")], False, -1, []))
        if call.keys[0].startswith("{n#1}"):
            return Settled(error=Unavailable("reply lost", outcome="unknown"))
        if call.keys[0].startswith("{n#2}"):
            return Settled(error=Unavailable("refused", outcome="not_applied"))
        return Settled((["r0"], -1))

    with pytest.raises(Unavailable) as caught:
        _drive(ops.claim_expired("me", LONG, 3), answer)
    assert caught.value.outcome == "unknown"

    def not_applied(op: Any) -> Settled[Any]:
        got = answer(op)
        if got.error is not None:
            return Settled(error=Unavailable("refused", outcome="not_applied"))
        return got

    # Partitions left out: a blocked claimer comes back for their runs soon, not at its
    # re-arm (10 s).
    assert _drive(ops.claim_expired("me", LONG, 3), not_applied) == (
        ["r0"], partitions.LEFT_OUT_RETRY)


def test_a_claim_without_an_unreachable_partition_warns_once_a_minute(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its runs wait while it is unreachable: someone must hear of it, but not once per
    claim (info between the warnings)."""
    import logging

    from redisstore.core import partitions
    from redisstore.core.driver import Settled

    ops = PartitionedOps("n", None, 1, partitions=2)
    ops.counted, ops.checks = True, {"eviction"}  # the checks passed

    def answer(op: Any) -> Settled[Any]:
        call = next(op)
        if call.keys[0].startswith("{n#1}"):
            return Settled(error=Unavailable("refused", outcome="not_applied"))
        if call.script.name == "run_heads":
            return Settled(([(0, "r0")], False, -1, []))
        return Settled((["r0"], -1))

    clock = [1000.0]
    monkeypatch.setattr(partitions.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="redisstore.core.partitions"):
        for step in (0, 1, 59, 61):
            clock[0] = 1000.0 + step
            assert _drive(ops.claim_expired("me", LONG, 3), answer) == (
                ["r0"], partitions.LEFT_OUT_RETRY)
    levels = [r.levelname for r in caplog.records if "went on without" in r.getMessage()]
    assert levels == ["WARNING", "INFO", "INFO", "WARNING"]


def test_a_claim_with_records_over_partitions_passes_the_budget_by_one_record_at_most(
        ) -> None:
    from redisstore.runs import MAX_CLAIM_BYTES

    store = RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace(), partitions=6)
    size = 1 << 20
    for i in range(12):
        store.insert(f"r{i}", bytes([i]) * size, Claim("dead", 1))
    import time

    time.sleep(0.01)
    got = store.claim_expired("me", LONG, 12, records=True)
    assert len(got) >= 1 and sum(len(c.current.record) for c in got) <= MAX_CLAIM_BYTES + size
    assert all(store.get(c.run).holder == Held("me", True) for c in got)
    rest: list[Any] = []
    while batch := store.claim_expired("me", LONG, 12, records=True):
        rest.extend(batch)
    assert sorted(c.run for c in got + rest) == sorted(f"r{i}" for i in range(12))


def test_a_pipeline_of_reads_checks_the_count_too() -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    RedisRunStore(client, namespace=ns).insert("r0", b"r", Release())
    store = RedisRunStore(client, namespace=ns, partitions=6)
    with store.pipeline() as pipe:
        got = pipe.get("r0")
    with pytest.raises(Misconfigured, match="used by a store of one partition"):
        got.result()


# ---------------------------------------------------------------------------- repartition


def fill_mixed(store: RedisRunStore) -> dict[str, bytes]:
    """Free, held, ready and waiting runs (waiters on a dependency of their family and of
    another); their records."""
    records: dict[str, bytes] = {}
    for i in range(12):
        record = rec({"at": 0} if i % 3 == 0 else None) + b" " * i
        store.insert(f"run-{i}", record, Claim("old", LONG) if i % 4 == 1 else Release())
        records[f"run-{i}"] = record
    store.insert("dep", rec(None), Release())
    records["dep"] = rec(None)
    for waiter, seen in (("{dep}near", 1), ("far", 1)):
        records[waiter] = rec({"changed": "dep", "seen": seen})
        store.insert(waiter, records[waiter], Release())
    return records


@pytest.mark.parametrize("counts", [(1, 6), (6, 3), (3, 1)])
def test_repartition_ends_the_stopped_engines_sessions_and_never_reuses_an_id(
        counts: tuple[int, int]) -> None:
    """The engines are stopped: their sessions' runs are freed by the moves, and the
    sessions themselves go with them, in every partition of either count (no record, no
    run set, no told list, no entry left, none listed); the ids go on from the highest
    given, never given again."""
    from redisstore import repartition

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    source, to = counts
    old = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=source)
    for i in range(20):
        old.insert(f"run-{i}", rec({"at": 0}), Release())
    first = old.open_session("old", LONG)
    second = old.open_session("old", LONG)
    assert len(second.claim(12)) == 12
    assert first.id != second.id
    old.close()
    repartition(client, ns, to, discover=json_wait)
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=to)
    assert store.sessions() == []
    kinds = (b":sessions", b":session-leases", b":s:", b":st:")
    left = sorted(k for k in client.scan_iter(match=f"{{{ns}*")
                  if any(kind in k for kind in kinds))
    assert left == []
    assert int(store.open_session("new", LONG).id) == int(second.id) + 1
    assert len(store.claim("new", LONG, 20)) == 20
    store.close()


@pytest.mark.parametrize("counts", [(1, 6), (6, 3), (3, 1)])
def test_repartition_moves_every_run_keeps_its_record_and_fences_its_revision(
        counts: tuple[int, int]) -> None:
    from redisstore import repartition

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    source, to = counts
    old = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=source)
    old.migrate()
    records = fill_mixed(old)
    revisions = {run: old.get(run).revision for run in records}
    done = repartition(client, ns, to, discover=json_wait)
    assert (done.before, done.after, done.damaged) == (source, to, 0)
    assert done.moved + done.rewritten == len(records)
    assert done.moved > 0
    with pytest.raises(Misconfigured, match=f"partitions={to}"):
        RedisRunStore(client, namespace=ns, partitions=source, discover=json_wait).get("dep")
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=to)
    for run, record in records.items():
        current = store.get(run)
        assert current.record == record and current.revision > revisions[run]
        assert current.holder == Free()  # the engines were stopped: leases dropped
    claimed = set(store.claim_ready("new", LONG, 100))
    assert {f"run-{i}" for i in range(0, 12, 3)} <= claimed
    for waiter in ("{dep}near", "far"):  # waiters may wake once: their dependency moved
        if waiter in claimed:
            store.compare_and_set(waiter, store.get(waiter).revision,
                                  rec({"changed": "dep", "seen": store.get("dep").revision}),
                                  Release())
    assert store.claim_ready("new", LONG, 100) == []
    store.compare_and_set("dep", store.get("dep").revision, rec(None), Release())
    assert sorted(store.claim_ready("new", LONG, 100)) == ["far", "{dep}near"]
    assert repartition(client, ns, to, discover=json_wait).moved == 0  # already there


def test_repartition_stopped_halfway_finishes_when_run_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from redisstore import repartition
    from redisstore.core.runops import RunOps

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    old = RedisRunStore(client, namespace=ns, discover=json_wait)
    old.migrate()
    records = fill_mixed(old)
    real, calls = RunOps.delete, []

    def dies(self: RunOps, run: str, expected: int, lease: Any) -> Any:
        calls.append(run)
        if len(calls) == 4:  # inserted in its new partition, not yet deleted: the crash
            raise KeyboardInterrupt
        return real(self, run, expected, lease)

    monkeypatch.setattr(RunOps, "delete", dies)
    with pytest.raises(KeyboardInterrupt):
        repartition(client, ns, 4, discover=json_wait)
    monkeypatch.setattr(RunOps, "delete", real)
    with pytest.raises(Misconfigured, match="being repartitioned"):
        RedisRunStore(client, namespace=ns, discover=json_wait, partitions=4).get("dep")
    with pytest.raises(Misconfigured, match="from 1 to 4"):  # not another count halfway
        repartition(client, ns, 1, discover=json_wait)
    done = repartition(client, ns, 4, discover=json_wait)
    assert done.before == 1 and done.after == 4
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=4)
    for run, record in records.items():
        assert store.get(run).record == record
    keys = [k for k in client.keys(f"{{{ns}}}:r:*")] + [k for k in client.keys(f"{{{ns}#*}}:r:*")]
    assert len(keys) == len(records)  # each run once


# ---------------------------------------------------------------------------- the reference


def _wait_rec(dep: str | None, seen: int | None) -> bytes:
    wait = None if dep is None else {"changed": dep, **({} if seen is None else {"seen": seen})}
    return json.dumps({"wait": wait}).encode()


def _step(store: Any, op: tuple[Any, ...]) -> Any:
    """One step of a history, on a partitioned store or the memory reference alike."""
    from redisstore import Seize

    def current(run: str) -> Any:
        try:
            return store.get(run)
        except NotFound:
            return None

    kind = op[0]
    if kind == "write":
        _, run, dep, mode, lease = op
        seen = None
        if dep is not None and mode != "unseen":
            there = current(dep)
            seen = (there.revision if there else 0) if mode == "current" else 10**9
        record = _wait_rec(dep, seen)
        condition = Release() if lease == "release" else Seize("x", LONG)
        now = current(run)
        if now is None:
            store.insert(run, record, condition)
        else:
            store.compare_and_set(run, now.revision, record, condition)
    elif kind == "delete":
        now = current(op[1])
        if now is not None:
            store.delete(op[1], now.revision, Release())
    elif kind == "refresh":
        if current(op[1]) is not None:
            store.refresh(op[1])
    elif kind == "release":
        store.release("x", [op[1]])
    else:
        got = sorted(store.claim_ready("o", LONG, 100))
        store.release("o", got)
        return got
    return None


@pytest.mark.parametrize("seed", range(60))
def test_dependencies_across_partitions_answer_as_the_memory_reference(seed: int) -> None:
    """Random histories of writes (waiting on runs of this partition or another, seen or
    not), deletes, refreshes, releases and claims: the store of 3 partitions claims what
    the memory reference claims, step by step."""
    from redisstore import MemoryRunStore

    rng = random.Random(seed)
    store = RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace(),
                          discover=json_wait, partitions=3)
    store.migrate()
    reference = MemoryRunStore(discover=json_wait)
    runs = ["a", "b", "c", "{a}x", "{b}y", "d", "e"]
    history: list[tuple[Any, ...]] = []
    for _ in range(60):
        k = rng.random()
        op: tuple[Any, ...]
        if k < 0.45:
            op = ("write", rng.choice(runs), rng.choice([*runs, None]),
                  rng.choice(["current", "current", "unseen", "ahead"]),
                  rng.choice(["release"] * 3 + ["seize"]))
        elif k < 0.6:
            op = ("delete", rng.choice(runs))
        elif k < 0.7:
            op = ("refresh", rng.choice(runs))
        elif k < 0.75:
            op = ("release", rng.choice(runs))
        else:
            op = ("claim",)
        history.append(op)
        assert _step(store, op) == _step(reference, op), history


def _stuck_outbox(client: Any, ns: str, entries: dict[str, float]) -> Keyspace:
    """Entries in partition 0's outbox; partition 1's fanout of another type, so that any
    delivery to it fails (as to a partition whose node is down)."""
    home = Keyspace(ns, 0)
    client.zadd(home.prefix + "outbox", entries)
    client.set(Keyspace(ns, 1).fanout, "not a sorted set")
    return home


@pytest.mark.parametrize("kind", ["undeliverable", "no version"])
def test_outbox_entries_that_stay_or_are_foreign_never_hide_a_delivery(kind: str) -> None:
    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    store = RedisRunStore(client, namespace=ns, discover=json_wait, partitions=3)
    dep = next(f"e{i}" for i in range(100) if partition_of(f"e{i}", 3) == 0)
    waiter = next(f"w{i}" for i in range(100) if partition_of(f"w{i}", 3) == 2)
    store.insert(dep, rec(None), Release())
    store.insert(waiter, rec({"changed": dep, "seen": 1}), Release())
    stuck = {f"1|x{i}": 4.0 for i in range(150)} if kind == "undeliverable" else {
        f"2|x{i}": score for i, score in enumerate([-1.0, 0.5, 2.0**60] * 50)}
    home = _stuck_outbox(client, ns, stuck)
    store.compare_and_set(dep, 1, rec(None), Release())
    got: list[str] = []
    for _ in range(20):  # 100 of 151 entries at random per claim
        got += store.claim_ready("a", LONG, 10)
        if got:
            break
    assert got == [waiter]
    left = {m.decode() for m in client.zrange(home.prefix + "outbox", 0, -1)}
    assert f"2|{dep}" not in left
    if kind == "no version":
        for _ in range(5):
            store.claim_ready("a", LONG, 10)
        assert client.zcard(home.prefix + "outbox") == 0  # removed, never a wall


def test_a_new_namespace_of_partitions_migrates_without_scanning_the_server() -> None:
    """A new namespace starts at layout 5: it has nothing of an older layout to find, so
    its migration is one step however many keys the server holds, with partitions or
    without (a namespace an older library started at layout 1 must SCAN for its runs)."""
    client = fakeredis.FakeRedis()
    client.mset({f"foreign:{i}": b"x" for i in range(3000)})
    assert RedisRunStore(client, namespace=unique_namespace(), partitions=4).migrate().steps == 1
    assert RedisRunStore(client, namespace=unique_namespace()).migrate().steps == 1
    old = unique_namespace()
    old_layouts.write(client, old, 1, {"run": old_layouts.OldRun(record=b"r")})
    assert RedisRunStore(client, namespace=old).migrate().steps > 10


def test_a_migration_of_partitions_is_a_call_per_step_each_with_its_deadline() -> None:
    """Partitions an older library left at layout 4 are migrated in bounded steps, each
    one call (its own deadline): a big database is many calls, not one that runs out of
    time."""
    client = fakeredis.FakeRedis()
    client.mset({f"foreign:{i}": b"x" for i in range(3000)})
    ns = unique_namespace()
    runs = {f"run{i}": old_layouts.OldRun(record=b"r%d" % i) for i in range(4)}
    old_layouts.write_partitioned(client, ns, 4, runs, 2)
    store = RedisRunStore(client, namespace=ns, partitions=2)
    with pytest.raises(Misconfigured, match="migrate"):
        store.get("run0")
    calls: list[int] = []
    real = store._io.drive

    def drive(op: Any) -> Any:
        calls.append(1)
        return real(op)

    store._io.drive = drive  # type: ignore[method-assign]
    done = store.migrate()
    store._io.drive = real  # type: ignore[method-assign]
    assert done.steps > 10 and len(calls) == done.steps and done.moved == 4
    for p in range(2):
        assert client.hget(Keyspace(ns, partition=p).meta, "layout") == b"5"
    assert {run: store.get(run).record for run in runs} == {
        run: old.record for run, old in runs.items()}
    assert store.migrate().steps == 1  # done: one call answers at once


@pytest.mark.parametrize("held", [True, False])
def test_a_run_moved_by_repartition_never_gives_a_grant_token_again(held: bool) -> None:
    """A zombie of an old grant (owner, token) must never see that token given again in the
    run's new partition: the floor there rises to the run's last token, read from its
    header when it is free (get names the token of a held run only)."""
    from redisstore import Fenced, LeaseRefused, repartition

    client = fakeredis.FakeRedis()
    ns = unique_namespace()
    old = RedisRunStore(client, namespace=ns)
    old.insert("run", b"r", Claim("a", LONG))
    for rev in (1, 2):  # grants 2 and 3, by the same owner
        old.compare_and_set("run", rev, b"r", Claim("a", LONG))
    assert old.get("run").token == 3
    if not held:
        old.release("a", ["run"])
    repartition(client, ns, 3)
    new = RedisRunStore(client, namespace=ns, partitions=3)
    current = new.get("run")
    new.compare_and_set("run", current.revision, b"r", Claim("a", LONG))
    assert (new.get("run").token or 0) > 3
    with pytest.raises(LeaseRefused):  # the zombie of grant 3
        new.compare_and_set("run", current.revision + 1, b"z", Fenced("a", 3))
