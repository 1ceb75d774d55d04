"""What the shells report, as neutral values, and what it means: the table of error code x
phase that decides every :class:`~redisstore.Unavailable`'s ``outcome``.

A shell sends one :class:`~redisstore.core.driver.Batch` and reports an :class:`Exchange`: the
replies it read (each a :class:`Reply` or an :class:`ErrorReply`) and, if the exchange broke,
a :class:`Lost` that says whether anything had been sent. Nothing here knows a client
library: no exception classes, no option names. docs/faults.md shows the same table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import APPLIED_UNCONFIRMED, NOT_APPLIED, UNKNOWN, Unavailable


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply the server sent (undecoded: bytes, ints, lists)."""

    value: Any


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error reply: its code (``ERR``, ``READONLY``...) and the text after it."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code} {self.message}" if self.code else self.message


@dataclass(frozen=True, slots=True)
class Lost:
    """The exchange broke: ``sent`` says whether any byte of the batch had left; the replies
    read before it broke are in the :class:`Exchange`. ``timed_out`` when the call's
    deadline cut it."""

    sent: bool
    reason: str
    timed_out: bool = False
    #: The server's error code when the server refused the connection itself (a handshake
    #: answered LOADING, NOAUTH...); None for a failure of the link.
    code: str | None = None


@dataclass(frozen=True, slots=True)
class Exchange:
    """What one batch got back: a reply per command read, then (maybe) how it broke."""

    replies: tuple[Reply | ErrorReply, ...]
    lost: Lost | None = None


# ---------------------------------------------------------------------------- the table

#: Codes the server answers before a script runs, or at a script's first write (which the
#: scripts make only after every read and check): nothing was applied.
REFUSED = frozenset({
    "NOSCRIPT", "BUSY", "LOADING", "READONLY", "OOM", "NOREPLICAS", "MISCONF", "CLUSTERDOWN",
    "TRYAGAIN", "MASTERDOWN", "MOVED", "ASK", "CROSSSLOT", "NOAUTH", "WRONGPASS", "NOPERM",
    "EXECABORT", "UNKILLABLE", "NOTBUSY", "BADARG", "ABORTED",
})

# Redis 6.2 wraps an error raised inside a script: "ERR Error running script (call to
# f_...): @user_script:91: -READONLY You can't write...". The code is after the dash.
_WRAPPED = re.compile(r"@user_script: ?\d+: -([A-Z]+) ")
# The library's scripts raise "BADARG ..." (bad arguments) or "ABORTED ..." (a read of the
# check phase failed, e.g. a cluster key that moved away) before their first write, as a
# plain string (Redis 6.2 cannot raise a table), which the server prefixes with
# "ERR user_script:12: " (fakeredis: '[string "..."]:12: ').
_OURS = re.compile(r"(?:user_script: ?\d+|\[string \"[^\"]*\"\]:\d+): (BADARG|ABORTED) ")
# An error raised by a command a script called (Redis >= 7 appends where it happened).
_IN_SCRIPT = re.compile(r"script: [0-9a-f]{40}, on @user_script:\d+\.?$")


def split_error(text: str) -> ErrorReply:
    """An error reply's text as (code, message), reading Redis 6.2's wrapped codes."""
    wrapped = _WRAPPED.search(text) or _OURS.search(text)
    if wrapped:
        return ErrorReply(wrapped.group(1), text)
    first, _, rest = text.partition(" ")
    if first.isupper() and first.replace("_", "").isalpha():
        return ErrorReply(first, rest)
    return ErrorReply("", text)


def _inside_script(error: ErrorReply) -> bool:
    return bool(_IN_SCRIPT.search(error.message)) or "Error running script" in error.message \
        or "user_script" in error.message


def error_outcome(error: ErrorReply, *, write: bool) -> str:
    """The outcome of a call answered by ``error``.

    A refusal of the list above means nothing ran; so does any error of a read. For a write,
    an error raised inside a script after its checks (a denied write command, a runtime
    error) may follow a write of that script: unknown.
    """
    if not write:
        return NOT_APPLIED
    if error.code in REFUSED and not (error.code == "NOPERM" and _inside_script(error)):
        return NOT_APPLIED
    if "unknown command" in error.message:
        return NOT_APPLIED
    return UNKNOWN


def hint(error: ErrorReply) -> str:
    """What to do about an error, where the library knows."""
    text = str(error).lower()
    if "unknown command" in text and "evalsha" in text:
        return (" (this server runs no Lua scripts; with fakeredis install its Lua extra: "
                "pip install 'fakeredis[lua]')")
    if error.code == "NOPERM" and "key" in text:
        return (" (the ACL user may not touch this namespace's keys: redisstore.acl_rule("
                "namespace) gives the rule that confines a user to its namespace, "
                "acl_rule(namespace, partitions=N) for a store or repository of N "
                "partitions)")
    if "can't run this command" in text or error.code == "NOPERM":
        return (" (the ACL user lacks a command the store needs: redisstore.acl_rule("
                "namespace) lists them: EVALSHA, EVAL, SCRIPT LOAD and the commands its "
                "scripts call)")
    return ""


def refused(error: ErrorReply, *, write: bool, doing: str = "",
            shown: str | None = None) -> Unavailable:
    """The Unavailable an error reply stands for. ``shown`` is the error's text as the
    caller should read it (a script's lines mapped to its files); the outcome is judged on
    the server's own text."""
    outcome = error_outcome(error, write=write)
    tail = {NOT_APPLIED: "nothing was applied", UNKNOWN: "the write's outcome is unknown"}
    what = f"{doing}: " if doing else ""
    text = str(error) if shown is None else shown
    return Unavailable(f"{what}server error: {text}{hint(error)}; {tail[outcome]}",
                       code=error.code or None, outcome=outcome)


def lost(lost: Lost, *, write: bool) -> Unavailable:
    """The Unavailable a broken exchange stands for: nothing sent is not applied; a write
    sent whose reply never came is unknown; a read changed nothing."""
    if not lost.sent or not write:
        outcome, tail = NOT_APPLIED, "nothing was applied"
        if lost.sent:
            tail = "nothing was changed (a read)"
    else:
        outcome, tail = UNKNOWN, "the write's outcome is unknown"
    prefix = f"server refused the connection ({lost.code}): " if lost.code else ""
    return Unavailable(f"{prefix}{lost.reason}; {tail}", code=lost.code, outcome=outcome)


def unconfirmed(reason: str) -> Unavailable:
    """A write applied on the primary whose durability confirmation failed."""
    return Unavailable(f"write applied but not confirmed: {reason}; it may be lost on "
                       "failover", outcome=APPLIED_UNCONFIRMED)


# Here, with what the shells report, so what a reply means (core/replies.py) stands below
# the Driver.
def text(value: Any) -> str:
    """A reply string as str (replies come undecoded). Bytes that are not UTF-8 (a run id a
    raw EVALSHA stored) decode with surrogateescape, so a claim that took such a run still
    answers, and the name sent back names the same key."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)
