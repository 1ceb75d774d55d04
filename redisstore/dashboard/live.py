"""The live feed: one reader per process turns store changes into server-sent events.

Every open page holds one ``EventSource`` on ``/events``; all of them are served by one
:class:`Feed`, whose single task reads each namespace a page watches once a round
(:data:`INTERVAL`), whatever the number of pages. It reads the store's change feed through
:meth:`Source.changes <redisstore.dashboard.values.Source.changes>` where the store has
one; until then (:class:`~redisstore.dashboard.values.NoFeed`) it polls the namespace's
counts, a few bounded commands, and sends a ``counts`` event when they changed.

Events carry ids ``<epoch>-<seq>``: a page that reconnects (``Last-Event-ID``) is sent the
events it missed from the last :data:`KEEP`, or a fresh ``counts`` snapshot when they are
gone or came from another process.
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


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: its id, the namespace it is about, its type and data."""

    id: str
    namespace: str
    kind: str
    data: dict[str, Any]

    def wire(self) -> str:
        # JSON holds no raw newline, so one data line carries it.
        return f"id: {self.id}\nevent: {self.kind}\ndata: {json.dumps(self.data)}\n\n"


@dataclass(eq=False)
class _Page:
    """One open page's stream: the namespace it watches (None: every known one)."""

    namespace: str | None
    queue: asyncio.Queue[Event] = field(default_factory=lambda: asyncio.Queue(QUEUE))
    lagged: bool = False

    def wants(self, namespace: str) -> bool:
        return self.namespace is None or self.namespace == namespace


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
        self._pages.add(page)
        self._start()
        try:
            missed = self._since(namespace, last_id)
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
                yield event.wire()
        finally:
            self._pages.discard(page)

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

    def publish(self, namespace: str, kind: str, data: dict[str, Any]) -> Event:
        """Number an event, keep it, and queue it for every page that watches it."""
        self._seq += 1
        event = Event(self._id(), namespace, kind, data)
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
                    for namespace, kind, data in found:
                        self.publish(namespace, kind, data)
                self.rounds += 1
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def _read(self, namespace: str) -> list[tuple[str, str, dict[str, Any]]]:
        """One round's read of ``namespace`` (on a worker thread): its feed's events
        where the store has a feed, then its counts when they changed."""
        found: list[tuple[str, str, dict[str, Any]]] = []
        if namespace not in self._feedless:
            try:
                changes = self.source.changes(namespace, self._cursors.get(namespace),
                                              limit=100, block=int(self.interval * 1000))
            except NoFeed:
                self._feedless.add(namespace)
            except Exception as exc:
                return [(namespace, "problem", {"namespace": namespace, "message":
                                                self.hide(f"{type(exc).__name__}: {exc}")})]
            else:
                for change in changes:
                    self._cursors[namespace] = change.cursor
                    found.append((namespace, "change", change_data(change)))
        data = self._read_counts(namespace)
        kind = data.pop("kind")
        if kind == "problem":
            return [*found, (namespace, kind, data)]
        version = data["counts"]
        if self._last.get(namespace) != version:
            self._last[namespace] = version
            found.append((namespace, "counts", data))
        return found

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
