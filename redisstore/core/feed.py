"""The change feed's values: what ``store.changes(...)`` answers, its options and its cursor.

Every store kind keeps the feed the same way (docs/contract.md, "The change feed"): per
partition, an ordered log of *entries*, each written by the call (the script) that made its
changes, and each listing one or more *events* (a claim of 100 runs is one entry of 100
events). An entry has an id ``"<ms>-<n>"`` (the server's time when written, then a
sequence: a Redis stream id) and a number, ``seq``: the partition's count of entries ever
written, kept beside the log and written in the same step. A reader at entry ``seq`` whose
next entry is not ``seq + 1``, or whose partition counts another number than ``seq`` while
holding nothing past it, knows entries were lost (trimmed by retention, a failover that lost
the last writes, a log dropped) and gets :class:`Compacted` instead of a silent gap. (A
number costs the server a ``HINCRBY`` a write; naming the entry before instead would cost an
``XREVRANGE``, twice as dear: benchmarks/bench_feed.py.)

**The cursor** is opaque to callers: ``"f1:"`` then one position per partition, joined by
``","``. A position is ``"<id>@<seq>"`` (everything up to and including that entry was
read), ``"<id>@<seq>/<k>"`` (the first ``k`` events of that entry were read) or ``""``
(nothing read yet: from the oldest entry retained, unchecked). ``0-0@0`` is the position
before a partition's first entry ever.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import Compacted

# The feed's values are the port's (redisstore.runs): re-exported here beside their logic.
from .runs import ENTRY_BYTES as ENTRY_BYTES
from .runs import KINDS as KINDS
from .runs import MAX_MS as MAX_MS
from .runs import MAX_RATE_MINUTES as MAX_RATE_MINUTES
from .runs import MINUTE_MS as MINUTE_MS
from .runs import RATE_SLOTS as RATE_SLOTS
from .runs import Changes as Changes
from .runs import Event as Event
from .runs import Feed as Feed
from .runs import Kind as Kind
from .runs import Rate as Rate
from .runs import check_int as check_int
from .runs import check_minutes as check_minutes

#: The most events one ``changes`` call answers.
MAX_CHANGES = 1000

#: The id before a partition's first entry.
ORIGIN = "0-0"

_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
_PART = re.compile(r"(\d{1,20}-\d{1,20})@(\d{1,20})(?:/(\d{1,9}))?")
_PREFIX = "f1:"


def check_changes(after: object, limit: object, block: object) -> tuple[str | None, int,
                                                                        int | None]:
    """The arguments of ``changes``, checked: ``ValueError``/``TypeError`` before anything
    is read."""
    if after is not None and not isinstance(after, str):
        raise TypeError(f"after must be a cursor (str) or None, got {type(after).__name__}")
    limit = check_int("limit", limit, minimum=1, maximum=MAX_CHANGES)
    if block is not None:
        block = check_int("block", block, minimum=0, maximum=MAX_MS)
    return after, limit, block


def id_key(entry_id: str) -> tuple[int, int]:
    """An entry id as a number pair, for ordering."""
    match = _ID.fullmatch(entry_id)
    if match is None:
        raise ValueError(f"not an entry id: {entry_id!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True, slots=True)
class Position:
    """One partition's place in the feed: after entry ``id``, number ``seq`` (``id`` None:
    nothing read yet, from the oldest retained), having read ``read`` events of it (None:
    all of them)."""

    id: str | None
    seq: int = 0
    read: int | None = None

    def text(self) -> str:
        if self.id is None:
            return ""
        at = f"{self.id}@{self.seq}"
        return at if self.read is None else f"{at}/{self.read}"


#: From the oldest entry retained, unchecked.
START = Position(None)


def decode(cursor: str | None, partitions: int) -> list[Position]:
    """The positions of ``cursor`` (None: each partition from its oldest entry retained).
    A cursor that is not one: ``ValueError``. One of another partition count (the namespace
    was repartitioned since): :class:`Compacted`, resuming from the oldest entries."""
    if cursor is None:
        return [START] * partitions
    if not cursor.startswith(_PREFIX):
        raise ValueError(f"not a feed cursor: {cursor!r}")
    positions = []
    for part in cursor[len(_PREFIX):].split(","):
        if part == "":
            positions.append(START)
            continue
        match = _PART.fullmatch(part)
        if match is None:
            raise ValueError(f"not a feed cursor: {cursor!r}")
        entry_id, seq, read = match.groups()
        positions.append(Position(entry_id, int(seq), None if read is None else int(read)))
    if len(positions) != partitions:
        raise Compacted(cursor, encode([START] * partitions),
                        f"the cursor has {len(positions)} partitions, the store {partitions}")
    return positions


def encode(positions: list[Position]) -> str:
    """The cursor of ``positions``."""
    return _PREFIX + ",".join(p.text() for p in positions)


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a partition's log: its ``id``, its number ``seq`` (1 for the partition's
    first entry ever), the ``owner`` of the call that wrote it (None: it named none) and its
    events as ``(run, kind, revision, takeover)``."""

    id: str
    seq: int
    owner: str | None
    items: tuple[tuple[str, Kind, int, bool], ...]

    @property
    def time(self) -> int:
        return id_key(self.id)[0]


@dataclass(frozen=True, slots=True)
class Found:
    """What a partition's log holds past a position: up to the count asked of its entries
    in order (from the position's own entry on, when it was read partly), and how many
    entries the partition has written in all (``count``: its last entry's ``seq``)."""

    entries: list[Entry]
    count: int


def gap(position: Position, found: Found) -> str | None:
    """Why a reader at ``position`` has lost entries (``found``: what the log holds from
    it), or None when the log holds everything past it."""
    if position.id is None:
        return None
    entries = found.entries
    if position.read is not None:
        if entries and entries[0].id == position.id and entries[0].seq == position.seq:
            return None
        return "the cursor's entry is no longer retained"
    if entries:
        if entries[0].seq == position.seq + 1:
            return None
        return "entries past the cursor are no longer retained"
    if found.count == position.seq:
        return None
    if found.count < position.seq:
        return "the feed ends before the cursor (a failover lost its last entries)"
    return "entries past the cursor are no longer retained"


def resume_at(oldest: Entry | None, count: int) -> Position:
    """Where a reader that lost entries of a partition goes on: at that partition's oldest
    entry retained (all of it unread), or past its last number when it holds none."""
    if oldest is None:
        return Position(ORIGIN, count)
    return Position(oldest.id, oldest.seq, 0)


def events_of(partitions: list[tuple[Position, Found]], limit: int) -> tuple[list[Event],
                                                                             list[Position]]:
    """The next ``limit`` events over every partition's log (each in its order; across
    partitions by entry time, then partition), and the positions after them."""
    # A partition read from its oldest entry that has none: past its last number.
    positions = [Position(ORIGIN, f.count) if p.id is None and not f.entries else p
                 for p, f in partitions]
    heads: list[tuple[tuple[int, int], int, int, int]] = []  # (id, partition, entry, skip)
    for index, (position, found) in enumerate(partitions):
        if found.entries:
            skip = 0
            if position.read is not None and found.entries[0].id == position.id:
                skip = position.read
            heads.append((id_key(found.entries[0].id), index, 0, skip))
    events: list[Event] = []
    while heads and len(events) < limit:
        heads.sort()
        _, index, at, skip = heads.pop(0)
        entry = partitions[index][1].entries[at]
        items = entry.items
        take = min(len(items) - skip, limit - len(events))
        for n in range(skip, skip + take):
            run, kind, revision, takeover = items[n]
            positions[index] = (Position(entry.id, entry.seq) if n + 1 == len(items)
                                else Position(entry.id, entry.seq, n + 1))
            events.append(Event(run, revision, kind, entry.owner, entry.time,
                                encode(positions), takeover))
        if skip + take == len(items):
            positions[index] = Position(entry.id, entry.seq)
            if at + 1 < len(partitions[index][1].entries):
                following = partitions[index][1].entries[at + 1]
                heads.append((id_key(following.id), index, at + 1, 0))
    return events, positions


class Log:
    """One partition's log kept in this process (the memory reference's): appended by the
    calls that change runs, trimmed by the feed's bounds at each append."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.entries: list[Entry] = []
        self.last = ORIGIN  # the last id given (a stream's last-generated id)
        self.count = 0  # entries ever written (the partition's number)

    def append(self, now: int, owner: str | None,
               items: list[tuple[str, Kind, int, bool]]) -> None:
        if not items:
            return
        ms, n = id_key(self.last)
        entry_id = f"{ms}-{n + 1}" if now <= ms else f"{now}-0"
        self.count += 1
        self.entries.append(Entry(entry_id, self.count, owner, tuple(items)))
        self.last = entry_id
        # The bounds, as XADD's MAXLEN and XTRIM's MINID apply them: never the entry just
        # added.
        oldest = now - self.feed.retention_ms
        drop = 0
        while (len(self.entries) - drop > 1
               and (len(self.entries) - drop > self.feed.max_entries
                    or self.entries[drop].time < oldest)):
            drop += 1
        del self.entries[:drop]

    def find(self, position: Position, count: int) -> Found:
        """Up to ``count`` entries from ``position`` on (XRANGE's answer)."""
        entries = self.entries
        if position.id is None:
            chosen = entries[:count]
        else:
            mark = id_key(position.id)
            start = 0
            while start < len(entries) and id_key(entries[start].id) < mark:
                start += 1
            if (position.read is None and start < len(entries)
                    and entries[start].id == position.id):
                start += 1
            chosen = entries[start:start + count]
        return Found(chosen, self.count)

    def oldest(self) -> Entry | None:
        return self.entries[0] if self.entries else None


#: The feed a store keeps unless told otherwise.
DEFAULT = Feed()


def answer(after: str | None, found: list[tuple[Position, Found]], limit: int,
           oldest: Callable[[int], Entry | None]) -> Changes:
    """What ``changes`` answers from what each partition's log holds past its position:
    :class:`Compacted` when one lost entries (``oldest(partition)``: its oldest entry
    retained, where it resumes; the others resume where they were), else up to ``limit``
    events and the cursor after them."""
    gaps = [gap(p, f) for p, f in found]
    lost = [g for g in gaps if g is not None]
    if lost:
        resume = [p if g is None else resume_at(oldest(index), f.count)
                  for index, (g, (p, f)) in enumerate(zip(gaps, found, strict=True))]
        raise Compacted(after or "", encode(resume), lost[0])
    events, moved = events_of(found, limit)
    return Changes(events, encode(moved))
