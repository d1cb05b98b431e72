"""Prometheus counters of the usage this replica served, and ``GET /metrics``.

The same counts as the usage records (``o41.webhook.usage.counters``), incremented at the same
place (``Usage.add`` calls ``observe``), but process-local: Prometheus scrapes every
replica and ``sum()`` adds them up, while the records in the state store add up replicas
for the usage page. Label cardinality is bounded: location names are no label, and once
``MAX_LABEL_SETS`` distinct label sets exist in a family, new ones are counted under one
``_other`` label set (the ``o41_usage_label_sets_folded_total`` counter says how often).
Regions come from clients, so without the cap a misbehaving job could grow the series
without end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

MAX_LABEL_SETS = int(os.environ.get("O41_METRICS_MAX_LABEL_SETS", "2000"))  # per family
OTHER = "_other"
UNKNOWN = "unknown"
PLACE = ("organization", "cloud", "region", "source")


class UsageMetrics:
    """One registry of usage counters; tests make their own, the service uses ``METRICS``."""

    def __init__(self, max_label_sets: int = MAX_LABEL_SETS) -> None:
        self.max_label_sets = max_label_sets
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*PLACE, *extra], registry=self.registry)

        self.begins = counter("o41_begins", "Writes begun, by writer place and rule.", "rule")
        self.warnings = counter(
            "o41_fallback_warnings", "Begins placed on the fallback with a warning."
        )
        self.writes = counter("o41_writes", "Versions committed, by writer place.", "rule")
        self.write_bytes = counter("o41_write_bytes", "Bytes committed, by writer place.", "rule")
        self.reads = counter("o41_reads", "Reads served, by reader place.", "locality")
        self.read_bytes = counter("o41_read_bytes", "Bytes of reads served.", "locality")
        self.folded = Counter(
            "o41_usage_label_sets_folded",
            "Observations counted under the _other label set: the label-set cap was reached.",
            registry=self.registry,
        )
        # each family's children by label values: labels() costs more than the increment
        self._children: dict[str, dict[tuple[str, ...], Any]] = {}

    def _inc(self, family: str, counter: Counter, values: tuple[str, ...], n: int) -> None:
        if n <= 0:
            return
        children = self._children.setdefault(family, {})
        child = children.get(values)
        if child is None:
            if len(children) < self.max_label_sets:
                child = children[values] = counter.labels(*values)
            else:
                self.folded.inc()
                child = counter.labels(*(OTHER,) * len(values))
        child.inc(n)

    def observe(
        self,
        organization: str,
        kind: str,
        dims: Mapping[str, str | None],
        counts: Mapping[str, int],
    ) -> None:
        """Count one ``Usage.add`` call: begin, write or read."""
        place = (
            organization,
            dims.get("cloud") or UNKNOWN,
            dims.get("region") or UNKNOWN,
            dims.get("source") or "none",
        )
        if kind == "begin":
            with_rule = (*place, dims.get("rule") or UNKNOWN)
            self._inc("begins", self.begins, with_rule, counts.get("begins", 0))
            self._inc("warnings", self.warnings, place, counts.get("warnings", 0))
        elif kind == "write":
            with_rule = (*place, dims.get("rule") or UNKNOWN)
            self._inc("writes", self.writes, with_rule, counts.get("versions", 0))
            self._inc("write_bytes", self.write_bytes, with_rule, counts.get("bytes", 0))
        elif kind == "read":
            with_locality = (*place, dims.get("locality") or UNKNOWN)
            self._inc("reads", self.reads, with_locality, counts.get("reads", 0))
            self._inc("read_bytes", self.read_bytes, with_locality, counts.get("bytes", 0))


METRICS = UsageMetrics()


def observe(
    organization: str, kind: str, dims: Mapping[str, str | None], counts: Mapping[str, int]
) -> None:
    """The hook ``Usage.add`` calls: this process's counters follow the usage records."""
    METRICS.observe(organization, kind, dims, counts)


routes = web.RouteTableDef()


@routes.get("/metrics")
async def metrics_text(request: web.Request) -> web.Response:
    """This replica's usage counters in the Prometheus text format."""
    body = generate_latest(METRICS.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def metrics_app() -> web.Application:
    """``/metrics`` alone, for a port of its own: the counters name every organization, and
    a NetworkPolicy can keep a port, not a path, to the scrapers."""
    app = web.Application()
    app.add_routes(routes)
    return app
