"""A ready-made ``discover`` for JSON records, so a store can use readiness without writing one.

The record is a JSON object; its ``"wait"`` field (the name is configurable) says what the
run waits for:

=================================================================  =========================
``{"wait": {"changed": "run-7", "seen": 3, "deadline": 1.8e12}}``   ``Changed("run-7", 3, …)``
``{"wait": {"changed": "run-7"}}``                                  ``Changed("run-7")``
``{"wait": {"poll": "inbox", "interval": 5000}}``                   ``Poll("inbox", 5000)``
``{"wait": {"at": 1800000000000}}``                                 ``At(1800000000000)``
no ``"wait"``, ``null``, or a record that is not a JSON object      ``None``
=================================================================  =========================

``seen`` and ``deadline`` are optional; times are backend UTC milliseconds. A ``"wait"``
that is present but malformed raises ``ValueError``, so the write that carries it is
refused with nothing written rather than silently never becoming ready.
"""

from __future__ import annotations

import json
from typing import Any

from .core.runs import At, Changed, Discover, Poll, Wait


def _int(spec: dict[str, Any], name: str, *, required: bool) -> Any:
    value = spec.get(name)
    if value is None:
        if required:
            raise ValueError(f"wait field {name!r} is required")
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_wait(spec: Any) -> Wait | None:
    """The Wait a JSON ``"wait"`` value stands for (see the module's table)."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"a wait must be a JSON object, got {spec!r}")
    kinds = [k for k in ("changed", "poll", "at") if k in spec]
    if len(kinds) != 1:
        raise ValueError(f"a wait names exactly one of changed, poll, at: {spec!r}")
    try:
        if kinds[0] == "changed":
            return Changed(spec["changed"], _int(spec, "seen", required=False),
                           _int(spec, "deadline", required=False))
        if kinds[0] == "poll":
            return Poll(spec["poll"], _int(spec, "interval", required=True),
                        _int(spec, "deadline", required=False))
        return At(_int(spec, "at", required=True))
    except TypeError as exc:
        raise ValueError(f"malformed wait {spec!r}: {exc}") from exc


def json_discovery(field: str = "wait") -> Discover:
    """A discover function reading the wait from the record's JSON field ``field``."""

    def discover(record: bytes) -> Wait | None:
        try:
            document = json.loads(record)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(document, dict):
            return None
        return parse_wait(document.get(field))

    discover.__name__ = f"json_discovery({field!r})"
    return discover


#: The discover function for records whose JSON ``"wait"`` field says what they wait for.
json_wait: Discover = json_discovery()
