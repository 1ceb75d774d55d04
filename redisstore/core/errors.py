"""One error hierarchy for every store: a caller matches on these classes.

Infrastructure failures of any kind surface as :class:`Unavailable`, whose ``outcome`` says
whether anything was applied; :mod:`redisstore.core.outcomes` decides it from what the shells saw.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error a store raises for a refused or failed operation."""


class NotFound(StoreError):
    """The run does not exist."""

    def __init__(self, run: str = "") -> None:
        super().__init__(f"run not found: {run!r}" if run else "run not found")
        self.run = run


class AlreadyExists(StoreError):
    """``insert`` of a run that already exists; nothing was written."""

    def __init__(self, run: str = "") -> None:
        super().__init__(f"run already exists: {run!r}" if run else "run already exists")
        self.run = run


class Conflict(StoreError):
    """``compare_and_set`` with a stale revision; ``current`` is the stored one."""

    def __init__(self, current: int) -> None:
        super().__init__(f"revision conflict: stored revision is {current}")
        self.current = current


class LeaseRefused(StoreError):
    """The lease condition was refused; ``holder`` is who holds the lease now."""

    def __init__(self, holder: object) -> None:  # a runs.Holder: runs.py imports this module
        super().__init__(f"lease refused: held as {holder!r}")
        self.holder = holder


class SessionLapsed(LeaseRefused):
    """The session ``session`` is not live: it expired (no keepalive within its ttl) or
    was closed. Nothing was done; a session never comes back to life (open another)."""

    def __init__(self, session: str) -> None:
        StoreError.__init__(self, f"session {session!r} has lapsed (expired or closed)")
        self.holder = None
        self.session = session


#: ``Unavailable.outcome`` values: what became of the operation.
NOT_APPLIED = "not_applied"
UNKNOWN = "unknown"
APPLIED_UNCONFIRMED = "applied_unconfirmed"
OUTCOMES = (NOT_APPLIED, UNKNOWN, APPLIED_UNCONFIRMED)


class Unavailable(StoreError):
    """The backend could not answer.

    ``outcome`` says what became of the operation:

    - ``"not_applied"``: nothing was sent, or the server refused the call before anything
      ran (``READONLY``, ``OOM``, ``BUSY``, ``NOSCRIPT`` after every reload (and EVAL)...). Nothing
      changed: retry when the server is back.
    - ``"unknown"``: a write was sent and its reply was lost (cut, timeout): it was applied
      entirely or not at all. Read the run back (:func:`redisstore.confirm_write`) before
      deciding.
    - ``"applied_unconfirmed"``: the write was applied on the primary, but its
      :class:`~redisstore.Durability` confirmation failed: it may be lost on failover.

    ``code`` is the server's error code (``"READONLY"``, ``"NOPERM"``...), or None when the
    failure was not an error reply (a refused or lost connection, a deadline).

    ``done`` and ``unanswered``: of ``renew`` or ``release`` over partitions whose
    partitions did not all answer, the runs the partitions that answered renewed (or
    released), and the runs of the partitions that failed (their outcome is this error's,
    or its ``__cause__``'s), each in the call's order; the other runs of the call were
    answered without (not held). None for every other error.
    """

    def __init__(self, reason: str, *, code: str | None = None,
                 outcome: str = UNKNOWN) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.outcome = outcome
        self.done: list[str] | None = None
        self.unanswered: list[str] | None = None


class Corrupt(StoreError):
    """The run's stored data fails validation (a foreign write, a damaged key): ``field``
    names what is wrong. Nothing was written. See docs/faults.md for finding and repairing
    damaged runs."""

    def __init__(self, run: str, field: str) -> None:
        # Without a run: the namespace's own data (its meta key, an index) is damaged.
        super().__init__(f"run {run!r} is corrupt: {field}" if run else
                         f"the namespace's data is corrupt: {field}")
        self.run = run
        self.field = field


class ConcurrentUpdate(StoreError):
    """Repository ``save`` whose ``rec_version`` does not match the stored one."""

    def __init__(self, id: str, expected: int, stored: int) -> None:
        super().__init__(
            f"concurrent update of {id!r}: expected rec_version {expected}, stored {stored}"
        )
        self.id = id
        self.expected = expected
        self.stored = stored


class UnknownGroup(StoreError):
    """Repository ``save`` with a group that was never registered."""

    def __init__(self, group: str) -> None:
        super().__init__(f"unknown engine group: {group!r}; call register_group first")
        self.group = group


class Misconfigured(StoreError):
    """The server is set up so that the store cannot keep its promises (raised by ``migrate``).

    For instance an eviction policy that may drop the store's keys under memory pressure, or
    a namespace laid out by a newer version of the library. The message names the setting
    and the fix.
    """


class Closed(StoreError, RuntimeError):
    """A call on a :class:`~redisstore.Keeper` (or ``AsyncKeeper``) that is closed, or that
    stopped on an error (then its ``__cause__``): nothing was done. Also a ``RuntimeError``,
    as the keeper raised before it had this class."""


class Compacted(StoreError):
    """``changes(after=cursor)`` where entries past ``cursor`` are gone: trimmed by the
    feed's retention, lost in a failover, or dropped by a repartition. Nothing is skipped
    silently: ``resume`` is the cursor to read on from (the oldest entries still retained
    where entries were lost, the cursor's own positions elsewhere), ``after`` the one
    given, ``reason`` what was found."""

    def __init__(self, after: str, resume: str, reason: str = "") -> None:
        super().__init__(f"the change feed past this cursor is gone ({reason}); "
                         f"resume from {resume!r}" if reason else
                         f"the change feed past this cursor is gone; resume from {resume!r}")
        self.after = after
        self.resume = resume
        self.reason = reason
