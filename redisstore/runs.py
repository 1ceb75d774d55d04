"""The run store port (its values, interface and checks), where users always found them.

The names live in :mod:`redisstore.core.runs`, on the ground floor with the rest of the core,
which imports nothing above it (docs/design/house.md); ``from redisstore.runs import ...``
keeps working.
"""

from redisstore.core.runs import *  # noqa: F403
