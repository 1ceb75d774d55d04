"""One logical instance repository over many partitions (``partitions=N``), as pure
generators (sans-I/O, like :mod:`redisstore.repository`). docs/scale-out.md is the user's
guide.

A record lives in the partition of its id (:func:`redisstore.core.placing.partition_of`: the
``{family}`` part of the id, else the id), the partition a run of the same id is in, so a
record and its run share a node. Every call of one record is that partition's script,
unchanged: one round trip. The calls over every partition:

- ``register_group`` registers the group in every partition (a save checks its own
  partition's registry); ``group_exists`` says True only once every partition has it, so a
  registration cut short reads as absent and is simply made again.
- ``list_in_flight`` lists every partition at one ``now`` (the first page's, from partition
  0's server when ``now`` is None), the partitions' pages at once; the ids partition after
  partition. ``list_in_flight_page`` gives the same ids in pages: a page goes on into the
  next partition when one's listing ends within it; its cursor names the partition.
- The count is the repository's own (key ``{ns}:repo-partitions``), apart from the run
  store's: a run store and a repository of one namespace may differ.
- ``max_terminal`` holds in each partition: a terminal record is never evicted sooner than
  a repository of one partition would evict it (the newer terminal records of its
  partition are a part of all the newer ones), and the partitions hold at most N times
  ``max_terminal`` in all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from . import scripts
from .driver import Operation, Spread, Steps
from .errors import StoreError, Unavailable
from .keys import Keyspace
from .placing import Counted, check_partitions, deferred, partition_of, values_of
from .repository import (
    MAX_PAGE,
    InFlightPage,
    InstanceRecord,
    Logger,
    check_expected_version,
    check_group,
    check_id,
    check_now,
    check_page_limit,
    check_record,
    is_int_text,
    to_us,
)
from .repository_ops import RepositoryOps
from .runs import check_text

#: A listing's position: (partition, now µs, the partition's own cursor score and id, both
#: empty at the partition's start).
Position = tuple[int, str, str, bytes]


class PartitionedRepositoryOps(Counted):
    """The repository's operations over ``partitions`` partitions of one namespace: one
    :class:`RepositoryOps` per partition."""

    what = "repository"
    changing = ("redisstore.repartition_repository changes it: docs/scale-out.md, "
                "'Changing the count'")
    step = "redisstore.repartition_repository"
    parts: list[RepositoryOps]

    def _count_script(self) -> tuple[scripts.Script, tuple[str, ...]]:
        """``repo_partitions``, in the repository's own key: apart from the run store's
        count (a damaged run store meta never reaches the repository)."""
        k = self.keys
        return scripts.REPO_PARTITIONS, (k.repo_partitions, k.groups, k.layout,
                                         k.repo_repartition)

    def __init__(self, namespace: str, max_terminal: int = 1024,
                 logger: Logger | None = None, *, partitions: int = 2) -> None:
        self.n = check_partitions(partitions)
        self.parts = [RepositoryOps(namespace, max_terminal, logger, partition=p)
                      for p in range(self.n)]
        self.keys = Keyspace(namespace)
        self.counted = False
        self.max_terminal = self.parts[0].max_terminal
        for part in self.parts:
            part.opened = self.n
        self._tail(str(self.n))

    def part(self, id: str) -> RepositoryOps:
        """The operations of ``id``'s partition (a bad id raises, as the call would)."""
        return self.parts[partition_of(check_id(id), self.n)]

    # ------------------------------------------------------------------ one record

    def save(self, rec: InstanceRecord) -> Operation[int] | Spread[int]:
        """See :meth:`RepositoryOps.save`, in the record's partition."""
        rec = check_record(rec)
        part = self.part(rec.id)
        return self._counted(lambda: part.save(rec))

    def load(self, id: str) -> Operation[InstanceRecord | None] | Spread[InstanceRecord | None]:
        """See :meth:`RepositoryOps.load`, in the record's partition."""
        part = self.part(id)
        return self._counted(lambda: part.load(id))

    def delete(self, id: str, *, expected_version: int | None = None
               ) -> Operation[None] | Spread[None]:
        """See :meth:`RepositoryOps.delete`, in the record's partition."""
        check_expected_version(expected_version)
        part = self.part(id)
        return self._counted(lambda: part.delete(id, expected_version=expected_version))

    # ------------------------------------------------------------------ every partition

    def register_group(self, group: str) -> Operation[None] | Spread[None]:
        """Add ``group`` to every partition's registry (idempotent). Cut short, the outcome
        is unknown; registering again completes it."""
        group = check_group(group)
        return Spread(self._everywhere(
            lambda part: part.register_group(group), lambda answers: None, write=True))

    def group_exists(self, group: str) -> Operation[bool] | Spread[bool]:
        """Whether every partition has ``group`` registered."""
        group = check_group(group)
        return Spread(self._everywhere(lambda part: part.group_exists(group), all))

    def _everywhere(self, call: Callable[[RepositoryOps], Operation[Any]],
                    merge: Callable[[list[Any]], Any], *, write: bool = False) -> Steps[Any]:
        answers = yield from self._fan([(deferred(call, part), None) for part in self.parts])
        return merge(values_of(answers, write=write))

    def migrate(self, *, settings: bool = True) -> Operation[None] | Spread[None]:
        """Partition 0's :meth:`RepositoryOps.migrate` (the scripts, its layout, the server's
        settings there), then every other partition's layout, at once."""
        return Spread(self._migrate(settings))

    def _migrate(self, settings: bool) -> Steps[None]:
        (first,) = yield from self._fan([(lambda: self.parts[0].migrate(settings=settings),
                                           None)])
        first.unwrap()
        answers = yield from self._fan([(deferred(RepositoryOps.record_layout, part), None)
                                        for part in self.parts[1:]])
        # A partition's refusal (a newer layout: Misconfigured; a damaged one: Corrupt) is
        # what a start-up must stop on, wherever it is: it comes before the outcome.
        refused = [got.error for got in answers if isinstance(got.error, StoreError)
                   and not isinstance(got.error, Unavailable)]
        if refused:
            raise refused[0]
        values_of(answers, write=True, applied=True)

    def cluster_compatibility(self) -> tuple[bool, str]:
        """``(True, reason)``: the state lives in the server, shared by every node."""
        namespace = self.keys.namespace
        return True, (f"state lives in Redis, shared by every engine; namespace {namespace!r} "
                      f"is spread over {self.n} partitions, hash tags {{{namespace}#0}} to "
                      f"{{{namespace}#{self.n - 1}}}: each record's operations are one atomic "
                      "script in its partition's cluster slot")

    # ------------------------------------------------------------------ listings

    def list_in_flight(self, group: str, now: datetime | None = None
                       ) -> Operation[list[str]] | Spread[list[str]]:
        """See :meth:`RepositoryOps.list_in_flight`: every partition, at one ``now``."""
        group, when = check_group(group), check_now(now)
        return Spread(self._list(group, "" if when is None else str(to_us(when))))

    def _list(self, group: str, at: str) -> Steps[list[str]]:
        listed: list[dict[str, None]] = [{} for _ in self.parts]
        after: dict[int, tuple[str, bytes]] = {p: ("", b"") for p in range(self.n)}
        if at == "":  # partition 0's first page reads the clock every partition uses
            ((ids, at, cursor),) = values_of((yield from self._fan(
                [(deferred(RepositoryOps.page, self.parts[0], group, at, MAX_PAGE, after[0]),
                  None)])))
            listed[0].update(dict.fromkeys(self._own(0, ids)))
            _advance(after, 0, cursor)
        while after:
            pages = values_of((yield from self._fan(
                [(deferred(RepositoryOps.page, self.parts[p], group, at, MAX_PAGE, after[p]),
                  None) for p in after])))
            for p, (ids, _, cursor) in zip(list(after), pages, strict=True):
                listed[p].update(dict.fromkeys(self._own(p, ids)))
                _advance(after, p, cursor)
        return [id for ids in listed for id in ids]

    def _own(self, p: int, ids: list[str]) -> list[str]:
        """The ids a page of partition ``p`` listed that are of that partition: a record
        found in another (foreign data) is never a record of this repository, which would
        load and delete it elsewhere."""
        return [id for id in ids if partition_of(id, self.n) == p]

    def list_in_flight_page(self, group: str, now: datetime | None = None, *,
                            cursor: str | None = None, limit: int = MAX_PAGE
                            ) -> Operation[InFlightPage] | Spread[InFlightPage]:
        """See :meth:`RepositoryOps.list_in_flight_page`: the partitions' listings one after
        the other, in pages of at most ``limit`` ids; the cursor names the partition."""
        group, when, limit = check_group(group), check_now(now), check_page_limit(limit)
        position = check_partitioned_cursor(cursor, self.n)
        at = "" if when is None else str(to_us(when))
        p, after = 0, ("", b"")
        if position is not None:
            p, carried, score, last = position
            if when is None:
                at = carried
            after = (score, last)
        return self._one_page(group, at, limit, p, after)

    def _one_page(self, group: str, at: str, limit: int, p: int,
                  after: tuple[str, bytes]) -> Operation[InFlightPage]:
        # A partition whose listing ends within the page hands the rest of the page to the
        # next one (a script each, each bounded by what is left of the limit), so a listing
        # of nothing is one complete page, as with one partition.
        ids: list[str] = []
        while True:
            got, at, cursor = yield from self._counted(deferred(
                RepositoryOps.page, self.parts[p], group, at, limit - len(ids), after))
            ids.extend(self._own(p, got))
            if cursor is not None:
                return InFlightPage(tuple(ids), _cursor(p, at, cursor))
            p, after = p + 1, ("", b"")
            if p == self.n:
                return InFlightPage(tuple(ids), None)
            if len(ids) == limit:
                return InFlightPage(tuple(ids), _cursor(p, at, after))


def _advance(after: dict[int, tuple[str, bytes]], p: int,
             cursor: tuple[str, bytes] | None) -> None:
    if cursor is None:
        del after[p]
    else:
        after[p] = cursor


def _cursor(p: int, at: str, after: tuple[str, bytes]) -> str:
    return f"P{p}|{at}|{after[0]}|{after[1].decode('utf-8', 'surrogateescape')}"


def check_partitioned_cursor(cursor: object, partitions: int) -> Position | None:
    """A page cursor of a repository of partitions as (partition, now µs, score, id), or
    None for the first page. Only a cursor a page of this repository returned is taken."""
    if cursor is None:
        return None
    text_ = check_text("cursor", cursor)
    head, _, rest = text_.partition("|")
    now, _, rest = rest.partition("|")
    score, _, id = rest.partition("|")
    number = head[1:]
    if (not head.startswith("P") or not is_int_text(number) or int(number) < 0
            or int(number) >= partitions or not is_int_text(now) or bool(score) != bool(id)):
        raise ValueError(f"cursor must be one a page returned, got {cursor!r}")
    return int(number), now, score, id.encode("utf-8", "surrogateescape")


def repository_ops(namespace: str, max_terminal: int, logger: Logger | None,
                   partitions: int) -> RepositoryOps | PartitionedRepositoryOps:
    """A repository's operations: :class:`RepositoryOps` for one partition (today's layout,
    unchanged), else :class:`PartitionedRepositoryOps`."""
    if check_partitions(partitions) == 1:
        return RepositoryOps(namespace, max_terminal, logger)
    return PartitionedRepositoryOps(namespace, max_terminal, logger, partitions=partitions)
