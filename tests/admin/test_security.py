"""Least privilege: ``acl_rule`` confines a user to one namespace. Both conformance suites
(run store and repository, sync and async) pass as such a user on Redis 7 and Valkey 8, and a
user confined to one namespace gets a clear error, never another's data, from another: by
the store, by direct command, by EVALSHA with foreign KEYS or with a forged key prefix."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import old_layouts
import pytest
import redis
import redis.asyncio
from aio_suites import (
    AsyncRepositorySuite,
    AsyncRunSuite,
    LoopThread,
    Synced,
)
from conftest import RedisSuite
from old_layouts import OldRun
from servers import Server, unique_namespace

from redisstore import (
    AsyncRedisRepository,
    AsyncRedisRunStore,
    Claim,
    InstanceRecord,
    RedisRepository,
    RedisRunStore,
    Release,
    Repository,
    RunStore,
    Unavailable,
    acl_rule,
)
from redisstore.admin.security import glob_escape, script_commands
from redisstore.conformance import RepositoryConformance
from redisstore.conformance.base import rec
from redisstore.core import scripts
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.discovery import json_wait
from redisstore.runs import Discover

# ---------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("namespace", ["a*", "a?", "[ab]", "a\\b", "x*?[]\\y"])
def test_the_key_pattern_matches_only_the_namespace(namespace: str) -> None:
    rule = acl_rule(namespace)
    pattern = rule.split()[1]
    assert pattern == "~" + glob_escape("{" + namespace + "}:") + "*"
    assert all("\\" + c in pattern for c in "*?[]" if c in namespace)


def test_the_rule_grants_every_command_the_scripts_call_and_the_loading_path() -> None:
    granted = set(acl_rule("ns").split())
    assert {"+evalsha", "+eval", "+script|load", "+time", "-@all", "resetkeys"} <= granted
    assert {f"+{c}" for c in script_commands()} <= granted
    # Layout 5's reads and writes of a run's string, its header sized and rewritten in
    # place, meta's fields sized before they are read.
    assert script_commands() >= {"zadd", "hset", "get", "getrange", "setrange", "strlen", "set",
                                 "hexists", "hstrlen", "hmget", "type"}
    assert "+wait" not in granted and "+info" not in granted
    assert {"+wait", "+command|info"} <= set(acl_rule("ns", durability=True).split())
    assert "+waitaof" not in acl_rule("ns", durability=True)  # Redis < 7.2 refuses it
    assert "+waitaof" in acl_rule("ns", durability=True, aof=True)
    assert {"+info", "+command|info"} <= set(acl_rule("ns", server_checks=True).split())
    # SCAN lists every key name on the server: granted where a script calls it (a migration
    # of older layouts visits the server's keys), and never with migrate=False.
    assert ("+scan" in granted) == ("scan" in script_commands())
    assert "+scan" not in acl_rule("ns", migrate=False)
    assert {"+cluster|slots", "+command"} <= set(acl_rule("ns", cluster=True).split())
    for flags in ({}, {"durability": True, "aof": True, "server_checks": True, "cluster": True}):
        assert "config" not in acl_rule("ns", **flags)  # CONFIG GET reads the passwords


@pytest.mark.parametrize("namespace", ["t allkeys nopass", "a\tb", "a\nb", "x\x00"])
def test_a_namespace_that_cannot_be_one_acl_word_is_refused(namespace: str) -> None:
    with pytest.raises(ValueError, match="whitespace or control"):
        acl_rule(namespace)


@pytest.mark.server
def test_the_rule_with_every_flag_is_taken_by_the_server_and_reads_no_password(
        server: Server) -> None:
    admin = server.client()
    namespace = unique_namespace()
    arguments = confine(server, namespace, durability=True, server_checks=True)
    client = redis.Redis(**arguments)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.config_get("requirepass")
    store = RedisRunStore(client, namespace=namespace)
    store.migrate()  # the eviction check reads INFO: no warning, no CONFIG
    assert store._ops.checks >= {"eviction"}
    store.insert("run", b"x", Release())  # the first write records the layout
    assert admin.hget(Keyspace(namespace).meta, "layout") == b"5"


@pytest.mark.server
@pytest.mark.parametrize("layout", [1, 4])
def test_a_confined_user_migrates_a_namespace_an_older_library_wrote(
        server: Server, layout: int) -> None:
    """migrate() as the namespace's own user: SCAN, and every command its scripts call
    (named in them: a command a script queues through a variable is never granted)."""
    namespace = unique_namespace()
    runs = {"held": OldRun(record=b"h", own="a", exp=2**40),
            "ready": OldRun(record=b"r", wk="a", wn=0, wrev=1, wpv=1, ready=0),
            "waiting": OldRun(record=b"w", wk="c", wa="dep", wn=0, wrev=1, wpv=1)}
    old_layouts.write(server.client(), namespace, layout, runs, bucket=1)
    store = RedisRunStore(redis.Redis(**confine(server, namespace)), namespace=namespace)
    assert store.migrate().moved == 3
    assert store.claim_ready("b", 600_000, 10) == ["ready"]
    store.insert("dep", b"d", Release())
    assert store.claim_ready("b", 600_000, 10) == ["waiting"]


@pytest.mark.server
@pytest.mark.parametrize("kind", ["redis62", "redis7", "valkey8"])
def test_the_rule_of_partitions_grants_their_wake_channels_alone(
        kind: str, request: pytest.FixtureRequest) -> None:
    """acl_rule(partitions=N) is taken by Redis 6.2 too (no SSUBSCRIBE or SPUBLISH named:
    the pub/sub category); the partitions' wake channels are granted, no other channel is,
    nor PUBSUB, which lists every channel on the server."""
    node: Server = request.getfixturevalue(kind)
    namespace = unique_namespace()
    client = redis.Redis(**confine(node, namespace, partitions=3))
    own = Keyspace(namespace, 2).wake("ready")
    assert client.publish(own, "1") == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.publish(Keyspace(namespace + "x", 2).wake("ready"), "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.publish(Keyspace(namespace, 3).wake("ready"), "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command("PUBSUB", "CHANNELS")
    if kind != "redis62":
        assert client.execute_command("SPUBLISH", own, "1") == 0
    assert "spublish" not in acl_rule(namespace)  # one partition: no channel at all
    assert "&" not in acl_rule(namespace)


def test_a_bad_namespace_is_refused() -> None:
    with pytest.raises((ValueError, TypeError)):
        acl_rule("")
    with pytest.raises((ValueError, TypeError)):
        acl_rule(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- confined users


def confine(server: Server, namespace: str, **flags: Any) -> dict[str, Any]:
    """A user confined to ``namespace`` by acl_rule: its client's connection arguments."""
    user, password = f"tenant-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    server.client().execute_command("ACL", "SETUSER", user, "on", f">{password}",
                                    *acl_rule(namespace, **flags).split())
    return {"host": "127.0.0.1", "port": server.port, "username": user, "password": password}


@pytest.fixture(params=["redis7", "valkey8"])
def server(request: pytest.FixtureRequest) -> Server:
    fixture: Server = request.getfixturevalue(request.param)
    return fixture


class ConfinedSuite(RedisSuite):
    """The run store suite with a user of its own for each namespace."""

    server: Server

    @pytest.fixture(autouse=True)
    def _backend(self, server: Server) -> None:
        self.server = server
        self.clients: dict[str, redis.Redis] = {}

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        namespace = unique_namespace()
        client = self.clients[namespace] = redis.Redis(
            **confine(self.server, namespace, partitions=self.partitions))
        store = RedisRunStore(client, namespace=namespace, discover=discover,
                              partitions=self.partitions, feed=self.feed)
        store.migrate()
        return store

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        assert isinstance(store, RedisRunStore)
        return RedisRunStore(self.clients[store.namespace], namespace=store.namespace,
                             discover=discover, projection_version=projection_version,
                             partitions=self.partitions)


@pytest.mark.server
class TestConfinedRunStore(ConfinedSuite):
    pass


@pytest.mark.server
def test_a_user_confined_to_a_store_of_partitions_runs_every_kind_of_call(
        server: Server) -> None:
    """acl_rule(partitions=6): the count check, one-run calls, renew and release, claims
    that read every partition's head, and a dependency across partitions (watch, announce,
    deliver) as a user confined to the namespace's partitions; then the repository of
    partitions, every kind of call."""
    namespace = unique_namespace()
    client = redis.Redis(**confine(server, namespace, partitions=6))
    store = RedisRunStore(client, namespace=namespace, discover=json_wait, partitions=6)
    store.migrate()
    assert partition_of("dep", 6) != partition_of("run", 6)
    store.insert("dep", rec(None), Release())
    store.insert("run", rec({"changed": "dep", "seen": 1}), Release())
    store.insert("held", b"{}", Claim("a", 600_000))
    assert store.renew("a", ["held"], 600_000) == ["held"]
    assert store.claim_ready("b", 600_000, 10) == []
    store.compare_and_set("dep", 1, rec(None), Release())
    assert store.claim_ready("b", 600_000, 10) == ["run"]
    assert store.release("b", ["run"]) == ["run"]
    assert store.quarantined() == []
    # The repository of the same namespace and count, as that user: every kind of call.
    repo = RedisRepository(client, namespace=namespace, partitions=6)
    repo.migrate()
    repo.register_group("g")
    assert repo.group_exists("g")
    ids = [f"i{i}" for i in range(12)]
    for id in ids:
        repo.save(InstanceRecord(id, b"p", "g"))
    assert sorted(repo.list_in_flight("g")) == sorted(ids)
    assert sorted(repo.list_in_flight_page("g", limit=1000).ids) == sorted(ids)
    repo.delete("i0", expected_version=1)
    assert repo.load("i0") is None and repo.load("i1") is not None


@pytest.mark.server
class TestConfinedRepository(RepositoryConformance):
    @pytest.fixture(autouse=True)
    def _backend(self, server: Server) -> None:
        self.server = server

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        namespace = unique_namespace()
        client = redis.Redis(**confine(self.server, namespace))
        return RedisRepository(client, namespace=namespace, max_terminal=max_terminal,
                               logger=logger)


@pytest.mark.server
class TestConfinedAsyncRunStore(AsyncRunSuite):
    """Through redis.asyncio, on Redis 7 and Valkey 8 as the sync suites."""

    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, server: Server) -> Iterator[None]:
        self.loop, self.server = loop_thread, server
        self.async_clients: dict[str, Any] = {}
        yield
        for client in self.async_clients.values():
            loop_thread.run(client.aclose())

    def _client(self, namespace: str) -> Any:
        arguments = confine(self.server, namespace)

        async def create() -> Any:
            return redis.asyncio.Redis(**arguments)

        client = self.async_clients[namespace] = self.loop.run(create())
        return client

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        namespace = unique_namespace()
        store = AsyncRedisRunStore(self._client(namespace), namespace=namespace,
                                   discover=discover, feed=self.feed)
        synced = Synced(store, self.loop)
        synced.migrate()
        return cast(RunStore, synced)

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        assert isinstance(store, Synced)
        other = AsyncRedisRunStore(self.async_clients[store.namespace],
                                   namespace=store.namespace, discover=discover,
                                   projection_version=projection_version)
        return cast(RunStore, Synced(other, self.loop))


@pytest.mark.server
class TestConfinedAsyncRepository(AsyncRepositorySuite):
    """Through redis.asyncio, on Redis 7 and Valkey 8 as the sync suites."""

    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, server: Server) -> Iterator[None]:
        self.loop, self.server = loop_thread, server
        self.async_clients: list[Any] = []
        yield
        for client in self.async_clients:
            loop_thread.run(client.aclose())

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        namespace = unique_namespace()
        arguments = confine(self.server, namespace)

        async def create() -> Any:
            return redis.asyncio.Redis(**arguments)

        client = self.loop.run(create())
        self.async_clients.append(client)
        repo = AsyncRedisRepository(client, namespace=namespace, max_terminal=max_terminal,
                                    logger=logger)
        return cast(Repository, Synced(repo, self.loop))


# ---------------------------------------------------------------------------- isolation


def keys_of(admin: redis.Redis, namespace: str) -> dict[bytes, Any]:
    return {k: admin.dump(k) for k in admin.scan_iter(match=glob_escape(f"{{{namespace}}}:") + "*")}


@pytest.mark.server
@pytest.mark.parametrize("mine, theirs", [("a*-{u}", "abc-{u}"), ("g-{u}", "g-{u}:1"),
                                          ("s?-{u}", "s1-{u}")])
def test_a_confined_user_gets_a_clear_error_and_nothing_of_another_namespace(
        server: Server, mine: str, theirs: str) -> None:
    u = uuid.uuid4().hex[:8]
    mine, theirs = mine.format(u=u), theirs.format(u=u)  # an unescaped pattern would span
    admin = server.client()
    b = RedisRunStore(redis.Redis(**confine(server, theirs)), namespace=theirs)
    b.migrate()
    b.insert("secret", b"B's record", Claim("b", 600_000))
    before = keys_of(admin, theirs)
    client = redis.Redis(**confine(server, mine))
    store_a = RedisRunStore(client, namespace=mine)
    store_a.migrate()
    store_a.insert("own", b"A's record", Release())

    calls: list[Callable[[], Any]] = [
        lambda: RedisRunStore(client, namespace=theirs).get("secret"),
        lambda: RedisRunStore(client, namespace=theirs).compare_and_set(
            "secret", 1, b"stolen", Release()),
        lambda: RedisRunStore(client, namespace=theirs).claim_expired("a", 1000, 10),
    ]
    for call in calls:
        with pytest.raises(Unavailable) as caught:
            call()
        assert caught.value.outcome == "not_applied" and caught.value.code == "NOPERM"
        assert "acl_rule" in str(caught.value)
    kb, ka = Keyspace(theirs), Keyspace(mine)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.get(kb.run("secret"))
    client.script_load(scripts.RUN_GET.source)
    client.script_load(scripts.RUN_INSERT.source)
    # EVALSHA naming the other namespace's keys, or its own keys with the other's prefix
    # (the scripts derive undeclared keys from ARGV[1]): refused inside, nothing read.
    for keys, prefix in (((kb.run("secret"), kb.meta), kb.prefix),
                         ((ka.run("own"), ka.meta), kb.prefix)):
        with pytest.raises(redis.ResponseError) as refused:
            client.evalsha(scripts.RUN_GET.sha, 2, *keys, prefix, "secret")
        assert "B's record" not in str(refused.value)
        # Foreign KEYS: the server's NOPERM; a forged prefix: the script's own BADARG.
        assert any(word in str(refused.value).lower() for word in ("no permissions", "badarg"))
    with pytest.raises(redis.ResponseError):
        client.evalsha(scripts.RUN_INSERT.sha, 4, ka.run("x"), ka.leases, ka.ready, ka.meta,
                       kb.prefix, "x", b"planted", "r", "", 0, "", "", "", "", 1)
    assert keys_of(admin, theirs) == before  # nothing of theirs read into a reply or written
    assert b.get("secret").record == b"B's record"
    assert store_a.get("own").record == b"A's record"
