"""What the usage page's advice saves: a trace of writes and reads replayed through the
core's placement and the page's advice, priced with the page's dated price table.

For each trace (SkyStore's CSV format, bench/traces/trace.py), four costs (egress of
writes and reads, and storage per GB-month, in the table's currency):

  (a) single     one bucket in one region (the first given location) for everything;
  (b) placement  o41.core.placement.place_write with the given locations;
  (c) advice     the same, adding in order the locations an advice names, re-run every
                 --every hours on the --window of counters the trace produced so far:
      (c) writes only   the page's advice before issue 20, o41.core.usage.best_new_location
                        (the region whose writes left it at the highest cost);
      (c+) net, shared  o41.core.advice.best_net_location, which ranks regions by the
                        egress a location would have saved on the window net of the reads
                        it sends elsewhere and the storage it holds, on read counters
                        without the version's writer (reads shared by bytes written);
      (c++) net (page)  the same on read counters that carry the version's writer place,
                        as the service counts them now: the usage page's advice;
  (d) optimum    each version at the candidate location (any region the trace names, or a
                 given location) where its write, its reads and its storage cost least,
                 knowing the future: a lower bound for single-copy placement.

    .venv/bin/python bench/cost_replay.py                      # the shipped traces
    .venv/bin/python bench/cost_replay.py TRACE.csv --locations aws:us-east-1,gcp:us-central1
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.traces.trace import Event, load  # noqa: E402
from o41.core import usage  # noqa: E402
from o41.core.advice import MONTH_HOURS, best_net_location  # noqa: E402
from o41.core.organization import LocationFacts, effective  # noqa: E402
from o41.core.placement import place_write  # noqa: E402
from o41.core.places import Place  # noqa: E402
from o41.core.usage import GB, PriceTable, Record, StoragePrices  # noqa: E402
from o41.webhook.usage.prices import DEFAULT_PRICES, STORAGE_PRICES  # noqa: E402

TRACES = ROOT / "bench" / "traces"
# the shipped traces and the locations their organization starts with (the first is the
# fallback; the first of each cloud its default)
SHIPPED: dict[str, tuple[str, ...]] = {
    "train-local.csv": ("aws:us-east-1", "gcp:us-central1"),
    "remote-eval.csv": ("aws:us-east-1",),
    "fan-out.csv": ("aws:us-east-1", "gcp:us-central1"),
}

Region = tuple[str, str]


@dataclass
class Version:
    """One version's life in the trace: who wrote it, who read it, how long it was held."""

    writer: Region
    size: int
    written: float
    ended: float | None = None
    reads: dict[Region, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Prices:
    egress: PriceTable
    storage: StoragePrices


@dataclass
class Cost:
    writes: float = 0.0
    reads: float = 0.0
    storage: float = 0.0

    @property
    def total(self) -> float:
        return self.writes + self.reads + self.storage

    def add(self, other: Cost) -> None:
        self.writes += other.writes
        self.reads += other.reads
        self.storage += other.storage


def version_cost(v: Version, at: Region, end: float, prices: Prices) -> Cost:
    """What ``v`` costs held at ``at``: its write's egress (the writer's cloud pays), its
    reads' (the location's cloud pays) and its storage from write to delete (or ``end``)."""
    gb = v.size / GB
    per_gb = prices.egress.per_gb
    held = ((v.ended if v.ended is not None else end) - v.written) / 3600
    return Cost(
        writes=gb * per_gb(v.writer[0], v.writer[1], at[0], at[1]),
        reads=sum(n * gb * per_gb(at[0], at[1], r[0], r[1]) for r, n in v.reads.items()),
        storage=gb * held / MONTH_HOURS * prices.storage.of(at[0]),
    )


@dataclass
class Replay:
    """The trace's versions, and for every event the version it touches."""

    events: list[Event]
    versions: list[Version]
    touches: list[int]  # per event: index into versions, -1 for a read of nothing
    end: float
    unread: int = 0  # reads of an object the trace never wrote (or deleted): skipped

    @classmethod
    def of(cls, events: list[Event]) -> Replay:
        versions: list[Version] = []
        current: dict[str, int] = {}
        touches = []
        unread = 0
        for e in events:
            if e.op == "write":
                old = current.get(e.key)
                if old is not None and versions[old].ended is None:
                    versions[old].ended = e.time  # replaced, as an overwrite
                current[e.key] = len(versions)
                versions.append(Version((e.cloud, e.region), e.size, e.time))
                touches.append(current[e.key])
            elif e.op == "read":
                found = current.get(e.key)
                if found is None or versions[found].ended is not None:
                    unread += 1
                    touches.append(-1)
                    continue
                reads = versions[found].reads
                reads[(e.cloud, e.region)] = reads.get((e.cloud, e.region), 0) + 1
                touches.append(found)
            else:
                found = current.pop(e.key, None)
                if found is not None and versions[found].ended is None:
                    versions[found].ended = e.time
                touches.append(found if found is not None else -1)
        end = events[-1].time if events else 0.0
        return cls(events, versions, touches, end, unread)

    def candidates(self, given: Sequence[Region]) -> list[Region]:
        seen = dict.fromkeys(given)
        for e in self.events:
            seen.setdefault((e.cloud, e.region))
        return list(seen)


def optimum(replay: Replay, candidates: Sequence[Region], prices: Prices) -> dict[int, Region]:
    """(d): each version where it costs least, knowing the future."""
    return {
        index: min(candidates, key=lambda at: version_cost(v, at, replay.end, prices).total)
        for index, v in enumerate(replay.versions)
    }


def hour_of(t: float) -> str:
    return time.strftime(usage.HOUR_FORMAT, time.gmtime(t))


def facts(region: Region, name: str | None = None) -> LocationFacts:
    return LocationFacts(
        name=name or f"{region[0]}-{region[1]}",
        cloud=region[0],
        region=region[1],
        ready=True,
        ever_ready=True,
    )


class Organization:
    """Locations in the order they were added, with the fallback and defaults in force."""

    def __init__(self, given: Sequence[Region]) -> None:
        self.locations = [facts(r) for r in given]
        self.in_force = effective(self.locations)
        self.added: list[tuple[str, Region]] = []

    def add(self, region: Region, when: float) -> None:
        self.locations.append(facts(region, f"added-{region[0]}-{region[1]}"))
        self.in_force = effective(self.locations, current=self.in_force)
        self.added.append((hour_of(when), region))

    def place(self, writer: Region) -> LocationFacts:
        chosen = place_write(
            Place(writer[0], writer[1], "env"),
            self.locations,
            fallback=self.in_force.fallback,
            cloud_defaults=self.in_force.cloud_defaults,
        )
        return next(loc for loc in self.locations if loc.name == chosen.location)


Advice = Callable[[Organization, list[Record], str, float], None]


class Counters:
    """The service's hourly usage counters, as the trace would have produced them."""

    def __init__(self) -> None:
        self.hours: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, int]]] = {}

    def add(self, t: float, kind: str, dims: dict[str, str], **counts: int) -> None:
        hour = self.hours.setdefault(hour_of(t), {})
        found = hour.setdefault((kind, tuple(sorted(dims.items()))), {})
        for name, n in counts.items():
            found[name] = found.get(name, 0) + n

    def window(self, now_hour: str, window: str) -> list[Record]:
        first, last = usage.window_hours(now_hour, window)
        return [
            Record(kind, hour, dict(dims), dict(counts))
            for hour, found in self.hours.items()
            if first <= hour <= last
            for (kind, dims), counts in found.items()
        ]


def simulate(
    replay: Replay,
    given: Sequence[Region],
    prices: Prices,
    *,
    advice: Advice | None = None,
    every: float = 24.0,
    window: str = usage.DEFAULT_WINDOW,
    writer_on_reads: bool = False,
) -> tuple[dict[int, Region], Organization]:
    """(b), or (c) with ``advice``: each write placed by the core as it comes, the advice
    re-run every ``every`` hours on the counters of the ``window`` before. Where each
    version went, by index. ``writer_on_reads``: the read counters carry the version's
    writer place (``writerCloud``, ``writerRegion``), as the service's do."""
    org = Organization(given)
    counters = Counters()
    at: dict[int, LocationFacts] = {}
    start = replay.events[0].time if replay.events else 0.0
    next_look = start + every * 3600
    for e, index in zip(replay.events, replay.touches, strict=True):
        while advice is not None and e.time >= next_look:
            now_hour = hour_of(next_look - 1)
            advice(org, counters.window(now_hour, window), now_hour, next_look)
            next_look += every * 3600
        if index < 0 or e.op == "delete":
            continue
        v = replay.versions[index]
        if e.op == "write":
            loc = at[index] = org.place(v.writer)
            dims = {
                "cloud": e.cloud,
                "region": e.region,
                "source": "env",
                "rule": "",
                "location": loc.name,
                "locationCloud": loc.cloud,
                "locationRegion": loc.region,
            }
            counters.add(e.time, "write", dims, versions=1, bytes=v.size)
        else:
            loc = at[index]
            how_far = (
                "local"
                if (loc.cloud, loc.region) == (e.cloud, e.region)
                else ("cross-region" if loc.cloud == e.cloud else "cross-cloud")
            )
            dims = {
                "cloud": e.cloud,
                "region": e.region,
                "source": "env",
                "locality": how_far,
                "location": loc.name,
                "locationCloud": loc.cloud,
                "locationRegion": loc.region,
            }
            if writer_on_reads:
                dims |= {"writerCloud": v.writer[0], "writerRegion": v.writer[1]}
            counters.add(e.time, "read", dims, reads=1, bytes=v.size)
    return {index: (loc.cloud, loc.region) for index, loc in at.items()}, org


def cost_of(replay: Replay, at: dict[int, Region], prices: Prices, since: float = -1.0) -> Cost:
    """What the versions written at ``since`` or later cost where ``at`` put them."""
    total = Cost()
    for index, where in at.items():
        v = replay.versions[index]
        if v.written >= since:
            total.add(version_cost(v, where, replay.end, prices))
    return total


def page_advice(prices: Prices, window: str = usage.DEFAULT_WINDOW) -> Advice:
    """The writes-only "where a new location pays" (the page's before issue 20), followed
    when it names a region without a location."""

    def follow(org: Organization, records: list[Record], now_hour: str, when: float) -> None:
        page = usage.report(
            records,
            prices=prices.egress,
            now_hour=now_hour,
            window=window,
            locations=[(loc.cloud, loc.region) for loc in org.locations if loc.writable],
        )
        if page.saving is not None and not page.saving.has_location:
            org.add((page.saving.cloud, page.saving.region), when)

    return follow


def net_advice(prices: Prices, held_hours: float) -> Advice:
    """o41.core.advice's net ranking, followed while it names a region that pays (the
    usage page shows its first, ``o41.core.advice.page_advice``)."""

    def follow(org: Organization, records: list[Record], now_hour: str, when: float) -> None:
        while True:
            best = best_net_location(
                records,
                prices=prices.egress,
                storage=prices.storage,
                locations=org.locations,
                in_force=org.in_force,
                held_hours=held_hours,
            )
            if best is None:
                return
            org.add((best.cloud, best.region), when)

    return follow


def region(text: str) -> Region:
    cloud, sep, name = text.partition(":")
    if not sep or not cloud or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not cloud:region (aws:us-east-1)")
    return cloud, name


@dataclass
class Result:
    name: str
    costs: dict[str, Cost]  # every version
    steady: dict[str, Cost]  # the versions written after the advice's first look
    added: dict[str, list[tuple[str, Region]]]
    replay: Replay
    every: float
    placed: dict[str, dict[int, Region]]


def run(
    name: str,
    events: list[Event],
    given: Sequence[Region],
    prices: Prices,
    *,
    every: float = 24.0,
    window: str = usage.DEFAULT_WINDOW,
    held_hours: float | None = None,
) -> Result:
    replay = Replay.of(events)
    held = held_hours if held_hours is not None else usage.WINDOWS[window]
    placed: dict[str, dict[int, Region]] = {}
    added: dict[str, list[tuple[str, Region]]] = {}
    placed["(a) single"], _ = simulate(replay, given[:1], prices)
    placed["(b) placement"], _ = simulate(replay, given, prices)
    for label, advice, writer in (
        ("(c) writes only", page_advice(prices, window), False),
        ("(c+) net, shared", net_advice(prices, held), False),
        ("(c++) net (page)", net_advice(prices, held), True),
    ):
        placed[label], org = simulate(
            replay, given, prices, advice=advice, every=every, window=window, writer_on_reads=writer
        )
        added[label] = org.added
    placed["(d) optimum"] = optimum(replay, replay.candidates(given), prices)
    first_look = (replay.events[0].time if replay.events else 0.0) + every * 3600
    return Result(
        name,
        {label: cost_of(replay, at, prices) for label, at in placed.items()},
        {label: cost_of(replay, at, prices, first_look) for label, at in placed.items()},
        added,
        replay,
        every,
        placed,
    )


def show(result: Result, currency: str) -> None:
    r = result.replay
    written = sum(v.size for v in r.versions)
    read = sum(v.size * n for v in r.versions for n in v.reads.values())
    print(
        f"{result.name}: {len(r.events)} events, {len(r.versions)} versions, "
        f"{usage.human_bytes(written)} written, {usage.human_bytes(read)} read, "
        f"{(r.end - (r.events[0].time if r.events else 0)) / 86400:.1f} days"
        + (f", {r.unread} reads of nothing skipped" if r.unread else "")
    )
    bound = result.costs["(d) optimum"].total
    steady_bound = result.steady["(d) optimum"].total
    print(
        f"  {'':19}{'total':>11}{'writes':>10}{'reads':>10}{'storage':>9}{'vs (d)':>11}"
        f"   after {result.every:g} h{'vs (d)':>11}"
    )
    for label, c in result.costs.items():
        later = result.steady[label]
        print(
            f"  {label:19}{c.total:11,.2f}{c.writes:10,.2f}{c.reads:10,.2f}{c.storage:9,.2f}"
            f"{_over(c.total, bound):>11}   {later.total:10,.2f}"
            f"{_over(later.total, steady_bound):>11}"
        )
    for label, places in result.added.items():
        shown = ", ".join(f"{c}/{g} ({h})" for h, (c, g) in places) or "none"
        print(f"  {label} added: {shown}")
    held: dict[Region, int] = {}
    for index, where in result.placed["(d) optimum"].items():
        held[where] = held.get(where, 0) + r.versions[index].size
    shown = ", ".join(
        f"{c}/{g} {n / written:.0%}" for (c, g), n in sorted(held.items(), key=lambda i: -i[1])
    )
    print(f"  (d) puts the bytes written in: {shown}")
    print(f"  ({currency}; 'after': the versions written after the advice's first look)")


def _over(cost: float, bound: float) -> str:
    if bound <= 0:
        return "-"
    return f"{(cost / bound - 1) * 100:+.1f}%"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, help="CSV traces (default: shipped)")
    parser.add_argument(
        "--locations",
        type=lambda s: [region(p) for p in s.split(",") if p],
        help="cloud:region,... the organization starts with (first: the fallback)",
    )
    parser.add_argument("--every", type=float, default=24.0, help="hours between advice runs")
    parser.add_argument("--window", choices=list(usage.WINDOWS), default=usage.DEFAULT_WINDOW)
    parser.add_argument(
        "--held-hours",
        type=float,
        help="how long the net advice assumes a byte is held (default: the window)",
    )
    args = parser.parse_args(argv)
    prices = Prices(DEFAULT_PRICES, STORAGE_PRICES)
    jobs: list[tuple[Path, list[Region]]] = []
    if args.traces:
        if not args.locations:
            parser.error("give --locations for your own traces")
        jobs = [(t, args.locations) for t in args.traces]
    else:
        jobs = [
            (TRACES / n, args.locations or [region(g) for g in given])
            for n, given in SHIPPED.items()
        ]
    print(
        f"egress prices as of {prices.egress.as_of}, storage as of {prices.storage.as_of}; "
        f"advice every {args.every:g} h on the {args.window} window"
    )
    for path, given in jobs:
        result = run(
            path.name,
            load(path),
            given,
            prices,
            every=args.every,
            window=args.window,
            held_hours=args.held_hours,
        )
        print(f"\nlocations given: {', '.join(f'{c}/{g}' for c, g in given)}")
        show(result, prices.egress.currency)


if __name__ == "__main__":
    main()
