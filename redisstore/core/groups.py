"""Calls sent together, by node: a :class:`Group` is one pipelined round trip of many
calls' batches (a pipeline's, or a spread's share of one node); :func:`by_node` makes them;
:class:`Spreading` runs a call over many partitions (a :class:`~redisstore.core.driver.Fan`)
by node, and :class:`Suspects` cuts a silent node short. Sans-I/O: the shells send the
groups (one after another on the sync transport, at once on the asyncio one).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from .driver import Batch, Driver, Durability, Operation, Pending, Settled, Spread
from .errors import NOT_APPLIED, UNKNOWN, StoreError, Unavailable
from .outcomes import ErrorReply, Exchange, Lost, Reply

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


def settled_of(call: Pending[T]) -> Settled[T]:
    """A sent call's answer as a Settled: its value or its StoreError (any other error, a
    bug's or a discover function's, is raised)."""
    try:
        return Settled(call.result())
    except StoreError as error:
        return Settled(error=error)


def _copy(error: StoreError) -> StoreError:
    """A fresh instance of ``error`` for each call it answers (an exception raised from
    several places would pile up their tracebacks)."""
    fresh = copy.copy(error)
    fresh.__traceback__ = None
    return fresh
