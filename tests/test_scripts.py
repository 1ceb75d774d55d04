"""The Lua build (redisstore/scripts.py): headers name their includes and the loader holds
them to what the bodies use; a server's line numbers are mapped back to the files; the reply
codes and the key names come from one definition each; scripts touch the KEYS they declare
and nothing outside their slot; every header has its fields in order."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import old_layouts
import pytest
from old_layouts import OldRun
from redis.crc import key_slot
from servers import Server, unique_namespace

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
    Status,
    Unavailable,
    scripts,
)
from redisstore.core import driver as protocol
from redisstore.core import keys as keys_module
from redisstore.core import runops
from redisstore.core.driver import Call, ask
from redisstore.core.keys import Keyspace
from redisstore.core.outcomes import ErrorReply
from redisstore.core.partitions import partition_of
from redisstore.runs import Wait
from redisstore.shells.sync import Pool, Transport

LONG = 600_000
LUA = Path(str(scripts.lua_dir()))


def build(tmp_path: Path, files: dict[str, str], specs: list[tuple[str, str]],
          ) -> dict[str, scripts.Script]:
    """Build ``specs`` from ``files`` (name -> Lua text) written to a folder of their own."""
    for name, text in files.items():
        (tmp_path / f"{name}.lua").write_text(text)
    return scripts.load_all(specs, folder=tmp_path)


def build_error(tmp_path: Path, files: dict[str, str], specs: list[tuple[str, str]]) -> str:
    with pytest.raises(scripts.BuildError) as caught:
        build(tmp_path, files, specs)
    return str(caught.value)


LIB = """-- _t.lua: a test lib.

local P = ARGV[1]

-- a doubles
local function a(x)
  return x * 2
end

local function b(x)
  return a(x) + 1
end

local UNUSED = 'c'
"""


def script(body: str, include: str = "--- @include b", name: str = "s") -> str:
    return (f"-- {name}: a test script.\n-- KEYS[1]  P..\"k\"\n-- ARGV[1]  key prefix\n"
            f"-- Reply    a number\n{include}\n{body}")


# ---------------------------------------------------------------------------- the build


def test_an_include_brings_what_it_uses_in_lib_order_and_nothing_else(tmp_path: Path) -> None:
    built = build(tmp_path, {"_t": LIB, "s": script("return b(1)\n")}, [("s", "_t")])
    source = built["s"].source.decode()
    assert source.startswith(scripts.PRELUDE)
    assert "-- a doubles\na = function" in source  # its comment travels with it
    assert source.index("a = function") < source.index("b = function")
    assert "UNUSED" not in source and "P =" not in source
    # Each definition is an assignment to a name declared once, ahead of the fragments.
    assert source.split("\n")[1] in ("local a, b", "local b, a")


def test_the_shipped_scripts_carry_what_they_use_and_only_that() -> None:
    """Every lib name a sent fragment uses is sent; every fragment sent is included by the
    header or used by another one sent."""
    for script_ in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS):
        lib = scripts.read_lib(scripts.lua_dir(), "_lib" if script_.name.startswith("run_")
                               else "_repo_lib")
        wanted, problems = scripts.includes(script_.name,
                                            (LUA / f"{script_.name}.lua").read_text())
        assert problems == []
        source = script_.source.decode()
        sent = [f for f in lib.fragments if scripts._assigned(f) in source]
        names_sent = {n for f in sent for n in f.names}
        assert set(wanted) <= names_sent, script_.name
        for frag in sent:
            assert set(frag.scan.used) & set(lib.defines) <= names_sent, (script_.name,
                                                                          frag.names)
            assert set(frag.names) & set(wanted) or any(
                set(frag.names) & set(other.scan.used) for other in sent if other is not frag
            ), (script_.name, frag.names, "sent but not used")


@pytest.mark.parametrize(("body", "include", "expected"), [
    ("return a(1) + b(2)\n", "--- @include b", r"s\.lua:6: uses a \(_t\.lua:5\), which its "
                                                r"header does not include"),
    ("return b(2)\n", "--- @include a, b", r"s\.lua:5: includes a, which the script does not "
                                           r"use"),
    ("return b(2)\n", "--- @include b, bb", r"s\.lua:5: includes bb, which _t\.lua does not "
                                            r"define \(did you mean b\?\)"),
    ("return b(2)\n", "-- (no include line)", r"s\.lua:1: no `--- @include` line"),
    ("return b(2)\n--- @include b\n", "--- @include b", r"s\.lua:7: a `--- @include` line "
                                                        r"below the header"),
    ("return bb(2)\n", "--- @include", r"s\.lua:6: uses bb, which neither _t\.lua nor Lua "
                                       r"defines \(did you mean b\?\)"),
    ("local a = 1\nreturn b(a)\n", "--- @include b", r"s\.lua:6: declares a, a name _t\.lua "
                                                     r"defines"),
    ("return b(2)\n", "--- @include b, b", r"s\.lua:5: includes b twice"),
    ("return b(2)\n", "--- @include b; a", r"an include line is `--- @include name"),
    ("return b(2)\n", "-- @include b", r"s\.lua:5: `-- @include b`: an include line starts "
                                       r"`--- @include`"),
])
def test_the_loader_refuses_a_header_that_disagrees_with_the_body(
        tmp_path: Path, body: str, include: str, expected: str) -> None:
    message = build_error(tmp_path, {"_t": LIB, "s": script(body, include)}, [("s", "_t")])
    assert re.search(expected, message), message


def test_the_error_says_what_the_includes_should_read(tmp_path: Path) -> None:
    message = build_error(tmp_path, {"_t": LIB, "s": script("return a(1) + b(2)\n")},
                          [("s", "_t")])
    assert message.endswith("s.lua: its header's includes should read:\n--- @include a, b")


def test_a_bare_include_says_the_script_uses_no_fragment(tmp_path: Path) -> None:
    built = build(tmp_path, {"_t": LIB, "s": script("return 1\n", "--- @include")},
                  [("s", "_t")])
    assert built["s"].source.decode() == scripts.PRELUDE + script("return 1\n",
                                                                  "--- @include")


def test_fields_strings_comments_and_table_keys_are_no_uses(tmp_path: Path) -> None:
    body = ("local t = {a = 1, ['b'] = 2}\n-- a(1)\nlocal s = 'a' .. \"b\" .. [[a]]\n"
            "--[[ b(1) ]]\nreturn t.a + t:b() + #s + b(1)\n")
    build(tmp_path, {"_t": LIB, "s": script(body)}, [("s", "_t")])


def test_names_tells_uses_from_declarations_fields_and_keys() -> None:
    scan = scripts.names("local t = {}\nfunction t:m(a)\n  return self.x + a + g\nend\n"
                         "local function f(x, ...)\n  for k, v in pairs(x) do print(k, v) end\n"
                         "  for i = 1, 3 do print(i) end\n"
                         "  return {k = 1, [2] = h}, x.y, x:z(w), 'q', 0x1f, 1e3\nend\n", 10)
    assert sorted(scan.used) == ["a", "g", "h", "i", "k", "pairs", "print", "self", "t", "v",
                                 "w", "x"]
    assert sorted(scan.declared) == ["a", "f", "i", "k", "self", "t", "v", "x"]
    assert scan.used["g"] == 12 and scan.declared["f"] == 14


def test_every_problem_of_every_script_is_reported_at_once(tmp_path: Path) -> None:
    message = build_error(
        tmp_path, {"_t": LIB, "s": script("return a(1)\n"),
                   "u": script("return UNUSED\n", name="u")}, [("s", "_t"), ("u", "_t")])
    assert "s.lua:6: uses a" in message and "u.lua:6: uses UNUSED" in message


@pytest.mark.parametrize(("lib", "expected"), [
    (LIB.replace("local function b(x)\n  return a(x) + 1", "local function b(x)\n  return "
                 "c(x) + 1") + "\nlocal function c(x)\n  return x\nend\n",
     r"_t\.lua:11: b uses c, which is defined below it \(_t\.lua:16\)"),
    (LIB + "\nlocal function d()\n  return e()\nend\n",
     r"_t\.lua:17: d uses e, which neither _t\.lua nor Lua defines"),
    (LIB + "\nlocal function a()\nend\n", r"_t\.lua:16: defines a again \(first at _t\.lua:5"),
    # Sent with every lib name declared ahead, these would read the lib's own nil local.
    (LIB + "\nlocal tostring = tostring\n",
     r"_t\.lua:16: tostring's value reads tostring, a name it defines"),
    (LIB + "\nlocal unpack = unpack or table.unpack\n",
     r"_t\.lua:16: unpack's value reads unpack"),
    (LIB + "\nlocal CACHE  -- filled later\n", r"_t\.lua:16: `local CACHE  -- filled later` "
     r"declares without a value"),
])
def test_the_loader_refuses_a_lib_that_cannot_work(tmp_path: Path, lib: str,
                                                   expected: str) -> None:
    message = build_error(tmp_path, {"_t": lib, "s": script("return b(1)\n")}, [("s", "_t")])
    assert re.search(expected, message), message


# ---------------------------------------------------------------------------- reply codes


def test_the_reply_codes_are_one_definition() -> None:
    assert runops.Code is scripts.Code
    assert scripts.generated_line(scripts.Code) == (
        "local " + ", ".join(c.name for c in scripts.Code) + " = "
        + ", ".join(str(c.value) for c in scripts.Code))
    for file in sorted((LUA / "_lib").iterdir()):
        assert not re.search(r"^local OK\b", file.read_text(), re.M), \
            f"{file.name} must not name the codes"


def test_a_lib_that_names_the_codes_itself_does_not_build(tmp_path: Path) -> None:
    lib = LIB + "\nlocal OK, NOT_FOUND = 0, 1\n"
    message = build_error(tmp_path, {"_lib": lib, "s": script("return b(OK)\n",
                                                                "--- @include b, OK")},
                          [("s", "_lib")])
    assert re.search(r"_lib\.lua:16: defines OK, NOT_FOUND, which redisstore\.scripts "
                     r"generates from Code: delete it", message), message


@pytest.mark.parametrize("lib", ["_lib", "_repo_lib"])
def test_the_scripts_see_the_codes_python_names(tmp_path: Path, lib: str) -> None:
    """A script of the real lib answers its codes; fakeredis runs it."""
    for file in (f"{lib}.lua", f"{scripts.COMMON}.lua"):
        if (LUA / file).is_file():
            (tmp_path / file).write_text((LUA / file).read_text())
    if (LUA / lib).is_dir():
        shutil.copytree(LUA / lib, tmp_path / lib)
    names = ", ".join(c.name for c in scripts.Code)
    (tmp_path / "codes.lua").write_text(
        f"-- codes: every reply code.\n--- @include {names}\nreturn {{{names}}}\n")
    built = scripts.load_all([("codes", lib)], folder=tmp_path)["codes"]
    assert fakeredis.FakeRedis().eval(built.source, 0) == [c.value for c in scripts.Code]


# ---------------------------------------------------------------------------- key schema

#: Each name of the key schema (redisstore.core.keys) as the lib's Lua makes it, and as Keyspace
#: does. A name the schema gains needs its line here.
SCHEMA_NAMES: dict[str, dict[str, tuple[str, Callable[[Keyspace], str]]]] = {
    "_lib": {
        "LEASES": ("LEASES", lambda k: k.leases),
        "READY": ("READY", lambda k: k.ready),
        "QUARANTINE": ("QUARANTINE", lambda k: k.quarantine),
        "FANOUT": ("FANOUT", lambda k: k.fanout),
        "FANOUT_CURSOR": ("FANOUT_CURSOR", lambda k: k.fanout_cursor),
        "META": ("META", lambda k: k.meta),
        "WAKE_READY": ("WAKE_READY", lambda k: k.wake("ready")),
        "WAKE_LEASES": ("WAKE_LEASES", lambda k: k.wake("leases")),
        "DEPV": ("DEPV", lambda k: k.depv),
        "OUTBOX": ("OUTBOX", lambda k: k.outbox),
        "UNWATCHED": ("UNWATCHED", lambda k: k.unwatched),
        "UNWATCH_Q": ("UNWATCH_Q", lambda k: k.unwatch),
        "WATCH_SEQ": ("WATCH_SEQ", lambda k: k.watch_seq),
        "FEED": ("FEED", lambda k: k.feed),
        "run": ("run_key('a:b')", lambda k: k.run("a:b")),
        "dependents": ("deps_ix('dé|p').key", lambda k: k.dependents("dé|p")),
        # Layout 4's index keys, which only run_migrate meets (old.lua's old_index reads
        # them back from these names).
        "deps dir": ("P .. DEPS_BUCKETS .. #'dé|p' .. DEPS_SEP .. 'dé|p' .. BUCKET_DIR",
                     lambda k: k.buckets("d:dé|p")[0]),
        "deps bucket": ("P .. DEPS_BUCKETS .. #'dé|p' .. DEPS_SEP .. 'dé|p' .. BUCKET_AT",
                        lambda k: k.buckets("d:dé|p")[1]),
        "leases dir": ("P .. LEASES_BUCKETS .. BUCKET_DIR", lambda k: k.buckets("leases")[0]),
        "leases bucket": ("P .. LEASES_BUCKETS .. BUCKET_AT",
                          lambda k: k.buckets("leases")[1]),
        "ready dir": ("P .. READY_BUCKETS .. BUCKET_DIR", lambda k: k.buckets("ready")[0]),
        "ready bucket": ("P .. READY_BUCKETS .. BUCKET_AT", lambda k: k.buckets("ready")[1]),
        # partitions.lua's watchers and rewatch_all, runs.lua's set_aside, inline.
        "watch": ("P .. WATCH_KEY .. 'a'", lambda k: k.watch("a")),
        "damaged": ("P .. DAMAGED_KEY .. 'outbox'", lambda k: k.damaged("outbox")),
    },
    "_repo_lib": {
        "GROUPS": ("GROUPS", lambda k: k.groups),
        "TERMINAL": ("TERMINAL", lambda k: k.terminal),
        "TERMINAL_SEQ": ("TERMINAL_SEQ", lambda k: k.terminal_seq),
        "REPO_LAYOUT": ("REPO_LAYOUT", lambda k: k.layout),
        "REPO_PARTITIONS": ("REPO_PARTITIONS", lambda k: k.repo_partitions),
        "REPO_REPARTITION": ("REPO_REPARTITION", lambda k: k.repo_repartition),
        "instance": ("inst_key('i:1')", lambda k: k.instance("i:1")),
        "inflight": ("inflight_key('g')", lambda k: k.inflight("g")),
    },
}


def _copy_libs(tmp_path: Path) -> None:
    for file in LUA.glob("_*.lua"):
        (tmp_path / file.name).write_text(file.read_text())
    shutil.copytree(LUA / "_lib", tmp_path / "_lib")


@pytest.mark.parametrize("lib", ["_lib", "_repo_lib"])
@pytest.mark.parametrize("keyspace", [Keyspace("n s"), Keyspace("ns", 3)], ids=str)
def test_the_scripts_build_the_key_names_keyspace_does(tmp_path: Path, lib: str,
                                                       keyspace: Keyspace) -> None:
    """The key schema is written once (redisstore.core.keys): the names a script of the real lib
    builds from its prefix are Keyspace's, run on fakeredis."""
    _copy_libs(tmp_path)
    exprs = SCHEMA_NAMES[lib]
    fixed, parts = ((keys_module.RUN_STORE_KEYS, keys_module.RUN_STORE_PARTS) if lib == "_lib"
                    else (keys_module.REPOSITORY_KEYS, keys_module.REPOSITORY_PARTS))
    assert set(fixed) <= set(exprs), "give each key of the schema its line in SCHEMA_NAMES"
    body = "return {" + ", ".join(lua for lua, _ in exprs.values()) + "}\n"
    used = [n for n in scripts.names(body).used if n not in scripts.LUA_GLOBALS]
    (tmp_path / "names.lua").write_text(
        f"-- names: the key names.\n--- @include {', '.join(used)}\n{body}")
    built = scripts.load_all([("names", lib)], folder=tmp_path)["names"]
    # Every generated name is used, so the expressions above cover the whole schema.
    declared = built.source.decode().split("\n")[1]
    assert set(fixed) | set(parts) <= set(declared.removeprefix("local ").split(", "))
    got = fakeredis.FakeRedis().eval(built.source, 1, keyspace.prefix + "x", keyspace.prefix)
    assert dict(zip(exprs, [g.decode() for g in got], strict=True)) == {
        name: python(keyspace) for name, (_, python) in exprs.items()}


def test_the_run_store_and_the_repository_name_their_keys_apart() -> None:
    """A run store and a repository can share a namespace."""
    k = keys_module
    run_store = [*k.RUN_STORE_KEYS.values(), *(k.RUN_STORE_PARTS[n] for n in (
        "RUN_KEY", "DEPS_KEY", "LEASES_BUCKETS", "READY_BUCKETS", "DEPS_BUCKETS", "WATCH_KEY",
        "DAMAGED_KEY"))]
    repository = [*k.REPOSITORY_KEYS.values(), *k.REPOSITORY_PARTS.values()]
    assert not [(a, b) for a in run_store for b in repository
                if a.startswith(b) or b.startswith(a)]




def test_no_lua_file_spells_a_key_name() -> None:
    """The libs and scripts name their keys by the schema's generated names (LEASES, P ..
    RUN_KEY .. run), never `P .. 'leases'`."""
    found: dict[str, list[str]] = {}
    for file in sorted([*LUA.glob("*.lua"), *(LUA / "_lib").glob("*.lua")]):
        toks = list(scripts._tokens(file.read_text(), 1))
        spelled = [toks[i + 2][1] for i, (_, tok, _) in enumerate(toks[:-2])
                   if tok == "P" and toks[i + 1][1] == ".." and toks[i + 2][0] == "string"]
        if spelled:
            found[str(file.relative_to(LUA))] = spelled
    assert found == {}


def test_a_lib_that_names_a_key_itself_does_not_build(tmp_path: Path) -> None:
    _copy_libs(tmp_path)
    shutil.copy(LUA / "run_get.lua", tmp_path)
    (tmp_path / "_lib" / "write.lua").write_text(
        (LUA / "_lib" / "write.lua").read_text() + "\nlocal RUN_KEY = 'r:'\n")
    with pytest.raises(scripts.BuildError, match=r"_lib/write\.lua:\d+: defines RUN_KEY, which "
                       r"redisstore\.scripts generates from redisstore\.core\.keys\.RUN_STORE: "
                       r"delete"):
        scripts.load_all([("run_get", "_lib")], folder=tmp_path)


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


# ---------------------------------------------------------------------------- line mapping


def test_every_line_sent_maps_to_the_line_it_came_from() -> None:
    generated = {g.file: g for made in scripts.GENERATED.values() for g in made}
    for script_ in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS):
        sent = script_.source.decode().split("\n")
        assert len(script_.lines) == len(sent) - 1  # the source ends with a newline
        for text, (file, line) in zip(sent, script_.lines, strict=False):
            if file == "<lib names>":  # the names the fragments then assign
                assert text.startswith("local "), script_.name
                continue
            if file == "<slow path>":  # the slow path's function around its part
                opened = (scripts.SLOW_OPEN, scripts.SLOW_CLOSE)[line - 1]
                assert text == opened.rstrip("\n"), script_.name
                continue
            if file == "<prelude>":
                origin = scripts.PRELUDE.split("\n")
            elif file in generated:
                origin = generated[file].text.split("\n")
            else:
                origin = (LUA / file).read_text().split("\n")
            # A fragment's definition line is sent as an assignment, the rest as written.
            assigned = re.sub(r"^local (?:function (\w+))?", lambda m: (
                f"{m[1]} = function" if m[1] else ""), origin[line - 1])
            assert text in (origin[line - 1], assigned), (script_.name, file, line)


@pytest.mark.parametrize("text", [
    "user_script:{n}: BADARG x script: 0123456789012345678901234567890123456789, on "
    "@user_script:{n}.",
    "Error running script (call to f_0a): @user_script:{n}: user_script:{n}: BADARG x",
    "Error running script (call to f_0a): @user_script: {n}: -READONLY You can't write",
    'Error running script (call to f_0a): @user_script:?: [string "<python>"]:{n}: BADARG x'
    '\nstack traceback:\n\t[string "<python>"]:{n}: in function \'arg_int\'',
])
def test_a_server_position_is_mapped_to_its_file_and_line(text: str) -> None:
    script_ = scripts.RUN_CLAIM_EXPIRED
    n = next(i for i, (file, _) in enumerate(script_.lines, 1) if file == "_lib/claims.lua")
    mapped = script_.map_error(text.format(n=n))
    assert "user_script:" + str(n) not in mapped and f"]:{n}" not in mapped
    assert mapped.count(f"_lib/claims.lua:{script_.lines[n - 1][1]}") == text.count("{n}")
    assert script_.map_error("user_script:100000: x") == "run_claim_expired(composed):100000: x"


def _line_of(text: str, pattern: str, first: int = 1) -> int:
    return next(i for i, line in enumerate(text.split("\n"), first) if re.search(pattern, line))


def _client(request: pytest.FixtureRequest, backend: str) -> Any:
    if backend == "fakeredis":
        return fakeredis.FakeRedis()
    server: Server = request.getfixturevalue(backend)
    return server.client()


BACKENDS = ["fakeredis", *(pytest.param(b, marks=pytest.mark.server)
                           for b in ("redis7", "redis62", "valkey8"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_in_the_lib_names_its_line_in_the_lib(request: pytest.FixtureRequest,
                                                       backend: str) -> None:
    keys = Keyspace(unique_namespace())
    arg_int = scripts.read_lib(scripts.lua_dir(), "_lib").defines["arg_int"]
    line = _line_of(arg_int.source, r"\berror\(", arg_int.line)
    call = Call(scripts.RUN_CLAIM_EXPIRED, (keys.leases, keys.meta),
                (keys.prefix, "me", "soon", 10), lambda r: r)  # ttl 'soon': arg_int raises
    with pytest.raises(Unavailable) as caught:
        Transport(_client(request, backend)).drive(ask(call))
    message = str(caught.value)
    assert "run_claim_expired: server error: " in message, message
    assert f"{arg_int.file}:{line}: BADARG ARGV[3]" in message, message
    assert "user_script:" not in message.replace("@user_script:?", ""), message


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_in_a_body_names_its_line_in_the_script(request: pytest.FixtureRequest,
                                                         backend: str) -> None:
    keys = Keyspace(unique_namespace())
    line = _line_of((LUA / "run_quarantined.lua").read_text(), r"error\('BADARG ARGV\[2\]")
    call = Call(scripts.RUN_QUARANTINED, (keys.quarantine,), (keys.prefix, "x"), lambda r: r,
                write=False)
    with pytest.raises(Unavailable) as caught:
        Transport(_client(request, backend)).drive(ask(call))
    assert f"run_quarantined.lua:{line}: BADARG ARGV[2]" in str(caught.value)


@pytest.mark.parametrize("backend", ["fakeredis",
                                     pytest.param("redis7", marks=pytest.mark.server)])
def test_a_script_that_does_not_compile_names_its_line(request: pytest.FixtureRequest,
                                                       tmp_path: Path, backend: str) -> None:
    """Redis refuses it at SCRIPT LOAD, fakeredis when it runs: both name the file's line."""
    bad = build(tmp_path, {"_t": LIB, "s": script("local x = = b(1)\nreturn x\n")},
                [("s", "_t")])["s"]
    with pytest.raises(Unavailable) as caught:
        Transport(_client(request, backend)).drive(ask(Call(bad, ("{n}:k",), ("{n}:",),
                                                            lambda r: r)))
    doing = "s" if backend == "fakeredis" else "SCRIPT LOAD s"
    assert re.match(rf"{doing}: server error: .*: s\.lua:6: unexpected symbol",
                    str(caught.value)), str(caught.value)


def test_an_error_without_a_position_is_left_as_it_is() -> None:
    call = Call(scripts.RUN_NOW, ("k",), ("{n}:",), lambda r: r)
    error = ErrorReply("READONLY", "You can't write against a replica")
    assert str(protocol.script_error(call, error, write=True)) == (
        "server error: READONLY You can't write against a replica; nothing was applied")


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


# ---------------------------------------------------------------------------- keys

# The keys of each command the scripts send: the first argument, every argument, none.
FIRST_KEY = frozenset({
    "GET", "SET", "SETRANGE", "GETRANGE", "STRLEN", "INCR", "INCRBY", "APPEND", "TYPE", "HGET",
    "HMGET", "HSET", "HDEL", "HEXISTS", "HSCAN", "HSTRLEN", "HLEN", "HGETALL", "HSETNX",
    "HINCRBY", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZCARD", "ZCOUNT", "ZRANK",
    "ZMSCORE", "ZRANGEBYLEX", "ZREVRANGEBYLEX", "ZREMRANGEBYRANK", "SADD", "SREM", "SSCAN",
    "SISMEMBER", "SCARD", "SMEMBERS", "SRANDMEMBER", "RPUSH", "HKEYS", "ZRANDMEMBER",
    # A sharded channel is routed as a key: it must be in the script's slot, as keys are.
    "SPUBLISH",
})
ALL_KEYS = frozenset({"DEL", "EXISTS", "UNLINK", "TOUCH", "MGET", "RENAME"})
#: Commands whose key follows a subcommand (MEMORY USAGE key).
SECOND_KEY = frozenset({"MEMORY"})
NO_KEYS = frozenset({"TIME", "SCAN", "PING"})
WRITES = frozenset({
    "SET", "SETRANGE", "INCR", "INCRBY", "APPEND", "HSET", "HDEL", "HSETNX", "HINCRBY", "ZADD",
    "ZREM", "ZREMRANGEBYRANK", "SADD", "SREM", "DEL", "UNLINK", "RPUSH", "RENAME",
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
        f"{name}: add it to the key table of tests/test_scripts.py")
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
    client = _client(request, backend)
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
    client = _client(request, backend)
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
    """redisstore.security grants a confined user the commands it finds in the scripts'
    sources (a literal redis.call('X'), redis.pcall('X') or later('X')): a command a
    script sends by a name it computes would be refused to that user. Every command the
    scenarios' scripts sent, on every path they took, is among those found (SPUBLISH: with
    partitions, which acl_rule grants with their channels)."""
    from redisstore.security import script_commands

    client = _client(request, backend)
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
BIG_LIB = 100
BIG_SCRIPTS = {"run_insert", "run_compare_and_set", "run_delete", "run_claim",
               "run_claim_ready", "run_claim_expired", "run_finish", "run_refresh",
               "run_finish_claim", "run_cas_claim", "run_release_claim"}


def test_the_lib_names_are_declared_so_that_finding_upvalues_walks_less() -> None:
    """Each shipped script declares its lib names in the order that makes its functions'
    upvalues cheapest to find (benchmarks/bench_instructions.py measures the instructions):
    by the walk's model never more steps than the lib's own order, fewer wherever the walk
    is long (over 1,000 steps), and for the scripts whose functions capture at least
    BIG_LIB distinct names at most 60% of them (compare_and_set's model: about 9,400
    steps in the lib's order, 4,800 declared)."""
    big, whole = set(), set()
    for script_ in (*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS):
        lib = scripts.read_lib(scripts.lua_dir(), "_lib" if script_.name.startswith("run_")
                               else "_repo_lib")
        text = (LUA / f"{script_.name}.lua").read_text()
        wanted, _ = scripts.includes(script_.name, text)
        # A script with a slow path (`--- @slow`) declares the names of each path on a line
        # of its own.
        lines = script_.source.decode().split("\n")
        declared_lines = [text for text, (file, _) in zip(lines, script_.lines, strict=False)
                          if file == "<lib names>"]
        if len(declared_lines) == 1:
            whole.add(script_.name)
        for frags, line in zip(scripts.paths(text, lib, wanted), declared_lines,
                               strict=False):
            own = {n for f in frags for n in f.names}
            captures = [n for n in scripts.upvalue_captures(frags, lib) if n in own]
            in_lib = [n for f in frags for n in f.names]
            assert line.startswith("local ")
            declared = line.removeprefix("local ").split(", ")
            assert sorted(declared) == sorted(in_lib), script_.name
            before = scripts.walk_steps(in_lib, captures)
            after = scripts.walk_steps(declared, captures)
            assert after <= before, (script_.name, before, after)
            if before > 1000:
                assert after < before, (script_.name, before, after)
            # A path of a split script has fewer hot names to put last than a whole lib:
            # it is held to the lib's order only (above).
            if len(set(captures)) >= BIG_LIB and len(declared_lines) == 1:
                big.add(script_.name)
                assert after <= 0.6 * before, (script_.name, before, after)
    assert big, "no script is big enough to hold to 60%: calibrate BIG_LIB again"
    small = (BIG_SCRIPTS & whole) - big
    assert not small, f"scripts below {BIG_LIB} names: {sorted(small)}"


def test_the_walk_model_counts_what_lua_walks() -> None:
    # Declared a, b, c; functions capture c, then a (past c), then b (past c), then a again.
    assert scripts.walk_steps(["a", "b", "c"], ["c", "a", "b", "a"]) == 1 + 2 + 2 + 3
    assert scripts.walk_steps(["c", "b", "a"], ["c", "a", "b", "a"]) == 1 + 1 + 2 + 1


def test_a_lib_file_the_order_does_not_list_does_not_build(tmp_path: Path) -> None:
    shutil.copytree(LUA, tmp_path / "lua")
    (tmp_path / "lua" / "_lib" / "extra.lua").write_text("-- extra.lua: unlisted.\n")
    with pytest.raises(scripts.BuildError,
                       match=r"_lib/extra.lua: a lib file redisstore.scripts.LIBS does not"):
        scripts.load_all([("run_get", "_lib")], folder=tmp_path / "lua")


def test_no_lua_file_is_over_400_lines() -> None:
    """One file a concept: a file that grows past this holds two."""
    long = {str(p.relative_to(LUA)): n for p in LUA.rglob("*.lua")
            if (n := p.read_text().count("\n")) > 400}
    assert long == {}


def test_the_built_scripts_file_is_current() -> None:
    """lua/_built.json is what the build makes of the Lua today: else run
    ``python -m redisstore._build`` (a stale file is never used, but import is slower)."""
    built = scripts.read_built()
    assert built is not None, "lua/_built.json is stale: run python -m redisstore._build"
    fresh = scripts.load_all(scripts.SHIPPED)
    assert built == fresh
    assert all(built[name].lines == fresh[name].lines for name in fresh)
    assert fresh["run_compare_and_set"] == scripts.RUN_COMPARE_AND_SET


def test_a_built_file_that_is_not_current_is_not_used(tmp_path: Path) -> None:
    shutil.copytree(LUA, tmp_path / "lua")
    folder = tmp_path / "lua"
    scripts.write_built(folder)
    assert scripts.read_built(folder) is not None
    get = folder / "run_get.lua"
    get.write_text(get.read_text() + "\n")
    assert scripts.read_built(folder) is None  # a Lua file changed: built again
    scripts.write_built(folder)
    data = (folder / scripts.BUILT_FILE).read_text()
    (folder / scripts.BUILT_FILE).write_text(data.replace("return", "return ", 1))
    assert scripts.read_built(folder) is None  # a source that is not its SHA1
    (folder / scripts.BUILT_FILE).write_text("{")
    assert scripts.read_built(folder) is None
    # A current digest over contents of the wrong shape: built again, never a crash.
    scripts.write_built(folder)
    good = json.loads((folder / scripts.BUILT_FILE).read_text())
    for damage in ({"scripts": []}, {"scripts": {"run_get": {**good["scripts"]["run_get"],
                                                             "source": 5}}},
                   {"scripts": {"run_get": {**good["scripts"]["run_get"],
                                            "lines": [["x", 1, 10**12]]}}}):
        (folder / scripts.BUILT_FILE).write_text(json.dumps({**good, **damage}))
        assert scripts.read_built(folder) is None
