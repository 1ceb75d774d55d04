"""Writes the shipped scripts as built, beside the Lua (``lua/_built.json``, see
:data:`redisstore.core.scripts.BUILT_FILE`), and the scripts' constants' declarations in
``core/scripts.py`` (``RUN_<NAME>: Script``, one per file of ``lua/``): run ``python -m
redisstore.build.lua`` after adding, removing or editing a Lua file or the build, so that
``import redisstore`` reads the scripts instead of building them and the type checker knows
each constant. ``--check`` only tells whether both are current."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from redisstore.core import scripts

#: The module whose declarations are written here.
SCRIPTS = Path(scripts.__file__)
_BLOCK = re.compile(r"(# --- declarations: begin\n)(.*?)(# --- declarations: end\n)", re.DOTALL)


def declared(text: str) -> str:
    """``text`` (core/scripts.py's) with its declarations as the folder ``lua/`` makes them:
    one ``RUN_<NAME>: Script`` (``REPO_``) a script, in name order."""
    names = (*scripts.script_names("run_"), *scripts.script_names("repo_"))
    lines = "".join(f"{name.upper()}: Script\n" for name in sorted(names))
    made, count = _BLOCK.subn(lambda m: m.group(1) + lines + m.group(3), text)
    if count != 1:
        raise ValueError(f"{SCRIPTS}: no block of declarations to write")
    return made


def main(argv: list[str]) -> int:
    text = SCRIPTS.read_text(encoding="utf-8")
    if argv[1:] == ["--check"]:
        stale = declared(text) != text or scripts.read_built() is None
        if stale:
            print("stale: run python -m redisstore.build.lua", file=sys.stderr)
        return 1 if stale else 0
    if argv[1:]:
        print("usage: python -m redisstore.build.lua [--check]", file=sys.stderr)
        return 2
    if declared(text) != text:  # first: the built file's digest reads this module
        SCRIPTS.write_text(declared(text), encoding="utf-8")
        print(f"wrote {SCRIPTS}")
    print(scripts.write_built())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
