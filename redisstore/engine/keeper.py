"""Lease keepers: a background renewal of every run a node holds, so that an engine does not
write its own renewal thread.

``Keeper(store, owner, ttl)`` (any sync run store) and ``AsyncKeeper(store, owner, ttl)`` (an
:class:`~redisstore.AsyncRedisRunStore`) each run in a thread of their own, on connections
of their own: a saturated pool, a busy event loop or a slow caller does not delay a renewal.
Every call to the store is made on that thread (``release`` too), so an asyncio keeper's
event loop and connections never leave it.

What ``valid(run)`` promises: the lease is live *now*. It is counted from the moment the
last renewal the server confirmed was *sent* (a renewal runs on the server after it is
sent, and makes the lease last ``ttl`` from then), by this process's monotonic clock, minus
a margin for the two clocks' drift. ``valid`` turns false at that bound; a run the keeper
could not confirm by then is reported lost (within ``renew_every``) and never renewed
again: a renewal never revives a lease, and the keeper never sends one for a run it gave
up. Each time a run is added it is a new entry: a renewal sent for an earlier one of the
same id (released and taken again meanwhile) never counts for it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from ..core import telemetry
from ..core.errors import Closed, SessionLapsed, StoreError, Unavailable
from ..core.runs import (
    MAX_RENEW,
    check_owner,
    check_run,
    check_runs,
    check_session_id,
    check_ttl,
)

log = logging.getLogger("redisstore.keeper")  # the name it always had

#: Why a keeper gave a run up (``Lost.reason``).
NOT_RENEWED = "not renewed"  # the store answered without it: expired, or another owner's now
DEADLINE = "deadline"  # no renewal confirmed within the keeper's own bound
STOPPED = "keeper stopped"  # the keeper died (``Keeper.failure``) holding it

#: After a renewal that failed, the runs it did not renew are tried again this soon (s),
#: then twice as late after each failure in a row, at most a period apart; a renewal of
#: unknown outcome is sent again at once, once.
RETRY = 0.05


@dataclass(frozen=True, slots=True)
class Lost:
    """A run whose lease the keeper no longer holds, and why: ``"not renewed"`` (the store
    answered without it), ``"deadline"`` (no renewal confirmed before its bound passed) or
    ``"keeper stopped"`` (the keeper died; see ``Keeper.failure``)."""

    run: str
    reason: str


@dataclass(slots=True)
class _Entry:
    gen: int  # which add() made it: a reply to a renewal of another entry never counts
    since: float | None  # monotonic time the confirming call was sent; None: not yet
    added: float
    session: str | None = None  # the session it is held under (None: a lease of its own)


class Keeper:
    """Renews every run it holds for ``owner``, ``ttl`` ms at a time.

    Renewals go in batches of at most ``MAX_RENEW`` runs, one round trip each, every
    ``renew_every`` ms (default ``ttl // 3``), on connections of the keeper's own (a Redis
    store is copied onto a pool of its own), with a deadline of at most ``renew_every``.
    The runs a renewal failed to renew are tried again on their own, 50 ms later, then
    twice as late after each failure in a row, at most ``renew_every`` apart; after a
    renewal whose reply was lost (``unknown``) the first try again goes at once: a renewal
    never revives a lease. Of a store of partitions with some partitions failing, the runs
    the others renewed count as renewed (``Unavailable.done``) and only the failed
    partitions' runs are tried again (``Unavailable.unanswered``), and once a batch failed,
    the round's later batches leave those partitions' runs out. ``margin`` (ms, default
    ``ttl // 20``, at least 1) is taken off every bound for clock drift.

    With ``session`` (a :class:`~redisstore.Session` of ``owner``, its id, or an
    :class:`~redisstore.AsyncSession`'s; ``since``, ``time.monotonic()`` read before it was
    opened), the keeper keeps that session alive instead: one keepalive every
    ``renew_every`` ms whatever the number of runs, held or not; the runs it holds are the
    session's (:meth:`add` counts each run's bound from the session's last confirmed
    keepalive); a run the keepalive reports taken from the session is lost (``not
    renewed``), and so is every run once the session lapsed (:attr:`lapsed` is then set:
    open another and :meth:`use`). On a store of partitions, a keepalive that finds the
    session lapsed in some partitions only loses the runs held there (:attr:`lapsed_in`
    names those partitions), and the runs of a partition it did not reach keep their bound;
    a session replaced by :meth:`use` (or :meth:`open_session`) while it still lives and
    holds runs is kept alive too until it holds none, then closed. ``close(release=True)``
    closes the session (and those).

    ``on_lost(Lost)`` is called from the keeper's thread for each run it gives up (by
    default a warning is logged). A keeper that dies (an error that is not ``Unavailable``)
    reports every run it held as lost, keeps the error in :attr:`failure`, and raises it
    from :meth:`add`. :attr:`max_lateness` is the most ms a renewal round started after it
    was due (a late round warns once it is later than half a period).
    """

    def __init__(self, store: Any, owner: str, ttl: int, *,
                 on_lost: Callable[[Lost], None] | None = None, renew_every: int | None = None,
                 margin: int | None = None, session: Any = None,
                 since: float | None = None) -> None:
        self.owner, self.ttl = check_owner(owner), check_ttl(ttl)
        # The session kept alive (its id), and when its last keepalive (or its opening) was
        # sent: every run of it is live until that bound at least.
        self._session: str | None = None
        self._session_since = time.monotonic() if since is None else since
        #: Set once the session lapsed (a keepalive refused): every run of it was lost.
        self.lapsed = threading.Event()
        #: On a store of partitions, the partitions where the session kept now lapsed
        #: while others live (their runs were lost; its claims leave them out): a Worker
        #: opens another session then (:meth:`use`), and this keeper keeps the old one
        #: alive too while it holds runs of it.
        self.lapsed_in: frozenset[int] = frozenset()
        # Sessions replaced while still live somewhere (id -> when their last keepalive was
        # sent), kept alive until no run held is theirs.
        self._retiring: dict[str, float] = {}
        if session is not None:
            self._session = check_session_id(getattr(session, "id", session))
        every = ttl // 3 if renew_every is None else check_ttl(renew_every)
        self.renew_every = max(every, 1)
        self.margin = max(ttl // 20, 1) if margin is None else check_ttl(margin)
        if self.margin >= ttl:
            raise ValueError(f"margin must be under ttl ({ttl} ms), got {self.margin}")
        self._on_lost = on_lost
        # A Redis store is copied onto connections of the keeper's own (closed with it).
        dedicated = getattr(store, "_dedicated", None)
        self._store = store if dedicated is None else dedicated(self.renew_every)
        self._owns_store = (self._store is not store
                            and getattr(self._store, "_keeper_closes", True))
        # The partition of a run (a store without partitions: one place for every run).
        self._place: Callable[[str], int] = getattr(self._store, "_place", lambda run: 0)
        self._cond = threading.Condition()
        self._held: dict[str, _Entry] = {}
        self._gen = 0
        self._due = time.monotonic()
        self._urgent = False
        # The runs (and their entries' gen) the last renewal did not answer for, tried again
        # on their own at _retry_at; the next pause after a failure, and whether the one
        # prompt resend after an unknown outcome was spent in this streak of failures.
        self._retry: dict[str, int] = {}
        self._retry_at = float("inf")
        self._backoff = RETRY
        self._resent = False
        self._stopped = False
        self._release_on_close = False
        # Releases asked of the keeper's thread (runs), and session openings (None).
        self._requests: list[tuple[list[str] | None, concurrent.futures.Future[Any]]] = []
        #: When the keeper's thread wakes next on its own (monotonic; 0: it is not asleep).
        self._waking = 0.0
        self.failure: BaseException | None = None
        self.max_lateness = 0.0
        self._thread = threading.Thread(target=self._run, name=f"redisstore-keeper-{owner}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the caller's side

    @property
    def session(self) -> str | None:
        """The id of the session the keeper keeps alive (None: per-run leases)."""
        return self._session

    def use(self, session: Any, *, since: float) -> None:
        """Keep ``session`` alive from now on (one opened after the last one lapsed; ``since``
        as at construction)."""
        sid = check_session_id(getattr(session, "id", session))
        with self._cond:
            self._raise_if_stopped()
            self._using(sid, since)
            self._cond.notify()

    def _using(self, sid: str, since: float) -> None:
        """Keep session ``sid`` alive from now on, its bound from ``since`` (under the lock).
        One it replaces that is live somewhere and holds runs is kept alive as well, until
        it holds none."""
        old = self._session
        if old is not None and old != sid and not self.lapsed.is_set() \
                and any(e.session == old for e in self._held.values()):
            self._retiring[old] = self._session_since
        self._session, self._session_since = sid, since
        self.lapsed.clear()
        self.lapsed_in = frozenset()
        self._due = since + self.renew_every / 1000

    def add(self, run: str, *, since: float | None = None) -> None:
        """Keep ``run``'s lease. ``since``: ``time.monotonic()`` read just before sending
        the call that took the lease for ``ttl`` (a claim, an insert or a write with
        ``Claim``/``Seize``); then :meth:`valid` counts from it at once. Without it the
        lease is not certain until the keeper's first renewal of it, sent at once."""
        run = check_run(run)
        now = time.monotonic()
        if since is not None and (type(since) not in (float, int) or since > now + 0.001):
            raise ValueError(f"since must be a time.monotonic() reading of the past, got "
                             f"{since!r}")
        with self._cond:
            self._raise_if_stopped()
            if self._session is not None:
                # A session's run lives with the session: its bound is the session's.
                self._gen += 1
                self._held[run] = _Entry(self._gen, self._session_since, now, self._session)
                return
            if not self._held:  # idle until now: a fresh schedule
                self._due = now + self.renew_every / 1000
            self._gen += 1
            self._held[run] = _Entry(self._gen, since, now)
            if since is None:
                self._urgent = True
            else:
                self._due = min(self._due, since + self.renew_every / 1000)
                self._urgent = self._urgent or self._due <= now
            # Wake the keeper's thread only if it must act before it would wake anyway: a
            # worker adds and discards a run per claim, and a wake-up per run (a thread
            # switch, the lock passed back and forth) cost more than the run's own call.
            if self._urgent or self._due < self._waking:
                self._cond.notify()

    def add_all(self, runs: Iterable[str], *, since: float | None = None) -> None:
        """:meth:`add` for each of ``runs`` (what a claim returned)."""
        for run in runs:
            self.add(run, since=since)

    def discard(self, run: str) -> None:
        """Stop keeping ``run`` (its lease is left to run out; see :meth:`release`)."""
        with self._cond:
            self._held.pop(run, None)

    def valid(self, run: str) -> bool:
        """Whether ``run``'s lease is certainly live now, by the keeper's own bound."""
        with self._cond:
            entry = self._held.get(run)
            since = None if entry is None or self._stopped else entry.since
        return since is not None and time.monotonic() < self._bound(since)

    @property
    def runs(self) -> list[str]:
        """The runs the keeper holds (confirmed or not yet)."""
        with self._cond:
            return [] if self._stopped else list(self._held)

    def release(self, runs: Iterable[str]) -> list[str]:
        """Stop keeping ``runs`` and free their leases now (``store.release``, sent by the
        keeper's thread); returns the runs released."""
        return self._submit(runs).result()

    def close(self, *, release: bool = False) -> None:
        """Stop renewing; with ``release``, free every lease held (in batches). The keeper's
        own connections are closed. Idempotent; may be called from ``on_lost``."""
        self._stop(release)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _stop(self, release: bool) -> None:
        """Ask the keeper's thread to end (releasing what it holds, if asked)."""
        with self._cond:
            if not self._stopped:
                self._stopped = True
                self._release_on_close = release
                self._cond.notify()

    def __enter__(self) -> Keeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the keeper's side

    def open_session(self) -> str:
        """Open a session of the keeper's owner and ttl on the keeper's own connections and
        keep it alive from then on (the keeper holds a session's runs from then on; a
        Worker's is opened so); its id. ``Closed`` once the keeper is."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            self._raise_if_stopped()
            self._requests.append((None, future))
            self._cond.notify()
        return str(future.result())

    def _submit(self, runs: Iterable[str]) -> concurrent.futures.Future[list[str]]:
        names = check_runs(runs)
        future: concurrent.futures.Future[list[str]] = concurrent.futures.Future()
        with self._cond:
            for run in names:
                self._held.pop(run, None)
            if not names:
                future.set_result([])
            elif self._stopped:
                future.set_exception(Closed(f"the keeper of {self.owner!r} is closed"))
            else:
                self._requests.append((names, future))
                self._cond.notify()
        return future

    def _bound(self, since: float) -> float:
        return since + (self.ttl - self.margin) / 1000

    def _raise_if_stopped(self) -> None:
        if self.failure is not None:
            raise Closed(f"the keeper of {self.owner!r} stopped: {self.failure!r}"
                               ) from self.failure
        if self._stopped:
            raise Closed(f"the keeper of {self.owner!r} is closed")

    def _round_due(self) -> bool:
        now = time.monotonic()
        return (self._stopped or self._urgent or bool(self._requests)
                or ((bool(self._held) or self._session is not None) and now >= self._due)
                or (bool(self._retry) and now >= self._retry_at))

    def _next_wake(self) -> float:
        """How long the keeper's thread may sleep: until its next round or retry, or, idle,
        a period (so that a run added meanwhile, due a period after it, needs no wake-up)."""
        if not self._held and self._session is None:
            return self.renew_every / 1000
        soonest = min(self._due, self._retry_at) if self._retry else self._due
        return max(soonest - time.monotonic(), 0.0)

    def _run(self) -> None:
        try:
            self._start()
            while True:
                with self._cond:
                    while not self._round_due():
                        sleep = self._next_wake()
                        self._waking = time.monotonic() + sleep
                        self._cond.wait(sleep)
                        self._waking = 0.0
                    if self._stopped:
                        return
                    requests, self._requests = self._requests, []
                    late = time.monotonic() - self._due
                    if not self._urgent and not requests and late > 0:
                        self.max_lateness = max(self.max_lateness, late * 1000)
                        telemetry.keeper_lateness(late * 1000)
                        if late * 1000 > self.renew_every / 2:
                            log.warning("redisstore: the keeper of %r renewed %.0f ms late",
                                        self.owner, late * 1000)
                    now = time.monotonic()
                    # A round renews every run held; between rounds, a retry renews only
                    # the runs the last renewal did not answer for.
                    full = self._urgent or ((bool(self._held) or self._session is not None)
                                            and now >= self._due)
                    retry = not full and bool(self._retry) and now >= self._retry_at
                    self._urgent = False
                    retrying = [(run, gen) for run, gen in self._retry.items()
                                if (e := self._held.get(run)) is not None and e.gen == gen]
                    # The runs the last renewal answered for first: a batch of them is
                    # not held up by a partition that failed.
                    snapshot = ([(run, entry.gen) for run, entry in self._held.items()
                                 if run not in self._retry] + retrying if full else
                                retrying if retry else None)
                for names, future in requests:
                    self._answer(names, future)
                if snapshot is not None:
                    self._round(snapshot, full)
        except BaseException as exc:  # a keeper never goes quiet: report what it held
            with self._cond:
                self.failure = exc
                held = list(self._held)
                self._held.clear()
            log.error("redisstore: the keeper of %r stopped: %r", self.owner, exc)
            self._report([Lost(run, STOPPED) for run in held])
        finally:
            self._shutdown()

    def _answer(self, names: list[str] | None, future: concurrent.futures.Future[Any]) -> None:
        try:
            if names is None:
                since = time.monotonic()
                sid = str(self._call("_session_open", self.owner, self.ttl))
                with self._cond:
                    self._using(sid, since)
                future.set_result(sid)
                return
            future.set_result(list(self._call("release", self.owner, names)))
        except Exception as exc:
            future.set_exception(exc)

    def _round(self, snapshot: list[tuple[str, int]], full: bool = True) -> None:
        """Renew ``snapshot``'s runs (every run held when ``full``, else the ones the last
        renewal did not answer for) and schedule the next round and retry. Once a batch
        failed, the runs of its failed partitions (of a store of one partition: every run)
        are not sent in the later batches of the round: they would wait for the same node
        (a hung one takes a batch its deadline); they are tried again first."""
        if self._session is not None:
            self._keepalive_round(snapshot)
            return
        lost: list[Lost] = []
        unanswered: dict[str, int] = {}
        skipped: dict[str, int] = {}
        down: set[int] = set()  # the partitions that failed in this round
        failed = unknown = False
        started = time.monotonic()
        queue = collections.deque(snapshot)
        try:
            while queue:
                self._expire(lost)  # a long round: the bounds of the next batch first
                batch: list[tuple[str, int]] = []
                with self._cond:
                    while queue and len(batch) < MAX_RENEW:
                        run, gen = queue.popleft()
                        if (e := self._held.get(run)) is None or e.gen != gen:
                            continue
                        if down and self._place(run) in down:
                            skipped[run] = gen
                        else:
                            batch.append((run, gen))
                if not batch:
                    continue
                sent = time.monotonic()
                missed: set[str] = set()
                try:
                    renewed = set(self._call("renew", self.owner, [r for r, _ in batch],
                                             self.ttl))
                except Unavailable as exc:
                    failed = True
                    unknown = unknown or exc.outcome == "unknown"
                    if exc.done is None or exc.unanswered is None:
                        renewed, missed = set(), {run for run, _ in batch}
                    else:  # a store of partitions: what the partitions that answered did
                        renewed, missed = set(exc.done), set(exc.unanswered)
                    down.update(self._place(run) for run in missed)
                with self._cond:
                    for run, gen in batch:
                        entry = self._held.get(run)
                        if entry is None or entry.gen != gen:
                            continue  # discarded, or added again: not this renewal's
                        if run in renewed:
                            entry.since = sent
                        elif run in missed:
                            unanswered[run] = gen  # not confirmed: its own bound decides
                        else:
                            del self._held[run]
                            lost.append(Lost(run, NOT_RENEWED))
            self._expire(lost)
            with self._cond:
                now = time.monotonic()
                if full:  # a period from the round's start (a slow round: the next at once)
                    self._due = started + self.renew_every / 1000
                self._retry = {run: gen for run, gen in (*skipped.items(),
                                                         *unanswered.items())
                               if (e := self._held.get(run)) is not None and e.gen == gen}
                self._next_retry(now, failed, unknown)
        finally:
            self._report(lost)

    def _next_retry(self, now: float, failed: bool, unknown: bool) -> None:
        """After a round (under the lock), when the runs in ``_retry`` go again: the back-off
        starts over after a round that did not fail; after a lost reply (``unknown``) the
        first retry goes at once, once in a streak (a renewal never revives a lease); else
        after the back-off, which doubles up to a period."""
        if not failed:
            self._backoff, self._resent = RETRY, False
        if not self._retry:
            self._retry_at = float("inf")
        elif unknown and not self._resent:
            self._resent = True
            self._retry_at = now
        else:
            self._retry_at = now + self._backoff
            self._backoff = min(self._backoff * 2, self.renew_every / 1000)

    def _keepalive_round(self, snapshot: list[tuple[str, int]]) -> None:
        """A session's round: one keepalive for every run (and one for each replaced
        session that still holds runs). The runs it reports taken are lost; once the session
        lapsed, all of them are; on a store of partitions, those of the partitions where it
        lapsed are, and those of the partitions it did not reach keep their bound (they
        are lost when it passes). Unanswered, the round is tried again as a renewal is (the
        runs' bound decides, :meth:`_expire`)."""
        lost: list[Lost] = []
        started = time.monotonic()
        failed = unknown = False
        with self._cond:
            session = self._session
            held = {e.session for e in self._held.values()}
            done = [old for old in self._retiring if old not in held]
            for old in done:
                del self._retiring[old]
            sessions = [session, *self._retiring]
        try:
            for old in done:  # holds nothing of ours: ended (a failed close lets it lapse)
                with contextlib.suppress(StoreError):
                    while not self._call("_session_close", old, self.owner, MAX_RENEW)[1]:
                        pass
            self._expire(lost)
            for sid in sessions:
                if sid is None:
                    continue
                f, u = self._keepalive(sid, sid == session, lost)
                failed, unknown = failed or f, unknown or u
            self._expire(lost)
            with self._cond:
                now = time.monotonic()
                self._due = started + self.renew_every / 1000
                # A failed keepalive goes again on its own (the entries only mark it due).
                self._retry = ({run: gen for run, gen in snapshot} or {"": 0}) if failed else {}
                self._next_retry(now, failed, unknown)
        finally:
            self._report(lost)

    def _keepalive(self, session: str, current: bool, lost: list[Lost]) -> tuple[bool, bool]:
        """One keepalive of ``session`` (the one kept, when ``current``, else a replaced one)
        and what it says of the runs held under it: (failed, outcome unknown)."""
        sent = time.monotonic()
        try:
            told = self._call("_session_keepalive", session, self.owner)
        except SessionLapsed:
            telemetry.session_keepalive("lapsed", 0)
            with self._cond:
                if current and self._session == session:
                    self.lapsed.set()
                self._retiring.pop(session, None)
                for run, entry in list(self._held.items()):
                    if entry.session == session:
                        del self._held[run]
                        lost.append(Lost(run, NOT_RENEWED))
            return False, False
        except Unavailable as exc:
            return True, exc.outcome == "unknown"
        telemetry.session_keepalive("kept", len(told))
        # A store of partitions: where it lapsed, and where this keepalive did not reach.
        gone: frozenset[int] = getattr(told, "lapsed", frozenset())
        away: frozenset[int] = getattr(told, "unanswered", frozenset())
        taken = set(told)
        with self._cond:
            if current and self._session == session:
                if not away:  # a run added now may be of a partition it did not reach
                    self._session_since = sent
                self.lapsed_in = gone
            elif session in self._retiring:
                self._retiring[session] = sent
            for run, entry in list(self._held.items()):
                if entry.session != session:
                    continue
                if run in taken or (gone and self._place(run) in gone):
                    del self._held[run]
                    lost.append(Lost(run, NOT_RENEWED))
                elif not (away and self._place(run) in away):
                    entry.since = sent
        return bool(away), False

    def _expire(self, lost: list[Lost]) -> None:
        """Give up every run whose bound passed without a confirmed renewal."""
        now = time.monotonic()
        with self._cond:
            for run, entry in list(self._held.items()):
                # A run not confirmed since it was added was taken before that.
                start = entry.added if entry.since is None else entry.since
                if now >= self._bound(start):
                    del self._held[run]
                    lost.append(Lost(run, DEADLINE))

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

    def _shutdown(self) -> None:
        """On the keeper's thread, as it ends: release if asked, close its connections."""
        with self._cond:
            self._stopped = True
            held = list(self._held)
            self._held.clear()
            requests, self._requests = self._requests, []
        for _, future in requests:
            future.set_exception(Closed(f"the keeper of {self.owner!r} is closed"))
        try:
            if self._release_on_close and self._session is not None:
                if self.failure is None:
                    for sid in [self._session, *self._retiring]:
                        done = False
                        while not done:  # Session.close's steps, from the keeper's store
                            _, done = self._call("_session_close", sid, self.owner,
                                                 MAX_RENEW)
            elif self._release_on_close and held:
                if self.failure is not None:
                    log.warning("redisstore: the keeper of %r stopped (%r): its leases are "
                                "not released", self.owner, self.failure)
                else:
                    kept: list[str] = []
                    for i in range(0, len(held), MAX_RENEW):
                        try:
                            self._call("release", self.owner, held[i:i + MAX_RENEW])
                        except Unavailable as exc:  # the other batches are released still
                            kept.extend(held[i:i + MAX_RENEW] if exc.unanswered is None
                                        else exc.unanswered)
                    if kept:
                        log.warning("redisstore: the keeper of %r could not release %d "
                                    "leases (their store did not answer): they run out",
                                    self.owner, len(kept))
        except Exception as exc:
            log.warning("redisstore: the keeper of %r could not release its leases: %r",
                        self.owner, exc)
        finally:
            self._finish()

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
    ``runs`` are plain methods; ``await keeper.arelease(runs)``, ``await
    keeper.aclose(release=...)`` and ``async with`` do not block the event loop. ``on_lost``
    is called on the loop that made the keeper (``call_soon_threadsafe``)."""

    def __init__(self, store: Any, owner: str, ttl: int, *,
                 on_lost: Callable[[Lost], None] | None = None, renew_every: int | None = None,
                 margin: int | None = None, session: Any = None,
                 since: float | None = None) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        report = on_lost
        if on_lost is not None:
            caller = asyncio.get_running_loop()

            def report(lost: Lost) -> None:
                if caller.is_closed():
                    log.warning("redisstore: %r lost the lease of %r (%s)", owner, lost.run,
                                lost.reason)
                else:
                    caller.call_soon_threadsafe(on_lost, lost)

        super().__init__(store, owner, ttl, on_lost=report, renew_every=renew_every,
                         margin=margin, session=session, since=since)

    def release(self, runs: Iterable[str]) -> list[str]:
        """:meth:`Keeper.release` from a thread without a running event loop; on one, use
        :meth:`arelease`."""
        self._not_on_a_loop("release", "arelease")
        return super().release(runs)

    def close(self, *, release: bool = False) -> None:
        """:meth:`Keeper.close` from a thread without a running event loop (or from
        ``on_lost``); on one, use :meth:`aclose`."""
        if threading.current_thread() is not self._thread:
            self._not_on_a_loop("close", "aclose")
        super().close(release=release)

    async def arelease(self, runs: Iterable[str]) -> list[str]:
        """:meth:`Keeper.release` without blocking the event loop."""
        return await asyncio.wrap_future(self._submit(runs))

    async def aclose(self, *, release: bool = False) -> None:
        """:meth:`Keeper.close` without blocking the event loop."""
        self._stop(release)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def __enter__(self) -> Keeper:
        raise TypeError("AsyncKeeper: use async with (or await aclose())")

    async def __aenter__(self) -> AsyncKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @staticmethod
    def _not_on_a_loop(name: str, instead: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(f"AsyncKeeper.{name}() would block the running event loop: "
                           f"await {instead}() instead")

    def _start(self) -> None:
        self._loop = asyncio.new_event_loop()

    def _call(self, name: str, *args: Any) -> Any:
        assert self._loop is not None
        method: Callable[..., Coroutine[Any, Any, Any]] = getattr(self._store, name)
        return self._loop.run_until_complete(method(*args))

    def _finish(self) -> None:
        loop = self._loop
        if loop is not None:
            try:
                if self._owns_store:
                    loop.run_until_complete(self._store.aclose())
            finally:
                loop.close()
