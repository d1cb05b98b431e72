"""The operator's record of a Location: the facts safety rules decide from.

A Location's status can be written by anyone with RBAC on ``locations/status``, so status
is only an output. What admission and placement decide from (did the location ever become
Ready, is it Ready now, did its setup fail, which bucket is being created) lives in one
ConfigMap per Location in the operator's namespace, which only the operator may write
(docs/operator.md, "The operator's record"). Shared here so that ``o41.operator`` (writes
it) and ``o41.webhook`` (reads it) never import each other.

The record is bound to the Location's uid: it is named after the uid, carries it in its
data and has the Location as its owner (the garbage collector removes it with the
Location), so a Location re-created under the same name inherits nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from o41.kube.api import API_VERSION

PREFIX = "o41-location-"
KIND_LABEL = "artifacts.o41.io/record"
KIND = "location"
SELECTOR = f"{KIND_LABEL}={KIND}"
LOCATION_ANNOTATION = "artifacts.o41.io/location"
# the placement service's version totals per Location, which the operator copies into
# each Location's status.versions (one writer per status field)
COUNTS = "o41-version-counts"


def record_name(uid: str) -> str:
    return PREFIX + uid


@dataclass(frozen=True, slots=True)
class LocationRecord:
    uid: str
    location: str
    ready_since: str | None = None  # set once, when the location first became Ready
    ready: bool = False  # Ready now (the operator's last setup or check)
    failed: bool = False  # the last setup attempt failed
    creating_bucket: str | None = None  # write-ahead record of a bucket being created
    # the Location's metadata.generation (the API server's, no user writes it) that the last
    # successful setup was for: an operator restart sets up again only what changed since
    set_up: int | None = None

    @property
    def ever_ready(self) -> bool:
        """It may hold versions: it was writable once."""
        return self.ready_since is not None

    @property
    def unfinished(self) -> bool:
        """Setup failed and it never became Ready, so it took no write."""
        return self.failed and not self.ever_ready

    @property
    def takes_writes(self) -> bool:
        return self.ready and self.ever_ready

    def with_(self, **changes: Any) -> LocationRecord:
        return replace(self, **changes)

    def data(self) -> dict[str, str | None]:
        """The ConfigMap's data; None removes a key in a merge patch."""
        return {
            "uid": self.uid,
            "location": self.location,
            "readySince": self.ready_since,
            "ready": _flag(self.ready),
            "failed": _flag(self.failed),
            "creatingBucket": self.creating_bucket,
            "setUpGeneration": None if self.set_up is None else str(self.set_up),
        }

    def configmap(self, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": record_name(self.uid),
                "namespace": namespace,
                "labels": {KIND_LABEL: KIND, "app.kubernetes.io/part-of": "o41-artifacts"},
                "annotations": {LOCATION_ANNOTATION: self.location},
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": "Location",
                        "name": self.location,
                        "uid": self.uid,
                    }
                ],
            },
            "data": {k: v for k, v in self.data().items() if v is not None},
        }


def _flag(value: bool) -> str:
    return "true" if value else "false"


def parse(configmap: Mapping[str, Any]) -> LocationRecord | None:
    """The record a ConfigMap holds, or None when it is not one (wrong label, or data
    whose uid is not the one its name is bound to)."""
    meta = configmap.get("metadata") or {}
    name = str(meta.get("name") or "")
    data: Mapping[str, str] = configmap.get("data") or {}
    if (meta.get("labels") or {}).get(KIND_LABEL) != KIND or not name.startswith(PREFIX):
        return None
    uid = name.removeprefix(PREFIX)
    if not uid or data.get("uid") != uid:
        return None
    return LocationRecord(
        uid=uid,
        location=str(data.get("location") or ""),
        ready_since=data.get("readySince") or None,
        ready=data.get("ready") == "true",
        failed=data.get("failed") == "true",
        creating_bucket=data.get("creatingBucket") or None,
        set_up=_generation(data.get("setUpGeneration")),
    )


def _generation(value: str | None) -> int | None:
    """A recorded generation, or None for one absent or not a number (never trusted)."""
    return int(value) if value is not None and value.isdigit() else None
