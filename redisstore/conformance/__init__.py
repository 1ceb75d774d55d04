"""Conformance suites: one truth, N backends (docs/testing.md).

Subclass a suite in a pytest test module and say how to make a fresh, isolated store::

    from redisstore.conformance import RunStoreConformance, RepositoryConformance

    class TestMyRunStore(RunStoreConformance):
        def make_store(self, *, discover=None):
            return RedisRunStore(client, namespace=unique_name(), discover=discover)

A green run is the definition of "implements the contract". Needs pytest (the ``test``
extra).
"""

from .repository import RepositoryConformance
from .runs import RunStoreConformance

__all__ = ["RepositoryConformance", "RunStoreConformance"]
