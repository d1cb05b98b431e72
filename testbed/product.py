"""The product's own processes on the test bed: the operator and the placement service.

Shared by the pytest fixtures, ``make demo`` and the benchmarks, so each starts them the
same way: on 127.0.0.1, with no route to a real cloud's metadata address.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import o41
from testbed.kube import apply, kubectl
from testbed.pki import Authority
from testbed.process import LOOPBACK, Server, free_port, port_open, wait_until
from testbed.stores import AzureStore, GcsStore, S3Store

NAMESPACE = "o41-system"
WEBHOOK_CONFIG = "o41-artifacts.o41.io"
CRDS = Path(__file__).resolve().parents[1] / "crds"
SAFE_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask a real metadata address
    "NO_PROXY": "*",
    "MALLOC_ARENA_MAX": "2",  # as the chart sets it: fewer malloc arenas, less RSS
}
# The test bed's other clusters' issuers listen on loopback: the operator and the service
# may fetch keys there (the chart's trustDomains.allowedNetworks; never link-local)
TRUST_ENV = {"O41_TRUST_ALLOWED_NETWORKS": "127.0.0.0/8"}


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - our own loopback URL
        return bool(r.status == 200)


def store_secrets(
    kubeconfig: Path,
    s3: S3Store | None = None,
    gcs: GcsStore | None = None,
    azure: AzureStore | None = None,
) -> dict[str, str]:
    """The stand-ins' credentials as Secrets in the operator's namespace, in the keys a
    Location's credentials name; returns backend -> Secret name."""
    from testbed.examples import secrets

    kubectl(kubeconfig, "create", "namespace", NAMESPACE, check=False)
    made = secrets(s3, gcs, azure)
    apply(kubeconfig, *made)
    return {m["metadata"]["name"].removeprefix("creds-"): m["metadata"]["name"] for m in made}


def install_crds(kubeconfig: Path) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(CRDS))
    for plural in ("locations", "organizations", "trustdomains"):
        crd = f"crd/{plural}.artifacts.o41.io"
        kubectl(kubeconfig, "wait", "--for=condition=Established", crd, "--timeout=60s")


class _Process:
    """What the test bed's product processes share: stopped (SIGTERM) or killed
    (SIGKILL: no chance to write anything out) by the pid of their server."""

    server: Server | None

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@dataclass
class OperatorProcess(_Process):
    """``python -m o41.operator`` with its admission webhook on loopback, signed by a
    throwaway CA, managing its ValidatingWebhookConfiguration. Can be killed and started."""

    kubeconfig: Path
    directory: Path
    check_interval: float = 5.0
    max_backoff: float = 4.0
    trust_refresh: float = 2.0  # seconds between fetches of a TrustDomain's keys
    log_format: str = "text"
    server: Server | None = field(default=None, repr=False)
    starts: int = 0
    readiness: str = ""  # its /readyz URL, once started
    metrics_port: int = field(default_factory=free_port)

    @property
    def metrics_url(self) -> str:
        """The operator's ``/metrics``."""
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    def start(self) -> OperatorProcess:
        ca = Authority.create(self.directory / "pki")
        cert = ca.issue("webhook", LOOPBACK, ips=(LOOPBACK,), dns=("localhost",))
        liveness = f"http://{LOOPBACK}:{free_port()}/healthz"
        self.readiness = f"http://{LOOPBACK}:{free_port()}/readyz"
        webhook_port = free_port()
        self.starts += 1
        self.server = Server(
            f"operator#{self.starts}",
            [
                sys.executable,
                "-m",
                "o41.operator",
                "--webhook-addr",
                LOOPBACK,
                "--webhook-port",
                str(webhook_port),
                "--webhook-cert",
                str(cert.cert),
                "--webhook-key",
                str(cert.key),
                "--webhook-ca",
                str(ca.cert_path),
                "--webhook-managed",
                WEBHOOK_CONFIG,
                "--liveness",
                liveness,
                "--readiness",
                self.readiness,
                "--log-format",
                self.log_format,
                "--metrics-port",
                str(self.metrics_port),
            ],
            self.directory / f"operator-{self.starts}.log",
            env={
                **SAFE_ENV,
                **TRUST_ENV,
                "KUBECONFIG": str(self.kubeconfig),
                "O41_OPERATOR_NAMESPACE": NAMESPACE,
                "O41_LOCATION_CHECK_INTERVAL": str(self.check_interval),
                "O41_MAX_BACKOFF": str(self.max_backoff),
                "O41_TRUST_REFRESH_INTERVAL": str(self.trust_refresh),
            },
        ).start()
        self.server.wait_ready(lambda: _answers(liveness), timeout=60)
        wait_until(
            lambda: _answers(self.readiness),
            timeout=60,
            what="the operator to be ready",
            interval=0.2,
        )
        wait_until(
            lambda: self._webhook_points_at(f"{LOOPBACK}:{webhook_port}"),
            timeout=60,
            what="the webhook configuration to point at this operator",
        )
        return self

    def _webhook_points_at(self, address: str) -> bool:
        """Whether every webhook calls ``address`` (not a previous, killed operator's)."""
        raw = kubectl(
            self.kubeconfig,
            "get",
            "validatingwebhookconfiguration",
            WEBHOOK_CONFIG,
            "-o",
            "json",
            check=False,
        )
        urls = [
            w["clientConfig"].get("url", "") for w in json.loads(raw or "{}").get("webhooks", [])
        ]
        return bool(urls) and all(f"//{address}/" in u for u in urls)

    def log(self) -> str:
        return self.server.tail(200) if self.server else ""


@dataclass
class CollectionsProcess(_Process):
    """``python -m o41.webhook.collections`` on loopback: the collections alone, without
    authentication, their state in etcd (the tests that kill it, the benchmark)."""

    etcd_endpoints: list[str]
    log: Path
    extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # more of the service's environment
    port: int = field(default_factory=free_port)
    server: Server | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        source = str(Path(o41.__file__).resolve().parents[1])  # the o41 this process runs
        self.server = Server(
            "collections service",
            [
                sys.executable,
                "-m",
                "o41.webhook.collections",
                "--port",
                str(self.port),
                "--etcd",
                ",".join(self.etcd_endpoints),
                *self.extra,
            ],
            self.log,
            env={
                **SAFE_ENV,
                "PYTHONPATH": source + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **self.env,
            },
        ).start()
        self.server.wait_ready(lambda: port_open(self.port), timeout=60)
        return self


@dataclass
class PlacementProcess(_Process):
    """``python -m o41.webhook`` on loopback, its state in etcd (or embedded)."""

    kubeconfig: Path
    etcd_endpoints: list[str]
    directory: Path
    port: int = field(default_factory=free_port)
    log_format: str = "text"
    server: Server | None = field(default=None, repr=False)
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # more environment (O41_OWN_ISSUER)
    extra: tuple[str, ...] = ()  # more flags (--collections-etcd)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> PlacementProcess:
        self.starts += 1
        self.server = Server(
            f"placement#{self.starts}",
            [
                sys.executable,
                "-m",
                "o41.webhook",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--etcd",
                ",".join(self.etcd_endpoints),
                "--kubeconfig",
                str(self.kubeconfig),
                "--secrets-namespace",
                NAMESPACE,
                "--log-format",
                self.log_format,
                *self.extra,
            ],
            self.directory / f"placement-{self.starts}.log",
            env={**SAFE_ENV, **TRUST_ENV, **self.env},
        ).start()
        self.server.wait_ready(lambda: _answers(f"{self.url}/readyz"), timeout=60)
        return self


@dataclass
class TierProcess(_Process):
    """``python -m o41.webhook --serve collections`` on loopback: a workload cluster's
    collections tier (issue 40), its pods' tokens checked by that cluster's TokenReview
    (``kubeconfig``, ``audience``), its state in its own etcd."""

    kubeconfig: Path
    etcd_endpoints: list[str]
    directory: Path
    audience: str = "o41"
    port: int = field(default_factory=free_port)
    server: Server | None = field(default=None, repr=False)
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # O41_TLS_CERT_FILE/KEY_FILE: HTTPS
    extra: tuple[str, ...] = ()  # more flags (--authentication none)
    ca_file: Path | None = None  # the CA of its serving certificate, when HTTPS

    @property
    def url(self) -> str:
        scheme = "https" if self.env.get("O41_TLS_CERT_FILE") else "http"
        return f"{scheme}://{LOOPBACK}:{self.port}"

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        with urllib.request.urlopen(f"{self.url}/readyz", timeout=1, context=context) as r:  # noqa: S310 - our own loopback URL
            return bool(r.status == 200)

    def start(self) -> Self:
        self.starts += 1
        self.server = Server(
            f"collections tier#{self.starts}",
            [
                sys.executable,
                "-m",
                "o41.webhook",
                "--serve",
                "collections",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--etcd",
                ",".join(self.etcd_endpoints),
                "--kubeconfig",
                str(self.kubeconfig),
                "--audience",
                self.audience,
                *self.extra,
            ],
            self.directory / f"tier-{self.starts}.log",
            env={**SAFE_ENV, **self.env},
        ).start()
        self.server.wait_ready(self._ready, timeout=60)
        return self
