"""Where an insert's cost goes beyond a trivial EVALSHA: the same keys and arguments sent
to scripts that do more and more of insert's work, wall time beside server time.

    python benchmarks/bench_breakdown.py [--calls 1500] [--rounds 5] [--valkey]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis
from common import own_server, server_binary

from redisstore import Claim
from redisstore.core import scripts
from redisstore.core.driver import Batch
from redisstore.core.runops import RunOps
from redisstore.shells.sync import Transport, pool_for


def variants() -> dict[str, str]:
    """Scripts from nothing to the real insert, each adding a part of its work."""
    insert = scripts.RUN_INSERT.source.decode()
    fragments = insert[:insert.index("local k = KEYS[1]")]
    return {
        "return 1, no keys or args": "return 1",
        "return {0}, insert's keys and args": "return {0}",
        "+ the fragments insert uses": fragments + "return {0}",
        "+ HSETNX, TIME, one HSET": fragments + (
            "local k = KEYS[1]\n"
            "if redis.call('HSETNX', k, 'rev', '1') == 0 then return {2} end\n"
            "local n = now_ms()\n"
            "redis.call('HSET', k, 'rec', ARGV[3], 'own', ARGV[5], 'exp', int(n), 'wpv', '1')\n"
            "return {0}"),
        "the real insert (+ ZADD, SMEMBERS)": insert,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--valkey", action="store_true")
    args = parser.parse_args(argv)
    with own_server(server_binary(args.valkey)) as port:
        client = redis.Redis(host="127.0.0.1", port=port)
        shas = {name: str(client.script_load(source)) for name, source in variants().items()}
        figures: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            ops = RunOps(f"bench-{uuid.uuid4().hex[:8]}", None, 1)
            for n, (name, sha) in enumerate(shas.items()):
                commands: list[tuple[str | bytes | int, ...]] = []
                for i in range(args.calls):
                    command = next(ops.insert(f"{n}-{i}", b"x" * 128,
                                              Claim("me", 10**7))).command()
                    commands.append(("EVALSHA", sha, 0) if n == 0
                                    else (command[0], sha, *command[2:]))
                transport, pool = Transport(client), pool_for(client.connection_pool)
                client.config_resetstat()
                start = time.perf_counter()
                for command in commands:
                    transport.exchange(pool, Batch((command,), True),  # type: ignore[arg-type]
                                       time.monotonic() + 5)
                wall = (time.perf_counter() - start) / args.calls * 1e6
                server = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
                figures.setdefault(name, []).append((wall, float(server)))
    print(f"{'script':40} {'wall µs':>9} {'server µs':>10}")
    for name, values in figures.items():
        print(f"{name:40} {statistics.median(v[0] for v in values):9.1f} "
              f"{statistics.median(v[1] for v in values):10.1f}")


if __name__ == "__main__":
    main()
