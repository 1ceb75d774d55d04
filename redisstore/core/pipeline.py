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

import time
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from .driver import Driver, Durability, Operation, Pending, Spread, continued
from .errors import NOT_APPLIED, StoreError, Unavailable
from .groups import Group
from .partition_ops import PartitionOps
from .pipeline_ops import PipelineOps
from .runops import RunOps, fusable, fused, runs_only
from .waits import check_block

T = TypeVar("T")


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


# What a pipeline's send asks of its shell, one step at a time: the order of the steps is
# written once (Pipelined._sending); each shell makes them its own way (the sync one on this
# thread, group after group; the asyncio one awaited, every group at once).
@dataclass(frozen=True, slots=True)
class Drive:
    """Send one operation as the store sends one call; answers its value."""

    op: Operation[Any]


@dataclass(frozen=True, slots=True)
class SendGroups:
    """Send ``groups``, one round trip each; every call of theirs then has its answer."""

    groups: list[Group]


@dataclass(frozen=True, slots=True)
class ClaimAgain:
    """Claim again, waiting up to ``left`` ms, for a claim queued with ``block`` that got
    nothing in the round trip; answers its runs."""

    blocked: Blocked
    left: int


SendStep: TypeAlias = Drive | SendGroups | ClaimAgain


class Pipelined(PipelineOps):
    """The calls a pipeline queues, for the sync and asyncio pipelines alike: each takes the
    arguments of the store method of its name, checks them at once (a bad one raises here,
    and nothing is queued) and returns a :class:`Pending`. See docs/runs.md."""

    #: Its operations: one partition's or a store of partitions' (typed by the generated
    #: ``PartitionOps``, not ``PartitionedOps``: a pipeline stands below the partitions).
    _ops: RunOps | PartitionOps

    def __init__(self, ops: RunOps | PartitionOps, durability: Durability | None) -> None:
        self._ops = ops
        self._durability = durability
        self._calls: list[Pending[Any]] = []
        self._sent = False
        #: The claims queued with ``block``: each waits after the round trip if it got
        #: nothing (:meth:`_still_blocked`).
        self._blocked: list[Blocked] = []
        #: The call :meth:`_lone` gave its shell to drive.
        self._one: Driver[Any] | None = None

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

    def _lone(self, alone: bool = True) -> Operation[Any] | None:
        """The pipeline's one call as the store sends one call (:meth:`_alone`), when
        nothing follows its answer (no claim queued with ``block``): a worker's unit, a
        finish and the next claim. The shells drive it themselves, then settle it with
        :meth:`_settle_lone`: no steps of :meth:`_sending` (their generator cost the asyncio
        unit 7% of its client CPU). None: :meth:`_sending`'s."""
        if not alone or self._blocked:
            return None
        one = self._alone()
        if one is None:
            return None
        assert one._call is not None
        self._one = one
        return continued(one._op, one._call)

    def _settle_lone(self, value: Any = None, error: StoreError | None = None) -> None:
        """The answer (or error) of the call :meth:`_lone` gave."""
        assert self._one is not None, "_lone first"
        if error is None:
            self._one.settled(value)
        else:
            self._one.settled(error=error)

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

    def _sending(self, node_of: Callable[[str], Hashable], started: float, *,
                 alone: bool = True) -> Generator[SendStep, Any, None]:
        """The steps of ``send``, for the sync and asyncio pipelines alike: the pipeline's one
        call as the store sends it (``alone``: where the shell may), else a group per node
        (``node_of``); then each claim queued with ``block`` that got nothing waits for
        work, what is left of its block since ``started``. A call's error is its answer."""
        one = self._alone() if alone else None
        if one is not None:
            assert one._call is not None
            try:
                one.settled((yield Drive(continued(one._op, one._call))))
            except StoreError as error:
                one.settled(error=error)
        groups = [] if one is not None else self._groups(node_of)
        if groups:
            yield SendGroups(groups)
        for blocked, left in self._still_blocked(started):
            try:
                blocked.answer((yield ClaimAgain(blocked, left)))
            except StoreError as error:
                blocked.answer(error=error)

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
