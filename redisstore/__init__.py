"""redisstore: a distributed lease store on Redis, Valkey and fakeredis.

Every public name is importable from here; docs/api.md lists them.
"""

# Private names: what the package imports for itself is not part of its surface
# (dir(redisstore) shows __all__ and the submodules).
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from .admin.namespaces import drop_namespace
from .admin.repartition import Repartitioned, repartition, repartition_repository
from .admin.security import acl_rule
from .core.driver import Durability, Pending
from .core.errors import (
    AlreadyExists,
    Closed,
    Compacted,
    ConcurrentUpdate,
    Conflict,
    Corrupt,
    LeaseRefused,
    Misconfigured,
    NotFound,
    SessionLapsed,
    StoreError,
    Unavailable,
    UnknownGroup,
)
from .core.feed import Changes, Event, Feed, Rate
from .core.repository import InFlightPage, InstanceLease, InstanceRecord, Repository, Status
from .core.runs import (
    At,
    Changed,
    Claim,
    Claimed,
    ClaimInfo,
    Current,
    Discover,
    Failure,
    Fenced,
    Free,
    Held,
    Hold,
    Holder,
    InSession,
    Kept,
    Lease,
    Migrated,
    Poll,
    Quarantined,
    Release,
    RunStore,
    Seize,
    SessionInfo,
    Wait,
    confirm_write,
)
from .engine.keeper import AsyncKeeper, Keeper, Lost
from .engine.worker import AsyncJob, AsyncWorker, Job, Retry, Unrecoverable, Worker
from .memory import MemoryRepository, MemoryRunStore
from .sessions import AsyncSession, Session
from .shells.aio_store import AsyncPipeline, AsyncRedisRunStore, aconfirm_write
from .shells.repo_aio import AsyncRedisRepository
from .shells.repo_store import RedisRepository
from .shells.store import Pipeline, RedisRunStore

try:
    #: The installed version of the package (its metadata; a bare checkout says so).
    __version__ = _version("redisstore")
except _PackageNotFoundError:  # pragma: no cover - imported from a checkout never installed
    __version__ = "0+unknown"

__all__ = [
    "AlreadyExists",
    "AsyncJob",
    "AsyncKeeper",
    "AsyncPipeline",
    "AsyncRedisRepository",
    "AsyncRedisRunStore",
    "AsyncSession",
    "AsyncWorker",
    "At",
    "Changed",
    "Changes",
    "Claim",
    "ClaimInfo",
    "Claimed",
    "Closed",
    "Compacted",
    "ConcurrentUpdate",
    "Conflict",
    "Corrupt",
    "Current",
    "Discover",
    "Durability",
    "Event",
    "Failure",
    "Feed",
    "Fenced",
    "Free",
    "Held",
    "Hold",
    "Holder",
    "InFlightPage",
    "InSession",
    "InstanceLease",
    "InstanceRecord",
    "Job",
    "Keeper",
    "Kept",
    "Lease",
    "LeaseRefused",
    "Lost",
    "MemoryRepository",
    "MemoryRunStore",
    "Migrated",
    "Misconfigured",
    "NotFound",
    "Pending",
    "Pipeline",
    "Poll",
    "Quarantined",
    "Rate",
    "RedisRepository",
    "RedisRunStore",
    "Release",
    "Repartitioned",
    "Repository",
    "Retry",
    "RunStore",
    "Seize",
    "Session",
    "SessionInfo",
    "SessionLapsed",
    "Status",
    "StoreError",
    "Unavailable",
    "UnknownGroup",
    "Unrecoverable",
    "Wait",
    "Worker",
    "__version__",
    "acl_rule",
    "aconfirm_write",
    "confirm_write",
    "drop_namespace",
    "repartition",
    "repartition_repository",
]
