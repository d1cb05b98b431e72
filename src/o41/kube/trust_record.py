"""The operator's record of a TrustDomain's keys: what the placement service trusts.

The operator fetches each TrustDomain's public keys (one fetch for all the service's
replicas) and keeps the last good ones in a ConfigMap of its namespace, which only it may
write; the service verifies tokens with those. A TrustDomain's status is user-writable,
so it only shows what happened (Ready, the kids): no key is ever taken from it. Shared
here so that ``o41.operator`` (writes it) and ``o41.webhook`` (reads it) never import each
other, as ``o41.kube.location_record``.

The record is bound to the TrustDomain's uid (named after it, carrying it, owned by it)
and carries the issuer it was fetched for: the service uses it only for a TrustDomain of
that uid and that issuer, so a TrustDomain deleted and made again with another issuer
inherits no key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from o41.core.trust import IssuerClaim
from o41.kube.api import API_VERSION
from o41.kube.location_record import KIND_LABEL

PREFIX = "o41-trust-"
KIND = "trust-domain"
SELECTOR = f"{KIND_LABEL}={KIND}"
TRUST_DOMAIN_ANNOTATION = "artifacts.o41.io/trust-domain"


def record_name(uid: str) -> str:
    return PREFIX + uid


@dataclass(frozen=True, slots=True)
class TrustRecord:
    uid: str
    trust_domain: str
    issuer: str
    jwks: Mapping[str, Any] = field(default_factory=dict)  # {"keys": [...]}, last good
    fetched_at: str | None = None  # RFC 3339, UTC: the last successful fetch

    def fetched(self) -> datetime | None:
        if self.fetched_at is None:
            return None
        try:
            when = datetime.fromisoformat(self.fetched_at)
        except ValueError:
            return None
        return when if when.tzinfo else when.replace(tzinfo=UTC)

    def key_ids(self) -> list[str]:
        return sorted(str(k.get("kid")) for k in self.jwks.get("keys") or () if k.get("kid"))

    def data(self) -> dict[str, str]:
        found = {
            "uid": self.uid,
            "trustDomain": self.trust_domain,
            "issuer": self.issuer,
            "jwks": json.dumps(self.jwks, sort_keys=True),
        }
        if self.fetched_at is not None:
            found["fetchedAt"] = self.fetched_at
        return found

    def configmap(self, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": record_name(self.uid),
                "namespace": namespace,
                "labels": {KIND_LABEL: KIND, "app.kubernetes.io/part-of": "o41-artifacts"},
                "annotations": {TRUST_DOMAIN_ANNOTATION: self.trust_domain},
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": "TrustDomain",
                        "name": self.trust_domain,
                        "uid": self.uid,
                    }
                ],
            },
            "data": self.data(),
        }


def parse(configmap: Mapping[str, Any]) -> TrustRecord | None:
    """The record a ConfigMap holds, or None when it is not one (wrong label, a uid not
    the one its name is bound to, keys that are not a JWKS)."""
    meta = configmap.get("metadata") or {}
    name = str(meta.get("name") or "")
    data: Mapping[str, str] = configmap.get("data") or {}
    if (meta.get("labels") or {}).get(KIND_LABEL) != KIND or not name.startswith(PREFIX):
        return None
    uid = name.removeprefix(PREFIX)
    if not uid or data.get("uid") != uid or not data.get("issuer"):
        return None
    try:
        jwks = json.loads(data.get("jwks") or "{}")
    except ValueError:
        return None
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys", []), list):
        return None
    return TrustRecord(
        uid=uid,
        trust_domain=str(data.get("trustDomain") or ""),
        issuer=str(data["issuer"]),
        jwks=jwks,
        fetched_at=data.get("fetchedAt") or None,
    )


def issuer_claim(trust_domain: Mapping[str, Any]) -> IssuerClaim | None:
    """A TrustDomain object's claim on its issuer (``o41.core.trust.issuer_owners``), from
    what no user can write: its creationTimestamp and uid, its name. None without an
    issuer (a spec the CRD should have refused)."""
    meta = trust_domain.get("metadata") or {}
    issuer = (trust_domain.get("spec") or {}).get("issuer")
    if not isinstance(issuer, str) or not issuer:
        return None
    created = str(meta.get("creationTimestamp") or "")  # a string, or a client's datetime
    return IssuerClaim(issuer, str(meta.get("name") or ""), str(meta.get("uid") or ""), created)
