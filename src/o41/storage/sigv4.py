"""SigV4 query-string presigning of one S3 object URL: the begin path's hot spot.

botocore's signer (S3SigV4QueryAuth) costs about 1 ms of CPU per URL, most of it in
generic request handling; the algorithm itself is a few HMACs. This module computes the
same URL (byte for byte: tests/storage/test_storage_presign.py compares it with botocore's under
a frozen clock) and caches the day's signing key. Everything else goes through botocore.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import time
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _now() -> str:
    """The request time as SigV4 writes it (``20261129T120000Z``)."""
    return _stamp(int(time.time()))


@functools.lru_cache(maxsize=4)
def _stamp(second: int) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))


@functools.lru_cache(maxsize=64)
def _signing_key(secret: str, date: str, region: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


@functools.lru_cache(maxsize=1024)
def _encode(value: str) -> str:
    """Most values repeat from URL to URL (credential scope, expiry, signed headers)."""
    return quote(value, safe="-_.~")


@functools.lru_cache(maxsize=256)
def _host(scheme: str, netloc: str) -> str:
    """The Host header S3 sees: the port only when it is not the scheme's default."""
    parts = urlsplit(f"{scheme}://{netloc}")
    host = parts.hostname or ""
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


@functools.lru_cache(maxsize=256)
def _headers(host: str, headers: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """(canonical header block, signed header names) of one set of headers."""
    signed = {"host": host, **{k.lower(): " ".join(v.split()) for k, v in headers}}
    names = sorted(signed)
    return "".join(f"{n}:{signed[n]}\n" for n in names), ";".join(names)


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
    ``params`` are the operation's own query parameters (``uploadId``, ``partNumber``).
    Everything that repeats from URL to URL (encodings, header blocks, the day's key)
    is cached: a begin signs one URL per request."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ") if now else _now()
    date = amz_date[:8]
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    path = slash + path
    header_block, names = _headers(_host(scheme, netloc), tuple(headers.items()))
    scope = f"{date}/{region}/s3/aws4_request"
    # the X-Amz-* names sort in this order, and before any lower-case parameter name
    amz = [
        f"X-Amz-Algorithm={ALGORITHM}",
        f"X-Amz-Credential={_encode(f'{access_key}/{scope}')}",
        f"X-Amz-Date={amz_date}",
        f"X-Amz-Expires={expires}",
        *([f"X-Amz-Security-Token={_encode(token)}"] if token else []),
        f"X-Amz-SignedHeaders={_encode(names)}",
    ]
    own = [f"{_encode(k)}={_encode(v)}" for k, v in (params or {}).items()]
    canonical = "\n".join(
        [
            method,
            path or "/",
            "&".join([*amz, *sorted(own)]),
            header_block,
            names,
            "UNSIGNED-PAYLOAD",
        ]
    )
    to_sign = "\n".join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signature = hmac.new(
        _signing_key(secret_key, date, region), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    plain = "&".join([*own, *amz[:4], *amz[5:], *amz[4:5]] if token else [*own, *amz])
    return f"{scheme}://{netloc}{path}?{plain}&X-Amz-Signature={signature}"
