"""Writes the shipped scripts as built, beside the Lua (``lua/_built.json``, see
:data:`redisstore.core.scripts.BUILT_FILE`): run ``python -m redisstore.build.lua`` after editing a
Lua file or the build, so that ``import redisstore`` reads them instead of building them."""

from __future__ import annotations

from redisstore.core import scripts

if __name__ == "__main__":
    print(scripts.write_built())
