"""A pytest plugin, loaded by pytest wherever redisstore is installed (entry point
``pytest11``): fixtures that give your tests a store on fakeredis in a fresh namespace, and
a clock your test moves by hand. docs/testing.md has a complete example.

Fixtures (all function-scoped, so every test starts empty):

- ``redisstore_clock``: a :class:`Clock` that drives what fakeredis answers to ``TIME``
  (scripts included), so leases expire and waits fall due when the test says:
  ``redisstore_clock.advance(30_000)``. Every store made by the fixtures below reads it.
- ``redisstore_redis``: the ``fakeredis.FakeRedis`` client behind them (one fresh server).
- ``redisstore_run_store``: a :class:`~redisstore.RedisRunStore` on it, in a fresh
  namespace at the newest layout, with the JSON ``discover``
  (:data:`redisstore.discovery.json_wait`).
- ``redisstore_make_run_store``: ``make(**options)`` for one with your own options
  (``discover=``, ``projection_version=``, ...), on the same server.
- ``redisstore_repository``: a :class:`~redisstore.RedisRepository` in a fresh namespace.
- ``redisstore_memory_store``: the memory reference (:class:`~redisstore.MemoryRunStore`)
  on the same clock.

They need fakeredis with its Lua extra: ``pip install 'redisstore[embedded]'``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

#: Where the clock starts: 2027-01-15, UTC, in ms (a fixed, round date: tests read well).
START = 1_800_000_000_000


class Clock:
    """The backend clock of a test, in UTC ms: :meth:`advance` moves it; nothing else does."""

    def __init__(self, ms: int = START) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        """Let ``ms`` milliseconds pass (leases expire, waits fall due)."""
        if type(ms) is not int or ms < 0:
            raise ValueError(f"advance takes ms >= 0, got {ms!r}")
        self.ms += ms


def _fakeredis() -> Any:
    try:
        import fakeredis
    except ImportError as exc:  # pragma: no cover - the embedded extra is missing
        raise pytest.UsageError("the redisstore fixtures need fakeredis: "
                                "pip install 'redisstore[embedded]'") from exc
    return fakeredis


@pytest.fixture
def redisstore_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A clock the test moves by hand; fakeredis answers ``TIME`` from it."""
    _fakeredis()
    from fakeredis.commands_mixins import server_mixin

    clock = Clock()
    # The half millisecond keeps TIME's microseconds exact whatever the float rounding.
    moved = SimpleNamespace(time=lambda: (clock.ms + 0.5) / 1000)
    monkeypatch.setattr(server_mixin, "time", moved)
    try:  # the ids XADD gives (the change feed's times) by the same clock
        from fakeredis.model import _stream
    except ImportError:  # pragma: no cover - a fakeredis that keeps streams elsewhere
        pass
    else:
        monkeypatch.setattr(_stream, "time", moved)
    return clock


@pytest.fixture
def redisstore_redis(redisstore_clock: Clock) -> Any:
    """A fakeredis client on a server of this test's own."""
    return _fakeredis().FakeRedis()


@pytest.fixture
def redisstore_make_run_store(redisstore_redis: Any) -> Iterator[Callable[..., Any]]:
    """``make(**options)``: a RedisRunStore in a fresh namespace at the newest layout."""
    from .shells.store import RedisRunStore

    made: list[Any] = []

    def make(**options: Any) -> Any:
        options.setdefault("namespace", f"test-{uuid.uuid4().hex[:12]}")
        store = RedisRunStore(redisstore_redis, **options)
        store.migrate()
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def redisstore_run_store(redisstore_make_run_store: Callable[..., Any]) -> Any:
    """A RedisRunStore on fakeredis with the JSON discover, in a fresh namespace."""
    from .discovery import json_wait

    return redisstore_make_run_store(discover=json_wait)


@pytest.fixture
def redisstore_repository(redisstore_redis: Any) -> Iterator[Any]:
    """A RedisRepository on fakeredis, in a fresh namespace."""
    from .shells.repo_store import RedisRepository

    repo = RedisRepository(redisstore_redis, namespace=f"test-{uuid.uuid4().hex[:12]}")
    yield repo
    repo.close()


@pytest.fixture
def redisstore_memory_store(redisstore_clock: Clock) -> Any:
    """The memory reference on the test's clock, with the JSON discover."""
    from .discovery import json_wait
    from .memory import MemoryRunStore

    return MemoryRunStore(clock=redisstore_clock, discover=json_wait)
