"""The rules for a workload token signed by another issuer (another cluster's API server),
as plain functions of data: which header and claims are accepted, who the token names,
and when the issuer's keys may be fetched again. No I/O and no clock: ``now`` is a
parameter. The service verifies the signature (``o41.webhook.identity.tokens``) and calls these.

Every refusal is a :class:`TokenRefused` whose ``reason`` is a CamelCase code and whose
message names the trust domain, the claim and the fix, and never holds the token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

# Asymmetric only: HS256 would let anyone holding the public key sign, and "none" anyone.
ALGORITHMS = frozenset({"RS256", "ES256"})
# What a Kubernetes API server accepts by default: a token minted for it is a credential
# to that cluster, and whoever holds one must not be able to replay it here.
API_SERVER_AUDIENCES = frozenset(
    {
        "https://kubernetes.default.svc.cluster.local",
        "https://kubernetes.default.svc",
        "kubernetes.default.svc",
    }
)
# JWS extensions (RFC 7515 crit, RFC 7797 unencoded payload): none is needed, so none is
# accepted rather than half understood.
REFUSED_HEADERS = frozenset({"crit", "b64"})
LEEWAY = 60  # seconds of clock skew between the issuer and us
REFETCH_INTERVAL = 60.0  # seconds between two fetches of one issuer's keys
SA_PREFIX = "system:serviceaccount:"
AUDIENCE_FIX = "(serviceAccountToken audience in the pod spec)"


def shown(value: object, limit: int = 80) -> str:
    """A claim's value for a message: its repr, cut short (claims are the caller's text)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TokenRefused(Exception):
    """A token this service does not accept; ``reason`` is the code clients and metrics see."""

    reason: ClassVar[str] = "Refused"

    def __init__(self, message: str, trust_domain: str | None = None, claim: str | None = None):
        super().__init__(message)
        self.trust_domain = trust_domain
        self.claim = claim


class Malformed(TokenRefused):
    reason = "Malformed"


class AlgorithmNotAllowed(TokenRefused):
    reason = "AlgorithmNotAllowed"


class MissingClaim(TokenRefused):
    reason = "MissingClaim"


class UnknownIssuer(TokenRefused):
    reason = "UnknownIssuer"


class UnknownKey(TokenRefused):
    reason = "UnknownKey"


class KeysUnavailable(TokenRefused):
    """Our fault, not the caller's: the issuer's keys were never fetched (a 503, not 401)."""

    reason = "KeysUnavailable"


class BadSignature(TokenRefused):
    reason = "BadSignature"


class WrongAudience(TokenRefused):
    reason = "WrongAudience"


class ApiServerAudience(TokenRefused):
    reason = "ApiServerAudience"


class Expired(TokenRefused):
    reason = "Expired"


class NotYetValid(TokenRefused):
    reason = "NotYetValid"


REASONS = tuple(
    c.reason
    for c in (
        Malformed,
        AlgorithmNotAllowed,
        MissingClaim,
        UnknownIssuer,
        UnknownKey,
        KeysUnavailable,
        BadSignature,
        WrongAudience,
        ApiServerAudience,
        Expired,
        NotYetValid,
    )
)


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    """What one trust domain (one other cluster's issuer) must show to be accepted."""

    trust_domain: str
    issuer: str
    audiences: frozenset[str]
    leeway: int = LEEWAY
    api_server_audiences: frozenset[str] = API_SERVER_AUDIENCES

    def __post_init__(self) -> None:
        if not self.trust_domain or not self.issuer or not self.audiences:
            raise ValueError("a trust policy needs a trust domain, an issuer and audiences")
        if self.audiences & self.refused_audiences:
            raise ValueError(
                f"trust domain {self.trust_domain!r}: audiences "
                f"{sorted(self.audiences & self.refused_audiences)} are the API server's"
            )
        if self.leeway < 0:
            raise ValueError("leeway must be >= 0")

    @property
    def algorithms(self) -> frozenset[str]:
        return ALGORITHMS

    @property
    def refused_audiences(self) -> frozenset[str]:
        """The API server's audiences, and the issuer: the API server's default audience."""
        return self.api_server_audiences | {self.issuer}


@dataclass(frozen=True, slots=True)
class Subject:
    """Who a verified token names. For a pod's projected token: its namespace, service
    account and pod; else only ``subject`` (the raw ``sub``)."""

    trust_domain: str
    subject: str
    expires: int
    namespace: str | None = None
    service_account: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class KeyRefetch:
    """May the issuer's keys be fetched again now? At most once per ``interval`` per
    issuer, failed attempts included, so a flood of unknown kids costs one fetch a minute."""

    interval: float = REFETCH_INTERVAL

    def allowed(self, last_fetch: float | None, now: float) -> bool:
        # A clock that went back counts as allowed once, rather than blocking for its jump.
        return last_fetch is None or now - last_fetch >= self.interval or now < last_fetch


def check_header(policy: TrustPolicy, header: Mapping[str, Any]) -> str:
    """The kid of an acceptable header; called before any key is touched."""
    domain = policy.trust_domain
    alg = header.get("alg")
    if alg not in policy.algorithms:
        raise AlgorithmNotAllowed(
            f"token of trust domain {domain!r} is signed with alg {shown(alg)}: "
            f"only {sorted(policy.algorithms)} are accepted; sign with the issuer's key",
            domain,
            "alg",
        )
    refused = sorted(REFUSED_HEADERS & header.keys())
    if refused:
        raise Malformed(
            f"token of trust domain {domain!r} has a {refused[0]!r} header: no JWS extension "
            "is understood here; send a plain service account token",
            domain,
            refused[0],
        )
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise MissingClaim(
            f"token of trust domain {domain!r} has no 'kid' header: the key cannot be "
            "chosen; send a token the issuer signed with a key of its JWKS",
            domain,
            "kid",
        )
    return kid


def audiences_of(policy: TrustPolicy, claims: Mapping[str, Any]) -> list[str]:
    aud = claims.get("aud")
    domain = policy.trust_domain
    if aud is None:
        raise MissingClaim(
            f"token of trust domain {domain!r} has no 'aud' claim: ask for a token with "
            f"audience {shown(sorted(policy.audiences)[0])} {AUDIENCE_FIX}",
            domain,
            "aud",
        )
    listed = [aud] if isinstance(aud, str) else aud
    if not isinstance(listed, list) or not all(isinstance(a, str) for a in listed):
        raise Malformed(
            f"token of trust domain {domain!r} has an 'aud' claim that is neither a string "
            "nor a list of strings; send a service account token",
            domain,
            "aud",
        )
    return listed


def check_audience(policy: TrustPolicy, claims: Mapping[str, Any]) -> None:
    domain = policy.trust_domain
    listed = audiences_of(policy, claims)
    wanted = shown(sorted(policy.audiences)[0])
    if set(listed) & policy.refused_audiences:
        raise ApiServerAudience(
            f"token of trust domain {domain!r} has audience {shown(listed)}, which is the "
            "API server's: such a token is a credential to that cluster and is never "
            f"accepted from another issuer; ask for a token with audience {wanted} "
            f"{AUDIENCE_FIX}",
            domain,
            "aud",
        )
    if not set(listed) & policy.audiences:
        raise WrongAudience(
            f"token of trust domain {domain!r} has audience {shown(listed)}: "
            f"ask for a token with audience {wanted} {AUDIENCE_FIX}",
            domain,
            "aud",
        )


def numeric_claim(policy: TrustPolicy, claims: Mapping[str, Any], name: str) -> int:
    value = claims.get(name)
    domain = policy.trust_domain
    if value is None:
        raise MissingClaim(
            f"token of trust domain {domain!r} has no {name!r} claim: send a bound "
            "service account token (projected, with an expiry)",
            domain,
            name,
        )
    if not isinstance(value, int) or isinstance(value, bool):
        raise Malformed(
            f"token of trust domain {domain!r} has a {name!r} claim that is not an "
            "integer (seconds since the epoch); send a service account token",
            domain,
            name,
        )
    return value


def check_times(policy: TrustPolicy, claims: Mapping[str, Any], now: int) -> int:
    """The token's exp, once exp, nbf and iat say it is valid at ``now``."""
    domain, leeway = policy.trust_domain, policy.leeway
    exp = numeric_claim(policy, claims, "exp")
    nbf = numeric_claim(policy, claims, "nbf")
    iat = numeric_claim(policy, claims, "iat")
    if exp <= now - leeway:
        raise Expired(
            f"token of trust domain {domain!r} expired {now - exp} s ago ('exp' claim): "
            "read the projected token file again (the kubelet rotates it) or ask for a new one",
            domain,
            "exp",
        )
    for name, value in (("nbf", nbf), ("iat", iat)):
        if value > now + leeway:
            raise NotYetValid(
                f"token of trust domain {domain!r} is valid only from {value - now} s from "
                f"now ({name!r} claim): the issuer's clock is ahead of ours; sync the clocks",
                domain,
                name,
            )
    return exp


def subject_of(policy: TrustPolicy, claims: Mapping[str, Any], exp: int) -> Subject:
    domain = policy.trust_domain
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise MissingClaim(
            f"token of trust domain {domain!r} has no 'sub' claim: send a service account token",
            domain,
            "sub",
        )
    k8s = claims.get("kubernetes.io")
    if k8s is None:
        return Subject(domain, sub, exp)
    parts = sub.removeprefix(SA_PREFIX).split(":")
    ns = k8s.get("namespace") if isinstance(k8s, dict) else None
    sa = k8s.get("serviceaccount") if isinstance(k8s, dict) else None
    pod = k8s.get("pod") if isinstance(k8s, dict) else None
    sa_name = sa.get("name") if isinstance(sa, dict) else None
    if (
        not sub.startswith(SA_PREFIX)
        or len(parts) != 2
        or parts != [ns, sa_name]
        or not (pod is None or isinstance(pod, dict))
    ):
        raise Malformed(
            f"token of trust domain {domain!r} has a 'kubernetes.io' claim that does not "
            f"match its 'sub' {shown(sub)}; send the pod's projected service account token",
            domain,
            "kubernetes.io",
        )
    pod_name = pod.get("name") if pod else None
    pod_uid = pod.get("uid") if pod else None
    return Subject(
        domain,
        sub,
        exp,
        namespace=parts[0],
        service_account=parts[1],
        pod_name=pod_name if isinstance(pod_name, str) else None,
        pod_uid=pod_uid if isinstance(pod_uid, str) else None,
    )


def check_claims(
    policy: TrustPolicy, header: Mapping[str, Any], claims: Mapping[str, Any], now: int
) -> Subject:
    """Who the token names, once its header and claims pass every rule at ``now``
    (the signature is the caller's job); else a :class:`TokenRefused`."""
    check_header(policy, header)
    iss = claims.get("iss")
    if iss != policy.issuer:
        raise UnknownIssuer(
            f"token has issuer {shown(iss)} ('iss' claim), not trust domain "
            f"{policy.trust_domain!r}'s {policy.issuer!r}; send a token of that issuer",
            policy.trust_domain,
            "iss",
        )
    check_audience(policy, claims)
    exp = check_times(policy, claims, now)
    return subject_of(policy, claims, exp)


# --- one issuer, one trust domain: the oldest TrustDomain naming it -----------------------


@dataclass(frozen=True, slots=True)
class IssuerClaim:
    """A TrustDomain's claim on its issuer, told by what no user can write: when the API
    server made it (``metadata.creationTimestamp``), then its name, then its uid. Never
    its status."""

    issuer: str
    name: str
    uid: str
    created: str = ""  # RFC 3339 as the API server writes it; "" sorts after any time

    @property
    def order(self) -> tuple[datetime, str, str]:
        """Older first: the time it was made, then its name, then its uid."""
        return (_instant(self.created), self.name, self.uid)


_NEVER = datetime.max.replace(tzinfo=UTC)


def _instant(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return _NEVER
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def issuer_owners(claims: Iterable[IssuerClaim]) -> dict[str, IssuerClaim]:
    """Each issuer's owner: the oldest of the claims naming it. A function of the set of
    claims alone, in any order, so every replica that knows the same TrustDomains decides
    the same; a newer claim never takes an issuer from an older one."""
    owners: dict[str, IssuerClaim] = {}
    for claim in claims:
        held = owners.get(claim.issuer)
        if held is None or claim.order < held.order:
            owners[claim.issuer] = claim
    return owners


def issuer_conflict(claim: IssuerClaim, claims: Iterable[IssuerClaim]) -> str | None:
    """Why ``claim`` is not its issuer's trust domain (another, older one is), or None."""
    owner = issuer_owners([claim, *claims]).get(claim.issuer)
    if owner is None or owner.uid == claim.uid:
        return None
    return (
        f"TrustDomain {claim.name!r}: issuer {claim.issuer!r} belongs to TrustDomain "
        f"{owner.name!r}, the oldest of the "
        f"TrustDomains naming it (made {owner.created or 'first'}): one issuer is one trust "
        f"domain, so this one is ignored and that issuer's tokens are {owner.name}:<namespace>. "
        f"Delete TrustDomain {claim.name!r}; or, to keep this one, delete {owner.name!r} "
        "(its tenants' data stays under its name)"
    )
