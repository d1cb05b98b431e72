"""Keep an Organization's fallback and cloud defaults in force (``o41.core.organization``),
show them in its status and its Locations' roles, and post an Event for each change."""

from __future__ import annotations

import asyncio

from o41.core.organization import Effective, effective
from o41.kube.locations import Location
from o41.operator import events
from o41.operator.index import LocationsIndex, OrganizationsIndex, locations_of, one
from o41.operator.model import OrganizationEntry, in_order, organization_status, role
from o41.operator.state import Shared


async def reconcile(
    state: Shared,
    org: str,
    locations: LocationsIndex,
    organizations: OrganizationsIndex,
) -> None:
    """Bring the Organization's status and its Locations' roles in line with the rules."""
    async with state.organizations.lock(org):
        entry = one(organizations, org)
        if entry is None:
            return  # Locations may come first; the Organization's own event will follow
        mine = locations_of(locations, org, state.records)
        before = state.organizations.in_force.get(org, entry.in_force)
        after = effective(in_order(mine), entry.picks, before)
        state.organizations.in_force[org] = after
        await _show(state, entry, after, mine)
        if after != before:
            await asyncio.to_thread(post_changes, state, entry, before, after)
        for loc in mine:  # only the roles that changed: 200 locations must not mean 200 patches
            wanted = role(loc.name, after)
            if wanted != loc.role:
                await asyncio.to_thread(
                    state.cluster.patch_status, "locations", loc.name, {"role": wanted or None}
                )


async def _show(
    state: Shared, entry: OrganizationEntry, after: Effective, mine: list[Location]
) -> None:
    """Replace what the Organization's status shows, when it differs."""
    shown = (entry.in_force, entry.locations, entry.observed_generation)
    if shown == (after, len(mine), entry.generation) and entry.conditions:
        return
    clouds = [*entry.in_force.cloud_defaults, *(loc.cloud for loc in mine)]
    status = organization_status(
        after, len(mine), entry.conditions, clouds=clouds, generation=entry.generation
    )
    await asyncio.to_thread(state.cluster.patch_status, "organizations", entry.name, status)


def post_changes(
    state: Shared, entry: OrganizationEntry, before: Effective, after: Effective
) -> None:
    ref, cluster = entry.ref, state.cluster
    if before.fallback != after.fallback:
        events.post(
            cluster,
            ref,
            type="Normal",
            reason="FallbackChanged",
            message=f"fallback is now {after.fallback!r} (was {before.fallback!r})",
        )
    for cloud in sorted(set(before.cloud_defaults) | set(after.cloud_defaults)):
        was, now_ = before.cloud_defaults.get(cloud), after.cloud_defaults.get(cloud)
        if was != now_:
            events.post(
                cluster,
                ref,
                type="Normal",
                reason="CloudDefaultChanged",
                message=f"default for {cloud} is now {now_!r} (was {was!r})",
            )
    if before.takes_writes != after.takes_writes:
        events.post(
            cluster,
            ref,
            type="Normal",
            reason="TakesWrites" if after.takes_writes else "StoppedWrites",
            message="takes writes" if after.takes_writes else "no longer takes writes",
        )
