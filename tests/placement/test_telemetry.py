"""The accounting behind both servers' ``/metrics``, in-process (no cluster): the request
middleware's bounded route labels, the state store's calls and failures by reason, the
collections' bounded labels and eventual-path series, the admission verdicts. The
end-to-end scrape of the real processes is tests/placement/test_metrics.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import kopf
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from o41.collections.engine import Engine
from o41.operator import telemetry as operator_telemetry
from o41.state import KeyValue, LeaseNotFound, StoreFull, StoreUnavailable
from o41.state.memory import MemoryStore
from o41.webhook import telemetry
from testbed.usage import ORG, bearer, seeded_app

Client = TestClient[web.Request, web.Application]


def value(name: str, **labels: str) -> float:
    found = telemetry.REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture
async def client(aiohttp_client: Any) -> Client:
    made: Client = await aiohttp_client(seeded_app([]))
    return made


async def test_requests_are_counted_by_route_template_never_by_raw_path(client: Client) -> None:
    def requests(route: str, method: str, status: str) -> float:
        return value("o41_http_requests_total", route=route, method=method, status=status)

    artifacts = "/v1/organizations/{organization}/artifacts"
    before = {
        "health": requests("/healthz", "GET", "200"),
        "missing": requests("unmatched", "GET", "404"),
        "bad": requests("/v1/writes", "POST", "400"),
        "list": requests(artifacts, "GET", "200"),
        "seconds": value(
            "o41_http_request_duration_seconds_count", route="/v1/writes", method="POST"
        ),
    }
    assert (await client.get("/healthz")).status == 200
    assert (await client.get(f"/v1/{ORG}/secret-path", headers=bearer())).status == 404
    json_type = {"Content-Type": "application/json"}
    r = await client.post("/v1/writes", data=b"{not json", headers=bearer() | json_type)
    assert r.status == 400
    r = await client.get(f"/v1/organizations/{ORG}/artifacts", headers=bearer())
    assert r.status == 200, await r.text()
    r = await client.request("PROPFIND", "/healthz")
    assert r.status == 405
    assert requests("/healthz", "GET", "200") == before["health"] + 1
    assert requests("unmatched", "GET", "404") == before["missing"] + 1
    assert requests("/v1/writes", "POST", "400") == before["bad"] + 1
    assert requests(artifacts, "GET", "200") == before["list"] + 1
    assert requests("unmatched", "other", "405") >= 1  # nor is a method of no route
    seconds = value("o41_http_request_duration_seconds_count", route="/v1/writes", method="POST")
    assert seconds == before["seconds"] + 1
    text = (await (await client.get("/metrics")).read()).decode()
    routes = {
        s.labels["route"]
        for f in text_string_to_metric_families(text)
        if f.name == "o41_http_requests"
        for s in f.samples
    }
    assert not [r for r in routes if ORG in r or "secret-path" in r]
    assert value("o41_http_requests_in_flight") == 0


class Failing(MemoryStore):
    """An embedded store whose ``get`` fails as ``error`` says."""

    error: Exception | None = None
    extra = "the wrapped store's own attribute"

    async def get(self, key: bytes, *, consistency: Any = "strong") -> KeyValue | None:
        if self.error is not None:
            raise self.error
        return await super().get(key, consistency=consistency)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (StoreUnavailable("no majority"), "unavailable"),
        (StoreFull("database space exceeded"), "full"),
        (LeaseNotFound("gone"), "lease_not_found"),
        (RuntimeError("a bug"), "error"),
    ],
)
async def test_state_store_calls_and_failures_by_operation_and_reason(
    error: Exception, reason: str
) -> None:
    inner = Failing()
    store = cast(Any, telemetry.instrumented(inner))
    assert store.extra == Failing.extra
    assert telemetry.instrumented(store) is store  # wrapped once
    calls = value("o41_state_store_requests_total", operation="get")
    failed = value("o41_state_store_failures_total", operation="get", reason=reason)
    timed = value("o41_state_store_request_duration_seconds_count", operation="get")
    await store.put(b"k", b"v")
    found = await store.get(b"k")
    assert found is not None and found.value == b"v"
    inner.error = error
    with pytest.raises(type(error)):
        await store.get(b"k")
    assert value("o41_state_store_requests_total", operation="get") == calls + 2
    assert value("o41_state_store_failures_total", operation="get", reason=reason) == failed + 1
    assert value("o41_state_store_request_duration_seconds_count", operation="get") == timed + 2


def test_collection_labels_take_only_the_engines_own_names() -> None:
    known = Engine(MemoryStore()).operations()
    labels = telemetry.collection_labels
    assert labels(known, "dict", "set", {"consistency": "eventual"}) == ("dict", "set", "eventual")
    assert labels(known, "dict", "set", {}) == ("dict", "set", "strong")
    assert labels(known, "dict", "x" * 200, {}) == ("dict", "other", "strong")
    assert labels(known, "made-up", "set", {}) == ("other", "other", "strong")
    assert labels(known, "queue", "offer", {"consistency": "weird"}) == ("queue", "offer", "other")
    assert labels(known, "queue", "offer", ["not", "a", "dict"]) == ("queue", "offer", "strong")


async def test_the_eventual_buffer_and_its_writes_are_read_from_the_engine() -> None:
    engine = Engine(MemoryStore(), flush_interval=3600)
    telemetry.ENGINE.follow(engine)
    flushed = value("o41_collections_eventual_flushed_total")
    for i in range(3):
        args = {"key": f"s{i}", "value": b"v", "consistency": "eventual"}
        await engine.call("ns", "c", "dict", "d", "set", args)
    assert value("o41_collections_eventual_buffered") == 3 == engine.buffer.count
    assert value("o41_collections_eventual_buffer_capacity") == engine.buffer.max_buffer
    await engine.close()  # writes out what is buffered
    assert value("o41_collections_eventual_buffered") == 0
    assert value("o41_collections_eventual_flushed_total") == engine.stats.flushed >= 3
    assert flushed >= 0 and value("o41_collections_eventual_dropped_total") == 0


def verdicts(handler: str) -> dict[str, float]:
    get = operator_telemetry.REGISTRY.get_sample_value
    names = ("allowed", "refused", "unavailable", "error")
    return {
        v: get("o41_operator_admission_requests_total", {"handler": handler, "verdict": v}) or 0
        for v in names
    }


def test_admission_verdicts_of_sync_and_async_handlers() -> None:
    @operator_telemetry.admission("test-sync")
    def sync(fail: Exception | None = None, **_: Any) -> None:
        if fail is not None:
            raise fail

    @operator_telemetry.admission("test-async")
    async def run_async(fail: Exception | None = None, **_: Any) -> None:
        if fail is not None:
            raise fail

    assert asyncio.iscoroutinefunction(run_async) and not asyncio.iscoroutinefunction(sync)
    failures = [
        None,
        kopf.AdmissionError("a rule says no", code=422),
        kopf.AdmissionError("could not read the Locations", code=503),
        RuntimeError("a bug"),
    ]
    for fail in failures:
        raised = (kopf.AdmissionError, RuntimeError)
        with pytest.raises(raised) if fail else contextlib.nullcontext():
            sync(fail=fail)
        with pytest.raises(raised) if fail else contextlib.nullcontext():
            asyncio.run(run_async(fail=fail))
    for handler in ("test-sync", "test-async"):
        assert verdicts(handler) == {"allowed": 1, "refused": 1, "unavailable": 1, "error": 1}


def test_plain_families_read_as_prometheus_reads_them() -> None:
    """A value on a bound counts in that bound's bucket (``le``); buckets are cumulative,
    with ``_sum`` and ``_count``; a family with no child yet still has its name."""
    from prometheus_client import CollectorRegistry, generate_latest

    from o41.webhook.telemetry.families import Families

    families, registry = Families(), CollectorRegistry()
    registry.register(families)
    seconds = families.histogram("t_seconds", "t", ["op"], (0.1, 1.0))
    calls = families.counter("t_calls", "t", ["op"])
    families.counter("t_unused", "t", ["op"])
    for v in (0.05, 0.1, 0.5, 7.0):
        seconds.labels("get").observe(v)
    calls.labels("get").inc()
    calls.labels("get").inc(2)
    with pytest.raises(ValueError, match="takes labels"):
        calls.labels("get", "extra")
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    bucket = "t_seconds_bucket"
    assert samples[bucket, (("le", "0.1"), ("op", "get"))] == 2
    assert samples[bucket, (("le", "1.0"), ("op", "get"))] == 3
    assert samples[bucket, (("le", "+Inf"), ("op", "get"))] == 4
    assert samples["t_seconds_count", (("op", "get"),)] == 4
    assert samples["t_seconds_sum", (("op", "get"),)] == pytest.approx(7.65)
    assert samples["t_calls_total", (("op", "get"),)] == 3
    assert "# TYPE t_unused_total counter" in text


async def test_build_info_names_the_running_version(aiohttp_client: Any) -> None:
    """``o41_build_info{version}`` is 1 on the service's /metrics: which replicas run what
    during a rollout (the chart's alerts and dashboard may join on it)."""
    from o41 import __version__
    from o41.webhook.telemetry.metrics import metrics_app

    scraper = await aiohttp_client(metrics_app())
    text = (await (await scraper.get("/metrics")).read()).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "o41_build_info"]
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("o41_build_info", {"version": __version__}, 1.0)
    ]


def test_the_operator_names_its_version_too() -> None:
    """The operator's /metrics carries ``o41_build_info{version}`` as the service's does."""
    from prometheus_client import generate_latest

    from o41 import __version__

    text = generate_latest(operator_telemetry.REGISTRY).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "o41_build_info"]
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("o41_build_info", {"version": __version__}, 1.0)
    ]
