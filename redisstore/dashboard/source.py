"""What the dashboard's pages read and do over a server's run stores: StoreSource.

:class:`Source` is the interface every page, the live feed and the actions go through;
:class:`StoreSource` implements it over one client with bounded reads of the layout-5
indexes (lua/_lib/keys.lua): ``{ns}:leases`` scored by lease expiry, ``{ns}:ready``
scored by the time a free run is eligible from, the ``{ns}:quarantine`` hash, and each
partition's ``{ns#p}:`` copies of them. Every read is a bounded command (ZCOUNT, ZRANGE
with LIMIT or by rank, HSCAN with COUNT, a run's own script); the only SCAN is
:meth:`StoreSource.scan`, called on an operator's explicit refresh, bounded and cached.

Three seams wait for the store: :meth:`Source.rates` (per-minute counters the scripts will
keep), :meth:`Source.events` and :meth:`Source.changes` (the change feed). They answer
"nothing yet" (an empty list, :class:`NoFeed`) until the store has them.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..core.errors import Compacted, Conflict, LeaseRefused, NotFound
from ..core.feed import ENTRY_BYTES, ORIGIN, Feed, Position, encode
from ..core.keys import Keyspace, check_namespace
from ..core.partitions import PartitionedOps, run_ops
from ..core.runops import RunOps, parse_events
from ..core.runs import MAX_RATE_MINUTES, MAX_RENEW, Claim, Fenced, Held, SessionInfo
from ..shells.shell import RunShell
from ..shells.store_ops import StoreOps
from ..shells.sync import Transport, _Drives
from .values import *  # noqa: F403 - the values StoreSource answers, where they were
from .values import (
    PAGE,
    Change,
    Counts,
    Entry,
    MinuteCounts,
    NoFeed,
    Outcome,
    Owner,
    Owners,
    Page,
    QuarantinePage,
    RunView,
    ScanResult,
    Seen,
    Source,
)

#: Sessions the counts and the owners view read at most (a namespace has about one a node).
SESSIONS_READ = 1000

#: Lease entries the owners view reads per slice: one get_many per MAX_RENEW of them (each
#: run's record is read with its header: the store has no header-only read).
OWNERS_SLICE = 200
#: Record bytes a run's page shows (the rest is counted, not shown).
RECORD_SHOWN = 64 << 10
#: What one explicit scan may do: SCAN calls (COUNT 1000 each), and dependency sets counted.
SCAN_CALLS = 100
SCAN_COUNT = 1000
SCAN_DEPENDENCIES = 1000
#: Seconds a scan's result is kept before a refresh may scan again.
SCAN_PAUSE = 5.0
#: Namespaces whose keyspaces and stores a source keeps at most.
KEPT = 100
#: The entries of each partition's feed a run's page looks through for its recent events.
EVENTS_LOOKED = 200

#: The owner an action on a free run deletes under (``Claim``: refused while another
#: owner holds the run live). Never used to hold anything: delete ignores the ttl.
DASHBOARD_OWNER = "redisstore-dashboard"


class _Runs(_Drives, StoreOps, RunShell[Transport]):
    """A namespace's run store as the dashboard reads it and acts on it: the sync store's
    operations on a transport of their own, without its pipelines, sessions or blocked
    claims. Not a ``RedisRunStore``: the source stands below the stores, so the dashboard's
    package and the command stand within the house's floors (docs/design/house.md)."""

    _ops: RunOps | PartitionedOps
    _transport = Transport
    _run_ops = staticmethod(run_ops)

    def session_parts(self, limit: int) -> list[list[SessionInfo]]:
        """Each partition's sessions, up to ``limit`` of each, with that partition's expiry
        and runs (:meth:`~redisstore.core.partitions.PartitionedOps.session_parts`)."""
        ops = self._ops
        if isinstance(ops, PartitionedOps):
            return self._read(ops.session_parts(limit))
        return [self._read(ops.sessions(limit))]


def _keeps_feed(store: _Runs) -> bool:
    """Whether ``store`` was opened with the namespace's change feed."""
    ops = store._ops
    part = ops.parts[0] if isinstance(ops, PartitionedOps) else ops
    return part.feed is not None


def _int(value: Any) -> int:
    return int(float(value))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def encode_cursor(entry: Entry) -> str:
    """A listing's cursor: the last entry shown, ``score:run``."""
    return f"{entry.score}:{entry.run}"


def decode_cursor(cursor: str) -> tuple[int, str]:
    """``(score, run)`` of a cursor; ValueError for one that is not."""
    score, sep, run = cursor.partition(":")
    if not sep or not re.fullmatch(r"-?\d{1,20}", score):
        raise ValueError(f"not a cursor: {cursor!r}")
    return int(score), run


#: Each scored state: its index, and its score range relative to the server time.
_RANGES = {
    "held_live": ("leases", False),
    "held_expired": ("leases", True),
    "ready_now": ("ready", True),
    "waiting_time": ("ready", False),
}

#: A key of some namespace or partition: its tag's name and partition, and the rest.
_KEY = re.compile(rb"\{([^{}#]+)(?:#(\d+))?\}:(.*)", re.DOTALL)
#: The run store's keys that mark a namespace as one of runs (the repository has others).
_RUN_KEYS = frozenset({b"meta", b"leases", b"ready", b"quarantine"})


class StoreSource(Source):
    """:class:`Source` over one redis-py compatible client (``redis.Redis``, fakeredis,
    valkey-py): the run store's operations per namespace for runs and actions, and bounded
    index reads of its own for counts and listings. ``namespaces``: those known without a
    scan (more come from :meth:`scan`)."""

    def __init__(self, client: Any, namespaces: Iterable[str] = (), *, label: str = "") -> None:
        self.client = client
        self.label = label
        self._given = [check_namespace(ns) for ns in namespaces]
        self._stores: dict[str, _Runs] = {}
        #: Per namespace: where the last read of its feed "from now" ended.
        self._tails: dict[str, str] = {}
        self._spaces: dict[str, list[Keyspace]] = {}
        self._lock = threading.Lock()
        self._scan: ScanResult | None = None

    # ---------------------------------------------------------------- namespaces

    def namespaces(self) -> list[str]:
        found = list(self._scan.namespaces) if self._scan else []
        return sorted(set(self._given) | set(found))

    def last_scan(self) -> ScanResult | None:
        return self._scan

    def scan(self) -> ScanResult:
        """Walk the keyspace with SCAN (``SCAN_CALLS`` calls of COUNT ``SCAN_COUNT`` at
        most) for run namespaces, their runs and dependency sets; cached, and not walked
        again within ``SCAN_PAUSE`` seconds. The only SCAN the dashboard sends."""
        with self._lock:
            if self._scan and time.monotonic() - self._scan.at < SCAN_PAUSE:
                return self._scan
            result = ScanResult(at=time.monotonic())
            deps: list[tuple[str, bytes]] = []
            cursor: int = 0
            while result.visited_calls < SCAN_CALLS:
                cursor, keys = self.client.scan(cursor, match="{*}:*", count=SCAN_COUNT)
                result.visited_calls += 1
                for key in keys:
                    found = _KEY.fullmatch(key if isinstance(key, bytes) else key.encode())
                    if not found:
                        continue
                    ns = found.group(1).decode("utf-8", "replace")
                    rest = found.group(3)
                    info = result.namespaces.setdefault(
                        ns, {"runs": 0, "dependency_sets": 0, "dependency_waiters": 0,
                             "indexed": 0})
                    if rest.startswith(b"r:"):
                        info["runs"] += 1
                    elif rest in _RUN_KEYS:
                        info["indexed"] = 1
                    elif rest.startswith(b"d:") and len(deps) < SCAN_DEPENDENCIES:
                        deps.append((ns, key))
                if int(cursor) == 0:
                    result.complete = True
                    break
            # A namespace of the instance repository alone has no run, index or meta.
            result.namespaces = {ns: info for ns, info in result.namespaces.items()
                                 if info.pop("indexed") or info["runs"]}
            if deps:
                pipe = self.client.pipeline(transaction=False)
                for _, key in deps:
                    pipe.scard(key)
                for (ns, _), size in zip(deps, pipe.execute(), strict=True):
                    if ns in result.namespaces:
                        result.namespaces[ns]["dependency_sets"] += 1
                        result.namespaces[ns]["dependency_waiters"] += int(size)
            self._scan = result
            return result

    def _spaces_of(self, namespace: str) -> list[Keyspace]:
        """The namespace's keyspaces (its partitions' when it has some), read from its meta
        key the first time (one HGET) and kept."""
        check_namespace(namespace)
        spaces = self._spaces.get(namespace)
        if spaces is None:
            from ..admin.namespaces import spaces_of

            if len(self._spaces) >= KEPT:  # any name a URL gives is read: keep few
                self._spaces.clear()
            spaces = self._spaces[namespace] = spaces_of(self.client, namespace)
        return spaces

    def _store(self, namespace: str) -> tuple[_Runs, list[Keyspace]]:
        """The namespace's store (made on its first run read or action: a store keeps
        connections of its own, and the counts need none) and keyspaces."""
        spaces = self._spaces_of(namespace)
        with self._lock:
            store = self._stores.get(namespace)
            if store is None:
                if len(self._stores) >= KEPT:  # each keeps connections: made again at need
                    for old in self._stores.values():
                        old.close()
                    self._stores.clear()
                store = _Runs(self.client, namespace=namespace,
                                      partitions=len(spaces), feed=self._feed_of(spaces))
                self._stores[namespace] = store
            return store, spaces

    def _feed_of(self, spaces: list[Keyspace]) -> Feed | None:
        """The change feed the namespace records (meta's ``feed``), or None. A store of
        partitions records it in each partition at its first write there: the first
        partition that records one (one pipelined HGET each)."""
        pipe = self.client.pipeline(transaction=False)
        for space in spaces:
            pipe.hget(space.meta, "feed")
        recorded = next((got for got in pipe.execute() if got is not None), None)
        if recorded is None:
            return None
        match = re.fullmatch(rb"([1-9]\d{0,8}):([1-9]\d{0,14})", bytes(recorded))
        if match is None:
            return None
        return Feed(retention_ms=int(match.group(2)),
                    retention_mb=int(match.group(1)) * ENTRY_BYTES / 2**20)

    def _tail(self, spaces: list[Keyspace]) -> str:
        """A cursor past every entry the namespace's feed holds now (one per partition):
        a reader from it sees what comes next."""
        positions = []
        for space in spaces:
            last = self.client.xrevrange(space.feed, count=1)
            if last:
                entry_id, fields = last[0]
                positions.append(Position(_text(entry_id), int(fields[b"n"])))
            else:
                positions.append(Position(ORIGIN, int(self.client.hget(space.meta, "feed-n")
                                                      or 0)))
        return encode(positions)

    def changes(self, namespace: str, after: str | None, limit: int = 100,
                block: int | None = None) -> list[Change]:
        """The namespace's change feed after ``after`` (None: from now); :class:`NoFeed`
        where the namespace records none; ``Compacted`` (with where to resume) when
        entries past ``after`` are gone: the live reader tells the pages, never a silent
        gap."""
        store, spaces = self._store(namespace)
        if not _keeps_feed(store):
            raise NoFeed(namespace)
        fresh = after is None
        if after is None:
            # From now: from where the last read from now ended (the live reader passes
            # None until it has an event's cursor), else the feed's end.
            after = self._tails.get(namespace) or self._tail(spaces)
        try:
            page = store.changes(after=after, limit=limit, block=block)
        except Compacted as lost:
            if not fresh:
                raise
            # Its own tail, trimmed since: from where the feed resumes (nothing was
            # promised to anyone from there).
            page = store.changes(after=lost.resume, limit=limit)
        if fresh:
            self._tails[namespace] = page.cursor
        return [Change(namespace, e.run, e.revision, e.kind, e.owner, e.time, e.cursor,
                       e.takeover) for e in page.events]

    def rates(self, namespace: str) -> list[MinuteCounts] | None:
        """The namespace's per-minute counts of the last hour (``store.rates``: one script
        a partition), or None where it keeps no feed, so no counts."""
        store, _ = self._store(namespace)
        if not _keeps_feed(store):
            return None
        return store.rates(MAX_RATE_MINUTES)

    def tail(self, namespace: str) -> str | None:
        """The cursor past the namespace's feed now (one bounded read a partition), or
        None where it keeps no feed."""
        store, spaces = self._store(namespace)
        return self._tail(spaces) if _keeps_feed(store) else None

    def events(self, namespace: str, run: str, limit: int = 20) -> list[Change]:
        """The run's recent events, newest first: from the last ``EVENTS_LOOKED`` entries
        of each partition's feed (bounded: a run quiet for longer shows none)."""
        store, spaces = self._store(namespace)
        if not _keeps_feed(store):
            return []
        found: list[Change] = []
        for space in spaces:
            for entry_id, fields in self.client.xrevrange(space.feed, count=EVENTS_LOOKED):
                items = parse_events(bytes(fields[b"e"]))
                owner = _text(fields[b"o"]) or None
                when = int(_text(entry_id).split("-")[0])
                for name, kind, revision, takeover in reversed(items):
                    if name == run:
                        found.append(Change(namespace, name, revision, kind, owner, when,
                                            "", takeover))
        found.sort(key=lambda c: c.time, reverse=True)
        return found[:limit]

    def _now(self) -> int:
        """The server's clock, ms (TIME: what the scripts judge leases by)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()

    # ---------------------------------------------------------------- reads

    def counts(self, namespace: str) -> Counts:
        spaces = self._spaces_of(namespace)
        now = self._now()
        pipe = self.client.pipeline(transaction=False)
        for keys in spaces:
            pipe.zcount(keys.leases, f"({now}", "+inf")
            pipe.zcount(keys.leases, "-inf", now)
            pipe.zcount(keys.ready, "-inf", now)
            pipe.zcount(keys.ready, f"({now}", "+inf")
            pipe.hlen(keys.quarantine)
        got = [int(x) for x in pipe.execute()]
        sums = [sum(got[i::5]) for i in range(5)]
        # A live session's runs have no lease entry of their own: held live, by the
        # session's count. (A lapsed session's runs go into the leases index at the next
        # claim, and are counted there.)
        sums[0] += sum(s.runs for s in self._live_sessions(namespace, now))
        return Counts(namespace, now, len(spaces), *sums)

    def _live_sessions(self, namespace: str, now: int) -> list[SessionInfo]:
        """The namespace's sessions live at ``now`` (at most SESSIONS_READ of each
        partition), each partition's apart: a session lapsed in some partitions only holds
        its runs there expired."""
        store, _ = self._store(namespace)
        return [s for listed in store.session_parts(SESSIONS_READ) for s in listed
                if s.expires > now]

    def listing(self, namespace: str, state: str, after: str | None = None,
                limit: int = PAGE) -> Page:
        index, due = _RANGES[state]
        spaces = self._spaces_of(namespace)
        limit = max(1, min(limit, PAGE))
        now = self._now()
        low, high = ("-inf", str(now)) if due else (f"({now}", "+inf")
        bound = None if after is None else decode_cursor(after)
        found: list[Entry] = []
        for keys in spaces:
            found += self._page(getattr(keys, index), low, high, bound, limit + 1)
        found.sort(key=lambda e: (e.score, e.run.encode("utf-8", "surrogateescape")))
        shown = found[:limit]
        return Page(shown, encode_cursor(shown[-1]) if len(found) > limit else None)

    def _page(self, key: str, low: str, high: str, bound: tuple[int, str] | None,
              count: int) -> list[Entry]:
        """Up to ``count`` entries of sorted set ``key`` within [low, high] by score, after
        ``bound`` (score, run) in the set's own order."""
        if bound is None:
            got = self.client.zrange(key, low, high, byscore=True, offset=0, num=count,
                                     withscores=True)
        else:
            at = self._position(key, *bound)
            got = self.client.zrange(key, at, at + count - 1, withscores=True)
        entries = [Entry(_text(run), _int(score)) for run, score in got]
        return [e for e in entries if _within(e.score, low, high)]

    def _position(self, key: str, score: int, run: str) -> int:
        """The rank of the first entry after ``(score, run)``: entries of one score are
        ordered by their bytes, so a binary search by rank within the score's group finds
        it in O(log n) calls of O(log N) each, whether or not the cursor's entry is still
        there. Never an offset: a cursor stays put when entries before it come and go."""
        member = run.encode("utf-8", "surrogateescape")
        pipe = self.client.pipeline(transaction=False)
        pipe.zcount(key, "-inf", f"({score}")
        pipe.zcount(key, "-inf", score)
        pipe.zscore(key, member)
        low, high, own = pipe.execute()
        if own is not None and _int(own) == score:
            rank = self.client.zrank(key, member)
            if rank is not None:
                return int(rank) + 1
        for _ in range(64):  # 2**64 entries of one score is more than any set holds
            if low >= high:
                break
            mid = (low + high) // 2
            at = self.client.zrange(key, mid, mid)
            if not at or at[0] > member:
                high = mid
            else:
                low = mid + 1
        return int(low)

    def quarantine(self, namespace: str, after: str | None = None,
                   limit: int = PAGE) -> QuarantinePage:
        spaces = self._spaces_of(namespace)
        # A cursor per partition would not fit in one link: a namespace of partitions
        # pages through its partitions one after the other, "p/cursor".
        part, _, cursor = (after or "0/0").partition("/")
        if not (part.isdigit() and cursor.isdigit()) or int(part) >= len(spaces):
            raise ValueError(f"not a quarantine cursor: {after!r}")
        p = int(part)
        nxt, fields = self.client.hscan(spaces[p].quarantine, int(cursor),
                                        count=max(1, min(limit, PAGE)))
        rows = []
        for name, value in fields.items():
            index, _, run = _text(name).partition("|")
            reason, _, error = _text(value).partition("\n")
            rows.append((index, run, reason, error if index == "failed" else None))
        rows.sort(key=lambda row: (row[1], row[0]))
        if int(nxt) != 0:
            following: str | None = f"{p}/{int(nxt)}"
        else:
            following = f"{p + 1}/0" if p + 1 < len(spaces) else None
        return QuarantinePage(rows, following)

    def owners(self, namespace: str, after: str | None = None) -> Owners:
        store, spaces = self._store(namespace)
        bound = None if after is None else decode_cursor(after)
        entries: list[Entry] = []
        for keys in spaces:
            entries += self._page(keys.leases, "-inf", "+inf", bound, OWNERS_SLICE + 1)
        entries.sort(key=lambda e: (e.score, e.run.encode("utf-8", "surrogateescape")))
        more = len(entries) > OWNERS_SLICE
        entries = entries[:OWNERS_SLICE]
        now = self._now()
        rows: dict[str, Owner] = {}
        for start in range(0, len(entries), MAX_RENEW):
            part = entries[start:start + MAX_RENEW]
            got = store.get_many([e.run for e in part])
            for entry in part:
                current = got.get(entry.run)
                if current is None or not isinstance(current.holder, Held):
                    continue  # gone or freed since the index was read
                owner = current.holder.owner
                was = rows.get(owner, Owner(owner, 0, 0, entry.score))
                rows[owner] = Owner(owner, was.runs + 1, was.live + (entry.score > now),
                                    min(was.soonest, entry.score))
        pipe = self.client.pipeline(transaction=False)
        for keys in spaces:
            pipe.zcard(keys.leases)
        total = sum(int(x) for x in pipe.execute())
        if after is None:
            # The runs of live sessions (no lease entry of their own), by their owner.
            for session in self._live_sessions(namespace, now):
                if session.runs:
                    was = rows.get(session.owner, Owner(session.owner, 0, 0, session.expires))
                    rows[session.owner] = Owner(session.owner, was.runs + session.runs,
                                                was.live + session.runs,
                                                min(was.soonest, session.expires))
                    total += session.runs
        return Owners(sorted(rows.values(), key=lambda o: (-o.runs, o.owner)), len(entries),
                      total, complete=not more and after is None,
                      next=encode_cursor(entries[-1]) if more else None, now=now)

    def run(self, namespace: str, run: str) -> RunView | None:
        store, spaces = self._store(namespace)
        try:
            current = store.get(run)
        except NotFound:
            return None
        from ..core.partitions import partition_of

        keys = spaces[partition_of(run, len(spaces))]
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(keys.leases, run)
        pipe.zscore(keys.ready, run)
        pipe.hget(keys.quarantine, f"failed|{run}")
        expiry, due, failed = pipe.execute()
        record = current.record
        shown = record[:RECORD_SHOWN]
        text = shown.decode("utf-8", "replace")
        is_json = False
        if len(record) <= RECORD_SHOWN:
            try:
                text = json.dumps(json.loads(record), indent=2, ensure_ascii=False)
                is_json = True
            except ValueError:
                pass
        error = None
        if failed is not None:
            error = _text(failed).partition("\n")[2] or None
        return RunView(namespace, run, current, self._now(),
                       None if expiry is None else _int(expiry),
                       None if due is None else _int(due), error, text, is_json,
                       len(record), len(record) > RECORD_SHOWN)

    # ---------------------------------------------------------------- actions

    def _refused(self, namespace: str, run: str, why: str) -> Outcome:
        return Outcome(False, why, self.run(namespace, run))

    def release_seen(self, namespace: str, run: str, seen: Seen) -> Outcome:
        """``finish`` with neither record nor failure under the grant seen: one script that
        checks the revision, then the grant, and frees the lease (no new revision)."""
        if seen.owner is None or seen.token is None:
            return self._refused(namespace, run, "the page showed it free: nothing to release")
        store, _ = self._store(namespace)
        lease = Fenced(seen.owner, seen.token)
        return self._checked(namespace, run, seen,
                             lambda: store.finish(run, seen.revision, lease), "released")

    def delete_seen(self, namespace: str, run: str, seen: Seen) -> Outcome:
        """``delete`` at the revision seen, under the grant seen (``Fenced``); a run seen
        free under ``Claim`` of the dashboard's owner, refused while another owner holds it
        live. One script either way. (A run claimed since the page and left to expire,
        with no write, is not told apart from a free one: no lease condition refuses
        every holder.)"""
        store, _ = self._store(namespace)
        lease: Fenced | Claim = (Claim(DASHBOARD_OWNER, 1) if seen.owner is None
                                 or seen.token is None else Fenced(seen.owner, seen.token))
        return self._checked(namespace, run, seen,
                             lambda: store.delete(run, seen.revision, lease), "deleted")

    def _checked(self, namespace: str, run: str, seen: Seen, write: Callable[[], object],
                 done: str) -> Outcome:
        """``write``, a store call checked against the revision and grant ``seen``: its
        refusal told as the page's reader needs it, with the run's state now."""
        try:
            write()
        except NotFound:
            return Outcome(False, "it no longer exists")
        except Conflict as conflict:
            return self._refused(namespace, run, f"it was written since the page was drawn "
                                 f"(revision {conflict.current}, the page showed "
                                 f"{seen.revision})")
        except LeaseRefused:
            return self._refused(namespace, run, "its lease changed hands since the page was "
                                 "drawn")
        return Outcome(True, done)

    def restore_seen(self, namespace: str, run: str, seen: Seen) -> Outcome:
        """``restore`` at the revision seen, in one script (``restore(run, expected=...)``):
        a write since the page was drawn is refused with the run's state now, and so is a
        run that is no longer quarantined. (A run that left the quarantine and came back
        to it at the same revision, by a release or a failed try, neither of which writes
        a revision, is put back as the page asked.)"""
        store, _ = self._store(namespace)
        restored: list[bool] = []
        outcome = self._checked(namespace, run, seen,
                                lambda: restored.append(store.restore(run, seen.revision)),
                                "restored")
        if outcome.done and not restored[0]:
            return self._refused(namespace, run, "it is not quarantined")
        return outcome


def _within(score: int, low: str, high: str) -> bool:
    """Whether ``score`` is within a ZRANGE BYSCORE range of ``low`` and ``high``."""

    def above(bound: str) -> bool:
        if bound == "-inf":
            return True
        return score > int(bound[1:]) if bound.startswith("(") else score >= int(bound)

    def below(bound: str) -> bool:
        if bound == "+inf":
            return True
        return score < int(bound[1:]) if bound.startswith("(") else score <= int(bound)

    return above(low) and below(high)
