"""The Lua scripts, one per operation, read from the ``lua/`` folder, and how they are built.

In a wheel the folder ships as ``redisstore/lua``; in a source checkout it is the top-level
``lua/``. Each script is called by its SHA1 (EVALSHA); the shells load it only after a
NOSCRIPT.

**The build.** A script file (``run_insert.lua``) is a header and a body. What the server gets
is, in this order: ``if redis.replicate_commands then ... end``; the fragments of its lib
(``lua/_lib/``'s files for the run store, ``_repo_lib.lua`` for the repository) that it includes,
together with the fragments those use, in the lib's order; then the whole file. A *fragment*
is one top-level ``local`` definition of the lib (``local function now_ms``, ``local P =``,
``local A, B = ...`` defines both), with the comment lines right above it, up to the next
one: its comment travels with it. A script carries only the fragments it uses: the server
runs every one it is sent, on each call. The fragments are sent as assignments to names
declared on one line before them (``local function f(`` becomes ``f = function(``, on the
same line), in the order that makes the server's Lua find each function's upvalues fastest
(:func:`_hoisted` says why).

**The header** is the run of ``--`` lines at the top of a script. Its fields, in this order::

    -- run_insert: one line saying what the script does.
    -- KEYS[1]  P.."r:"..run      KEYS[2] P.."leases"      (one or more KEYS[i] entries)
    -- ARGV[1]  key prefix        ARGV[2] run              (one or more ARGV[i] entries)
    -- Reply    {OK} | {EXISTS} ...                         (what it answers)
    -- Also touches, undeclared (same hash tag): P.."d:"..dep   (or `Also reads`; optional)
    --- @include arg_text, arg_int, load
    --- @include commit, OK, CORRUPT

``KEYS[i]`` entries name each key the caller sends as a key expression: ``P`` (the prefix,
``ARGV[1]``, ``"{namespace}:"``), ``..`` and string literals or a name (``run``) that some
``ARGV`` entry of the header describes (a description that says ``not read`` marks a key
sent only to name the slot). A script touches no key outside its KEYS but the ones it derives
from ``P`` while it runs (a claimed run, a dependency's waiters), which its ``Also touches``
field (``Also reads`` when it only reads them) says: every key shares the hash tag
``{namespace}``, so all of them are in the cluster slot of its KEYS (a cluster serves a
script only keys of that slot). tests/lua/test_keys_touched.py holds every header to the keys its
operations send and touch.

``--- @include`` lines (one or more; names separated by commas or spaces; a bare
``--- @include`` says the script uses no fragment) name every lib definition the body uses
directly: functions, constants and the reply codes alike. The lib's own fragments find their
dependencies by use instead: a fragment's dependencies are in its own few lines, where a
declared list would only go stale while the lib is reworked, and the build resolves them
exactly (an include brings in what it uses, transitively).

**The checks** (:func:`load` raises :class:`BuildError`, listing every problem at once, when
the package is imported): a body that uses a lib name it does not include, includes one it
does not use or one the lib does not define, uses a name that neither the lib nor Lua defines
(a fragment renamed under it), or declares a local of a lib name's; a lib fragment that uses a
name defined below it (a Lua local is visible only after its definition) or defined nowhere,
a name defined twice, or a generated name defined by hand.

**Built ahead.** ``lua/_built.json`` holds every shipped script as built, with the digest
of what the build read; ``import redisstore`` uses it while the digest holds, and builds
otherwise (:func:`read_built`; ``python -m redisstore.build.lua`` writes it again).

**Generated definitions.** The reply codes are named once, in :class:`Code`, the run
scripts' caps in :class:`redisstore.core.caps.Cap`, and the key schema (every key name the
scripts build from the prefix) in :mod:`redisstore.core.keys`; the build writes each into the
scripts as Lua ``local`` lines (:data:`GENERATED`: ``local OK, NOT_FOUND, ... = 0, 1, ...``,
``local LEASES = P .. 'leases'``, ``local RUN_KEY = 'r:'``); no lib defines them.

**Line mapping.** :attr:`Script.lines` maps each line of the source sent to the file and line
it came from; :meth:`Script.map_error` rewrites a server's ``user_script:104`` (Redis,
Valkey, 6.2's wrapped form) or fakeredis' ``[string "..."]:104`` as ``_lib/codec.lua:42``, which
the driver does in the error a caller sees.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from . import keys
from .caps import Cap


class Code(IntEnum):
    """A run script's reply status code. The build writes the same names and values into the
    run store's scripts (see :data:`GENERATED`): they are defined here only."""

    OK = 0
    NOT_FOUND = 1
    EXISTS = 2
    CONFLICT = 3
    REFUSED = 4
    CORRUPT = 7
    TOO_NEW = 8
    TOO_OLD = 9
    PARTITIONED = 10
    UNCOUNTED = 11
    REWATCH = 12
    SESSION_LAPSED = 13


@dataclass(frozen=True)
class Generated:
    """Lua definitions the build writes from a Python one, ahead of a lib's own: ``text``,
    whose top-level ``local`` lines are fragments as a lib file's are; ``origin`` names the
    Python definition (the line map calls the text ``<origin>``)."""

    origin: str
    text: str

    @property
    def file(self) -> str:
        return f"<{self.origin}>"


def generated_lines(enum: type[IntEnum]) -> list[str]:
    """The Lua ``local`` lines that define ``enum``'s names as its values, one a name: each
    is a fragment of its own, so a script declares only the names it uses (Lua allows a
    function 200 locals, and the fused scripts are near it)."""
    # __members__, not iteration: two names of one value (two caps of 100) are aliases,
    # which iterating an enum skips.
    return [f"local {name} = {int(member)}" for name, member in enum.__members__.items()]


def generated_enum(enum: type[IntEnum]) -> Generated:
    """``enum``'s names, a fragment each: ``local OK = 0``, ``local NOT_FOUND = 1``..."""
    # A blank line after the comment: it heads the text, not the first name's fragment.
    return Generated(enum.__name__, f"-- Generated by redisstore.core.scripts from its "
                     f"{enum.__name__}: named there only.\n\n"
                     + "\n\n".join(generated_lines(enum)) + "\n")


def _lua_string(text: str) -> str:
    if not re.fullmatch(r"[\w:|/#.\-]*", text):
        raise ValueError(f"{text!r}: a key name part is word characters and :|/#.- only")
    return f"'{text}'"


def generated_keys(origin: str, fixed: dict[str, str], parts: dict[str, str]) -> Generated:
    """A key schema (:mod:`redisstore.core.keys`: ``origin`` names its tables, ``*_KEYS`` and
    ``*_PARTS``) as one fragment a name: each key of ``fixed`` ``local LEASES = P ..
    'leases'`` (the prefix, then its suffix), each of ``parts`` ``local RUN_KEY = 'r:'``."""
    # A blank line after the comment: it heads the text, not the first key's fragment (a
    # fragment's comment is sent with it).
    lines = [f"-- Generated by redisstore.core.scripts from {origin}: named there only.", ""]
    for name, suffix in fixed.items():
        lines += [f"local {name} = P .. {_lua_string(suffix)}", ""]
    for name, part in parts.items():
        lines += [f"local {name} = {_lua_string(part)}", ""]
    return Generated(origin, "\n".join(lines))


#: The Lua definitions the build writes into each lib, from Python, ahead of the lib's own
#: (after ``_common.lua``'s): each enum becomes one fragment ``local NAME, ... = value, ...``,
#: each name of the key schema one fragment of its own (:func:`generated_keys`). The lib
#: must not define those names itself.
GENERATED: dict[str, tuple[Generated, ...]] = {
    "_lib": (generated_enum(Code), generated_enum(Cap),
             generated_keys("redisstore.core.keys.RUN_STORE", keys.RUN_STORE_KEYS,
                            keys.RUN_STORE_PARTS)),
    "_repo_lib": (generated_enum(Code), generated_enum(Cap),
                  generated_keys("redisstore.core.keys.REPOSITORY", keys.REPOSITORY_KEYS,
                                 keys.REPOSITORY_PARTS)),
}

#: The line of every script before its fragments. Redis 5.x/6.x with lua-replicate-commands
#: off replicate a script by its source, and refuse a write after TIME; this switches to
#: effects replication (the only mode since 7.0, where the function is gone or a no-op;
#: fakeredis lacks it).
PRELUDE = "if redis.replicate_commands then redis.replicate_commands() end\n"


class BuildError(Exception):
    """Scripts whose headers and bodies disagree, or a lib that cannot be composed: each
    line of the message is one problem, as ``file.lua:line: what to fix``."""


def lua_dir() -> Traversable:
    """Where the scripts are: inside the installed package, else the checkout's ``lua/``."""
    packaged = resources.files("redisstore") / "lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "lua"


@dataclass(frozen=True, slots=True)
class Script:
    """One operation's script: its name, full source and the SHA1 that EVALSHA names.

    ``lines[i]`` is the (file, line) that line ``i + 1`` of ``source`` came from.
    """

    name: str
    source: bytes = field(repr=False)
    sha: str
    lines: tuple[tuple[str, int], ...] = field(default=(), repr=False, compare=False)

    def where(self, line: int) -> str:
        """``file.lua:line`` of line ``line`` (from 1) of the source sent (for a line it
        does not have, ``name(composed):line``)."""
        if 1 <= line <= len(self.lines):
            file, at = self.lines[line - 1]
            return f"{file}:{at}"
        return f"{self.name}(composed):{line}"

    def map_error(self, text: str) -> str:
        """An error text with each position in the source sent (``user_script:104``,
        ``@user_script: 104``, fakeredis' ``[string "<python>"]:104``) written as the file
        and line it came from (``_lib/codec.lua:42``)."""
        return _POSITION.sub(lambda m: self.where(int(m.group(1) or m.group(2))), text)


_POSITION = re.compile(r'@?user_script: ?(\d+)|\[string "[^"\n]*"\]:(\d+)')


# ---------------------------------------------------------------------------- reading Lua

_LEX = re.compile(r"""
    (?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|--[^\n]*)
  | (?P<string>\[(?P<seq>=*)\[.*?\](?P=seq)\]|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<number>(?:\d|\.\d)(?:[eE][+-]|[\w.])*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>\.\.\.|\.\.|==|~=|<=|>=|[^\s\w])
""", re.X | re.S)

_KEYWORDS = frozenset({
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
})

#: The globals of a Redis script (Lua 5.1 and the server's libraries).
LUA_GLOBALS = frozenset({
    "_G", "_VERSION", "assert", "collectgarbage", "dofile", "error", "gcinfo", "getfenv",
    "getmetatable", "ipairs", "load", "loadfile", "loadstring", "module", "newproxy", "next",
    "pairs", "pcall", "print", "rawequal", "rawget", "rawset", "require", "select", "setfenv",
    "setmetatable", "tonumber", "tostring", "type", "unpack", "xpcall", "coroutine", "debug",
    "math", "os", "string", "table", "bit", "cjson", "cmsgpack", "struct", "redis", "KEYS",
    "ARGV",
})


@dataclass
class Names:
    """The names a piece of Lua uses freely (not as a field, a table key or a declaration)
    and the names it declares (locals, parameters, loop variables): name -> first line."""

    used: dict[str, int] = field(default_factory=dict)
    declared: dict[str, int] = field(default_factory=dict)


def _tokens(text: str, line: int) -> Iterator[tuple[str, str, int]]:
    pos = 0
    for m in _LEX.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        kind = m.lastgroup  # the outer group: it closes after the one nested in it
        if kind != "comment":
            yield kind or "", m.group(), line


def names(text: str, line: int = 1) -> Names:
    """What ``text`` (Lua starting at ``line``) uses and declares.

    Scopes are not followed: a name declared anywhere counts as declared.
    """
    toks = list(_tokens(text, line))
    out = Names()
    n = len(toks)

    def at(j: int) -> str:
        return toks[j][1] if j < n else ""

    def is_name(j: int) -> bool:
        return j < n and toks[j][0] == "name" and toks[j][1] not in _KEYWORDS

    def declare(j: int) -> None:
        out.declared.setdefault(toks[j][1], toks[j][2])

    def name_list(j: int) -> int:
        while is_name(j):
            declare(j)
            j += 1
            if at(j) != ",":
                break
            j += 1
        return j

    def params(j: int) -> int:
        if at(j) != "(":
            return j
        j = name_list(j + 1)
        if at(j) == "...":
            j += 1
        return j + 1 if at(j) == ")" else j

    brackets: list[str] = []
    i = 0
    while i < n:
        kind, tok, ln = toks[i]
        if kind == "op":
            if tok in "([{":
                brackets.append(tok)
            elif tok in ")]}" and brackets:
                brackets.pop()
        elif kind == "name" and tok == "local":
            if at(i + 1) == "function" and is_name(i + 2):
                declare(i + 2)
                i = params(i + 3)
            else:
                i = name_list(i + 1)
            continue
        elif kind == "name" and tok == "function":
            j = i + 1
            if is_name(j):  # function a.b:c(...): a is a use, the rest fields
                out.used.setdefault(toks[j][1], toks[j][2])
                j += 1
                while at(j) in (".", ":") and is_name(j + 1):
                    if at(j) == ":":  # a method: `self` is its first parameter
                        out.declared.setdefault("self", toks[j][2])
                    j += 2
            i = params(j)
            continue
        elif kind == "name" and tok == "for":
            i = name_list(i + 1)
            continue
        elif kind == "name" and tok not in _KEYWORDS:
            prev = toks[i - 1] if i else ("", "", 0)
            field_access = prev[0] == "op" and prev[1] in (".", ":")
            table_key = (bool(brackets) and brackets[-1] == "{" and prev[1] in ("{", ",", ";")
                         and at(i + 1) == "=")
            if not (field_access or table_key):
                out.used.setdefault(tok, ln)
        i += 1
    return out


# ---------------------------------------------------------------------------- libs

@dataclass(frozen=True)
class Fragment:
    """One top-level definition of a lib, with the comment lines right above it."""

    names: tuple[str, ...]
    source: str
    #: The line of its file (of its text, for a generated one) the fragment's first line is.
    line: int
    file: str
    scan: Names


@dataclass(frozen=True, eq=False)  # hashed by identity: parse_lib's cache keys on a base
class Lib:
    """A lib file split into fragments, with the problems found in it."""

    name: str
    fragments: tuple[Fragment, ...]
    #: name -> the fragment that defines it.
    defines: dict[str, Fragment]
    problems: tuple[str, ...]

    def needs(self, fragment: Fragment) -> set[str]:
        """The lib names ``fragment`` uses (over-approximated: every use counts, even of a
        local of its own with a lib name; at worst a fragment too many is sent)."""
        return set(fragment.scan.used) & set(self.defines) - set(fragment.names)

    def closure(self, wanted: Iterable[str]) -> list[Fragment]:
        """The fragments defining ``wanted`` and everything they use, in lib order."""
        chosen: set[int] = set()
        todo = [self.defines[n] for n in wanted if n in self.defines]
        while todo:
            frag = todo.pop()
            if id(frag) in chosen:
                continue
            chosen.add(id(frag))
            todo.extend(self.defines[n] for n in self.needs(frag))
        return [f for f in self.fragments if id(f) in chosen]


# A fragment starts at a top-level `local` (with the comment lines right above it) and runs
# up to the next one. `local A, B = ...` defines both names.
_FRAGMENT = re.compile(r"^(?:--[^\n]*\n)*local (?:function )?([A-Za-z_]\w*(?:, *[A-Za-z_]\w*)*)",
                       re.M)


def _split(text: str) -> Iterator[tuple[tuple[str, ...], str, int, int]]:
    """The fragments of a lib's ``text``: the names each defines, its source, its first line
    and the line of its definition."""
    starts = list(_FRAGMENT.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    for m, end in zip(starts, ends, strict=True):
        yield (tuple(n.strip() for n in m.group(1).split(",")),
               text[m.start():end].rstrip() + "\n", text.count("\n", 0, m.start()) + 1,
               text.count("\n", 0, m.end()) + 1)


def generated_fragments(generated: Generated) -> list[Fragment]:
    """The fragments of ``generated``, each as the line map names it (``<origin>``)."""
    return [Fragment(defined, source, line, generated.file, names(source, line))
            for defined, source, line, _ in _split(generated.text)]


@lru_cache(maxsize=8)
def parse_lib(name: str, text: str, generated: tuple[Generated, ...] = (),
              base: Lib | None = None) -> Lib:
    """Split the lib ``name`` (``text``, the file's content) into fragments, after the
    ``generated`` ones and those of ``base`` (a lib it extends), and check it."""
    file = f"{name}.lua"
    problems: list[str] = []
    frags: list[Fragment] = []
    made_frags = [f for g in generated for f in generated_fragments(g)]
    # A name generated for a lib file before this one is as much Python's.
    inherited_made = [f for f in (base.fragments if base is not None else ())
                      if f.file.startswith("<")]
    made = {n: f.file[1:-1] for f in (*inherited_made, *made_frags) for n in f.names}
    for defined, source, line, def_line in _split(text):
        clash = [n for n in defined if n in made]
        if clash:
            problems.append(
                f"{file}:{def_line}: defines {', '.join(clash)}, which redisstore.core.scripts "
                f"generates from {made[clash[0]]}: delete it (the names are defined once, in "
                "Python)")
            continue
        frag = Fragment(defined, source, line, file, names(source, line))
        problems += _unhoistable(frag, def_line)
        frags.append(frag)
    frags[:0] = made_frags
    inherited = base.fragments if base is not None else ()
    defines: dict[str, Fragment] = dict(base.defines) if base is not None else {}
    for frag in frags:
        for n in frag.names:
            if n in defines:
                problems.append(f"{file}:{frag.line}: defines {n} again (first at "
                                f"{defines[n].file}:{defines[n].line}): keep one")
            else:
                defines[n] = frag
    order = {id(f): i for i, f in enumerate((*inherited, *frags))}
    for frag in frags:
        own = frag.scan.declared
        for n, ln in sorted(own.items(), key=lambda kv: kv[1]):
            if n in defines and n not in frag.names:
                # Scopes are not followed: the lib's own would be sent, and all it needs,
                # with every script that sends this fragment (on a fast path, dearly).
                problems.append(f"{file}:{ln}: {frag.names[0]} declares {n}, a name "
                                f"{defines[n].file} defines: rename it")
        for n, ln in sorted(frag.scan.used.items(), key=lambda kv: kv[1]):
            if n in own:
                continue
            if n in defines:
                other = defines[n]
                if order[id(other)] > order[id(frag)]:
                    problems.append(
                        f"{file}:{ln}: {frag.names[0]} uses {n}, which is defined below it "
                        f"({other.file}:{other.line}): a Lua local is visible only after its "
                        f"definition, so move {n} above {frag.names[0]}")
            elif n not in LUA_GLOBALS:
                problems.append(f"{file}:{ln}: {frag.names[0]} uses {n}, which neither "
                                f"{file} nor Lua defines")
    return Lib(name, (*inherited, *frags), defines,
               (*(base.problems if base is not None else ()), *problems))


# ---------------------------------------------------------------------------- scripts

_INCLUDE = re.compile(r"^---[ \t]*@include\b(.*)$")
_ALMOST = re.compile(r"^-+[ \t]*@?include\b")


def header_lines(text: str) -> list[str]:
    """A script's header: the run of ``--`` lines at its top."""
    head = []
    for line in text.split("\n"):
        if not line.startswith("--"):
            break
        head.append(line)
    return head


def includes(name: str, text: str) -> tuple[dict[str, int], list[str]]:
    """The names a script's header includes (name -> line) and the problems of its
    ``--- @include`` lines."""
    file = f"{name}.lua"
    head = len(header_lines(text))
    found: dict[str, int] = {}
    problems: list[str] = []
    seen_line = False
    for ln, line in enumerate(text.split("\n"), 1):
        m = _INCLUDE.match(line)
        if m is None:
            if _ALMOST.match(line):
                problems.append(f"{file}:{ln}: `{line.strip()}`: an include line starts "
                                "`--- @include` (three dashes, an at sign)")
            continue
        if ln > head:
            problems.append(f"{file}:{ln}: a `--- @include` line below the header: includes "
                            "belong to the header, the comment lines at the top")
            continue
        seen_line = True
        rest = m.group(1)
        if not re.fullmatch(r"[\sA-Za-z0-9_,]*", rest):
            problems.append(f"{file}:{ln}: `{line.strip()}`: an include line is "
                            "`--- @include name, name, ...` (lib names, commas or spaces)")
        for n in re.findall(r"[A-Za-z_]\w*", rest):
            if n in found:
                problems.append(f"{file}:{ln}: includes {n} twice (also line {found[n]})")
            found.setdefault(n, ln)
    if not seen_line:
        problems.append(f"{file}:1: no `--- @include` line in the header")
    return found, problems


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _include_lines(wanted: Iterable[str], lib: Lib) -> str:
    names_in_order = sorted(set(wanted), key=lambda n: (lib.defines[n].line, n))
    out, line = [], "--- @include"
    for n in names_in_order:
        if len(line) + len(n) + 2 > 92:
            out.append(line.rstrip(","))
            line = "--- @include"
        line += f" {n},"
    out.append(line.rstrip(","))
    return "\n".join(out)


def check(name: str, text: str, lib: Lib) -> list[str]:
    """The problems of script ``name`` (``text``, its file) against ``lib``."""
    file, libfile = f"{name}.lua", f"{lib.name}.lua"
    wanted, problems = includes(name, text)
    scan = names(text)
    uses = {n: ln for n, ln in scan.used.items() if n in lib.defines}
    for n, ln in sorted(scan.declared.items(), key=lambda kv: kv[1]):
        if n in lib.defines:
            problems.append(f"{file}:{ln}: declares {n}, a name {libfile} defines: rename this "
                            "local (the header cannot tell the two apart)")
    for n, ln in sorted(scan.used.items(), key=lambda kv: kv[1]):
        if n not in lib.defines and n not in LUA_GLOBALS and n not in scan.declared:
            problems.append(f"{file}:{ln}: uses {n}, which neither {libfile} nor Lua defines"
                            f"{_suggest(n, lib.defines)}")
    for n, ln in sorted(uses.items(), key=lambda kv: kv[1]):
        if n not in wanted and n not in scan.declared:
            frag = lib.defines[n]
            problems.append(f"{file}:{ln}: uses {n} ({frag.file}:{frag.line}), which its "
                            "header does not include")
    for n, ln in sorted(wanted.items(), key=lambda kv: kv[1]):
        if n not in lib.defines:
            problems.append(f"{file}:{ln}: includes {n}, which {libfile} does not define"
                            f"{_suggest(n, lib.defines)}")
        elif n not in uses:
            problems.append(f"{file}:{ln}: includes {n}, which the script does not use")
    if problems:
        used = [n for n in uses if n not in scan.declared]
        problems.append(f"{file}: its header's includes should read:\n"
                        + _include_lines(used, lib))
    return problems


# A fragment's definition line: `local function NAME` or `local A, B =`.
_DEFINITION = re.compile(r"^((?:--[^\n]*\n)*)local (?:function ([A-Za-z_]\w*)|(?=[A-Za-z_]))")
# A definition line without a value: `local A, B` (and maybe a comment).
_BARE = re.compile(r"^local [A-Za-z_]\w*(?:, *[A-Za-z_]\w*)*[ \t]*(?:--[^\n]*)?$", re.M)


def _unhoistable(frag: Fragment, def_line: int) -> list[str]:
    """What keeps ``frag`` from being sent as :func:`_hoisted` sends it: a definition without
    a value, or a value that reads a name the fragment defines on its own first line (the
    global it means, ``local tostring = tostring``, is the lib's own nil local once the
    names are declared ahead)."""
    head = frag.source.split("\n")[def_line - frag.line]
    if head.startswith("local function "):
        return []
    if _BARE.match(head):
        return [f"{frag.file}:{def_line}: `{head.strip()}` declares without a value: give "
                "it one (`= nil`, `= false`)"]
    own = [n for n in frag.names if frag.scan.used.get(n) == def_line]
    if own:
        return [f"{frag.file}:{def_line}: {frag.names[0]}'s value reads {', '.join(own)}, a "
                "name it defines: scripts declare every lib name before the fragments, so "
                "that reads the lib's own local, not the global; name it apart"]
    return []


def _assigned(frag: Fragment) -> str:
    """``frag``'s source with its ``local`` definition written as an assignment to the names
    declared before it (``local function f(`` as ``f = function(``): same lines."""
    m = _DEFINITION.match(frag.source)
    if m is None:  # parse_lib cut the fragment at this very pattern
        raise BuildError(f"{frag.file}:{frag.line}: no `local` definition heads this fragment")
    head = f"{m.group(2)} = function" if m.group(2) else ""
    return frag.source[:m.start()] + m.group(1) + head + frag.source[m.end():]


def walk_steps(declared: list[str], captures: list[str]) -> int:
    """The steps Lua 5.1's ``luaF_findupval`` takes to find ``captures`` (each a local a new
    function uses, in the order the functions are made) when the locals are ``declared`` in
    that order: one, plus one for each local already captured that was declared after it."""
    level = {n: i for i, n in enumerate(declared)}
    opened: list[int] = []
    steps = 0
    for name in captures:
        at = level[name]
        steps += 1 + sum(1 for other in opened if other > at)
        if at not in opened:
            opened.append(at)
    return steps


def upvalue_captures(frags: list[Fragment], lib: Lib) -> list[str]:
    """The lib names the functions among ``frags`` use, function by function in lib order,
    each function's in the order of their first use (the order Lua numbers its upvalues)."""
    return [n for f in frags if "\nlocal function " in "\n" + f.source
            for n in sorted(lib.needs(f), key=lambda n: (f.scan.used[n], n))]


#: How many of the names the lib's functions use most :func:`_hoisted` declares last.
_HOT = 15


def _hoisted(frags: list[Fragment], lib: Lib) -> list[tuple[str, str, int]]:
    """The fragments, each definition written as an assignment (same lines) to names all
    declared before the first, in the order that makes the lib cheapest to define.

    Why: Lua 5.1 makes every function of the lib again on each call, and finds each local
    it uses (an upvalue) by walking the list of locals captured so far, from the last
    declared down to the one it wants: for compare_and_set that walk was a third of what the
    script paid before its own first line. Declared as the lib defines them, the names used
    most (the prefix, push, the reply codes) were the first and every walk went to the
    bottom of the list. Here they come last, and the rest in the order functions first use
    them, so that most walks stop within a few steps (a model of the walk, checked with
    callgrind: 7,880 steps for compare_and_set before, about 4,000 after).
    """
    if not frags:
        return []
    # A slow path's fragments also use the fast path's, declared outside: not walked here.
    own = {n for f in frags for n in f.names}
    captures = [n for n in upvalue_captures(frags, lib) if n in own]
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, n in enumerate(captures):
        count[n] = count.get(n, 0) + 1
        first.setdefault(n, i)
    hot = sorted(count, key=lambda n: (count[n], -first[n]))[-_HOT:]
    hot_set = set(hot)
    names_in_lib = [n for f in frags for n in f.names]
    declared = ([n for n in names_in_lib if n not in first]
                + sorted((n for n in first if n not in hot_set), key=first.__getitem__)
                + hot)
    # A small lib (get's) walks less in its own order.
    if walk_steps(names_in_lib, captures) <= walk_steps(declared, captures):
        declared = names_in_lib
    parts: list[tuple[str, str, int]] = [(f"local {', '.join(declared)}\n", "<lib names>", 1)]
    parts += [(_assigned(f), f.file, f.line) for f in frags]
    return parts


#: The line that splits a script's body into its fast path (above) and its slow path
#: (below); see :func:`compose`.
SLOW_MARK = "--- @slow"

#: The lines around the slow path, made only where the fast path falls through to it.
SLOW_OPEN, SLOW_CLOSE = "return (function()\n", "end)()\n"


def split_slow(text: str) -> tuple[str, str | None, int]:
    """``text`` cut at its ``--- @slow`` line: the part above, the part below (None without
    the line) and the line the part below starts at."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.rstrip() == SLOW_MARK:
            return "\n".join(lines[:i]) + "\n", "\n".join(lines[i + 1:]), i + 2
    return text, None, 1


def paths(text: str, lib: Lib, wanted: Iterable[str]) -> tuple[list[Fragment], list[Fragment]]:
    """The fragments of script ``text`` that ``wanted`` needs, as the script defines them:
    those its fast path uses, at the top, and those only its slow path uses, inside the
    slow path's function (none without a ``--- @slow`` line)."""
    wanted = set(wanted)
    fast, slow, _ = split_slow(text)
    if slow is None:
        return lib.closure(wanted), []
    eager = lib.closure(set(names(fast).used) & wanted)
    chosen = {id(f) for f in eager}
    return eager, [f for f in lib.closure(wanted) if id(f) not in chosen]


def compose(name: str, text: str, lib: Lib, wanted: Iterable[str]) -> Script:
    """Script ``name``: the prelude, the fragments of ``lib`` that ``wanted`` needs (as
    :func:`_hoisted` writes them), then ``text``; with the line map.

    A script with a ``--- @slow`` line has two paths. The fast one, above the line, handles
    the common case with the few fragments it uses and returns its answer; any other case it
    lets fall through, before it has written anything, to the slow one, the general code
    below the line. The slow path and the fragments only it uses are one function made
    where the fast path falls through (``return (function() ... end)()``), so a call that
    stays on the fast path never makes them: Lua makes every function a script defines
    again on each call, about 1,000 server instructions each, and finds every local a
    function uses among those captured so far; a slow path defined ahead of the fast one
    cost the fast path a fifth of its instructions. Both paths share the fast path's
    fragments and their state (a run loaded, the layout checked), so the slow path repeats
    no read.
    """
    file = f"{name}.lua"
    parts: list[tuple[str, str, int]] = [(PRELUDE, "<prelude>", 1)]
    eager, lazy = paths(text, lib, wanted)
    fast, slow, slow_line = split_slow(text)
    if slow is None:
        parts += _hoisted(eager, lib)
        parts.append((text if text.endswith("\n") else text + "\n", file, 1))
    else:
        parts += _hoisted(eager, lib)
        parts.append((fast, file, 1))
        parts.append((SLOW_OPEN, "<slow path>", 1))
        parts += _hoisted(lazy, lib)
        parts.append((slow if slow.endswith("\n") else slow + "\n", file, slow_line))
        parts.append((SLOW_CLOSE, "<slow path>", 2))
    lines: list[tuple[str, int]] = []
    for source, file, first in parts:
        lines += [(file, first + i) for i in range(source.count("\n"))]
    data = "".join(source for source, _, _ in parts).encode()
    return Script(name, data, hashlib.sha1(data).hexdigest(), tuple(lines))


#: The lib every lib extends: fragments both ports' scripts use (its definitions come
#: first, so a lib's own may use them).
COMMON = "_common"


#: The libs kept as a folder of files, one a concept (``lua/_lib/keys.lua``...), in the
#: order the build reads them: a file's fragments may use those of the files before it.
LIBS: dict[str, tuple[str, ...]] = {
    "_lib": ("keys", "args", "index", "signals", "feed", "layout", "commit", "codec", "sessions",
             "runs",
             "partitions", "claims", "leases", "fanout", "taking", "write", "finish", "ops",
             "lean", "lean_write", "lean_one", "old"),
}


def read_lib(folder: Traversable, lib: str) -> Lib:
    """The lib ``lua/<lib>.lua`` of ``folder`` (or the files of the folder ``lua/<lib>/``
    that :data:`LIBS` lists, in its order) on top of ``lua/_common.lua``, parsed, with its
    generated fragments."""
    common = folder / f"{COMMON}.lua"
    base = parse_lib(COMMON, common.read_text(encoding="utf-8")) if common.is_file() else None
    if lib not in LIBS or (folder / f"{lib}.lua").is_file():
        return parse_lib(lib, (folder / f"{lib}.lua").read_text(encoding="utf-8"),
                         GENERATED.get(lib, ()), base)
    files = LIBS[lib]
    found = sorted(p.name for p in (folder / lib).iterdir() if p.name.endswith(".lua"))
    stray = [f"{lib}/{name}: a lib file redisstore.core.scripts.LIBS does not list: add it "
             "there, in its place" for name in found if name.removesuffix(".lua") not in files]
    generated = GENERATED.get(lib, ())
    for name in files:
        base = parse_lib(f"{lib}/{name}", (folder / lib / f"{name}.lua").read_text(
            encoding="utf-8"), generated, base)
        generated = ()
    assert base is not None
    return Lib(lib, base.fragments, base.defines, (*base.problems, *stray))


def load(name: str, lib: str = "_lib", folder: Traversable | None = None) -> Script:
    """Script ``lua/<name>.lua``, built with the fragments of ``lua/<lib>.lua`` its header
    includes; raise :class:`BuildError` on any problem of the script or of its lib."""
    return load_all([(name, lib)], folder)[name]


def load_all(specs: Iterable[tuple[str, str]], folder: Traversable | None = None, *,
             every: bool = False) -> dict[str, Script]:
    """Every script of ``specs`` (``(name, lib)`` pairs) by name, or one BuildError that
    lists every problem of all of them and of their libs. With ``every`` (``specs`` are all
    the scripts: the build), a lib fragment none of them sends is a problem too: dead code."""
    folder = lua_dir() if folder is None else folder
    problems: list[str] = []
    libs: dict[str, Lib] = {}
    out: dict[str, Script] = {}
    sent: set[tuple[str, int]] = set()
    for name, libname in specs:
        if libname not in libs:
            libs[libname] = read_lib(folder, libname)
            problems += libs[libname].problems
        text = (folder / f"{name}.lua").read_text(encoding="utf-8")
        found = check(name, text, libs[libname])
        problems += found
        if not found:
            wanted = includes(name, text)[0]
            out[name] = compose(name, text, libs[libname], wanted)
            sent.update((f.file, f.line) for f in libs[libname].closure(wanted))
    if every and not problems:
        problems += unsent(libs.values(), sent)
    if problems:
        raise BuildError("the Lua scripts do not build (redisstore/core/scripts.py explains the "
                         "header):\n" + "\n".join(problems))
    return out


def unsent(libs: Iterable[Lib], sent: set[tuple[str, int]]) -> list[str]:
    """A problem for each fragment of ``libs`` (their files, not the generated names) whose
    ``(file, line)`` is not in ``sent``: no script uses it."""
    seen: set[tuple[str, int]] = set()
    problems = []
    for lib in libs:
        for frag in lib.fragments:
            where = (frag.file, frag.line)
            if where in seen or where in sent or frag.file not in _LIB_FILES:
                continue
            seen.add(where)
            problems.append(f"{frag.file}:{frag.line}: {', '.join(frag.names)}: no script "
                            "uses it: delete it (or include it where it is used)")
    return problems


#: The lib files a fragment may come from (a generated fragment has none of these names).
_LIB_FILES = frozenset({f"{COMMON}.lua", "_repo_lib.lua", *(
    f"{lib}/{name}.lua" for lib, files in LIBS.items() for name in files)})


def script_names(prefix: str, folder: Traversable | None = None) -> tuple[str, ...]:
    """The scripts of ``lua/`` whose file name starts with ``prefix`` (``run_``, ``repo_``),
    in name order: the folder is the list, nothing names a script twice."""
    folder = lua_dir() if folder is None else folder
    return tuple(sorted(entry.name.removesuffix(".lua") for entry in folder.iterdir()
                        if entry.name.startswith(prefix) and entry.name.endswith(".lua")))


RUN_NAMES = script_names("run_")
REPO_NAMES = script_names("repo_")

#: Every shipped script and the lib it is built with.
SHIPPED = tuple([(n, "_lib") for n in RUN_NAMES] + [(n, "_repo_lib") for n in REPO_NAMES])

# ---------------------------------------------------------------------------- built ahead

#: The shipped scripts as built, beside the Lua: generated by ``python -m
#: redisstore.build.lua`` (:func:`write_built`), so that ``import redisstore`` reads them
#: instead of building them (about 0.2 s). It records the digest of everything the build
#: reads (:func:`sources_digest`); where that differs (a Lua file or this module edited and
#: the file not generated again), the scripts are built as before, so a stale file is never
#: used. tests/lua/test_build.py checks that the shipped one is current.
BUILT_FILE = "_built.json"


def _lua_files(folder: Traversable, under: str = "") -> Iterator[tuple[str, Traversable]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = f"{under}{entry.name}"
        if entry.is_dir():
            yield from _lua_files(entry, name + "/")
        elif entry.name.endswith(".lua"):
            yield name, entry


def sources_digest(folder: Traversable | None = None) -> str:
    """SHA1 of what the build reads: every Lua file of ``folder`` (its path and text), the
    generated definitions, and this module's own source (how it composes)."""
    folder = lua_dir() if folder is None else folder
    digest = hashlib.sha1()
    for name, entry in _lua_files(folder):
        digest.update(f"{name}\0".encode())
        digest.update(entry.read_bytes())
        digest.update(b"\0")
    for generated in GENERATED.values():
        for one in generated:
            digest.update(one.text.encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def _segments(lines: tuple[tuple[str, int], ...]) -> list[list[Any]]:
    """A line map as runs of consecutive lines: [file, first line, count]."""
    out: list[list[Any]] = []
    for file, line in lines:
        last = out[-1] if out else None
        if last is not None and last[0] == file and last[1] + last[2] == line:
            last[2] += 1
        else:
            out.append([file, line, 1])
    return out


def write_built(folder: Traversable | None = None) -> Path:
    """Build every shipped script and write :data:`BUILT_FILE` beside the Lua."""
    folder = lua_dir() if folder is None else folder
    built = load_all(SHIPPED, folder, every=True)
    data = {"generated by": "python -m redisstore.build.lua: do not edit",
            "digest": sources_digest(folder),
            "scripts": {name: {"sha": s.sha, "source": s.source.decode("utf-8"),
                               "lines": _segments(s.lines)} for name, s in built.items()}}
    path = Path(str(folder)) / BUILT_FILE
    path.write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_built(folder: Traversable | None = None) -> dict[str, Script] | None:
    """The scripts of :data:`BUILT_FILE`, or None where it is missing, unreadable or not
    current (its digest is not :func:`sources_digest`'s)."""
    folder = lua_dir() if folder is None else folder
    try:
        data = json.loads((folder / BUILT_FILE).read_text(encoding="utf-8"))
        if data["digest"] != sources_digest(folder):
            return None
        out = {}
        for name, entry in data["scripts"].items():
            source = entry["source"].encode("utf-8")
            if hashlib.sha1(source).hexdigest() != entry["sha"]:
                return None
            # The map has a line for each line of the source, no more (a damaged count
            # would make a huge tuple).
            if sum(count for _, _, count in entry["lines"]) != source.count(b"\n"):
                return None
            lines = tuple((str(file), int(first) + i) for file, first, count in entry["lines"]
                          for i in range(count))
            out[name] = Script(name, source, entry["sha"], lines)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return out if set(out) == {name for name, _ in SHIPPED} else None


_BUILT = read_built() or load_all(SHIPPED, every=True)

# Each script as a constant, RUN_<NAME> for lua/run_<name>.lua (REPO_ for repo_), made from
# the folder below. Declared for the type checker and the reader by `python -m
# redisstore.build.lua`, from the folder (tests/codegen/test_generated.py checks them).
# --- declarations: begin
REPO_DELETE: Script
REPO_GROUP_EXISTS: Script
REPO_LIST_IN_FLIGHT: Script
REPO_LOAD: Script
REPO_MIGRATE: Script
REPO_PARTITIONS: Script
REPO_REGISTER_GROUP: Script
REPO_SAVE: Script
RUN_CAS_CLAIM: Script
RUN_CLAIM: Script
RUN_CLAIM_EXPIRED: Script
RUN_CLAIM_READY: Script
RUN_COMPARE_AND_SET: Script
RUN_DELETE: Script
RUN_DELIVERED: Script
RUN_FINISH: Script
RUN_FINISH_CLAIM: Script
RUN_GET: Script
RUN_GET_MANY: Script
RUN_HEADS: Script
RUN_INSERT: Script
RUN_MIGRATE: Script
RUN_NOTIFY: Script
RUN_NOW: Script
RUN_PARTITIONS: Script
RUN_QUARANTINED: Script
RUN_RATES: Script
RUN_REFRESH: Script
RUN_RELEASE: Script
RUN_RELEASE_CLAIM: Script
RUN_RENEW: Script
RUN_RESTORE: Script
RUN_SESSION_CLOSE: Script
RUN_SESSION_KEEPALIVE: Script
RUN_SESSION_OPEN: Script
RUN_SESSIONS: Script
RUN_UNWATCH: Script
RUN_WATCH: Script
# --- declarations: end

globals().update({name.upper(): script for name, script in _BUILT.items()})

#: The scripts only a store spread over partitions sends (a partition's prefix, {ns#p}:).
PARTITION_SCRIPTS = tuple(_BUILT[name] for name in ("run_watch", "run_notify", "run_delivered",
                                                   "run_unwatch"))
RUN_SCRIPTS = tuple(_BUILT[name] for name in RUN_NAMES)

#: The repository scripts only a repository spread over partitions sends.
REPO_PARTITION_SCRIPTS = (_BUILT["repo_partitions"],)
REPO_SCRIPTS = tuple(_BUILT[name] for name in REPO_NAMES)
