"""The operator's metrics, served on a port of their own (``--metrics-port``), by
Prometheus's conventions (base units, ``_total``, ``_seconds`` histograms, bounded labels).

- ``o41_operator_locations{organization,cloud,ready,role}``: how many Locations, and
  ``o41_operator_location_ready{organization,location,cloud,role}`` (1 or 0) each. Both are
  computed at scrape time from the operator's own memory: kopf's index of the Locations'
  specs, the operator's record (Ready: its last setup or check, never status, which a
  user can write), and the fallback and cloud defaults it put in force (``role``:
  fallback, default, "fallback,default" or none).
- ``o41_operator_organization_fallback{organization}``: 1 when the organization has a
  fallback in force; ``o41_operator_organization_takes_writes{organization}``.
- ``o41_operator_location_setup_duration_seconds{outcome}`` and
  ``o41_operator_location_check_duration_seconds{outcome}`` (ok, failed), and
  ``o41_operator_location_failures_total{phase,reason}`` (``o41.storage.Reason`` or
  SecretNotFound).
- ``o41_operator_admission_requests_total{handler,verdict}``: the admission webhook's
  answers (allowed, refused: a rule said no; unavailable: it could not decide, so it said
  no; error: a bug) and ``o41_operator_admission_duration_seconds{handler}``.
- ``o41_operator_reconcile_errors_total{resource}``: a handler raised (kopf retries it).
- ``o41_build_info{version}``: always 1, the running version (as the service's).
- The process, the Python runtime and its GC.

Organization and Location names are labels: cluster-scoped objects the platform team
creates, so bounded. No label takes a namespace or any other user string.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import kopf
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from o41 import __version__
from o41.operator.index import LocationsIndex, recorded
from o41.operator.model import role

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from o41.operator.state import Shared

P = ParamSpec("P")
R = TypeVar("R")

REGISTRY = CollectorRegistry(auto_describe=True)
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

#: ``o41_build_info{version}``: always 1, the running version (as the service's).
BUILD = Info("o41_build", "The operator's version (always 1).", registry=REGISTRY)
BUILD.info({"version": __version__})

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

SETUP_SECONDS = Histogram(
    "o41_operator_location_setup_duration_seconds",
    "Time of one setup of a Location's bucket (create or adopt), by outcome (ok, failed).",
    ["outcome"],
    buckets=BUCKETS,
    registry=REGISTRY,
)
CHECK_SECONDS = Histogram(
    "o41_operator_location_check_duration_seconds",
    "Time of one periodic check that a Ready Location's bucket is reachable, by outcome.",
    ["outcome"],
    buckets=BUCKETS,
    registry=REGISTRY,
)
FAILURES = Counter(
    "o41_operator_location_failures",
    "Location setups and checks that failed, by phase (setup, check) and reason.",
    ["phase", "reason"],
    registry=REGISTRY,
)
ADMISSION = Counter(
    "o41_operator_admission_requests",
    "Admission reviews answered, by handler and verdict (allowed, refused, unavailable, error).",
    ["handler", "verdict"],
    registry=REGISTRY,
)
ADMISSION_SECONDS = Histogram(
    "o41_operator_admission_duration_seconds",
    "Time to answer an admission review, by handler.",
    ["handler"],
    buckets=BUCKETS,
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "o41_operator_reconcile_errors",
    "Handlers that raised (kopf retries or logs them), by resource.",
    ["resource"],
    registry=REGISTRY,
)


def failed(phase: str, reason: str) -> None:
    FAILURES.labels(phase, reason).inc()


def _verdict(e: BaseException | None) -> str:
    if e is None:
        return "allowed"
    if isinstance(e, kopf.AdmissionError):
        return "unavailable" if (e.code or 0) >= 500 else "refused"
    return "error"


def admission(handler: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Count an admission handler's verdicts and time it (sync or async alike: kopf
    awaits the one and runs the other in a thread, as before)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        def done(start: float, e: BaseException | None) -> None:
            ADMISSION.labels(handler, _verdict(e)).inc()
            ADMISSION_SECONDS.labels(handler).observe(time.perf_counter() - start)

        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                start = time.perf_counter()
                try:
                    result = await cast(Callable[P, Awaitable[Any]], fn)(*args, **kwargs)
                except BaseException as e:
                    done(start, e)
                    raise
                done(start, None)
                return result

            return cast(Callable[P, R], run_async)

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                done(start, e)
                raise
            done(start, None)
            return result

        return run

    return wrap


def reconciled(resource: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Count the handler's errors (any exception it lets out) by ``resource``; kopf's own
    temporary errors count too: the setup's retries are reconcile errors."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                try:
                    return await cast(Callable[P, Awaitable[Any]], fn)(*args, **kwargs)
                except Exception:
                    RECONCILE_ERRORS.labels(resource).inc()
                    raise

            return cast(Callable[P, R], run_async)

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except Exception:
                RECONCILE_ERRORS.labels(resource).inc()
                raise

        return run

    return wrap


class Timed:
    """``with Timed(SETUP_SECONDS):`` observes the block's time under outcome ok or failed
    (any exception: kopf's retries included)."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram

    def __enter__(self) -> Timed:
        self.start = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        outcome = "ok" if kind is None else "failed"
        self.histogram.labels(outcome).observe(time.perf_counter() - self.start)


class LocationsCollector(Collector):
    """The Locations and Organizations as the operator knows them, computed at scrape
    time: the index (specs), the records (Ready) and what it put in force (roles)."""

    def __init__(self) -> None:
        self.state: Shared | None = None
        self.index: LocationsIndex | None = None

    def follow(self, state: Shared, index: LocationsIndex) -> None:
        self.state, self.index = state, index

    def collect(self) -> Iterable[Metric]:
        count = GaugeMetricFamily(
            "o41_operator_locations",
            "Locations, by organization, cloud, Ready (from the operator's record) and role.",
            labels=["organization", "cloud", "ready", "role"],
        )
        each = GaugeMetricFamily(
            "o41_operator_location_ready",
            "1 if the Location is Ready (the operator's last setup or check), else 0.",
            labels=["organization", "location", "cloud", "role"],
        )
        fallback = GaugeMetricFamily(
            "o41_operator_organization_fallback",
            "1 if the organization has a fallback in force, else 0.",
            labels=["organization"],
        )
        takes = GaugeMetricFamily(
            "o41_operator_organization_takes_writes",
            "1 if the organization takes writes (its fallback is Ready), else 0.",
            labels=["organization"],
        )
        state, index = self.state, self.index
        if state is not None:
            in_force = dict(state.organizations.in_force)
            counts: dict[tuple[str, str, str, str], int] = {}
            for organization, locations in list((index or {}).items()):
                effective = in_force.get(organization)
                for location in list(locations):
                    now = recorded(location, state.records)
                    played = (role(now.name, effective) if effective else "") or "none"
                    ready = "true" if now.ready else "false"
                    key = (organization, now.cloud, ready, played)
                    counts[key] = counts.get(key, 0) + 1
                    each.add_metric(
                        [organization, now.name, now.cloud, played], 1 if now.ready else 0
                    )
            for labels, n in sorted(counts.items()):
                count.add_metric(list(labels), n)
            for organization, effective in sorted(in_force.items()):
                fallback.add_metric([organization], 1 if effective.fallback else 0)
                takes.add_metric([organization], 1 if effective.takes_writes else 0)
        yield from (count, each, fallback, takes)


LOCATIONS = LocationsCollector()
REGISTRY.register(LOCATIONS)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def serve(host: str, port: int) -> web.AppRunner:
    """``/metrics`` on ``host:port``; the caller cleans the runner up at shutdown."""
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
