"""Tokens the service itself issues, for callers no cluster vouches for (SkyPilot VMs, a
laptop): the pure rules. A platform admin creates one for an organization and a subject
(``kubectl o41 token create``); it is signed with the service's own key, lasts at most
``MAX_TTL``, and is accepted only while its record exists (deleting the record revokes
it). The caller it names may use that one organization, as the tenant
``vm.o41.<organization>:<subject>`` (:func:`tenant_of`): a trust domain's name is a DNS
label, so no cluster's namespace can be that tenant, and the same subject in two
organizations is two tenants (issue 37: one tenant per subject let a token of one
organization read and commit another's state).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from o41.core.trust import (
    Expired,
    Malformed,
    MissingClaim,
    NotYetValid,
    TokenRefused,
    TrustPolicy,
    check_audience,
    check_header,
    check_times,
    shown,
)

DOMAIN = "vm.o41"  # the trust domain of service tokens: not a DNS label, so no TrustDomain's
AUDIENCE = "o41"
ALGORITHM = "ES256"
DEFAULT_TTL = 24 * 3600
MAX_TTL = 30 * 24 * 3600  # a month: a longer job gets a new token, the old one revoked
SUBJECT = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
CLAIM = "o41"  # {"organization": ...}
_TTL = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FIX = "ask a platform admin for a new one (kubectl o41 token create)"


class Revoked(TokenRefused):
    reason = "Revoked"


class TooLong(TokenRefused):
    """A token that lasts longer than :data:`MAX_TTL`: the CLI never makes one, so it was
    minted some other way with the service's key; the cap holds where tokens are taken."""

    reason = "LifetimeTooLong"


def tenant_of(organization: str, subject: str) -> str:
    """The tenant a service token acts as: one per organization and subject. The subject
    is a DNS label (no ':' nor '.'), so the text maps back to one (organization, subject)."""
    return f"{DOMAIN}.{organization}:{subject}"


def issuer_for(namespace: str) -> str:
    """The issuer of the service installed in ``namespace`` (not a URL: nobody fetches
    its keys; only that service verifies them)."""
    return f"urn:o41:service-tokens:{namespace}"


def parse_ttl(text: str) -> int:
    """``90m``, ``24h``, ``7d``: seconds, from 1 minute to ``MAX_TTL``."""
    m = _TTL.fullmatch(text.strip())
    seconds = int(m.group(1)) * _UNIT[m.group(2)] if m else 0
    if not 60 <= seconds <= MAX_TTL:
        raise ValueError(
            f"ttl {text!r}: give a number and a unit (s, m, h, d) from 1m to "
            f"{MAX_TTL // 86400}d, e.g. 24h"
        )
    return seconds


def check_subject(subject: str) -> str:
    if not SUBJECT.fullmatch(subject):
        raise ValueError(
            f"subject {subject!r}: use lower-case letters, digits and '-' (a DNS label, "
            "at most 63 characters), e.g. the SkyPilot cluster's name"
        )
    return subject


@dataclass(frozen=True, slots=True)
class Issued:
    """One service token, as its record keeps it (never the token itself)."""

    id: str
    organization: str
    subject: str
    expires: int  # seconds since the epoch
    created: int


def claims_for(issuer: str, issued: Issued) -> dict[str, Any]:
    return {
        "iss": issuer,
        "aud": [AUDIENCE],
        "sub": issued.subject,
        "jti": issued.id,
        "iat": issued.created,
        "nbf": issued.created,
        "exp": issued.expires,
        CLAIM: {"organization": issued.organization},
    }


def check_claims(
    issuer: str, header: Mapping[str, Any], claims: Mapping[str, Any], now: int
) -> Issued:
    """What a service token says, once its header and claims pass the rules at ``now``
    (the signature and the record are the caller's job); else a TokenRefused."""
    policy = TrustPolicy(DOMAIN, issuer, frozenset({AUDIENCE}))
    check_header(policy, header)
    if header.get("alg") != ALGORITHM or claims.get("iss") != issuer:
        raise Malformed(f"service token is not one this service issued: {FIX}", DOMAIN, "iss")
    check_audience(policy, claims)
    try:
        exp = check_times(policy, claims, now)
    except Expired:
        raise Expired(
            f"service token {shown(claims.get('jti'))} expired ('exp' claim): {FIX}",
            DOMAIN,
            "exp",
        ) from None
    except NotYetValid as e:
        raise NotYetValid(f"service token is not valid yet: {e}", DOMAIN, e.claim) from None
    check_lifetime(claims.get("jti"), int(claims["iat"]), exp, now)
    found = {name: claims.get(name) for name in ("jti", "sub")}
    extra = claims.get(CLAIM)
    organization = extra.get("organization") if isinstance(extra, Mapping) else None
    for name, value in (*found.items(), ("o41.organization", organization)):
        if not isinstance(value, str) or not value:
            raise MissingClaim(f"service token has no {name!r} claim: {FIX}", DOMAIN, name)
    if not SUBJECT.fullmatch(str(found["sub"])):  # its tenant's text must map back to it
        raise Malformed(f"service token's 'sub' is not a DNS label: {FIX}", DOMAIN, "sub")
    return Issued(
        str(found["jti"]),
        str(organization),
        str(found["sub"]),
        exp,
        int(claims["iat"]),
    )


def check_lifetime(token_id: object, iat: int, exp: int, now: int) -> None:
    """At most :data:`MAX_TTL` from its issue (or from now, if that is earlier): a
    longer-lived token is refused whoever signed it."""
    lifetime = exp - min(iat, now)
    if lifetime > MAX_TTL:
        raise TooLong(
            f"service token {shown(token_id)} lasts {lifetime // 86400} days; at most "
            f"{MAX_TTL // 86400} are accepted: {FIX}",
            DOMAIN,
            "exp",
        )


def check_record(token: Issued, record: Issued | None) -> Issued:
    """The token is accepted only as recorded: a record deleted (revoked) or another
    token's refuses it."""
    if record is None or (record.organization, record.subject) != (
        token.organization,
        token.subject,
    ):
        raise Revoked(
            f"service token {shown(token.id)} of {shown(token.subject)} was revoked: {FIX}",
            DOMAIN,
            "jti",
        )
    return record
