"""Where a new location pays, net: the egress it would have saved on the window, less the
egress it would have added and the storage it would have held.

The usage page's advice before (:func:`o41.core.usage.best_new_location`, still what
``o41.core.usage.report`` does without an ``advise``) names the region whose writes left
it at the highest cost. Two things make it wrong on ML traces (bench/cost_replay.py shows
both):

- It counts only writes. A location in a trainer's region keeps its checkpoints local but
  makes every read from another cloud pay the trainer's cloud's internet egress; when the
  readers are elsewhere, the location costs more than it saves.
- It keeps naming a region that has a location already until the window has forgotten the
  writes from before that location (up to seven days): the next region waits.

This ranks every known region without a location by what adding a location there would
have changed over the window's counters: each writer place is placed again with the
candidate among the locations (the same :func:`o41.core.placement.place_write`), the bytes
it moves change their write egress, the reads of the versions they were follow them, and
their storage is priced where they would lie. Pure: records, prices and the organization's
locations in; numbers out.

Which reads follow: a read counter with the version's writer place (dims ``writerCloud``
and ``writerRegion``; a version record holds its writer's place) goes with that writer's
bytes exactly; the service counts reads so (``o41.webhook.writes.read``). Read counters
without it (older ones, or a version whose writer place was unknown): a location's reads
are shared among the places that wrote to it in proportion to their bytes, which is wrong
when one writer's versions are read far more than another's (bench/cost_replay.py, trace
remote-eval, shows how much).

The usage page shows :func:`page_advice`'s answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from o41.core.organization import Effective, LocationFacts, effective
from o41.core.placement import PlacementRefused, place_write
from o41.core.places import SOURCES, Place, Source
from o41.core.usage import (
    GB,
    PriceTable,
    Record,
    Saving,
    StoragePrices,
    Tally,
    WriterPlace,
    best_new_location,
)

__all__ = ["MONTH_HOURS", "NetSaving", "StoragePrices", "best_net_location", "page_advice"]

MONTH_HOURS = 720  # a storage month, as the page's 30-day window


@dataclass(frozen=True, slots=True)
class NetSaving:
    """What a location in ``cloud``/``region`` would have changed over the window (money,
    the price table's currency; positive is saved)."""

    cloud: str
    region: str
    write_egress: float  # saved on writes (>= 0 for the places it takes)
    read_egress: float  # saved on reads (negative: reads now leave it for elsewhere)
    storage: float  # saved on storage (negative: dearer storage where it lies)
    moved_bytes: int  # bytes written in the window that would have gone there
    moved_versions: int = 0  # and their versions

    @property
    def net(self) -> float:
        return self.write_egress + self.read_egress + self.storage


def _writer_place(r: Record) -> Place | None:
    cloud = r.dim("cloud")
    source: Source = next((s for s in SOURCES if s == r.dim("source")), "none")
    try:
        return Place(cloud, r.dim("region") if cloud else None, source)
    except ValueError:  # a damaged counter (an upper-case cloud): not a place to move
        return None


def rank_new_locations(
    records: Iterable[Record],
    *,
    prices: PriceTable,
    storage: StoragePrices,
    locations: Sequence[LocationFacts],
    in_force: Effective,
    held_hours: float,
) -> list[NetSaving]:
    """Every known region without a writable location, best net saving first.

    ``records`` are the window's counters (merged or not); ``locations`` the
    organization's, in the order they were added, and ``in_force`` its fallback and cloud
    defaults; ``held_hours`` how long a byte written in the window is held on average
    (storage is priced for that long). A candidate is placed as a new, ready location,
    added last: it becomes a cloud's default only for a cloud with none.
    """
    records = list(records)
    by_name = {loc.name: loc for loc in locations}
    # bytes each writer place put in each location, and each location's read bytes by reader
    written: dict[tuple[Place, str], int] = {}
    versions: dict[tuple[Place, str], int] = {}
    into: dict[str, int] = {}
    reads: dict[str, dict[tuple[str | None, str | None], int]] = {}  # not attributed
    # attributed: (writer cloud, writer region, location) -> reader -> bytes
    reads_of: dict[tuple[str, str, str], dict[tuple[str | None, str | None], int]] = {}
    regions: set[tuple[str, str]] = set()
    for r in records:
        cloud, region = r.dim("cloud"), r.dim("region")
        if cloud is not None and region is not None:
            regions.add((cloud, region))
        location = r.dim("location")
        if location is None or location not in by_name:
            continue
        if r.kind == "write":
            place = _writer_place(r)
            if place is None:
                continue
            written[(place, location)] = written.get((place, location), 0) + r.count("bytes")
            versions[(place, location)] = versions.get((place, location), 0) + r.count("versions")
            into[location] = into.get(location, 0) + r.count("bytes")
        elif r.kind == "read":
            reader = (cloud, region if cloud else None)
            by_cloud, by_region = r.dim("writerCloud"), r.dim("writerRegion")
            if by_cloud is not None and by_region is not None:
                readers = reads_of.setdefault((by_cloud, by_region, location), {})
            else:
                readers = reads.setdefault(location, {})
            readers[reader] = readers.get(reader, 0) + r.count("bytes")
    taken = {(loc.cloud, loc.region) for loc in locations if loc.writable}
    months = held_hours / MONTH_HOURS
    # a candidate takes a place's writes by region, as its cloud's default, or as the
    # fallback (o41.core.placement.place_write): only those places are placed again
    of_cloud: dict[str | None, list[tuple[Place, str]]] = {}
    of_place_region: dict[tuple[str | None, str | None], list[tuple[Place, str]]] = {}
    region_bytes: dict[tuple[str | None, str | None, str], int] = {}
    for place, name in written:
        of_cloud.setdefault(place.cloud, []).append((place, name))
        of_place_region.setdefault((place.cloud, place.region), []).append((place, name))
        at = (place.cloud, place.region, name)
        region_bytes[at] = region_bytes.get(at, 0) + written[(place, name)]
    ranked = []
    after_of: dict[str, Effective] = {}
    after_named: dict[str, str] = {}
    for cloud, region in sorted(regions - taken):
        candidate = LocationFacts(
            name=f"candidate {cloud}/{region}",
            cloud=cloud,
            region=region,
            ready=True,
            ever_ready=True,
        )
        trial = [*locations, candidate]
        # a candidate changes the roles in force only through its cloud (it is added last):
        # the same for every region of a cloud, unless it takes a role itself
        after = after_of.get(cloud)
        if after is None or _names(after, after_named[cloud]):
            after = after_of[cloud] = effective(trial, current=in_force)
            after_named[cloud] = candidate.name
        if after.fallback == candidate.name:
            may_move = list(written)
        elif after.cloud_defaults.get(cloud) == candidate.name:
            may_move = of_cloud.get(cloud, [])
        else:
            may_move = of_place_region.get((cloud, region), [])
        saved_writes = saved_reads = saved_storage = 0.0
        moved = moved_versions = 0
        for place, old_name in may_move:
            size = written[(place, old_name)]
            try:
                new = place_write(
                    place, trial, fallback=after.fallback, cloud_defaults=after.cloud_defaults
                )
            except PlacementRefused:
                continue
            if new.location != candidate.name:
                continue
            old = by_name[old_name]
            moved += size
            moved_versions += versions.get((place, old_name), 0)
            gb = size / GB
            saved_writes += gb * (
                prices.per_gb(place.cloud, place.region, old.cloud, old.region)
                - prices.per_gb(place.cloud, place.region, cloud, region)
            )
            saved_storage += gb * months * (storage.of(old.cloud) - storage.of(cloud))
            share = size / into[old_name] if into.get(old_name) else 0.0
            followed = [(b * share, reader) for reader, b in reads.get(old_name, {}).items()]
            if place.cloud is not None and place.region is not None:
                exact = reads_of.get((place.cloud, place.region, old_name), {})
                # a place's sources share its region's attributed reads by their bytes
                of_region = region_bytes.get((place.cloud, place.region, old_name), 0)
                region_share = size / of_region if of_region else 0.0
                followed += [(b * region_share, reader) for reader, b in exact.items()]
            for read_bytes, (reader_cloud, reader_region) in followed:
                saved_reads += (
                    read_bytes
                    / GB
                    * (
                        prices.per_gb(old.cloud, old.region, reader_cloud, reader_region)
                        - prices.per_gb(cloud, region, reader_cloud, reader_region)
                    )
                )
        if moved:
            ranked.append(
                NetSaving(
                    cloud, region, saved_writes, saved_reads, saved_storage, moved, moved_versions
                )
            )
    ranked.sort(key=lambda s: (-s.net, -s.moved_bytes, s.cloud, s.region))
    return ranked


def _names(roles: Effective, name: str) -> bool:
    return roles.fallback == name or name in roles.cloud_defaults.values()


def best_net_location(
    records: Iterable[Record],
    *,
    prices: PriceTable,
    storage: StoragePrices,
    locations: Sequence[LocationFacts],
    in_force: Effective,
    held_hours: float,
) -> NetSaving | None:
    """The region where a new location would have saved the most over the window, net of
    the reads it would send elsewhere and the storage it would hold; None when none pays."""
    ranked = rank_new_locations(
        records,
        prices=prices,
        storage=storage,
        locations=locations,
        in_force=in_force,
        held_hours=held_hours,
    )
    return ranked[0] if ranked and ranked[0].net > 0 else None


def page_advice(
    *,
    prices: PriceTable,
    storage: StoragePrices,
    locations: Sequence[LocationFacts],
    in_force: Effective,
    held_hours: float,
) -> Callable[[list[Record], list[WriterPlace]], Saving | None]:
    """The usage page's "where a new location pays" (``o41.core.usage.report``'s
    ``advise``): the net advice as the page's :class:`~o41.core.usage.Saving`, and when no
    new location pays, the writes-only ranking's region if a location is there already
    (its writes left the region although a location is there: a location to check)."""

    def advise(records: list[Record], places: list[WriterPlace]) -> Saving | None:
        best = best_net_location(
            records,
            prices=prices,
            storage=storage,
            locations=locations,
            in_force=in_force,
            held_hours=held_hours,
        )
        if best is not None:
            return Saving(
                best.cloud,
                best.region,
                Tally(best.moved_versions, best.moved_bytes, best.write_egress),
                has_location=False,
                reads=best.read_egress,
                storage=best.storage,
            )
        writable = [(loc.cloud, loc.region) for loc in locations if loc.writable]
        old = best_new_location(places, writable)
        return old if old is not None and old.has_location else None

    return advise
