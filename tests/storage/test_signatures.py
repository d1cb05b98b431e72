"""The signed URLs we hand to pods pass the real clouds' checks, and nothing wider does.

Offline, for both clouds: these tests recompute the signatures the way AWS and Google
document them, independently of the SDKs that produced them:
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html and
https://cloud.google.com/storage/docs/access-control/signing-urls-manually
A good URL must verify. A tampered URL, a wrong secret or key, or an expired URL must not.
(fake-gcs-server checks no V4 signature, so for GCS this is all there is.)

Against the S3 stand-in (versitygw, which checks SigV4 as S3 does): the URLs the placement
service makes are taken, and every tampered, expired, wrong-key or widened one (another
method, key, bucket, size, part or region; a signed header added or left out) is refused by
the store itself, with S3's error code, and changes nothing in the bucket.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from o41.storage import BucketRef, SignedRequest, bucket_name, open_bucket, sigv4
from o41.storage.s3 import S3Bucket
from testbed.stores import (
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    GcsStore,
    S3Store,
    VersityStore,
    throwaway_service_account,
)

ENDPOINT = "http://127.0.0.1:9"  # never contacted: presigning is local computation
MAX_EXPIRES = 7 * 24 * 3600  # both clouds cap signed URLs at 7 days


def _utc(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)


def _query_pairs(query: str) -> list[tuple[str, str]]:
    # A literal "+" is a plus sign to both clouds (RFC 3986), not a space as in forms.
    return parse_qsl(query.replace("+", "%2B"), keep_blank_values=True, strict_parsing=False)


def _encode(s: str) -> str:
    """RFC 3986 percent-encoding of everything but the unreserved characters."""
    return quote(s, safe="-_.~")


def _canonical_query(pairs: list[tuple[str, str]], drop: str) -> str:
    encoded = sorted((_encode(k), _encode(v)) for k, v in pairs if k != drop)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _canonical_headers(signed: list[str], url_host: str, headers: Mapping[str, str]) -> str | None:
    """Header lines of the signed headers, or None if the request lacks one of them."""
    have = {k.lower(): v for k, v in headers.items()}
    have.setdefault("host", url_host)
    lines = []
    for name in signed:
        if name not in have:
            return None
        lines.append(f"{name}:{' '.join(have[name].split())}\n")
    return "".join(lines)


# -------------------------------------------------------------------------------- AWS SigV4


def check_sigv4_url(
    url: str,
    *,
    method: str,
    access_key: str,
    secret_key: str,
    region: str,
    now: dt.datetime,
    headers: Mapping[str, str] | None = None,
) -> str:
    """What S3 would say about a presigned request: "ok" or why it refuses it.

    Query-string SigV4: canonical request, string to sign, HMAC chain keyed by the secret.
    ``region`` is the bucket's region: a URL signed for another region fails there.
    """
    parts = urlsplit(url)
    pairs = _query_pairs(parts.query)
    q = dict(pairs)
    try:
        signature = q["X-Amz-Signature"]
        key_id, date, scope_region, service, terminal = q["X-Amz-Credential"].split("/")
        stamp, expires = q["X-Amz-Date"], int(q["X-Amz-Expires"])
        signed_headers = q["X-Amz-SignedHeaders"].split(";")
        signed_at = _utc(stamp)
    except (KeyError, ValueError):
        return "malformed"
    if q.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" or terminal != "aws4_request":
        return "malformed"
    if service != "s3" or date != stamp[:8] or not 1 <= expires <= MAX_EXPIRES:
        return "malformed"
    if key_id != access_key:
        return "unknown key"
    if scope_region != region:
        return "wrong region"
    if now > signed_at + dt.timedelta(seconds=expires):
        return "expired"

    canonical_headers = _canonical_headers(signed_headers, parts.netloc, headers or {})
    if canonical_headers is None:
        return "bad signature"
    canonical_request = "\n".join(
        [
            method,
            quote(unquote(parts.path) or "/", safe="/-_.~"),
            _canonical_query(pairs, drop="X-Amz-Signature"),
            canonical_headers,
            ";".join(signed_headers),
            "UNSIGNED-PAYLOAD",
        ]
    )
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            f"{date}/{scope_region}/{service}/aws4_request",
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret_key}".encode()
    for part in (date, scope_region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    return "ok" if hmac.compare_digest(expected, signature) else "bad signature"


def test_sigv4_checker_reproduces_aws_published_example() -> None:
    """AWS's published example (GET examplebucket/test.txt) validates the checker itself."""
    url = (
        "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )
    verdict = check_sigv4_url(
        url,
        method="GET",
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # AWS's documented example
        region="us-east-1",
        now=_utc("20130524T120000Z"),
    )
    assert verdict == "ok"


FROZEN = dt.datetime(2026, 1, 2, 3, 4, 5)  # botocore's clock is naive UTC


def _s3_client(region: str = "eu-west-2", secret: str = S3_SECRET_KEY) -> Any:
    store = S3Store(
        server=mock.Mock(), started=mock.Mock(), endpoint=ENDPOINT,
        access_key=S3_ACCESS_KEY, secret_key=secret, region=region,
    )  # fmt: skip
    return store.client()


def _presign(
    op: str, params: dict[str, Any], *, region: str = "eu-west-2", expires: int = 900
) -> str:
    """A presigned URL made at FROZEN, exactly as the placement service will make it."""
    with mock.patch("botocore.auth.get_current_datetime", return_value=FROZEN):
        url: str = _s3_client(region).generate_presigned_url(op, Params=params, ExpiresIn=expires)
    return url


def _check_s3(url: str, method: str, **overrides: Any) -> str:
    kw: dict[str, Any] = {
        "method": method,
        "access_key": S3_ACCESS_KEY,
        "secret_key": S3_SECRET_KEY,
        "region": "eu-west-2",
        "now": FROZEN.replace(tzinfo=dt.UTC) + dt.timedelta(minutes=1),
    }
    return check_sigv4_url(url, **(kw | overrides))


PUT_KEY = {"Bucket": "o41-art-eu", "Key": "runs/7/ckpt 1+ü.bin"}
PART = {"Bucket": "o41-art-eu", "Key": "big.bin", "UploadId": "u-123", "PartNumber": 2}


@pytest.mark.parametrize(
    ("op", "params", "method"),
    [
        ("put_object", PUT_KEY, "PUT"),
        ("get_object", PUT_KEY, "GET"),
        ("upload_part", PART, "PUT"),
    ],
)
def test_boto3_presigned_urls_verify(op: str, params: dict[str, Any], method: str) -> None:
    url = _presign(op, params)
    assert "X-Amz-Date=20260102T030405Z" in url
    assert "%2Feu-west-2%2Fs3%2Faws4_request" in url  # signed for the bucket's region
    assert _check_s3(url, method) == "ok"


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    return lambda url: re.sub(pattern, repl, url, count=1)


S3_TAMPERINGS: dict[str, Callable[[str], str]] = {
    "other key": _sub(r"/ckpt%201", "/ckpt%202"),
    "other bucket": _sub(r"/o41-art-eu/", "/o41-art-us/"),
    "other host": _sub(r"127\.0\.0\.1:9/", "127.0.0.1:10/"),
    "longer expiry": _sub(r"X-Amz-Expires=900", "X-Amz-Expires=3600"),
    "earlier date": _sub(r"X-Amz-Date=20260102T030405Z", "X-Amz-Date=20260102T030404Z"),
    "flipped signature": lambda url: url[:-1] + ("0" if url[-1] != "0" else "1"),
    "extra parameter": lambda url: url + "&x-id=DeleteObject",
}


@pytest.mark.parametrize("tamper", S3_TAMPERINGS.values(), ids=S3_TAMPERINGS.keys())
def test_tampered_presigned_url_fails(tamper: Callable[[str], str]) -> None:
    url = _presign("put_object", PUT_KEY)
    tampered = tamper(url)
    assert tampered != url
    assert _check_s3(tampered, "PUT") == "bad signature"


def test_presigned_part_url_is_bound_to_its_part_and_upload() -> None:
    url = _presign("upload_part", PART)
    assert _check_s3(url.replace("partNumber=2", "partNumber=3"), "PUT") == "bad signature"
    assert _check_s3(url.replace("uploadId=u-123", "uploadId=u-124"), "PUT") == "bad signature"


def test_presigned_put_is_not_a_get() -> None:
    assert _check_s3(_presign("put_object", PUT_KEY), "GET") == "bad signature"


def test_wrong_secret_fails() -> None:
    url = _presign("put_object", PUT_KEY)
    assert _check_s3(url, "PUT", secret_key=S3_SECRET_KEY + "x") == "bad signature"
    assert _check_s3(url, "PUT", access_key="SOMEONEELSE") == "unknown key"


def test_url_signed_for_another_region_fails() -> None:
    url = _presign("put_object", PUT_KEY, region="us-east-1")
    assert _check_s3(url, "PUT") == "wrong region"


def test_presigned_url_expires() -> None:
    url = _presign("get_object", PUT_KEY, expires=900)
    at = FROZEN.replace(tzinfo=dt.UTC)
    assert _check_s3(url, "GET", now=at + dt.timedelta(seconds=900)) == "ok"
    assert _check_s3(url, "GET", now=at + dt.timedelta(seconds=901)) == "expired"


# --------------------------------------------------------------------------------- GCS V4


def check_gcs_v4_url(
    url: str,
    *,
    method: str,
    public_key: rsa.RSAPublicKey,
    signer_email: str,
    now: dt.datetime,
    headers: Mapping[str, str] | None = None,
) -> str:
    """What GCS would say about a V4-signed request: "ok" or why it refuses it.

    GOOG4-RSA-SHA256: canonical request, string to sign, RSA-SHA256 (PKCS#1 v1.5) by the
    service account's key, verified here with its public key.
    """
    parts = urlsplit(url)
    pairs = _query_pairs(parts.query)
    q = dict(pairs)
    try:
        signature = bytes.fromhex(q["X-Goog-Signature"])
        email, date, location, service, terminal = q["X-Goog-Credential"].split("/")
        stamp, expires = q["X-Goog-Date"], int(q["X-Goog-Expires"])
        signed_headers = q["X-Goog-SignedHeaders"].split(";")
        signed_at = _utc(stamp)
    except (KeyError, ValueError):
        return "malformed"
    if q.get("X-Goog-Algorithm") != "GOOG4-RSA-SHA256" or terminal != "goog4_request":
        return "malformed"
    if service != "storage" or date != stamp[:8] or not 1 <= expires <= MAX_EXPIRES:
        return "malformed"
    if email != signer_email:
        return "wrong signer"
    if now > signed_at + dt.timedelta(seconds=expires):
        return "expired"

    request_headers = {k.lower(): v for k, v in (headers or {}).items()}
    canonical_headers = _canonical_headers(signed_headers, parts.netloc, request_headers)
    if canonical_headers is None:
        return "bad signature"
    canonical_request = "\n".join(
        [
            method,
            quote(unquote(parts.path), safe="/-_.~"),
            _canonical_query(pairs, drop="X-Goog-Signature"),
            canonical_headers,
            ";".join(signed_headers),
            request_headers.get("x-goog-content-sha256", "UNSIGNED-PAYLOAD"),
        ]
    )
    string_to_sign = "\n".join(
        [
            "GOOG4-RSA-SHA256",
            stamp,
            f"{date}/{location}/{service}/goog4_request",
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    try:
        public_key.verify(signature, string_to_sign.encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return "bad signature"
    return "ok"


@pytest.fixture(scope="module")
def signer() -> GcsStore:
    """A GcsStore that only signs: a throwaway RSA key and no server behind the endpoint."""
    info = throwaway_service_account("o41-test", token_uri=f"{ENDPOINT}/token")
    return GcsStore(
        server=mock.Mock(), started=mock.Mock(), endpoint=ENDPOINT,
        project="o41-test", location="US-CENTRAL1", service_account_info=info,
    )  # fmt: skip


def _public_key(store: GcsStore) -> rsa.RSAPublicKey:
    key = serialization.load_pem_private_key(
        store.service_account_info["private_key"].encode(), password=None
    )
    assert isinstance(key, rsa.RSAPrivateKey)
    return key.public_key()


OBJECT = "runs/7/ckpt 1+ü.bin"
CT = {"Content-Type": "application/octet-stream"}


def _gcs_sign(store: GcsStore, method: str, **kw: Any) -> tuple[str, dt.datetime]:
    blob = store.client().bucket("o41-art-eu").blob(OBJECT)
    url: str = blob.generate_signed_url(
        version="v4",
        method=method,
        expiration=dt.timedelta(minutes=15),
        credentials=store.signing_credentials(),
        **kw,
    )
    stamp = re.search(r"X-Goog-Date=(\d{8}T\d{6}Z)", url)
    assert stamp is not None
    return url, _utc(stamp.group(1))


def _check_gcs(store: GcsStore, url: str, method: str, at: dt.datetime, **overrides: Any) -> str:
    kw: dict[str, Any] = {
        "method": method,
        "public_key": _public_key(store),
        "signer_email": store.service_account_info["client_email"],
        "now": at + dt.timedelta(minutes=1),
    }
    return check_gcs_v4_url(url, **(kw | overrides))


def test_v4_signed_get_verifies(signer: GcsStore) -> None:
    url, at = _gcs_sign(signer, "GET", response_disposition='attachment; filename="c.bin"')
    assert url.startswith(f"{ENDPOINT}/o41-art-eu/runs/7/ckpt%201%2B%C3%BC.bin?")
    assert _check_gcs(signer, url, "GET", at) == "ok"


def test_v4_signed_put_verifies_only_with_its_content_type(signer: GcsStore) -> None:
    """Content-Type is signed. The uploader must send exactly the type the URL was signed for."""
    url, at = _gcs_sign(signer, "PUT", content_type=CT["Content-Type"])
    assert _check_gcs(signer, url, "PUT", at, headers=CT) == "ok"
    other = {"Content-Type": "application/x-www-form-urlencoded"}  # urllib's default
    assert _check_gcs(signer, url, "PUT", at, headers=other) == "bad signature"
    assert _check_gcs(signer, url, "PUT", at, headers={}) == "bad signature"


GCS_TAMPERINGS: dict[str, Callable[[str], str]] = {
    "other object": _sub(r"/ckpt%201", "/ckpt%202"),
    "other bucket": _sub(r"/o41-art-eu/", "/o41-art-us/"),
    "other host": _sub(r"127\.0\.0\.1:9/", "127.0.0.1:10/"),
    "longer expiry": _sub(r"X-Goog-Expires=900", "X-Goog-Expires=3600"),
    "flipped signature": lambda url: url[:-1] + ("0" if url[-1] != "0" else "1"),
    "extra parameter": lambda url: url + "&generation=1",
}


@pytest.mark.parametrize("tamper", GCS_TAMPERINGS.values(), ids=GCS_TAMPERINGS.keys())
def test_tampered_v4_url_fails(signer: GcsStore, tamper: Callable[[str], str]) -> None:
    url, at = _gcs_sign(signer, "GET")
    tampered = tamper(url)
    assert tampered != url
    assert _check_gcs(signer, tampered, "GET", at) == "bad signature"


def test_v4_signed_get_is_not_a_put(signer: GcsStore) -> None:
    url, at = _gcs_sign(signer, "GET")
    assert _check_gcs(signer, url, "PUT", at) == "bad signature"


def test_v4_url_fails_under_another_key(signer: GcsStore) -> None:
    url, at = _gcs_sign(signer, "GET")
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    assert _check_gcs(signer, url, "GET", at, public_key=stranger) == "bad signature"
    assert _check_gcs(signer, url, "GET", at, signer_email="x@y.iam.gserviceaccount.com") == (
        "wrong signer"
    )


def test_v4_url_expires(signer: GcsStore) -> None:
    url, at = _gcs_sign(signer, "GET")
    assert _check_gcs(signer, url, "GET", at, now=at + dt.timedelta(minutes=15)) == "ok"
    late = at + dt.timedelta(minutes=15, seconds=1)
    assert _check_gcs(signer, url, "GET", at, now=late) == "expired"


# ------------------------------------------------------- S3: refused by the store itself

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _send(
    method: str, url: str, headers: Mapping[str, str], body: bytes | None = None
) -> tuple[int, str]:
    """A pod's plain request (no SDK, no proxy, loopback only): (status, S3 error code)."""
    assert urlsplit(url).hostname == "127.0.0.1", url
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with _DIRECT.open(request, timeout=30) as r:
            r.read()
            return r.status, ""
    except urllib.error.HTTPError as e:
        found = re.search(rb"<Code>([^<]+)</Code>", e.read())
        return e.code, found.group(1).decode() if found else ""


@pytest.fixture(scope="module")
def bucket(s3: VersityStore) -> S3Bucket:
    """A bucket set up by o41.storage on the stand-in, as the operator sets one up."""
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    name = bucket_name("s3", "signatures", str(uuid.uuid4()))
    ref = BucketRef("s3", name, "eu-west-2", endpoint=s3.endpoint, credentials=creds)
    opened = open_bucket(ref)
    assert isinstance(opened, S3Bucket)
    opened.ensure("loc-signatures")
    return opened


def _put(req: SignedRequest, body: bytes, **headers: str) -> tuple[int, str]:
    return _send(req.method, req.url, {**req.headers, **headers}, body)


def _stored(bucket: S3Bucket, key: str) -> bytes | None:
    """What the bucket holds under ``key`` (None: nothing), read with a fresh signed GET."""
    request = urllib.request.Request(bucket.presign_get(key, expires=60).url)
    try:
        with _DIRECT.open(request, timeout=30) as r:
            body: bytes = r.read()
            return body
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        return None


PAYLOAD = b"the bytes the service signed for"


def _signed_put(bucket: S3Bucket, key: str) -> SignedRequest:
    return bucket.presign_put(key, expires=300, size=len(PAYLOAD))


def _query_sub(url: str, name: str, value: str) -> str:
    return re.sub(rf"([?&]{name}=)[^&]*", lambda m: m.group(1) + value, url, count=1)


def _a_second_before(url: str) -> str:
    """The URL's X-Amz-Date less one second: always another date, whatever second it was signed."""
    signed = dict(parse_qsl(urlsplit(url).query))["X-Amz-Date"]
    at = dt.datetime.strptime(signed, "%Y%m%dT%H%M%SZ") - dt.timedelta(seconds=1)
    return at.strftime("%Y%m%dT%H%M%SZ")


@pytest.mark.stores
def test_the_services_urls_are_taken_by_the_stand_in(bucket: S3Bucket) -> None:
    key = "signed/ok ü+.bin"
    assert _put(_signed_put(bucket, key), PAYLOAD) == (200, "")
    assert _stored(bucket, key) == PAYLOAD


WIDENED_PUTS: dict[str, Callable[[SignedRequest, S3Bucket], tuple[str, dict[str, str]]]] = {
    "flipped signature": lambda r, b: (r.url[:-1] + ("0" if r.url[-1] != "0" else "1"), {}),
    "longer expiry": lambda r, b: (_query_sub(r.url, "X-Amz-Expires", "604800"), {}),
    "earlier date": lambda r, b: (_query_sub(r.url, "X-Amz-Date", _a_second_before(r.url)), {}),
    "extra parameter": lambda r, b: (r.url + "&versionId=1", {}),
    "added signed header": lambda r, b: (
        _query_sub(
            r.url, "X-Amz-SignedHeaders", "content-length%3Bcontent-type%3Bhost%3Bx-amz-acl"
        ),
        {"x-amz-acl": "public-read"},
    ),
    "removed signed header": lambda r, b: (
        _query_sub(r.url, "X-Amz-SignedHeaders", "content-length%3Bhost"),
        {"Content-Type": "text/html"},
    ),
    "other content type": lambda r, b: (r.url, {"Content-Type": "text/html"}),
}


@pytest.mark.stores
@pytest.mark.parametrize("widen", WIDENED_PUTS.values(), ids=WIDENED_PUTS.keys())
def test_a_tampered_or_widened_put_is_refused(
    bucket: S3Bucket, widen: Callable[[SignedRequest, S3Bucket], tuple[str, dict[str, str]]]
) -> None:
    key = f"signed/{uuid.uuid4().hex}"
    req = _signed_put(bucket, key)
    url, headers = widen(req, bucket)
    assert url != req.url or headers
    assert _send("PUT", url, {**req.headers, **headers}, PAYLOAD) == (403, "SignatureDoesNotMatch")
    assert _stored(bucket, key) is None


@pytest.mark.stores
def test_a_put_of_another_size_is_refused(bucket: S3Bucket) -> None:
    """Content-Length is signed: a pod cannot store more (or fewer) bytes than declared."""
    key = f"signed/{uuid.uuid4().hex}"
    req = _signed_put(bucket, key)
    assert _put(req, PAYLOAD + b"!", **{"Content-Length": str(len(PAYLOAD) + 1)}) == (
        403,
        "SignatureDoesNotMatch",
    )
    assert _put(req, PAYLOAD[:-1], **{"Content-Length": str(len(PAYLOAD) - 1)}) == (
        403,
        "SignatureDoesNotMatch",
    )
    assert _stored(bucket, key) is None


@pytest.mark.stores
def test_a_put_to_another_key_or_bucket_is_refused(s3: VersityStore, bucket: S3Bucket) -> None:
    key, other = f"signed/{uuid.uuid4().hex}", f"signed/{uuid.uuid4().hex}"
    neighbour = open_bucket(
        BucketRef(
            "s3", bucket_name("s3", "neighbour", str(uuid.uuid4())), "eu-west-2",
            endpoint=s3.endpoint, credentials=bucket.ref.credentials,
        )
    )  # fmt: skip
    neighbour.ensure("loc-neighbour")
    req = _signed_put(bucket, key)
    base = bucket._object_base
    assert req.url.startswith(base + key)
    to_other_key = req.url.replace(base + key, base + other, 1)
    to_other_bucket = req.url.replace(f"/{bucket.ref.bucket}/", f"/{neighbour.ref.bucket}/", 1)
    for url in (to_other_key, to_other_bucket):
        assert _send("PUT", url, req.headers, PAYLOAD) == (403, "SignatureDoesNotMatch")
    assert _stored(bucket, other) is None
    assert isinstance(neighbour, S3Bucket)
    assert _stored(neighbour, key) is None


@pytest.mark.stores
def test_a_signed_get_does_nothing_else(bucket: S3Bucket) -> None:
    """A GET URL is not a PUT, a DELETE or a HEAD; a PUT URL is not a GET."""
    key = f"signed/{uuid.uuid4().hex}"
    assert _put(_signed_put(bucket, key), PAYLOAD) == (200, "")
    get = bucket.presign_get(key, expires=300)
    octets = {"Content-Type": "application/octet-stream"}
    assert _send("PUT", get.url, octets, b"overwritten") == (403, "SignatureDoesNotMatch")
    assert _send("DELETE", get.url, {}) == (403, "SignatureDoesNotMatch")
    assert _send("GET", _signed_put(bucket, key).url, {}) == (403, "SignatureDoesNotMatch")
    assert _stored(bucket, key) == PAYLOAD


def _resign(bucket: S3Bucket, key: str, **over: Any) -> str:
    """A PUT URL for ``key`` signed like the service's, with ``over`` changed."""
    creds = bucket.ref.credentials
    assert creds is not None
    kw: dict[str, Any] = {
        "access_key": creds["accessKeyId"],
        "secret_key": creds["secretAccessKey"],
        "token": None,
        "region": "eu-west-2",
        "expires": 300,
    }
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(PAYLOAD))}
    return sigv4.presign("PUT", bucket._object_base + quote(key), headers, **(kw | over))


@pytest.mark.stores
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong secret", (403, "SignatureDoesNotMatch")),
        ("unknown key", (403, "InvalidAccessKeyId")),
        ("expired", (403, "AccessDenied")),
    ],
)
def test_a_url_signed_with_wrong_keys_or_expired_is_refused(
    bucket: S3Bucket, case: str, expected: tuple[int, str]
) -> None:
    key = f"signed/{uuid.uuid4().hex}"
    assert bucket.ref.credentials is not None
    secret = bucket.ref.credentials["secretAccessKey"]
    cases: dict[str, dict[str, Any]] = {
        "wrong secret": {"secret_key": secret + "x"},
        "unknown key": {"access_key": "AKIAO41NOSUCHKEY000"},
        "expired": {"now": dt.datetime.now(dt.UTC) - dt.timedelta(seconds=301), "expires": 300},
    }
    url = _resign(bucket, key, **cases[case])
    headers = {"Content-Type": "application/octet-stream"}
    assert _send("PUT", url, headers, PAYLOAD) == expected
    assert _stored(bucket, key) is None
    # the same URL, unexpired and with the right keys, is taken: the case alone was refused
    assert _send("PUT", _resign(bucket, key), headers, PAYLOAD) == (200, "")


@pytest.mark.stores
def test_a_url_signed_for_another_region_is_refused(s3: VersityStore, bucket: S3Bucket) -> None:
    """Sent to a gateway of one region (as AWS's regional endpoints are), a URL signed for
    another region is refused."""
    key = f"signed/{uuid.uuid4().hex}"
    url = _resign(bucket, key).replace(s3.endpoint, s3.gateway("us-east-1"), 1)
    status, code = _send("PUT", url, {"Content-Type": "application/octet-stream"}, PAYLOAD)
    assert (status, code) == (400, "AuthorizationQueryParametersError")
    assert _stored(bucket, key) is None


@pytest.mark.stores
def test_a_part_url_is_bound_to_its_part_and_upload(bucket: S3Bucket) -> None:
    key = f"signed/{uuid.uuid4().hex}"
    chunk = os.urandom(5 * 2**20)
    upload = bucket.start_multipart(key, parts=2, expires=300)
    other = bucket.start_multipart(key, parts=1, expires=300)
    part = upload.parts[0]
    moved = {
        "other part": part.url.replace("partNumber=1", "partNumber=2"),
        "other upload": part.url.replace(
            f"uploadId={quote(upload.upload_id, safe='')}",
            f"uploadId={quote(other.upload_id, safe='')}",
        ),
    }
    for url in moved.values():
        assert url != part.url
        assert _send("PUT", url, part.headers, chunk) == (403, "SignatureDoesNotMatch")
    assert _send("PUT", part.url, part.headers, chunk) == (200, "")
    bucket.abort_multipart(key, upload)
    bucket.abort_multipart(key, other)
