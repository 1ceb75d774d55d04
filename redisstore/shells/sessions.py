"""A Redis store's sessions: the steps a ``Session`` sends, one source for the sync store
and the asyncio one, of one partition or many (a store of partitions fans them:
redisstore/core/partitions.py). Each step hands back what the store's ``_write``,
``_read`` or ``_claim`` does: the answer, or an awaitable of it."""

from __future__ import annotations

from typing import Any

from ..core.partition_ops import PartitionOps
from ..core.runops import RunOps


class SessionSteps:
    """The :class:`~redisstore.sessions.SessionBackend` of a Redis store."""

    _ops: RunOps | PartitionOps

    def _write(self, op: Any) -> Any:
        raise NotImplementedError

    def _read(self, op: Any) -> Any:
        raise NotImplementedError

    def _claim(self, index: str, limit: int, block: int | None, claim: Any) -> Any:
        raise NotImplementedError

    def _session_open(self, owner: str, ttl: int, /) -> Any:
        return self._write(self._ops.session_open(owner, ttl))

    def _session_keepalive(self, session: str, owner: str, /) -> Any:
        return self._write(self._ops.session_keepalive(session, owner))

    def _session_claim(self, kind: str, session: str, owner: str, ttl: int, limit: int,
                       records: bool, block: int, max_takeovers: int | None, /) -> Any:
        ops = self._ops
        return self._claim(kind, limit, block, lambda: (
            ops.session_claim(kind, session, owner, ttl, limit, records, max_takeovers)))

    def _session_close(self, session: str, owner: str, count: int, /) -> Any:
        return self._write(self._ops.session_close(session, owner, count))

    def _sessions(self, limit: int) -> Any:
        return self._read(self._ops.sessions(limit))
