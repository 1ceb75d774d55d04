"""A history checker for the run backend: pure functions over a log of calls and outcomes
plus the final state, no I/O.

A history is a list of :class:`Event` values, one per call a process made (the torture
test writes them as JSON lines). Every record a writer writes carries a fresh ``token``
and the token of the record it replaced (``prev``), so the chain of records behind a
run's final record can be rebuilt from the log.

Times: ``b0`` is a backend time (server ``TIME``, ms) known to be at or before the call
was applied, ``b1`` one known to be at or after it (read after the call returned). The
checker reasons with those bounds conservatively: it reports a violation only when every
ordering the bounds allow is a violation. An outcome that is unknown (``unavailable``)
counts as possibly applied, at any time up to ``b1 + UNKNOWN_SLACK_MS``.

What it proves (each a kind of :class:`Violation`):

- ``fork``: two successful writes (acknowledged, or unknown but confirmed by readback)
  advanced one run to the same revision.
- ``chain``: the final record's chain is broken: a link nobody wrote (``phantom``), a
  revision that does not step by one, a chain that does not start at an insert, or a
  write that was refused (Conflict, LeaseRefused...) is in it.
- ``lost``: a successful write is not in the final record's chain.
- ``overlap``: an owner took a run by claim (not Seize) while another owner's
  acknowledged lease on it was certainly live and nothing could have ended it.
- ``revival``: a renew returned a run whose lease, by every possible earlier acquisition
  of that owner, had certainly expired (or never existed).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

WRITES = ("insert", "cas")
CLAIMS = ("claim_ready", "claim_expired")
REFUSALS = ("Conflict", "LeaseRefused", "NotFound", "AlreadyExists")
UNKNOWN = "unavailable"
# Applied, but its Durability confirmation failed (``applied_unconfirmed``): stored on the
# primary, never acknowledged, so a later failover may lose it even when a readback found it.
UNCONFIRMED = "unconfirmed"
INF = float("inf")
# How long after a call's end an unknown-outcome request may still have been applied
# (the server reads bytes a cut connection had already delivered). Conservative.
UNKNOWN_SLACK_MS = 1000


@dataclass(frozen=True)
class Event:
    """One call and its outcome, as a process logged it."""

    proc: str
    seq: int
    op: str                          # insert | cas | renew | claim_ready | claim_expired | get
    outcome: str                     # ok | unavailable | the error class name
    run: str | None = None
    runs: tuple[str, ...] = ()       # renew's input
    value: tuple[str, ...] = ()      # claims' and renew's answer
    expected: int | None = None      # cas
    lease: str | None = None         # hold | claim | seize | release
    ttl: int | None = None
    token: str | None = None         # the record written
    prev: str | None = None          # the token of the record it replaced
    confirmed: bool | None = None    # readback after an unavailable write
    b0: int | None = None
    b1: int | None = None
    t0: float = 0.0
    t1: float = 0.0

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Event:
        fields = dict(d)
        for name in ("runs", "value"):
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
            else:
                fields.pop(name, None)
        known = Event.__dataclass_fields__
        return Event(**{k: v for k, v in fields.items() if k in known})

    @property
    def revision(self) -> int | None:
        """The revision a write would create."""
        if self.op == "insert":
            return 1
        if self.op == "cas" and self.expected is not None:
            return self.expected + 1
        return None

    @property
    def succeeded(self) -> bool:
        """Acknowledged, or unknown and confirmed by readback."""
        return self.outcome == "ok" or (self.outcome == UNKNOWN and self.confirmed is True)

    @property
    def maybe_applied(self) -> bool:
        return self.outcome in ("ok", UNKNOWN, UNCONFIRMED)


@dataclass(frozen=True)
class Final:
    """A run as read at the end."""

    revision: int
    token: str | None
    owner: str | None = None
    live: bool = False


@dataclass(frozen=True)
class Violation:
    kind: str
    run: str
    detail: str


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.counts.items())]
        return " ".join(parts) + f" violations={len(self.violations)}"


def load(lines: Iterable[str]) -> list[Event]:
    """Events from JSON lines (blank lines skipped)."""
    return [Event.from_dict(json.loads(line)) for line in lines if line.strip()]


def by_process(events: Iterable[Event]) -> list[list[Event]]:
    """Each process's events, in the order it made them."""
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        grouped[event.proc].append(event)
    return [sorted(proc_events, key=lambda e: e.seq) for proc_events in grouped.values()]


def fill_upper_bounds(events: Iterable[Event]) -> list[Event]:
    """Give each event without ``b1`` the next ``b1`` its process read later (a later read
    is still an upper bound); events with none stay ``None`` (unbounded)."""
    out: list[Event] = []
    for proc_events in by_process(events):
        later: int | None = None
        filled: list[Event] = []
        for event in reversed(proc_events):
            if event.b1 is not None:
                later = event.b1
                filled.append(event)
            else:
                filled.append(_replace_b1(event, later))
        out.extend(reversed(filled))
    return out


def _replace_b1(event: Event, b1: int | None) -> Event:
    d = dict(event.__dict__)
    d["b1"] = b1
    return Event(**d)


def _lo(event: Event) -> float:
    return -INF if event.b0 is None else event.b0


def _hi(event: Event) -> float:
    if event.b1 is None:
        return INF
    return event.b1 + (UNKNOWN_SLACK_MS if event.outcome == UNKNOWN else 0)


# ---------------------------------------------------------------------------- chains


def check_chains(events: Iterable[Event], final: Mapping[str, Final]) -> list[Violation]:
    """Per run: one chain of revisions behind the final record, holding every success."""
    violations: list[Violation] = []
    by_token: dict[str, Event] = {}
    successes: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event.op not in WRITES or event.token is None or event.run is None:
            continue
        if event.token in by_token:
            violations.append(Violation("chain", event.run, f"token {event.token} logged twice"))
        by_token[event.token] = event
        if event.succeeded:
            successes[event.run].append(event)

    for run in sorted(set(successes) | set(final)):
        seen_revisions: dict[int, Event] = {}
        for event in successes.get(run, []):
            rev = event.revision
            assert rev is not None
            if rev in seen_revisions:
                other = seen_revisions[rev]
                violations.append(Violation(
                    "fork", run, f"revision {rev} written by {other.proc}#{other.seq} "
                    f"({other.token}) and {event.proc}#{event.seq} ({event.token})"))
            seen_revisions[rev] = event
        state = final.get(run)
        if state is None:
            violations.append(Violation("lost", run, "run absent at the end"))
            continue
        chain: set[str] = set()
        token, expect = state.token, state.revision
        while token is not None:
            if token in chain:
                violations.append(Violation("chain", run, f"cycle at {token}"))
                break
            link = by_token.get(token)
            if link is None or link.run != run:
                violations.append(Violation("chain", run, f"phantom record {token} at "
                                            f"revision {expect}: nobody logged writing it"))
                break
            chain.add(token)
            if link.revision != expect:
                violations.append(Violation(
                    "chain", run, f"{token} written as revision {link.revision} sits at "
                    f"revision {expect}"))
            if not link.maybe_applied:
                violations.append(Violation(
                    "chain", run, f"{token} was refused ({link.outcome}) but is stored"))
            if link.op == "insert":
                if expect != 1:
                    violations.append(Violation("chain", run, f"insert {token} at {expect}"))
                break
            token, expect = link.prev, expect - 1
            if token is None:
                violations.append(Violation("chain", run, "chain ends without an insert"))
        for event in successes.get(run, []):
            if event.token not in chain:
                violations.append(Violation(
                    "lost", run, f"{event.proc}#{event.seq} wrote {event.token} at revision "
                    f"{event.revision} ({event.outcome}), not in the final chain"))
    return violations


# ---------------------------------------------------------------------------- leases


def _acquired(event: Event) -> list[str]:
    """Runs this acknowledged event certainly gave its owner a live lease on."""
    if event.outcome != "ok":
        return []
    if event.op in CLAIMS or event.op == "renew":
        return list(event.value)
    if event.op in WRITES and event.lease in ("claim", "seize") and event.run is not None:
        return [event.run]
    return []


def _takeover(event: Event) -> bool:
    """An acquisition that is only allowed when the lease is free, own or expired."""
    return event.op in CLAIMS or (event.op in WRITES and event.lease == "claim")


def _may_end(event: Event, run: str, owner: str) -> bool:
    """Could this event have ended ``owner``'s lease on ``run`` legitimately?"""
    if event.run != run or event.op not in WRITES or not event.maybe_applied:
        return False
    return event.lease == "release" or (event.lease == "seize" and event.proc != owner)


def check_leases(events: Iterable[Event]) -> list[Violation]:
    """No claim took a run while another owner's lease on it was certainly live."""
    events = list(events)
    violations: list[Violation] = []
    live: dict[str, list[tuple[Event, float, float]]] = defaultdict(list)
    takeovers: dict[str, list[Event]] = defaultdict(list)
    enders: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        for run in _acquired(event):
            if event.b0 is not None and event.b1 is not None and event.ttl is not None:
                # Applied at some t in [b0, b1]: live on [t, t + ttl) ⊇ [b1, b0 + ttl).
                live[run].append((event, event.b1, event.b0 + event.ttl))
            if _takeover(event):
                takeovers[run].append(event)
        if event.op in WRITES and event.run is not None and event.maybe_applied:
            enders[event.run].append(event)
    for run, intervals in live.items():
        for holder, start, end in intervals:
            if end <= start:
                continue
            for taker in takeovers.get(run, []):
                if taker.proc == holder.proc or taker.b0 is None or taker.b1 is None:
                    continue
                if not (taker.b0 > start and taker.b1 < end):
                    continue
                if any(_may_end(e, run, holder.proc) and _hi(e) >= _lo(holder)
                       and _lo(e) <= taker.b1 for e in enders.get(run, [])):
                    continue
                violations.append(Violation(
                    "overlap", run, f"{taker.proc}#{taker.seq} {taker.op} in "
                    f"[{taker.b0}, {taker.b1}] while {holder.proc}#{holder.seq} "
                    f"({holder.op}) held it live over [{start}, {end})"))
    return violations


def _may_extend(event: Event, run: str) -> float | None:
    """The latest expiry this event of the renewing owner may have set on ``run``."""
    if event.ttl is None or not event.maybe_applied:
        return None
    unknown = event.outcome == UNKNOWN
    touches = False
    if event.op in CLAIMS:
        touches = unknown or run in event.value
    elif event.op == "renew":
        touches = run in event.value or (unknown and run in event.runs)
    elif event.op in WRITES:
        touches = event.run == run and event.lease in ("claim", "seize")
    return _hi(event) + event.ttl if touches else None


def check_renewals(events: Iterable[Event]) -> list[Violation]:
    """A renew only returns runs whose lease the owner could still hold live."""
    violations: list[Violation] = []
    for proc_events in by_process(events):
        latest: dict[str, float] = {}   # run -> latest expiry its earlier events may have set
        any_run = -INF                  # an unknown claim may have taken any run
        for event in proc_events:
            if event.op == "renew" and event.outcome == "ok":
                for run in event.value:
                    expiry = max(latest.get(run, -INF), any_run)
                    if expiry == -INF:
                        violations.append(Violation(
                            "revival", run, f"{event.proc}#{event.seq} renewed a lease it "
                            "never acquired"))
                    elif event.b0 is not None and expiry <= event.b0:
                        violations.append(Violation(
                            "revival", run, f"{event.proc}#{event.seq} renewed at >= "
                            f"{event.b0} a lease that expired by {expiry}"))
            if event.op in CLAIMS and event.outcome == UNKNOWN and event.ttl is not None:
                any_run = max(any_run, _hi(event) + event.ttl)
            for run in {*event.value, *event.runs, *([event.run] if event.run else [])}:
                expiry = _may_extend(event, run)
                if expiry is not None:
                    latest[run] = max(latest.get(run, -INF), expiry)
    return violations


# ---------------------------------------------------------------------------- all


def check(events: Iterable[Event], final: Mapping[str, Final]) -> Report:
    """Every check, and the counts a run of the torture test prints."""
    events = fill_upper_bounds(events)
    report = Report()
    report.violations += check_chains(events, final)
    report.violations += check_leases(events)
    report.violations += check_renewals(events)
    c = report.counts
    for event in events:
        if event.proc == "setup":
            continue
        c["operations"] += 1
        c[f"op.{event.op}"] += 1
        if event.outcome == UNKNOWN:
            c["unavailable"] += 1
            if event.op in WRITES:
                c["unavailable_writes"] += 1
                if event.confirmed is not None:
                    c["resolved_by_readback"] += 1
                if event.confirmed:
                    c["confirmed_by_readback"] += 1
        elif event.outcome != "ok":
            c[f"refused.{event.outcome}"] += 1
        if event.succeeded and event.op in WRITES:
            c["successful_writes"] += 1
    return report
