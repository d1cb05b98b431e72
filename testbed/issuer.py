"""Another cluster's token issuer, in memory: its signing key, its JWKS, and pods' projected
tokens signed as a kube-apiserver signs them (tests/placement/test_trust_service.py,
bench/trust.py). The end-to-end tests use a real second kube-apiserver instead."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jwt
from joserfc.jwk import RSAKey


def rsa_key() -> RSAKey:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return RSAKey.import_key(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@dataclass
class Issuer:
    """An issuer at ``url`` signing with one RSA key named ``kid``."""

    url: str
    kid: str = "key-1"
    key: RSAKey = field(default_factory=rsa_key)

    def jwks(self) -> dict[str, Any]:
        return {"keys": [{**self.key.as_dict(private=False), "kid": self.kid, "use": "sig"}]}

    def claims(
        self,
        namespace: str,
        service_account: str = "default",
        *,
        audience: str | list[str] = "o41",
        lifetime: int = 3600,
        now: float | None = None,
        **changes: Any,
    ) -> dict[str, Any]:
        """A pod's projected token's claims, as a kube-apiserver writes them; ``changes``
        replace claims (None removes one)."""
        at = int(time.time() if now is None else now)
        found: dict[str, Any] = {
            "iss": self.url,
            "aud": [audience] if isinstance(audience, str) else audience,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "exp": at + lifetime,
            "nbf": at,
            "iat": at,
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": service_account, "uid": str(uuid.uuid4())},
                "pod": {"name": f"{service_account}-0", "uid": str(uuid.uuid4())},
            },
        }
        found.update(changes)
        return {k: v for k, v in found.items() if v is not None}

    def token(self, namespace: str, service_account: str = "default", **changes: Any) -> str:
        return self.sign(self.claims(namespace, service_account, **changes))

    def sign(self, claims: dict[str, Any], *, kid: str | None = None) -> str:
        header = {"alg": "RS256", "kid": kid or self.kid}
        return jwt.encode(header, claims, self.key, algorithms=["RS256"])
