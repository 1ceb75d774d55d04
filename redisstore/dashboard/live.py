"""The live feed: one reader per process turns store changes into server-sent events.

Every open page holds one ``EventSource`` on ``/events``; all of them are served by one
:class:`Feed`, whose single task reads each namespace a page watches once a round
(:data:`INTERVAL`), whatever the number of pages. It reads the store's change feed through
:meth:`Source.changes <redisstore.dashboard.values.Source.changes>` where the store has
one; until then (:class:`~redisstore.dashboard.values.NoFeed`) it polls the namespace's
counts, a few bounded commands, and sends a ``counts`` event when they changed.

Events carry ids ``<epoch>-<seq>``, and on a namespace's page where the namespace keeps a
change feed ``<epoch>-<seq>~<cursor>``: the page's own position in the feed, after every
change event it was sent. A page that reconnects (``Last-Event-ID``) with a cursor is sent
every change event past it, read from the store's feed (whichever process it reconnects
to, however long it was away), then goes on with the live events, those it was already
sent left out; a cursor older than the feed keeps gets a ``compacted`` event (the page is
told, never a silent gap). Without a cursor, it is sent the events it missed from the last
:data:`KEEP`, or a fresh ``counts`` snapshot when they are gone or came from another
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from ..core.errors import Compacted
from ..core.feed import Position, decode, encode
from .values import Change, NoFeed, Source

#: Seconds between two reads of a watched namespace.
INTERVAL = 1.0
#: Events kept for pages that reconnect.
KEEP = 512
#: Events queued for one page before it is sent a snapshot instead (a slow reader).
QUEUE = 100
#: Seconds of silence after which a comment line keeps proxies from closing the stream.
KEEPALIVE = 15.0
#: Seconds between two looks of a stream at :attr:`Feed.closing`.
TICK = 0.25
#: Seconds the reader goes on with no page open before it stops (the next page starts it).
IDLE = 10.0
#: Namespaces the namespaces page follows live at most (each costs one round trip a round).
WATCH_ALL = 50
#: The most change events a page that reconnects is sent from the store's feed before it
#: is told it is too far behind (a ``compacted`` event, then a snapshot).
CATCH_UP = 2_000
#: What separates an event id from the page's feed cursor in it.
CURSOR_MARK = "~"
#: How long a browser waits before it reconnects a dropped stream (ms).
RETRY_MS = 1_000


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: its id, the namespace it is about, its type and data (and
    for a change event, the feed cursor right after it)."""

    id: str
    namespace: str
    kind: str
    data: dict[str, Any]
    cursor: str | None = None

    def wire(self, id: str | None = None) -> str:
        # JSON holds no raw newline, so one data line carries it.
        return (f"id: {self.id if id is None else id}\nevent: {self.kind}\n"
                f"data: {json.dumps(self.data)}\n\n")


def positions_of(cursor: str) -> list[Position] | None:
    """A feed cursor's positions (its own partition count), or None for one that is not."""
    if not cursor.startswith("f1:"):
        return None
    try:
        return decode(cursor, len(cursor[3:].split(",")))
    except (ValueError, Compacted):
        return None


def _order(position: Position) -> tuple[int, float]:
    """Where a position stands in its partition's feed: entry number, then events read of
    it (all of it: past every one)."""
    if position.id is None:
        return (-1, 0)
    return (position.seq, float("inf") if position.read is None else position.read)


def advance(seen: list[Position], cursor: str | None) -> list[Position] | None:
    """The positions a page that has seen ``seen`` is at once sent the change event whose
    cursor is ``cursor``; None when that event is not past ``seen`` in any partition (the
    page has it already). A cursor of another partition count moves the page to it."""
    after = positions_of(cursor) if cursor else None
    if after is None:
        return seen
    if len(after) != len(seen):
        return after
    if not any(_order(a) > _order(s) for a, s in zip(after, seen, strict=True)):
        return None
    return [a if _order(a) > _order(s) else s for a, s in zip(after, seen, strict=True)]


@dataclass(eq=False)
class _Page:
    """One open page's stream: the namespace it watches (None: every known one) and, on a
    namespace's page, its position in the namespace's feed (None: not known yet)."""

    namespace: str | None
    queue: asyncio.Queue[Event] = field(default_factory=lambda: asyncio.Queue(QUEUE))
    lagged: bool = False
    positions: list[Position] | None = None

    def wants(self, namespace: str) -> bool:
        return self.namespace is None or self.namespace == namespace

    def send(self, event: Event) -> str | None:
        """``event`` as this page is sent it, its id carrying the page's feed position
        after it; None for a change event the page was already sent (read from the feed
        when it came back)."""
        if self.namespace is not None and event.kind == "change" and event.cursor:
            if self.positions is None:
                self.positions = positions_of(event.cursor)
            else:
                moved = advance(self.positions, event.cursor)
                if moved is None:
                    return None
                self.positions = moved
        if self.namespace is None or self.positions is None:
            return event.wire()
        return event.wire(f"{event.id}{CURSOR_MARK}{encode(self.positions)}")


def split_id(last_id: str | None) -> tuple[str | None, str | None]:
    """A Last-Event-ID's own part (``<epoch>-<seq>``) and feed cursor (None: none)."""
    if not last_id:
        return None, None
    own, mark, cursor = last_id.partition(CURSOR_MARK)
    return own or None, (cursor or None) if mark else None


def counts_data(counts: Any) -> dict[str, Any]:
    return {"namespace": counts.namespace, "now": counts.now, "counts": counts.by_state()}


def change_data(change: Change) -> dict[str, Any]:
    return {"namespace": change.namespace, "run": change.run, "revision": change.revision,
            "kind": change.kind, "owner": change.owner, "time": change.time,
            "takeover": change.takeover}


class Feed:
    """The process's one reader of ``source``, fanning events out to every open page.
    ``hide`` makes an error's text safe to show (a URL's credentials)."""

    def __init__(self, source: Source, *, interval: float = INTERVAL,
                 hide: Callable[[str], str] = str) -> None:
        self.source = source
        self.interval = interval
        self.hide = hide
        self.epoch = secrets.token_hex(4)
        self._seq = 0
        self._recent: deque[Event] = deque(maxlen=KEEP)
        self._pages: set[_Page] = set()
        self._task: asyncio.Task[None] | None = None
        self._last: dict[str, dict[str, Any]] = {}
        self._cursors: dict[str, str | None] = {}
        self._feedless: set[str] = set()
        #: Rounds read so far (the tests count them).
        self.rounds = 0
        #: Set (from any thread) when the server stops: every stream ends within
        #: :data:`TICK`, so a graceful shutdown does not wait on open pages.
        self.closing = threading.Event()

    # ------------------------------------------------------------------ pages

    async def stream(self, namespace: str | None, last_id: str | None) -> AsyncIterator[str]:
        """The event stream of one page: what it missed since ``last_id``, then every new
        event about ``namespace`` (None: about every namespace), until it goes away."""
        page = _Page(namespace)
        own, cursor = split_id(last_id)
        fresh = cursor is None and own is None
        if namespace is not None and fresh:
            # A page that opens now has seen the feed up to its end: its ids carry that
            # position from the first event on, so a drop at any moment resumes from it.
            cursor = await anyio.to_thread.run_sync(self._tail, namespace)
        if namespace is not None and cursor is not None:
            page.positions = positions_of(cursor)
            if page.positions is not None and self._cursors.get(namespace) is None:
                # The reader has not read this namespace since this process started: it
                # reads from the page's cursor on (what it would have skipped, as "from
                # now", the page reads itself below).
                self._cursors[namespace] = cursor
        # Registered first: every event published from here on is queued for the page;
        # those before are in the store's feed, which the catch-up reads.
        self._pages.add(page)
        self._start()
        try:
            # The browser's wait before it reconnects after a drop (its default is 3 s).
            yield f"retry: {RETRY_MS}\n\n"
            if namespace is not None and page.positions is not None and not fresh:
                async for chunk in self._catch_up(page, namespace):
                    yield chunk
            elif fresh:
                for event in await self._snapshot(namespace):
                    wired = page.send(event)
                    if wired is not None:
                        yield wired
            else:
                missed = self._since(namespace, own)
                if missed is None:
                    for event in await self._snapshot(namespace):
                        yield event.wire()
                else:
                    for event in missed:
                        yield event.wire()
            quiet = 0.0
            while not self.closing.is_set():
                if page.lagged:
                    page.lagged = False
                    while not page.queue.empty():
                        page.queue.get_nowait()
                    if namespace is not None and page.positions is not None:
                        # A slow page: what it was not sent is in the feed, read from it.
                        async for chunk in self._catch_up(page, namespace):
                            yield chunk
                    else:
                        for event in await self._snapshot(namespace):
                            yield event.wire()
                try:
                    event = await asyncio.wait_for(page.queue.get(), TICK)
                except TimeoutError:
                    quiet += TICK
                    if quiet >= KEEPALIVE:
                        quiet = 0.0
                        yield ": keep-alive\n\n"
                    continue
                quiet = 0.0
                wired = page.send(event)
                if wired is not None:
                    yield wired
        finally:
            self._pages.discard(page)

    async def _catch_up(self, page: _Page, namespace: str) -> AsyncIterator[str]:
        """Every change event of ``namespace``'s feed past the page's position, read from
        the store until it has none more (the reader's events queued meanwhile that the
        page is sent here are then left out), then a counts snapshot. A position older than
        the feed keeps: a ``compacted`` event first, and on from where the feed resumes;
        more than :data:`CATCH_UP` events behind: a ``compacted`` event, and the page goes
        on from the live events (its counts and live part fetched afresh)."""
        sent = 0
        while page.positions is not None:
            after = encode(page.positions)
            try:
                changes = await anyio.to_thread.run_sync(self._page_read, namespace, after)
            except NoFeed:
                page.positions = None
                break
            except Compacted as lost:
                page.positions = positions_of(lost.resume)
                yield self._told(namespace, lost.reason, after).wire()
                continue
            except Exception as exc:
                yield Event(self._id(), namespace, "problem", {
                    "namespace": namespace,
                    "message": self.hide(f"{type(exc).__name__}: {exc}")}).wire()
                break
            if not changes:
                break
            for change in changes:
                chunk = page.send(Event(self._id(), namespace, "change", change_data(change),
                                        change.cursor))
                if chunk is not None:
                    sent += 1
                    yield chunk
            if sent >= CATCH_UP:
                page.positions = None
                yield self._told(namespace, f"more than {CATCH_UP} events were missed",
                                 after).wire()
                break
        for event in await self._snapshot(namespace):
            chunk = page.send(event)
            if chunk is not None:
                yield chunk

    def _tail(self, namespace: str) -> str | None:
        """The namespace's feed's end now (None: no feed, or it could not be read: the
        page then resumes as a page without a feed does)."""
        try:
            return self.source.tail(namespace)
        except Exception:
            return None

    def _page_read(self, namespace: str, after: str) -> list[Change]:
        """One read of a page's catch-up (on a worker thread): up to 100 change events."""
        return self.source.changes(namespace, after, limit=100)

    def _told(self, namespace: str, reason: str, after: str) -> Event:
        """The event that tells a page change events past ``after`` are not coming: it
        fetches its live part afresh."""
        return Event(self._id(), namespace, "compacted",
                     {"namespace": namespace, "reason": reason, "after": after})

    def _since(self, namespace: str | None, last_id: str | None) -> list[Event] | None:
        """The kept events after ``last_id`` about ``namespace``; None when the page must
        start from a snapshot (no id, another process's, or one no longer kept)."""
        if not last_id:
            return None
        epoch, _, seq = last_id.partition("-")
        if epoch != self.epoch or not seq.isdigit():
            return None
        after = int(seq)
        if after > self._seq:
            return None
        if after < self._seq and (not self._recent
                                  or int(self._recent[0].id.split("-")[1]) > after + 1):
            return None  # some it missed are no longer kept
        return [e for e in self._recent if int(e.id.split("-")[1]) > after
                and (namespace is None or e.namespace == namespace)]

    async def _snapshot(self, namespace: str | None) -> list[Event]:
        """A counts event of each namespace the page watches, as of now, under the
        latest id (it changes nothing: a page that resumes from it misses nothing)."""
        names = self._watched_by(namespace)
        events = []
        for name in names:
            data = await anyio.to_thread.run_sync(self._read_counts, name)
            events.append(Event(self._id(), name, data.pop("kind"), data))
        return events

    def _read_counts(self, namespace: str) -> dict[str, Any]:
        try:
            return {"kind": "counts", **counts_data(self.source.counts(namespace))}
        except Exception as exc:
            return {"kind": "problem", "namespace": namespace,
                    "message": self.hide(f"{type(exc).__name__}: {exc}")}

    def _watched_by(self, namespace: str | None) -> list[str]:
        if namespace is not None:
            return [namespace]
        return self.source.namespaces()[:WATCH_ALL]

    # ------------------------------------------------------------------ the reader

    def _id(self) -> str:
        return f"{self.epoch}-{self._seq}"

    def publish(self, namespace: str, kind: str, data: dict[str, Any],
                cursor: str | None = None) -> Event:
        """Number an event, keep it, and queue it for every page that watches it."""
        self._seq += 1
        event = Event(self._id(), namespace, kind, data, cursor)
        self._recent.append(event)
        for page in list(self._pages):
            if not page.wants(namespace):
                continue
            try:
                page.queue.put_nowait(event)
            except asyncio.QueueFull:
                page.lagged = True
        return event

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        idle_since: float | None = None
        while True:
            started = time.monotonic()
            if self.closing.is_set():
                return
            if not self._pages:
                idle_since = idle_since or started
                if started - idle_since > IDLE:
                    return
            else:
                idle_since = None
                names: set[str] = set()
                for page in list(self._pages):
                    names.update(self._watched_by(page.namespace))
                results = await asyncio.gather(
                    *(anyio.to_thread.run_sync(self._read, name) for name in sorted(names)))
                for found in results:
                    for namespace, kind, data, cursor in found:
                        self.publish(namespace, kind, data, cursor)
                self.rounds += 1
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def _read(self, namespace: str) -> list[tuple[str, str, dict[str, Any], str | None]]:
        """One round's read of ``namespace`` (on a worker thread): its feed's events
        where the store has a feed, then its counts when they changed. A cursor of the
        reader's older than the feed keeps: a ``compacted`` event for its pages, and on
        from where the feed resumes."""
        found: list[tuple[str, str, dict[str, Any], str | None]] = []
        if namespace not in self._feedless:
            after = self._cursors.get(namespace)
            try:
                changes = self.source.changes(namespace, after, limit=100,
                                              block=int(self.interval * 1000))
            except NoFeed:
                self._feedless.add(namespace)
            except Compacted as lost:
                self._cursors[namespace] = lost.resume
                found.append((namespace, "compacted", {"namespace": namespace,
                                                       "reason": lost.reason,
                                                       "after": after}, None))
            except Exception as exc:
                return [(namespace, "problem", {"namespace": namespace, "message":
                                                self.hide(f"{type(exc).__name__}: {exc}")},
                         None)]
            else:
                for change in changes:
                    self._cursors[namespace] = change.cursor
                    found.append((namespace, "change", change_data(change), change.cursor))
        data = self._read_counts(namespace)
        kind = data.pop("kind")
        if kind == "problem":
            return [*found, (namespace, kind, data, None)]
        version = data["counts"]
        if self._last.get(namespace) != version:
            self._last[namespace] = version
            found.append((namespace, "counts", data, None))
        return found

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
