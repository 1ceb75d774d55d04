"""The durability option: each write confirmed by WAIT / WAITAOF, with a real primary and
replica started by fixtures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio
from servers import Server, redis_binary, replica_pair, unique_namespace, valkey_binary

from redisstore import (
    AlreadyExists,
    AsyncRedisRunStore,
    Claim,
    Durability,
    Hold,
    Misconfigured,
    RedisRunStore,
    Release,
    Unavailable,
    confirm_write,
)

pytestmark = pytest.mark.server
LONG = 600_000


@pytest.fixture(params=["redis", "valkey"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    binary = redis_binary() if request.param == "redis" else valkey_binary()
    # Both keep an AOF: WAITAOF counts replicas that fsynced it.
    args = ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
    with replica_pair(binary, request.param, tmp_path, args) as servers:
        yield servers


def test_confirmed_writes_are_on_the_replica(pair: tuple[Server, Server]) -> None:
    primary, replica = pair
    namespace = unique_namespace()
    store = RedisRunStore(primary.client(), namespace=namespace,
                          durability=Durability(replicas=1, timeout=2000))
    store.insert("run", b"r1", Claim("n", LONG))
    store.compare_and_set("run", 1, b"r2", Hold("n"))
    assert store.renew("n", ["run"], LONG) == ["run"]
    # Confirmed means the replica has it now, not eventually.
    on_replica = RedisRunStore(replica.client(), namespace=namespace)
    assert (on_replica.get("run").revision, on_replica.get("run").record) == (2, b"r2")


def test_an_unconfirmed_write_is_unavailable(pair: tuple[Server, Server]) -> None:
    primary, replica = pair
    store = RedisRunStore(primary.client(), namespace=unique_namespace(),
                          durability=Durability(replicas=1, timeout=200))
    store.insert("run", b"r1", Release())
    replica.kill()
    with pytest.raises(Unavailable) as caught:
        store.compare_and_set("run", 1, b"r2-token", Release())
    assert "not confirmed" in caught.value.reason
    # Applied on the primary, which is why the caller must treat it as unknown:
    assert confirm_write(store, "run", 2, b"r2-token")


def test_refusals_are_answers_not_unavailable(pair: tuple[Server, Server]) -> None:
    primary, _ = pair
    store = RedisRunStore(primary.client(), namespace=unique_namespace(),
                          durability=Durability(replicas=1, timeout=2000))
    store.insert("run", b"r1", Claim("other", LONG))
    from redisstore import Conflict, LeaseRefused
    with pytest.raises(Conflict):
        store.compare_and_set("run", 7, b"r2", Hold("me"))
    with pytest.raises(LeaseRefused):
        store.compare_and_set("run", 1, b"r2", Hold("me"))


def test_waitaof_where_the_server_has_it(pair: tuple[Server, Server]) -> None:
    primary, _ = pair
    store = RedisRunStore(primary.client(), namespace=unique_namespace(),
                          durability=Durability(replicas=1, timeout=2000, aof=True))
    version = tuple(int(x) for x in primary.version().split(".")[:2])
    is_valkey = "valkey" in primary.binary
    if is_valkey or version >= (7, 2):
        store.insert("run", b"r1", Release())
        assert store.get("run").revision == 1
    else:
        # Redis 7.0 has no WAITAOF: the store says so before its first write, rather than
        # apply every write and then fail to confirm it.
        with pytest.raises(Misconfigured, match="WAITAOF"):
            store.insert("run", b"r1", Release())
        assert primary.client().keys(f"{{{store.namespace}}}:*") == []


@pytest.mark.parametrize("bad", [
    {"replicas": -1}, {"timeout": 0}, {"replicas": True}, {"aof": "yes"},
])
def test_bad_durability_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        Durability(**bad)  # type: ignore[arg-type]


def test_concurrent_async_writes_share_one_confirmation_per_flush(
        pair: tuple[Server, Server]) -> None:
    # 50 tasks write at once: the multiplexer sends their writes in a few flushes, each
    # ended by one WAIT that covers every write before it on the connection.
    primary, replica = pair
    namespace = unique_namespace()
    admin = primary.client()

    def waits() -> int:
        return int(admin.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    async def main() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=primary.port)
        store = AsyncRedisRunStore(client, namespace=namespace,
                                   durability=Durability(replicas=1, timeout=2000))
        await store.insert("warm", b"x", Release())
        before = waits()
        await asyncio.gather(*(store.insert(f"r{i}", f"{i}".encode(), Release())
                               for i in range(50)))
        assert waits() - before < 50 / 5  # one per flush, not one per write
        stale = await asyncio.gather(*(store.insert(f"r{i}", b"x", Release())
                                       for i in range(5)), return_exceptions=True)
        assert all(isinstance(e, AlreadyExists) for e in stale)  # refusals stay answers
        await client.aclose()

    asyncio.run(main())
    on_replica = RedisRunStore(replica.client(), namespace=namespace)
    assert [on_replica.get(f"r{i}").record for i in range(50)] == [
        f"{i}".encode() for i in range(50)]  # confirmed: on the replica now
