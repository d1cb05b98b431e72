"""From Kubernetes objects to the core's facts, and conditions the Kubernetes way.

Plain functions of dicts: the kopf handlers call them, tests call them without a cluster.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from o41.core.organization import Effective, LocationFacts, Picks
from o41.location_record import LocationRecord

Body = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class LocationEntry:
    """One Location as the operator's index keeps it."""

    organization: str
    created: str  # creationTimestamp: orders "the first location added"
    facts: LocationFacts
    uid: str = ""
    role: str = ""  # as its status shows it now


@dataclass(frozen=True, slots=True)
class OrganizationEntry:
    name: str
    uid: str
    picks: Picks
    in_force: Effective
    locations: int  # as its status shows it now
    conditions: Sequence[Mapping[str, Any]]
    ref: Mapping[str, Any]  # enough of the body to post Events on it


def condition_status(status: Body | None, kind: str = "Ready") -> str | None:
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def recorded(facts: LocationFacts, record: LocationRecord | None) -> LocationFacts:
    """The facts with what the operator's record says (never what status says, which users
    with RBAC on locations/status can write). No record: neither Ready nor unfinished."""
    return replace(
        facts,
        ready=record is not None and record.takes_writes,
        unfinished=record is not None and record.unfinished,
        ever_ready=record is not None and record.ever_ready,
    )


def location_facts(name: str, spec: Body, record: LocationRecord | None) -> LocationFacts:
    """What the rules know of a location: its spec, and the operator's record of it."""
    return recorded(
        LocationFacts(
            name=name,
            cloud=str(spec.get("cloud", "")),
            region=str(spec.get("region", "")),
            retired=bool(spec.get("retired", False)),
        ),
        record,
    )


def location_entry(name: str, meta: Body, spec: Body, status: Body | None) -> LocationEntry:
    """The index's entry; its facts carry no record yet (``recorded`` adds it when the
    rules run, so a record written since the last event counts)."""
    status = status or {}
    return LocationEntry(
        organization=str(spec.get("organization", "")),
        created=str(meta.get("creationTimestamp")),
        facts=location_facts(name, spec, None),
        uid=str(meta.get("uid", "")),
        role=str(status.get("role") or ""),
    )


def organization_entry(body: Body) -> OrganizationEntry:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    return OrganizationEntry(
        name=meta["name"],
        uid=meta.get("uid", ""),
        picks=Picks(spec.get("fallback"), dict(spec.get("cloudDefaults") or {})),
        in_force=Effective(
            status.get("fallback"),
            dict(status.get("cloudDefaults") or {}),
            bool(status.get("takesWrites", False)),
        ),
        locations=int(status.get("locations") or 0),
        conditions=list(status.get("conditions") or []),
        ref={
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {"name": meta["name"], "uid": meta.get("uid")},
        },
    )


def in_order(entries: Sequence[LocationEntry]) -> list[LocationFacts]:
    """Facts in the order the locations were added (creation time, then name)."""
    return [e.facts for e in sorted(entries, key=lambda e: (e.created, e.facts.name))]


def role(name: str, in_force: Effective) -> str:
    roles = []
    if in_force.fallback == name:
        roles.append("fallback")
    if name in in_force.cloud_defaults.values():
        roles.append("default")
    return ",".join(roles)


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_condition(
    current: Sequence[Body] | None,
    *,
    kind: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Set one condition, keeping lastTransitionTime when its status did not change."""
    value = "True" if status else "False"
    others = [dict(c) for c in current or [] if c.get("type") != kind]
    previous = next((c for c in current or [] if c.get("type") == kind), None)
    since = (
        previous.get("lastTransitionTime")
        if previous is not None and previous.get("status") == value
        else None
    ) or now()
    mine: dict[str, Any] = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        mine["observedGeneration"] = generation
    return [*others, mine]
