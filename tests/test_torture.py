"""Torture: engine processes work a shared set of runs through a fault proxy while the
server is cut off, loses replies and is killed -9 and restarted (AOF, fsync always); half
the processes run their engines as threads sharing one asyncio store, whose multiplexer
pipelines their calls. Every call is logged; :mod:`history` then checks the log against the
final state.

It runs once on Redis 7 and once on Valkey 8. ``REDISSTORE_TORTURE_SECONDS`` sets how long
the load runs (default 20 s per server, about 25-30 s each in all);
``REDISSTORE_TORTURE_WORKERS`` how many processes (default 6).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from faultproxy import FaultProxy
from history import Event, Final, check, load
from servers import Server, redis_binary, start, unique_namespace, valkey_binary

from redisstore import (
    AsyncRedisRunStore,
    Held,
    Hold,
    NotFound,
    RedisRunStore,
    Release,
    Seize,
    StoreError,
    Unavailable,
    confirm_write,
)
from redisstore.discovery import json_wait
from redisstore.runs import Claim

pytestmark = [pytest.mark.server, pytest.mark.slow]

SECONDS = float(os.environ.get("REDISSTORE_TORTURE_SECONDS", "20"))
WORKERS = int(os.environ.get("REDISSTORE_TORTURE_WORKERS", "6"))
RUNS = 50
TTL = 1500          # ms: short enough that abandoned and orphaned leases expire in the test
FAULT_EVERY = (0.3, 1.2)  # seconds between faults
#: Workers sharing one asyncio store in each of the odd-numbered processes.
ASYNC_TASKS = 3
DURABLE = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")


def _record(token: str, prev: str | None, owner: str, step: int) -> bytes:
    # {"wait": {"at": 0}}: eligible for claim_ready whenever the run is free.
    return json.dumps({"token": token, "prev": prev, "owner": owner, "step": step,
                       "wait": {"at": 0}}).encode()


def _token_of(record: bytes) -> str | None:
    token = json.loads(record).get("token")
    return str(token) if token is not None else None


class Worker:
    """One engine process: claims runs, writes them under Hold, renews, releases; logs all."""

    def __init__(self, store: RedisRunStore, owner: str, log: Any, rng: random.Random) -> None:
        self.store, self.owner, self.log, self.rng = store, owner, log, rng
        self.seq = 0
        self.last_time: int | None = None
        self.held: set[str] = set()

    def clock(self) -> int | None:
        try:
            self.last_time = self.store.now()
            return self.last_time
        except StoreError:
            return None

    def call(self, op: str, fn: Callable[[], Any], **fields: Any) -> tuple[str, Any]:
        """Run one call, log it with its outcome and backend-time bounds."""
        b0, t0 = self.last_time, time.monotonic()
        value: Any = None
        try:
            value = fn()
            outcome = "ok"
        except Unavailable as exc:
            outcome, fields["reason"] = "unavailable", exc.reason[:120]
        except StoreError as exc:
            outcome = type(exc).__name__
            fields["error"] = repr(exc)[:120]
        t1 = time.monotonic()
        b1 = self.clock()
        if outcome == "unavailable" and op in ("insert", "cas"):
            fields["confirmed"] = self.resolve(fields["run"], fields["expected"] + 1,
                                               fields["record"])
        fields.pop("record", None)
        if op in ("claim_ready", "claim_expired", "renew") and outcome == "ok":
            fields["value"] = list(value)
        self.seq += 1
        self.log.write(json.dumps({"proc": self.owner, "seq": self.seq, "op": op,
                                   "outcome": outcome, "b0": b0, "b1": b1, "t0": t0,
                                   "t1": t1, **fields}) + "\n")
        return outcome, value

    def resolve(self, run: str, revision: int, record: bytes) -> bool | None:
        """Readback after an Unavailable write (None: the server stayed out of reach)."""
        for _ in range(30):
            try:
                return confirm_write(self.store, run, revision, record)
            except Unavailable:
                time.sleep(0.1)
        return None

    def claim(self) -> None:
        op = "claim_ready" if self.rng.random() < 0.7 else "claim_expired"
        fn = self.store.claim_ready if op == "claim_ready" else self.store.claim_expired
        outcome, got = self.call(op, lambda: fn(self.owner, TTL, 2), ttl=TTL, limit=2)
        if outcome == "ok":
            self.held.update(got)
        # Unknown: those runs stay ours until the ttl runs out; claim_expired finds them.

    def renew(self) -> None:
        runs = sorted(self.held)
        outcome, kept = self.call("renew", lambda: self.store.renew(self.owner, runs, TTL),
                                  runs=runs, ttl=TTL)
        if outcome == "ok":
            self.held = set(kept)

    def write(self, run: str, lease: Hold | Release | Seize | Claim, *, current: Any) -> str:
        token = f"{self.owner}-{self.seq}-{uuid.uuid4().hex[:8]}"
        prev = _token_of(current.record)
        record = _record(token, prev, self.owner, self.seq)
        kind = type(lease).__name__.lower()
        ttl = getattr(lease, "ttl", None)
        outcome, _ = self.call(
            "cas", lambda: self.store.compare_and_set(run, current.revision, record, lease),
            run=run, expected=current.revision, lease=kind, ttl=ttl, token=token, prev=prev,
            record=record)
        return outcome

    def get(self, run: str) -> Any:
        try:
            current = self.store.get(run)
        except (Unavailable, NotFound):
            return None
        self.clock()
        return current

    def step(self, run: str) -> None:
        current = self.get(run)
        if current is None or current.holder != Held(self.owner, True):
            self.held.discard(run)
            return
        r = self.rng.random()
        if r < 0.05:  # the engine "crashes" on this run: its lease will expire
            self.held.discard(run)
            return
        lease: Hold | Release | Claim = (
            Hold(self.owner) if r < 0.6 else Release() if r < 0.9 else Claim(self.owner, TTL))
        outcome = self.write(run, lease, current=current)
        if outcome != "ok" or isinstance(lease, Release):
            self.held.discard(run)

    def seize(self, run: str) -> None:
        current = self.get(run)
        if current is not None and self.write(run, Seize(self.owner, TTL),
                                              current=current) == "ok":
            self.held.add(run)

    def loop(self, deadline: float, runs: list[str]) -> None:
        while self.clock() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        while time.monotonic() < deadline:
            if len(self.held) < 3:
                self.claim()
            if self.held and self.rng.random() < 0.5:
                self.renew()
            for run in sorted(self.held)[:2]:
                self.step(run)
            if self.rng.random() < 0.02:
                self.seize(self.rng.choice(runs))
            if not self.held:
                time.sleep(0.01)


class OnLoop:
    """The sync calls a Worker makes, each a call of one asyncio store run on its event loop
    in another thread: the workers of a process share the store, whose multiplexer pipelines
    their concurrent calls on its few connections."""

    def __init__(self, store: AsyncRedisRunStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store, self._loop = store, loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(method(*args, **kwargs),
                                                    self._loop).result()
        return call


def _work(port: int, namespace: str, owner: str, seconds: float, log_path: str,
          runs: list[str], seed: int, tasks: int) -> None:
    """One engine process: a sync store, or (``tasks`` > 0) that many workers, each logged as
    its own process, sharing one multiplexed asyncio store."""
    deadline = time.monotonic() + seconds
    if not tasks:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2,
                             socket_connect_timeout=2)
        store = RedisRunStore(client, namespace=namespace, discover=json_wait)
        with open(log_path, "w", buffering=1) as log:
            Worker(store, owner, log, random.Random(seed)).loop(deadline, runs)
        return
    loop = asyncio.new_event_loop()
    looping = threading.Thread(target=loop.run_forever, daemon=True)
    looping.start()
    aclient = redis.asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=2,
                                  socket_connect_timeout=2)
    shared: Any = OnLoop(AsyncRedisRunStore(aclient, namespace=namespace, discover=json_wait),
                         loop)
    rng = random.Random(seed)
    with open(log_path, "w", buffering=1) as log:
        lock = threading.Lock()

        class Lines:  # one line at a time from every thread
            def write(self, line: str) -> None:
                with lock:
                    log.write(line)

        threads = [threading.Thread(target=Worker(shared, f"{owner}t{k}", Lines(),
                                                  random.Random(rng.random())).loop,
                                    args=(deadline, runs)) for k in range(tasks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    asyncio.run_coroutine_threadsafe(aclient.aclose(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


class Faults:
    """The parent's fault thread: cut connections, lose replies, kill -9 and restart."""

    KINDS = ("cut", "drop", "hang", "restart")

    def __init__(self, proxy: FaultProxy, server: Server, rng: random.Random) -> None:
        self.proxy, self.server, self.rng = proxy, server, rng
        self.counts: Counter[str] = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="torture-faults", daemon=True)
        self.restart_downtime: list[float] = []

    def _run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*FAULT_EVERY)):
            kinds = list(self.KINDS)
            self.rng.shuffle(kinds)
            for kind in kinds:
                if self.stop.wait(self.rng.uniform(*FAULT_EVERY)):
                    return
                self.inject(kind)

    def inject(self, kind: str) -> None:
        if kind == "cut":
            self.proxy.cut_all()
        elif kind == "drop":
            self.proxy.drop_replies(self.rng.randint(1, 3))
        elif kind == "hang":
            self.proxy.drop_replies(1, hang=True)
        else:
            began = time.monotonic()
            self.server.kill()
            time.sleep(self.rng.uniform(0.05, 0.5))
            self.server.start()
            self.restart_downtime.append(time.monotonic() - began)
        self.counts[kind] += 1


@pytest.fixture(params=["redis", "valkey"])
def durable_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    binary = redis_binary() if request.param == "redis" else valkey_binary()
    server = start(binary, request.param, tmp_path / "server", DURABLE)
    try:
        yield server
    finally:
        server.kill()


def test_torture_history_is_linearizable_enough(durable_server: Server,
                                                 tmp_path: Path) -> None:
    namespace = unique_namespace("torture")
    setup = RedisRunStore(durable_server.client(), namespace=namespace, discover=json_wait)
    runs = [f"run-{i:02d}" for i in range(RUNS)]
    setup_lines: list[str] = []
    for i, run in enumerate(runs):
        token = f"seed-{run}"
        setup.insert(run, _record(token, None, "setup", 0), Release())
        setup_lines.append(json.dumps({"proc": "setup", "seq": i, "op": "insert",
                                       "outcome": "ok", "run": run, "lease": "release",
                                       "token": token}))
    rng = random.Random(os.environ.get("REDISSTORE_TORTURE_SEED", "torture"))
    with FaultProxy(durable_server.port) as proxy:
        faults = Faults(proxy, durable_server, rng)
        ctx = multiprocessing.get_context("spawn")
        logs = [tmp_path / f"w{w}.jsonl" for w in range(WORKERS)]
        # Half the processes are engines on a sync store each, half run ASYNC_TASKS
        # workers on one shared asyncio store (its multiplexer under the same faults).
        workers = [ctx.Process(target=_work, args=(proxy.port, namespace, f"w{w}", SECONDS,
                                                   str(logs[w]), runs, rng.randrange(2**32),
                                                   ASYNC_TASKS if w % 2 else 0))
                   for w in range(WORKERS)]
        began = time.monotonic()
        for worker in workers:
            worker.start()
        time.sleep(2)  # the spawned interpreters start before the faults do
        faults.thread.start()
        for worker in workers:
            worker.join(SECONDS + 120)
        faults.stop.set()
        faults.thread.join(30)
        assert all(worker.exitcode == 0 for worker in workers), \
            [worker.exitcode for worker in workers]
        dropped, cut = proxy.replies_dropped, proxy.connections_cut
        elapsed = time.monotonic() - began

    final: dict[str, Final] = {}
    for run in runs:
        current = setup.get(run)
        holder = current.holder
        final[run] = Final(current.revision, _token_of(current.record),
                           holder.owner if isinstance(holder, Held) else None,
                           isinstance(holder, Held) and holder.live)
    lines = list(setup_lines)
    for path in logs:
        lines += path.read_text().splitlines()
    events = load(lines)
    report = check(events, final)

    counts = report.counts
    print(f"\ntorture: {WORKERS} processes x {SECONDS:.0f} s over {RUNS} runs "
          f"({elapsed:.0f} s wall)")
    print(f"  operations={counts['operations']} "
          + " ".join(f"{k[3:]}={v}" for k, v in sorted(counts.items()) if k.startswith("op.")))
    print(f"  faults injected: {dict(faults.counts)}; replies dropped={dropped} "
          f"connections cut={cut}; restart downtime "
          f"max={max(faults.restart_downtime, default=0):.2f} s")
    print(f"  unavailable={counts['unavailable']} (writes {counts['unavailable_writes']}: "
          f"resolved by readback {counts['resolved_by_readback']}, of which confirmed "
          f"{counts['confirmed_by_readback']}); successful writes="
          f"{counts['successful_writes']}; refusals="
          + str({k[8:]: v for k, v in counts.items() if k.startswith("refused.")}))
    print(f"  violations={len(report.violations)}")
    for violation in report.violations[:20]:
        print("   ", violation)

    assert report.violations == []
    assert all(faults.counts[kind] > 0 for kind in Faults.KINDS), faults.counts
    assert dropped > 0
    assert counts["unavailable"] > 0
    assert counts["operations"] > 50 * SECONDS
    assert counts["successful_writes"] > 50
    # The asyncio stores' workers wrote too, and met the faults.
    shared = [e for e in events if re.fullmatch(r"w\d+t\d+", e.proc)]
    assert sum(e.op == "cas" and e.outcome == "ok" for e in shared) > 20, len(shared)
    assert any(e.outcome == "unavailable" for e in shared)
    _assert_the_checker_bites(events, final)


def _assert_the_checker_bites(events: list[Event], final: dict[str, Final]) -> None:
    """The same real history, doctored, must fail: the checks are not vacuous."""
    run = max(final, key=lambda r: final[r].revision)
    rolled_back = {**final, run: Final(1, f"seed-{run}")}
    assert "lost" in {v.kind for v in check(events, rolled_back).violations}
    claim = next(e for e in events if e.op == "claim_ready" and e.outcome == "ok"
                 and e.value and e.b0 is not None and e.b1 is not None
                 and e.b1 - e.b0 < TTL // 4)
    assert claim.b1 is not None
    intruder = Event(proc="intruder", seq=0, op="claim_expired", outcome="ok",
                     value=(claim.value[0],), ttl=TTL, b0=claim.b1 + 1, b1=claim.b1 + 2)
    # Without the releases and seizures that might have ended that lease first:
    unended = [e for e in events
               if not (e.run == claim.value[0] and e.lease in ("release", "seize"))]
    kinds = {v.kind for v in check([*unended, intruder], final).violations}
    assert "overlap" in kinds
    late = Event(proc=claim.proc, seq=claim.seq, op="renew", outcome="ok",
                 runs=(claim.value[0],), value=(claim.value[0],), ttl=TTL,
                 b0=claim.b1 + 3 * TTL, b1=claim.b1 + 3 * TTL + 1)
    only_claim = [e for e in events if e.proc != claim.proc or e.seq < claim.seq]
    assert "revival" in {v.kind for v in check([*only_claim, late], final).violations}
