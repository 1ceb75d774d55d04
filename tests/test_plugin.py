"""The pytest plugin shipped with the package: docs/testing.md's example runs as pasted, in
a folder of its own, with the fixtures found through the entry point."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from redisstore.pytest_plugin import Clock

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_example_passes_with_the_installed_plugin(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                  if "redisstore_clock" in b]
    (tmp_path / "test_engine.py").write_text(example)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_engine.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_every_fixture_gives_what_it_says(redisstore_run_store: object,
                                          redisstore_make_run_store: object,
                                          redisstore_repository: object,
                                          redisstore_memory_store: object,
                                          redisstore_clock: Clock) -> None:
    from redisstore import (
        Claim,
        InstanceRecord,
        MemoryRunStore,
        RedisRepository,
        RedisRunStore,
    )

    assert isinstance(redisstore_run_store, RedisRunStore)
    assert isinstance(redisstore_repository, RedisRepository)
    assert isinstance(redisstore_memory_store, MemoryRunStore)
    assert callable(redisstore_make_run_store)
    other = redisstore_make_run_store(projection_version=2)
    assert other.namespace != redisstore_run_store.namespace
    start = redisstore_clock()
    assert redisstore_run_store.now() == start == redisstore_memory_store.now()
    redisstore_clock.advance(1234)
    assert redisstore_run_store.now() == start + 1234 == redisstore_memory_store.now()
    redisstore_memory_store.insert("r", b"x", Claim("a", 10))
    redisstore_clock.advance(10)
    assert redisstore_memory_store.claim_expired("b", 10, 1) == ["r"]
    redisstore_repository.register_group("g")
    redisstore_repository.save(InstanceRecord("i", b"p", "g"))
    loaded = redisstore_repository.load("i")
    assert loaded is not None and loaded.payload == b"p"


def test_the_clock_refuses_to_go_back() -> None:
    clock = Clock()
    for bad in (-1, 1.5, True):
        try:
            clock.advance(bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"advance({bad!r}) was taken")
