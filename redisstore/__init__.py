"""redisstore: a distributed lease store on Redis, Valkey and fakeredis.

Every public name is importable from here; docs/api.md lists them.
"""

from .aio import AsyncRedisRepository, AsyncRedisRunStore
from .errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    Corrupt,
    LeaseRefused,
    Misconfigured,
    NotFound,
    StoreError,
    Unavailable,
    UnknownGroup,
)
from .memory import MemoryRepository, MemoryRunStore
from .protocol import Durability
from .repository import InFlightPage, InstanceLease, InstanceRecord, Repository, Status
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
    Migrated,
    Poll,
    Quarantined,
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
    "Corrupt",
    "Current",
    "Discover",
    "Durability",
    "Free",
    "Held",
    "Hold",
    "Holder",
    "InFlightPage",
    "InstanceLease",
    "InstanceRecord",
    "Lease",
    "LeaseRefused",
    "MemoryRepository",
    "MemoryRunStore",
    "Migrated",
    "Misconfigured",
    "NotFound",
    "Poll",
    "Quarantined",
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
