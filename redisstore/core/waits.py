"""What a blocked claim waits for: the kinds of work (:data:`KINDS`) and ``block``'s check.

A claimer waits for ready runs (``claim_ready``'s kind, ``READY``), expired leases
(``claim_expired``'s, ``LEASES``) or either (``claim``'s, ``ANY``); the shells' waiting
(:mod:`redisstore.shells.wakeups`) and the memory reference queue their claims by these.
"""

from __future__ import annotations

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
