"""``RedisRunStore``: the leased run backend on Redis, Valkey or fakeredis (sync)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .protocol import RunOps
from .runs import Current, Discover, Lease
from .transport import Transport


class RedisRunStore:
    """The leased run backend (SPEC §1) on a ``redis.Redis``-compatible client.

    Every method is one server-side Lua script, one round trip (``refresh`` reads, then
    writes). Leases and readiness are judged by the server's clock. ``namespace`` isolates
    stores that share a server; all of its keys share the hash tag ``{namespace}``.
    ``discover`` derives each record's wait for :meth:`claim_ready`; ``projection_version``
    marks metadata derived by an older ``discover`` as stale.

    Failures that are not an answer of the contract raise ``Unavailable``; a write whose
    reply was lost is never re-sent (see :func:`redisstore.confirm_write`).
    """

    def __init__(self, client: Any, *, namespace: str = "redisstore",
                 discover: Discover | None = None, projection_version: int = 1) -> None:
        self._ops = RunOps(namespace, discover, projection_version)
        self._io = Transport(client)

    @property
    def namespace(self) -> str:
        """The namespace this store's keys live in."""
        return self._ops.keys.namespace

    def now(self) -> int:
        """The backend clock (Redis ``TIME``), UTC Unix milliseconds."""
        return self._io.drive(self._ops.now())

    def get(self, run: str) -> Current:
        """The run's latest record, revision and holder; raises ``NotFound``."""
        return self._io.drive(self._ops.get(run))

    def insert(self, run: str, record: bytes, lease: Lease) -> None:
        """Create ``run`` at revision 1; raises ``AlreadyExists`` if it exists."""
        self._io.drive(self._ops.insert(run, record, lease))

    def compare_and_set(self, run: str, expected: int, record: bytes, lease: Lease) -> None:
        """Write revision ``expected + 1`` if ``expected`` is current and the lease allows.

        Raises ``NotFound``, ``Conflict(current)`` or ``LeaseRefused(holder)``; nothing is
        written then.
        """
        self._io.drive(self._ops.compare_and_set(run, expected, record, lease))

    def renew(self, owner: str, runs: Iterable[str], ttl: int) -> list[str]:
        """Extend each lease ``owner`` holds live among ``runs`` to ``ttl`` ms from now."""
        return self._io.drive(self._ops.renew(owner, runs, ttl))

    def claim_expired(self, owner: str, ttl: int, limit: int) -> list[str]:
        """Claim up to ``limit`` held, expired leases, the longest-expired first."""
        return self._io.drive(self._ops.claim_expired(owner, ttl, limit))

    def claim_ready(self, owner: str, ttl: int, limit: int) -> list[str]:
        """Claim up to ``limit`` free runs whose wait is eligible, the earliest first."""
        return self._io.drive(self._ops.claim_ready(owner, ttl, limit))

    def refresh(self, run: str) -> bool:
        """Re-derive the run's wait from its current record; True if it now has one."""
        return self._io.drive(self._ops.refresh(run))
