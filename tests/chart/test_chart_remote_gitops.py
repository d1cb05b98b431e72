"""The o41-remote chart's collections tier through GitOps: with
``collections.etcd.tls.generator=job`` a render holds no certificate, so two ``helm
template`` runs are byte-identical, and applying it again, as Argo CD does on every sync,
leaves the etcd CAs the certificates Job made in the cluster as they were. The Job is the
hub chart's (``python -m o41.kube.certificates``) with etcd's part of the plan only.

On the test bed kwok runs the pods without running their containers, so the Job's code
runs here as the Job's ServiceAccount (what it may do is what the chart's RBAC grants), as
tests/chart/test_chart_gitops.py does for the hub chart; tests/real/test_real_remote_tier.py
runs the Job's own pod on the real node and the tier on the etcd its certificates made.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from o41.kube import certificates
from test_chart import Doc, run_helm
from test_chart_gitops import apply, cert, mounted_secrets
from test_chart_install import run_the_job
from test_chart_remote import HUB, REMOTE
from testbed.kube import Kube

GITOPS = (f"hub.endpoint={HUB}", "collections.enabled=true", "collections.etcd.tls.generator=job")


def template(release: str, namespace: str, *sets: str) -> str:
    done = run_helm("template", release, str(REMOTE), "--namespace", namespace,
                    *[a for s in sets for a in ("--set", s)])  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def docs_of(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def the(docs: list[Doc], kind: str) -> Doc:
    (only,) = [d for d in docs if d["kind"] == kind]
    return only


def plan_of(job: Doc) -> certificates.Plan:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][:4] == ["python", "-m", "o41.kube.certificates", "--plan"]
    return certificates.Plan.parse(container["args"][4])


def test_two_renders_are_byte_identical_and_hold_no_certificate() -> None:
    first, second = (template("w", "ml", *GITOPS) for _ in range(2))
    assert first == second
    assert not [d for d in docs_of(first) if d["kind"] == "Secret"]
    assert "BEGIN CERTIFICATE" not in first
    assert the(docs_of(first), "Job")["metadata"]["name"].startswith("w-o41-remote-certificates-")
    # the default (helm) makes new CAs on every render: why GitOps takes the Job
    helm_made = (f"hub.endpoint={HUB}", "collections.enabled=true")
    assert template("w", "ml", *helm_made) != template("w", "ml", *helm_made)


def test_the_plan_is_what_the_pods_mount_and_etcd_checks() -> None:
    """The Job's set, made from the rendered plan without a cluster: the Secrets the members
    and the tier mount; the members' serving and the tier's client certificate of the
    clients' CA, the peer one of a CA of its own with the common name etcd allows."""
    docs = docs_of(template("w", "ml", *GITOPS))
    plan = plan_of(the(docs, "Job"))
    mounted = mounted_secrets(docs)
    assert mounted == set(plan.etcd_secrets.values())
    assert not plan.webhook_secret  # the remote chart has no webhook
    made = certificates.etcd_set(plan)
    ca, leaf = {}, {}
    for role, secret in plan.etcd_secrets.items():
        ca[role], leaf[role] = cert(made[secret]["ca.crt"]), cert(made[secret]["tls.crt"])
        leaf[role].verify_directly_issued_by(ca[role])
    assert ca["server"] == ca["client"] != ca["peer"]
    (etcd,) = the(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    allowed = [a.split("=", 1)[1] for a in etcd["args"] if a.startswith("--peer-cert-allowed-cn")]
    cn = NameOID.COMMON_NAME
    assert [leaf["peer"].subject.get_attributes_for_oid(cn)[0].value] == allowed
    tier = the(docs, "Deployment")["metadata"]["name"]
    assert leaf["client"].subject.get_attributes_for_oid(cn)[0].value == tier
    # the tier dials each member by these names: the serving certificate names them all
    (container,) = the(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    endpoints = container["args"][container["args"].index("--etcd") + 1].split(",")
    served = leaf["server"].extensions.get_extension_for_class(x509.SubjectAlternativeName)
    dns = served.value.get_values_for_type(x509.DNSName)
    assert endpoints and all(e.removeprefix("https://").split(":")[0] in dns for e in endpoints)


def secrets_of(kube: Kube, namespace: str, names: list[str]) -> dict[str, str]:
    found = {}
    for name in names:
        data = json.loads(kube.kubectl("get", "secret", name, "-n", namespace, "-o", "json"))
        found[name] = data["data"]["ca.crt"] + data["data"]["tls.crt"]
    return found


@pytest.mark.kube
def test_an_argo_like_apply_twice_keeps_the_etcd_cas(kube: Kube, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    namespace, release = f"o41-remote-gitops-{tag}", f"g{tag}"  # its ClusterRole: cluster-wide
    kube.kubectl("create", "namespace", namespace)
    rendered = template(release, namespace, *GITOPS)
    job = the(docs_of(rendered), "Job")
    secrets = list(plan_of(job).etcd_secrets.values())
    try:
        apply(kube, rendered, namespace)
        first = run_the_job(kube, namespace, job, tmp_path)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "etcd TLS: made" in first.stdout and "webhook" not in first.stdout
        before = secrets_of(kube, namespace, secrets)

        # the next sync: the same render, applied again, the Job's code run again
        again = template(release, namespace, *GITOPS)
        assert again == rendered
        etcd = ("statefulset", f"{release}-o41-remote-etcd", "-n", namespace, "-o", "json")
        generation = json.loads(kube.kubectl("get", *etcd))["metadata"]["generation"]
        out = apply(kube, again, namespace)
        for what in (
            f"deployment.apps/{release}-o41-remote-collections unchanged",
            f"job.batch/{job['metadata']['name']} unchanged",
        ):
            assert what in out, out
        # kubectl reports a StatefulSet with volumeClaimTemplates "configured" on every
        # apply (as it does PodDisruptionBudgets); its spec is the same: no new generation
        assert json.loads(kube.kubectl("get", *etcd))["metadata"]["generation"] == generation
        second = run_the_job(kube, namespace, job, tmp_path)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "etcd TLS: kept" in second.stdout
        assert secrets_of(kube, namespace, secrets) == before

        # a set partly lost is refused, never completed with a second CA
        peer = f"{release}-o41-remote-etcd-peer-tls"
        kube.kubectl("delete", "secret", peer, "-n", namespace)
        refused = run_the_job(kube, namespace, job, tmp_path)
        assert refused.returncode == 2
        assert f"etcd TLS: {peer} missing" in refused.stderr
        assert "delete all of" in refused.stderr  # what to do
    finally:
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for kind in ("clusterrole", "clusterrolebinding"):
            kube.kubectl("delete", kind, f"{release}-o41-remote-collections", check=False)


def test_an_unknown_generator_is_refused_with_its_path() -> None:
    done = run_helm("template", "w", str(REMOTE), "--set", f"hub.endpoint={HUB}",
                    "--set", "collections.enabled=true",
                    "--set", "collections.etcd.tls.generator=cert-manager")  # fmt: skip
    assert done.returncode != 0
    assert "/collections/etcd/tls/generator" in done.stderr and "'helm', 'job'" in done.stderr
