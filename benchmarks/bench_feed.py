"""What the change feed's entry costs the server per call, in callgrind instructions: the
commands a script would add to write one entry (docs/contract.md, "The change feed"),
measured alone in EVALSHA calls, beside the floor (``return 1``) and beside the job cycle's
unit (benchmarks/README.md: ``finish`` + ``claim(1, records)``, 901,923 instructions in
its last table) and ``claim(100)`` (about 19M a call).

Each row starts ``redis-server`` under ``valgrind --tool=callgrind`` (as
``bench_instructions.py`` does, ``hz 1``), fills a stream of ``--prefill`` entries of one
event (a partition's feed at its size bound), then makes ``--calls`` calls of the row's
script; (instructions with calls - instructions without) / calls is one call's cost.

Rows (each appends one entry to ``{f}:feed`` and trims it as a store would):

- ``floor``: ``return 1``: what any EVALSHA costs.
- ``xadd``: ``XADD key MAXLEN ~ n *`` of one event (``p`` prev id, ``o`` owner, run, code).
- ``prev+xadd``: the same after ``XREVRANGE key + - COUNT 1`` (the id of the entry before,
  which each entry names so a reader detects a gap exactly).
- ``prev+xadd+minid``: the same, then ``XTRIM key MINID ~ t`` (the time bound; XADD takes
  one trim strategy a call).
- ``prev+xadd(100)``: one entry listing 100 events (a claim of 100 runs), MAXLEN ~.
- ``seq+xadd``: the entry's sequence number from ``HINCRBY meta feed-n 1`` instead of the
  id before it (a reader detects a gap as exactly: the entry after its position must be
  the next number), then ``XADD ... MAXLEN ~``.
- ``seq+xadd+minid/128``: the same, and the time bound's ``XTRIM MINID ~`` only on every
  128th entry (its ``TIME`` too).
- ``seq+xadd(100)``: the sequence number, then one entry of 100 events.

Nothing is asserted; the figures are printed::

    .venv/bin/python benchmarks/bench_feed.py [--calls 200] [--prefill 10000]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import redis
from bench_instructions import instructions

KEY = "{f}:feed"
META = "{f}:meta"
RUN = "run-0001"
OWNER = "node-a"
MAXLEN = 500_000

PREV = "local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)\n" \
       "local prev = last[1] and last[1][1] or '0-0'\n"


def xadd(events: int, trim: str = "MAXLEN") -> str:
    pairs = ", ".join(f"ARGV[1] .. '{n}', 'c7'" for n in range(events))
    if trim == "MAXLEN":
        return (f"redis.call('XADD', KEYS[1], 'MAXLEN', '~', {MAXLEN}, '*', 'p', prev, "
                f"'o', ARGV[2], {pairs})\n")
    raise ValueError(trim)


MINID = ("local t = redis.call('TIME')\n"
         "redis.call('XTRIM', KEYS[1], 'MINID', '~', "
         "(tonumber(t[1]) - 3600) * 1000 .. '-0')\n")

SEQ = "local prev = redis.call('HINCRBY', KEYS[2], 'feed-n', 1)\n"
EVERY = ("if prev % 128 == 0 then\n" + MINID + "end\n")

ROWS: dict[str, str] = {
    "floor": "return 1",
    "xadd": "local prev = '0-0'\n" + xadd(1) + "return 1",
    "prev+xadd": PREV + xadd(1) + "return 1",
    "prev+xadd+minid": PREV + xadd(1) + MINID + "return 1",
    "prev+xadd(100)": PREV + xadd(100) + "return 1",
    "seq+xadd": SEQ + xadd(1) + "return 1",
    "seq+xadd+minid/128": SEQ + xadd(1) + EVERY + "return 1",
    "seq+xadd(100)": SEQ + xadd(100) + "return 1",
}


def workload(source: str, calls: int, prefill: int) -> Callable[[redis.Redis], int]:
    def work(client: redis.Redis) -> int:
        pipe = client.pipeline(transaction=False)
        for n in range(prefill):
            pipe.xadd(KEY, {"p": "0-0", "o": OWNER, f"run-{n}": "c1"})
            if n % 1000 == 999:
                pipe.execute()
        pipe.execute()
        sha = client.script_load(source)
        for _ in range(calls):
            client.evalsha(sha, 2, KEY, META, RUN, OWNER)
        return calls
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--prefill", type=int, default=10_000)
    parser.add_argument("--only", default="", help="rows, comma-separated")
    args = parser.parse_args()
    rows = [r for r in ROWS if not args.only or r in args.only.split(",")]
    base = None
    for row in rows:
        without, _ = instructions(workload(ROWS[row], 0, args.prefill))
        with_calls, units = instructions(workload(ROWS[row], args.calls, args.prefill))
        cost = (with_calls - without) / units
        if row == "floor":
            base = cost
        extra = f"  (+{cost - base:,.0f} over the floor)" if base is not None and row != "floor" \
            else ""
        print(f"{row:18} {cost:12,.0f} instructions a call{extra}", flush=True)


if __name__ == "__main__":
    main()
