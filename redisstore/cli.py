"""``redisstore``: the command line. ``redisstore demo`` shows two engine nodes sharing
runs through one store, on embedded fakeredis by default or on a server with ``--url`` (or
``REDISSTORE_URL``). A URL's credentials are never printed."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from . import Claim, Hold, LeaseRefused, RedisRunStore, Release, __version__
from .discovery import json_wait


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


def _client(url: str | None) -> Any:
    if url is None:
        try:
            import fakeredis
        except ImportError:
            sys.exit("the embedded default needs fakeredis: pip install 'redisstore[embedded]'")
        return fakeredis.FakeRedis()
    import redis

    return redis.Redis.from_url(url)


def demo(url: str | None, out: Any = None) -> int:
    """Run the demo (printing to ``out``, default stdout); a failure is printed, without the
    URL's credentials, and answers 2."""
    out = sys.stdout if out is None else out
    try:
        return _demo(url, out)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        for secret in _secrets(url):
            text = text.replace(secret, "***")
        print(f"redisstore demo failed on {redact(url) if url else 'fakeredis'}: {text}",
              file=out)
        return 2


def _demo(url: str | None, out: Any) -> int:
    """Two nodes share runs: claims, a crash, a takeover, a fenced zombie, a timed wait."""

    def say(text: str) -> None:
        print(text, file=out)

    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(_client(url), namespace=namespace, discover=json_wait)
    say(f"store: {'fakeredis (embedded)' if url is None else redact(url)}, "
        f"namespace {namespace!r}")
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
    store.close()
    return 0 if claimed == ["reminder-7"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``redisstore`` command."""
    parser = argparse.ArgumentParser(prog="redisstore", description=__doc__)
    parser.add_argument("--version", action="version", version=f"redisstore {__version__}")
    sub = parser.add_subparsers(dest="command")
    run_demo = sub.add_parser("demo", help="two nodes sharing runs (the default command)")
    run_demo.add_argument("--url", default=os.environ.get("REDISSTORE_URL"),
                          help="redis://127.0.0.1:6379/0 (default: $REDISSTORE_URL, else "
                               "embedded fakeredis); credentials are never printed")
    args = parser.parse_args(argv)
    url = getattr(args, "url", None) or os.environ.get("REDISSTORE_URL") or None
    return demo(url)


if __name__ == "__main__":
    sys.exit(main())
