"""The sans-I/O core shared by the sync and asyncio shells.

An operation is a generator: it validates its arguments (raising before anything is sent),
yields :class:`Call` values, receives each call's parsed reply (or has the StoreError thrown
in) and returns its result. A shell only sends calls and feeds replies back, so the logic of
every operation exists once. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from . import scripts
from .errors import (
    AlreadyExists,
    Conflict,
    LeaseRefused,
    NotFound,
    StoreError,
    Unavailable,
    is_noscript,
    unavailable,
)
from .keys import Keyspace
from .runs import (
    Changed,
    Claim,
    ClaimInfo,
    Current,
    Discover,
    Free,
    Held,
    Hold,
    Holder,
    Lease,
    Poll,
    Seize,
    Wait,
    check_lease,
    check_limit,
    check_owner,
    check_projection_version,
    check_record,
    check_revision,
    check_run,
    check_runs,
    check_ttl,
    check_wait,
)

T = TypeVar("T")
Arg: TypeAlias = str | bytes | int


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One round trip: EVALSHA of ``script`` (or, with no script, the plain command ``args``).

    ``write`` marks a call that may change data: a shell never replays it after a failure
    whose outcome is unknown. ``parse`` turns the raw reply into a value or raises.
    """

    script: scripts.Script | None
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    parse: Callable[[Any], T] = field(repr=False)
    write: bool = True

    def command(self) -> tuple[Arg, ...]:
        """The command as sent: EVALSHA sha numkeys keys... args... (or the plain command)."""
        if self.script is None:
            return self.args
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


Operation: TypeAlias = Generator[Call[Any], Any, T]


@dataclass(frozen=True, slots=True)
class Durability:
    """Confirm each write before it counts: ``WAIT replicas timeout`` and, with ``aof``,
    ``WAITAOF 1 replicas timeout`` (the primary and ``replicas`` replicas fsynced it; Redis
    >= 7.2, Valkey >= 8). The confirmation is pipelined with the write: still one round trip.

    A write not confirmed within ``timeout`` ms raises ``Unavailable``: it is applied on the
    primary but may be lost if the primary fails now, so treat it as of unknown outcome.
    """

    replicas: int = 0
    timeout: int = 1000
    aof: bool = False

    def __post_init__(self) -> None:
        for name in ("replicas", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.aof, bool):
            raise TypeError("aof must be a bool")
        if self.timeout == 0:
            raise ValueError("timeout 0 would make WAIT block forever; give milliseconds")

    def command(self) -> tuple[Arg, ...]:
        """The command sent right after each write, on the same connection."""
        if self.aof:
            return ("WAITAOF", 1, self.replicas, self.timeout)
        return ("WAIT", self.replicas, self.timeout)

    def check(self, reply: Any) -> None:
        """Raise ``Unavailable`` unless the reply confirms the write."""
        if isinstance(reply, Exception):
            raise Unavailable(f"write not confirmed: {reply}; it may be lost on failover")
        if self.aof:
            local, replicas = int(reply[0]), int(reply[1])
            if local < 1 or replicas < self.replicas:
                raise Unavailable(
                    f"write not confirmed in {self.timeout} ms: fsynced locally {local}, by "
                    f"{replicas} of {self.replicas} replicas; it may be lost on failover")
        elif int(reply) < self.replicas:
            raise Unavailable(
                f"write not confirmed in {self.timeout} ms: {int(reply)} of {self.replicas} "
                "replicas acknowledged it; it may be lost on failover")

# ---------------------------------------------------------------------------- the wire

# redis-py's option that keeps a reply undecoded whatever the client's decode_responses
# says: records are bytes. Both shells pass it on the reads they send through the client.
UNDECODED: dict[str, Any] = {"NEVER_DECODE": True}


@dataclass(frozen=True, slots=True)
class Batch:
    """What a shell sends in one round trip: ``commands`` pipelined on one connection.

    A ``write`` batch is sent exactly once, on a connection taken from the pool, bypassing
    the client's retry; a read goes through the client. ``keys`` name the slot (a cluster
    client sends the batch to that slot's node).
    """

    commands: tuple[tuple[Arg, ...], ...]
    write: bool
    keys: tuple[str, ...] = ()


#: What a shell hands back for a batch: one reply per command, error replies as exception
#: values (so every reply of the pipeline is read), or the exception that lost the batch
#: (connection refused or lost, timeout): then the outcome of a write is unknown.
Outcome: TypeAlias = list[Any] | BaseException


def single(call: Call[T]) -> Operation[T]:
    """An operation of one call."""
    return (yield call)  # type: ignore[no-any-return]


def _first(outcome: Outcome) -> Any:
    return outcome if isinstance(outcome, BaseException) else outcome[0]


def settle(call: Call[T], durability: Durability | None, outcome: Outcome) -> T:
    """The call's value from what its batch got back, or the StoreError it stands for."""
    reply = _first(outcome)
    if isinstance(reply, BaseException):
        # Chained: RedisRepository.migrate tells an error reply from a lost link by it.
        raise unavailable(reply, write=call.write) from reply
    if call.write and durability is not None:
        assert isinstance(outcome, list)
        durability.check(outcome[1])
    return call.parse(reply)


def exchange(call: Call[T], durability: Durability | None) -> Generator[Batch, Outcome, T]:
    """One call as round trips: its batch (the write, then the durability confirmation) and,
    after NOSCRIPT, a SCRIPT LOAD and the batch again, the one safe replay: nothing ran."""
    commands: tuple[tuple[Arg, ...], ...] = (call.command(),)
    if call.write and durability is not None:
        commands += (durability.command(),)
    batch = Batch(commands, call.write, call.keys)
    outcome = yield batch
    if call.script is not None and is_noscript(_first(outcome)):
        # SCRIPT LOAD is idempotent: it goes through the client (and its retry) as a read.
        loaded = _first((yield Batch((("SCRIPT", "LOAD", call.script.source),), False)))
        if isinstance(loaded, BaseException):
            raise unavailable(loaded, write=call.write) from loaded
        outcome = yield batch
    return settle(call, durability, outcome)


def _batches(op: Operation[T], durability: Durability | None) -> Generator[Batch, Outcome, T]:
    value: Any = None
    error: StoreError | None = None
    while True:
        try:
            call = op.throw(error) if error is not None else op.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            value, error = (yield from exchange(call, durability)), None
        except StoreError as exc:
            value, error = None, exc


class Conversation(Generic[T]):
    """An operation as the batches a shell sends, one after the other.

    A shell iterates over the batches, sends each and hands its outcome to :meth:`reply`;
    when the iteration ends, :attr:`result` holds the operation's value (or the iteration
    raised its error)::

        conversation = Conversation(op, durability)
        for batch in conversation:
            conversation.reply(send(batch))
        return conversation.result
    """

    def __init__(self, op: Operation[T], durability: Durability | None = None) -> None:
        self._steps = _batches(op, durability)
        self._outcome: Outcome | None = None
        self.result: T

    def __iter__(self) -> Iterator[Batch]:
        outcome: Any = None
        while True:
            try:
                batch = self._steps.send(outcome)
            except StopIteration as stop:
                self.result = stop.value
                return
            self._outcome = None
            yield batch
            outcome = self._outcome
            if outcome is None:
                raise RuntimeError("a shell sent a batch without replying to it")

    def reply(self, outcome: Outcome) -> None:
        """What the batch just sent got back."""
        self._outcome = outcome


# ---------------------------------------------------------------------------- replies


def text(value: Any) -> str:
    """A reply string as str (replies come undecoded)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def reply_error(reply: Any, run: str = "") -> StoreError:
    """The StoreError a script's non-zero status code stands for."""
    code = reply[0]
    if code == 1:
        return NotFound(run)
    if code == 2:
        return AlreadyExists(run)
    if code == 3:
        return Conflict(int(reply[1]))
    if code == 4:
        return LeaseRefused(holder_of(reply[1], reply[2]))
    return Unavailable(f"unexpected script reply: {reply!r}")


def holder_of(owner: Any, live: Any) -> Holder:
    """A holder from the reply shape owner|None, live 0|1."""
    if owner is None or owner is False:
        return Free()
    return Held(text(owner), bool(live))


def ok(run: str = "") -> Callable[[Any], Any]:
    """A parser for replies {0, value?}: returns the value, raises for other codes."""

    def parse(reply: Any) -> Any:
        if not isinstance(reply, list) or not reply:
            raise Unavailable(f"unexpected script reply: {reply!r}")
        if reply[0] != 0:
            raise reply_error(reply, run)
        return reply[1] if len(reply) > 1 else None

    return parse


def parse_names(reply: Any) -> list[str]:
    """A list of run ids."""
    return [text(name) for name in reply]


def parse_current(reply: list[Any]) -> Current:
    """run_get's reply as a Current."""
    _, revision, record, owner, live, key, dep_rev, claimed_at = reply
    claim = None
    if claimed_at is not None:
        claim = ClaimInfo(
            key=text(key) if key else None,
            dependency_revision=int(dep_rev) if dep_rev else None,
            claimed_at=int(claimed_at),
        )
    return Current(int(revision), bytes(record), holder_of(owner, live), claim)


# ---------------------------------------------------------------------------- encodings


def lease_args(lease: Lease) -> tuple[str, str, int]:
    """A lease as (kind, owner, ttl) script arguments."""
    if isinstance(lease, Hold):
        return "h", lease.owner, 0
    if isinstance(lease, Claim):
        return "c", lease.owner, lease.ttl
    if isinstance(lease, Seize):
        return "s", lease.owner, lease.ttl
    return "r", "", 0


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


# ---------------------------------------------------------------------------- operations


class _Ops(Protocol):
    keys: Keyspace


OpsT = TypeVar("OpsT", bound=_Ops)


class Shell(Generic[OpsT]):
    """Base of the store classes, sync and async: each holds its operations (``_ops``, a
    :class:`RunOps` or a ``RepositoryOps``) and a transport that sends them."""

    _ops: OpsT

    @property
    def namespace(self) -> str:
        """The namespace the store's keys live in (they share the hash tag ``{namespace}``)."""
        return self._ops.keys.namespace


class RunOps:
    """The run store's operations over one namespace, as pure generators of calls."""

    def __init__(self, namespace: str, discover: Discover | None, projection_version: int) -> None:
        self.keys = Keyspace(namespace)
        if discover is not None and not callable(discover):
            raise TypeError("discover must be a callable taking record bytes, or None")
        self.discover = discover
        self.projection_version = check_projection_version(projection_version)

    def _wait(self, record: bytes) -> tuple[Arg, ...]:
        wait = None if self.discover is None else check_wait(self.discover(record))
        return (*wait_args(wait), self.projection_version)

    def now(self) -> Operation[int]:
        """Backend clock, UTC ms, read by the server (or cluster node) holding the namespace."""
        now: int = yield Call(scripts.RUN_NOW, (self.keys.leases,), (self.keys.prefix,), ok(),
                              write=False)
        return int(now)

    def get(self, run: str) -> Operation[Current]:
        """The run's record, revision, holder and claim info."""
        run = check_run(run)
        reply = yield Call(scripts.RUN_GET, (self.keys.run(run),), (self.keys.prefix,),
                           lambda r: r, write=False)
        if reply[0] != 0:
            raise reply_error(reply, run)
        return parse_current(reply)

    def insert(self, run: str, record: bytes, lease: Lease) -> Operation[None]:
        """Create the run at revision 1."""
        run, record, lease = check_run(run), check_record(record), check_lease(lease)
        args = (self.keys.prefix, run, record, *lease_args(lease), *self._wait(record))
        yield Call(scripts.RUN_INSERT, (self.keys.run(run), self.keys.leases, self.keys.ready),
                   args, ok(run))

    def compare_and_set(self, run: str, expected: int, record: bytes,
                        lease: Lease) -> Operation[None]:
        """Write revision expected + 1 under the lease condition."""
        run, expected = check_run(run), check_revision(expected)
        record, lease = check_record(record), check_lease(lease)
        args = (self.keys.prefix, run, expected, record, *lease_args(lease),
                *self._wait(record))
        yield Call(scripts.RUN_COMPARE_AND_SET,
                   (self.keys.run(run), self.keys.leases, self.keys.ready), args, ok(run))

    def renew(self, owner: str, runs: Iterable[str], ttl: int) -> Operation[list[str]]:
        """Extend owner's live leases among runs to ttl from now."""
        owner, ttl, names = check_owner(owner), check_ttl(ttl), check_runs(runs)
        if not names:
            return []
        reply = yield Call(scripts.RUN_RENEW, (self.keys.leases,),
                           (self.keys.prefix, owner, ttl, *names), ok())
        return parse_names(reply)

    def claim_expired(self, owner: str, ttl: int, limit: int) -> Operation[list[str]]:
        """Claim up to limit held, expired leases."""
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        if limit == 0:
            return []
        reply = yield Call(scripts.RUN_CLAIM_EXPIRED, (self.keys.leases,),
                           (self.keys.prefix, owner, ttl, limit), ok())
        return parse_names(reply)

    def claim_ready(self, owner: str, ttl: int, limit: int) -> Operation[list[str]]:
        """Claim up to limit free, eligible runs."""
        owner, ttl, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        if limit == 0:
            return []
        reply = yield Call(scripts.RUN_CLAIM_READY, (self.keys.ready, self.keys.leases),
                           (self.keys.prefix, owner, ttl, limit, self.projection_version), ok())
        return parse_names(reply)

    def refresh(self, run: str) -> Operation[bool]:
        """Re-derive the run's wait from its current record; True when it has one."""
        run = check_run(run)
        # A write between our read and our refresh derived fresh metadata itself, unless it
        # came from a store with a lower projection version: read again and retry.
        for _ in range(16):
            current = yield from self.get(run)
            args = (self.keys.prefix, run, current.revision, *self._wait(current.record))
            try:
                indexed = yield Call(scripts.RUN_REFRESH, (self.keys.run(run), self.keys.ready),
                                     args, ok(run))
            except Conflict:
                continue
            return bool(indexed)
        raise Unavailable(f"refresh of {run!r} gave up: the run kept changing under it")
