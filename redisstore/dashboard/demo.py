"""The demo workload: workers processing orders, so that ``dashboard --demo`` is alive.

Three :class:`~redisstore.Worker` nodes claim orders from one namespace; a feeder keeps
some ready, some waiting for a time or for a payment (a dependency it writes later), and
removes finished orders after a while, so the namespace stays small. Some orders always
fail and end in the quarantine; now and then a node "crashes" holding an order, whose
lease expires and is taken over. A second namespace holds a few orders nobody works on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core.errors import StoreError
from ..core.runs import Claim, Failure, Feed, Fenced, Release
from ..discovery import json_wait
from ..engine.worker import Job, Retry, Unrecoverable, Worker

#: Runs the feeder keeps in the namespace at most (finished ones are deleted).
POPULATION = 80
#: Seconds a finished order stays before the feeder deletes it.
KEEP_DONE = 20.0
#: Failed orders kept in the quarantine (older ones, by id, are deleted).
QUARANTINED = 8


def _record(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


class Workload:
    """The demo's nodes and feeder over ``client``, in ``namespace`` (the workers') and
    ``quiet`` (a few runs nobody works on), on stores ``stores`` opens (the command's:
    ``RedisRunStore``, which the demo does not import, so it stands below the stores).
    ``start()``, then ``stop()``."""

    def __init__(self, client: Any, namespace: str = "demo-orders",
                 quiet: str = "demo-billing", *, stores: Callable[..., Any],
                 seed: int | None = None) -> None:
        self.namespace, self.quiet = namespace, quiet
        # The workers' namespace keeps a change feed (so the live pages read it, and the
        # chart has the per-minute counts); the quiet one shows a namespace without.
        self.store = stores(client, namespace=namespace, discover=json_wait, feed=Feed())
        self.quiet_store = stores(client, namespace=quiet, discover=json_wait)
        self.random = random.Random(seed)
        self.workers = [Worker(self.store, f"node-{name}", self._handle, ttl=4_000,
                               concurrency=2, poll=500,
                               retry=Retry(attempts=3, base=1_500, cap=5_000))
                        for name in "abc"]
        self._stop = threading.Event()
        self._done: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()
        self._next = 0
        self._feeder = threading.Thread(target=self._feed, name="demo-feeder", daemon=True)

    # ---------------------------------------------------------------- the story

    def _handle(self, job: Job) -> bytes | None:
        order = json.loads(job.current.record)
        time.sleep(self.random.uniform(0.3, 1.8))  # the work
        if order.get("poison"):
            raise ValueError(f"card declined for order {order['order']}")
        if order.get("fatal"):
            raise Unrecoverable("address does not exist")
        if self.random.random() < 0.08:
            raise TimeoutError("payment service timed out")
        order["step"] = order.get("step", 0) + 1
        if order["step"] < 3:
            order["wait"] = {"at": self.store.now() + self.random.randint(2_000, 9_000)}
            return _record(order)
        order["wait"] = None
        with self._lock:
            self._done.append((time.monotonic(), job.run))
        return _record(order)

    def _new_order(self) -> None:
        n = self._next
        self._next += 1
        roll = self.random.random()
        order: dict[str, Any] = {"order": n, "step": 0, "items": self.random.randint(1, 5)}
        now = self.store.now()
        if roll < 0.15:
            order["wait"] = {"changed": f"payment-{n}"}  # ready once the payment is written
        elif roll < 0.35:
            order["wait"] = {"at": now + self.random.randint(5_000, 30_000)}
        else:
            order["wait"] = {"at": now}
        if self.random.random() < 0.04:
            order["poison"] = True
        elif self.random.random() < 0.02:
            order["fatal"] = True
        self.store.insert(f"order-{n}", _record(order), Release())
        if "changed" in order["wait"]:
            self._payments.append((time.monotonic() + self.random.uniform(3, 15), n))

    def _crash(self) -> None:
        """A node that claims an order and dies: its lease runs out, a worker takes over."""
        self.store.claim("node-z", ttl=3_000)  # and never heard of again

    def _sweep(self) -> None:
        now = time.monotonic()
        while self._payments and self._payments[0][0] <= now:
            _, n = self._payments.popleft()
            with contextlib.suppress(StoreError):
                self.store.insert(f"payment-{n}", _record({"paid": True, "wait": None}),
                                  Release())
        with self._lock:
            old = []
            while self._done and self._done[0][0] < now - KEEP_DONE:
                old.append(self._done.popleft()[1])
        for run in old:
            with contextlib.suppress(StoreError):
                current = self.store.get(run)
                self.store.delete(run, current.revision, Release())
                self._live -= 1
                with contextlib.suppress(StoreError):
                    payment = run.replace("order-", "payment-")
                    self.store.delete(payment, self.store.get(payment).revision, Release())

    def _prune(self) -> None:
        """Keep at most :data:`QUARANTINED` failed orders: the rest are deleted, so that
        the quarantine never fills the demo's population."""
        failed = [q.run for q in self.store.quarantined(limit=100) if q.index == "failed"]
        for run in sorted(failed)[QUARANTINED:]:
            with contextlib.suppress(StoreError):
                self.store.delete(run, self.store.get(run).revision, Release())
                self._live -= 1

    def _feed(self) -> None:
        ticks = 0
        while not self._stop.wait(0.6):
            ticks += 1
            try:
                if self._live < POPULATION:
                    self._new_order()
                    self._live += 1
                if ticks % 15 == 0:
                    self._crash()
                if ticks % 10 == 0:
                    self._prune()
                self._sweep()
            except StoreError:
                continue  # the server went away for a moment: the next tick tries again

    def _seed_quiet(self) -> None:
        store = self.quiet_store
        now = store.now()
        for i in range(6):
            with contextlib.suppress(StoreError):
                store.insert(f"invoice-{i}", _record({"invoice": i, "wait": {
                    "at": now + (i + 1) * 3_600_000}}), Release())
        with contextlib.suppress(StoreError):
            store.insert("invoice-<script>alert(1)</script>",
                         _record({"note": "<b>ids and records are shown as text</b>",
                                  "wait": {"at": now}}), Release())
            store.insert("invoice-broken", _record({"wait": {"at": 0}}), Release())
            for claimed in store.claim("billing-1", ttl=30_000, records=True, limit=10):
                if claimed.run == "invoice-broken" and claimed.current.token is not None:
                    store.finish(claimed.run, claimed.current.revision,
                                 Fenced("billing-1", claimed.current.token),
                                 failure=Failure("KeyError: 'customer'", final=True))
                else:
                    store.release("billing-1", [claimed.run])
        with contextlib.suppress(StoreError):
            store.insert("invoice-held", _record({"invoice": 99, "wait": None}),
                         Claim("billing-1", 3_600_000))

    # ---------------------------------------------------------------- control

    def start(self) -> Workload:
        # The demo's failures are on purpose: the dashboard shows them, the terminal need
        # not (a handler of the application's own still gets them).
        logging.getLogger("redisstore.worker").addHandler(_QUIET)
        self._payments: deque[tuple[float, int]] = deque()
        self._live = 0
        self._seed_quiet()
        for _ in range(12):
            self._new_order()
            self._live += 1
        for worker in self.workers:
            worker.start()
        self._feeder.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.stop(timeout=3)
        self._feeder.join(timeout=5)
        self.store.close()
        self.quiet_store.close()
        logging.getLogger("redisstore.worker").removeHandler(_QUIET)


_QUIET = logging.NullHandler()
