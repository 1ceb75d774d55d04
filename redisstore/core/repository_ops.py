"""The Redis repository's operations, sans-I/O: each a generator of
:class:`~redisstore.core.driver.Call` (as :class:`~redisstore.core.runops.RunOps` is for
the run store) and the parsing of their replies; the shells only send them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from . import scripts
from .driver import EVICTING, Call, Operation, ask, config_get, eviction_policy, text
from .errors import (
    ConcurrentUpdate,
    Corrupt,
    Misconfigured,
    StoreError,
    Unavailable,
    UnknownGroup,
)
from .keys import Keyspace
from .replies import Uncounted, partitioned, reply_parts
from .repository import (
    _INT,
    LAYOUT_VERSION,
    MAX_INT64,
    MAX_OFFSET_US,
    MAX_PAGE,
    MAX_VERSION,
    MIN_INT64,
    InFlightPage,
    InstanceLease,
    InstanceRecord,
    Logger,
    Status,
    check_cursor,
    check_expected_version,
    check_group,
    check_id,
    check_max_terminal,
    check_now,
    check_page_limit,
    check_record,
    from_us,
    log,
    offset_us,
    to_us,
)
from .scripts import Code

F = TypeVar("F", bound=Callable[..., Any])

#: The repository's methods both stores offer, in the order the core defines them: each
#: sends its operation of the same name, with the signature and the docstring it has
#: here. redisstore/build/ops.py writes the two stores' from them (their mixins
#: ``RepositoryStoreOps``, ``AsyncRepositoryStoreOps``).
PUBLIC: list[str] = []


def public(method: F) -> F:
    """Mark ``method`` as one both repository stores offer (see :data:`PUBLIC`)."""
    PUBLIC.append(method.__name__)
    return method

# ---------------------------------------------------------------------------- replies


def _text(id: str, name: str, raw: Any, *, empty: bool = True) -> str:
    """A stored text field, or Corrupt: absent, empty where it may not be, or not UTF-8."""
    if not isinstance(raw, bytes | str):
        raise Corrupt(id, name)
    try:
        value = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise Corrupt(id, name) from None
    if not value and not empty:
        raise Corrupt(id, name)
    return value


def _int(id: str, name: str, raw: Any, lo: int, hi: int) -> int:
    """A stored canonical decimal integer in [lo, hi], or Corrupt (the script checked the
    form already; this holds for any reply)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        digits = _text(id, name, raw)
        if not _INT.match(digits):
            raise Corrupt(id, name)
        value = int(digits)
    if not lo <= value <= hi:
        raise Corrupt(id, name)
    return value


def parse_record(id: str, payload: Any) -> InstanceRecord:
    """repo_load's payload as an InstanceRecord; a field that fails is Corrupt(id, field)."""
    if not isinstance(payload, list) or len(payload) != 9:
        raise Corrupt(id, "reply")
    version, body, group, tenant, expiry, offset, owner, incarnation, status = payload
    if not isinstance(body, bytes):
        raise Corrupt(id, "pl")
    expiry_text = _text(id, "x", expiry)
    offset_us_ = _int(id, "xo", offset, -MAX_OFFSET_US, MAX_OFFSET_US)
    at = None
    if expiry_text:
        try:
            at = from_us(_int(id, "x", expiry_text, -(10**18), 10**18), offset_us_)
        except OverflowError:  # the instant exists, its wall time in that offset does not
            raise Corrupt(id, "x") from None
    lease = InstanceLease(expiry=at, owner=_text(id, "o", owner),
                          incarnation=_int(id, "n", incarnation, MIN_INT64, MAX_INT64))
    return InstanceRecord(id=id, payload=body, group=_text(id, "g", group, empty=False),
                          tenant=_text(id, "t", tenant), lease=lease,
                          rec_version=_int(id, "v", version, 1, MAX_VERSION),
                          status=Status(_text(id, "s", status, empty=False)))


def answer(id: str, *, stale: Callable[[Any], StoreError] | None = None,
           group: str = "", namespace: str = "", opened: int | None = None
           ) -> Callable[[Any], Any]:
    """A parser of ``{code, payload, dropped, next_due}`` replies (the run store's shape and
    :class:`~redisstore.core.scripts.Code`): the payload on OK, else the contract's answer.
    ``stale`` makes CONFLICT's error from the stored version; ``opened``: the partition
    count of the repository that calls (None: one partition)."""

    def parse(reply: Any) -> Any:
        code, payload = reply_parts(reply)
        if code == Code.OK:
            return payload
        if code == Code.CORRUPT:
            raise Corrupt(id, text(payload))
        if code == Code.CONFLICT and stale is not None:
            raise stale(payload)
        if code == Code.NOT_FOUND and payload is not None and text(payload) == "group":
            raise UnknownGroup(group)
        if code == Code.TOO_NEW:
            raise Misconfigured(
                f"namespace {namespace!r} has repository layout version {int(payload)}, "
                f"newer than this library's {LAYOUT_VERSION}: upgrade redisstore on this node")
        if code == Code.PARTITIONED:
            if opened is None:
                raise Misconfigured(
                    f"namespace {namespace!r} is spread over {int(payload)} partitions: open "
                    f"the repository with partitions={int(payload)} (nothing was written)")
            raise partitioned(namespace, int(payload), opened, what="repository",
                              step="redisstore.repartition_repository")
        if code == Code.UNCOUNTED:
            raise Uncounted(f"namespace {namespace!r}: a partition records no repository "
                            "partition count (nothing was written)")
        raise ValueError(f"unexpected reply code {code!r}")

    return parse


def _load_answer(id: str, namespace: str, opened: int | None = None
                 ) -> Callable[[Any], InstanceRecord | None]:
    ok = answer(id, namespace=namespace, opened=opened)

    def parse(reply: Any) -> InstanceRecord | None:
        if isinstance(reply, list) and reply and reply[0] == Code.NOT_FOUND:
            return None
        return parse_record(id, ok(reply))

    return parse


def _server_error(exc: StoreError) -> bool:
    """Whether a failed call got an error reply (the server answered: NOPERM, unknown
    command...), not a lost link: only an answer carries the server's code."""
    return isinstance(exc, Unavailable) and exc.code is not None




# ---------------------------------------------------------------------------- operations


class RepositoryOps:
    """The repository's operations over one namespace, as pure generators of calls."""

    def __init__(self, namespace: str, max_terminal: int = 1024,
                 logger: Logger | None = None, *, partition: int | None = None) -> None:
        #: The namespace's keys, or one partition's (see redisstore.core.partitioned_repository).
        self.keys = Keyspace(namespace, partition)
        self.max_terminal = check_max_terminal(max_terminal)
        self.logger: Logger = logger if logger is not None else log
        # save is the hot path (one per engine checkpoint): name its fixed keys once.
        self._instances, self._inflight = self.keys.instance(""), self.keys.inflight("")
        #: ARGV[1] of its scripts: the key prefix, and in a repository of partitions its
        #: count (lua/_common.lua's COUNT_ARG); the count, which refusals name.
        self.arg1 = self.keys.prefix
        self.opened: int | None = None
        self._save_keys = (self.keys.groups, self.keys.terminal, self.keys.terminal_seq)

    @public
    def save(self, rec: InstanceRecord) -> Operation[int]:
        """Store ``rec`` iff ``rec.rec_version`` is the stored version (0 creates).

        Returns the new stored version. Raises ``ConcurrentUpdate`` on a mismatch,
        ``UnknownGroup`` for an unregistered group (nothing written), ``ValueError`` /
        ``TypeError`` for a bad record (nothing sent).
        """
        return self._save(check_record(rec), "")

    def place(self, rec: InstanceRecord) -> Operation[int]:
        """Write ``rec`` as moved here from another partition, with its ``rec_version``
        (where no record of its id is: one stored with that version already is the same
        move made again; another is a ConcurrentUpdate), evicting no terminal record (the
        engines' next saves do). Only :func:`redisstore.repartition_repository` moves."""
        rec = check_record(rec)
        if not 1 <= rec.rec_version < MAX_VERSION:
            raise ValueError(f"a record moved has a version in [1, {MAX_VERSION - 1}] (one "
                             f"save at least left), got {rec.rec_version}")
        return self._save(rec, rec.rec_version)

    def _save(self, rec: InstanceRecord, placed: int | str) -> Operation[int]:
        lease = rec.lease
        expiry = "" if lease.expiry is None else str(to_us(lease.expiry))
        offset = 0 if lease.expiry is None else offset_us(lease.expiry)
        groups, terminal, terminal_seq = self._save_keys
        args = (self.arg1, rec.id, 0 if placed else rec.rec_version, rec.payload, rec.group,
                rec.tenant, expiry, offset, lease.owner, lease.incarnation, str(rec.status),
                MAX_VERSION if placed else self.max_terminal, placed)
        # Keyspace.instance / Keyspace.inflight, without the calls.
        keys = (self._instances + rec.id, groups, self._inflight + rec.group, terminal,
                terminal_seq)
        ok = self._answer(rec.id, group=rec.group, stale=lambda stored: ConcurrentUpdate(
            rec.id, rec.rec_version, int(stored)))

        def parse(raw: Any) -> int:
            version, evicted = ok(raw)
            for id in evicted:
                self.warn_evicted(text(id))
            return int(version)

        return (yield from ask(Call(scripts.REPO_SAVE, keys, args, parse)))

    def _answer(self, id: str, **options: Any) -> Callable[[Any], Any]:
        """:func:`answer` for a call of this namespace (its messages name it)."""
        return answer(id, namespace=self.keys.namespace, opened=self.opened, **options)

    def warn_evicted(self, id: str) -> None:
        """The warning for one evicted terminal record."""
        self.logger.warning(
            "redisstore: evicted terminal instance %r: more than max_terminal=%d terminal "
            "records are kept%s (the oldest go first)", id, self.max_terminal,
            "" if self.keys.partition is None else " in its partition")

    def cluster_compatibility(self) -> tuple[bool, str]:
        """``(True, reason)``: the state lives in the server, shared by every node."""
        namespace = self.keys.namespace
        return True, (f"state lives in Redis, shared by every engine; all keys of namespace "
                      f"{namespace!r} share the hash tag {{{namespace}}}, so each "
                      "operation is one atomic script in one cluster slot")

    @public
    def load(self, id: str) -> Operation[InstanceRecord | None]:
        """The record stored under ``id`` (a fresh copy), or None."""
        # Corrupt when it fails validation.
        id = check_id(id)
        return (yield from ask(Call(scripts.REPO_LOAD, (self.keys.instance(id),),
                                    (self.arg1, id),
                                    _load_answer(id, self.keys.namespace, self.opened),
                                    write=False)))

    @public
    def delete(self, id: str, *, expected_version: int | None = None) -> Operation[None]:
        """Remove the record for ``id``; a no-op when there is none. With
        ``expected_version``, only while the stored ``rec_version`` is that one: else
        ``ConcurrentUpdate`` and nothing is deleted (a zombie's delete after another node
        saved the record)."""
        # A damaged record goes too (unless fenced), with its index entries.
        id = check_id(id)
        fence = check_expected_version(expected_version)
        yield from ask(Call(
            scripts.REPO_DELETE, (self.keys.instance(id), self.keys.terminal),
            (self.arg1, id, "" if fence is None else fence),
            self._answer(id, stale=lambda stored: ConcurrentUpdate(id, fence or 0,
                                                                   int(stored)))))

    @public
    def list_in_flight(self, group: str, now: datetime | None = None) -> Operation[list[str]]:
        """Ids of ``group``'s records that are not terminal, not suspended, and whose lease
        is expired or absent at ``now`` (None: the server's clock). Unregistered: ``[]``."""
        # Read in pages of MAX_PAGE index entries (one bounded script each) at the now of
        # the first page.
        group, when = check_group(group), check_now(now)
        at = "" if when is None else str(to_us(when))
        listed: dict[str, None] = {}  # insertion-ordered; an id moved mid-listing once
        after: tuple[str, bytes] = ("", b"")
        while True:
            ids, at, cursor = yield from self.page(group, at, MAX_PAGE, after)
            listed.update(dict.fromkeys(ids))
            if cursor is None:
                return list(listed)
            after = cursor

    @public
    def list_in_flight_page(self, group: str, now: datetime | None = None, *,
                            cursor: str | None = None,
                            limit: int = MAX_PAGE) -> Operation[InFlightPage]:
        """One page of :meth:`list_in_flight`: at most ``limit`` (<= 1000) ids, and the
        ``cursor`` of the next page (None once the listing is complete); docs/repository.md
        says what a listing across pages guarantees."""
        # At most limit index entries visited from cursor (None: the start); now=None is
        # the server's clock at the first page, carried by the cursor to the next ones.
        group, when, limit = check_group(group), check_now(now), check_page_limit(limit)
        position = check_cursor(cursor)
        at = "" if when is None else str(to_us(when))
        after = ("", b"")
        if position is not None:
            if when is None:
                at = position[0]
            # The id goes back byte for byte, even one that is not UTF-8 (see below).
            after = (position[1], position[2].encode("utf-8", "surrogateescape"))
        ids, at, next_after = yield from self.page(group, at, limit, after)
        if next_after is None:
            return InFlightPage(tuple(ids), None)
        score, last = next_after
        return InFlightPage(tuple(ids),
                            f"{at}|{score}|{last.decode('utf-8', 'surrogateescape')}")

    def page(self, group: str, at: str, limit: int, after: tuple[str, bytes],
              ) -> Operation[tuple[list[str], str, tuple[str, bytes] | None]]:
        """One script's page: (ids, the now it used, the cursor or None when complete)."""
        payload = yield from ask(Call(
            scripts.REPO_LIST_IN_FLIGHT, (self.keys.inflight(group),),
            (self.arg1, group, at, limit, *after),
            self._answer(""), write=False))
        raw_ids, score, last, used = payload
        ids = []
        for raw in raw_ids:
            try:
                ids.append(raw.decode() if isinstance(raw, bytes) else str(raw))
            except UnicodeDecodeError:
                continue  # not an id this library wrote (ids are UTF-8 text): skipped
        done = score is None or score is False
        if done:
            return ids, text(used), None
        # The cursor keeps the last entry's bytes: a foreign member that is not UTF-8 must
        # not stop the listing from moving past it.
        return ids, text(used), (text(score), last if isinstance(last, bytes)
                                 else str(last).encode())

    @public
    def register_group(self, group: str) -> Operation[None]:
        """Establish ``group`` in the registry (idempotent)."""
        group = check_group(group)
        yield from ask(Call(scripts.REPO_REGISTER_GROUP, (self.keys.groups,),
                            (self.arg1, group),
                            self._answer("")))

    @public
    def group_exists(self, group: str) -> Operation[bool]:
        """Whether ``group`` is registered."""
        group = check_group(group)
        found = yield from ask(Call(scripts.REPO_GROUP_EXISTS, (self.keys.groups,),
                                    (self.arg1, group),
                                    self._answer(""), write=False))
        return bool(found)

    # ------------------------------------------------------------------ migrate

    def load_scripts(self) -> Operation[None]:
        """SCRIPT LOAD every repository script (a replica or a restarted server has none)."""
        for script in scripts.REPO_SCRIPTS:
            yield from ask(Call(
                None, (), ("SCRIPT", "LOAD", script.source), lambda r: r, write=False))

    def record_layout(self) -> Operation[int]:
        """Record this library's layout version; returns the one found (0: none)."""
        found = yield from ask(Call(scripts.REPO_MIGRATE, (self.keys.layout,),
                                    (self.arg1, LAYOUT_VERSION),
                                    self._answer("")))
        return int(found)

    def migrate(self, *, settings: bool = True) -> Operation[None]:
        """Load the scripts, record the layout version, and inspect the server's settings
        (unless ``settings`` is False: fakeredis has none to inspect).

        Raises :class:`Misconfigured` when the server may evict our keys; warns when it
        persists nothing; warns and goes on when ``CONFIG GET`` is refused.
        """
        yield from self.load_scripts()
        yield from self.record_layout()
        if not settings:
            return
        try:
            policy = yield from eviction_policy(self.keys.groups)
            save = yield from config_get("save", self.keys.groups)
            appendonly = yield from config_get("appendonly", self.keys.groups)
        except StoreError as exc:
            if not _server_error(exc):
                raise
            self.logger.warning(
                "redisstore: CONFIG GET is not allowed on this server (%s); cannot check "
                "maxmemory-policy or persistence. Make sure the server never evicts keys "
                "(maxmemory-policy noeviction) and persists them (AOF or RDB)", exc)
            return
        if policy in EVICTING:
            raise Misconfigured(
                f"maxmemory-policy is {policy}: under memory pressure the server may evict "
                "the repository's records and indexes. Fix: CONFIG SET maxmemory-policy "
                "noeviction (and set it in redis.conf so it survives a restart)")
        if (save or "") == "" and appendonly != "yes":
            self.logger.warning(
                "redisstore: this server persists nothing (save \"\" and appendonly no): "
                "every instance record is lost when it restarts. Enable AOF "
                "(CONFIG SET appendonly yes) or RDB snapshots")
