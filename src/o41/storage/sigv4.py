"""SigV4 query-string presigning of one S3 object URL: the begin path's hot spot.

botocore's signer (S3SigV4QueryAuth) costs about 1 ms of CPU per URL, most of it in
generic request handling; the algorithm itself is a few HMACs. This module computes the
same URL (byte for byte: tests/test_storage_presign.py compares it with botocore's under
a frozen clock) and caches the day's signing key. Everything else goes through botocore.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@functools.lru_cache(maxsize=64)
def _signing_key(secret: str, date: str, region: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _encode(value: str) -> str:
    return quote(value, safe="-_.~")


def presign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    access_key: str,
    secret_key: str,
    token: str | None,
    region: str,
    expires: int,
    params: Mapping[str, str] | None = None,
    now: dt.datetime | None = None,
) -> str:
    """``url`` (path already percent-encoded) signed for ``method`` with ``headers``;
    ``params`` are the operation's own query parameters (``uploadId``, ``partNumber``)."""
    when = now or _now()
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    signed = {"host": host, **{k.lower(): " ".join(v.split()) for k, v in headers.items()}}
    names = sorted(signed)
    scope = f"{date}/{region}/s3/aws4_request"
    query = {
        "X-Amz-Algorithm": ALGORITHM,
        "X-Amz-Credential": f"{access_key}/{scope}",
        "X-Amz-Date": amz_date,
        "X-Amz-Expires": str(expires),
        "X-Amz-SignedHeaders": ";".join(names),
    }
    if token:
        query["X-Amz-Security-Token"] = token
    pairs = [f"{_encode(k)}={_encode(v)}" for k, v in (params or {}).items()]
    pairs += [f"{k}={_encode(v)}" for k, v in query.items()]  # these names need no encoding
    canonical_query = "&".join(sorted(pairs))
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            canonical_query,
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            "UNSIGNED-PAYLOAD",
        ]
    )
    to_sign = "\n".join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signature = hmac.new(
        _signing_key(secret_key, date, region), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    plain = "&".join(pairs)
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{plain}&X-Amz-Signature={signature}"
