"""The change feed's values (what ``store.changes()`` answers), where users found them.

The names live in :mod:`redisstore.core.feed`, on the ground floor with the rest of the core,
which imports nothing above it (docs/design/house.md); ``from redisstore.feed import ...``
keeps working.
"""

from redisstore.core.feed import *  # noqa: F403
