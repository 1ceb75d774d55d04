"""The change feed's calls of one partition (docs/design/feed.md), as generators of calls:
recording the store's bounds in meta, reading the stream, waiting on it. ``RunOps.changes``
and ``PartitionedOps.changes`` put them together through :mod:`redisstore.feed`."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from .driver import Call, Operation, ask, text
from .errors import Corrupt, Misconfigured, StoreError, Unavailable
from .feed import Entry, Feed, Found, Kind, Position
from .keys import Keyspace

T = TypeVar("T")

#: The events' one-letter codes, as lua/_lib/feed.lua writes them.
CODES: dict[str, tuple[Kind, bool]] = {
    "i": ("inserted", False), "w": ("written", False), "c": ("claimed", False),
    "t": ("claimed", True), "r": ("released", False), "d": ("deleted", False),
    "q": ("quarantined", False), "b": ("restored", False)}

_EVENT = re.compile(rb"([iwctrdqb])(\d{1,16}):(\d{1,5}):")


def parse_events(value: bytes) -> tuple[tuple[str, Kind, int, bool], ...]:
    """An entry's ``e`` field: each event as ``<code><rev>:<length>:<run>``."""
    events = []
    at = 0
    while at < len(value):
        match = _EVENT.match(value, at)
        if match is None:
            raise Corrupt("", "feed")
        code, rev, length = match.groups()
        start = match.end()
        end = start + int(length)
        if end > len(value):
            raise Corrupt("", "feed")
        kind, takeover = CODES[code.decode()]
        events.append((value[start:end].decode("utf-8", "surrogateescape"), kind, int(rev),
                       takeover))
        at = end
    return tuple(events)


def parse_entries(reply: Any) -> list[Entry]:
    """XRANGE's (or one stream of XREAD's) raw answer as entries."""
    if isinstance(reply, StoreError):
        raise reply
    entries = []
    for entry_id, fields in reply or []:
        pairs = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) \
            else fields
        try:
            seq = int(pairs[b"n"])
            owner = text(pairs[b"o"]) or None
            items = parse_events(bytes(pairs[b"e"]))
        except (KeyError, ValueError, TypeError) as exc:
            raise Corrupt("", "feed") from exc
        entries.append(Entry(text(entry_id), seq, owner, items))
    return entries


def _count(reply: Any) -> int:
    if reply is None:
        return 0
    try:
        return int(reply)
    except (TypeError, ValueError) as exc:
        raise Corrupt("", "meta.feed-n") from exc


def _typed(call: Call[T], field: str) -> Operation[T]:
    """``call``'s answer; a key of another type (WRONGTYPE) is the namespace's data damaged:
    ``Corrupt`` naming ``field``, never an outage."""
    try:
        return (yield from ask(call))
    except Unavailable as exc:
        if exc.code == "WRONGTYPE":
            raise Corrupt("", field) from exc
        raise


class FeedOps:
    """The feed's part of :class:`~redisstore.core.runops.RunOps`."""

    keys: Keyspace
    #: The store's feed bounds (None: it keeps none), and whether they are in meta yet.
    feed: Feed | None = None
    feed_recorded: bool = True

    def set_feed(self, feed: Feed | None) -> None:
        """Open the store with ``feed``: recorded in the namespace's meta before its first
        write (:meth:`record_feed`), which every script of the namespace then reads."""
        if feed is not None and not isinstance(feed, Feed):
            raise TypeError(f"feed must be a Feed or None, got {type(feed).__name__}")
        self.feed = feed
        self.feed_recorded = feed is None

    def record_feed(self) -> Operation[None]:
        """Record the bounds (idempotent: sent again after a lost reply)."""
        if self.feed_recorded or self.feed is None:
            return
        meta = self.keys.meta
        # v5 goes: a namespace with a feed leaves its writes to the scripts' general code,
        # which writes the entries (lua/_lib/layout.lua).
        yield from ask(Call(None, (meta,), ("HSET", meta, "feed", f"{self.feed.max_entries}:"
                                            f"{self.feed.retention_ms}"),
                            lambda _: None, write=False))
        yield from ask(Call(None, (meta,), ("HDEL", meta, "v5"), lambda _: None, write=False))
        self.feed_recorded = True

    def feed_on(self) -> None:
        if self.feed is None:
            raise Misconfigured("this store was opened without a change feed: open it with "
                                "feed=Feed(...) (docs/runs.md, \"The change feed\")")

    def feed_read(self, position: Position, count: int) -> Operation[Found]:
        """Up to ``count`` entries past ``position`` (from its own entry when read partly),
        and the partition's count, read first: entries written in between only add."""
        k = self.keys
        n = yield from _typed(Call(None, (k.meta,), ("HGET", k.meta, "feed-n"), _count,
                                   write=False), "meta")
        if position.id is None:
            start = "-"
        elif position.read is not None:
            start = position.id
        else:
            start = "(" + position.id
        entries = yield from _typed(Call(None, (k.feed,), ("XRANGE", k.feed, start, "+",
                                                           "COUNT", count), parse_entries,
                                         write=False), "feed")
        return Found(entries, max(n, entries[-1].seq if entries else 0))

    def feed_oldest(self) -> Operation[Entry | None]:
        """The partition's oldest entry retained, or None."""
        k = self.keys
        entries = yield from _typed(Call(None, (k.feed,), ("XRANGE", k.feed, "-", "+",
                                                           "COUNT", 1), parse_entries,
                                         write=False), "feed")
        return entries[0] if entries else None

    def feed_wait(self, position: Position, ms: int) -> Operation[None]:
        """Wait up to ``ms`` (server-side, ``XREAD BLOCK``) for an entry past ``position``."""
        k = self.keys
        after = "$" if position.id is None else position.id
        yield from ask(Call(None, (k.feed,), ("XREAD", "COUNT", 1, "BLOCK", ms, "STREAMS",
                                              k.feed, after), lambda _: None, write=False,
                            fresh=True))
