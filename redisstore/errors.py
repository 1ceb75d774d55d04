"""The error hierarchy, where users always found them.

The names live in :mod:`redisstore.core.errors`, on the ground floor with the rest of the core,
which imports nothing above it (docs/design/house.md); ``from redisstore.errors import ...``
keeps working.
"""

from redisstore.core.errors import *  # noqa: F403
