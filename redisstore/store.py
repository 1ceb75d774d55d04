"""``RedisRunStore`` and ``RedisRepository``: the run backend and the instance repository on
Redis, Valkey or fakeredis (sync)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal, TypeVar, overload

from . import wakeups
from .partitioned_repository import PartitionedRepositoryOps, repository_ops
from .partitions import PartitionedOps, run_ops
from .pipeline import Pipelined
from .protocol import Durability, Operation, Shell, Spread, check_io
from .repository import MAX_PAGE, InFlightPage, InstanceRecord, Logger, RepositoryOps
from .runops import RunOps
from .runs import (
    MAX_RECORD,
    MIGRATE_COUNT,
    Claimed,
    Current,
    Discover,
    Lease,
    Migrated,
    Quarantined,
)
from .transport import Transport, node_wakers
from .wakeups import Wakeups, check_block

T = TypeVar("T")
S = TypeVar("S", bound="_Closes")


class _Closes:
    """``close()`` and ``with``: the store's own connections are given back to the server."""

    _io: Transport

    def close(self) -> None:
        """Disconnect the store's own connections to the server: the idle ones now, the
        busy ones as their calls end. They are shared by every store on the same client,
        and any of them connects again on its next call, so closing is always safe. The
        client is yours: close it too when you are done with it."""
        self._io.close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pipeline(Pipelined):
    """Calls of one :class:`RedisRunStore` sent together in one round trip, at the end of
    its ``with`` block (or by :meth:`send`): see :meth:`RedisRunStore.pipeline`."""

    def __init__(self, io: Transport, ops: RunOps | PartitionedOps) -> None:
        super().__init__(ops, io.durability)
        self._io = io

    def send(self) -> None:
        """Send the queued calls; each :class:`Pending` then holds its answer (one round
        trip per node their partitions are on)."""
        groups = self._groups(self._io.node_of)
        try:
            for group in groups:
                self._io.run(group)
        except BaseException as exc:  # cancelled, interrupted: every call gets an answer
            for group in groups:
                group.interrupted(type(exc).__name__)
            raise

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            self._abandon()
        elif not self._sent:
            self.send()


class RedisRunStore(_Closes, Shell[RunOps | PartitionedOps]):
    """The leased run backend on a ``redis.Redis``-compatible client.

    Every method is one server-side Lua script, one round trip (``refresh`` reads, then
    writes). Leases and readiness are judged by the server's clock. ``namespace`` isolates
    stores that share a server; all of its keys share the hash tag ``{namespace}``.
    ``discover`` derives each record's wait for :meth:`claim_ready`; ``projection_version``
    marks metadata derived by an older ``discover`` as stale.

    Failures that are not an answer of the contract raise ``Unavailable``; a write whose
    reply was lost is never re-sent (see :func:`redisstore.confirm_write`). With
    ``durability``, each write is confirmed by ``WAIT`` / ``WAITAOF`` before it counts.

    ``partitions=N`` (1 to 256) spreads one logical store over N hash tags, hence over a
    cluster's primaries: a run is in the partition of its id's ``{family}`` part (else of
    its id); calls of one run stay one round trip, ``renew`` / ``release`` go one round
    trip per node, claims two (every partition's head, then each one's share). The count
    is recorded in the namespace; a store opened with another is refused
    (``Misconfigured``). A ``Changed`` dependency in another partition costs its waiter's
    write a round trip more, and claims deliver its writes. See docs/scale-out.md.
    """

    def __init__(self, client: Any, *, namespace: str = "redisstore",
                 discover: Discover | None = None, projection_version: int = 1,
                 durability: Durability | None = None, timeout: int = 5000,
                 max_record_bytes: int = MAX_RECORD, partitions: int = 1) -> None:
        durability, timeout = check_io(durability, timeout)
        self._ops = run_ops(namespace, discover, projection_version, durability=durability,
                            max_record_bytes=max_record_bytes, partitions=partitions)
        self._io = Transport(client, durability, timeout)
        self._ops.checks = self._io.checks
        self._wake: Wakeups | None = None
        self._wake_lock = threading.Lock()

    def close(self) -> None:
        """Stop the store's waker (if a claim ever blocked) and disconnect its connections
        (see :meth:`RedisRepository.close`); the store stays usable."""
        with self._wake_lock:
            wake, self._wake = self._wake, None
        if wake is not None:
            wake.stop()
        super().close()

    def _wakeups(self) -> Wakeups:
        """The store's blocked claims, made with the first (see :mod:`redisstore.wakeups`):
        the wakers' connections are their own (on a cluster, the client's node connections,
        which they must not close)."""
        with self._wake_lock:
            if self._wake is None:
                io = Transport(self._io.client, None, wakeups.waker_timeout(self._io.timeout),
                               dedicated=True)
                (first, *also) = self._ops.wake_sources(io.cluster)
                sweeps = self._ops.sweeps(io.cluster)
                self._wake = Wakeups(
                    io.drive, *first, (lambda: None) if io.cluster else io.close,
                    pop_seconds=wakeups.pop_cap(self._io.client), also=also,
                    sharded=None if sweeps is None else (
                        sweeps, node_wakers(io, self._io.timeout)))
            return self._wake

    def now(self) -> int:
        """The backend clock (Redis ``TIME``), UTC Unix milliseconds."""
        return self._io.drive(self._ops.counting(self._ops.now()))

    #: Whether a keeper closes this store when it ends (not a cluster's twin, whose node
    #: connections are every store's on its client).
    _keeper_closes = True

    def _dedicated(self, timeout: int) -> RedisRunStore:
        """This store on connections of its own (a Keeper's), with a deadline of at most
        ``timeout`` ms; close it when done. On a cluster client, with the client's node
        connections (closing them would disconnect every other store): the keeper does not
        close it, and its deadline is capped all the same (a hung node costs a renewal
        ``timeout`` at most)."""
        twin = copy.copy(self)
        io = self._io
        twin._io = Transport(io.client, io.durability, min(timeout, io.timeout),
                             dedicated=not io.cluster)
        twin._wake, twin._wake_lock = None, threading.Lock()
        twin._keeper_closes = not io.cluster
        return twin

    def _place(self, run: str) -> int:
        """The partition of ``run`` (0 in a store of one partition): a keeper leaves a failed
        partition's runs out of the rest of its round."""
        return self._ops.place(run) if isinstance(self._ops, PartitionedOps) else 0

    def pipeline(self) -> Pipeline:
        """Queue calls and send them in one round trip::

            with store.pipeline() as pipe:
                done = pipe.compare_and_set(run, revision, record, Release())
                nxt = pipe.claim_ready("node-a", 30_000, 1, records=True)
            done.result()          # None, or raises this call's own error
            claimed = nxt.result()

        Each queued method takes the arguments of the store method of its name and returns
        a :class:`~redisstore.pipeline.Pending`. The calls run in the order queued, each
        on its own (not a transaction: other clients' calls may run between them, and one
        call's error does not stop the next); each write is sent exactly once. A block that
        raises sends nothing. docs/runs.md has the rules.
        """
        return Pipeline(self._io, self._ops)

    def get(self, run: str) -> Current:
        """The run's latest record, revision and holder; raises ``NotFound``."""
        return self._io.drive(self._ops.counting(self._ops.get(run)))

    def insert(self, run: str, record: bytes, lease: Lease) -> int:
        """Create ``run`` and return its revision: 1, or in a namespace where runs were
        deleted, one above the highest revision a deleted run had (so an id inserted again
        never reuses a revision). Raises ``AlreadyExists`` if it exists."""
        return self._write(self._ops.insert(run, record, lease))

    def compare_and_set(self, run: str, expected: int, record: bytes, lease: Lease) -> None:
        """Write revision ``expected + 1`` if ``expected`` is current and the lease allows.

        Raises ``NotFound``, ``Conflict(current)`` or ``LeaseRefused(holder)``; nothing is
        written then.
        """
        self._write(self._ops.compare_and_set(run, expected, record, lease))

    def renew(self, owner: str, runs: Iterable[str], ttl: int) -> list[str]:
        """Extend each lease ``owner`` holds live among ``runs`` to ``ttl`` ms from now."""
        return self._write(self._ops.renew(owner, runs, ttl))

    def release(self, owner: str, runs: Iterable[str]) -> list[str]:
        """Free each lease ``owner`` holds, live or expired, among ``runs``, without a new
        revision; returns those runs. A run with a wait becomes claimable as its wait says
        (at once when due); a poison run leaves the quarantine."""
        return self._write(self._ops.release(owner, runs))

    def delete(self, run: str, expected: int, lease: Lease) -> None:
        """Remove ``run`` if ``expected`` is current and the lease allows (the checks of
        :meth:`compare_and_set`): its record, lease and index entries go, and runs waiting
        for it to change read it as revision 0. An insert of the id starts above its last
        revision, so a stale ``expected`` never matches again.

        Raises ``NotFound``, ``Conflict(current)`` or ``LeaseRefused(holder)``; nothing is
        written then. Needs layout 3 (:meth:`migrate`), else ``Misconfigured``.
        """
        self._write(self._ops.delete(run, expected, lease))

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int, *,
                      records: Literal[False] = False, max_takeovers: int | None = None,
                      block: int | None = None) -> list[str]: ...

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int, *,
                      records: Literal[True], max_takeovers: int | None = None,
                      block: int | None = None) -> list[Claimed]: ...

    def claim_expired(self, owner: str, ttl: int, limit: int, *, records: bool = False,
                      max_takeovers: int | None = None,
                      block: int | None = None) -> list[str] | list[Claimed]:
        """Claim up to ``limit`` held, expired leases, the longest-expired first.

        With ``records=True`` each comes back as ``Claimed(run, current)``, its record
        included, in the same round trip; the claim then stops before the run whose record
        would take the reply past ``MAX_CLAIM_BYTES`` (2 MiB; the first run always comes),
        so it may return fewer than ``limit`` while more are claimable.

        With ``max_takeovers=N``, a run whose expired lease was already handed to another
        owner ``N`` times since its last write (``Current.takeovers``) is not handed out
        again: it goes to the quarantine as poison (:meth:`quarantined`) until a write or
        :meth:`release` puts it back. Needs layout 3 (:meth:`migrate`), else
        ``Misconfigured``.

        With ``block=ms``, when nothing is claimable, wait up to ``block`` ms and claim as
        soon as a lease expires (docs/runs.md, "Waiting for work").
        """
        wait = check_block(block)
        if limit == 0:
            wait = 0  # nothing could be claimed: nothing to wait for
        ops = self._ops

        def claim() -> tuple[list[Any], int]:
            return self._write(ops.claim_expired(owner, ttl, limit, records, max_takeovers))

        return claim()[0] if not wait else wakeups.claim(self._wakeups, wakeups.LEASES, claim,
                                                         wait)

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int, *,
                    records: Literal[False] = False, block: int | None = None) -> list[str]: ...

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int, *,
                    records: Literal[True], block: int | None = None) -> list[Claimed]: ...

    def claim_ready(self, owner: str, ttl: int, limit: int, *, records: bool = False,
                    block: int | None = None) -> list[str] | list[Claimed]:
        """Claim up to ``limit`` free runs whose wait is eligible, the earliest first.

        ``records=True`` hands back ``Claimed(run, current)`` values, as
        :meth:`claim_expired` does. With ``block=ms``, when nothing is claimable, wait up
        to ``block`` ms and claim as soon as something is (docs/runs.md, "Waiting for
        work"): the call returns the first claim that got runs, or ``[]`` once ``block``
        ms have passed; its deadline is ``block`` plus the store's ``timeout``.
        """
        wait = check_block(block)
        if limit == 0:
            wait = 0  # nothing could be claimed: nothing to wait for
        ops = self._ops

        def claim() -> tuple[list[Any], int]:
            return self._write(ops.claim_ready(owner, ttl, limit, records))

        return claim()[0] if not wait else wakeups.claim(self._wakeups, wakeups.READY, claim,
                                                         wait)

    def refresh(self, run: str) -> bool:
        """Re-derive the run's wait from its current record; True if it now has one."""
        return self._write(self._ops.refresh(run))

    def quarantined(self, limit: int = 1000) -> list[Quarantined]:
        """Index entries that claims dropped as damaged (a run missing, of another type, or
        corrupt), with the reason, up to ``limit``; docs/faults.md says how to repair."""
        return self._io.drive(self._ops.counting(self._ops.quarantined(limit)))

    def migrate(self, *, count: int = MIGRATE_COUNT) -> Migrated:
        """Move the namespace to the newest run layout this library knows, in bounded steps.

        A new namespace starts at the newest layout (4): this is needed only for one an
        older library started at layout 1, 2 or 3, and on a new one it is one step that
        finds nothing to do. Call it once every node runs a version that knows layout 4:
        from the first step on, a library that knows only an older layout refuses the
        namespace (``Misconfigured``) instead of misreading it, while this one reads both
        and rewrites each run on its next write. Each step is one
        script that visits at most ``count`` keys of the server (SCAN, at most 200) and
        rewrites at most 512 KiB of records (at least one run); steps go on until a whole
        pass is done. Safe to run from several nodes at once, to stop and resume (the
        cursor is kept in the namespace), and on a new namespace. Damaged runs are left
        as they are and listed by :meth:`quarantined` under the index ``"migrate"``.
        """
        report = Migrated()
        while True:
            step = self._write(self._ops.migrate_step(count))
            report = report.then(step)
            if step[1]:
                return report

    def _write(self, op: Operation[T] | Spread[T]) -> T:
        # The one-time server check runs before the store's first write (after the
        # write's own argument checks).
        return self._io.drive(self._ops.guarded(op))


class RedisRepository(_Closes, Shell[RepositoryOps | PartitionedRepositoryOps]):
    """The instance repository on a ``redis.Redis``-compatible client.

    Every method is one server-side Lua script, one round trip. ``save`` is a
    compare-and-set on ``rec_version`` that keeps, in the same atomic step, the indexes
    right: a per-group sorted set of claimable in-flight records scored by lease expiry
    (``list_in_flight`` is a range query), the terminal records in the order they became
    terminal (capped at ``max_terminal``, oldest evicted first, a warning to ``logger``),
    and the group registry. ``namespace`` isolates repositories sharing a server; all of
    its keys share the hash tag ``{namespace}``.

    ``partitions=N`` (1 to 256) spreads one logical repository over N hash tags
    ``{namespace#p}`` (docs/scale-out.md): a record's calls go to its id's partition, one
    round trip; ``register_group``, ``group_exists`` and the listings span every partition;
    ``max_terminal`` holds in each partition. The count is recorded in the namespace (apart
    from its run store's); another is refused (``Misconfigured``).

    Failures that are not an answer of the contract raise ``Unavailable``; a ``save`` or
    ``delete`` whose reply was lost is never re-sent (load the record to find out).
    """

    def __init__(self, client: Any, *, namespace: str = "redisstore", max_terminal: int = 1024,
                 logger: Logger | None = None, durability: Durability | None = None,
                 timeout: int = 5000, partitions: int = 1) -> None:
        self._ops = repository_ops(namespace, max_terminal, logger, partitions)
        self._io = Transport(client, *check_io(durability, timeout))

    def save(self, rec: InstanceRecord) -> int:
        """Store ``rec`` iff ``rec.rec_version`` is the stored version (0 creates).

        Returns the new stored version. Raises ``ConcurrentUpdate`` on a mismatch,
        ``UnknownGroup`` for an unregistered group (nothing written), ``ValueError`` /
        ``TypeError`` for a bad record (nothing sent).
        """
        return self._io.drive(self._ops.save(rec))

    def load(self, id: str) -> InstanceRecord | None:
        """The record stored under ``id`` (a fresh copy), or None."""
        return self._io.drive(self._ops.load(id))

    def delete(self, id: str, *, expected_version: int | None = None) -> None:
        """Remove the record for ``id``; a no-op when there is none. With
        ``expected_version``, only while the stored ``rec_version`` is that one: else
        ``ConcurrentUpdate`` and nothing is deleted (a zombie's delete after another node
        saved the record)."""
        self._io.drive(self._ops.delete(id, expected_version))

    def list_in_flight(self, group: str, now: datetime | None = None) -> list[str]:
        """Ids of ``group``'s records that are not terminal, not suspended, and whose lease
        is expired or absent at ``now`` (None: the server's clock). Unregistered: ``[]``."""
        return self._io.drive(self._ops.list_in_flight(group, now))

    def list_in_flight_page(self, group: str, now: datetime | None = None, *,
                            cursor: str | None = None, limit: int = MAX_PAGE) -> InFlightPage:
        """One page of :meth:`list_in_flight`: at most ``limit`` (<= 1000) ids, and the
        ``cursor`` of the next page (None once the listing is complete); docs/repository.md
        says what a listing across pages guarantees."""
        return self._io.drive(self._ops.list_in_flight_page(group, now, cursor=cursor,
                                                            limit=limit))

    def register_group(self, group: str) -> None:
        """Establish ``group`` in the registry (idempotent)."""
        self._io.drive(self._ops.register_group(group))

    def group_exists(self, group: str) -> bool:
        """Whether ``group`` is registered."""
        return self._io.drive(self._ops.group_exists(group))

    def migrate(self) -> None:
        """Prepare the server, idempotently: load the scripts, record the layout version,
        and check the settings. Raises ``Misconfigured`` when the server may evict keys
        (``maxmemory-policy allkeys-*``); warns when nothing is persisted, or when
        ``CONFIG GET`` is not allowed (managed services), and goes on."""
        self._io.drive(self._ops.migrate(settings=not self._io.fake))

    def cluster_compatibility(self) -> tuple[bool, str]:
        """``(True, reason)``: the state lives in the server, shared by every node."""
        return self._ops.cluster_compatibility()
