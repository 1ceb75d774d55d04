"""The change feed's shared reading logic (redisstore/core/feed.py), which every store kind's
``changes`` answers through: the cursor, the gap checks, the order over partitions. The
promises themselves are the conformance rules (redisstore/conformance/feed.py); these are
the attacks on the logic below them, partitions included, without a server."""

from __future__ import annotations

import pytest

from redisstore import Compacted, Event, Feed, MemoryRunStore, Misconfigured, Release
from redisstore.core.feed import (
    ENTRY_BYTES,
    ORIGIN,
    Log,
    Position,
    answer,
    decode,
    encode,
)


def logs(count: int, feed: Feed | None = None) -> list[Log]:
    return [Log(feed or Feed()) for _ in range(count)]


def read(parts: list[Log], after: str | None, limit: int = 1000) -> tuple[list[Event], str]:
    positions = decode(after, len(parts))
    page = answer(after, [(p, log.find(p, limit)) for p, log in zip(positions, parts,
                                                                       strict=True)], limit,
                  lambda index: parts[index].oldest())
    return page.events, page.cursor


def test_the_cursor_holds_one_position_per_partition_and_round_trips() -> None:
    positions = [Position(None), Position("17-0", 4), Position("18-3", 5, 2),
                 Position(ORIGIN, 0)]
    cursor = encode(positions)
    assert cursor == "f1:,17-0@4,18-3@5/2,0-0@0"
    assert decode(cursor, 4) == positions
    assert decode(None, 3) == [Position(None)] * 3


@pytest.mark.parametrize("cursor", ["", "f1", "f2:0-0@0", "f1:1", "f1:1-x", "f1:1-1",
                                    "f1:1-1@", "f1:1-1@1/", "f1:1-1@1/-2", "f1:1-1@1/1/1",
                                    "f1: 1-1@1", "f1:0x1-1@1", "f1:1-1@-1"])
def test_a_cursor_that_is_not_one_is_a_value_error(cursor: str) -> None:
    with pytest.raises(ValueError):
        decode(cursor, 1)


def test_a_cursor_of_another_partition_count_is_compacted_from_the_start() -> None:
    with pytest.raises(Compacted) as lost:
        decode("f1:5-0@1,6-0@1", 3)
    assert lost.value.after == "f1:5-0@1,6-0@1"
    assert decode(lost.value.resume, 3) == [Position(None)] * 3


def test_partitions_interleave_by_time_each_in_its_order() -> None:
    a, b = logs(2)
    a.append(10, "x", [("a1", "inserted", 1, False)])
    b.append(11, "y", [("b1", "inserted", 1, False)])
    a.append(12, "x", [("a2", "claimed", 1, False), ("a3", "claimed", 4, True)])
    b.append(12, None, [("b2", "deleted", 3, False)])
    events, cursor = read([a, b], None)
    assert [(e.run, e.time, e.owner) for e in events] == [
        ("a1", 10, "x"), ("b1", 11, "y"), ("a2", 12, "x"), ("a3", 12, "x"),
        ("b2", 12, None)]
    assert events[3].takeover and events[3].revision == 4
    # Every event's cursor resumes right after it, in each partition.
    for n, event in enumerate(events):
        assert read([a, b], event.cursor)[0] == events[n + 1:]
    assert read([a, b], cursor)[0] == []


def test_one_entry_of_many_events_is_read_a_page_at_a_time() -> None:
    (log,) = logs(1)
    log.append(5, "me", [(f"r{n:03}", "claimed", 1, False) for n in range(100)])
    whole, _ = read([log], None)
    assert len(whole) == 100 and len(log.entries) == 1
    cursor: str | None = None
    paged: list[Event] = []
    while True:
        events, cursor = read([log], cursor, limit=7)
        if not events:
            break
        paged += events
    assert paged == whole


def test_a_cursor_across_partitions_after_one_partition_trimmed() -> None:
    """One partition's entries past the cursor were trimmed, the other's were not: Compacted,
    whose resume keeps the untouched partition's position and moves only the trimmed one to
    its oldest entry retained; nothing of either is skipped or read twice."""
    feed = Feed(retention_mb=2 * ENTRY_BYTES / 2**20)  # two entries a partition
    a, b = logs(2, feed)
    a.append(1, "x", [("a0", "inserted", 1, False)])
    b.append(1, "x", [("b0", "inserted", 1, False)])
    _, cursor = read([a, b], None)
    b.append(2, "x", [("b1", "inserted", 1, False)])  # b: within its bound
    for n in range(1, 5):
        a.append(2 + n, "x", [(f"a{n}", "inserted", 1, False)])  # a: a1, a2 trimmed
    with pytest.raises(Compacted) as lost:
        read([a, b], cursor)
    resume = decode(lost.value.resume, 2)
    assert resume[1] == decode(cursor, 2)[1]  # b's position untouched
    events, _ = read([a, b], lost.value.resume)
    assert [e.run for e in events] == ["b1", "a3", "a4"]  # a from its oldest retained


def test_a_partial_entry_trimmed_under_the_reader_is_compacted() -> None:
    (log,) = logs(1, Feed(retention_mb=ENTRY_BYTES / 2**20))  # one entry
    log.append(1, "x", [("r1", "claimed", 1, False), ("r2", "claimed", 1, False)])
    events, cursor = read([log], None, limit=1)
    assert [e.run for e in events] == ["r1"]
    log.append(2, "x", [("r3", "released", 1, False)])
    with pytest.raises(Compacted) as lost:
        read([log], cursor)
    assert [e.run for e in read([log], lost.value.resume)[0]] == ["r3"]


def test_a_feed_that_ends_before_the_cursor_lost_entries() -> None:
    """A failover to a replica that had not received the last entries: the partition counts
    fewer entries than the cursor's. Found at once, not when the next entry comes; and
    still found after new entries came, which reuse the lost numbers."""
    (log,) = logs(1)
    log.append(1, "x", [("r1", "inserted", 1, False)])
    log.append(2, "x", [("r2", "inserted", 1, False)])
    _, cursor = read([log], None)
    log.entries.pop()  # the failover: the last entry and its number are gone
    log.count, log.last = 1, log.entries[-1].id
    with pytest.raises(Compacted) as lost:
        read([log], cursor)
    assert "ends before" in lost.value.reason
    assert [e.run for e in read([log], lost.value.resume)[0]] == ["r1"]
    log.append(3, "x", [("r3", "inserted", 1, False)])  # number 2 again
    log.append(4, "x", [("r4", "inserted", 1, False)])
    with pytest.raises(Compacted):
        read([log], cursor)


def test_a_log_dropped_is_compacted_unless_the_reader_had_read_it_all() -> None:
    """The log's key is gone (set aside as damaged, dropped) while the partition's number
    stays: a reader that had read every entry loses nothing; one behind it lost the rest."""
    (log,) = logs(1)
    log.append(1, "x", [("r1", "inserted", 1, False)])
    _, behind = read([log], None)
    log.append(2, "x", [("r2", "inserted", 1, False)])
    _, caught_up = read([log], behind)
    log.entries.clear()
    assert read([log], caught_up)[0] == []
    with pytest.raises(Compacted) as lost:
        read([log], behind)
    log.append(5, "x", [("r3", "inserted", 1, False)])
    assert [e.run for e in read([log], caught_up)[0]] == ["r3"]
    assert [e.run for e in read([log], lost.value.resume)[0]] == ["r3"]


def test_entry_ids_keep_rising_when_the_clock_does_not() -> None:
    (log,) = logs(1)
    for now in (100, 100, 99, 101):
        log.append(now, None, [("r", "written", 1, False)])
    assert [e.id for e in log.entries] == ["100-0", "100-1", "100-2", "101-0"]
    assert [e.seq for e in log.entries] == [1, 2, 3, 4]


def test_feed_bounds_are_checked() -> None:
    assert Feed().max_entries == 64 * 2**20 // ENTRY_BYTES
    for bad in ({"retention_ms": 0}, {"retention_mb": 0}, {"retention_mb": 2**21}):
        with pytest.raises(ValueError):
            Feed(**bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Feed(retention_mb=True)
    with pytest.raises(TypeError):
        MemoryRunStore(feed=object())  # type: ignore[arg-type]


def test_a_memory_store_without_a_feed_says_so() -> None:
    store = MemoryRunStore(feed=None)
    store.insert("r", b"x", Release())
    with pytest.raises(Misconfigured):
        store.changes()
