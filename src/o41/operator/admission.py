"""The validating admission webhook: refuse what the organization rules forbid.

CEL in the CRDs checks what one object can check alone (immutable cloud, region, backend);
these checks need other objects (the fallback in force, the Locations a pick names) or act
on DELETE, which CEL cannot. Every refusal says what to do instead.

No rule here decides from a field a user can write: whether a location ever became Ready
or its setup failed comes from the operator's record (a ConfigMap only the operator
writes), read from the API server at the time of the request, never from status.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from o41.api import GROUP, VERSION
from o41.core.organization import (
    Effective,
    LocationFacts,
    Picks,
    Refused,
    check_delete,
    check_organization_delete,
    check_picks,
    check_retire,
    effective,
)
from o41.operator.handlers import cluster, entries_of, one, records, with_record
from o41.operator.model import LocationEntry, OrganizationEntry, in_order, location_facts


def _refuse(e: Refused) -> kopf.AdmissionError:
    return kopf.AdmissionError(str(e), code=422)


@kopf.on.validate(GROUP, VERSION, "locations", id="location-rules", operations=["UPDATE"])  # type: ignore[arg-type]
def refuse_retiring_the_fallback(
    name: str,
    spec: kopf.Spec,
    old: Any,
    locations_by_name: kopf.Index[str, LocationEntry],
    organizations_by_name: kopf.Index[str, OrganizationEntry],
    **_: Any,
) -> None:
    was_retired = bool((old or {}).get("spec", {}).get("retired", False))
    if not spec.get("retired") or was_retired:
        return
    org = spec.get("organization", "")
    entry: OrganizationEntry | None = one(organizations_by_name, org)
    picks, shown = (entry.picks, entry.in_force) if entry else (Picks(), Effective())
    in_force = effective(in_order(entries_of(locations_by_name, org)), picks, shown)
    try:
        check_retire(name, org, in_force)
        if shown.fallback not in (None, in_force.fallback):
            check_retire(name, org, shown)  # what the user sees in status counts too
    except Refused as e:
        raise _refuse(e) from None


def _unavailable(what: str, e: Exception) -> kopf.AdmissionError:
    return kopf.AdmissionError(
        f"could not read {what} from the API server ({type(e).__name__}), so nothing is "
        f"deleted: try again shortly",
        code=503,
    )


@kopf.on.validate(GROUP, VERSION, "locations", id="location-delete", operations=["DELETE"])
async def refuse_deleting_a_used_location(
    name: str, meta: kopf.Meta, spec: kopf.Spec, **_: Any
) -> None:
    """From the operator's record, read now: status could say anything."""
    try:
        record = await asyncio.to_thread(records().read, str(meta.get("uid", "")))
    except Exception as e:
        raise _unavailable(f"the operator's record of location {name!r}", e) from None
    try:
        check_delete(location_facts(name, spec, record))
    except Refused as e:
        raise _refuse(e) from None


@kopf.on.validate(GROUP, VERSION, "organizations", id="organization-delete", operations=["DELETE"])
async def refuse_deleting_an_organization_with_locations(name: str, **_: Any) -> None:
    """Its Locations, listed now (a cached index could miss one just created)."""
    try:
        every = await asyncio.to_thread(cluster().list_locations)
    except Exception as e:
        raise _unavailable("the Locations", e) from None
    mine = [
        str(loc["metadata"]["name"])
        for loc in every
        if (loc.get("spec") or {}).get("organization") == name
    ]
    try:
        check_organization_delete(name, mine)
    except Refused as e:
        raise _refuse(e) from None


@kopf.on.validate(  # type: ignore[arg-type]  # kopf passes indexes by name
    GROUP, VERSION, "organizations", id="organization-picks", operations=["CREATE", "UPDATE"]
)
def refuse_unusable_picks(
    name: str,
    spec: kopf.Spec,
    old: Any,
    locations_by_name: kopf.Index[str, LocationEntry],
    **_: Any,
) -> None:
    """Only what the change picks is checked: editing the namespaces of an organization
    whose default later broke must still work."""
    before = (old or {}).get("spec") or {}
    fallback = spec.get("fallback")
    defaults = dict(spec.get("cloudDefaults") or {})
    old_defaults = dict(before.get("cloudDefaults") or {})
    picks = Picks(
        fallback if fallback != before.get("fallback") else None,
        {cloud: loc for cloud, loc in defaults.items() if old_defaults.get(cloud) != loc},
    )
    known: dict[str, tuple[str, LocationFacts]] = {
        key: (e.organization, with_record(e).facts)
        for key in locations_by_name
        for e in locations_by_name[key]
    }
    try:
        check_picks(name, picks, known)
    except Refused as e:
        raise _refuse(e) from None
