"""The Lua build (redisstore/core/scripts.py): headers name their includes and the loader holds
them to what the bodies use; a server's line numbers are mapped back to the files; the reply
codes and the key names come from one definition each; a lib fragment no script uses fails
the build; lua/_built.json is current."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import fakeredis
import pytest
from servers import BACKENDS, backend_client, unique_namespace

from redisstore import (
    Unavailable,
)
from redisstore.core import driver as protocol
from redisstore.core import keys as keys_module
from redisstore.core import runops, scripts
from redisstore.core.driver import Call, ask
from redisstore.core.keys import Keyspace
from redisstore.core.outcomes import ErrorReply
from redisstore.shells.sync import Transport

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
    assert scripts.generated_lines(scripts.Code) == [
        f"local {c.name} = {c.value}" for c in scripts.Code]
    for file in sorted((LUA / "_lib").iterdir()):
        assert not re.search(r"^local OK\b", file.read_text(), re.M), \
            f"{file.name} must not name the codes"


def test_a_lib_that_names_the_codes_itself_does_not_build(tmp_path: Path) -> None:
    lib = LIB + "\nlocal OK, NOT_FOUND = 0, 1\n"
    message = build_error(tmp_path, {"_lib": lib, "s": script("return b(OK)\n",
                                                                "--- @include b, OK")},
                          [("s", "_lib")])
    assert re.search(r"_lib\.lua:16: defines OK, NOT_FOUND, which redisstore\.core\.scripts "
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
        "SESSIONS": ("SESSIONS", lambda k: k.sessions),
        "SESSION_LEASES": ("SESSION_LEASES", lambda k: k.session_leases),
        "SESSION_SEQ": ("SESSION_SEQ", lambda k: k.session_seq),
        "session runs": ("P .. SESSION_RUNS .. '7'", lambda k: k.session_runs("7")),
        "session told": ("P .. SESSION_TOLD .. '7'", lambda k: k.session_told("7")),
        "RATES": ("RATES", lambda k: k.rates),
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
                       r"redisstore\.core\.scripts generates from "
                       r"redisstore\.core\.keys\.RUN_STORE: delete"):
        scripts.load_all([("run_get", "_lib")], folder=tmp_path)


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



@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_in_the_lib_names_its_line_in_the_lib(request: pytest.FixtureRequest,
                                                       backend: str) -> None:
    keys = Keyspace(unique_namespace())
    arg_int = scripts.read_lib(scripts.lua_dir(), "_lib").defines["arg_int"]
    line = _line_of(arg_int.source, r"\berror\(", arg_int.line)
    call = Call(scripts.RUN_CLAIM_EXPIRED, (keys.leases, keys.meta),
                (keys.prefix, "me", "soon", 10), lambda r: r)  # ttl 'soon': arg_int raises
    with pytest.raises(Unavailable) as caught:
        Transport(backend_client(request, backend)).drive(ask(call))
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
        Transport(backend_client(request, backend)).drive(ask(call))
    assert f"run_quarantined.lua:{line}: BADARG ARGV[2]" in str(caught.value)


@pytest.mark.parametrize("backend", ["fakeredis",
                                     pytest.param("redis7", marks=pytest.mark.server)])
def test_a_script_that_does_not_compile_names_its_line(request: pytest.FixtureRequest,
                                                       tmp_path: Path, backend: str) -> None:
    """Redis refuses it at SCRIPT LOAD, fakeredis when it runs: both name the file's line."""
    bad = build(tmp_path, {"_t": LIB, "s": script("local x = = b(1)\nreturn x\n")},
                [("s", "_t")])["s"]
    with pytest.raises(Unavailable) as caught:
        Transport(backend_client(request, backend)).drive(ask(Call(bad, ("{n}:k",), ("{n}:",),
                                                            lambda r: r)))
    doing = "s" if backend == "fakeredis" else "SCRIPT LOAD s"
    assert re.match(rf"{doing}: server error: .*: s\.lua:6: unexpected symbol",
                    str(caught.value)), str(caught.value)


def test_an_error_without_a_position_is_left_as_it_is() -> None:
    call = Call(scripts.RUN_NOW, ("k",), ("{n}:",), lambda r: r)
    error = ErrorReply("READONLY", "You can't write against a replica")
    assert str(protocol.script_error(call, error, write=True)) == (
        "server error: READONLY You can't write against a replica; nothing was applied")


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
                       match=r"_lib/extra.lua: a lib file redisstore.core.scripts.LIBS does not"):
        scripts.load_all([("run_get", "_lib")], folder=tmp_path / "lua")


def test_a_lib_fragment_no_script_uses_does_not_build(tmp_path: Path) -> None:
    shutil.copytree(LUA, tmp_path / "lua")
    write = tmp_path / "lua" / "_lib" / "write.lua"
    write.write_text(write.read_text() + "\n-- Nobody calls it.\nlocal function stray(x)\n"
                     "  return x\nend\n")
    # One script alone does not tell: only the whole build (every script) does.
    scripts.load_all([("run_get", "_lib")], folder=tmp_path / "lua")
    with pytest.raises(scripts.BuildError,
                       match=r"_lib/write\.lua:\d+: stray: no script uses it: delete it"):
        scripts.load_all(scripts.SHIPPED, folder=tmp_path / "lua", every=True)
    with pytest.raises(scripts.BuildError, match="stray: no script uses it"):
        scripts.write_built(tmp_path / "lua")


def test_every_lib_fragment_is_sent_by_some_script() -> None:
    assert len(scripts.load_all(scripts.SHIPPED, every=True)) == len(scripts.SHIPPED)


def test_no_lua_file_is_over_400_lines() -> None:
    """One file a concept: a file that grows past this holds two."""
    long = {str(p.relative_to(LUA)): n for p in LUA.rglob("*.lua")
            if (n := p.read_text().count("\n")) > 400}
    assert long == {}


def test_the_built_scripts_file_is_current() -> None:
    """lua/_built.json is what the build makes of the Lua today: else run
    ``python -m redisstore.build.lua`` (a stale file is never used, but import is slower)."""
    built = scripts.read_built()
    assert built is not None, "lua/_built.json is stale: run python -m redisstore.build.lua"
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


def _top_level_locals(source: str) -> int:
    """How many locals a composed script's main chunk declares (each fragment's ``local``
    line, and the body's own)."""
    count = 0
    for line in source.split("\n"):
        if line.startswith("local function "):
            count += 1
        elif line.startswith("local "):
            count += len(line[len("local "):].split("=")[0].split(","))
    return count


#: Lua refuses a function of more than 200 locals ("error loading code"); the fused scripts
#: (a finish or a write, then a claim) come nearest. A script that passes this has room for
#: a fix; a new feature that needs more folds its state into a table (SESSION, FEED_STATE).
MAX_LOCALS = 196


@pytest.mark.parametrize("script", [*scripts.RUN_SCRIPTS, *scripts.REPO_SCRIPTS],
                         ids=lambda s: s.name)
def test_every_script_loads_within_luas_200_locals(script: scripts.Script) -> None:
    assert _top_level_locals(script.source.decode()) <= MAX_LOCALS, script.name
    # Compiled by Lua 5.1, as Redis does (lupa: fakeredis[lua]'s runtime).
    from lupa import lua51
    lua51.LuaRuntime().compile(script.source.decode())
