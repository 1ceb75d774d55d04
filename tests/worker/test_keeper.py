"""Lease keepers (redisstore.engine.keeper): renewal in batches on connections of their own, the
``valid`` bound, every loss reported, no renewal after a loss; under the fault proxy (cut,
hung and delayed replies, a partition) on Redis 7 and Valkey 8."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from faultproxy import FaultProxy
from servers import Server, unique_namespace

from redisstore import (
    AsyncKeeper,
    AsyncRedisRunStore,
    Claim,
    Closed,
    Free,
    Held,
    Keeper,
    Lost,
    MemoryRunStore,
    RedisRunStore,
    Seize,
    StoreError,
    Unavailable,
)
from redisstore.engine.keeper import DEADLINE, NOT_RENEWED, STOPPED
from redisstore.runs import MAX_RENEW
from redisstore.shells.sync import pool_for

# serial: renewals on a timer, under faults
pytestmark = pytest.mark.serial

TTL = 600


class Counting(MemoryRunStore):
    """A memory store that counts renew calls and their sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: list[int] = []

    def renew(self, owner: str, runs: Any, ttl: int) -> list[str]:
        names = list(runs)
        self.renewals.append(len(names))
        return super().renew(owner, names, ttl)


def take(store: Any, keeper: Keeper, run: str, ttl: int = TTL) -> None:
    since = time.monotonic()
    store.insert(run, b"r", Claim(keeper.owner, ttl))
    keeper.add(run, since=since)


def test_a_keeper_keeps_leases_live_past_many_ttls_in_capped_batches() -> None:
    store = Counting()
    lost: list[Lost] = []
    with Keeper(store, "me", TTL, on_lost=lost.append) as keeper:
        for i in range(MAX_RENEW + 10):
            take(store, keeper, f"r{i}")
        time.sleep(TTL * 2.5 / 1000)
        assert all(store.get(f"r{i}").holder == Held("me", True)
                   for i in range(MAX_RENEW + 10))
        assert all(keeper.valid(f"r{i}") for i in range(MAX_RENEW + 10))
        assert lost == []
    # Every round is two calls, the first at the cap.
    assert store.renewals and set(store.renewals[::2]) == {MAX_RENEW}
    assert set(store.renewals[1::2]) == {10}


def test_valid_waits_for_a_first_confirmation_without_since() -> None:
    store = MemoryRunStore()
    with Keeper(store, "me", TTL) as keeper:
        store.insert("run", b"r", Claim("me", TTL))
        keeper.add("run")
        assert not keeper.valid("run")  # not certain until the keeper's own renewal
        deadline = time.monotonic() + 1
        while not keeper.valid("run") and time.monotonic() < deadline:
            time.sleep(0.005)
        assert keeper.valid("run")


def test_a_run_taken_by_another_owner_is_reported_once_and_never_renewed_again() -> None:
    store = MemoryRunStore()
    lost: list[Lost] = []
    with Keeper(store, "me", TTL, on_lost=lost.append) as keeper:
        take(store, keeper, "run")
        take(store, keeper, "other-run")
        store.compare_and_set("run", 1, b"r2", Seize("thief", 60_000))
        time.sleep(TTL / 1000)
        assert lost == [Lost("run", NOT_RENEWED)]
        assert not keeper.valid("run") and keeper.runs == ["other-run"]
        assert store.get("run").holder == Held("thief", True)


def test_a_discarded_run_runs_out_and_close_can_release_the_rest() -> None:
    store = MemoryRunStore()
    keeper = Keeper(store, "me", TTL)
    take(store, keeper, "kept")
    take(store, keeper, "dropped", ttl=100)
    keeper.discard("dropped")
    time.sleep(0.3)
    assert store.get("dropped").holder == Held("me", False)
    assert keeper.release(["nothing"]) == []
    keeper.close(release=True)
    assert store.get("kept").holder.__class__.__name__ == "Free"
    with pytest.raises(StoreError, match="closed"):  # a StoreError (Closed), as every answer
        keeper.add("kept")
    keeper.close()  # idempotent


def test_a_keeper_that_dies_reports_every_run_and_raises() -> None:
    class Broken(MemoryRunStore):
        def renew(self, owner: str, runs: Any, ttl: int) -> list[str]:
            raise KeyError("a bug")

    store = Broken()
    lost: list[Lost] = []
    keeper = Keeper(store, "me", TTL, on_lost=lost.append)
    take(store, keeper, "a")
    take(store, keeper, "b")
    deadline = time.monotonic() + 2
    while keeper.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(keeper.failure, KeyError)
    assert sorted(lost, key=lambda item: item.run) == [Lost("a", STOPPED), Lost("b", STOPPED)]
    assert not keeper.valid("a")
    with pytest.raises(Closed, match="stopped") as stopped:
        keeper.add("c")
    assert isinstance(stopped.value.__cause__, KeyError)
    keeper.close()


# The keeper's first round loads its scripts on connections of its own (a fresh fakeredis
# connection compiles them); a ttl of 300 ms left too little room for that on a loaded
# machine, so the starvation tests give each round 900 ms and block for three ttls.
STARVED_TTL = 900


@pytest.mark.server
def test_a_saturated_store_pool_does_not_starve_the_keeper(redis7: Server) -> None:
    client = redis.Redis(connection_pool=redis.BlockingConnectionPool(
        host="127.0.0.1", port=redis7.port, max_connections=1))
    store = RedisRunStore(client, namespace=unique_namespace())
    lost: list[Lost] = []
    with Keeper(store, "me", STARVED_TTL, on_lost=lost.append) as keeper:
        take(store, keeper, "run", ttl=STARVED_TTL)
        pool = pool_for(client.connection_pool)
        held, _ = pool.acquire(time.monotonic() + 1)  # the store's only connection, busy
        try:
            time.sleep(3 * STARVED_TTL / 1000)
            assert keeper.valid("run") and lost == []
        finally:
            pool.release(held)
        assert store.get("run").holder == Held("me", True)


def test_an_async_keeper_is_not_starved_by_a_busy_event_loop() -> None:
    async def main() -> None:
        store = AsyncRedisRunStore(fakeredis.FakeAsyncRedis(), namespace=unique_namespace())
        lost: list[Lost] = []
        async with AsyncKeeper(store, "me", STARVED_TTL, on_lost=lost.append) as keeper:
            since = time.monotonic()
            await store.insert("run", b"r", Claim("me", STARVED_TTL))
            await store.insert("stolen", b"r", Claim("me", STARVED_TTL))
            keeper.add_all(["run", "stolen"], since=since)
            time.sleep(3 * STARVED_TTL / 1000)  # the caller's loop blocked for three ttls
            assert keeper.valid("run")
            assert (await store.get("run")).holder == Held("me", True)
            await store.compare_and_set("stolen", 1, b"x", Seize("thief", 60_000))
            waited = time.monotonic() + 3 * STARVED_TTL / 1000
            while not lost and time.monotonic() < waited:
                await asyncio.sleep(0.01)
            assert lost == [Lost("stolen", NOT_RENEWED)]  # delivered on this loop
            assert await keeper.arelease(["run"]) == ["run"]
        assert keeper.runs == []

    asyncio.run(main())


def test_bad_arguments() -> None:
    store = MemoryRunStore()
    for make in (lambda: Keeper(store, "", TTL), lambda: Keeper(store, "me", 0),
                 lambda: Keeper(store, "me", TTL, margin=TTL),
                 lambda: Keeper(store, "me", TTL, renew_every=0)):
        with pytest.raises((ValueError, TypeError)):
            make()
    with Keeper(store, "me", TTL) as keeper, pytest.raises((ValueError, TypeError)):
        keeper.add("")


# ---------------------------------------------------------------------------- faults


@pytest.fixture(params=["redis7", "valkey8"])
def server(request: pytest.FixtureRequest) -> Server:
    fixture: Server = request.getfixturevalue(request.param)
    return fixture


@pytest.fixture
def proxy(server: Server) -> Iterator[FaultProxy]:
    with FaultProxy(server.port) as p:
        yield p


class Watch:
    """Samples, every 2 ms, the server's view of the lease (read first, directly) and then
    the keeper's ``valid``: a keeper that calls a lease valid after the server saw it
    expired is wrong."""

    def __init__(self, direct: RedisRunStore, keeper: Keeper, run: str) -> None:
        self.direct, self.keeper, self.run = direct, keeper, run
        self.violations: list[str] = []
        self.invalid_at: float | None = None
        self.expired_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            live = self.direct.get(self.run).holder == Held(self.keeper.owner, True)
            valid = self.keeper.valid(self.run)
            now = time.monotonic()
            if not live and self.expired_at is None:
                self.expired_at = now
            if not valid and self.invalid_at is None:
                self.invalid_at = now
            if valid and not live:
                self.violations.append(f"valid at {now} though the server saw it expired")
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def watched(proxy: FaultProxy, server: Server, ttl: int
            ) -> Iterator[tuple[RedisRunStore, Keeper, list[Lost], Watch]]:
    """A keeper holding "run" through the proxy, watched; stopped and closed afterwards."""
    namespace = unique_namespace()
    direct = RedisRunStore(server.client(), namespace=namespace)
    store = RedisRunStore(redis.Redis(host=proxy.host, port=proxy.port), namespace=namespace)
    lost: list[Lost] = []
    keeper = Keeper(store, "me", ttl, on_lost=lost.append)
    take(direct, keeper, "run", ttl)
    watch = Watch(direct, keeper, "run")
    try:
        yield direct, keeper, lost, watch
    finally:
        watch.stop()
        keeper.close()


@pytest.mark.server
@pytest.mark.parametrize("fault", ["partition", "hung replies"])
def test_a_lease_the_keeper_cannot_renew_is_reported_before_it_runs_out(
        fault: str, proxy: FaultProxy, server: Server) -> None:
    with watched(proxy, server, TTL) as (direct, keeper, lost, watch):
        time.sleep(TTL / 1000)  # a few good rounds first
        assert keeper.valid("run") and lost == []
        if fault == "partition":
            proxy.refuse(True)
            proxy.cut_all()
        else:
            proxy.drop_replies(10_000, hang=True)
        deadline = time.monotonic() + 3 * TTL / 1000
        while not lost and time.monotonic() < deadline:
            time.sleep(0.005)
        assert lost == [Lost("run", DEADLINE)]
        time.sleep(TTL * 1.5 / 1000)
        watch.stop()
        assert watch.violations == []
        assert watch.invalid_at is not None and watch.expired_at is not None
        assert watch.invalid_at <= watch.expired_at  # reported before it could run out
        # Healed: the keeper never renews a lease it gave up.
        proxy.refuse(False)
        proxy.pass_through()
        proxy.cut_all()
        time.sleep(TTL / 1000)
        assert direct.get("run").holder == Held("me", False)
        assert direct.claim_expired("other", 60_000, 10) == ["run"]


@pytest.mark.server
@pytest.mark.parametrize("fault", ["delayed replies", "cut connections"])
def test_a_keeper_rides_out_slow_and_cut_connections(
        fault: str, proxy: FaultProxy, server: Server) -> None:
    with watched(proxy, server, TTL) as (direct, keeper, lost, watch):
        if fault == "delayed replies":
            proxy.set_delay(TTL / 20 / 1000)  # each reply; a new connection takes four
            time.sleep(3 * TTL / 1000)
        else:
            for _ in range(15):  # every connection cut, ten times a ttl
                proxy.cut_all()
                time.sleep(TTL / 10 / 1000)
        watch.stop()
        assert lost == [] and watch.violations == []
        assert keeper.valid("run")
        assert direct.get("run").holder == Held("me", True)


@pytest.mark.server
def test_after_a_lost_renewal_reply_the_keeper_resends_at_once(
        proxy: FaultProxy, server: Server) -> None:
    with watched(proxy, server, TTL) as (direct, keeper, lost, watch):
        time.sleep(TTL / 1000 / 2)
        proxy.drop_replies(1)  # the next renewal runs, its reply is lost: unknown
        assert proxy.wait_dropped(1)
        time.sleep(TTL / 1000)
        watch.stop()
        assert lost == [] and watch.violations == [] and keeper.valid("run")
        assert direct.get("run").holder == Held("me", True)


def test_unavailable_is_what_a_renewal_fails_with() -> None:
    """The keeper's retry rule rests on this: a store call that cannot reach the server
    raises Unavailable, never something the keeper would take for a bug."""
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.05)
    store = RedisRunStore(client, namespace=unique_namespace(), timeout=200)
    with pytest.raises(Unavailable):
        store.renew("me", ["run"], TTL)


# ---------------------------------------------------------------------------- races


class Gated(MemoryRunStore):
    """A memory store whose first renewal waits, after running, until the test lets its
    reply go (``gate``), and whose second waits for ``gate2``: slow replies, as the keeper
    sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.gate2 = threading.Event(), threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def renew(self, owner: str, runs: Any, ttl: int) -> list[str]:
        renewed = super().renew(owner, runs, ttl)
        self.calls += 1
        self.entered.set()
        (self.gate if self.calls == 1 else self.gate2).wait(5)
        return renewed


@pytest.mark.parametrize("second_since", [True, False])
def test_a_late_reply_never_counts_for_the_run_taken_again(second_since: bool) -> None:
    """A renewal in flight while the run is released, taken by another owner and back, and
    added again: its reply belongs to the earlier entry, never to the new one."""
    store = Gated()
    lost: list[Lost] = []
    with Keeper(store, "me", TTL, on_lost=lost.append) as keeper:
        store.insert("run", b"r", Claim("me", TTL))
        keeper.add("run")  # renewed at once: the reply is held at the gate
        assert store.entered.wait(2)
        store.release("me", ["run"])
        keeper.discard("run")
        store.compare_and_set("run", 1, b"b", Seize("b", TTL))
        store.release("b", ["run"])
        since = time.monotonic()
        store.compare_and_set("run", 2, b"me again", Claim("me", TTL))
        keeper.add("run", since=since if second_since else None)
        store.gate.set()  # the old reply ("renewed") arrives now
        time.sleep(0.05)  # without since, the new entry's own renewal is held at gate2
        assert keeper.valid("run") is second_since  # counted from its own since only
        store.gate2.set()
        time.sleep(TTL * 1.5 / 1000)
        assert lost == [] and keeper.valid("run")
        assert store.get("run").holder == Held("me", True)


def test_a_reply_for_an_earlier_entry_does_not_drop_the_new_one() -> None:
    store = Gated()
    lost: list[Lost] = []
    with Keeper(store, "me", TTL, on_lost=lost.append) as keeper:
        store.insert("run", b"r", Claim("me", TTL))
        keeper.release(["run"])  # freed, not kept
        keeper.add("run")  # its renewal runs on a free run: "not renewed" for this entry
        assert store.entered.wait(2)
        since = time.monotonic()
        store.compare_and_set("run", 1, b"again", Claim("me", TTL))
        keeper.add("run", since=since)  # a new entry while that reply is held
        store.gate.set()
        store.gate2.set()
        time.sleep(TTL * 1.5 / 1000)
        assert lost == [] and keeper.valid("run")


def test_losses_of_a_round_are_reported_when_the_keeper_dies_in_it() -> None:
    class Dies(MemoryRunStore):
        calls = 0

        def renew(self, owner: str, runs: Any, ttl: int) -> list[str]:
            Dies.calls += 1
            if Dies.calls == 2:
                raise KeyError("a bug in the second batch")
            return [r for r in super().renew(owner, runs, ttl) if r != "r0"]

    store = Dies()
    lost: list[Lost] = []
    keeper = Keeper(store, "me", TTL, on_lost=lost.append)
    since = time.monotonic()
    for i in range(MAX_RENEW + 50):
        store.insert(f"r{i}", b"r", Claim("me", TTL))
    keeper.add_all([f"r{i}" for i in range(MAX_RENEW + 50)], since=since)
    keeper.add("r0")  # a renewal round at once
    deadline = time.monotonic() + 2
    while keeper.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    keeper.close()
    assert Lost("r0", NOT_RENEWED) in lost
    assert sorted(item.run for item in lost) == sorted(f"r{i}" for i in range(MAX_RENEW + 50))


def test_close_from_on_lost_ends_the_keeper_and_releases() -> None:
    store = MemoryRunStore()
    holder: list[Keeper] = []
    keeper = Keeper(store, "me", TTL, on_lost=lambda lost: holder[0].close(release=True))
    holder.append(keeper)
    take(store, keeper, "kept")
    store.insert("stolen", b"r", Claim("thief", 60_000))
    keeper.add("stolen")
    keeper._thread.join(2)
    assert not keeper._thread.is_alive()
    assert store.get("kept").holder.__class__.__name__ == "Free"
    keeper.close()


def test_since_must_be_a_past_monotonic_reading_and_an_old_one_renews_at_once() -> None:
    store = Counting()
    with Keeper(store, "me", TTL) as keeper:
        with pytest.raises(ValueError):
            keeper.add("run", since=time.monotonic() + 5)
        with pytest.raises(ValueError):
            keeper.add("run", since=time.time())
        old = time.monotonic() - 0.3  # the taking call's reply came back late
        store.insert("run", b"r", Claim("me", TTL))
        keeper.add("run", since=old)
        time.sleep(0.05)
        assert store.renewals == [1]  # renewed at once, not renew_every after add


def test_an_async_keeper_refuses_to_block_its_callers_loop() -> None:
    async def main() -> None:
        store = AsyncRedisRunStore(fakeredis.FakeAsyncRedis(), namespace=unique_namespace())
        keeper = AsyncKeeper(store, "me", TTL)
        with pytest.raises(RuntimeError, match="arelease"):
            keeper.release(["x"])
        with pytest.raises(RuntimeError, match="aclose"):
            keeper.close()
        with pytest.raises(TypeError), keeper:
            pass
        await keeper.aclose()

    asyncio.run(main())


class PartlyDown(MemoryRunStore):
    """A memory store whose runs in ``down`` are in a failed partition: a renewal that
    names them raises as a store of partitions does (``Unavailable``, what the answering
    partitions did in ``done``, the failed one's runs in ``unanswered``); every call is
    recorded (its time and runs)."""

    def __init__(self, down: set[str]) -> None:
        super().__init__()
        self.down = down
        self.calls: list[tuple[float, list[str]]] = []

    def renew(self, owner: str, runs: Any, ttl: int) -> list[str]:
        names = list(runs)
        self.calls.append((time.monotonic(), names))
        dead = [run for run in names if run in self.down]
        alive = [run for run in names if run not in self.down]
        done = super().renew(owner, alive, ttl) if alive else []
        if not dead:
            return done
        error = Unavailable("1 of the call's partitions failed",
                            outcome="unknown" if alive else "not_applied")
        error.done, error.unanswered = done, dead
        raise error


@pytest.mark.parametrize("heals", [False, True])
def test_a_failed_partition_costs_only_its_runs_and_its_retries_back_off(
        heals: bool) -> None:
    """The runs the answering partitions renewed count as renewed; only the failed
    partition's runs are tried again, after 0 (unknown), 50, 100, 200 ms... at most a period
    apart, never in a loop; they are lost at their own bound, unless the partition comes
    back before it."""
    down = {"d0", "d1"}
    store = PartlyDown(down)
    lost: list[tuple[float, Lost]] = []
    with Keeper(store, "me", TTL, on_lost=lambda item: lost.append((time.monotonic(), item))
                ) as keeper:
        for run in ["d0", "h0", "d1", "h1", "h2"]:
            take(store, keeper, run)
        time.sleep(0.05)
        began = time.monotonic()
        store.calls.clear()
        if heals:
            time.sleep(TTL / 1000 / 2)
            down.clear()
        time.sleep(TTL * 2 / 1000)
        calls = list(store.calls)
        assert all(keeper.valid(run) for run in ["h0", "h1", "h2"])
        assert all(store.get(run).holder == Held("me", True) for run in ["h0", "h1", "h2"])
        if heals:
            assert lost == [] and keeper.valid("d0") and keeper.valid("d1")
        else:
            assert sorted(item.run for _, item in lost) == ["d0", "d1"]
            assert {item.reason for _, item in lost} == {DEADLINE}
            bound = (TTL - keeper.margin - keeper.renew_every) / 1000
            assert all(at >= began + bound for at, _ in lost)
    retries = [at for at, names in calls if set(names) <= down]
    gaps = [b - a for a, b in itertools.pairwise(retries)]
    # 2 ttls of 200 ms periods: 6 rounds or so, a few retries between them.
    assert len(calls) <= 20, calls
    assert all(gap >= 0.045 for gap in gaps[1:]), gaps  # the first resend may go at once


class OneHung(MemoryRunStore):
    """A memory store of 3 partitions (run ``p<k>-<i>`` is in partition k) whose partition
    1 hangs: a renewal naming its runs renews the others at once and answers after a
    period (its deadline), as a store of partitions with a hung node does."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def _place(self, run: str) -> int:
        return int(run.split("-")[0][1:])

    def renew(self, owner: str, runs: Any, ttl: int) -> list[str]:
        names = list(runs)
        dead = [run for run in names if self._place(run) == 1]
        done = super().renew(owner, [run for run in names if run not in dead], ttl)
        if not dead:
            return done
        time.sleep(self.delay)
        error = Unavailable("1 of the call's partitions failed (deadline of 200 ms exceeded)")
        error.done, error.unanswered = done, dead
        raise error


def test_a_hung_partition_holds_up_one_batch_of_a_round_not_every_batch() -> None:
    """Four batches, each with runs of the hung partition: once the first has waited its
    deadline, the round's other batches leave that partition's runs out, and the next
    rounds send the healthy runs first, so their leases are renewed every period."""
    store = OneHung(delay=TTL / 3 / 1000)
    lost: list[Lost] = []
    runs = [f"p{i % 3}-{i}" for i in range(4 * MAX_RENEW)]
    with Keeper(store, "me", TTL, on_lost=lost.append) as keeper:
        since = time.monotonic()
        for run in runs:
            store.insert(run, b"r", Claim("me", TTL))
        keeper.add_all(runs, since=since)
        time.sleep(TTL * 3 / 1000)
        healthy = [run for run in runs if not run.startswith("p1-")]
        assert [item for item in lost if item.run in healthy] == []
        assert all(keeper.valid(run) for run in healthy)
        assert {item.run for item in lost} == set(runs) - set(healthy)


def test_close_with_release_goes_on_after_a_batch_that_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    """A failed partition's runs are left to run out; every other batch is released."""
    class FirstFails(MemoryRunStore):
        def release(self, owner: str, runs: Any) -> list[str]:
            names = list(runs)
            if "r0" in names:
                error = Unavailable("1 of the call's partitions failed")
                error.done = super().release(owner, names[1:])
                error.unanswered = names[:1]
                raise error
            return super().release(owner, names)

    store = FirstFails()
    keeper = Keeper(store, "me", 60_000)
    runs = [f"r{i}" for i in range(MAX_RENEW + 5)]
    for run in runs:
        take(store, keeper, run, ttl=60_000)
    keeper.close(release=True)
    assert store.get("r0").holder == Held("me", True)
    assert all(store.get(run).holder == Free() for run in runs[1:])
    assert "could not release 1 leases" in caplog.text


# ---------------------------------------------------------------------------- one node down

#: A keeper over a store of 6 partitions on a three-primary cluster: 2 s renewals.
NODE_TTL = 6000
PARTS = 6
PER_PART = 4
OUTAGE = 6.0  # s: a node stays down this long
RATE = 10.0  # calls/s: the most EVALSHA a healthy primary may see meanwhile


def _cluster_for_outages(tmp_path: Any) -> list[Server]:
    """Three primaries that keep serving their slots while one is down (no full coverage
    needed: with the default, every node answers CLUSTERDOWN once one has failed)."""
    from servers import EPHEMERAL, redis_binary, start_cluster
    return start_cluster(redis_binary(), tmp_path / "cluster",
                         args=(*EPHEMERAL, "--cluster-require-full-coverage", "no"))


def _spread_runs(client: Any, namespace: str) -> tuple[dict[int, list[str]], int]:
    """PER_PART runs in every partition, by the port of their node; and the port of a node
    that holds partitions but not the namespace's own key (which a new store reads first:
    it stays up, so that a fresh store can read every healthy run)."""
    from redisstore.core.keys import Keyspace
    from redisstore.core.partitions import partition_of

    by_part: dict[int, list[str]] = {p: [] for p in range(PARTS)}
    i = 0
    while any(len(runs) < PER_PART for runs in by_part.values()):
        run = f"job-{i}"
        i += 1
        if len(by_part[p := partition_of(run, PARTS)]) < PER_PART:
            by_part[p].append(run)
    by_port: dict[int, list[str]] = {}
    for p, runs in by_part.items():
        port = client.get_node_from_key(Keyspace(namespace, p).meta).port
        by_port.setdefault(port, []).extend(runs)
    own = client.get_node_from_key(Keyspace(namespace).meta).port
    victim = next(port for port in sorted(by_port) if port != own)
    return by_port, victim


def _evalsha(server: Server) -> int:
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["killed", "hung"])
@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_keeper_over_partitions_loses_only_the_runs_of_the_node_that_failed(
        tmp_path: Any, shell: str, fault: str) -> None:
    """One primary of three killed (connection refused) or hung (SIGSTOP, for OUTAGE s):
    no run of a healthy partition is reported lost, and each is still live on the
    server; the failed node's runs are lost only once their bound passed; the keeper's
    retries of them back off (the healthy primaries see a few EVALSHA a second)."""
    import os
    import signal

    from aio_suites import LoopThread, Synced
    from redis.cluster import RedisCluster

    servers = _cluster_for_outages(tmp_path)
    namespace = unique_namespace("keeper-outage")
    loop = LoopThread() if shell == "asyncio" else None
    lost: list[tuple[float, Lost]] = []

    def on_lost(item: Lost) -> None:
        lost.append((time.monotonic(), item))

    def healthy_store() -> RedisRunStore:  # a fresh client, through a healthy node
        client = RedisCluster(host="127.0.0.1", port=healthy[0].port, socket_timeout=10)
        return RedisRunStore(client, namespace=namespace, partitions=PARTS, timeout=2000)

    stopped = False
    keeper: Any = None
    try:
        sync_client = RedisCluster(host="127.0.0.1", port=servers[0].port, socket_timeout=10)
        by_port, victim_port = _spread_runs(sync_client, namespace)
        victim = next(s for s in servers[:3] if s.port == victim_port)
        healthy = [s for s in servers[:3] if s is not victim]
        doomed = by_port[victim_port]
        kept = [run for port, runs in by_port.items() if port != victim_port for run in runs]
        if loop is None:
            store: Any = RedisRunStore(sync_client, namespace=namespace, partitions=PARTS,
                                       timeout=2000)
            keeper = Keeper(store, "me", NODE_TTL, on_lost=on_lost)
        else:
            import redis.asyncio

            async def make() -> tuple[Any, AsyncKeeper]:
                client = redis.asyncio.RedisCluster(host="127.0.0.1",
                                                    port=servers[0].port, socket_timeout=10)
                made = AsyncRedisRunStore(client, namespace=namespace, partitions=PARTS,
                                          timeout=2000)
                return made, AsyncKeeper(made, "me", NODE_TTL, on_lost=on_lost)

            made, keeper = loop.run(make())
            store = Synced(made, loop)
        store.migrate()
        for run in doomed + kept:  # the failed node's group first in each renewal
            since = time.monotonic()
            store.insert(run, b"r", Claim("me", NODE_TTL))
            keeper.add(run, since=since)
        time.sleep(keeper.renew_every / 1000 * 1.5)  # a good round first
        assert lost == [] and all(keeper.valid(run) for run in kept + doomed)

        # Another client, made before the fault: redis-py's RedisCluster asks a random
        # node for COMMAND as it is made, so one made now may ask the hung one.
        fresh = healthy_store()
        calls = {s.port: _evalsha(s) for s in healthy}
        began = time.monotonic()
        if fault == "killed":
            victim.kill()
        else:
            os.kill(victim.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            stopped = True
        invalid: set[str] = set()
        while time.monotonic() < began + OUTAGE - 0.3:
            time.sleep(0.1)
            invalid.update(run for run in kept if not keeper.valid(run))
        elapsed = time.monotonic() - began
        rates = {port: round((_evalsha(s) - calls[port]) / elapsed, 1)
                 for s in healthy if (port := s.port)}
        dead = [run for run in kept if fresh.get(run).holder != Held("me", True)]
        print(f"\n{shell}, {fault}: EVALSHA/s on the healthy primaries {rates}; "
              f"{len(lost)} losses, {sum(i.run in kept for _, i in lost)} of "
              f"{len(kept)} healthy runs; {len(kept) - len(dead)} healthy leases live")
        assert [item for _, item in lost if item.run in kept] == []
        assert invalid == set()
        # Every healthy run's lease is live, as a fresh client reads it.
        assert dead == []
        assert max(rates.values()) < RATE, rates
        # The failed node's runs: lost, each only once its bound passed (the last
        # confirmation came at most a period before the fault).
        bound = (NODE_TTL - keeper.margin - keeper.renew_every) / 1000
        deadline = began + NODE_TTL / 1000 + 2 * keeper.renew_every / 1000
        while len(lost) < len(doomed) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"the failed node's runs lost {min(at for at, _ in lost) - began:.2f}-"
              f"{max(at for at, _ in lost) - began:.2f} s after the fault" if lost else "")
        assert sorted(item.run for _, item in lost) == sorted(doomed)
        assert all(item.reason == DEADLINE and at >= began + bound - 0.05
                   for at, item in lost), [(at - began, item) for at, item in lost]
        assert not any(keeper.valid(run) for run in doomed)
        assert all(keeper.valid(run) for run in kept)
        # A release answers per partition too: the healthy runs are freed.
        with pytest.raises(Unavailable) as caught:
            keeper.release([doomed[0], *kept[:2]])
        assert caught.value.done == kept[:2] and caught.value.unanswered == doomed[:1]
        assert [fresh.get(run).holder for run in kept[:2]] == [Free(), Free()]
        fresh.close()
    finally:
        if stopped:
            os.kill(victim.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        if keeper is not None:
            if loop is not None:
                loop.run(keeper.aclose())
            else:
                keeper.close()
        if loop is not None:
            loop.stop()
        for server in servers:
            server.kill()
