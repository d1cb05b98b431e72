"""Where this process's collections go: this cluster's collections tier when the cluster
has one, else the hub, else nowhere but this process (issue 40). Artifacts always go to the
hub (``O41_ARTIFACTS_ENDPOINT``); ``sky.*`` code is the same whichever it is.

The environment (the remote chart's ConfigMap sets the first when it installs the tier):

============================== ==========================================================
``O41_COLLECTIONS_ENDPOINT``    the collections tier's URL; unset: the collections go to
                                ``O41_ARTIFACTS_ENDPOINT`` (the hub), and with neither
                                they are embedded in this process
``O41_COLLECTIONS_CA_FILE``     the CA bundle of an ``https://`` tier (default:
                                ``O41_ARTIFACTS_CA_FILE``'s)
``O41_COLLECTIONS_TOKEN_FILE``  the token's file for the tier (default: the artifacts'
                                token settings: one projected token, audience ``o41``,
                                serves both)
============================== ==========================================================

Standard library only (pods import it at start-up).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any, Literal

from o41.client.connection import ENV_ENDPOINT, Connection
from o41.client.tls import ENV_CA_FILE

ENV_COLLECTIONS_ENDPOINT = "O41_COLLECTIONS_ENDPOINT"
ENV_COLLECTIONS_CA_FILE = "O41_COLLECTIONS_CA_FILE"
ENV_COLLECTIONS_TOKEN_FILE = "O41_COLLECTIONS_TOKEN_FILE"  # noqa: S105 - a variable name

Where = Literal["tier", "hub", "embedded"]

__all__ = [
    "ENV_COLLECTIONS_CA_FILE",
    "ENV_COLLECTIONS_ENDPOINT",
    "ENV_COLLECTIONS_TOKEN_FILE",
    "CollectionsRoute",
    "TierConnection",
    "collections_route",
]


class TierConnection(Connection):
    """A :class:`Connection` to this cluster's collections tier: its errors name the tier,
    ``$O41_COLLECTIONS_ENDPOINT`` and the CA variable its bundle came from, not the hub's."""

    service = "the collections tier"
    named_by = ENV_COLLECTIONS_ENDPOINT

    def __init__(self, endpoint: str, **settings: Any) -> None:
        own = settings.get("ca_file") or os.environ.get(ENV_COLLECTIONS_CA_FILE)
        settings["ca_file"] = own or None  # None: O41_ARTIFACTS_CA_FILE's, as Connection reads it
        super().__init__(endpoint, **settings)
        self.ca_variable = ENV_COLLECTIONS_CA_FILE if own else ENV_CA_FILE

    def untrusted(self, error: BaseException, shown: str | None = None) -> str | None:
        if not isinstance(error, ssl.SSLCertVerificationError):
            return None
        why = f"certificate verify failed: {error.verify_message or error.reason}"
        where = f"the collections tier at {shown or self.url}"
        fix = (
            f"set {ENV_COLLECTIONS_CA_FILE} to the CA bundle of the tier's serving "
            "certificate (the remote chart's ConfigMap names it)"
        )
        if self.ca_file:
            return (
                f"{where} has a certificate that {self.ca_variable}={self.ca_file} does not "
                f"vouch for ({why}): {fix}"
            )
        return f"{where} has a certificate of a CA this machine does not trust ({why}): {fix}"


@dataclass(frozen=True)
class CollectionsRoute:
    """Where the collections go (``where``) and the connection there (None: embedded)."""

    where: Where
    connection: Connection | None

    @property
    def endpoint(self) -> str | None:
        return self.connection.endpoint if self.connection is not None else None

    @property
    def why(self) -> str:
        """Which setting chose it, as ``o41 status`` says it."""
        if self.where == "tier":
            return f"this cluster's collections tier, ${ENV_COLLECTIONS_ENDPOINT}"
        if self.where == "hub":
            return f"the hub, ${ENV_ENDPOINT}; ${ENV_COLLECTIONS_ENDPOINT} is not set"
        return f"neither ${ENV_COLLECTIONS_ENDPOINT} nor ${ENV_ENDPOINT} is set"

    def described(self) -> str:
        """``collections: <url> (<why>)``, or that they are embedded in this process."""
        if self.connection is None:
            return f"collections: embedded in this process ({self.why})"
        return f"collections: {self.endpoint} ({self.why})"


def collections_route(
    *, timeout: float | None = None, retry_deadline: float | None = None
) -> CollectionsRoute:
    """Where this process's collections go, from the environment (read now); ``timeout``
    and ``retry_deadline``: the connection's (default: as :class:`Connection` says)."""
    tier = os.environ.get(ENV_COLLECTIONS_ENDPOINT, "").strip()
    if tier:
        connection = TierConnection(
            tier,
            token_file=os.environ.get(ENV_COLLECTIONS_TOKEN_FILE) or None,
            timeout=timeout,
            retry_deadline=retry_deadline,
        )
        return CollectionsRoute("tier", connection)
    hub = Connection(timeout=timeout, retry_deadline=retry_deadline)
    if hub.endpoint:
        return CollectionsRoute("hub", hub)
    return CollectionsRoute("embedded", None)
