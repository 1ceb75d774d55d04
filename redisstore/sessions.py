"""Sessions: one owner's liveness lease on the backend's clock, holding many runs, kept
alive by one call whatever their number (docs/contract.md, "Sessions")."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol, TypeAlias, TypeVar

from .core.waits import check_block
from .runs import (
    MAX_RENEW,
    InSession,
    Kept,
    check_flag,
    check_limit,
    check_max_takeovers,
    check_owner,
    check_session_id,
    check_ttl,
)
from .session_ops import AsyncSessionMethods, SessionMethods

#: The most runs one step of ``close`` releases, and one keepalive reports.
CLOSE_STEP = MAX_RENEW

T = TypeVar("T")
#: What a session's call asks of its store, one step: the backend's call, given the store.
#: Both kinds of session make the same steps (:class:`_SessionValues`); only the drivers
#: differ, :func:`_run` calls each step, :func:`_arun` awaits it.
_Ask: TypeAlias = Callable[[Any], Any]
_Steps: TypeAlias = Generator[_Ask, Any, T]


class SessionBackend(Protocol):
    """What a store does for its sessions (the narrow interface a :class:`Session` uses).
    Arguments are checked by the caller; each call is one step on the backend."""

    def _session_open(self, owner: str, ttl: int, /) -> str: ...

    def _session_keepalive(self, session: str, owner: str, /) -> Kept: ...

    def _session_claim(self, kind: str, session: str, owner: str, ttl: int, limit: int,
                       records: bool, block: int, max_takeovers: int | None, /
                       ) -> list[Any]: ...

    def _session_close(self, session: str, owner: str, count: int, /) -> tuple[int, bool]: ...


class AsyncSessionBackend(Protocol):
    """:class:`SessionBackend` of an asyncio store: each step awaited."""

    async def _session_open(self, owner: str, ttl: int, /) -> str: ...

    async def _session_keepalive(self, session: str, owner: str, /) -> Kept: ...

    async def _session_claim(self, kind: str, session: str, owner: str, ttl: int,
                             limit: int, records: bool, block: int, max_takeovers: int | None,
                             /) -> list[Any]: ...

    async def _session_close(self, session: str, owner: str, count: int, /
                             ) -> tuple[int, bool]: ...


def check_session(owner: object, ttl: object) -> tuple[str, int]:
    """``open_session``'s arguments."""
    return check_owner(owner), check_ttl(ttl)


def check_claim(limit: object, records: object, block: object,
                max_takeovers: object) -> tuple[int, bool, int, int | None]:
    """A session claim's arguments, as the store's claims check them."""
    return (check_limit(limit), check_flag("records", records), check_block(block),
            check_max_takeovers(max_takeovers))


class _SessionValues:
    """What both kinds of session are: an id, an owner, a ttl and the lease condition."""

    __slots__ = ("_id", "_owner", "_ttl")

    def __init__(self, id: str, owner: str, ttl: int) -> None:
        self._id, self._owner, self._ttl = check_session_id(id), owner, ttl

    @property
    def id(self) -> str:
        """The session's id: unique in the namespace, never reused."""
        return self._id

    @property
    def owner(self) -> str:
        """The owner the session's runs are held by (``Held(owner, live)``)."""
        return self._owner

    @property
    def ttl(self) -> int:
        """How long (ms) the session lives after its opening and each keepalive."""
        return self._ttl

    @property
    def lease(self) -> InSession:
        """The lease condition that takes a run under this session in ``insert`` and
        ``compare_and_set``."""
        return InSession(self._owner, self._id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self._id!r}, owner={self._owner!r}, ttl={self._ttl})"

    # The calls' steps, written once for both kinds (docs/contract.md, "Sessions").

    def _keeping(self) -> _Steps[Kept]:
        kept: Kept = yield lambda store: store._session_keepalive(self._id, self._owner)
        return kept

    def _claiming(self, kind: str, limit: object, records: object, block: object,
                  max_takeovers: object) -> _Steps[list[Any]]:
        n, rec, wait, bound = check_claim(limit, records, block, max_takeovers)
        claimed: list[Any] = yield lambda store: store._session_claim(
            kind, self._id, self._owner, self._ttl, n, rec, wait, bound)
        return claimed

    def _closing(self) -> _Steps[int]:
        released = 0
        while True:
            step: tuple[int, bool] = yield lambda store: store._session_close(
                self._id, self._owner, CLOSE_STEP)
            released += step[0]
            if step[1]:
                return released


def _run(store: SessionBackend, steps: _Steps[T]) -> T:
    """What ``steps`` answer, each step's call made on this thread."""
    answer = None
    while True:
        try:
            ask = steps.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer = ask(store)


async def _arun(store: AsyncSessionBackend, steps: _Steps[T]) -> T:
    """:func:`_run` of an asyncio store: each step's call awaited."""
    answer = None
    while True:
        try:
            ask = steps.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        answer = await ask(store)


class Session(_SessionValues, SessionMethods):
    """One owner's liveness lease (``store.open_session(owner, ttl)``): the runs it holds
    are live exactly while it is, and :meth:`keepalive` keeps them all alive in one call.
    A context manager: leaving it closes the session. Its calls are generated
    (:mod:`redisstore.session_ops`), one source with :class:`AsyncSession`'s."""

    __slots__ = ("_store",)

    def __init__(self, store: SessionBackend, id: str, owner: str, ttl: int) -> None:
        super().__init__(id, owner, ttl)
        self._store = store

    def _call(self, steps: _Steps[T]) -> T:
        return _run(self._store, steps)


class AsyncSession(_SessionValues, AsyncSessionMethods):
    """:class:`Session` of an asyncio store: the same calls, awaited."""

    __slots__ = ("_store",)

    def __init__(self, store: AsyncSessionBackend, id: str, owner: str, ttl: int) -> None:
        super().__init__(id, owner, ttl)
        self._store = store

    async def _call(self, steps: _Steps[T]) -> T:
        return await _arun(self._store, steps)
