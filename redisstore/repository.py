"""The instance repository port: its values, its interface, argument checks and the
sans-I/O operations of the Redis repository.

The values are plain data: building an :class:`InstanceRecord` with an
empty group or a naive datetime is allowed, and a repository refuses it when it is saved
(``ValueError`` / ``TypeError``, before anything is sent). Only the payload is normalised
on construction: a ``bytearray`` or ``memoryview`` is copied into ``bytes``, so a record
never aliases a buffer its caller may mutate.

:class:`RepositoryOps` holds the operations as generators of :class:`~redisstore.protocol.Call`
(exactly like :class:`~redisstore.protocol.RunOps`); the shells only send them. Nothing here
does I/O.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar, Protocol, runtime_checkable

from . import scripts
from .errors import (
    ConcurrentUpdate,
    Corrupt,
    Misconfigured,
    StoreError,
    Unavailable,
    UnknownGroup,
)
from .keys import Keyspace
from .protocol import EVICTING, Call, Operation, ask, config_get, eviction_policy, text
from .runops import Code, Uncounted, partitioned, reply_parts
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

_EPOCH = datetime(1970, 1, 1)  # naive: wall-clock arithmetic in _from_us stays in range
_EPOCH_UTC = _EPOCH.replace(tzinfo=UTC)
_US = timedelta(microseconds=1)

log = logging.getLogger("redisstore.repository")


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


def _text(id: str, name: str, raw: Any, *, empty: bool = True) -> str:
    """A stored text field, or Corrupt: absent, empty where it may not be, or not UTF-8."""
    if not isinstance(raw, bytes | str):
        raise Corrupt(id, name)
    try:
        value = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise Corrupt(id, name) from None
    if not value and not empty:
        raise Corrupt(id, name)
    return value


def _int(id: str, name: str, raw: Any, lo: int, hi: int) -> int:
    """A stored canonical decimal integer in [lo, hi], or Corrupt (the script checked the
    form already; this holds for any reply)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        digits = _text(id, name, raw)
        if not _INT.match(digits):
            raise Corrupt(id, name)
        value = int(digits)
    if not lo <= value <= hi:
        raise Corrupt(id, name)
    return value


def parse_record(id: str, payload: Any) -> InstanceRecord:
    """repo_load's payload as an InstanceRecord; a field that fails is Corrupt(id, field)."""
    if not isinstance(payload, list) or len(payload) != 9:
        raise Corrupt(id, "reply")
    version, body, group, tenant, expiry, offset, owner, incarnation, status = payload
    if not isinstance(body, bytes):
        raise Corrupt(id, "pl")
    expiry_text = _text(id, "x", expiry)
    offset_us_ = _int(id, "xo", offset, -MAX_OFFSET_US, MAX_OFFSET_US)
    at = None
    if expiry_text:
        try:
            at = from_us(_int(id, "x", expiry_text, -(10**18), 10**18), offset_us_)
        except OverflowError:  # the instant exists, its wall time in that offset does not
            raise Corrupt(id, "x") from None
    lease = InstanceLease(expiry=at, owner=_text(id, "o", owner),
                          incarnation=_int(id, "n", incarnation, MIN_INT64, MAX_INT64))
    return InstanceRecord(id=id, payload=body, group=_text(id, "g", group, empty=False),
                          tenant=_text(id, "t", tenant), lease=lease,
                          rec_version=_int(id, "v", version, 1, MAX_VERSION),
                          status=Status(_text(id, "s", status, empty=False)))


def answer(id: str, *, stale: Callable[[Any], StoreError] | None = None,
           group: str = "", namespace: str = "", opened: int | None = None
           ) -> Callable[[Any], Any]:
    """A parser of ``{code, payload, dropped, next_due}`` replies (the run store's shape and
    :class:`~redisstore.runops.Code`): the payload on OK, else the contract's answer.
    ``stale`` makes CONFLICT's error from the stored version; ``opened``: the partition
    count of the repository that calls (None: one partition)."""

    def parse(reply: Any) -> Any:
        code, payload = reply_parts(reply)
        if code == Code.OK:
            return payload
        if code == Code.CORRUPT:
            raise Corrupt(id, text(payload))
        if code == Code.CONFLICT and stale is not None:
            raise stale(payload)
        if code == Code.NOT_FOUND and payload is not None and text(payload) == "group":
            raise UnknownGroup(group)
        if code == Code.TOO_NEW:
            raise Misconfigured(
                f"namespace {namespace!r} has repository layout version {int(payload)}, "
                f"newer than this library's {LAYOUT_VERSION}: upgrade redisstore on this node")
        if code == Code.PARTITIONED:
            if opened is None:
                raise Misconfigured(
                    f"namespace {namespace!r} is spread over {int(payload)} partitions: open "
                    f"the repository with partitions={int(payload)} (nothing was written)")
            raise partitioned(namespace, int(payload), opened, what="repository",
                              step="redisstore.repartition_repository")
        if code == Code.UNCOUNTED:
            raise Uncounted(f"namespace {namespace!r}: a partition records no repository "
                            "partition count (nothing was written)")
        raise ValueError(f"unexpected reply code {code!r}")

    return parse


def _load_answer(id: str, namespace: str, opened: int | None = None
                 ) -> Callable[[Any], InstanceRecord | None]:
    ok = answer(id, namespace=namespace, opened=opened)

    def parse(reply: Any) -> InstanceRecord | None:
        if isinstance(reply, list) and reply and reply[0] == Code.NOT_FOUND:
            return None
        return parse_record(id, ok(reply))

    return parse


def _server_error(exc: StoreError) -> bool:
    """Whether a failed call got an error reply (the server answered: NOPERM, unknown
    command...), not a lost link: only an answer carries the server's code."""
    return isinstance(exc, Unavailable) and exc.code is not None




# ---------------------------------------------------------------------------- operations


class RepositoryOps:
    """The repository's operations over one namespace, as pure generators of calls."""

    def __init__(self, namespace: str, max_terminal: int = 1024,
                 logger: Logger | None = None, *, partition: int | None = None) -> None:
        #: The namespace's keys, or one partition's (see redisstore.partitioned_repository).
        self.keys = Keyspace(namespace, partition)
        self.max_terminal = check_max_terminal(max_terminal)
        self.logger: Logger = logger if logger is not None else log
        # save is the hot path (one per engine checkpoint): name its fixed keys once.
        self._instances, self._inflight = self.keys.instance(""), self.keys.inflight("")
        #: ARGV[1] of its scripts: the key prefix, and in a repository of partitions its
        #: count (lua/_common.lua's COUNT_ARG); the count, which refusals name.
        self.arg1 = self.keys.prefix
        self.opened: int | None = None
        self._save_keys = (self.keys.groups, self.keys.terminal, self.keys.terminal_seq)

    def save(self, rec: InstanceRecord) -> Operation[int]:
        """Compare-and-set on ``rec_version``; returns the new stored version."""
        return self._save(check_record(rec), "")

    def place(self, rec: InstanceRecord) -> Operation[int]:
        """Write ``rec`` as moved here from another partition, with its ``rec_version``
        (where no record of its id is: one stored with that version already is the same
        move made again; another is a ConcurrentUpdate), evicting no terminal record (the
        engines' next saves do). Only :func:`redisstore.repartition_repository` moves."""
        rec = check_record(rec)
        if not 1 <= rec.rec_version < MAX_VERSION:
            raise ValueError(f"a record moved has a version in [1, {MAX_VERSION - 1}] (one "
                             f"save at least left), got {rec.rec_version}")
        return self._save(rec, rec.rec_version)

    def _save(self, rec: InstanceRecord, placed: int | str) -> Operation[int]:
        lease = rec.lease
        expiry = "" if lease.expiry is None else str(to_us(lease.expiry))
        offset = 0 if lease.expiry is None else offset_us(lease.expiry)
        groups, terminal, terminal_seq = self._save_keys
        args = (self.arg1, rec.id, 0 if placed else rec.rec_version, rec.payload, rec.group,
                rec.tenant, expiry, offset, lease.owner, lease.incarnation, str(rec.status),
                MAX_VERSION if placed else self.max_terminal, placed)
        # Keyspace.instance / Keyspace.inflight, without the calls.
        keys = (self._instances + rec.id, groups, self._inflight + rec.group, terminal,
                terminal_seq)
        ok = self._answer(rec.id, group=rec.group, stale=lambda stored: ConcurrentUpdate(
            rec.id, rec.rec_version, int(stored)))

        def parse(raw: Any) -> int:
            version, evicted = ok(raw)
            for id in evicted:
                self.warn_evicted(text(id))
            return int(version)

        return (yield from ask(Call(scripts.REPO_SAVE, keys, args, parse)))

    def _answer(self, id: str, **options: Any) -> Callable[[Any], Any]:
        """:func:`answer` for a call of this namespace (its messages name it)."""
        return answer(id, namespace=self.keys.namespace, opened=self.opened, **options)

    def warn_evicted(self, id: str) -> None:
        """The warning for one evicted terminal record."""
        self.logger.warning(
            "redisstore: evicted terminal instance %r: more than max_terminal=%d terminal "
            "records are kept%s (the oldest go first)", id, self.max_terminal,
            "" if self.keys.partition is None else " in its partition")

    def cluster_compatibility(self) -> tuple[bool, str]:
        """``(True, reason)``: the state lives in the server, shared by every node."""
        namespace = self.keys.namespace
        return True, (f"state lives in Redis, shared by every engine; all keys of namespace "
                      f"{namespace!r} share the hash tag {{{namespace}}}, so each "
                      "operation is one atomic script in one cluster slot")

    def load(self, id: str) -> Operation[InstanceRecord | None]:
        """The record stored under ``id``, or None; ``Corrupt`` when it fails validation."""
        id = check_id(id)
        return (yield from ask(Call(scripts.REPO_LOAD, (self.keys.instance(id),),
                                    (self.arg1, id),
                                    _load_answer(id, self.keys.namespace, self.opened),
                                    write=False)))

    def delete(self, id: str, expected_version: int | None = None) -> Operation[None]:
        """Remove the record (a damaged one too, unless fenced) and its index entries; a
        no-op when absent. With expected_version, only while rec_version is that one."""
        id = check_id(id)
        fence = check_expected_version(expected_version)
        yield from ask(Call(
            scripts.REPO_DELETE, (self.keys.instance(id), self.keys.terminal),
            (self.arg1, id, "" if fence is None else fence),
            self._answer(id, stale=lambda stored: ConcurrentUpdate(id, fence or 0,
                                                                   int(stored)))))

    def list_in_flight(self, group: str, now: datetime | None = None) -> Operation[list[str]]:
        """Claimable ids of ``group`` at ``now`` (None: the server's clock), read in pages
        of :data:`MAX_PAGE` index entries (one bounded script each) at the ``now`` of the
        first page."""
        group, when = check_group(group), check_now(now)
        at = "" if when is None else str(to_us(when))
        listed: dict[str, None] = {}  # insertion-ordered; an id moved mid-listing once
        after: tuple[str, bytes] = ("", b"")
        while True:
            ids, at, cursor = yield from self.page(group, at, MAX_PAGE, after)
            listed.update(dict.fromkeys(ids))
            if cursor is None:
                return list(listed)
            after = cursor

    def list_in_flight_page(self, group: str, now: datetime | None = None, *,
                            cursor: str | None = None,
                            limit: int = MAX_PAGE) -> Operation[InFlightPage]:
        """One page of ``list_in_flight``: at most ``limit`` (<= :data:`MAX_PAGE`) index
        entries visited from ``cursor`` (None: the start). ``now=None`` is the server's
        clock at the first page, carried by the cursor to the next ones."""
        group, when, limit = check_group(group), check_now(now), check_page_limit(limit)
        position = check_cursor(cursor)
        at = "" if when is None else str(to_us(when))
        after = ("", b"")
        if position is not None:
            if when is None:
                at = position[0]
            # The id goes back byte for byte, even one that is not UTF-8 (see below).
            after = (position[1], position[2].encode("utf-8", "surrogateescape"))
        ids, at, next_after = yield from self.page(group, at, limit, after)
        if next_after is None:
            return InFlightPage(tuple(ids), None)
        score, last = next_after
        return InFlightPage(tuple(ids),
                            f"{at}|{score}|{last.decode('utf-8', 'surrogateescape')}")

    def page(self, group: str, at: str, limit: int, after: tuple[str, bytes],
              ) -> Operation[tuple[list[str], str, tuple[str, bytes] | None]]:
        """One script's page: (ids, the now it used, the cursor or None when complete)."""
        payload = yield from ask(Call(
            scripts.REPO_LIST_IN_FLIGHT, (self.keys.inflight(group),),
            (self.arg1, group, at, limit, *after),
            self._answer(""), write=False))
        raw_ids, score, last, used = payload
        ids = []
        for raw in raw_ids:
            try:
                ids.append(raw.decode() if isinstance(raw, bytes) else str(raw))
            except UnicodeDecodeError:
                continue  # not an id this library wrote (ids are UTF-8 text): skipped
        done = score is None or score is False
        if done:
            return ids, text(used), None
        # The cursor keeps the last entry's bytes: a foreign member that is not UTF-8 must
        # not stop the listing from moving past it.
        return ids, text(used), (text(score), last if isinstance(last, bytes)
                                 else str(last).encode())

    def register_group(self, group: str) -> Operation[None]:
        """Add ``group`` to the registry (idempotent)."""
        group = check_group(group)
        yield from ask(Call(scripts.REPO_REGISTER_GROUP, (self.keys.groups,),
                            (self.arg1, group),
                            self._answer("")))

    def group_exists(self, group: str) -> Operation[bool]:
        """Whether ``group`` is registered."""
        group = check_group(group)
        found = yield from ask(Call(scripts.REPO_GROUP_EXISTS, (self.keys.groups,),
                                    (self.arg1, group),
                                    self._answer(""), write=False))
        return bool(found)

    # ------------------------------------------------------------------ migrate

    def load_scripts(self) -> Operation[None]:
        """SCRIPT LOAD every repository script (a replica or a restarted server has none)."""
        for script in scripts.REPO_SCRIPTS:
            yield from ask(Call(
                None, (), ("SCRIPT", "LOAD", script.source), lambda r: r, write=False))

    def record_layout(self) -> Operation[int]:
        """Record this library's layout version; returns the one found (0: none)."""
        found = yield from ask(Call(scripts.REPO_MIGRATE, (self.keys.layout,),
                                    (self.arg1, LAYOUT_VERSION),
                                    self._answer("")))
        return int(found)

    def migrate(self, *, settings: bool = True) -> Operation[None]:
        """Load the scripts, record the layout version, and inspect the server's settings
        (unless ``settings`` is False: fakeredis has none to inspect).

        Raises :class:`Misconfigured` when the server may evict our keys; warns when it
        persists nothing; warns and goes on when ``CONFIG GET`` is refused.
        """
        yield from self.load_scripts()
        yield from self.record_layout()
        if not settings:
            return
        try:
            policy = yield from eviction_policy(self.keys.groups)
            save = yield from config_get("save", self.keys.groups)
            appendonly = yield from config_get("appendonly", self.keys.groups)
        except StoreError as exc:
            if not _server_error(exc):
                raise
            self.logger.warning(
                "redisstore: CONFIG GET is not allowed on this server (%s); cannot check "
                "maxmemory-policy or persistence. Make sure the server never evicts keys "
                "(maxmemory-policy noeviction) and persists them (AOF or RDB)", exc)
            return
        if policy in EVICTING:
            raise Misconfigured(
                f"maxmemory-policy is {policy}: under memory pressure the server may evict "
                "the repository's records and indexes. Fix: CONFIG SET maxmemory-policy "
                "noeviction (and set it in redis.conf so it survives a restart)")
        if (save or "") == "" and appendonly != "yes":
            self.logger.warning(
                "redisstore: this server persists nothing (save \"\" and appendonly no): "
                "every instance record is lost when it restarts. Enable AOF "
                "(CONFIG SET appendonly yes) or RDB snapshots")
