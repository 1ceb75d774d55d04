"""OpenTelemetry metrics and spans for every store call, through OpenTelemetry's API, when
it is installed (``pip install 'redisstore[otel]'``); without it, nothing is done and
nothing is imported. Configure a ``TracerProvider`` / ``MeterProvider`` as usual; the
library only records. Names follow OpenTelemetry's database-client conventions:

- span ``redisstore <operation>`` (kind CLIENT) per store call, with ``db.system.name``
  (``redis``), ``db.operation.name`` (the script: ``run_claim_ready``...),
  ``db.namespace`` (the store's namespace), and on failure ``error.type`` (the error's
  class: ``Conflict``, ``LeaseRefused``, ``Unavailable``...) and ``redisstore.outcome``
  (an ``Unavailable``'s outcome);
- histogram ``db.client.operation.duration`` (s) with the same attributes;
- counter ``redisstore.runs.claimed``: runs handed out by ``claim_ready`` /
  ``claim_expired``, by operation.

The keeper's lateness is the histogram ``redisstore.keeper.lateness`` (ms); the runs a
worker's handler had, the counter ``redisstore.worker.runs`` by ``redisstore.outcome``
(``done``, ``released``, ``failed``, ``lost``, ``stopped``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from .errors import Unavailable

try:  # optional: the library works the same without it
    import opentelemetry.metrics as _metrics
    import opentelemetry.trace as _trace

    _HAVE = True
except ImportError:  # pragma: no cover - exercised where opentelemetry is not installed
    _HAVE = False

try:  # where the API keeps its global providers (None until set): read once per call
    import opentelemetry.metrics._internal as _metrics_state
    _FAST = hasattr(_trace, "_TRACER_PROVIDER") and hasattr(_metrics_state, "_METER_PROVIDER")
except ImportError:  # pragma: no cover
    _FAST = False

_SCOPE = "redisstore"
#: The claim scripts, whose runs are counted: the core's claim operations register them
#: (:func:`count_claims`, from ``runops.CLAIM_KINDS``).
_CLAIMS: set[str] = set()


def count_claims(names: Iterable[str]) -> None:
    """Count the runs the scripts ``names`` claim (``redisstore.runs.claimed``)."""
    _CLAIMS.update(names)


class Call:
    """What a shell tells telemetry about one store call: set ``result`` on success."""

    __slots__ = ("name", "namespace", "result")

    def __init__(self) -> None:
        self.name: str | None = None
        self.namespace: str | None = None
        self.result: Any = None


class _Instruments:
    """The tracer and instruments, from the global providers (or the ones given)."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        #: Whether providers were given (they record whatever the global ones are).
        self.given = tracer_provider is not None or meter_provider is not None
        meter = (meter_provider.get_meter(_SCOPE) if meter_provider is not None
                 else _metrics.get_meter(_SCOPE))
        self.tracer = (tracer_provider.get_tracer(_SCOPE) if tracer_provider is not None
                       else _trace.get_tracer(_SCOPE))
        self.duration = meter.create_histogram(
            "db.client.operation.duration", unit="s",
            description="Duration of a redisstore call, its round trips included")
        self.claimed = meter.create_counter(
            "redisstore.runs.claimed", unit="{run}",
            description="Runs handed out by claim_ready and claim_expired")
        self.worker_runs = meter.create_counter(
            "redisstore.worker.runs", unit="{run}",
            description="Runs a worker's handler had, by how they ended")
        self.lateness = meter.create_histogram(
            "redisstore.keeper.lateness", unit="ms",
            description="How late a keeper's renewal round started")
        self.keepalives = meter.create_counter(
            "redisstore.session.keepalives", unit="{call}",
            description="Keepalives of a keeper's session, by outcome (kept, lapsed)")
        self.taken = meter.create_counter(
            "redisstore.session.runs_taken", unit="{run}",
            description="Runs a keepalive reported taken from its session")


_INSTRUMENTS: _Instruments | None = None


def _instruments() -> _Instruments | None:
    global _INSTRUMENTS
    if not _HAVE:
        return None
    if _INSTRUMENTS is None:
        _INSTRUMENTS = _Instruments()
    return _INSTRUMENTS


def enabled() -> bool:
    """Whether OpenTelemetry's API is installed (calls are then recorded)."""
    return _HAVE


#: Set once a global tracer or meter provider is (OpenTelemetry sets each at most once).
_LIVE = False


def recording() -> bool:
    """Whether a store call is recorded now: OpenTelemetry's API is installed and a tracer
    or meter provider is set (globally, or given to the instruments). Until one is, the
    API's proxies would record nothing, and a call costs no telemetry work at all."""
    global _LIVE
    if _LIVE:
        return True
    if not _HAVE:
        return False
    if _INSTRUMENTS is not None and _INSTRUMENTS.given:
        return True
    if _FAST and _trace._TRACER_PROVIDER is None and _metrics_state._METER_PROVIDER is None \
            and not _FROM_ENV:
        return False
    if isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider) \
            and type(_metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider":
        return False
    _LIVE = True
    return True


#: Providers named by environment variables, which the API loads on first use.
_FROM_ENV = any(name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER",
                                                "OTEL_PYTHON_METER_PROVIDER"))


@contextmanager
def operation(call: Call) -> Iterator[Call]:
    """Record one store call: a span around it, its duration and, for a claim, the runs
    it handed out. ``call.name`` and ``call.namespace`` may be set while it runs."""
    instruments = _instruments()
    if instruments is None:
        yield call
        return
    started = time.perf_counter()
    with instruments.tracer.start_as_current_span(
            "redisstore", kind=_trace.SpanKind.CLIENT,
            record_exception=False, set_status_on_exception=False) as span:
        error: BaseException | None = None
        try:
            yield call
        except BaseException as exc:
            error = exc
            raise
        finally:
            name = call.name or "unknown"
            attributes: dict[str, str] = {"db.system.name": "redis",
                                          "db.operation.name": name}
            if call.namespace:
                attributes["db.namespace"] = call.namespace
            if error is not None:
                attributes["error.type"] = type(error).__name__
                if isinstance(error, Unavailable):
                    attributes["redisstore.outcome"] = error.outcome
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(error)))
            span.update_name(f"redisstore {name}")
            span.set_attributes(attributes)
            instruments.duration.record(time.perf_counter() - started, attributes)
            if error is None and name in _CLAIMS:
                runs = call.result[0] if isinstance(call.result, tuple) else call.result
                if isinstance(runs, list) and runs:
                    instruments.claimed.add(len(runs), {"db.operation.name": name})


def worker_run(namespace: str, outcome: str) -> None:
    """Count a run a worker's handler had, by how it ended (``done``, ``released``,
    ``failed``, ``quarantined``, ``lost``, ``stopped``, ``unknown``): once each, so a
    try that quarantined the run counts as ``quarantined`` only (``Worker.stats`` counts
    it under ``failed`` too)."""
    instruments = _instruments()
    if instruments is not None:
        instruments.worker_runs.add(1, {"db.namespace": namespace,
                                        "redisstore.outcome": outcome})


def keeper_lateness(ms: float) -> None:
    """Record how late a keeper's round started."""
    instruments = _instruments()
    if instruments is not None:
        instruments.lateness.record(ms)


def session_keepalive(outcome: str, taken: int) -> None:
    """Count a keeper's keepalive (``kept`` or ``lapsed``) and the runs it reported taken
    from the session."""
    instruments = _instruments()
    if instruments is not None:
        instruments.keepalives.add(1, {"redisstore.outcome": outcome})
        if taken:
            instruments.taken.add(taken)
