"""``redisstore``: the command line.

- ``redisstore demo [--url URL] [--namespace NS] [--keep]``: two engine nodes sharing runs
  through one store, on embedded fakeredis by default; it removes what it wrote unless
  ``--keep``.
- ``redisstore inspect --namespace NS [RUN] [--json]``: what a namespace holds (runs, held
  and expired leases, waiting and ready runs, the quarantine, the layout), or one run.
  Reads only, by SCAN in bounded steps.
- ``redisstore doctor [--namespace NS] [--json]``: is this server safe for leases? Each
  finding with its severity and fix; exit 1 when one blocks safe use.
- ``redisstore bench [--ops N] [--json] [--plot PNG]``: each store call's rate and
  latency percentiles, in one table (see :mod:`redisstore.bench`).
- ``redisstore drop --namespace NS --yes``: delete every key of a namespace.
- ``redisstore dashboard [--namespace NS]... [--host H] [--port P] [--allow-actions
  --token-file F] [--demo]``: the operator's web dashboard (:mod:`redisstore.dashboard`);
  ``--demo`` runs it over embedded fakeredis with a workload running.
- ``redisstore --version``.

The server is ``--url``, else ``REDISSTORE_URL``. A URL's credentials are never printed
(:mod:`redisstore.admin.cli`); a failure is one line and exit code 2.

``python -m redisstore`` runs this module and the ``redisstore`` script calls its
:func:`main`: one program, where Python looks for a package's, not a module of its own
with another above it to start it (docs/design/house.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .admin.cli import hide, redact
from .admin.namespaces import drop_namespace, namespace_keys, repository_partitions, spaces_of
from .core.errors import LeaseRefused
from .core.keys import Keyspace, check_namespace
from .core.partitions import partition_of
from .core.runs import Claim, Free, Held, Hold, Release
from .discovery import json_wait
from .shells.store import RedisRunStore


def _client(url: str | None) -> Any:
    if url is None:
        try:
            import fakeredis
        except ImportError:
            sys.exit("the embedded default needs fakeredis: pip install 'redisstore[embedded]'")
        return fakeredis.FakeRedis()
    import redis

    return redis.Redis.from_url(url)


def demo(url: str | None, out: Any = None, *, namespace: str | None = None,
         keep: bool = False) -> int:
    """Run the demo (printing to ``out``, default stdout) in ``namespace`` (default: a new
    ``demo-<hex>``), then remove what it wrote unless ``keep``; a failure is printed,
    without the URL's credentials, and answers 2."""
    return _guarded("demo", url, out, lambda o: _demo(url, o, namespace, keep))


#: The exit code of a command stopped by Ctrl-C (128 + SIGINT, as a shell gives).
INTERRUPTED = 130


def _guarded(command: str, url: str | None, out: Any, body: Callable[[Any], int]) -> int:
    """Run ``body``; a failure is one line, without the URL's credentials, and exit code 2;
    Ctrl-C is one line and exit code 130 (``body`` cleans up in its ``finally``)."""
    out = sys.stdout if out is None else out
    try:
        return body(out)
    except KeyboardInterrupt:
        print(f"redisstore {command}: interrupted", file=out)
        return INTERRUPTED
    except BrokenPipeError:
        raise  # the reader of the output went away (`| head -1`): main ends quietly
    except Exception as exc:
        text = _auth_problem(exc) or hide(f"{type(exc).__name__}: {exc}", url)
        print(f"redisstore {command} failed on {redact(url) if url else 'fakeredis'}: {text}",
              file=out)
        return 2


#: How to give a server its password, for a refused handshake's line.
_HOW_TO_AUTH = ("give it in the URL, redis://:PASSWORD@host:port/db (an ACL user: "
                "redis://USER:PASSWORD@host:port/db), with --url or $REDISSTORE_URL")


def _auth_problem(exc: Exception) -> str | None:
    """The line for a server that refused the connection's authentication, or None.

    redis-py's own text does not say what to do: with no password it is a paragraph about
    ``HELLO`` (RESP3) or ``NOAUTH``, and its text for a wrong password names no URL. The
    store's ``Unavailable`` carries the same text, so the text is what is read."""
    text = str(exc)
    if ("HELLO must be called with the client already authenticated" in text
            or "NOAUTH" in text or "Authentication required" in text):
        return f"the server requires a password: {_HOW_TO_AUTH}"
    if "WRONGPASS" in text or "invalid username-password pair" in text:
        return f"the server refused the URL's user or password: {_HOW_TO_AUTH}"
    return None


def _demo(url: str | None, out: Any, namespace: str | None, keep: bool) -> int:
    """Two nodes share runs: claims, a crash, a takeover, a fenced zombie, a timed wait."""

    def say(text: str) -> None:
        print(text, file=out)

    namespace = f"demo-{uuid.uuid4().hex[:8]}" if namespace is None else namespace
    client = _client(url)
    store = RedisRunStore(client, namespace=namespace, discover=json_wait)
    say(f"store: {'fakeredis (embedded)' if url is None else redact(url)}, "
        f"namespace {namespace!r}")
    cleaned = False
    try:
        claimed = _demo_steps(store, say)
        store.close()
        if keep and url is None:
            say("nothing is kept on embedded fakeredis (it lives in this process): give --url")
        elif keep:
            say(f"kept namespace {namespace!r}: redisstore inspect --url {redact(url or '')} "
                f"--namespace {namespace}")
        else:
            say(f"removed the {drop_namespace(client, namespace)} keys it wrote (--keep "
                "leaves them)")
        cleaned = True
    finally:
        if not cleaned and not keep:
            # Stopped midway (Ctrl-C, a failure): what it wrote goes, as promised.
            store.close()
            drop_namespace(client, namespace)
    return 0 if claimed == ["reminder-7"] else 1


def _demo_steps(store: RedisRunStore, say: Callable[[str], None]) -> list[str]:
    """The demo's story; the runs its last blocked claim took."""
    ttl = 300

    store.insert("order-42", json.dumps({"step": 1}).encode(), Claim("node-a", ttl))
    say(f"node-a inserts order-42 and holds it: {store.get('order-42').holder}")
    store.compare_and_set("order-42", 1, json.dumps({"step": 2}).encode(), Hold("node-a"))
    say(f"node-a writes step 2 under its lease: revision {store.get('order-42').revision}")
    try:
        store.compare_and_set("order-42", 2, b'{"step": 99}', Claim("node-b", ttl))
    except LeaseRefused as refused:
        say(f"node-b tries to claim it: refused, {refused.holder}")
    say(f"node-a renews: {store.renew('node-a', ['order-42'], ttl)}; then node-a crashes")
    time.sleep((ttl + 50) / 1000)
    say(f"after the ttl the lease is {store.get('order-42').holder}")
    say(f"node-b claims expired runs: {store.claim_expired('node-b', ttl, 10)}")
    try:
        store.compare_and_set("order-42", 2, b'{"step": 3, "by": "zombie"}', Hold("node-a"))
    except LeaseRefused as refused:
        say(f"node-a comes back and writes: refused, the lease is {refused.holder}")
    store.compare_and_set("order-42", 2, json.dumps({"step": 3}).encode(), Release())
    say(f"node-b writes step 3 and releases: {store.get('order-42')}")

    due = store.now() + 200
    store.insert("reminder-7", json.dumps({"wait": {"at": due}}).encode(), Release())
    say(f"reminder-7 waits until backend time {due}: claim_ready now gives "
        f"{store.claim_ready('node-b', ttl, 10)}")
    started = time.monotonic()
    claimed = store.claim_ready("node-b", ttl, 10, block=2000)
    waited = (time.monotonic() - started) * 1000
    say(f"claim_ready(..., block=2000) waits and gives {claimed} after {waited:.0f} ms, when "
        f"it is due; claim info {store.get('reminder-7').claim}")
    return list(claimed)


def inspect(url: str | None, namespace: str, run: str | None, as_json: bool,
            out: Any = None, *, scan_limit: int = 100_000) -> int:
    """Print what ``namespace`` holds (or one ``run``); reads only."""
    return _guarded("inspect", url, out,
                    lambda o: _inspect(url, namespace, run, as_json, o, scan_limit))


def run_layout(client: Any, keys: Keyspace) -> int:
    """The run layout a namespace (or a partition, ``keys``) is at, as the scripts read it
    (lua/_lib/layout.lua): 5 where its meta records ``v5``, else its ``layout``; none
    recorded, 1 when its flat indexes exist (a namespace written before layouts were
    recorded: not a partition's), else 5 (never written). A damaged field reads as 0."""
    v5, got = client.hmget(keys.meta, "v5", "layout")
    if v5 is not None:
        return 5
    if got is None:
        return 1 if keys.partition is None and client.exists(keys.leases, keys.ready) else 5
    value = got.decode("ascii", "replace") if isinstance(got, bytes) else str(got)
    return int(value) if value.isdigit() and len(value) <= 7 else 0


def index_keys(client: Any, keys: Keyspace, index: str) -> list[bytes]:
    """The key of run index ``index`` (``"leases"``, ``"ready"``): one sorted set."""
    return [getattr(keys, index).encode()]


def _each(client: Any, keys: list[bytes], command: str, *args: Any) -> list[Any]:
    """``command key *args`` for each key, in one pipelined round trip."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command(command, key, *args)
    return list(pipe.execute())


def _index_score(client: Any, keys: Keyspace, index: str, run: str) -> float | None:
    """The score of ``run``'s entry in ``index``, or ``None``."""
    scores = _each(client, index_keys(client, keys, index), "ZSCORE", run)
    return next((float(s) for s in scores if s is not None), None)


def _index_counts(client: Any, keys: Keyspace, index: str, now: int) -> tuple[int, int]:
    """How many entries ``index`` holds, and how many of them are due by ``now``."""
    found = index_keys(client, keys, index)
    return (sum(_each(client, found, "ZCARD")),
            sum(_each(client, found, "ZCOUNT", "-inf", now)))


def _inspect(url: str | None, namespace: str, run: str | None, as_json: bool, out: Any,
             scan_limit: int) -> int:
    client = _client(url)
    if next(namespace_keys(client, namespace), None) is None:
        # A typo must not look like an empty namespace.
        print(f"redisstore inspect: namespace {namespace!r} has no keys on "
              f"{redact(url) if url else 'fakeredis'} (check its name)", file=out)
        return 1
    spaces = spaces_of(client, namespace)
    store = RedisRunStore(client, namespace=namespace, partitions=len(spaces))
    now = store.now()
    if run is not None:
        keys = spaces[partition_of(run, len(spaces))]
        current = store.get(run)
        holder = current.holder
        expiry = _index_score(client, keys, "leases", run)
        due = _index_score(client, keys, "ready", run)
        report: dict[str, Any] = {
            "run": run, "revision": current.revision, "record_bytes": len(current.record),
            "holder": "free" if isinstance(holder, Free) else holder.owner,
            "live": isinstance(holder, Held) and holder.live,
            "session": current.session,
            "lease_ms_left": None if expiry is None else int(expiry) - now,
            "ready_in_ms": None if due is None else max(int(due) - now, 0),
            "claim": None if current.claim is None else {
                "key": current.claim.key,
                "dependency_revision": current.claim.dependency_revision,
                "claimed_ms_ago": now - current.claim.claimed_at},
            "takeovers": current.takeovers,
        }
    else:
        runs = 0
        truncated = False
        prefixes = tuple(keys.run("").encode() for keys in spaces)
        for key in namespace_keys(client, namespace):
            if key.startswith(prefixes):
                runs += 1
                if runs >= scan_limit:
                    truncated = True
                    break
        layout = run_layout(client, spaces[0])
        counts = [(*_index_counts(client, keys, "leases", now),
                   *_index_counts(client, keys, "ready", now)) for keys in spaces]
        held, held_expired, waiting, ready_now = (sum(c[i] for c in counts) for i in range(4))
        sessions = store.sessions(limit=50)
        # A live session's runs have no lease entry of their own: held, by its count.
        held += sum(s.runs for s in sessions if s.expires > now)
        report = {
            "namespace": namespace, "partitions": len(spaces),
            "repository_partitions": repository_partitions(client, namespace),
            "server_time_ms": now,
            # Below 5 the store refuses it until migrate() (its layout 4 buckets are not
            # counted above).
            "layout": layout,
            "runs": runs, f"runs_counted_only_up_to_{scan_limit}": truncated,
            "held": held, "held_expired": held_expired,
            "waiting": waiting, "ready_now": ready_now,
            "quarantined": [{"index": q.index, "run": q.run, "reason": q.reason}
                            for q in store.quarantined(limit=50)],
            "sessions": [{"id": s.id, "owner": s.owner, "runs": s.runs,
                          "ms_left": max(s.expires - now, 0)} for s in sessions],
        }
    store.close()
    if as_json:
        print(json.dumps(report, indent=2), file=out)
    else:
        width = max(len(k) for k in report)
        for name, value in report.items():
            print(f"{name.replace('_', ' '):<{width}}  {value}", file=out)
    return 0


#: A doctor's finding: its severity ("ok", "info", "warn", or "block": unsafe for leases), what
#: it saw, and what to do.
Finding = tuple[str, str, str]


def doctor(url: str | None, namespace: str, as_json: bool, out: Any = None) -> int:
    """Whether the server is safe for leases: exit 0, or 1 when a finding blocks safe use."""
    return _guarded("doctor", url, out, lambda o: _doctor(url, namespace, as_json, o))


def _ask(call: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return call(), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


#: Clocks of a cluster's primaries further apart than this are worth a warning: leases of
#: namespaces on different nodes are judged by different clocks.
MAX_SKEW_MS = 50


def _primary_clocks(client: Any) -> list[tuple[str, float, float]]:
    """``(node, offset ms, round trip ms)`` of each primary of the cluster ``client`` is a
    node of: its ``TIME`` minus this machine's clock at the middle of the exchange."""
    source = client.connection_pool  # each node's connection made like the client's own
    primaries = sorted({(p[0].decode() if isinstance(p[0], bytes) else str(p[0]), int(p[1]))
                        for _start, _end, p, *_ in client.execute_command("CLUSTER", "SLOTS")})
    samples = []
    for host, port in primaries:
        conn = source.connection_class(**{**source.connection_kwargs,
                                          "host": host or source.connection_kwargs.get("host"),
                                          "port": port})
        try:
            best: tuple[float, float] | None = None
            for _ in range(5):  # the exchange with the shortest round trip says most
                sent = time.time()
                conn.send_command("TIME")
                seconds, micros = (int(x) for x in conn.read_response())
                came = time.time()
                offset = (seconds + micros / 1e6 - (sent + came) / 2) * 1000
                if best is None or (came - sent) * 1000 < best[1]:
                    best = (offset, (came - sent) * 1000)
            assert best is not None
            samples.append((f"{host}:{port}", *best))
        finally:
            conn.disconnect()
    return samples


def clock_skew(samples: list[tuple[str, float, float]]) -> Finding:
    """The finding for the primaries' clocks (``(node, offset ms, round trip ms)`` each):
    how far apart they are, give or take half the longest round trip."""
    if len(samples) < 2:
        return ("ok", "one primary: one clock judges every lease", "")
    offsets = [offset for _, offset, _ in samples]
    skew = max(offsets) - min(offsets)
    slack = max(rtt for _, _, rtt in samples) / 2
    apart = (f"the {len(samples)} primaries' clocks are {skew:.1f} ms apart "
             f"(± {slack:.1f} ms)")
    if skew - slack > MAX_SKEW_MS:
        return ("warn", f"{apart}: each namespace's leases are judged by its own node's "
                "clock, so times read from namespaces on different nodes disagree by that "
                "much", "run NTP (chrony) on every node")
    return ("ok", apart, "")


#: What a server answers to SELECT of a database it does not have (Redis, Valkey).
_NO_SUCH_DATABASE = "DB index is out of range"


def _missing_database(client: Any) -> Finding:
    """The finding for a URL whose database the server does not have: every command on
    the connection fails (its SELECT did), which would read as INFO and TIME denied. How
    many the server has comes from ``CONFIG GET databases`` on database 0."""
    import redis

    pool = client.connection_pool
    db = pool.connection_kwargs.get("db", 0)
    probe = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **{**pool.connection_kwargs, "db": 0}))
    try:
        got, _ = _ask(lambda: probe.config_get("databases"))
    finally:
        probe.close()
    count = str((got or {}).get("databases", ""))
    if count.isdigit():
        return ("block", f"database {db} does not exist on this server (it has {count})",
                f"give a database number below {count} in the URL (0 to {int(count) - 1}; "
                "redis://host:port/0 is the default)")
    return ("block", f"database {db} does not exist on this server (SELECT {db}: "
            f"{_NO_SUCH_DATABASE})", "give a database the server has in the URL "
            "(redis://host:port/0, the default)")


def _print_findings(found: list[Finding], as_json: bool, out: Any) -> int:
    """Print doctor's findings; its exit code: 1 when one blocks safe use, else 0."""
    if as_json:
        print(json.dumps([{"severity": sev, "finding": what, "fix": fix}
                          for sev, what, fix in found], indent=2), file=out)
    else:
        for sev, what, fix in found:
            print(f"{sev.upper():<6} {what}" + (f"\n       fix: {fix}" if fix else ""),
                  file=out)
    return 1 if any(sev == "block" for sev, _, _ in found) else 0


def _doctor(url: str | None, namespace: str, as_json: bool, out: Any) -> int:
    client = _client(url)
    try:  # nothing listening, a wrong password: one line and exit 2, not findings
        client.ping()
    except Exception as exc:
        if type(exc).__name__ not in ("NoPermissionError", "ResponseError"):
            raise  # a user without +ping is connected all the same
        if _NO_SUCH_DATABASE in str(exc):
            # Every later check would fail the same way, and read as denied by the ACL.
            return _print_findings([_missing_database(client)], as_json, out)

    found: list[Finding] = []
    info, denied = _ask(client.info)
    if info is None:
        found.append(("warn", f"INFO is not allowed or failed ({denied}): version, "
                      "persistence, replicas and hz cannot be seen",
                      "run doctor as a user with +info (acl_rule(..., server_checks=True))"))
        info = {}
    version = info.get("valkey_version") or info.get("redis_version")
    if version:
        major_minor = tuple(int(x) for x in str(version).split(".")[:2])
        name = "Valkey" if info.get("valkey_version") else "Redis"
        if name == "Redis" and major_minor < (6, 2):
            found.append(("block", f"Redis {version}: older than 6.2",
                          "upgrade to Redis 6.2 or later (or Valkey 7.2 or later)"))
        else:
            found.append(("ok", f"{name} {version}", ""))
    policy = info.get("maxmemory_policy")
    if policy is None:
        got, _ = _ask(lambda: client.config_get("maxmemory-policy"))
        policy = (got or {}).get("maxmemory-policy")
    if policy is None:
        found.append(("warn", "the eviction policy cannot be read",
                      "make sure maxmemory-policy is noeviction (or volatile-*)"))
    elif str(policy).startswith("allkeys"):
        found.append(("block", f"maxmemory-policy {policy}: a held run may be evicted and "
                      "re-inserted by another node (history lost, two owners)",
                      "CONFIG SET maxmemory-policy noeviction (and in the config file)"))
    else:
        found.append(("ok", f"maxmemory-policy {policy}", ""))
    if "aof_enabled" in info:
        saves, _ = _ask(lambda: client.config_get("save"))
        snapshots = (saves or {}).get("save")
        if int(info["aof_enabled"]):
            found.append(("ok", "AOF on: acknowledged writes survive a restart", ""))
        elif snapshots == "":
            found.append(("warn", "this server persists nothing (save \"\" and appendonly "
                          "no): a restart loses every run and lease",
                          "appendonly yes, appendfsync everysec (or always)"))
        else:
            found.append(("warn", "AOF off: a restart loses the writes since the last "
                          "snapshot (leases and revisions go back)",
                          "appendonly yes, appendfsync everysec (or always)"))
    if "connected_slaves" in info:
        replicas = int(info["connected_slaves"])
        found.append(("ok" if replicas else "warn",
                      f"{replicas} replica(s) connected" + ("" if replicas else ": a "
                      "failure of this server loses it all; Durability(replicas=1) cannot "
                      "confirm"), "" if replicas else "add a replica (and Sentinel or a "
                      "cluster) for failover"))
    if "hz" in info and int(info["hz"]) < 10:
        found.append(("warn", f"hz {info['hz']}: expired keys and timeouts are checked "
                      "rarely", "hz 10 (the default) or more"))
    now, failed = _ask(lambda: client.eval("return redis.call('TIME')", 0))
    if now is None:
        found.append(("block", f"TIME inside a script failed ({failed}): leases are judged "
                      "by the server's clock, read in the scripts",
                      "allow TIME in scripts (grant +time; some managed services forbid it)"))
    else:
        found.append(("ok", "TIME works inside scripts", ""))
    on_cluster = info.get("cluster_enabled") in (1, "1")
    if not info:  # INFO denied: CLUSTER INFO may still say
        state, _ = _ask(lambda: client.execute_command("CLUSTER", "INFO"))
        on_cluster = bool(state) and "cluster_state" in str(state)
    cluster_client = None
    if on_cluster:
        found.append(("ok", "cluster mode: use redis.cluster.RedisCluster; a namespace lives "
                      "in one slot", ""))
        samples, problem = _ask(lambda: _primary_clocks(client))
        found.append(clock_skew(samples) if samples is not None else (
            "warn", f"the primaries' clocks cannot be read ({problem})",
            "run doctor as a user with +cluster|slots and +time"))
        from redis.cluster import RedisCluster

        assert url is not None  # fakeredis is never a cluster
        # The namespace's calls go to its slot's node, whichever node the URL names.
        cluster_client, problem = _ask(lambda: RedisCluster.from_url(url))
        if cluster_client is None:
            found.append(("warn", f"no cluster client can be made ({problem}): the namespace "
                          "is checked on this node alone", "run doctor as a user with "
                          "+cluster|slots, or with the URL of the namespace's node"))
        else:
            client = cluster_client
    spaces, _ = _ask(lambda: spaces_of(client, namespace))
    spaces = spaces or [Keyspace(namespace)]
    store = RedisRunStore(client, namespace=namespace, partitions=len(spaces))
    clock, failed = _ask(store.now)
    if clock is None:
        found.append(("block", f"the store cannot run on namespace {namespace!r} ({failed})",
                      f"grant the user acl_rule(namespace, partitions={len(spaces)})"))
    else:
        layout = run_layout(client, spaces[0])
        spread = f" over {len(spaces)} partitions" if len(spaces) > 1 else ""
        if layout == 5:
            found.append(("ok", f"namespace {namespace!r}{spread}: the store runs; run "
                          "layout 5", ""))
        else:
            found.append(("block", f"namespace {namespace!r}{spread} is at run layout "
                          f"{layout}, which this version refuses (every call raises "
                          "Misconfigured)", "layout 1 to 4: stop every node of the "
                          "namespace, call store.migrate() once with this version, then "
                          "start them (docs/runs.md, Layouts and migrate()); another: "
                          "the version that wrote it"))
        records, _ = _ask(lambda: repository_partitions(client, namespace))
        if records and records > 1:
            found.append(("ok", f"namespace {namespace!r}: its instance repository is spread "
                          f"over {records} partitions", ""))
    store.close()
    if cluster_client is not None:
        cluster_client.close()
    return _print_findings(found, as_json, out)


def bench_command(url: str | None, ops: int, as_json: bool, plot_to: str | None,
                  out: Any = None, *, namespace: str | None = None) -> int:
    """Run :mod:`redisstore.bench` and print its table (or JSON); draw it with ``plot_to``."""
    from .admin import bench

    def body(o: Any) -> int:
        if url is None:
            print("on embedded fakeredis: the figures are the Python side's alone; give "
                  "--url for a server's", file=sys.stderr)
        rows = bench.run(_client(url), ops, bench.progress_line, namespace=namespace,
                         stores=RedisRunStore)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        print(bench.as_json(rows) if as_json else bench.table(rows), file=o)
        if plot_to:
            bench.plot(rows, plot_to)
            print(f"plot: {plot_to}", file=o)
        return 0

    return _guarded("bench", url, out, body)


def drop(url: str | None, namespace: str, yes: bool, out: Any = None) -> int:
    """Delete every key of ``namespace`` (both ports); only with ``yes``."""
    out = sys.stdout if out is None else out
    if not yes:
        print(f"redisstore drop: this deletes every key of namespace {namespace!r} on "
              f"{redact(url) if url else 'fakeredis'}; add --yes to do it", file=out)
        return 2

    def body(o: Any) -> int:
        count = drop_namespace(_client(url), namespace)
        print(f"deleted {count} key{'' if count == 1 else 's'} of namespace {namespace!r}",
              file=o)
        return 0

    return _guarded("drop", url, out, body)


def dashboard(url: str | None, namespaces: list[str], host: str, port: int, *,
              demo: bool = False, allow_actions: bool = False, token: str | None = None,
              out: Any = None, ready: Callable[[int], None] | None = None) -> int:
    """Serve the dashboard on ``host:port`` until Ctrl-C (exit 130); with ``demo``, over a
    workload of its own (on embedded fakeredis unless ``url``; what it wrote on a server
    is removed at the end). ``ready`` is told the port once it listens (0 picks one)."""
    return _guarded("dashboard", url, out, lambda o: _dashboard(
        url, namespaces, host, port, demo, allow_actions, token, o, ready))


def _dashboard(url: str | None, namespaces: list[str], host: str, port: int, demo: bool,
               allow_actions: bool, token: str | None, out: Any,
               ready: Callable[[int], None] | None) -> int:
    import socket

    # The pages and the source side by side, not the package's app(): what the command
    # stands on is one floor over the stores, not three.
    from .dashboard.app import app_of
    from .dashboard.demo import Workload
    from .dashboard.serving import server
    from .dashboard.source import StoreSource

    listening = socket.create_server((host, port))  # taken now: a busy port fails here
    client = _client(url)
    workload = None
    if demo:
        suffix = "" if url is None else f"-{uuid.uuid4().hex[:6]}"
        workload = Workload(client, f"demo-orders{suffix}", f"demo-billing{suffix}",
                            stores=RedisRunStore)
        namespaces = [*namespaces, workload.namespace, workload.quiet]
    label = redact(url) if url else "fakeredis (embedded)"
    import ipaddress

    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    board = app_of(StoreSource(client, namespaces, label=label),
                   allow_actions=allow_actions, token=token, hide=lambda text: hide(text, url),
                   # On loopback only this machine's names: a site whose name another DNS
                   # answer points here gets nothing (DNS rebinding).
                   hosts=("127.0.0.1", "localhost", "::1", host) if loopback else None)
    bound = listening.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    try:
        if workload is not None:
            workload.start()
        print(f"redisstore dashboard on http://{shown}:{bound}/ ({label}; "
              f"{'actions allowed' if allow_actions else 'read-only'}); Ctrl-C stops it",
              file=out, flush=True)
        if ready is not None:
            ready(bound)
        server(board).run_in_foreground([listening])
    finally:
        listening.close()
        if workload is not None:
            workload.stop()
            if url is not None:
                drop_namespace(client, workload.namespace)
                drop_namespace(client, workload.quiet)
        board.dashboard.source.close()
    return 0


def namespace_arg(value: str) -> str:
    """``--namespace``'s check, the one every command uses (as the stores check it): a
    refusal is the command's usage and one message, before any server is reached."""
    try:
        return check_namespace(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "a namespace must not be empty, nor hold braces or '#' (its keys' hash tag is "
            f"{{namespace}}, and '#' names one of its partitions'): got {value!r}") from None


def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``redisstore`` command's parser, and each command's own parser by its name."""
    parser = argparse.ArgumentParser(
        prog="redisstore", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="redisstore: a distributed lease store on Redis and Valkey.",
        epilog="The server is --url, else $REDISSTORE_URL, else embedded fakeredis (demo, "
               "bench and dashboard --demo only). Credentials in a URL are never printed.")
    parser.add_argument("--version", action="version", version=f"redisstore {_installed()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def url_option(command: argparse.ArgumentParser) -> None:
        command.add_argument("--url", default=None,
                             help="redis://[user:password@]host:port/db (default: "
                                  "$REDISSTORE_URL)")

    run_demo = sub.add_parser("demo", help="two engine nodes sharing runs (the default)")
    url_option(run_demo)
    run_demo.add_argument("--namespace", type=namespace_arg,
                          help="where to write (default: demo-<random>)")
    run_demo.add_argument("--keep", action="store_true",
                          help="leave what the demo wrote (to inspect it)")
    run_inspect = sub.add_parser("inspect", help="what a namespace holds, or one run")
    url_option(run_inspect)
    run_inspect.add_argument("--namespace", required=True, type=namespace_arg)
    run_inspect.add_argument("run", nargs="?", help="one run to show")
    run_inspect.add_argument("--json", action="store_true", help="print JSON")
    run_doctor = sub.add_parser("doctor", help="is this server safe for leases? (exit 1 if "
                                "not)")
    url_option(run_doctor)
    run_doctor.add_argument("--namespace", default="redisstore", type=namespace_arg,
                            help="the namespace to check the store on (default: redisstore)")
    run_doctor.add_argument("--json", action="store_true", help="print JSON")
    run_bench = sub.add_parser("bench", help="how long each store call takes, in one table")
    url_option(run_bench)
    run_bench.add_argument("--ops", type=int, default=500, help="calls per operation")
    run_bench.add_argument("--json", action="store_true", help="print JSON")
    run_bench.add_argument("--plot", metavar="PNG", help="draw the percentiles (matplotlib)")
    run_bench.add_argument("--namespace", type=namespace_arg,
                           help="where to write (default: bench-<random>); "
                           "it is removed afterwards")
    run_drop = sub.add_parser("drop", help="delete every key of a namespace")
    url_option(run_drop)
    run_drop.add_argument("--namespace", required=True, type=namespace_arg)
    run_drop.add_argument("--yes", action="store_true", help="really delete")
    run_dashboard = sub.add_parser("dashboard", help="the operator's web dashboard")
    url_option(run_dashboard)
    run_dashboard.add_argument("--namespace", action="append", default=[],
                               type=namespace_arg, help="a namespace to show (repeat it for "
                               "more; others are found by a scan the page offers)")
    run_dashboard.add_argument("--host", default="127.0.0.1",
                               help="the address to listen on (default: 127.0.0.1, this "
                                    "machine only)")
    run_dashboard.add_argument("--port", type=int, default=8080,
                               help="the port to listen on (default: 8080; 0: any free one)")
    run_dashboard.add_argument("--allow-actions", action="store_true",
                               help="let an operator who gives the token release, restore "
                                    "and delete runs (default: read-only)")
    run_dashboard.add_argument("--token-file", metavar="F",
                               help="the file holding the operator's token (with "
                                    "--allow-actions)")
    run_dashboard.add_argument("--demo", action="store_true",
                               help="run a demo workload and show it (embedded fakeredis "
                                    "unless --url)")
    return parser, {"demo": run_demo, "inspect": run_inspect, "doctor": run_doctor,
                    "bench": run_bench, "drop": run_drop, "dashboard": run_dashboard}


#: The exit code of a command whose reader went away (``redisstore demo | head -1``):
#: 128 + SIGPIPE, what a shell reports for a command a closed pipe ended.
BROKEN_PIPE = 141


def _installed() -> str:
    """The installed version of the package (``redisstore.__version__``)."""
    try:
        return version("redisstore")
    except PackageNotFoundError:  # pragma: no cover - a checkout that was never installed
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``redisstore`` command. A closed stdout ends it quietly, with
    exit code :data:`BROKEN_PIPE` (what it was doing cleans up in its ``finally``)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python flushes stdout once more at exit, which would fail again and print
        # "Exception ignored": point it at the null device (the standard recipe).
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):
            return BROKEN_PIPE  # not a file (a test's StringIO): nothing is flushed at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        return BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser, commands = parsers()
    run_inspect, run_doctor = commands["inspect"], commands["doctor"]
    run_bench, run_drop = commands["bench"], commands["drop"]
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # parse_args would report them from the top-level parser, whose usage line says
        # nothing of the command's own options.
        commands.get(args.command, parser).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    url = getattr(args, "url", None) or os.environ.get("REDISSTORE_URL") or None
    if args.command == "inspect":
        if url is None:
            run_inspect.error("inspect needs a server: --url or $REDISSTORE_URL")
        return inspect(url, args.namespace, args.run, args.json)
    if args.command == "doctor":
        if url is None:
            run_doctor.error("doctor needs a server: --url or $REDISSTORE_URL")
        return doctor(url, args.namespace, args.json)
    if args.command == "bench":
        if args.ops < 1:
            run_bench.error("--ops must be 1 or more")
        if args.plot:
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:
                run_bench.error("--plot needs matplotlib: pip install 'redisstore[plot]'")
        return bench_command(url, args.ops, args.json, args.plot, namespace=args.namespace)
    if args.command == "drop":
        if url is None:
            run_drop.error("drop needs a server: --url or $REDISSTORE_URL")
        return drop(url, args.namespace, args.yes)
    if args.command == "dashboard":
        return _dashboard_args(commands["dashboard"], args, url)
    return demo(url, namespace=getattr(args, "namespace", None),
                keep=getattr(args, "keep", False))


def _dashboard_args(command: argparse.ArgumentParser, args: argparse.Namespace,
                    url: str | None) -> int:
    """The dashboard command's checks, each a usage error before anything starts."""
    import importlib.util

    missing = [m for m in ("starlette", "jinja2", "uvicorn")
               if importlib.util.find_spec(m) is None]
    if missing:
        command.error(f"the dashboard needs {', '.join(missing)}: pip install "
                      "'redisstore[dashboard]'")
    if url is None and not args.demo:
        command.error("dashboard needs a server: --url or $REDISSTORE_URL (or --demo, on "
                      "embedded fakeredis)")
    if not 0 <= args.port <= 65535:
        command.error("--port must be between 0 and 65535")
    token = None
    if args.allow_actions:
        if not args.token_file:
            command.error("--allow-actions needs --token-file: the operator's token")
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            command.error(f"cannot read --token-file: {exc.strerror}")
        if len(token or "") < 16:
            command.error("the token file must hold a token of 16 characters or more")
    elif args.token_file:
        command.error("--token-file is for --allow-actions")
    return dashboard(url, args.namespace, args.host, args.port, demo=args.demo,
                     allow_actions=args.allow_actions, token=token)


if __name__ == "__main__":
    sys.exit(main())
