"""The service tokens' pure rules (``o41.core.service_tokens``): lifetimes, subjects, and
what a token must say; examples and properties, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.service_tokens import (
    DOMAIN,
    MAX_TTL,
    Issued,
    Revoked,
    TooLong,
    check_claims,
    check_record,
    check_subject,
    claims_for,
    issuer_for,
    parse_ttl,
    tenant_of,
)
from o41.core.trust import AlgorithmNotAllowed, Expired, Malformed, MissingClaim

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
ISSUER = issuer_for("o41-system")
TOKEN = Issued("abc123", "ml", "sky-llama", expires=2_000_003_600, created=2_000_000_000)
HEADER = {"alg": "ES256", "kid": "k"}


@given(st.integers(0, 10**7), st.sampled_from(sorted(UNITS)))
def test_a_ttl_is_a_number_and_a_unit_from_a_minute_to_the_cap(n: int, unit: str) -> None:
    seconds = n * UNITS[unit]
    if 60 <= seconds <= MAX_TTL:
        assert parse_ttl(f"{n}{unit}") == seconds
    else:
        with pytest.raises(ValueError, match="from 1m to 30d"):
            parse_ttl(f"{n}{unit}")


@pytest.mark.parametrize("text", ["", "24", "1w", "-1h", "1.5h", "h", "24 h"])
def test_a_ttl_without_a_known_unit_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 24h"):
        parse_ttl(text)


@pytest.mark.parametrize("subject", ["Sky", "a_b", "-a", "a-", "x" * 64, "", "a.b"])
def test_a_subject_is_a_dns_label(subject: str) -> None:
    with pytest.raises(ValueError, match="DNS label"):
        check_subject(subject)


def test_the_claims_it_signs_are_the_claims_it_accepts() -> None:
    claims = claims_for(ISSUER, TOKEN)
    assert check_claims(ISSUER, HEADER, claims, TOKEN.created + 10) == TOKEN
    assert DOMAIN == "vm.o41" and "." in DOMAIN  # never a TrustDomain's name (a DNS label)


def test_what_a_service_token_must_say() -> None:
    claims = claims_for(ISSUER, TOKEN)
    now = TOKEN.created + 10
    with pytest.raises(Expired, match="kubectl o41 token create"):
        check_claims(ISSUER, HEADER, claims, TOKEN.expires + 120)
    with pytest.raises(AlgorithmNotAllowed):
        check_claims(ISSUER, {**HEADER, "alg": "HS256"}, claims, now)
    with pytest.raises(Malformed):  # RS256 is a cluster's alg, never this service's
        check_claims(ISSUER, {**HEADER, "alg": "RS256"}, claims, now)
    with pytest.raises(Malformed):  # another installation's tokens
        check_claims(issuer_for("other"), HEADER, claims, now)
    for name in ("jti", "sub", "o41"):
        with pytest.raises(MissingClaim):
            check_claims(ISSUER, HEADER, {**claims, name: None}, now)


def test_a_token_is_accepted_only_as_recorded() -> None:
    assert check_record(TOKEN, TOKEN) == TOKEN
    for record in (None, Issued(TOKEN.id, "other", TOKEN.subject, 1, 1)):
        with pytest.raises(Revoked, match="was revoked"):
            check_record(TOKEN, record)


@given(st.integers(1, 3 * MAX_TTL), st.integers(-MAX_TTL, 3600))
def test_a_token_lasting_past_the_cap_is_refused_whoever_signed_it(lifetime: int, age: int) -> None:
    """Issue 37, point 5: the 30-day cap holds where tokens are taken, not only in the
    CLI; ``age``: how long ago it was issued (negative: within the clock leeway ahead)."""
    now = 2_000_000_000
    iat = now - max(age, -30)
    claims = claims_for(ISSUER, Issued("t", "ml", "sky", expires=iat + lifetime, created=iat))
    if iat + lifetime <= now - 60:
        return  # expired: refused for that (test_what_a_service_token_must_say)
    if lifetime > MAX_TTL or iat + lifetime - now > MAX_TTL:
        with pytest.raises(TooLong, match="at most 30 are accepted") as refused:
            check_claims(ISSUER, HEADER, claims, now)
        assert (refused.value.reason, refused.value.claim) == ("LifetimeTooLong", "exp")
    else:
        assert check_claims(ISSUER, HEADER, claims, now).expires == iat + lifetime


@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
)
def test_a_service_tokens_tenant_is_one_per_organization_and_subject(
    org: str, subject: str, other_org: str, other_subject: str
) -> None:
    """Issue 37, point 1: one subject in two organizations is two tenants, and no tenant
    text of a service token is a namespace's or another cluster's (``<domain>:<ns>``)."""
    tenant = tenant_of(org, subject)
    assert (tenant == tenant_of(other_org, other_subject)) == (
        (org, subject) == (other_org, other_subject)
    )
    domain, _, _ = tenant.rpartition(":")
    assert domain.startswith(f"{DOMAIN}.") and "." in domain  # no DNS label: no TrustDomain's


def test_a_subject_that_is_no_dns_label_is_malformed() -> None:
    claims = claims_for(ISSUER, Issued("t", "ml", "sky:x", TOKEN.expires, TOKEN.created))
    with pytest.raises(Malformed, match="'sub' is not a DNS label"):
        check_claims(ISSUER, HEADER, claims, TOKEN.created)
