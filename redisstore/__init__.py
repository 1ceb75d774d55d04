"""redisstore: a distributed lease store on Redis, Valkey and fakeredis.

The public names of SPEC.md are importable from here.
"""

from .errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    LeaseRefused,
    NotFound,
    StoreError,
    Unavailable,
    UnknownGroup,
)
from .memory import MemoryRunStore
from .runs import (
    At,
    Changed,
    Claim,
    ClaimInfo,
    Current,
    Discover,
    Free,
    Held,
    Hold,
    Holder,
    Lease,
    Poll,
    Release,
    RunStore,
    Seize,
    Wait,
    confirm_write,
)
from .store import RedisRunStore

__all__ = [
    "AlreadyExists",
    "At",
    "Changed",
    "Claim",
    "ClaimInfo",
    "ConcurrentUpdate",
    "Conflict",
    "Current",
    "Discover",
    "Free",
    "Held",
    "Hold",
    "Holder",
    "Lease",
    "LeaseRefused",
    "MemoryRunStore",
    "NotFound",
    "Poll",
    "RedisRunStore",
    "Release",
    "RunStore",
    "Seize",
    "StoreError",
    "Unavailable",
    "UnknownGroup",
    "Wait",
    "confirm_write",
]
