"""kopf's in-memory indexes, keyed by what is looked up, and their helpers.

- ``locations_by_organization``: an organization's Locations (what the rules of one
  organization run over), without a scan of every Location.
- ``locations_by_name``: a Location a pick names (admission checks picks by name).
- ``organizations_by_name``: the Organization a Location belongs to.
- ``locations_seen``: every Location's name (the readiness: have the watches delivered?).
- ``trust_domains_by_issuer``: the TrustDomains naming each issuer (the oldest owns it,
  ``o41.core.trust.issuer_owners``; the others show ``Conflict``).

Kept apart from the handlers, so that admission reads them without importing handlers.
An index holds what the objects say; what the operator's record says (Ready, unfinished)
is added when the rules run (``recorded``), so a record written since the last event
counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import kopf
from pydantic import ValidationError

from o41.core.organization import LocationFacts
from o41.core.trust import IssuerClaim
from o41.kube.api import GROUP, VERSION
from o41.kube.locations import Location, read_location
from o41.kube.trust_record import issuer_claim
from o41.operator.model import OrganizationEntry, organization_entry
from o41.operator.records import Records

T = TypeVar("T")

LocationsIndex = kopf.Index[str, Location]
OrganizationsIndex = kopf.Index[str, OrganizationEntry]
TrustDomainsIndex = kopf.Index[str, IssuerClaim]


def _location(body: kopf.Body) -> Location | None:
    try:
        return read_location(body)
    except ValidationError:  # not a Location its CRD admits: nothing to index
        return None


@kopf.index(GROUP, VERSION, "locations")
def locations_by_organization(body: kopf.Body, **_: Any) -> dict[str, Location]:
    location = _location(body)
    return {location.organization: location} if location is not None else {}


@kopf.index(GROUP, VERSION, "locations")
def locations_by_name(body: kopf.Body, **_: Any) -> dict[str, Location]:
    location = _location(body)
    return {location.name: location} if location is not None else {}


@kopf.index(GROUP, VERSION, "locations")
def locations_seen(name: str, **_: Any) -> dict[str, bool]:
    """Every Location by name, one its CRD admits but the model does not included: what
    the readiness compares with the API server's list (``o41.operator.health``)."""
    return {name: True}


@kopf.index(GROUP, VERSION, "trustdomains")
def trust_domains_by_issuer(body: kopf.Body, **_: Any) -> dict[str, IssuerClaim]:
    claim = issuer_claim(body)
    return {claim.issuer: claim} if claim is not None else {}


@kopf.index(GROUP, VERSION, "organizations")
def organizations_by_name(name: str, body: kopf.Body, **_: Any) -> dict[str, OrganizationEntry]:
    return {name: organization_entry(body)}


def one(index: kopf.Index[str, T], key: str) -> T | None:
    """The one value under ``key`` (indexes keyed by a name hold at most one)."""
    return next(iter(index.get(key, ())), None)


def recorded(location: Location, records: Records) -> Location:
    """The location with what the operator's record says now."""
    return location.recorded(records.cached(location.uid))


def locations_of(index: LocationsIndex, organization: str, records: Records) -> list[Location]:
    """An organization's Locations (``locations_by_organization``), as recorded now."""
    return [recorded(loc, records) for loc in index.get(organization, ())]


def named(
    index: LocationsIndex, names: Iterable[str], records: Records
) -> Mapping[str, tuple[str, LocationFacts]]:
    """The Locations ``names`` name (``locations_by_name``), as the pick rules want them:
    name -> (its organization, its facts as recorded now); a missing name is left out."""
    found: dict[str, tuple[str, LocationFacts]] = {}
    for name in names:
        location = one(index, name)
        if location is not None:
            found[name] = (location.organization, recorded(location, records).facts)
    return found
