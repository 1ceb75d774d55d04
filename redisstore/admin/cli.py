"""What the command line shows of a server: its URL and errors with the credentials hidden.

The command itself is :mod:`redisstore.__main__` (``redisstore`` and ``python -m
redisstore``); these stay here, where users import :func:`redact` from (docs/dashboard.md).
"""

from __future__ import annotations

import re
from urllib.parse import unquote


def redact(url: str) -> str:
    """``url`` with its user info and any ``password=`` / ``username=`` query value replaced
    by ``***``: safe to show. Works on text, not on a parse: a password with an unescaped
    ``#``, ``/`` or ``?`` still goes."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    rest = _QUERY_SECRET.sub(r"\1***", rest)
    return f"{scheme}{sep}{rest}"


# A query parameter redis-py reads credentials from.
_QUERY_SECRET = re.compile(r"([?&](?:password|username)=)[^&#]*", re.IGNORECASE)


def _secrets(url: str | None) -> list[str]:
    """The parts of ``url`` that must never be shown, as written and decoded."""
    if url is None:
        return []
    rest = url.partition("://")[2] or url
    found = [rest.rsplit("@", 1)[0]] if "@" in rest else []
    found += [m.group(0).split("=", 1)[1] for m in _QUERY_SECRET.finditer(rest)]
    for part in list(found):
        found += [unquote(piece) for piece in part.split(":")] + part.split(":")
    return sorted({x for x in found if len(x) >= 2}, key=len, reverse=True)


def hide(text: str, url: str | None) -> str:
    """``text`` with every credential of ``url`` replaced by ``***``: where it stands as a
    token of its own (not inside a word), so a user named "app" leaves "applied" whole and
    a message never spells out a password by what it left around it."""
    for secret in _secrets(url):
        text = re.sub(r"(?<![A-Za-z0-9])" + re.escape(secret) + r"(?![A-Za-z0-9])", "***",
                      text)
    return text
