"""Namespaces as the libraries before layout 5 left them (layouts 1 to 4), written directly
with Redis commands: the fixtures of the migration tests. No script of this library writes
an old layout any more; the formats are spelled out here as those libraries wrote them
(docs/runs.md, "Layouts and migrate()", and lua/_lib/codec.lua on the branch main):

- layout 1: one hash per run, a field each (``rev own exp ck cdr cat wk wa wn wdl wrev wpv
  pk pt``) and ``rec``, the record; flat indexes ``{ns}:leases``, ``{ns}:ready`` (sorted
  sets) and ``{ns}:d:<dep>`` (sets); meta ``layout`` 1, or nothing at all (written before
  layouts were recorded);
- layout 2: one string per run, the record, a header of those fields in order, each ended
  by ``,`` (texts length-prefixed, ``6:node-a``; absent fields at the end left out), room
  (spaces), then the trailer (the header region's length, then the count of its digits);
- layout 3: layout 2 with ``tk`` (takeovers) and ``px`` (``1``: a poison run) in the
  header, and meta ``deleted-rev``;
- layout 4: layout 3 with ``rt`` (the ready time) and bucketed indexes: each index a chain
  of sorted sets of at most 128 entries (``{ns}:L|<bound>``, ``{ns}:Q|<bound>``,
  ``{ns}:D<n>:<dep>|<bound>``; the first bucket's bound is empty) and a directory of the
  other bounds (``{ns}:L/``...); meta ``old-ix`` while layout 3's flat keys may still hold
  entries.

Also a reader of layout 5's header (:func:`header5`), to see what ``migrate()`` wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redisstore import ClaimInfo, Current, Free, Held
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of

#: The fields of layouts 1 to 4, in the order of the header of layouts 2 to 4.
FIELDS = ("rev", "own", "exp", "ck", "cdr", "cat", "wk", "wa", "wn", "wdl", "wrev", "wpv",
          "pk", "pt", "tk", "px", "rt")


@dataclass(frozen=True)
class OldRun:
    """One run as an old library stored it. ``ready``: the score of its entry in the ready
    index (None: it has none), and in layout 4 its header's ready time (``rt``)."""

    rev: int = 1
    record: bytes = b""
    own: str | None = None
    exp: int | None = None
    ck: str | None = None
    cdr: int | None = None
    cat: int | None = None
    wk: str | None = None
    wa: str | None = None
    wn: int | None = None
    wdl: int | None = None
    wrev: int | None = None
    wpv: int | None = None
    pk: str | None = None
    pt: int | None = None
    tk: int = 0
    px: bool = False
    ready: int | None = None

    def expected(self, now: int) -> Current:
        """The run as ``get`` reads it once migrated, at backend time ``now``."""
        holder = Free() if self.own is None else Held(self.own, (self.exp or 0) > now)
        claim = None
        if self.cat is not None:
            claim = ClaimInfo(self.ck or None, self.cdr, self.cat)
        poison = self.px and self.own is not None
        return Current(self.rev, self.record, holder, claim, self.tk,
                       1 if self.own is not None else None, 0, None,
                       "poison" if poison else None)


def encoded(text: str) -> bytes:
    """A key name or member as the scripts hand it back (any bytes: surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


def decoded(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _num(value: int | None) -> bytes:
    return b"" if value is None else str(value).encode()


def _text(value: str | None) -> bytes:
    if value is None:
        return b""
    raw = value.encode("utf-8", "surrogateescape")
    return str(len(raw)).encode() + b":" + raw


def hash_fields(run: OldRun) -> dict[str, bytes]:
    """A layout 1 run's hash, as that library's save wrote it (with ``rec``)."""
    fields: dict[str, bytes] = {"rev": _num(run.rev), "rec": run.record}
    if run.own is not None:
        fields["own"] = run.own.encode("utf-8", "surrogateescape")
        fields["exp"] = _num(run.exp)
    if run.cat is not None:
        fields.update(ck=(run.ck or "").encode("utf-8", "surrogateescape"),
                      cdr=_num(run.cdr), cat=_num(run.cat))
    if run.wk is not None:
        fields.update(wk=run.wk.encode(), wa=(run.wa or "").encode("utf-8", "surrogateescape"),
                      wn=_num(run.wn), wdl=_num(run.wdl), wrev=_num(run.wrev),
                      wpv=_num(run.wpv))
        if run.pk is not None:
            fields["pk"] = run.pk.encode("utf-8", "surrogateescape")
            if run.pt is not None:
                fields["pt"] = _num(run.pt)
    if run.tk:  # never in a layout 1 library's hash; read if there
        fields["tk"] = _num(run.tk)
    if run.px:
        fields["px"] = b"1"
    return fields


def header(run: OldRun, layout: int) -> bytes:
    """The comma header of layouts 2 to 4 (that library's ``header``)."""
    waits = run.wk is not None
    parts = [
        _num(run.rev), _text(run.own), _num(run.exp if run.own is not None else None),
        _text(run.ck or "") if run.cat is not None else b"",
        _num(run.cdr) if run.cat is not None else b"", _num(run.cat),
        (run.wk or "").encode(), _text(run.wa if waits and run.wk != "a" else None),
        _num(run.wn) if waits else b"", _num(run.wdl) if waits else b"",
        _num(run.wrev) if waits else b"", _num(run.wpv) if waits else b"",
        _text(run.pk if waits else None),
        _num(run.pt) if waits and run.pk is not None else b"",
        _num(run.tk or None), b"1" if run.px else b"",
        _num(run.ready) if layout >= 4 else b"",
    ]
    while len(parts) > 1 and parts[-1] == b"":
        parts.pop()
    return b",".join(parts) + b","


def trailer(size: int) -> bytes:
    digits = str(size).encode()
    return digits + str(len(digits)).encode()


def string_value(run: OldRun, layout: int, room: int = 0) -> bytes:
    """A run of layouts 2 to 4 as one string: record, header, ``room`` spaces, trailer."""
    region = header(run, layout) + b" " * room
    return run.record + region + trailer(len(region))


@dataclass
class Written:
    """What :func:`write` wrote: the keyspace and, per index, its entries."""

    keys: Keyspace
    leases: dict[str, int] = field(default_factory=dict)
    ready: dict[str, int] = field(default_factory=dict)
    waiters: dict[str, set[str]] = field(default_factory=dict)


def write(client: Any, namespace: str, layout: int, runs: dict[str, OldRun], *,
          partition: int | None = None, bucket: int = 128, record_layout: bool = True,
          deleted_rev: int | None = None, flat: Iterable[str] = (),
          fanout: dict[str, bytes] | None = None, room: int = 0,
          partitions: int | None = None) -> Written:
    """Write ``runs`` in ``namespace`` (or its ``partition``) as a library of ``layout``
    left them, with their index entries: the leases of held runs (but poison ones), the
    ready entries of runs with a ``ready`` score, each ``Changed`` wait in its dependency's
    waiters, and the quarantine's entry of each poison run. Layout 4 puts them in buckets
    of ``bucket`` entries (``flat``: runs whose entries stay in layout 3's keys, as while
    an old migration was under way: meta ``old-ix``). ``record_layout=False`` records no
    layout (layout 1 only); ``fanout``: dependencies with a pending fan-out and their
    cursors. ``room``: spaces after each header (where one shrank). ``partitions``: the
    count a partition's meta records."""
    keys = Keyspace(namespace, partition)
    done = Written(keys)
    pipe = client.pipeline(transaction=False)
    for run_id, run in runs.items():
        if layout == 1:
            pipe.hset(encoded(keys.run(run_id)), mapping=hash_fields(run))  # type: ignore[arg-type]
        else:
            pipe.set(encoded(keys.run(run_id)), string_value(run, layout, room))
        if run.own is not None and not run.px and run.exp is not None:
            done.leases[run_id] = run.exp
        if run.own is not None and run.px:  # what the claim that found it poison wrote
            pipe.hset(keys.quarantine, encoded("poison|" + run_id), f"takeovers={run.tk}")
        if run.ready is not None:
            done.ready[run_id] = run.ready
        if run.wk == "c" and run.wa is not None:
            done.waiters.setdefault(run.wa, set()).add(run_id)
    kept = set(flat)
    bucketed = layout >= 4
    for name, entries in (("leases", done.leases), ("ready", done.ready)):
        old = {r: s for r, s in entries.items() if not bucketed or r in kept}
        if old:
            pipe.zadd(getattr(keys, name), {encoded(r): s for r, s in old.items()})
        if bucketed:
            _buckets(pipe, keys, name, {r: s for r, s in entries.items() if r not in kept},
                     bucket)
    for dep, waiters in done.waiters.items():
        old_set = {w for w in waiters if not bucketed or w in kept}
        if old_set:
            pipe.sadd(encoded(keys.dependents(dep)), *map(encoded, old_set))
        if bucketed:
            _buckets(pipe, keys, "d:" + dep, {w: 0 for w in waiters - kept}, bucket)
    meta: dict[str, Any] = {}
    if record_layout:
        meta["layout"] = layout
    elif layout != 1:
        raise ValueError("only layout 1 was ever written without its layout recorded")
    if deleted_rev is not None:
        meta["deleted-rev"] = deleted_rev
    if bucketed and kept:
        meta["old-ix"] = 1
    if partitions is not None:
        meta["partitions"] = partitions
    if meta:
        pipe.hset(keys.meta, mapping=meta)
    for dep, cursor in (fanout or {}).items():
        pipe.zadd(keys.fanout, {dep: 1})
        pipe.hset(keys.fanout_cursor, dep, cursor)
    pipe.execute()
    return done


def write_partitioned(client: Any, namespace: str, layout: int, runs: dict[str, OldRun],
                      partitions: int, **options: Any) -> list[Written]:
    """``runs`` of a namespace spread over ``partitions`` (each in its own, as
    :func:`~redisstore.core.partitions.partition_of` says), as a library of ``layout`` (3 or
    4: the first with partitions) left them: each partition's meta records its layout and
    the count, and so does the namespace's own."""
    parts: list[dict[str, OldRun]] = [{} for _ in range(partitions)]
    for run_id, run in runs.items():
        parts[partition_of(run_id, partitions)][run_id] = run
    written = [write(client, namespace, layout, part, partition=p, partitions=partitions,
                     **options) for p, part in enumerate(parts)]
    client.hset(Keyspace(namespace).meta, "partitions", partitions)
    return written


def composite(index: str, score: int, run: str) -> bytes:
    """An entry's place in a layout 4 index: the score as 16 digits, then the run id (the
    run id alone for a dependency's waiters)."""
    raw = run.encode("utf-8", "surrogateescape")
    if index.startswith("d:"):
        return raw
    return f"{score:016d}".encode() + raw


def _buckets(pipe: Any, keys: Keyspace, index: str, entries: dict[str, int],
             size: int) -> None:
    """``entries`` in layout 4's buckets of ``index``, ``size`` to a bucket, in order."""
    if not entries:
        return
    directory, prefix = keys.buckets(index)
    ordered = sorted(entries.items(), key=lambda e: composite(index, e[1], e[0]))
    for start in range(0, len(ordered), size):
        chunk = ordered[start:start + size]
        bound = b"" if start == 0 else composite(index, chunk[0][1], chunk[0][0])
        pipe.zadd(encoded(prefix) + bound, {encoded(r): score for r, score in chunk})
        if bound:
            pipe.zadd(encoded(directory), {bound: 0})


def bucket_keys(client: Any, keys: Keyspace) -> list[bytes]:
    """Every key of layout 4's indexes left in the namespace (or partition)."""
    pattern = re.escape(keys.prefix.encode()) + rb"(L|Q|D\d+:.*)[|/]"
    return [k for k in client.scan_iter(count=1000) if re.match(pattern, k, re.S)]


# ---------------------------------------------------------------------------- layout 5

#: Layout 5's header: its numbers, then the lengths of its three texts (lua/_lib/keys.lua).
FIELDS5 = ("rev", "exp", "tok", "cdr", "cat", "wk", "wn", "wdl", "wrev", "wpv", "pt", "tk",
           "at", "nb", "px", "sid")


def header5(value: bytes) -> dict[str, Any]:
    """The fields of a layout 5 run's string: numbers as ints (None: none), ``wk`` and
    ``px`` as text, the texts ``own``, ``ck``, ``wa``, and ``record``."""
    digits = int(value[-1:])
    size = int(value[-1 - digits:-1])
    start = len(value) - 1 - digits - size
    region = value[start:start + size]
    numbers = region.split(b",", len(FIELDS5))
    lengths, _, texts = numbers[-1].partition(b":")
    lo, lc, lw = (int(n) for n in lengths.split(b","))
    out: dict[str, Any] = {"record": value[:start]}
    for name, raw in zip(FIELDS5, numbers[:-1], strict=True):
        out[name] = raw.decode() if name in ("wk", "px") else (int(raw) if raw else None)
    out["own"] = texts[:lo].decode("utf-8", "surrogateescape")
    out["ck"] = texts[lo:lo + lc].decode("utf-8", "surrogateescape")
    out["wa"] = texts[lo + lc:lo + lc + lw].decode("utf-8", "surrogateescape")
    if texts[lo + lc + lw:].strip(b" "):
        raise ValueError(f"not a layout 5 header: {region!r}")
    return out


def wait5(client: Any, keys: Keyspace, run: str) -> tuple[Any, ...]:
    """The wait a migrated run keeps (kind, key, n, deadline, revision, projection version,
    poll time), from its layout 5 header."""
    value = client.get(encoded(keys.run(run)))
    h = header5(value)
    return (h["wk"] or None, h["wa"] or None, h["wn"], h["wdl"], h["wrev"], h["wpv"], h["pt"])


def wait_of(run: OldRun) -> tuple[Any, ...]:
    """The wait :func:`wait5` reads once ``run`` is migrated: the poll time only while it
    was taken for the wait's key."""
    if run.wk is None:
        return (None,) * 7
    pt = run.pt if run.wk == "p" and run.pk == run.wa else None
    return (run.wk, run.wa if run.wk != "a" else None, run.wn, run.wdl, run.wrev, run.wpv, pt)


def with_field5(value: bytes, name: str, raw: bytes) -> bytes:
    """A layout 5 run's string with the number field ``name`` of its header replaced by
    ``raw`` as it is (damaged, if one wishes), the trailer made to fit."""
    digits = int(value[-1:])
    size = int(value[-1 - digits:-1])
    start = len(value) - 1 - digits - size
    fields = value[start:start + size].split(b",", len(FIELDS5))
    fields[FIELDS5.index(name)] = raw
    region = b",".join(fields)
    return value[:start] + region + trailer(len(region))


def damage5(client: Any, keys: Keyspace, run: str, name: str, raw: bytes | str) -> None:
    """Set the number field ``name`` of ``run``'s layout 5 header to ``raw``."""
    value = client.get(keys.run(run))
    client.set(keys.run(run), with_field5(value, name, raw.encode() if isinstance(raw, str)
                                         else raw))
