"""Faults on real servers, for both ports: a cut in each phase of a call (before the request
is sent, after it, between a write's reply and its confirmation), lost replies of every
write, server errors, and scripts flushed under load, through redis-py, valkey-py and
redis.asyncio clients. (Crashes, failover and the torture test live elsewhere.)"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio
from aio_suites import LoopThread, Synced
from faultproxy import FaultProxy
from servers import (
    Server,
    awarm,
    redis_binary,
    replica_pair,
    start,
    unique_namespace,
    valkey_binary,
    warm,
)

from redisstore import (
    AsyncRedisRunStore,
    Claim,
    ConcurrentUpdate,
    Conflict,
    Durability,
    Free,
    Held,
    Hold,
    InstanceRecord,
    NotFound,
    RedisRepository,
    RedisRunStore,
    Release,
    Unavailable,
    confirm_write,
)
from redisstore.core import scripts
from redisstore.discovery import json_wait

# serial: cuts, lost replies and timeouts at their deadlines
pytestmark = [pytest.mark.server, pytest.mark.serial]
LONG = 600_000
SHORT = 800  # ms: a claim whose reply is lost stays held this long


@pytest.fixture(params=["redis", "valkey"])
def server(request: pytest.FixtureRequest) -> Server:
    fixture: Server = request.getfixturevalue("redis7" if request.param == "redis"
                                              else "valkey8")
    return fixture


@pytest.fixture
def proxy(server: Server) -> Iterator[FaultProxy]:
    with FaultProxy(server.port) as p:
        yield p


def through(proxy: FaultProxy, **options: Any) -> redis.Redis:
    """A client whose handshake and script loads are done, so the next reply a test drops or
    replaces is the operation's own."""
    options.setdefault("socket_timeout", 0.3)
    client = redis.Redis(host=proxy.host, port=proxy.port, **options)
    client.ping()
    for script in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS):
        client.script_load(script.source)
    warm(client)
    return client


# ---------------------------------------------------------------------------- each phase

#: The client libraries a store is given: the shells turn each one's exceptions into the
#: same neutral values, so each phase must end in the same outcome through all of them.
LIBRARIES = ["redis-py", "valkey-py", "redis.asyncio"]


@contextlib.contextmanager
def run_store(library: str, proxy: FaultProxy, namespace: str, *, ready: bool = True,
              socket_timeout: float = 0.3, **options: Any) -> Iterator[RedisRunStore]:
    """A run store on a client of ``library`` through ``proxy`` (an asyncio store is driven
    from this thread on a loop of its own). With ``ready``, connected, scripts loaded and the
    store's pool warm, so that what a test cuts is an operation's own exchange."""
    if library == "redis.asyncio":
        loop = LoopThread()

        async def connect() -> redis.asyncio.Redis:
            client = redis.asyncio.Redis(host=proxy.host, port=proxy.port,
                                         socket_timeout=socket_timeout)
            if ready:
                await client.ping()
                for script in scripts.RUN_SCRIPTS:
                    await client.script_load(script.source)
                await awarm(client)
            return client

        aclient = loop.run(connect())
        try:
            store = AsyncRedisRunStore(aclient, namespace=namespace, discover=json_wait,
                                       **options)
            yield cast(RedisRunStore, Synced(store, loop))
            loop.run(aclient.aclose())
        finally:
            loop.stop()
        return
    if library == "valkey-py":
        valkey = pytest.importorskip("valkey")
        client = valkey.Valkey(host=proxy.host, port=proxy.port, socket_timeout=socket_timeout)
    else:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=socket_timeout)
    if ready:
        client.ping()
        for script in scripts.RUN_SCRIPTS:
            client.script_load(script.source)
        warm(client)
    yield RedisRunStore(client, namespace=namespace, discover=json_wait, **options)
    client.close()


def _every_write(store: RedisRunStore) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("insert", lambda: store.insert("new", b"new-token", Release())),
        ("compare_and_set", lambda: store.compare_and_set("run", 1, b"r2-token", Hold("me"))),
        ("renew", lambda: store.renew("me", ["run"], LONG)),
        ("claim_expired", lambda: store.claim_expired("me", LONG, 10)),
        ("claim_ready", lambda: store.claim_ready("me", LONG, 10)),
        ("refresh", lambda: store.refresh("ready")),
    ]


def _cut_then(proxy: FaultProxy, store: RedisRunStore, write: Callable[[], object]) -> None:
    """Cut every connection, then make ``write`` at once. An asyncio store's call runs on its
    loop right after the cut, in the same step: the loop has not yet run the read callback
    that would tell the client's stream about the EOF, only the socket knows."""
    if not isinstance(store, Synced):
        proxy.cut_all()
        write()
        return

    async def cut_and_insert() -> None:
        proxy.cut_all()
        await store.store.insert("new", b"new-token", Release())

    store._loop.run(cut_and_insert())


@pytest.mark.parametrize("connection", ["new", "pooled"])
@pytest.mark.parametrize("library", LIBRARIES)
def test_a_cut_before_the_request_is_sent_is_not_applied(
        library: str, connection: str, server: Server, proxy: FaultProxy) -> None:
    """The connection is cut before a byte of the write leaves: the store's idle pooled
    connection was closed (it must notice before sending), or a new one is closed as soon as
    it is accepted. Nothing ran: ``not_applied``, and nothing is written."""
    namespace = unique_namespace()
    direct = RedisRunStore(server.client(), namespace=namespace, discover=json_wait)
    lease_ends = time.monotonic() + 0.3
    direct.insert("run", b"r1", Claim("me", 300))  # a renewal would keep it live past 300 ms
    direct.insert("crashed", b"c1", Claim("dead", 1))
    direct.insert("ready", b'{"wait": {"at": 0}}', Release())
    time.sleep(0.01)  # the dead lease (1 ms) ran out
    with run_store(library, proxy, namespace, ready=connection == "pooled") as store:
        proxy.refuse()  # every new connection is closed at once
        for name, write in _every_write(store):
            with pytest.raises(Unavailable) as caught:
                if name == "insert":  # the first: cut every open connection right before it
                    _cut_then(proxy, store, write)
                else:
                    write()
            assert (caught.value.outcome, caught.value.code) == ("not_applied", None), \
                (name, caught.value.reason)
        assert proxy.connections_refused >= len(_every_write(store))
        # Nothing was written: no run, no revision, no claim, no renewal.
        with pytest.raises(NotFound):
            direct.get("new")
        assert direct.get("crashed").holder == Held("dead", False)
        assert direct.get("ready").holder == Free()
        time.sleep(max(0.0, lease_ends - time.monotonic()) + 0.05)
        current = direct.get("run")
        assert (current.revision, current.record, current.holder) == (1, b"r1",
                                                                      Held("me", False))
        proxy.refuse(False)
        store.compare_and_set("run", 1, b"r2", Hold("me"))  # and it works again
    assert direct.get("run").revision == 2


@pytest.mark.parametrize("hang", [False, True], ids=["closed", "timed-out"])
@pytest.mark.parametrize("library", LIBRARIES)
def test_a_cut_after_the_request_is_sent_is_unknown_and_a_resend_is_harmless(
        library: str, hang: bool, server: Server, proxy: FaultProxy) -> None:
    """The release reached the server, its reply did not reach the client: ``unknown``, and
    it is there exactly once. Sending it again is refused by the revision fence, and
    renewing afterwards revives nothing (what docs/faults.md promises about resending)."""
    namespace = unique_namespace()
    direct = RedisRunStore(server.client(), namespace=namespace)
    direct.insert("run", b"r1", Claim("me", LONG))
    with run_store(library, proxy, namespace) as store:
        proxy.drop_replies(1, hang=hang)
        with pytest.raises(Unavailable) as caught:
            store.compare_and_set("run", 1, b"r2-token", Release())
        assert caught.value.outcome == "unknown", caught.value.reason
        assert proxy.replies_dropped == 1
        stored = direct.get("run")
        assert (stored.revision, stored.record, stored.holder) == (2, b"r2-token", Free())
        with pytest.raises(Conflict) as conflict:  # the resend cannot apply twice
            store.compare_and_set("run", 1, b"r2-token", Release())
        assert conflict.value.current == 2
        assert confirm_write(store, "run", 2, b"r2-token")  # ... and the stored one is ours
        assert store.renew("me", ["run"], LONG) == []  # a released lease stays released
    assert direct.get("run") == stored


class CutAfter(FaultProxy):
    """A proxy that can let a number of the server's replies through, then cut the
    connection at the next one (the pipelined write and WAIT come back as separate
    replies, and the test must cut between them)."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._passes = 0
        self._passes_lock = threading.Lock()

    def cut_after(self, passes: int) -> None:
        """Forward the next ``passes`` chunks from the server, then drop the one after and
        close that connection."""
        with self._passes_lock:
            self._passes = passes
        self.drop_replies(1)

    def _take_drop(self) -> str | None:
        # The hook the proxy calls for every chunk from the server, before forwarding it.
        with self._passes_lock:
            if self._passes > 0:
                self._passes -= 1
                return None
        return super()._take_drop()


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize(("phase", "outcome"), [("write", "unknown"),
                                                ("confirmation", "applied_unconfirmed")])
def test_a_cut_around_the_durability_confirmation_has_the_outcome_of_its_phase(
        phase: str, outcome: str, library: str, replica: tuple[Server, Server]) -> None:
    """With Durability the store pipelines EVALSHA then WAIT. Cut before the write's reply:
    ``unknown``. Cut after the write's reply, before WAIT's: the write is applied, only its
    confirmation is missing: ``applied_unconfirmed``. Either way the write is there once."""
    primary, copy = replica
    namespace = unique_namespace()
    direct = RedisRunStore(primary.client(), namespace=namespace)
    direct.insert("run", b"r1", Claim("me", LONG))
    durability = Durability(replicas=1, timeout=1000)
    # A socket timeout above WAIT's: the confirmation is cut, not timed out.
    with CutAfter(primary.port) as proxy, \
            run_store(library, proxy, namespace, socket_timeout=3,
                      durability=durability) as store:
        store.compare_and_set("run", 1, b"r2", Hold("me"))  # confirmed; the WAIT check done
        assert copy.process is not None
        # A stopped replica acknowledges nothing, so WAIT answers only at its timeout, a
        # second after the write's reply: the two replies cannot arrive as one chunk.
        copy.process.send_signal(signal.SIGSTOP)
        try:
            proxy.cut_after(0 if phase == "write" else 1)
            with pytest.raises(Unavailable) as caught:
                store.compare_and_set("run", 2, b"r3-token", Hold("me"))
        finally:
            copy.process.send_signal(signal.SIGCONT)
        assert caught.value.outcome == outcome, caught.value.reason
        if phase == "confirmation":
            # The confirmation's reply was lost; not a WAIT that answered "0 replicas".
            assert "lost" in caught.value.reason, caught.value.reason
        assert proxy.replies_dropped == 1
    current = direct.get("run")
    assert (current.revision, current.record) == (3, b"r3-token")
    assert confirm_write(direct, "run", 3, b"r3-token")


# ---------------------------------------------------------------------------- lost replies


@dataclass
class Case:
    """One write: how to set it up, make it, and tell afterwards that it applied once."""

    setup: Callable[[RedisRunStore, RedisRepository], None]
    write: Callable[[RedisRunStore, RedisRepository], object]
    applied_once: Callable[[RedisRunStore, RedisRepository], None]


def _set_up_runs(runs: RedisRunStore, repo: RedisRepository) -> None:
    runs.insert("existing", b'{"wait": {"at": 0}}', Claim("me", SHORT))
    runs.insert("crashed", b"r", Claim("dead", 1))
    runs.insert("ready", b'{"wait": {"at": 0}}', Release())
    repo.register_group("g")
    repo.save(InstanceRecord("inst", b"v1", "g"))
    time.sleep(0.01)


def _set_up_layout_3(runs: RedisRunStore, repo: RedisRepository) -> None:
    runs.migrate()  # delete needs it
    _set_up_runs(runs, repo)


def _released(runs: RedisRunStore, repo: RedisRepository) -> None:
    assert runs.get("existing").holder == Free()
    assert runs.release("me", ["existing"]) == []  # a resend finds nothing left to free


def _run_deleted_once(runs: RedisRunStore, repo: RedisRepository) -> None:
    with pytest.raises(NotFound):
        runs.get("existing")
    with pytest.raises(NotFound):  # a resend deletes nothing more
        runs.delete("existing", 1, Hold("me"))


def _insert_once(runs: RedisRunStore, repo: RedisRepository) -> None:
    assert confirm_write(runs, "new", 1, b"token-1")
    with pytest.raises(Exception, match="exists"):
        runs.insert("new", b"token-1", Release())


def _cas_once(runs: RedisRunStore, repo: RedisRepository) -> None:
    assert confirm_write(runs, "existing", 2, b"token-2")
    with pytest.raises(Conflict):
        runs.compare_and_set("existing", 1, b"token-2", Hold("me"))


def _set_up_renew(runs: RedisRunStore, repo: RedisRepository) -> None:
    # The lease to renew runs 60 s, not SHORT: on a loaded machine SHORT may pass before the
    # renewal through the proxy arrives, and a renewal rightly never revives a lease.
    _set_up_runs(runs, repo)
    assert runs.renew("me", ["existing"], 60_000) == ["existing"]


def _renewed(runs: RedisRunStore, repo: RedisRepository) -> None:
    # The lost renewal did extend it: the lease now ends LONG from the renewal, far past the
    # 60 s it had (the leases index holds its expiry).
    expiry = runs._io.client.zscore(f"{{{runs.namespace}}}:leases", "existing")
    assert expiry is not None and expiry > runs.now() + 60_000
    assert runs.get("existing").holder == Held("me", True)


def _claimed_expired(runs: RedisRunStore, repo: RedisRepository) -> None:
    assert runs.get("crashed").holder == Held("me", True)
    assert runs.claim_expired("other", LONG, 10) == []  # nobody else gets it meanwhile
    time.sleep(SHORT / 1000 + 0.05)
    assert "crashed" in runs.claim_expired("other", LONG, 10)  # ... until the ttl ran out


def _claimed_ready(runs: RedisRunStore, repo: RedisRepository) -> None:
    assert runs.get("ready").holder == Held("me", True)
    assert runs.claim_ready("other", LONG, 10) == []
    time.sleep(SHORT / 1000 + 0.05)
    assert "ready" in runs.claim_expired("other", LONG, 10)


def _saved_once(runs: RedisRunStore, repo: RedisRepository) -> None:
    stored = repo.load("inst")
    assert stored is not None and (stored.rec_version, stored.payload) == (2, b"v2-token")
    with pytest.raises(ConcurrentUpdate):
        repo.save(InstanceRecord("inst", b"v2-token", "g", rec_version=1))


def _deleted(runs: RedisRunStore, repo: RedisRepository) -> None:
    assert repo.load("inst") is None


CASES = {
    "insert": Case(_set_up_runs, lambda r, _: r.insert("new", b"token-1", Release()),
                   _insert_once),
    "compare_and_set": Case(_set_up_runs, lambda r, _: r.compare_and_set(
        "existing", 1, b"token-2", Hold("me")), _cas_once),
    "renew": Case(_set_up_renew, lambda r, _: r.renew("me", ["existing"], LONG), _renewed),
    "release": Case(_set_up_runs, lambda r, _: r.release("me", ["existing"]), _released),
    "delete run": Case(_set_up_layout_3, lambda r, _: r.delete("existing", 1, Hold("me")),
                       _run_deleted_once),
    "claim_expired": Case(_set_up_runs, lambda r, _: r.claim_expired("me", SHORT, 10),
                          _claimed_expired),
    "claim_ready": Case(_set_up_runs, lambda r, _: r.claim_ready("me", SHORT, 10),
                        _claimed_ready),
    "save": Case(_set_up_runs, lambda _, repo: repo.save(
        InstanceRecord("inst", b"v2-token", "g", rec_version=1)), _saved_once),
    "delete": Case(_set_up_runs, lambda _, repo: repo.delete("inst"), _deleted),
}


@pytest.mark.parametrize("hang", [False, True], ids=["closed", "timed-out"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_lost_reply_is_unavailable_and_the_write_applied_once(
        name: str, hang: bool, server: Server, proxy: FaultProxy) -> None:
    case = CASES[name]
    namespace = unique_namespace()
    direct_runs = RedisRunStore(server.client(), namespace=namespace, discover=json_wait)
    direct_repo = RedisRepository(server.client(), namespace=namespace)
    case.setup(direct_runs, direct_repo)
    client = through(proxy)  # redis-py's default retry stays on: the store must not use it
    runs = RedisRunStore(client, namespace=namespace, discover=json_wait)
    repo = RedisRepository(client, namespace=namespace)
    proxy.drop_replies(1, hang=hang)
    with pytest.raises(Unavailable) as caught:
        case.write(runs, repo)
    assert caught.value.outcome == "unknown"
    assert proxy.replies_dropped == 1
    case.applied_once(direct_runs, direct_repo)


# ---------------------------------------------------------------------------- server errors

REFUSALS = [
    "LOADING Redis is loading the dataset in memory",
    "CLUSTERDOWN The cluster is down",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
]


@pytest.mark.parametrize("error", REFUSALS, ids=lambda e: e.split()[0])
def test_refusing_servers_are_unavailable_and_nothing_is_applied(
        error: str, server: Server, proxy: FaultProxy) -> None:
    namespace = unique_namespace()
    direct = RedisRunStore(server.client(), namespace=namespace)
    direct.insert("run", b"r1", Claim("me", LONG))
    client = through(proxy)
    store = RedisRunStore(client, namespace=namespace)
    kind = error.split()[0]
    for call, write in ((lambda: store.compare_and_set("run", 1, b"r2", Hold("me")), True),
                        (lambda: store.insert("other", b"r", Release()), True),
                        (lambda: store.get("run"), False)):
        client.ping()  # connected before the errors are armed: a handshake is not counted
        before = proxy.errors_answered
        proxy.answer_errors(error, count=100)
        with pytest.raises(Unavailable) as caught:
            call()
        proxy.answer_errors(error, count=0)
        assert kind in caught.value.reason, caught.value.reason
        assert caught.value.outcome == "not_applied"
        assert caught.value.code == kind
        sent = proxy.errors_answered - before
        # A write is sent at most once (a connection whose handshake the server refused
        # counts its handshake commands here, and sends no write at all).
        assert sent >= 1
        del write
    assert direct.get("run").revision == 1
    assert not confirm_write(direct, "other", 1, b"r")
    store.compare_and_set("run", 1, b"r2", Hold("me"))  # and it works again afterwards


@pytest.fixture(params=["redis", "valkey"])
def replica(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    binary = redis_binary() if request.param == "redis" else valkey_binary()
    with replica_pair(binary, request.param, tmp_path) as servers:
        yield servers


def test_writing_to_a_replica_is_readonly_unavailable(replica: tuple[Server, Server]) -> None:
    primary, copy = replica
    namespace = unique_namespace()
    # Confirmed by the replica before the insert returns (a fixed pause was too short on a
    # loaded machine).
    RedisRunStore(primary.client(), namespace=namespace,
                  durability=Durability(replicas=1, timeout=4000)).insert(
        "run", b"r1", Claim("me", LONG))
    store = RedisRunStore(copy.client(), namespace=namespace)
    assert store.get("run").revision == 1  # reads are fine on a replica
    with pytest.raises(Unavailable) as caught:
        store.compare_and_set("run", 1, b"r2", Hold("me"))
    assert "READONLY" in caught.value.reason and caught.value.outcome == "not_applied"
    with pytest.raises(Unavailable, match="READONLY"):
        RedisRepository(copy.client(), namespace=namespace).register_group("g")
    assert store.get("run").revision == 1


def test_a_long_script_on_the_server_is_busy_unavailable(tmp_path: Path) -> None:
    server = start(redis_binary(), "redis-server", tmp_path,
                   ("--save", "", "--appendonly", "no", "--busy-reply-threshold", "50"))
    try:
        namespace = unique_namespace()
        store = RedisRunStore(server.client(), namespace=namespace)
        store.insert("run", b"r1", Claim("me", LONG))
        hog = threading.Thread(target=_spin, args=(server,), daemon=True)
        hog.start()
        time.sleep(0.3)
        with pytest.raises(Unavailable) as caught:
            store.compare_and_set("run", 1, b"r2", Hold("me"))
        assert "BUSY" in caught.value.reason
        server.client().script_kill()
        hog.join(10)
        store.compare_and_set("run", 1, b"r2", Hold("me"))
        assert store.get("run").revision == 2
    finally:
        server.kill()


def _spin(server: Server) -> None:
    with contextlib.suppress(redis.RedisError):  # killed by SCRIPT KILL, as intended
        server.client(socket_timeout=30).eval("local i = 0 while true do i = i + 1 end", 0)


def test_out_of_memory_is_unavailable(tmp_path: Path) -> None:
    server = start(redis_binary(), "redis-server", tmp_path,
                   ("--save", "", "--appendonly", "no", "--maxmemory", "3mb",
                    "--maxmemory-policy", "noeviction"))
    try:
        store = RedisRunStore(server.client(), namespace=unique_namespace())
        with pytest.raises(Unavailable) as caught:
            for i in range(10_000):
                store.insert(f"run-{i}", b"x" * 2048, Release())
        assert "OOM" in caught.value.reason
        assert i > 10  # some writes went in before memory ran out
        assert caught.value.outcome == "not_applied"
        with pytest.raises(Exception, match="not found"):
            store.get(f"run-{i}")  # the refused insert left nothing behind
        assert store.get("run-0").record == b"x" * 2048  # reads still answer
    finally:
        server.kill()


#: Empties the script cache of the server on port argv[1] every argv[2] seconds, forever;
#: says "flushing" once the first flush is done.
FLUSHER = """
import socket, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
first = True
while True:
    sock.sendall(b"SCRIPT FLUSH\\r\\n")
    reply = b""
    while not reply.endswith(b"\\r\\n"):
        chunk = sock.recv(64)
        if not chunk:
            sys.exit("the server closed the connection")
        reply += chunk
    if reply != b"+OK\\r\\n":
        sys.exit(f"SCRIPT FLUSH answered {reply!r}")
    if first:
        print("flushing", flush=True)
        first = False
    time.sleep(float(sys.argv[2]))
"""


def _script_flushes(client: redis.Redis) -> int:
    """How many SCRIPT FLUSH the server has run (Redis >= 7 and Valkey count subcommands)."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_script|flush", {}).get("calls", 0))


def test_script_flush_under_write_load_is_invisible(server: Server) -> None:
    namespace = unique_namespace()
    store = RedisRunStore(server.client(), namespace=namespace)
    stats = server.client()
    # The flushes come from a process of their own. A thread of this process (as this test
    # once had) can be starved of the GIL by the writer's I/O for the whole run: it once
    # flushed 0 times while the writer made its 1,200 calls.
    flusher = subprocess.Popen([sys.executable, "-c", FLUSHER, str(server.port), "0.005"],
                               stdout=subprocess.PIPE)
    try:
        assert flusher.stdout is not None
        assert flusher.stdout.readline() == b"flushing\n", flusher.wait(10)
        before = _script_flushes(stats)
        for i in range(400):
            store.insert(f"run-{i}", b"r1", Claim("me", LONG))
            store.compare_and_set(f"run-{i}", 1, b"r2", Hold("me"))
            assert store.renew("me", [f"run-{i}"], LONG) == [f"run-{i}"]
        flushes = _script_flushes(stats) - before
        assert flusher.poll() is None, "the flusher stopped"
    finally:
        flusher.terminate()
        flusher.wait(10)
    assert flushes > 5, flushes
    assert all(store.get(f"run-{i}").revision == 2 for i in range(0, 400, 37))
