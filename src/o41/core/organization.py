"""An organization's rules: its single fallback, its cloud defaults, what may be retired,
deleted or picked. Pure functions of the facts; the operator and its webhook call them.

- Exactly one location is the fallback. The first location added becomes it, until the
  user picks another; the organization takes writes only once it has a ready one.
- The first location in a cloud is that cloud's default, until the user picks another.
- A location is retired, never deleted. The fallback must be moved before it is retired.
  Only an unfinished location (setup failed, no write taken) can be removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LocationFacts:
    """What the rules need to know of one location: the core's one Location type.

    ``ready`` and ``unfinished`` come from the operator's record, never from status
    (``o41.kube.locations.read_location``)."""

    name: str
    cloud: str
    region: str
    retired: bool = False
    ready: bool = False
    unfinished: bool = False  # setup failed and it never became Ready, so took no write
    ever_ready: bool = False  # it became Ready once, so it may hold versions

    @property
    def writable(self) -> bool:
        """May take a new version now: Ready, not retired, not unfinished."""
        return self.ready and not self.retired and not self.unfinished

    @property
    def eligible(self) -> bool:
        """May become the fallback or a cloud default without the user asking."""
        return not self.retired and not self.unfinished


@dataclass(frozen=True, slots=True)
class Picks:
    """What the user chose in the Organization's spec (each optional)."""

    fallback: str | None = None
    cloud_defaults: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Effective:
    """The fallback and cloud defaults in force, as the Organization's status shows them."""

    fallback: str | None = None
    cloud_defaults: Mapping[str, str] = field(default_factory=dict)
    takes_writes: bool = False


def effective(
    locations: Sequence[LocationFacts],
    picks: Picks = Picks(),
    current: Effective = Effective(),
) -> Effective:
    """The fallback and defaults in force.

    ``locations`` come in the order they were added. A pick that still names a usable
    location wins; otherwise what is in force now stays (so adding locations never moves
    the fallback); otherwise the first eligible location added takes the role.
    """
    by_name = {loc.name: loc for loc in locations}

    def keeps(name: str | None, cloud: str | None = None) -> bool:
        loc = by_name.get(name) if name is not None else None
        return loc is not None and loc.eligible and (cloud is None or loc.cloud == cloud)

    fallback: str | None = None
    for candidate in (picks.fallback, current.fallback):
        if keeps(candidate):
            fallback = candidate
            break
    else:
        fallback = next((loc.name for loc in locations if loc.eligible), None)

    defaults: dict[str, str] = {}
    for cloud in _clouds_in_order(locations):
        chosen = next(
            (
                c
                for c in (picks.cloud_defaults.get(cloud), current.cloud_defaults.get(cloud))
                if keeps(c, cloud)
            ),
            None,
        )
        if chosen is None:
            chosen = next(
                (loc.name for loc in locations if loc.cloud == cloud and loc.eligible), None
            )
        if chosen is not None:
            defaults[cloud] = chosen

    takes_writes = fallback is not None and by_name[fallback].ready
    return Effective(fallback, defaults, takes_writes)


def _clouds_in_order(locations: Iterable[LocationFacts]) -> list[str]:
    return list(dict.fromkeys(loc.cloud for loc in locations))


class Refused(Exception):
    """A change the rules forbid; the message tells the user what to do instead."""


def check_retire(location: str, organization: str, in_force: Effective) -> None:
    """Retiring the fallback would leave writes with nowhere to go."""
    if in_force.fallback == location:
        raise Refused(
            f"location {location!r} is the fallback of organization {organization!r}: "
            f"make another location the fallback first (set spec.fallback on Organization "
            f"{organization!r}), then retire {location!r}"
        )


def check_delete(location: LocationFacts) -> None:
    """Only an unfinished location can be removed; every other one is retired instead.

    The facts must come from what only the operator records, never from status."""
    if location.unfinished and not location.ever_ready:
        return
    if location.ever_ready:
        why = "it has been Ready, so it may hold versions"
    else:
        why = "its setup has not failed, so it may still become Ready and take writes"
    raise Refused(
        f"location {location.name!r} cannot be deleted ({why}; a location that may hold "
        f"versions is retired, never deleted): set spec.retired: true to stop new writes "
        f"while its versions stay readable"
    )


def check_organization_delete(organization: str, locations: Sequence[str]) -> None:
    """An organization's versions are found through it: deleting it while Locations
    belong to it would make their versions unreadable (404)."""
    if not locations:
        return
    shown = ", ".join(repr(n) for n in sorted(locations)[:5])
    more = f" and {len(locations) - 5} more" if len(locations) > 5 else ""
    raise Refused(
        f"organization {organization!r} cannot be deleted: {len(locations)} Location(s) "
        f"belong to it ({shown}{more}) and its versions live there; they would no longer "
        f"be readable. Delete its unfinished Locations first; a Location that may hold "
        f"versions is retired, never deleted, so an organization with one stays (to stop "
        f"pods from using it, set its spec.namespaces to [])"
    )


def check_picks(
    organization: str, picks: Picks, locations: Mapping[str, tuple[str, LocationFacts]]
) -> None:
    """The fallback and cloud defaults a user picks must be able to serve writes.

    ``locations`` maps every Location name the picks may name to (its organization, facts).
    """

    def usable(name: str, role: str) -> LocationFacts:
        found = locations.get(name)
        if found is None:
            raise Refused(
                f"{role} {name!r} does not exist: create the Location first, "
                f"or pick one listed by `kubectl get locations`"
            )
        owner, facts = found
        if owner != organization:
            raise Refused(
                f"{role} {name!r} belongs to organization {owner!r}, not {organization!r}: "
                f"pick a Location of {organization!r}"
            )
        if facts.retired:
            raise Refused(f"{role} {name!r} is retired: pick an active Location")
        if not facts.ready:
            raise Refused(
                f"{role} {name!r} is not Ready: wait until its bucket is set up "
                f"(`kubectl get location {name}`), then pick it"
            )
        return facts

    if picks.fallback is not None:
        usable(picks.fallback, "fallback")
    for cloud, name in sorted(picks.cloud_defaults.items()):
        facts = usable(name, f"default for cloud {cloud!r}")
        if facts.cloud != cloud:
            raise Refused(
                f"default for cloud {cloud!r} names {name!r}, a Location in cloud "
                f"{facts.cloud!r}: a cloud's default must be in that cloud"
            )
