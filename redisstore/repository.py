"""The repository port (its records, interface and checks), where users always found them.

The names live in :mod:`redisstore.core.repository`, on the ground floor with the rest of the core,
which imports nothing above it (docs/design/house.md); ``from redisstore.repository import ...``
keeps working.
"""

from redisstore.core.repository import *  # noqa: F403
