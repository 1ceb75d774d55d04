"""One error hierarchy for every store: a caller matches on these classes.

Infrastructure failures of any kind surface as :class:`Unavailable`; the pure helpers at
the bottom turn redis-py's exceptions into it, so the sync and async shells share them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runs import Holder


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

    def __init__(self, holder: Holder) -> None:
        super().__init__(f"lease refused: held as {holder!r}")
        self.holder = holder


class Unavailable(StoreError):
    """The backend could not answer. For a write, its outcome is unknown.

    After an ``Unavailable`` write, read the run back (see
    :func:`redisstore.confirm_write`) before deciding whether it happened.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


# Server error codes that mean "the server could not run this now". They all become
# Unavailable; anything else from a script is a bug or a broken script, also Unavailable.
# The first group turns a command away before a script writes anything: a script that hits
# READONLY, OOM or NOREPLICAS fails at its first write, which the server refuses. For the
# rest the outcome of a write is unknown.
_REFUSED = ("READONLY", "LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "MOVED",
            "ASK", "OOM", "NOREPLICAS")
_TRANSIENT = (*_REFUSED, "NOTBUSY", "UNKILLABLE")

# redis-py turns some codes into classes and strips the code from the message; older
# versions keep no ``status_code``, so the class name says it.
_CODES_BY_CLASS = {
    "ReadOnlyError": "READONLY", "BusyLoadingError": "LOADING", "OutOfMemoryError": "OOM",
    "ClusterDownError": "CLUSTERDOWN", "TryAgainError": "TRYAGAIN",
    "MasterDownError": "MASTERDOWN", "MovedError": "MOVED", "AskError": "ASK",
}


def error_code(exc: BaseException) -> str:
    """The server's error code of a reply error (``READONLY``, ``OOM``...), or ''."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    for cls in type(exc).__mro__:
        if cls.__name__ in _CODES_BY_CLASS:
            return _CODES_BY_CLASS[cls.__name__]
    first = str(exc).split(" ", 1)[0]
    return first if first.isupper() else ""


def unavailable(exc: BaseException, *, write: bool) -> Unavailable:
    """Translate a redis-py (or socket) exception into :class:`Unavailable`.

    ``write`` says whether the failed command could have changed data, so the reason tells
    the caller whether the outcome is unknown or simply that nothing was read.
    """
    text = str(exc) or type(exc).__name__
    kind = error_code(exc)
    outcome = "; the write's outcome is unknown" if write else ""
    if kind in _REFUSED:
        return Unavailable(f"server refused ({kind}): {text}; nothing was applied")
    if kind in _TRANSIENT:
        return Unavailable(f"server error ({kind}): {text}{outcome}")
    return Unavailable(f"{type(exc).__name__}: {text}{outcome}")


def is_noscript(reply: object) -> bool:
    """Whether a reply is the server's NOSCRIPT error (the script is not loaded: nothing
    ran). Matched by class name, so this module needs no client library: redis-py and
    valkey-py both raise a ``NoScriptError``."""
    return isinstance(reply, BaseException) and any(
        cls.__name__ == "NoScriptError" for cls in type(reply).__mro__)


class Misconfigured(StoreError):
    """The server is set up so that the store cannot keep its promises (raised by ``migrate``).

    For instance an eviction policy that may drop the store's keys under memory pressure, or
    a namespace laid out by a newer version of the library. The message names the setting
    and the fix.
    """
