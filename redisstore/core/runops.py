"""The run store's operations as pure generators of calls (sans-I/O), and what their
scripts' replies mean. The sync and async stores drive the same generators.

Every script answers ``{code, payload, dropped, next_due}`` (see lua/_lib/keys.lua); the codes are
named once, in :class:`redisstore.core.scripts.Code` (re-exported here as :class:`Code`), from
which the build writes them into the scripts.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar, overload

from . import scripts, telemetry
from .driver import (
    EVICTING,
    Arg,
    Call,
    Durability,
    Operation,
    Settled,
    Spread,
    ask,
    eviction_policy,
    parsed,
    preceded,
    text,
)
from .errors import (
    APPLIED_UNCONFIRMED,
    NOT_APPLIED,
    Conflict,
    Corrupt,
    Misconfigured,
    StoreError,
    Unavailable,
)
from .feed import (
    MINUTE_MS,
    Changes,
    Entry,
    Feed,
    Found,
    Position,
    Rate,
    check_changes,
    check_minutes,
    decode,
    gap,
)
from .feed import Kind as EventKind
from .feed import answer as feed_answer
from .keys import Keyspace
from .replies import LAYOUT as LAYOUT
from .replies import Uncounted as Uncounted
from .replies import answer as answer
from .replies import holder_of, reply_parts
from .runs import (
    MAX_CLAIM_BYTES,
    MAX_RENEW,
    Changed,
    Claim,
    Claimed,
    ClaimInfo,
    Current,
    Discover,
    Failure,
    Fenced,
    Hold,
    InSession,
    Kept,
    Lease,
    Poll,
    Quarantined,
    Seize,
    SessionInfo,
    Wait,
    check_failure,
    check_fenced,
    check_flag,
    check_lease,
    check_limit,
    check_listing_limit,
    check_max_record,
    check_max_takeovers,
    check_migrate_count,
    check_new_lease,
    check_owner,
    check_projection_version,
    check_record,
    check_revision,
    check_run,
    check_runs,
    check_ttl,
    check_wait,
)
from .waits import ANY, LEASES, READY
from .waits import KINDS as KINDS
from .waits import Share as Share

log = logging.getLogger(__name__)
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
#: What an operation is (see :class:`Spec`).
Kind: TypeAlias = Literal["read", "write", "claim"]


@dataclass(frozen=True)
class Spec:
    """How the rest of the package derives an operation of :class:`RunOps`:
    redisstore/build/ops.py writes the stores', the pipelines' and the store of partitions'
    methods from it (and from the operation's signature and docstring).

    ``kind``: ``"read"`` (no server check first), ``"write"``, or ``"claim"`` (a write that
    answers (runs, wait): the stores hand back the runs and take ``block=ms``).
    ``route``, in a store of partitions: ``"first"`` (partition 0's), ``"one:<arg>"`` (the
    partition of the run ``<arg>``), ``"each:<arg>"`` (the runs of ``<arg>`` by partition,
    one call in each), ``"claim:<index>"`` (a claim over every partition's ``<index>``,
    each share by ``<claim>_call``), ``"own"`` (PartitionedOps writes its own).
    ``pipeline``: whether a pipeline queues it; ``queued``: what its docstring adds there.
    """

    kind: Kind
    route: str
    pipeline: bool = True
    queued: str = ""


def operation(kind: Kind, route: str, *, pipeline: bool = True,
              queued: str = "") -> Callable[[F], F]:
    """Mark a method of :class:`RunOps` as a public operation of the run store (see
    :class:`Spec`); the method itself is unchanged."""
    spec = Spec(kind, route, pipeline, queued)

    def mark(method: F) -> F:
        method.__operation__ = spec  # type: ignore[attr-defined]
        return method

    return mark


#: The longest ``XREAD BLOCK`` a blocked ``changes`` sends at a time (ms): below every
#: store's call deadline; it reads again and waits again until its ``block`` is over.
FEED_WAIT = 1000

#: A script reply's status code: defined in scripts, the one place the Lua side gets them too.
Code = scripts.Code


def with_wait(parse: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, int]]:
    """A claim's parser: its payload and its wait (``{code, payload, dropped, wait}``): ms
    until the index has a claimable entry, 0 when one is left now, -1 when none is
    indexed."""

    def parsed(reply: Any) -> tuple[Any, int]:
        payload = parse(reply)
        dropped = reply[2] if len(reply) > 2 else 0
        if type(dropped) is int and dropped > 0:
            log.warning("redisstore: a claim moved %d damaged index entries to the "
                        "quarantine (store.quarantined() lists them; docs/faults.md says how "
                        "to repair)", dropped)
        wait = reply[3] if len(reply) > 3 else -1
        return payload, wait if type(wait) is int and wait >= -1 else -1

    return parsed


#: The scripts that run a finish, a write or a release and then a claim, as one: by the
#: first's script (lua/run_*_claim.lua).
FUSED = {scripts.RUN_FINISH.name: scripts.RUN_FINISH_CLAIM,
         scripts.RUN_COMPARE_AND_SET.name: scripts.RUN_CAS_CLAIM,
         scripts.RUN_RELEASE.name: scripts.RUN_RELEASE_CLAIM}
#: The claim scripts such a script runs second, and the kind it names each by: every
#: ``@operation("claim", "claim:<kind>")`` of :class:`RunOps`, by the script it sends
#: (``run_<operation>``); made below the class (:func:`claim_kinds`).
CLAIM_KINDS: dict[str, str] = {}
#: Each kind's claim script, by name: :data:`CLAIM_KINDS` the other way round. A session's
#: claim names its kind (``any``, ``ready``, ``leases``), and sends that kind's script.
CLAIM_SCRIPTS: dict[str, str] = {}


def fusable(first: Call[Any] | None, then: Call[Any] | None) -> bool:
    """Whether ``first`` (a finish, a write or a release) and the claim ``then`` go in one
    script: both of one namespace of one partition (a store of partitions never fuses)."""
    return (first is not None and then is not None and first.script is not None
            and then.script is not None and first.script.name in FUSED
            and then.script.name in CLAIM_KINDS and bool(first.args) and bool(then.args)
            and first.args[0] == then.args[0] and "#" not in str(first.args[0]))


def _resume(op: Operation[T], settled: Settled[Any]) -> Operation[Settled[T]]:
    """The rest of ``op``, which yielded a call whose answer is ``settled``: its own further
    calls, then its value or its StoreError."""
    try:
        call = op.send(settled)
        while True:
            call = op.send((yield call))
    except StopIteration as stop:
        return Settled(stop.value)
    except StoreError as error:
        return Settled(error=error)


def fused(first: tuple[Operation[Any], Call[Any]], then: tuple[Operation[Any], Call[Any]]
          ) -> Operation[tuple[Settled[Any], Settled[Any]]]:
    """Two operations, each stepped to its first call (:func:`fusable`: a finish, a write or
    a release, then a claim), as one: one script runs both calls, and each operation goes on
    with its own answer; the answer of each (its value, or its error). When the first call
    is refused (anything but OK), the script runs no claim, and the claim is sent alone after
    it: answers and errors are those of the two calls, one after the other."""
    (op1, c1), (op2, c2) = first, then
    assert c1.script is not None and c2.script is not None
    parts: list[tuple[Settled[Any], Settled[Any] | None]] = []

    def split(reply: Any) -> tuple[Settled[Any], Settled[Any] | None]:
        if not isinstance(reply, list) or len(reply) != 2:
            raise ValueError("not a {first, claim} reply")
        claim = reply[1]
        pair = (parsed(c1, reply[0]),
                None if claim is None or claim is False else parsed(c2, claim))
        parts.append(pair)
        return pair

    prefix = str(c1.args[0])
    keys = (*c1.keys, prefix + "fanout")
    got = yield Call(FUSED[c1.script.name], keys,
                     (prefix, len(c1.args) - 1, *c1.args[1:], CLAIM_KINDS[c2.script.name],
                      *c2.args[1:]), split)
    s1: Settled[Any]
    s2: Settled[Any] | None
    if got.error is None:
        s1, s2 = got.value  # type: ignore[misc]
    elif parts and isinstance(got.error, Unavailable) and \
            got.error.outcome == APPLIED_UNCONFIRMED:
        # Applied, its confirmation failed: a part the script refused wrote nothing, and
        # keeps its own answer; an applied one is unconfirmed.
        s1, s2 = parts[0]
        s1 = s1 if s1.error is not None else Settled(error=_fresh(got.error))
        s2 = s2 if s2 is None or s2.error is not None else Settled(error=_fresh(got.error))
    else:
        s1, s2 = Settled(error=got.error), Settled(error=_fresh(got.error))
    r1 = yield from _resume(op1, s1)
    if s2 is None:  # the claim did not run: alone now
        s2 = yield c2
    r2 = yield from _resume(op2, s2)
    return r1, r2


def _fresh(error: StoreError) -> StoreError:
    """A copy of ``error`` for a second answer (one exception raised from two places would
    pile up their tracebacks)."""
    again = copy.copy(error)
    again.__traceback__ = None
    return again


def runs_only(claim: Operation[tuple[list[Any], int]]) -> Operation[list[Any]]:
    """A claim operation without its wait: what a claim that does not block returns."""
    runs, _ = yield from claim
    return runs


def parse_names(payload: Any) -> list[str]:
    """A list of run ids."""
    return [text(name) for name in payload]


def parse_claimed(payload: Any) -> list[Claimed]:
    """A claim's payload with records: {run, current} pairs."""
    return [Claimed(text(run), parse_current(current)) for run, current in payload]


#: A quarantine mark in a run's reply, as ``Current.quarantined`` says it.
QUARANTINE_MARKS = {b"": None, b"p": "poison", b"f": "failed"}


def _maybe(value: Any) -> int | None:
    """A reply's number, or None for its false (RESP2: None, RESP3: False)."""
    return None if value is None or value is False else int(value)


def parse_current(payload: list[Any]) -> Current:
    """run_get's payload as a Current."""
    (revision, record, owner, live, key, dep_rev, claimed_at, takeovers, token, attempts,
     not_before, mark) = payload[:12]
    # The session a run is held under: a 13th field (the fast paths, which never read a
    # session's run, answer 12).
    session = payload[12] if len(payload) > 12 else None
    claim = None
    if claimed_at is not None and claimed_at is not False:
        claim = ClaimInfo(
            key=text(key) if key else None,
            dependency_revision=int(dep_rev) if dep_rev else None,
            claimed_at=int(claimed_at),
        )
    return Current(int(revision), bytes(record), holder_of(owner, live), claim, int(takeovers),
                   _maybe(token), int(attempts), _maybe(not_before),
                   QUARANTINE_MARKS[bytes(mark) if not isinstance(mark, str) else mark.encode()],
                   text(session) if session else None)


def lease_args(lease: Lease) -> tuple[str, str, int | str]:
    """A lease as (kind, owner, ttl or token) script arguments."""
    if isinstance(lease, Hold):
        return "h", lease.owner, 0
    if isinstance(lease, Claim):
        return "c", lease.owner, lease.ttl
    if isinstance(lease, Seize):
        return "s", lease.owner, lease.ttl
    if isinstance(lease, Fenced):
        return ("F" if lease.release else "f"), lease.owner, lease.token
    if isinstance(lease, InSession):
        return "j", lease.owner, lease.session
    return "r", "", 0


def failure_args(failure: Failure | None) -> tuple[Arg, Arg, Arg, Arg]:
    """A finish's failure as (error text, delay, max attempts, final) script arguments ('-'
    for none)."""
    if failure is None:
        return "-", 0, "", ""
    return (failure.error, failure.delay, _opt(failure.max_attempts),
            "1" if failure.final else "")


def _opt(value: int | None) -> Arg:
    return "" if value is None else value


def wait_args(wait: Wait | None) -> tuple[Arg, Arg, Arg, Arg]:
    """A wait as (kind, dependency-or-key, number, deadline) script arguments."""
    if wait is None:
        return "", "", "", ""
    if isinstance(wait, Changed):
        return "c", wait.dependency, _opt(wait.seen), _opt(wait.deadline)
    if isinstance(wait, Poll):
        return "p", wait.key, wait.interval, _opt(wait.deadline)
    return "a", "", wait.due, ""


_WARNED: set[str] = set()


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log a warning once per process for ``key``."""
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message, *args)


def next_wakeup(spaces: list[Keyspace], kinds: Iterable[str], seconds: float
                ) -> Operation[tuple[str, str] | None]:
    """Wait up to ``seconds`` (server-side, BZPOPMIN) for a wake-up token of one of
    ``kinds`` ("ready", "leases") in the wake keys of ``spaces`` (partitions on one server;
    a cluster's command takes one slot's); the (kind, token) taken, or None."""
    keys = tuple(space.wake(kind) for space in spaces for kind in kinds)
    kind_of = {key.encode(): key.rsplit("wake-", 1)[1] for key in keys}

    def parse(reply: Any) -> tuple[str, str] | None:
        if reply is None:
            return None
        key, token = reply[0], reply[1]
        return kind_of[bytes(key)], text(token)

    # Sent as a read: after a broken connection it is sent again. A token whose reply was
    # lost is gone, which the claimers' re-arm covers.
    return (yield from ask(Call(None, keys, ("BZPOPMIN", *keys, f"{seconds:g}"), parse,
                                write=False)))


def _one(op: Operation[T] | Spread[T]) -> Operation[T]:
    """``op``, which a store of one partition never makes a Spread."""
    if isinstance(op, Spread):
        raise TypeError("a call over partitions on a store of one partition")
    return op


#: What a partition's head read answers (:meth:`RunOps.heads`): due entries, pending,
#: wait, outbox entries (entry, version, watch number), the outbox's size, unwatch queue
#: entries (entry, watch number) and the queue's size (a size -1: that queue is damaged).
Heads: TypeAlias = tuple[list[tuple[int, str]], bool, int, list[tuple[str, int, int]], int,
                         list[tuple[str, int]], int]

class Rewatch:
    """A write's answer when its dependency's watch may have been undone meanwhile
    (REWATCH): nothing was written; the operation watches again, above ``floor`` (the
    unwatched watch number), and sends the write again."""

    def __init__(self, floor: int) -> None:
        self.floor = floor


#: How often a write watches again before it gives up (each time, an unwatch raced it).
MAX_REWATCH = 16

#: The highest integer a Lua number holds exactly (lua/_common.lua's MAX_INT).
MAX_INT = 2**53 - 1


# ---------------------------------------------------------------------------- the feed
# The change feed's calls of one partition (docs/design/feed.md): recording the
# store's bounds in meta, reading the stream, waiting on it. ``RunOps.changes`` and
# ``PartitionedOps.changes`` put them together through redisstore.feed. Here, not in a
# module of their own under RunOps: that would hold the stores a floor higher.

#: The events' one-letter codes, as lua/_lib/feed.lua writes them.
CODES: dict[str, tuple[EventKind, bool]] = {
    "i": ("inserted", False), "w": ("written", False), "c": ("claimed", False),
    "t": ("claimed", True), "r": ("released", False), "d": ("deleted", False),
    "q": ("quarantined", False), "b": ("restored", False)}

_EVENT = re.compile(rb"([iwctrdqb])(\d{1,16}):(\d{1,5}):")


def parse_events(value: bytes) -> tuple[tuple[str, EventKind, int, bool], ...]:
    """An entry's ``e`` field: each event as ``<code><rev>:<length>:<run>``."""
    events = []
    at = 0
    while at < len(value):
        match = _EVENT.match(value, at)
        if match is None:
            raise Corrupt("", "feed")
        code, rev, length = match.groups()
        start = match.end()
        end = start + int(length)
        if end > len(value):
            raise Corrupt("", "feed")
        kind, takeover = CODES[code.decode()]
        events.append((value[start:end].decode("utf-8", "surrogateescape"), kind, int(rev),
                       takeover))
        at = end
    return tuple(events)


def parse_entries(reply: Any) -> list[Entry]:
    """XRANGE's (or one stream of XREAD's) raw answer as entries."""
    if isinstance(reply, StoreError):
        raise reply
    entries = []
    for entry_id, fields in reply or []:
        pairs = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) \
            else fields
        try:
            seq = int(pairs[b"n"])
            owner = text(pairs[b"o"]) or None
            items = parse_events(bytes(pairs[b"e"]))
        except (KeyError, ValueError, TypeError) as exc:
            raise Corrupt("", "feed") from exc
        entries.append(Entry(text(entry_id), seq, owner, items))
    return entries


def _count(reply: Any) -> int:
    if reply is None:
        return 0
    try:
        return int(reply)
    except (TypeError, ValueError) as exc:
        raise Corrupt("", "meta.feed-n") from exc


def _typed(call: Call[T], field: str) -> Operation[T]:
    """``call``'s answer; a key of another type (WRONGTYPE) is the namespace's data damaged:
    ``Corrupt`` naming ``field``, never an outage."""
    try:
        return (yield from ask(call))
    except Unavailable as exc:
        if exc.code == "WRONGTYPE":
            raise Corrupt("", field) from exc
        raise


class FeedOps:
    """The feed's part of :class:`~redisstore.core.runops.RunOps`."""

    keys: Keyspace
    #: The store's feed bounds (None: it keeps none), and whether they are in meta yet.
    feed: Feed | None = None
    feed_recorded: bool = True

    def set_feed(self, feed: Feed | None) -> None:
        """Open the store with ``feed``: recorded in the namespace's meta before its first
        write (:meth:`record_feed`), which every script of the namespace then reads."""
        if feed is not None and not isinstance(feed, Feed):
            raise TypeError(f"feed must be a Feed or None, got {type(feed).__name__}")
        self.feed = feed
        self.feed_recorded = feed is None

    def record_feed(self) -> Operation[None]:
        """Record the bounds (idempotent: sent again after a lost reply)."""
        if self.feed_recorded or self.feed is None:
            return
        meta = self.keys.meta
        # v5 goes: a namespace with a feed leaves its writes to the scripts' general code,
        # which writes the entries (lua/_lib/layout.lua).
        yield from ask(Call(None, (meta,), ("HSET", meta, "feed", f"{self.feed.max_entries}:"
                                            f"{self.feed.retention_ms}"),
                            lambda _: None, write=False))
        yield from ask(Call(None, (meta,), ("HDEL", meta, "v5"), lambda _: None, write=False))
        self.feed_recorded = True

    def feed_on(self) -> None:
        if self.feed is None:
            raise Misconfigured("this store was opened without a change feed: open it with "
                                "feed=Feed(...) (docs/runs.md, \"The change feed\")")

    def feed_read(self, position: Position, count: int) -> Operation[Found]:
        """Up to ``count`` entries past ``position`` (from its own entry when read partly),
        and the partition's count, read first: entries written in between only add."""
        k = self.keys
        n = yield from _typed(Call(None, (k.meta,), ("HGET", k.meta, "feed-n"), _count,
                                   write=False), "meta")
        if position.id is None:
            start = "-"
        elif position.read is not None:
            start = position.id
        else:
            start = "(" + position.id
        entries = yield from _typed(Call(None, (k.feed,), ("XRANGE", k.feed, start, "+",
                                                           "COUNT", count), parse_entries,
                                         write=False), "feed")
        return Found(entries, max(n, entries[-1].seq if entries else 0))

    def feed_oldest(self) -> Operation[Entry | None]:
        """The partition's oldest entry retained, or None."""
        k = self.keys
        entries = yield from _typed(Call(None, (k.feed,), ("XRANGE", k.feed, "-", "+",
                                                           "COUNT", 1), parse_entries,
                                         write=False), "feed")
        return entries[0] if entries else None

    def feed_wait(self, position: Position, ms: int) -> Operation[None]:
        """Wait up to ``ms`` (server-side, ``XREAD BLOCK``) for an entry past ``position``."""
        k = self.keys
        after = "$" if position.id is None else position.id
        yield from ask(Call(None, (k.feed,), ("XREAD", "COUNT", 1, "BLOCK", ms, "STREAMS",
                                              k.feed, after), lambda _: None, write=False,
                            fresh=True))


def _version(score: Any) -> int:
    """A queue entry's score as a version or watch number; -1 for a score none has (a
    foreign write: the claim removes it, run_delivered)."""
    value = float(score)
    return int(value) if value.is_integer() and 0 <= value <= MAX_INT else -1


class SessionOps:
    """A session's steps on a store of one partition (docs/design/sessions.md): not
    operations of the run store's own (``Session`` sends them), so no generated method has
    them. Arguments are checked by ``Session`` and ``open_session``."""

    keys: Keyspace
    arg1: str
    projection_version: int

    def _answer(self, run: str = "") -> Callable[[Any], Any]:
        raise NotImplementedError

    def _claim_argv(self, share: Share, owner: str, ttl: int, max_takeovers: int | None
                    ) -> tuple[Arg, ...]:
        raise NotImplementedError

    def claim_keys(self, kind: str) -> tuple[str, ...]:
        """The keys a claim of ``kind`` touches: the leases and the meta always; the ready
        index and the dependencies' fan-out when it takes ready runs."""
        if kind == LEASES:
            return (self.keys.leases, self.keys.meta)
        return (self.keys.ready, self.keys.leases, self.keys.meta, self.keys.fanout)

    def session_open(self, owner: str, ttl: int, session: str | None = None) -> Operation[str]:
        """A new session of ``owner``, live ``ttl`` ms from now: its id. With ``session``,
        that id (a store of partitions opens partition 0's in each other partition);
        ``SessionLapsed`` where the partition knows that id already."""
        sid = yield from ask(Call(
            scripts.RUN_SESSION_OPEN,
            (self.keys.sessions, self.keys.session_leases, self.keys.session_seq,
             self.keys.meta), (self.arg1, owner, ttl, *(() if session is None else (session,))),
            self._answer()))
        return text(sid)

    def session_keepalive(self, session: str, owner: str) -> Operation[Kept]:
        """Keep ``session`` live; the runs others took from it since the last one."""
        told = yield from ask(Call(
            scripts.RUN_SESSION_KEEPALIVE,
            (self.keys.sessions, self.keys.session_leases, self.keys.meta),
            (self.arg1, session, owner), self._answer()))
        return Kept([text(run) for run in told])

    def session_claim(self, kind: str, session: str, owner: str, ttl: int, limit: int,
                      records: bool, max_takeovers: int | None
                      ) -> Operation[tuple[list[Any], int]]:
        """A claim of ``kind`` (one of :data:`CLAIM_SCRIPTS`: ``any``, ``ready``, ``leases``)
        under ``session``. One of
        limit 0 is sent too: it claims nothing, but a lapsed session refuses it
        (``SessionLapsed``), as the contract and the memory reference say."""
        return (yield from self.session_claim_call(
            kind, Share(limit, MAX_CLAIM_BYTES if records else 0), session, owner, ttl,
            max_takeovers))

    def session_claim_call(self, kind: str, share: Share, session: str, owner: str, ttl: int,
                           max_takeovers: int | None) -> Operation[tuple[list[Any], int]]:
        """:meth:`session_claim` of a ``share`` (a store of partitions gives each its own)."""
        bound = None if kind == READY else max_takeovers
        payload, wait = yield from ask(Call(
            getattr(scripts, CLAIM_SCRIPTS[kind].upper()), self.claim_keys(kind),
            (*self._claim_argv(share, owner, ttl, bound), session),
            with_wait(self._answer())))
        return (parse_claimed(payload) if share.budget else parse_names(payload)), wait

    def session_close(self, session: str, owner: str, count: int
                      ) -> Operation[tuple[int, bool]]:
        """One step of ``close``: runs released, and whether the session is ended."""
        released, done = yield from ask(Call(
            scripts.RUN_SESSION_CLOSE,
            (self.keys.sessions, self.keys.session_leases, self.keys.leases, self.keys.ready,
             self.keys.meta), (self.arg1, session, owner, count, self.projection_version),
            self._answer()))
        return int(released), bool(int(done))

    def sessions(self, limit: int) -> Operation[list[SessionInfo]]:
        """Up to ``limit`` sessions, by expiry: pages of ``MAX_RENEW`` read in turn."""
        found: list[SessionInfo] = []
        offset = 0
        while len(found) < limit:
            page, read = yield from self.sessions_page(offset, MAX_RENEW)
            found += page
            offset += read
            if read < MAX_RENEW:
                break
        return found[:limit]

    def sessions_page(self, offset: int, count: int) -> Operation[tuple[list[SessionInfo], int]]:
        """A page of the sessions from ``offset``: those listed, and how many entries it
        read (fewer than ``count``: the last page)."""
        reply = yield from ask(Call(
            scripts.RUN_SESSIONS, (self.keys.session_leases, self.keys.sessions),
            (self.arg1, offset, count), lambda r: r, write=False))
        code, payload = reply_parts(reply)
        if code != Code.OK:
            raise ValueError(f"unknown reply code {code!r}")
        found = [SessionInfo(text(sid), text(owner), int(expires), int(runs))
                 for sid, owner, expires, runs in payload]
        return found, int(reply[2])


class RunOps(FeedOps, SessionOps):
    """The run store's operations over one namespace, as pure generators of calls.

    Before the store's first write, :meth:`server_check` runs once: it refuses a server
    that may evict keys and, with ``durability``, one without ``WAIT`` / ``WAITAOF``.
    """

    def __init__(self, namespace: str, discover: Discover | None, projection_version: int,
                 *, durability: Durability | None = None,
                 max_record_bytes: int = 1 << 20, partition: int | None = None,
                 place: Callable[[str], int] | None = None) -> None:
        self.keys = Keyspace(namespace, partition)
        #: Which partition a run id is in (None: a store of one partition).
        self.place = place
        #: ``watcher(dependency, partition, floor)``: the watch of a dependency in another
        #: partition, in that partition (a store of partitions sets it): its version, the
        #: watch's number (above ``floor``) and the dependency's partition.
        self.watcher: Callable[[str, int, int], Operation[tuple[int, int, int]]] | None = None
        if discover is not None and not callable(discover):
            raise TypeError("discover must be a callable taking record bytes, or None")
        self.discover = discover
        self.projection_version = check_projection_version(projection_version)
        self.durability = durability
        self.max_record_bytes = check_max_record(max_record_bytes)
        #: The one-time server checks done (see :meth:`server_check`); the shells share
        #: one set per client, so they run once per client, not once per store.
        self.checks: set[str] = set()
        self._needed = frozenset({"eviction"} if durability is None else
                                 {"eviction", "WAITAOF" if durability.aof else "WAIT"})
        k = self.keys
        self._write_keys = (k.leases, k.ready, k.meta)
        #: ARGV[1] of its scripts: the key prefix, and in a store of partitions the count
        #: the partition compares with the one it records (lua/_common.lua's TAIL).
        self.arg1 = k.prefix
        #: The partition count of the store (None: one partition), which refusals name.
        self.opened: int | None = None

    def _wait(self, record: bytes) -> tuple[tuple[Arg, ...], str | None]:
        """The wait's script arguments, and its dependency when that is in another
        partition (its watch goes first: :meth:`_watched`)."""
        wait = None if self.discover is None else check_wait(self.discover(record))
        foreign = None
        if isinstance(wait, Changed) and self.place is not None \
                and self.place(wait.dependency) != self.keys.partition:
            foreign = wait.dependency
        return (*wait_args(wait), self.projection_version), foreign

    def _watched(self, foreign: str | None, floor: int = 0) -> Operation[tuple[Arg, ...]]:
        """For a dependency in another partition, its watch there (the first half of a
        dependency across partitions): the version, watch number and partition the write
        then carries (a number above ``floor``, after a REWATCH; a floor -1: again after a
        REWATCH of a damaged unwatched key)."""
        if foreign is None or self.watcher is None:
            return ()
        assert self.keys.partition is not None
        version, seq, where = yield from self.watcher(foreign, self.keys.partition,
                                                      max(floor, 0))
        return (version, seq, where, *(("1",) if floor else ()))

    def _rewatching(self, foreign: str | None, send: Callable[[tuple[Arg, ...]], Call[T]]
                    ) -> Operation[T]:
        """A write that carries its dependency's watch (``send(watched)``): sent again
        behind a new watch while it answers REWATCH (an unwatch of that dependency raced
        it; nothing was written)."""
        floor = 0
        for _ in range(MAX_REWATCH):
            watched = (yield from self._watched(foreign, floor)) if foreign is not None else ()
            got = yield from ask(send(watched))
            if not isinstance(got, Rewatch):
                return got
            if got.floor < 0:
                warn_once(f"unwatched:{self.keys.prefix}",
                          "redisstore: %sunwatched is damaged (another type, or a field that "
                          "is not a number): each write waiting on a run of another partition "
                          "watches twice until it is deleted", self.keys.prefix)
            floor = got.floor if got.floor > 0 else -1
        raise Unavailable(f"a write waiting on {foreign!r} gave up: its watch was undone "
                          f"{MAX_REWATCH} times in a row (nothing was written)",
                          outcome=NOT_APPLIED)

    def _answer_write(self, run: str) -> Callable[[Any], Any]:
        """A write's parser: a :class:`Rewatch` for REWATCH, else the contract's answer."""
        parse = self._answer(run)

        def parsed(reply: Any) -> Any:
            code, payload = reply_parts(reply)
            if code == Code.REWATCH:
                return Rewatch(int(payload))
            return parse(reply)
        return parsed

    def watch(self, run: str, watcher: int, floor: int = 0) -> Operation[tuple[int, int, int]]:
        """Note ``watcher`` (a partition) as waiting on ``run``, with a new watch number
        (above ``floor``): run's version here, that number and this partition."""
        k = self.keys
        assert k.partition is not None
        got = yield from ask(Call(scripts.RUN_WATCH, (k.meta,),
                                  (self.arg1, run, watcher, *((floor,) if floor else ())),
                                  self._answer(run), write=False))
        return int(got[0]), int(got[1]), k.partition

    def watch_all(self, run: str, partitions: int) -> Operation[None]:
        """Turn the "every partition watches" a damaged watch key of ``run`` left into a
        watch of each partition of ``partitions`` (each pruned by the unwatch protocol)."""
        k = self.keys
        yield from ask(Call(scripts.RUN_WATCH, (k.meta,), (self.arg1, run, "*", "", partitions),
                            self._answer(run), write=False))

    def notify(self, dependency: str, version: int, source: int | None = None,
               seq: int = 0) -> Operation[bool]:
        """Deliver ``dependency``'s version (from the outbox of partition ``source``, whose
        watch of it by this partition is ``seq``); idempotent. With no waiter of it here,
        its watch is unwatched instead."""
        k = self.keys
        rose = yield from ask(Call(scripts.RUN_NOTIFY, (k.meta, k.fanout),
                                   (self.arg1, dependency, version, self.projection_version,
                                    *(() if source is None else (source, seq))),
                                   self._answer(), write=False))
        return bool(rose)

    def unwatch(self, dependency: str, watcher: int, seq: int) -> Operation[bool]:
        """Remove partition ``watcher``'s watch of ``dependency`` here if it is still watch
        ``seq`` (and its outbox entry); idempotent."""
        k = self.keys
        gone = yield from ask(Call(scripts.RUN_UNWATCH, (k.meta,),
                                   (self.arg1, dependency, watcher, seq), self._answer(),
                                   write=False))
        return bool(gone)

    def delivered(self, entries: list[tuple[str, int]], queue: str = "outbox"
                  ) -> Operation[int]:
        """Remove outbox entries (entry, version) once delivered, unless a newer version
        was announced since; or, with ``queue="unwatch"``, unwatch queue entries (entry,
        watch number) once acknowledged."""
        k = self.keys
        flat = tuple(x for entry, version in entries for x in (entry, version))
        gone = yield from ask(Call(scripts.RUN_DELIVERED, (k.outbox,),
                                   (self.arg1, queue, *flat), self._answer(), write=False))
        return int(gone)

    def _answer(self, run: str = "") -> Callable[[Any], Any]:
        return answer(run, self.keys.namespace, self.opened)

    def checked(self) -> bool:
        """Whether :meth:`server_check` has passed for this client (and this store's feed
        bounds are recorded)."""
        return self.checks >= self._needed and self.feed_recorded

    def guarded(self, op: Operation[T] | Spread[T]) -> Operation[T] | Spread[T]:
        """``op`` preceded, until it has passed once, by :meth:`server_check`."""
        return op if self.checked() else preceded(self.server_check(), _one(op))

    def counting(self, op: Operation[T] | Spread[T]) -> Operation[T] | Spread[T]:
        """``op``: a store of one partition needs no check before a read (its scripts refuse
        a namespace spread over partitions, :class:`~redisstore.core.partitions.PartitionedOps`
        checks the count)."""
        return op

    def read_check(self) -> Operation[None] | None:
        """What a pipeline of reads only sends first: nothing (see :meth:`counting`)."""
        return None

    def server_check(self) -> Operation[None]:
        """Refuse a server that may evict the store's keys (``maxmemory-policy allkeys-*``)
        and, with ``durability``, one without ``WAIT`` / ``WAITAOF``. Where ``CONFIG`` is
        not allowed, warn once and go on."""
        if "eviction" in self.checks:
            policy = None
        else:
            policy = yield from self._policy()
        if policy in EVICTING:
            raise Misconfigured(
                f"maxmemory-policy is {policy}: under memory pressure the server may evict a "
                "held run, and another node would re-insert it at revision 1 (history lost, "
                "two owners). Fix: CONFIG SET maxmemory-policy noeviction (and in redis.conf)")
        self.checks.add("eviction")
        if self.durability is not None:
            name = "WAITAOF" if self.durability.aof else "WAIT"
            info = yield from ask(Call(None, (self.keys.leases,), ("COMMAND", "INFO", name),
                                       lambda r: r, write=False))
            if not info or info[0] is None:
                raise Misconfigured(f"this server has no {name} command, which Durability("
                                    f"aof={self.durability.aof}) needs (WAITAOF: Redis >= 7.2, "
                                    "Valkey >= 8)")
            self.checks.add(name)
        yield from self.record_feed()

    def _policy(self) -> Operation[str | None]:
        try:
            return (yield from eviction_policy(self.keys.leases))
        except Unavailable as exc:
            if exc.code is None:
                raise  # the server could not be asked: try again with the next write
            warn_once("config", "redisstore: cannot read maxmemory-policy here (INFO memory "
                      "has none, CONFIG GET answered %s); cannot check that the server never "
                      "evicts keys. Make sure maxmemory-policy is noeviction (or volatile-*)",
                      exc.code)
            return None

    # ------------------------------------------------------------------ the operations
    #
    # Each public operation is written here once: its signature and docstring (the stores'
    # own, sync and asyncio), its checks, its script call and the parse of its reply. The
    # stores, the pipelines and the store of partitions (PartitionedOps) follow from it:
    # redisstore/build/ops.py writes their methods (redisstore/_*_ops.py) from the
    # @operation beside each. A claim's core answers (runs, wait): the stores hand back
    # the runs, and wait on the wait when blocked.

    @operation("read", "first")
    def now(self) -> Operation[int]:
        """The backend clock (Redis ``TIME``), UTC Unix milliseconds."""
        now = yield from ask(Call(scripts.RUN_NOW, (self.keys.leases,), (self.arg1,),
                                  self._answer(), write=False))
        return int(now)

    @operation("read", "one:run")
    def get(self, run: str) -> Operation[Current]:
        """The run's latest record, revision and holder; raises ``NotFound``."""
        run = check_run(run)
        payload = yield from ask(Call(scripts.RUN_GET, (self.keys.run(run), self.keys.meta),
                                      (self.arg1, run), self._answer(run), write=False))
        return parse_current(payload)

    @operation("read", "each:runs")
    def get_many(self, runs: Iterable[str]) -> Operation[dict[str, Current]]:
        """What :meth:`get` answers for each of ``runs`` that exists, by run, in the order of
        ``runs``; a run that does not exist is absent from the dict. At most ``MAX_RENEW``
        (150) runs; one round trip (a store of partitions: one per node, at once) but where
        their records pass ``MAX_CLAIM_BYTES`` (2 MiB), whose rest is read in further calls,
        each within the store's ``timeout`` of its own. Raises ``Corrupt`` for a run whose
        stored data fails its checks."""
        names = check_runs(runs)
        found: dict[str, Current] = {}
        while names:
            # Each round trip reads up to 2 MiB of records and may take the whole timeout
            # (150 records of 2 MiB are 150 of them): each has a deadline of its own.
            payload = yield from ask(Call(scripts.RUN_GET_MANY, (self.keys.meta,),
                                          (self.arg1, MAX_CLAIM_BYTES, *names), self._answer(),
                                          write=False, fresh=True))
            read, *entries = payload
            for entry in entries:
                run = text(entry[0])
                if entry[1] is None or entry[1] is False:
                    raise Corrupt(run, text(entry[2]))
                found[run] = parse_current(entry[1])
            if int(read) < 1:
                raise Unavailable(f"get_many read no run of {len(names)}", code="PROTOCOL",
                                  outcome=NOT_APPLIED)
            names = names[int(read):]
        return found

    @operation("write", "one:run")
    def insert(self, run: str, record: bytes, lease: Lease) -> Operation[int]:
        """Create ``run`` and return its revision: 1, or in a namespace where runs were
        deleted, one above the highest revision a deleted run had (so an id inserted again
        never reuses a revision). Raises ``AlreadyExists`` if it exists."""
        run, lease = check_run(run), check_new_lease(lease)
        record = check_record(record, self.max_record_bytes)
        wait, foreign = self._wait(record)
        revision = yield from self._rewatching(foreign, lambda watched: Call(
            scripts.RUN_INSERT, (self.keys.run(run), *self._write_keys),
            (self.arg1, run, record, *lease_args(lease), *wait, *watched),
            self._answer_write(run)))
        return int(revision)

    @operation("write", "one:run")
    def compare_and_set(self, run: str, expected: int, record: bytes,
                        lease: Lease) -> Operation[None]:
        """Write revision ``expected + 1`` if ``expected`` is current and the lease allows.

        Raises ``NotFound``, ``Conflict(current)`` or ``LeaseRefused(holder)``; nothing is
        written then.
        """
        run, expected, lease = check_run(run), check_revision(expected), check_lease(lease)
        record = check_record(record, self.max_record_bytes)
        wait, foreign = self._wait(record)
        yield from self._rewatching(foreign, lambda watched: Call(
            scripts.RUN_COMPARE_AND_SET, (self.keys.run(run), *self._write_keys),
            (self.arg1, run, expected, record, *lease_args(lease), *wait, *watched),
            self._answer_write(run)))

    # renew and release over no runs send nothing (their checks run all the same): a store
    # of partitions checks a call's arguments so, before it spreads it.

    @operation("write", "each:runs")
    def renew(self, owner: str, runs: Iterable[str], ttl: int) -> Operation[list[str]]:
        """Extend each lease ``owner`` holds live among ``runs`` to ``ttl`` ms from now."""
        owner, ttl, names = check_owner(owner), check_ttl(ttl), check_runs(runs)
        if not names:
            return []
        payload = yield from ask(Call(scripts.RUN_RENEW, (self.keys.leases, self.keys.meta),
                                      (self.arg1, owner, ttl, *names), self._answer()))
        return parse_names(payload)

    @operation("write", "each:runs")
    def release(self, owner: str, runs: Iterable[str]) -> Operation[list[str]]:
        """Free each lease ``owner`` holds, live or expired, among ``runs``, without a new
        revision; returns those runs. A run with a wait becomes claimable as its wait says
        (at once when due); a poison run leaves the quarantine."""
        owner, names = check_owner(owner), check_runs(runs)
        if not names:
            return []
        k = self.keys
        payload = yield from ask(Call(scripts.RUN_RELEASE, (k.leases, k.ready, k.meta),
                                      (self.arg1, owner, self.projection_version, *names),
                                      self._answer()))
        return parse_names(payload)

    @operation("write", "one:run")
    def delete(self, run: str, expected: int, lease: Lease) -> Operation[None]:
        """Remove ``run`` if ``expected`` is current and the lease allows (the checks of
        :meth:`compare_and_set`): its record, lease and index entries go, and runs waiting
        for it to change read it as revision 0. An insert of the id starts above its last
        revision, so a stale ``expected`` never matches again.

        Raises ``NotFound``, ``Conflict(current)`` or ``LeaseRefused(holder)``; nothing is
        written then.
        """
        run, expected, lease = check_run(run), check_revision(expected), check_lease(lease)
        yield from ask(Call(scripts.RUN_DELETE, (self.keys.run(run), *self._write_keys),
                            (self.arg1, run, expected, *lease_args(lease),
                             self.projection_version), self._answer(run)))

    @operation("write", "one:run")
    def finish(self, run: str, expected: int, lease: Fenced, *, record: bytes | None = None,
               failure: Failure | None = None) -> Operation[None]:
        """End the grant ``lease`` (a :class:`~redisstore.Fenced`: ``Current.token`` of the
        claim that took the run) of ``run`` at revision ``expected``, one of three ways:

        - ``record``: write it as revision ``expected + 1`` and free the run (its attempts,
          takeovers and ``not_before`` start again);
        - neither: free the run, nothing written;
        - ``failure``: a failed try: its attempts go up by one; then it is quarantined
          (``quarantined()`` lists it under ``failed``) if ``failure.final`` or once they
          reach ``failure.max_attempts``, else freed and held back from ready claims for
          ``failure.delay`` ms (its ``not_before``).

        Raises ``NotFound``, ``Conflict(current)`` or ``LeaseRefused(holder)`` (the run is
        not under that grant: another claim, ``Seize`` or release came since); nothing is
        written then. ``lease.release`` plays no part: a finish always ends the grant.
        """
        run, expected, lease = check_run(run), check_revision(expected), check_fenced(lease)
        failure = check_failure(failure)
        if record is not None:
            record = check_record(record, self.max_record_bytes)
            if failure is not None:
                raise ValueError("finish takes a record or a failure, not both")
        return (yield from self._finish(run, expected, lease, record, failure))

    def _finish(self, run: str, expected: int, lease: Fenced, record: bytes | None,
                failure: Failure | None) -> Operation[None]:
        """:meth:`finish`, its arguments checked."""
        if record is not None:
            wait, foreign = self._wait(record)
        else:  # no write: no wait to derive (the run keeps its own)
            wait, foreign = (*wait_args(None), self.projection_version), None
        yield from self._rewatching(foreign, lambda watched: self.finish_call(
            run, expected, lease, record, failure, wait, watched))

    def finish_call(self, run: str, expected: int, lease: Fenced, record: bytes | None,
                    failure: Failure | None, wait: tuple[Arg, ...],
                    watched: tuple[Arg, ...] = ()) -> Call[Any]:
        """run_finish's call, arguments checked and the wait derived."""
        what = "w" if record is not None else "x" if failure is not None else "r"
        return Call(scripts.RUN_FINISH, (self.keys.run(run), *self._write_keys),
                    (self.arg1, run, expected, lease.owner, lease.token, what,
                     record if record is not None else b"", *failure_args(failure), *wait,
                     *watched), self._answer_write(run))

    @operation("write", "one:run")
    def restore(self, run: str, expected: int | None = None) -> Operation[bool]:
        """Put a quarantined run (poison or failed) back: out of the quarantine, its
        takeovers, attempts and ``not_before`` cleared, claimable again as its lease and
        wait say. Whether it was quarantined (False: nothing written). Raises
        ``NotFound``.

        With ``expected``, only while the run is at that revision, checked in the same
        step as the restore: else ``Conflict(current)``, nothing written (an operator's
        action from a page that showed the run at ``expected``)."""
        run = check_run(run)
        tail: tuple[Arg, ...] = ()
        if expected is not None:
            tail = (check_revision(expected),)
        restored = yield from ask(Call(scripts.RUN_RESTORE, (self.keys.run(run), *self._write_keys),
                                       (self.arg1, run, self.projection_version, *tail),
                                       self._answer(run)))
        return bool(restored)

    # A claim's share in one partition is its ``<claim>_call(share, ...)``: its arguments
    # but ``limit`` and ``records`` (a store of partitions calls it so in each).

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *,
                      records: Literal[False] = False, max_takeovers: int | None = None
                      ) -> Operation[tuple[list[str], int]]: ...

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *,
                      records: Literal[True], max_takeovers: int | None = None
                      ) -> Operation[tuple[list[Claimed], int]]: ...

    @overload
    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
                      max_takeovers: int | None = None
                      ) -> Operation[tuple[list[str] | list[Claimed], int]]: ...

    @operation("claim", "claim:leases")
    def claim_expired(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
                      max_takeovers: int | None = None
                      ) -> Operation[tuple[list[str] | list[Claimed], int]]:
        """Claim up to ``limit`` held, expired leases, the longest-expired first.

        With ``records=True`` each comes back as ``Claimed(run, current)``, its record
        included, in the same round trip; the claim then stops before the run whose record
        would take the reply past ``MAX_CLAIM_BYTES`` (2 MiB; the first run always comes),
        so it may return fewer than ``limit`` while more are claimable.

        With ``max_takeovers=N``, a run whose expired lease was already handed to another
        owner ``N`` times since its last write (``Current.takeovers``) is not handed out
        again: it goes to the quarantine as poison (:meth:`quarantined`) until a write or
        :meth:`release` puts it back.

        With ``block=ms``, when nothing is claimable, wait up to ``block`` ms and claim as
        soon as a lease expires (docs/runs.md, "Waiting for work").
        """
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        records = check_flag("records", records)
        bound = check_max_takeovers(max_takeovers)
        if limit == 0:
            return [], -1
        return (yield from self.claim_expired_call(
            Share(limit, MAX_CLAIM_BYTES if records else 0), owner, ttl, bound))

    def claim_expired_call(self, share: Share, owner: str, ttl: int, max_takeovers: int | None
                           ) -> Operation[tuple[list[Any], int]]:
        """:meth:`claim_expired`'s script, arguments checked, for ``share``."""
        payload, wait = yield from ask(Call(
            scripts.RUN_CLAIM_EXPIRED, self.claim_keys(LEASES),
            self._claim_argv(share, owner, ttl, max_takeovers), with_wait(self._answer())))
        return (parse_claimed(payload) if share.budget else parse_names(payload)), wait

    def _claim_argv(self, share: Share, owner: str, ttl: int, max_takeovers: int | None
                    ) -> tuple[Arg, ...]:
        """A claim script's ARGV (every kind's: run_claim's header)."""
        return (self.arg1, owner, ttl, share.limit, self.projection_version, share.budget,
                _opt(max_takeovers), "1" if share.strict else "")

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *,
                    records: Literal[False] = False) -> Operation[tuple[list[str], int]]: ...

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *,
                    records: Literal[True]) -> Operation[tuple[list[Claimed], int]]: ...

    @overload
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False
                    ) -> Operation[tuple[list[str] | list[Claimed], int]]: ...

    @operation("claim", "claim:ready")
    def claim_ready(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False
                    ) -> Operation[tuple[list[str] | list[Claimed], int]]:
        """Claim up to ``limit`` free runs whose wait is eligible, the earliest first.

        ``records=True`` hands back ``Claimed(run, current)`` values, as
        :meth:`claim_expired` does. With ``block=ms``, when nothing is claimable, wait up
        to ``block`` ms and claim as soon as something is (docs/runs.md, "Waiting for
        work"): the call returns the first claim that got runs, or ``[]`` once ``block``
        ms have passed; its deadline is ``block`` plus the store's ``timeout``.
        """
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        records = check_flag("records", records)
        if limit == 0:
            return [], -1
        return (yield from self.claim_ready_call(
            Share(limit, MAX_CLAIM_BYTES if records else 0), owner, ttl))

    def claim_ready_call(self, share: Share, owner: str, ttl: int
                         ) -> Operation[tuple[list[Any], int]]:
        """:meth:`claim_ready`'s script, arguments checked, for ``share``. With limit 0 it
        only finishes re-indexing a dependency's waiters."""
        payload, wait = yield from ask(Call(
            scripts.RUN_CLAIM_READY, self.claim_keys(READY),
            self._claim_argv(share, owner, ttl, None), with_wait(self._answer())))
        return (parse_claimed(payload) if share.budget else parse_names(payload)), wait

    @overload
    def claim(self, owner: str, ttl: int, limit: int = 1, *,
              records: Literal[False] = False, max_takeovers: int | None = None
              ) -> Operation[tuple[list[str], int]]: ...

    @overload
    def claim(self, owner: str, ttl: int, limit: int = 1, *,
              records: Literal[True], max_takeovers: int | None = None
              ) -> Operation[tuple[list[Claimed], int]]: ...

    @overload
    def claim(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
              max_takeovers: int | None = None
              ) -> Operation[tuple[list[str] | list[Claimed], int]]: ...

    @operation("claim", "claim:any")
    def claim(self, owner: str, ttl: int, limit: int = 1, *, records: bool = False,
              max_takeovers: int | None = None
              ) -> Operation[tuple[list[str] | list[Claimed], int]]:
        """Claim up to ``limit`` runs of both kinds, in due order across both: free runs
        whose wait is eligible (as :meth:`claim_ready` takes them, with their claim info)
        and held, expired leases (as :meth:`claim_expired` takes them, a takeover counted).
        A ready run is due when its wait became eligible, an expired lease when it expired;
        ties go by run id.

        ``records=True`` hands back ``Claimed(run, current)`` values, as the other claims
        do. ``max_takeovers=N`` quarantines a poison run among the expired leases, as
        :meth:`claim_expired` does. With ``block=ms``, when nothing is claimable, wait up to
        ``block`` ms and claim at whichever comes first: a run made ready or a lease's
        expiry (docs/runs.md, "One claim for all work").
        """
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        records = check_flag("records", records)
        bound = check_max_takeovers(max_takeovers)
        if limit == 0:
            return [], -1
        return (yield from self.claim_call(
            Share(limit, MAX_CLAIM_BYTES if records else 0), owner, ttl, bound))

    def claim_call(self, share: Share, owner: str, ttl: int, max_takeovers: int | None
                   ) -> Operation[tuple[list[Any], int]]:
        """:meth:`claim`'s script, arguments checked, for ``share``. With limit 0 it only
        finishes re-indexing a dependency's waiters."""
        payload, wait = yield from ask(Call(
            scripts.RUN_CLAIM, self.claim_keys(ANY),
            self._claim_argv(share, owner, ttl, max_takeovers), with_wait(self._answer())))
        return (parse_claimed(payload) if share.budget else parse_names(payload)), wait

    def heads(self, index: str, limit: int) -> Operation[Heads]:
        """The first due entries of ``index`` (``"ready"`` or ``"leases"``), up to
        ``limit``, as (score, run) earliest first; whether a dependency's waiters are still
        being re-indexed; the ms until the next entry is due (0: more are due, -1: none);
        the outbox's first entries (partition, dependency, version) to deliver, and how
        many entries it holds."""
        k = self.keys
        flat, pending, wait, outbox, size, seqs, queued, queue_size = yield from ask(Call(
            scripts.RUN_HEADS, (k.ready, k.leases, k.meta, k.fanout),
            (self.arg1, index, limit),
            lambda reply: (self._answer()(reply), *reply[2:4], reply[4] if len(reply) > 4
                           else [], reply[5] if len(reply) > 5 else 0,
                           reply[6] if len(reply) > 6 else [],
                           reply[7] if len(reply) > 7 else [],
                           reply[8] if len(reply) > 8 else 0), write=False))
        # Ties go by the ids' bytes, as the scripts and the memory reference order them.
        entries = sorted(((int(flat[i + 1]), text(flat[i])) for i in range(0, len(flat) - 1, 2)),
                         key=lambda e: (e[0], e[1].encode("utf-8", "surrogateescape")))
        deliveries = []
        for i in range(0, len(outbox) - 1, 2):
            seq = seqs[i // 2] if i // 2 < len(seqs) else 0
            deliveries.append((text(outbox[i]), _version(outbox[i + 1]),
                               seq if type(seq) is int and seq >= 0 else 0))
        unwatches = [(text(queued[i]), _version(queued[i + 1]))
                     for i in range(0, len(queued) - 1, 2)]
        return (entries[:limit], bool(pending), int(wait) if int(wait) >= -1 else -1,
                deliveries, int(size) if type(size) is int else 0, unwatches,
                int(queue_size) if type(queue_size) is int else 0)

    def next_wakeup(self, kinds: Iterable[str], seconds: float
                    ) -> Operation[tuple[str, str] | None]:
        """Wait up to ``seconds`` (server-side, BZPOPMIN) for a wake-up token of one of
        ``kinds`` ("ready", "leases"); the (kind, token) taken, or None."""
        return (yield from next_wakeup([self.keys], kinds, seconds))

    def wake_sources(self, cluster: bool) -> list[tuple[Any, Any]]:
        """The (next_wakeup, give_back) pairs a store's waker listens to: one."""
        return [(self.next_wakeup, self.give_back_wakeup)]

    def sweeps(self, cluster: bool) -> None:
        """None: one namespace's wake keys share a slot, so one ``BZPOPMIN`` waits on them
        (a store of partitions on a cluster has wakers per node instead)."""
        return None

    def give_back_wakeup(self, kind: str, token: str) -> Operation[None]:
        """Put back a token this node took but had no claimer for (first in line)."""
        key = self.keys.wake(kind)
        # Idempotent (NX): sent again after a broken connection, as a read is.
        yield from ask(Call(None, (key,), ("ZADD", key, "NX", 0, token), lambda _: None,
                            write=False))
        if self.keys.partition is not None:
            # A partition's token is also announced on its channel, as its scripts do (a
            # cluster's wakers per node listen there); a refused publish is only advice.
            yield Call(None, (key,), ("SPUBLISH", key, "1"), lambda _: None, write=False)

    def take_wakeups(self, kind: str, count: int) -> Operation[list[str]]:
        """Take up to ``count`` wake-up tokens of ``kind`` without waiting (``ZPOPMIN``): a
        cluster's waker per node sweeps its partitions' keys so, on each message of their
        channels and after it subscribed."""
        key = self.keys.wake(kind)

        def parse(reply: Any) -> list[str]:
            if not isinstance(reply, list):
                return []
            if reply and isinstance(reply[0], list):  # RESP3: [token, score] pairs
                return [text(pair[0]) for pair in reply]
            return [text(token) for token in reply[::2]]

        # Sent as a read, as BZPOPMIN is: tokens whose reply was lost are gone, which the
        # claimers' re-arm covers.
        return (yield from ask(Call(None, (key,), ("ZPOPMIN", key, count), parse,
                                    write=False)))

    @operation("write", "one:run", queued="it reads, then writes: it takes a second round trip")
    def refresh(self, run: str) -> Operation[bool]:
        """Re-derive the run's wait from its current record; True if it now has one."""
        run = check_run(run)
        # A write between our read and our refresh derived fresh metadata itself, unless it
        # came from a store with a lower projection version: read again and retry.
        for _ in range(16):
            current = yield from self.get(run)
            wait, foreign = self._wait(current.record)
            try:
                indexed = yield from self._rewatching(
                    foreign, self._refresh_call(run, current.revision, wait))
            except Conflict:
                continue
            return bool(indexed)
        raise Unavailable(f"refresh of {run!r} gave up: the run kept changing under it",
                          outcome=NOT_APPLIED)

    def _refresh_call(self, run: str, revision: int, wait: tuple[Arg, ...]
                      ) -> Callable[[tuple[Arg, ...]], Call[Any]]:
        """The refresh of ``run`` at ``revision`` with ``wait``, given its watch's arguments."""
        return lambda watched: Call(
            scripts.RUN_REFRESH, (self.keys.run(run), self.keys.ready, self.keys.meta),
            (self.arg1, run, revision, *wait, *watched), self._answer_write(run))

    def migrate_step(self, count: int) -> Operation[tuple[int, bool, int, int]]:
        """One bounded step of moving a namespace of layout 1 to 4 to layout 5, offline
        (lua/run_migrate.lua): (runs moved, done, damaged runs left as they were, entries
        moved out of layout 4's buckets). At layout 5 already, or on a new namespace, one
        step that scans nothing is done."""
        count = check_migrate_count(count)
        moved, done, damaged, entries = yield from ask(Call(
            scripts.RUN_MIGRATE, (self.keys.meta,), (self.arg1, count), self._answer()))
        return int(moved), bool(done), int(damaged), int(entries)

    @operation("read", "own", pipeline=False)
    def changes(self, after: str | None = None, limit: int = 100, *,
                block: int | None = None) -> Operation[Changes]:
        """The change feed's events after the cursor ``after`` (None: from the oldest
        retained), at most ``limit`` (<= 1000); with ``block``, wait up to that many ms for
        one. Raises ``Compacted`` (with where to resume) when entries past ``after`` are
        gone, ``Misconfigured`` on a store opened without ``feed=Feed(...)``. See
        docs/contract.md, "The change feed"."""
        after, limit, block = check_changes(after, limit, block)
        self.feed_on()
        (position,) = decode(after, 1)
        deadline = time.monotonic() + (block or 0) / 1000
        while True:
            found = yield from self.feed_read(position, limit)
            oldest: dict[int, Entry | None] = {}
            if gap(position, found) is not None:
                oldest[0] = yield from self.feed_oldest()
            page = feed_answer(after, [(position, found)], limit, oldest.get)
            left = int((deadline - time.monotonic()) * 1000)
            if page.events or left <= 0:
                return page
            yield from self.feed_wait(decode(page.cursor, 1)[0], min(left, FEED_WAIT))

    @operation("read", "own", pipeline=False)
    def rates(self, minutes: int = 60) -> Operation[list[Rate]]:
        """Claims, finishes and takeovers per minute over the last ``minutes`` (1 to 60)
        minutes of the backend clock, this one included, oldest first: one :class:`Rate`
        a minute, zeros where nothing was counted. A namespace with a feed counts them in
        the scripts that make them (docs/contract.md, "Per-minute counts");
        ``Misconfigured`` on a store opened without ``feed=Feed(...)``."""
        minutes = check_minutes(minutes)
        self.feed_on()
        return (yield from self.rates_read(minutes))

    def rates_read(self, minutes: int) -> Operation[list[Rate]]:
        """This partition's counts of the last ``minutes`` minutes (run_rates)."""
        flat = yield from ask(Call(scripts.RUN_RATES, (self.keys.rates,),
                                   (self.arg1, minutes), self._answer(), write=False))
        try:
            return [Rate(int(flat[i]) * MINUTE_MS, int(flat[i + 1]), int(flat[i + 2]),
                         int(flat[i + 3])) for i in range(0, len(flat) - 3, 4)]
        except (TypeError, ValueError, IndexError) as exc:
            raise Corrupt("", "rates") from exc

    @operation("read", "own", pipeline=False)
    def quarantined(self, limit: int = 1000) -> Operation[list[Quarantined]]:
        """Index entries that claims dropped as damaged (a run missing, of another type, or
        corrupt), with the reason, up to ``limit``; docs/faults.md says how to repair."""
        limit = check_listing_limit(limit)
        found: list[Quarantined] = []
        cursor: Arg = "0"
        while len(found) < limit:
            cursor_b, flat = yield from ask(Call(scripts.RUN_QUARANTINED,
                                                 (self.keys.quarantine,),
                                                 (self.arg1, cursor), self._answer(),
                                                 write=False))
            for i in range(0, len(flat) - 1, 2):
                index, _, run = text(flat[i]).partition("|")
                reason, newline, error = text(flat[i + 1]).partition("\n")
                found.append(Quarantined(index, run, reason, error if newline else None))
            cursor = text(cursor_b)
            if cursor == "0":
                break
        return sorted(found, key=lambda q: (q.index, q.run))[:limit]


def claim_kinds() -> dict[str, str]:
    """Each claim operation's script (``run_<name>``) and the kind of work it claims (its
    route's ``claim:<kind>``, one of :data:`waits.KINDS`), read from the ``@operation`` marks
    of :class:`RunOps`: the one list of the claims, which the fused scripts and telemetry's
    count of claimed runs follow."""
    found = {}
    for name, method in vars(RunOps).items():
        spec = getattr(method, "__operation__", None)
        if isinstance(spec, Spec) and spec.kind == "claim":
            kind = spec.route.removeprefix("claim:")
            script = f"run_{name}"
            if kind not in KINDS or not hasattr(scripts, script.upper()):
                raise TypeError(f"RunOps.{name}: a claim's route is claim:<kind> (one of "
                                f"{sorted(KINDS)}) and it sends lua/{script}.lua")
            found[script] = kind
    return found


CLAIM_KINDS.update(claim_kinds())
CLAIM_SCRIPTS.update({kind: script for script, kind in CLAIM_KINDS.items()})
telemetry.count_claims(CLAIM_KINDS)
