"""Lease keepers: a background renewal of every run a node holds, so that an engine does not
write its own renewal thread.

``Keeper(store, owner, ttl)`` (any sync run store) and ``AsyncKeeper(store, owner, ttl)`` (an
:class:`~redisstore.AsyncRedisRunStore`) each run in a thread of their own, on connections
of their own: a saturated pool, a busy event loop or a slow caller does not delay a renewal.

What ``valid(run)`` promises: the lease is live *now*. It is counted from the moment the
last renewal the server confirmed was *sent* (a renewal runs on the server after it is
sent, and makes the lease last ``ttl`` from then), by this process's monotonic clock, minus
a margin for the two clocks' drift. A run the keeper cannot confirm within that bound is
reported lost before the lease could have run out, and is never renewed again: a renewal
never revives a lease, and the keeper never sends one for a run it has given up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import Unavailable
from .runs import MAX_RENEW, check_owner, check_run, check_runs, check_ttl

log = logging.getLogger("redisstore")

#: Why a keeper gave a run up (``Lost.reason``).
NOT_RENEWED = "not renewed"  # the store answered without it: expired, or another owner's now
DEADLINE = "deadline"  # no renewal confirmed within the keeper's own bound
STOPPED = "keeper stopped"  # the keeper died (``Keeper.failure``) holding it

#: After a renewal that failed with nothing applied, the next try comes this soon (s).
RETRY = 0.05


@dataclass(frozen=True, slots=True)
class Lost:
    """A run whose lease the keeper no longer holds, and why: ``"not renewed"`` (the store
    answered without it), ``"deadline"`` (no renewal confirmed before its bound passed) or
    ``"keeper stopped"`` (the keeper died; see ``Keeper.failure``)."""

    run: str
    reason: str


class Keeper:
    """Renews every run it holds for ``owner``, ``ttl`` ms at a time.

    Renewals go in batches of at most ``MAX_RENEW`` runs, one round trip each, every
    ``renew_every`` ms (default ``ttl // 3``), on connections of the keeper's own (a Redis
    store is copied onto a pool of its own), with a deadline of at most ``renew_every``.
    After a renewal whose reply was lost (``unknown``) it sends the next at once: a renewal
    never revives a lease. ``margin`` (ms, default ``ttl // 20``, at least 1) is taken off
    every bound for clock drift.

    ``on_lost(Lost)`` is called from the keeper's thread for each run it gives up (by
    default a warning is logged). A keeper that dies (an error that is not ``Unavailable``)
    reports every run it held as lost, keeps the error in :attr:`failure`, and raises it
    from :meth:`add`. :attr:`max_lateness` is the most ms a renewal round started after it
    was due (a late round warns once it is later than half a period).
    """

    def __init__(self, store: Any, owner: str, ttl: int, *,
                 on_lost: Callable[[Lost], None] | None = None, renew_every: int | None = None,
                 margin: int | None = None) -> None:
        self.owner, self.ttl = check_owner(owner), check_ttl(ttl)
        every = ttl // 3 if renew_every is None else check_ttl(renew_every)
        self.renew_every = max(every, 1)
        self.margin = max(ttl // 20, 1) if margin is None else check_ttl(margin)
        if self.margin >= ttl:
            raise ValueError(f"margin must be under ttl ({ttl} ms), got {self.margin}")
        self._on_lost = on_lost
        # A Redis store is copied onto connections of the keeper's own (closed with it).
        dedicated = getattr(store, "_dedicated", None)
        self._owns_store = dedicated is not None
        self._store = store if dedicated is None else dedicated(self.renew_every)
        self._cond = threading.Condition()
        # run -> monotonic time the last confirmed renewal (or the taking call) was sent;
        # _unsure: run -> when it was added, for runs not confirmed yet.
        self._held: dict[str, float] = {}
        self._unsure: dict[str, float] = {}
        self._due = time.monotonic()
        self._urgent = False
        self._stopped = False
        self.failure: BaseException | None = None
        self.max_lateness = 0.0
        self._thread = threading.Thread(target=self._run, name=f"redisstore-keeper-{owner}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the caller's side

    def add(self, run: str, *, since: float | None = None) -> None:
        """Keep ``run``'s lease. ``since``: ``time.monotonic()`` read just before sending
        the call that took the lease for ``ttl`` (a claim, an insert or a write with
        ``Claim``/``Seize``); then :meth:`valid` counts from it at once. Without it the
        lease is not certain until the keeper's first renewal of it, sent at once."""
        run = check_run(run)
        with self._cond:
            self._raise_if_failed()
            if not self._held and not self._unsure:  # idle until now: a fresh schedule
                self._due = time.monotonic() + self.renew_every / 1000
            if since is None:
                self._unsure.setdefault(run, time.monotonic())
                self._held.pop(run, None)
                self._urgent = True
            else:
                self._held[run] = since
                self._unsure.pop(run, None)
            self._cond.notify()

    def add_all(self, runs: Iterable[str], *, since: float | None = None) -> None:
        """:meth:`add` for each of ``runs`` (what a claim returned)."""
        for run in runs:
            self.add(run, since=since)

    def discard(self, run: str) -> None:
        """Stop keeping ``run`` (its lease is left to run out; see :meth:`release`)."""
        with self._cond:
            self._held.pop(run, None)
            self._unsure.pop(run, None)

    def valid(self, run: str) -> bool:
        """Whether ``run``'s lease is certainly live now, by the keeper's own bound."""
        with self._cond:
            since = self._held.get(run)
        return since is not None and time.monotonic() < self._bound(since)

    @property
    def runs(self) -> list[str]:
        """The runs the keeper holds (confirmed or not yet)."""
        with self._cond:
            return [*self._held, *self._unsure]

    def release(self, runs: Iterable[str]) -> list[str]:
        """Stop keeping ``runs`` and free their leases now (``store.release``); returns the
        runs released."""
        names = check_runs(runs)
        for run in names:
            self.discard(run)
        return list(self._call("release", self.owner, names)) if names else []

    def close(self, *, release: bool = False) -> None:
        """Stop renewing; with ``release``, free every lease held (in batches). The keeper's
        own connections are closed. Idempotent."""
        with self._cond:
            already = self._stopped
            self._stopped = True
            held = [*self._held, *self._unsure]
            self._held.clear()
            self._unsure.clear()
            self._cond.notify()
        if already:
            return
        self._thread.join()
        try:
            if release and self.failure is None:
                for i in range(0, len(held), MAX_RENEW):
                    self._call("release", self.owner, held[i:i + MAX_RENEW])
        finally:
            self._finish()

    def __enter__(self) -> Keeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the keeper's side

    def _bound(self, since: float) -> float:
        return since + (self.ttl - self.margin) / 1000

    def _raise_if_failed(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the keeper of {self.owner!r} stopped: {self.failure!r}"
                               ) from self.failure
        if self._stopped:
            raise RuntimeError(f"the keeper of {self.owner!r} is closed")

    def _run(self) -> None:
        try:
            self._start()
            while True:
                with self._cond:
                    while not self._round_due():
                        holding = self._held or self._unsure
                        self._cond.wait(max(self._due - time.monotonic(), 0.0) if holding
                                        else None)
                    if self._stopped:
                        return
                    late = time.monotonic() - self._due
                    if not self._urgent and late > 0:
                        self.max_lateness = max(self.max_lateness, late * 1000)
                        if late * 1000 > self.renew_every / 2:
                            log.warning("redisstore: the keeper of %r renewed %.0f ms late",
                                        self.owner, late * 1000)
                    self._urgent = False
                    runs = [*self._held, *self._unsure]
                self._round(runs)
        except BaseException as exc:  # a keeper never goes quiet: report what it held
            with self._cond:
                self.failure = exc
                held = [*self._held, *self._unsure]
                self._held.clear()
                self._unsure.clear()
            log.error("redisstore: the keeper of %r stopped: %r", self.owner, exc)
            self._report([Lost(run, STOPPED) for run in held])

    def _round_due(self) -> bool:
        holding = bool(self._held or self._unsure)
        return (self._stopped or self._urgent
                or (holding and time.monotonic() >= self._due))

    def _round(self, runs: list[str]) -> None:
        lost: list[Lost] = []
        again = self.renew_every / 1000
        for i in range(0, len(runs), MAX_RENEW):
            batch = runs[i:i + MAX_RENEW]
            sent = time.monotonic()
            try:
                renewed = set(self._call("renew", self.owner, batch, self.ttl))
            except Unavailable as exc:
                if exc.outcome == "unknown":
                    self._urgent = True  # resend at once: it never revives a lease
                again = min(again, RETRY)
                continue
            with self._cond:
                for run in batch:
                    if run not in self._held and run not in self._unsure:
                        continue  # discarded meanwhile
                    if run in renewed:
                        self._held[run] = sent
                        self._unsure.pop(run, None)
                    else:
                        self._held.pop(run, None)
                        self._unsure.pop(run, None)
                        lost.append(Lost(run, NOT_RENEWED))
        now = time.monotonic()
        with self._cond:
            for run, since in list(self._held.items()):
                if now >= self._bound(since):
                    del self._held[run]
                    lost.append(Lost(run, DEADLINE))
            # Not confirmed since added: certainly expired ttl after it was added.
            for run, added in list(self._unsure.items()):
                if now >= added + self.ttl / 1000:
                    del self._unsure[run]
                    lost.append(Lost(run, DEADLINE))
            self._due = now + again
        self._report(lost)

    def _report(self, lost: list[Lost]) -> None:
        for item in lost:
            if self._on_lost is None:
                log.warning("redisstore: %r lost the lease of %r (%s)", self.owner, item.run,
                            item.reason)
                continue
            try:
                self._on_lost(item)
            except Exception:
                log.exception("redisstore: on_lost of the keeper of %r raised", self.owner)

    # ------------------------------------------------------------------ I/O (AsyncKeeper: its loop)

    def _start(self) -> None:
        """Runs first on the keeper's thread."""

    def _call(self, name: str, *args: Any) -> Any:
        return getattr(self._store, name)(*args)

    def _finish(self) -> None:
        if self._owns_store:
            self._store.close()


class AsyncKeeper(Keeper):
    """:class:`Keeper` for an :class:`~redisstore.AsyncRedisRunStore`: the renewals run on
    an event loop of the keeper's own thread (with connections of their own), so a busy
    event loop of the caller's does not delay them. ``add``, ``discard``, ``valid`` and
    ``runs`` are plain methods; ``await keeper.aclose(release=...)`` or ``async with``
    stops it. ``on_lost`` is called on the loop that made the keeper (``call_soon``)."""

    def __init__(self, store: Any, owner: str, ttl: int, *,
                 on_lost: Callable[[Lost], None] | None = None, renew_every: int | None = None,
                 margin: int | None = None) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        report = on_lost
        if on_lost is not None:
            caller = asyncio.get_running_loop()

            def report(lost: Lost) -> None:
                caller.call_soon_threadsafe(on_lost, lost)

        super().__init__(store, owner, ttl, on_lost=report, renew_every=renew_every,
                         margin=margin)

    async def aclose(self, *, release: bool = False) -> None:
        """:meth:`Keeper.close` without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, lambda: self.close(
            release=release))

    async def arelease(self, runs: Iterable[str]) -> list[str]:
        """:meth:`Keeper.release` without blocking the event loop."""
        names = list(runs)
        return await asyncio.get_running_loop().run_in_executor(None, self.release, names)

    async def __aenter__(self) -> AsyncKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _start(self) -> None:
        self._loop = asyncio.new_event_loop()

    def _call(self, name: str, *args: Any) -> Any:
        method: Callable[..., Coroutine[Any, Any, Any]] = getattr(self._store, name)
        loop = self._loop
        mine = threading.current_thread() is self._thread or not self._thread.is_alive()
        if loop is not None and mine and not loop.is_closed():
            return loop.run_until_complete(method(*args))
        # release() from another thread while the keeper runs: a loop of its own.
        return asyncio.run(method(*args))

    def _finish(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            if self._owns_store:
                loop.run_until_complete(self._store.aclose())
            loop.close()
