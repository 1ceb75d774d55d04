"""Pipelines: many calls of one run store in one round trip.

Sans-I/O like the rest of the core: a pipeline queues :class:`~redisstore.core.driver.Driver`
values (one per call, built at once, so a bad argument raises where the call is queued),
and :class:`Group` runs them together as batches a shell sends. Each round trip carries the
next batch of every call still running, in the order the calls were queued; a call needs a
second one only when it must be sent again (after ``NOSCRIPT``, when nothing ran; a read
whose connection broke) or reads before it writes (``refresh``). Every rule of one call
holds for each call of a pipeline: a write goes out exactly once, and each call gets its own
answer or its own error, decided by its own driver.

With ``Durability``, one confirmation (``WAIT`` / ``WAITAOF``) at the end of a round trip
covers every write in it (``WAIT`` counts every write sent before it on the connection).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import NOT_APPLIED, UNKNOWN, StoreError, Unavailable
from .driver import Batch, Driver, Durability, Operation, Settled, Spread
from .outcomes import ErrorReply, Exchange, Lost, Reply
from .partitions import PartitionedOps
from .pending import Pending
from .pipeline_ops import PipelineOps
from .runops import RunOps, fusable, fused, runs_only
from .waits import check_block

T = TypeVar("T")


#: A round trip carries at most this many calls, and at most this many bytes of arguments
#: (records), beyond its first call: the server runs a round trip's scripts back to back,
#: so a longer one would hold other clients up; the rest go in the next round trip.
MAX_ROUND_CALLS = 100
MAX_ROUND_BYTES = 2 << 20


def batch_size(batch: Batch) -> int:
    """The bytes of a batch's arguments (an int counts 8), for the round trip caps."""
    return sum(len(a) if isinstance(a, bytes) else 8 for c in batch.commands for a in c)


class Group:
    """The calls of one pipeline as one machine of batches (``next_batch`` / ``receive``,
    like a :class:`~redisstore.core.driver.Driver`): each round trip sends the batch of every
    call still running, in queue order.

    ``first``, when given, runs alone before the calls: the store's one-time server check,
    which must pass before any write is sent. If it fails, every write fails with its error
    and is not sent (with ``guards_reads``, every call: a check reads depend on).
    """

    def __init__(self, calls: list[Pending[Any]], durability: Durability | None,
                 first: Driver[None] | None = None, *, guards_reads: bool = False,
                 node: Hashable = None) -> None:
        #: The node the group is sent to (as the shell's ``node_of`` names it).
        self.node = node
        self._calls = calls
        self._durability = durability
        self._first = first
        self._guards_reads = guards_reads
        self._round: list[tuple[Driver[Any], Batch, int]] = []
        #: Drivers of this round whose SCRIPT LOAD an earlier call of the round sent: the
        #: index of that load's reply.
        self._shared: dict[int, int] = {}
        self._confirmed = False

    def next_batch(self) -> Batch | None:
        """The batch to send now, or None when every call has its answer."""
        if self._first is not None:
            batch = self._first.next_batch()
            if batch is not None:
                return batch
            try:
                self._first.result()
            except StoreError as error:
                # The server may not hold the store's keys (it evicts): no write goes out.
                # Reads do, as they would alone.
                for call in self._calls:
                    if call._write or self._guards_reads:
                        call._fail(_copy(error))
            self._first = None
        self._round = []
        self._shared = {}
        commands: list[tuple[bytes | int, ...]] = []
        keys: tuple[str, ...] = ()
        write = fresh = False
        loads: dict[bytes | int, int] = {}
        size = 0
        seen: set[int] = set()
        for call in self._calls:
            driver = call._driver
            batch = driver.next_batch() if driver is not None and not call.done() else None
            if driver is None or batch is None or id(driver) in seen:
                continue  # done, or the second of two calls that share a script
            seen.add(id(driver))
            size += batch_size(batch)
            if self._round and (len(self._round) >= MAX_ROUND_CALLS
                                or size > MAX_ROUND_BYTES):
                break  # the next round trip takes the rest, in order
            own = batch.commands
            if batch.write and self._durability is not None:
                own = own[:-1]  # its own confirmation: the round's one covers it
            if own and own[0][:2] == (b"SCRIPT", b"LOAD"):
                # After NOSCRIPT: each script is loaded once per round trip, by the first
                # call that needs it; the others share that load's reply.
                source = own[0][2]
                if source in loads:
                    self._shared[id(driver)] = loads[source]
                    own = own[1:]
                else:
                    loads[source] = len(commands)
            commands.extend(own)
            self._round.append((driver, batch, len(own)))
            keys = keys or batch.keys
            write = write or batch.write
            fresh = fresh or batch.fresh  # a call of the round starts a deadline of its own
        if not self._round:
            return None
        self._confirmed = write and self._durability is not None
        if self._confirmed:
            assert self._durability is not None
            commands.append(self._durability.command())
        return Batch(tuple(commands), write, keys, fresh)

    def interrupted(self, why: str) -> None:
        """The shell stopped in the middle (a cancelled task, KeyboardInterrupt): each call
        still without its answer gets one. A write of the round in flight may have been
        applied (``unknown``); anything else was not sent (``not_applied``)."""
        self.cut(f"the pipeline was interrupted ({why})")

    def cut(self, reason: str) -> None:
        """The shell stopped waiting for this group (a patient fan's straggler, see
        :class:`~redisstore.core.driver.Fan`): each call still without its answer gets
        ``Unavailable(reason)``, ``not_applied`` (a patient fan sends no write; a write in
        flight would be ``unknown``)."""
        in_flight = {id(driver) for driver, _, _ in self._round} if self._first is None \
            else set()
        for call in self._calls:
            if call.done() or call._driver is None:
                continue
            batch = call._driver.next_batch()
            sent = id(call._driver) in in_flight and batch is not None and batch.write
            call._fail(Unavailable(reason, outcome=UNKNOWN if sent else NOT_APPLIED))

    def receive(self, got: Exchange) -> None:
        """What the batch just sent got back: each call gets its own part of it."""
        if self._first is not None:
            self._first.receive(got)
            return
        replies = got.replies
        size = sum(n for _, _, n in self._round)
        confirmation: Reply | ErrorReply | None = None
        if self._confirmed and len(replies) > size:
            confirmation = replies[size]
        at = 0
        for driver, batch, n in self._round:
            mine = replies[at:at + n]
            at += n
            lost: Lost | None = got.lost if len(mine) < n else None
            shared = self._shared.get(id(driver))
            if shared is not None:
                if shared >= len(replies):
                    mine, lost = (), got.lost or Lost(True, "no reply came back")
                else:
                    mine = (replies[shared], *mine)
            whole = len(mine) == n + (shared is not None)
            if whole and batch.write and self._durability is not None:
                if confirmation is not None:
                    mine = (*mine, confirmation)
                else:
                    lost = got.lost or Lost(True, "no confirmation came back")
            driver.receive(Exchange(tuple(mine), lost))


def by_node(ops: Iterable[Operation[Any]], durability: Durability | None,
            node_of: Callable[[str], Hashable]) -> tuple[list[Pending[Any]], list[Group]]:
    """Operations of several partitions (a :class:`~redisstore.core.partitions.Fan`), each as a
    pending call, and the groups that send them: one per node (``node_of`` a key's node),
    each one pipelined round trip. An operation with nothing to send is answered already."""
    calls = [Pending(Driver(op, durability)) for op in ops]
    nodes: dict[Hashable, list[Pending[Any]]] = {}
    for call in calls:
        batch = call._driver.next_batch() if call._driver is not None else None
        if batch is not None:
            nodes.setdefault(node_of(batch.keys[0] if batch.keys else ""), []).append(call)
    return calls, [Group(group, durability, node=node) for node, group in nodes.items()]


#: A patient fan (:class:`~redisstore.core.driver.Fan`) waits for its stragglers, once a node
#: has answered, this part of the call's deadline, and at least MIN_PATIENCE s.
PATIENCE = 0.25
MIN_PATIENCE = 0.05


def patience(timeout: int) -> float:
    """How long (s) a patient fan of a call of ``timeout`` ms waits for the nodes still
    silent once one has answered (the call's deadline bounds it too)."""
    return max(timeout / 1000 * PATIENCE, MIN_PATIENCE)


#: A node a patient fan cut is left out of the patient fans of the shell's next calls this
#: long (s); then the next one sends to it again as a probe, waited for PROBE of the
#: patience once another node has answered (a new connection's handshake must fit).
SUSPECT_FOR = 1.0
PROBE = 0.25


class Suspects:
    """The nodes a shell's patient fans cut lately (most likely hung): a breaker, so a node
    that hangs costs one call its patience, not every call. A suspect is left out of the
    patient fans of the next calls (its calls answer ``not_applied`` at once, nothing
    sent) for :data:`SUSPECT_FOR` s; then the next patient fan sends to it again, waiting
    for it a shorter while (:data:`PROBE`); an answer clears it, another cut starts the
    wait again. Only patient fans consult it: every other call is sent as it comes."""

    def __init__(self) -> None:
        self._since: dict[Hashable, float] = {}

    def plan(self, groups: list[Group], wait_more: float, now: float
             ) -> tuple[list[Group], list[float]]:
        """Of a patient fan's ``groups``: the ones to send, and how long each is waited for
        once another has answered (s); the suspects' groups are answered now (Group.cut).
        A fan whose nodes are all suspects is sent whole."""
        send: list[Group] = []
        graces: list[float] = []
        skipped: list[tuple[Group, float]] = []
        for group in groups:
            since = self._since.get(group.node)
            if since is None:
                send.append(group)
                graces.append(wait_more)
            elif now - since < SUSPECT_FOR:
                skipped.append((group, since))
            else:
                send.append(group)
                graces.append(max(wait_more * PROBE, min(MIN_PATIENCE, wait_more)))
        if not send:
            return groups, [wait_more] * len(groups)
        for group, since in skipped:
            group.cut(f"node {group.node} is left out of this call: it did not answer a "
                      f"read in time {now - since:.1f} s ago (it may hang); it is tried again "
                      f"{SUSPECT_FOR:g} s after; nothing was changed (a read)")
        return send, graces

    def heard(self, groups: list[Group], cut: list[bool], now: float) -> None:
        """What became of the ``groups`` a patient fan sent: each ``cut`` one's node is a
        suspect from ``now``; the others' nodes answered (or refused): no longer suspects."""
        for group, was_cut in zip(groups, cut, strict=True):
            if was_cut:
                self._since[group.node] = now
            else:
                self._since.pop(group.node, None)


def straggled(waited: float) -> str:
    """The reason a patient fan's straggler is left out of its call."""
    return (f"no answer within {waited * 1000:.0f} ms of the other nodes' (the node may "
            "hang): left out of this call")


class Spreading(Generic[T]):
    """Runs a :class:`~redisstore.core.driver.Spread` as the groups a shell sends::

        spreading = Spreading(spread, durability, node_of)
        while (groups := spreading.next_groups()) is not None:
            send the groups at once (a patient fan: see protocol.Fan)
        return spreading.result

    Each fan's operations are grouped by node (:func:`by_node`); once the groups are sent,
    the next call hands each operation's answer back to the spread."""

    def __init__(self, spread: Spread[T], durability: Durability | None,
                 node_of: Callable[[str], Hashable]) -> None:
        self._steps = spread.steps
        self._durability = durability
        self._node_of = node_of
        self._calls: list[Pending[Any]] | None = None
        self.result: T | None = None
        #: Whether the fan of the groups :meth:`next_groups` gave last is patient.
        self.patient = False

    def next_groups(self) -> list[Group] | None:
        """The groups to send now, or None when the call is over (its value in
        :attr:`result`)."""
        try:
            if self._calls is None:
                fan = next(self._steps)
            else:
                fan = self._steps.send([settled_of(call) for call in self._calls])
        except StopIteration as stop:
            self.result = stop.value
            return None
        self._calls, groups = by_node(fan.ops, self._durability, self._node_of)
        self.patient = fan.patient
        return groups


@dataclass(frozen=True)
class Blocked:
    """A claim queued in a pipeline with ``block``: its pending answer, its index (what it
    waits for), limit, block (ms) and the claim to send again."""

    pending: Pending[Any]
    index: str
    limit: int
    block: int
    claim: Callable[[], Operation[tuple[list[Any], int]] | Spread[tuple[list[Any], int]]]

    def answer(self, runs: list[Any] | None = None, error: StoreError | None = None) -> None:
        """The claim's answer after it waited: its runs, or the error of a claim of its."""
        if error is not None:
            self.pending._error = error
        else:
            self.pending._later = (runs,)


def settled_of(call: Pending[T]) -> Settled[T]:
    """A sent call's answer as a Settled: its value or its StoreError (any other error, a
    bug's or a discover function's, is raised)."""
    try:
        return Settled(call.result())
    except StoreError as error:
        return Settled(error=error)


class Pipelined(PipelineOps):
    """The calls a pipeline queues, for the sync and asyncio pipelines alike: each takes the
    arguments of the store method of its name, checks them at once (a bad one raises here,
    and nothing is queued) and returns a :class:`Pending`. See docs/runs.md."""

    def __init__(self, ops: RunOps | PartitionedOps, durability: Durability | None) -> None:
        self._ops = ops
        self._durability = durability
        self._calls: list[Pending[Any]] = []
        self._sent = False
        #: The claims queued with ``block``: each waits after the round trip if it got
        #: nothing (:meth:`_still_blocked`).
        self._blocked: list[Blocked] = []

    def __len__(self) -> int:
        return len(self._calls)

    # The primitives of the calls it queues (PipelineOps, generated from the core:
    # redisstore/core/pipeline_ops.py).

    def _queue_claim(self, index: str, limit: int, block: int | None,
                     claim: Callable[[], Operation[tuple[list[Any], int]]
                                     | Spread[tuple[list[Any], int]]]) -> Pending[Any]:
        wait = check_block(block)
        before = self._calls[-1] if self._calls else None
        pending = self._queue(_runs(claim()))
        if before is not None:
            self._fuse(before, pending)
        if wait and limit:
            self._blocked.append(Blocked(pending, index, limit, wait, claim))
        return pending

    def _fuse(self, first: Pending[Any], then: Pending[Any]) -> None:
        """A claim queued right after a finish, a write or a release of a store of one
        partition: one script runs both (:func:`~redisstore.core.runops.fused`), and each
        call keeps its own answer."""
        one, two = first._driver, then._driver
        if (one is None or two is None or first._part is not None
                or not fusable(one._call, two._call)):
            return
        assert one._call is not None and two._call is not None
        both = Driver(fused((one._op, one._call), (two._op, two._call)), self._durability)
        first._driver, first._part = both, 0
        then._driver, then._part = both, 1

    def _still_blocked(self, started: float) -> list[tuple[Blocked, int]]:
        """The claims queued with ``block`` that got nothing in the round trip begun at
        ``started`` (monotonic), each with the ms of its block left (more than 0)."""
        waiting = []
        for blocked in self._blocked:
            pending = blocked.pending
            if pending._error is None and pending._later is None and pending.done():
                try:
                    got = pending.result()
                except StoreError:
                    continue
                left = blocked.block - int((time.monotonic() - started) * 1000)
                if not got and left > 0:
                    waiting.append((blocked, left))
        return waiting

    def _queue(self, op: Operation[T] | Spread[T], *, write: bool = True) -> Pending[T]:
        if self._sent:
            raise RuntimeError("this pipeline was sent: start another one")
        if isinstance(op, Spread):
            raise TypeError("a pipeline of a store of several partitions takes the calls that "
                            "name one run each (get, insert, compare_and_set, delete, refresh, "
                            "now); renew, release and the claims span partitions: call them on "
                            "the store itself (one round trip per node)")
        pending = Pending(Driver(op, self._durability), write)  # checks the arguments now
        self._calls.append(pending)
        return pending

    def _alone(self) -> Driver[Any] | None:
        """The driver of the pipeline's one call (or of a finish and the claim fused with
        it), when the pipeline may send it as the store sends one call (no Group, no batch
        made: the lean path): a store of one partition whose server check passed, and the
        call not sent. Marks the pipeline sent."""
        if self._sent or not self._calls or type(self._ops) is not RunOps \
                or not self._ops.checked():
            return None
        driver = self._calls[0]._driver
        if driver is None or driver._call is None or driver.over() \
                or any(call._driver is not driver for call in self._calls):
            return None
        self._sent = True
        return driver

    def _groups(self, node_of: Callable[[str], Hashable]) -> list[Group]:
        """The calls to send, once, as one group per node (``node_of`` a key's node; one
        group unless a partitioned store's calls are on several nodes of a cluster)."""
        if self._sent:
            raise RuntimeError("this pipeline was sent already")
        self._sent = True
        nodes: dict[Hashable, list[Pending[Any]]] = {}
        for call in self._calls:
            batch = call._driver.next_batch() if call._driver is not None else None
            key = batch.keys[0] if batch is not None and batch.keys else ""
            nodes.setdefault(node_of(key), []).append(call)
        groups = []
        for calls in nodes.values():
            first, reads = None, False
            if not self._ops.checked() and any(call._write for call in calls):
                # Each group checks before its writes (the check is idempotent): a group
                # whose check fails sends none of its writes.
                first = Driver(self._ops.server_check(), None)
            elif (check := self._ops.read_check()) is not None:
                # A store of partitions checks the count before reads too.
                first, reads = Driver(check, None), True
            groups.append(Group(calls, self._durability, first, guards_reads=reads))
        return groups

    def _abandon(self) -> None:
        """The with block raised: a pipeline not sent yet never will be, and each call
        says so. (One sent already keeps every answer it got.)"""
        if self._sent:
            return
        self._sent = True
        for call in self._calls:
            call._fail(Unavailable("the pipeline was not sent: its with block raised",
                                   outcome=NOT_APPLIED))


def _runs(claim: Operation[tuple[list[Any], int]] | Spread[tuple[list[Any], int]]
          ) -> Operation[list[Any]] | Spread[Any]:
    """A claim without its wait (a Spread stays one, for _queue to refuse)."""
    return claim if isinstance(claim, Spread) else runs_only(claim)


def _copy(error: StoreError) -> StoreError:
    """A fresh instance of ``error`` for each call it answers (an exception raised from
    several places would pile up their tracebacks)."""
    fresh = copy.copy(error)
    fresh.__traceback__ = None
    return fresh
