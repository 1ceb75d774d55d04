"""Where a run is among partitions (:func:`partition_of`), and what a store and a
repository of partitions share (:class:`Counted`: the namespace's count, checked and carried
by every call; :func:`values_of`: a fan's answers or its error).

Below both (:mod:`redisstore.core.partitions`, :mod:`redisstore.core.partitioned_repository`),
so the repository over partitions does not stand on the run store's (docs/design/house.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from . import scripts
from .driver import Call, Operation, Settled, Steps, ask, fan, fanned, preceded
from .errors import NOT_APPLIED, UNKNOWN, Misconfigured, StoreError, Unavailable
from .keys import Keyspace
from .replies import Uncounted, answer
from .runs import Cap, check_int

T = TypeVar("T")
C = TypeVar("C", bound="Counted")

#: The most partitions one store spreads over: a claim reads every partition's head.
MAX_PARTITIONS = int(Cap.MAX_PARTITIONS)


def check_partitions(partitions: object) -> int:
    """A store's ``partitions`` option: an int in [1, MAX_PARTITIONS]."""
    return check_int("partitions", partitions, minimum=1, maximum=MAX_PARTITIONS)


def family_of(run: str) -> str:
    """The part of a run id that chooses its partition: what lies between its first ``{``
    and the next ``}`` when that is not empty (as a cluster's hash tag), else the whole id.
    Runs of one family are always in one partition."""
    start = run.find("{")
    if start >= 0:
        end = run.find("}", start + 1)
        if end > start + 1:
            return run[start + 1:end]
    return run


def partition_of(run: str, partitions: int) -> int:
    """The partition of ``run`` in a store of ``partitions``: CRC-32 of its family, modulo
    the count (stable across processes, versions and platforms)."""
    if partitions == 1:
        return 0
    return zlib.crc32(family_of(run).encode("utf-8", "surrogateescape")) % partitions


def worst(errors: list[StoreError], *, applied: bool) -> StoreError:
    """The error of a call over partitions whose parts failed with ``errors``. When another
    part applied the call (``applied``), or a failed part may have, the whole call's outcome
    is unknown: ``Unavailable(outcome="unknown")``, the first error its cause. Else an answer
    of the contract (``Corrupt``, ``Misconfigured``...) comes first, then the first
    ``Unavailable`` (nothing was applied anywhere)."""
    maybe = [e for e in errors if isinstance(e, Unavailable) and e.outcome != NOT_APPLIED]
    if not applied and not maybe:
        contract = [e for e in errors if not isinstance(e, Unavailable)]
        return (contract or errors)[0]
    if not applied and len(errors) == 1:
        return errors[0]  # one part, its outcome unknown: its own error says it
    cause = maybe[0] if maybe else errors[0]
    reason = getattr(cause, "reason", str(cause))
    unknown = Unavailable(
        f"{len(errors)} of the call's partitions failed ({type(cause).__name__}: {reason})"
        + ("; the others applied it" if applied else ""), code=getattr(cause, "code", None),
        outcome=UNKNOWN)
    unknown.__cause__ = cause
    return unknown


def values_of(answers: list[Settled[Any]], *, write: bool = False,
            applied: bool = False) -> list[Any]:
    """The answers of a fan, or the error of the call: of a ``write``, unknown when another
    part, or a step before (``applied``), may have applied it
    (:func:`worst`); of a read, the first answer of the contract
    (``Corrupt``...), else the first failure."""
    errors: list[StoreError] = []
    for got in answers:
        if got.error is not None:
            if not isinstance(got.error, StoreError):
                raise got.error
            errors.append(got.error)
    if errors:
        raise worst(errors, applied=write and (applied or len(errors) < len(answers)))
    return [got.value for got in answers]


class Counted:
    """What a store and a repository of partitions share: the namespace's own keys, their
    count, its check there (:meth:`count_check`), and each partition's compare of the count
    it records with this one's, carried by every call (:meth:`_counted`, :meth:`_fan`)."""

    #: The partition count, and the namespace's own keys ``{namespace}`` (its meta key
    #: holds the count; the data is in the partitions' keys, ``{namespace#p}``).
    n: int
    keys: Keyspace
    #: Each partition's operations (each with ``keys``, ``arg1`` and ``opened``).
    parts: list[Any]
    #: Whether :meth:`count_check` has passed for this store.
    counted: bool = False
    #: What the messages call this object, and say of changing its count.
    what = "store"
    changing = "docs/scale-out.md says how to change the count"
    #: The step that changes the count (its name in the messages).
    step = "redisstore.repartition"

    def _count_script(self) -> tuple[scripts.Script, tuple[str, ...]]:
        """The script that checks and records the count, and its keys: the runs' count
        (``run_partitions``, in the namespace's meta key). The repository's is apart."""
        k = self.keys
        return scripts.RUN_PARTITIONS, (k.meta, k.leases)

    def count_check(self) -> Operation[None]:
        """Refuse a namespace spread over another number of partitions than this one's, or
        used by a store or repository of one partition; record the count in a namespace not
        used yet (one script, checks then writes: of two that race, one is refused)."""
        if self.counted:
            return
        k = self.keys
        script, keys = self._count_script()
        # A write (it may record the count): a lost reply is of unknown outcome.
        recorded = yield from ask(Call(script, keys, (k.prefix, self.n),
                                       answer("", k.namespace)))
        if int(recorded) == 0:
            raise Misconfigured(
                f"namespace {k.namespace!r} is being repartitioned ({self.step} "
                "stopped before its end, or runs now): finish it first (nothing was "
                "written)")
        if int(recorded) != self.n:
            raise Misconfigured(
                f"namespace {k.namespace!r} is "
                + (f"spread over {int(recorded)} partitions" if int(recorded) > 1 else
                   f"used by a {self.what} of one partition")
                + f" and this {self.what} was opened with partitions={self.n}: open it with "
                f"partitions={int(recorded)} (nothing was written; {self.changing})")
        self.counted = True
        self._now_counted()

    def _tail(self, tail: str) -> None:
        """What every partition's scripts get after the key prefix in ARGV[1]: the count
        (``"6"``: the partition compares it with the one it records; ``"6+"`` once the
        namespace's own count was checked: and records it where none is; ``"*"``: a
        repartition's own calls, which compare nothing)."""
        for part in self.parts:
            part.arg1 = part.keys.prefix + tail

    def _now_counted(self) -> None:
        """Once the count check passed, the scripts ask the partitions to record it."""
        self._tail(f"{self.n}+")

    def repartitioning(self: C) -> C:
        """These operations as :func:`redisstore.repartition` (or
        :func:`redisstore.repartition_repository`) sends them: its calls work while the
        partitions are marked, or record another count."""
        self._tail("*")
        return self

    def _checked(self, make: Callable[[], Operation[T]], part: Any = None) -> Operation[T]:
        """The operation ``make()`` makes, in one partition; before a write (``part``, the
        partition written) that partition's server check, once (on a cluster per partition,
        on its own node: no node is checked for another's writes)."""
        op = make()
        if part is not None and not part.checked():
            op = preceded(part.server_check(), op)  # its argument checks first
        return (yield from op)

    def _counted(self, make: Callable[[], Operation[T]], part: Any = None) -> Operation[T]:
        """:meth:`_checked`; if the partition records no count and this store has not
        checked the namespace's own, that check (:meth:`count_check`, on the namespace's
        node), then the operation again (nothing was written). A partition that records
        the count needs no call elsewhere. Once the count check passed, the calls ask the
        partitions to record it: the one sent again is never answered so."""
        try:
            return (yield from self._checked(make, part))
        except Uncounted:
            pass  # made before the count check passed (a pipeline's), or none passed yet
        yield from self.count_check()
        return (yield from self._checked(make, part))

    def _fan(self, calls: list[tuple[Callable[[], Operation[Any]], Any]], *,
             patient: bool = False) -> Steps[list[Settled[Any]]]:
        """A fan of :meth:`_checked` operations (each in its partition, on its node); those
        answered :class:`~redisstore.core.replies.Uncounted` go again, in a fan of their own,
        after the count check (itself a fan of its own: a fan's operation stays on its
        node). When the count check fails, they fail with its error: the others' answers
        stand. ``patient``: see :class:`~redisstore.core.driver.Fan`."""
        answers = yield from fan((self._checked(make, part) for make, part in calls),
                                 patient=patient)
        again = [i for i, got in enumerate(answers) if isinstance(got.error, Uncounted)]
        if not again:
            return answers
        try:
            yield from fanned(self.count_check())
        except StoreError as error:
            for i in again:
                answers[i] = Settled(error=error)
            return answers
        redo = yield from fan((self._checked(*calls[i]) for i in again), patient=patient)
        for i, got in zip(again, redo, strict=True):
            answers[i] = got
        return answers


def deferred(call: Callable[..., Operation[T]], *args: Any) -> Callable[[], Operation[T]]:
    """``call(*args)``, made when called (each time: a call sent again is made again)."""
    return lambda: call(*args)
