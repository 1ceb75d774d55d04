"""Fencing and finishing, as docs/contract.md gives them: every grant of a lease has its own
token, ``Fenced(owner, token)`` writes only under that grant, and ``finish`` ends it with
a result, a plain release or a failure (attempts, a back-off, the quarantine, ``restore``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ..discovery import json_wait
from ..errors import Conflict, LeaseRefused, NotFound
from ..runs import (
    MAX_ERROR,
    Claim,
    Claimed,
    Failure,
    Fenced,
    Free,
    Held,
    Hold,
    Quarantined,
    Release,
    RunStore,
    Seize,
)
from .base import LONG, ME, OTHER, RunSuite, rec

READY = rec({"at": 0})


class FencingRules(RunSuite):
    """Grant tokens, the ``Fenced`` condition, ``finish``, retries and ``restore``."""

    def _claimed(self, store: RunStore, run: str = "run", owner: str = ME,
                 ttl: int = LONG) -> Claimed:
        """``run``, inserted ready, claimed by ``owner`` with its record (and token)."""
        store.insert(run, READY, Release())
        got = store.claim(owner, ttl, records=True)
        assert [c.run for c in got] == [run]
        return got[0]

    # ------------------------------------------------------------------ tokens

    def test_every_grant_has_a_token_of_its_own(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("free", rec(None), Release())
        assert store.get("free").token is None
        first = self._claimed(store, "run").current.token
        assert first is not None and store.get("run").token == first
        # Renewals, checkpoints and Hold keep the grant; a release ends it.
        store.renew(ME, ["run"], LONG)
        store.compare_and_set("run", 1, READY, Hold(ME))
        assert store.get("run").token == first
        store.compare_and_set("run", 2, READY, Fenced(ME, first))
        assert store.get("run").token == first
        assert store.release(ME, ["run"]) == ["run"]
        assert store.get("run").token is None
        # Each new grant, by any kind of claim or condition, even of the same owner: a
        # token not seen before.
        seen = {first}
        for step in range(5):
            if step == 0:
                store.claim_ready(ME, LONG)
            elif step == 1:
                store.compare_and_set("run", 3, READY, Claim(ME, LONG))  # its own again
            elif step == 2:
                store.compare_and_set("run", 4, READY, Seize(OTHER, self.short_ttl))
                self.expire(store)
                store.claim_expired(OTHER, LONG)  # its own expired lease, taken back
            elif step == 3:
                store.compare_and_set("run", 5, READY, Seize(ME, self.short_ttl))
                self.expire(store)
                store.claim(OTHER, LONG)
            else:
                store.compare_and_set("run", 6, READY, Seize(ME, LONG))
            token = store.get("run").token
            assert token is not None and token not in seen, step
            seen.add(token)

    def test_a_token_is_never_used_again_for_an_id_inserted_again(self) -> None:
        store = self.make_store(discover=json_wait)
        tokens = set()
        for _ in range(3):
            claimed = self._claimed(store)
            token = claimed.current.token
            assert token is not None and token not in tokens
            tokens.add(token)
            store.delete("run", claimed.current.revision, Fenced(ME, token))
        store.insert("run", READY, Claim(ME, LONG))
        assert store.get("run").token not in tokens

    def test_insert_takes_no_fenced_condition(self) -> None:
        store = self.make_store()
        with pytest.raises(TypeError):
            store.insert("run", b"r1", Fenced(ME, 1))
        with pytest.raises(NotFound):
            store.get("run")

    # ------------------------------------------------------------------ Fenced

    @pytest.mark.parametrize("release", [False, True])
    def test_fenced_writes_only_under_its_grant(self, release: bool) -> None:
        store = self.make_store(discover=json_wait)
        old = self._claimed(store, ttl=self.short_ttl).current
        assert old.token is not None
        # Another grant came since (here: the same owner's loop took its own expired lease).
        self.expire(store)
        assert store.claim(ME, LONG) == ["run"]
        new = store.get("run")
        with pytest.raises(LeaseRefused) as refused:
            store.compare_and_set("run", 1, b"zombie", Fenced(ME, old.token, release))
        assert refused.value.holder == Held(ME, True)
        assert store.get("run") == new
        # Under the grant that holds it: applied, live or expired.
        assert new.token is not None
        store.compare_and_set("run", 1, READY, Fenced(ME, new.token, release))
        after = store.get("run")
        assert after.revision == 2
        assert after.holder == (Free() if release else Held(ME, True))
        assert after.token == (None if release else new.token)

    def test_fenced_is_refused_on_a_free_run_and_after_the_checks_before_it(self) -> None:
        store = self.make_store()
        store.insert("free", b"r1", Release())
        with pytest.raises(LeaseRefused) as refused:
            store.compare_and_set("free", 1, b"x", Fenced(ME, 1))
        assert refused.value.holder == Free()
        with pytest.raises(NotFound):
            store.compare_and_set("absent", 1, b"x", Fenced(ME, 1))
        store.insert("held", b"r1", Claim(OTHER, LONG))
        with pytest.raises(Conflict):
            store.compare_and_set("held", 7, b"x", Fenced(ME, 1))  # revision first
        token = store.get("held").token
        assert token is not None
        with pytest.raises(LeaseRefused):
            store.compare_and_set("held", 1, b"x", Fenced(ME, token))  # another owner
        with pytest.raises(LeaseRefused):
            store.delete("held", 1, Fenced(OTHER, token + 1))
        store.delete("held", 1, Fenced(OTHER, token))
        with pytest.raises(NotFound):
            store.get("held")

    def test_a_zombie_result_never_lands_over_a_takeover(self) -> None:
        """A worker paused past its ttl: its run was taken over, then its result comes."""
        store = self.make_store(discover=json_wait)
        zombie = self._claimed(store, ttl=self.short_ttl).current
        assert zombie.token is not None
        self.expire(store)
        assert store.claim(OTHER, LONG) == ["run"]
        taken = store.get("run")
        fence = Fenced(ME, zombie.token)
        calls: list[Callable[[], Any]] = [
            lambda: store.finish("run", 1, fence, record=b"late"),
            lambda: store.finish("run", 1, fence),
            lambda: store.finish("run", 1, fence, failure=Failure("boom", 10)),
            lambda: store.compare_and_set("run", 1, b"late", fence)]
        for call in calls:
            with pytest.raises(LeaseRefused) as refused:
                call()
            assert refused.value.holder == Held(OTHER, True)
        assert store.get("run") == taken

    # ------------------------------------------------------------------ finish

    def test_finish_with_a_record_writes_it_and_frees_the_run(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        store.finish("run", 1, Fenced(ME, claimed.token), record=rec(None))
        current = store.get("run")
        assert (current.revision, current.record, current.holder, current.token) == (
            2, rec(None), Free(), None)
        assert store.claim(ME, LONG) == []  # no wait: never ready again

    def test_finish_without_a_record_frees_the_run_as_it_is(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        store.finish("run", 1, Fenced(ME, claimed.token))
        current = store.get("run")
        assert (current.revision, current.record, current.holder) == (1, READY, Free())
        assert store.claim(OTHER, LONG) == ["run"]  # its wait is due: claimable at once

    def test_finish_refuses_as_a_fenced_write_does(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        with pytest.raises(NotFound):
            store.finish("absent", 1, Fenced(ME, claimed.token))
        with pytest.raises(Conflict) as conflict:
            store.finish("run", 2, Fenced(ME, claimed.token), record=b"x")
        assert conflict.value.current == 1
        with pytest.raises(LeaseRefused):
            store.finish("run", 1, Fenced(ME, claimed.token + 1), failure=Failure("x"))
        assert store.get("run") == claimed

    def test_a_failure_counts_an_attempt_and_holds_the_run_back(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None and claimed.attempts == 0
        delay = 4 * self.short_ttl
        store.finish("run", 1, Fenced(ME, claimed.token), failure=Failure("boom", delay))
        current = store.get("run")
        assert (current.revision, current.holder, current.attempts) == (1, Free(), 1)
        assert current.not_before is not None and current.quarantined is None
        assert store.claim(ME, LONG) == []  # due by its wait, held back by its back-off
        self.advance(store, delay)
        again = store.claim(ME, LONG, records=True)
        assert [c.run for c in again] == ["run"]
        assert again[0].current.attempts == 1  # kept by the claim

    def test_a_failure_without_delay_frees_the_run_at_once(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        store.finish("run", 1, Fenced(ME, claimed.token), failure=Failure("again"))
        assert store.get("run").not_before is None
        assert store.claim(OTHER, LONG) == ["run"]

    def test_the_last_attempt_quarantines_the_run_with_its_error(self) -> None:
        store = self.make_store(discover=json_wait)
        for attempt in (1, 2, 3):
            got = store.claim(ME, LONG, records=True) if attempt > 1 else [
                self._claimed(store)]
            assert [c.run for c in got] == ["run"]
            token = got[0].current.token
            assert token is not None
            store.finish("run", 1, Fenced(ME, token),
                         failure=Failure(f"boom {attempt}", 0, max_attempts=3))
        current = store.get("run")
        assert (current.holder, current.attempts, current.quarantined) == (
            Free(), 3, "failed")
        assert store.quarantined() == [Quarantined("failed", "run", "attempts=3", "boom 3")]
        assert store.claim(ME, LONG) == []
        assert store.claim_ready(ME, LONG) == []

    def test_a_final_failure_quarantines_at_once(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        text = "é" * (MAX_ERROR // 2)
        store.finish("run", 1, Fenced(ME, claimed.token), failure=Failure(text, final=True))
        assert store.quarantined() == [Quarantined("failed", "run", "final", text)]
        assert store.get("run").quarantined == "failed"
        assert store.claim(ME, LONG) == []

    def test_restore_puts_a_quarantined_run_back(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        assert store.restore("run") is False  # not quarantined: nothing written
        store.finish("run", 1, Fenced(ME, claimed.token), failure=Failure("x", final=True))
        assert store.restore("run") is True
        current = store.get("run")
        assert (current.attempts, current.takeovers, current.not_before,
                current.quarantined, current.revision) == (0, 0, None, None, 1)
        assert store.quarantined() == []
        assert store.claim(ME, LONG) == ["run"]
        with pytest.raises(NotFound):
            store.restore("absent")

    def test_restore_with_expected_checks_the_revision_in_the_same_step(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        store.finish("run", 1, Fenced(ME, claimed.token), failure=Failure("x", final=True))
        # A stale page's revision: refused with the run's, nothing written.
        with pytest.raises(Conflict) as stale:
            store.restore("run", expected=2)
        assert stale.value.current == 1
        with pytest.raises(Conflict):
            store.restore("run", expected=0)
        assert store.get("run").quarantined == "failed"
        assert store.restore("run", expected=1) is True
        assert store.get("run").quarantined is None
        # Not quarantined (any more): nothing written, as without expected; the revision
        # is checked first.
        assert store.restore("run", expected=1) is False
        store.compare_and_set("run", 1, READY, Release())
        with pytest.raises(Conflict) as moved:
            store.restore("run", expected=1)
        assert moved.value.current == 2
        with pytest.raises(NotFound):
            store.restore("absent", expected=1)
        for bad in (-1, 2**53):
            with pytest.raises(ValueError):
                store.restore("run", expected=bad)
        for wrong in ("1", 1.0, True):
            with pytest.raises(TypeError):
                store.restore("run", expected=wrong)  # type: ignore[arg-type]

    def test_restore_puts_a_poison_run_back(self) -> None:
        store = self.make_store()
        store.insert("poison", b"r1", Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim_expired(ME, LONG, 10, max_takeovers=0) == []
        assert store.get("poison").quarantined == "poison"
        assert store.restore("poison") is True
        assert store.quarantined() == []
        current = store.get("poison")
        assert (current.takeovers, current.quarantined, current.holder) == (
            0, None, Held(OTHER, False))
        assert store.claim_expired(ME, LONG, 10, max_takeovers=1) == ["poison"]

    def test_a_write_puts_a_failed_run_back_and_clears_its_back_off(self) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        store.finish("run", 1, Fenced(ME, claimed.token), failure=Failure("x", 10 * LONG))
        assert store.claim(ME, LONG) == []
        store.compare_and_set("run", 1, READY, Release())
        current = store.get("run")
        assert (current.not_before, current.attempts, current.quarantined) == (None, 0, None)
        assert store.claim(ME, LONG) == ["run"]

    # ------------------------------------------------------------------ counters

    def test_checkpoints_keep_attempts_and_takeovers_a_finish_starts_them_again(self) -> None:
        store = self.make_store(discover=json_wait)
        store.insert("run", READY, Claim(OTHER, self.short_ttl))
        self.expire(store)
        assert store.claim(ME, LONG) == ["run"]  # a takeover, and a lost try
        current = store.get("run")
        assert (current.takeovers, current.attempts) == (1, 1)
        assert current.token is not None
        store.compare_and_set("run", 1, READY, Hold(ME))
        store.compare_and_set("run", 2, READY, Fenced(ME, current.token))
        store.renew(ME, ["run"], LONG)
        kept = store.get("run")
        assert (kept.takeovers, kept.attempts) == (1, 1)
        store.finish("run", 3, Fenced(ME, current.token), failure=Failure("x"))
        assert store.get("run").attempts == 2
        token = store.claim(ME, self.short_ttl, records=True)[0].current.token
        self.expire(store)
        assert store.claim(ME, LONG) == ["run"]  # its own lease, taken back: a lost try
        again = store.get("run")
        assert (again.takeovers, again.attempts) == (1, 3)
        assert token is not None and again.token is not None and again.token != token
        store.finish("run", 3, Fenced(ME, again.token), record=READY)
        done = store.get("run")
        assert (done.revision, done.takeovers, done.attempts) == (4, 0, 0)

    @pytest.mark.parametrize("call", [
        lambda s, t: s.finish("", 1, Fenced(ME, t)),
        lambda s, t: s.finish("run", -1, Fenced(ME, t)),
        lambda s, t: s.finish("run", 1, Hold(ME)),
        lambda s, t: s.finish("run", 1, Fenced(ME, t), record="text"),
        lambda s, t: s.finish("run", 1, Fenced(ME, t), record=b"x", failure=Failure("x")),
        lambda s, t: s.finish("run", 1, Fenced(ME, t), failure="boom"),
        lambda s, t: s.restore(""),
        lambda s, t: Fenced(ME, 0),
        lambda s, t: Fenced(ME, True),
        lambda s, t: Fenced("", 1),
        lambda s, t: Failure("x" * (MAX_ERROR + 1)),
        lambda s, t: Failure("x", -1),
        lambda s, t: Failure("x", 0, max_attempts=0),
        lambda s, t: Failure("x", 0, final=1),  # type: ignore[arg-type]
    ])
    def test_bad_finish_arguments_raise_and_write_nothing(
            self, call: Callable[[Any, int], Any]) -> None:
        store = self.make_store(discover=json_wait)
        claimed = self._claimed(store).current
        assert claimed.token is not None
        with pytest.raises((ValueError, TypeError)):
            call(store, claimed.token)
        assert store.get("run") == claimed
