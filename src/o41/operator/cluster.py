"""The few Kubernetes API calls the operator makes itself (kopf makes the rest).

Synchronous: called from kopf's sync handlers (which run in threads) or via
``asyncio.to_thread``, never directly on the event loop.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from o41.kube.api import GROUP, VERSION
from o41.kube.trust_keys import own_issuer

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def operator_namespace() -> str:
    """Where the operator reads Locations' credential Secrets (its own namespace)."""
    explicit = os.environ.get("O41_OPERATOR_NAMESPACE")
    if explicit:
        return explicit
    if SA_NAMESPACE.exists():
        return SA_NAMESPACE.read_text().strip()
    return "o41-system"


class SecretMissing(Exception):
    """The Secret or one of its keys is not there; the message says which."""


@dataclass
class Cluster:
    namespace: str

    @cached_property
    def _api(self) -> Any:
        from kubernetes import client, config

        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()

    def own_issuer(self, given: str | None) -> tuple[str | None, str]:
        """This cluster's issuer, and where it was learnt (``o41.kube.trust_keys.own_issuer``:
        given, this pod's token, else the API server's discovery, asked with our
        credentials)."""
        return own_issuer(given, self._api)

    def read_secret(self, name: str) -> dict[str, str]:
        """The Secret's data, decoded. Never logged."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            secret = client.CoreV1Api(self._api).read_namespaced_secret(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                raise SecretMissing(
                    f"Secret {self.namespace}/{name} does not exist: create it in the "
                    f"operator's namespace {self.namespace!r}"
                ) from None
            raise
        data = secret.data or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CustomObjectsApi(self._api).patch_cluster_custom_object_status(
                GROUP, VERSION, plural, name, {"status": status}
            )
        except ApiException as e:
            if e.status != 404:  # gone meanwhile: nothing to show status on
                raise

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        from kubernetes import client

        client.CoreV1Api(self._api).create_namespaced_event(namespace, body)  # type: ignore[arg-type]  # a dict body is sent as is

    # --- ConfigMaps in the operator's namespace: its records, the placement's counts -----

    def read_configmap(self, name: str) -> dict[str, Any] | None:
        """The ConfigMap as a plain dict, None when it does not exist."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            found = client.CoreV1Api(self._api).read_namespaced_config_map(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        result: dict[str, Any] = self._api.sanitize_for_serialization(found)
        return result

    def list_configmaps(self, selector: str) -> list[dict[str, Any]]:
        from kubernetes import client

        found = client.CoreV1Api(self._api).list_namespaced_config_map(
            self.namespace, label_selector=selector
        )
        items: list[dict[str, Any]] = self._api.sanitize_for_serialization(found)["items"]
        return items

    def create_configmap(self, body: dict[str, Any]) -> bool:
        """Create it; False when one of that name exists already."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CoreV1Api(self._api).create_namespaced_config_map(self.namespace, body)  # type: ignore[arg-type]  # a dict body is sent as is
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def patch_configmap(self, name: str, body: dict[str, Any]) -> bool:
        """Merge ``body`` into the ConfigMap (None removes a key); False when it does not
        exist."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CoreV1Api(self._api).patch_namespaced_config_map(name, self.namespace, body)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def list_locations(self) -> list[dict[str, Any]]:
        """Every Location, read now (admission must not trust a lagging cache)."""
        return self.list_objects("locations")

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        """Every object of one of our resources (``locations``, ``organizations``), now."""
        from kubernetes import client

        found: dict[str, Any] = client.CustomObjectsApi(self._api).list_cluster_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, plural
        )
        items: list[dict[str, Any]] = found["items"]
        return items
