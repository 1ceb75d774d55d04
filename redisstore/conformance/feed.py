"""The change feed, as docs/contract.md ("The change feed") gives it: one event per change,
written with it (a refused call and a renewal leave none), in order within a partition,
resumable from every event's cursor, and never a silent gap: a cursor past what is retained
raises ``Compacted`` with where to resume. And its per-minute counts ("Per-minute counts"):
claims, finishes and takeovers, counted by the calls that make them, for an hour.
"""

from __future__ import annotations

import threading
import time

import pytest

from ..discovery import json_wait
from ..errors import AlreadyExists, Compacted, Conflict, LeaseRefused, NotFound
from ..feed import MINUTE_MS, Changes, Event, Feed
from ..runs import Claim, Discover, Failure, Fenced, Hold, Release, RunStore, Seize
from .base import LONG, ME, OTHER, RunSuite, rec


def seen(events: list[Event]) -> list[tuple[str, str, int, str | None, bool]]:
    """What the rules compare of each event: run, kind, revision, owner, takeover."""
    return [(e.run, e.kind, e.revision, e.owner, e.takeover) for e in events]


class FeedRules(RunSuite):
    """``changes``: the change feed."""

    # ------------------------------------------------------------------ hooks

    def make_feed_store(self, feed: Feed, *, discover: Discover | None = None) -> RunStore:
        """A fresh, isolated store (as :meth:`make_store`) that keeps a change feed with the
        bounds ``feed`` says. A backend without a feed skips the rules."""
        pytest.skip("this backend keeps no change feed")

    def feed_store(self, *, discover: Discover | None = None) -> RunStore:
        return self.make_feed_store(Feed(), discover=discover)

    # ------------------------------------------------------------------ helpers

    def everything(self, store: RunStore, after: str | None = None) -> Changes:
        """Every event after ``after``, read a page at a time; the last page's cursor."""
        events: list[Event] = []
        cursor = after
        while True:
            page = store.changes(after=cursor, limit=1000)
            events += page.events
            cursor = page.cursor
            if not page.events:
                return Changes(events, cursor)

    @property
    def parts(self) -> int:
        """The store's partitions (a suite over a store of many sets ``partitions``)."""
        return int(getattr(self, "partitions", 1))

    def in_order(self, events: list[Event], expected: list[tuple[str, str, int, str | None,
                                                                 bool]]) -> None:
        """``events`` are ``expected``: in that order on a store of one partition; over
        partitions, each run's in its order (a partition's are in order, and a run is in
        one partition), and the same events in all."""
        got = seen(events)
        if self.parts == 1:
            assert got == expected
            return
        assert sorted(got) == sorted(expected)
        for run in {e[0] for e in expected}:
            assert [e for e in got if e[0] == run] == [e for e in expected if e[0] == run]

    def tail(self, store: RunStore) -> str:
        """The cursor past every event so far."""
        return self.everything(store).cursor

    # ------------------------------------------------------------------ the events

    def test_each_change_is_one_event_in_order_with_its_owner(self) -> None:
        store = self.feed_store(discover=json_wait)
        assert store.changes().events == []
        start = store.now()
        store.insert("a", rec(None), Claim(ME, self.short_ttl))
        store.insert("b", rec({"at": 0}), Release())
        store.compare_and_set("b", 1, rec({"at": 0}, n=1), Release())
        assert store.claim_ready(OTHER, LONG) == ["b"]
        self.expire(store)
        assert store.claim_expired(OTHER, LONG) == ["a"]
        assert store.release(OTHER, ["b"]) == ["b"]
        token = store.get("a").token
        assert token is not None
        store.finish("a", 1, Fenced(OTHER, token), failure=Failure("no", final=True))
        assert store.restore("a")
        store.delete("b", 2, Release())
        events = self.everything(store).events
        self.in_order(events, [
            ("a", "inserted", 1, ME, False),
            ("b", "inserted", 1, None, False),
            ("b", "written", 2, None, False),
            ("b", "claimed", 2, OTHER, False),
            ("a", "claimed", 1, OTHER, True),
            ("b", "released", 2, OTHER, False),
            ("a", "quarantined", 1, OTHER, False),
            ("a", "restored", 1, None, False),
            ("b", "deleted", 2, None, False),
        ])
        times = [e.time for e in events]
        assert times == sorted(times) and times[0] >= start and times[-1] <= store.now()

    def test_finish_and_the_lease_conditions_say_what_they_did(self) -> None:
        store = self.feed_store()
        store.insert("r", b"r1", Seize(ME, LONG))
        store.compare_and_set("r", 1, b"r2", Hold(ME))
        token = store.get("r").token
        assert token is not None
        store.finish("r", 2, Fenced(ME, token), record=b"r3")
        store.compare_and_set("r", 3, b"r4", Claim(OTHER, LONG))
        token = store.get("r").token
        assert token is not None
        store.finish("r", 4, Fenced(OTHER, token))
        store.compare_and_set("r", 4, b"r5", Seize(ME, LONG))
        token = store.get("r").token
        assert token is not None
        store.finish("r", 5, Fenced(ME, token), failure=Failure("later", delay=10))
        assert seen(self.everything(store).events) == [
            ("r", "inserted", 1, ME, False),
            ("r", "written", 2, ME, False),
            ("r", "written", 3, ME, False),
            ("r", "written", 4, OTHER, False),
            ("r", "released", 4, OTHER, False),
            ("r", "written", 5, ME, False),
            ("r", "released", 5, ME, False),
        ]

    def test_a_refused_call_or_a_renewal_is_no_event(self) -> None:
        store = self.feed_store()
        store.insert("r", b"r1", Claim(OTHER, LONG))
        cursor = self.tail(store)
        with pytest.raises(AlreadyExists):
            store.insert("r", b"again", Release())
        with pytest.raises(Conflict):
            store.compare_and_set("r", 7, b"r2", Release())
        with pytest.raises(LeaseRefused):
            store.compare_and_set("r", 1, b"r2", Hold(ME))
        with pytest.raises(LeaseRefused):
            store.compare_and_set("r", 1, b"r2", Claim(ME, LONG))
        with pytest.raises(NotFound):
            store.delete("absent", 1, Release())
        with pytest.raises(LeaseRefused):
            store.finish("r", 1, Fenced(ME, 1))
        assert store.renew(OTHER, ["r"], LONG) == ["r"]
        assert store.release(ME, ["r", "absent"]) == []
        assert store.claim(ME, LONG, 10) == []
        assert not store.restore("r")
        assert store.refresh("r") is False
        assert store.changes(after=cursor).events == []

    def test_a_claim_of_many_runs_lists_them_in_claim_order_and_resumes_mid_way(self) -> None:
        store = self.feed_store(discover=json_wait)
        runs = [f"run-{n:03}" for n in range(100)]
        for n, run in enumerate(runs):
            store.insert(run, rec({"at": n}), Release())
        cursor = self.tail(store)
        assert store.claim_ready(ME, LONG, 100) == runs
        whole = store.changes(after=cursor, limit=1000).events
        self.in_order(whole, [(run, "claimed", 1, ME, False) for run in runs])
        if self.parts == 1:
            assert len({e.time for e in whole}) == 1  # one call, one script, one instant
        # Read 7 at a time: the same events, each page resuming where the last stopped.
        paged: list[Event] = []
        while True:
            page = store.changes(after=cursor, limit=7)
            if not page.events:
                break
            assert len(page.events) <= 7
            paged += page.events
            cursor = page.cursor
        assert paged == whole

    def test_every_events_cursor_resumes_right_after_it(self) -> None:
        store = self.feed_store()
        for n in range(5):
            store.insert(f"r{n}", b"x", Claim(ME, LONG))
        assert store.release(ME, ["r3", "r1", "r4"]) == ["r3", "r1", "r4"]
        events = self.everything(store).events
        assert len(events) == 8
        for n, event in enumerate(events):
            rest = self.everything(store, event.cursor).events
            assert rest == events[n + 1:]
        assert store.changes(after=events[-1].cursor).events == []

    def test_an_empty_answer_gives_a_cursor_that_sees_what_comes_next(self) -> None:
        store = self.feed_store()
        empty = store.changes()
        assert empty.events == []
        store.insert("r", b"x", Release())
        assert seen(store.changes(after=empty.cursor).events) == [
            ("r", "inserted", 1, None, False)]

    def test_the_arguments_are_checked_before_anything_is_read(self) -> None:
        store = self.feed_store()
        for limit in (0, -1, 1001):
            with pytest.raises(ValueError):
                store.changes(limit=limit)
        with pytest.raises(TypeError):
            store.changes(limit="10")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.changes(after=b"f1:0-0@0")  # type: ignore[arg-type]
        for cursor in ("", "0-0", "f1:x", "f1:1-1@1/x", "f1:1-1", "nonsense"):
            with pytest.raises(ValueError):
                store.changes(after=cursor)
        with pytest.raises(ValueError):
            store.changes(block=-1)

    # ------------------------------------------------------------------ waiting

    def test_block_waits_for_the_next_event(self) -> None:
        store = self.feed_store()
        cursor = self.tail(store)
        writer = threading.Timer(0.15, lambda: store.insert("late", b"x", Release()))
        writer.start()
        started = time.monotonic()
        try:
            page = store.changes(after=cursor, block=5000)
        finally:
            writer.join()
        assert seen(page.events) == [("late", "inserted", 1, None, False)]
        assert time.monotonic() - started < 4

    def test_block_gives_up_after_its_time_with_no_events(self) -> None:
        store = self.feed_store()
        store.insert("r", b"x", Release())
        cursor = self.tail(store)
        started = time.monotonic()
        page = store.changes(after=cursor, block=200)
        assert page.events == [] and time.monotonic() - started >= 0.15
        store.insert("s", b"x", Release())
        assert seen(store.changes(after=page.cursor).events) == [
            ("s", "inserted", 1, None, False)]

    # ------------------------------------------------------------------ retention

    def test_a_cursor_older_than_the_size_bound_is_compacted_with_where_to_resume(
            self) -> None:
        """(Enough entries for a backend that trims whole blocks of entries at a time: a
        Redis stream's ``MAXLEN ~``, 100 entries a block, in each partition.)"""
        store = self.make_feed_store(Feed(retention_mb=2 / 1024))  # 16 entries a partition
        store.insert("first", b"x", Release())
        first = self.everything(store).events[0]
        count = 250 * self.parts
        for n in range(count):
            store.insert(f"r{n:04}", b"x", Release())
        with pytest.raises(Compacted) as lost:
            store.changes(after=first.cursor)
        assert lost.value.after == first.cursor
        # Where to resume: the oldest events retained, with no gap from there.
        rest = [e.run for e in self.everything(store, lost.value.resume).events]
        assert 16 <= len(rest) < count and "first" not in rest and f"r{count - 1:04}" in rest
        if self.parts == 1:
            assert rest == [f"r{n:04}" for n in range(count - len(rest), count)]
        # From the start: what is retained, no error.
        assert [e.run for e in self.everything(store).events] == rest

    def test_a_cursor_older_than_the_time_bound_is_compacted(self) -> None:
        """Entries older than ``retention_ms`` go at the writes that follow. (Enough of
        them, old and new, for a backend that trims whole blocks of entries at a time, and
        only on some writes: a Redis stream's ``MINID ~``, in each partition.)"""
        store = self.make_feed_store(Feed(retention_ms=300))
        old, new = 150 * self.parts, 300 * self.parts
        for n in range(old):
            store.insert(f"old{n:04}", b"x", Release())
        first, *_ = self.everything(store).events
        caught_up = self.tail(store)
        self.advance(store, 400)
        for n in range(new):
            store.insert(f"new{n:04}", b"x", Release())
        with pytest.raises(Compacted) as lost:
            store.changes(after=first.cursor)
        rest = [e.run for e in self.everything(store, lost.value.resume).events]
        assert "old0000" not in rest and f"new{new - 1:04}" in rest
        if not self.clock_is_controlled:
            return  # the first new entries may be past the bound too by the last write
        assert sorted(rest)[-new:] == [f"new{n:04}" for n in range(new)]
        # A reader that had read every event before the trim lost nothing: no error, though
        # its own last event may be gone too.
        after_old = [e.run for e in self.everything(store, caught_up).events]
        assert sorted(after_old) == [f"new{n:04}" for n in range(new)]

    def test_a_cursor_past_the_end_of_the_feed_is_compacted(self) -> None:
        """Entries up to the cursor were lost (a failover, a feed dropped and begun again):
        the cursor names an entry past the feed's last one."""
        store = self.feed_store()
        store.insert("r", b"x", Release())
        cursor = self.tail(store)
        # The same cursor, each partition's position moved far ahead.
        ahead = "f1:" + ",".join("99999999999999-0@999999" for _ in cursor[3:].split(","))
        with pytest.raises(Compacted) as lost:
            store.changes(after=ahead)
        # Resumed from the oldest entries retained: what the reader saw may come again,
        # nothing is skipped.
        assert seen(self.everything(store, lost.value.resume).events) == [
            ("r", "inserted", 1, None, False)]

    def test_a_cursor_of_another_partition_count_is_compacted(self) -> None:
        store = self.feed_store()
        store.insert("r", b"x", Release())
        cursor = self.tail(store)
        with pytest.raises(Compacted) as lost:
            store.changes(after=cursor + ",0-0@0")
        assert seen(self.everything(store, lost.value.resume).events) == [
            ("r", "inserted", 1, None, False)]

    # ------------------------------------------------------------------ per-minute counts

    def totals(self, store: RunStore) -> tuple[int, int, int]:
        """Claims, finishes and takeovers counted over the last hour (a test that crosses a
        minute's end counts in two minutes: their sum is what it did)."""
        rates = store.rates(60)
        return (sum(r.claims for r in rates), sum(r.finishes for r in rates),
                sum(r.takeovers for r in rates))

    def test_rates_are_an_hour_of_minutes_oldest_first(self) -> None:
        store = self.feed_store()
        before = store.now() // MINUTE_MS * MINUTE_MS
        rates = store.rates()
        after = store.now() // MINUTE_MS * MINUTE_MS
        assert len(rates) == 60
        assert rates[-1].minute in (before, after)
        assert [r.minute for r in rates] == [rates[0].minute + n * MINUTE_MS
                                             for n in range(60)]
        assert all((r.claims, r.finishes, r.takeovers) == (0, 0, 0) for r in rates)
        assert [r.minute for r in store.rates(1)][-1] >= rates[-1].minute
        assert len(store.rates(minutes=7)) == 7

    def test_rates_arguments_are_checked(self) -> None:
        store = self.feed_store()
        for bad in (0, 61, -1):
            with pytest.raises(ValueError):
                store.rates(bad)
        for wrong in ("5", 5.0, True, None):
            with pytest.raises(TypeError):
                store.rates(wrong)  # type: ignore[arg-type]

    def test_claims_finishes_and_takeovers_are_counted(self) -> None:
        store = self.feed_store(discover=json_wait)
        ready = rec({"at": 0})
        for run in ("a", "b", "c"):
            store.insert(run, ready, Release())
        store.insert("lost", ready, Claim(OTHER, self.short_ttl))
        store.insert("held", ready, Claim(OTHER, LONG))
        self.expire(store)
        assert self.totals(store) == (0, 0, 0)  # inserts and writes are not counted
        claimed = store.claim(ME, LONG, 10, records=True)
        assert sorted(c.run for c in claimed) == ["a", "b", "c", "lost"]
        assert self.totals(store) == (4, 0, 1)  # the expired lease of OTHER: a takeover
        grants = {c.run: c.current for c in claimed}

        def fenced(run: str) -> Fenced:
            token = grants[run].token
            assert token is not None
            return Fenced(ME, token)

        store.finish("a", grants["a"].revision, fenced("a"), record=ready)
        store.finish("b", grants["b"].revision, fenced("b"))
        store.finish("c", grants["c"].revision, fenced("c"), failure=Failure("x", final=True))
        assert self.totals(store) == (4, 3, 1)
        # Not counted: a refused finish, a release, a restore, a write that frees, a
        # claim of nothing.
        with pytest.raises(LeaseRefused):
            store.finish("a", 2, fenced("a"))
        with pytest.raises(Conflict):
            store.finish("lost", 99, fenced("lost"))
        assert store.release(ME, ["lost"]) == ["lost"]
        assert store.restore("c")
        store.compare_and_set("held", 1, b"x", Seize(ME, LONG))
        store.compare_and_set("held", 2, b"y", Release())
        assert self.totals(store) == (4, 3, 1)

    def test_a_poison_run_set_aside_is_no_claim(self) -> None:
        store = self.feed_store()
        store.insert("poison", b"r1", Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_expired(ME, LONG, 10, max_takeovers=0) == []
        assert self.totals(store) == (0, 0, 0)
        assert store.restore("poison")
        assert store.claim_expired(ME, LONG, 10) == ["poison"]
        assert self.totals(store) == (1, 0, 1)

    def test_a_claim_of_many_runs_counts_each(self) -> None:
        store = self.feed_store(discover=json_wait)
        for n in range(30):
            store.insert(f"r{n:02}", rec({"at": 0}), Release())
        assert len(store.claim(ME, LONG, 25)) == 25
        assert len(store.claim_ready(OTHER, LONG, 25)) == 5
        assert self.totals(store) == (30, 0, 0)

    def test_counts_older_than_an_hour_are_gone(self) -> None:
        if not self.clock_is_controlled:
            pytest.skip("needs a clock the test moves")
        store = self.feed_store(discover=json_wait)
        store.insert("r", rec({"at": 0}), Release())
        assert store.claim(ME, LONG) == ["r"]
        assert self.totals(store) == (1, 0, 0)
        self.advance(store, 59 * MINUTE_MS)
        assert self.totals(store) == (1, 0, 0)
        assert store.rates(60)[0].claims == 1
        self.advance(store, MINUTE_MS)
        assert self.totals(store) == (0, 0, 0)
