"""The placement service's settings (``python -m o41.webhook``'s flags, the chart's values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

from o41.core.addresses import Network
from o41.state import EtcdTls
from o41.webhook.http.tls import ServingTls


@dataclass(frozen=True)
class Settings:
    etcd_endpoints: list[str] = field(default_factory=list)  # empty: the embedded store
    etcd_tls: EtcdTls | None = None  # for https:// endpoints
    # the collections' own etcd in the full service (--collections-etcd; the same TLS
    # files); empty: the collections share the index's store, as before issue 40
    collections_etcd_endpoints: list[str] = field(default_factory=list)
    kubeconfig: str | None = None  # None: in-cluster, else $KUBECONFIG
    secrets_namespace: str = "o41-system"
    authentication: Literal["tokenreview", "none"] = "tokenreview"
    audiences: list[str] = field(default_factory=list)
    usage_interval: float = 5.0
    usage_hourly_days: int = 14  # hourly usage counters kept (the chart's usage.retention)
    usage_daily_days: int = 400  # daily usage counters kept
    store_timeout: float = 5.0
    # None: /metrics on the service's port, unless that port is TLS (the exposed one, and
    # /metrics names every organization): then nowhere
    metrics_address: tuple[str, int] | None = None
    retention_interval: float = 600.0  # seconds between passes over every covered artifact
    tls: ServingTls | None = None  # HTTPS on the service's port (the metrics port stays HTTP)
    # the /usage page (a token form and a cookie): off where the port is exposed outside the
    # cluster (the chart's placement.usagePage.exposed); /v1/usage answers either way
    usage_page: bool = True
    # etcd snapshots (o41.webhook.backups): the organization whose fallback location keeps
    # them (empty: off), seconds between them, how many are kept, where the temporary file goes
    backup_organization: str = ""
    backup_interval: float = 3600.0
    backup_keep: int = 14
    backup_dir: str | None = None  # None: the system's temporary directory
    # this cluster's service account issuer, which no TrustDomain may name (None: learnt at
    # start, o41.kube.trust_keys.own_issuer); the networks beyond the public ones an issuer's
    # keys may be fetched from (the chart's trustDomains.allowedNetworks)
    own_issuer: str | None = None
    trust_allowed: tuple[Network, ...] = ()


SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
