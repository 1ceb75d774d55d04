"""What redisstore.core.telemetry records through OpenTelemetry's API: a CLIENT span and a
duration per call, with the database-client attributes, the error's type and an
Unavailable's outcome; the runs a claim handed out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from servers import unique_namespace

from redisstore import (
    Claim,
    Conflict,
    Hold,
    InSession,
    Keeper,
    RedisRunStore,
    Seize,
    Unavailable,
)
from redisstore.core import telemetry

SPANS = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def providers() -> Iterator[None]:
    """Providers of this module's own (the global ones stay unset: the rest of the suite
    records nothing)."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(SPANS))
    meter_provider = MeterProvider(metric_readers=[READER])
    telemetry._INSTRUMENTS = telemetry._Instruments(tracer_provider, meter_provider)
    yield
    telemetry._INSTRUMENTS = None
    tracer_provider.shutdown()
    meter_provider.shutdown()


def points(name: str) -> list[Any]:
    data = READER.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found += list(metric.data.data_points)
    return found


def test_calls_make_client_spans_and_durations_with_their_attributes() -> None:
    assert telemetry.enabled()
    SPANS.clear()
    store = RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace())
    store.insert("run", b"x", Claim("me", 1))
    with pytest.raises(Conflict):
        store.compare_and_set("run", 7, b"y", Hold("me"))
    spans = {s.name: s for s in SPANS.get_finished_spans()}
    insert = spans["redisstore run_insert"]
    assert insert.kind == trace.SpanKind.CLIENT
    assert insert.attributes["db.system.name"] == "redis"
    assert insert.attributes["db.namespace"] == store.namespace
    cas = spans["redisstore run_compare_and_set"]
    assert cas.attributes["error.type"] == "Conflict"
    assert cas.status.status_code == trace.StatusCode.ERROR
    durations = {p.attributes["db.operation.name"]: p for p in
                 points("db.client.operation.duration")}
    assert durations["run_insert"].count >= 1 and durations["run_insert"].sum > 0


def test_claims_count_the_runs_they_hand_out_and_unavailable_says_its_outcome() -> None:
    import redis

    store = RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace())
    for i in range(3):
        store.insert(f"r{i}", b"x", Claim("dead", 1))
    import time

    time.sleep(0.01)
    before = sum(p.value for p in points("redisstore.runs.claimed"))
    assert len(store.claim_expired("me", 60_000, 10)) == 3
    after = sum(p.value for p in points("redisstore.runs.claimed"))
    assert after - before == 3
    SPANS.clear()
    down = RedisRunStore(redis.Redis(port=1), namespace="nowhere", timeout=300)
    with pytest.raises(Unavailable):
        down.get("run")
    (span,) = [s for s in SPANS.get_finished_spans() if s.name.endswith("run_get")]
    assert span.attributes["error.type"] == "Unavailable"
    assert span.attributes["redisstore.outcome"] == "not_applied"


def test_a_keepers_session_counts_its_keepalives_and_the_runs_taken() -> None:
    """A keeper's keepalives are counted as kept, and a run seized from its session as
    taken (once: the keeper reports it lost and holds it no more)."""
    store = RedisRunStore(fakeredis.FakeRedis(), namespace=unique_namespace())
    kept = {p.attributes["redisstore.outcome"]: p.value
            for p in points("redisstore.session.keepalives")}
    taken = sum(p.value for p in points("redisstore.session.runs_taken"))
    with Keeper(store, "me", 300) as keeper:
        session = keeper.open_session()
        revision = store.insert("run", b"x", InSession("me", session))
        keeper.add("run")
        store.compare_and_set("run", revision, b"x", Seize("thief", 60_000))
        deadline = time.monotonic() + 5
        while keeper.runs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert keeper.runs == []
    now = {p.attributes["redisstore.outcome"]: p.value
           for p in points("redisstore.session.keepalives")}
    assert now.get("kept", 0) > kept.get("kept", 0)
    assert sum(p.value for p in points("redisstore.session.runs_taken")) == taken + 1
