"""What the admission webhook decides about a change, as pure functions of the facts.

The organization rules say what may be picked, retired or deleted
(``o41.core.organization``); these say which of them a change brings into play:

- Only the picks a change makes are checked. Editing the namespaces of an organization
  whose cloud default later broke must still work; picking that default again must not.
- Retiring protects the fallback in force and the fallback shown in status: what the
  user reads in ``kubectl get organization`` is never retired from under them, even while
  the operator has not caught up with a change yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from o41.core.organization import (
    Effective,
    LocationFacts,
    Picks,
    check_picks,
    check_retire,
    effective,
)


def picks_made(new: Picks, old: Picks | None = None) -> Picks:
    """The picks a change makes: the fallback if it changed, the cloud defaults that
    changed or were added. A creation (no ``old``) makes all of its picks."""
    before = old or Picks()
    return Picks(
        new.fallback if new.fallback != before.fallback else None,
        {
            cloud: name
            for cloud, name in new.cloud_defaults.items()
            if before.cloud_defaults.get(cloud) != name
        },
    )


def check_pick_change(
    organization: str,
    new: Picks,
    old: Picks | None,
    locations: Mapping[str, tuple[str, LocationFacts]],
) -> None:
    """Refuse a change whose new picks cannot serve writes (``check_picks``).

    ``locations`` maps each Location name the new picks name to (its organization,
    facts); a name missing from it does not exist."""
    check_picks(organization, picks_made(new, old), locations)


def retiring(was_retired: bool, retired: bool) -> bool:
    """The change retires the location (rather than leaving it or taking it back)."""
    return retired and not was_retired


def check_retire_change(
    location: str,
    organization: str,
    *,
    was_retired: bool,
    retired: bool,
    locations: Sequence[LocationFacts],
    picks: Picks,
    shown: Effective,
) -> None:
    """Refuse retiring the fallback: the one in force (what the rules give for
    ``locations`` in the order they were added, the ``picks`` and what status ``shown``)
    and the one status shows."""
    if not retiring(was_retired, retired):
        return
    in_force = effective(locations, picks, shown)
    check_retire(location, organization, in_force)
    if shown.fallback not in (None, in_force.fallback):
        check_retire(location, organization, shown)
