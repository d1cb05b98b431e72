"""o41.storage without servers: names, errors, and signed URLs for the real clouds.

Presigning is local computation, so the URLs pods would get on AWS, Google and Azure are
built here and checked against the clouds' documented signing rules (the checkers in
tests/storage/test_signatures.py), with nothing listening anywhere. A socket guard fails any test
that tries to resolve or reach a non-loopback address. The stand-in tests are in
tests/storage/test_storage_stores.py.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
import socket
import subprocess
import sys
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st

from o41.storage import (
    KINDS,
    Bucket,
    BucketRef,
    Kind,
    Reason,
    SetupFailed,
    bucket_name,
    bucket_name_problem,
    open_bucket,
    owner_mark,
)
from o41.storage.base import scrub
from test_signatures import check_gcs_v4_url, check_sigv4_url
from testbed.stores import S3_ACCESS_KEY, S3_SECRET_KEY, throwaway_service_account

NOWHERE = "http://127.0.0.1:9"  # discard port: nothing listens, nothing is sent
S3_CREDS = {"accessKeyId": S3_ACCESS_KEY, "secretAccessKey": S3_SECRET_KEY}

# ------------------------------------------------------------------------------- safety

_ENV_DROP = (
    "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "GOOGLE_APPLICATION_CREDENTIALS",
    "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING", "HTTP_PROXY", "HTTPS_PROXY",
    "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
)  # fmt: skip


def _loopback(host: object) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SDK may find ambient credentials, a metadata service or a proxy, and no socket
    may resolve or reach anything but loopback: a slip fails the test instead of calling
    a cloud."""
    for name in _ENV_DROP:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"{NOWHERE}/")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/o41-test")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/o41-test")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            raise AssertionError(f"test tried to connect to {address!r}")
        real_connect(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _loopback(host.decode() if isinstance(host, bytes) else host):
            raise AssertionError(f"test tried to resolve {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_the_guard_refuses_the_metadata_address() -> None:
    with pytest.raises(AssertionError, match=r"169\.254\.169\.254"):
        socket.create_connection(("169.254.169.254", 80), timeout=0.1)
    with pytest.raises(AssertionError, match=r"metadata\.google\.internal"):
        socket.getaddrinfo("metadata.google.internal", 80)


def test_package_imports_no_cloud_sdk() -> None:
    """The admission webhook and the client import o41.storage; only a bucket call may
    load boto3, google-cloud-storage or azure-storage-blob, and only the one it needs."""
    code = (
        "import sys, o41.storage as s\n"
        "s.bucket_name('gcs', 'x', 'y')\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(roots & {'boto3', 'botocore', 'google', 'azure'}))\n"
        "s.open_bucket(s.BucketRef('azure_blob', 'abc', 'westeurope',"
        " account_url='http://127.0.0.1:9/a'))\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(roots & {'boto3', 'botocore', 'google', 'azure'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out == ["[]", "['azure']"]


# -------------------------------------------------------------------------------- names

_STRICTEST = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def _valid_everywhere(name: str) -> bool:
    """The rules written out independently of the implementation: Azure's container
    syntax (the strictest), S3's reserved prefixes/suffixes, GCS's "google" rules."""
    return (
        _STRICTEST.fullmatch(name) is not None
        and not name.startswith(("xn--", "sthree-", "amzn-s3-demo-", "goog"))
        and not name.endswith(_S3_RESERVED_SUFFIXES)
        and re.search(r"g[o0]+g[l1]", name) is None
    )


names = st.text(min_size=0, max_size=300)
uids = st.text(min_size=1, max_size=80)
kinds = st.sampled_from(KINDS)


@given(kind=kinds, name=names, uid=uids)
def test_generated_names_are_valid_for_every_backend(kind: Kind, name: str, uid: str) -> None:
    generated = bucket_name(kind, name, uid)
    assert _valid_everywhere(generated), generated
    for other in KINDS:
        assert bucket_name_problem(other, generated) is None


@given(kind=kinds, name=names, uid=uids)
def test_generated_names_are_stable(kind: Kind, name: str, uid: str) -> None:
    assert bucket_name(kind, name, uid) == bucket_name(kind, name, uid)


@given(kind=kinds, name=names, uid1=uids, uid2=uids)
def test_distinct_uids_give_distinct_names(kind: Kind, name: str, uid1: str, uid2: str) -> None:
    if uid1 != uid2:
        assert bucket_name(kind, name, uid1) != bucket_name(kind, name, uid2)


def test_generated_names_read_like_the_location() -> None:
    uid = "0b7d9f0e-8e4b-4c43-9d43-7b3f1b0d2a11"
    assert bucket_name("s3", "aws-us-east-1", uid).startswith("o41-aws-us-east-1-")
    assert bucket_name("gcs", "My google--Bucket!", uid).startswith("o41-my-bucket-")
    assert bucket_name("gcs", "", uid).startswith("o41-")
    assert len(bucket_name("azure_blob", "x" * 300, uid)) == 63


@pytest.mark.parametrize(
    ("kind", "name", "fragment"),
    [
        ("s3", "ab", "3 to 63"),
        ("s3", "My-Bucket", "lowercase"),
        ("s3", "192.168.10.1", "IP address"),
        ("s3", "xn--bucket", "reserves"),
        ("s3", "data-s3alias", "reserves"),
        ("s3", "a..b", "dot"),
        ("gcs", "goog-data", "goog"),
        ("gcs", "my-g00gle-data", "google"),
        ("azure_blob", "a--b", "single hyphens"),
        ("azure_blob", "a.b.c", "single hyphens"),
        ("azure_blob", "-abc", "single hyphens"),
    ],
)
def test_invalid_names_say_which_rule(kind: Kind, name: str, fragment: str) -> None:
    problem = bucket_name_problem(kind, name)
    assert problem is not None
    assert fragment in problem


@pytest.mark.parametrize(
    ("kind", "name"), [("s3", "my.data-1"), ("gcs", "my_data.1"), ("azure_blob", "my-data-1")]
)
def test_valid_user_names_pass(kind: Kind, name: str) -> None:
    assert bucket_name_problem(kind, name) is None


_LABEL_VALUE = re.compile(r"[a-z0-9_-]{1,63}")


@given(owner=st.text(min_size=1, max_size=300))
def test_owner_marks_fit_every_backend(owner: str) -> None:
    """GCS label values are the strictest mark syntax; every backend stores this form."""
    mark = owner_mark(owner)
    assert _LABEL_VALUE.fullmatch(mark), mark
    assert owner_mark(owner) == mark


def test_owner_marks_keep_simple_names_and_tell_long_ones_apart() -> None:
    assert owner_mark("aws-us-east-1") == "aws-us-east-1"
    long_a, long_b = "a" * 100 + "-1", "a" * 100 + "-2"
    assert owner_mark(long_a) != owner_mark(long_b)


# ------------------------------------------------------------------------------- errors


def test_ref_repr_never_shows_credentials() -> None:
    ref = BucketRef("s3", "bkt", "eu-west-2", credentials=S3_CREDS)
    assert S3_SECRET_KEY not in repr(ref)
    assert S3_SECRET_KEY not in str(ref)


def test_scrub_removes_credentials_and_pem_lines() -> None:
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    text = f"failed with key {S3_SECRET_KEY} and MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
    cleaned = scrub(text, [S3_SECRET_KEY, pem])
    assert S3_SECRET_KEY not in cleaned
    assert "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in cleaned


def _ref(kind: Kind, credentials: dict[str, str] | None) -> BucketRef:
    return BucketRef(
        kind, "o41-a-b", "eu-north1", endpoint=NOWHERE, account_url=f"{NOWHERE}/acct",
        credentials=credentials,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("ref", "secret"),
    [
        pytest.param(_ref("s3", {"accessKeyId": "AKIAEXAMPLE123"}), "AKIAEXAMPLE123", id="s3"),
        pytest.param(
            _ref("s3_compatible", {"secretAccessKey": "s3cr3t-value"}), "s3cr3t-value", id="s3c"
        ),
        pytest.param(
            _ref("gcs", {"serviceAccount.json": '{"private_key": "s3cr3t-value"'}),
            "s3cr3t-value",
            id="gcs-broken-json",
        ),
        pytest.param(_ref("gcs", {}), None, id="gcs-no-key-file"),
        pytest.param(
            _ref("azure_blob", {"accountKey": "not base64 s3cr3t!"}), "s3cr3t", id="azure-bad-key"
        ),
        pytest.param(_ref("azure_blob", None), None, id="azure-ambient"),
    ],
)
def test_unusable_credentials_fail_before_any_call(ref: BucketRef, secret: str | None) -> None:
    """A Secret without the backend's keys, or with a value that can't be one, is
    BadCredentials at once (nothing listens at the endpoint: a call would say otherwise)."""
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc")
    assert failed.value.reason == "BadCredentials"
    assert not failed.value.retryable
    if secret:
        assert secret not in str(failed.value)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_bucket_name_fails_before_any_call(kind: Kind) -> None:
    ref = BucketRef(
        kind, "Not_A_Bucket", "eu-west-2", endpoint=NOWHERE, account_url=f"{NOWHERE}/acct",
        credentials={**S3_CREDS, "accountKey": "a2V5a2V5a2V5a2V5", "serviceAccount.json": "{}"},
    )  # fmt: skip
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc")
    assert failed.value.reason == "InvalidBucketName"
    assert "spec.bucket" in str(failed.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_unresolvable_endpoint_is_endpoint_unreachable(
    kind: Kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that does not resolve (the guard answers NXDOMAIN, no DNS server is asked)."""

    def nxdomain(host: Any, *args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", nxdomain)
    ref = BucketRef(
        kind, "o41-a-b", "eu-west-2", endpoint="http://storage.invalid",
        account_url="http://storage.invalid/acct",
        credentials={**S3_CREDS, "accountKey": "a2V5a2V5a2V5a2V5a2V5a2V5"},
    )  # fmt: skip
    if kind == "gcs":
        ref = BucketRef(kind, "o41-a-b", "us-central1", endpoint="http://storage.invalid")
    with pytest.raises(SetupFailed) as failed:
        open_bucket(ref).ensure("loc")
    assert failed.value.reason == Reason.ENDPOINT_UNREACHABLE
    assert failed.value.retryable


def test_backends_implement_the_protocol() -> None:
    """mypy checks these assignments structurally against the Bucket protocol."""
    from o41.storage.azure import AzureBucket
    from o41.storage.gcs import GcsBucket
    from o41.storage.s3 import S3Bucket

    ref = BucketRef("s3", "o41-a-b", "eu-west-2")
    buckets: list[Bucket] = [
        S3Bucket(ref),
        GcsBucket(BucketRef("gcs", "o41-a-b", "eu-west-2")),
        AzureBucket(BucketRef("azure_blob", "o41-a-b", "eu-west-2", account_url=NOWHERE)),
    ]
    assert [type(b).__name__ for b in buckets] == ["S3Bucket", "GcsBucket", "AzureBucket"]


@pytest.mark.parametrize("expires", [0, -5, 7 * 24 * 3600 + 1])
def test_expiry_outside_what_clouds_accept_is_refused(expires: int) -> None:
    bucket = open_bucket(BucketRef("s3", "o41-a-b", "eu-west-2", credentials=S3_CREDS))
    with pytest.raises(ValueError, match="expires"):
        bucket.presign_get("k", expires=expires)


# ------------------------------------------------------------------ real clouds' URLs


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.mark.parametrize(
    ("region", "bucket", "host", "path"),
    [
        ("eu-west-2", "o41-art-0a1b", "o41-art-0a1b.s3.eu-west-2.amazonaws.com", "/runs/1 +ü"),
        ("us-east-1", "o41-art-0a1b", "o41-art-0a1b.s3.us-east-1.amazonaws.com", "/runs/1 +ü"),
        # Dotted names break the wildcard certificate of virtual hosts: path style.
        ("ap-southeast-2", "o41.art", "s3.ap-southeast-2.amazonaws.com", "/o41.art/runs/1 +ü"),
    ],
)
def test_aws_urls_are_signed_for_the_buckets_regional_endpoint(
    region: str, bucket: str, host: str, path: str
) -> None:
    """On AWS a URL must name the bucket's region, in its host and in its SigV4 scope:
    opt-in regions accept nothing else. The signature verifies with the secret."""
    b = open_bucket(BucketRef("s3", bucket, region, credentials=S3_CREDS))
    put = b.presign_put("runs/1 +ü", expires=600, size=11)
    get = b.presign_get("runs/1 +ü", expires=600)
    for req in (put, get):
        parts = urlsplit(req.url)
        assert (parts.scheme, parts.hostname) == ("https", host)
        assert unquote(parts.path) == path
        verdict = check_sigv4_url(
            req.url, method=req.method, access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY,
            region=region, now=_now(), headers=req.headers,
        )  # fmt: skip
        assert verdict == "ok"
    assert put.headers == {"Content-Type": "application/octet-stream", "Content-Length": "11"}
    # The size is signed: a request of another size no longer matches the signature.
    other = check_sigv4_url(
        put.url, method="PUT", access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY,
        region=region, now=_now(),
        headers={"Content-Type": "application/octet-stream", "Content-Length": "12"},
    )  # fmt: skip
    assert other == "bad signature"


@pytest.mark.parametrize(
    ("style", "signing_region", "host", "scope"),
    [
        ("virtual", None, "o41-x.storage.eu-north1.nebius.cloud", "eu-north1"),
        ("path", "auto", "storage.eu-north1.nebius.cloud", "auto"),
    ],
)
def test_s3_compatible_urls_use_the_endpoint_style_and_signing_region(
    style: str, signing_region: str | None, host: str, scope: str
) -> None:
    ref = BucketRef(
        "s3_compatible", "o41-x", "eu-north1",
        endpoint="https://storage.eu-north1.nebius.cloud", credentials=S3_CREDS,
        signing_region=signing_region, addressing_style=style,
    )  # fmt: skip
    get = open_bucket(ref).presign_get("a/b", expires=60)
    assert urlsplit(get.url).hostname == host
    assert check_sigv4_url(
        get.url, method="GET", access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY,
        region=scope, now=_now(),
    ) == "ok"  # fmt: skip


@pytest.fixture(scope="module")
def service_account() -> dict[str, str]:
    return throwaway_service_account("o41-test", token_uri=f"{NOWHERE}/token")


def _public_key(info: dict[str, str]) -> rsa.RSAPublicKey:
    key = serialization.load_pem_private_key(info["private_key"].encode(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    return key.public_key()


def test_gcs_urls_are_v4_signed_by_the_locations_service_account(
    service_account: dict[str, str],
) -> None:
    ref = BucketRef(
        "gcs", "o41-art-0a1b", "europe-west4",
        credentials={"serviceAccount.json": json.dumps(service_account)},
    )  # fmt: skip
    b = open_bucket(ref)
    put = b.presign_put("runs/1 +ü", expires=600, size=5)
    get = b.presign_get("runs/1 +ü", expires=600)
    assert put.headers == {
        "Content-Type": "application/octet-stream",
        "x-goog-content-length-range": "5,5",
    }
    for req in (put, get):
        assert req.url.startswith("https://storage.googleapis.com/o41-art-0a1b/runs/1%20%2B")
        verdict = check_gcs_v4_url(
            req.url, method=req.method, public_key=_public_key(service_account),
            signer_email=service_account["client_email"], now=_now(), headers=req.headers,
        )  # fmt: skip
        assert verdict == "ok"
    wrong_size = dict(put.headers, **{"x-goog-content-length-range": "0,999999"})
    assert check_gcs_v4_url(
        put.url, method="PUT", public_key=_public_key(service_account),
        signer_email=service_account["client_email"], now=_now(), headers=wrong_size,
    ) == "bad signature"  # fmt: skip


def test_gcs_multipart_parts_are_separate_signed_objects(service_account: dict[str, str]) -> None:
    """No request is needed to start a GCS multipart upload: part objects are signed PUTs."""
    ref = BucketRef(
        "gcs", "o41-art-0a1b", "europe-west4",
        credentials={"serviceAccount.json": json.dumps(service_account)},
    )  # fmt: skip
    upload = open_bucket(ref).start_multipart("ckpt/model.bin", parts=3, expires=600)
    assert re.fullmatch(r"[0-9a-f]{16}", upload.upload_id)
    paths = [urlsplit(p.url).path for p in upload.parts]
    assert paths == [
        f"/o41-art-0a1b/ckpt/model.bin.o41part-{upload.upload_id}-{n:05d}" for n in (1, 2, 3)
    ]


def test_azure_urls_carry_a_narrow_service_sas() -> None:
    key = "a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5"
    ref = BucketRef(
        "azure_blob", "o41-art-0a1b", "westeurope",
        account_url="https://acct.blob.core.windows.net", credentials={"accountKey": key},
    )  # fmt: skip
    b = open_bucket(ref)
    put = b.presign_put("runs/1 +ü", expires=600)
    get = b.presign_get("runs/1 +ü", expires=600)
    assert put.headers["x-ms-blob-type"] == "BlockBlob"
    assert urlsplit(put.url).hostname == "acct.blob.core.windows.net"
    put_q, get_q = parse_qs(urlsplit(put.url).query), parse_qs(urlsplit(get.url).query)
    assert (put_q["sp"], put_q["sr"]) == (["cw"], ["b"])
    assert (get_q["sp"], get_q["sr"]) == (["r"], ["b"])
    assert key not in put.url


def test_azure_block_ids_have_one_width() -> None:
    """Azure refuses a block list whose ids differ in length."""
    ref = BucketRef(
        "azure_blob", "o41-art-0a1b", "westeurope",
        account_url="https://acct.blob.core.windows.net",
        credentials={"accountKey": "a2V5a2V5a2V5a2V5a2V5a2V5a2V5a2V5"},
    )  # fmt: skip
    upload = open_bucket(ref).start_multipart("k", parts=120, expires=600)
    ids = [parse_qs(urlsplit(p.url).query)["blockid"][0] for p in upload.parts]
    assert len(set(ids)) == 120
    assert len({len(i) for i in ids}) == 1
    assert all(parse_qs(urlsplit(p.url).query)["comp"] == ["block"] for p in upload.parts)
