"""Both conformance suites once more through valkey-py (``valkey.Valkey`` and
``valkey.asyncio.Valkey``) on Valkey 8.

valkey-py is a fork of redis-py with its own exception classes and connection signatures;
the stores promise to work with it as with redis-py. Each class here is the Valkey 8 tier
of an existing conformance module with only its client fixture replaced, so every rule
(and every later change to those tiers) runs through both client libraries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import test_conformance_async as async_tier
import test_conformance_repository as repository_tier
import test_conformance_runs as runs_tier
from servers import Server

valkey = pytest.importorskip("valkey")
valkey_asyncio = pytest.importorskip("valkey.asyncio")

pytestmark = pytest.mark.server


def _sync(server: Server) -> Any:
    return valkey.Valkey(host="127.0.0.1", port=server.port, socket_timeout=10)


class ValkeyPy:
    """Each tier below replaces its parent's redis-py client by valkey-py's (its fixture has
    the parent's name): this proves it did."""

    client: Any

    def test_the_client_is_valkey_py(self) -> None:
        assert type(self.client).__module__.startswith("valkey"), type(self.client)


class TestValkeyPyRunStore(ValkeyPy, runs_tier.TestValkey8RunStore):
    @pytest.fixture(autouse=True)
    def _backend(self, valkey8: Server) -> None:
        self.client = _sync(valkey8)


class TestValkeyPyRepository(ValkeyPy, repository_tier.TestValkey8Repository):
    @pytest.fixture(autouse=True)
    def _backend(self, valkey8: Server) -> None:
        self.client = _sync(valkey8)


class TestValkeyPyAsyncRunStore(ValkeyPy, async_tier.TestValkey8AsyncRunStore):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: async_tier.LoopThread,
                 valkey8: Server) -> Iterator[None]:
        yield from self.connect(
            loop_thread, lambda: valkey_asyncio.Valkey(host="127.0.0.1", port=valkey8.port))


class TestValkeyPyAsyncRepository(ValkeyPy, async_tier.TestValkey8AsyncRepository):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: async_tier.LoopThread,
                 valkey8: Server) -> Iterator[None]:
        yield from self.connect(
            loop_thread, lambda: valkey_asyncio.Valkey(host="127.0.0.1", port=valkey8.port))



@pytest.fixture(scope="module")
def loop_thread() -> Iterator[async_tier.LoopThread]:
    loop = async_tier.LoopThread()
    yield loop
    loop.stop()
