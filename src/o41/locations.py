"""A Location object as both the operator and the placement service read it.

Shared here so that ``o41.operator`` and ``o41.webhook`` never import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from o41.storage import BucketRef, Kind, bucket_name

# the CRD's backend field -> the storage kind
_KINDS: dict[str, Kind] = {
    "s3": "s3",
    "gcs": "gcs",
    "azureBlob": "azure_blob",
    "s3Compatible": "s3_compatible",
}


def bucket_ref(
    name: str, uid: str, spec: Mapping[str, Any], credentials: Mapping[str, str] | None
) -> BucketRef:
    """Everything needed to talk to the Location's bucket.

    The bucket name is ``spec.bucket`` or the one generated from the Location's name and
    uid: stable across retries, restarts and both components.
    """
    backend: Mapping[str, Any] = spec["backend"]
    field = next(k for k in _KINDS if k in backend)
    kind = _KINDS[field]
    options: Mapping[str, Any] = backend[field] or {}
    return BucketRef(
        kind=kind,
        bucket=spec.get("bucket") or bucket_name(kind, name, uid),
        region=spec["region"],
        endpoint=options.get("endpoint"),
        credentials=credentials,
        project=options.get("project"),
        account_url=options.get("accountUrl"),
        signing_region=options.get("signingRegion"),
        addressing_style=options.get("addressingStyle", "path"),
    )
