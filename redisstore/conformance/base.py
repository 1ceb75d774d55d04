"""What every rule of the run store suite builds on: the hooks a backend implements, the
clock, the holder states a lease condition is checked against, and a run's JSON record."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, ClassVar

from ..runs import Claim, Discover, Hold, Holder, Lease, Release, RunStore, Seize

ME, OTHER = "node-a", "node-b"
LONG = 600_000  # a lease that cannot expire during a test

# The holder states a lease condition is checked against.
STATES = ("free", "mine-live", "mine-expired", "other-live", "other-expired")

# (lease kind, holder state) -> accepted?  docs/runs.md.
ACCEPTS: dict[tuple[str, str], bool] = {
    **{("hold", s): s.startswith("mine") for s in STATES},
    **{("claim", s): s != "other-live" for s in STATES},
    **{("seize", s): True for s in STATES},
    **{("release", s): True for s in STATES},
}


# Here, not with the readiness rules: every suite writes records, and a suite that stood
# on another for this alone stood a floor higher (docs/design/house.md).
def rec(wait: dict[str, Any] | None, **fields: Any) -> bytes:
    """A JSON record whose ``"wait"`` is ``wait``."""
    return json.dumps({"wait": wait, **fields}, sort_keys=True).encode()


def lease_of(kind: str, owner: str, ttl: int) -> Lease:
    """The lease condition named ``kind`` (hold, claim, seize, release)."""
    if kind == "hold":
        return Hold(owner)
    if kind == "claim":
        return Claim(owner, ttl)
    if kind == "seize":
        return Seize(owner, ttl)
    return Release()


class RunSuite:
    """Hooks and helpers of the run store suite.

    ``clock_is_controlled``: the test moves the backend clock with :meth:`advance` and
    nothing else moves it; boundaries are then checked exactly.
    """

    clock_is_controlled: ClassVar[bool] = False
    #: On a real clock: the ttl of leases a test lets expire, and the sleep margin after it.
    short_ttl: ClassVar[int] = 100
    margin: ClassVar[int] = 25

    # ------------------------------------------------------------------ hooks

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        """A fresh, isolated store (nothing in it, no other test sees it)."""
        raise NotImplementedError

    def reopen(self, store: RunStore, *, discover: Discover | None,
               projection_version: int) -> RunStore:
        """Another store over the same runs as ``store`` (another process, another version
        of the software), with its own ``discover`` and ``projection_version``."""
        raise NotImplementedError

    def advance(self, store: RunStore, ms: int) -> None:
        """Let ``ms`` of backend time pass. On a real clock: sleep a little longer."""
        time.sleep((ms + self.margin) / 1000)

    def advance_soon(self, store: RunStore, ms: int) -> threading.Thread:
        """Let ``ms`` of backend time pass, from another thread (a controlled clock moves
        at once; a real one is only slept on)."""
        thread = threading.Thread(target=self.advance, args=(store, ms), daemon=True)
        thread.start()
        return thread

    # ------------------------------------------------------------------ helpers

    def expire(self, store: RunStore) -> None:
        """Let every lease of ``short_ttl`` taken before now expire (exactly, if controlled)."""
        self.advance(store, self.short_ttl)

    def given(self, store: RunStore, run: str, state: str, record: bytes = b"r1") -> None:
        """Create ``run`` at revision 1 with its lease in ``state`` (one of STATES)."""
        if state == "free":
            store.insert(run, record, Release())
            return
        owner = ME if state.startswith("mine") else OTHER
        ttl = self.short_ttl if state.endswith("expired") else LONG
        store.insert(run, record, Claim(owner, ttl))

    def held(self, store: RunStore, run: str) -> Holder:
        """The run's holder now."""
        return store.get(run).holder
