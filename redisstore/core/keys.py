"""Key names of a namespace: the key schema, defined here only. Every key shares the hash tag
``{namespace}``, so every script runs in one cluster slot; a store spread over partitions
(``partitions=N``) has one hash tag per partition, ``{namespace#p}`` (and ``{namespace}``
holds only the count).

The Lua scripts build the same names from the prefix (``P``, their ARGV[1]): the build
(:data:`redisstore.core.scripts.GENERATED`) writes each entry of the tables below into the
scripts as one Lua ``local`` line, ``local LEASES = P .. 'leases'`` for a key
(:data:`RUN_STORE_KEYS`, :data:`REPOSITORY_KEYS`) and ``local RUN_KEY = 'r:'`` for a part
of the names built from a run, a dependency or a bound (:data:`RUN_STORE_PARTS`,
:data:`REPOSITORY_PARTS`); no Lua file spells them. :class:`Keyspace` builds its names from
the same tables, and tests/lua/test_keys_touched.py holds the names the scripts build to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The run store's keys of a fixed name, by the name the Lua scripts give them (the build
#: writes ``local LEASES = P .. 'leases'``): each is the prefix followed by its suffix here.
RUN_STORE_KEYS: dict[str, str] = {
    "LEASES": "leases",  # Keyspace.leases
    "READY": "ready",  # Keyspace.ready
    "QUARANTINE": "quarantine",  # Keyspace.quarantine
    "FANOUT": "fanout",  # Keyspace.fanout
    "FANOUT_CURSOR": "fanout-cursor",  # Keyspace.fanout_cursor
    "META": "meta",  # Keyspace.meta
    "WAKE_READY": "wake-ready",  # Keyspace.wake("ready")
    "WAKE_LEASES": "wake-leases",  # Keyspace.wake("leases")
    "DEPV": "depv",  # Keyspace.depv
    "OUTBOX": "outbox",  # Keyspace.outbox
    "UNWATCHED": "unwatched",  # Keyspace.unwatched
    "UNWATCH_Q": "unwatch",  # Keyspace.unwatch
    "WATCH_SEQ": "watch-seq",  # Keyspace.watch_seq
    "FEED": "feed",  # the change feed
    "SESSIONS": "sessions",  # Keyspace.sessions: session id -> its record
    "SESSION_LEASES": "session-leases",  # Keyspace.session_leases: id -> expiry
    "SESSION_SEQ": "session-seq",  # Keyspace.session_seq: the last session id given
    "RATES": "rates",  # the feed's per-minute counters (Keyspace.rates)
}

#: The parts of the run store's key names built from a run, a dependency or an index's
#: bound, by the name the Lua scripts give them (the build writes ``local RUN_KEY = 'r:'``;
#: the Lua functions put them together as :class:`Keyspace` does).
RUN_STORE_PARTS: dict[str, str] = {
    # prefix + RUN_KEY + run: a run's string (a hash in layout 1) (Keyspace.run).
    "RUN_KEY": "r:",
    # prefix + DEPS_KEY + dependency: its waiters' set (Keyspace.dependents).
    "DEPS_KEY": "d:",
    # Layout 4's indexes (Keyspace.buckets), which only migrate() reads (lua/_lib/old.lua):
    # the base of each, prefix + LEASES_BUCKETS, prefix + READY_BUCKETS, and for a
    # dependency's waiters prefix + DEPS_BUCKETS + its length in bytes + DEPS_SEP +
    # dependency; an index's directory is its base + BUCKET_DIR, its bucket of bound b its
    # base + BUCKET_AT + b.
    "LEASES_BUCKETS": "L",
    "READY_BUCKETS": "Q",
    "DEPS_BUCKETS": "D",
    "DEPS_SEP": ":",
    "BUCKET_DIR": "/",
    "BUCKET_AT": "|",
    # prefix + WATCH_KEY + run: the partitions watching run (Keyspace.watch).
    "WATCH_KEY": "watch:",
    # prefix + DAMAGED_KEY + name + ":" + time: a damaged key set aside (Keyspace.damaged).
    "DAMAGED_KEY": "damaged:",
    # prefix + SESSION_RUNS + id: the set of runs a session holds (Keyspace.session_runs);
    # prefix + SESSION_TOLD + id: the list of runs taken from it, for its next keepalive.
    "SESSION_RUNS": "s:",
    "SESSION_TOLD": "st:",
}

#: The instance repository's keys of a fixed name, as :data:`RUN_STORE_KEYS` (names apart
#: from the run store's, so a run store and a repository can share a namespace).
REPOSITORY_KEYS: dict[str, str] = {
    "GROUPS": "groups",  # Keyspace.groups
    "TERMINAL": "terminal",  # Keyspace.terminal
    "TERMINAL_SEQ": "terminal-seq",  # Keyspace.terminal_seq
    "REPO_LAYOUT": "repo-layout",  # Keyspace.layout
    "REPO_PARTITIONS": "repo-partitions",  # Keyspace.repo_partitions
    "REPO_REPARTITION": "repo-repartition",  # Keyspace.repo_repartition
}

#: The parts of the repository's key names built from an id or a group, as
#: :data:`RUN_STORE_PARTS`: prefix + INST_KEY + id (Keyspace.instance), prefix +
#: INFLIGHT_KEY + group (Keyspace.inflight).
REPOSITORY_PARTS: dict[str, str] = {"INST_KEY": "inst:", "INFLIGHT_KEY": "inflight:"}

_K, _P = RUN_STORE_KEYS, RUN_STORE_PARTS
_RK, _RP = REPOSITORY_KEYS, REPOSITORY_PARTS
_WAKE = {"ready": _K["WAKE_READY"], "leases": _K["WAKE_LEASES"]}


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
        object.__setattr__(self, "leases", prefix + _K["LEASES"])
        object.__setattr__(self, "ready", prefix + _K["READY"])

    @property
    def meta(self) -> str:
        """Hash: the namespace's run layout version (``layout``, 5, and ``v5``; absent: a
        namespace never written, which starts at 5), ``deleted-rev``, ``deleted-tok``."""
        return self.prefix + _K["META"]

    @property
    def feed(self) -> str:
        """The change feed's stream (docs/design/feed.md)."""
        return self.prefix + _K["FEED"]

    @property
    def rates(self) -> str:
        """Hash: the per-minute counts of claims, finishes and takeovers a namespace with a
        feed keeps (lua/_lib/feed.lua's ``rates_send``): ``c``/``f``/``t`` then the minute's
        slot (its number mod 61), each the minute's number times 2**24 plus its count."""
        return self.prefix + _K["RATES"]

    @property
    def quarantine(self) -> str:
        """Hash: ``index|run`` -> reason, for index entries claims dropped as damaged."""
        return self.prefix + _K["QUARANTINE"]

    @property
    def fanout(self) -> str:
        """Sorted set: dependencies whose many waiters are still being re-indexed."""
        return self.prefix + _K["FANOUT"]

    @property
    def fanout_cursor(self) -> str:
        """Hash: the SSCAN cursor of each dependency of :attr:`fanout`."""
        return self.prefix + _K["FANOUT_CURSOR"]

    def wake(self, kind: str) -> str:
        """Sorted set ``wake-ready`` / ``wake-leases``: wake-up tokens of blocked claimers
        (kind ``"ready"`` or ``"leases"``)."""
        return self.prefix + _WAKE[kind]

    @property
    def sessions(self) -> str:
        """Hash: session id -> its record ``expiry,ttl,cursor,owner`` (docs/design/sessions.md)."""
        return self.prefix + _K["SESSIONS"]

    @property
    def session_leases(self) -> str:
        """Sorted set: session id -> its expiry, while it is live or has runs to hand out."""
        return self.prefix + _K["SESSION_LEASES"]

    @property
    def session_seq(self) -> str:
        """String: the last session id given."""
        return self.prefix + _K["SESSION_SEQ"]

    def session_runs(self, session: str) -> str:
        """Set: the runs the session holds."""
        return self.prefix + _P["SESSION_RUNS"] + session

    def session_told(self, session: str) -> str:
        """List: the runs taken from the session since its last keepalive."""
        return self.prefix + _P["SESSION_TOLD"] + session

    def run(self, run: str) -> str:
        """The string of one run: record, then its header (revision, lease, claim info,
        wait...) and trailer; a hash in layout 1."""
        return self.prefix + _P["RUN_KEY"] + run

    def dependents(self, dependency: str) -> str:
        """Set of runs whose wait is ``Changed(dependency)``."""
        return self.prefix + _P["DEPS_KEY"] + dependency

    def buckets(self, index: str) -> tuple[str, str]:
        """Layout 4's keys of ``index`` (``"leases"``, ``"ready"``, or ``"d:<dependency>"``),
        which only ``migrate()`` reads: its directory (sorted set of the buckets' lower
        bounds, all scored 0) and the prefix of its buckets (the bucket of bound ``b`` is
        that prefix followed by ``b``; the first bucket's bound is ``""``)."""
        if index.startswith("d:"):
            dep = index[2:]
            size = len(dep.encode("utf-8", "surrogateescape"))  # any bytes, as the scripts'
            base = self.prefix + _P["DEPS_BUCKETS"] + str(size) + _P["DEPS_SEP"] + dep
        else:
            base = self.prefix + _P[{"leases": "LEASES_BUCKETS", "ready": "READY_BUCKETS"}[index]]
        return base + _P["BUCKET_DIR"], base + _P["BUCKET_AT"]

    # ------------------------------------------------------------------ partitions
    # A partition's keys for the dependencies across partitions (lua/_lib/keys.lua says
    # what each holds).

    @property
    def depv(self) -> str:
        """Hash: dependency in another partition -> its mirror entry ``v|s|d``."""
        return self.prefix + _K["DEPV"]

    @property
    def outbox(self) -> str:
        """Sorted set: ``<partition>|<run>`` -> the version of run to deliver there."""
        return self.prefix + _K["OUTBOX"]

    @property
    def unwatched(self) -> str:
        """Hash: partition -> the highest watch an unwatch begun here toward it covered."""
        return self.prefix + _K["UNWATCHED"]

    @property
    def unwatch(self) -> str:
        """Sorted set: ``<partition>|<run>`` -> the watch to remove there."""
        return self.prefix + _K["UNWATCH_Q"]

    @property
    def watch_seq(self) -> str:
        """String: the last watch number given in this partition."""
        return self.prefix + _K["WATCH_SEQ"]

    def watch(self, run: str) -> str:
        """Hash: partition with a run waiting on ``run`` -> its latest watch."""
        return self.prefix + _P["WATCH_KEY"] + run

    def damaged(self, name: str) -> str:
        """What the key ``prefix + name`` found damaged is renamed to, but for the time
        (``:<ms>``) that follows."""
        return self.prefix + _P["DAMAGED_KEY"] + name

    # ------------------------------------------------------------------ instance repository
    # Names chosen apart from the run store's (r:, leases, ready, d:), so a run store and a
    # repository can share a namespace.

    def instance(self, id: str) -> str:
        """The hash of one instance record: payload, group, tenant, lease, version, status."""
        return self.prefix + _RP["INST_KEY"] + id

    def inflight(self, group: str) -> str:
        """Sorted set: the group's claimable in-flight instance -> lease expiry (µs since
        the epoch; ``-inf`` without one). Suspended and terminal records are not in it."""
        return self.prefix + _RP["INFLIGHT_KEY"] + group

    @property
    def groups(self) -> str:
        """Set: the registered engine groups."""
        return self.prefix + _RK["GROUPS"]

    @property
    def terminal(self) -> str:
        """Sorted set: terminal instance -> the sequence number of when it became terminal."""
        return self.prefix + _RK["TERMINAL"]

    @property
    def terminal_seq(self) -> str:
        """Counter that numbers terminal transitions, for the order of :attr:`terminal`."""
        return self.prefix + _RK["TERMINAL_SEQ"]

    @property
    def layout(self) -> str:
        """The repository layout version ``migrate`` recorded."""
        return self.prefix + _RK["REPO_LAYOUT"]

    @property
    def repo_partitions(self) -> str:
        """The repository's partition count, when it is spread over partitions (its
        partitions' keys are ``{namespace#p}``)."""
        return self.prefix + _RK["REPO_PARTITIONS"]

    @property
    def repo_repartition(self) -> str:
        """While :func:`redisstore.repartition_repository` runs: the counts it moves the
        records from and to (``"4 6"``); repositories of partitions refuse the namespace."""
        return self.prefix + _RK["REPO_REPARTITION"]
