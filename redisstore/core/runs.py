"""The leased run backend port: its values, its interface and argument checks.

Values are immutable and hashable. Constructors check their own fields, so a bad lease or
wait is refused where it is made, before any store sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias, overload, runtime_checkable

from .caps import Cap as Cap
from .errors import NotFound

# A ttl, an interval or a timestamp must stay exact in a Lua double (2^53) once added to the
# backend clock; 2^47 ms is about 4,400 years, far beyond any sensible lease.
MAX_MS = 2**47
#: The highest revision a run can reach: every revision is exact in a Lua double.
MAX_REVISION = 2**53 - 1

MAX_CLAIM = int(Cap.MAX_CLAIM)
MAX_RENEW = int(Cap.MAX_RENEW)
MAX_VISIT = int(Cap.MAX_VISIT)
MAX_TEXT = int(Cap.MAX_TEXT)
MAX_RECORD_CEILING = int(Cap.MAX_RECORD_CEILING)
MAX_CLAIM_BYTES = int(Cap.MAX_CLAIM_BYTES)
#: Default cap on a record's size (a store's ``max_record_bytes``).
MAX_RECORD = 1 << 20


def check_text(name: str, value: object, *, empty: bool = False, cap: int = MAX_TEXT) -> str:
    """A str argument, non-empty unless ``empty``, at most ``cap`` (MAX_TEXT) bytes of
    UTF-8 (which it must encode to): TypeError / ValueError otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value and not empty:
        raise ValueError(f"{name} must not be empty")
    if len(value) > cap // 4:  # only then can the UTF-8 be over the cap
        try:
            size = len(value.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"{name} is not encodable as UTF-8: {exc}") from None
        if size > cap:
            raise ValueError(f"{name} is {size} bytes of UTF-8, over the cap of {cap}")
    elif not value.isascii():
        try:
            value.encode("utf-8", "surrogateescape")  # as protocol.text decoded it
        except UnicodeEncodeError as exc:
            raise ValueError(f"{name} is not encodable as UTF-8: {exc}") from None
    return value


def check_flag(name: str, value: object) -> bool:
    """A bool argument (an int or anything else is a TypeError: ``records=1`` is a typo
    more often than a choice)."""
    if type(value) is not bool:
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return value


def check_int(name: str, value: object, *, minimum: int, maximum: int = MAX_MS) -> int:
    """An int argument (not a bool) within [minimum, maximum]."""
    if type(value) is not int:  # not a bool, nor an int subclass the wire may refuse
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def _check_optional_int(name: str, value: object, *, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum=minimum)


def _check_taking(owner: object, ttl: object) -> None:
    """A lease that is taken: a non-empty owner, a ttl in ms > 0."""
    check_text("owner", owner)
    check_int("ttl", ttl, minimum=1)


# ---------------------------------------------------------------------------- holders


@dataclass(frozen=True, slots=True)
class Free:
    """Nobody holds the lease."""


@dataclass(frozen=True, slots=True)
class Held:
    """``owner`` holds the lease; ``live`` while its expiry is ahead of the backend clock."""

    owner: str
    live: bool


Holder: TypeAlias = Free | Held

# ---------------------------------------------------------------------------- leases


@dataclass(frozen=True, slots=True)
class Hold:
    """Write only while ``owner`` holds the lease (live or expired); leave the lease as is."""

    owner: str

    def __post_init__(self) -> None:
        check_text("owner", self.owner)


@dataclass(frozen=True, slots=True)
class Claim:
    """Write while the lease is free, held by ``owner`` or expired; then hold it ``ttl`` ms."""

    owner: str
    ttl: int

    def __post_init__(self) -> None:
        _check_taking(self.owner, self.ttl)


@dataclass(frozen=True, slots=True)
class Seize:
    """Write whoever holds the lease; then ``owner`` holds it ``ttl`` ms."""

    owner: str
    ttl: int

    def __post_init__(self) -> None:
        _check_taking(self.owner, self.ttl)


@dataclass(frozen=True, slots=True)
class Release:
    """Write whoever holds the lease; then it is free."""


@dataclass(frozen=True, slots=True)
class Fenced:
    """Write only while ``owner`` holds the lease under the grant ``token``
    (``Current.token``, live or expired): no claim, ``Claim``, ``Seize`` or release came
    since that grant. Then the lease stays (a checkpoint), or with ``release=True`` it is
    free (the run's step is finished: its attempts and takeovers start again from 0)."""

    owner: str
    token: int
    release: bool = False

    def __post_init__(self) -> None:
        check_text("owner", self.owner)
        check_int("token", self.token, minimum=1, maximum=MAX_REVISION)
        check_flag("release", self.release)


@dataclass(frozen=True, slots=True)
class InSession:
    """Write as :class:`Claim` does (while the lease is free, held by ``owner`` or
    expired); then ``owner`` holds it under the session ``session`` (its id,
    ``Session.id``): live exactly while the session is. Refused (``LeaseRefused``) unless
    that session is ``owner``'s and live. ``Session.lease`` makes one."""

    owner: str
    session: str

    def __post_init__(self) -> None:
        check_text("owner", self.owner)
        check_session_id(self.session)


def check_session_id(session: object) -> str:
    """A session id as ``open_session`` gives them: 1 to 20 decimal digits."""
    if not isinstance(session, str):
        raise TypeError(f"session must be a session id (str), not {type(session).__name__}")
    if not (0 < len(session) <= 20 and session.isascii() and session.isdigit()):
        raise ValueError(f"session must be a session id (decimal digits), got {session!r}")
    return session


Lease: TypeAlias = Hold | Claim | Seize | Release | Fenced | InSession

#: The most bytes of UTF-8 a :class:`Failure`'s error text may hold.
MAX_ERROR = int(Cap.MAX_ERROR)


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed try of a run tells :meth:`~redisstore.RedisRunStore.finish`: the run's
    ``attempts`` go up by one; then it is quarantined (``quarantined()`` lists it under
    ``failed`` with ``error``) if ``final`` or once ``attempts`` reach ``max_attempts``, else
    it is free and held back from ready claims for ``delay`` ms (its ``not_before``).
    ``error`` is at most ``MAX_ERROR`` (1 KiB) of UTF-8."""

    error: str
    delay: int = 0
    max_attempts: int | None = None
    final: bool = False

    def __post_init__(self) -> None:
        check_text("error", self.error, empty=True, cap=MAX_ERROR)
        check_int("delay", self.delay, minimum=0)
        if self.max_attempts is not None:
            check_int("max_attempts", self.max_attempts, minimum=1, maximum=2**31)
        check_flag("final", self.final)

# ---------------------------------------------------------------------------- reads


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """What a ``claim_ready`` saw when it claimed the run.

    ``key`` is the Poll key or the dependency id (None for an ``At`` wait),
    ``dependency_revision`` the dependency's revision it saw (None unless ``Changed``),
    ``claimed_at`` the backend time of the claim (UTC ms).
    """

    key: str | None
    dependency_revision: int | None
    claimed_at: int


@dataclass(frozen=True, slots=True)
class Current:
    """A run as stored: its revision, record bytes, lease holder and ready-claim info;
    ``takeovers``, how many times a claim handed its expired lease to another owner, and
    ``attempts``, its failed tries (``finish`` with a failure, and every expired lease a
    claim took), both since it last finished; ``token``, the grant that holds it (None
    while free: see :class:`Fenced`); ``not_before``, the backend time before which a ready
    claim leaves it (None: none); ``quarantined``, ``"failed"`` or ``"poison"`` while it is
    out of every claim (None: not); ``session``, the id of the session it is held under
    (None: a lease of its own, or free)."""

    revision: int
    record: bytes
    holder: Holder
    claim: ClaimInfo | None = None
    takeovers: int = 0
    token: int | None = None
    attempts: int = 0
    not_before: int | None = None
    quarantined: str | None = None
    session: str | None = None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as listed (``store.sessions()``): its ``id`` and ``owner``, ``expires``
    (backend ms; a lapsed session's runs are expired from then on) and the ``runs`` it
    holds."""

    id: str
    owner: str
    expires: int
    runs: int


class Kept(list[str]):
    """What a keepalive answers: the runs taken from the session since the last one (a
    list of run ids). On a store of partitions, also ``lapsed``: the partitions where the
    session is not live (it lapsed there, or was never opened there: their runs are lost,
    and its claims leave them out), and ``unanswered``: those this keepalive did not reach
    (their runs stay live only until the session's expiry there). Both empty on a store of
    one partition, where a lapsed session raises ``SessionLapsed``."""

    __slots__ = ("lapsed", "unanswered")

    def __init__(self, told: Iterable[str] = (), *, lapsed: frozenset[int] = frozenset(),
                 unanswered: frozenset[int] = frozenset()) -> None:
        super().__init__(told)
        self.lapsed = lapsed
        self.unanswered = unanswered


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run that a claim with ``records=True`` handed out, as it stands once claimed
    (``current.holder`` is the claimer's live lease): no ``get`` needed after the claim."""

    run: str
    current: Current


@dataclass(frozen=True, slots=True)
class Quarantined:
    """An index entry a claim dropped as damaged: ``index`` (``"leases"``, ``"ready"``, or
    ``"d:<dependency>"``) pointed at ``run``, which was ``reason`` (``"missing"``,
    ``"type"`` for a key of another type, or the name of the corrupt field). A poison run
    that ``claim_expired(..., max_takeovers=N)`` stopped handing out is listed under the
    index ``"poison"`` with the reason ``"takeovers=N"``; a run a failure quarantined,
    under ``"failed"`` with the reason ``"attempts=N"`` or ``"final"`` and its ``error``."""

    index: str
    run: str
    reason: str
    #: The error text of a run quarantined by a failure (``index == "failed"``), else None.
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Migrated:
    """What a store's ``migrate()`` did: runs ``moved`` to the current layout (5),
    ``damaged`` runs left as they were (``quarantined()`` lists them under the index
    ``"migrate"``), the ``steps`` (one bounded script each) it took, and the index
    ``entries`` it moved from layout 4's buckets to the flat indexes."""

    moved: int = 0
    damaged: int = 0
    steps: int = 0
    entries: int = 0

    def then(self, step: tuple[int, bool, int, int]) -> Migrated:
        """This report after one more step (moved, done, damaged, entries)."""
        return Migrated(self.moved + step[0], self.damaged + step[2], self.steps + 1,
                        self.entries + step[3])


#: Keys one migration step visits (SCAN COUNT); docs/runs.md gives the cost.
MIGRATE_COUNT = int(Cap.MAX_MIGRATE)


def check_migrate_count(count: object) -> int:
    """A migration step's SCAN COUNT: an int in [1, MIGRATE_COUNT]."""
    return check_int("count", count, minimum=1, maximum=MIGRATE_COUNT)


# ---------------------------------------------------------------------------- readiness


@dataclass(frozen=True, slots=True)
class Changed:
    """Wait for ``dependency`` to reach a revision other than ``seen`` (None: never seen).

    An absent dependency counts as revision 0. ``deadline`` (backend UTC ms) makes the run
    eligible on its own once reached.
    """

    dependency: str
    seen: int | None = None
    deadline: int | None = None

    def __post_init__(self) -> None:
        check_text("dependency", self.dependency)
        _check_optional_int("seen", self.seen, minimum=0)
        _check_optional_int("deadline", self.deadline, minimum=0)


@dataclass(frozen=True, slots=True)
class Poll:
    """Observe ``key`` every ``interval`` ms: due at once the first time, then ``interval``
    after each ready claim. ``deadline`` (backend UTC ms) makes it eligible on its own."""

    key: str
    interval: int
    deadline: int | None = None

    def __post_init__(self) -> None:
        check_text("key", self.key)
        check_int("interval", self.interval, minimum=1)
        _check_optional_int("deadline", self.deadline, minimum=0)


@dataclass(frozen=True, slots=True)
class At:
    """Eligible from backend UTC ms ``due`` on; a claim does not consume it."""

    due: int

    def __post_init__(self) -> None:
        check_int("due", self.due, minimum=0)


Wait: TypeAlias = Changed | Poll | At
#: What a store is given to derive a run's wait from its record bytes (None: no wait).
Discover: TypeAlias = Callable[[bytes], Wait | None]

# ---------------------------------------------------------------------------- checks


def check_run(run: object) -> str:
    """A run id: a non-empty str."""
    return check_text("run", run)


def check_owner(owner: object) -> str:
    """A lease owner: a non-empty str."""
    return check_text("owner", owner)


def check_ttl(ttl: object) -> int:
    """A lease ttl in ms: an int > 0."""
    return check_int("ttl", ttl, minimum=1)


def check_limit(limit: object) -> int:
    """A claim limit: an int in [0, MAX_CLAIM]."""
    return check_int("limit", limit, minimum=0, maximum=MAX_CLAIM)


def check_listing_limit(limit: object) -> int:
    """How many entries a listing such as ``quarantined`` returns: an int in [0, 2**31]
    (the listing is read in bounded steps, so a large limit costs only what exists)."""
    return check_int("limit", limit, minimum=0, maximum=2**31)


def check_max_takeovers(value: object) -> int | None:
    """``claim_expired``'s ``max_takeovers``: None (no bound) or an int in [0, 2**31]."""
    return None if value is None else check_int("max_takeovers", value, minimum=0,
                                                maximum=2**31)


def check_revision(expected: object) -> int:
    """An expected revision: an int in [0, 2**53 - 2] (its successor stays exact in Lua)."""
    return check_int("expected", expected, minimum=0, maximum=MAX_REVISION - 1)


def check_record(record: object, limit: int = MAX_RECORD) -> bytes:
    """Record bytes: exactly ``bytes`` (a copy is not needed: bytes are immutable), at most
    ``limit`` bytes."""
    if type(record) is not bytes:
        raise TypeError(f"record must be bytes, not {type(record).__name__}")
    if len(record) > limit:
        raise ValueError(f"record is {len(record)} bytes, over the cap of {limit} "
                         "(max_record_bytes)")
    return record


def check_max_record(value: object) -> int:
    """A store's ``max_record_bytes``: 1 .. MAX_RECORD_CEILING."""
    return check_int("max_record_bytes", value, minimum=1, maximum=MAX_RECORD_CEILING)


def check_lease(lease: object) -> Lease:
    """One of Hold, Claim, Seize, Release, Fenced, InSession."""
    if not isinstance(lease, Hold | Claim | Seize | Release | Fenced | InSession):
        raise TypeError("lease must be Hold, Claim, Seize, Release, Fenced or InSession, "
                        f"not {type(lease).__name__}")
    return lease


def check_new_lease(lease: object) -> Lease:
    """An insert's lease: one of Hold, Claim, Seize, Release (a new run has no grant to
    fence)."""
    lease = check_lease(lease)
    if isinstance(lease, Fenced):
        raise TypeError("insert takes Hold, Claim, Seize or Release: a new run has no grant "
                        "for Fenced to name")
    return lease


def check_fenced(lease: object) -> Fenced:
    """``finish``'s lease: a Fenced."""
    if not isinstance(lease, Fenced):
        raise TypeError(f"lease must be Fenced(owner, token), not {type(lease).__name__}")
    return lease


def check_failure(failure: object) -> Failure | None:
    """``finish``'s failure: None or a Failure."""
    if failure is not None and not isinstance(failure, Failure):
        raise TypeError(f"failure must be a Failure or None, not {type(failure).__name__}")
    return failure


def check_runs(runs: object) -> list[str]:
    """Runs to renew or release: an iterable of run ids (not a single str), de-duplicated in
    order, at most MAX_RENEW of them."""
    if isinstance(runs, str | bytes) or not isinstance(runs, Iterable):
        raise TypeError("runs must be an iterable of run ids, not a single value")
    names = list(dict.fromkeys(check_run(run) for run in runs))
    if len(names) > MAX_RENEW:
        raise ValueError(f"{len(names)} runs in one call, over the cap of {MAX_RENEW}: "
                         "split them")
    return names


def check_wait(wait: object) -> Wait | None:
    """What a discover function returned: a Wait or None."""
    if wait is not None and not isinstance(wait, Changed | Poll | At):
        raise TypeError(f"discover must return Changed, Poll, At or None, not {wait!r}")
    return wait


def check_projection_version(version: object) -> int:
    """A projection version: an int >= 0."""
    return check_int("projection_version", version, minimum=0, maximum=2**31)


# ---------------------------------------------------------------------------- the port


@runtime_checkable
class RunStore(Protocol):
    """The leased run backend port, as the sync stores implement it."""

    def now(self) -> int:
        """The backend clock, UTC Unix milliseconds."""
        ...

    def get(self, run: str) -> Current:
        """The run's latest record, revision, holder and claim info; ``NotFound``."""
        ...

    def get_many(self, runs: Iterable[str]) -> dict[str, Current]:
        """What :meth:`get` answers for each of ``runs`` that exists, by run, in the order
        of ``runs``; a run that does not exist is absent. At most ``MAX_RENEW`` runs."""
        ...

    def insert(self, run: str, record: bytes, lease: Lease) -> int:
        """Create ``run``; returns its revision (1, or one above the highest revision a
        deleted run had); ``AlreadyExists`` if it exists."""
        ...

    def compare_and_set(self, run: str, expected: int, record: bytes, lease: Lease) -> None:
        """Write revision ``expected + 1``; ``NotFound``, ``Conflict``, ``LeaseRefused``."""
        ...

    def renew(self, owner: str, runs: Iterable[str], ttl: int) -> list[str]:
        """Extend ``owner``'s live leases among ``runs``; returns those runs."""
        ...

    def release(self, owner: str, runs: Iterable[str]) -> list[str]:
        """Free the leases ``owner`` holds, live or expired, among ``runs`` without a new
        revision; returns those runs."""
        ...

    def delete(self, run: str, expected: int, lease: Lease) -> None:
        """Remove the run under the checks of ``compare_and_set``; ``NotFound``,
        ``Conflict``, ``LeaseRefused``."""
        ...

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
        ``records``, each as :class:`Claimed` (up to MAX_CLAIM_BYTES of records); with
        ``max_takeovers``, a run already taken over that often goes to the quarantine; with
        ``block``, wait up to that many ms for one when none is claimable."""
        ...

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *,
                    records: Literal[False] = False, block: int | None = None) -> list[str]: ...

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *,
                    records: Literal[True], block: int | None = None) -> list[Claimed]: ...

    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
                    block: int | None = None) -> list[str] | list[Claimed]:
        """Claim up to ``limit`` free, eligible runs, the earliest eligible first; with
        ``records``, each as :class:`Claimed` (up to MAX_CLAIM_BYTES of records); with
        ``block``, wait up to that many ms for one when none is claimable."""
        ...

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
        """Claim up to ``limit`` runs of both kinds, free eligible runs and held expired
        leases, in due order across both, each as :meth:`claim_ready` or
        :meth:`claim_expired` takes it; with ``block``, wait up to that many ms for either
        (a lease's expiry wakes it)."""
        ...

    def finish(self, run: str, expected: int, lease: Fenced, *, record: bytes | None = None,
               failure: Failure | None = None) -> None:
        """End the grant ``lease`` of ``run`` at revision ``expected``: write ``record`` and
        free it; or free it without a write; or, with ``failure``, count a failed try and
        free it behind its back-off or quarantine it. ``NotFound``, ``Conflict``,
        ``LeaseRefused``."""
        ...

    def restore(self, run: str, expected: int | None = None) -> bool:
        """Put a quarantined run back (counters cleared); whether it was quarantined. With
        ``expected``, only at that revision (``Conflict``), checked in the same step."""
        ...

    def refresh(self, run: str) -> bool:
        """Re-derive the run's wait from its current record; True if it has one."""
        ...

    def quarantined(self, limit: int = 1000) -> list[Quarantined]:
        """Up to ``limit`` quarantined index entries and poison runs, with the reason."""
        ...

    def changes(self, after: str | None = None, limit: int = 100, *,
                block: int | None = None) -> Changes:
        """The change feed's events after the cursor ``after`` (docs/contract.md)."""
        ...

    def rates(self, minutes: int = 60) -> list[Rate]:
        """Claims, finishes and takeovers per minute over the last ``minutes`` minutes, as
        a store with a feed counts them (docs/contract.md, "Per-minute counts")."""
        ...


def confirm_write(store: RunStore, run: str, revision: int | None, record: bytes) -> bool:
    """After an ``Unavailable`` insert or compare_and_set, tell whether it is the one stored.

    True: the run is at ``revision`` with exactly ``record`` (a compare_and_set writes
    ``expected + 1``; for an insert pass None: it writes 1, or above the highest revision a
    deleted run had, and the record alone tells). Because every record the engine writes
    carries a fresh token, nobody else can have written those bytes. False: not (or no longer)
    visible; the outcome stays unknown, but the revision fence keeps it harmless: a late
    apply of the lost write would make the caller's next compare_and_set see a Conflict.
    Raises ``Unavailable`` when the store still cannot answer.
    """
    try:
        current = store.get(run)
    except NotFound:
        return False
    return _is_the_write(current, revision, record)


def _is_the_write(current: Current, revision: int | None, record: bytes) -> bool:
    # The record carries the writer's fresh token: the same bytes at the revision it wrote
    # can only be its own write.
    return revision in (None, current.revision) and current.record == record


# ---------------------------------------------------------------------------- the change feed
# Its values (redisstore.feed holds its logic: cursors, gaps, the answer).

#: The kinds of events, in the contract's words.
KINDS = ("inserted", "written", "claimed", "released", "deleted", "quarantined", "restored")
Kind = Literal["inserted", "written", "claimed", "released", "deleted", "quarantined",
               "restored"]

#: What the size bound counts an entry as: ``retention_mb`` keeps at most
#: ``retention_mb * 2**20 // ENTRY_BYTES`` entries a partition (a Redis stream is trimmed by
#: count, and an entry of a few events of ids and owners of usual lengths takes about this).
ENTRY_BYTES = 128


@dataclass(frozen=True, slots=True)
class Feed:
    """How long a store's change feed keeps its entries: ``retention_ms`` (default one
    hour) and ``retention_mb`` (default 64, counted as ``ENTRY_BYTES`` an entry), a
    partition at a time; the older entries go, at the writes that follow. An entry is
    dropped once either bound says so; a reader whose position was dropped gets
    :class:`~redisstore.Compacted`."""

    retention_ms: int = 3_600_000
    retention_mb: float = 64.0

    def __post_init__(self) -> None:
        check_int("retention_ms", self.retention_ms, minimum=1, maximum=MAX_MS)
        mb = self.retention_mb
        if isinstance(mb, bool) or not isinstance(mb, int | float):
            raise TypeError(f"retention_mb must be a number, got {type(mb).__name__}")
        if not (mb * 2**20 >= ENTRY_BYTES and mb <= 2**20):
            raise ValueError(f"retention_mb must be in [{ENTRY_BYTES / 2**20}, {2**20}], "
                             f"got {mb!r}")

    @property
    def max_entries(self) -> int:
        """The size bound as a count of entries a partition."""
        return int(self.retention_mb * 2**20) // ENTRY_BYTES


@dataclass(frozen=True, slots=True)
class Event:
    """One change of one run: ``kind`` (``inserted``, ``written``, ``claimed``,
    ``released``, ``deleted``, ``quarantined``, ``restored``; ``takeover`` for a claim of
    another owner's expired lease), the run's ``revision`` after it (a deleted run's last
    one), the ``owner`` whose call made it (None for a call that names none), the server's
    ``time`` (UTC ms) and the ``cursor`` that resumes the feed right after it."""

    run: str
    revision: int
    kind: Kind
    owner: str | None
    time: int
    cursor: str
    takeover: bool = False


@dataclass(frozen=True, slots=True)
class Changes:
    """What ``changes`` answers: the ``events`` in order (at most ``limit``), and the
    ``cursor`` to pass as ``after`` next (past the last event, or where the call looked when
    there was none)."""

    events: list[Event]
    cursor: str


#: The most minutes ``rates`` answers: the last hour, this minute included (the counters
#: keep one minute more, the one being reused).
MAX_RATE_MINUTES = 60

#: The ms of one minute of the counters (minutes are the backend clock's, UTC).
MINUTE_MS = 60_000

#: The minutes the counters keep (a minute's slot is its number mod this): the hour read,
#: and the one being reused (lua/_lib/feed.lua's RATE_SLOTS).
RATE_SLOTS = 61


@dataclass(frozen=True, slots=True)
class Rate:
    """One minute of a namespace's work, as a store with a feed counts it: ``claims``
    (runs handed out by a claim, takeovers included), ``finishes`` (grants ended by
    ``finish``: with a record, without one, or with a failure) and ``takeovers`` (claims of
    another owner's expired lease) in the minute starting at backend ms ``minute``."""

    minute: int
    claims: int
    finishes: int
    takeovers: int


def check_minutes(minutes: object) -> int:
    """``rates``' argument: minutes in [1, :data:`MAX_RATE_MINUTES`]."""
    return check_int("minutes", minutes, minimum=1, maximum=MAX_RATE_MINUTES)
