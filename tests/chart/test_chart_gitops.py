"""The chart through GitOps (issue 42, point 1): with ``certificates.generator=job`` a render
holds no certificate and no caBundle, so two ``helm template`` runs are byte-identical, and
applying it again, as Argo CD does on every sync (``kubectl apply`` of the render), leaves
the etcd and webhook CAs that the certificates Job made in the cluster as they were.

On the test bed kwok runs the pods without running their containers, so the Job's own code
(``python -m o41.kube.certificates`` with the plan the chart rendered) runs here, as the
Job's ServiceAccount (its token): what it may do is what the chart's RBAC grants.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from o41.kube import certificates
from test_chart import CHART, Doc, find, run_helm
from test_chart_install import Release, run_the_job
from testbed.kube import Kube, kubectl_binary

GITOPS = ("certificates.generator=job", "etcd.persistence.enabled=false")


def template(release: str, namespace: str, *sets: str) -> str:
    argv = ["template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        argv += ["--set", s]
    done = run_helm(*argv)
    assert done.returncode == 0, done.stderr
    return done.stdout


def docs_of(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def mounted_secrets(docs: list[Doc]) -> set[str]:
    """The Secrets the rendered Deployments and StatefulSets mount."""
    return {
        v["secret"]["secretName"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        for v in d["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    }


def test_two_renders_are_byte_identical() -> None:
    first, second = (template("o41", "o41-system", *GITOPS) for _ in range(2))
    assert first == second
    docs = docs_of(first)
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert "BEGIN CERTIFICATE" not in first and "caBundle" not in first.replace(
        "# The caBundle", ""
    )
    config = find(docs, "ValidatingWebhookConfiguration")
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])
    job = find(docs, "Job", "")
    assert job["metadata"]["name"].startswith("o41-artifacts-certificates-")
    # the Helm-made certificates (the default) differ on every render: why GitOps takes the job
    assert template("o41", "o41-system") != template("o41", "o41-system")


def test_the_plan_names_what_the_pods_mount() -> None:
    docs = docs_of(template("o41", "o41-system", *GITOPS))
    (container,) = find(docs, "Job", "")["spec"]["template"]["spec"]["containers"]
    plan = certificates.Plan.parse(container["args"][container["args"].index("--plan") + 1])
    mounted = mounted_secrets(docs)
    # the operator mounts the webhook's, etcd the server's and peer's, the service the client's
    assert mounted == {plan.webhook_secret, *plan.etcd_secrets.values()}
    assert (
        plan.webhook_configuration
        == find(docs, "ValidatingWebhookConfiguration")["metadata"]["name"]
    )
    assert "o41-artifacts-operator.o41-system.svc" in plan.webhook_names


def test_placement_tls_without_an_issuer_is_refused_in_job_mode() -> None:
    done = run_helm(
        "template", "o41", str(CHART), "--set", "certificates.generator=job",
        "--set", "placement.tls.enabled=true",
    )  # fmt: skip
    assert done.returncode != 0
    assert "placement.tls.certManager.issuerRef" in done.stderr


def test_the_jobs_certificates_are_what_etcd_and_the_webhook_check() -> None:
    """The set the Job makes from the chart's plan, without a cluster: etcd's serving
    certificate and the service's client one chain to the clients' CA, the peer certificate
    to a CA of its own with the common name etcd allows on its peer port, the names etcd
    and the API server check, server and client use both."""
    docs = docs_of(template("o41", "o41-system", *GITOPS))
    (container,) = find(docs, "Job", "")["spec"]["template"]["spec"]["containers"]
    plan = certificates.Plan.parse(container["args"][-1])
    made = certificates.etcd_set(plan) | certificates.webhook_set(plan)
    pair = {name: (cert(d["ca.crt"]), cert(d["tls.crt"])) for name, d in made.items()}
    s, p, c = (pair[plan.etcd_secrets[r]] for r in ("server", "peer", "client"))
    s[1].verify_directly_issued_by(s[0])
    c[1].verify_directly_issued_by(c[0])
    p[1].verify_directly_issued_by(p[0])
    assert s[0] == c[0] and p[0] != s[0]  # two CAs: no client certificate is a peer's
    cn = NameOID.COMMON_NAME
    assert p[1].subject.get_attributes_for_oid(cn)[0].value == plan.etcd_peer_cn
    assert c[1].subject.get_attributes_for_oid(cn)[0].value == "o41-artifacts-placement"
    names = s[1].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "o41-artifacts-etcd-0.o41-artifacts-etcd.o41-system.svc" in names.get_values_for_type(
        x509.DNSName
    )
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for _, leaf in pair.values():
        usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usage) == {
            ExtendedKeyUsageOID.SERVER_AUTH,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        }
    hook = pair[plan.webhook_secret]
    hook[1].verify_directly_issued_by(hook[0])
    assert hook[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca


# --- on the test bed ------------------------------------------------------------------------


def apply(kube: Kube, text: str, namespace: str) -> str:
    done = subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(kube.kubeconfig), "apply", "-n", namespace,
         "-f", "-"],
        input=text, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def cas(kube: Kube, namespace: str, secrets: list[str], config: str) -> dict[str, str]:
    found = {}
    for name in secrets:
        secret = json.loads(kube.kubectl("get", "secret", name, "-n", namespace, "-o", "json"))
        found[name] = secret["data"]["ca.crt"] + secret["data"]["tls.crt"]
    hooks = json.loads(kube.kubectl("get", "validatingwebhookconfiguration", config, "-o", "json"))
    for hook in hooks["webhooks"]:
        found[hook["name"]] = hook["clientConfig"].get("caBundle", "")
    return found


def cert(b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(b64))


@pytest.mark.kube
def test_an_argo_like_apply_twice_keeps_the_cas_and_the_pods_ready(
    kube: Kube, tmp_path: Path
) -> None:
    release = "gitops"
    namespace = f"o41-gitops-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    rendered = template(release, namespace, *GITOPS)
    docs = docs_of(rendered)
    job = find(docs, "Job", "")
    config = find(docs, "ValidatingWebhookConfiguration")["metadata"]["name"]
    plan_arg = job["spec"]["template"]["spec"]["containers"][0]["args"][-1]
    plan = certificates.Plan.parse(plan_arg)
    secrets = [plan.webhook_secret, *plan.etcd_secrets.values()]
    rel = Release(kube, release, namespace, tmp_path)
    try:
        apply(kube, rendered, namespace)
        first = run_the_job(kube, namespace, job, tmp_path)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "etcd TLS: made" in first.stdout and "webhook TLS: made" in first.stdout
        assert "caBundle set on 5 webhooks" in first.stdout
        before = cas(kube, namespace, secrets, config)
        assert all(before.values()), before

        # the next sync: a new render, applied again, and the Job's code run again
        again = template(release, namespace, *GITOPS)
        assert again == rendered
        out = apply(kube, again, namespace)
        # the webhook configuration, the workloads and the Job: not changed by the sync
        # (kubectl reports the PodDisruptionBudgets "configured" on every apply, as it does
        # for any PDB; their spec is the same)
        for what in (
            f"validatingwebhookconfiguration.admissionregistration.k8s.io/{config} unchanged",
            f"deployment.apps/{release}-o41-artifacts-operator unchanged",
            f"deployment.apps/{release}-o41-artifacts-placement unchanged",
            f"statefulset.apps/{release}-o41-artifacts-etcd unchanged",
            f"job.batch/{job['metadata']['name']} unchanged",
        ):
            assert what in out, out
        second = run_the_job(kube, namespace, job, tmp_path)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "etcd TLS: kept" in second.stdout and "webhook TLS: kept" in second.stdout
        assert "caBundle already the CA's" in second.stdout
        assert cas(kube, namespace, secrets, config) == before

        # what was made is a working set: the webhook's certificate is its CA's and names
        # the operator's Service, the service's etcd client certificate is the clients' CA's
        hook = json.loads(
            kube.kubectl("get", "secret", plan.webhook_secret, "-n", namespace, "-o", "json")
        )
        serving, ca = cert(hook["data"]["tls.crt"]), cert(hook["data"]["ca.crt"])
        serving.verify_directly_issued_by(ca)
        names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{release}-o41-artifacts-operator.{namespace}.svc" in names.get_values_for_type(
            x509.DNSName
        )
        bundle = json.loads(
            kube.kubectl("get", "validatingwebhookconfiguration", config, "-o", "json")
        )
        assert {w["clientConfig"]["caBundle"] for w in bundle["webhooks"]} == {
            hook["data"]["ca.crt"]
        }
        server, client = (
            json.loads(
                kube.kubectl("get", "secret", plan.etcd_secrets[r], "-n", namespace, "-o", "json")
            )
            for r in ("server", "client")
        )
        cert(client["data"]["tls.crt"]).verify_directly_issued_by(cert(server["data"]["ca.crt"]))
        cert(server["data"]["tls.crt"]).verify_directly_issued_by(cert(client["data"]["ca.crt"]))

        rel.wait_ready("the GitOps-applied release's workloads to be ready")

        # a set partly lost is refused, never completed with a second CA
        kube.kubectl("delete", "secret", plan.etcd_secrets["peer"], "-n", namespace)
        refused = run_the_job(kube, namespace, job, tmp_path)
        assert refused.returncode == 2
        assert f"etcd TLS: {plan.etcd_secrets['peer']} missing" in refused.stderr
    finally:
        subprocess.run(
            [kubectl_binary(), "--kubeconfig", str(kube.kubeconfig), "delete", "-n", namespace,
             "--wait=false", "--ignore-not-found", "-f", "-"],
            input=rendered, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
