"""What only the Redis repository has: migrate(), cluster compatibility, the key layout and
its indexes, clients, failures."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from faultproxy import FaultProxy
from redis.backoff import NoBackoff
from redis.retry import Retry
from servers import EPHEMERAL, Server, free_port, redis_binary, start, unique_namespace, warm
from snapshots import snapshot

from redisstore import (
    ConcurrentUpdate,
    Corrupt,
    InstanceLease,
    InstanceRecord,
    Misconfigured,
    RedisRepository,
    RedisRunStore,
    Release,
    Status,
    Unavailable,
)
from redisstore.conformance.repository import RecordingLogger
from redisstore.core import scripts
from redisstore.core.driver import Call, ask
from redisstore.core.keys import Keyspace
from redisstore.core.repository_ops import RepositoryOps
from redisstore.repository import LAYOUT_VERSION, MAX_EVICT, MAX_PAGE, MAX_PAYLOAD, record_class
from redisstore.shells.sync import Transport

G = "engines"
T0 = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


def rec(id: str, group: str = G, **fields: object) -> InstanceRecord:
    fields.setdefault("payload", f"doc {id}".encode())
    return InstanceRecord(id=id, group=group, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Redis 7 of our own whose settings the tests change (started evicting, on purpose)."""
    server = start(redis_binary(), "redis-server (Redis 7)", tmp_path_factory.mktemp("private"),
                   args=(*EPHEMERAL, "--maxmemory-policy", "allkeys-lru"))
    yield server
    server.stop()


def _keys(client: redis.Redis, namespace: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match="{" + namespace + "}:*")}


# ---------------------------------------------------------------------------- migrate


@pytest.mark.server
def test_migrate_is_idempotent_and_records_the_layout_version(redis7: Server) -> None:
    client = redis7.client()
    namespace = unique_namespace()
    repo = RedisRepository(client, namespace=namespace, logger=RecordingLogger())
    repo.migrate()
    layout = Keyspace(namespace).layout
    assert client.get(layout) == str(LAYOUT_VERSION).encode()
    repo.register_group(G)
    repo.save(rec("i1"))
    before = _keys(client, namespace)
    repo.migrate()
    repo.migrate()
    assert _keys(client, namespace) == before
    assert client.get(layout) == str(LAYOUT_VERSION).encode()
    assert repo.load("i1") == rec("i1", rec_version=1)


@pytest.mark.server
def test_migrate_loads_every_script(redis7: Server) -> None:
    client = redis7.client()
    client.script_flush()
    RedisRepository(client, namespace=unique_namespace(), logger=RecordingLogger()).migrate()
    assert all(client.script_exists(*(s.sha for s in scripts.REPO_SCRIPTS)))


@pytest.mark.server
def test_migrate_refuses_a_newer_layout(redis7: Server) -> None:
    client = redis7.client()
    namespace = unique_namespace()
    client.set(Keyspace(namespace).layout, LAYOUT_VERSION + 1)
    repo = RedisRepository(client, namespace=namespace, logger=RecordingLogger())
    with pytest.raises(Misconfigured, match="upgrade"):
        repo.migrate()
    assert client.get(Keyspace(namespace).layout) == str(LAYOUT_VERSION + 1).encode()


@pytest.mark.server
@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_migrate_refuses_an_evicting_policy(private: Server, policy: str) -> None:
    client = private.client()
    client.config_set("maxmemory-policy", policy)
    try:
        repo = RedisRepository(client, namespace=unique_namespace(), logger=RecordingLogger())
        with pytest.raises(Misconfigured) as caught:
            repo.migrate()
        message = str(caught.value)
        assert "maxmemory-policy" in message and policy in message
        assert "CONFIG SET maxmemory-policy noeviction" in message
    finally:
        client.config_set("maxmemory-policy", "allkeys-lru")


@pytest.mark.server
def test_the_server_started_evicting(private: Server) -> None:
    # The refusal above is against a server started with the setting, not only a CONFIG SET.
    assert private.client().config_get("maxmemory-policy") == {
        "maxmemory-policy": "allkeys-lru"}


@pytest.mark.server
@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-ttl"])
def test_migrate_accepts_policies_that_never_evict_our_keys(private: Server, policy: str) -> None:
    client = private.client()
    client.config_set("maxmemory-policy", policy)
    try:
        RedisRepository(client, namespace=unique_namespace(), logger=RecordingLogger()).migrate()
    finally:
        client.config_set("maxmemory-policy", "allkeys-lru")


@pytest.mark.server
def test_migrate_warns_when_nothing_is_persisted(private: Server) -> None:
    client = private.client()
    client.config_set("maxmemory-policy", "noeviction")
    try:
        logger = RecordingLogger()
        RedisRepository(client, namespace=unique_namespace(), logger=logger).migrate()
        assert len(logger.warnings) == 1
        assert "persists nothing" in logger.warnings[0]
        client.config_set("save", "3600 1")
        quiet = RecordingLogger()
        RedisRepository(client, namespace=unique_namespace(), logger=quiet).migrate()
        assert quiet.warnings == []
    finally:
        client.config_set("save", "")
        client.config_set("maxmemory-policy", "allkeys-lru")


@pytest.mark.server
def test_migrate_with_aof_only_does_not_warn(tmp_path: Path) -> None:
    server = start(redis_binary(), "redis-server (Redis 7)", tmp_path,
                   args=("--save", "", "--appendonly", "yes"))
    try:
        logger = RecordingLogger()
        RedisRepository(server.client(), namespace=unique_namespace(), logger=logger).migrate()
        assert logger.warnings == []
    finally:
        server.stop()


@pytest.mark.server
def test_migrate_without_config_permission_says_so_and_goes_on(private: Server) -> None:
    admin = private.client()
    user = f"app-{unique_namespace()}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all",
                          "-config")
    try:
        client = private.client(username=user, password="secret")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.config_get("maxmemory-policy")
        namespace = unique_namespace()
        logger = RecordingLogger()
        repo = RedisRepository(client, namespace=namespace, logger=logger)
        repo.migrate()  # the server is evicting, but we cannot know: warn and go on
        assert len(logger.warnings) == 1
        assert "CONFIG GET is not allowed" in logger.warnings[0]
        assert "noeviction" in logger.warnings[0]
        assert admin.get(Keyspace(namespace).layout) == str(LAYOUT_VERSION).encode()
        repo.register_group(G)
        assert repo.save(rec("i1")) == 1
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_migrate_on_fakeredis_checks_no_server_settings() -> None:
    """fakeredis keeps its data in the process: no maxmemory, no persistence settings to
    check (it used to warn, to every newcomer, that it could not read them)."""
    logger = RecordingLogger()
    client = fakeredis.FakeRedis()
    namespace = unique_namespace()
    RedisRepository(client, namespace=namespace, logger=logger).migrate()
    assert logger.warnings == []
    assert client.get(Keyspace(namespace).layout) == str(LAYOUT_VERSION).encode()


def test_migrate_on_an_unreachable_server_is_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=1,
                         retry=Retry(NoBackoff(), 1))
    logger = RecordingLogger()
    with pytest.raises(Unavailable):
        RedisRepository(client, namespace=unique_namespace(), logger=logger).migrate()
    assert logger.warnings == []


# ---------------------------------------------------------------------------- capabilities


def test_cluster_compatibility() -> None:
    repo = RedisRepository(fakeredis.FakeRedis(), namespace="ns-1")
    ok, reason = repo.cluster_compatibility()
    assert ok is True
    assert "{ns-1}" in reason


# ---------------------------------------------------------------------------- layout


def test_every_key_shares_the_hash_tag_and_leaves_the_run_store_alone(
        client: redis.Redis) -> None:
    namespace = unique_namespace()
    repo = RedisRepository(client, namespace=namespace)
    runs = RedisRunStore(client, namespace=namespace)
    repo.register_group(G)
    for id in ("x", "a:b{c}", "leases", "r:x"):
        runs.insert(id, b"run " + id.encode(), Release())
        repo.save(rec(id, lease=InstanceLease(T0, "n", 1)))
        repo.save(rec(f"done {id}", status=Status.COMPLETED))
    keys = _keys(client, namespace)
    assert all(k.startswith("{" + namespace + "}:") for k in keys)
    space = Keyspace(namespace)
    run_keys = {space.run(id) for id in ("x", "a:b{c}", "leases", "r:x")}
    assert run_keys <= keys
    for id in ("x", "a:b{c}", "leases", "r:x"):
        assert runs.get(id).record == b"run " + id.encode()
        loaded = repo.load(id)
        assert loaded is not None and loaded.payload == f"doc {id}".encode()
    assert sorted(repo.list_in_flight(G, T0)) == sorted(["x", "a:b{c}", "leases", "r:x"])


def test_indexes_follow_status_and_delete(client: redis.Redis) -> None:
    namespace = unique_namespace()
    space = Keyspace(namespace)
    repo = RedisRepository(client, namespace=namespace)
    repo.register_group(G)
    repo.register_group("other")

    def where() -> tuple[bool, bool, bool]:
        return (client.zscore(space.inflight(G), "i1") is not None,
                client.zscore(space.inflight("other"), "i1") is not None,
                client.zscore(space.terminal, "i1") is not None)

    repo.save(rec("i1"))
    assert where() == (True, False, False)
    assert client.zscore(space.inflight(G), "i1") == float("-inf")
    repo.save(rec("i1", status=Status.SUSPENDED, rec_version=1))
    assert where() == (False, False, False)
    repo.save(rec("i1", group="other", lease=InstanceLease(T0, "n", 1), rec_version=2))
    assert where() == (False, True, False)
    assert client.zscore(space.inflight("other"), "i1") == (T0 - datetime(
        1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    repo.save(rec("i1", group="other", status=Status.TERMINATED, rec_version=3))
    assert where() == (False, False, True)
    repo.delete("i1")
    assert where() == (False, False, False)
    assert not client.exists(space.instance("i1"))


def test_status_classes() -> None:
    assert [record_class(s) for s in ("active", "suspended", "completed", "terminated",
                                      "new-one")] == ["c", "s", "t", "t", "c"]


def test_list_in_flight_is_a_range_query_over_the_group_alone(client: redis.Redis) -> None:
    """A large population of other groups and terminal records changes nothing in the
    result, and stays out of the group's index (the timing is in the benchmark)."""
    namespace = unique_namespace()
    space = Keyspace(namespace)
    repo = RedisRepository(client, namespace=namespace, max_terminal=10**6)
    ops = RepositoryOps(namespace, max_terminal=10**6)
    for group in (G, "crowd-1", "crowd-2"):
        repo.register_group(group)
    expected = set()
    for i in range(200):
        lease = InstanceLease(T0 + timedelta(seconds=i - 100), "n", 1)
        status = (Status.ACTIVE, Status.SUSPENDED, "custom", Status.COMPLETED)[i % 4]
        repo.save(rec(f"mine-{i}", lease=lease, status=status))
        if i <= 100 and i % 4 in (0, 2):
            expected.add(f"mine-{i}")
    # The crowd: claimable records of other groups and terminal ones, pipelined.
    crowd = 3_000 if isinstance(client, fakeredis.FakeRedis) else 30_000  # fakeredis is slow
    pipe = client.pipeline(transaction=False)
    for i in range(crowd):
        group = ("crowd-1", "crowd-2", G)[i % 3]
        status = Status.COMPLETED if group == G else Status.ACTIVE
        call = next(ops.save(rec(f"crowd-{i}", group=group, status=status)))
        pipe.execute_command(*call.command())
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    assert set(repo.list_in_flight(G, T0)) == expected
    assert len(repo.list_in_flight(G, T0)) == len(expected)
    assert client.zcard(space.inflight(G)) == 100  # active + custom of mine only
    assert client.zcard(space.inflight("crowd-1")) == crowd // 3
    assert len(repo.list_in_flight("crowd-2", T0)) == crowd // 3
    assert client.zcard(space.terminal) == crowd // 3 + 50


# ---------------------------------------------------------------------------- clients


def test_script_flush_is_reloaded_transparently(client: redis.Redis) -> None:
    repo = RedisRepository(client, namespace=unique_namespace())
    repo.register_group(G)
    client.script_flush()
    assert repo.save(rec("i1")) == 1
    client.script_flush()
    assert repo.list_in_flight(G, T0) == ["i1"]


@pytest.mark.server
def test_decoding_clients_still_get_bytes(redis7: Server) -> None:
    repo = RedisRepository(redis7.client(decode_responses=True), namespace=unique_namespace())
    repo.register_group(G)
    payload = bytes(range(256))
    repo.save(rec("ünï", payload=payload, tenant="tënant"))
    loaded = repo.load("ünï")
    assert loaded is not None and loaded.payload == payload and loaded.tenant == "tënant"
    assert repo.list_in_flight(G, T0) == ["ünï"]
    assert repo.group_exists(G) is True


def test_every_repository_script_is_headed_by_keys_argv_and_reply() -> None:
    folder = scripts.lua_dir()
    for script in scripts.REPO_SCRIPTS:
        body = (folder / f"{script.name}.lua").read_text()
        head = body.split("\n\n")[0]
        assert head.startswith(f"-- {script.name}:"), script.name
        assert "-- KEYS[1]" in head and "-- ARGV[1]" in head and "-- Reply" in head
        for n in {int(n) for n in re.findall(r"ARGV\[(\d+)\]", body)}:
            assert re.search(rf"ARGV\[{n}\]", head), (script.name, n)
        for n in {int(n) for n in re.findall(r"KEYS\[(\d+)\]", body)}:
            assert re.search(rf"KEYS\[{n}\]", head), (script.name, n)


# ---------------------------------------------------------------------------- failures


def test_refused_connection_is_unavailable() -> None:
    # Reads may retry; one quick retry keeps the test short (writes never retry anyway).
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=1,
                         retry=Retry(NoBackoff(), 1))
    repo = RedisRepository(client, namespace=unique_namespace())
    with pytest.raises(Unavailable) as caught:
        repo.save(rec("i1"))
    assert caught.value.outcome == "not_applied"
    with pytest.raises(Unavailable) as caught:
        repo.delete("i1")
    assert caught.value.outcome == "not_applied"
    for read in (lambda: repo.load("i1"), lambda: repo.list_in_flight(G),
                 lambda: repo.group_exists(G), lambda: repo.register_group(G)):
        with pytest.raises(Unavailable):
            read()


@pytest.fixture
def proxy(redis7: Server) -> Iterator[FaultProxy]:
    with FaultProxy(redis7.port) as p:
        yield p


@pytest.mark.server
def test_lost_reply_of_a_save_is_unavailable_and_applied_once(proxy: FaultProxy,
                                                              redis7: Server) -> None:
    """The client keeps redis-py's default retry: the repository must not let it replay."""
    namespace = unique_namespace()
    direct = RedisRepository(redis7.client(), namespace=namespace)
    direct.register_group(G)
    client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=0.5)
    client.ping()
    for script in scripts.REPO_SCRIPTS:  # the dropped reply must be the save's own
        client.script_load(script.source)
    warm(client)
    repo = RedisRepository(client, namespace=namespace)
    proxy.drop_replies(1)
    with pytest.raises(Unavailable) as caught:
        repo.save(rec("i1", payload=b"token-1"))
    assert caught.value.outcome == "unknown"
    loaded = direct.load("i1")
    assert loaded is not None and (loaded.rec_version, loaded.payload) == (1, b"token-1")
    with pytest.raises(ConcurrentUpdate):  # the caller's blind retry is fenced
        repo.save(rec("i1", payload=b"token-1"))


def test_an_unknown_command_is_unavailable() -> None:
    transport = Transport(fakeredis.FakeRedis())
    with pytest.raises(Unavailable):
        transport.drive(ask(Call(None, (), ("NO-SUCH-COMMAND",), lambda r: r, write=False)))


# ---------------------------------------------------------------------------- trust nothing
# Each test below failed before the scripts checked everything before writing.

DAMAGED_NUMBERS = ["nan", "inf", "1.5", "", "0x10", " 5", "1e3", "-0", "007", str(2**63)]


def raw(client: redis.Redis, script: scripts.Script, keys: tuple[str, ...],
        args: tuple[object, ...]) -> object:
    """A script called with EVALSHA directly, as a hostile tenant would."""
    client.script_load(script.source)
    return client.evalsha(script.sha, len(keys), *keys, *args)  # type: ignore[arg-type]


def fresh(client: redis.Redis, **options: object) -> tuple[RedisRepository, Keyspace]:
    namespace = unique_namespace()
    repo = RedisRepository(client, namespace=namespace, **options)  # type: ignore[arg-type]
    repo.register_group(G)
    return repo, Keyspace(namespace)


@pytest.mark.parametrize("bad", [*DAMAGED_NUMBERS, "wrong type"])
def test_a_terminal_save_with_a_damaged_sequence_writes_nothing(client: redis.Redis,
                                                                bad: str) -> None:
    repo, space = fresh(client)
    repo.save(rec("i1"))
    if bad == "wrong type":
        client.hset(space.terminal_seq, "n", "1")
    else:
        client.set(space.terminal_seq, bad)
    before = snapshot(client, space.namespace)
    with pytest.raises(Corrupt) as caught:
        repo.save(rec("i1", status=Status.COMPLETED, rec_version=1))
    assert caught.value.field == "terminal-seq"
    assert snapshot(client, space.namespace) == before  # not saved-but-never-indexed
    client.set(space.terminal_seq, "41")  # the repair docs/repository.md gives
    assert repo.save(rec("i1", status=Status.COMPLETED, rec_version=1)) == 2
    assert client.zscore(space.terminal, "i1") == 42


# (ARGV index, values the script must refuse): expected, expiry, offset, incarnation, cap.
BAD_ARGV = [
    (3, [*DAMAGED_NUMBERS, "-1", str(2**53)]),
    (7, ["nan", "inf", "1.5", "0x10", " 5", "1e3", "-0", "007", str(10**18)]),
    (8, ["nan", "1.5", "", "0x10", " 5", "86400000000", "-86400000000"]),
    (10, ["nan", "1.5", "", "0x10", " 5", "1e3", str(2**63), str(-(2**63) - 1)]),
    (12, DAMAGED_NUMBERS),
]


@pytest.mark.parametrize(("index", "bad"), [(i, b) for i, values in BAD_ARGV for b in values])
def test_a_raw_save_with_a_bad_number_is_refused_and_writes_nothing(
        client: redis.Redis, index: int, bad: str) -> None:
    repo, space = fresh(client)
    repo.save(rec("i1", status=Status.COMPLETED))
    ops = RepositoryOps(space.namespace)
    call = next(ops.save(rec("i1", lease=InstanceLease(T0, "n", 1), rec_version=1)))
    args = list(call.args)
    args[index - 1] = bad
    before = snapshot(client, space.namespace)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        raw(client, scripts.REPO_SAVE, call.keys, tuple(args))
    assert snapshot(client, space.namespace) == before


@pytest.mark.parametrize("key", [0, 1, 2, 3, 4])
def test_a_raw_save_with_keys_of_its_own_choosing_is_refused(client: redis.Redis,
                                                             key: int) -> None:
    repo, space = fresh(client)
    call = next(RepositoryOps(space.namespace).save(rec("i1")))
    keys = list(call.keys)
    keys[key] = space.prefix + "elsewhere"
    with pytest.raises(redis.ResponseError, match="BADARG"):
        raw(client, scripts.REPO_SAVE, tuple(keys), call.args)
    assert repo.load("i1") is None and not client.exists(space.prefix + "elsewhere")


# (field, damaged value) of a stored record; "type" replaces the hash by a string.
DAMAGED_FIELDS = [
    *[("v", bad) for bad in [*DAMAGED_NUMBERS, "0", str(2**53)]],
    *[("x", bad) for bad in ["nan", "inf", "1.5", "0x10", " 5", "-0", str(10**18)]],
    ("xo", "86400000000"), ("xo", "nan"), ("xo", ""), ("n", str(2**63)), ("n", "1.5"),
    ("k", "z"), ("k", "t"), ("s", ""), ("g", ""), ("pl", None), ("t", None), ("o", None),
    ("type", None),
]
#: The fields a save reads (it rewrites all the others, which repairs them).
SAVE_READS = {"v", "g", "k", "s", "type"}


def damage(client: redis.Redis, key: str, field: str, value: str | None) -> None:
    if field == "type":
        client.delete(key)
        client.set(key, "not a hash")
    elif value is None:
        client.hdel(key, field)
    else:
        client.hset(key, field, value)


@pytest.mark.parametrize(("field", "bad"), DAMAGED_FIELDS)
def test_a_damaged_record_is_corrupt_and_nothing_is_written(client: redis.Redis, field: str,
                                                            bad: str | None) -> None:
    repo, space = fresh(client)
    repo.save(rec("i1", lease=InstanceLease(T0, "n", 1)))
    repo.save(rec("good"))
    damage(client, space.instance("i1"), field, bad)
    before = snapshot(client, space.namespace)
    with pytest.raises(Corrupt) as caught:
        repo.load("i1")
    assert (caught.value.run, caught.value.field) == ("i1", field)
    change = rec("i1", lease=InstanceLease(T0 + timedelta(days=1), "m", 2), rec_version=1)
    if field in SAVE_READS:
        with pytest.raises(Corrupt):
            repo.save(change)
        assert snapshot(client, space.namespace) == before
    else:
        assert repo.save(change) == 2  # a save rewrites the damaged field: repaired
        assert repo.load("i1") == replace(change, rec_version=2)
    loaded = repo.load("good")
    assert loaded is not None and loaded.rec_version == 1
    assert "good" in repo.list_in_flight(G, T0)


@pytest.mark.parametrize(("field", "bad"), DAMAGED_FIELDS)
def test_delete_removes_a_damaged_record(client: redis.Redis, field: str,
                                         bad: str | None) -> None:
    repo, space = fresh(client)
    repo.save(rec("i1"))
    damage(client, space.instance("i1"), field, bad)
    repo.delete("i1")
    assert repo.load("i1") is None
    assert not client.exists(space.instance("i1"))
    if field not in ("g", "type"):  # else the record no longer names its group's index...
        assert client.zscore(space.inflight(G), "i1") is None
    assert repo.list_in_flight(G, T0) == []  # ...and the entry left there is not listed
    assert repo.save(rec("i1")) == 1
    assert repo.list_in_flight(G, T0) == ["i1"]


@pytest.mark.parametrize("index", ["inflight", "terminal", "groups"])
def test_a_damaged_index_key_refuses_writes_before_writing(client: redis.Redis,
                                                           index: str) -> None:
    repo, space = fresh(client)
    repo.register_group("other")
    repo.save(rec("active"))
    repo.save(rec("done", status=Status.COMPLETED))
    key = {"inflight": space.inflight(G), "terminal": space.terminal,
           "groups": space.groups}[index]
    client.delete(key)
    client.set(key, "not an index")
    before = snapshot(client, space.namespace)
    writes = [lambda: repo.save(rec("new")), lambda: repo.save(rec("new2", group="other")),
              lambda: repo.save(rec("active", status=Status.TERMINATED, rec_version=1)),
              lambda: repo.save(rec("done", rec_version=1)), lambda: repo.delete("active"),
              lambda: repo.delete("done"), lambda: repo.register_group("other"),
              lambda: repo.group_exists(G), lambda: repo.list_in_flight(G, T0)]
    refused = 0
    for write in writes:
        try:
            write()
        except Corrupt as caught:
            assert caught.field == ("index:" + index), caught
            assert snapshot(client, space.namespace) == before
            refused += 1
        else:
            before = snapshot(client, space.namespace)  # a call the damage does not concern
    assert refused >= 2


def test_listing_skips_entries_its_records_do_not_back(client: redis.Redis) -> None:
    repo, space = fresh(client)
    repo.register_group("other")
    for id in ("a", "moved", "suspended", "live", "string", "done"):
        repo.save(rec(id))
    index = space.inflight(G)
    client.zadd(index, {"nothing": float("-inf")})            # a record that does not exist
    repo.save(rec("moved", group="other", rec_version=1))     # its entry left behind:
    client.zadd(index, {"moved": float("-inf")})
    client.hset(space.instance("suspended"), mapping={"s": "suspended", "k": "s"})
    client.hset(space.instance("live"), mapping={"x": str(10**17), "xo": "0"})  # score -inf
    client.delete(space.instance("string"))
    client.set(space.instance("string"), "not a hash")
    client.hset(space.instance("done"), mapping={"s": "completed", "k": "t"})
    assert repo.list_in_flight(G, T0) == ["a"]
    assert repo.list_in_flight("other", T0) == ["moved"]


def test_eviction_after_lowering_max_terminal_is_capped_per_save(client: redis.Redis) -> None:
    big, space = fresh(client, max_terminal=1000)
    for i in range(130):
        big.save(rec(f"t{i:03}", status=Status.COMPLETED, payload=b""))
    logger = RecordingLogger()
    small = RedisRepository(client, namespace=space.namespace, max_terminal=10, logger=logger)
    left = 130
    for round, evicted in enumerate([MAX_EVICT, MAX_EVICT, 130 + 3 - 10 - 2 * MAX_EVICT]):
        small.save(rec(f"new{round}", status=Status.COMPLETED))
        left += 1 - evicted
        assert client.zcard(space.terminal) == left
        assert len(logger.warnings) == (round + 1) * MAX_EVICT or round == 2
    assert left == 10
    assert len(logger.warnings) == 123
    assert "'t000'" in logger.warnings[0] and "'t122'" in logger.warnings[-1]
    assert [small.load(f"t{i:03}") is None for i in (122, 123)] == [True, False]


def test_eviction_deletes_only_terminal_records(client: redis.Redis) -> None:
    logger = RecordingLogger()
    repo, space = fresh(client, max_terminal=1, logger=logger)
    repo.save(rec("active"))
    client.zadd(space.terminal, {"active": 0, "ghost": 0})  # stray entries, oldest of all
    client.set(space.instance("ghost"), "a foreign key")
    repo.save(rec("done", status=Status.COMPLETED))
    assert repo.load("active") is not None  # never evicted: it is not terminal
    assert client.get(space.instance("ghost")) == b"a foreign key"
    assert client.zrange(space.terminal, 0, -1) == [b"done"]
    assert logger.warnings == []


def test_a_listing_is_read_in_bounded_pages(client: redis.Redis,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    repo, space = fresh(client)
    ops = RepositoryOps(space.namespace)
    count = 2 * MAX_PAGE + 300
    pipe = client.pipeline(transaction=False)
    client.script_load(scripts.REPO_SAVE.source)
    for i in range(count):  # half of them expire exactly at T0: the boundary case
        lease = InstanceLease(T0 if i % 2 else T0 - timedelta(seconds=i), "n", 1)
        pipe.execute_command(*next(ops.save(rec(f"i{i:05}", lease=lease))).command())
    pipe.execute()
    pages: list[int] = []
    original = RepositoryOps.page

    def spy(self: RepositoryOps, group: str, at: str, limit: int,
            after: tuple[str, bytes]) -> Any:
        pages.append(limit)
        return (yield from original(self, group, at, limit, after))

    monkeypatch.setattr(RepositoryOps, "page", spy)
    listed = repo.list_in_flight(G, T0)
    assert sorted(listed) == [f"i{i:05}" for i in range(count)]
    assert pages == [MAX_PAGE] * 3
    with pytest.raises(redis.ResponseError, match="BADARG"):
        raw(client, scripts.REPO_LIST_IN_FLIGHT, (space.inflight(G),),
            (space.prefix, G, "", MAX_PAGE + 1, "", ""))
    with pytest.raises(ValueError, match=str(MAX_PAGE)):
        next(ops.list_in_flight_page(G, T0, limit=MAX_PAGE + 1))


@pytest.mark.parametrize("score", ["nan", "0x10", " 5", "1.50", "abc", ""])
def test_a_raw_listing_with_a_forged_cursor_is_refused(client: redis.Redis,
                                                       score: str) -> None:
    space = Keyspace(unique_namespace())
    with pytest.raises(redis.ResponseError, match="BADARG"):
        raw(client, scripts.REPO_LIST_IN_FLIGHT, (space.inflight(G),),
            (space.prefix, G, "", 10, score, "i1"))


def test_pages_resume_by_byte_order_when_the_cursor_record_goes(client: redis.Redis) -> None:
    # Ties (no lease: all at -inf) are ordered by the bytes of the id; a page whose cursor
    # record was deleted resumes by a bisection that must agree with that order exactly.
    repo, space = fresh(client)
    ids = ["a", "a\x00", "a\x00b", "ab", "a\x7f", "a\u00e9", "b", "B", "\u00e9", "\u00e9a",
           "z" * 40, "\U0001f600", "0", "00", "~"]
    for id in ids:
        repo.save(rec(id))
    ops = RepositoryOps(space.namespace)
    transport = Transport(client)
    listed: list[str] = []
    cursor = None
    for _ in range(len(ids) + 1):
        page = transport.drive(ops.list_in_flight_page(G, T0, cursor=cursor, limit=1))
        listed += page.ids
        if page.cursor is None:
            break
        repo.delete(page.ids[-1])  # the cursor's own record is gone before the next page
        cursor = page.cursor
    assert listed == sorted(ids, key=lambda id: id.encode())


def test_the_payload_cap_is_checked_before_sending_and_by_the_script(
        client: redis.Redis) -> None:
    repo, space = fresh(client)
    before = snapshot(client, space.namespace)
    with pytest.raises(ValueError, match="payload"):
        repo.save(rec("big", payload=b"x" * (MAX_PAYLOAD + 1)))
    assert repo.save(rec("max", payload=b"x" * MAX_PAYLOAD)) == 1
    call = next(RepositoryOps(space.namespace).save(rec("max", rec_version=1)))
    args = list(call.args)
    args[3] = b"x" * (MAX_PAYLOAD + 1)
    before = snapshot(client, space.namespace)
    with pytest.raises(redis.ResponseError, match="BADARG"):
        raw(client, scripts.REPO_SAVE, call.keys, tuple(args))
    assert snapshot(client, space.namespace) == before


@pytest.mark.parametrize("bad", ["abc", "1.5", "0x10", "", "0", "wrong type"])
def test_migrate_refuses_a_damaged_layout_key(client: redis.Redis, bad: str) -> None:
    namespace = unique_namespace()
    layout = Keyspace(namespace).layout
    if bad == "wrong type":
        client.hset(layout, "v", "1")
    else:
        client.set(layout, bad)
    before = snapshot(client, namespace)
    repo = RedisRepository(client, namespace=namespace, logger=RecordingLogger())
    with pytest.raises(Corrupt) as caught:
        repo.migrate()
    assert caught.value.field == "repo-layout"
    assert snapshot(client, namespace) == before


@pytest.fixture(params=["redis7", "valkey8"])
def acl_server(request: pytest.FixtureRequest) -> Server:
    server: Server = request.getfixturevalue(request.param)
    return server


def _terminal_save(repo: RedisRepository) -> object:
    return repo.save(rec("active", status=Status.COMPLETED, rec_version=1))


# (the read command the user may not run, the call that meets it in its check phase)
DENIED_READS = [
    ("sismember", lambda repo: repo.save(rec("new"))),              # the group registry
    ("get", _terminal_save),                                         # the terminal counter
    ("hget", _terminal_save),                                        # an eviction candidate
    ("hmget", lambda repo: repo.list_in_flight(G, T0)),              # a listed record
    ("hmget", lambda repo: repo.load("active")),                     # the record
    ("get", lambda repo: repo.migrate()),                            # the layout key
]


@pytest.mark.server
@pytest.mark.parametrize(("denied", "call"), DENIED_READS)
def test_a_read_refused_for_another_reason_than_its_type_aborts(
        acl_server: Server, denied: str, call: Any) -> None:
    # Only WRONGTYPE means damaged data; any other error of a check-phase read (an ACL, a
    # cluster key that moved away) aborts the script before it writes: ABORTED, not_applied,
    # not a Corrupt blaming the data, and never a listing or an eviction that skips quietly.
    admin = acl_server.client()
    namespace = unique_namespace()
    user = f"app-{namespace}"
    setup = RedisRepository(admin, namespace=namespace, max_terminal=1)
    setup.register_group(G)
    setup.save(rec("active"))
    setup.save(rec("done", status=Status.COMPLETED))
    admin.execute_command("ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all",
                          f"-{denied}")
    try:
        client = acl_server.client(username=user, password="secret")
        repo = RedisRepository(client, namespace=namespace, max_terminal=1,
                               logger=RecordingLogger())
        before = snapshot(admin, namespace)
        with pytest.raises(Unavailable) as caught:
            call(repo)
        assert (caught.value.code, caught.value.outcome) == ("ABORTED", "not_applied")
        assert snapshot(admin, namespace) == before
    finally:
        admin.execute_command("ACL", "DELUSER", user)


@pytest.mark.server
def test_a_save_that_evicts_its_own_record_is_refused_whole_when_memory_is_full(
        tmp_path: Path) -> None:
    # With max_terminal=0 a terminal save writes no record, only evictions and the counter:
    # Redis checks maxmemory at a script's first write only if that write can grow memory,
    # so the counter must go first or the evictions open the way past the limit.
    server = start(redis_binary(), "redis-server (Redis 7)", tmp_path,
                   (*EPHEMERAL, "--maxmemory", "3mb", "--maxmemory-policy", "noeviction"))
    try:
        client = server.client()
        repo, space = fresh(client, max_terminal=1000)
        repo.save(rec("late"))
        for i in range(3):
            repo.save(rec(f"done-{i}", status=Status.COMPLETED))
        with pytest.raises(Unavailable):
            for i in range(10_000):
                repo.save(rec(f"fill-{i}", payload=b"x" * 2048))
        lowered = RedisRepository(client, namespace=space.namespace, max_terminal=0,
                                  logger=RecordingLogger())
        before = snapshot(client, space.namespace)
        with pytest.raises(Unavailable) as caught:
            lowered.save(rec("late", status=Status.COMPLETED, rec_version=1))
        assert caught.value.outcome == "not_applied" and "OOM" in caught.value.reason
        assert snapshot(client, space.namespace) == before
    finally:
        server.kill()
