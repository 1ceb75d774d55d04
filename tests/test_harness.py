"""The suite's own machinery (tests/conftest.py), where a mistake would not fail a test but
slow or spoil every run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# What a class of the suites does: its autouse fixture keeps the test's client on `self`.
LEAKY = '''
import gc
import weakref

import pytest

kept = []


class Client:
    """Stands for a client: a cluster client with its slot table is about 2 MB."""


class TestKeepsItsClientOnSelf:
    @pytest.fixture(autouse=True)
    def _backend(self):
        self.client = Client()
        kept.append(weakref.ref(self.client))

    def test_one(self):
        assert self.client is not None

    def test_two(self):
        assert self.client is not None


def test_the_clients_of_the_tests_before_are_gone():
    gc.collect()
    assert len(kept) == 2
    assert [ref for ref in kept if ref() is not None] == []
'''


def test_what_a_test_keeps_on_its_class_instance_goes_when_the_test_ends(
        tmp_path: Path) -> None:
    """pytest keeps each test's class instance (``item.instance``) for the whole session: a
    client a fixture put on ``self`` lived until the end. With the conformance classes'
    clients that grew an xdist worker to 5 million objects and 3-4 GB, whose last
    ``gc.collect()`` then took longer than the 5 s execnet waits before it sends the worker
    SIGINT: a KeyboardInterrupt traceback, from inside a gc callback, at the end of a green
    run. The suite's conftest forgets an instance's attributes when its test ends."""
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(LEAKY))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "conftest", "--rootdir", str(tmp_path), "-c", os.devnull, "-p", "no:randomly",
         str(tmp_path / "test_leaky.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout
