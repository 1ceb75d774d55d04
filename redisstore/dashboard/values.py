"""What the dashboard's pages show and ask: its values and the :class:`Source` seam.

The pages (:mod:`redisstore.dashboard.app`), the live feed, the chart and the actions speak
these; :class:`~redisstore.dashboard.source.StoreSource` implements :class:`Source` over a
server. Apart from it, so the pages stand below the stores they read through it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.runs import Current, Free, Held, Rate

#: The states a namespace's runs are counted in, as the pages and /metrics name them.
STATES = ("held_live", "held_expired", "ready_now", "waiting_time", "quarantined")

#: Most entries one page of a listing shows (one ZRANGE of this many per index).
PAGE = 50


class NoFeed(Exception):
    """The store has no change feed (yet): the live reader polls :meth:`Source.counts`."""


@dataclass(frozen=True, slots=True)
class Counts:
    """A namespace's runs by state, from its indexes at server time ``now`` (ms).
    ``waiting_time``: free runs due later (an ``At``, a ``Poll`` interval, a deadline, a
    back-off); runs waiting only for a dependency are in no scored index (see
    :class:`ScanResult`)."""

    namespace: str
    now: int
    partitions: int
    held_live: int
    held_expired: int
    ready_now: int
    waiting_time: int
    quarantined: int

    def by_state(self) -> dict[str, int]:
        return {state: getattr(self, state) for state in STATES}


#: One minute of a namespace's activity, as the store counts it (:class:`redisstore.Rate`):
#: claims, finishes and takeovers in the minute starting at backend ms ``minute``.
MinuteCounts = Rate


@dataclass(frozen=True, slots=True)
class Change:
    """One event of the change feed: ``kind`` is ``inserted``, ``written``, ``claimed``
    (``takeover`` when it took another owner's expired lease), ``released``, ``deleted``,
    ``quarantined`` or ``restored``; ``time`` the server's ms; ``cursor`` where a reader
    resumes after it."""

    namespace: str
    run: str
    revision: int | None
    kind: str
    owner: str | None
    time: int
    cursor: str
    takeover: bool = False


@dataclass(frozen=True, slots=True)
class Entry:
    """One index entry: a run and its score (lease expiry or eligible time, backend ms)."""

    run: str
    score: int


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing, and where the next starts (None: this was the last)."""

    entries: list[Entry]
    next: str | None


@dataclass(frozen=True, slots=True)
class QuarantinePage:
    """One page of the quarantine: ``(index, run, reason, error)`` rows, the next HSCAN
    cursor (None: done)."""

    rows: list[tuple[str, str, str, str | None]]
    next: str | None


@dataclass(frozen=True, slots=True)
class Owner:
    """Runs one owner holds among the lease entries read, and its soonest expiry (ms)."""

    owner: str
    runs: int
    live: int
    soonest: int


@dataclass(frozen=True, slots=True)
class Owners:
    """The owners of one slice of the leases index (in expiry order): ``read`` entries of
    ``total``; ``complete`` when the slice reached the end, so the counts are exact."""

    rows: list[Owner]
    read: int
    total: int
    complete: bool
    next: str | None
    now: int


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as its page shows it."""

    namespace: str
    run: str
    current: Current
    now: int
    expiry: int | None
    due: int | None
    quarantine_error: str | None
    record_text: str
    record_json: bool
    record_bytes: int
    record_cut: bool


@dataclass(frozen=True, slots=True)
class Seen:
    """What a page showed of a run, which an action must still find: its revision and its
    grant (``owner`` and ``token``; both None when it was free)."""

    revision: int
    owner: str | None = None
    token: int | None = None

    def matches(self, current: Current) -> bool:
        held = current.holder.owner if isinstance(current.holder, Held) else None
        return (current.revision, held, current.token) == (self.revision, self.owner,
                                                           self.token)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action did: ``done``, or refused with ``reason`` and the run as it is now
    (None: it no longer exists)."""

    done: bool
    reason: str
    now: RunView | None = None


@dataclass(slots=True)
class ScanResult:
    """What one explicit scan of the server found (the keyspace walked by SCAN, bounded):
    the run namespaces (those with a meta key or an index), runs and dependency sets per
    namespace, and whether the walk reached the end."""

    at: float
    namespaces: dict[str, dict[str, int]] = field(default_factory=dict)
    visited_calls: int = 0
    complete: bool = False


class Source(ABC):
    """What the dashboard reads and does. Every method is bounded: no page's call may
    stall the server."""

    #: Where the data comes from, safe to show (credentials redacted).
    label: str = ""

    @abstractmethod
    def namespaces(self) -> list[str]:
        """The namespaces known now: those given, and those the last scan found."""

    @abstractmethod
    def counts(self, namespace: str) -> Counts:
        """``namespace``'s runs by state."""

    @abstractmethod
    def listing(self, namespace: str, state: str, after: str | None = None,
                limit: int = PAGE) -> Page:
        """One page of ``namespace``'s runs in ``state`` (a scored state of
        :data:`STATES`), after the cursor ``after`` (a previous page's ``next``)."""

    @abstractmethod
    def quarantine(self, namespace: str, after: str | None = None,
                   limit: int = PAGE) -> QuarantinePage:
        """One page of ``namespace``'s quarantine."""

    @abstractmethod
    def owners(self, namespace: str, after: str | None = None) -> Owners:
        """Who holds ``namespace``'s runs, over one slice of its leases index."""

    @abstractmethod
    def run(self, namespace: str, run: str) -> RunView | None:
        """One run (None: it does not exist)."""

    @abstractmethod
    def release_seen(self, namespace: str, run: str, seen: Seen) -> Outcome:
        """Free the run's lease, only under the grant and at the revision ``seen``."""

    @abstractmethod
    def restore_seen(self, namespace: str, run: str, seen: Seen) -> Outcome:
        """Put a quarantined run back, only while it is as ``seen``."""

    @abstractmethod
    def delete_seen(self, namespace: str, run: str, seen: Seen) -> Outcome:
        """Delete the run, only at the revision and under the holder ``seen``."""

    def scan(self) -> ScanResult | None:
        """Walk the server for namespaces (an operator's explicit refresh only); None when
        this source cannot."""
        return None

    def last_scan(self) -> ScanResult | None:
        """The last scan's result, or None."""
        return None

    def rates(self, namespace: str) -> list[MinuteCounts] | None:
        """Claims, finishes and takeovers per minute over the last hour, oldest first; None
        where the namespace keeps no counts (no change feed: ``Feed()`` switches both on)."""
        return None

    def events(self, namespace: str, run: str, limit: int = 20) -> list[Change]:
        """The run's recent events, newest first: from the change feed, once the store has
        one; empty until then."""
        return []

    def changes(self, namespace: str, after: str | None, limit: int = 100,
                block: int | None = None) -> list[Change]:
        """The feed's events after the cursor ``after`` (None: from now), at most
        ``limit``, waiting up to ``block`` ms for one. :class:`NoFeed` while the store
        has no feed: the live reader then polls :meth:`counts`. ``Compacted`` when events
        past ``after`` are gone."""
        raise NoFeed(namespace)

    def tail(self, namespace: str) -> str | None:
        """A feed cursor past every event of ``namespace``'s feed now (what a page that
        opens now has seen), or None where it keeps no feed."""
        return None

    def close(self) -> None:  # noqa: B027 - a source that opened nothing has nothing to do
        """Let go of what the source opened."""


def holder_text(current: Current) -> str:
    """Who holds the run, as a page says it."""
    if isinstance(current.holder, Free):
        return "free"
    return current.holder.owner


def as_seen(current: Current) -> Seen:
    """What a page showing ``current`` asks an action to find."""
    held = current.holder.owner if isinstance(current.holder, Held) else None
    return Seen(current.revision, held, current.token if held is not None else None)


def states_present(counts: Sequence[Counts]) -> dict[str, int]:
    """Totals by state over several namespaces."""
    return {state: sum(getattr(c, state) for c in counts) for state in STATES}
