"""Conformance suites: one truth, N backends (docs/testing.md).

Subclass a suite in a pytest test module and say how to make a fresh, isolated store::

    from redisstore.conformance import RunStoreConformance, RepositoryConformance

    class TestMyRunStore(RunStoreConformance):
        def make_store(self, *, discover=None):
            store = RedisRunStore(client, namespace=unique_name(), discover=discover)
            store.migrate()  # the newest layout (else set newest_layout = False)
            return store

A green run is the definition of "implements the contract". Needs pytest (the ``test``
extra).
"""

from .repository import RepositoryConformance
from .runs import RunStoreConformance

__all__ = ["RepositoryConformance", "RunStoreConformance"]
