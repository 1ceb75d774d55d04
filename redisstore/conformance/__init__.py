"""Conformance suites: one truth, N backends (docs/testing.md).

Subclass a suite in a pytest test module and say how to make a fresh, isolated store::

    from redisstore.conformance import RunStoreConformance, RepositoryConformance

    class TestMyRunStore(RunStoreConformance):
        def make_store(self, *, discover=None):
            return RedisRunStore(client, namespace=unique_name(), discover=discover)

A green run is the definition of "implements the contract". Needs pytest (the ``test``
extra).
"""

from .claiming import ClaimRules
from .feed import FeedRules
from .fencing import FencingRules
from .lifecycle import LifecycleRules
from .readiness import ReadinessRules
from .repository import RepositoryConformance
from .runs import LeaseRules
from .sessions import SessionRules
from .wakeups import WakeupRules
from .working import WorkerRules

__all__ = ["RepositoryConformance", "RunStoreConformance"]


# Put together here, beside the suites, not in a module of its own: each suite stands on
# what it tests (the worker's, on the engine), and the whole contract one floor above them.
class RunStoreConformance(LeaseRules, ReadinessRules, LifecycleRules, WakeupRules,
                          ClaimRules, FencingRules, WorkerRules, FeedRules, SessionRules):
    """The whole leased run backend contract as pytest tests.

    Implement :meth:`make_store` (and :meth:`reopen`, for the projection-version rules).
    Override :meth:`advance` and set ``clock_is_controlled`` when the test drives the
    backend's clock.
    """
