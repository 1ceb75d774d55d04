"""``MemoryRunStore``: the in-process reference of the leased run backend.

It follows the Lua scripts step by step (same eligibility times, same orders, ties broken by
run id), so a model-based test can compare the two answer for answer. Its clock is
injectable; by default it is this process's UTC clock, which here *is* the backend's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, overload

from . import repository as repo
from .errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    LeaseRefused,
    Misconfigured,
    NotFound,
    SessionLapsed,
    UnknownGroup,
)
from .feed import DEFAULT as DEFAULT_FEED
from .feed import (
    MINUTE_MS,
    RATE_SLOTS,
    Changes,
    Feed,
    Kind,
    Log,
    Rate,
    answer,
    check_changes,
    check_minutes,
    decode,
)
from .repository import InstanceRecord, Logger
from .runs import (
    MAX_CLAIM_BYTES,
    MAX_VISIT,
    MIGRATE_COUNT,
    At,
    Changed,
    Claim,
    Claimed,
    ClaimInfo,
    Current,
    Discover,
    Failure,
    Fenced,
    Free,
    Held,
    Hold,
    Holder,
    InSession,
    Kept,
    Lease,
    Migrated,
    Poll,
    Quarantined,
    Release,
    Seize,
    SessionInfo,
    Wait,
    check_failure,
    check_fenced,
    check_flag,
    check_lease,
    check_limit,
    check_listing_limit,
    check_max_takeovers,
    check_migrate_count,
    check_new_lease,
    check_owner,
    check_projection_version,
    check_record,
    check_revision,
    check_run,
    check_runs,
    check_ttl,
    check_wait,
)
from .sessions import CLOSE_STEP, Session, check_session
from .shells import wakeups
from .shells.wakeups import check_block


def system_clock() -> int:
    """This process's UTC clock in Unix milliseconds."""
    return time.time_ns() // 1_000_000


M = TypeVar("M", bound="_NothingToClose")


class _NothingToClose:
    """``close()`` and ``with``, as the Redis stores have them, so code written for those
    runs unchanged on the memory references (which hold no connections)."""

    def close(self) -> None:
        """Nothing to release: here for parity with :meth:`redisstore.RedisRunStore.close`."""

    def __enter__(self: M) -> M:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Budget:
    """The record bytes a claim with records hands back, as the scripts count them: a run
    fits while the total stays within MAX_CLAIM_BYTES, and the first run always fits."""

    def __init__(self, records: bool) -> None:
        self.records = records
        self.spent = 0

    def fits(self, record: bytes, taken: list[str]) -> bool:
        if not self.records:
            return True
        if taken and self.spent + len(record) > MAX_CLAIM_BYTES:
            return False
        self.spent += len(record)
        return True


@dataclass(slots=True)
class _Run:
    rev: int
    rec: bytes
    own: str | None = None
    exp: int = 0
    claim: ClaimInfo | None = None
    wait: Wait | None = None
    wrev: int = 0
    wpv: int = 0
    poll_time: int | None = None  # last ready-claim time of the current Poll key
    takeovers: int = 0  # expired leases handed to another owner since the run finished
    attempts: int = 0  # failed tries (failures, expired leases taken) since it finished
    grants: int = 0  # the last grant's token (the run's lease is held under it)
    not_before: int | None = None  # a failed try's back-off: no ready claim before it
    quarantine: str | None = None  # "poison" (max_takeovers) or "failed" (a failure)
    error: str | None = None  # the failure's text, while quarantined as failed
    reason: str = ""  # why it is quarantined (the listing's reason)
    session: str | None = None  # the session it is held under (its lease lives with it)

    @property
    def poisoned(self) -> bool:
        return self.quarantine == "poison"


@dataclass(slots=True)
class _Session:
    owner: str
    ttl: int
    exp: int
    runs: set[str] = field(default_factory=set)
    taken: list[str] = field(default_factory=list)  # left it by others' calls: keepalive tells


class MemoryRunStore(_NothingToClose):
    """The leased run backend kept in this process: the reference for tests.

    ``clock`` returns the backend time in UTC ms (inject one to control time in tests).
    ``discover`` and ``projection_version`` work as on :class:`redisstore.RedisRunStore`.
    Thread-safe; state is not shared across processes.
    """

    def __init__(self, *, clock: Callable[[], int] | None = None,
                 discover: Discover | None = None, projection_version: int = 1,
                 feed: Feed | None = DEFAULT_FEED) -> None:
        if discover is not None and not callable(discover):
            raise TypeError("discover must be a callable taking record bytes, or None")
        if feed is not None and not isinstance(feed, Feed):
            raise TypeError(f"feed must be a Feed or None, got {type(feed).__name__}")
        # The change feed (docs/contract.md): one log, as a store of one partition has.
        self._log = Log(feed) if feed is not None else None
        # Its per-minute counts (docs/contract.md, "Per-minute counts"): minute number ->
        # [claims, finishes, takeovers], the last RATE_SLOTS minutes kept, as the scripts'.
        self._rates: dict[int, list[int]] = {}
        self._clock = clock or system_clock
        self._discover = discover
        self._pv = check_projection_version(projection_version)
        self._runs: dict[str, _Run] = {}
        self._ready: dict[str, int] = {}
        self._dependents: dict[str, set[str]] = {}
        # The highest revision and the highest grant token a deleted run had: an id
        # inserted again starts above both (no ABA, no token used twice).
        self._deleted = [0, 0]
        # Sessions by id, and the last id given (ids are never reused).
        self._sessions: dict[str, _Session] = {}
        self._session_ids = [0]
        self._lock = threading.RLock()
        # Blocked claims wait on it; every write wakes them to look again.
        self._changed = threading.Condition(self._lock)

    def sharing(self, *, discover: Discover | None = None,
                projection_version: int = 1) -> MemoryRunStore:
        """Another store over the same runs and clock, with its own ``discover`` and
        ``projection_version``: what a second process (or a newer version of the software)
        sharing a server would be. Used by the conformance suite's staleness rules."""
        other = MemoryRunStore(clock=self._clock, discover=discover,
                               projection_version=projection_version)
        other._runs, other._ready, other._dependents = self._runs, self._ready, self._dependents
        other._deleted = self._deleted
        other._sessions, other._session_ids = self._sessions, self._session_ids
        other._lock, other._changed = self._lock, self._changed
        other._log, other._rates = self._log, self._rates
        return other

    # ------------------------------------------------------------------ the change feed

    def _note(self, owner: str | None, items: list[tuple[str, Kind, int, bool]],
              now: int | None = None, *, finished: bool = False) -> None:
        """One entry of the feed for the call that made these changes (under the lock),
        and its claims, takeovers and (``finished``: a finish) its finish counted in its
        minute, as lua/_lib/feed.lua's feed_send does."""
        if self._log is None or not items:
            return
        now = self._clock() if now is None else now
        self._log.append(now, owner, items)
        claims = sum(1 for _, kind, _, _ in items if kind == "claimed")
        takeovers = sum(1 for _, kind, _, takeover in items if kind == "claimed" and takeover)
        if claims or finished:
            minute = now // MINUTE_MS
            row = self._rates.setdefault(minute, [0, 0, 0])
            row[0] += claims
            row[1] += 1 if finished else 0
            row[2] += takeovers
            for old in [m for m in self._rates if m <= minute - RATE_SLOTS]:
                del self._rates[old]

    def rates(self, minutes: int = 60) -> list[Rate]:
        """Claims, finishes and takeovers per minute over the last ``minutes`` minutes (see
        :meth:`redisstore.RedisRunStore.rates`)."""
        minutes = check_minutes(minutes)
        if self._log is None:
            raise Misconfigured("this store was opened without a change feed (feed=None)")
        with self._lock:
            now = self._clock() // MINUTE_MS
            return [Rate(m * MINUTE_MS, *self._rates.get(m, (0, 0, 0)))
                    for m in range(now - minutes + 1, now + 1)]

    def changes(self, after: str | None = None, limit: int = 100, *,
                block: int | None = None) -> Changes:
        """The feed's events after the cursor ``after`` (None: from the oldest retained),
        at most ``limit``; with ``block``, wait up to that many ms for one. ``Compacted``
        when entries past ``after`` are gone (see docs/contract.md, "The change feed")."""
        after, limit, block = check_changes(after, limit, block)
        if self._log is None:
            raise Misconfigured("this store was opened without a change feed (feed=None)")
        log = self._log
        positions = decode(after, 1)
        deadline = time.monotonic() + (block or 0) / 1000
        with self._changed:
            while True:
                page = answer(after, [(p, log.find(p, limit)) for p in positions], limit,
                              lambda _: log.oldest())
                remaining = deadline - time.monotonic()
                if page.events or remaining <= 0:
                    return page
                self._changed.wait(min(remaining, wakeups.REARM))

    # ------------------------------------------------------------------ sessions

    def open_session(self, owner: str, ttl: int) -> Session:
        """A new session of ``owner``, live ``ttl`` ms from now (docs/contract.md,
        "Sessions")."""
        owner, ttl = check_session(owner, ttl)
        return Session(self, self._session_open(owner, ttl), owner, ttl)

    def sessions(self, limit: int = 1000) -> list[SessionInfo]:
        """Up to ``limit`` sessions, by id: live ones, and lapsed ones that still hold runs
        (expired, to be taken over)."""
        limit = check_listing_limit(limit)
        with self._lock:
            now = self._clock()
            for sid in [sid for sid, s in self._sessions.items() if s.exp <= now and not s.runs]:
                del self._sessions[sid]  # lapsed without runs: gone (as the scripts do)
            found = sorted(self._sessions.items(), key=lambda item: int(item[0]))[:limit]
            return [SessionInfo(sid, s.owner, s.exp, len(s.runs)) for sid, s in found]

    def _session_open(self, owner: str, ttl: int) -> str:
        with self._lock:
            self._session_ids[0] += 1
            sid = str(self._session_ids[0])
            self._sessions[sid] = _Session(owner, ttl, self._clock() + ttl)
            return sid

    def _live_session(self, sid: str, owner: str, now: int) -> _Session:
        """The session ``sid`` of ``owner`` while it is live; else ``SessionLapsed``."""
        session = self._sessions.get(sid)
        if session is None or session.owner != owner or session.exp <= now:
            raise SessionLapsed(sid)
        return session

    def _session_keepalive(self, sid: str, owner: str) -> Kept:
        with self._lock:
            now = self._clock()
            session = self._live_session(sid, owner, now)
            session.exp = now + session.ttl
            told = session.taken[:CLOSE_STEP]
            del session.taken[:CLOSE_STEP]
            self._changed.notify_all()  # a blocked claim waiting for the old expiry
            return Kept(told)

    def _session_claim(self, kind: str, sid: str, owner: str, ttl: int, limit: int,
                       records: bool, block: int, max_takeovers: int | None) -> list[Any]:
        # A claim of each kind of work (core/waits.py's KINDS) is its _<kind>_now, due at
        # its _<kind>_due: the store's own claim of that kind, under the session.
        take = getattr(self, f"_{kind}_now")

        def claim(now: int) -> list[Any]:
            self._live_session(sid, owner, now)  # checked at every look of a blocked claim
            claimed: list[Any] = take(owner, ttl, limit, records, max_takeovers, now, sid)
            return claimed

        return self._blocking(block if limit else 0, getattr(self, f"_{kind}_due"), claim)

    def _session_close(self, sid: str, owner: str, count: int) -> tuple[int, bool]:
        with self._lock:
            session = self._sessions.get(sid)
            if session is None or session.owner != owner:
                return 0, True
            now = self._clock()
            step = sorted(session.runs)[:count]
            for run in step:
                state = self._runs[run]
                self._leave(run, state, now, told=False)
                state.own, state.exp, state.claim = None, 0, None
                self._put_back(run, state, counters=False)
                self._reindex(run, state, now, dependency_write=False)
            self._note(owner, [(run, "released", self._runs[run].rev, False) for run in step],
                       now)
            self._changed.notify_all()
            if session.runs:
                return len(step), False
            self._sessions.pop(sid, None)
            return len(step), True

    # ------------------------------------------------------------------ reads

    def now(self) -> int:
        """The backend clock, UTC Unix milliseconds."""
        return self._clock()

    def get(self, run: str) -> Current:
        """The run's latest record, revision and holder; raises ``NotFound``."""
        run = check_run(run)
        with self._lock:
            state = self._runs.get(run)
            if state is None:
                raise NotFound(run)
            return self._current(state, self._clock())

    def get_many(self, runs: Iterable[str]) -> dict[str, Current]:
        """What :meth:`get` answers for each of ``runs`` that exists, by run, in the order
        of ``runs`` (read at one instant); a run that does not exist is absent."""
        names = check_runs(runs)
        with self._lock:
            now = self._clock()
            return {run: self._current(self._runs[run], now) for run in names
                    if run in self._runs}

    def _current(self, state: _Run, now: int) -> Current:
        return Current(state.rev, state.rec, self._holder(state, now), state.claim,
                       state.takeovers, state.grants if state.own is not None else None,
                       state.attempts, state.not_before, state.quarantine, state.session)

    # ------------------------------------------------------------------ writes

    def insert(self, run: str, record: bytes, lease: Lease) -> int:
        """Create ``run`` and return its revision: 1 (one above the highest revision a
        deleted run had); raises ``AlreadyExists`` if it exists."""
        run, record, lease = check_run(run), check_record(record), check_new_lease(lease)
        wait = self._derive(record)
        with self._lock:
            if run in self._runs:
                raise AlreadyExists(run)
            now = self._clock()
            if isinstance(lease, InSession):
                self._live_session(lease.session, lease.owner, now)
            state = self._runs[run] = _Run(rev=self._deleted[0] + 1, rec=record,
                                           grants=self._deleted[1])
            if isinstance(lease, Claim | Seize | InSession):
                self._grant(run, state, lease, now)
            self._after_write(run, state, wait, now)
            self._note(_owner_of(lease), [(run, "inserted", state.rev, False)], now)
            return state.rev

    def compare_and_set(self, run: str, expected: int, record: bytes, lease: Lease) -> None:
        """Write revision ``expected + 1`` if ``expected`` is current and the lease allows."""
        run, expected = check_run(run), check_revision(expected)
        record, lease = check_record(record), check_lease(lease)
        wait = self._derive(record)
        with self._lock:
            state, now = self._checked(run, expected, lease)
            self._written(run, state, record, lease, wait, now)
            self._note(_owner_of(lease), [(run, "written", state.rev, False)], now)

    def _written(self, run: str, state: _Run, record: bytes, lease: Lease,
                 wait: Wait | None, now: int) -> None:
        """A write accepted: the next revision with ``record``, the lease condition's
        effect, the wait. A checkpoint (``Hold``, ``Fenced`` keeping the lease) keeps the
        run's counters; every other write starts them again."""
        state.rev += 1
        state.rec = record
        keeps = isinstance(lease, Hold) or (isinstance(lease, Fenced) and not lease.release)
        self._put_back(run, state, counters=not keeps)
        state.not_before = None
        if isinstance(lease, Claim | Seize | InSession):
            self._grant(run, state, lease, now)
        elif isinstance(lease, Release) or (isinstance(lease, Fenced) and lease.release):
            self._leave(run, state, now, told=isinstance(lease, Release))
            state.own, state.exp, state.claim = None, 0, None
        self._after_write(run, state, wait, now)

    def _checked(self, run: str, expected: int, lease: Lease) -> tuple[_Run, int]:
        """The run and the time, once the revision and then the lease condition passed
        (compare_and_set's and delete's checks, in that order). Under the lock."""
        state = self._runs.get(run)
        if state is None:
            raise NotFound(run)
        if state.rev != expected:
            raise Conflict(state.rev)
        now = self._clock()
        holder = self._holder(state, now)
        if isinstance(lease, Hold):
            allowed = isinstance(holder, Held) and holder.owner == lease.owner
        elif isinstance(lease, Fenced):
            allowed = (isinstance(holder, Held) and holder.owner == lease.owner
                       and state.grants == lease.token)
        elif isinstance(lease, Claim | InSession):
            allowed = (not isinstance(holder, Held) or holder.owner == lease.owner
                       or not holder.live)
        else:
            allowed = True
        if not allowed:
            raise LeaseRefused(holder)
        if isinstance(lease, InSession):
            self._live_session(lease.session, lease.owner, now)
        return state, now

    def delete(self, run: str, expected: int, lease: Lease) -> None:
        """Remove ``run`` if ``expected`` is current and the lease allows (the checks of
        :meth:`compare_and_set`); its waiters read it as revision 0."""
        run, expected, lease = check_run(run), check_revision(expected), check_lease(lease)
        with self._lock:
            state, now = self._checked(run, expected, lease)
            self._leave(run, state, now, told=not isinstance(lease, Fenced))
            self._deleted[0] = max(self._deleted[0], state.rev)
            self._deleted[1] = max(self._deleted[1], state.grants)
            self._set_wait(run, state, None)
            del self._runs[run]
            self._ready.pop(run, None)
            self._wake_dependents(run, now)
            self._note(_owner_of(lease), [(run, "deleted", state.rev, False)], now)
            self._changed.notify_all()

    def release(self, owner: str, runs: Iterable[str]) -> list[str]:
        """Free each lease ``owner`` holds, live or expired, among ``runs``, without a new
        revision; returns those runs."""
        owner, names = check_owner(owner), check_runs(runs)
        with self._lock:
            now = self._clock()
            released = []
            for run in names:
                state = self._runs.get(run)
                if state is not None and state.own == owner:
                    self._leave(run, state, now, told=True)
                    state.own, state.exp, state.claim = None, 0, None
                    self._put_back(run, state, counters=False)
                    self._reindex(run, state, now, dependency_write=False)
                    released.append(run)
            self._note(owner, [(run, "released", self._runs[run].rev, False)
                               for run in released], now)
            self._changed.notify_all()
            return released

    def renew(self, owner: str, runs: Iterable[str], ttl: int) -> list[str]:
        """Extend each lease ``owner`` holds live among ``runs`` to ``ttl`` ms from now."""
        owner, ttl, names = check_owner(owner), check_ttl(ttl), check_runs(runs)
        with self._lock:
            now = self._clock()
            renewed = []
            for run in names:
                state = self._runs.get(run)
                if (state is not None and state.own == owner and self._expiry(state) > now
                        and not state.poisoned):
                    if state.session is None:  # a session's run lives with its session
                        state.exp = now + ttl
                    renewed.append(run)
            return renewed

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *,
                      records: Literal[False] = False, max_takeovers: int | None = None,
                      block: int | None = None) -> list[str]: ...

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *,
                      records: Literal[True], max_takeovers: int | None = None,
                      block: int | None = None) -> list[Claimed]: ...

    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
                      max_takeovers: int | None = None,
                      block: int | None = None) -> list[str] | list[Claimed]:
        """Claim up to ``limit`` held, expired leases, the longest-expired first; with
        ``records``, as :class:`Claimed` values; with ``max_takeovers``, a run already taken
        over that many times goes to the quarantine instead; with ``block``, wait for one (see
        :meth:`redisstore.RedisRunStore.claim_expired`)."""
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        records = check_flag("records", records)
        max_takeovers = check_max_takeovers(max_takeovers)
        wait = check_block(block)
        return self._blocking(wait if limit else 0, self._leases_due, lambda now: (
            self._leases_now(owner, ttl, limit, records, max_takeovers, now)))

    def _leases_now(self, owner: str, ttl: int, limit: int, records: bool,
                    max_takeovers: int | None, now: int,
                    session: str | None = None) -> list[str] | list[Claimed]:
        expired = sorted((self._expiry(s), run) for run, s in self._runs.items()
                         if s.own is not None and self._expiry(s) <= now and not s.poisoned)
        budget = _Budget(records)
        claimed: list[str] = []
        events: list[tuple[str, Kind, int, bool]] = []
        # As the script: it visits at most limit + MAX_VISIT index entries.
        for _, run in expired[:limit + MAX_VISIT]:
            if len(claimed) == limit:
                break
            state = self._runs[run]
            takeover = state.own != owner
            if takeover and max_takeovers is not None and state.takeovers >= max_takeovers:
                state.quarantine, state.reason = "poison", f"takeovers={state.takeovers}"
                events.append((run, "quarantined", state.rev, False))
                continue
            if not budget.fits(state.rec, claimed):
                break
            self._take_expired(run, state, owner, now + ttl, session)
            claimed.append(run)
            events.append((run, "claimed", state.rev, takeover))
        self._note(owner, events, now)
        if claimed:
            self._changed.notify_all()  # new leases: blocked claim_expired calls look again
        return self._claimed(claimed, records, now)

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *,
                    records: Literal[False] = False, block: int | None = None) -> list[str]: ...

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *,
                    records: Literal[True], block: int | None = None) -> list[Claimed]: ...

    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
                    block: int | None = None) -> list[str] | list[Claimed]:
        """Claim up to ``limit`` free runs whose wait is eligible, the earliest first; with
        ``records``, as :class:`Claimed` values; with ``block``, wait for one (see
        :meth:`redisstore.RedisRunStore.claim_ready`)."""
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        records = check_flag("records", records)
        wait = check_block(block)
        return self._blocking(wait if limit else 0, self._ready_due, lambda now: (
            self._ready_now(owner, ttl, limit, records, None, now)))

    @overload
    def claim(self, owner: str, ttl: int, limit: int = 1, *,
              records: Literal[False] = False, block: int | None = None,
              max_takeovers: int | None = None) -> list[str]: ...

    @overload
    def claim(self, owner: str, ttl: int, limit: int = 1, *,
              records: Literal[True], block: int | None = None,
              max_takeovers: int | None = None) -> list[Claimed]: ...

    def claim(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
              block: int | None = None,
              max_takeovers: int | None = None) -> list[str] | list[Claimed]:
        """Claim up to ``limit`` runs of both kinds, ready runs and expired leases, in due
        order across both, each as :meth:`claim_ready` or :meth:`claim_expired` takes it;
        with ``block``, wait for either (see :meth:`redisstore.RedisRunStore.claim`)."""
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        records = check_flag("records", records)
        max_takeovers = check_max_takeovers(max_takeovers)
        wait = check_block(block)
        return self._blocking(wait if limit else 0, self._any_due, lambda now: (
            self._any_now(owner, ttl, limit, records, max_takeovers, now)))

    def _any_due(self) -> int | None:
        return min((t for t in (self._ready_due(), self._leases_due()) if t is not None),
                   default=None)

    def _any_now(self, owner: str, ttl: int, limit: int, records: bool,
                 max_takeovers: int | None, now: int,
                 session: str | None = None) -> list[str] | list[Claimed]:
        # As the script: the two indexes merged by (due time, id bytes), each visited at
        # most limit + MAX_VISIT times, each entry handled as the claim of its kind does.
        budget = _Budget(records)
        claimed: list[str] = []
        events: list[tuple[str, Kind, int, bool]] = []
        visits = {"ready": 0, "leases": 0}
        while len(claimed) < limit:
            due = [(t, run.encode("utf-8", "surrogateescape"), "ready", run)
                   for run, t in self._ready.items()
                   if t <= now and visits["ready"] < limit + MAX_VISIT]
            due += [(self._expiry(s), run.encode("utf-8", "surrogateescape"), "leases", run)
                    for run, s in self._runs.items()
                    if s.own is not None and self._expiry(s) <= now and not s.poisoned
                    and visits["leases"] < limit + MAX_VISIT]
            if not due:
                break
            _, _, kind, run = min(due)
            visits[kind] += 1
            state = self._runs[run]
            if kind == "ready":
                at = self._eligible_at(state, now)
                if at is None:
                    del self._ready[run]
                elif at > now:
                    self._ready[run] = at
                elif not budget.fits(state.rec, claimed):
                    break
                else:
                    self._claim_ready(run, state, owner, now, ttl, session)
                    claimed.append(run)
                    events.append((run, "claimed", state.rev, False))
                continue
            takeover = state.own != owner
            if takeover and max_takeovers is not None and state.takeovers >= max_takeovers:
                state.quarantine, state.reason = "poison", f"takeovers={state.takeovers}"
                events.append((run, "quarantined", state.rev, False))
                continue
            if not budget.fits(state.rec, claimed):
                break
            self._take_expired(run, state, owner, now + ttl, session)
            claimed.append(run)
            events.append((run, "claimed", state.rev, takeover))
        self._note(owner, events, now)
        if claimed:
            self._changed.notify_all()  # new leases: blocked claims look again
        return self._claimed(claimed, records, now)

    def _blocking(self, block: int, due: Callable[[], int | None],
                  claim: Callable[[int], list[Any]]) -> list[Any]:
        """Claim; with ``block``, until something comes or ``block`` ms pass. A waiting
        claim looks again after every write, at the next due time (read on the store's
        clock, waited in real time) and at least every REARM seconds."""
        deadline = time.monotonic() + block / 1000
        with self._changed:
            while True:
                claimed = claim(self._clock())
                remaining = deadline - time.monotonic()
                if claimed or remaining <= 0:
                    return claimed
                at = due()
                if at is not None:
                    remaining = min(remaining, max(at - self._clock(), 1) / 1000)
                self._changed.wait(min(remaining, wakeups.REARM))

    def _wait_for_work(self, seconds: float, event: threading.Event) -> None:
        """A worker's wait for work: until a write (every one wakes the waiters),
        :meth:`_nudge`, or ``seconds``."""
        with self._changed:
            if not event.is_set():
                self._changed.wait(seconds)

    def _nudge(self) -> None:
        """Wake every worker waiting for work (a stopping worker's loops)."""
        with self._changed:
            self._changed.notify_all()

    def _ready_due(self) -> int | None:
        return min(self._ready.values(), default=None)

    def _leases_due(self) -> int | None:
        return min((self._expiry(s) for s in self._runs.values()
                    if s.own is not None and not s.poisoned), default=None)

    def _claim_ready_runs(self, owner: str, ttl: int, limit: int, records: bool,
                          now: int, session: str | None = None) -> list[str] | list[Claimed]:
        budget = _Budget(records)
        claimed: list[str] = []
        while len(claimed) < limit:
            due = sorted((t, run) for run, t in self._ready.items() if t <= now)
            if not due:
                break
            for _, run in due[: limit - len(claimed)]:
                state = self._runs[run]
                at = self._eligible_at(state, now)
                if at is not None and at <= now:
                    if not budget.fits(state.rec, claimed):
                        return self._claimed(claimed, records, now)
                    self._claim_ready(run, state, owner, now, ttl, session)
                    self._changed.notify_all()  # a new lease
                    claimed.append(run)
                elif at is None:
                    del self._ready[run]
                else:
                    self._ready[run] = at
        return self._claimed(claimed, records, now)

    def _ready_now(self, owner: str, ttl: int, limit: int, records: bool,
                   max_takeovers: int | None, now: int, session: str | None = None
                   ) -> list[str] | list[Claimed]:
        # max_takeovers plays no part: a ready run is free.
        claimed = self._claim_ready_runs(owner, ttl, limit, records, now, session)
        runs = [c if isinstance(c, str) else c.run for c in claimed]
        self._note(owner, [(run, "claimed", self._runs[run].rev, False) for run in runs], now)
        return claimed

    def _claimed(self, runs: list[str], records: bool,
                 now: int) -> list[str] | list[Claimed]:
        if not records:
            return runs
        return [Claimed(run, self._current(self._runs[run], now)) for run in runs]

    def refresh(self, run: str) -> bool:
        """Re-derive the run's wait from its current record; True if it now has one."""
        run = check_run(run)
        with self._lock:
            state = self._runs.get(run)
            if state is None:
                raise NotFound(run)
            wait = self._derive(state.rec)
            self._set_wait(run, state, wait)
            self._reindex(run, state, self._clock(), dependency_write=False)
            self._changed.notify_all()
            return wait is not None

    def migrate(self, *, count: int = MIGRATE_COUNT) -> Migrated:
        """Nothing to move: memory has one layout (the Redis stores' counterpart)."""
        check_migrate_count(count)
        return Migrated()

    def quarantined(self, limit: int = 1000) -> list[Quarantined]:
        """The poison runs ``claim_expired(..., max_takeovers=N)`` stopped handing out and
        the runs a failure quarantined (the memory store keeps no index a foreign write
        could damage)."""
        limit = check_listing_limit(limit)
        with self._lock:
            found = sorted((s.quarantine, run) for run, s in self._runs.items()
                           if s.quarantine is not None)
            return [Quarantined(index, run, self._runs[run].reason, self._runs[run].error)
                    for index, run in found[:limit]]

    def finish(self, run: str, expected: int, lease: Fenced, *, record: bytes | None = None,
               failure: Failure | None = None) -> None:
        """End the grant ``lease`` (see :meth:`redisstore.RedisRunStore.finish`)."""
        run, expected, lease = check_run(run), check_revision(expected), check_fenced(lease)
        failure = check_failure(failure)
        if record is not None:
            record = check_record(record)
            if failure is not None:
                raise ValueError("finish takes a record or a failure, not both")
        wait = None if record is None else self._derive(record)
        with self._lock:
            state, now = self._checked(run, expected, lease)
            if record is not None:
                self._written(run, state, record, Fenced(lease.owner, lease.token, True),
                              wait, now)
                self._note(lease.owner, [(run, "written", state.rev, False)], now,
                           finished=True)
                return
            self._leave(run, state, now, told=False)
            state.own, state.exp, state.claim = None, 0, None
            self._put_back(run, state, counters=False)
            if failure is not None:
                state.attempts += 1
                if failure.final or (failure.max_attempts is not None
                                     and state.attempts >= failure.max_attempts):
                    state.quarantine, state.error = "failed", failure.error
                    state.reason = "final" if failure.final else f"attempts={state.attempts}"
                else:
                    state.not_before = now + failure.delay if failure.delay else None
            kind: Kind = "quarantined" if state.quarantine is not None else "released"
            self._note(lease.owner, [(run, kind, state.rev, False)], now, finished=True)
            self._reindex(run, state, now, dependency_write=False)
            self._changed.notify_all()

    def restore(self, run: str, expected: int | None = None) -> bool:
        """Put a quarantined run back: its counters and back-off cleared, claimable as its
        lease and wait say; whether it was quarantined. With ``expected``, only at that
        revision: else ``Conflict(current)``, nothing changed."""
        run = check_run(run)
        if expected is not None:
            expected = check_revision(expected)
        with self._lock:
            state = self._runs.get(run)
            if state is None:
                raise NotFound(run)
            if expected is not None and state.rev != expected:
                raise Conflict(state.rev)
            if state.quarantine is None:
                return False
            state.quarantine, state.error, state.reason = None, None, ""
            state.takeovers = state.attempts = 0
            state.not_before = None
            now = self._clock()
            self._reindex(run, state, now, dependency_write=False)
            self._note(None, [(run, "restored", state.rev, False)], now)
            self._changed.notify_all()
            return True

    # ------------------------------------------------------------------ the scripts' steps

    def _derive(self, record: bytes) -> Wait | None:
        return None if self._discover is None else check_wait(self._discover(record))

    def _holder(self, state: _Run, now: int) -> Holder:
        if state.own is None:
            return Free()
        return Held(state.own, self._expiry(state) > now)

    def _expiry(self, state: _Run) -> int:
        """When the run's lease expires: its own expiry, or its session's."""
        if state.session is None:
            return state.exp
        return self._sessions[state.session].exp

    def _grant(self, run: str, state: _Run, lease: Claim | Seize | InSession, now: int) -> None:
        """The grant of an accepted Claim, Seize or InSession condition."""
        if isinstance(lease, InSession):
            self._take(run, state, lease.owner, 0, lease.session)
        else:
            self._take(run, state, lease.owner, now + lease.ttl)

    def _take(self, run: str, state: _Run, owner: str, exp: int,
              session: str | None = None) -> None:
        """A grant: ``owner`` holds the run until ``exp`` (or while ``session`` lives),
        under a new token. A run it takes from another session leaves that one (told)."""
        if state.own != owner:
            state.claim = None
        if state.session != session:
            self._leave(run, state, self._clock(), told=True)
            if session is not None:
                self._sessions[session].runs.add(run)
                state.session = session
        state.own, state.exp = owner, exp
        state.grants += 1
        self._ready.pop(run, None)

    def _leave(self, run: str, state: _Run, now: int, *, told: bool) -> None:
        """The run leaves its session, if it has one (its lease ends or goes elsewhere);
        ``told``: by another's call, which the session's next keepalive reports. A lapsed
        session left without runs is gone."""
        if state.session is None:
            return
        session = self._sessions[state.session]
        session.runs.discard(run)
        if told:
            session.taken.append(run)
        if not session.runs and session.exp <= now:
            del self._sessions[state.session]
        state.session = None

    def _take_expired(self, run: str, state: _Run, owner: str, exp: int,
                      session: str | None = None) -> None:
        """A claim of an expired lease: the try it ended counts as failed; handed to
        another owner, it is a takeover."""
        if state.own != owner:
            state.takeovers += 1
        state.attempts += 1
        self._take(run, state, owner, exp, session)

    def _claim_ready(self, run: str, state: _Run, owner: str, now: int, ttl: int,
                     session: str | None = None) -> None:
        wait = state.wait
        key: str | None = None
        dep_rev: int | None = None
        if isinstance(wait, Changed):
            key, dep_rev = wait.dependency, self._revision(wait.dependency)
        elif isinstance(wait, Poll):
            key, state.poll_time = wait.key, now
        self._take(run, state, owner, now + ttl, session)
        state.claim = ClaimInfo(key, dep_rev, now)

    def _revision(self, run: str) -> int:
        state = self._runs.get(run)
        return 0 if state is None else state.rev

    def _eligible_at(self, state: _Run, now: int) -> int | None:
        wait = state.wait
        if (state.own is not None or wait is None or state.wrev != state.rev
                or state.wpv < self._pv or state.quarantine is not None):
            return None
        at: int | None = None
        deadline: int | None = None
        if isinstance(wait, At):
            at = wait.due
        elif isinstance(wait, Poll):
            at = now if state.poll_time is None else state.poll_time + wait.interval
            deadline = wait.deadline
        else:
            if wait.seen is None or self._revision(wait.dependency) != wait.seen:
                at = now
            deadline = wait.deadline
        if deadline is not None and (at is None or deadline < at):
            at = deadline
        if at is not None and state.not_before is not None and state.not_before > at:
            at = state.not_before
        return at

    def _reindex(self, run: str, state: _Run, now: int, *, dependency_write: bool) -> None:
        at = self._eligible_at(state, now)
        if at is None:
            self._ready.pop(run, None)
            return
        if dependency_write and at == now:
            old = self._ready.get(run)
            if old is not None and old <= now:
                return
        self._ready[run] = at

    def _set_wait(self, run: str, state: _Run, wait: Wait | None) -> None:
        old = state.wait
        if isinstance(old, Changed) and (
                not isinstance(wait, Changed) or wait.dependency != old.dependency):
            self._dependents.get(old.dependency, set()).discard(run)
        if isinstance(wait, Changed):
            self._dependents.setdefault(wait.dependency, set()).add(run)
        if not (isinstance(wait, Poll) and isinstance(old, Poll) and old.key == wait.key):
            state.poll_time = None
        state.wait, state.wrev, state.wpv = wait, state.rev, self._pv

    @staticmethod
    def _put_back(run: str, state: _Run, *, counters: bool) -> None:
        """A write (``counters``: one that starts the counters again) or a release: a
        quarantined run is out of the quarantine; a poison one's count restarts."""
        if state.quarantine == "poison":
            state.takeovers = 0
        state.quarantine, state.error, state.reason = None, None, ""
        if counters:
            state.takeovers = state.attempts = 0

    def _after_write(self, run: str, state: _Run, wait: Wait | None, now: int) -> None:
        self._set_wait(run, state, wait)
        self._reindex(run, state, now, dependency_write=False)
        self._wake_dependents(run, now)
        self._changed.notify_all()  # blocked claims look again

    def _wake_dependents(self, run: str, now: int) -> None:
        for waiter in sorted(self._dependents.get(run, ())):
            self._reindex(waiter, self._runs[waiter], now, dependency_write=True)



def _owner_of(lease: Lease) -> str | None:
    """The owner a lease condition names (None: ``Release()``)."""
    return None if isinstance(lease, Release) else lease.owner


def _order(expiry: datetime | None) -> float | int:
    """Where a record sorts in a listing: -inf without a lease, else its expiry in µs."""
    return float("-inf") if expiry is None else repo.to_us(expiry)


def _order_score(text: str) -> float | int:
    """A cursor's position back from its text (memory writes '-inf' or exact µs)."""
    if text == "-inf":
        return float("-inf")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"cursor must be one a page returned, got a score {text!r}") from None


class MemoryRepository(_NothingToClose):
    """The instance repository kept in this process: the reference for tests.

    Records are stored and returned as copies (values are immutable and payloads are
    ``bytes``). Terminal records are capped at ``max_terminal``, the oldest to become
    terminal evicted first with a warning to ``logger``; other records are kept
    unconditionally. ``now=None`` in :meth:`list_in_flight` is this process's UTC clock,
    which here *is* the backend's. Thread-safe; state is not shared across processes.
    """

    def __init__(self, *, max_terminal: int = 1024, logger: Logger | None = None) -> None:
        self._max_terminal = repo.check_max_terminal(max_terminal)
        self._logger: Logger = logger if logger is not None else repo.log
        self._records: dict[str, InstanceRecord] = {}
        self._groups: set[str] = set()
        # id -> when it became terminal; dicts keep insertion order, so the first is oldest.
        self._terminal: dict[str, int] = {}
        self._terminal_seq = 0
        self._lock = threading.RLock()

    def save(self, rec: InstanceRecord) -> int:
        """Store ``rec`` iff ``rec.rec_version`` is the stored version (0 creates)."""
        rec = repo.check_record(rec)
        with self._lock:
            if rec.group not in self._groups:
                raise UnknownGroup(rec.group)
            old = self._records.get(rec.id)
            stored = 0 if old is None else old.rec_version
            if rec.rec_version != stored:
                raise ConcurrentUpdate(rec.id, rec.rec_version, stored)
            self._records[rec.id] = replace(rec, payload=bytes(rec.payload),
                                            rec_version=stored + 1)
            if not repo.is_terminal(rec.status):
                self._terminal.pop(rec.id, None)
            elif rec.id not in self._terminal:
                self._terminal_seq += 1
                self._terminal[rec.id] = self._terminal_seq
            # At most MAX_EVICT per save, as the Redis script does (the rest go later).
            for _ in range(min(len(self._terminal) - self._max_terminal, repo.MAX_EVICT)):
                evicted = next(iter(self._terminal))
                del self._terminal[evicted]
                del self._records[evicted]
                self._logger.warning(
                    "redisstore: evicted terminal instance %r: more than max_terminal=%d "
                    "terminal records are kept (the oldest go first)", evicted,
                    self._max_terminal)
            return stored + 1

    def load(self, id: str) -> InstanceRecord | None:
        """The record stored under ``id``, or None."""
        id = repo.check_id(id)
        with self._lock:
            return self._records.get(id)

    def delete(self, id: str, *, expected_version: int | None = None) -> None:
        """Remove the record for ``id``; a no-op when there is none. With
        ``expected_version``, only while the stored ``rec_version`` is that one."""
        id = repo.check_id(id)
        fence = repo.check_expected_version(expected_version)
        with self._lock:
            stored = self._records.get(id)
            if fence is not None and stored is not None and stored.rec_version != fence:
                raise ConcurrentUpdate(id, fence, stored.rec_version)
            self._records.pop(id, None)
            self._terminal.pop(id, None)

    def list_in_flight(self, group: str, now: datetime | None = None) -> list[str]:
        """Ids of ``group``'s records that are not terminal, not suspended, and whose lease
        is expired or absent at ``now`` (None: this process's clock), in the Redis order."""
        group, when = repo.check_group(group), repo.check_now(now)
        return [id for _, id in self._listing(group, datetime.now(UTC) if when is None
                                              else when)]

    def list_in_flight_page(self, group: str, now: datetime | None = None, *,
                            cursor: str | None = None,
                            limit: int = repo.MAX_PAGE) -> repo.InFlightPage:
        """One page of :meth:`list_in_flight`: at most ``limit`` ids after ``cursor`` (None:
        the start); the page's cursor is None once the listing is complete. ``now=None`` is
        this process's clock at the first page, carried by the cursor."""
        group, when = repo.check_group(group), repo.check_now(now)
        limit, position = repo.check_page_limit(limit), repo.check_cursor(cursor)
        at = repo.to_us(datetime.now(UTC)) if when is None else repo.to_us(when)
        if position is not None and when is None:
            at = int(position[0])
        try:
            instant = repo.from_us(at)
        except OverflowError:
            raise ValueError(f"cursor must be one a page returned, got {cursor!r}") from None
        listing = self._listing(group, instant)
        if position is not None:
            last = (_order_score(position[1]), position[2])
            listing = [entry for entry in listing if entry > last]
        page = listing[:limit]
        if len(listing) <= limit:
            return repo.InFlightPage(tuple(id for _, id in page), None)
        score, id = page[-1]
        return repo.InFlightPage(tuple(id for _, id in page), f"{at}|{score}|{id}")

    def _listing(self, group: str, at: datetime) -> list[tuple[float | int, str]]:
        """The claimable (order, id) pairs of ``group`` at ``at``, in the Redis order: no
        lease first, then by expiry, ties by id."""
        with self._lock:
            listed = [(_order(rec.lease.expiry), id) for id, rec in self._records.items()
                      if rec.group == group and repo.record_class(rec.status) == "c"
                      and rec.lease.expired(at)]
        listed.sort()
        return listed

    def register_group(self, group: str) -> None:
        """Establish ``group`` (idempotent)."""
        group = repo.check_group(group)
        with self._lock:
            self._groups.add(group)

    def group_exists(self, group: str) -> bool:
        """Whether ``group`` is registered."""
        group = repo.check_group(group)
        with self._lock:
            return group in self._groups

    def migrate(self) -> None:
        """Nothing to prepare in memory; idempotent by nature."""

    def cluster_compatibility(self) -> tuple[bool, str]:
        """``(False, reason)``: the state lives in this process only."""
        return False, "in-memory; state is not shared across nodes"
