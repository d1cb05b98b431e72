"""Workload tokens of other issuers (other clusters' API servers), verified offline against
each issuer's published keys (JWKS); the rules are ``o41.core.trust``, this is the I/O.

The fetch is async because the service is aiohttp and a fetch is network I/O (the
issuer's JWKS, or the keys the operator recorded); a sync source wraps itself in
``asyncio.to_thread``. It is called only for an unknown kid, at most once a minute per
issuer (:class:`~o41.core.trust.KeyRefetch`); when it fails the last good keys serve on.
Verified tokens are cached by their SHA-256 (never the token) until their exp.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, RSAKey, import_key

from o41.core.jsonlimits import TooDeep, check_depth
from o41.core.trust import (
    BadSignature,
    KeyRefetch,
    KeysUnavailable,
    Malformed,
    Subject,
    TrustPolicy,
    UnknownIssuer,
    UnknownKey,
    check_claims,
    check_header,
    shown,
)

log = logging.getLogger("o41.webhook.tokens")
MAX_TOKEN = 16 * 1024  # bytes: a projected token is about 1 KiB; refuse before decoding more
MAX_DEPTH = 8  # JSON levels in a token's header or claims: a projected token's nest 3
MAX_CONTAINERS = 64  # arrays and objects in either: a projected token's claims hold 5
FETCH_TIMEOUT = 10.0  # seconds: a hung issuer must not hold every waiting request forever

Fetch = Callable[[TrustPolicy], Awaitable[Mapping[str, Any]]]
VerifyKey = RSAKey | ECKey


@dataclass
class Issuer:
    """One trusted issuer: its policy, its last good keys by kid, when they were fetched."""

    policy: TrustPolicy
    keys: dict[str, VerifyKey] = field(default_factory=dict)
    last_fetch: float | None = None
    # the keys serve until ``stale_after`` seconds past their last good fetch (the
    # operator's or ours), no longer: a key the issuer removed must not verify forever
    # while the issuer is away; None: no limit
    stale_after: float | None = None
    fetched_at: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def import_keys(jwks: Mapping[str, Any]) -> dict[str, VerifyKey]:
    """The public signing keys of a JWKS by kid; anything else in it is skipped."""
    found: dict[str, VerifyKey] = {}
    entries = jwks.get("keys")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("kty") not in ("RSA", "EC"):
            continue
        kid, use = entry.get("kid"), entry.get("use", "sig")
        if not isinstance(kid, str) or not kid or use != "sig" or "d" in entry:
            continue
        try:
            key = import_key(entry)
        except (JoseError, ValueError, TypeError):
            log.warning("skipped JWKS key %s: not a valid public key", shown(kid))
            continue
        if isinstance(key, RSAKey | ECKey):
            found[kid] = key
    return found


def decode_segment(segment: str) -> dict[str, Any]:
    """A base64url JSON object of a compact JWS, or :class:`Malformed`. Its depth is
    measured before it is parsed: a token of a thousand nested arrays is a malformed
    token, not a ``RecursionError`` (issue 37)."""
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        check_depth(raw, MAX_DEPTH, what="the token's JSON", max_containers=MAX_CONTAINERS)
        value = json.loads(raw)
    except TooDeep as e:
        reason = str(e).split(":")[0]  # what was wrong; the fix is a token's, not a body's
        raise Malformed(
            f"token is not a JWT a cluster signs ({reason}): send the pod's ServiceAccount "
            "token as it is",
            None,
            None,
        ) from None
    except (binascii.Error, ValueError):
        value = None
    if not isinstance(value, dict):
        raise Malformed("token is not a compact JWS of JSON objects; send a JWT", None, None)
    return value


MAX_CLAIMED = 10_000  # tokens whose claimed issuer is remembered (by SHA-256)
_claimed: dict[bytes, str | None] = {}


def claimed_issuer(token: str) -> str | None:
    """The ``iss`` a compact JWS claims, unverified (None: not a JWT of JSON objects, or
    no issuer named): what chooses the path a token takes, never whether it is good. A
    pure function of the token, remembered by its SHA-256 (never the token): decoding
    the claims again on every request of the same pod cost each request about 11 us,
    twice (the service's own tokens and the other clusters' each asked; issue 41)."""
    if len(token) > MAX_TOKEN:
        return None
    digest = hashlib.sha256(token.encode()).digest()
    try:
        return _claimed[digest]
    except KeyError:
        pass
    parts = token.split(".")
    iss: str | None = None
    if len(parts) == 3:
        try:
            claimed = decode_segment(parts[1]).get("iss")
        except Malformed:
            claimed = None
        iss = claimed if isinstance(claimed, str) else None
    if len(_claimed) >= MAX_CLAIMED:  # bounded: forget them all, the next decode is cheap
        _claimed.clear()
    _claimed[digest] = iss
    return iss


class TokenVerifier:
    """Verifies tokens of the trusted issuers; ``verify`` answers a Subject or raises
    :class:`~o41.core.trust.TokenRefused`."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        clock: Callable[[], float] = time.time,
        refetch: KeyRefetch = KeyRefetch(),  # noqa: B008 (frozen, immutable)
        cache_size: int = 10_000,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._refetch = refetch
        self._cache_size = cache_size
        self._issuers: dict[str, Issuer] = {}
        self._cache: dict[bytes, tuple[float, Subject, Issuer, str]] = {}

    def trust(
        self,
        policy: TrustPolicy,
        jwks: Mapping[str, Any] | None = None,
        *,
        fetched_at: float | None = None,
        stale_after: float | None = None,
    ) -> None:
        """Trust ``policy``'s issuer, with keys already known (the operator's, fetched at
        ``fetched_at``, epoch seconds) or none yet (the first token fetches them); keys
        serve until ``stale_after`` seconds past their last good fetch (None: no limit).
        Given keys are not a fetch: a new kid may still fetch at once. A trust
        domain given another issuer forgets the old one; a changed policy or key set
        drops the cache of verified tokens, the same ones again (a watch's re-list)
        keep it."""
        old = self._issuers.get(policy.issuer)
        if old is not None and old.policy.trust_domain != policy.trust_domain:
            raise ValueError(
                f"issuer {policy.issuer!r} is already trust domain {old.policy.trust_domain!r}"
            )
        if old is None:
            self.forget(policy.trust_domain)
        issuer = Issuer(policy) if old is None else old
        changed = old is None or old.policy != policy or old.stale_after != stale_after
        issuer.policy = policy
        issuer.stale_after = stale_after
        keys = import_keys(jwks) if jwks is not None else {}
        if keys:  # as with a fetch, a set with no usable key leaves the last good keys
            changed = changed or published(keys) != published(issuer.keys)
            issuer.keys = keys
            if fetched_at is not None:  # never older than a fetch of our own
                issuer.fetched_at = max(fetched_at, issuer.fetched_at or fetched_at)
        self._issuers[policy.issuer] = issuer
        if changed:  # the same policy and keys again (a watch's re-list): the cache stays
            self._cache.clear()

    def issues(self, token: str) -> bool:
        """Does a trusted issuer's name stand in the token's (unverified) ``iss``? Only
        chooses the path a token takes; :meth:`verify` decides."""
        if not self._issuers:
            return False
        iss = claimed_issuer(token)
        return iss is not None and iss in self._issuers

    def forget(self, trust_domain: str) -> None:
        self._issuers = {
            k: v for k, v in self._issuers.items() if v.policy.trust_domain != trust_domain
        }
        self._cache.clear()

    async def verify(self, token: str) -> Subject:
        now = self._clock()
        digest = hashlib.sha256(token.encode()).digest()
        hit = self._cache.get(digest)
        if hit is not None:
            until, subject, issuer, kid = hit
            # Still valid, its issuer still trusted, its key still published.
            current = self._issuers.get(issuer.policy.issuer)
            if until > now and current is issuer and kid in issuer.keys and fresh(issuer, now):
                return subject
            del self._cache[digest]
        header, claims = self.parse(token)
        iss = claims.get("iss")
        found = self._issuers.get(iss) if isinstance(iss, str) else None
        if found is None:
            raise UnknownIssuer(
                f"token has issuer {shown(iss)} ('iss' claim), which no trust "
                "domain names: a platform admin applies a TrustDomain for that issuer",
                None,
                "iss",
            )
        issuer = found
        kid = check_header(issuer.policy, header)  # alg allowlist before any key is used
        if not fresh(issuer, now):
            domain = issuer.policy.trust_domain
            raise KeysUnavailable(
                f"keys of trust domain {domain!r} are stale: none was fetched within its "
                f"spec.staleAfter; a platform admin checks `kubectl get trustdomain {domain}`",
                domain,
                "kid",
            )
        key = await self.key(issuer, kid)
        try:
            jws.deserialize_compact(token, key, algorithms=[header["alg"]])
        except (JoseError, ValueError) as err:
            domain = issuer.policy.trust_domain
            raise BadSignature(
                f"token of trust domain {domain!r} has a signature its key {shown(kid)} does "
                "not verify ('kid' header): send a token this issuer signed, unmodified",
                domain,
                "kid",
            ) from err
        subject = check_claims(issuer.policy, header, claims, int(now))
        self.remember(digest, subject, issuer, kid, now)
        return subject

    @staticmethod
    def parse(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The header and the (not yet verified) claims: enough to choose issuer and key."""
        parts = token.split(".")  # an empty signature is alg none's: the alg check says so
        if len(token) > MAX_TOKEN or len(parts) != 3 or not parts[0] or not parts[1]:
            raise Malformed("token is not a compact JWS (three parts); send a JWT")
        return decode_segment(parts[0]), decode_segment(parts[1])

    async def key(self, issuer: Issuer, kid: str) -> VerifyKey:
        """The key ``kid``, fetching the issuer's keys again once if the rule allows."""
        key = issuer.keys.get(kid)
        if key is not None:
            return key
        async with issuer.lock:  # waiters see the fetch already under way, not a new one
            key = issuer.keys.get(kid)
            if key is None and self._refetch.allowed(issuer.last_fetch, self._clock()):
                await self.fetch(issuer)
                key = issuer.keys.get(kid)
        if key is not None:
            return key
        domain = issuer.policy.trust_domain
        if not issuer.keys:
            raise KeysUnavailable(
                f"keys of trust domain {domain!r} could not be fetched yet: retry later; "
                "a platform admin checks the issuer's JWKS endpoint",
                domain,
                "kid",
            )
        raise UnknownKey(
            f"token of trust domain {domain!r} names key {shown(kid)} ('kid' header), which "
            "its issuer does not publish (checked again at most once a minute): send a "
            "fresh token of that cluster",
            domain,
            "kid",
        )

    async def fetch(self, issuer: Issuer) -> None:
        """One fetch of the issuer's keys; on failure the last good keys stay."""
        issuer.last_fetch = self._clock()
        domain = issuer.policy.trust_domain
        try:
            async with asyncio.timeout(FETCH_TIMEOUT):
                jwks = await self._fetch(issuer.policy)
        except Exception as err:  # any failure of the source: keep serving the last keys
            log.warning("keys of trust domain %s not fetched: %r", domain, err)
            return
        keys = import_keys(jwks) if isinstance(jwks, Mapping) else {}
        if not keys:
            log.warning("keys of trust domain %s not replaced: the JWKS has no usable key", domain)
            return
        issuer.keys = keys
        issuer.fetched_at = self._clock()

    def remember(
        self, digest: bytes, subject: Subject, issuer: Issuer, kid: str, now: float
    ) -> None:
        if subject.expires <= now:
            return
        if len(self._cache) >= self._cache_size:  # bounded: expired first, then the oldest
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            while len(self._cache) >= self._cache_size:
                del self._cache[next(iter(self._cache))]
        self._cache[digest] = (subject.expires, subject, issuer, kid)


def published(keys: Mapping[str, VerifyKey]) -> dict[str, Any]:
    """The keys as their issuer publishes them: what tells a new JWKS from the same."""
    return {kid: key.as_dict(private=False) for kid, key in keys.items()}


def fresh(issuer: Issuer, now: float) -> bool:
    """May its keys still serve at ``now``? Keys never fetched are not stale: there are
    none, which :meth:`TokenVerifier.key` answers."""
    if issuer.stale_after is None or not issuer.keys:
        return True
    return issuer.fetched_at is not None and now <= issuer.fetched_at + issuer.stale_after
