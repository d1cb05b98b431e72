"""The placement service's own metrics, beside the usage counters of
``o41.webhook.telemetry.metrics``, in the same registry (one ``GET /metrics``), by Prometheus's
conventions: base units, ``_total`` counters, ``_seconds`` histograms, and labels whose
values are bounded.

- Requests (RED): ``o41_http_requests_total{route,method,status}`` and
  ``o41_http_request_duration_seconds{route,method}``, from :func:`middleware`. ``route`` is
  the route's template (``/v1/collections/{compute}/{kind}/{name}/{op}``), never the raw
  path; a path no route matches (or a method none of its routes takes) is ``unmatched``;
  ``method`` is one of HTTP's (anything else is ``other``). WebSocket upgrades are
  counted, their lifetime is not a latency.
- The state store: calls, failures (``reason``: unavailable, full, lease_not_found,
  error) and latency by ``operation`` (the ``Store`` methods), from :class:`Instrumented`.
- Buckets: URLs signed and bucket failures by ``location`` (Location names: the platform
  team creates them, admission bounds them) and ``operation`` (sign, call) and ``reason``
  (``o41.storage.Reason``).
- Collections: operations by ``kind``, ``op`` (only the engine's own names; anything else
  is ``other``), ``consistency`` and ``outcome`` (ok, refused, unavailable), with latency;
  open WebSockets; the eventual writes buffered now and those dropped (ended in doubt).
- Tokens refused by ``reason`` (``o41.core.trust``'s codes) and ``trust_domain`` (the
  TrustDomains a platform admin made, ``vm.o41`` for service tokens, or empty).
- The process (CPU, memory, file descriptors), the Python runtime and its GC.
- ``o41_build_info{version}``: always 1, the running version (``o41.__version__``, which the
  image's tag and the chart's appVersion follow): which replicas run what during a rollout.

No label takes a namespace, an artifact, a version, a key or a token.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from o41 import __version__
from o41.state import (
    Compare,
    Consistency,
    KeyValue,
    LeaseNotFound,
    Op,
    Store,
    StoreFull,
    StoreUnavailable,
    TxnResult,
    WatchEvent,
)
from o41.webhook.telemetry.families import Families
from o41.webhook.telemetry.metrics import METRICS

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from o41.collections.engine import Engine

T = TypeVar("T")
REGISTRY = METRICS.registry  # one /metrics: the usage counters and these

# latency buckets (seconds): a signed URL answers in ~1 ms, an etcd round trip in a few,
# a strong barrier or lock wait up to 25 s
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"
OTHER = "other"

for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)
FAMILIES = (
    Families()
)  # plain numbers, changed on the event loop only (o41.webhook.telemetry.families)
REGISTRY.register(FAMILIES)
BUILD = Info("o41_build", "The placement service's version (always 1).", registry=REGISTRY)
BUILD.info({"version": __version__})

REQUESTS = FAMILIES.counter(
    "o41_http_requests",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "status"],
)
TOKENS_REFUSED = FAMILIES.counter(
    "o41_tokens_refused",
    "Tokens of other clusters' issuers and service tokens refused, by reason (Expired, "
    "WrongAudience, ...) and trust domain (empty: no trust domain named it).",
    ["reason", "trust_domain"],
)
REQUEST_SECONDS = FAMILIES.histogram(
    "o41_http_request_duration_seconds",
    "Time to answer an HTTP request (WebSocket upgrades excluded), by route template.",
    ["route", "method"],
    BUCKETS,
)
IN_FLIGHT = FAMILIES.gauge(
    "o41_http_requests_in_flight", "HTTP requests being answered now (open WebSockets too)."
)
STORE_CALLS = FAMILIES.counter(
    "o41_state_store_requests",
    "Calls to the state store (etcd), by operation.",
    ["operation"],
)
STORE_FAILURES = FAMILIES.counter(
    "o41_state_store_failures",
    "State-store calls that failed, by operation and reason (unavailable: no majority or "
    "a timeout; full: etcd's NOSPACE alarm; lease_not_found; error).",
    ["operation", "reason"],
)
STORE_SECONDS = FAMILIES.histogram(
    "o41_state_store_request_duration_seconds",
    "Time of a state-store call, by operation (watches: not timed).",
    ["operation"],
    BUCKETS,
)
SIGNED = FAMILIES.counter(
    "o41_bucket_signatures",
    "Bucket signings (one per signing call: a multipart upload's URLs are one), by location.",
    ["location"],
)
BUCKET_FAILURES = FAMILIES.counter(
    "o41_bucket_failures",
    "Bucket requests of the service that failed, by location, operation (sign, call) and "
    "reason (o41.storage.Reason).",
    ["location", "operation", "reason"],
)
COLLECTION_OPS = FAMILIES.counter(
    "o41_collections_operations",
    "Collection operations, by kind, op, consistency and outcome (ok, refused, unavailable).",
    ["kind", "op", "consistency", "outcome"],
)
COLLECTION_SECONDS = FAMILIES.histogram(
    "o41_collections_operation_duration_seconds",
    "Time of a collection operation (waits of barriers and locks included), by kind and op.",
    ["kind", "op", "consistency"],
    BUCKETS,
)
WEBSOCKETS = FAMILIES.gauge(
    "o41_collections_websockets",
    "Collections WebSocket connections open now.",
)
WEBSOCKETS_OPENED = FAMILIES.counter(
    "o41_collections_websockets_opened",
    "Collections WebSocket connections accepted.",
)


# --- requests ---------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route_of(request: web.Request) -> str:
    """The route's template, bounded: never the raw path a client sent."""
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    if resource is None or getattr(info, "http_exception", None) is not None:
        return UNMATCHED
    canonical: str = resource.canonical
    return canonical


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time every request by route template, method and final status. Put it
    first: it sees the status the error middleware answered with."""
    start = time.perf_counter()
    method = request.method if request.method in METHODS else OTHER
    status, upgraded = 500, False
    IN_FLIGHT.inc()
    try:
        response = await handler(request)
    except web.HTTPException as e:
        status = e.status
        raise
    else:
        status = response.status
        upgraded = isinstance(response, web.WebSocketResponse)
        return response
    finally:
        IN_FLIGHT.dec()
        route = route_of(request)
        REQUESTS.labels(route, method, str(status)).inc()
        if not upgraded:
            REQUEST_SECONDS.labels(route, method).observe(time.perf_counter() - start)


# --- the state store --------------------------------------------------------------------


def _reason(e: BaseException) -> str:
    if isinstance(e, StoreFull):
        return "full"
    if isinstance(e, StoreUnavailable):
        return "unavailable"
    if isinstance(e, LeaseNotFound):
        return "lease_not_found"
    return "error"


class _Timed:
    """One operation's children, looked up once (``labels()`` costs more than the count)."""

    __slots__ = ("calls", "name", "seconds")

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = STORE_CALLS.labels(name)
        self.seconds = STORE_SECONDS.labels(name)

    async def run(self, call: Awaitable[T]) -> T:
        self.calls.inc()
        start = time.perf_counter()
        try:
            return await call
        except Exception as e:
            STORE_FAILURES.labels(self.name, _reason(e)).inc()
            raise
        finally:
            self.seconds.observe(time.perf_counter() - start)


_OPS = ("get", "range", "put", "delete", "txn", "lease_grant", "lease_keepalive", "lease_revoke")
_TIMED = {name: _Timed(name) for name in (*_OPS, "watch")}


class Instrumented:
    """A ``Store`` that counts and times each call of the one it wraps; what it does not
    define (a store's own extras) is the wrapped store's."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def get(self, key: bytes, *, consistency: Consistency = "strong") -> KeyValue | None:
        return await _TIMED["get"].run(self.store.get(key, consistency=consistency))

    async def range(
        self,
        prefix: bytes,
        *,
        limit: int = 0,
        consistency: Consistency = "strong",
        start: bytes = b"",
        end: bytes = b"",
    ) -> list[KeyValue]:
        return await _TIMED["range"].run(
            self.store.range(prefix, limit=limit, consistency=consistency, start=start, end=end)
        )

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        return await _TIMED["put"].run(self.store.put(key, value, lease=lease))

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        return await _TIMED["delete"].run(self.store.delete(key, prefix=prefix))

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        return await _TIMED["txn"].run(self.store.txn(compare, success, failure))

    async def lease_grant(self, ttl: int) -> int:
        return await _TIMED["lease_grant"].run(self.store.lease_grant(ttl))

    async def lease_keepalive(self, lease: int) -> int:
        return await _TIMED["lease_keepalive"].run(self.store.lease_keepalive(lease))

    async def lease_revoke(self, lease: int) -> None:
        await _TIMED["lease_revoke"].run(self.store.lease_revoke(lease))

    async def watch(
        self,
        prefix: bytes,
        *,
        start_revision: int = 0,
        prev_kv: bool = False,
        deletes_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        timed = _TIMED["watch"]
        timed.calls.inc()
        try:
            async for event in self.store.watch(
                prefix, start_revision=start_revision, prev_kv=prev_kv, deletes_only=deletes_only
            ):
                yield event
        except Exception as e:
            STORE_FAILURES.labels("watch", _reason(e)).inc()
            raise

    async def close(self) -> None:
        await self.store.close()


def instrumented(store: Store) -> Store:
    return store if isinstance(store, Instrumented) else Instrumented(store)


# --- buckets ----------------------------------------------------------------------------


def signed(location: str) -> None:
    SIGNED.labels(location).inc()


def bucket_failed(location: str, operation: str, reason: str) -> None:
    BUCKET_FAILURES.labels(location, operation, reason).inc()


# --- collections ------------------------------------------------------------------------


def collection_labels(
    known: Mapping[str, Collection[str]], kind: str, op: str, args: object
) -> tuple[str, str, str]:
    """(kind, op, consistency), each from a fixed set: a name the engine does not know is
    ``other`` (clients send these strings)."""
    ops = known.get(kind)
    if ops is None:
        kind, op = OTHER, OTHER
    elif op not in ops:
        op = OTHER
    consistency = args.get("consistency", "strong") if isinstance(args, dict) else "strong"
    return kind, op, consistency if consistency in ("strong", "eventual") else OTHER


def collection_done(labels: tuple[str, str, str], outcome: str, seconds: float) -> None:
    COLLECTION_OPS.labels(*labels, outcome).inc()
    COLLECTION_SECONDS.labels(*labels).observe(seconds)


class EngineCollector(Collector):
    """The eventual path of the collections engine this process runs now: writes waiting
    for etcd, and those that reached it, ended in doubt (dropped) or failed a flush."""

    def __init__(self) -> None:
        self._engine: weakref.ReferenceType[Engine] | None = None

    def follow(self, engine: Engine) -> None:
        self._engine = weakref.ref(engine)

    def collect(self) -> Iterable[Metric]:
        engine = self._engine() if self._engine is not None else None
        depth = GaugeMetricFamily(
            "o41_collections_eventual_buffered",
            "Eventual collection writes acknowledged and waiting for etcd on this replica.",
        )
        flushed = CounterMetricFamily(
            "o41_collections_eventual_flushed",
            "Eventual collection writes that reached etcd.",
        )
        dropped = CounterMetricFamily(
            "o41_collections_eventual_dropped",
            "Eventual counter adds and queue offers whose write ended in doubt and were "
            "dropped (at most once).",
        )
        lost = CounterMetricFamily(
            "o41_collections_eventual_lost_on_close",
            "Eventual writes still buffered when the service stopped without reaching etcd.",
        )
        capacity = GaugeMetricFamily(
            "o41_collections_eventual_buffer_capacity",
            "Eventual writes a replica buffers before it refuses more (503).",
        )
        if engine is not None:
            depth.add_metric([], engine.buffer.count)
            flushed.add_metric([], engine.stats.flushed)
            dropped.add_metric([], engine.stats.dropped)
            lost.add_metric([], engine.stats.lost_on_close)
            capacity.add_metric([], engine.buffer.max_buffer)
        yield from (depth, flushed, dropped, lost, capacity)


ENGINE = EngineCollector()
REGISTRY.register(ENGINE)
