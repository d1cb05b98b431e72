"""From Kubernetes objects to the core's facts, and conditions the Kubernetes way.

Plain functions of dicts: the kopf handlers call them, tests call them without a cluster.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from o41.core.organization import Effective, LocationFacts, Picks
from o41.kube.locations import Location

Body = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OrganizationEntry:
    name: str
    uid: str
    picks: Picks
    in_force: Effective
    locations: int  # as its status shows it now
    conditions: Sequence[Mapping[str, Any]]
    ref: Mapping[str, Any]  # enough of the body to post Events on it
    generation: int | None = None  # metadata.generation: the spec's version
    observed_generation: int | None = None  # the one its status shows


def picks_of(spec: Body | None) -> Picks:
    """What an Organization's spec picks."""
    spec = spec or {}
    return Picks(spec.get("fallback"), dict(spec.get("cloudDefaults") or {}))


def organization_entry(body: Body) -> OrganizationEntry:
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    return OrganizationEntry(
        name=meta["name"],
        uid=meta.get("uid", ""),
        picks=picks_of(spec),
        in_force=Effective(
            status.get("fallback"),
            dict(status.get("cloudDefaults") or {}),
            bool(status.get("takesWrites", False)),
        ),
        locations=int(status.get("locations") or 0),
        conditions=list(status.get("conditions") or []),
        generation=meta.get("generation"),
        observed_generation=status.get("observedGeneration"),
        ref={
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {"name": meta["name"], "uid": meta.get("uid")},
        },
    )


def in_order(locations: Iterable[Location]) -> list[LocationFacts]:
    """Facts in the order the locations were added (creation time, then name)."""
    return [loc.facts for loc in sorted(locations, key=lambda loc: (loc.created, loc.name))]


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


def organization_status(
    in_force: Effective,
    locations: int,
    conditions: Sequence[Mapping[str, Any]],
    *,
    clouds: Iterable[str] = (),
    generation: int | None = None,
) -> dict[str, Any]:
    """The Organization's status as a merge patch that replaces what it showed: a cloud
    without a default any more (its only location retired or unfinished) is set to None,
    which a JSON merge patch deletes. ``clouds``: every cloud it may show a default for
    (those of its locations, and those its status shows now). ``generation``: the spec's
    (``metadata.generation``) these picks were made from, shown as ``observedGeneration``
    of the status and of its condition."""
    if in_force.takes_writes:
        reason, message = "FallbackReady", f"takes writes; fallback is {in_force.fallback!r}"
    elif in_force.fallback is None:
        reason = "NoFallback"
        message = "no location yet, so no writes: add a Location to this organization"
    else:
        reason = "FallbackNotReady"
        message = f"the fallback {in_force.fallback!r} is not Ready yet, so no writes"
    defaults: dict[str, str | None] = dict.fromkeys(clouds)
    defaults.update(in_force.cloud_defaults)
    return {
        "fallback": in_force.fallback,
        "cloudDefaults": (defaults if in_force.cloud_defaults else None),
        "takesWrites": in_force.takes_writes,
        "locations": locations,
        "observedGeneration": generation,
        "conditions": with_condition(
            conditions,
            kind="Ready",
            status=in_force.takes_writes,
            reason=reason,
            message=message,
            generation=generation,
        ),
    }
