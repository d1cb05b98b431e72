"""The usage page's answers, from the service's counter records, hourly and daily.

Two questions (the spec's "Usage"): which places write to the fallback or another region,
which is where a new location pays, and how many bytes cross clouds on reads. Pure: the
records, a price table and the current hour in; plain data and sentences out. No clock,
no store, so every number on the page is tested with examples and properties.

Egress is charged by the cloud the bytes leave (ingress is free on the clouds we price):
a write is paid by the writer's cloud, a read by the location's cloud. A place with an
unknown cloud is priced at the default internet rate, so egress is never under-reported.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from o41.core.placement import Rule
from o41.core.places import SOURCES, Locality, Place, locality

GB = 10**9  # prices are per GB; the page counts decimal units (1 TB = 1000 GB)
WINDOWS: dict[str, int] = {"24h": 24, "7d": 7 * 24, "30d": 30 * 24}  # hours
DEFAULT_WINDOW = "7d"
RULES: tuple[str, ...] = tuple(Rule)
LOCALITIES: tuple[str, ...] = tuple(Locality)
UNKNOWN = "unknown"  # how a missing cloud or region is shown
HOUR_FORMAT = "%Y-%m-%dT%H"
DAY_FORMAT = "%Y-%m-%d"


# --- prices -------------------------------------------------------------------------


class PriceError(ValueError):
    """A price override that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class Prices:
    """What one GB costs when it leaves a region of this cloud."""

    inter_region: float  # to another region of the same cloud
    internet: float  # to the internet, which is how another cloud is reached


@dataclass(frozen=True)
class PriceTable:
    """Per-GB egress list prices, dated, with where they come from."""

    as_of: str
    currency: str
    clouds: Mapping[str, Prices]
    default: Prices  # any other cloud tag (an S3 endpoint, nebius...) and unknown places
    sources: tuple[str, ...] = ()

    def of(self, cloud: str | None) -> Prices:
        return self.clouds.get(cloud or "", self.default)

    def per_gb(
        self,
        from_cloud: str | None,
        from_region: str | None,
        to_cloud: str | None,
        to_region: str | None,
    ) -> float:
        """The price of one GB moving between two places, charged by the sender's cloud.

        An unknown cloud on either side is cross-cloud and an unknown region is
        cross-region: we cannot show the bytes stayed home.
        """
        if from_cloud is None or to_cloud is None or from_cloud != to_cloud:
            return self.of(from_cloud).internet
        if from_region is None or to_region is None or from_region != to_region:
            return self.of(from_cloud).inter_region
        return 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "asOf": self.as_of,
            "currency": self.currency,
            "clouds": {
                name: {"interRegion": p.inter_region, "internet": p.internet}
                for name, p in sorted(self.clouds.items())
            },
            "default": {
                "interRegion": self.default.inter_region,
                "internet": self.default.internet,
            },
            "sources": list(self.sources),
        }


@dataclass(frozen=True)
class StoragePrices:
    """Per GB-month list prices of the standard storage class, by cloud, dated."""

    as_of: str
    clouds: Mapping[str, float]
    default: float  # any other cloud tag and unknown places
    sources: tuple[str, ...] = ()

    def of(self, cloud: str | None) -> float:
        return self.clouds.get(cloud or "", self.default)


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PriceError(f"{where} must be a number (per GB), got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise PriceError(f"{where} must be a finite number >= 0, got {value!r}")
    return float(value)


def _prices(data: Any, where: str, base: Prices) -> Prices:
    if not isinstance(data, Mapping):
        raise PriceError(f"{where} must be a mapping with interRegion and internet")
    unknown = set(data) - {"interRegion", "internet"}
    if unknown:
        raise PriceError(f"{where} has unknown fields {sorted(unknown)}: use interRegion, internet")
    return Prices(
        inter_region=_price(data.get("interRegion", base.inter_region), f"{where}.interRegion"),
        internet=_price(data.get("internet", base.internet), f"{where}.internet"),
    )


def override_prices(data: Any, base: PriceTable) -> PriceTable:
    """``base`` with the user's override laid over it, field by field.

    The override is ``{asOf, currency, clouds: {aws: {interRegion, internet}}, default,
    sources}``, every field optional; a cloud it names keeps ``base``'s price for a field
    it leaves out. Wrong input raises PriceError naming the field.
    """
    if not isinstance(data, Mapping):
        raise PriceError("the price file must hold a mapping (asOf, currency, clouds, default)")
    unknown = set(data) - {"asOf", "currency", "clouds", "default", "sources"}
    if unknown:
        raise PriceError(
            f"the price file has unknown fields {sorted(unknown)}: "
            "use asOf, currency, clouds, default, sources"
        )
    clouds = dict(base.clouds)
    raw_clouds = data.get("clouds", {})
    if not isinstance(raw_clouds, Mapping):
        raise PriceError("clouds must map a cloud tag (aws, gcp...) to its prices")
    for name, prices in raw_clouds.items():
        if not isinstance(name, str) or not name or name != name.lower():
            raise PriceError(f"clouds: {name!r} is not a lower-case cloud tag")
        clouds[name] = _prices(prices, f"clouds.{name}", clouds.get(name, base.default))
    default = (
        _prices(data["default"], "default", base.default) if "default" in data else base.default
    )
    sources = data.get("sources", list(base.sources))
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise PriceError("sources must be a list of strings")
    return PriceTable(
        as_of=str(data.get("asOf", base.as_of)),
        currency=str(data.get("currency", base.currency)),
        clouds=clouds,
        default=default,
        sources=tuple(sources),
    )


# --- records and the window ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """One counter record: what happened in one hour (or one day) for one set of
    dimensions."""

    kind: str  # begin, write, read
    hour: str  # YYYY-MM-DDTHH, UTC; a daily record's day, YYYY-MM-DD
    dims: Mapping[str, str]
    counts: Mapping[str, int]
    daily: bool = False

    def dim(self, name: str) -> str | None:
        """A dimension, None when it was unknown (the counters store it as "")."""
        return self.dims.get(name) or None

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)


def records_from(raw: Iterable[Any]) -> list[Record]:
    """The well-formed records of ``raw`` (the store's JSON); others are skipped, since a
    damaged counter must not take the page down. Dimensions come in name order."""
    found = []
    for r in raw:
        if not isinstance(r, Mapping):
            continue
        kind, dims, counts = r.get("kind"), r.get("dims"), r.get("counts")
        daily = "hour" not in r
        hour = r.get("day") if daily else r.get("hour")
        if not (isinstance(kind, str) and isinstance(hour, str)):
            continue
        if not (isinstance(dims, Mapping) and isinstance(counts, Mapping)):
            continue
        found.append(
            Record(
                kind,
                hour,
                dict(sorted((str(k), v) for k, v in dims.items() if isinstance(v, str))),
                {
                    str(k): v
                    for k, v in counts.items()
                    if isinstance(v, int) and not isinstance(v, bool) and v >= 0
                },
                daily,
            )
        )
    return found


def window_hours(now_hour: str, window: str) -> tuple[str, str]:
    """The first and last hour of ``window`` ending with the hour ``now_hour``, both included."""
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    last = dt.datetime.strptime(now_hour, HOUR_FORMAT)
    first = last - dt.timedelta(hours=WINDOWS[window] - 1)
    return first.strftime(HOUR_FORMAT), now_hour


def in_window(records: Iterable[Record], first: str, last: str) -> list[Record]:
    """Hourly records of the hours ``first`` to ``last`` (fixed-width hours sort as
    strings)."""
    return [r for r in records if not r.daily and first <= r.hour <= last]


@dataclass(frozen=True)
class Span:
    """What a window reads: hourly records for the hours before its first whole day, daily
    records for its days (today's so far included). ``first_hour`` is where the window
    really starts: later than the window's first hour when those hours are no longer kept
    hourly (then it starts with the next whole day)."""

    first_hour: str
    last_hour: str
    hours: tuple[str, ...]
    days: tuple[str, ...]


def _hours(first: dt.datetime, last: dt.datetime) -> tuple[str, ...]:
    found, at = [], first
    while at <= last:
        found.append(at.strftime(HOUR_FORMAT))
        at += dt.timedelta(hours=1)
    return tuple(found)


def window_span(now_hour: str, window: str, hourly_since: str | None = None) -> Span:
    """The periods to read for ``window`` ending with the hour ``now_hour``.

    ``hourly_since``: the oldest hour still kept hourly; None reads every hour of the window
    hourly (no daily records: the page's numbers then come from hours alone). Otherwise
    the whole days of the window are read daily (today's daily record is today's hours so
    far) and the hours of its first, partial day hourly when kept; a window whose first
    day is no longer kept hourly starts with the next whole day.
    """
    first_hour, last_hour = window_hours(now_hour, window)
    first, last = (dt.datetime.strptime(h, HOUR_FORMAT) for h in (first_hour, last_hour))
    if hourly_since is None:
        return Span(first_hour, last_hour, _hours(first, last), ())
    head_end = first.replace(hour=0) + dt.timedelta(days=1)  # the first whole day
    hours: tuple[str, ...] = ()
    if first.hour == 0:
        head_end = first
    elif first_hour >= hourly_since:
        hours = _hours(first, min(head_end - dt.timedelta(hours=1), last))
    else:
        first_hour = head_end.strftime(HOUR_FORMAT)
    days, day = [], head_end
    while day <= last:
        days.append(day.strftime(DAY_FORMAT))
        day += dt.timedelta(days=1)
    return Span(first_hour, last_hour, hours, tuple(days))


def in_span(records: Iterable[Record], span: Span) -> list[Record]:
    """The records of the span's hours (hourly) and days (daily)."""
    hours, days = set(span.hours), set(span.days)
    return [r for r in records if r.hour in (days if r.daily else hours)]


def merged(records: Iterable[Record]) -> list[Record]:
    """Records of the same kind and dimensions added up across hours (hour: the first).

    The answers do not depend on the hour, and a month has 720 of them: merging first
    keeps the aggregation proportional to the distinct places, not to the history.
    Dimensions are compared in their order (:func:`records_from` sorts them): records
    whose dimensions come in another order stay apart, which changes no answer.
    """
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Record, dict[str, int]]] = {}
    for r in records:
        key = (r.kind, tuple(r.dims.items()))
        hit = sums.get(key)
        if hit is None:
            sums[key] = (r, dict(r.counts))
        else:
            totals = hit[1]
            for name, n in r.counts.items():
                totals[name] = totals.get(name, 0) + n
    return [Record(r.kind, r.hour, r.dims, totals, r.daily) for r, totals in sums.values()]


# --- question 1: which places write to another region ----------------------------------


@dataclass(frozen=True, slots=True)
class Tally:
    """Versions (or reads) and bytes, with the estimated egress cost of those bytes."""

    count: int = 0
    bytes: int = 0
    cost: float = 0.0

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.count + other.count, self.bytes + other.bytes, self.cost + other.cost)

    def as_json(self, count: str) -> dict[str, Any]:
        return {count: self.count, "bytes": self.bytes, "cost": round(self.cost, 6)}


@dataclass(frozen=True)
class WriterPlace:
    """Everything written from one place, as its writers reported it."""

    cloud: str | None
    region: str | None
    source: str
    by_rule: Mapping[str, Tally]  # region, cloud, fallback: committed versions and bytes
    left_region: Tally  # the part whose location is not in the writer's cloud and region
    begins: int = 0
    warnings: int = 0  # fallback warnings on begin

    @property
    def written(self) -> Tally:
        return sum(self.by_rule.values(), Tally())

    @property
    def label(self) -> str:
        return place_label(self.cloud, self.region)

    def as_json(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "region": self.region,
            "source": self.source,
            "byRule": {rule: t.as_json("versions") for rule, t in self.by_rule.items()},
            "written": self.written.as_json("versions"),
            "leftRegion": self.left_region.as_json("versions"),
            "begins": self.begins,
            "warnings": self.warnings,
        }


def place_label(cloud: str | None, region: str | None) -> str:
    if cloud is None:
        return f"{UNKNOWN} place"
    return f"{cloud}/{region or UNKNOWN + ' region'}"


def _rule_order(rule: str) -> tuple[int, str]:
    return (RULES.index(rule) if rule in RULES else len(RULES), rule)


def writer_places(records: Iterable[Record], prices: PriceTable) -> list[WriterPlace]:
    """Writes grouped by writer place, sorted by the bytes that left the writer's region
    (then their cost, then the place): the first rows are where a location would pay."""
    by_rule: dict[tuple[str | None, str | None, str], dict[str, Tally]] = {}
    left: dict[tuple[str | None, str | None, str], Tally] = {}
    begun: dict[tuple[str | None, str | None, str], tuple[int, int]] = {}
    for r in records:
        key = (
            r.dim("cloud"),
            r.dim("region") if r.dim("cloud") else None,
            r.dim("source") or "none",
        )
        if r.kind == "write":
            cloud, region = key[0], key[1]
            to_cloud, to_region = r.dim("locationCloud"), r.dim("locationRegion")
            n, size = r.count("versions"), r.count("bytes")
            cost = size / GB * prices.per_gb(cloud, region, to_cloud, to_region)
            rules = by_rule.setdefault(key, {})
            rule = r.dim("rule") or UNKNOWN
            rules[rule] = rules.get(rule, Tally()) + Tally(n, size, cost)
            stayed = cloud is not None and (cloud, region) == (to_cloud, to_region)
            left[key] = left.get(key, Tally()) + (Tally() if stayed else Tally(n, size, cost))
        elif r.kind == "begin":
            b, w = begun.get(key, (0, 0))
            begun[key] = (b + r.count("begins"), w + r.count("warnings"))
    places = [
        WriterPlace(
            cloud=key[0],
            region=key[1],
            source=key[2],
            by_rule={
                rule: t
                for rule, t in sorted(by_rule.get(key, {}).items(), key=lambda i: _rule_order(i[0]))
            },
            left_region=left.get(key, Tally()),
            begins=begun.get(key, (0, 0))[0],
            warnings=begun.get(key, (0, 0))[1],
        )
        for key in set(by_rule) | set(begun)
    ]
    places.sort(
        key=lambda p: (
            -p.left_region.bytes,
            -p.left_region.cost,
            -p.written.bytes,
            p.cloud or "~",
            p.region or "~",
            p.source,
        )
    )
    return places


@dataclass(frozen=True, slots=True)
class Saving:
    """What a location in ``cloud``/``region`` would have kept local over the window.

    ``kept``: the writes it would have taken and their egress; ``reads`` and ``storage``:
    what it would have changed on the reads of those versions and on their storage
    (positive saved, negative spent; zero for the writes-only ranking).
    """

    cloud: str
    region: str
    kept: Tally
    has_location: bool  # a location is there already: it did not take these writes
    reads: float = 0.0
    storage: float = 0.0

    @property
    def net(self) -> float:
        return self.kept.cost + self.reads + self.storage

    def as_json(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "region": self.region,
            "kept": self.kept.as_json("versions"),
            "hasLocation": self.has_location,
            "reads": round(self.reads, 6),
            "storage": round(self.storage, 6),
            "net": round(self.net, 6),
        }


def best_new_location(
    places: Iterable[WriterPlace], locations: Collection[tuple[str, str]] = ()
) -> Saving | None:
    """The known region whose writes cost the most egress: where a location pays most.

    Sums over every source of a region. Places without a region cannot be served by a
    location (their fix is place detection), so they are never the answer.
    """
    per_region: dict[tuple[str, str], Tally] = {}
    for p in places:
        if p.cloud is not None and p.region is not None and p.left_region.bytes > 0:
            key = (p.cloud, p.region)
            per_region[key] = per_region.get(key, Tally()) + p.left_region
    if not per_region:
        return None
    (cloud, region), kept = min(per_region.items(), key=lambda i: (-i[1].cost, -i[1].bytes, i[0]))
    return Saving(cloud, region, kept, (cloud, region) in set(locations))


def human_bytes(n: int) -> str:
    """Decimal units, as clouds bill: ``1.2 TB``."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if value < 1000 or unit == "PB":
            if unit == "B":
                return f"{n} B"
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def money(amount: float, currency: str = "USD") -> str:
    """``$110``, ``$4.20``, ``<$0.01``: the page's estimates are never more precise."""
    if currency == "USD":
        if 0 < amount < 0.005:
            return "<$0.01"
        return f"${amount:,.0f}" if amount >= 100 else f"${amount:,.2f}"
    if 0 < amount < 0.005:
        return f"<0.01 {currency}"
    return f"{amount:,.0f} {currency}" if amount >= 100 else f"{amount:,.2f} {currency}"


def _net_of(saving: Saving, currency: str) -> str:
    """`` (net of $12 more egress on reads)``: what the reads and storage changed."""
    said = []
    for amount, what in ((saving.reads, "egress on reads"), (saving.storage, "storage")):
        if amount <= -0.005:
            said.append(f"{money(-amount, currency)} more {what}")
        elif amount >= 0.005:
            said.append(f"{money(amount, currency)} less {what}")
    return f" (net of {' and '.join(said)})" if said else ""


def savings_sentence(
    saving: Saving | None,
    places: Iterable[WriterPlace],
    currency: str = "USD",
    *,
    none_pays: bool = False,
) -> str:
    """Where a new location would pay, in one or two sentences. ``none_pays``: writes left
    their region, but no new location would have saved money net (the net advice)."""
    places = list(places)
    unknown = sum((p.left_region for p in places if p.region is None), Tally())
    parts = []
    if saving is None:
        left = sum((p.left_region for p in places if p.region is not None), Tally())
        if none_pays and left.bytes:
            parts.append(
                f"{human_bytes(left.bytes)} written left its writer's region (about "
                f"{money(left.cost, currency)}), but no new location would have saved money "
                "over this window: the reads of those versions would then cross further."
            )
        elif any(p.written.count for p in places) and not unknown.bytes:
            parts.append(
                "Every write in this window stayed in its writer's region: "
                "no new location would pay."
            )
        elif not unknown.bytes:
            parts.append("No writes were committed in this window.")
    elif saving.has_location:
        parts.append(
            f"{human_bytes(saving.kept.bytes)} written from {saving.cloud}/{saving.region} "
            f"left the region although a location is there (about "
            f"{money(saving.kept.cost, currency)} over this window): check that it is Ready "
            "and not retired, and why uploads to it failed."
        )
    else:
        parts.append(
            f"A location in {saving.cloud}/{saving.region} would have kept "
            f"{human_bytes(saving.kept.bytes)} local, about {money(saving.net, currency)} "
            f"over this window{_net_of(saving, currency)}."
        )
    if unknown.bytes:
        parts.append(
            f"{human_bytes(unknown.bytes)} came from writers with an unknown cloud or region "
            f"(about {money(unknown.cost, currency)}): no location can keep those local; set "
            "O41_ARTIFACTS_CLOUD and O41_ARTIFACTS_REGION for those jobs."
        )
    return " ".join(parts)


# --- question 2: what crosses clouds on reads -------------------------------------------


@dataclass(frozen=True)
class Reads:
    """Read bytes from reader cloud to location cloud, and across regions inside a cloud."""

    matrix: Mapping[tuple[str, str], Tally]  # (reader cloud or "unknown", location cloud)
    cross_region: Mapping[str, Tally]  # location cloud -> cross-region reads inside it
    by_locality: Mapping[str, Tally]

    @property
    def total(self) -> Tally:
        return sum(self.matrix.values(), Tally())

    @property
    def cross_cloud(self) -> Tally:
        return self.by_locality.get(Locality.CROSS_CLOUD, Tally())

    def as_json(self) -> dict[str, Any]:
        return {
            "matrix": [
                {"readerCloud": reader, "locationCloud": loc, **t.as_json("reads")}
                for (reader, loc), t in self.matrix.items()
            ],
            "crossRegion": [
                {"cloud": cloud, **t.as_json("reads")} for cloud, t in self.cross_region.items()
            ],
            "byLocality": {k: t.as_json("reads") for k, t in self.by_locality.items()},
            "total": self.total.as_json("reads"),
        }


def read_flows(records: Iterable[Record], prices: PriceTable) -> Reads:
    """Reads as flows, priced by the locality the service reported and the location's
    cloud (the one the bytes leave)."""
    matrix: dict[tuple[str, str], Tally] = {}
    cross_region: dict[str, Tally] = {}
    by_locality: dict[str, Tally] = {}
    for r in records:
        if r.kind != "read":
            continue
        reader = r.dim("cloud")
        cloud, region = r.dim("locationCloud"), r.dim("locationRegion")
        how_far = r.dim("locality")
        if how_far not in LOCALITIES:  # an older record: judge it as the service would
            how_far = _locality(reader, r.dim("region"), cloud, region)
        rate = {
            Locality.LOCAL: 0.0,
            Locality.CROSS_REGION: prices.of(cloud).inter_region,
            Locality.CROSS_CLOUD: prices.of(cloud).internet,
        }[Locality(how_far)]
        size = r.count("bytes")
        t = Tally(r.count("reads"), size, size / GB * rate)
        key = (reader or UNKNOWN, cloud or UNKNOWN)
        matrix[key] = matrix.get(key, Tally()) + t
        by_locality[how_far] = by_locality.get(how_far, Tally()) + t
        if how_far == Locality.CROSS_REGION:
            cross_region[cloud or UNKNOWN] = cross_region.get(cloud or UNKNOWN, Tally()) + t
    return Reads(
        matrix=dict(sorted(matrix.items())),
        cross_region=dict(sorted(cross_region.items())),
        by_locality={k: by_locality[k] for k in LOCALITIES if k in by_locality},
    )


def _locality(
    reader_cloud: str | None, reader_region: str | None, cloud: str | None, region: str | None
) -> str:
    """The service's locality (``places.locality``) of a read whose record did not say it
    (an older record); a location with an unknown cloud or region is as far as can be."""
    if reader_cloud is None or cloud is None or reader_cloud != cloud:
        return Locality.CROSS_CLOUD
    if region is None:
        return Locality.CROSS_REGION
    return locality(Place(reader_cloud, reader_region, "none"), cloud, region)


# --- how writes were placed, by place.source ---------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceRow:
    """Writes by how the writer found its place: ``none`` is a job with an unknown place."""

    source: str
    begins: int
    warnings: int
    written: Tally
    fallback: Tally

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "begins": self.begins,
            "warnings": self.warnings,
            "written": self.written.as_json("versions"),
            "fallback": self.fallback.as_json("versions"),
        }


def by_source(places: Iterable[WriterPlace]) -> list[SourceRow]:
    """One row per place.source seen, in the spec's order (env, skypilot, metadata, none)."""
    rows: dict[str, SourceRow] = {}
    for p in places:
        old = rows.get(p.source, SourceRow(p.source, 0, 0, Tally(), Tally()))
        rows[p.source] = SourceRow(
            p.source,
            old.begins + p.begins,
            old.warnings + p.warnings,
            old.written + p.written,
            old.fallback + p.by_rule.get(Rule.FALLBACK, Tally()),
        )
    order: dict[str, int] = {s: i for i, s in enumerate(SOURCES)}
    return sorted(rows.values(), key=lambda r: (order.get(r.source, len(order)), r.source))


# --- what was cleaned up: abandoned uploads, versions retention deleted -------------------


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Per location: the uploads of expired writes (``abandoned``: what their writes
    declared; ``aborted``: those whose abort the bucket took; the rest are left to the
    bucket's lifecycle rule) and the versions retention deleted."""

    location: str
    abandoned: Tally = Tally()
    aborted: Tally = Tally()
    retained_away: Tally = Tally()  # deleted by retention

    @property
    def left(self) -> Tally:
        """Abandoned uploads not aborted (the bucket's rule removes them later)."""
        return Tally(
            self.abandoned.count - self.aborted.count, self.abandoned.bytes - self.aborted.bytes
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "abandoned": {"uploads": self.abandoned.count, "bytes": self.abandoned.bytes},
            "aborted": {"uploads": self.aborted.count, "bytes": self.aborted.bytes},
            "notAborted": {"uploads": self.left.count, "bytes": self.left.bytes},
            "retention": {"versions": self.retained_away.count, "bytes": self.retained_away.bytes},
        }


def cleanup(records: Iterable[Record]) -> list[Cleanup]:
    """The ``abandoned`` (the sweeper's) and ``retention`` counters, by location."""
    rows: dict[str, Cleanup] = {}
    for r in records:
        if r.kind not in ("abandoned", "retention"):
            continue
        name = r.dim("location") or UNKNOWN
        row = rows.get(name, Cleanup(name))
        if r.kind == "abandoned":
            row = Cleanup(
                name,
                row.abandoned + Tally(r.count("uploads"), r.count("bytes")),
                row.aborted + Tally(r.count("aborted"), r.count("abortedBytes")),
                row.retained_away,
            )
        else:
            row = Cleanup(
                name,
                row.abandoned,
                row.aborted,
                row.retained_away + Tally(r.count("versions"), r.count("bytes")),
            )
        rows[name] = row
    return [rows[n] for n in sorted(rows)]


# --- the whole report ---------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """Both answers for one organization and window."""

    window: str
    first_hour: str
    last_hour: str
    places: list[WriterPlace]
    sources: list[SourceRow]
    reads: Reads
    saving: Saving | None
    summary: str
    prices: PriceTable
    records: list[Record] = field(default_factory=list)
    cleanups: list[Cleanup] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.records

    @property
    def written(self) -> Tally:
        return sum((p.written for p in self.places), Tally())

    @property
    def left_region(self) -> Tally:
        return sum((p.left_region for p in self.places), Tally())


Advise = Callable[[list[Record], list[WriterPlace]], "Saving | None"]


def report(
    records: Iterable[Record],
    *,
    prices: PriceTable,
    now_hour: str,
    window: str = DEFAULT_WINDOW,
    locations: Collection[tuple[str, str]] = (),
    span: Span | None = None,
    advise: Advise | None = None,
) -> Report:
    """The usage page for the ``window`` ending in ``now_hour``; ``locations`` are the
    (cloud, region) pairs that have an active location already.

    ``span``: the hours and days the records are of (:func:`window_span`); None: every
    hour of the window, hourly. ``advise``: where a new location pays, from the window's
    merged records and writer places (the service passes ``o41.core.advice``'s net
    advice); None: the writes-only :func:`best_new_location`.
    """
    span = span or window_span(now_hour, window)
    kept = in_span(records, span)
    summed = merged(kept)
    places = writer_places(summed, prices)
    if advise is None:
        saving, none_pays = best_new_location(places, locations), False
    else:
        saving = advise(summed, places)
        none_pays = saving is None
    return Report(
        window=window,
        first_hour=span.first_hour,
        last_hour=span.last_hour,
        places=places,
        sources=by_source(places),
        reads=read_flows(summed, prices),
        saving=saving,
        summary=savings_sentence(saving, places, prices.currency, none_pays=none_pays),
        prices=prices,
        records=kept,
        cleanups=cleanup(summed),
    )
