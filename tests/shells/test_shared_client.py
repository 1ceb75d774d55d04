"""One store and one client shared by 16 threads (or 16 asyncio tasks), for every kind of
client: each call must get its own reply, and no refused write may come back acknowledged.

Every thread mixes every operation of the run store: get, insert (new runs and runs that
exist), compare_and_set (with the revision it last saw, which other threads make stale, and
deliberately stale or future ones), renew, claim_expired, claim_ready and refresh. Each
record is JSON that names its run and carries a fresh token and the token it replaces, so
afterwards :mod:`history` rebuilds every run's chain of revisions from the log and checks
that each acknowledged write is in it and no refused one is. Each worker also knows exactly
which leases it holds (leases are long, only their holder releases them), so every reply is
checked on the spot: a get names the run asked for, a renew returns exactly the caller's
leases among those asked, claims hand out runs of the right kind, and no run is claimed twice.

A reply delivered to the wrong caller (two threads on one connection, as a
``single_connection_client`` shared between threads once did) fails these checks within
milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio
from history import Event, Final, check
from servers import Server, unique_namespace

from redisstore import (
    AlreadyExists,
    AsyncRedisRunStore,
    Claim,
    Conflict,
    Current,
    Free,
    Held,
    Hold,
    LeaseRefused,
    RedisRunStore,
    Release,
    StoreError,
)
from redisstore.discovery import json_wait

# serial: 16 threads or tasks on one client load the machine
pytestmark = pytest.mark.serial

WORKERS = 16
#: Seconds of load per client kind (each kind also spends ~1 s on setup and checks).
SECONDS = float(os.environ.get("REDISSTORE_SHARED_SECONDS", "4"))
LONG = 600_000  # ms: no lease taken during the test runs out before it ends
CONTENDED = 8   # runs every worker writes to
CLAIMABLE = 400  # ready runs, and as many runs with an expired lease


# ---------------------------------------------------------------------------- the runs


def record(run: str, token: str, prev: str | None, ready: bool = False) -> bytes:
    document: dict[str, Any] = {"run": run, "token": token, "prev": prev}
    if ready:
        document["wait"] = {"at": 0}  # due since 1970: claim_ready hands it out while free
    return json.dumps(document).encode()


@dataclass
class Runs:
    """The runs of one test: contended ones (never ready, never expired), ready ones, ones
    whose lease has expired, and the ones the workers insert."""

    contended: list[str] = field(default_factory=lambda: [f"c{i}" for i in range(CONTENDED)])
    ready: list[str] = field(default_factory=lambda: [f"r{i}" for i in range(CLAIMABLE)])
    expired: list[str] = field(default_factory=lambda: [f"e{i}" for i in range(CLAIMABLE)])
    inserted: list[str] = field(default_factory=list)  # appended by workers after an ack

    def all(self) -> list[str]:
        return [*self.contended, *self.ready, *self.expired, *list(self.inserted)]


def set_up(store: RedisRunStore, runs: Runs) -> list[Event]:
    """Insert the runs (through a store of another client) and log the inserts."""
    events: list[Event] = []

    def insert(run: str, ready: bool, lease: Claim | Release) -> None:
        token = uuid.uuid4().hex
        store.insert(run, record(run, token, None, ready), lease)
        events.append(Event("setup", len(events), "insert", "ok", run=run, token=token,
                            lease="claim" if isinstance(lease, Claim) else "release"))

    for run in runs.contended:
        insert(run, False, Release())
    for run in runs.ready:
        insert(run, True, Release())
    for run in runs.expired:
        insert(run, False, Claim("dead", 1))
    return events


# ---------------------------------------------------------------------------- a worker


@dataclass
class Plan:
    """One call a worker makes, and how it judges the answer."""

    method: str
    args: tuple[Any, ...]
    judge: Callable[[Any, StoreError | None], None]


class Worker:
    """What one thread (or task) does: picks calls, checks each answer, logs the events.

    The same worker serves the sync and the asyncio store: only how a plan is called
    differs.
    """

    def __init__(self, name: str, runs: Runs, seed: int) -> None:
        self.name = name
        self.runs = runs
        self.rng = random.Random(seed)
        self.held: set[str] = set()          # the leases this worker holds, exactly
        self.seen: dict[str, tuple[int, str]] = {}  # run -> (revision, token) it last saw
        self.events: list[Event] = []
        self.reads: list[tuple[str, int, str]] = []  # (run, revision, token) a get returned
        self.claimed: list[str] = []
        self.failures: list[str] = []
        self.stats: Counter[str] = Counter()
        self.inserts = 0

    def fail(self, message: str) -> None:
        self.failures.append(f"{self.name}: {message}")

    def log(self, op: str, outcome: str, **fields: Any) -> None:
        self.events.append(Event(self.name, len(self.events), op, outcome, **fields))

    def unexpected(self, what: str, error: StoreError | None) -> None:
        self.fail(f"{what}: unexpected {type(error).__name__}: {error}")

    # -- picking a call

    def plan(self) -> Plan:
        roll = self.rng.random()
        if roll < 0.22:
            return self.get(self.rng.choice(self.runs.all()))
        if roll < 0.55:
            return self.compare_and_set()
        if roll < 0.65:
            return self.insert()
        if roll < 0.77:
            return self.renew()
        if roll < 0.85:
            return self.claim("claim_expired")
        if roll < 0.93:
            return self.claim("claim_ready")
        return self.refresh()

    def get(self, run: str) -> Plan:
        def judge(current: Any, error: StoreError | None) -> None:
            self.stats["get"] += 1
            if error is not None:
                return self.unexpected(f"get({run})", error)
            document = json.loads(current.record)
            if document["run"] != run:
                return self.fail(f"get({run}) returned {document['run']}'s record")
            self.reads.append((run, current.revision, document["token"]))
            self.seen[run] = (current.revision, document["token"])
            holder = current.holder
            mine = isinstance(holder, Held) and holder.owner == self.name
            if mine != (run in self.held):
                self.fail(f"get({run}) says holder {holder}; this worker holds "
                          f"{run in self.held}")

        return Plan("get", (run,), judge)

    def compare_and_set(self) -> Plan:
        mine = sorted(run for run in self.held if run not in self.runs.contended)
        run = self.rng.choice(mine) if mine and self.rng.random() < 0.3 \
            else self.rng.choice(self.runs.contended)
        if run not in self.seen:
            return self.get(run)
        revision, prev = self.seen[run]
        stale = self.rng.random() < 0.25
        # One behind can never match again; a million ahead is never reached.
        expected = (revision - 1 if self.rng.random() < 0.7 else revision + 1_000_000) \
            if stale else revision
        if run in self.runs.contended:
            if run in self.held:
                lease: Hold | Claim | Release = Hold(self.name) if self.rng.random() < 0.6 \
                    else Release()
            else:
                # Claim takes it if free; Hold by a non-holder is always refused.
                lease = Claim(self.name, LONG) if self.rng.random() < 0.7 else Hold(self.name)
        else:
            lease = Hold(self.name)
        token = uuid.uuid4().hex
        data = record(run, token, prev, ready=run in self.runs.ready)
        kind = {Hold: "hold", Claim: "claim", Release: "release"}[type(lease)]
        ttl = LONG if kind == "claim" else None

        def judge(_: Any, error: StoreError | None) -> None:
            self.stats["compare_and_set"] += 1
            what = f"compare_and_set({run}, {expected}, {kind})"
            if error is None:
                self.stats["cas acknowledged"] += 1
                self.log("cas", "ok", run=run, expected=expected, lease=kind, ttl=ttl,
                         token=token, prev=prev)
                if stale:
                    return self.fail(f"{what} acknowledged, but {revision} was current")
                self.seen[run] = (expected + 1, token)
                if kind == "claim":
                    self.held.add(run)
                elif kind == "release":
                    self.held.discard(run)
            elif isinstance(error, Conflict | LeaseRefused):
                self.stats["cas refused" + (" (stale on purpose)" if stale else "")] += 1
                self.log("cas", type(error).__name__, run=run, expected=expected, lease=kind,
                         ttl=ttl, token=token, prev=prev)
                if isinstance(error, LeaseRefused) and kind == "hold" and run in self.held:
                    self.fail(f"{what} refused the holder: {error.holder}")
            else:
                self.unexpected(what, error)

        return Plan("compare_and_set", (run, expected, data, lease), judge)

    def insert(self) -> Plan:
        token = uuid.uuid4().hex
        if self.rng.random() < 0.2:
            run = self.rng.choice(self.runs.contended)  # exists: must be refused

            def refused(_: Any, error: StoreError | None) -> None:
                self.stats["insert"] += 1
                if error is None:
                    self.log("insert", "ok", run=run, token=token, lease="release")
                    return self.fail(f"insert({run}) of an existing run acknowledged")
                if not isinstance(error, AlreadyExists):
                    return self.unexpected(f"insert({run})", error)
                self.stats["insert refused"] += 1
                self.log("insert", "AlreadyExists", run=run, token=token, lease="release")

            return Plan("insert", (run, record(run, token, None), Release()), refused)
        self.inserts += 1
        run = f"i-{self.name}-{self.inserts}"

        def judge(_: Any, error: StoreError | None) -> None:
            self.stats["insert"] += 1
            if error is not None:
                return self.unexpected(f"insert({run})", error)
            self.log("insert", "ok", run=run, token=token, lease="release")
            self.runs.inserted.append(run)

        return Plan("insert", (run, record(run, token, None), Release()), judge)

    def renew(self) -> Plan:
        others = self.rng.sample(self.runs.all(), 3)
        asked = list(dict.fromkeys([*self.rng.sample(sorted(self.held),
                                                     min(3, len(self.held))), *others]))
        self.rng.shuffle(asked)
        want = [run for run in asked if run in self.held]  # in the order asked

        def judge(renewed: Any, error: StoreError | None) -> None:
            self.stats["renew"] += 1
            if error is not None:
                return self.unexpected("renew", error)
            self.log("renew", "ok", runs=tuple(asked), value=tuple(renewed), ttl=LONG)
            if renewed != want:
                self.fail(f"renew({asked}) returned {renewed}, this worker holds {want}")

        return Plan("renew", (self.name, asked, LONG), judge)

    def claim(self, method: str) -> Plan:
        limit = self.rng.randint(1, 3)
        pool = set(self.runs.expired if method == "claim_expired" else self.runs.ready)

        def judge(claimed: Any, error: StoreError | None) -> None:
            self.stats[method] += 1
            if error is not None:
                return self.unexpected(method, error)
            self.log(method, "ok", value=tuple(claimed), ttl=LONG)
            self.stats[f"{method} runs"] += len(claimed)
            if len(claimed) > limit or not set(claimed) <= pool:
                self.fail(f"{method}(limit={limit}) returned {claimed}")
            self.claimed.extend(claimed)
            self.held.update(claimed)

        return Plan(method, (self.name, LONG, limit), judge)

    def refresh(self) -> Plan:
        run = self.rng.choice([*self.runs.ready, *self.runs.expired, *list(self.runs.inserted)])
        want = run in self.runs.ready  # only ready runs' records say what they wait for

        def judge(indexed: Any, error: StoreError | None) -> None:
            self.stats["refresh"] += 1
            if error is not None:
                return self.unexpected(f"refresh({run})", error)
            if indexed is not want:
                self.fail(f"refresh({run}) returned {indexed}")

        return Plan("refresh", (run,), judge)


# ---------------------------------------------------------------------------- clients


def _valkey(server: Server) -> Any:
    valkey = pytest.importorskip("valkey")
    return valkey.Valkey(host="127.0.0.1", port=server.port)


#: Each kind of client: the server fixture it runs on, and how to make it.
CLIENTS: dict[str, tuple[str, Callable[[Server], Any]]] = {
    "redis-default-pool": ("redis7", lambda s: redis.Redis(host="127.0.0.1", port=s.port)),
    "redis-single-connection": ("redis7", lambda s: redis.Redis(
        host="127.0.0.1", port=s.port, single_connection_client=True)),
    # Fewer connections than workers: calls wait for one.
    "redis-blocking-pool": ("redis7", lambda s: redis.Redis(
        connection_pool=redis.BlockingConnectionPool(host="127.0.0.1", port=s.port,
                                                     max_connections=4, timeout=5))),
    "valkey-py": ("valkey8", _valkey),
    "redis-asyncio": ("redis7", lambda s: redis.asyncio.Redis(host="127.0.0.1", port=s.port)),
}


def _run_threads(store: RedisRunStore, workers: list[Worker]) -> None:
    start = threading.Barrier(len(workers))
    end = [0.0]

    def work(worker: Worker) -> None:
        start.wait(30)
        end[0] = end[0] or time.monotonic() + SECONDS
        while time.monotonic() < end[0] and len(worker.failures) < 5:
            plan = worker.plan()
            try:
                result = getattr(store, plan.method)(*plan.args)
            except StoreError as error:
                plan.judge(None, error)
            else:
                plan.judge(result, None)

    threads = [threading.Thread(target=work, args=(w,), name=w.name) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SECONDS + 60)
        assert not thread.is_alive(), f"{thread.name} is stuck"


def _run_tasks(client: Any, namespace: str, workers: list[Worker]) -> None:
    async def main() -> None:
        store = AsyncRedisRunStore(client, namespace=namespace, discover=json_wait)
        end = time.monotonic() + SECONDS

        async def work(worker: Worker) -> None:
            while time.monotonic() < end and len(worker.failures) < 5:
                plan = worker.plan()
                try:
                    result = await getattr(store, plan.method)(*plan.args)
                except StoreError as error:
                    plan.judge(None, error)
                else:
                    plan.judge(result, None)

        await asyncio.wait_for(asyncio.gather(*(work(w) for w in workers)), SECONDS + 60)
        await client.aclose()

    asyncio.run(main())


@pytest.fixture(params=list(CLIENTS))
def kind(request: pytest.FixtureRequest) -> Iterator[tuple[str, Server]]:
    fixture, _ = CLIENTS[request.param]
    server: Server = request.getfixturevalue(fixture)
    yield request.param, server


@pytest.mark.server
def test_threads_sharing_one_store_and_client_get_their_own_replies(
        kind: tuple[str, Server]) -> None:
    name, server = kind
    namespace = unique_namespace()
    direct = RedisRunStore(server.client(), namespace=namespace, discover=json_wait)
    runs = Runs()
    events = set_up(direct, runs)
    time.sleep(0.01)  # the "dead" leases (1 ms) have run out
    workers = [Worker(f"w{i}", runs, seed=i) for i in range(WORKERS)]
    for worker in workers:  # every worker starts knowing the contended runs' revisions
        for run in runs.contended:
            current = direct.get(run)
            worker.seen[run] = (current.revision, json.loads(current.record)["token"])

    client = CLIENTS[name][1](server)
    if name == "redis-asyncio":
        _run_tasks(client, namespace, workers)
    else:
        _run_threads(RedisRunStore(client, namespace=namespace, discover=json_wait), workers)

    failures = [f for w in workers for f in w.failures]
    assert failures == [], "\n".join(failures[:20])

    # The history: one chain of revisions per run holding every acknowledged write and no
    # refused one; no renew of a lease its owner never took.
    for worker in workers:
        events += worker.events
    final: dict[str, Final] = {}
    for run in runs.all():
        current = direct.get(run)
        holder = current.holder
        final[run] = Final(current.revision, json.loads(current.record)["token"],
                           holder.owner if isinstance(holder, Held) else None,
                           isinstance(holder, Held) and holder.live)
    report = check(events, final)
    assert report.violations == [], report.violations[:10]

    # Every record a get returned is the one written at that revision.
    written = {(e.run, e.revision): e.token for e in events if e.succeeded and e.revision}
    for worker in workers:
        for run, revision, token in worker.reads:
            assert written.get((run, revision)) == token, (worker.name, run, revision, token)

    # Claims are disjoint, and each claimed run is still its claimer's.
    claimed = Counter(run for worker in workers for run in worker.claimed)
    assert claimed and max(claimed.values()) == 1, claimed.most_common(3)
    for worker in workers:
        for run in worker.claimed:
            assert final[run].owner == worker.name, (run, final[run], worker.name)
        for run in worker.held:
            assert final[run].owner == worker.name and final[run].live, (run, worker.name)

    # The mix really ran: every operation, acknowledged and refused writes, stale ones.
    stats: Counter[str] = Counter()
    for worker in workers:
        stats.update(worker.stats)
    for need in ("get", "insert", "insert refused", "renew", "refresh", "claim_expired runs",
                 "claim_ready runs", "cas acknowledged", "cas refused",
                 "cas refused (stale on purpose)"):
        assert stats[need] >= 10, (need, dict(stats))
    print(name, dict(sorted(stats.items())), report.summary())


def test_a_refused_write_acknowledged_would_be_caught() -> None:
    """The checks above can fail: a stale compare_and_set reported as done is a violation."""
    runs = Runs(contended=["c0"], ready=[], expired=[])
    worker = Worker("w0", runs, seed=1)
    worker.seen["c0"] = (3, "t3")
    while (plan := worker.plan()).method != "compare_and_set" or plan.args[1] == 3:
        pass  # until a deliberately stale compare_and_set comes up
    plan.judge(None, None)  # "acknowledged"
    assert worker.failures and "acknowledged" in worker.failures[0]

    other = Worker("w1", runs, seed=2)
    other.get("c0").judge(_current(b'{"run": "c1", "token": "t"}'), None)
    assert other.failures and "c1's record" in other.failures[0]


def _current(data: bytes) -> Current:
    return Current(1, data, Free())
