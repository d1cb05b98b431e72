"""The stand-ins are real: a plain HTTP client moves bytes through their signed URLs.

Buckets are created with each cloud's real SDK. The uploads and downloads go through
presigned / V4-signed / SAS URLs with urllib. That's the path a pod takes, because pods never
hold cloud credentials. Each test asserts on the bytes that come back.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import re
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

import pytest
from azure.storage.blob import BlobSasPermissions, generate_blob_sas
from botocore.exceptions import ClientError

from testbed.stores import (
    AzureStore,
    GcsStore,
    S3Store,
    VersityStore,
    inet_sockets,
    unique_name,
)

pytestmark = pytest.mark.stores

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
OCTETS = {"Content-Type": "application/octet-stream"}


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request without proxies, only to 127.0.0.1. An error status is returned, not raised.

    Always send a Content-Type with a body: urllib's default is form-urlencoded, and moto then
    parses the body as a form and stores an empty object (real S3 would keep the bytes).
    """
    assert urlsplit(url).hostname == "127.0.0.1", f"refusing a non-loopback URL: {url}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _DIRECT.open(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


# --------------------------------------------------------------------------------------- S3


@pytest.mark.parametrize(
    ("region", "reported"),
    [
        ("eu-west-2", "eu-west-2"),
        ("ap-southeast-1", "ap-southeast-1"),
        # AWS's legacy answer for us-east-1 is "no constraint": read None as us-east-1.
        ("us-east-1", None),
    ],
)
def test_s3_bucket_location_is_the_region_it_was_created_in(
    s3: S3Store, region: str, reported: str | None
) -> None:
    """The operator checks a bucket's region with get_bucket_location: answered like AWS."""
    client = s3.client(region)
    bucket = unique_name("loc")
    if region == "us-east-1":
        client.create_bucket(Bucket=bucket)
    else:
        client.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region}
        )
    assert client.get_bucket_location(Bucket=bucket).get("LocationConstraint") == reported


def test_s3_location_constraint_must_be_the_endpoints_region(s3: S3Store) -> None:
    """Like AWS's regional endpoints, the stand-in creates buckets only in the region a
    request is signed for (and refuses us-east-1 as a constraint, as AWS does)."""
    for region, constraint in (("eu-west-2", "ap-southeast-1"), ("us-east-1", "us-east-1")):
        with pytest.raises(ClientError) as refused:
            s3.client(region).create_bucket(
                Bucket=unique_name("loc"),
                CreateBucketConfiguration={"LocationConstraint": constraint},
            )
        assert refused.value.response["Error"]["Code"] == "InvalidLocationConstraint"


def test_s3_presigned_put_then_get(s3: S3Store) -> None:
    client = s3.client("eu-west-2")
    bucket = unique_name("art")
    client.create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-2"}
    )
    key = "runs/7/ckpt 1+ü.bin"  # space, plus sign and non-ASCII: the URL must encode them right
    data = os.urandom(256 * 1024)

    put = client.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300
    )
    status, _, _ = http("PUT", put, data, OCTETS)
    assert status == 200

    get = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300
    )
    status, _, body = http("GET", get)
    assert status == 200
    assert body == data


def test_s3_presigned_multipart_upload(s3: S3Store) -> None:
    """Large writes: the service starts and completes; the pod PUTs each part to its own URL."""
    client = s3.client("eu-west-2")
    bucket = unique_name("mpu")
    client.create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-2"}
    )
    key = "datasets/shard-0000.bin"
    parts_data = [os.urandom(5 * 2**20), os.urandom(123_457)]  # S3's minimum for non-last parts

    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    completed = []
    for number, chunk in enumerate(parts_data, start=1):
        url = client.generate_presigned_url(
            "upload_part",
            Params={"Bucket": bucket, "Key": key, "UploadId": upload_id, "PartNumber": number},
            ExpiresIn=300,
        )
        status, headers, _ = http("PUT", url, chunk, OCTETS)
        assert status == 200
        completed.append({"PartNumber": number, "ETag": headers["etag"]})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": completed}
    )

    get = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300
    )
    status, _, body = http("GET", get)
    assert status == 200
    assert hashlib.sha256(body).digest() == hashlib.sha256(b"".join(parts_data)).digest()


# -------------------------------------------------------------------------------------- GCS


def test_gcs_v4_signed_put_then_get(gcs: GcsStore) -> None:
    bucket = gcs.client().create_bucket(unique_name("art"))
    blob = bucket.blob("runs/7/ckpt 1+ü.bin")
    signer = gcs.signing_credentials()
    data = os.urandom(256 * 1024)

    put = blob.generate_signed_url(
        version="v4",
        method="PUT",
        expiration=dt.timedelta(minutes=5),
        credentials=signer,
        content_type=OCTETS["Content-Type"],  # signed: the upload must send exactly this one
    )
    status, _, _ = http("PUT", put, data, OCTETS)
    assert status == 200

    get = blob.generate_signed_url(
        version="v4", method="GET", expiration=dt.timedelta(minutes=5), credentials=signer
    )
    status, _, body = http("GET", get)
    assert status == 200
    assert body == data


def test_gcs_bucket_location_is_the_servers_not_the_requested_one(gcs: GcsStore) -> None:
    """A limit of the stand-in, pinned here so the operator's tests don't trust it.

    fake-gcs-server 1.54 reports every bucket in its -location, whatever was asked for at
    creation. If this starts failing, fake-gcs-server got better: update GcsStore's docstring.
    """
    bucket = gcs.client().create_bucket(unique_name("loc"), location="EUROPE-WEST4")
    assert gcs.client().get_bucket(bucket.name).location == gcs.location


# ------------------------------------------------------------------------------------ Azure


def _sas_url(
    azure: AzureStore,
    container: str,
    blob: str,
    *,
    permission: BlobSasPermissions,
    expiry: dt.datetime,
    start: dt.datetime | None = None,
    key: str | None = None,
) -> str:
    """A blob URL with a service SAS, as the placement service will hand it to a pod."""
    sas = generate_blob_sas(
        azure.account_name,
        container,
        blob,
        account_key=key or azure.account_key,
        permission=permission,
        expiry=expiry,
        start=start,
    )
    return f"{azure.account_url}/{container}/{quote(blob)}?{sas}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def az_blob(azure: AzureStore) -> tuple[str, str, bytes]:
    """A container holding one blob that was written through a write-only SAS URL."""
    container = unique_name("art")
    azure.client().create_container(container)
    blob, data = "runs/7/ckpt 1+ü.bin", os.urandom(256 * 1024)
    put = _sas_url(
        azure,
        container,
        blob,
        permission=BlobSasPermissions(create=True, write=True),
        start=_now() - dt.timedelta(minutes=1),  # tolerate clock skew, as real clients should
        expiry=_now() + dt.timedelta(minutes=5),
    )
    status, _, _ = http("PUT", put, data, {"x-ms-blob-type": "BlockBlob", **OCTETS})
    assert status == 201
    return container, blob, data


def test_azure_sas_put_then_get(azure: AzureStore, az_blob: tuple[str, str, bytes]) -> None:
    container, blob, data = az_blob
    get = _sas_url(
        azure,
        container,
        blob,
        permission=BlobSasPermissions(read=True),
        expiry=_now() + dt.timedelta(minutes=5),
    )
    status, _, body = http("GET", get)
    assert status == 200
    assert body == data


def _flip_sig(url: str) -> str:
    sig = re.search(r"[?&]sig=([^&]+)", url)
    assert sig is not None
    first = sig.group(1)[0]
    return url.replace(f"sig={first}", f"sig={'B' if first == 'A' else 'A'}", 1)


@pytest.mark.parametrize(
    "case",
    [
        "tampered signature",
        "widened permission",
        "expired",
        "wrong key",
        "other blob",
        "read SAS to write",
    ],
)
def test_azurite_refuses_bad_sas(
    azure: AzureStore, az_blob: tuple[str, str, bytes], case: str
) -> None:
    """Azurite checks SAS like Azure, so the placement service's SAS code is really exercised."""
    container, blob, data = az_blob
    read = BlobSasPermissions(read=True)
    soon = _now() + dt.timedelta(minutes=5)
    method, body, headers = "GET", None, {}
    if case == "tampered signature":
        url = _flip_sig(_sas_url(azure, container, blob, permission=read, expiry=soon))
    elif case == "widened permission":
        url = _sas_url(azure, container, blob, permission=read, expiry=soon).replace(
            "sp=r&", "sp=rw&"
        )
        assert "sp=rw&" in url
        method, body, headers = "PUT", b"overwritten", {"x-ms-blob-type": "BlockBlob", **OCTETS}
    elif case == "expired":
        url = _sas_url(
            azure, container, blob, permission=read,
            start=_now() - dt.timedelta(minutes=10), expiry=_now() - dt.timedelta(minutes=1),
        )  # fmt: skip
    elif case == "wrong key":
        other_key = base64.b64encode(os.urandom(64)).decode()
        url = _sas_url(azure, container, blob, key=other_key, permission=read, expiry=soon)
    elif case == "other blob":
        url = _sas_url(azure, container, "some/other.bin", permission=read, expiry=soon)
        url = url.replace(quote("some/other.bin"), quote(blob), 1)
        assert f"/{container}/{quote(blob)}?" in url
    else:  # a read SAS used to write
        url = _sas_url(azure, container, blob, permission=read, expiry=soon)
        method, body, headers = "PUT", b"overwritten", {"x-ms-blob-type": "BlockBlob", **OCTETS}

    status, _, got = http(method, url, body, headers)
    assert status == 403
    assert data not in got

    # ...and the blob is what the valid write left there.
    good = _sas_url(azure, container, blob, permission=read, expiry=soon)
    assert http("GET", good)[2] == data


def test_azure_block_upload_via_sas(azure: AzureStore) -> None:
    """Large writes on Azure: Put Block for each block, then Put Block List, all through one SAS."""
    container = unique_name("blk")
    azure.client().create_container(container)
    blob = "datasets/shard-0000.bin"
    blocks = [os.urandom(4 * 2**20), os.urandom(98_765)]
    sas = _sas_url(
        azure, container, blob, permission=BlobSasPermissions(create=True, write=True, read=True),
        expiry=_now() + dt.timedelta(minutes=5),
    )  # fmt: skip

    ids = [base64.b64encode(f"block-{i:06d}".encode()).decode() for i in range(len(blocks))]
    for block_id, chunk in zip(ids, blocks, strict=True):
        status, _, _ = http(
            "PUT", f"{sas}&comp=block&blockid={quote(block_id, safe='')}", chunk, OCTETS
        )
        assert status == 201
    block_list = "".join(f"<Latest>{i}</Latest>" for i in ids)
    xml = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{block_list}</BlockList>'
    status, _, _ = http(
        "PUT", f"{sas}&comp=blocklist", xml.encode(), {"Content-Type": "application/xml"}
    )
    assert status == 201

    status, _, body = http("GET", sas)
    assert status == 200
    assert hashlib.sha256(body).digest() == hashlib.sha256(b"".join(blocks)).digest()


# ----------------------------------------------------------------------------------- safety


def _own_ports(store: S3Store | GcsStore | AzureStore) -> set[int | None]:
    """The ports a stand-in should listen on: its endpoint, and versitygw's region gateways."""
    ports = {urlsplit(store.endpoint).port}
    if isinstance(store, VersityStore):
        ports |= {urlsplit(store.gateway(r)).port for r in store.regions()}
    return ports


def test_stand_ins_listen_on_loopback_only(
    s3: VersityStore, s3_moto: S3Store, gcs: GcsStore, azure: AzureStore
) -> None:
    """Every socket the stand-ins hold is on loopback: no telemetry, no calls home, no admin
    or metrics port beyond the ones they serve (versitygw's admin API shares its S3 port)."""
    s3.gateway("eu-west-2")  # a second region's gateway is running too
    for store in (s3, s3_moto, gcs, azure):
        sockets = inet_sockets(store.server.pid)
        name = store.server.name
        assert {s.local_port for s in sockets if s.listening} == _own_ports(store), name
        for s in sockets:
            assert s.local.is_loopback, f"{name}: {s.proto} socket bound to {s.local}"
            assert s.remote.is_loopback or s.remote.is_unspecified, (
                f"{name}: {s.proto} socket connected to {s.remote}:{s.remote_port}"
            )
