"""What the store logs, one logger per module under "redisstore": a claim that quarantines
damaged index entries (warning), a script loaded again after NOSCRIPT (info), and every
Unavailable raised, with its outcome (info)."""

from __future__ import annotations

import logging

import fakeredis
import pytest
from servers import unique_namespace

from redisstore import Claim, RedisRunStore, Unavailable
from redisstore.core.keys import Keyspace


def test_a_claim_that_quarantines_warns(caplog: pytest.LogCaptureFixture) -> None:
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace=unique_namespace())
    store.insert("good", b"x", Claim("dead", 1))
    client.zadd(Keyspace(store.namespace).leases, {"ghost": 0})  # a run that is not there
    with caplog.at_level(logging.WARNING, logger="redisstore"):
        assert store.claim_expired("me", 60_000, 10) == ["good"]
    (record,) = [r for r in caplog.records if "quarantine" in r.getMessage()]
    assert record.name == "redisstore.core.runops" and record.levelno == logging.WARNING
    assert "moved 1 damaged index entries" in record.getMessage()


def test_a_reload_after_noscript_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace=unique_namespace())
    store.now()
    client.script_flush()
    with caplog.at_level(logging.INFO, logger="redisstore"):
        store.insert("run", b"x", Claim("me", 1000))
    assert any(r.name == "redisstore.core.driver" and "loading it again" in r.getMessage()
               and "run_insert" in r.getMessage() for r in caplog.records)


def test_an_unavailable_is_logged_with_its_outcome(caplog: pytest.LogCaptureFixture) -> None:
    import redis

    store = RedisRunStore(redis.Redis(port=1), namespace="nowhere", timeout=500)
    with caplog.at_level(logging.INFO, logger="redisstore"), pytest.raises(Unavailable):
        store.get("run")
    assert any("outcome not_applied" in r.getMessage() for r in caplog.records)


def _loggers() -> dict[str, str]:
    """Each module's logger (``log = logging.getLogger(...)``) by name: its module."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent / "redisstore"
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "logging.getLogger"):
                continue
            (arg,) = node.value.args
            name = module if ast.unparse(arg) == "__name__" else ast.literal_eval(arg)
            found[name] = module
    return found


def test_every_logger_is_the_one_docs_faults_lists() -> None:
    # A logger's name is the user's interface (their logging configuration names it):
    # renaming one, or adding one, fails here until docs/faults.md says so.
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "faults.md").read_text()
    section = text[text.index("## What the store logs"):text.index("## Metrics")]
    listed = set(re.findall(r"`(redisstore\.[\w.]+)`", section.split("| level |")[0]))
    tabled = set(re.findall(r"^\| \w+ \| `([\w.]+)` \|", section, flags=re.MULTILINE))
    loggers = _loggers()
    assert len(loggers) >= 7
    assert set(loggers) == listed
    assert set(loggers) == tabled
