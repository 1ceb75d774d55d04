"""The Python blocks of README.md and docs/ run, in order, against fakeredis.

Each file's blocks run one after the other on a fakeredis server of the file's own:
``redis.Redis`` and ``redis.asyncio.Redis`` are fakeredis there, whatever host they name.
The docs/ files' blocks share one namespace of names, as a reader reads them (a block may
use what an earlier one made), and a few names that their fragments take as given exist
from the start: ``client``, ``store`` (on ``json_wait``), ``work`` (does nothing) and
``running`` (False: a worker's loop is shown, not run).

README.md's blocks are what a newcomer pastes, one at a time: each runs with nothing
given, and on a real server each runs alone, twice, and leaves no key behind (the
``server`` test below). A new README block follows the others: it imports what it uses,
makes its own client and store in a namespace of its own, and ends with ``close()`` and,
if it wrote, ``drop_namespace(client, namespace)``.
"""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

from redisstore import RedisRunStore
from redisstore.discovery import json_wait

ROOT = Path(__file__).resolve().parent.parent
FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
#: Files whose blocks each run alone, with no name given: what a reader pastes one by one.
STANDALONE = {"README.md", "docs/package.md"}


def blocks(name: str) -> list[str]:
    """The file's python blocks, dedented (a block inside a list item is indented)."""
    return [textwrap.dedent(b) for b in
            re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(), re.S)]


def fake_clients(monkeypatch: pytest.MonkeyPatch) -> type[fakeredis.FakeRedis]:
    """Make ``redis.Redis`` and ``redis.asyncio.Redis`` clients of one new fakeredis server,
    whatever they are given; return the sync class. (Classes, not factories: fakeredis
    2.31, the lowest the package allows, reads ``redis.Redis.__init__`` when it makes a
    client.)"""
    server = fakeredis.FakeServer()

    class Client(fakeredis.FakeRedis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(server=server)

        @classmethod
        def from_url(cls, *args: Any, **kwargs: Any) -> Client:
            return cls()

    class AsyncClient(fakeredis.FakeAsyncRedis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(server=server)

    monkeypatch.setattr(redis, "Redis", Client)
    monkeypatch.setattr(redis.asyncio, "Redis", AsyncClient)
    return Client


@pytest.mark.parametrize("name", [f for f in FILES if blocks(f)])
def test_every_python_block_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = fake_clients(monkeypatch)()
    given: dict[str, Any] = {
        "__name__": "__docs__", "client": client, "running": False,
        "store": RedisRunStore(client, namespace="docs", discover=json_wait),
        "work": lambda *args: None,
    }
    names = {"__name__": "__docs__"} if name in STANDALONE else given
    for i, block in enumerate(blocks(name)):
        if name in STANDALONE:
            names = {"__name__": "__docs__"}  # nothing of an earlier block
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(block, f"{name}, python block {i + 1}", "exec"), names)
        except Exception as exc:
            raise AssertionError(f"{name}, python block {i + 1} failed: "
                                 f"{type(exc).__name__}: {exc}\n{block}") from exc
    for store in [v for v in {**given, **names}.values() if hasattr(v, "close")]:
        with contextlib.suppress(Exception):
            store.close()


def test_readme_usage_prints_what_its_comments_say(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    fake_clients(monkeypatch)
    usage = blocks("README.md")[0]
    exec(compile(usage, "README.md usage", "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip() == "Held(owner='node-b', live=True)"
    # A second run on the same server works too (the id comes back above its old revision).
    exec(compile(usage, "README.md usage", "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip() == "Held(owner='node-b', live=True)"


@pytest.mark.server
def test_every_readme_block_runs_alone_twice_on_a_server_and_leaves_nothing(
        monkeypatch: pytest.MonkeyPatch, redis7: Any) -> None:
    """A newcomer pastes each block of README.md on its own (nothing from an earlier block),
    twice, against a real server: each runs both times and leaves no key behind."""
    port = redis7.port

    class Real(redis.Redis):
        """Whatever server a block names (127.0.0.1:6379, or fakeredis): the test's own."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(host="127.0.0.1", port=port)

    monkeypatch.setattr(redis, "Redis", Real)
    monkeypatch.setattr(fakeredis, "FakeRedis", Real)
    admin = redis7.client()
    for i, block in enumerate(blocks("README.md")):
        for attempt in (1, 2):
            before = set(admin.scan_iter(count=1000))
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(block, f"README.md, python block {i + 1}", "exec"),
                         {"__name__": "__docs__"})
            except Exception as exc:
                raise AssertionError(f"README.md, python block {i + 1}, run {attempt}: "
                                     f"{type(exc).__name__}: {exc}\n{block}") from exc
            left = set(admin.scan_iter(count=1000)) - before
            assert not left, (f"README.md, python block {i + 1}, run {attempt} left "
                              f"{sorted(left)[:5]}")
