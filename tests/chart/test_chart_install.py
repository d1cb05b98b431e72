"""The chart in a real control plane: `helm install`, `upgrade`, `uninstall`, and the RBAC it
grants proved by running the real operator and placement service with its ServiceAccounts'
tokens.

kwok runs the pods (Running and Ready without pulling an image), so what is proved here is
what the API server and the controllers make of the chart; the product's own processes run
on 127.0.0.1 (testbed.product), with the tokens of the chart's ServiceAccounts.

One release per module, in a namespace of its own. While it is installed its webhook
configuration (failurePolicy Fail) points at an operator pod that kwok only pretends to
run, so nothing could change a Location: the process part below removes the configuration
first and runs the operator with --no-webhook (tests/operator/test_operator.py covers admission).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from test_chart import CHART, helm
from testbed.kube import Kube, kubectl_binary
from testbed.process import LOOPBACK, Server, free_port
from testbed.product import SAFE_ENV
from testbed.stores import S3Store

from support import token_kubeconfig as kubeconfig_for
from support import wait_for

pytestmark = [pytest.mark.kube]

CRD_NAMES = tuple(
    f"{plural}.artifacts.o41.io" for plural in ("locations", "organizations", "trustdomains")
)


@dataclass
class Release:
    kube: Kube
    name: str
    namespace: str
    directory: Path

    @property
    def fullname(self) -> str:
        # the chart's rule (o41.fullname): release o41 gives o41-artifacts, not o41-o41-artifacts
        chart = "o41-artifacts"
        if chart in self.name:
            return self.name
        return chart if chart.startswith(f"{self.name}-") else f"{self.name}-{chart}"

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [helm(), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
            env={**os.environ, "KUBECONFIG": str(self.kube.kubeconfig)},
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def get(self, kind: str, name: str, namespaced: bool = True) -> dict[str, Any]:
        ns = ["-n", self.namespace] if namespaced else []
        result: dict[str, Any] = json.loads(self.kube.kubectl("get", kind, name, *ns, "-o", "json"))
        return result

    COUNTS = ("replicas", "readyReplicas", "updatedReplicas")

    def not_ready(self) -> list[str]:
        """The Deployments and the StatefulSet not yet with every replica updated and
        ready (and observed at their generation), each with its counts."""
        found = []
        for kind in ("deployments", "statefulsets"):
            items = json.loads(self.kube.kubectl("get", kind, "-n", self.namespace, "-o", "json"))
            for item in items["items"]:
                want = item["spec"]["replicas"]
                status = item.get("status", {})
                counts = [
                    status.get(k, 0) for k in ("replicas", "readyReplicas", "updatedReplicas")
                ]
                observed = status.get("observedGeneration") == item["metadata"]["generation"]
                if not observed or counts != [want] * 3:
                    name = f"{kind}/{item['metadata']['name']}"
                    found.append(
                        f"{name}: want {want}, {self.COUNTS} {counts}, observed {observed}"
                    )
        return found

    def ready(self) -> bool:
        return not self.not_ready()

    def wait_ready(self, what: str) -> None:
        """Until every workload is ready; else fail with what is not, and why (the pods,
        the events), as a user would look."""
        try:
            wait_for(self.ready, timeout=300, what=what)  # a loaded machine: minutes
        except AssertionError as e:
            pods = self.kube.kubectl("get", "pods", "-n", self.namespace, "-o", "wide", check=False)
            events = self.kube.kubectl(
                "get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp", check=False
            )
            raise AssertionError(f"{e}\n{self.not_ready()}\n{pods}\n{events[-4000:]}") from None


@pytest.fixture(scope="module")
def release(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    name = "o41"
    namespace = f"o41-chart-{uuid.uuid4().hex[:6]}"
    rel = Release(kube, name, namespace, tmp_path_factory.mktemp("chart"))
    # no provisioner here: etcd on emptyDir (the PVC template is tested by rendering)
    installed = rel.helm(
        "install", name, str(CHART), "--namespace", namespace, "--create-namespace",
        "--set", "etcd.persistence.enabled=false",
    )  # fmt: skip
    (rel.directory / "install.out").write_text(installed.stdout)
    try:
        yield rel
    finally:
        rel.helm("uninstall", name, "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# --- the certificates Job (certificates.generator=job), its code run here ------------------


class Cluster(Protocol):
    """A cluster's admin kubeconfig and kubectl: the ``kube`` fixture's, or a ControlPlane's."""

    @property
    def kubeconfig(self) -> Path: ...

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str: ...


def run_the_job(
    kube: Cluster, namespace: str, job: dict[str, Any], where: Path
) -> subprocess.CompletedProcess[str]:
    """The Job's container's command, here, with the Job's ServiceAccount's token."""
    spec = job["spec"]["template"]["spec"]
    token = kube.kubectl(
        "create", "token", spec["serviceAccountName"], "-n", namespace, "--duration=1h"
    ).strip()
    config = kubeconfig_for(kube.kubeconfig, token, "certificates", where / "job.kubeconfig")
    (container,) = spec["containers"]
    assert container["args"][:3] == ["python", "-m", "o41.kube.certificates"]
    return subprocess.run(
        [sys.executable, *container["args"][1:],
         "--kubeconfig", str(config), "--wait-seconds", "30"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_install_makes_every_workload_ready_and_points_the_webhook_at_the_operator(
    release: Release,
) -> None:
    out = (release.directory / "install.out").read_text()
    assert "STATUS: deployed" in out
    endpoint = f"O41_ARTIFACTS_ENDPOINT=http://{release.fullname}-placement.{release.namespace}"
    assert endpoint in out, out  # NOTES.txt
    assert "etcd TLS: client certificates required, only the placement service holds one" in out
    assert "metrics ports (they name every organization) closed: name your scrapers" in out
    release.wait_ready("the release's workloads to be ready")

    operator = release.get("deployment", f"{release.fullname}-operator")
    assert operator["status"]["readyReplicas"] == 1
    available = {c["type"]: c["status"] for c in operator["status"]["conditions"]}
    assert available["Available"] == "True"
    assert (
        release.get("deployment", f"{release.fullname}-placement")["status"]["readyReplicas"] == 2
    )
    assert release.get("statefulset", f"{release.fullname}-etcd")["status"]["readyReplicas"] == 3
    for crd in CRD_NAMES:
        release.kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}")

    config = release.get(
        "validatingwebhookconfiguration",
        f"{release.fullname}.artifacts.o41.io",
        namespaced=False,
    )
    service = release.get("service", f"{release.fullname}-operator")
    secret = release.get("secret", f"{release.fullname}-webhook-tls")
    for hook in config["webhooks"]:
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (
            service["metadata"]["name"],
            release.namespace,
        )
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    # the Service selects the operator's pod, which serves the webhook port
    endpoints = json.loads(
        release.kube.kubectl(
            "get", "endpointslices", "-n", release.namespace,
            "-l", f"kubernetes.io/service-name={service['metadata']['name']}", "-o", "json",
        )
    )  # fmt: skip
    ports = {p["port"] for s in endpoints["items"] for p in s.get("ports") or []}
    addresses = [a for s in endpoints["items"] for a in s.get("endpoints") or []]
    assert ports == {9443}
    assert len(addresses) == 1
    # by default: etcd over TLS with the chart's certificates, and the NetworkPolicies
    etcd = release.get("statefulset", f"{release.fullname}-etcd")
    assert "--client-cert-auth" in etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    for role in ("server", "peer", "client"):
        data = release.get("secret", f"{release.fullname}-etcd-{role}-tls")["data"]
        assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
    policies = release.kube.kubectl("get", "networkpolicies", "-n", release.namespace, "-o", "name")
    assert sorted(policies.split()) == sorted(
        f"networkpolicy.networking.k8s.io/{release.fullname}-{c}"
        for c in ("etcd", "operator", "placement")
    )


def test_upgrade_with_changed_values_takes_effect_and_keeps_the_ca(release: Release) -> None:
    release.wait_ready("the release's workloads to be ready")
    ca_before = release.get("secret", f"{release.fullname}-webhook-tls")["data"]
    etcd_tls = [f"{release.fullname}-etcd-{role}-tls" for role in ("server", "peer", "client")]
    etcd_before = {name: release.get("secret", name)["data"] for name in etcd_tls}
    release.helm(
        "upgrade", release.name, str(CHART), "--namespace", release.namespace,
        "--reuse-values", "--set", "placement.replicas=3",
    )  # fmt: skip
    release.wait_ready("the upgraded workloads to be ready")
    placement = release.get("deployment", f"{release.fullname}-placement")
    assert placement["spec"]["replicas"] == 3
    assert placement["status"]["readyReplicas"] == 3
    # the generated CAs and certificates are looked up, not generated again
    assert release.get("secret", f"{release.fullname}-webhook-tls")["data"] == ca_before
    assert {name: release.get("secret", name)["data"] for name in etcd_tls} == etcd_before
    config = release.get(
        "validatingwebhookconfiguration",
        f"{release.fullname}.artifacts.o41.io",
        namespaced=False,
    )
    assert {h["clientConfig"]["caBundle"] for h in config["webhooks"]} == {ca_before["ca.crt"]}
    history = release.helm("history", release.name, "--namespace", release.namespace)
    assert "upgrade complete" in history.stdout.lower()


def test_an_upgrade_that_would_switch_etcds_tls_under_its_members_is_refused(
    release: Release,
) -> None:
    done = release.helm(
        "upgrade", release.name, str(CHART), "-n", release.namespace, "--reuse-values",
        "--set", "etcd.tls.enabled=false", check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "etcd.tls.enabled=false would change how the running etcd members" in done.stderr
    assert "keep etcd.tls.enabled=true" in done.stderr
    etcd = release.get("statefulset", f"{release.fullname}-etcd")
    assert "--client-cert-auth" in etcd["spec"]["template"]["spec"]["containers"][0]["args"]


def test_an_upgrade_with_one_etcd_tls_secret_missing_stops_and_with_none_makes_a_new_set(
    release: Release,
) -> None:
    names = [f"{release.fullname}-etcd-{role}-tls" for role in ("server", "peer", "client")]
    before = {name: release.get("secret", name)["data"] for name in names}
    upgrade = ("upgrade", release.name, str(CHART), "-n", release.namespace, "--reuse-values")
    release.kube.kubectl("delete", "secret", names[1], "-n", release.namespace)
    done = release.helm(*upgrade, check=False)
    assert done.returncode != 0
    assert f"etcd's TLS Secret {names[1]} is missing" in done.stderr
    assert "delete all three" in done.stderr
    for name in (names[0], names[2]):  # untouched: the members keep their certificates
        assert release.get("secret", name)["data"] == before[name]
    release.kube.kubectl("delete", "secret", names[0], names[2], "-n", release.namespace)
    release.helm(*upgrade)
    after = {name: release.get("secret", name)["data"] for name in names}
    assert all(after[name]["ca.crt"] != before[name]["ca.crt"] for name in names)
    assert after[names[0]]["ca.crt"] == after[names[2]]["ca.crt"]  # one clients' CA


# --- RBAC: the real processes with the chart's ServiceAccount tokens ------------------------


def token_kubeconfig(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that is that ServiceAccount: its token, the cluster's server and CA."""
    token = kube.kubectl("create", "token", account, "-n", namespace, "--duration=1h").strip()
    return kubeconfig_for(kube.kubeconfig, token, account, path)


def refusals(log: str) -> list[str]:
    """The lines of a log that tell of an RBAC refusal: the API server's ``... is forbidden:
    User "system:..." cannot VERB resource ...``, whichever client logged it. Not any 403:
    this operator also handles every other test's Locations, and a store's own 403 for one
    of them (AccessDenied, botocore's "(403) ... Forbidden") says nothing of the RBAC."""
    return [line for line in log.splitlines() if "is forbidden: User" in line]


def can_i(kubeconfig: Path, *args: str) -> bool:
    done = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", "auth", "can-i", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.stdout.strip() in ("yes", "no"), done.stdout + done.stderr
    return done.stdout.strip() == "yes"


def test_rbac_lets_the_operator_and_service_work_and_no_more(release: Release, s3: S3Store) -> None:
    kube, ns, full = release.kube, release.namespace, release.fullname
    operator_kc = token_kubeconfig(kube, ns, f"{full}-operator", release.directory / "op.kc")
    service_kc = token_kubeconfig(kube, ns, f"{full}-placement", release.directory / "svc.kc")

    # no more than needed
    assert can_i(operator_kc, "patch", "locations.artifacts.o41.io")
    assert can_i(operator_kc, "patch", "trustdomains.artifacts.o41.io", "--subresource=status")
    assert can_i(service_kc, "watch", "trustdomains.artifacts.o41.io")
    assert not can_i(service_kc, "patch", "trustdomains.artifacts.o41.io")
    assert not can_i(service_kc, "patch", "configmaps/o41-trust-x", "-n", ns)
    assert can_i(operator_kc, "get", "secrets", "-n", ns)
    assert can_i(service_kc, "create", "tokenreviews.authentication.k8s.io")
    # the operator's records: only it writes ConfigMaps there; the service reads them and
    # writes its counts ConfigMap alone, and no Location status
    assert can_i(operator_kc, "create", "configmaps", "-n", ns)
    assert can_i(operator_kc, "patch", "configmaps", "-n", ns)
    assert can_i(service_kc, "watch", "configmaps", "-n", ns)
    assert can_i(service_kc, "update", "configmaps/o41-version-counts", "-n", ns)
    assert not can_i(service_kc, "patch", "configmaps/o41-location-x", "-n", ns)
    assert not can_i(service_kc, "create", "configmaps", "-n", ns)
    assert not can_i(service_kc, "patch", "locations.artifacts.o41.io", "--subresource=status")
    assert not can_i(operator_kc, "create", "configmaps", "-n", "default")
    for kc in (operator_kc, service_kc):
        assert not can_i(kc, "delete", "locations.artifacts.o41.io")
        assert not can_i(kc, "create", "organizations.artifacts.o41.io")
        assert not can_i(kc, "get", "secrets", "-n", "default")
        assert not can_i(kc, "get", "secrets", "-n", "kube-system")
        assert not can_i(kc, "list", "secrets", "-n", ns)
        assert not can_i(kc, "create", "secrets", "-n", ns)
        assert not can_i(kc, "patch", "deployments.apps", "-n", ns)
        assert not can_i(kc, "create", "pods", "-n", ns)
        assert not can_i(kc, "patch", "validatingwebhookconfigurations")
    assert not can_i(service_kc, "patch", "organizations.artifacts.o41.io", "--subresource=status")
    assert not can_i(service_kc, "patch", "locations.artifacts.o41.io")
    assert not can_i(operator_kc, "create", "tokenreviews.authentication.k8s.io")

    # kwok's operator pod serves no webhook: take the configuration away (see module doc)
    kube.kubectl("delete", "validatingwebhookconfiguration", f"{full}.artifacts.o41.io")

    suffix = uuid.uuid4().hex[:6]
    org, loc, secret = f"chart-{suffix}", f"chart-aws-{suffix}", f"chart-s3-{suffix}"
    writers = f"writers-{suffix}"
    kube.kubectl("create", "namespace", writers)
    kube.kubectl("create", "serviceaccount", "job", "-n", writers)
    kube.kubectl(
        "create", "secret", "generic", secret, "-n", ns,
        f"--from-literal=accessKeyId={s3.access_key}",
        f"--from-literal=secretAccessKey={s3.secret_key}",
    )  # fmt: skip
    objects = [
        {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": org},
            "spec": {"namespaces": [writers]},
        },
        {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Location",
            "metadata": {"name": loc},
            "spec": {
                "organization": org,
                "cloud": "aws",
                "region": "us-east-1",
                "backend": {"s3": {"endpoint": s3.endpoint}},
                "credentials": {"secretName": secret},
            },
        },
    ]
    kube.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )

    liveness = f"http://{LOOPBACK}:{free_port()}/healthz"
    operator = Server(
        "chart-operator",
        [sys.executable, "-m", "o41.operator", "--no-webhook", "--liveness", liveness],
        release.directory / "operator.log",
        env={
            **SAFE_ENV,
            "KUBECONFIG": str(operator_kc),
            "O41_OPERATOR_NAMESPACE": ns,
            "O41_MAX_BACKOFF": "4",
        },
    ).start()
    port = free_port()
    service = Server(
        "chart-placement",
        [
            sys.executable, "-m", "o41.webhook", "--host", LOOPBACK, "--port", str(port),
            "--etcd", "", "--kubeconfig", str(service_kc), "--secrets-namespace", ns,
        ],
        release.directory / "placement.log",
        env=SAFE_ENV,
    )  # fmt: skip
    try:
        operator.wait_ready(lambda: _answers(liveness), timeout=60)

        def location_ready() -> bool:
            status = release.get("location", loc, namespaced=False).get("status") or {}
            return any(
                c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
            )

        wait_for(location_ready, timeout=90, what=f"Location {loc} Ready via the SA operator")
        wait_for(
            lambda: (
                (release.get("organization", org, namespaced=False).get("status") or {}).get(
                    "fallback"
                )
                == loc
            ),
            timeout=60,
            what="the organization's fallback",
        )
        # the whole log: this operator also handles every other test's Locations, so the
        # lines about this one need not be among the last few hundred
        log = (release.directory / "operator.log").read_text(errors="replace")
        assert not refusals(log), "\n".join(refusals(log)[:10])
        # this operator, with the chart's token, did the work (not another one running)
        done = (f"[{loc}] Creation is processed", f"[{loc}] Resuming is processed")
        assert any(line in log for line in done), operator.tail(200)
        events = kube.kubectl(
            "get", "events", "-A", "--field-selector", f"involvedObject.name={loc}"
        )
        assert loc in events

        # the service: lists and watches (readyz), TokenReview + Secret (a whole write)
        service.start().wait_ready(lambda: _answers(f"http://{LOOPBACK}:{port}/readyz"), 60)
        token = release.directory / "job.token"
        token.write_text(kube.kubectl("create", "token", "job", "-n", writers).strip())
        data = release.directory / "model.bin"
        data.write_bytes(os.urandom(4096))
        env = {
            **os.environ,
            **SAFE_ENV,
            "O41_ARTIFACTS_CLOUD": "aws",
            "O41_ARTIFACTS_REGION": "us-east-1",
        }
        common = ["--endpoint", f"http://{LOOPBACK}:{port}", "--token-file", str(token)]
        o41 = [sys.executable, "-m", "o41.cli"]
        wrote = subprocess.run(
            [*o41, "write", "--org", org, "--artifact", "model", str(data), "--json", *common],
            capture_output=True, text=True, check=False, timeout=120, env=env,
        )  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr + service.tail(50)
        version = json.loads(wrote.stdout)["version"]
        assert json.loads(wrote.stdout)["location"] == loc
        out = release.directory / "back.bin"
        read = subprocess.run(
            [*o41, "read", "--org", org, "--artifact", "model", "--version", version,
             "--output", str(out), "--json", *common],
            capture_output=True, text=True, check=False, timeout=120, env=env,
        )  # fmt: skip
        assert read.returncode == 0, read.stderr + service.tail(50)
        assert out.read_bytes() == data.read_bytes()
        # the count, written by the service to its ConfigMap, copied by the operator
        wait_for(
            lambda: (
                (release.get("location", loc, namespaced=False).get("status") or {}).get("versions")
                == 1
            ),
            timeout=60,
            what="status.versions to show the version",
        )
        slog = service.tail(400)
        assert not refusals(slog), "\n".join(refusals(slog)[:10])
    finally:
        service.stop()
        operator.stop()
        kube.kubectl("delete", "namespace", writers, "--wait=false", check=False)


def test_an_upgrade_to_the_certificates_job_keeps_helms_certificates_once_marked_kept(
    release: Release,
) -> None:
    """certificates.generator=job on a release whose certificates Helm made: the upgrade's
    render has none of those Secrets, so Helm would delete them and the Job would make a
    new set under the running members; it is refused, saying how to keep them, and once
    they are marked kept the upgrade leaves them and the Job's code keeps them."""
    names = [f"{release.fullname}-webhook-tls"]
    names += [f"{release.fullname}-etcd-{role}-tls" for role in ("server", "peer", "client")]
    before = {name: release.get("secret", name)["data"] for name in names}
    upgrade = ("upgrade", release.name, str(CHART), "-n", release.namespace, "--reuse-values",
               "--set", "certificates.generator=job")  # fmt: skip
    done = release.helm(*upgrade, check=False)
    assert done.returncode != 0
    advice = f"kubectl -n {release.namespace} annotate secret {' '.join(names)} "
    assert advice + "helm.sh/resource-policy=keep" in done.stderr, done.stderr
    assert {name: release.get("secret", name)["data"] for name in names} == before
    release.kube.kubectl("annotate", "secret", *names, "-n", release.namespace,
                         "helm.sh/resource-policy=keep")  # fmt: skip
    release.helm(*upgrade)
    assert {name: release.get("secret", name)["data"] for name in names} == before
    manifest = release.helm("get", "manifest", release.name, "-n", release.namespace).stdout
    (job,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Job"]
    kept = run_the_job(release.kube, release.namespace, job, release.directory)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "etcd TLS: kept" in kept.stdout and "webhook TLS: kept" in kept.stdout
    assert {name: release.get("secret", name)["data"] for name in names} == before
    config = release.get(
        "validatingwebhookconfiguration", f"{release.fullname}.artifacts.o41.io", namespaced=False
    )
    assert {h["clientConfig"]["caBundle"] for h in config["webhooks"]} == {
        before[names[0]]["ca.crt"]
    }


def test_uninstall_removes_the_release_and_keeps_the_crds_and_custom_resources(
    release: Release,
) -> None:
    kube = release.kube
    keep = f"kept-{uuid.uuid4().hex[:6]}"
    # kwok's operator pod serves no webhook: without its configuration the API server
    # takes the Organization (the release's CRDs and the objects must outlive it)
    kube.kubectl(
        "delete", "validatingwebhookconfiguration", f"{release.fullname}.artifacts.o41.io",
        "--ignore-not-found",
    )  # fmt: skip
    organization = {
        "apiVersion": "artifacts.o41.io/v1alpha1",
        "kind": "Organization",
        "metadata": {"name": keep},
        "spec": {"namespaces": ["default"]},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(organization))
    release.helm("uninstall", release.name, "--namespace", release.namespace)
    assert release.helm("status", release.name, "-n", release.namespace, check=False).returncode
    for kind in ("deployments", "statefulsets", "services", "roles", "serviceaccounts"):
        left = kube.kubectl("get", kind, "-n", release.namespace, "-o", "name")
        assert release.fullname not in left, (kind, left)
    # cluster-wide, by owner: the release's name is a substring of others' (release o41
    # gives o41-artifacts, which the test bed's own webhook, o41-artifacts.o41.io, holds)
    for kind in ("clusterroles", "clusterrolebindings", "validatingwebhookconfigurations"):
        items = json.loads(kube.kubectl("get", kind, "-o", "json"))["items"]
        owned = [
            i["metadata"]["name"]
            for i in items
            if (i["metadata"].get("annotations") or {}).get("meta.helm.sh/release-namespace")
            == release.namespace
        ]
        assert owned == [], (kind, owned)
    for crd in CRD_NAMES:  # Helm never deletes what it installed from crds/
        kube.kubectl("get", "crd", crd)
    assert kube.kubectl("get", "organization", keep, "-o", "name") == (
        f"organization.artifacts.o41.io/{keep}\n"
    )
    kube.kubectl("delete", "organization", keep)


def _answers(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=1) as r:
        return bool(r.status == 200)
