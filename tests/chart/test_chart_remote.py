"""The o41-remote chart (issue 31, point 4): a workload cluster's side of a hub. Rendered
with `helm template`, refused with words, and installed for real into a second control
plane, where its opt-in binding is what lets the hub fetch that cluster's keys by
discovery (`kubectl o41 cluster add` then chooses discovery, not keys inline)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from test_chart import REPO, helm, run_helm
from test_chart_install import run_the_job
from testbed.kube import SELF, ControlPlane, bin_dir
from testbed.pki import Authority

REMOTE = REPO / "charts" / "o41-remote"
HUB = "https://hub.example.com:30443"


def render(*args: str) -> list[dict[str, object]]:
    done = run_helm("template", "w", str(REMOTE), "--namespace", "ml", *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_it_renders_the_hubs_url_and_ca_for_pods_and_no_binding_by_default(
    tmp_path: Path,
) -> None:
    ca = Authority.create(tmp_path / "pki").cert_path
    docs = render("--set", f"hub.endpoint={HUB}", "--set-file", f"hub.caBundle={ca}")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [  # type: ignore[index]
        ("ConfigMap", "w-o41-remote-hub")
    ]
    data = docs[0]["data"]
    assert data == {"endpoint": HUB, "audience": "o41", "ca.crt": ca.read_text()}

    docs = render("--set", f"hub.endpoint={HUB}", "--set", "publicIssuerDiscovery=true")
    binding = docs[1]
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["roleRef"]["name"] == "system:service-account-issuer-discovery"  # type: ignore[index]
    assert binding["subjects"] == [  # only the discovery role, to anonymous callers
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}
    ]
    assert "ca.crt" not in docs[0]["data"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "hub.endpoint is required"),
        (("--set", "hub.endpoint=http://hub.example.com"), "does not match pattern"),
        (
            ("--set", f"hub.endpoint={HUB}", "--set", "hub.caBundle=not-a-pem"),
            "hub.caBundle must be PEM certificates",
        ),
    ],
)
def test_bad_values_are_refused_with_what_to_set(args: tuple[str, ...], said: str) -> None:
    done = run_helm("template", "w", str(REMOTE), *args)
    assert done.returncode != 0 and said in done.stderr, done.stderr


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("workload"), bin_dir(), nodes=0, issuer=SELF)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def planned_keys(plane: ControlPlane) -> dict[str, object]:
    """What `kubectl o41 cluster add --dry-run` would write for this cluster."""
    done = subprocess.run(
        [sys.executable, "-m", "o41.cli", "cluster", "add", "w",
         "--from-kubeconfig", str(plane.kubeconfig), "--dry-run"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec: dict[str, object] = yaml.safe_load(done.stdout)["spec"]
    return spec


def test_installed_its_opt_in_lets_the_hub_fetch_the_keys_by_discovery(
    workload: ControlPlane,
) -> None:
    kubeconfig = {"KUBECONFIG": str(workload.kubeconfig)}

    def helm_on_workload(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [helm(), *args], capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, **kubeconfig},
        )  # fmt: skip

    assert "keys" in planned_keys(workload)  # discovery closed: the keys would go inline
    done = helm_on_workload(
        "install", "w", str(REMOTE), "--namespace", "ml", "--create-namespace",
        "--set", f"hub.endpoint={HUB}", "--set", "publicIssuerDiscovery=true", "--wait",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    try:
        assert workload.kubectl("get", "configmap", "w-o41-remote-hub", "-n", "ml",
                                "-o", "jsonpath={.data.endpoint}") == HUB  # fmt: skip
        assert planned_keys(workload) == {
            "issuer": workload.service_account_issuer,
            "caBundle": workload.ca_cert.read_text(),
        }
    finally:
        done = helm_on_workload("uninstall", "w", "--namespace", "ml", "--wait")
        assert done.returncode == 0, done.stderr
    assert "keys" in planned_keys(workload)  # the binding went with the release


def test_installed_with_the_tier_it_may_only_review_tokens_and_an_upgrade_keeps_its_certs(
    workload: ControlPlane, tmp_path: Path
) -> None:
    """collections.enabled through the API server (each object accepted as rendered), the
    tier's ServiceAccount allowed TokenReviews and nothing else, and etcd's certificates
    kept by an upgrade (looked up), so that the members and the tier keep trusting each
    other. No pod runs here: tests/real/test_real_remote_tier.py runs them."""
    env = {**os.environ, "KUBECONFIG": str(workload.kubeconfig)}

    def helm_here(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120,
                              check=False, env=env)  # fmt: skip

    done = helm_here(
        "install", "t", str(REMOTE), "--namespace", "ml-tier", "--create-namespace",
        "--set", f"hub.endpoint={HUB}", "--set", "collections.enabled=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "O41_COLLECTIONS_ENDPOINT" in done.stdout  # the notes say what pods set
    tier = "system:serviceaccount:ml-tier:t-o41-remote-collections"
    try:

        def may(*what: str) -> str:
            return workload.kubectl("auth", "can-i", *what, f"--as={tier}", check=False).strip()

        assert may("create", "tokenreviews.authentication.k8s.io") == "yes"
        for what in (("get", "secrets", "-n", "ml-tier"), ("list", "pods", "-A"),
                     ("create", "subjectaccessreviews.authorization.k8s.io"),
                     ("get", "configmaps", "-n", "ml-tier")):  # fmt: skip
            assert may(*what) == "no", what
        secrets = [f"t-o41-remote-etcd-{role}-tls" for role in ("server", "peer", "client")]

        def certificates() -> list[str]:
            path = "jsonpath={.data.tls\\.crt}"
            return [workload.kubectl("get", "secret", s, "-n", "ml-tier", "-o", path)
                    for s in secrets]  # fmt: skip

        before = certificates()
        assert all(before)
        done = helm_here("upgrade", "t", str(REMOTE), "--namespace", "ml-tier", "--reuse-values")
        assert done.returncode == 0, done.stderr
        assert certificates() == before
        endpoint = workload.kubectl("get", "configmap", "t-o41-remote-hub", "-n", "ml-tier",
                                    "-o", "jsonpath={.data.collectionsEndpoint}")  # fmt: skip
        assert endpoint == "http://t-o41-remote-collections.ml-tier.svc:8080"

        # to the certificates Job (GitOps): the render has no Secret any more, Helm keeps
        # them (resource-policy keep), and the Job's code finds and keeps the same set;
        # Secrets of an earlier chart, without the annotation, are refused with what to do
        to_job = ("upgrade", "t", str(REMOTE), "--namespace", "ml-tier", "--reuse-values",
                  "--set", "collections.etcd.tls.generator=job")  # fmt: skip
        workload.kubectl("annotate", "secret", *secrets, "-n", "ml-tier",
                         "helm.sh/resource-policy-")  # fmt: skip
        done = helm_here(*to_job)
        assert done.returncode != 0
        advice = f"kubectl -n ml-tier annotate secret {' '.join(secrets)} helm.sh/resource-policy"
        assert advice + "=keep" in done.stderr, done.stderr
        assert certificates() == before
        workload.kubectl("annotate", "secret", *secrets, "-n", "ml-tier",
                         "helm.sh/resource-policy=keep")  # fmt: skip
        done = helm_here(*to_job)
        assert done.returncode == 0, done.stderr
        assert "certificates are made in the cluster by a Job" in done.stdout  # the notes
        assert certificates() == before
        manifest = helm_here("get", "manifest", "t", "--namespace", "ml-tier").stdout
        (job,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Job"]
        kept = run_the_job(workload, "ml-tier", job, tmp_path)
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert "etcd TLS: kept" in kept.stdout
        assert certificates() == before
    finally:
        done = helm_here("uninstall", "t", "--namespace", "ml-tier")
        assert done.returncode == 0, done.stderr
        workload.kubectl("delete", "namespace", "ml-tier", "--wait=false", check=False)
