"""``Shell``: the base of the store classes, sync and async."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from ..core.keys import Keyspace


class _Ops(Protocol):
    keys: Keyspace


OpsT = TypeVar("OpsT", bound=_Ops)


class Shell(Generic[OpsT]):
    """Base of the store classes, sync and async: each holds its operations (``_ops``, a
    :class:`RunOps` or a ``RepositoryOps``) and a transport that sends them."""

    _ops: OpsT

    @property
    def namespace(self) -> str:
        """The namespace the store's keys live in (they share the hash tag ``{namespace}``)."""
        return self._ops.keys.namespace
