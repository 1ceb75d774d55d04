"""The instance repository port: its values, its interface and argument checks (its
operations on Redis are :mod:`redisstore.core.repository_ops`).

The values are plain data: building an :class:`InstanceRecord` with an
empty group or a naive datetime is allowed, and a repository refuses it when it is saved
(``ValueError`` / ``TypeError``, before anything is sent). Only the payload is normalised
on construction: a ``bytearray`` or ``memoryview`` is copied into ``bytes``, so a record
never aliases a buffer its caller may mutate.

Nothing here does I/O.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar, Protocol, runtime_checkable

from .runs import check_int, check_text

#: Version of the repository's key layout; ``migrate`` records it in the namespace.
LAYOUT_VERSION = 1

# rec_version is incremented inside Lua, where numbers are doubles: keep it exact.
MAX_VERSION = 2**53 - 1
# The incarnation is stored as text and never computed with; bound it like Go's int64.
MIN_INT64, MAX_INT64 = -(2**63), 2**63 - 1

# Caps that keep every script short (docs/repository.md gives the measured per-item costs).
# lua/_repo_lib.lua has the same numbers and checks them again, for anyone with EVALSHA.
#: Most index entries one ``list_in_flight_page`` visits (and the page ``list_in_flight``
#: reads its listing in).
MAX_PAGE = 1000
#: Most terminal records one save evicts; the rest go on the next terminal saves.
MAX_EVICT = 50
#: The largest payload a save takes.
MAX_PAYLOAD = 2 << 20
# A UTC offset is strictly within a day (datetime.timezone's bound).
MAX_OFFSET_US = 24 * 3600 * 1_000_000 - 1



class Logger(Protocol):
    """What a repository needs of a logger: ``logging.Logger`` (or an adapter) fits."""

    def warning(self, msg: str, /, *args: Any) -> None:
        """Record a warning, ``msg % args``."""


# ---------------------------------------------------------------------------- values


class Status(str):
    """An instance status. The vocabulary is open: any non-empty string is a status.

    Only ``COMPLETED`` and ``TERMINATED`` are terminal; ``SUSPENDED`` is in flight but not
    claimable. A status a repository has never heard of counts as in flight and claimable,
    so the vocabulary can grow without touching the stores. Compares equal to its text.
    """

    __slots__ = ()

    ACTIVE: ClassVar[Status]
    SUSPENDED: ClassVar[Status]
    COMPLETED: ClassVar[Status]
    TERMINATED: ClassVar[Status]

    def is_terminal(self) -> bool:
        """True for ``COMPLETED`` and ``TERMINATED``."""
        return is_terminal(self)

    def __repr__(self) -> str:
        return f"Status({str.__repr__(self)})"


Status.ACTIVE = Status("active")
Status.SUSPENDED = Status("suspended")
Status.COMPLETED = Status("completed")
Status.TERMINATED = Status("terminated")

_TERMINAL = frozenset((Status.COMPLETED, Status.TERMINATED))


def is_terminal(status: str) -> bool:
    """Whether ``status`` (any string) is terminal: completed or terminated."""
    return status in _TERMINAL


@dataclass(frozen=True, slots=True)
class InstanceLease:
    """The ownership claim on an instance: who runs it, its fencing incarnation, until when.

    The zero lease (``InstanceLease()``) means unowned. ``expiry`` is a timezone-aware
    datetime, or None for no expiry at all (an absent lease is always expired).
    """

    expiry: datetime | None = None
    owner: str = ""
    incarnation: int = 0

    def expired(self, now: datetime) -> bool:
        """True when there is no expiry or ``now >= expiry`` (the boundary is expired)."""
        now = check_datetime("now", now)
        if self.expiry is None:
            return True
        return now >= check_datetime("lease expiry", self.expiry)


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """The durable record of one instance: the engine's checkpoint and its bookkeeping.

    ``payload`` is opaque bytes (a ``bytearray`` or ``memoryview`` is copied into bytes).
    ``group`` is the creator engine's group and must not be empty when saved; ``tenant``
    ``""`` is the group's default tenant. ``rec_version`` is the compare-and-set version:
    0 for a record not stored yet.
    """

    id: str
    payload: bytes = field(repr=False)
    group: str
    tenant: str = ""
    lease: InstanceLease = field(default_factory=InstanceLease)
    rec_version: int = 0
    status: str = Status.ACTIVE

    def __post_init__(self) -> None:
        # Copy mutable buffers: the record must not change when the caller's buffer does.
        if isinstance(self.payload, bytearray | memoryview):
            object.__setattr__(self, "payload", bytes(self.payload))
        if isinstance(self.status, str) and not isinstance(self.status, Status):
            object.__setattr__(self, "status", Status(self.status))


@dataclass(frozen=True, slots=True)
class InFlightPage:
    """One page of a paged listing (``list_in_flight_page``): ``ids`` in listing order and
    the ``cursor`` to pass for the next page, None once the listing is complete.

    A page holds at most the ``limit`` asked for, and may hold fewer (even none) while
    more follow: the limit bounds the index entries a page visits, and an entry whose
    record does not say it is claimable is skipped. The cursor is opaque text.
    """

    ids: tuple[str, ...]
    cursor: str | None


@runtime_checkable
class Repository(Protocol):
    """The instance repository port, as the sync repositories implement it.

    ``migrate()`` and ``cluster_compatibility()`` are optional capabilities (a migrator and
    cluster awareness); both bundled repositories have them.
    """

    def save(self, rec: InstanceRecord) -> int:
        """CAS on ``rec_version`` (0 creates); returns the new stored version."""
        ...

    def load(self, id: str) -> InstanceRecord | None:
        """A copy of the stored record, or None."""
        ...

    def delete(self, id: str, *, expected_version: int | None = None) -> None:
        """Remove the record; a no-op when absent. With ``expected_version``, only while
        the stored ``rec_version`` is that one (else ``ConcurrentUpdate``)."""
        ...

    def list_in_flight(self, group: str, now: datetime | None = None) -> list[str]:
        """Ids of the group's claimable in-flight records at ``now`` (None: backend clock)."""
        ...

    def register_group(self, group: str) -> None:
        """Establish the group, idempotently."""
        ...

    def group_exists(self, group: str) -> bool:
        """Whether the group is registered."""
        ...


# ---------------------------------------------------------------------------- checks


def check_expected_version(version: object) -> int | None:
    """``delete``'s ``expected_version``: None (no fence) or a rec_version, an int >= 1."""
    if version is None:
        return None
    return check_int("expected_version", version, minimum=1, maximum=MAX_VERSION)


def check_id(id: object) -> str:
    """An instance id: a non-empty str."""
    return check_text("id", id)


def check_group(group: object) -> str:
    """An engine group: a non-empty str (an ungrouped engine is a group of its own)."""
    return check_text("group", group)


def check_datetime(name: str, value: object) -> datetime:
    """A timezone-aware datetime (a naive one has no defined instant: ValueError)."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got the naive {value!r}")
    return value


def check_now(now: object) -> datetime | None:
    """``list_in_flight``'s ``now``: None (the backend clock) or an aware datetime."""
    return None if now is None else check_datetime("now", now)


def check_max_terminal(max_terminal: object) -> int:
    """The terminal cap: an int >= 0 (0 keeps no terminal record)."""
    return check_int("max_terminal", max_terminal, minimum=0, maximum=MAX_VERSION)


def check_lease(lease: object) -> InstanceLease:
    """An InstanceLease with an aware (or no) expiry, a str owner, an int64 incarnation."""
    if not isinstance(lease, InstanceLease):
        raise TypeError(f"lease must be an InstanceLease, not {type(lease).__name__}")
    if lease.expiry is not None:
        check_datetime("lease expiry", lease.expiry)
    check_text("lease owner", lease.owner, empty=True)
    check_int("lease incarnation", lease.incarnation, minimum=MIN_INT64, maximum=MAX_INT64)
    return lease


def check_record(rec: object) -> InstanceRecord:
    """A record fit to be saved; raises ValueError / TypeError naming the bad field."""
    if not isinstance(rec, InstanceRecord):
        raise TypeError(f"save takes an InstanceRecord, not {type(rec).__name__}")
    check_id(rec.id)
    if not isinstance(rec.payload, bytes):
        raise TypeError(f"payload must be bytes, not {type(rec.payload).__name__}")
    check_group(rec.group)
    check_text("tenant", rec.tenant, empty=True)
    check_lease(rec.lease)
    check_int("rec_version", rec.rec_version, minimum=0, maximum=MAX_VERSION - 1)
    check_text("status", rec.status)
    if len(rec.payload) > MAX_PAYLOAD:
        raise ValueError(f"payload is {len(rec.payload)} bytes, over the cap of {MAX_PAYLOAD} "
                         "(a save copies it into one script: see docs/repository.md)")
    return rec


def check_page_limit(limit: object) -> int:
    """A page size: an int in [1, MAX_PAGE]."""
    return check_int("limit", limit, minimum=1, maximum=MAX_PAGE)


_INT = re.compile(r"(?:0|-?[1-9][0-9]*)\Z", re.ASCII)


def is_int_text(value: str) -> bool:
    """Whether ``value`` is a canonical decimal integer ('0', '42', '-7'; not '007', '-0')."""
    return bool(_INT.match(value))


def check_cursor(cursor: object) -> tuple[str, str, str] | None:
    """A page cursor as (now µs, score, id), or None for the first page. A cursor is only
    ever one a page returned: anything else is a ValueError."""
    if cursor is None:
        return None
    text_ = check_text("cursor", cursor)
    now, _, rest = text_.partition("|")
    score, _, id = rest.partition("|")
    if not is_int_text(now) or not score or not id:
        raise ValueError(f"cursor must be one a page returned, got {cursor!r}")
    return now, score, id


_EPOCH = datetime(1970, 1, 1)  # naive: wall-clock arithmetic in _from_us stays in range
_EPOCH_UTC = _EPOCH.replace(tzinfo=UTC)
_US = timedelta(microseconds=1)

log = logging.getLogger("redisstore.repository")

# ---------------------------------------------------------------------------- encodings


def to_us(value: datetime) -> int:
    """An aware datetime as integer microseconds since the Unix epoch (exact)."""
    return (value - _EPOCH_UTC) // _US


def offset_us(value: datetime) -> int:
    """The datetime's UTC offset in microseconds, kept so it loads back in its own offset."""
    offset = value.utcoffset()
    assert offset is not None
    return offset // _US


def from_us(us: int, offset: int = 0) -> datetime:
    """The datetime ``us`` microseconds after the epoch, in a fixed ``offset`` (µs) zone."""
    tz = UTC if offset == 0 else timezone(timedelta(microseconds=offset))
    # Compute the local wall time directly: going through UTC could leave datetime's range
    # for an instant near datetime.min/max that is representable in its own offset.
    return (_EPOCH + timedelta(microseconds=us + offset)).replace(tzinfo=tz)


def record_class(status: str) -> str:
    """How a status is indexed: 't' terminal, 's' suspended, 'c' claimable when expired."""
    if is_terminal(status):
        return "t"
    if status == Status.SUSPENDED:
        return "s"
    return "c"
