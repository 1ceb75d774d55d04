"""Sessions, as docs/contract.md gives them: one owner's liveness lease holding many runs,
kept alive by one call; its runs live exactly while it does, and expire together."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from ..discovery import json_wait
from ..errors import Conflict, LeaseRefused, NotFound, SessionLapsed
from ..runs import (
    Claim,
    Fenced,
    Free,
    Held,
    Hold,
    InSession,
    Release,
    RunStore,
    Seize,
)
from ..sessions import CLOSE_STEP, Session
from .base import LONG, ME, OTHER, RunSuite, rec

READY = rec({"at": 0})


class SessionRules(RunSuite):
    """``open_session``, a session's claims, ``keepalive`` and ``close``, and the
    ``InSession`` condition."""

    # ------------------------------------------------------------------ helpers

    @property
    def lapsing(self) -> int:
        """The ttl of a session a rule lets lapse: three short ttls, so that on a real clock
        the calls a rule makes under it before it lapses have room."""
        return 3 * self.short_ttl

    def lapse(self, store: RunStore) -> None:
        """Let every session of :attr:`lapsing` opened before now lapse."""
        self.advance(store, self.lapsing)

    def open(self, store: RunStore, owner: str = ME, ttl: int = LONG) -> Session:
        return cast(Session, cast(Any, store).open_session(owner, ttl))

    def ready_runs(self, store: RunStore, *runs: str) -> None:
        for run in runs:
            store.insert(run, READY, Release())

    def sessions_of(self, store: RunStore) -> list[Any]:
        return cast(list[Any], cast(Any, store).sessions())

    # ------------------------------------------------------------------ opening

    def test_a_session_has_an_id_of_its_own(self) -> None:
        store = self.make_store(discover=json_wait)
        first, again = self.open(store), self.open(store)
        other = self.open(store, OTHER)
        assert len({first.id, again.id, other.id}) == 3  # opened again: a new session
        assert (first.owner, first.ttl) == (ME, LONG)
        assert first.lease == InSession(ME, first.id)
        assert {s.id for s in self.sessions_of(store)} == {first.id, again.id, other.id}

    def test_bad_arguments_raise_before_anything_is_written(self) -> None:
        store = self.make_store(discover=json_wait)
        for owner, ttl in (("", LONG), (ME, 0), (ME, -1), (7, LONG), (ME, "1")):
            with pytest.raises((ValueError, TypeError)):
                cast(Any, store).open_session(owner, ttl)
        assert self.sessions_of(store) == []
        session = self.open(store)
        for kwargs in ({"limit": -1}, {"block": -1}, {"max_takeovers": -1},
                       {"records": "yes"}):
            with pytest.raises((ValueError, TypeError)):
                session.claim(**kwargs)
        for bad in ("", "x1", "1" * 21, "-1"):
            with pytest.raises(ValueError):
                InSession(ME, bad)

    # ------------------------------------------------------------------ claims

    def test_its_claims_take_runs_under_it(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a", "b", "c")
        session = self.open(store)
        assert session.claim(1) == ["a"]
        got = session.claim_ready(1, records=True)
        assert [c.run for c in got] == ["b"]
        current = got[0].current
        assert current.holder == Held(ME, True) and current.session == session.id
        assert current.token is not None
        assert store.get("a").session == session.id
        # Another owner's claims leave runs held under a live session alone.
        assert store.claim(OTHER, LONG, 5) == ["c"]
        assert store.get("c").session is None
        assert [(s.id, s.runs) for s in self.sessions_of(store)] == [(session.id, 2)]

    def test_insert_and_compare_and_set_take_runs_under_it(self) -> None:
        store = self.make_store(discover=json_wait)
        session = self.open(store)
        store.insert("new", b"r", session.lease)
        assert store.get("new").holder == Held(ME, True)
        assert store.get("new").session == session.id
        store.insert("old", b"r", Claim(ME, LONG))
        store.compare_and_set("old", 1, b"r2", session.lease)
        assert store.get("old").session == session.id
        # As Claim: refused while another owner holds it live.
        store.insert("theirs", b"r", Claim(OTHER, LONG))
        with pytest.raises(LeaseRefused):
            store.compare_and_set("theirs", 1, b"x", session.lease)
        assert store.get("theirs").revision == 1
        # Another owner's session, or one that does not exist, is no session of ME's.
        others = self.open(store, OTHER)
        for lease in (InSession(ME, others.id), InSession(ME, "999999")):
            with pytest.raises(SessionLapsed):
                store.insert("nope", b"r", lease)
            with pytest.raises(NotFound):
                store.get("nope")
        # NotFound and Conflict come first, as for every condition.
        with pytest.raises(NotFound):
            store.compare_and_set("absent", 1, b"x", session.lease)
        with pytest.raises(Conflict):
            store.compare_and_set("old", 1, b"x", session.lease)

    def test_every_grant_under_it_has_a_token_of_its_own(self) -> None:
        store = self.make_store(discover=json_wait)
        session = self.open(store)
        store.insert("run", b"r", session.lease)
        first = store.get("run").token
        store.compare_and_set("run", 1, b"r", session.lease)
        second = store.get("run").token
        assert first is not None and second is not None and second > first
        with pytest.raises(LeaseRefused):
            store.compare_and_set("run", 2, b"x", Fenced(ME, first))
        store.finish("run", 2, Fenced(ME, second), record=b"done")
        assert store.get("run").holder == Free() and store.get("run").session is None

    # ------------------------------------------------------------------ liveness

    def test_runs_live_exactly_while_it_does(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a", "b")
        ttl = 8 * self.short_ttl  # room on a real clock between the sleeps and the reads
        session = self.open(store, ttl=ttl)
        assert session.claim(2) == ["a", "b"]
        self.advance(store, ttl * 6 // 10)
        assert session.keepalive() == []
        self.advance(store, ttl * 6 // 10)  # past the opening's ttl: kept alive
        assert store.get("a").holder == Held(ME, True)
        assert store.renew(ME, ["a", "b"], 1) == ["a", "b"]  # returns them, changes nothing
        self.advance(store, ttl)
        for run in ("a", "b"):  # all at once
            assert store.get(run).holder == Held(ME, False)
        assert store.renew(ME, ["a", "b"], LONG) == []

    def test_keepalive_never_revives_it(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a")
        session = self.open(store, ttl=self.lapsing)
        assert session.claim() == ["a"]
        self.lapse(store)
        with pytest.raises(SessionLapsed) as lapsed:
            session.keepalive()
        assert isinstance(lapsed.value, LeaseRefused) and lapsed.value.session == session.id
        assert store.get("a").holder == Held(ME, False)
        with pytest.raises(SessionLapsed):
            session.claim()
        with pytest.raises(SessionLapsed):
            store.insert("b", b"r", session.lease)

    def test_its_expired_runs_are_taken_over_in_due_order(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a", "b", "c")
        session = self.open(store, ttl=self.lapsing)
        assert session.claim(2) == ["a", "b"]
        store.insert("own", b"r", Claim(OTHER, 10 * self.lapsing))
        self.lapse(store)
        # Due at the session's expiry (before the lease that expires later), bounded by
        # limit, as takeovers.
        taken = store.claim_expired(OTHER, LONG, 1)
        assert len(taken) == 1 and taken[0] in ("a", "b")
        assert store.claim_expired(OTHER, LONG, 5) == [{"a", "b"}.difference(taken).pop()]
        for run in ("a", "b"):
            got = store.get(run)
            assert got.holder == Held(OTHER, True) and got.session is None
            assert (got.takeovers, got.attempts) == (1, 1)
        assert self.sessions_of(store) == []  # lapsed and empty: gone

    def test_lapsed_sessions_ahead_hold_back_no_others_runs(self) -> None:
        """Sessions that lapsed earlier, holding nothing, never keep a later lapsed
        session's runs from the claim that comes after it lapsed."""
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a")
        for _ in range(3):
            self.open(store, ttl=1)  # lapse first, holding nothing
        self.advance(store, 1)
        session = self.open(store, ttl=self.lapsing)
        assert session.claim(1) == ["a"]
        self.lapse(store)
        assert store.claim_expired(OTHER, LONG, 5) == ["a"]

    def test_max_takeovers_applies_to_its_runs(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a")
        for owner in (ME, OTHER):  # one takeover already
            session = self.open(store, owner, self.lapsing)
            assert session.claim(max_takeovers=5) in (["a"], [])
            self.lapse(store)
        assert store.get("a").takeovers == 1
        assert store.claim(ME, LONG, max_takeovers=1) == []
        assert store.get("a").quarantined == "poison"

    def test_a_blocked_claim_wakes_at_its_expiry(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a")
        session = self.open(store, ttl=self.lapsing)
        assert session.claim() == ["a"]
        mover = self.advance_soon(store, self.lapsing)
        try:
            assert store.claim(OTHER, LONG, block=10 * self.lapsing + 2_000) == ["a"]
        finally:
            mover.join()

    def test_a_claim_blocked_under_it_stops_when_it_lapses(self) -> None:
        store = self.make_store(discover=json_wait)
        session = self.open(store, ttl=self.lapsing)
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                session.claim(block=20 * self.lapsing + 2_000)
            except BaseException as e:
                errors.append(e)

        waiter = threading.Thread(target=wait)
        waiter.start()
        mover = self.advance_soon(store, self.lapsing)
        mover.join()
        store.insert("late", READY, Release())  # a write: the blocked claim looks again
        waiter.join(30)
        assert [type(e) for e in errors] == [SessionLapsed]
        assert store.get("late").holder == Free()

    # ------------------------------------------------------------------ leaving it

    def test_keepalive_reports_what_others_took(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "seized", "released", "deleted", "claimed", "kept", "done")
        session = self.open(store)
        assert len(session.claim(6)) == 6
        store.compare_and_set("seized", 1, b"r", Seize(OTHER, LONG))
        assert store.release(ME, ["released"]) == ["released"]
        store.delete("deleted", 1, Release())
        store.compare_and_set("claimed", 1, b"r", Claim(ME, LONG))  # its own lease now
        store.compare_and_set("kept", 1, READY, Hold(ME))  # a checkpoint keeps it
        done = store.get("done")
        assert done.token is not None
        store.finish("done", 1, Fenced(ME, done.token), record=b"ok")  # its holder's: untold
        kept = session.keepalive()
        assert sorted(kept) == ["claimed", "deleted", "released", "seized"]
        # A session live everywhere: no partition lapsed, none unreached (of a store of
        # partitions too: one session over all of them).
        assert (kept.lapsed, kept.unanswered) == (frozenset(), frozenset())
        assert session.keepalive() == []  # told once
        assert store.get("seized").holder == Held(OTHER, True)
        assert store.get("claimed").session is None and store.get("kept").session == session.id
        assert [s.runs for s in self.sessions_of(store)] == [1]

    def test_a_seized_run_outlives_it(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a")
        session = self.open(store, ttl=self.lapsing)
        assert session.claim() == ["a"]
        store.compare_and_set("a", 1, b"r", Seize(OTHER, LONG))
        self.lapse(store)
        assert store.get("a").holder == Held(OTHER, True)
        assert store.claim_expired(ME, LONG) == []

    def test_close_releases_everything_in_steps(self) -> None:
        store = self.make_store(discover=json_wait)
        count = CLOSE_STEP + 5
        for i in range(count):
            store.insert(f"r{i:05}", b"r", Release())
        session = self.open(store)
        for i in range(count):
            store.compare_and_set(f"r{i:05}", 1, b"r", session.lease)
        assert session.close() == count
        held = store.get_many([f"r{i:05}" for i in range(0, count, 97)])
        assert all(c.holder == Free() and c.session is None for c in held.values())
        with pytest.raises(SessionLapsed):
            session.keepalive()
        with pytest.raises(SessionLapsed):
            session.claim()
        assert session.close() == 0 and self.sessions_of(store) == []

    def test_closing_a_lapsed_session_releases_what_is_left(self) -> None:
        store = self.make_store(discover=json_wait)
        self.ready_runs(store, "a", "b")
        with self.open(store, ttl=self.lapsing) as session:
            assert session.claim(2) == ["a", "b"]
            self.lapse(store)
            assert store.claim_expired(OTHER, LONG) in (["a"], ["b"])
        left = ({"a", "b"} - {r for r in "ab" if store.get(r).holder == Held(OTHER, True)})
        assert [store.get(r).holder for r in left] == [Free()]
        assert self.sessions_of(store) == []
