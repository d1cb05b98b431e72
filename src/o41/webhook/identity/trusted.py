"""The TrustDomains this service accepts tokens of, kept in the token verifier.

A TrustDomain's spec (a platform admin's: cluster-scoped) gives the policy: issuer,
audiences, leeway, the stale limit. Its keys come from the operator's record of them (a
ConfigMap only the operator may write, ``o41.kube.trust_record``), used only when the record
is bound to that TrustDomain's uid and issuer; its status is never read. A TrustDomain
whose issuer is this cluster's own is ignored: this cluster's tokens keep going to the
TokenReview, which sees revocation.

One issuer is one trust domain: of the TrustDomains naming an issuer, only the oldest
(creationTimestamp, then name, then uid: ``o41.core.trust.issuer_owners``) is trusted,
whatever order the watch brought them in, so every replica maps the issuer's tokens to
the same tenants. The operator shows the others ``Conflict``; that is not read here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from o41.core.addresses import Network
from o41.core.trust import IssuerClaim, TrustPolicy, issuer_owners
from o41.kube.api import TrustDomainSpec
from o41.kube.trust_record import TrustRecord
from o41.webhook.identity.tokens import TokenVerifier

log = logging.getLogger("o41.webhook.trusted")


@dataclass(frozen=True, slots=True)
class TrustDomainSource:
    name: str
    uid: str
    spec: TrustDomainSpec
    created: str = ""  # metadata.creationTimestamp: the oldest of an issuer's owns it

    @property
    def claim(self) -> IssuerClaim:
        return IssuerClaim(self.spec.issuer, self.name, self.uid, self.created)

    def policy(self) -> TrustPolicy:
        spec = self.spec
        return TrustPolicy(self.name, spec.issuer, frozenset(spec.audiences), spec.clock_leeway)


def trust_domain_source(obj: Mapping[str, Any]) -> TrustDomainSource | None:
    """What a TrustDomain object says, or None for a spec the CRD should have refused."""
    meta = obj.get("metadata") or {}
    try:
        spec = TrustDomainSpec.model_validate(obj.get("spec") or {})
    except ValidationError as e:
        log.warning("TrustDomain %s ignored: its spec is not valid: %s", meta.get("name"), e)
        return None
    created = str(meta.get("creationTimestamp") or "")
    return TrustDomainSource(str(meta["name"]), str(meta["uid"]), spec, created)


@dataclass
class TrustedDomains:
    """The verifier of other clusters' tokens, fed from the TrustDomains and records."""

    local_issuer: str | None = None  # this cluster's own issuer, never trusted offline
    allowed: tuple[Network, ...] = ()  # networks beyond the public ones keys come from
    sources: dict[str, TrustDomainSource] = field(default_factory=dict)  # by name
    records: dict[str, TrustRecord] = field(default_factory=dict)  # by TrustDomain uid
    verifier: TokenVerifier = field(init=False)

    def __post_init__(self) -> None:
        self.verifier = TokenVerifier(self.fetch)

    def put_source(self, source: TrustDomainSource) -> None:
        before = self.sources.get(source.name)
        self.sources[source.name] = source
        self._settle({source.spec.issuer} | ({before.spec.issuer} if before else set()))

    def drop_source(self, name: str) -> None:
        gone = self.sources.pop(name, None)
        self.verifier.forget(name)
        if gone is not None:  # the next oldest naming its issuer, if any, owns it now
            self._settle({gone.spec.issuer})

    def _settle(self, issuers: set[str]) -> None:
        """The issuers' TrustDomains again: the ones no longer owners forgotten first
        (the verifier holds one domain per issuer), then the owners trusted."""
        named = [s for s in self.sources.values() if s.spec.issuer in issuers]
        owners = issuer_owners(s.claim for s in named)
        for source in sorted(named, key=lambda s: s.uid == owners[s.spec.issuer].uid):
            self._apply(source.name)

    def put_record(self, record: TrustRecord) -> None:
        self.records[record.uid] = record
        self._apply(record.trust_domain)

    def drop_record(self, uid: str) -> None:
        gone = self.records.pop(uid, None)
        if gone is not None:
            self._apply(gone.trust_domain)

    def _apply(self, name: str) -> None:
        source = self.sources.get(name)
        if source is None:
            return
        if source.spec.issuer == self.local_issuer:
            log.warning(
                "TrustDomain %s ignored: %s is this cluster's own issuer, whose tokens the "
                "TokenReview checks",
                name,
                source.spec.issuer,
            )
            self.verifier.forget(name)
            return
        claims = (s.claim for s in self.sources.values() if s.spec.issuer == source.spec.issuer)
        owner = issuer_owners(claims)[source.spec.issuer]
        if owner.uid != source.uid:
            log.warning(
                "TrustDomain %s ignored: issuer %s belongs to TrustDomain %s, the oldest naming it",
                name,
                source.spec.issuer,
                owner.name,
            )
            self.verifier.forget(name)
            return
        record = self.records.get(source.uid)
        bound = record is not None and record.issuer == source.spec.issuer
        fetched = record.fetched() if record is not None and bound else None
        if not bound:  # only keys recorded for this very issuer serve (or the service's own)
            self.verifier.forget(name)
        try:
            self.verifier.trust(
                source.policy(),
                record.jwks if record is not None and bound else None,
                fetched_at=fetched.timestamp() if fetched else None,
                stale_after=float(source.spec.stale_after),
            )
        except ValueError as e:  # an API-server audience, an issuer of another domain
            log.warning("TrustDomain %s ignored: %s", name, e)
            self.verifier.forget(name)

    async def fetch(self, policy: TrustPolicy) -> Mapping[str, Any]:
        """An unknown kid's one refetch (at most a minute apart per issuer), straight
        from the issuer as the operator fetches: a rotation need not wait for its timer."""
        from o41.kube.trust_keys import fetch_keys

        source = self.sources.get(policy.trust_domain)
        if source is None:
            raise LookupError(f"trust domain {policy.trust_domain!r} is gone")
        return await fetch_keys(source.spec, allowed=self.allowed)
