"""Which entries of a JWKS (RFC 7517) can verify a workload token, judged by their members
alone: plain functions of data, shared by admission (an inline JWKS) and the key fetch
(``o41.kube.trust_keys``, which also has each key parsed by joserfc).

A usable key is public, for signatures, and fits RS256 (kty RSA) or ES256 (kty EC, curve
P-256), the only algorithms tokens are accepted with (``o41.core.trust.ALGORITHMS``); it
has a kid, since a token names its key by kid and no key is ever guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# The members that make a JWK private (RFC 7518 6.2.2, 6.3.2, 6.4): a JWKS that holds one
# leaks a signing key, so it is refused, never trimmed.
PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
FITS = {"RSA": ("RS256", ("n", "e")), "EC": ("ES256", ("x", "y"))}
_B64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


class NotAJwks(ValueError):
    """The text is not a JWKS: the message says what it is instead."""


def parse_jwks(text: str) -> dict[str, Any]:
    """The JWKS a text holds: a JSON object with a ``keys`` list."""
    try:
        found = json.loads(text)
    except json.JSONDecodeError as e:
        raise NotAJwks(f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise NotAJwks("is not a JWKS (JSON nested too deeply)") from None
    return as_jwks(found)


def as_jwks(found: object) -> dict[str, Any]:
    if not isinstance(found, dict) or not isinstance(found.get("keys"), list):
        raise NotAJwks('is not a JWKS: a JSON object with a "keys" list is expected')
    return found


def is_private(entry: object) -> bool:
    return isinstance(entry, Mapping) and bool(PRIVATE_MEMBERS & entry.keys())


def private_key_ids(jwks: Mapping[str, Any]) -> list[str]:
    """The kids (or positions, for keys without one) of the entries with private members."""
    return [
        str(entry.get("kid") or f"#{i}")
        for i, entry in enumerate(jwks.get("keys") or [])
        if is_private(entry)
    ]


def usable(entry: object) -> bool:
    """A public RS256 or ES256 signature key with a kid, by its members."""
    if not isinstance(entry, Mapping) or is_private(entry):
        return False
    kid, kty = entry.get("kid"), entry.get("kty")
    if not isinstance(kid, str) or not kid or kty not in FITS:
        return False
    alg, members = FITS[kty]
    if entry.get("alg", alg) != alg or entry.get("use", "sig") != "sig":
        return False
    ops = entry.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        return False
    if kty == "EC" and entry.get("crv") != "P-256":
        return False
    return all(_base64url(entry.get(m)) for m in members)


def _base64url(value: object) -> bool:
    """A key member as JWK writes it (base64url, unpadded): anything else is no key."""
    return isinstance(value, str) and _B64URL.fullmatch(value) is not None


def signing_keys(jwks: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The usable entries of a JWKS, in order; the others are dropped."""
    return [dict(entry) for entry in jwks.get("keys") or [] if usable(entry)]
