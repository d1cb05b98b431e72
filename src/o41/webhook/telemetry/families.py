"""Counters, gauges and histograms for the service's hot path, exported by one collector.

prometheus-client's own are thread-safe: every increment takes a lock, and ``labels()``
validates its arguments on every call. Measured on the collections' hot path (an
embedded-store ``get`` through ``perform``), that came to tens of microseconds an
operation, more than the operation itself. These are plain numbers, so they may be
changed only from one thread: the service's event loop, where every caller of
``o41.webhook.telemetry`` runs. Prometheus sees the same families at scrape time
(``_total`` counters, cumulative ``le`` buckets, ``_sum`` and ``_count``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: over every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value


class _Family:
    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.label_names = name, doc, list(labels)

    def metric(self) -> Metric:
        raise NotImplementedError


class CounterFamily(_Family):
    def __init__(self, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, doc, labels)
        self.children: dict[tuple[str, ...], CounterChild] = {}

    def labels(self, *values: str) -> CounterChild:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.label_names):
                raise ValueError(f"{self.name} takes labels {self.label_names}, got {values}")
            child = self.children[values] = CounterChild()
        return child

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=self.label_names)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value)
        return family


class HistogramFamily(_Family):
    def __init__(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, doc, labels)
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], HistogramChild] = {}

    def labels(self, *values: str) -> HistogramChild:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.label_names):
                raise ValueError(f"{self.name} takes labels {self.label_names}, got {values}")
            child = self.children[values] = HistogramChild(self.bounds)
        return child

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.label_names)
        les = [repr(b) for b in self.bounds] + ["+Inf"]  # as prometheus-client writes them
        for values, child in list(self.children.items()):
            cumulative, running = [], 0
            for le, n in zip(les, list(child.counts), strict=True):
                running += n
                cumulative.append((le, float(running)))
            family.add_metric(list(values), cumulative, child.total)
        return family


class GaugeValue(_Family):
    def __init__(self, name: str, doc: str) -> None:
        super().__init__(name, doc, ())
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def metric(self) -> Metric:
        return GaugeMetricFamily(self.name, self.doc, value=self.value)


class Families(Collector):
    """The families made here, in the order made, for one registry."""

    def __init__(self) -> None:
        self._families: list[_Family] = []

    def _add(self, family: _Family) -> None:
        self._families.append(family)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> CounterFamily:
        family = CounterFamily(name, doc, labels)
        self._add(family)
        return family

    def histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> HistogramFamily:
        family = HistogramFamily(name, doc, labels, buckets)
        self._add(family)
        return family

    def gauge(self, name: str, doc: str) -> GaugeValue:
        family = GaugeValue(name, doc)
        self._add(family)
        return family

    def collect(self) -> Iterable[Metric]:
        for family in self._families:
            yield family.metric()
