"""The keys the scripts touch: every header has its fields in order and declares its keys;
each script reads and writes the KEYS it declares (or keys derived from its prefix that its
header lists), nothing outside its slot, on every backend; and acl_rule grants every command
the scripts send."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import old_layouts
import pytest
from old_layouts import OldRun
from redis.crc import key_slot
from servers import backend_client, unique_namespace

from redisstore import (
    At,
    Changed,
    Claim,
    Conflict,
    Failure,
    Fenced,
    Hold,
    InstanceLease,
    InstanceRecord,
    Misconfigured,
    Poll,
    RedisRepository,
    RedisRunStore,
    Release,
    Seize,
    Status,
)
from redisstore.core import driver as protocol
from redisstore.core import keys as keys_module
from redisstore.core import runops, scripts
from redisstore.core.driver import Call
from redisstore.core.keys import Keyspace
from redisstore.core.partitions import partition_of
from redisstore.runs import Wait
from redisstore.shells.sync import Pool

LONG = 600_000
LUA = Path(str(scripts.lua_dir()))



# ---------------------------------------------------------------------------- headers

_ENTRY = r"(?:KEYS|ARGV)\[\d+(?:\.\.\d*)?\]"
_EXPR = re.compile(r"""P(?:\s*\.\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z_]\w*))*""")


@dataclass
class Header:
    """The fields of a script's header."""

    name: str
    lines: list[str]
    #: KEYS[i] -> its description ('P.."leases" (names the slot; not read)').
    keys: dict[int, str] = field(default_factory=dict)
    #: ARGV[i] -> its description.
    argv: dict[int, str] = field(default_factory=dict)
    #: Field -> the indexes of the lines it starts on.
    fields: dict[str, list[int]] = field(default_factory=dict)


def header(name: str, text: str | None = None) -> Header:
    if text is None:
        text = (LUA / f"{name}.lua").read_text()
    head = Header(name, scripts.header_lines(text))
    for i, line in enumerate(head.lines):
        kind = next((k for k, p in (("KEYS", "-- KEYS["), ("ARGV", "-- ARGV["),
                                    ("Reply", "-- Reply"), ("Also", "-- Also "),
                                    ("include", "--- @include")) if line.startswith(p)), None)
        if kind is not None:
            head.fields.setdefault(kind, []).append(i)
        if kind in ("KEYS", "ARGV"):
            for m in re.finditer(rf"({_ENTRY})\s+(.*?)(?=\s+{_ENTRY}|$)", line[3:]):
                index = int(re.findall(r"\d+", m.group(1))[0])
                (head.keys if kind == "KEYS" else head.argv)[index] = m.group(2).strip()
    return head


def lint(head: Header) -> list[str]:
    """What is wrong with a header's fields: every script's has KEYS, ARGV, Reply and its
    includes, in this order, each KEYS entry a key expression and ARGV[1] the prefix."""
    problems = []
    if not head.lines or not head.lines[0].startswith(f"-- {head.name}:"):
        problems.append("the first line is not `-- <name>: what it does`")
    spans = {kind: head.fields.get(kind, []) for kind in ("KEYS", "ARGV", "Reply", "include")}
    for kind, where in spans.items():
        if not where:
            problems.append(f"no {kind} field")
    if all(spans.values()):
        order = [spans["KEYS"], spans["ARGV"], spans["Reply"], spans["include"]]
        for before, after in itertools.pairwise(order):
            if max(before) > min(after):
                problems.append(f"fields out of order: line {max(before) + 1} after line "
                                f"{min(after) + 1}")
        if spans["include"] != list(range(min(spans["include"]), len(head.lines))):
            problems.append("the include lines are not the header's last lines")
    if sorted(head.keys) != list(range(1, len(head.keys) + 1)):
        problems.append(f"KEYS entries {sorted(head.keys)} are not KEYS[1..n]")
    for index, text in head.keys.items():
        if not _EXPR.match(text):
            problems.append(f"KEYS[{index}] `{text}` is not a key expression like P..\"name\"")
    if not head.argv.get(1, "").startswith("key prefix"):
        problems.append("ARGV[1] is not the key prefix")
    return problems


SCRIPT_NAMES = [s.name for s in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS)]


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_header_has_keys_argv_reply_and_includes_in_order(name: str) -> None:
    assert lint(header(name)) == []


def test_every_script_of_the_folder_is_built() -> None:
    files = sorted(p.stem for p in LUA.glob("*.lua") if not p.stem.startswith("_"))
    assert files == sorted(SCRIPT_NAMES)


@pytest.mark.parametrize(("text", "expected"), [
    ("-- s: x\n-- ARGV[1]  key prefix\n-- KEYS[1]  P..'k'\n-- Reply  1\n--- @include\n",
     "fields out of order"),
    ("-- s: x\n-- KEYS[1]  P..'k'\n-- ARGV[1]  key prefix\n--- @include\n-- Reply  1\n",
     "fields out of order"),
    ("-- s: x\n-- KEYS[1]  P..'k'\n-- ARGV[1]  key prefix\n-- Reply  1\n", "no include"),
    ("-- s: x\n-- KEYS[1]  the hash\n-- ARGV[1]  key prefix\n-- Reply  1\n--- @include\n",
     "is not a key expression"),
    ("-- s: x\n-- KEYS[2]  P..'k'\n-- ARGV[1]  key prefix\n-- Reply  1\n--- @include\n",
     "not KEYS[1..n]"),
    ("-- s: x\n-- KEYS[1]  P..'k'\n-- ARGV[1]  run\n-- Reply  1\n--- @include\n",
     "ARGV[1] is not the key prefix"),
    ("-- t: x\n-- KEYS[1]  P..'k'\n-- ARGV[1]  key prefix\n-- Reply  1\n--- @include\n",
     "the first line"),
])
def test_the_header_lint_finds_each_fault(text: str, expected: str) -> None:
    assert any(expected in p for p in lint(header("s", text))), lint(header("s", text))


def prefix_of(arg: str) -> str:
    """The key prefix of an ARGV[1]: a partition's is followed by the store's count."""
    return arg[:arg.index("}:") + 2] if "}:" in arg else arg


def expected_key(head: Header, index: int, argv: tuple[str, ...]) -> str:
    """KEYS[index] of ``head`` with the arguments sent: P is ARGV[1], a name the ARGV entry
    whose description starts with it."""
    expr = _EXPR.match(head.keys[index])
    assert expr, (head.name, index)
    out = []
    for part in re.split(r"\s*\.\.\s*", expr.group()):
        if part == "P":
            out.append(prefix_of(argv[0]))
        elif part[0] in "\"'":
            out.append(part[1:-1])
        else:
            named = [i for i, d in head.argv.items() if re.match(rf"{part}\b", d)]
            assert named, f"{head.name}: KEYS[{index}] names {part}, which no ARGV entry is"
            out.append(argv[named[0] - 1])
    return "".join(out)


def test_a_key_expression_is_read_with_the_arguments_sent() -> None:
    head = header("s", '-- s: x\n-- KEYS[1]  P.."r:"..run   KEYS[2] P..\'leases\' (not read)\n'
                       "-- ARGV[1]  key prefix  ARGV[2] run\n-- Reply  1\n--- @include\n")
    assert expected_key(head, 1, ("{n}:", "a")) == "{n}:r:a"
    assert expected_key(head, 2, ("{n}:", "a")) == "{n}:leases"


def test_every_header_key_is_a_name_of_the_schema() -> None:
    """The headers' key expressions (P.."leases", P.."r:"..run) are names the schema makes."""
    k = keys_module
    parts = k.RUN_STORE_PARTS
    made = {*k.RUN_STORE_KEYS.values(), *k.REPOSITORY_KEYS.values(),
            *k.REPOSITORY_PARTS.values(), parts["RUN_KEY"], parts["DEPS_KEY"],
            parts["WATCH_KEY"],
            *(parts[base] + parts[end] for base in ("LEASES_BUCKETS", "READY_BUCKETS")
              for end in ("BUCKET_DIR", "BUCKET_AT"))}
    for name in SCRIPT_NAMES:
        for index, text in header(name).keys.items():
            expr = _EXPR.match(text)
            assert expr, (name, index)
            literals = re.findall(r"""\.\.\s*(?:"([^"]*)"|'([^']*)')""", expr.group())
            assert literals, (name, index, text)
            assert literals[0][0] + literals[0][1] in made, (name, index, text)


# ---------------------------------------------------------------------------- keys

# The keys of each command the scripts send: the first argument, every argument, none.
FIRST_KEY = frozenset({
    "GET", "SET", "SETRANGE", "GETRANGE", "STRLEN", "INCR", "INCRBY", "APPEND", "TYPE", "HGET",
    "HMGET", "HSET", "HDEL", "HEXISTS", "HSCAN", "HSTRLEN", "HLEN", "HGETALL", "HSETNX",
    "HINCRBY", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZCARD", "ZCOUNT", "ZRANK",
    "ZMSCORE", "ZRANGEBYLEX", "ZREVRANGEBYLEX", "ZREMRANGEBYRANK", "SADD", "SREM", "SSCAN",
    "SISMEMBER", "SCARD", "SMEMBERS", "SRANDMEMBER", "RPUSH", "HKEYS", "ZRANDMEMBER",
    "LLEN", "LRANGE", "LTRIM",
    # A sharded channel is routed as a key: it must be in the script's slot, as keys are.
    "SPUBLISH",
})
ALL_KEYS = frozenset({"DEL", "EXISTS", "UNLINK", "TOUCH", "MGET", "RENAME"})
#: Commands whose key follows a subcommand (MEMORY USAGE key).
SECOND_KEY = frozenset({"MEMORY"})
NO_KEYS = frozenset({"TIME", "SCAN", "PING"})
WRITES = frozenset({
    "SET", "SETRANGE", "INCR", "INCRBY", "APPEND", "HSET", "HDEL", "HSETNX", "HINCRBY", "ZADD",
    "ZREM", "ZREMRANGEBYRANK", "SADD", "SREM", "DEL", "UNLINK", "RPUSH", "RENAME", "LTRIM",
})

TRACE = "__trace"

# Ahead of an instrumented script: a local `redis` that notes every command it is given.
_SHADOW = r"""local __real, __trace = redis, {}
local function __note(...)
  local args = {...}
  for i = 1, #args do args[i] = tostring(args[i]) end
  __trace[#__trace + 1] = table.concat(args, '\0')
end
local redis = setmetatable({
  call = function(...) __note(...) return __real.call(...) end,
  pcall = function(...) __note(...) return __real.pcall(...) end,
}, {__index = __real})
"""


def instrumented(script_: scripts.Script) -> scripts.Script:
    """``script_`` with its body run as a function, and each command it sent pushed to
    ARGV[1].."__trace" after it: its name, its KEYS, then one entry per command."""
    lines = script_.source.decode().split("\n")
    start = next(i for i, (file, _) in enumerate(script_.lines)
                 if file in (f"{script_.name}.lua", "<slow path>"))
    source = "\n".join([
        _SHADOW, *lines[:start], "local __reply = (function()", *lines[start:], "end)()",
        "__real.call('RPUSH', string.sub(ARGV[1], 1, string.find(ARGV[1], '}:', 1, true) + 1)"
        f" .. '{TRACE}', '{script_.name}', "
        "table.concat(KEYS, '\\0'), unpack(__trace))", "return __reply"]).encode()
    return scripts.Script(script_.name, source, hashlib.sha1(source).hexdigest())


@dataclass
class Run:
    """One execution of a script: what it was sent and the commands it sent."""

    name: str
    keys: tuple[str, ...]
    commands: list[list[str]]


@dataclass
class Sent:
    """One EVALSHA as a batch carried it."""

    name: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Sent]]:
    """Every script instrumented; yields the EVALSHAs the driver sends."""
    by_sha: dict[bytes, str] = {}
    for attr, value in list(vars(scripts).items()):
        if isinstance(value, scripts.Script):
            new = instrumented(value)
            by_sha[new.sha.encode()] = new.name
            monkeypatch.setattr(scripts, attr, new)
    for group in ("RUN_SCRIPTS", "REPO_SCRIPTS"):
        monkeypatch.setattr(scripts, group, tuple(getattr(scripts, s.name.upper())
                                                  for s in getattr(scripts, group)))
    # The scripts that fuse a call with the next claim, kept by name when runops loaded.
    for first, both in list(runops.FUSED.items()):
        monkeypatch.setitem(runops.FUSED, first, getattr(scripts, both.name.upper()))
    sent: list[Sent] = []
    last: list[Call[Any]] = []
    original = protocol.Driver._batch_of

    def batch_of(self: protocol.Driver[Any], call: Call[Any]) -> protocol.Batch:
        batch = original(self, call)
        command = batch.commands[0]
        if command[0] == b"EVALSHA" and not (last and last[-1] is call):  # not a resend
            last[:] = [call]
            n = int(command[2])
            text = [c.decode() if isinstance(c, bytes) else str(c) for c in command[3:]]
            assert isinstance(command[1], bytes)
            sent.append(Sent(by_sha[command[1]], tuple(text[:n]), tuple(text[n:])))
        return batch

    monkeypatch.setattr(protocol.Driver, "_batch_of", batch_of)
    # The lean path (transport._lean_drive) sends plain calls without a Driver: every call
    # here goes through one, where it is seen.
    monkeypatch.setattr(Pool, "take_lean", lambda self: None)
    yield sent


def runs_of(client: Any, prefix: str) -> list[Run]:
    """The executions the instrumented scripts noted under ``prefix``."""
    entries = [e.decode() for e in client.lrange(prefix + TRACE, 0, -1)]
    runs: list[Run] = []
    names = {s.name for s in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS)}
    i = 0
    while i < len(entries):
        assert entries[i] in names, entries[i]
        run = Run(entries[i], tuple(entries[i + 1].split("\0")), [])
        i += 2
        while i < len(entries) and entries[i] not in names:
            run.commands.append(entries[i].split("\0"))
            i += 1
        runs.append(run)
    return runs


def touched(command: list[str]) -> tuple[list[str], bool]:
    """The keys a command names and whether it writes."""
    name = command[0].upper()
    assert name in FIRST_KEY | ALL_KEYS | NO_KEYS | SECOND_KEY, (
        f"{name}: add it to the key table of tests/lua/test_keys_touched.py")
    keys = (command[1:2] if name in FIRST_KEY else command[1:] if name in ALL_KEYS
            else command[2:3] if name in SECOND_KEY else [])
    return keys, name in WRITES


def key_problems(sent: list[Sent], runs: list[Run], prefix: str) -> list[str]:
    """Where the scripts' keys disagree with their headers."""
    problems = []
    heads = {name: header(name) for name in {s.name for s in sent}}
    for call in sent:
        head = heads[call.name]
        if prefix_of(call.argv[0]) != prefix:
            problems.append(f"{call.name}: ARGV[1] {call.argv[0]!r} is not the prefix")
        if len(call.keys) != len(head.keys):
            problems.append(f"{call.name}: sent {len(call.keys)} KEYS, the header declares "
                            f"{len(head.keys)}")
            continue
        for i, key in enumerate(call.keys, 1):
            want = expected_key(head, i, call.argv)
            if key != want:
                problems.append(f"{call.name}: KEYS[{i}] is {key!r}, the header says {want!r}")
    used: dict[str, set[int]] = {}
    for run in runs:
        head = heads.get(run.name) or header(run.name)
        slot = key_slot(run.keys[0].encode())
        also = "\n".join(head.lines[i] for i in head.fields.get("Also", []))
        for command in run.commands:
            for key in touched(command)[0]:
                if key in run.keys:
                    used.setdefault(run.name, set()).add(run.keys.index(key) + 1)
                    continue
                if key == prefix + TRACE:
                    continue
                if not key.startswith(prefix) or key_slot(key.encode()) != slot:
                    problems.append(f"{run.name}: touches {key!r}, outside its KEYS' slot")
                write = touched(command)[1]
                if not re.search(r"^-- Also touches\b" if write else r"^-- Also (touches|reads)\b",
                                 also, re.M) or "same hash tag" not in also:
                    problems.append(
                        f"{run.name}: {'writes' if write else 'reads'} {key!r} ({command[0]}), "
                        "not in its KEYS, and its header has no `-- Also "
                        f"{'touches' if write else 'reads'}, undeclared (same hash tag): ...` "
                        "line")
    for name in {run.name for run in runs}:
        head = heads.get(name) or header(name)
        for i, text in head.keys.items():
            if i not in used.get(name, set()) and "not read" not in text:
                problems.append(f"{name}: declares KEYS[{i}] {text!r} but never touched it")
    return sorted(set(problems))


def test_the_key_check_finds_each_fault() -> None:
    prefix = "{n}:"
    good = Sent("run_get", (prefix + "r:a", prefix + "meta"), (prefix, "a"))
    assert key_problems([good], [Run("run_get", good.keys, [["HGET", prefix + "r:a", "x"],
                                                            ["HGET", prefix + "meta", "l"]])],
                        prefix) == []
    wrong = [replace(good, keys=(prefix + "r:b", prefix + "meta")),
             replace(good, keys=(prefix + "r:a",)), replace(good, argv=("{m}:", "a"))]
    for bad in wrong:
        assert key_problems([bad], [], prefix), bad
    outside = Run("run_get", good.keys, [["HGET", prefix + "r:a", "x"],
                                         ["HGET", prefix + "meta", "x"], ["GET", "{m}:x"]])
    assert any("outside its KEYS' slot" in p for p in key_problems([good], [outside], prefix))
    untold = Run("run_get", good.keys, [["HGET", prefix + "r:a", "x"],
                                        ["HGET", prefix + "meta", "x"],
                                        ["HSET", prefix + "r:b", "x", "1"]])
    assert any("no `-- Also touches" in p for p in key_problems([good], [untold], prefix))
    unread = Run("run_get", good.keys, [["HGET", prefix + "r:a", "x"]])
    assert any("never touched" in p for p in key_problems([good], [unread], prefix))
    with pytest.raises(AssertionError, match="add it to the key table"):
        touched(["BITOP", "AND", "x", "y"])


def discover(record: bytes) -> Wait | None:
    kind, _, arg = record.decode().partition(":")
    return {"dep": lambda: Changed(arg), "poll": lambda: Poll(arg, 1),
            "at": lambda: At(0)}.get(kind, lambda: None)()


def run_store_scenario(client: Any) -> str:
    """Every operation of the run store, through the paths that touch each key its script
    declares and the others: first the migration of what a library of layout 4 left
    (buckets, a fan-out under way) and of a damaged run; a dependency and its waiters, a
    poll key, damaged index entries, expiry, leases taken and given back by writes,
    finishes of each kind, the quarantine (poison and failed runs) and restore, deletes of
    held and ready runs, and pipelines that fuse a finish, a write or a release with the
    next claim."""
    store = RedisRunStore(client, namespace=unique_namespace(), discover=discover)
    keys = Keyspace(store.namespace)
    old = {"old-held": OldRun(record=b"plain", own="a", exp=LONG),
           "old-ready": OldRun(record=b"at:", wk="a", wn=0, wrev=1, wpv=1, ready=0),
           "old-wait": OldRun(record=b"dep:old-dep", wk="c", wa="old-dep", wrev=1, wpv=1),
           "old-dep": OldRun(record=b"plain")}
    old_layouts.write(client, store.namespace, 4, old, fanout={"old-dep": b"bold-wait"})
    client.set(keys.run("old-bad"), "damaged")
    store.migrate()
    store.insert("d", b"plain", Claim("a", LONG))
    store.insert("w", b"dep:d", Release())
    store.insert("p", b"poll:k", Release())
    store.insert("t", b"at:", Release())
    store.compare_and_set("d", 1, b"plain", Claim("a", LONG))
    store.get("d")
    store.get_many(["d", "w", "absent"])
    store.now()
    store.renew("a", ["d", "w"], LONG)
    client.zadd(keys.ready, {"ghost": 0})
    store.claim_ready("b", LONG, 10)
    store.insert("e", b"plain", Claim("a", 1))
    client.zadd(keys.leases, {"ghost": 0})
    time.sleep(0.01)
    store.claim_expired("b", LONG, 10)
    store.insert("f", b"plain", Claim("a", 1))
    client.zadd(keys.ready, {"ghost2": 0})
    time.sleep(0.01)
    store.claim("b", LONG, 10)
    store.refresh("w")
    store.quarantined()
    # A store of partitions checks the namespace's count (run_partitions) where its
    # partition records none, and refuses this one, which a store of one partition uses.
    with contextlib.suppress(Misconfigured):
        RedisRunStore(client, namespace=store.namespace, partitions=2).get("d")
    heads = getattr(store._ops, "heads", None)  # what a store of partitions reads first
    if heads is not None:
        store._io.drive(heads("ready", 10))
        store._io.drive(heads("leases", 10))
        store._io.drive(heads("any", 10))
    migrate: Callable[[], Any] | None = getattr(store, "migrate", None)
    if migrate is not None:
        migrate()
    # A write that takes a lease out of the ready index, then one that gives it back.
    store.insert("c", b"at:", Release())
    store.compare_and_set("c", 1, b"at:", Claim("a", LONG))
    store.compare_and_set("c", 2, b"at:", Release())
    store.refresh("c")  # free, with a wait: re-placed in the ready index
    store.compare_and_set("d", 2, b"plain", Release())
    store.get("d")
    # A poison run quarantined and put back by release, another by restore; a release that
    # makes a run ready; a dependency deleted and inserted again.
    store.insert("x", b"plain", Claim("a", 1))
    store.insert("z", b"at:", Claim("a", 1))
    time.sleep(0.01)
    store.claim_expired("b", LONG, 10, max_takeovers=0)
    store.release("a", ["x", "d"])
    store.restore("z")
    store.insert("y", b"at:", Claim("b", LONG))
    store.release("b", ["y"])
    store.delete("d", 3, Release())
    store.insert("d", b"plain", Release())
    # Deletes of a held run and of a ready one: each index entry goes. (Inserts after a
    # delete start above its revision and token: each call names what the run has.)
    revision = store.insert("gone-held", b"plain", Claim("a", LONG))
    store.delete("gone-held", revision, Release())
    store.delete("y", 1, Release())

    def fence(run: str) -> tuple[int, Fenced]:
        current = store.get(run)
        assert current.token is not None
        return current.revision, Fenced("a", current.token)

    # Finishes of each kind: with a record, without, with a failure (held back), with a
    # final one (quarantined as failed, then restored).
    for run in ("f1", "f2", "f3", "f4"):
        store.insert(run, b"at:", Claim("a", LONG))
    store.finish("f1", *fence("f1"), record=b"at:")
    store.finish("f2", *fence("f2"))
    store.finish("f3", *fence("f3"), failure=Failure("boom", delay=LONG))
    store.finish("f4", *fence("f4"), failure=Failure("boom", final=True))
    store.restore("f4")
    store.restore("f1")  # not quarantined: nothing written
    # Pipelines that fuse a finish, a write, a release with the claim after it (run_*_claim):
    # each first with a claim of expired leases and with one that reads the ready index
    # (the fanout key too), and a finish refused (the claim then goes alone).
    runs = [f"g{i}" for i in range(7)]
    for run in runs:
        store.insert(run, b"at:", Claim("a", LONG))
    fences = {run: fence(run) for run in runs}
    with store.pipeline() as pipe:
        pipe.finish("g0", *fences["g0"], record=b"at:")
        pipe.claim("a", LONG, 1)
        pipe.finish("g1", *fences["g1"])
        pipe.claim_expired("a", LONG, 1)
        pipe.compare_and_set("g2", fences["g2"][0], b"at:", Release())
        pipe.claim_ready("a", LONG, 1, records=True)
        pipe.compare_and_set("g3", fences["g3"][0], b"at:", Hold("a"))
        pipe.claim_expired("a", LONG, 1)
        pipe.release("a", ["g4"])
        pipe.claim("a", LONG, 1)
        pipe.release("a", ["g5"])
        pipe.claim_expired("a", LONG, 1)
        refused = pipe.finish("g6", fences["g6"][0] + 5, fences["g6"][1])
        pipe.claim("a", LONG, 1)
    with pytest.raises(Conflict):
        refused.result()
    if heads is not None:
        store._io.drive(heads("ready", 10))
        store._io.drive(heads("leases", 10))
    # Sessions: runs taken under one by each claim and by InSession writes, one seized from
    # it (told at the keepalive), renewed, released, deleted; the listing; one that lapses
    # (its runs put into the leases index and taken over), and a close.
    if hasattr(store, "open_session"):
        session = store.open_session("s", LONG)
        for run in ("s1", "s2", "s3"):
            store.insert(run, b"at:", Release())
        session.claim(1)
        session.claim_ready(1)
        s4 = store.insert("s4", b"plain", session.lease)
        s3 = store.get("s3").revision
        store.compare_and_set("s3", s3, b"plain", session.lease)
        store.compare_and_set("s4", s4, b"plain", Seize("b", LONG))
        store.renew("s", ["s1"], LONG)
        session.keepalive()
        store.release("s", ["s2"])
        store.delete("s3", s3 + 1, Release())
        session.claim_expired(1)
        store.sessions()
        short = store.open_session("s", 200)
        store.insert("s5", b"plain", short.lease)
        time.sleep(0.25)
        store.claim_expired("b", LONG, 10)
        session.close()
        short.close()
    # The per-minute counts' read (run_rates), which store.rates() sends only on a store
    # with a feed: this namespace has none, so its counters' key is absent.
    store._io.drive(store._ops.rates_read(5))  # type: ignore[union-attr]
    return keys.prefix


T0 = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def repository_scenario(client: Any) -> str:
    """Every operation of the repository, with a group change and a terminal eviction."""
    repo = RedisRepository(client, namespace=unique_namespace(), max_terminal=1)
    repo.migrate()
    repo.register_group("g1")
    repo.register_group("g2")
    repo.group_exists("g1")
    lease = InstanceLease(expiry=T0, owner="o", incarnation=1)
    first = InstanceRecord(id="i1", payload=b"x", group="g1", lease=lease)
    repo.save(first)
    repo.save(replace(first, rec_version=1, group="g2"))
    repo.list_in_flight("g2", T0 + timedelta(hours=1))
    for id in ("i2", "i3"):
        repo.save(InstanceRecord(id=id, payload=b"x", group="g1", status=Status.COMPLETED))
    repo.load("i1")
    repo.load("nothing")
    repo.delete("i1")
    repo.delete("nothing")
    return Keyspace(repo.namespace).prefix


@pytest.mark.parametrize("backend", ["fakeredis",
                                     pytest.param("redis7", marks=pytest.mark.server)])
@pytest.mark.parametrize(("scenario", "group"), [(run_store_scenario, "RUN_SCRIPTS"),
                                                  (repository_scenario, "REPO_SCRIPTS")])
def test_scripts_read_the_keys_they_declare(request: pytest.FixtureRequest, backend: str,
                                           traced: list[Sent], scenario: Any,
                                           group: str) -> None:
    client = backend_client(request, backend)
    prefix = scenario(client)
    runs = runs_of(client, prefix)
    # The store of partitions the scenario opens asks its partition first.
    traced = [s for s in traced if prefix_of(s.argv[0]) == prefix]
    assert key_problems(traced, runs, prefix) == []
    called = {s.name for s in traced}
    assert called >= {s.name for s in getattr(scripts, group)} - {
        s.name for s in (*scripts.PARTITION_SCRIPTS, *scripts.REPO_PARTITION_SCRIPTS)}, \
        "an operation left out"
    assert {run.name for run in runs} == called


def partitioned_scenario(client: Any) -> list[str]:
    """A dependency across partitions: watched, announced, delivered, acknowledged, and
    deleted; then a repository of partitions; the prefixes of the namespace and its
    partitions."""
    store = RedisRunStore(client, namespace=unique_namespace(), discover=discover,
                          partitions=2)
    dep, waiter = "d", next(f"w{i}" for i in range(50)
                            if partition_of(f"w{i}", 2) != partition_of("d", 2))
    store.migrate()
    store.insert(dep, b"plain", Release())
    store.insert(waiter, f"dep:{dep}".encode(), Release())
    store.compare_and_set(dep, 1, b"plain", Release())
    store.claim_ready("a", LONG, 10)
    store.compare_and_set(waiter, 1, f"dep:{dep}".encode(), Release())
    store.delete(dep, 2, Release())
    store.claim_ready("a", LONG, 10)
    store.delete(waiter, 2, Release())  # its last waiter gone: the watch goes (run_unwatch)
    store.claim_ready("a", LONG, 10)
    # In each partition, writes that take a lease out of the ready index and give it
    # back, deletes of a held run and of a ready one; claims of expired leases and of both
    # kinds (their heads read each index).
    for p in range(2):
        held, ready = (next(f"{x}{i}" for i in range(50) if partition_of(f"{x}{i}", 2) == p)
                       for x in ("h", "t"))
        store.insert(held, b"plain", Claim("a", LONG))
        first = store.insert(ready, b"at:", Release())
        store.compare_and_set(ready, first, b"at:", Claim("a", LONG))
        store.compare_and_set(ready, first + 1, b"at:", Release())
        store.delete(held, store.get(held).revision, Release())
        store.delete(ready, first + 2, Release())
    store.claim_expired("a", LONG, 10)
    store.claim("a", LONG, 10)
    repo = RedisRepository(client, namespace=store.namespace, partitions=2)
    repo.register_group("g")  # (repository_scenario runs each script of a partition alike)
    repo.load("i1")
    return [Keyspace(store.namespace).prefix,
            *(Keyspace(store.namespace, p).prefix for p in range(2))]


@pytest.mark.parametrize("backend", ["fakeredis",
                                     pytest.param("redis7", marks=pytest.mark.server)])
def test_partition_scripts_read_the_keys_they_declare(request: pytest.FixtureRequest,
                                                     backend: str,
                                                     traced: list[Sent]) -> None:
    client = backend_client(request, backend)
    called: set[str] = set()
    for prefix in partitioned_scenario(client):
        sent = [s for s in traced if prefix_of(s.argv[0]) == prefix]
        runs = runs_of(client, prefix)
        assert key_problems(sent, runs, prefix) == []
        assert {run.name for run in runs} == {s.name for s in sent}
        called |= {s.name for s in sent}
    assert called >= {s.name for s in (*scripts.PARTITION_SCRIPTS, scripts.RUN_HEADS,
                                       scripts.RUN_PARTITIONS, scripts.REPO_PARTITIONS)}



@pytest.mark.parametrize("backend", ["fakeredis",
                                     pytest.param("redis7", marks=pytest.mark.server)])
def test_the_acl_rule_grants_every_command_the_scripts_send(request: pytest.FixtureRequest,
                                                            backend: str,
                                                            traced: list[Sent]) -> None:
    """redisstore.admin.security grants a confined user the commands it finds in the scripts'
    sources (a literal redis.call('X'), redis.pcall('X') or later('X')): a command a
    script sends by a name it computes would be refused to that user. Every command the
    scenarios' scripts sent, on every path they took, is among those found (SPUBLISH: with
    partitions, which acl_rule grants with their channels)."""
    from redisstore.admin.security import script_commands

    client = backend_client(request, backend)
    prefixes = [run_store_scenario(client), repository_scenario(client),
                *partitioned_scenario(client)]
    sent = {"memory|usage" if command[0].upper() == "MEMORY" else command[0].lower()
            for prefix in prefixes for run in runs_of(client, prefix)
            for command in run.commands}
    assert {"srem", "zrem", "setrange", "sscan", "memory|usage", "spublish"} <= sent
    assert sent - script_commands() - {"spublish"} == set()


#: The scripts whose functions capture at least BIG_LIB distinct lib names: the size
#: _hoisted's hot set (scripts._HOT, 15 names declared last) was calibrated for, at most
#: 15% of their names. A smaller script's hot set is a larger share of its names (renew's
#: 73: a fifth), and puts less behind it. (A script split into a fast and a slow path is
#: held to its lib's order only: each path has fewer hot names to put last.)
