"""The history checker catches each kind of violation in small hand-written histories, and
passes the histories that are fine."""

from __future__ import annotations

import json
from itertools import count
from typing import Any

from history import (
    UNCONFIRMED,
    Event,
    Final,
    check,
    check_leases,
    check_renewals,
    fill_upper_bounds,
    load,
)

_seq = count()


def ev(proc: str, op: str, outcome: str = "ok", **fields: Any) -> Event:
    for name in ("runs", "value"):
        if name in fields:
            fields[name] = tuple(fields[name])
    return Event(proc=proc, seq=next(_seq), op=op, outcome=outcome, **fields)


def seed(run: str = "r", token: str = "s") -> Event:
    return ev("setup", "insert", run=run, lease="release", token=token, b0=0, b1=1)


def kinds(events: list[Event], final: dict[str, Final]) -> list[str]:
    return sorted(v.kind for v in check(events, final).violations)


def good_history() -> list[Event]:
    return [
        seed(),
        ev("w1", "claim_ready", value=["r"], ttl=1000, b0=100, b1=101),
        ev("w1", "cas", run="r", expected=1, lease="hold", token="a", prev="s", b0=101, b1=110),
        ev("w1", "renew", runs=["r"], value=["r"], ttl=1000, b0=500, b1=501),
        ev("w1", "cas", run="r", expected=2, lease="release", token="b", prev="a",
           b0=600, b1=601),
        ev("w2", "claim_ready", value=["r"], ttl=1000, b0=700, b1=701),
        # A refused write and an unknown, unconfirmed one that did not land: both harmless.
        ev("w3", "cas", "Conflict", run="r", expected=1, lease="hold", token="x", prev="s",
           b0=702, b1=703),
        ev("w2", "cas", "unavailable", run="r", expected=3, lease="hold", token="y",
           prev="b", confirmed=False, b0=710, b1=720),
    ]


def test_a_good_history_has_no_violations() -> None:
    report = check(good_history(), {"r": Final(3, "b", "w2", True)})
    assert report.violations == []
    assert report.counts["operations"] == 7
    assert report.counts["unavailable_writes"] == 1
    assert report.counts["resolved_by_readback"] == 1
    assert report.counts["successful_writes"] == 2


def test_an_unknown_write_confirmed_by_readback_counts_as_success() -> None:
    events = [seed(), ev("w1", "cas", "unavailable", run="r", expected=1, lease="hold",
                         token="a", prev="s", confirmed=True, b0=1, b1=2)]
    assert kinds(events, {"r": Final(2, "a")}) == []
    # ... so it must be in the chain:
    assert kinds(events, {"r": Final(1, "s")}) == ["lost"]


def test_an_unknown_write_that_landed_unconfirmed_may_be_a_link() -> None:
    events = [seed(),
              ev("w1", "cas", "unavailable", run="r", expected=1, lease="hold", token="a",
                 prev="s", confirmed=False, b0=1, b1=2),
              ev("w2", "cas", run="r", expected=2, lease="hold", token="b", prev="a",
                 b0=3, b1=4)]
    assert kinds(events, {"r": Final(3, "b")}) == []


def test_an_unconfirmed_write_found_by_readback_may_still_be_lost() -> None:
    # Its Durability confirmation failed: never acknowledged, so a later failover may drop
    # it and another write take its revision; it may also stay.
    lost_later = [seed(),
                  ev("w1", "cas", UNCONFIRMED, run="r", expected=1, lease="hold", token="a",
                     prev="s", confirmed=True, b0=1, b1=2),
                  ev("w1", "cas", run="r", expected=1, lease="hold", token="b", prev="s",
                     b0=3, b1=4)]
    assert kinds(lost_later, {"r": Final(2, "b")}) == []
    kept = lost_later[:2]
    assert kinds(kept, {"r": Final(2, "a")}) == []
    # The same history with the write acknowledged is a fork and a loss.
    acked = [*lost_later[:1], ev("w1", "cas", run="r", expected=1, lease="hold", token="a",
                                 prev="s", b0=1, b1=2), lost_later[2]]
    assert kinds(acked, {"r": Final(2, "b")}) == ["fork", "lost"]


def test_two_writers_advancing_one_revision_is_a_fork() -> None:
    events = [seed(),
              ev("w1", "cas", run="r", expected=1, lease="hold", token="a", prev="s"),
              ev("w2", "cas", run="r", expected=1, lease="hold", token="b", prev="s")]
    assert kinds(events, {"r": Final(2, "a")}) == ["fork", "lost"]


def test_an_acknowledged_write_missing_from_the_final_chain_is_lost() -> None:
    events = [seed(), ev("w1", "cas", run="r", expected=1, lease="hold", token="a", prev="s")]
    assert kinds(events, {"r": Final(1, "s")}) == ["lost"]
    assert kinds(events, {}) == ["lost"]  # the run vanished


def test_a_record_nobody_wrote_breaks_the_chain() -> None:
    assert kinds([seed()], {"r": Final(2, "zzz")}) == ["chain", "lost"]


def test_a_refused_write_that_is_stored_breaks_the_chain() -> None:
    events = [seed(), ev("w1", "cas", "LeaseRefused", run="r", expected=1, lease="hold",
                         token="a", prev="s")]
    assert kinds(events, {"r": Final(2, "a")}) == ["chain"]


def test_a_revision_that_skips_breaks_the_chain() -> None:
    events = [seed(), ev("w1", "cas", run="r", expected=2, lease="hold", token="a", prev="s")]
    assert "chain" in kinds(events, {"r": Final(3, "a")})


def test_a_chain_must_start_at_an_insert() -> None:
    events = [ev("w1", "cas", run="r", expected=1, lease="hold", token="a", prev=None)]
    assert kinds(events, {"r": Final(2, "a")}) == ["chain"]


def test_a_claim_over_a_live_lease_of_another_owner_is_an_overlap() -> None:
    held = ev("w1", "claim_ready", value=["r"], ttl=1000, b0=100, b1=101)
    taken = ev("w2", "claim_expired", value=["r"], ttl=1000, b0=500, b1=501)
    assert [v.kind for v in check_leases([held, taken])] == ["overlap"]
    # Through a Claim write too, and over a renewed lease:
    renewed = ev("w1", "renew", runs=["r"], value=["r"], ttl=1000, b0=1000, b1=1001)
    claim_write = ev("w2", "cas", run="r", expected=1, lease="claim", ttl=1000, token="c",
                     prev="s", b0=1500, b1=1501)
    assert [v.kind for v in check_leases([held, renewed, claim_write])] == ["overlap"]


def test_claims_that_might_be_legal_are_not_overlaps() -> None:
    held = ev("w1", "claim_ready", value=["r"], ttl=1000, b0=100, b1=101)
    after_expiry = ev("w2", "claim_expired", value=["r"], ttl=1000, b0=1100, b1=1101)
    straddles_expiry = ev("w2", "claim_expired", value=["r"], ttl=1000, b0=900, b1=1200)
    assert check_leases([held, after_expiry, straddles_expiry]) == []
    taken = ev("w2", "claim_ready", value=["r"], ttl=1000, b0=500, b1=501)
    released = ev("w1", "cas", run="r", expected=1, lease="release", token="a", prev="s",
                  b0=300, b1=301)
    assert check_leases([held, released, taken]) == []
    maybe_released = ev("w1", "cas", "unavailable", run="r", expected=1, lease="release",
                        token="a", prev="s", b0=300, b1=None)
    assert check_leases([held, maybe_released, taken]) == []
    seized = ev("w3", "cas", run="r", expected=1, lease="seize", ttl=100, token="z",
                prev="s", b0=200, b1=201)
    assert check_leases([held, seized, taken]) == []
    # A Seize is no takeover: it may take a live lease.
    assert check_leases([held, seized]) == []


def test_renewing_an_expired_lease_is_a_revival() -> None:
    held = ev("w1", "claim_ready", value=["r"], ttl=100, b0=100, b1=101)
    late = ev("w1", "renew", runs=["r"], value=["r"], ttl=100, b0=500, b1=501)
    assert [v.kind for v in check_renewals([held, late])] == ["revival"]
    in_time = ev("w1", "renew", runs=["r"], value=["r"], ttl=100, b0=150, b1=151)
    assert check_renewals([held, in_time]) == []
    # Chained renewals keep it live:
    chained = ev("w1", "renew", runs=["r"], value=["r"], ttl=100, b0=240, b1=241)
    assert check_renewals([held, in_time, chained]) == []


def test_renewing_a_lease_never_acquired_is_a_revival() -> None:
    stray = ev("w1", "renew", runs=["r"], value=["r"], ttl=100, b0=100, b1=101)
    assert [v.kind for v in check_renewals([stray])] == ["revival"]
    # ...unless an unknown-outcome claim may have taken it.
    lost_claim = ev("w1", "claim_expired", "unavailable", ttl=1000, b0=50, b1=60)
    stray2 = ev("w1", "renew", runs=["r"], value=["r"], ttl=100, b0=100, b1=101)
    assert check_renewals([lost_claim, stray2]) == []


def test_missing_upper_bounds_come_from_a_later_read() -> None:
    a = ev("w1", "claim_ready", value=["r"], ttl=1000, b0=100, b1=None)
    b = ev("w1", "get", run="r", b0=100, b1=None)
    c = ev("w1", "get", run="r", b0=100, b1=900)
    filled = fill_upper_bounds([a, b, c])
    assert [e.b1 for e in filled] == [900, 900, 900]
    assert fill_upper_bounds([a])[0].b1 is None


def test_events_round_trip_through_json_lines() -> None:
    events = good_history()
    lines = [json.dumps({k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in e.__dict__.items()}) for e in events]
    assert load([*lines, ""]) == events
