"""Tokens this service issued (``kubectl o41 token create``), verified: the signature with
the public half of the key in the service's Secret, the rules of
``o41.core.service_tokens``, and the record, which must still exist (a deleted record is
a revoked token; the view's watch sees it within seconds)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import ECKey

from o41.core.service_tokens import ALGORITHM, DOMAIN, FIX, Issued, check_claims, check_record
from o41.core.trust import BadSignature, KeysUnavailable
from o41.kube.service_tokens import KEY_FIELD, SECRET, kid_of, signing_key
from o41.webhook.identity.tokens import TokenVerifier, claimed_issuer

log = logging.getLogger("o41.webhook.service_tokens")
KEY_TTL = 60.0  # seconds: a new key in the Secret serves within a minute
MAX_CACHED = 10_000  # verified tokens remembered (by SHA-256, never the token)

KeySource = Callable[[], Awaitable[Mapping[str, str]]]  # the Secret's data


@dataclass
class ServiceTokens:
    issuer: str | None = None  # None: not set up (outside a cluster, no namespace known)
    source: KeySource | None = None
    records: dict[str, Issued] = field(default_factory=dict)  # by token id
    clock: Callable[[], float] = time.time
    _key: tuple[float, ECKey] | None = None
    _verified: dict[bytes, tuple[ECKey, Issued]] = field(default_factory=dict)

    def issues(self, token: str) -> bool:
        return self.issuer is not None and claimed_issuer(token) == self.issuer

    async def verify(self, token: str) -> Issued:
        """The token's claims, once its signature and the rules pass and its record
        exists. A signature verified once is remembered by the token's SHA-256 until its
        exp and while the key is the same; the record is looked at on every call, so a
        revocation takes effect at once."""
        assert self.issuer is not None, "issues() said no"
        now = self.clock()
        digest = hashlib.sha256(token.encode()).digest()
        key = await self.key()
        hit = self._verified.get(digest)
        if hit is not None and hit[0] is key and hit[1].expires > now:
            return check_record(hit[1], self.records.get(hit[1].id))
        header, claims = TokenVerifier.parse(token)
        issued = check_claims(self.issuer, header, claims, int(now))
        if header.get("kid") != kid_of(key):
            raise BadSignature(
                f"service token {issued.id!r} was signed with a key this service no longer "
                f"has: {FIX}",
                DOMAIN,
                "kid",
            )
        try:
            jws.deserialize_compact(token, key, algorithms=[ALGORITHM])
        except (JoseError, ValueError):
            raise BadSignature(
                f"service token {issued.id!r} has a signature the service's key does not "
                "verify: send the token unmodified",
                DOMAIN,
                "kid",
            ) from None
        if len(self._verified) >= MAX_CACHED:  # bounded: the expired go, then all
            self._verified = {d: v for d, v in self._verified.items() if v[1].expires > now}
            if len(self._verified) >= MAX_CACHED:
                self._verified.clear()
        self._verified[digest] = (key, issued)
        return check_record(issued, self.records.get(issued.id))

    async def key(self) -> ECKey:
        now = time.monotonic()
        if self._key is not None and self._key[0] > now:
            return self._key[1]
        try:
            assert self.source is not None
            data = await self.source()
            key = signing_key(data[KEY_FIELD])
        except Exception as e:  # no Secret yet, unreadable: our side, not the token's
            log.warning("service tokens' key not read: %r", e)
            if self._key is not None:
                return self._key[1]  # the last good key serves on
            raise KeysUnavailable(
                f"the service's token key (Secret {SECRET}) cannot be read now: retry "
                "later; a platform admin checks that the Secret exists",
                DOMAIN,
                "kid",
            ) from None
        self._key = (now + KEY_TTL, key)
        return key

    def use_key(self, pem: bytes | str) -> None:
        """Use this key (tests; the Secret is not read then until it is forgotten)."""
        self._key = (float("inf"), signing_key(pem))
