"""Stall tests at scale: every run-store script at its caps, in namespaces of 300,000 runs,
blocks the server less than its busy threshold, and no client gets BUSY because of it.

A Redis script runs alone; past ``busy-reply-threshold`` every other client gets ``BUSY``.
The server here runs with ``busy-reply-threshold 100`` and ``slowlog-log-slower-than 0``;
each measured call is sent alone between ``SLOWLOG RESET`` and ``SLOWLOG GET``, and a
thread PINGs the server all along. This is a bound, not a benchmark: the scenarios are
``benchmarks/bench_stall.py``'s (its docstring says what each one does), run with fewer
repeats, and their figures are printed for the CI log. These tests hold two lines: the
100 ms after which other clients are refused (every repeat), and the library's 10 ms per
script at its caps (docs/runs.md, caps: the median of the repeats' own time, below).

SLOWLOG counts wall time, so on a shared machine it also counts the time the server sat
runnable while other processes had the CPUs (seen here: an 8 MiB insert at 238 ms of
SLOWLOG with 77 ms on a CPU). The bound is therefore on a script's own time: its SLOWLOG
duration, capped by what the server's main thread ran on a CPU during the call (Linux
schedstat; where that cannot be read, SLOWLOG alone). BUSY replies fail the test unless a
measured call passed the threshold and its own time did not: the machine's load, printed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from servers import EPHEMERAL, Server, missing, redis_binary, start

from redisstore.core import scripts
from redisstore.core.driver import Call, Operation

# serial: scripts' time measured on the server
pytestmark = [pytest.mark.server, pytest.mark.serial, pytest.mark.slow]

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
BUSY_US = 100_000  # the server's busy-reply-threshold (100 ms), in SLOWLOG's µs
RUNS = 300_000
REPEATS = 3


def bench_stall() -> ModuleType:
    """benchmarks/bench_stall.py, which holds the scenarios (not in an sdist)."""
    if not (BENCHMARKS / "bench_stall.py").exists():
        missing("benchmarks/bench_stall.py is not in this tree")
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("bench_stall")


@pytest.fixture(scope="module")
def stall_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start(redis_binary(), "redis-server (Redis 7)", tmp_path_factory.mktemp("stall"),
                   (*EPHEMERAL, "--busy-reply-threshold", "100",
                    "--slowlog-log-slower-than", "0"))
    yield server
    server.stop()


def own_us(figure: Any) -> list[int]:
    """Each repeat's own time: SLOWLOG's µs, capped by the server's CPU µs when known."""
    return list(figure.own_us)


def over_target(figures: list[Any]) -> list[str]:
    """The rows over the 10 ms target (docs/runs.md): a script whose own time, the median
    over the repeats, passes it. The median: one repeat slowed by the machine (this VM's
    CPU time doubles at its worst moments) decides nothing; a script that costs more at its
    caps is over in most repeats."""
    return [f"{f.script} ({f.scenario}): median {f.own:,.0f} µs of its own, each repeat "
            f"{own_us(f)}" for f in figures if f.over]


def problems(figures: list[Any], busy: int) -> list[str]:
    """What breaks the bound: a script whose own time reached the busy threshold, or BUSY
    replies that no measured call over the threshold explains."""
    found = [f"{f.script} ({f.scenario}): {max(own_us(f)):,} µs of its own, SLOWLOG "
             f"{f.server_us}, on a CPU {f.cpu_us}, waiting for one {f.wait_us}"
             for f in figures if max(own_us(f)) >= BUSY_US]
    if busy and not any(f.worst >= BUSY_US for f in figures):
        found.append(f"{busy} BUSY replies, yet no measured call reached the threshold")
    return found


def run(b: ModuleType, server: Server, capsys: pytest.CaptureFixture[str], title: str,
        work: Any, show: bool = True) -> Any:
    """``work(bench)`` with the busy probe running; print the figures (to the log; with
    ``show=False`` to pytest's capture, shown only if the test fails); then the bound."""
    bench = b.Bench(server.port, REPEATS, log=lambda line: None)
    before = b.busy_replies(bench.admin)
    prober = b.Prober(server.port)
    prober.start()
    started = time.monotonic()
    try:
        work(bench)
    finally:
        prober.stop()
    busy = b.busy_replies(bench.admin) - before
    figures = bench.figures
    worst = max(figures, key=lambda f: max(own_us(f)))
    over = [f for f in figures if f.over]
    loaded = [f for f in figures if f.worst >= BUSY_US]
    with capsys.disabled() if show else contextlib.nullcontext():
        print(f"\n{title}: {len(figures)} scenarios in {time.monotonic() - started:.0f} s, "
              f"load average {os.getloadavg()[0]:.2f}; worst stall {max(own_us(worst)):,} µs "
              f"of its own, {worst.worst:,} µs SLOWLOG ({worst.script}: {worst.scenario}); "
              f"{busy} BUSY replies; over the 10 ms target (median of its own time): "
              + (", ".join(f"{f.script} ({f.scenario}) {f.own:,.0f} µs" for f in over)
                 or "none"))
        if loaded:
            print("past the busy threshold in SLOWLOG only while the server waited for a "
                  "CPU: " + ", ".join(f"{f.script} ({f.scenario}) {f.server_us} µs, "
                                      f"waiting {f.wait_us}" for f in loaded))
        print(b.table(bench))
    assert prober.pings > 0, "the probe never reached the server"
    assert all(f.server_us for f in figures)
    assert problems(figures, busy + bench.busy_seen) == []
    assert over_target(figures) == [], "over the 10 ms target"
    return bench


def test_a_script_over_the_busy_threshold_breaks_the_bound(stall_server: Server) -> None:
    """The instruments can fail: a script that spins 1.5 s shows up in SLOWLOG, as its own
    time, as BUSY replies to the probe and in INFO errorstats, and breaks the bound. (The
    spin is long so that its CPU time passes the 100 ms threshold on a loaded machine too:
    with a fifth of a CPU, a spin of 600 ms had about 120 ms of its own, and 100 at worse.)"""
    b = bench_stall()
    source = (b"local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
              b"repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > 1500000 "
              b"return {0, 1, 0, -1}")
    spin = scripts.Script("spin", source, hashlib.sha1(source).hexdigest())
    stall_server.client().script_load(source)

    def op() -> Operation[Any]:
        return (yield Call(spin, (), (), lambda reply: reply, write=False)).unwrap()

    bench = b.Bench(stall_server.port, 1, log=lambda line: None)
    before = b.busy_replies(bench.admin)
    prober = b.Prober(stall_server.port, every=0.002)
    prober.start()
    try:
        bench.measure("spin 1.5 s", "spin", 0, 0, bench.admin, lambda i: op())
        time.sleep(0.05)
    finally:
        prober.stop()
    busy = b.busy_replies(bench.admin) - before
    (figure,) = bench.figures
    assert figure.worst >= 1_500_000
    assert prober.busy >= 1 and busy >= 1
    found = problems(bench.figures, busy)
    assert found and found[0].startswith("spin (spin 1.5 s)")
    (over,) = over_target(bench.figures)  # and it is over the 10 ms target: a row OVER
    assert over.startswith("spin (spin 1.5 s): median") and "OVER" in b.table(bench)
    assert problems([], busy) == [f"{busy} BUSY replies, yet no measured call reached the "
                                  "threshold"]


def test_every_run_script_at_its_caps_over_300k_runs_stays_below_the_busy_threshold(
        stall_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    """Every run script but run_migrate, at layout 5 (the only one the scripts read: an
    older namespace answers TOO_OLD until migrate(), measured below)."""
    b = bench_stall()

    def work(bench: Any) -> None:
        b.suite(bench, 0, b.Plan(runs=RUNS, per_item=False))

    try:
        bench = run(b, stall_server, capsys, f"layout {b.LAYOUT}, {RUNS:,} runs", work)
    finally:
        stall_server.client(db=0).flushdb()  # our own server: give the memory back
    measured = {f.script for f in bench.figures}
    expected = {s.name for s in scripts.RUN_SCRIPTS} - {"run_migrate"}
    assert measured == expected, "every run script has a stall scenario (migrate: below)"
    assert {f.layout for f in bench.figures} == {5}


def test_migrate_steps_at_their_caps_stay_below_the_busy_threshold(
        stall_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    """run_migrate steps from layouts 1 and 4 (written with plain commands) at their caps:
    SCAN COUNT, record bytes, and the entries moved out of layout 4's buckets."""
    b = bench_stall()
    first = 1

    def work(bench: Any) -> None:
        b.migration(bench, first, b.Plan(per_item=False))

    try:
        bench = run(b, stall_server, capsys, "migration to layout 5", work)
    finally:
        for db in range(first, first + b.MIGRATE_DBS):
            stall_server.client(db=db).flushdb()
    steps = [f for f in bench.figures if f.script == "run_migrate"]
    assert len(steps) == len(bench.figures) == 6
    assert sorted({f.layout for f in steps}) == [1, 4]


@pytest.mark.parametrize("kind", ["watch-set", "watch-hash", "outbox", "mirror", "meta",
                                  "repo", "header"])
def test_a_big_value_planted_in_a_key_a_script_reads_costs_no_more_than_its_refusal(
        stall_server: Server, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """Values of 8 and 32 MB planted in the keys of partitions (watch, outbox, mirror),
    the meta's layout and the repository's count: each script that meets one bounds it
    (STRLEN, HSTRLEN, SCARD, ZCARD) before it reads it, so it answers within the 10 ms
    target (read whole, 8 MB cost 34-43 ms and 32 MB 127-287 ms). And runs whose header
    region is the most a trailer announces, met by a get, a claim and a get_many."""
    b = bench_stall()
    db = 1 + b.MIGRATE_DBS

    def work(bench: Any) -> None:
        b.planted(bench, stall_server.client(db=db), kinds=[kind])

    try:
        run(b, stall_server, capsys, f"planted values ({kind})", work)
    finally:
        stall_server.client(db=db).flushdb()
