"""Buckets for the operator and the placement service, behind one small interface.

``open_bucket(ref)`` imports only the backend module ``ref.kind`` needs, so importing this
package loads no cloud SDK (the admission webhook and the client never pay for boto3,
google-cloud-storage and azure-storage-blob). See docs/storage.md.
"""

from __future__ import annotations

import importlib

from o41.storage.base import (
    KINDS,
    MAX_EXPIRES,
    MAX_PARTS,
    NO_RECORD,
    OCTET_STREAM,
    Bucket,
    BucketRef,
    Creations,
    Ensured,
    Kind,
    MultipartUpload,
    ObjectStat,
    Part,
    Reason,
    SetupFailed,
    SignedRequest,
    StorageError,
    UploadIncomplete,
    bucket_name,
    bucket_name_problem,
    owner_mark,
)

__all__ = [
    "KINDS",
    "MAX_EXPIRES",
    "MAX_PARTS",
    "NO_RECORD",
    "OCTET_STREAM",
    "Bucket",
    "BucketRef",
    "Creations",
    "Ensured",
    "Kind",
    "MultipartUpload",
    "ObjectStat",
    "Part",
    "Reason",
    "SetupFailed",
    "SignedRequest",
    "StorageError",
    "UploadIncomplete",
    "bucket_name",
    "bucket_name_problem",
    "open_bucket",
    "owner_mark",
]

_MODULES: dict[str, str] = {
    "s3": "o41.storage.s3",
    "s3_compatible": "o41.storage.s3",
    "gcs": "o41.storage.gcs",
    "azure_blob": "o41.storage.azure",
}


def open_bucket(ref: BucketRef) -> Bucket:
    """The bucket behind ``ref``. Cheap: the SDK client is built on the first call, and a
    Secret without the keys the backend needs surfaces there as ``SetupFailed``
    (BadCredentials), before any request. A ref missing what its kind requires (an
    s3_compatible endpoint, an azure_blob account_url) is a ``ValueError`` here.
    """
    module = importlib.import_module(_MODULES[ref.kind])
    bucket: Bucket = module.open_bucket(ref)
    return bucket
