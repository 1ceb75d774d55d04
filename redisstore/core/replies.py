"""What a script's reply means, for both ports' stores: its ``{code, payload}`` parts, and
the value or the contract's error each code answers (:func:`answer`).

Below the operations (:mod:`redisstore.core.runops`, :mod:`redisstore.core.repository_ops`)
and what a store and a repository of partitions share (:mod:`redisstore.core.placing`), so
each stands on it, not on the others (docs/design/house.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import (
    AlreadyExists,
    Conflict,
    Corrupt,
    LeaseRefused,
    Misconfigured,
    NotFound,
    SessionLapsed,
)
from .outcomes import text
from .runs import Free, Held, Holder
from .scripts import Code

#: The layout of the run store's keys that this library reads and writes (lua/_lib/keys.lua's
#: LAYOUT). A new namespace starts at it; one an older library wrote is refused until
#: ``migrate()`` moves it.
LAYOUT = 5



def holder_of(owner: Any, live: Any) -> Holder:
    """A holder from the reply shape owner|false, live 0|1."""
    if owner is None or owner is False:
        return Free()
    return Held(text(owner), bool(live))


def reply_parts(reply: Any) -> tuple[Any, Any]:
    """The (code, payload) of a ``{code, payload, dropped, next_due}`` reply, the shape of
    every script of both ports; ValueError for anything else."""
    if not isinstance(reply, list) or len(reply) < 2:
        raise ValueError("not a {code, payload} reply")
    return reply[0], reply[1]


class Uncounted(Misconfigured):
    """A partition records no partition count, and the caller's store has not checked the
    namespace's own yet (nothing was written): a store of partitions checks it
    (:meth:`redisstore.core.placing.Counted.count_check`) and sends the call again."""


def answer(run: str, namespace: str, opened: int | None = None) -> Callable[[Any], Any]:
    """A parser for ``{code, payload, ...}`` replies: the payload on OK, else the contract's
    answer (NotFound, Conflict...) or Corrupt / Misconfigured. ``opened``: the partition
    count of the store that calls (None: one partition)."""

    def parse(reply: Any) -> Any:
        code, payload = reply_parts(reply)
        if code == Code.OK:
            return payload
        if code == Code.NOT_FOUND:
            raise NotFound(run)
        if code == Code.EXISTS:
            raise AlreadyExists(run)
        if code == Code.CONFLICT:
            raise Conflict(int(payload))
        if code == Code.REFUSED:
            raise LeaseRefused(holder_of(payload[0], payload[1]))
        if code == Code.CORRUPT:
            raise Corrupt(run, text(payload))
        if code == Code.TOO_NEW:
            raise Misconfigured(
                f"namespace {namespace!r} has run layout version {int(payload)}, newer than "
                f"this library's {LAYOUT}: upgrade redisstore on this node")
        if code == Code.PARTITIONED:
            raise partitioned(namespace, int(payload), opened)
        if code == Code.UNCOUNTED:
            raise Uncounted(f"namespace {namespace!r}: a partition records no partition "
                            "count (nothing was written)")
        if code == Code.SESSION_LAPSED:
            raise SessionLapsed(text(payload))
        if code == Code.TOO_OLD:
            raise Misconfigured(
                f"namespace {namespace!r} has run layout version {int(payload)}, older than "
                f"this library's {LAYOUT}: stop every node, then call store.migrate() once "
                "with this version of redisstore (nothing was written)")
        raise ValueError(f"unknown reply code {code!r}")

    return parse


def partitioned(namespace: str, recorded: int, opened: int | None, *, what: str = "store",
                step: str = "redisstore.repartition") -> Misconfigured:
    """The refusal of a namespace whose count (``recorded``: as a partition, or the
    namespace's own meta, records it) is not ``opened``, the caller's (a ``what`` whose
    count ``step`` changes)."""
    if opened is None:
        return Misconfigured(
            f"namespace {namespace!r} is spread over {recorded} partitions: open it with "
            f"partitions={recorded} (nothing was written)")
    if recorded == 0:
        return Misconfigured(
            f"namespace {namespace!r} is being repartitioned ({step} stopped before its "
            f"end, or runs now): finish it first, then open the {what} with the new count "
            "(nothing was written)")
    return Misconfigured(
        f"namespace {namespace!r} is "
        + (f"spread over {recorded} partitions" if recorded > 1 else
           f"used by a {what} of one partition")
        + f" and this {what} was opened with partitions={opened}: open it with "
        f"partitions={recorded} (its count changed since it was opened? Nothing was "
        "written; docs/scale-out.md says how to change the count)")
