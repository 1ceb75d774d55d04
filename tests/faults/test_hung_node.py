"""One primary of three hung (SIGSTOP, not failed over) under a store of 6 partitions: the
claims hand out the runs of the partitions that answer in time, well within the deadline,
and the calls of a run in a healthy partition are not delayed by the hung node. Sync and
asyncio. (docs/faults.md, "One partition's node fails", has the measured table.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio
from aio_suites import LoopThread
from redis.cluster import RedisCluster
from servers import Server, redis_binary, start_cluster, unique_namespace

from redisstore import AsyncRedisRunStore, Claim, Held, RedisRunStore, Release, Unavailable
from redisstore.conformance.readiness import rec
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.discovery import json_wait

pytestmark = pytest.mark.server

TIMEOUT = 2000  # ms: every call's deadline
PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    # A hung node stays a member: no failure detection (and CLUSTERDOWN) within a test.
    slow = ("--cluster-node-timeout", "60000")
    servers = start_cluster(redis_binary(), tmp_path_factory.mktemp("hung"),
                            extra={i: slow for i in range(3)})
    yield servers
    for server in servers:
        server.kill()


@contextlib.contextmanager
def hung(server: Server) -> Iterator[None]:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


class Store:
    """A store of 6 partitions on the cluster, sync or asyncio (run on a loop thread of its
    own), called synchronously; ``timed`` gives a call's answer (or error) and seconds."""

    def __init__(self, shell: str, cluster: list[Server]) -> None:
        self.namespace = unique_namespace("hung")
        self.loop: LoopThread | None = None
        port = cluster[0].port
        if shell == "sync":
            self.client: Any = RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
            self.store: Any = RedisRunStore(self.client, namespace=self.namespace,
                                            discover=json_wait, partitions=PARTITIONS,
                                            timeout=TIMEOUT)
        else:
            self.loop = LoopThread()
            self.client = self.loop.run(asyncio.sleep(0, redis.asyncio.RedisCluster(
                host="127.0.0.1", port=port, socket_timeout=10)))
            self.store = AsyncRedisRunStore(self.client, namespace=self.namespace,
                                            discover=json_wait, partitions=PARTITIONS,
                                            timeout=TIMEOUT)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        got = getattr(self.store, name)(*args, **kwargs)
        return got if self.loop is None else self.loop.run(got)

    def timed(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        since = time.monotonic()
        try:
            got = self.call(name, *args, **kwargs)
        except Exception as exc:
            got = exc
        return got, time.monotonic() - since

    def node_of(self, p: int, cluster: list[Server]) -> Server:
        """The server holding partition ``p``."""
        sync = RedisCluster(host="127.0.0.1", port=cluster[0].port)
        try:
            port = sync.get_node_from_key(Keyspace(self.namespace, p).leases).port
        finally:
            sync.close()
        return next(s for s in cluster if s.port == port)

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
            self.client.close()
            return
        self.loop.run(self.store.aclose())
        self.loop.run(self.client.aclose())
        self.loop.stop()


def runs_in(partitions: set[int], each: int, prefix: str) -> list[str]:
    """``each`` run ids in every partition of ``partitions``."""
    found: dict[int, list[str]] = {p: [] for p in partitions}
    n = 0
    while any(len(v) < each for v in found.values()):
        run = f"{prefix}{n}"
        p = partition_of(run, PARTITIONS)
        if p in found and len(found[p]) < each:
            found[p].append(run)
        n += 1
    return [run for p in sorted(found) for run in found[p]]


def setup(shell: str, cluster: list[Server]) -> tuple[Store, Server, set[int]]:
    """The store, the node to hang (one holding some partitions, not all) and the
    partitions of the other nodes."""
    for _ in range(20):  # a namespace whose 6 partitions are on at least two nodes
        io = Store(shell, cluster)
        nodes = {p: io.node_of(p, cluster) for p in range(PARTITIONS)}
        ports = {s.port for s in nodes.values()}
        if len(ports) >= 2:
            break
        io.close()
    # The node holding most partitions, fewer than all: the worst case for a claim.
    counts = {port: sum(1 for s in nodes.values() if s.port == port) for port in ports}
    port = max(ports, key=lambda q: counts[q])
    victim = next(s for s in cluster if s.port == port)
    healthy = {p for p, s in nodes.items() if s.port != port}
    print(f"\n{shell}: hung node holds partitions "
          f"{sorted(set(range(PARTITIONS)) - healthy)} of {PARTITIONS}")
    return io, victim, healthy


@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_hung_node_costs_a_claim_only_its_own_partitions(
        cluster: list[Server], shell: str) -> None:
    io, victim, healthy = setup(shell, cluster)
    everywhere = set(range(PARTITIONS))
    try:
        ready = runs_in(everywhere, 1, "ready-")
        expired = runs_in(everywhere, 1, "gone-")
        for run in ready:
            io.call("insert", run, rec({"at": 0}), Release())
        for run in expired:
            io.call("insert", run, rec(None), Claim("old", 1))
        time.sleep(0.05)  # the expired leases are past their ttl
        assert io.call("quarantined") == []  # a connection to every node before the hang
        ok_ready = {r for r in ready if partition_of(r, PARTITIONS) in healthy}
        ok_expired = {r for r in expired if partition_of(r, PARTITIONS) in healthy}
        with hung(victim):
            got, seconds = io.timed("claim_ready", "me", 60_000, 10)
            print(f"{shell}: claim_ready(10), one node hung: {seconds * 1000:.0f} ms, {got!r}")
            assert not isinstance(got, Exception), got
            assert set(got) == ok_ready
            assert seconds < TIMEOUT / 1000

            got, seconds = io.timed("claim_expired", "me", 60_000, 10)
            print(f"{shell}: claim_expired(10): {seconds * 1000:.0f} ms, {got!r}")
            assert not isinstance(got, Exception), got
            assert set(got) == ok_expired
            assert seconds < TIMEOUT / 1000

            # A blocked claim with nothing claimable where it can reach: a run made ready
            # in a healthy partition is handed out.
            late = runs_in({min(healthy)}, 1, "late-")[0]
            threading.Timer(0.5, lambda: io.call("insert", late, rec({"at": 0}),
                                                 Release())).start()
            got, seconds = io.timed("claim_ready", "me", 60_000, 10, block=5_000)
            print(f"{shell}: claim_ready(10, block=5000): {seconds * 1000:.0f} ms, {got!r}")
            assert got == [late], got
            assert seconds < 0.5 + TIMEOUT / 1000

            # The calls of one run in a healthy partition do not wait for the hung node
            # (after the claims had it time out, and the cluster client relearn its map).
            run = runs_in({min(healthy)}, 1, "one-")[0]
            for name, args in (("insert", (run, rec(None), Claim("me", 60_000))),
                               ("get", (run,)),
                               ("compare_and_set", (run, 1, rec(None), Claim("me", 60_000)))):
                got, seconds = io.timed(name, *args)
                print(f"{shell}: {name} of a healthy partition's run: "
                      f"{seconds * 1000:.1f} ms, {got!r}")
                assert not isinstance(got, Exception), got
                assert seconds < TIMEOUT / 1000
        # Once the node answers again, the claims that probe it hand out its runs.
        rest = set(ready) - ok_ready
        got_back: set[str] = set()
        until = time.monotonic() + 10
        while got_back != rest and time.monotonic() < until:
            time.sleep(0.2)
            got_back.update(io.call("claim_ready", "me", 60_000, 10))
        assert got_back == rest
    finally:
        io.close()


SESSION_TTL = 5000  # ms: a keepalive waits for the hung node its deadline (TIMEOUT) each time


@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_hung_node_costs_a_session_only_its_own_partitions(
        cluster: list[Server], shell: str) -> None:
    """A session over the 6 partitions while one node is hung past its ttl: the keepalives
    keep it alive in the other nodes' partitions throughout; once the node is back, the
    session has lapsed in its partitions alone: their runs are expired (taken over by
    another owner's claim, due at the session's expiry), the keepalive names those
    partitions and goes on, and the session's claims leave them out."""
    io, victim, healthy = setup(shell, cluster)
    everywhere = set(range(PARTITIONS))
    away = frozenset(everywhere - healthy)

    def on(session: Any, name: str, *args: Any) -> Any:
        got = getattr(session, name)(*args)
        return got if io.loop is None else io.loop.run(got)

    try:
        runs = runs_in(everywhere, 2, "held-")
        for run in runs:
            io.call("insert", run, rec({"at": 0}), Release())
        assert io.call("quarantined") == []  # a connection to every node before the hang
        session = io.call("open_session", "me", SESSION_TTL)
        assert sorted(on(session, "claim", len(runs))) == sorted(runs)
        kept_runs = {r for r in runs if partition_of(r, PARTITIONS) in healthy}
        with hung(victim):
            until = time.monotonic() + SESSION_TTL / 1000 + 1
            while time.monotonic() < until:
                kept = on(session, "keepalive")
                assert (list(kept), kept.lapsed, kept.unanswered) == ([], frozenset(), away)
            for run in kept_runs:  # alive throughout, by the keepalives of the others
                assert io.call("get", run).holder == Held("me", True)
            # Nothing due where it reaches: its claim answers none, not the hung node's error.
            assert on(session, "claim", 5) == []
        # Back: its partitions find the session lapsed (the node's clock ran on).
        until = time.monotonic() + 10
        while True:
            try:
                kept = on(session, "keepalive")
            except Unavailable:
                kept = None  # the cluster client relearning the hung node
            if kept is not None and not kept.unanswered:
                break
            assert time.monotonic() < until, "the node never answered again"
            time.sleep(0.2)
        assert (list(kept), kept.lapsed) == ([], away)
        for run in runs:
            live = run in kept_runs
            assert io.call("get", run).holder == Held("me", live)
        # Its runs there are another's, due at the session's expiry there (claims over
        # partitions leave out a node slow to answer their heads: the node just back may be
        # for a while).
        taken: set[str] = set()
        until = time.monotonic() + 10
        tries = 0
        while taken != set(runs) - kept_runs and time.monotonic() < until:
            tries += 1
            taken.update(io.call("claim_expired", "other", 60_000, len(runs)))
            time.sleep(0.1)
        print(f"{shell}: the lapsed partitions' runs taken over in {tries} claims")
        assert taken == set(runs) - kept_runs
        # The session's claims leave those partitions out; its keepalives go on.
        fresh = runs_in(everywhere, 1, "fresh-")
        for run in fresh:
            io.call("insert", run, rec({"at": 0}), Release())
        got = on(session, "claim", len(fresh))
        assert set(got) == {r for r in fresh if partition_of(r, PARTITIONS) in healthy}
        assert on(session, "keepalive").lapsed == away
        assert on(session, "close") == len(kept_runs) + len(got)
    finally:
        io.close()
