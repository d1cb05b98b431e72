"""Our S3 presign (o41.storage.sigv4) signs exactly what botocore's full path signs."""

from __future__ import annotations

import datetime as dt
from typing import Any
from unittest import mock

import pytest

from o41.storage import BucketRef, open_bucket
from o41.storage.s3 import S3Bucket

FIXED = dt.datetime(2026, 11, 29, 12, 0, 0)


def botocore_presign(s3: S3Bucket, operation: str, params: dict[str, Any], expires: int) -> str:
    """The reference: botocore's own presigning, through the bucket's client."""
    url: str = s3._client.generate_presigned_url(operation, Params=params, ExpiresIn=expires)
    return url


@pytest.mark.parametrize(
    ("kind", "endpoint", "bucket"),
    [
        ("s3", None, "o41-models-0123abcd"),  # AWS: virtual-hosted, regional
        ("s3", None, "o41.dotted.name"),  # dotted names stay on path style
        ("s3", "http://127.0.0.1:9000", "o41-models-0123abcd"),  # an endpoint override
        ("s3_compatible", "https://storage.eu-north1.nebius.cloud", "o41-nebius-1"),
    ],
)
@pytest.mark.parametrize("key", ["model/0193a1b2c3d4-9f8e", "a b/ü+%.pt"])
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////wEaDO+session/token="])
def test_fast_presign_equals_botocore(
    kind: str, endpoint: str | None, bucket: str, key: str, token: str | None
) -> None:
    ref = BucketRef(
        kind=kind,  # type: ignore[arg-type]
        bucket=bucket,
        region="eu-west-2",
        endpoint=endpoint,
        credentials={
            "accessKeyId": "AKIAEXAMPLE",
            "secretAccessKey": "not-a-secret",
            **({"sessionToken": token} if token else {}),
        },
    )
    s3 = open_bucket(ref)
    assert isinstance(s3, S3Bucket)
    headers = {"Content-Type": "application/octet-stream", "Content-Length": "10"}
    # one frozen clock for both signers, so any difference is in the signing itself
    with (
        mock.patch("botocore.auth.get_current_datetime", return_value=FIXED),
        mock.patch("o41.storage.sigv4._now", return_value=f"{FIXED:%Y%m%dT%H%M%SZ}"),
    ):
        fast_put = s3._presign_object("PUT", key, headers, 3600)
        full_put = botocore_presign(
            s3,
            "put_object",
            {
                "Bucket": bucket,
                "Key": key,
                "ContentType": headers["Content-Type"],
                "ContentLength": 10,
            },
            3600,
        )
        fast_get = s3._presign_object("GET", key, {}, 900)
        full_get = botocore_presign(s3, "get_object", {"Bucket": bucket, "Key": key}, 900)
        part = {"partNumber": "7", "uploadId": "2~Vx.ab/c+d=="}
        fast_part = s3._presign_object("PUT", key, {}, 3600, part)
        full_part = botocore_presign(
            s3,
            "upload_part",
            {"Bucket": bucket, "Key": key, "PartNumber": 7, "UploadId": part["uploadId"]},
            3600,
        )
    assert "X-Amz-Date=20261129T120000Z" in full_put  # the clock really was frozen
    assert fast_put == full_put
    assert fast_get == full_get
    assert fast_part == full_part
