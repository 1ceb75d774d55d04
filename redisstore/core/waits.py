"""What a claim waits for and takes: the kinds of work (:data:`KINDS`), ``block``'s check, a share.

A claimer waits for ready runs (``claim_ready``'s kind, ``READY``), expired leases
(``claim_expired``'s, ``LEASES``) or either (``claim``'s, ``ANY``); the shells' waiting
(:mod:`redisstore.shells.wakeups`) and the memory reference queue their claims by these.
"""

from __future__ import annotations

from typing import NamedTuple

from .runs import check_int

#: The two kinds of work a claimer waits for: ``claim_ready``'s and ``claim_expired``'s.
READY, LEASES = "ready", "leases"
#: ``claim``'s: either kind. Its claims wait in a queue of their own, woken by a token of
#: either kind (whichever claim of the two queues waited longest goes first) and by a due
#: time of either index.
ANY = "any"
#: The wake keys (and wakers) a claim of each kind waits on.
KINDS: dict[str, tuple[str, ...]] = {READY: (READY,), LEASES: (LEASES,), ANY: (READY, LEASES)}
#: The longest ``block`` (ms): one day.
MAX_BLOCK = 86_400_000


def check_block(block: object) -> int:
    """``block``: None (do not wait) or an int of ms in [0, MAX_BLOCK]."""
    return 0 if block is None else check_int("block", block, minimum=0, maximum=MAX_BLOCK)


# Here, below the operations: the partitions' mixin (core/partition_ops.py) types a claim's
# share without standing on RunOps.
class Share(NamedTuple):
    """A claim's part in one partition: at most ``limit`` runs, ``budget`` bytes of records
    (0: ids only); ``strict``: the first run too must fit the budget."""

    limit: int
    budget: int
    strict: bool = False


# Here, below both the wakers' queues (shells/wakeups.py) and the client adapters that
# decide it (shells/clients.py), so neither stands on the other.
class Refused(Exception):
    """The server refuses sharded pub/sub for good (Redis 6.2 has none; a user without the
    command or the channels): the store's waker listens per partition instead."""
