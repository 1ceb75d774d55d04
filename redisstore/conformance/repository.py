"""The instance repository's conformance suite.

Time is explicit here: ``list_in_flight`` takes ``now``, so the listing filters and the
``now == expiry`` boundary are checked exactly on any backend. ``now=None`` (the backend's
clock) is checked with leases a day away from the real time. The paged listing
(``list_in_flight_page``) is an optional capability, like ``migrate``: its tests skip on a
repository without it. Needs pytest (the ``test`` extra).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import FrozenInstanceError, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ..errors import ConcurrentUpdate, StoreError, UnknownGroup
from ..repository import MAX_PAGE, InFlightPage, InstanceLease, InstanceRecord, Repository, Status

GROUP, OTHER_GROUP = "engines-a", "engines-b"
T0 = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)  # a fixed "now" for explicit listings
US = timedelta(microseconds=1)
DAY = timedelta(days=1)

# Expiries that must load back exactly: microseconds, offsets, both sides of the epoch, and
# the ends of datetime's range (beyond what a double holds exactly as microseconds).
EXPIRIES = [
    T0,
    datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    datetime(2030, 1, 1, 12, 0, 0, 999999, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2029, 7, 1, 23, 59, 59, 500000, tzinfo=timezone(timedelta(hours=-8))),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
]

# (status, lease) -> listed?  Listed iff not terminal, not suspended, and expired or absent
# at T0 (an expiry equal to now is expired). "paused-by-operator" is a status no store knows.
STATUSES = [Status.ACTIVE, Status.SUSPENDED, Status.COMPLETED, Status.TERMINATED,
            "paused-by-operator"]
LEASES = {
    "none": InstanceLease(),
    "expired": InstanceLease(T0 - timedelta(seconds=1), "node-a", 1),
    "boundary": InstanceLease(T0, "node-a", 1),
    "just-live": InstanceLease(T0 + US, "node-a", 1),
    "live": InstanceLease(T0 + DAY, "node-a", 1),
    "expiry-only": InstanceLease(T0 - US),
}
LISTED_STATUSES = {Status.ACTIVE, "paused-by-operator"}
EXPIRED_LEASES = {"none", "expired", "boundary", "expiry-only"}


class RecordingLogger:
    """A logger that keeps the warnings it is given (formatted), for the tests to read."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, msg: str, /, *args: Any) -> None:
        """Keep ``msg % args``."""
        self.warnings.append(msg % args if args else msg)


def record(id: Any, group: Any = GROUP, **fields: Any) -> InstanceRecord:
    """A record with a payload naming it; ``fields`` override the rest (typed ``Any`` so the
    bad-input tests can pass what a type checker would refuse)."""
    fields.setdefault("payload", f"payload of {id}".encode())
    return InstanceRecord(id=id, group=group, **fields)


def bad_lease(*fields: Any) -> InstanceLease:
    """An InstanceLease built from fields a type checker would refuse."""
    return InstanceLease(*fields)


class RepositoryConformance:
    """The instance repository contract as pytest tests.

    Implement :meth:`make_repository`: a fresh, isolated repository per call.
    """

    # ------------------------------------------------------------------ hooks

    def make_repository(self, *, max_terminal: int = 1024,
                        logger: Any = None) -> Repository:
        """A fresh, isolated repository (nothing in it, no other test sees it)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers

    def repo(self, **options: Any) -> Repository:
        """A fresh repository with GROUP and OTHER_GROUP registered."""
        repo = self.make_repository(**options)
        repo.register_group(GROUP)
        repo.register_group(OTHER_GROUP)
        return repo

    def stored(self, repo: Repository, id: str) -> InstanceRecord:
        loaded = repo.load(id)
        assert loaded is not None, f"{id!r} should be stored"
        return loaded

    # ------------------------------------------------------------------ CAS discipline

    def test_save_creates_at_version_one(self) -> None:
        repo = self.repo()
        assert repo.load("i1") is None
        assert repo.save(record("i1")) == 1
        loaded = self.stored(repo, "i1")
        assert loaded == record("i1", rec_version=1)

    def test_each_save_increments_the_version_by_one(self) -> None:
        repo = self.repo()
        for version in range(6):
            payload = b"v%d" % version
            assert repo.save(record("i1", payload=payload, rec_version=version)) == version + 1
            loaded = self.stored(repo, "i1")
            assert (loaded.rec_version, loaded.payload) == (version + 1, payload)

    @pytest.mark.parametrize("expected", [0, 1, 3, 100])
    def test_stale_version_is_a_concurrent_update_and_writes_nothing(self,
                                                                    expected: int) -> None:
        repo = self.repo()
        repo.save(record("i1", payload=b"one"))
        repo.save(record("i1", payload=b"two", rec_version=1))
        before = self.stored(repo, "i1")
        assert before.rec_version == 2
        stale = record("i1", payload=b"stale", rec_version=expected,
                       lease=InstanceLease(T0 + DAY, "zombie", 9), status=Status.COMPLETED)
        with pytest.raises(ConcurrentUpdate) as caught:
            repo.save(stale)
        assert isinstance(caught.value, StoreError)
        assert self.stored(repo, "i1") == before
        assert repo.list_in_flight(GROUP, T0) == ["i1"]

    def test_nonzero_version_on_an_absent_record_is_a_concurrent_update(self) -> None:
        repo = self.repo()
        with pytest.raises(ConcurrentUpdate):
            repo.save(record("i1", rec_version=1))
        assert repo.load("i1") is None
        assert repo.list_in_flight(GROUP, T0) == []

    def test_the_zombie_engine_is_fenced(self) -> None:
        # Engine A holds the instance; B reclaims it (CAS, incarnation + 1); A's late save
        # carries the version it loaded and must lose, leaving B's state intact.
        repo = self.repo()
        repo.save(record("i1", lease=InstanceLease(T0, "A", 1)))
        seen_by_a = self.stored(repo, "i1")
        claimed = replace(seen_by_a, payload=b"B's state",
                          lease=InstanceLease(T0 + DAY, "B", 2))
        assert repo.save(claimed) == 2
        with pytest.raises(ConcurrentUpdate):
            repo.save(replace(seen_by_a, payload=b"A's late state"))
        loaded = self.stored(repo, "i1")
        assert (loaded.payload, loaded.lease, loaded.rec_version) == (
            b"B's state", InstanceLease(T0 + DAY, "B", 2), 2)

    def test_concurrent_saves_of_one_version_have_one_winner(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        results: list[str] = []

        def attempt(n: int) -> None:
            try:
                repo.save(record("i1", payload=b"writer %d" % n, rec_version=1))
                results.append(f"won {n}")
            except ConcurrentUpdate:
                results.append("lost")

        threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [r for r in results if r.startswith("won")]
        assert len(results) == 8 and len(winners) == 1
        loaded = self.stored(repo, "i1")
        assert loaded.rec_version == 2
        assert loaded.payload == b"writer " + winners[0].split()[1].encode()

    # ------------------------------------------------------------------ registry and groups

    def test_register_group_is_idempotent(self) -> None:
        repo = self.make_repository()
        assert repo.group_exists(GROUP) is False
        repo.register_group(GROUP)
        repo.register_group(GROUP)
        assert repo.group_exists(GROUP) is True
        assert repo.group_exists(OTHER_GROUP) is False

    def test_group_names_are_any_text(self) -> None:
        repo = self.make_repository()
        for group in ["a:b", "{tag}", "ünï cödé", " spaced ", "g" * 300]:
            assert repo.group_exists(group) is False
            repo.register_group(group)
            assert repo.group_exists(group) is True
            repo.save(record(f"in {group}", group=group))
            assert repo.list_in_flight(group, T0) == [f"in {group}"]

    def test_save_with_an_unregistered_group_writes_nothing(self) -> None:
        repo = self.repo()
        with pytest.raises(UnknownGroup):
            repo.save(record("i1", group="never-registered"))
        assert isinstance(UnknownGroup("g"), StoreError)
        assert repo.load("i1") is None
        assert repo.group_exists("never-registered") is False
        assert repo.list_in_flight("never-registered", T0) == []

    def test_unregistered_group_lists_empty(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        assert repo.list_in_flight("never-registered", T0) == []
        assert repo.list_in_flight("never-registered") == []

    def test_listing_is_scoped_to_the_group(self) -> None:
        repo = self.repo()
        repo.save(record("a1"))
        repo.save(record("a2"))
        repo.save(record("b1", group=OTHER_GROUP))
        assert sorted(repo.list_in_flight(GROUP, T0)) == ["a1", "a2"]
        assert repo.list_in_flight(OTHER_GROUP, T0) == ["b1"]

    def test_a_record_saved_into_another_group_moves(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        repo.save(record("i1", group=OTHER_GROUP, rec_version=1))
        assert repo.list_in_flight(GROUP, T0) == []
        assert repo.list_in_flight(OTHER_GROUP, T0) == ["i1"]
        assert self.stored(repo, "i1").group == OTHER_GROUP

    # ------------------------------------------------------------------ round trips

    @pytest.mark.parametrize("expiry", EXPIRIES, ids=lambda e: e.isoformat())
    def test_lease_round_trips_to_the_microsecond(self, expiry: datetime) -> None:
        repo = self.repo()
        lease = InstanceLease(expiry, "node-ω", 42)
        repo.save(record("i1", lease=lease))
        loaded = self.stored(repo, "i1").lease
        assert loaded == lease
        assert loaded.expiry is not None
        assert loaded.expiry.utcoffset() == expiry.utcoffset()
        assert (loaded.expiry.year, loaded.expiry.hour, loaded.expiry.microsecond) == (
            expiry.year, expiry.hour, expiry.microsecond)

    @pytest.mark.parametrize("lease", [
        InstanceLease(),
        InstanceLease(None, "owner-without-expiry", 3),
        InstanceLease(T0, "", 0),
        InstanceLease(T0, "n", 2**63 - 1),
        InstanceLease(T0, "n", -(2**63)),
    ], ids=["zero", "no-expiry", "no-owner", "max-incarnation", "min-incarnation"])
    def test_lease_fields_round_trip(self, lease: InstanceLease) -> None:
        repo = self.repo()
        repo.save(record("i1", lease=lease))
        assert self.stored(repo, "i1").lease == lease

    @pytest.mark.parametrize("tenant", ["", "tenant-42", "ünï cödé", "a:b {c}"])
    def test_tenant_round_trips(self, tenant: str) -> None:
        repo = self.repo()
        repo.save(record("i1", tenant=tenant))
        assert self.stored(repo, "i1").tenant == tenant

    @pytest.mark.parametrize("status", [*STATUSES, "x"])
    def test_status_round_trips(self, status: str) -> None:
        repo = self.repo()
        repo.save(record("i1", status=status))
        loaded = self.stored(repo, "i1")
        assert loaded.status == status
        assert str(loaded.status) == status

    @pytest.mark.parametrize("payload", [
        b"", b"\x00", b"a\x00b\x00", bytes(range(256)), b"\xff" * 3, "é✓".encode(),
        bytes(range(256)) * 4096,
    ], ids=["empty", "nul", "nuls", "all-bytes", "ff", "utf8", "1MiB"])
    def test_payloads_are_binary_safe(self, payload: bytes) -> None:
        repo = self.repo()
        repo.save(record("i1", payload=payload))
        loaded = self.stored(repo, "i1")
        assert type(loaded.payload) is bytes and loaded.payload == payload

    def test_ids_are_any_text(self) -> None:
        repo = self.repo()
        ids = ["a:b:c", "{braces}", "ünï cödé", " spaced ", "r" * 300]
        for id in ids:
            repo.save(record(id))
            assert self.stored(repo, id).payload == f"payload of {id}".encode()
        assert sorted(repo.list_in_flight(GROUP, T0)) == sorted(ids)

    def test_whole_record_round_trips(self) -> None:
        repo = self.repo()
        rec = InstanceRecord(id="i1", payload=b"\x00doc", group=GROUP, tenant="t",
                             lease=InstanceLease(EXPIRIES[2], "node-b", 7), rec_version=0,
                             status=Status.SUSPENDED)
        repo.save(rec)
        assert self.stored(repo, "i1") == replace(rec, rec_version=1)

    # ------------------------------------------------------------------ copies

    def test_a_mutable_payload_passed_in_is_copied(self) -> None:
        repo = self.repo()
        buffer = bytearray(b"original")
        repo.save(record("i1", payload=buffer))
        buffer[:] = b"mutated!"
        assert self.stored(repo, "i1").payload == b"original"
        view_source = bytearray(b"viewed")
        repo.save(record("i2", payload=memoryview(view_source)))
        view_source[:] = b"VIEWED"
        assert self.stored(repo, "i2").payload == b"viewed"

    def test_what_load_returns_cannot_change_what_is_stored(self) -> None:
        repo = self.repo()
        repo.save(record("i1", payload=b"stored"))
        loaded = self.stored(repo, "i1")
        assert isinstance(loaded.payload, bytes)  # immutable
        with pytest.raises(FrozenInstanceError):
            loaded.payload = b"changed"  # type: ignore[misc]
        changed = replace(loaded, payload=b"changed locally")
        assert changed.payload != loaded.payload
        assert self.stored(repo, "i1").payload == b"stored"
        assert self.stored(repo, "i1") == loaded

    # ------------------------------------------------------------------ listing

    @pytest.mark.parametrize("lease", sorted(LEASES))
    @pytest.mark.parametrize("status", STATUSES)
    def test_listing_filters(self, status: str, lease: str) -> None:
        repo = self.repo()
        repo.save(record("i1", status=status, lease=LEASES[lease]))
        listed = status in LISTED_STATUSES and lease in EXPIRED_LEASES
        assert repo.list_in_flight(GROUP, T0) == (["i1"] if listed else [])

    def test_an_expiry_equal_to_now_is_expired(self) -> None:
        repo = self.repo()
        for i, expiry in enumerate(EXPIRIES):
            repo.save(record(f"i{i}", lease=InstanceLease(expiry, "n", 1)))
        for i, expiry in enumerate(EXPIRIES):
            assert f"i{i}" in repo.list_in_flight(GROUP, expiry)
            assert f"i{i}" not in repo.list_in_flight(GROUP, expiry - US)
        assert InstanceLease(T0).expired(T0)
        assert not InstanceLease(T0).expired(T0 - US)

    def test_now_in_any_offset_is_the_same_instant(self) -> None:
        repo = self.repo()
        repo.save(record("i1", lease=InstanceLease(T0, "n", 1)))
        east = timezone(timedelta(hours=9))
        assert repo.list_in_flight(GROUP, T0.astimezone(east)) == ["i1"]
        assert repo.list_in_flight(GROUP, (T0 - US).astimezone(east)) == []

    def test_now_none_is_the_backend_clock(self) -> None:
        repo = self.repo()
        real = datetime.now(UTC)
        repo.save(record("past", lease=InstanceLease(real - DAY, "n", 1)))
        repo.save(record("future", lease=InstanceLease(real + DAY, "n", 1)))
        repo.save(record("unowned"))
        assert sorted(repo.list_in_flight(GROUP)) == ["past", "unowned"]
        assert sorted(repo.list_in_flight(GROUP, None)) == ["past", "unowned"]

    def test_listing_follows_each_save(self) -> None:
        repo = self.repo()
        steps: list[tuple[str, InstanceLease, bool]] = [
            (Status.ACTIVE, InstanceLease(T0 + DAY, "a", 1), False),
            (Status.ACTIVE, InstanceLease(T0 - DAY, "a", 1), True),
            (Status.SUSPENDED, InstanceLease(), False),
            (Status.ACTIVE, InstanceLease(), True),
            ("waiting-for-godot", InstanceLease(T0, "b", 2), True),
            (Status.ACTIVE, InstanceLease(T0 + US, "b", 2), False),
            (Status.COMPLETED, InstanceLease(), False),
            (Status.ACTIVE, InstanceLease(), True),
            (Status.TERMINATED, InstanceLease(), False),
        ]
        for version, (status, lease, listed) in enumerate(steps):
            repo.save(record("i1", status=status, lease=lease, rec_version=version))
            assert repo.list_in_flight(GROUP, T0) == (["i1"] if listed else []), (status, lease)

    def test_listing_returns_each_claimable_id_once(self) -> None:
        repo = self.repo()
        expected = set()
        for i in range(60):
            lease = InstanceLease(T0 + timedelta(seconds=i - 30), "n", 1)
            repo.save(record(f"i{i:02}", lease=lease, status=STATUSES[i % 5]))
            if STATUSES[i % 5] in LISTED_STATUSES and i <= 30:
                expected.add(f"i{i:02}")
        listed = repo.list_in_flight(GROUP, T0)
        assert len(listed) == len(set(listed))
        assert set(listed) == expected

    # ------------------------------------------------------------------ paged listing

    def pages(self, repo: Repository, group: str, now: datetime | None = T0, *,
              limit: int = MAX_PAGE, cursor: str | None = None) -> list[InFlightPage]:
        """Every page of a paged listing from ``cursor``, in order (skips the test for a
        repository without ``list_in_flight_page``, an optional capability)."""
        page_of = getattr(repo, "list_in_flight_page", None)
        if page_of is None:
            pytest.skip("this repository does not page list_in_flight")
        out: list[InFlightPage] = []
        while True:
            page = page_of(group, now, cursor=cursor, limit=limit)
            assert isinstance(page, InFlightPage)
            assert len(page.ids) <= limit
            out.append(page)
            if page.cursor is None:
                return out
            assert isinstance(page.cursor, str) and page.cursor
            assert len(out) < 10_000, "the listing never ends"
            cursor = page.cursor

    def crowd(self, repo: Repository) -> list[str]:
        """Records of every listing kind (ties without a lease, expiries on both sides of
        now, statuses that are not listed); returns the ids listed at T0."""
        listed = []
        for i in range(40):
            lease = (InstanceLease() if i % 3 == 0
                     else InstanceLease(T0 + timedelta(seconds=(i % 7) - 4), "n", 1))
            status = STATUSES[i % 5]
            repo.save(record(f"i{i:02}", lease=lease, status=status))
            if status in LISTED_STATUSES and (lease.expiry is None or lease.expiry <= T0):
                listed.append(f"i{i:02}")
        return listed

    @pytest.mark.parametrize("limit", [1, 2, 7, MAX_PAGE])
    def test_pages_make_up_the_listing(self, limit: int) -> None:
        repo = self.repo()
        listed = self.crowd(repo)
        pages = self.pages(repo, GROUP, limit=limit)
        flat = [id for page in pages for id in page.ids]
        assert flat == repo.list_in_flight(GROUP, T0)
        assert sorted(flat) == sorted(listed)
        assert all(page.cursor for page in pages[:-1])

    def test_a_page_of_an_unregistered_or_empty_group_is_complete(self) -> None:
        repo = self.repo()
        for group in ("never-registered", GROUP):
            assert self.pages(repo, group) == [InFlightPage((), None)]

    def test_pages_go_on_past_records_that_change_between_them(self) -> None:
        # Recovery lists a page, claims what it listed (each record moves to a live lease,
        # so out of the listing), deletes one, and asks for the next page: every record
        # that stayed claimable is listed, once.
        repo = self.repo()
        ids = [f"i{i:02}" for i in range(15)]
        for i, id in enumerate(ids):
            lease = InstanceLease() if i < 10 else InstanceLease(T0 - DAY, "n", 1)
            repo.save(record(id, lease=lease))
        first = self.pages(repo, GROUP, limit=4)[0]
        assert len(first.ids) == 4 and first.cursor is not None
        for id in first.ids[:-1]:
            repo.save(record(id, lease=InstanceLease(T0 + DAY, "me", 1), rec_version=1))
        repo.delete(first.ids[-1])  # the record the cursor stands on is gone
        rest = [id for page in self.pages(repo, GROUP, limit=4, cursor=first.cursor)
                for id in page.ids]
        assert sorted(rest) == sorted(set(ids) - set(first.ids))
        assert len(rest) == len(set(rest))

    def test_pages_keep_the_first_pages_now(self) -> None:
        # now=None: the backend clock at the first page; the cursor carries it, so a
        # record whose lease runs out while the listing goes on does not join it halfway.
        # (One family: a repository of partitions keeps a listing's order within one.)
        repo = self.repo()
        real = datetime.now(UTC)
        for i in range(4):
            repo.save(record(f"{{f}}a{i}", lease=InstanceLease(real - DAY, "n", 1)))
        repo.save(record("{f}soon", lease=InstanceLease(real + timedelta(milliseconds=300),
                                                        "n", 1)))
        first = self.pages(repo, GROUP, None, limit=2)[0]
        assert first.ids == ("{f}a0", "{f}a1")
        time.sleep(0.4)  # "soon" has expired by the backend's clock (the same host's)
        assert "{f}soon" in repo.list_in_flight(GROUP)
        rest = [id for page in self.pages(repo, GROUP, None, limit=2, cursor=first.cursor)
                for id in page.ids]
        assert rest == ["{f}a2", "{f}a3"]

    @pytest.mark.parametrize(("limit", "cursor"), [
        (0, None), (MAX_PAGE + 1, None), (-1, None), (True, None), ("3", None), (2.0, None),
        (5, ""), (5, "no cursor"), (5, 42), (5, "1|2"), (5, "x|-inf|i1"),
    ])
    def test_bad_page_arguments_raise(self, limit: Any, cursor: Any) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        page_of = getattr(repo, "list_in_flight_page", None)
        if page_of is None:
            pytest.skip("this repository does not page list_in_flight")
        with pytest.raises((ValueError, TypeError)):
            page_of(GROUP, T0, cursor=cursor, limit=limit)

    # ------------------------------------------------------------------ delete

    def test_delete_removes_the_record_and_its_listing(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        repo.save(record("i2"))
        repo.delete("i1")
        assert repo.load("i1") is None
        assert repo.list_in_flight(GROUP, T0) == ["i2"]
        assert self.stored(repo, "i2").rec_version == 1

    def test_delete_of_an_absent_record_is_a_no_op(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        repo.delete("absent")
        repo.delete("absent")
        assert repo.load("absent") is None
        assert self.stored(repo, "i1").rec_version == 1

    def test_a_fenced_delete_removes_only_the_version_it_names(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        repo.save(record("i1", rec_version=1))  # version 2 now
        with pytest.raises(ConcurrentUpdate) as stale:
            repo.delete("i1", expected_version=1)  # a zombie that read version 1
        assert (stale.value.expected, stale.value.stored) == (1, 2)
        assert self.stored(repo, "i1").rec_version == 2
        repo.delete("i1", expected_version=2)
        assert repo.load("i1") is None
        repo.delete("i1", expected_version=2)  # absent: a no-op, as unfenced
        with pytest.raises((ValueError, TypeError)):
            repo.delete("i1", expected_version=0)
        with pytest.raises((ValueError, TypeError)):
            repo.delete("i1", expected_version=True)

    def test_a_deleted_record_starts_again_at_version_zero(self) -> None:
        repo = self.repo()
        repo.save(record("i1"))
        repo.save(record("i1", rec_version=1))
        repo.delete("i1")
        with pytest.raises(ConcurrentUpdate):
            repo.save(record("i1", rec_version=2))
        assert repo.save(record("i1", payload=b"again")) == 1
        assert self.stored(repo, "i1").payload == b"again"

    # ------------------------------------------------------------------ terminal cap
    # The records are of one family ({c}): a repository of partitions holds the cap in each
    # partition, and a family is in one.

    def test_terminal_records_are_capped_oldest_first_with_a_warning(self) -> None:
        logger = RecordingLogger()
        repo = self.repo(max_terminal=3, logger=logger)
        for i in range(5):
            repo.save(record(f"{{c}}t{i}",
                             status=Status.COMPLETED if i % 2 else Status.TERMINATED))
        assert [repo.load(f"{{c}}t{i}") is not None for i in range(5)] == [False, False, True,
                                                                         True, True]
        assert len(logger.warnings) == 2
        assert "'{c}t0'" in logger.warnings[0] and "'{c}t1'" in logger.warnings[1]

    def test_no_warning_within_the_cap(self) -> None:
        logger = RecordingLogger()
        repo = self.repo(max_terminal=3, logger=logger)
        for i in range(3):
            repo.save(record(f"{{c}}t{i}", status=Status.COMPLETED))
        for i in range(20):
            repo.save(record(f"a{i}"))
        assert logger.warnings == []
        assert all(repo.load(f"{{c}}t{i}") is not None for i in range(3))

    def test_active_records_are_never_evicted(self) -> None:
        logger = RecordingLogger()
        repo = self.repo(max_terminal=2, logger=logger)
        statuses = [Status.ACTIVE, Status.SUSPENDED, "custom"]
        for i in range(30):
            repo.save(record(f"a{i}", status=statuses[i % 3]))
        for i in range(6):
            repo.save(record(f"{{c}}t{i}", status=Status.TERMINATED))
        assert all(repo.load(f"a{i}") is not None for i in range(30))
        assert [repo.load(f"{{c}}t{i}") is not None
                for i in range(6)] == [False] * 4 + [True] * 2
        assert len(logger.warnings) == 4

    def test_the_cap_orders_by_when_records_became_terminal(self) -> None:
        logger = RecordingLogger()
        repo = self.repo(max_terminal=2, logger=logger)
        repo.save(record("{c}created-first"))
        repo.save(record("{c}done-first", status=Status.COMPLETED))
        repo.save(record("{c}created-first", status=Status.COMPLETED, rec_version=1))
        # A later terminal save (completed -> terminated) keeps the record's place.
        repo.save(record("{c}done-first", status=Status.TERMINATED, rec_version=1))
        repo.save(record("{c}done-last", status=Status.COMPLETED))
        assert repo.load("{c}done-first") is None
        assert repo.load("{c}created-first") is not None
        assert repo.load("{c}done-last") is not None
        assert len(logger.warnings) == 1 and "'{c}done-first'" in logger.warnings[0]

    def test_deleted_or_reactivated_records_leave_the_cap(self) -> None:
        logger = RecordingLogger()
        repo = self.repo(max_terminal=2, logger=logger)
        repo.save(record("{c}t1", status=Status.COMPLETED))
        repo.save(record("{c}t2", status=Status.COMPLETED))
        repo.delete("{c}t1")
        repo.save(record("{c}t2", status=Status.ACTIVE, rec_version=1))
        repo.save(record("{c}t3", status=Status.COMPLETED))
        repo.save(record("{c}t4", status=Status.COMPLETED))
        assert logger.warnings == []
        assert [repo.load(i) is not None
                for i in ("{c}t2", "{c}t3", "{c}t4")] == [True, True, True]

    def test_default_cap_is_1024(self) -> None:
        logger = RecordingLogger()
        repo = self.repo(logger=logger)
        for i in range(1025):
            repo.save(record(f"{{c}}t{i}", status=Status.COMPLETED, payload=b""))
        assert repo.load("{c}t0") is None
        assert repo.load("{c}t1") is not None and repo.load("{c}t1024") is not None
        assert len(logger.warnings) == 1

    # ------------------------------------------------------------------ bad input

    @pytest.mark.parametrize("call", [
        lambda r: r.save(None),
        lambda r: r.save("i1"),
        lambda r: r.save(record("")),
        lambda r: r.save(record(None)),
        lambda r: r.save(record("i1", payload="text")),
        lambda r: r.save(record("i1", payload=None)),
        lambda r: r.save(record("i1", group="")),
        lambda r: r.save(record("i1", group=None)),
        lambda r: r.save(record("i1", tenant=None)),
        lambda r: r.save(record("i1", lease=None)),
        lambda r: r.save(record("i1", lease=(T0, "n", 1))),
        lambda r: r.save(record("i1", lease=InstanceLease(datetime(2031, 1, 1), "n", 1))),
        lambda r: r.save(record("i1", lease=bad_lease("2031-01-01", "n", 1))),
        lambda r: r.save(record("i1", lease=bad_lease(T0, None, 1))),
        lambda r: r.save(record("i1", lease=bad_lease(T0, "n", "1"))),
        lambda r: r.save(record("i1", lease=bad_lease(T0, "n", True))),
        lambda r: r.save(record("i1", lease=bad_lease(T0, "n", 1.0))),
        lambda r: r.save(record("i1", lease=InstanceLease(T0, "n", 2**63))),
        lambda r: r.save(record("i1", rec_version=-1)),
        lambda r: r.save(record("i1", rec_version="0")),
        lambda r: r.save(record("i1", rec_version=False)),
        lambda r: r.save(record("i1", status="")),
        lambda r: r.save(record("i1", status=None)),
        lambda r: r.load(""),
        lambda r: r.load(None),
        lambda r: r.delete(""),
        lambda r: r.delete(None),
        lambda r: r.list_in_flight(""),
        lambda r: r.list_in_flight(None),
        lambda r: r.list_in_flight(GROUP, datetime(2031, 1, 1)),
        lambda r: r.list_in_flight(GROUP, "2031-01-01T00:00:00Z"),
        lambda r: r.list_in_flight(GROUP, 1_900_000_000),
        lambda r: r.register_group(""),
        lambda r: r.register_group(None),
        lambda r: r.group_exists(""),
        lambda r: r.group_exists(None),
    ])
    def test_bad_arguments_raise_and_write_nothing(self, call: Callable[[Any], Any]) -> None:
        repo = self.repo()
        repo.save(record("keep", lease=InstanceLease(T0 - DAY, "n", 1)))
        before = self.stored(repo, "keep")
        with pytest.raises((ValueError, TypeError)):
            call(repo)
        assert repo.load("i1") is None
        assert self.stored(repo, "keep") == before
        assert repo.list_in_flight(GROUP, T0) == ["keep"]

    def test_naive_datetimes_are_refused_with_value_error(self) -> None:
        repo = self.repo()
        naive = datetime(2031, 1, 1)
        with pytest.raises(ValueError, match="aware"):
            repo.save(record("i1", lease=InstanceLease(naive, "n", 1)))
        with pytest.raises(ValueError, match="aware"):
            repo.list_in_flight(GROUP, naive)
        with pytest.raises(ValueError):
            InstanceLease(T0).expired(naive)
        assert repo.load("i1") is None

    def test_empty_group_is_a_value_error(self) -> None:
        repo = self.repo()
        with pytest.raises(ValueError):
            repo.save(record("i1", group=""))
        with pytest.raises(ValueError):
            repo.list_in_flight("")
        with pytest.raises(ValueError):
            repo.register_group("")
        assert repo.load("i1") is None

    @pytest.mark.parametrize("max_terminal", [-1, "3", 2.0, None])
    def test_bad_max_terminal_is_refused(self, max_terminal: Any) -> None:
        with pytest.raises((ValueError, TypeError)):
            self.make_repository(max_terminal=max_terminal)

    # ------------------------------------------------------------------ values

    def test_status_vocabulary(self) -> None:
        assert (Status.ACTIVE, Status.SUSPENDED, Status.COMPLETED, Status.TERMINATED) == (
            "active", "suspended", "completed", "terminated")
        assert Status.COMPLETED.is_terminal() and Status.TERMINATED.is_terminal()
        assert not Status.ACTIVE.is_terminal() and not Status.SUSPENDED.is_terminal()
        assert not Status("paused-by-operator").is_terminal()
        assert InstanceRecord("i", b"", GROUP).status == Status.ACTIVE

    def test_record_defaults(self) -> None:
        rec = InstanceRecord("i", b"p", GROUP)
        assert (rec.tenant, rec.lease, rec.rec_version, rec.status) == (
            "", InstanceLease(), 0, "active")
        assert InstanceLease() == InstanceLease(None, "", 0)
        assert InstanceLease().expired(T0)
        assert hash(rec) == hash(InstanceRecord("i", b"p", GROUP))

    # ------------------------------------------------------------------ capabilities

    def test_migrate_is_idempotent_and_keeps_data(self) -> None:
        repo = self.repo()
        migrate = getattr(repo, "migrate", None)
        if migrate is None:
            pytest.skip("this repository has no migrate()")
        repo.save(record("i1"))
        migrate()
        migrate()
        assert self.stored(repo, "i1") == record("i1", rec_version=1)
        assert repo.group_exists(GROUP)
        assert repo.list_in_flight(GROUP, T0) == ["i1"]

    def test_cluster_compatibility_gives_a_reason(self) -> None:
        repo = self.make_repository()
        compatibility = getattr(repo, "cluster_compatibility", None)
        if compatibility is None:
            pytest.skip("this repository does not declare its cluster compatibility")
        ok, reason = compatibility()
        assert isinstance(ok, bool)
        assert isinstance(reason, str) and reason
