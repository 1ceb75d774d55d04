"""redisstore: a distributed lease store on Redis, Valkey and fakeredis.

The public names of SPEC.md are importable from here.
"""

from .aio import AsyncRedisRepository, AsyncRedisRunStore
from .errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    LeaseRefused,
    Misconfigured,
    NotFound,
    StoreError,
    Unavailable,
    UnknownGroup,
)
from .memory import MemoryRepository, MemoryRunStore
from .protocol import Durability
from .repository import InstanceLease, InstanceRecord, Repository, Status
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
    aconfirm_write,
    confirm_write,
)
from .store import RedisRepository, RedisRunStore

__all__ = [
    "AlreadyExists",
    "AsyncRedisRepository",
    "AsyncRedisRunStore",
    "At",
    "Changed",
    "Claim",
    "ClaimInfo",
    "ConcurrentUpdate",
    "Conflict",
    "Current",
    "Discover",
    "Durability",
    "Free",
    "Held",
    "Hold",
    "Holder",
    "InstanceLease",
    "InstanceRecord",
    "Lease",
    "LeaseRefused",
    "MemoryRepository",
    "MemoryRunStore",
    "Misconfigured",
    "NotFound",
    "Poll",
    "RedisRepository",
    "RedisRunStore",
    "Release",
    "Repository",
    "RunStore",
    "Seize",
    "Status",
    "StoreError",
    "Unavailable",
    "UnknownGroup",
    "Wait",
    "aconfirm_write",
    "confirm_write",
]
