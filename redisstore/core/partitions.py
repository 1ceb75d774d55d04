"""One logical run store over many partitions (``partitions=N``): which partition a run is
in, and the calls that span partitions, as pure generators (sans-I/O, like
:mod:`redisstore.core.runops`). docs/scale-out.md is the user's guide; docs/design/partitions.md
the design.

A call that spans partitions (``renew``, ``release``, the claims, ``quarantined``,
``migrate``) is a :class:`Spread`: a generator that yields a :class:`Fan` (one operation per
partition it needs) and gets back each operation's :class:`~redisstore.core.driver.Settled`.
The shells send a fan's operations grouped by node, one pipelined round trip per node
(:func:`redisstore.core.groups.by_node`); everything else is decided here, once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from .driver import (
    Durability,
    Operation,
    PerNode,
    Settled,
    Spread,
    Steps,
    fan,
)
from .errors import NOT_APPLIED, SessionLapsed, StoreError, Unavailable
from .feed import Changes, Feed, Position, Rate, check_changes, check_minutes, decode, gap
from .feed import answer as feed_answer
from .keys import Keyspace
from .partition_ops import PartitionOps
from .placing import MAX_PARTITIONS as MAX_PARTITIONS
from .placing import Counted as Counted
from .placing import check_partitions as check_partitions
from .placing import deferred as deferred
from .placing import family_of as family_of
from .placing import partition_of as partition_of
from .placing import values_of as values_of
from .placing import worst as worst
from .runops import KINDS, Heads, RunOps, Share, next_wakeup, warn_once
from .runs import (
    MAX_CLAIM_BYTES,
    Claimed,
    Discover,
    Kept,
    Quarantined,
    SessionInfo,
    check_listing_limit,
    check_migrate_count,
    check_run,
    check_runs,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

#: What a claim removes from its partitions' queues once sent: (partition, "outbox" or
#: "unwatch") -> [(entry, version or watch number)].
Acks = dict[tuple[int, str], list[tuple[str, int]]]

#: The wake-up token of an outbox with entries left to deliver (as the scripts' announce).
OUTBOX_TOKEN = "~outbox"
#: How run_heads names a lapsed session's runs not yet in its partition's leases index.
LAPSED_MARK = "~"
#: A claim that left out a partition it could not reach says its next claim is due in this
#: many ms (the breaker's suspect period: pipeline.SUSPECT_FOR), so a blocked claimer comes
#: back for that partition's runs then.
LEFT_OUT_RETRY = 1000
#: A claim that goes on without an unreachable partition warns at most this often (s).
WARN_EVERY = 60.0


def checked_only(op: Operation[T]) -> T | None:
    """Run ``op`` up to its first call and drop it: an operation checks its arguments
    before it makes any call (a bad one raises here); nothing is sent. What it answered,
    where it answered without a call (a call over no runs: ``[]``, ``{}``), else None."""
    try:
        next(op)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    op.close()
    return None


class PartitionedOps(PartitionOps, Counted):
    """The run store's operations over ``partitions`` partitions of one namespace: one
    :class:`RunOps` per partition. A call of one run is that run's partition's operation,
    unchanged; a call over many runs is a :class:`Spread`. The operations themselves are
    :class:`RunOps`'s, routed as each one's ``@operation`` says (PartitionOps, generated:
    redisstore/core/partition_ops.py); this class writes the routes."""

    parts: list[RunOps]

    def __init__(self, namespace: str, discover: Discover | None, projection_version: int,
                 *, durability: Durability | None = None, max_record_bytes: int = 1 << 20,
                 partitions: int = 2) -> None:
        self.n = check_partitions(partitions)
        self.parts = [RunOps(namespace, discover, projection_version, durability=durability,
                             max_record_bytes=max_record_bytes, partition=p,
                             place=self.place) for p in range(self.n)]
        self.keys = Keyspace(namespace)
        self.counted = False
        self._warned = -WARN_EVERY  # when a claim last warned of an unreachable partition
        #: The partitions where each session this store opened or kept is known not to be
        #: live (left out at its opening, lapsed since): its keepalives and claims leave them
        #: out. Learned again from the partitions' answers by a store that did not open it.
        self._lapsed: dict[str, set[int]] = {}
        for part in self.parts:
            part.watcher = self._watch
            part.opened = self.n
        self._tail(str(self.n))

    @property
    def max_record_bytes(self) -> int:
        """The cap on a record, the same in every partition (a Worker checks its results
        against it)."""
        return self.parts[0].max_record_bytes

    def _watch(self, dependency: str, watcher: int, floor: int = 0
               ) -> Operation[tuple[int, int, int]]:
        """The watch of ``dependency`` by a run of partition ``watcher``, in its partition
        (a number above ``floor``): its version, the watch's number, its partition."""
        part = self.parts[self.place(dependency)]
        return self._counted(lambda: part.watch(dependency, watcher, floor))

    @property
    def checks(self) -> set[str]:
        """The one-time server checks done for the client (shared by every partition on one
        server; on a cluster, :class:`~redisstore.core.driver.PerNode`, each partition's own)."""
        return self.parts[0].checks

    @checks.setter
    def checks(self, checks: set[str]) -> None:
        for part in self.parts:
            part.checks = PerNode(checks) if isinstance(checks, PerNode) else checks

    def place(self, run: str) -> int:
        """The partition of ``run``."""
        return partition_of(run, self.n)

    def part(self, run: str) -> RunOps:
        """The operations of ``run``'s partition (a bad id raises, as the call would)."""
        return self.parts[partition_of(check_run(run), self.n)]

    # ------------------------------------------------------------------ the checks

    def checked(self) -> bool:
        """Whether a pipeline needs no check first: the count and every partition's server
        checked (a pipeline's calls never call another node than their group's)."""
        return self.counted and all(part.checked() for part in self.parts)

    def server_check(self) -> Operation[None]:
        """What a pipeline of writes sends first: the count check, then every partition's
        server check (:meth:`RunOps.server_check`). A call alone checks only its own
        partitions (:meth:`_counted`)."""
        yield from self.count_check()
        for part in self.parts:
            if not part.checked():
                yield from part.server_check()

    def read_check(self) -> Operation[None] | None:
        """What a pipeline of reads only sends first: the count check, until it passed."""
        return None if self.counted else self.count_check()

    def counting(self, op: Operation[T] | Spread[T]) -> Operation[T] | Spread[T]:
        """``op``: its partitions compare the count (:meth:`_counted`)."""
        return op

    def guarded(self, op: Operation[T] | Spread[T]) -> Operation[T] | Spread[T]:
        """``op``: it does its own checks in the partitions it writes (:meth:`_counted`)."""
        return op

    # ------------------------------------------------------------------ wake-ups

    def next_wakeup(self, kinds: Iterable[str], seconds: float
                    ) -> Operation[tuple[str, str] | None]:
        """A wake-up token of any partition (one ``BZPOPMIN`` over all their wake keys: on
        one server only)."""
        return next_wakeup([part.keys for part in self.parts], kinds, seconds)

    def give_back_wakeup(self, kind: str, token: str) -> Operation[None]:
        """Put back a token (in partition 0: one waker listens to every partition)."""
        return self.parts[0].give_back_wakeup(kind, token)

    def wake_sources(self, cluster: bool) -> list[tuple[Any, Any]]:
        """The (next_wakeup, give_back) pairs a store's waker listens to: one over every
        partition on one server; one per partition on a cluster (a command takes the keys
        of one slot), which its wakers per node fall back to (:meth:`sweeps`)."""
        if not cluster:
            return [(self.next_wakeup, self.give_back_wakeup)]
        return [(part.next_wakeup, part.give_back_wakeup) for part in self.parts]

    def sweeps(self, cluster: bool) -> PartitionSweeps | None:
        """On a cluster, what its wakers per node do with their partitions' wake keys
        (:class:`~redisstore.shells.wakeups.Sweeps`); None on one server, where one ``BZPOPMIN``
        spans the partitions."""
        return PartitionSweeps(self.parts) if cluster else None

    # ------------------------------------------------------------------ one run

    def _one(self, run: str, make: Callable[[RunOps], Operation[T]], *,
             write: bool) -> Operation[T]:
        """A call of one run in its partition (a bad id raises here, as the call would)."""
        part = self.part(run)
        return self._counted(lambda: make(part), part if write else None)

    # ------------------------------------------------------------------ many runs

    def _by_partition(self, names: list[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for name in names:
            groups.setdefault(self.place(name), []).append(name)
        return groups

    def _each(self, runs: Iterable[str],
              call: Callable[[RunOps, list[str]], Operation[T]]) -> Spread[T]:
        """A call over many runs (``renew``, ``release``, ``get_many``):
        :meth:`_each_steps`. Its other arguments are checked now, by the core's call over no
        runs (which sends nothing)."""
        none = checked_only(call(self.parts[0], []))
        return Spread(self._each_steps(call, check_runs(runs), isinstance(none, dict)))

    def _each_steps(self, call: Callable[[RunOps, list[str]], Operation[T]],
                    names: list[str], by_run: bool) -> Steps[T]:
        """Each partition's runs in one call; the answers, each the runs it did (a list) or,
        ``by_run``, the runs it found (a dict by run), joined in the caller's order. When some
        partitions fail, the call's error (:func:`worst`) says, when it is ``Unavailable``,
        what the others did: the runs they renewed, released or found (``done``) and the
        runs of the failed partitions (``unanswered``), so a caller (the keeper) counts the
        ones and retries the others."""
        groups = self._by_partition(names)
        answers = yield from self._fan([(deferred(call, self.parts[p], group), self.parts[p])
                                        for p, group in groups.items()])
        done: dict[str, Any] = {}
        unanswered: set[str] = set()
        errors: list[StoreError] = []
        for group, got in zip(groups.values(), answers, strict=True):
            if got.error is None:
                value: Any = got.value or ()
                done.update(value if by_run else dict.fromkeys(value))
            elif not isinstance(got.error, StoreError):
                raise got.error
            else:
                errors.append(got.error)
                unanswered.update(group)
        if errors:
            # renew and release (answering lists) are writes: another partition that
            # answered applied them. get_many (a dict by run) is a read: nothing was applied
            # anywhere, so an answer of the contract (Corrupt) is the call's answer.
            write = not by_run
            error = worst(errors, applied=write and len(errors) < len(answers))
            if isinstance(error, Unavailable):
                error.done = [name for name in names if name in done]
                error.unanswered = [name for name in names if name in unanswered]
            raise error
        found: Any = ({name: done[name] for name in names if name in done} if by_run
                      else [name for name in names if name in done])
        return found  # type: ignore[no-any-return]

    def _claims(self, index: str, checks: Operation[tuple[list[Any], int]], limit: int,
                records: bool, claim: Callable[[RunOps, Share], Operation[tuple[list[Any], int]]]
                ) -> Spread[tuple[list[Any], int]]:
        """A claim (``claim_ready``, ``claim_expired``): :meth:`_claim` over the ``index``
        of every partition, each share by ``claim``. ``checks``, the core's claim, checks
        the arguments now (dropped before it sends anything)."""
        checked_only(checks)
        return Spread(self._claim(index, limit, records, claim))

    def _claim(self, index: str, limit: int, records: bool,
               claim: Callable[[RunOps, Share], Operation[tuple[list[Any], int]]],
               lapsed: set[int] | None = None) -> Steps[tuple[list[Any], int]]:
        """A claim over every partition, in two round trips per node (four when an outbox
        holds a dependency's write to deliver: :meth:`_heads_delivered`). First each
        partition's head (its first ``limit`` due entries, read only); the heads merged,
        earliest first, and the first ``limit`` entries say how many each partition gives.
        Then each partition claims its share. Bounded by ``limit``; disjoint (each claim is
        one script in one partition); in due order across partitions up to the race
        between the two round trips; a partition that gives less than its share (another
        claimer was faster, a stale entry) leaves the call short. The heads (and the
        notifies) are patient fans (:class:`~redisstore.core.driver.Fan`): a node that does
        not answer them in time is left out, so the claims still have time.

        A session's claim (``lapsed``: the partitions where its session is not live, which
        the claim adds to as their claims answer so) leaves those partitions out: the
        others' runs are handed out as ever; when nothing was claimed because of them, the
        wait is 0, so that a blocked claim looks again at once."""
        if limit == 0:
            return [], -1
        heads, acks, more = yield from self._heads_delivered(index, limit)
        left_out = frozenset(lapsed or ())
        entries: list[tuple[int, bytes, int, str]] = []
        waits: list[int] = []
        pending: list[int] = []
        errors: list[StoreError] = []
        for p, got in enumerate(heads):
            if p in left_out:
                continue
            if got.error is not None:
                errors.append(got.error)
                if isinstance(got.error, Unavailable):
                    # Left out of this claim (down, cut, a suspect): its runs may be due,
                    # so a blocked claim tries again soon rather than at its re-arm.
                    waits.append(LEFT_OUT_RETRY)
                continue
            due, busy, wait = got.unwrap()[:3]
            entries.extend((score, run.encode("utf-8", "surrogateescape"), p, run)
                           for score, run in due)
            waits.append(wait)
            if busy:
                pending.append(p)
        if errors and len(errors) == len(heads) - len(left_out):
            raise worst(errors, applied=False)
        entries.sort()
        chosen = entries[:limit]
        if len(entries) > limit:
            waits.append(0)  # more is due than this call takes
        shares = Counter(p for _, _, p, _ in chosen)
        # A partition still re-indexing a dependency's waiters claims (its share, or 0)
        # so that its claim finishes that work, as one partition's claims do; so does one
        # whose lapsed sessions hold runs outside its leases index (run_heads names them
        # "~<session>"), so that its claim sweeps them in: a dead node's runs are claimable
        # in every partition at its expiry, not when the merge reaches theirs.
        extra = set(pending) if index in ("ready", "any") else set()
        if index in ("leases", "any"):
            extra.update(p for _, _, p, run in entries if run.startswith(LAPSED_MARK))
        order = sorted(set(shares) | extra)
        if lapsed is not None and not order:
            # A session's claim with nothing due: one partition's claim of none checks the
            # session there (refused once lapsed), as one partition's claim always does; one
            # whose head answered, so that a node away does not fail a claim of nothing.
            order = [min(p for p, got in enumerate(heads)
                         if got.error is None and p not in left_out)]
        # The record budget is shared; only the partition of the earliest entry always hands
        # back its first run, so a reply passes the budget by one record at most.
        budget = max(1, MAX_CLAIM_BYTES // max(1, len(shares))) if records else 0
        first = chosen[0][2] if chosen else -1
        # A partition with due work and no share keeps a wake-up token for its first due
        # run (NX: the one it had, if the waker has not taken it): the token that woke this
        # claim may have been that partition's, and its claim script, which would say it
        # left work behind, does not run.
        left: dict[int, str] = {}
        for _, _, p, run in entries[limit:]:
            if p not in shares and p not in left:
                left[p] = run
        answers = yield from fan([*(self._checked(deferred(claim, self.parts[p],
                                                         Share(shares[p], budget, p != first)),
                                                self.parts[p])
                                    for p in order),
                                  *(self.parts[p].give_back_wakeup(kind, run)
                                    for p, run in left.items() for kind in KINDS[index]),
                                  *(self.parts[d].give_back_wakeup("ready", OUTBOX_TOKEN)
                                    for d in more),
                                  *(self.parts[d].delivered(done, queue)
                                    for (d, queue), done in acks.items())])
        answers = answers[:len(order)]
        rank = {(p, run): i for i, (_, _, p, run) in enumerate(chosen)}
        claimed: list[tuple[int, Any]] = []
        failed: list[StoreError] = []
        for p, claim_answer in zip(order, answers, strict=True):
            if lapsed is not None and isinstance(claim_answer.error, SessionLapsed):
                lapsed.add(p)  # the session lapsed there: left out from now on
                waits.append(0)
                continue
            if claim_answer.error is not None:
                failed.append(claim_answer.error)
                if isinstance(claim_answer.error, Unavailable):
                    waits.append(LEFT_OUT_RETRY)  # its due runs: see the heads above
                continue
            runs, wait = claim_answer.unwrap()
            waits.append(wait)
            for run in runs:
                name = run.run if isinstance(run, Claimed) else run
                claimed.append((rank.get((p, name), len(rank) + len(claimed)), run))
        maybe = [e for e in failed if isinstance(e, Unavailable) and e.outcome != NOT_APPLIED]
        if maybe or (failed and not claimed):
            # A partition's claim may have run (its reply was lost): its runs are held by
            # this owner until their ttl, as one partition's would be; the call says so.
            raise worst(failed, applied=bool(claimed))
        for error in errors + failed:
            # Nothing was written there (a damaged index, a partition unreachable): the
            # others' work goes on rather than every claim failing with that partition.
            # Damage warns; an unreachable partition warns once a minute per store (its
            # runs wait meanwhile: someone must hear of it) and is logged at info between.
            (log.warning if not isinstance(error, Unavailable) or self._warn_now()
             else log.info)(
                "redisstore: a claim over partitions went on without one of them: %s", error)
        claimed.sort(key=lambda c: c[0])
        return [run for _, run in claimed], _soonest(waits)

    def _warn_now(self) -> bool:
        """Whether a claim that went on without an unreachable partition warns now: at
        most once per WARN_EVERY seconds per store."""
        now = time.monotonic()
        if now - self._warned < WARN_EVERY:
            return False
        self._warned = now
        return True

    def _heads_delivered(self, index: str, limit: int
                         ) -> Steps[tuple[list[Settled[Heads]], Acks, list[int]]]:
        """Every partition's head, after delivering what their outboxes hold (dependencies
        across partitions): each entry is notified to its partition first, so the waiters
        it makes claimable are in the heads this claim reads; with them, the unwatches each
        partition queued are sent to the dependency's partition. Answers the heads; the
        entries to remove from each partition's outbox and unwatch queue (in the claim's
        round trip: one whose notify or unwatch failed stays, and is sent again by a later
        claim; both are idempotent); and the partitions whose outbox held more than this
        claim read while it delivered some (or removed foreign ones): the claim leaves a
        wake-up token there, so that a blocked claim goes on delivering at once rather than
        at its re-arm. An outbox none of whose deliveries succeeded (the waiters' node is
        down) gets none: no claim loops on it."""
        acks: Acks = {}
        heads = yield from self._fan([(deferred(RunOps.heads, part, index, limit), None)
                                      for part in self.parts], patient=True)
        unread = {d for d, got in enumerate(heads)
                  if got.error is None and _outbox_size(got.unwrap()) > len(got.unwrap()[3])}
        # (queue's partition, queue, entry, score, target partition, dependency, watch,
        # group: the sends of one entry, acknowledged once they all succeeded)
        sends: list[tuple[int, str, str, int, int, str, int, int]] = []
        foreign: list[tuple[int, str]] = []
        for d, got in enumerate(heads):
            if got.error is not None:
                continue
            found = got.unwrap()
            for queue, size in (("outbox", _outbox_size(found)),
                                ("unwatch", found[6] if len(found) > 6 else 0)):
                if size < 0:  # damaged: set aside in the claim's round trip
                    acks[(d, queue + "!")] = []
                    warn_once(f"damaged:{self.parts[d].keys.prefix}{queue}",
                              "redisstore: partition %d's %s is damaged (of another type, or "
                              "bigger than its entries can be): set aside as %s (listed by "
                              "store.quarantined())", d, self.parts[d].keys.prefix + queue,
                              self.parts[d].keys.prefix + "damaged:" + queue + ":<time>")
            queued = [("outbox", *e) for e in found[3]]
            queued += [("unwatch", entry, seq, seq) for entry, seq in _unwatches(found)]
            for queue, entry, score, seq in queued:
                where, _, dependency = entry.partition("|")
                group = len(sends)
                if score < 0:
                    acks.setdefault((d, queue), []).append((entry, 0))  # no score: removed
                    foreign.append((d, entry))
                elif where == "*" and queue == "outbox" and _is_run(dependency):
                    # A damaged watch's "every partition": delivered to each, and the watch
                    # made one of each partition (then pruned as any other).
                    sends.append((d, "watch", entry, score, d, dependency, 0, group))
                    sends.extend((d, queue, entry, score, w, dependency, 0, group)
                                 for w in range(self.n) if w != d)
                elif where.isdigit() and int(where) < self.n and _is_run(dependency) \
                        and (queue == "outbox" or (score > 0 and int(where) != d)):
                    sends.append((d, queue, entry, score, int(where), dependency, seq, group))
                else:  # not one of ours (a foreign write): removed, never a wall
                    acks.setdefault((d, queue), []).append((entry, score))
                    foreign.append((d, entry))
        if foreign:
            d, entry = foreign[0]
            log.warning("redisstore: a claim removes %d outbox or unwatch entries that name "
                        "no run of this store (a foreign write), the first in partition %d: "
                        "%r%s", len(foreign), d, entry[:120], "..." if len(entry) > 120 else "")
        if not sends:
            return heads, acks, [d for d in unread if (d, "outbox") in acks]
        sent = yield from fan((self._checked(
            deferred(RunOps.notify, self.parts[w], dependency, score, d, seq)
            if queue == "outbox" else deferred(RunOps.watch_all, self.parts[w], dependency,
                                               self.n) if queue == "watch"
            else deferred(RunOps.unwatch, self.parts[w], dependency, d, seq), self.parts[w])
            for d, queue, _, score, w, dependency, seq, _ in sends), patient=True)
        delivered = False
        failed = {group for (*_, group), got in zip(sends, sent, strict=True)
                  if got.error is not None}
        done: set[int] = set()
        for (d, queue, entry, score, _, _, _, group), got in zip(sends, sent, strict=True):
            if got.error is not None:
                log.warning("redisstore: a dependency's %s could not reach its partition yet "
                            "(%s); a later claim sends it again",
                            "unwatch" if queue == "unwatch" else "write", got.error)
            elif group not in failed and group not in done:
                done.add(group)
                queue = "unwatch" if queue == "unwatch" else "outbox"
                acks.setdefault((d, queue), []).append((entry, score))
                delivered = delivered or queue == "outbox"
        if delivered:  # waiters may be claimable now: read the heads again
            heads = yield from fan((part.heads(index, limit) for part in self.parts),
                                   patient=True)  # counted by now where the first needed it
        return heads, acks, [d for d in unread if (d, "outbox") in acks]

    def set_feed(self, feed: Feed | None) -> None:
        """See :meth:`RunOps.set_feed`: each partition's."""
        for part in self.parts:
            part.set_feed(feed)

    def changes(self, after: str | None = None, limit: int = 100, *,
                block: int | None = None) -> Spread[Changes]:
        """See :meth:`RunOps.changes`: every partition's feed, one position each in the
        cursor; a page interleaves them by time."""
        after, limit, block = check_changes(after, limit, block)
        self.parts[0].feed_on()
        positions = decode(after, self.n)
        return Spread(self._changes(after, positions, limit, block))

    def _changes(self, after: str | None, positions: list[Position], limit: int,
                 block: int | None) -> Steps[Changes]:
        deadline = time.monotonic() + (block or 0) / 1000
        while True:
            answers = yield from fan(part.feed_read(p, limit)
                                     for part, p in zip(self.parts, positions, strict=True))
            found = [(p, got.unwrap()) for p, got in zip(positions, answers, strict=True)]
            lost = [d for d, (p, f) in enumerate(found) if gap(p, f) is not None]
            oldest: dict[int, Any] = {}
            if lost:
                got_oldest = yield from fan(self.parts[d].feed_oldest() for d in lost)
                oldest = {d: got.unwrap() for d, got in zip(lost, got_oldest, strict=True)}
            page = feed_answer(after, found, limit, oldest.get)
            left = int((deadline - time.monotonic()) * 1000)
            if page.events or left <= 0:
                return page
            # Each partition's stream in a cluster slot of its own: a short wait on each, at
            # once, then a read of all.
            now = decode(page.cursor, self.n)
            yield from fan(part.feed_wait(p, min(left, PARTITION_FEED_WAIT))
                           for part, p in zip(self.parts, now, strict=True))

    def rates(self, minutes: int = 60) -> Spread[list[Rate]]:
        """See :meth:`RunOps.rates`: every partition's counts, added minute by minute (each
        partition's minutes by its node's clock: the rows are those of the first
        partition's clock, a count of another minute goes to the row of its own minute
        when there is one)."""
        minutes = check_minutes(minutes)
        self.parts[0].feed_on()
        return Spread(self._rates(minutes))

    def _rates(self, minutes: int) -> Steps[list[Rate]]:
        answers = yield from fan(part.rates_read(minutes) for part in self.parts)
        tables = [got.unwrap() for got in answers]
        rows = {r.minute: [r.claims, r.finishes, r.takeovers] for r in tables[0]}
        for table in tables[1:]:
            for r in table:
                row = rows.get(r.minute)
                if row is not None:
                    row[0] += r.claims
                    row[1] += r.finishes
                    row[2] += r.takeovers
        return [Rate(minute, *row) for minute, row in rows.items()]

    def quarantined(self, limit: int = 1000) -> Spread[list[Quarantined]]:
        """See :meth:`RunOps.quarantined`: every partition's, merged."""
        limit = check_listing_limit(limit)
        return Spread(self._quarantined(limit))

    def _quarantined(self, limit: int) -> Steps[list[Quarantined]]:
        answers = yield from fan(part.quarantined(limit) for part in self.parts)
        found: list[Quarantined] = []
        for got in answers:
            found.extend(got.unwrap())
        return sorted(found, key=lambda q: (q.index, q.run))[:limit]

    def migrate_step(self, count: int) -> Spread[tuple[int, bool, int, int]]:
        """One step in every partition at once, each bounded as a store of one partition's
        (a partition already done answers at once): (runs moved, whether every partition is
        done, damaged runs, index entries moved). Each step is a call of its own, with its
        own deadline, so a migration over a big database is as many calls as it takes."""
        count = check_migrate_count(count)
        return Spread(self._migrate(count))

    def _migrate(self, count: int) -> Steps[tuple[int, bool, int, int]]:
        answers = yield from self._fan([(deferred(RunOps.migrate_step, part, count), part)
                                        for part in self.parts])
        steps = [got.unwrap() for got in answers]
        return (sum(s[0] for s in steps), all(s[1] for s in steps),
                sum(s[2] for s in steps), sum(s[3] for s in steps))


    # ------------------------------------------------------------------ sessions

    def session_open(self, owner: str, ttl: int) -> Spread[str]:
        """A session in every partition (docs/design/sessions.md, "Over partitions"): its id
        from partition 0 (which gives ids never given twice), then the same session opened
        in each other partition at once. A partition that does not take it (its node down,
        or it knows that id already) is left out: the session is not live there, and its
        claims and keepalives leave it out (once they find so, for a node that was away).
        Partition 0 failing fails the opening."""
        return Spread(self._session_open(owner, ttl))

    def _session_open(self, owner: str, ttl: int) -> Steps[str]:
        first = self.parts[0]
        [got] = yield from self._fan([(deferred(RunOps.session_open, first, owner, ttl), first)])
        sid: str = got.unwrap()
        others = self.parts[1:]
        answers = yield from self._fan([(deferred(RunOps.session_open, part, owner, ttl, sid),
                                         part) for part in others])
        lapsed = self._lapsed.setdefault(sid, set())
        for p, opened in enumerate(answers, start=1):
            if opened.error is None:
                continue
            if not isinstance(opened.error, StoreError):
                raise opened.error
            if isinstance(opened.error, SessionLapsed):
                lapsed.add(p)
            # Else (its node away...) it is not marked: the keepalives and claims sent there
            # once it is back find no session (SessionLapsed) and leave it out from then on;
            # until then they fail there as any call does (its runs wait for the node).
            log.warning("redisstore: session %s of %r was not opened in partition %d (%s): "
                        "its runs there are left to per-run claims", sid, owner, p,
                        opened.error)
        return sid

    def session_keepalive(self, session: str, owner: str) -> Spread[Kept]:
        """The keepalive of every partition where the session may be live, at once (one
        round trip per node): their told runs merged. A partition where it lapsed is left
        out from then on (:attr:`Kept.lapsed`: the runs held there are lost, it never
        comes back there); ``SessionLapsed`` once it lapsed in every partition. One that
        did not answer is in :attr:`Kept.unanswered`; when none kept it, the call's error."""
        return Spread(self._keepalive(session, owner))

    def _keepalive(self, session: str, owner: str) -> Steps[Kept]:
        lapsed = self._lapsed.setdefault(session, set())
        live = [p for p in range(self.n) if p not in lapsed]
        answers = yield from self._fan([
            (deferred(RunOps.session_keepalive, self.parts[p], session, owner), self.parts[p])
            for p in live])
        told: list[str] = []
        errors: list[StoreError] = []
        unanswered: set[int] = set()
        for p, got in zip(live, answers, strict=True):
            if got.error is None:
                told += got.value or []
            elif isinstance(got.error, SessionLapsed):
                lapsed.add(p)
            elif isinstance(got.error, StoreError):
                errors.append(got.error)
                unanswered.add(p)
            else:
                raise got.error
        if len(lapsed) == self.n:
            self._lapsed.pop(session, None)  # (another thread's close may have, too)
            raise SessionLapsed(session)
        if len(unanswered) + len(lapsed) == self.n:
            raise worst(errors, applied=False)  # kept nowhere
        return Kept(told, lapsed=frozenset(lapsed), unanswered=frozenset(unanswered))

    def session_claim(self, kind: str, session: str, owner: str, ttl: int, limit: int,
                      records: bool, max_takeovers: int | None
                      ) -> Spread[tuple[list[Any], int]]:
        """A claim under ``session`` (:meth:`RunOps.session_claim`) over the partitions where
        it is live: shares by the heads as the store's claims (:meth:`_claim`; a lapsed
        session's unswept runs count as due at its expiry), each partition's claim under
        the session. ``SessionLapsed`` when it is live in none."""
        return Spread(self._session_claim(kind, session, owner, ttl, limit, records,
                                          max_takeovers))

    def _session_claim(self, kind: str, session: str, owner: str, ttl: int, limit: int,
                       records: bool, max_takeovers: int | None
                       ) -> Steps[tuple[list[Any], int]]:
        lapsed = self._lapsed.setdefault(session, set())
        if limit == 0:
            # Claims nothing; refused when the session is live nowhere, as one partition's.
            live = [p for p in range(self.n) if p not in lapsed]
            answers = yield from self._fan([(deferred(
                RunOps.session_claim, self.parts[p], kind, session, owner, ttl, 0, records,
                max_takeovers), self.parts[p]) for p in live])
            for p, got in zip(live, answers, strict=True):
                if isinstance(got.error, SessionLapsed):
                    lapsed.add(p)
            if len(lapsed) < self.n:
                values_of([got for got in answers if not isinstance(got.error, SessionLapsed)])
                return [], -1
        while True:
            if len(lapsed) == self.n:
                self._lapsed.pop(session, None)
                raise SessionLapsed(session)
            before = len(lapsed)
            claimed = yield from self._claim(kind, limit, records, lambda part, share: (
                part.session_claim_call(kind, share, session, owner, ttl, max_takeovers)),
                lapsed)
            # Nothing claimed because the session lapsed in a partition: again without it
            # (at most once per partition), so that a session lapsed everywhere is refused.
            if claimed[0] or len(lapsed) == before:
                return claimed

    def session_close(self, session: str, owner: str, count: int
                      ) -> Spread[tuple[int, bool]]:
        """One step of ``close`` in every partition at once (one that is done answers at
        once): runs released, and whether every partition is done. Every partition, the
        lapsed ones too: a lapsed session's runs left there are released as well."""
        return Spread(self._session_close(session, owner, count))

    def _session_close(self, session: str, owner: str, count: int
                       ) -> Steps[tuple[int, bool]]:
        answers = yield from self._fan([
            (deferred(RunOps.session_close, part, session, owner, count), part)
            for part in self.parts])
        steps = values_of(answers, write=True)
        done = all(d for _, d in steps)
        if done:
            self._lapsed.pop(session, None)
        return sum(r for r, _ in steps), done

    def sessions(self, limit: int) -> Spread[list[SessionInfo]]:
        """Up to ``limit`` sessions, each once, read from every partition at once: its
        owner, the runs it holds summed over the partitions, its latest expiry (it is live
        while it is live in any partition); by expiry."""
        return Spread(self._sessions(limit))

    def session_parts(self, limit: int) -> Spread[list[list[SessionInfo]]]:
        """Each partition's sessions (up to ``limit`` of each, read at once), as that
        partition has them: its own expiry and runs. A session lapsed in some partitions
        only (their node away past the ttl) is live in the others alone."""
        return Spread(self._session_parts(limit))

    def _session_parts(self, limit: int) -> Steps[list[list[SessionInfo]]]:
        answers = yield from fan(part.sessions(limit) for part in self.parts)
        return list(values_of(answers))

    def _sessions(self, limit: int) -> Steps[list[SessionInfo]]:
        merged: dict[str, SessionInfo] = {}
        for listed in (yield from self._session_parts(limit)):
            for info in listed:
                seen = merged.get(info.id)
                if seen is None:
                    merged[info.id] = info
                    continue
                merged[info.id] = SessionInfo(
                    info.id, seen.owner if seen.owner != "?" else info.owner,
                    max(seen.expires, info.expires), seen.runs + info.runs)
        return sorted(merged.values(), key=lambda i: (i.expires, int(i.id)))[:limit]

#: The longest ``XREAD BLOCK`` a blocked ``changes`` over partitions sends each at a time
#: (ms): every partition waits at once, and the read of all follows the slowest.
PARTITION_FEED_WAIT = 250


def _outbox_size(heads: Heads) -> int:
    """How many entries the outbox of a head read holds (0 where not told)."""
    return heads[4] if len(heads) > 4 else 0


def _unwatches(heads: Heads) -> list[tuple[str, int]]:
    """The unwatch queue entries of a head read (none where not told)."""
    return heads[5] if len(heads) > 5 else []


def _is_run(name: str) -> bool:
    """Whether ``name`` passes the run-id checks (an outbox entry's dependency that fails
    them can never be a run of ours: removed as foreign, never sent to a script)."""
    try:
        check_run(name)
    except (TypeError, ValueError):
        return False
    return True


def _soonest(waits: list[int]) -> int:
    """The soonest of the partitions' waits (0: claimable work is left, -1: none)."""
    ahead = [w for w in waits if w >= 0]
    return min(ahead) if ahead else -1


def run_ops(namespace: str, discover: Discover | None, projection_version: int, *,
            durability: Durability | None, max_record_bytes: int,
            partitions: int) -> RunOps | PartitionedOps:
    """A store's operations: :class:`RunOps` for one partition (today's layout, unchanged),
    else :class:`PartitionedOps`."""
    if check_partitions(partitions) == 1:
        return RunOps(namespace, discover, projection_version, durability=durability,
                      max_record_bytes=max_record_bytes)
    return PartitionedOps(namespace, discover, projection_version, durability=durability,
                          max_record_bytes=max_record_bytes, partitions=partitions)


class PartitionSweeps:
    """The wake keys of a store's partitions, swept by a cluster's wakers per node: each
    key is also the name of its partition's sharded channel (the scripts publish there)."""

    def __init__(self, parts: list[RunOps]) -> None:
        self._parts = parts
        self.count = len(parts)

    def wake_key(self, p: int, kind: str) -> str:
        """Partition ``p``'s wake key (and channel) of ``kind``."""
        return self._parts[p].keys.wake(kind)

    def take(self, wants: Iterable[tuple[int, str, int]]
             ) -> Spread[Sequence[list[str] | Exception]]:
        """Up to ``count`` tokens of ``kind`` from each partition ``p`` of ``wants``, in one
        call over partitions (a round trip per node); for a partition whose sweep failed (a
        foreign wake key, a node away, a denied ZPOPMIN), its error."""
        ops = [self._parts[p].take_wakeups(kind, count) for p, kind, count in wants]

        def steps() -> Steps[Sequence[list[str] | Exception]]:
            answers = yield from fan(ops)
            return [a.error if a.error is not None else (a.value or []) for a in answers]
        return Spread(steps())

    def give_back(self, p: int, kind: str, token: str) -> Operation[None]:
        """Put a token back in partition ``p`` (announced on its channel)."""
        return self._parts[p].give_back_wakeup(kind, token)
