"""Service tokens (``o41.core.service_tokens``) in the cluster: the signing key in a Secret
of the service's namespace, one ConfigMap per token as its record (what lists and
revokes it; never the token itself). Shared by the CLI (``kubectl o41 token``, with a
platform admin's kubeconfig: whoever may read that Secret may mint tokens) and the
placement service (verifies), which never import each other.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from joserfc import jwt
from joserfc.jwk import ECKey

from o41.core.service_tokens import (
    ALGORITHM,
    Issued,
    check_subject,
    claims_for,
    issuer_for,
)
from o41.kube.location_record import KIND_LABEL

SECRET = "o41-service-tokens"  # noqa: S105 - a Secret's name
KEY_FIELD = "signing-key.pem"
PREFIX = "o41-token-"
KIND = "service-token"
SELECTOR = f"{KIND_LABEL}={KIND}"


def new_signing_key() -> bytes:
    """A P-256 private key, PEM (ES256)."""
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def signing_key(pem: bytes | str) -> ECKey:
    key = ECKey.import_key(pem)
    if key.curve_name != "P-256" or not key.is_private:
        raise ValueError(f"the {SECRET} Secret's {KEY_FIELD} is not a P-256 private key")
    return key


def kid_of(key: ECKey) -> str:
    return key.thumbprint()


def sign(key: ECKey, namespace: str, issued: Issued) -> str:
    header = {"alg": ALGORITHM, "kid": kid_of(key), "typ": "JWT"}
    return jwt.encode(header, claims_for(issuer_for(namespace), issued), key, [ALGORITHM])


def record_name(token_id: str) -> str:
    return PREFIX + token_id


def record(issued: Issued, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(issued.id),
            "namespace": namespace,
            "labels": {
                KIND_LABEL: KIND,
                "app.kubernetes.io/part-of": "o41-artifacts",
                "artifacts.o41.io/organization": issued.organization,
            },
        },
        "data": {
            "id": issued.id,
            "organization": issued.organization,
            "subject": issued.subject,
            "expires": str(issued.expires),
            "created": str(issued.created),
        },
    }


def parse_record(configmap: Mapping[str, Any]) -> Issued | None:
    """The token a record names, or None when it is not one."""
    meta = configmap.get("metadata") or {}
    data: Mapping[str, str] = configmap.get("data") or {}
    name = str(meta.get("name") or "")
    if (meta.get("labels") or {}).get(KIND_LABEL) != KIND or name != record_name(
        str(data.get("id"))
    ):
        return None
    try:
        return Issued(
            data["id"],
            data["organization"],
            data["subject"],
            int(data["expires"]),
            int(data["created"]),
        )
    except (KeyError, ValueError):
        return None


class TokenAdmin:
    """Create, list and revoke service tokens through the Kubernetes API (synchronous:
    the CLI's)."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api)
        self._objects = client.CustomObjectsApi(api)
        self.namespace = namespace

    def create(self, organization: str, subject: str, ttl: int) -> tuple[str, Issued]:
        """A new token (returned once, never stored) and its record."""
        from o41.kube.api import GROUP, VERSION

        check_subject(subject)
        self._objects.get_cluster_custom_object(GROUP, VERSION, "organizations", organization)
        now = int(time.time())
        issued = Issued(secrets.token_hex(8), organization, subject, now + ttl, now)
        key = self._key()
        self._core.create_namespaced_config_map(
            self.namespace,
            record(issued, self.namespace),  # type: ignore[arg-type]
        )
        return sign(key, self.namespace, issued), issued

    def list(self) -> list[Issued]:
        found = self._core.list_namespaced_config_map(self.namespace, label_selector=SELECTOR)
        plain = self._core.api_client.sanitize_for_serialization
        issued = (parse_record(plain(cm)) for cm in found.items)
        return sorted((i for i in issued if i is not None), key=lambda i: i.created)

    def revoke(self, token_id: str) -> bool:
        """Delete its record: the service refuses the token within seconds (its watch)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.delete_namespaced_config_map(record_name(token_id), self.namespace)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def _key(self) -> ECKey:
        """The signing key, made on first use (409: another admin made it meanwhile)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            found = self._core.read_namespaced_secret(SECRET, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            body = client.V1Secret(
                metadata=client.V1ObjectMeta(
                    name=SECRET, labels={"app.kubernetes.io/part-of": "o41-artifacts"}
                ),
                string_data={KEY_FIELD: new_signing_key().decode()},
            )
            try:
                self._core.create_namespaced_secret(self.namespace, body)
            except ApiException as e2:
                if e2.status != 409:
                    raise
            found = self._core.read_namespaced_secret(SECRET, self.namespace)
        return signing_key(base64.b64decode((found.data or {})[KEY_FIELD]))
