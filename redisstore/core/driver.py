"""The sans-I/O core shared by the sync and asyncio shells.

An operation is a generator: it validates its arguments (raising before anything is sent),
yields :class:`Call` values, gets each call's :class:`Settled` back and returns its result.
A :class:`Driver` turns an operation into the batches a shell sends and decides what each
:class:`~redisstore.core.outcomes.Exchange` the shell reports means. The shells only move bytes,
so the logic of every operation exists once. Nothing here does I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from . import outcomes, scripts, telemetry
from .errors import (
    NOT_APPLIED,
    UNKNOWN,
    StoreError,
    Unavailable,
)
from .outcomes import ErrorReply, Exchange, Lost, Reply
from .outcomes import text as text

T = TypeVar("T")
log = logging.getLogger(__name__)
Arg: TypeAlias = str | bytes | int


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One round trip: EVALSHA of ``script`` (or, with no script, the plain command ``args``).

    ``write`` marks a call that may change data: it is sent exactly once, never replayed
    after a failure whose outcome is unknown. ``parse`` turns the raw reply into a value or
    raises the contract's answer (``Conflict``...).

    ``fresh`` gives the call a deadline of its own: the store's ``timeout`` counts again
    from when it is first sent, instead of what is left of the operation's. For an
    operation of as many round trips as its data needs, each of which may take the whole
    ``timeout`` (``get_many`` past its 2 MiB budget: 150 records of 2 MiB are 150 round
    trips), so that the call ends by a round trip that hangs, not by one that is merely
    not the first.
    """

    script: scripts.Script | None
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    parse: Callable[[Any], T] = field(repr=False)
    write: bool = True
    fresh: bool = False

    def command(self, *, source: bool = False) -> tuple[bytes | int, ...]:
        """The command as sent: EVALSHA sha numkeys keys... args... (or the plain command).
        With ``source``, EVAL of the script's source instead: it runs the script and caches
        it, in one command.

        Text is encoded here, as UTF-8, whatever encoding the client was made with: the
        keys a store writes are the keys it reads.
        """
        if self.script is None:
            return _encoded(self.args)
        name = (b"EVAL", self.script.source) if source else (b"EVALSHA", self.script.sha.encode())
        return (*name, len(self.keys), *_encoded(self.keys), *_encoded(self.args))

    def wire(self) -> tuple[Arg, ...]:
        """:meth:`command` (EVALSHA) with its text not encoded yet: for a packer that
        encodes text as UTF-8 itself (hiredis; see ``redisstore.shells.sync._pack_one``)."""
        if self.script is None:
            return self.args
        return (b"EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def _encoded(args: tuple[Arg, ...]) -> tuple[bytes | int, ...]:
    # surrogateescape: a name that came back from the server as bytes that are not UTF-8
    # (see text) goes back as the same bytes.
    return tuple(a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a
                 for a in args)


@dataclass(frozen=True, slots=True)
class Settled(Generic[T]):
    """What an operation gets back for a call: the parsed value, or the StoreError the call
    ended in. :meth:`unwrap` gives the value or raises the error."""

    value: T | None = None
    error: StoreError | None = None

    def unwrap(self) -> T:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


#: An operation: a generator that validates its arguments (raising before anything is
#: sent), yields calls, gets each one's :class:`Settled` back and returns its result.
Operation: TypeAlias = Generator[Call[Any], Settled[Any], T]


@dataclass(frozen=True, slots=True)
class Fan:
    """Operations to run at once, each in its own partition: the shell sends them grouped by
    node and answers each with its :class:`~redisstore.core.driver.Settled`, in order.

    A ``patient`` fan is of reads only (or of calls safe to send again, that change nothing
    a caller sees), whose call goes on without the partitions that do not answer: once a
    node has answered, the shell waits for the others only a part of the call's deadline
    (:func:`redisstore.core.groups.patience`) and answers the calls of a node still silent
    ``Unavailable(outcome="not_applied")``, so the call's next round trip still has time.
    A fan with a write is never patient: its calls get the whole deadline."""

    ops: tuple[Operation[Any], ...]
    patient: bool = False


#: The steps of a call over many partitions: yields fans, gets their answers, returns.
Steps: TypeAlias = Generator[Fan, list[Settled[Any]], T]


class Spread(Generic[T]):
    """A call over many partitions, as its :data:`Steps` (the shells' ``drive`` runs it)."""

    __slots__ = ("steps",)

    def __init__(self, steps: Steps[T]) -> None:
        self.steps = steps


#: What a store's operations make, one partition's or many's: what a shell drives.
Sendable: TypeAlias = Operation[T] | Spread[T]


Y = TypeVar("Y")
S = TypeVar("S")


def preceded(check: Generator[Y, S, None], op: Generator[Y, S, T]) -> Generator[Y, S, T]:
    """``op`` with ``check`` sent before it: first ``op``'s argument checks (a bad argument
    raises before anything is sent), then ``check``'s steps, then ``op``'s. An operation
    with nothing to send sends no check either."""
    try:
        first = next(op)  # runs op's argument checks
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    yield from check
    answer = yield first
    while True:
        try:
            step = op.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer = yield step


def next_step(steps: Generator[Y, Any, Any], value: Any, error: BaseException | None
              ) -> Y | None:
    """The next step ``steps`` asks for, given the last one's ``value`` or ``error`` (thrown
    in); None once they ended. What drives steps written once for a sync and an asyncio
    caller (a worker's loop, a pipeline's send) with each caller's own calls."""
    try:
        return steps.send(value) if error is None else steps.throw(error)
    except StopIteration:
        return None


def fanned(op: Operation[None]) -> Generator[Fan, list[Settled[Any]], None]:
    """One operation as the steps of a call over partitions: a fan of it alone."""
    (settled,) = yield Fan((op,))
    settled.unwrap()


def fan(ops: Iterable[Operation[Any]], *, patient: bool = False
        ) -> Generator[Fan, list[Settled[Any]], list[Settled[Any]]]:
    """Run ``ops`` at once; their answers, in order (``patient``: see :class:`Fan`)."""
    batch = tuple(ops)
    if not batch:
        return []
    return (yield Fan(batch, patient))


@dataclass(frozen=True, slots=True)
class Durability:
    """Confirm each write before it counts: ``WAIT replicas timeout`` and, with ``aof``,
    ``WAITAOF 1 replicas timeout`` (the primary and ``replicas`` replicas fsynced it; Redis
    >= 7.2, Valkey >= 8). The confirmation is pipelined with the write: still one round trip.

    A write applied but not confirmed within ``timeout`` ms raises ``Unavailable`` with
    ``outcome == "applied_unconfirmed"``: it may be lost if the primary fails now. A write
    the contract refused (``Conflict``, ``LeaseRefused``...) raises that answer: nothing was
    written, so there is nothing to confirm. ``timeout`` must be below the store's.
    """

    replicas: int = 0
    timeout: int = 1000
    aof: bool = False

    def __post_init__(self) -> None:
        for name in ("replicas", "timeout"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if type(self.aof) is not bool:
            raise TypeError("aof must be a bool")
        if self.timeout == 0:
            raise ValueError("timeout 0 would make WAIT block forever; give milliseconds")

    def command(self) -> tuple[bytes | int, ...]:
        """The command sent right after each write, on the same connection."""
        if self.aof:
            return (b"WAITAOF", 1, self.replicas, self.timeout)
        return (b"WAIT", self.replicas, self.timeout)

    def problem(self, reply: Reply | ErrorReply | Lost) -> str | None:
        """Why ``reply`` does not confirm the write, or None when it does."""
        if isinstance(reply, Lost):
            return f"the confirmation's reply was lost ({reply.reason})"
        if isinstance(reply, ErrorReply):
            return f"{self.command()[0].decode()} failed: {reply}"  # type: ignore[union-attr]
        try:
            if self.aof:
                local, replicas = int(reply.value[0]), int(reply.value[1])
                if local < 1 or replicas < self.replicas:
                    return (f"not confirmed in {self.timeout} ms: fsynced locally {local}, by "
                            f"{replicas} of {self.replicas} replicas")
            elif int(reply.value) < self.replicas:
                return (f"not confirmed in {self.timeout} ms: {int(reply.value)} of "
                        f"{self.replicas} replicas acknowledged it")
        except (TypeError, ValueError, IndexError):
            return f"unexpected confirmation reply {reply.value!r}"
        return None


def check_durability(durability: object) -> Durability | None:
    """A store's ``durability`` option: a Durability or None."""
    if durability is not None and not isinstance(durability, Durability):
        raise TypeError("durability must be a redisstore.Durability (or None), not "
                        f"{type(durability).__name__}")
    return durability


#: The default deadline of one store call, in ms: far below any sensible lease ttl (a call
#: that hangs must fail while the caller's leases still have time to be renewed).
DEFAULT_TIMEOUT = 5000


def check_io(durability: object, timeout: object) -> tuple[Durability | None, int]:
    """A store's ``durability`` and ``timeout`` (ms, the deadline of each call) options.
    A durability confirmation must be able to finish within the call's deadline."""
    checked = check_durability(durability)
    if type(timeout) is not int:
        raise TypeError(f"timeout must be an int of milliseconds, not {type(timeout).__name__}")
    if not 1 <= timeout <= 3_600_000:
        raise ValueError(f"timeout must be between 1 and 3600000 ms, got {timeout}")
    if checked is not None and checked.timeout >= timeout:
        raise ValueError(f"Durability.timeout ({checked.timeout} ms) must be below the "
                         f"store's timeout ({timeout} ms), or every unconfirmed write would "
                         "end in a lost reply instead of an answer")
    return checked, timeout

# ---------------------------------------------------------------------------- the wire


@dataclass(frozen=True, slots=True)
class Batch:
    """What a shell sends in one round trip: ``commands`` pipelined on one connection.

    Every batch is sent once, on a connection of the store's own pool, never through the
    client's retry. ``keys`` name the slot (a cluster shell sends the batch to that slot's
    node). ``write`` says whether it may change data. ``fresh``: the first sending of a
    :class:`Call` that has a deadline of its own; the shell starts the deadline again for
    it (a reload or a read sent again keeps the one it had).
    """

    commands: tuple[tuple[bytes | int, ...], ...]
    write: bool
    keys: tuple[str, ...] = ()
    fresh: bool = False


def continued(op: Operation[T], call: Call[Any]) -> Operation[T]:
    """``op``, which yielded ``call`` already (its arguments checked), as an operation that
    yields it again, then goes on as ``op`` does: what a pipeline of one call (or of a
    finish and the claim fused with it) runs as the store runs one call."""
    settled = yield call
    while True:
        try:
            call = op.send(settled)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        settled = yield call


def ask(call: Call[T]) -> Operation[T]:
    """An operation of one call: its value, or raise its error."""
    return (yield call).unwrap()  # type: ignore[no-any-return]


#: NOSCRIPT is routine (every restart, promotion and SCRIPT FLUSH empties the cache): the
#: driver sends the call again this many times before it gives up (first behind SCRIPT
#: LOAD, then as EVAL, which a real server never answers NOSCRIPT).
MAX_RELOADS = 5
#: A read whose connection broke (not its deadline) is sent again this many times.
READ_RETRIES = 1


def script_error(call: Call[Any], error: ErrorReply, *, write: bool,
                 doing: str = "") -> Unavailable:
    """The Unavailable of an error reply to ``call``: a position in the script's source
    (``user_script:104``) is shown as the file and line it came from (``_lib/codec.lua:42``),
    after the script's name."""
    if call.script is not None:
        shown = call.script.map_error(str(error))
        if shown != str(error):
            return outcomes.refused(error, write=write, shown=shown,
                                    doing=f"{doing} {call.script.name}".strip())
    return outcomes.refused(error, write=write, doing=doing)


def settle(call: Call[T], durability: Durability | None, got: Exchange) -> Settled[T]:
    """The call's value from what its batch got back, or the StoreError it stands for.

    The contract's reply is parsed first: a refused write (``Conflict``...) wrote nothing,
    whatever its confirmation says. Only an applied write is judged by ``durability``.
    """
    first = got.replies[0] if got.replies else None
    if first is None:
        assert got.lost is not None
        return Settled(error=outcomes.lost(got.lost, write=call.write))
    if isinstance(first, ErrorReply):
        return Settled(error=script_error(call, first, write=call.write))
    answer = parsed(call, first.value)
    if answer.error is None and call.write and durability is not None:
        second: Reply | ErrorReply | Lost | None = (
            got.replies[1] if len(got.replies) > 1 else got.lost)
        problem = durability.problem(second) if second is not None else "no confirmation"
        if problem is not None:
            return Settled(error=outcomes.unconfirmed(problem))
    return answer


def parsed(call: Call[T], value: Any) -> Settled[T]:
    """What a plain (not an error) reply of ``call`` means: its parsed value, the StoreError
    it answers (a refused write wrote nothing), or ``Unavailable`` for a reply that does not
    parse (the outcome of a write is then unknown)."""
    try:
        return Settled(call.parse(value))
    except StoreError as answer:
        return Settled(error=answer)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        outcome = UNKNOWN if call.write else NOT_APPLIED
        return Settled(error=Unavailable(
            f"unexpected reply {value!r:.200} ({exc})", code="PROTOCOL", outcome=outcome))


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """An operation's value: what :func:`resume` gives once the operation has returned."""

    value: T


def resume(op: Operation[T], settled: Settled[Any]) -> Call[Any] | Done[T]:
    """Send ``settled`` into ``op``: the next call it makes, or :class:`Done` with its value.
    An ``Unavailable`` the operation raises is logged, as a :class:`Driver` logs it, and
    raised: for the shells that step an operation themselves (the lean paths)."""
    try:
        return op.send(settled)
    except StopIteration as stop:
        return Done(stop.value)
    except Unavailable as exc:
        log.info("redisstore: %s (outcome %s, code %s)", exc.reason, exc.outcome, exc.code)
        raise


class Machine(Protocol):
    """What a shell runs: a :class:`Driver` (one operation) or a pipeline's ``Group``."""

    def next_batch(self) -> Batch | None:
        """The batch to send now, or None when it is over."""
        ...

    def receive(self, got: Exchange) -> None:
        """What the batch just sent got back."""
        ...


#: A driver's batch before it is asked for (Driver.next_batch makes it).
_UNMADE = Batch((), False)


class Driver(Generic[T]):
    """Runs one operation as the batches a shell sends, one after the other.

    Explicit state, no hidden control flow: :meth:`next_batch` says what to send (None when
    the operation is over), :meth:`receive` takes what came back, :meth:`result` gives the
    operation's value or raises its error. Building a driver runs the operation's argument
    checks: a bad argument raises there, before anything is sent. A shell is::

        driver = Driver(op, durability)
        while (batch := driver.next_batch()) is not None:
            driver.receive(send(batch))
        return driver.result()

    The driver alone decides what a reply means: after NOSCRIPT (nothing ran) it sends
    SCRIPT LOAD and the call again in one batch, and if the call still meets NOSCRIPT, the
    call as EVAL of its script's source (up to :data:`MAX_RELOADS` times in all); a broken
    read is sent again once; everything else settles the call (:func:`settle`).
    """

    def __init__(self, op: Operation[T], durability: Durability | None = None) -> None:
        self._op = op
        self._durability = durability
        self._call: Call[Any] | None = None
        self._batch: Batch | None = None
        self._loading = False
        self._reloads = 0
        self._retries = 0
        self._result: T | None = None
        self._error: BaseException | None = None
        #: What telemetry records of this call: the operation (its last script or
        #: command), the namespace, the result.
        self.telemetry = telemetry.Call()
        self._step(None)

    @classmethod
    def resumed(cls, op: Operation[T], call: Call[Any], durability: Durability | None = None
                ) -> Driver[T]:
        """A driver of ``op``, which a shell already stepped to ``call`` (its arguments
        checked) and whose batch it sent: ``receive`` what that batch got back, go on as
        usual. A shell's lean path takes the plain replies itself and hands the rest
        (an error reply, a lost exchange, a durability confirmation) to such a driver."""
        driver: Driver[T] = cls.__new__(cls)
        driver._op, driver._durability = op, durability
        driver._result, driver._error = None, None
        driver.telemetry = telemetry.Call()
        driver._took(call)
        return driver

    def next_batch(self) -> Batch | None:
        """The batch to send now, or None when the operation is over."""
        if self._batch is _UNMADE:
            assert self._call is not None
            self._batch = self._first_batch(self._call)
        return self._batch

    def over(self) -> bool:
        """Whether the operation is over (its batch is not made to ask)."""
        return self._batch is None

    def receive(self, got: Exchange) -> None:
        """What the batch just sent got back."""
        call = self._call
        if call is None or self._batch is None:
            raise RuntimeError("receive() without a batch in flight")
        if self._loading:
            # The batch was SCRIPT LOAD, then the call: the first reply is the load's.
            load = got.replies[0] if got.replies else None
            if isinstance(load, ErrorReply):
                # Refused (a script that does not compile, a missing right...): the call
                # behind it met NOSCRIPT and never ran.
                self._step(Settled(error=script_error(call, load, write=False,
                                                      doing="SCRIPT LOAD")))
                return
            got = Exchange(got.replies[1:], got.lost)
        first = got.replies[0] if got.replies else None
        if call.script is not None and isinstance(first, ErrorReply) \
                and first.code == "NOSCRIPT":
            if self._reloads < MAX_RELOADS:
                self._reloads += 1
                log.info("redisstore: %s was not in the server's script cache (a restart, a "
                         "failover or SCRIPT FLUSH): loading it again", call.script.name)
                # Nothing ran. First the load and the call in one batch: a script that does
                # not compile (or a user without the right to load) is refused by SCRIPT
                # LOAD, and a lost reply of the batch is the call's own. The server usually
                # runs the two back to back, but it may read a long script in two parts
                # and serve another client's SCRIPT FLUSH in between; then EVAL, which runs
                # and caches the script in one command. (With a round trip between load
                # and call, a writer starved of CPU while the cache was flushed every 5 ms
                # met NOSCRIPT six times in a row.)
                if self._reloads == 1:
                    self._batch, self._loading = self._loading_batch_of(call), True
                else:
                    self._batch, self._loading = self._eval_batch_of(call), False
                return
            self._step(Settled(error=Unavailable(
                f"NOSCRIPT {MAX_RELOADS + 1} times for {call.script.name}, even to EVAL of "
                "its source: something between the store and the server answers it; nothing "
                "was applied", code="NOSCRIPT", outcome=NOT_APPLIED)))
            return
        if first is None and not call.write and got.lost is not None \
                and not got.lost.timed_out and self._retries < READ_RETRIES:
            self._retries += 1
            if self._batch.fresh:  # sent again within the deadline it already has
                self._batch = replace(self._batch, fresh=False)
            return  # send the same read again
        self._step(settle(call, self._durability, got))

    def settled(self, value: Any = None, error: BaseException | None = None) -> None:
        """The operation ran elsewhere (:func:`continued`, sent as one call): its value, or
        its error."""
        self._call, self._batch, self._result, self._error = None, None, value, error

    def result(self) -> T:
        """The operation's value, or raise its error."""
        if self._batch is not None:
            raise RuntimeError("the operation is not over")
        if self._error is not None:
            if isinstance(self._error, Unavailable):
                # The caller gets the error; the log keeps what happened (outcome, code).
                log.info("redisstore: %s (outcome %s, code %s)", self._error.reason,
                         self._error.outcome, self._error.code)
            raise self._error
        return self._result  # type: ignore[return-value]

    def _step(self, settled: Settled[Any] | None) -> None:
        try:
            call = next(self._op) if settled is None else self._op.send(settled)
        except StopIteration as stop:
            self._call, self._batch, self._result = None, None, stop.value
            return
        except Exception as error:
            if settled is None:
                raise  # raised before anything was sent: the caller sees it at once
            # After a reply (a discover that raises in refresh, say): the operation's own
            # error, kept for result(), so a pipeline's other calls still get theirs.
            self._call, self._batch, self._error = None, None, error
            return
        self._took(call)

    def _took(self, call: Call[Any]) -> None:
        """The operation yielded ``call``: it is the batch to send now, made when asked
        (next_batch): a call a pipeline fuses with the next, or sends by the lean path
        (continued), is never encoded as a batch."""
        self._call, self._reloads, self._retries = call, 0, 0
        if telemetry.recording():  # nothing to record otherwise: no work per call
            self._name(call)
        self._batch, self._loading = _UNMADE, False

    def _first_batch(self, call: Call[Any]) -> Batch:
        batch = self._batch_of(call)
        if call.fresh:  # its first sending starts the deadline again (Batch.fresh)
            batch = replace(batch, fresh=True)
        return batch

    def _name(self, call: Call[Any]) -> None:
        """What telemetry says the call was: its script (or command) and namespace."""
        self.telemetry.name = call.script.name if call.script is not None else text(
            call.args[0]) if call.args else None
        if call.keys and self.telemetry.namespace is None:
            tag = call.keys[0]
            end = tag.find("}:")
            if tag.startswith("{") and end > 0:
                self.telemetry.namespace = tag[1:end]

    def _batch_of(self, call: Call[Any]) -> Batch:
        return self._confirmed(call, call.command())

    def _eval_batch_of(self, call: Call[Any]) -> Batch:
        """The call as EVAL of its script's source."""
        return self._confirmed(call, call.command(source=True))

    def _confirmed(self, call: Call[Any], command: tuple[bytes | int, ...]) -> Batch:
        """``command``, followed by the durability confirmation when it is a write."""
        commands: tuple[tuple[bytes | int, ...], ...] = (command,)
        if call.write and self._durability is not None:
            commands += (self._durability.command(),)
        return Batch(commands, call.write, call.keys)

    def _loading_batch_of(self, call: Call[Any]) -> Batch:
        """SCRIPT LOAD of the call's script, then the call (after NOSCRIPT)."""
        assert call.script is not None
        batch = self._batch_of(call)
        return Batch(((b"SCRIPT", b"LOAD", call.script.source), *batch.commands), batch.write,
                     batch.keys)


# ---------------------------------------------------------------------------- pipelines
# What a call queued in a pipeline will answer: here, beside its Driver, so that the
# groups that send it and the pipelines' mixin that types it stand one floor lower.


class Pending(Generic[T]):
    """What a call queued in a pipeline will answer: :meth:`result` gives its value or
    raises its own error, once the pipeline has been sent."""

    __slots__ = ("_driver", "_error", "_later", "_part", "_write")

    def __init__(self, driver: Driver[T] | None, write: bool = True) -> None:
        self._driver: Driver[Any] | None = driver
        self._error: BaseException | None = None
        self._write = write
        #: The answer of a blocked claim's wait after the round trip, when it waited.
        self._later: tuple[T] | None = None
        #: A call that shares one script with its neighbour (runops.fused): which of the
        #: driver's two answers is its own (None: the driver is its own).
        self._part: int | None = None

    def done(self) -> bool:
        """Whether the call has its answer (the pipeline was sent)."""
        return self._error is not None or (self._driver is not None
                                           and self._driver.over())

    def result(self) -> T:
        """The call's value, or raise its error (``Conflict``, ``Unavailable``...);
        ``RuntimeError`` before the pipeline was sent."""
        if self._error is not None:
            raise self._error
        if self._later is not None:
            return self._later[0]
        if self._driver is None or not self._driver.over():
            raise RuntimeError("the pipeline has not been sent yet: leave its with block "
                               "(or call send()) first")
        if self._part is not None:
            return self._driver.result()[self._part].unwrap()  # type: ignore[no-any-return]
        return self._driver.result()  # type: ignore[no-any-return]

    def _fail(self, error: BaseException) -> None:
        """Answer with ``error``, unless the call has its answer already."""
        if not self.done():
            self._error = error


# ---------------------------------------------------------------------------- operations

# Eviction policies that may drop keys without a TTL, i.e. ours. volatile-* only evicts
# keys with an expiry, which the stores never set.
EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


class PerNode(set[str]):
    """The one-time server checks of a cluster's shell: each is of one node, so a store of
    partitions keeps them per partition (:class:`~redisstore.core.partitions.PartitionedOps`),
    each partition's asked of its own node before its first write there."""


def eviction_policy(route: str) -> Operation[str | None]:
    """The ``maxmemory-policy`` of the server holding the key ``route`` (on a cluster, the
    node of its slot: the one whose settings the namespace depends on), from ``INFO memory``
    (a right that reveals no secret, unlike ``CONFIG GET``, which reads the passwords too),
    else from CONFIG GET."""
    try:
        reply = yield from ask(Call(None, (route,), ("INFO", "memory"), lambda r: r,
                                    write=False))
    except StoreError as exc:
        if getattr(exc, "code", None) is None:
            raise  # the server could not be asked
        reply = None
    for line in text(reply or b"").splitlines():
        name, _, value = line.partition(":")
        if name == "maxmemory_policy" and value.strip():
            return value.strip()
    return (yield from config_get("maxmemory-policy", route))


def config_get(name: str, route: str) -> Operation[str | None]:
    """One CONFIG GET value of the server holding the key ``route`` (None when the server
    does not know the setting). ``route`` only chooses the node: it is not sent."""
    reply = yield from ask(Call(None, (route,), ("CONFIG", "GET", name), lambda r: r,
                                write=False))
    if isinstance(reply, dict):  # RESP3
        values = {text(k): v for k, v in reply.items()}
    else:
        values = {text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    value = values.get(name)
    return None if value is None else text(value)
