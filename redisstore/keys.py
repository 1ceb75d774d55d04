"""Key names of a namespace. Every key shares the hash tag ``{namespace}``, so every script
runs in one cluster slot; a store spread over partitions (``partitions=N``) has one hash tag
per partition, ``{namespace#p}`` (and ``{namespace}`` holds only the count). The Lua
scripts build the same names from the prefix (see ``lua/_lib/keys.lua``); keep the two in step."""

from __future__ import annotations

from dataclasses import dataclass, field


def check_namespace(namespace: object) -> str:
    """A namespace: a non-empty str without braces (they would break the hash tag) and
    without ``#`` (it names a partition's hash tag, ``{namespace#p}``: no namespace's keys
    may meet another's partitions)."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
    if not namespace or "{" in namespace or "}" in namespace or "#" in namespace:
        raise ValueError("namespace must be non-empty and without braces or '#', got "
                         f"{namespace!r}")
    return namespace


@dataclass(frozen=True, slots=True)
class Keyspace:
    """The keys of one namespace, ``{namespace}``, or of one of its partitions (``partition``
    p: ``{namespace#p}``) when a store spreads it over partitions."""

    namespace: str
    partition: int | None = None
    #: What every key of the namespace starts with; scripts get it as ARGV[1].
    prefix: str = field(init=False)
    #: Sorted set: held run -> lease expiry (backend ms).
    leases: str = field(init=False)
    #: Sorted set: free run with a fresh wait -> time it is eligible from (backend ms).
    ready: str = field(init=False)

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        if self.partition is not None and (type(self.partition) is not int
                                           or self.partition < 0):
            raise ValueError(f"partition must be an int >= 0 or None, got {self.partition!r}")
        # Computed once: every call of every operation names these keys.
        tag = self.namespace if self.partition is None else f"{self.namespace}#{self.partition}"
        prefix = "{" + tag + "}:"
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "leases", prefix + "leases")
        object.__setattr__(self, "ready", prefix + "ready")

    @property
    def meta(self) -> str:
        """Hash: the namespace's run layout version (``layout``; absent: a namespace never
        written, which starts at 4)."""
        return self.prefix + "meta"

    @property
    def quarantine(self) -> str:
        """Hash: ``index|run`` -> reason, for index entries claims dropped as damaged."""
        return self.prefix + "quarantine"

    @property
    def fanout(self) -> str:
        """Sorted set: dependencies whose many waiters are still being re-indexed."""
        return self.prefix + "fanout"

    def wake(self, kind: str) -> str:
        """Sorted set ``wake-ready`` / ``wake-leases``: wake-up tokens of blocked claimers
        (kind ``"ready"`` or ``"leases"``)."""
        return f"{self.prefix}wake-{kind}"

    def run(self, run: str) -> str:
        """The hash of one run: record, revision, lease, claim info, wait metadata."""
        return self.prefix + "r:" + run

    def dependents(self, dependency: str) -> str:
        """Set of runs whose wait is ``Changed(dependency)`` (up to layout 3)."""
        return f"{self.prefix}d:{dependency}"

    def buckets(self, index: str) -> tuple[str, str]:
        """Layout 4's keys of ``index`` (``"leases"``, ``"ready"``, or ``"d:<dependency>"``):
        its directory (sorted set of the buckets' lower bounds, all scored 0) and the prefix
        of its buckets (the bucket of bound ``b`` is that prefix followed by ``b``; the first
        bucket's bound is ``""``)."""
        if index.startswith("d:"):
            dep = index[2:]
            base = f"{self.prefix}D{len(dep.encode())}:{dep}"
        else:
            base = self.prefix + {"leases": "L", "ready": "Q"}[index]
        return base + "/", base + "|"

    # ------------------------------------------------------------------ instance repository
    # Names chosen apart from the run store's (r:, leases, ready, d:), so a run store and a
    # repository can share a namespace.

    def instance(self, id: str) -> str:
        """The hash of one instance record: payload, group, tenant, lease, version, status."""
        return f"{self.prefix}inst:{id}"

    def inflight(self, group: str) -> str:
        """Sorted set: the group's claimable in-flight instance -> lease expiry (µs since
        the epoch; ``-inf`` without one). Suspended and terminal records are not in it."""
        return f"{self.prefix}inflight:{group}"

    @property
    def groups(self) -> str:
        """Set: the registered engine groups."""
        return self.prefix + "groups"

    @property
    def terminal(self) -> str:
        """Sorted set: terminal instance -> the sequence number of when it became terminal."""
        return self.prefix + "terminal"

    @property
    def terminal_seq(self) -> str:
        """Counter that numbers terminal transitions, for the order of :attr:`terminal`."""
        return self.prefix + "terminal-seq"

    @property
    def layout(self) -> str:
        """The repository layout version ``migrate`` recorded."""
        return self.prefix + "repo-layout"

    @property
    def repo_partitions(self) -> str:
        """The repository's partition count, when it is spread over partitions (its
        partitions' keys are ``{namespace#p}``)."""
        return self.prefix + "repo-partitions"

    @property
    def repo_repartition(self) -> str:
        """While :func:`redisstore.repartition_repository` runs: the counts it moves the
        records from and to (``"4 6"``); repositories of partitions refuse the namespace."""
        return self.prefix + "repo-repartition"
