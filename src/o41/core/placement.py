"""Where a new version goes: region, then the cloud's default, then the fallback.

The spec's list, first match wins. A location the caller excludes (its uploads failed)
or that cannot take writes (retired, unfinished, not ready) is passed over, which moves
the write down the list: a broken bucket costs money, not the run.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from o41.core.organization import LocationFacts
from o41.core.places import Place
from o41.core.writes import writable


class Rule(enum.StrEnum):
    """Which line of the placement list matched."""

    REGION = "region"
    CLOUD = "cloud"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class Placement:
    location: str
    rule: Rule
    warning: str | None = None


class PlacementRefused(Exception):
    """No location can take this write; the message says what the user can do."""


def place_write(
    place: Place,
    locations: Sequence[LocationFacts],
    *,
    fallback: str | None,
    cloud_defaults: Mapping[str, str],
    exclude: Collection[str] = (),
    organization: str = "the organization",
) -> Placement:
    """Choose the location for a write from ``place``; ``locations`` in the order the
    organization added them."""
    if fallback is None:
        raise PlacementRefused(
            f"{organization} has no fallback location yet, so it takes no writes: "
            "add a Location to it and wait until the Location is Ready"
        )
    usable = writable(locations, exclude)

    if place.cloud is not None and place.region is not None:
        for c in locations:
            if c.name in usable and (c.cloud, c.region) == (place.cloud, place.region):
                return Placement(c.name, Rule.REGION)

    if place.cloud is not None:
        default = cloud_defaults.get(place.cloud)
        if default is not None and default in usable:
            return Placement(default, Rule.CLOUD)

    if fallback in usable:
        return Placement(fallback, Rule.FALLBACK, _fallback_warning(place, fallback))

    passed_over = sorted(set(exclude))
    raise PlacementRefused(
        f"no location of {organization} can take this write: the fallback {fallback!r} "
        + ("was excluded after failed uploads" if fallback in exclude else "cannot take writes")
        + (f" (excluded: {', '.join(passed_over)})" if passed_over else "")
        + "; check the Locations' Ready condition with `kubectl get locations`"
    )


def _fallback_warning(place: Place, fallback: str) -> str:
    if place.cloud is None:
        where = "an unknown place (source: none)"
    elif place.region is None:
        where = f"{place.cloud} with an unknown region"
    else:
        where = f"{place.cloud}/{place.region}"
    return (
        f"no location serves {where}: this version goes to the fallback {fallback!r}, "
        "which may cost egress; a Location in your cloud and region would keep it local"
    )
