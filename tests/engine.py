"""An engine's loop over a run store, every call logged for :mod:`history`: the torture
test's processes and the resharding test's threads run it (tests/faults/test_torture.py,
tests/faults/test_reshard.py)."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from history import Final

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
from redisstore.runs import Claim

TTL = 1500  # ms: short enough that abandoned and orphaned leases expire in a test


def make_record(token: str, prev: str | None, owner: str, step: int) -> bytes:
    # {"wait": {"at": 0}}: eligible for claim_ready whenever the run is free.
    return json.dumps({"token": token, "prev": prev, "owner": owner, "step": step,
                       "wait": {"at": 0}}).encode()


def token_of(record: bytes) -> str | None:
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
            fields["applied"] = exc.outcome  # not_applied, unknown, applied_unconfirmed
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
        prev = token_of(current.record)
        record = make_record(token, prev, self.owner, self.seq)
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


def seed(store: RedisRunStore, runs: list[str]) -> list[str]:
    """Insert each run free, with a first record the engines chain theirs to; the log lines
    that say so (process ``setup``)."""
    lines = []
    for i, run in enumerate(runs):
        token = f"seed-{run}"
        store.insert(run, make_record(token, None, "setup", 0), Release())
        lines.append(json.dumps({"proc": "setup", "seq": i, "op": "insert", "outcome": "ok",
                                 "run": run, "lease": "release", "token": token}))
    return lines


def final_state(store: RedisRunStore, runs: list[str]) -> dict[str, Final]:
    """Each run's state at the end, as :func:`history.check` takes it."""
    final = {}
    for run in runs:
        current = store.get(run)
        holder = current.holder
        final[run] = Final(current.revision, token_of(current.record),
                           holder.owner if isinstance(holder, Held) else None,
                           isinstance(holder, Held) and holder.live)
    return final

