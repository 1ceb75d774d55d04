"""The Lua scripts, one per operation, read from the ``lua/`` folder.

In a wheel the folder ships as ``redisstore/lua``; in a source checkout it is the top-level
``lua/``. Each script is sent with the shared fragments of ``_lib.lua`` in front, and is
called by its SHA1 (EVALSHA); the shells load it only after a NOSCRIPT.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path


def lua_dir() -> Traversable:
    """Where the scripts are: inside the installed package, else the checkout's ``lua/``."""
    packaged = resources.files(__package__) / "lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


@dataclass(frozen=True, slots=True)
class Script:
    """One operation's script: its name, full source and the SHA1 that EVALSHA names."""

    name: str
    source: bytes = field(repr=False)
    sha: str


# A fragment is one top-level `local` definition of a lib file (with the comment lines right
# above it), up to the next one. `local A, B = ...` defines both names.
_FRAGMENT = re.compile(rb"^(?:--[^\n]*\n)*local (?:function )?([A-Za-z_]\w*(?:, [A-Za-z_]\w*)*)",
                       re.M)
_WORD = re.compile(rb"[A-Za-z_]\w*")
_COMMENT = re.compile(rb"--[^\n]*")


def _words(source: bytes) -> set[bytes]:
    return set(_WORD.findall(_COMMENT.sub(b"", source)))


def fragments(lib: bytes) -> list[tuple[bytes, bytes]]:
    """A lib file's fragments as (name, source), in file order (its header is dropped). A
    fragment defining several names is listed once per name, with the same source."""
    starts = list(_FRAGMENT.finditer(lib))
    ends = [m.start() for m in starts[1:]] + [len(lib)]
    return [(name, lib[m.start():end].rstrip() + b"\n")
            for m, end in zip(starts, ends, strict=True)
            for name in m.group(1).split(b", ")]


def used_fragments(lib: bytes, body: bytes) -> bytes:
    """The fragments of ``lib`` that ``body`` uses, directly or through another fragment.

    Every fragment a script sends is code the server runs on each call (it defines the
    functions anew), so a script carries only what it calls.
    """
    parts = fragments(lib)
    needed: set[bytes] = set()
    words = _words(body)
    while True:
        more = {name for name, _ in parts if name in words} - needed
        if not more:
            break
        needed |= more
        for name, source in parts:
            if name in more:
                words |= _words(source)
    chosen: list[bytes] = []
    for name, source in parts:
        if name in needed and source not in chosen:
            chosen.append(source)
    return b"".join(chosen)


def load(name: str, lib: str = "_lib") -> Script:
    """Read ``lua/<name>.lua`` with the fragments of ``lua/<lib>.lua`` that it uses in front."""
    folder = lua_dir()
    body = (folder / f"{name}.lua").read_bytes()
    # Redis 5.x/6.x with lua-replicate-commands off replicate a script by its source, and
    # refuse a write after TIME; this switches to effects replication (the only mode since
    # 7.0, where the function is gone or a no-op; fakeredis lacks it).
    source = (b"if redis.replicate_commands then redis.replicate_commands() end\n"
              + used_fragments((folder / f"{lib}.lua").read_bytes(), body) + b"\n" + body)
    return Script(name, source, hashlib.sha1(source).hexdigest())


RUN_NOW = load("run_now")
RUN_GET = load("run_get")
RUN_INSERT = load("run_insert")
RUN_COMPARE_AND_SET = load("run_compare_and_set")
RUN_RENEW = load("run_renew")
RUN_CLAIM_EXPIRED = load("run_claim_expired")
RUN_CLAIM_READY = load("run_claim_ready")
RUN_REFRESH = load("run_refresh")
RUN_QUARANTINED = load("run_quarantined")

RUN_SCRIPTS = (RUN_NOW, RUN_GET, RUN_INSERT, RUN_COMPARE_AND_SET, RUN_RENEW, RUN_CLAIM_EXPIRED,
               RUN_CLAIM_READY, RUN_REFRESH, RUN_QUARANTINED)

# The instance repository's scripts, with their own fragments (lua/_repo_lib.lua).
REPO_SAVE = load("repo_save", lib="_repo_lib")
REPO_LOAD = load("repo_load", lib="_repo_lib")
REPO_DELETE = load("repo_delete", lib="_repo_lib")
REPO_LIST_IN_FLIGHT = load("repo_list_in_flight", lib="_repo_lib")
REPO_REGISTER_GROUP = load("repo_register_group", lib="_repo_lib")
REPO_GROUP_EXISTS = load("repo_group_exists", lib="_repo_lib")
REPO_MIGRATE = load("repo_migrate", lib="_repo_lib")

REPO_SCRIPTS = (REPO_SAVE, REPO_LOAD, REPO_DELETE, REPO_LIST_IN_FLIGHT, REPO_REGISTER_GROUP,
                REPO_GROUP_EXISTS, REPO_MIGRATE)
