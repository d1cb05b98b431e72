"""o41.storage against the stand-ins (versitygw, fake-gcs-server, Azurite), as the operator
and the placement service use it: ensure, check, then bytes moved by a plain HTTP client
through the signed requests, exactly as a pod moves them.

versitygw checks S3 signatures and part checksums; the few S3 settings it lacks (public
access block, default encryption, a bucket's region other than the one a request is signed
for, other accounts) are tested on moto (``s3_moto``), each test saying why. What the
stand-ins cannot show (GCS signatures, real regions on GCS, labels on GCS, bad credentials on
GCS) is listed in docs/storage.md; GCS signatures are checked offline in
tests/storage/test_signatures.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import pathlib
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from o41.core.parts import composite_matches, crc32_b64
from o41.storage import (
    Bucket,
    BucketRef,
    Kind,
    Reason,
    SetupFailed,
    SignedRequest,
    StorageError,
    UploadIncomplete,
    bucket_name,
    open_bucket,
)
from o41.storage.base import AZURE_OWNER_METADATA, CRC32_HEADER, S3_OWNER_TAG
from o41.storage.gcs import MARKER_OBJECT
from test_signatures import check_sigv4_url
from test_storage import offline as offline
from testbed.process import free_port
from testbed.stores import AzureStore, GcsStore, S3Store, VersityStore

pytestmark = pytest.mark.stores

MiB = 2**20


# --------------------------------------------------------------------------- a plain pod


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def send(req: SignedRequest, body: bytes | None = None) -> tuple[int, Mapping[str, str], bytes]:
    """One signed request as a pod makes it: urllib without proxies, no SDK, no credentials,
    only to 127.0.0.1, with exactly the headers the service handed out. An error status is
    returned, not raised."""
    assert urlsplit(req.url).hostname == "127.0.0.1", f"refusing a non-loopback URL: {req.url}"
    request = urllib.request.Request(
        req.url, data=body, method=req.method, headers=dict(req.headers)
    )
    try:
        with _DIRECT.open(request, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def upload_parts(parts: tuple[SignedRequest, ...], chunks: list[bytes]) -> list[str]:
    """All parts at once, from threads: the ETag each PUT answered (empty if none)."""

    def put(i: int) -> str:
        status, headers, body = send(parts[i], chunks[i])
        assert status in (200, 201), (status, body[:300])
        return headers.get("etag", "")

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(put, range(len(parts))))


# ------------------------------------------------------------------------------ backends


@dataclass
class Backend:
    """One stand-in seen through o41.storage, plus its own SDK to look behind our back."""

    kind: Kind
    region: str
    ref: Callable[..., BucketRef]  # (bucket, region=..., credentials=...) -> BucketRef
    listed: Callable[[str], list[str]]  # bucket names the SDK lists that equal this one
    create_foreign: Callable[[str], None]  # a bucket that is not ours
    sdk: Any


def _name(kind: Kind) -> str:
    return bucket_name(kind, "test", str(uuid.uuid4()))


def _s3(store: S3Store) -> Backend:
    creds = {"accessKeyId": store.access_key, "secretAccessKey": store.secret_key}

    def ref(bucket: str, region: str = "eu-west-2", credentials: Any = creds) -> BucketRef:
        return BucketRef("s3", bucket, region, endpoint=store.endpoint, credentials=credentials)

    def listed(bucket: str) -> list[str]:
        return [b["Name"] for b in store.client().list_buckets()["Buckets"] if b["Name"] == bucket]

    def foreign(bucket: str) -> None:
        store.client("eu-west-2").create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-2"}
        )

    return Backend("s3", "eu-west-2", ref, listed, foreign, store.client("eu-west-2"))


def _gcs(store: GcsStore) -> Backend:
    creds = {"serviceAccount.json": json.dumps(store.service_account_info)}
    region = store.location.lower()  # fake-gcs-server puts every bucket there

    def ref(bucket: str, region: str = region, credentials: Any = creds) -> BucketRef:
        return BucketRef(
            "gcs", bucket, region, endpoint=store.endpoint, credentials=credentials,
            project=store.project,
        )  # fmt: skip

    def listed(bucket: str) -> list[str]:
        return [b.name for b in store.client().list_buckets() if b.name == bucket]

    def foreign(bucket: str) -> None:
        store.client().create_bucket(bucket)

    return Backend("gcs", region, ref, listed, foreign, store.client())


def _azure(store: AzureStore) -> Backend:
    creds = {"accountKey": store.account_key}

    def ref(bucket: str, region: str = "westeurope", credentials: Any = creds) -> BucketRef:
        return BucketRef(
            "azure_blob", bucket, region, account_url=store.account_url, credentials=credentials
        )

    def listed(bucket: str) -> list[str]:
        found = store.client().list_containers(name_starts_with=bucket)
        return [c.name for c in found if c.name == bucket]

    def foreign(bucket: str) -> None:
        store.client().create_container(bucket)

    return Backend("azure_blob", "westeurope", ref, listed, foreign, store.client())


@pytest.fixture(params=["s3", "gcs", "azure_blob"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each test runs against the three stand-ins; a stand-in starts on first use."""
    kind: str = request.param
    if kind == "s3":
        return _s3(request.getfixturevalue("s3"))
    if kind == "gcs":
        return _gcs(request.getfixturevalue("gcs"))
    return _azure(request.getfixturevalue("azure"))


@pytest.fixture
def ready(backend: Backend) -> Bucket:
    """A freshly ensured bucket of this backend."""
    bucket = open_bucket(backend.ref(_name(backend.kind)))
    bucket.ensure("loc-ready")
    return bucket


# --------------------------------------------------------------------------------- setup


def test_ensure_creates_once_then_adopts(backend: Backend) -> None:
    name = _name(backend.kind)
    first = open_bucket(backend.ref(name)).ensure("aws-eu-west-2")
    assert first.created
    assert first.bucket == name
    assert first.region_checked == (backend.kind != "azure_blob")  # Azure can't tell
    # A new process (a restarted operator) builds everything again and adopts the bucket.
    again = open_bucket(backend.ref(name)).ensure("aws-eu-west-2")
    assert not again.created
    assert again.endpoint == first.endpoint
    assert backend.listed(name) == [name]
    open_bucket(backend.ref(name)).check()


def test_s3_bucket_is_marked_at_creation_and_the_missing_settings_are_warned(
    s3: VersityStore,
) -> None:
    """versitygw keeps the owner tag sent with CreateBucket (no PutBucketTagging needed),
    and answers NotImplemented to public access block and default encryption: outside AWS
    that is a warning (for an Event), not a failed setup."""
    backend = _s3(s3)
    name = _name("s3")
    ensured = open_bucket(backend.ref(name)).ensure("loc-1")
    assert ensured.created
    assert backend.sdk.get_bucket_tagging(Bucket=name)["TagSet"] == [
        {"Key": S3_OWNER_TAG, "Value": "loc-1"}
    ]
    assert ensured.warnings == (
        f"{s3.endpoint} has no public access block; check the bucket is private",
        f"{s3.endpoint} does not take a default encryption setting",
    )
    # adopted: the same warnings again, nothing else
    assert open_bucket(backend.ref(name)).ensure("loc-1").warnings == ensured.warnings


def test_s3_bucket_is_marked_private_and_encrypted(s3_moto: S3Store) -> None:
    """moto: versitygw has no public access block or default encryption to read back."""
    backend = _s3(s3_moto)
    name = _name("s3")
    assert open_bucket(backend.ref(name)).ensure("loc-1").warnings == ()
    sdk = backend.sdk
    assert sdk.get_bucket_tagging(Bucket=name)["TagSet"] == [
        {"Key": S3_OWNER_TAG, "Value": "loc-1"}
    ]
    block = sdk.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert block == dict.fromkeys(
        ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"),
        True,
    )
    rule = sdk.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"


def test_s3_adoption_keeps_an_existing_encryption_and_restores_public_blocks(
    s3_moto: S3Store,
) -> None:
    """An adopted bucket may use SSE-KMS by choice: ensure must not downgrade it. moto:
    versitygw takes no encryption setting."""
    backend = _s3(s3_moto)
    name = _name("s3")
    open_bucket(backend.ref(name)).ensure("loc-1")
    kms = {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/o41-test"}
    backend.sdk.put_bucket_encryption(
        Bucket=name,
        ServerSideEncryptionConfiguration={"Rules": [{"ApplyServerSideEncryptionByDefault": kms}]},
    )
    backend.sdk.delete_public_access_block(Bucket=name)
    assert not open_bucket(backend.ref(name)).ensure("loc-1").created
    rule = backend.sdk.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]
    assert rule["Rules"][0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert backend.sdk.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"][
        "BlockPublicPolicy"
    ]


def test_gcs_bucket_is_marked_and_the_stand_ins_gaps_are_warned(gcs: GcsStore) -> None:
    """fake-gcs-server keeps neither labels nor iamConfiguration. ensure says so in
    warnings (for an Event), keeps the owner mark in an object instead, and still adopts."""
    backend = _gcs(gcs)
    name = _name("gcs")
    ensured = open_bucket(backend.ref(name)).ensure("loc-1")
    assert any("labels" in w for w in ensured.warnings)
    assert any("public access prevention" in w for w in ensured.warnings)
    assert gcs.client().bucket(name).blob(MARKER_OBJECT).download_as_bytes() == b"loc-1"


def test_azure_container_is_marked_and_adoption_makes_it_private(azure: AzureStore) -> None:
    backend = _azure(azure)
    name = _name("azure_blob")
    container = azure.client().get_container_client(name)
    container.create_container(metadata={AZURE_OWNER_METADATA: "loc-1"}, public_access="blob")
    assert container.get_container_properties().public_access == "blob"
    assert not open_bucket(backend.ref(name)).ensure("loc-1").created
    props = container.get_container_properties()
    assert props.public_access is None
    assert props.metadata == {AZURE_OWNER_METADATA: "loc-1"}


def test_foreign_bucket_is_name_taken(backend: Backend) -> None:
    name = _name(backend.kind)
    backend.create_foreign(name)
    with pytest.raises(SetupFailed) as failed:
        open_bucket(backend.ref(name)).ensure("loc-1")
    assert failed.value.reason == Reason.NAME_TAKEN
    assert not failed.value.retryable
    assert "spec.bucket" in str(failed.value)
    assert "adopt" in str(failed.value)  # how to adopt a bucket of an interrupted setup


class Recorded:
    """``o41.storage.Creations`` in memory (the operator keeps it in the Location's status),
    noting which buckets the stand-in listed at the moment each creation was recorded."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.names: set[str] = set()
        self.listed_at_record: list[list[str]] = []

    def recorded(self, bucket: str) -> bool:
        return bucket in self.names

    def record(self, bucket: str) -> None:
        self.listed_at_record.append(self.backend.listed(bucket))
        self.names.add(bucket)


def test_a_creation_is_recorded_before_the_bucket_exists(backend: Backend) -> None:
    name = _name(backend.kind)
    creations = Recorded(backend)
    assert open_bucket(backend.ref(name)).ensure("loc-1", creations).created
    if backend.kind == "azure_blob":  # metadata comes with the create call: nothing to record
        assert creations.listed_at_record == []
    else:
        assert creations.listed_at_record == [[]]  # recorded while the bucket did not exist
    records = len(creations.listed_at_record)
    assert not open_bucket(backend.ref(name)).ensure("loc-1", creations).created
    assert len(creations.listed_at_record) == records  # an existing bucket is not recorded


def test_a_creation_that_cannot_be_recorded_creates_nothing(backend: Backend) -> None:
    class Unrecordable(Recorded):
        def record(self, bucket: str) -> None:
            raise SetupFailed("StatusNotRecorded", "the API server is away", retryable=True)

    name = _name(backend.kind)
    if backend.kind == "azure_blob":  # records nothing, so nothing stops it
        assert open_bucket(backend.ref(name)).ensure("loc-1", Unrecordable(backend)).created
        return
    with pytest.raises(SetupFailed, match="away"):
        open_bucket(backend.ref(name)).ensure("loc-1", Unrecordable(backend))
    assert backend.listed(name) == []


def test_an_interrupted_creation_is_finished_by_the_next_setup(backend: Backend) -> None:
    """A crash between creating and marking (moto ignores tags given at creation, and
    fake-gcs-server labels) leaves an unmarked bucket: recorded, it is adopted and marked.
    Azure marks in the create call, so an unmarked container is never one of ours."""
    name = _name(backend.kind)
    creations = Recorded(backend)
    creations.record(name)
    backend.create_foreign(name)  # created, then the setup died before marking it
    if backend.kind == "azure_blob":
        with pytest.raises(SetupFailed) as failed:
            open_bucket(backend.ref(name)).ensure("loc-1", creations)
        assert failed.value.reason == Reason.NAME_TAKEN
        return
    assert open_bucket(backend.ref(name)).ensure("loc-1", creations).created
    # Marked now: a later setup without the record adopts it, another location may not.
    assert not open_bucket(backend.ref(name)).ensure("loc-1").created
    with pytest.raises(SetupFailed, match="marked for 'loc-1'"):
        open_bucket(backend.ref(name)).ensure("loc-2", creations)
    assert backend.listed(name) == [name]


def test_a_recorded_creation_never_takes_another_locations_bucket(backend: Backend) -> None:
    name = _name(backend.kind)
    open_bucket(backend.ref(name)).ensure("loc-2")
    creations = Recorded(backend)
    creations.record(name)
    with pytest.raises(SetupFailed) as failed:
        open_bucket(backend.ref(name)).ensure("loc-1", creations)
    assert failed.value.reason == Reason.NAME_TAKEN
    assert "'loc-2'" in str(failed.value)


def test_another_locations_bucket_is_name_taken(backend: Backend) -> None:
    name = _name(backend.kind)
    open_bucket(backend.ref(name)).ensure("loc-1")
    with pytest.raises(SetupFailed) as failed:
        open_bucket(backend.ref(name)).ensure("loc-2")
    assert failed.value.reason == "NameTaken"
    assert "'loc-1'" in str(failed.value)


def test_s3_bucket_of_another_account_is_name_taken(s3_moto: S3Store) -> None:
    """moto keeps buckets per account (x-moto-account-id), like AWS's global namespace;
    versitygw's root account sees every bucket."""
    s3 = s3_moto
    other = s3.client("eu-west-2")

    def as_other_account(request: Any, **_: Any) -> None:
        request.headers["x-moto-account-id"] = "111122223333"

    other.meta.events.register("before-sign.s3.*", as_other_account)
    name = _name("s3")
    other.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-2"})
    with pytest.raises(SetupFailed) as failed:
        open_bucket(_s3(s3).ref(name)).ensure("loc-1")
    assert failed.value.reason == "NameTaken"


@pytest.mark.parametrize(
    ("created_in", "declared"),
    [("eu-west-2", "us-east-1"), ("us-east-1", "eu-west-2"), ("ap-southeast-1", "eu-west-2")],
)
def test_s3_bucket_in_another_region_is_region_mismatch(
    s3_moto: S3Store, created_in: str, declared: str
) -> None:
    """The SDK made the bucket elsewhere and marked it ours; the Location declares another
    region. us-east-1 answers GetBucketLocation with no constraint at all. moto: versitygw
    answers GetBucketLocation with the region the request was signed for."""
    s3 = s3_moto
    name = _name("s3")
    sdk = s3.client(created_in)
    config = {} if created_in == "us-east-1" else {"LocationConstraint": created_in}
    sdk.create_bucket(Bucket=name, **({"CreateBucketConfiguration": config} if config else {}))
    sdk.put_bucket_tagging(
        Bucket=name, Tagging={"TagSet": [{"Key": S3_OWNER_TAG, "Value": "loc-1"}]}
    )
    with pytest.raises(SetupFailed) as failed:
        open_bucket(_s3(s3).ref(name, region=declared)).ensure("loc-1")
    assert failed.value.reason == Reason.REGION_MISMATCH
    assert not failed.value.retryable
    assert created_in in str(failed.value)
    assert declared in str(failed.value)


@pytest.mark.parametrize(
    ("serves", "declared"), [("eu-west-2", "us-east-1"), ("us-east-1", "ap-south-1")]
)
def test_s3_endpoint_of_another_region_is_region_mismatch(
    s3: VersityStore, serves: str, declared: str
) -> None:
    """An endpoint serving one region only (like AWS's regional endpoints), a Location
    declaring another: the store refuses the signature's region, and botocore does not sign
    again for the region the error names (which would create the bucket there, and leave the
    pods' URLs, signed for the declared region, all refused)."""
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    name = _name("s3")
    ref = BucketRef("s3", name, declared, endpoint=s3.gateway(serves), credentials=creds)
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc-1")
    assert failed.value.reason == Reason.REGION_MISMATCH
    assert not failed.value.retryable
    assert "spec.region" in str(failed.value)
    assert _s3(s3).listed(name) == []


def test_gcs_bucket_in_another_location_is_region_mismatch(gcs: GcsStore) -> None:
    """fake-gcs-server reports every bucket in its own -location (US-CENTRAL1), so a
    Location declaring europe-west4 sees the mismatch, as it would on GCS."""
    backend = _gcs(gcs)
    name = _name("gcs")
    open_bucket(backend.ref(name)).ensure("loc-1")
    with pytest.raises(SetupFailed) as failed:
        open_bucket(backend.ref(name, region="europe-west4")).ensure("loc-1")
    assert failed.value.reason == "RegionMismatch"
    assert "US-CENTRAL1" in str(failed.value)


def test_s3_compatible_region_is_a_tag(s3: VersityStore) -> None:
    """On an S3-compatible endpoint the region is the user's tag; requests are signed for
    signing_region. ensure cannot check the region there and says so."""
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    name = _name("s3_compatible")
    ref = BucketRef(
        "s3_compatible", name, "eu-north1", endpoint=s3.endpoint, credentials=creds,
        signing_region="us-east-1",
    )  # fmt: skip
    ensured = open_bucket(ref).ensure("nebius-eu-north1")
    assert (ensured.created, ensured.region_checked) == (True, False)
    bucket = open_bucket(ref)
    data = os.urandom(1000)
    assert send(bucket.presign_put("k", expires=60), data)[0] == 200
    assert send(bucket.presign_get("k", expires=60))[2] == data


def test_s3_compatible_parts_go_without_checksums(s3: VersityStore) -> None:
    """S3-compatible stores differ in what they do with checksum headers: given part
    checksums, the upload is made without them there, and completes."""
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    ref = BucketRef("s3_compatible", _name("s3_compatible"), "eu-north1", endpoint=s3.endpoint,
                    credentials=creds, signing_region="us-east-1")  # fmt: skip
    bucket = open_bucket(ref)
    bucket.ensure("nebius-eu-north1")
    chunks = [os.urandom(5 * MiB), os.urandom(1000)]
    crc32 = [crc32_b64(zlib.crc32(c)) for c in chunks]
    upload = bucket.start_multipart("k", parts=2, expires=300, crc32=crc32)
    assert all(CRC32_HEADER not in p.headers for p in upload.parts)
    bucket.complete_multipart("k", upload, upload_parts(upload.parts, chunks), crc32)
    stat = bucket.stat("k")
    assert stat is not None and stat.size == len(chunks[0]) + len(chunks[1])


def test_s3_compatible_endpoint_wanting_another_signing_region(s3: VersityStore) -> None:
    """Signed for eu-north1 (no signingRegion), an endpoint serving us-east-1 only refuses
    the signature's region: the message points at signingRegion."""
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    ref = BucketRef(
        "s3_compatible", _name("s3_compatible"), "eu-north1", endpoint=s3.gateway("us-east-1"),
        credentials=creds,
    )  # fmt: skip
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc-1")
    assert failed.value.reason == "RegionMismatch"
    assert "signingRegion" in str(failed.value)
    assert _s3(s3).listed(ref.bucket) == []


@pytest.mark.parametrize("wrong", ["secretAccessKey", "accessKeyId"])
def test_s3_wrong_keys_are_bad_credentials(s3: VersityStore, wrong: str) -> None:
    """versitygw refuses a wrong secret (SignatureDoesNotMatch) and an unknown key
    (InvalidAccessKeyId) as S3 does: BadCredentials, not retryable, the secret never shown."""
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    creds[wrong] = "O41WRONG" + uuid.uuid4().hex.upper()
    name = _name("s3")
    with pytest.raises(SetupFailed) as failed:
        open_bucket(_s3(s3).ref(name, credentials=creds)).ensure("loc-1")
    assert failed.value.reason == Reason.BAD_CREDENTIALS
    assert not failed.value.retryable
    assert "accessKeyId/secretAccessKey" in str(failed.value)
    assert creds["secretAccessKey"] not in str(failed.value)
    assert _s3(s3).listed(name) == []


def test_azurite_refuses_a_wrong_account_key(azure: AzureStore) -> None:
    wrong = base64.b64encode(os.urandom(64)).decode()
    ref = _azure(azure).ref(_name("azure_blob"), credentials={"accountKey": wrong})
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc-1")
    assert failed.value.reason == Reason.BAD_CREDENTIALS
    assert not failed.value.retryable
    assert wrong not in str(failed.value)
    assert wrong not in repr(failed.value)


@pytest.mark.timeout(30)
def test_closed_port_is_endpoint_unreachable(backend: Backend) -> None:
    """Nothing listens on the port: a retryable EndpointUnreachable after a short connect
    timeout and at most one retry (the test's timeout guards against the SDK defaults)."""
    closed = f"http://127.0.0.1:{free_port()}"
    ref = backend.ref(_name(backend.kind))
    if backend.kind == "azure_blob":
        ref = replace(ref, account_url=f"{closed}/devstoreaccount1")
    else:
        ref = replace(ref, endpoint=closed)
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc-1")
    assert failed.value.reason == Reason.ENDPOINT_UNREACHABLE
    assert failed.value.retryable
    assert closed in str(failed.value)


def test_check_reports_a_missing_bucket(backend: Backend) -> None:
    with pytest.raises(SetupFailed) as failed:
        open_bucket(backend.ref(_name(backend.kind))).check()
    assert failed.value.reason == Reason.BUCKET_MISSING
    assert not failed.value.retryable


# ---------------------------------------------------------------------------- transfers

KEY = "runs/7/ckpt 1+ü.bin"  # space, plus and non-ASCII: the URLs must encode them right


def test_put_then_get_through_signed_requests(ready: Bucket) -> None:
    data = os.urandom(256 * 1024)
    put = ready.presign_put(KEY, expires=300, size=len(data))
    assert put.method == "PUT"
    assert put.expires_at > dt.datetime.now(dt.UTC)
    status, _, body = send(put, data)
    assert status in (200, 201), body[:300]

    stat = ready.stat(KEY)
    assert stat is not None
    assert stat.size == len(data)
    if stat.md5 is not None:
        assert stat.md5 == hashlib.md5(data).hexdigest()

    status, _, body = send(ready.presign_get(KEY, expires=300))
    assert status == 200
    assert body == data


def test_stat_of_a_missing_key_is_none(ready: Bucket) -> None:
    assert ready.stat("no/such/object") is None


def test_list_under_a_prefix_gives_each_object_its_size(ready: Bucket) -> None:
    """A directory version's commit lists its prefix: every key under it (and only those),
    with the size and, where the listing shows one, the MD5 of each."""
    files = {f"d/v1/{name}": os.urandom(n) for n, name in enumerate(["a", "b/c", "é f"], 1)}
    files["d/v10/other"] = b"not under d/v1/"
    for key, data in files.items():
        status, _, body = send(ready.presign_put(key, expires=300, size=len(data)), data)
        assert status in (200, 201), body[:300]
    listed = ready.list_under("d/v1/")
    assert sorted(listed) == ["d/v1/a", "d/v1/b/c", "d/v1/é f"]
    for key, stat in listed.items():
        assert stat.size == len(files[key])
        if stat.md5 is not None:
            assert stat.md5 == hashlib.md5(files[key]).hexdigest()
    assert ready.list_under("nothing/here/") == {}


def test_delete_removes_the_object_and_is_idempotent(ready: Bucket) -> None:
    """What retention calls: the object is gone; a second delete (a pass repeated after a
    crash) and a delete of a key that never existed are no error."""
    put = ready.presign_put("r/old", expires=300, size=3)
    status, _, body = send(put, b"old")
    assert status in (200, 201), body[:300]
    kept = ready.presign_put("r/kept", expires=300, size=4)
    assert send(kept, b"kept")[0] in (200, 201)
    ready.delete("r/old")
    assert ready.stat("r/old") is None
    ready.delete("r/old")
    ready.delete("never/was")
    stat = ready.stat("r/kept")
    assert stat is not None and stat.size == 4


async def test_a_directory_versions_files_are_deleted_and_only_they(ready: Bucket) -> None:
    """What the sweeper (an expired directory write: the manifest's files the bucket
    holds) and retention (a let-go directory version: every object under its prefix) call
    on each backend: the objects go, a neighbouring version's prefix stays, and a repeat
    deletes nothing more."""
    from o41.webhook.buckets import OpenBucket, delete_files

    files = {f"d/v1/{name}": os.urandom(n) for n, name in enumerate(["a", "b/c", "é f"], 1)}
    files["d/v10/other"] = b"not under d/v1/"
    for key, data in files.items():
        status, _, body = send(ready.presign_put(key, expires=300, size=len(data)), data)
        assert status in (200, 201), body[:300]
    opened = OpenBucket(ready, signs_locally=True)
    # the sweeper's way: the manifest's paths (one never uploaded), only those held
    assert await delete_files(opened, "loc", "d/v1", ["a", "never-sent"]) == (1, 1)
    assert sorted(ready.list_under("d/")) == ["d/v1/b/c", "d/v1/é f", "d/v10/other"]
    # retention's way: everything under the prefix
    assert await delete_files(opened, "loc", "d/v1") == (2, 5)
    assert sorted(ready.list_under("d/")) == ["d/v10/other"]
    assert await delete_files(opened, "loc", "d/v1") == (0, 0)


def _chunks(kind: Kind) -> list[bytes]:
    """S3 parts must be >= 5 MiB except the last; GCS and Azure take any size, so GCS gets
    more than 32 parts to need a second level of compose."""
    if kind == "gcs":
        return [os.urandom(64 * 1024 + n) for n in range(40)]
    return [os.urandom(5 * MiB), os.urandom(5 * MiB + 17), os.urandom(123_457)]


@pytest.mark.parametrize("with_crc32", [False, True], ids=["plain", "crc32"])
def test_multipart_upload_in_parallel(backend: Backend, ready: Bucket, with_crc32: bool) -> None:
    """With each part's CRC32, S3 keeps the composite checksum; GCS and Azure take no
    CRC32 per part and the same call still works there."""
    chunks = _chunks(backend.kind)
    whole = b"".join(chunks)
    crc32 = [crc32_b64(zlib.crc32(c)) for c in chunks] if with_crc32 else None
    upload = ready.start_multipart(KEY, parts=len(chunks), expires=300, crc32=crc32)
    assert len(upload.parts) == len(chunks)
    etags = upload_parts(upload.parts, chunks)

    ready.complete_multipart(KEY, upload.upload_id, etags, crc32)

    stat = ready.stat(KEY)
    assert stat is not None
    assert stat.size == len(whole)
    if crc32 is not None and backend.kind == "s3":
        assert stat.crc32 is not None and composite_matches(stat.crc32, crc32)
    status, _, body = send(ready.presign_get(KEY, expires=300))
    assert status == 200
    assert hashlib.sha256(body).digest() == hashlib.sha256(whole).digest()


def test_s3_part_urls_are_signed_for_the_buckets_region(s3: VersityStore) -> None:
    """The part URLs verify with the secret as S3 computes it (versitygw takes them too:
    test_multipart_upload_in_parallel)."""
    bucket = open_bucket(_s3(s3).ref(_name("s3"), region="ap-southeast-1"))
    bucket.ensure("loc-1")
    upload = bucket.start_multipart("k", parts=2, expires=300)
    for part in upload.parts:
        verdict = check_sigv4_url(
            part.url, method="PUT", access_key=s3.access_key, secret_key=s3.secret_key,
            region="ap-southeast-1", now=dt.datetime.now(dt.UTC), headers=part.headers,
        )  # fmt: skip
        assert verdict == "ok"
    bucket.abort_multipart("k", upload)


def test_s3_part_checksums_are_signed_into_the_part_urls(s3: VersityStore) -> None:
    """A part's CRC32 header is part of its signature: S3 refuses the URL with another
    checksum, so a pod cannot swap in other bytes with their own CRC32."""
    bucket = open_bucket(_s3(s3).ref(_name("s3")))
    bucket.ensure("loc-1")
    crc32 = [crc32_b64(zlib.crc32(b"part one")), crc32_b64(zlib.crc32(b"part two"))]
    upload = bucket.start_multipart("k", parts=2, expires=300, crc32=crc32)
    for part, checksum in zip(upload.parts, crc32, strict=True):
        assert part.headers[CRC32_HEADER] == checksum
        assert CRC32_HEADER in parse_qs(urlsplit(part.url).query)["X-Amz-SignedHeaders"][0]

        def verdict(headers: Mapping[str, str], url: str = part.url) -> str:
            return check_sigv4_url(
                url, method="PUT", access_key=s3.access_key, secret_key=s3.secret_key,
                region="eu-west-2", now=dt.datetime.now(dt.UTC), headers=headers,
            )  # fmt: skip

        assert verdict(part.headers) == "ok"
        swapped = {**part.headers, CRC32_HEADER: crc32_b64(zlib.crc32(b"other bytes"))}
        assert verdict(swapped) == "bad signature"
        # and the store itself: other bytes with their own checksum, or under the signed one
        status, _, body = send(replace(part, headers=swapped), b"other bytes")
        assert (status, b"SignatureDoesNotMatch" in body) == (403, True)
        status, _, body = send(part, b"other bytes")
        assert (status, b"BadDigest" in body) == (400, True)
    bucket.abort_multipart("k", upload)


def test_gcs_compose_deletes_only_its_own_parts(gcs: GcsStore) -> None:
    """The one delete o41 makes: this upload's part objects. Another upload's parts of the
    same key and the user's objects stay."""
    backend = _gcs(gcs)
    name = _name("gcs")
    bucket = open_bucket(backend.ref(name))
    bucket.ensure("loc-1")
    sdk_bucket = gcs.client().bucket(name)
    sdk_bucket.blob("user/data.bin").upload_from_string(b"user")
    mine = bucket.start_multipart("k", parts=2, expires=300)
    theirs = bucket.start_multipart("k", parts=1, expires=300)
    upload_parts(mine.parts, [b"a" * 10, b"b" * 10])
    upload_parts(theirs.parts, [b"c" * 10])

    bucket.complete_multipart("k", mine, ["", ""])

    names = {b.name for b in gcs.client().list_blobs(name)}
    assert names == {
        MARKER_OBJECT,
        "user/data.bin",
        "k",
        f"k.o41part-{theirs.upload_id}-00001",
    }
    bucket.abort_multipart("k", theirs)
    assert {b.name for b in gcs.client().list_blobs(name)} == {MARKER_OBJECT, "user/data.bin", "k"}


def test_complete_with_a_missing_part_is_upload_incomplete(backend: Backend, ready: Bucket) -> None:
    """The client's fault, not the bucket's: UploadIncomplete, so the placement service
    doesn't exclude a healthy location."""
    chunks = _chunks(backend.kind)[:3]
    upload = ready.start_multipart("partial", parts=3, expires=300)
    etags = upload_parts(upload.parts[:2], chunks[:2])
    with pytest.raises(UploadIncomplete) as failed:
        ready.complete_multipart("partial", upload, [*etags, '"0123456789abcdef0123456789abcdef"'])
    assert failed.value.reason == "UploadIncomplete"
    assert ready.stat("partial") is None
    ready.abort_multipart("partial", upload)


# ----------------------------------------------------------- the service's own objects


def test_put_then_get_gives_the_bytes_and_a_put_replaces(ready: Bucket) -> None:
    """Records, manifests and journal entries the placement service writes itself: the
    exact bytes back, the MD5 the store checked kept where it shows one, a second put
    replacing the first, an empty object an object too."""
    data = os.urandom(300_001)
    ready.put(KEY, data)
    assert ready.get(KEY) == data
    stat = ready.stat(KEY)
    assert stat is not None and stat.size == len(data)
    assert stat.md5 == hashlib.md5(data).hexdigest()  # all three stand-ins show it

    shorter = b'{"version": 2}'
    ready.put(KEY, shorter)
    assert ready.get(KEY) == shorter
    stat = ready.stat(KEY)
    assert stat is not None and stat.size == len(shorter)

    ready.put("empty", b"")
    assert ready.get("empty") == b""


@pytest.mark.parametrize("backend", ["s3", "azure_blob"], indirect=True)
def test_a_put_whose_bytes_differ_from_their_md5_is_refused(
    backend: Backend, ready: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MD5 a put sends is checked by the store: made to send the MD5 of other bytes,
    as if its bytes had changed on the way, the write is refused and the old object
    stays. Not on GCS: fake-gcs-server ignores the md5Hash it is sent (GCS checks it)."""
    ready.put("r", b"old")
    other = hashlib.md5(b"other bytes")
    if backend.kind == "s3":
        import o41.storage.s3

        monkeypatch.setattr(o41.storage.s3, "hashlib", SimpleNamespace(md5=lambda _: other))
    else:
        from azure.storage.blob._shared import policies  # the SDK's Content-MD5

        monkeypatch.setattr(policies, "calculate_content_md5", lambda _: other.digest())
    with pytest.raises(StorageError) as failed:
        ready.put("r", b"new")
    assert failed.value.reason == Reason.BACKEND_ERROR
    assert "writing an object to" in str(failed.value)
    monkeypatch.undo()
    assert ready.get("r") == b"old"


def test_get_of_a_missing_key_is_none(ready: Bucket) -> None:
    assert ready.get("no/such/object") is None


def test_put_objects_are_listed_with_their_sizes(ready: Bucket) -> None:
    entries = {f"journal/{n:04d}": os.urandom(10 + n) for n in range(3)}
    for key, data in entries.items():
        ready.put(key, data)
    ready.put("journalist", b"not under journal/")
    listed = ready.list_under("journal/")
    assert {key: stat.size for key, stat in listed.items()} == {
        key: len(data) for key, data in entries.items()
    }


def test_upload_then_download_a_large_file(
    backend: Backend, ready: Bucket, tmp_path: pathlib.Path
) -> None:
    """An etcd snapshot: uploaded in parts (two on S3 and Azure, each part checked there),
    downloaded byte for byte, over a file already at the path."""
    source = tmp_path / "snapshot.db"
    with source.open("wb") as f:
        for _ in range(12):
            f.write(os.urandom(MiB))
        f.write(os.urandom(12_345))
    want = hashlib.sha256(source.read_bytes()).hexdigest()

    ready.upload("etcd/snapshot.db", source)

    stat = ready.stat("etcd/snapshot.db")
    assert stat is not None and stat.size == source.stat().st_size
    if backend.kind == "s3":
        head = backend.sdk.head_object(Bucket=ready.ref.bucket, Key="etcd/snapshot.db")
        assert head["ETag"].endswith('-2"')  # multipart: two parts of 8 MiB at most
        assert stat.crc32 is not None and stat.crc32.endswith("-2")  # each part's CRC32
    if backend.kind == "azure_blob":
        blob = backend.sdk.get_blob_client(ready.ref.bucket, "etcd/snapshot.db")
        committed, _ = blob.get_block_list("committed")
        assert len(committed) == 2

    target = tmp_path / "restored.db"
    target.write_bytes(b"an older snapshot")
    assert ready.download("etcd/snapshot.db", target)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["restored.db", "snapshot.db"]


def test_download_of_a_missing_key_is_false_and_writes_nothing(
    ready: Bucket, tmp_path: pathlib.Path
) -> None:
    target = tmp_path / "restored.db"
    assert ready.download("no/such/snapshot", target) is False
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left either
    target.write_bytes(b"kept")
    assert ready.download("no/such/snapshot", target) is False
    assert target.read_bytes() == b"kept"


def test_standin_bucket_puts_gets_uploads_and_downloads(tmp_path: pathlib.Path) -> None:
    """The in-process stand-in (testbed.standin_bucket) the service's tests use:
    no server needed for what the service writes and reads itself."""
    from testbed.standin_bucket import StandInBucket, Storage

    storage = Storage()
    bucket = StandInBucket(BucketRef("s3", "o41-standin", "us-east-1"), storage)
    other = StandInBucket(BucketRef("s3", "o41-other", "us-east-1"), storage)
    bucket.put(KEY, b"one")
    bucket.put(KEY, b"two")
    assert bucket.get(KEY) == b"two"
    assert other.get(KEY) is None
    assert bucket.get("no/such/object") is None
    stat = bucket.stat(KEY)
    assert stat is not None and stat.size == 3 and stat.md5 == hashlib.md5(b"two").hexdigest()
    assert {k: s.size for k, s in bucket.list_under("runs/").items()} == {KEY: 3}

    source = tmp_path / "snapshot.db"
    source.write_bytes(os.urandom(100_000))
    bucket.upload("etcd/snapshot.db", source)
    target = tmp_path / "restored.db"
    assert bucket.download("etcd/snapshot.db", target)
    assert target.read_bytes() == source.read_bytes()
    assert not bucket.download("no/such/snapshot", tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
