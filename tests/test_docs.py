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

A docs/ file's blocks run on a real server too: the whole file's sequence, as a reader
reads it, twice, leaving no key behind; so a docs/ block that writes uses a namespace of
its file's own (no other file's, nor README's) and cleans up as README's blocks do.
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
from servers import unique_namespace

from redisstore import RedisRunStore, drop_namespace
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


def real_clients(monkeypatch: pytest.MonkeyPatch, port: int) -> type[redis.Redis]:
    """Make ``redis.Redis``, ``redis.asyncio.Redis`` and fakeredis's clients clients of the
    server at ``port``, whatever server they name (127.0.0.1:6379, 6380, or none); return
    the sync class."""

    class Real(redis.Redis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(host="127.0.0.1", port=port)

        @classmethod
        def from_url(cls, *args: Any, **kwargs: Any) -> Real:
            return cls()

    class RealAsync(redis.asyncio.Redis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(host="127.0.0.1", port=port)

    for module, name, real in ((redis, "Redis", Real), (redis.asyncio, "Redis", RealAsync),
                               (fakeredis, "FakeRedis", Real),
                               (fakeredis, "FakeAsyncRedis", RealAsync)):
        monkeypatch.setattr(module, name, real)
    return Real


DOCS = [f for f in FILES if f.startswith("docs/") and blocks(f)]


@pytest.mark.server
@pytest.mark.parametrize("name", DOCS)
def test_every_docs_file_runs_twice_on_a_server_and_leaves_nothing(
        name: str, monkeypatch: pytest.MonkeyPatch, redis7: Any) -> None:
    """A reader runs a docs/ file's blocks in order (sharing names, as in
    test_every_python_block_runs) against a real server, then runs them all again: both
    times every block runs, and no key is left behind. The names given to the fragments
    (``store``...) are the test's, in a namespace of its own, dropped after each run."""
    admin = redis7.client()
    real = real_clients(monkeypatch, redis7.port)
    for attempt in (1, 2):
        before = set(admin.scan_iter(count=1000))
        client = real()
        given_namespace = unique_namespace("docs")
        given: dict[str, Any] = {
            "__name__": "__docs__", "client": client, "running": False,
            "store": RedisRunStore(client, namespace=given_namespace, discover=json_wait),
            "work": lambda *args: None,
        }
        names = given
        made: list[Any] = [given["store"]]
        try:
            for i, block in enumerate(blocks(name)):
                if name in STANDALONE:
                    names = {"__name__": "__docs__"}
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        exec(compile(block, f"{name}, python block {i + 1}", "exec"), names)
                except Exception as exc:
                    raise AssertionError(f"{name}, python block {i + 1}, run {attempt}: "
                                         f"{type(exc).__name__}: {exc}\n{block}") from exc
                made += [v for v in names.values() if hasattr(v, "close")]
        finally:
            for thing in made:
                with contextlib.suppress(Exception):
                    thing.close()
            drop_namespace(admin, given_namespace)
        left = set(admin.scan_iter(count=1000)) - before
        assert not left, f"{name}, run {attempt} left {sorted(left)[:5]}"


def namespaces_named(name: str) -> set[str]:
    """The namespaces a file's python blocks name (``namespace="..."``, and the namespace
    argument of ``drop_namespace``, ``repartition`` and ``repartition_repository``)."""
    found: set[str] = set()
    for block in blocks(name):
        found |= set(re.findall(r"namespace=\"([^\"]+)\"", block))
        found |= set(re.findall(r"(?:drop_namespace|repartition(?:_repository)?)\(\w+, "
                                r"\"([^\"]+)\"", block))
    return found


def test_no_two_files_blocks_share_a_namespace() -> None:
    """On one server, a file's blocks must not meet another file's keys (README's
    repository block drops "engine": a docs/ block that used it would lose its keys)."""
    owner: dict[str, str] = {}
    shared: list[str] = []
    for name in FILES:
        for namespace in sorted(namespaces_named(name)):
            if namespace in owner:
                shared.append(f"{namespace!r}: {owner[namespace]} and {name}")
            owner.setdefault(namespace, name)
    assert "engine" in owner and "orders" in owner  # the scan sees README's namespaces
    assert not shared, shared


def test_every_block_that_names_a_server_names_readmes() -> None:
    """A block a reader runs as it is names the server README's blocks name,
    127.0.0.1:6379 (docker-compose.yml's 6380 and 6381 are for the command line)."""
    named = {(name, port) for name in FILES for block in blocks(name)
             for port in re.findall(r"port=(\d+)", block)}
    assert ("README.md", "6379") in named
    assert {(name, port) for name, port in named if port != "6379"} == set()


def test_every_finish_the_docs_pipeline_before_a_claim_is_fenced() -> None:
    """A run's finish queued in a pipeline (the finish-and-claim step of a worker's loop),
    in a block or in the prose around it, is fenced by the claim's grant (``Fenced``):
    ``Release()`` frees the run whoever holds it, and ``Hold`` cannot tell two grants of
    one owner apart, so either would land a paused worker's result over a takeover."""
    call = re.compile(r"pipe\.(?:compare_and_set|finish|release)\((?:[^()]|\([^()]*\))*\)")
    unfenced = [f"{name}: {' '.join(found.split())}" for name in FILES
                for found in call.findall((ROOT / name).read_text())
                if "Fenced(" not in found]
    assert not unfenced, unfenced
