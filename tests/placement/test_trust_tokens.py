"""Tokens of other issuers (issue 31, point 6 at the library level): the pure rules of
``o41.core.trust`` and the offline verifier ``o41.webhook.identity.tokens``, with real RSA and
EC keys and real signatures. No cluster: the issuer is a JWKS in memory, time is injected."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

from o41.core.trust import (
    API_SERVER_AUDIENCES,
    REASONS,
    AlgorithmNotAllowed,
    ApiServerAudience,
    BadSignature,
    Expired,
    KeyRefetch,
    KeysUnavailable,
    Malformed,
    MissingClaim,
    NotYetValid,
    Subject,
    TokenRefused,
    TrustPolicy,
    UnknownIssuer,
    UnknownKey,
    WrongAudience,
    check_claims,
)
from o41.webhook.identity.tokens import TokenVerifier

NOW = 1_900_000_000
ISSUER = "https://oidc.cluster-b.example"
POLICY = TrustPolicy("cluster-b", ISSUER, frozenset({"o41"}))
POD_UID = "6f1c1f7e-0000-4000-8000-000000000001"


def rsa_key() -> RSAKey:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return RSAKey.import_key(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def ec_key() -> ECKey:
    private = ec.generate_private_key(ec.SECP256R1())
    return ECKey.import_key(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


RSA_OLD, RSA_NEW, EC_KEY, RSA_STRANGER = rsa_key(), rsa_key(), ec_key(), rsa_key()


def public(key: RSAKey | ECKey, kid: str) -> dict[str, Any]:
    return {**key.as_dict(private=False), "kid": kid, "use": "sig"}


def jwks(*pairs: tuple[RSAKey | ECKey, str]) -> dict[str, Any]:
    return {"keys": [public(k, kid) for k, kid in pairs]}


def claims(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": ["o41"],
        "sub": "system:serviceaccount:ml:trainer",
        "exp": NOW + 3600,
        "nbf": NOW - 10,
        "iat": NOW - 10,
        "kubernetes.io": {
            "namespace": "ml",
            "serviceaccount": {"name": "trainer", "uid": "sa-uid"},
            "pod": {"name": "trainer-0", "uid": POD_UID},
        },
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def signed(key: RSAKey | ECKey, kid: str, body: dict[str, Any], alg: str = "RS256") -> str:
    return jwt.encode({"alg": alg, "kid": kid}, body, key, algorithms=[alg])


def sign(key: RSAKey | ECKey, kid: str, alg: str = "RS256", **changes: Any) -> str:
    return signed(key, kid, claims(**changes), alg)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_built(header: dict[str, Any], body: dict[str, Any], signature: bytes = b"") -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}.{b64(signature)}"


@dataclass
class Clock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


@dataclass
class Published:
    """The issuer's JWKS endpoint: what it serves now, and how often it was asked."""

    jwks: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    fails: bool = False

    async def __call__(self, policy: TrustPolicy) -> Mapping[str, Any]:
        assert policy.issuer == ISSUER
        self.calls += 1
        if self.fails:
            raise ConnectionError("issuer unreachable")
        return self.jwks


def verifier(
    known: dict[str, Any] | None, published: Published, clock: Clock, **kw: Any
) -> TokenVerifier:
    v = TokenVerifier(published, clock=clock, **kw)
    v.trust(POLICY, known)
    return v


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def issuer() -> Published:
    return Published(jwks((RSA_OLD, "old"), (EC_KEY, "ec")))


@pytest.fixture
def tokens(issuer: Published, clock: Clock) -> TokenVerifier:
    return verifier(issuer.jwks, issuer, clock)


async def refused(v: TokenVerifier, token: str, kind: type[TokenRefused]) -> TokenRefused:
    with pytest.raises(kind) as caught:
        await v.verify(token)
    err = caught.value
    message = str(err)
    assert token not in message
    assert all(part not in message for part in token.split(".") if len(part) > 8)
    assert err.reason in REASONS
    return err


# --- accepted -------------------------------------------------------------------------------


async def test_a_good_rs256_token_names_its_pod(tokens: TokenVerifier, issuer: Published) -> None:
    subject = await tokens.verify(sign(RSA_OLD, "old"))
    assert subject == Subject(
        trust_domain="cluster-b",
        subject="system:serviceaccount:ml:trainer",
        expires=NOW + 3600,
        namespace="ml",
        service_account="trainer",
        pod_name="trainer-0",
        pod_uid=POD_UID,
    )
    assert issuer.calls == 0  # the keys it was given served


async def test_a_good_es256_token_without_kubernetes_claims_keeps_its_raw_sub(
    tokens: TokenVerifier,
) -> None:
    token = sign(EC_KEY, "ec", alg="ES256", **{"kubernetes.io": None, "sub": "vm:trainer-7"})
    subject = await tokens.verify(token)
    assert (subject.trust_domain, subject.subject, subject.namespace) == (
        "cluster-b",
        "vm:trainer-7",
        None,
    )


async def test_a_string_audience_is_accepted(tokens: TokenVerifier) -> None:
    assert (await tokens.verify(sign(RSA_OLD, "old", aud="o41"))).namespace == "ml"


async def test_keys_never_given_are_fetched_by_the_first_token(
    issuer: Published, clock: Clock
) -> None:
    v = verifier(None, issuer, clock)
    assert (await v.verify(sign(RSA_OLD, "old"))).pod_name == "trainer-0"
    assert issuer.calls == 1


# --- refused: point 6 of issue 31 ------------------------------------------------------------


async def test_the_wrong_audience_is_refused_naming_the_fix(tokens: TokenVerifier) -> None:
    err = await refused(tokens, sign(RSA_OLD, "old", aud=["vault"]), WrongAudience)
    assert (err.reason, err.trust_domain, err.claim) == ("WrongAudience", "cluster-b", "aud")
    assert "'cluster-b'" in str(err) and "['vault']" in str(err)
    assert "audience 'o41'" in str(err) and "serviceAccountToken" in str(err)


@pytest.mark.parametrize(
    "aud",
    [
        ["https://kubernetes.default.svc"],
        ["o41", "https://kubernetes.default.svc.cluster.local"],  # o41's own does not save it
        "kubernetes.default.svc",
        [ISSUER],  # the API server's default audience is its issuer
    ],
)
async def test_a_token_for_the_api_server_is_refused(tokens: TokenVerifier, aud: Any) -> None:
    err = await refused(tokens, sign(RSA_OLD, "old", aud=aud), ApiServerAudience)
    assert (err.trust_domain, err.claim) == ("cluster-b", "aud")
    assert "API server" in str(err) and "audience 'o41'" in str(err)


async def test_alg_none_is_refused_before_any_key(tokens: TokenVerifier, issuer: Published) -> None:
    token = hand_built({"alg": "none", "kid": "old"}, claims())
    err = await refused(tokens, token, AlgorithmNotAllowed)
    assert (err.trust_domain, err.claim) == ("cluster-b", "alg")
    assert "'none'" in str(err) and "ES256" in str(err) and "RS256" in str(err)
    assert issuer.calls == 0


async def test_hs256_signed_with_the_public_key_is_refused_before_any_key(
    tokens: TokenVerifier, issuer: Published
) -> None:
    pem = RSA_OLD.as_pem(private=False)  # what an attacker can read from the JWKS
    header = {"alg": "HS256", "kid": "old"}
    unsigned = hand_built(header, claims()).rsplit(".", 1)[0]
    mac = hmac.new(pem, unsigned.encode(), hashlib.sha256).digest()
    err = await refused(tokens, f"{unsigned}.{b64(mac)}", AlgorithmNotAllowed)
    assert "'HS256'" in str(err) and err.claim == "alg"
    # The same with a kid the service does not know: still no fetch, the alg goes first.
    header["kid"] = "never-published"
    await refused(tokens, hand_built(header, claims(), mac), AlgorithmNotAllowed)
    assert issuer.calls == 0


async def test_an_expired_token_is_refused_and_leeway_is_honoured(tokens: TokenVerifier) -> None:
    err = await refused(tokens, sign(RSA_OLD, "old", exp=NOW - 61), Expired)
    assert (err.trust_domain, err.claim) == ("cluster-b", "exp")
    assert "projected token" in str(err)
    assert (await tokens.verify(sign(RSA_OLD, "old", exp=NOW - 59))).namespace == "ml"


@pytest.mark.parametrize("claim", ["nbf", "iat"])
async def test_a_token_from_the_future_is_refused(tokens: TokenVerifier, claim: str) -> None:
    err = await refused(tokens, signed(RSA_OLD, "old", claims(**{claim: NOW + 61})), NotYetValid)
    assert (err.trust_domain, err.claim) == ("cluster-b", claim)
    assert "clock" in str(err)
    assert (
        await tokens.verify(signed(RSA_OLD, "old", claims(**{claim: NOW + 59})))
    ).namespace == "ml"


async def test_an_unknown_issuer_is_refused(tokens: TokenVerifier, issuer: Published) -> None:
    err = await refused(
        tokens, sign(RSA_OLD, "old", iss="https://elsewhere.example"), UnknownIssuer
    )
    assert err.claim == "iss" and "'https://elsewhere.example'" in str(err)
    assert "TrustDomain" in str(err)
    await refused(tokens, sign(RSA_OLD, "old", iss=["not", "a string"]), UnknownIssuer)
    assert issuer.calls == 0


async def test_an_unknown_kid_is_refused_after_one_refresh(
    tokens: TokenVerifier, issuer: Published, clock: Clock
) -> None:
    token = sign(RSA_STRANGER, "stranger")
    err = await refused(tokens, token, UnknownKey)
    assert (err.trust_domain, err.claim) == ("cluster-b", "kid")
    assert "'stranger'" in str(err)
    assert issuer.calls == 1
    clock.now += 59
    await refused(tokens, token, UnknownKey)
    assert issuer.calls == 1
    clock.now += 1
    await refused(tokens, token, UnknownKey)
    assert issuer.calls == 2


async def test_a_flood_of_unknown_kids_makes_one_fetch_a_minute(
    tokens: TokenVerifier, issuer: Published, clock: Clock
) -> None:
    flood = [sign(RSA_STRANGER, f"kid-{i}") for i in range(100)]
    results = await asyncio.gather(*(tokens.verify(t) for t in flood), return_exceptions=True)
    assert all(isinstance(r, UnknownKey) for r in results)
    for token in flood:  # and one after another
        clock.now += 0.5
        await refused(tokens, token, UnknownKey)
    assert issuer.calls == 1
    clock.now = NOW + 60
    await refused(tokens, flood[0], UnknownKey)
    assert issuer.calls == 2


async def test_key_rotation_refetches_once_and_old_tokens_stay_valid(
    tokens: TokenVerifier, issuer: Published
) -> None:
    old_token = sign(RSA_OLD, "old")
    assert (await tokens.verify(old_token)).namespace == "ml"
    issuer.jwks = jwks((RSA_OLD, "old"), (RSA_NEW, "new"))  # the issuer rotates
    new_tokens = [sign(RSA_NEW, "new", iat=NOW - i) for i in range(5)]
    results = await asyncio.gather(*(tokens.verify(t) for t in new_tokens))
    assert {r.pod_name for r in results} == {"trainer-0"}
    assert issuer.calls == 1
    assert (await tokens.verify(sign(RSA_OLD, "old", iat=NOW - 1))).namespace == "ml"
    assert issuer.calls == 1


async def test_a_failed_fetch_keeps_the_last_good_keys(
    tokens: TokenVerifier, issuer: Published, clock: Clock
) -> None:
    issuer.fails = True
    await refused(tokens, sign(RSA_NEW, "new"), UnknownKey)
    assert issuer.calls == 1
    assert (await tokens.verify(sign(RSA_OLD, "old"))).namespace == "ml"
    issuer.fails, issuer.jwks = False, {"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "x"}]}
    clock.now += 60
    await refused(tokens, sign(RSA_NEW, "new"), UnknownKey)  # nothing usable: kept
    assert issuer.calls == 2
    assert (await tokens.verify(sign(RSA_OLD, "old", iat=NOW - 1))).namespace == "ml"


async def test_an_issuer_whose_keys_were_never_fetched_is_unavailable_not_a_caller_error(
    issuer: Published, clock: Clock
) -> None:
    issuer.fails = True
    v = verifier(None, issuer, clock)
    err = await refused(v, sign(RSA_OLD, "old"), KeysUnavailable)
    assert err.trust_domain == "cluster-b" and "retry later" in str(err)


async def test_a_forged_or_altered_signature_is_refused(tokens: TokenVerifier) -> None:
    forged = sign(RSA_STRANGER, "old")  # the right kid, another key
    err = await refused(tokens, forged, BadSignature)
    assert (err.trust_domain, err.claim) == ("cluster-b", "kid")
    header, _, signature = sign(RSA_OLD, "old").split(".")
    admin = claims(sub="system:serviceaccount:kube-system:admin")
    altered = f"{header}.{b64(json.dumps(admin).encode())}.{signature}"
    await refused(tokens, altered, BadSignature)
    ec_as_rsa = sign(EC_KEY, "old", alg="ES256")  # an ES256 token naming an RSA key
    await refused(tokens, ec_as_rsa, BadSignature)


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        "a.b.c",
        "a..c",
        hand_built({"alg": "RS256", "kid": "old"}, {"iss": ISSUER})[:-1] + "x" * 20_000,
    ],
)
async def test_garbage_is_malformed(tokens: TokenVerifier, token: str) -> None:
    await refused(tokens, token, Malformed)


async def test_claims_that_are_missing_or_inconsistent_are_refused(tokens: TokenVerifier) -> None:
    for name in ("exp", "nbf", "iat", "sub", "aud"):
        err = await refused(tokens, signed(RSA_OLD, "old", claims(**{name: None})), MissingClaim)
        assert (err.trust_domain, err.claim) == ("cluster-b", name)
        assert f"'{name}'" in str(err)
    err = await refused(tokens, sign(RSA_OLD, "old", exp=float(NOW + 60)), Malformed)
    assert err.claim == "exp"
    err = await refused(
        tokens, sign(RSA_OLD, "old", sub="system:serviceaccount:kube-system:x"), Malformed
    )
    assert err.claim == "kubernetes.io"
    token = hand_built({"alg": "RS256", "kid": "old", "crit": ["exp"], "exp": 1}, claims(), b"x")
    assert (await refused(tokens, token, Malformed)).claim == "crit"


async def test_verified_tokens_are_cached_by_hash_until_exp_and_bounded(
    issuer: Published, clock: Clock
) -> None:
    v = verifier(issuer.jwks, issuer, clock, cache_size=3)
    many = [sign(RSA_OLD, "old", exp=NOW + 100, iat=NOW - i) for i in range(5)]
    for token in many:
        await v.verify(token)
    cached = v._cache
    assert len(cached) <= 3
    assert all(len(k) == 32 and k not in {t.encode() for t in many} for k in cached)
    await v.verify(many[-1])  # a hit
    clock.now = NOW + 100 + 61
    await refused(v, many[-1], Expired)  # the hit ended at exp; the rules said expired


async def test_the_same_policy_and_keys_again_keep_the_cache_a_change_drops_it(
    issuer: Published, clock: Clock
) -> None:
    """A watch's re-list hands the same TrustDomain and record again: verified tokens stay
    cached; new keys or a new policy (audiences, leeway) are checked afresh."""
    v = verifier(issuer.jwks, issuer, clock)
    await v.verify(sign(RSA_OLD, "old"))
    v.trust(POLICY, issuer.jwks)
    assert len(v._cache) == 1
    v.trust(POLICY, jwks((RSA_OLD, "old"), (RSA_NEW, "new")))
    assert len(v._cache) == 0
    await v.verify(sign(RSA_OLD, "old"))
    v.trust(TrustPolicy("cluster-b", ISSUER, frozenset({"o41"}), leeway=5))
    assert len(v._cache) == 0


async def test_an_issuer_belongs_to_one_trust_domain(tokens: TokenVerifier) -> None:
    with pytest.raises(ValueError, match="already trust domain"):
        tokens.trust(TrustPolicy("cluster-c", ISSUER, frozenset({"o41"})))
    tokens.forget("cluster-b")
    await refused(tokens, sign(RSA_OLD, "old"), UnknownIssuer)


# --- the pure rules ---------------------------------------------------------------------------


def test_a_policy_cannot_accept_the_api_servers_audience() -> None:
    with pytest.raises(ValueError, match="API server"):
        TrustPolicy("b", ISSUER, frozenset({"o41", "https://kubernetes.default.svc"}))
    with pytest.raises(ValueError, match="API server"):
        TrustPolicy("b", ISSUER, frozenset({ISSUER}))
    assert POLICY.algorithms == {"RS256", "ES256"} and POLICY.leeway == 60


def test_keys_may_be_fetched_again_once_a_minute() -> None:
    rule = KeyRefetch()
    assert rule.allowed(None, NOW)
    assert not rule.allowed(NOW, NOW + 59.9)
    assert rule.allowed(NOW, NOW + 60)
    assert rule.allowed(NOW, NOW - 5)  # a clock that went back does not block for its jump


HEADER = {"alg": "RS256", "kid": "old"}
LEEWAY = POLICY.leeway


@given(st.integers(min_value=-(2**40), max_value=NOW - LEEWAY))
def test_any_exp_before_now_minus_leeway_is_expired(exp: int) -> None:
    with pytest.raises(Expired):
        check_claims(POLICY, HEADER, claims(exp=exp, nbf=exp - 10, iat=exp - 10), NOW)


@given(st.integers(min_value=NOW - LEEWAY + 1, max_value=2**40), st.integers(0, 2 * LEEWAY))
def test_times_within_leeway_are_accepted(exp: int, ahead: int) -> None:
    t = NOW + ahead - LEEWAY
    assert check_claims(POLICY, HEADER, claims(exp=exp, nbf=t, iat=t), NOW).expires == exp


@given(
    st.lists(st.text(max_size=20) | st.just("o41"), max_size=4),
    st.sampled_from(sorted(API_SERVER_AUDIENCES | {ISSUER})),
    st.integers(min_value=0, max_value=4),
)
def test_an_audience_list_with_an_api_server_audience_is_always_refused(
    others: list[str], api: str, at: int
) -> None:
    aud = [*others[:at], api, *others[at:]]
    with pytest.raises(ApiServerAudience):
        check_claims(POLICY, HEADER, claims(aud=aud), NOW)


@given(st.text(max_size=10).filter(lambda a: a not in {"RS256", "ES256"}))
def test_any_other_alg_is_refused(alg: str) -> None:
    with pytest.raises(AlgorithmNotAllowed):
        check_claims(POLICY, {"alg": alg, "kid": "k"}, claims(), NOW)


@given(st.lists(st.text(max_size=20).filter(lambda a: a != "o41"), max_size=4))
def test_an_audience_list_without_o41_is_refused(aud: list[str]) -> None:
    with pytest.raises((WrongAudience, ApiServerAudience)):
        check_claims(POLICY, HEADER, claims(aud=aud), NOW)
