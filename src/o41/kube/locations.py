"""A Location object as both the operator and the placement service read it.

The one reader of a Location: its spec parsed by the CRD's own model (``o41.kube.api``), its
identity, and the core's facts with what the operator's record says. Ready, unfinished and
ever-Ready come from that record (``o41.kube.location_record``), never from status, which users
with RBAC on ``locations/status`` can write. Shared here so that ``o41.operator`` and
``o41.webhook`` never import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from o41.core.organization import LocationFacts
from o41.kube.api import LocationSpec
from o41.kube.location_record import LocationRecord
from o41.storage import BucketRef, Kind, bucket_name

# the CRD model's backend field -> the storage kind
_KINDS: dict[str, Kind] = {
    "s3": "s3",
    "gcs": "gcs",
    "azure_blob": "azure_blob",
    "s3_compatible": "s3_compatible",
}


@dataclass(frozen=True, slots=True)
class Location:
    """One Location: what its object says, and what the operator's record adds."""

    name: str
    uid: str
    created: str  # creationTimestamp: orders "the first location added"
    spec: LocationSpec
    facts: LocationFacts
    role: str = ""  # as its status shows it now (an output the operator compares)

    @property
    def organization(self) -> str:
        return self.spec.organization

    @property
    def cloud(self) -> str:
        return self.spec.cloud

    @property
    def region(self) -> str:
        return self.spec.region

    @property
    def retired(self) -> bool:
        return self.spec.retired

    @property
    def ready(self) -> bool:
        return self.facts.ready

    @property
    def unfinished(self) -> bool:
        return self.facts.unfinished

    @property
    def writable(self) -> bool:
        return self.facts.writable

    @property
    def credentials_secret(self) -> str | None:
        return self.spec.credentials.secret_name if self.spec.credentials else None

    def recorded(self, record: LocationRecord | None) -> Location:
        """This location as the operator's record says (no record: neither Ready nor
        unfinished, so no writes)."""
        facts = replace(
            self.facts,
            ready=record is not None and record.takes_writes,
            unfinished=record is not None and record.unfinished,
            ever_ready=record is not None and record.ever_ready,
        )
        return self if facts == self.facts else replace(self, facts=facts)

    def bucket(self, credentials: Mapping[str, str] | None) -> BucketRef:
        """Everything needed to talk to its bucket. The name is ``spec.bucket`` or the one
        generated from the Location's name and uid: stable across retries, restarts and
        both components."""
        backend = self.spec.backend
        field = backend.kind
        kind = _KINDS[field]
        options: Any = getattr(backend, field)
        return BucketRef(
            kind=kind,
            bucket=self.spec.bucket or bucket_name(kind, self.name, self.uid),
            region=self.spec.region,
            endpoint=getattr(options, "endpoint", None),
            credentials=credentials,
            project=getattr(options, "project", None),
            account_url=getattr(options, "account_url", None),
            signing_region=getattr(options, "signing_region", None),
            addressing_style=getattr(options, "addressing_style", "path"),
        )


def read_location(obj: Mapping[str, Any], record: LocationRecord | None = None) -> Location:
    """The Location in a Kubernetes object (a watch event's, kopf's body, a test's dict)."""
    meta = obj["metadata"]
    spec = LocationSpec.model_validate(dict(obj.get("spec") or {}))  # kopf's views too
    status = obj.get("status") or {}
    location = Location(
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        created=str(meta.get("creationTimestamp") or ""),
        spec=spec,
        facts=LocationFacts(str(meta["name"]), spec.cloud, spec.region, spec.retired),
        role=str(status.get("role") or ""),
    )
    return location.recorded(record)


def condition(status: Mapping[str, Any] | None, kind: str = "Ready") -> Mapping[str, Any]:
    """One condition of a status as shown (``{}`` when absent): the one reader of it.
    An output only: no safety rule decides from it."""
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}
