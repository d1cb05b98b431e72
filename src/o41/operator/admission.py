"""The validating admission webhook: refuse what the organization rules forbid.

CEL in the CRDs checks what one object can check alone (immutable cloud, region, backend);
these checks need other objects (the fallback in force, the Locations a pick names, the
other TrustDomains' issuers) or act on DELETE, which CEL cannot. Every refusal says what
to do instead. What a change brings into play is decided in the core
(``o41.core.admission``); these handlers gather the facts.

No rule here decides from a field a user can write: whether a location ever became Ready
or its setup failed comes from the operator's record (a ConfigMap only the operator
writes), read from the API server at the time of the request, never from status.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from o41.core.admission import check_pick_change, check_retire_change, check_trust_domain
from o41.core.organization import (
    Effective,
    Picks,
    Refused,
    check_delete,
    check_organization_delete,
)
from o41.kube.api import GROUP, VERSION
from o41.kube.locations import read_location
from o41.operator import telemetry
from o41.operator.index import (
    LocationsIndex,
    OrganizationsIndex,
    locations_of,
    named,
    one,
)
from o41.operator.model import in_order, picks_of
from o41.operator.state import shared


def _refuse(e: Refused) -> kopf.AdmissionError:
    return kopf.AdmissionError(str(e), code=422)


def _unavailable(what: str, e: Exception, so: str = "so nothing is deleted") -> kopf.AdmissionError:
    return kopf.AdmissionError(
        f"could not read {what} from the API server ({type(e).__name__}), {so}: try again shortly",
        code=503,
    )


@kopf.on.validate(GROUP, VERSION, "locations", id="location-rules", operations=["UPDATE"])  # type: ignore[arg-type]
@telemetry.admission("location-rules")
def refuse_retiring_the_fallback(
    name: str,
    spec: kopf.Spec,
    old: Any,
    memo: kopf.Memo,
    locations_by_organization: LocationsIndex,
    organizations_by_name: OrganizationsIndex,
    **_: Any,
) -> None:
    org = str(spec.get("organization", ""))
    entry = one(organizations_by_name, org)
    try:
        check_retire_change(
            name,
            org,
            was_retired=bool(((old or {}).get("spec") or {}).get("retired", False)),
            retired=bool(spec.get("retired", False)),
            locations=in_order(locations_of(locations_by_organization, org, shared(memo).records)),
            picks=entry.picks if entry else Picks(),
            shown=entry.in_force if entry else Effective(),
        )
    except Refused as e:
        raise _refuse(e) from None


@kopf.on.validate(GROUP, VERSION, "locations", id="location-delete", operations=["DELETE"])
@telemetry.admission("location-delete")
async def refuse_deleting_a_used_location(
    name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """From the operator's record, read now: status could say anything."""
    records = shared(memo).records
    try:
        record = await asyncio.to_thread(records.read, str(body["metadata"].get("uid", "")))
    except Exception as e:
        raise _unavailable(f"the operator's record of location {name!r}", e) from None
    try:
        check_delete(read_location(body, record).facts)
    except Refused as e:
        raise _refuse(e) from None


@kopf.on.validate(GROUP, VERSION, "organizations", id="organization-delete", operations=["DELETE"])
@telemetry.admission("organization-delete")
async def refuse_deleting_an_organization_with_locations(
    name: str, memo: kopf.Memo, **_: Any
) -> None:
    """Its Locations, listed now (a cached index could miss one just created)."""
    try:
        every = await asyncio.to_thread(shared(memo).cluster.list_locations)
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
@telemetry.admission("organization-picks")
def refuse_unusable_picks(
    name: str,
    spec: kopf.Spec,
    old: Any,
    memo: kopf.Memo,
    locations_by_name: LocationsIndex,
    **_: Any,
) -> None:
    """Only what the change picks is checked (``o41.core.admission.picks_made``)."""
    new = picks_of(spec)
    before = picks_of((old or {}).get("spec")) if old else None
    names = [n for n in (new.fallback, *new.cloud_defaults.values()) if n is not None]
    try:
        check_pick_change(name, new, before, named(locations_by_name, names, shared(memo).records))
    except Refused as e:
        raise _refuse(e) from None


@kopf.on.validate(  # type: ignore[arg-type]  # kopf passes old by name
    GROUP, VERSION, "trustdomains", id="trustdomain-rules", operations=["CREATE", "UPDATE"]
)
@telemetry.admission("trustdomain-rules")
async def refuse_unsafe_trust_domains(
    name: str, spec: kopf.Spec, old: Any, memo: kopf.Memo, **_: Any
) -> None:
    """The rules of ``o41.core.admission.check_trust_domain``, with the TrustDomains
    listed now (a cached index could miss one just made)."""
    state = shared(memo)
    try:
        every = await asyncio.to_thread(state.cluster.list_objects, "trustdomains")
    except Exception as e:
        raise _unavailable("the TrustDomains", e, "so the issuer's uniqueness is unknown") from None
    others = {
        str(td["metadata"]["name"]): str((td.get("spec") or {}).get("issuer") or "") for td in every
    }
    try:
        check_trust_domain(
            name,
            spec,
            (old or {}).get("spec") if old else None,
            others,
            own_issuer=state.trust.own_issuer,
            allowed=state.trust.allowed,
        )
    except Refused as e:
        raise _refuse(e) from None
