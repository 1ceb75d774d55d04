"""``redisstore bench``: how long each store call takes on a server, in one table.

It runs in a namespace of its own (removed afterwards), one operation at a time, each
``ops`` times after a warm-up, and prints per operation the calls per second and the
latency percentiles seen by the caller (µs), with a progress line on stderr while it runs.
``--plot out.png`` draws the percentiles (needs matplotlib: ``pip install
'redisstore[plot]'``). The repository's ``benchmarks/`` folder has the long, side-by-side
benchmarks (peers, stalls, memory); this is the quick look.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..core.runs import Claim, Hold, Release
from .namespaces import drop_namespace

LONG = 600_000


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One operation's figures: calls, calls per second, latency percentiles in µs."""

    operation: str
    calls: int
    per_second: float
    p50: float
    p90: float
    p99: float
    worst: float


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(client: Any, ops: int = 500, progress: Any = None, *,
        namespace: str | None = None, stores: Callable[..., Any]) -> list[Row]:
    """Measure each operation ``ops`` times on ``client`` (a redis.Redis or fakeredis), in
    ``namespace`` (default: a new ``bench-<hex>``), whose keys are removed afterwards, on a
    store ``stores`` opens (the command's: ``RedisRunStore``, which the bench does not
    import, so it stands below the stores)."""
    from ..discovery import json_wait

    namespace = namespace or f"bench-{uuid.uuid4().hex[:8]}"
    store = stores(client, namespace=namespace, discover=json_wait)
    store.migrate()
    ready = b'{"wait": {"at": 0}}'
    revisions: dict[str, int] = {}  # what each insert returned: a write names it, no read

    def insert(run: str, record: bytes, lease: Any) -> None:
        revisions[run] = store.insert(run, record, lease)

    def write(i: int) -> None:
        store.compare_and_set(f"r{i}", revisions[f"r{i}"], b"y" * 100, Hold("me"))
        revisions[f"r{i}"] += 1

    def unit(i: int) -> Any:
        """A worker's steady state: finish p<i> and claim the next, one round trip."""
        with store.pipeline() as pipe:
            pipe.compare_and_set(f"p{i}", revisions[f"p{i}"], b"done", Release())
            nxt = pipe.claim_ready("w", LONG, 1, records=True)
        return nxt.result()

    plans: list[tuple[str, Callable[[int], Any], Callable[[int], Any] | None]] = [
        ("now", lambda i: store.now(), None),
        ("insert", lambda i: insert(f"r{i}", b"x" * 100, Claim("me", LONG)), None),
        ("get", lambda i: store.get(f"r{i}"), None),
        ("compare_and_set", write, None),
        ("renew (1 run)", lambda i: store.renew("me", [f"r{i}"], LONG), None),
        ("release (1 run)", lambda i: store.release("me", [f"r{i}"]), None),
        ("claim_ready (1, records)",
         lambda i: store.claim_ready("w", LONG, 1, records=True),
         lambda i: store.insert(f"q{i}", ready, Release())),
        ("pipeline: write + claim next", unit,
         lambda i: insert(f"p{i}", ready, Claim("w", LONG))),
    ]
    rows: list[Row] = []
    try:
        for step, (name, call, prepare) in enumerate(plans, 1):
            if prepare is not None:
                for i in range(ops + 20):
                    prepare(i)
            for i in range(20):  # warm-up: connections, the script cache
                call(ops + i)
            times: list[float] = []
            started = time.perf_counter()
            for i in range(ops):
                t0 = time.perf_counter()
                call(i)
                times.append((time.perf_counter() - t0) * 1e6)
                if progress is not None and i % 50 == 0:
                    progress(step, len(plans), name, i, ops)
            total = time.perf_counter() - started
            rows.append(Row(name, ops, ops / total, _pct(times, 0.5), _pct(times, 0.9),
                            _pct(times, 0.99), max(times)))
    finally:
        store.close()
        drop_namespace(client, namespace)
    return rows


def table(rows: list[Row]) -> str:
    """The rows as an aligned text table."""
    lines = [f"{'operation':<30}{'calls/s':>10}{'p50 µs':>10}{'p90 µs':>10}{'p99 µs':>10}"
             f"{'max µs':>10}"]
    for r in rows:
        lines.append(f"{r.operation:<30}{r.per_second:>10,.0f}{r.p50:>10,.0f}{r.p90:>10,.0f}"
                     f"{r.p99:>10,.0f}{r.worst:>10,.0f}")
    return "\n".join(lines)


def as_json(rows: list[Row]) -> str:
    """The rows as JSON."""
    return json.dumps([dataclasses.asdict(r) for r in rows], indent=2)


def plot(rows: list[Row], path: str) -> None:
    """Draw p50/p90/p99 per operation into ``path`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'redisstore[plot]'") from exc
    figure, axes = plt.subplots(figsize=(9, 4.5))
    names = [r.operation for r in rows]
    positions = range(len(rows))
    for offset, (label, values) in enumerate((("p50", [r.p50 for r in rows]),
                                              ("p90", [r.p90 for r in rows]),
                                              ("p99", [r.p99 for r in rows]))):
        axes.bar([p + (offset - 1) * 0.27 for p in positions], values, width=0.27, label=label)
    axes.set_xticks(list(positions), names, rotation=30, ha="right", fontsize=8)
    axes.set_ylabel("µs per call (caller's view)")
    axes.set_title("redisstore bench")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def progress_line(step: int, steps: int, name: str, done: int, total: int) -> None:
    """A progress line on stderr (rewritten in place on a terminal)."""
    if sys.stderr.isatty():
        print(f"\r[{step}/{steps}] {name:<30} {done:>6}/{total}", end="", file=sys.stderr,
              flush=True)
