"""The Helm chart, rendered: lint, the schema of values, the Kubernetes 1.37 schemas, and
what the important templates say (no cluster needed; helm is the test bed's pinned one).
"""

from __future__ import annotations

import base64
import filecmp
import json
import ssl
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from o41.state import EtcdTls
from testbed.kube import bin_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "o41-artifacts"
NAMESPACE = "o41-system"
KUBE_VERSION = "1.37.0"  # the schemas kubernetes-validate bundles for our control plane
# Kinds of other projects' CRDs: no schema in kubernetes-validate; checked by their shape.
FOREIGN_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}

Doc = dict[str, Any]


@cache
def helm() -> str:
    # helm linked without its Kubernetes version assumes 1.20 and refuses the chart's
    # kubeVersion: hack/testbed-bin.sh links it as helm's Makefile does, and stamps it
    if not (bin_dir() / "helm.kube-version").exists():
        pytest.fail("the test bed's helm predates its link-time Kubernetes version: run make bins")
    return str(bin_dir() / "helm")


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, check=False, timeout=120)


def render(*sets: str, release: str = "o41") -> list[Doc]:
    """`helm template` with ``--set`` pairs; the parsed documents."""
    argv = ["template", release, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        argv += ["--set", s]
    done = run_helm(*argv)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(docs: list[Doc], kind: str, suffix: str = "") -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def kinds(docs: list[Doc]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def container(deployment: Doc) -> Doc:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    result: Doc = only
    return result


# --- lint, CRDs, schemas -----------------------------------------------------------------


def test_helm_lint_strict_passes() -> None:
    done = run_helm("lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("admission.tls.certManager.enabled=true",),
        ("etcd.external.endpoints[0]=http://etcd.db.svc:2379",),
        (
            "metrics.serviceMonitor.enabled=true",
            "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.team=monitoring",
            "networkPolicy.admission.from[0].ipBlock.cidr=10.0.0.0/28",
            "networkPolicy.placement.from[0].namespaceSelector.matchLabels.o41=jobs",
        ),
        (
            "etcd.persistence.enabled=false",
            "placement.pdb.enabled=false",
            "rbac.create=false",
            "etcd.tls.enabled=false",
            "networkPolicy.enabled=false",
        ),
        (
            "etcd.external.endpoints[0]=https://etcd.db.svc:2379",
            "etcd.external.tls.secretName=etcd-client",
            "placement.prices.asOf=2026-12-01",
        ),
        ("etcd.tls.certManager.enabled=true",),
        (
            "etcd.tls.certManager.enabled=true",
            "etcd.tls.certManager.issuerRef.name=corp-ca",
            "etcd.tls.certManager.issuerRef.kind=ClusterIssuer",
        ),
        ("certificates.generator=job", "crds.enabled=true"),
        (
            "podSecurityContext.runAsUser=null",
            "podSecurityContext.fsGroup=null",
            "etcd.topologySpreadConstraints[0].maxSkew=1",
            "etcd.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "etcd.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
            "serviceAccounts.operator.create=false",
            "serviceAccounts.operator.name=mine",
            "global.imageRegistry=mirror.corp",
            "global.imagePullSecrets[0]=corp",
        ),
    ],
    ids=[
        "defaults",
        "cert-manager",
        "external-etcd",
        "netpol-monitor",
        "minimal",
        "etcd-tls",
        "etcd-cert-manager",
        "etcd-cert-manager-issuer",
        "certificates-job-crds",
        "production-knobs",
    ],
)
def test_lint_and_rendered_objects_match_the_kubernetes_1_37_schemas(
    sets: tuple[str, ...],
) -> None:
    lint = run_helm("lint", "--strict", str(CHART), *[a for s in sets for a in ("--set", s)])
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(*sets)
    assert docs
    for doc in docs:
        if doc["kind"] in FOREIGN_KINDS:
            assert doc["apiVersion"].split("/")[0] in ("cert-manager.io", "monitoring.coreos.com")
            continue
        # strict: an unknown field anywhere is an error too
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_chart_crds_are_the_repos_generated_crds() -> None:
    """The chart ships copies of crds/ (Helm installs crds/ first and never deletes them);
    refresh with `cp crds/*.yaml charts/o41-artifacts/crds/`."""
    ours = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    theirs = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert theirs == ours
    _, mismatch, errors = filecmp.cmpfiles(REPO / "crds", CHART / "crds", ours, shallow=False)
    assert (mismatch, errors) == ([], []), "run: cp crds/*.yaml charts/o41-artifacts/crds/"


def test_schema_refuses_an_unknown_key_with_its_path() -> None:
    done = run_helm("template", "o41", str(CHART), "--set", "placement.replica=3")
    assert done.returncode != 0
    assert "at '/placement': additional properties 'replica' not allowed" in done.stderr


def test_schema_refuses_an_unknown_top_level_key_and_a_nested_one() -> None:
    for bad, where in (
        ("replicas=3", "at '': additional properties 'replicas'"),
        ("etcd.persistence.sise=1Gi", "at '/etcd/persistence'"),
    ):
        done = run_helm("template", "o41", str(CHART), "--set", bad)
        assert done.returncode != 0
        assert where in done.stderr, done.stderr


def test_schema_refuses_a_wrong_type_naming_what_it_wanted() -> None:
    done = run_helm("template", "o41", str(CHART), "--set", "placement.replicas=three")
    assert done.returncode != 0
    assert "at '/placement/replicas': got string, want integer" in done.stderr
    done = run_helm("template", "o41", str(CHART), "--set-json", 'etcd.external.endpoints="x"')
    assert done.returncode != 0
    assert "at '/etcd/external/endpoints': got string, want array" in done.stderr


def test_schema_refuses_a_value_outside_its_enum() -> None:
    done = run_helm("template", "o41", str(CHART), "--set", "admission.failurePolicy=Maybe")
    assert done.returncode != 0
    assert "/admission/failurePolicy" in done.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("webhook.failurePolicy=Ignore", "set admission.* instead of webhook.*"),
        ("webhook.tls.certManager.enabled=true", "set admission.* instead of webhook.*"),
        (
            "networkPolicy.webhook.from=null",
            "set networkPolicy.admission.from instead of networkPolicy.webhook.from",
        ),
    ],
)
def test_the_old_webhook_key_is_refused_naming_admission(old: str, new: str) -> None:
    """The admission webhook's values moved from ``webhook`` (beside ``placement``, the
    placement service, which confused the two) to ``admission``: the old key fails loudly
    with the new name instead of being ignored."""
    done = run_helm("template", "o41", str(CHART), "--set", old)
    assert done.returncode != 0
    assert new in done.stderr, done.stderr
    assert "renamed" in done.stderr


# --- the templates -----------------------------------------------------------------------


def test_defaults_install_everything_with_etcd_as_three_members() -> None:
    docs = render()
    assert kinds(docs) == sorted(
        ["ClusterRole"] * 2
        + ["ClusterRoleBinding"] * 2
        + ["Role"] * 2
        + ["RoleBinding"] * 2
        + ["ServiceAccount"] * 3
        + ["Deployment"] * 2
        + ["Service"] * 4  # the webhook's, the operator's metrics, the service's, etcd's
        + ["PodDisruptionBudget"] * 2
        + ["Secret"] * 4  # the webhook's TLS; etcd's server, peer and client TLS
        + ["NetworkPolicy"] * 3
        + ["StatefulSet", "ValidatingWebhookConfiguration"]
        + ["ConfigMap"]  # the placement service's version counts
    )
    etcd = find(docs, "StatefulSet", "-etcd")
    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    image = container(etcd)["image"]
    assert image.startswith("quay.io/coreos/etcd:v3.6.")
    (claim,) = etcd["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert "storageClassName" not in claim["spec"]
    headless = find(docs, "Service", "-etcd")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["spec"]["ports"]} == {2379, 2380, 2381}
    args = container(etcd)["args"]
    assert (
        "--initial-cluster="
        + ",".join(
            f"o41-artifacts-etcd-{i}=https://o41-artifacts-etcd-{i}"
            f".o41-artifacts-etcd.{NAMESPACE}.svc:2380"
            for i in range(3)
        )
        in args
    )


def test_etcd_persistence_size_class_and_emptydir_switch() -> None:
    etcd = find(
        render("etcd.persistence.size=20Gi", "etcd.persistence.storageClass=fast"),
        "StatefulSet",
    )
    (claim,) = etcd["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    etcd = find(render("etcd.persistence.enabled=false"), "StatefulSet")
    assert "volumeClaimTemplates" not in etcd["spec"]
    volumes = etcd["spec"]["template"]["spec"]["volumes"]
    assert [v for v in volumes if v["name"] == "data"] == [{"name": "data", "emptyDir": {}}]


def test_operator_is_one_replica_recreated_with_the_documented_args() -> None:
    docs = render()
    operator = find(docs, "Deployment", "-operator")
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    c = container(operator)
    assert c["args"] == [
        "python", "-m", "o41.operator",
        "--webhook-addr", "0.0.0.0", "--webhook-port", "9443",
        "--webhook-cert", "/tls/tls.crt", "--webhook-key", "/tls/tls.key",
        "--liveness", "http://0.0.0.0:8080/healthz",
        "--readiness", "http://0.0.0.0:8081/readyz",
        "--log-format", "text",
        "--metrics-addr", "0.0.0.0", "--metrics-port", "9091",
    ]  # fmt: skip
    env = {e["name"]: e for e in c["env"]}
    assert env["O41_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    assert env["MALLOC_ARENA_MAX"]["value"] == "2"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # ready only when its webhook server and its watches are (o41.operator.health)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ready"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"webhook": 9443, "health": 8080, "ready": 8081, "metrics": 9091}
    tls = next(v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == find(docs, "Secret", "-webhook-tls")["metadata"]["name"]


def test_log_format_reaches_both_servers_and_is_checked() -> None:
    docs = render("logFormat=json")
    for suffix in ("-operator", "-placement"):
        args = container(find(docs, "Deployment", suffix))["args"]
        assert args[args.index("--log-format") + 1] == "json", suffix
    done = run_helm("template", "o41", str(CHART), "--set", "logFormat=yaml")
    assert done.returncode != 0
    assert "logFormat" in done.stderr


def test_trust_domains_allowed_networks_and_own_issuer_reach_both_servers() -> None:
    """Issue 37: loopback and private issuers only where the chart says; both servers fetch
    keys (the operator's timer, the service's unknown-kid refetch)."""
    own = "https://kubernetes.default.svc.cluster.local"
    docs = render("trustDomains.allowedNetworks={10.0.0.0/8,127.0.0.1/32}",
                  f"trustDomains.ownIssuer={own}")  # fmt: skip
    for suffix in ("-operator", "-placement"):
        env = {
            e["name"]: e.get("value") for e in container(find(docs, "Deployment", suffix))["env"]
        }
        assert env["O41_TRUST_ALLOWED_NETWORKS"] == "10.0.0.0/8,127.0.0.1/32", suffix
        assert env["O41_OWN_ISSUER"] == own, suffix
    for suffix in ("-operator", "-placement"):  # by default: public addresses only
        names = {e["name"] for e in container(find(render(), "Deployment", suffix))["env"]}
        assert not names & {"O41_TRUST_ALLOWED_NETWORKS", "O41_OWN_ISSUER"}, suffix
    done = run_helm("template", "o41", str(CHART), "--set", "trustDomains.allowedNetworks={ten}")
    assert done.returncode != 0 and "trustDomains/allowedNetworks" in done.stderr


def test_placement_replicas_probes_args_and_pdb() -> None:
    docs = render("placement.replicas=5")
    placement = find(docs, "Deployment", "-placement")
    assert placement["spec"]["replicas"] == 5
    c = container(placement)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
    ]
    etcd = "o41-artifacts-etcd"
    endpoints = ",".join(f"https://{etcd}-{i}.{etcd}.{NAMESPACE}.svc:2379" for i in range(3))
    assert c["args"] == [
        "python", "-m", "o41.webhook", "--host", "0.0.0.0", "--port", "8080",
        "--metrics-port", "9090", "--etcd", endpoints, "--secrets-namespace", NAMESPACE,
        "--authentication", "tokenreview", "--usage-hourly-days", "14",
        "--usage-daily-days", "400", "--retention-interval", "600", "--log-format", "text",
    ]  # fmt: skip
    pdb = find(docs, "PodDisruptionBudget", "-placement")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == placement["spec"]["selector"]
    service = find(docs, "Service", "-placement")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http", 8080),
        ("metrics", 9090),
    ]
    assert service["spec"]["selector"] == placement["spec"]["selector"]["matchLabels"]


def test_usage_retention_reaches_the_service_and_is_checked() -> None:
    docs = render(
        "placement.usage.retention.hourlyDays=3", "placement.usage.retention.dailyDays=90"
    )
    args = container(find(docs, "Deployment", "-placement"))["args"]
    assert args[args.index("--usage-hourly-days") + 1] == "3"
    assert args[args.index("--usage-daily-days") + 1] == "90"
    done = run_helm("template", "o41", str(CHART), "--set", "placement.usage.retention.dailyDays=7")
    assert done.returncode != 0
    assert "/placement/usage/retention/dailyDays" in done.stderr


def test_the_retention_interval_reaches_the_service_and_is_checked() -> None:
    docs = render("placement.retentionIntervalSeconds=60")
    args = container(find(docs, "Deployment", "-placement"))["args"]
    assert args[args.index("--retention-interval") + 1] == "60"
    done = run_helm("template", "o41", str(CHART), "--set", "placement.retentionIntervalSeconds=5")
    assert done.returncode != 0
    assert "/placement/retentionIntervalSeconds" in done.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "o41.webhook", "--retention-interval", "5"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--retention-interval must be at least 10 seconds" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_etcd_attempt_seconds_reach_the_service_and_are_checked() -> None:
    """placement.etcd.attemptSeconds is the service's O41_ETCD_ATTEMPT_SECONDS (1 s by
    default, as the service's own default); 0 or a negative time is refused at install."""
    env = {
        e["name"]: e.get("value")
        for e in container(find(render(), "Deployment", "-placement"))["env"]
    }
    assert env["O41_ETCD_ATTEMPT_SECONDS"] == "1"
    docs = render("placement.etcd.attemptSeconds=3")
    env = {
        e["name"]: e.get("value") for e in container(find(docs, "Deployment", "-placement"))["env"]
    }
    assert env["O41_ETCD_ATTEMPT_SECONDS"] == "3"
    # a fraction (--set would pass it as text; values files and --set-json as a number)
    done = run_helm(
        "template", "o41", str(CHART), "--set-json", "placement.etcd.attemptSeconds=2.5"
    )
    assert done.returncode == 0, done.stderr
    assert '- name: O41_ETCD_ATTEMPT_SECONDS\n              value: "2.5"' in done.stdout
    for wrong in ("0", "-1"):
        done = run_helm(
            "template", "o41", str(CHART), "--set", f"placement.etcd.attemptSeconds={wrong}"
        )
        assert done.returncode != 0
        assert "/placement/etcd/attemptSeconds" in done.stderr


def test_external_etcd_deploys_no_etcd_and_is_what_the_service_uses() -> None:
    urls = ["http://etcd-0.db.svc:2379", "http://etcd-1.db.svc:2379"]
    docs = render(*(f"etcd.external.endpoints[{i}]={u}" for i, u in enumerate(urls)))
    assert "StatefulSet" not in kinds(docs)
    assert not [d for d in docs if d["metadata"]["name"].endswith("-etcd")]
    args = container(find(docs, "Deployment", "-placement"))["args"]
    assert args[args.index("--etcd") + 1] == ",".join(urls)


TLS_FILES = ("O41_ETCD_CA_FILE", "O41_ETCD_CERT_FILE", "O41_ETCD_KEY_FILE")
TLS_ETCD = (
    "etcd.external.endpoints[0]=https://etcd-0.db.svc:2379",
    "etcd.external.tls.secretName=etcd-client",
)


def test_tls_to_an_external_etcd_mounts_the_secret_where_the_service_reads_it() -> None:
    docs = render(*TLS_ETCD)
    placement = find(docs, "Deployment", "-placement")
    pod = placement["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container(placement)["env"]}
    # what the chart sets is what the service reads
    assert EtcdTls.from_environment(env) == EtcdTls(
        "/etc/o41-etcd-tls/ca.crt", "/etc/o41-etcd-tls/tls.crt", "/etc/o41-etcd-tls/tls.key"
    )
    (mount,) = [m for m in container(placement)["volumeMounts"] if m["name"] == "etcd-tls"]
    assert mount == {"name": "etcd-tls", "mountPath": "/etc/o41-etcd-tls", "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "etcd-tls"]
    assert volume["secret"] == {"secretName": "etcd-client", "defaultMode": 0o440}
    assert pod["securityContext"]["fsGroup"] == 10001  # who may read the 0440 files
    # a CA only: the service shows etcd no certificate
    docs = render(*TLS_ETCD, "etcd.external.tls.clientCertificate=false")
    env = {
        e["name"]: e.get("value") for e in container(find(docs, "Deployment", "-placement"))["env"]
    }
    assert EtcdTls.from_environment(env) == EtcdTls("/etc/o41-etcd-tls/ca.crt")
    # no Secret: nothing mounted, nothing set
    placement = find(render(TLS_ETCD[0]), "Deployment", "-placement")
    assert not [e for e in container(placement)["env"] if e["name"] in TLS_FILES]
    assert "etcd-tls" not in {v["name"] for v in placement["spec"]["template"]["spec"]["volumes"]}


def test_tls_to_an_external_etcd_is_refused_at_install_without_https_endpoints() -> None:
    secret = "etcd.external.tls.secretName=etcd-client"
    done = run_helm("template", "o41", str(CHART), "--set", secret)
    assert done.returncode != 0
    assert "give its https:// URLs in etcd.external.endpoints" in done.stderr
    plain = "etcd.external.endpoints[0]=http://etcd-0.db.svc:2379"
    done = run_helm("template", "o41", str(CHART), "--set", plain, "--set", secret)
    assert done.returncode != 0
    assert "must be https://, not http://etcd-0.db.svc:2379" in done.stderr
    done = run_helm(
        "template",
        "o41",
        str(CHART),
        "--set",
        TLS_ETCD[0],
        "--set",
        "etcd.external.tls.secretName=Etcd_Client",
    )
    assert done.returncode != 0
    assert "/etcd/external/tls/secretName" in done.stderr


def test_every_container_is_hardened() -> None:
    docs = render()
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) == 3
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            assert c["securityContext"] == {
                "runAsNonRoot": True,
                "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            }, w["metadata"]["name"]
            assert c["resources"]["requests"], w["metadata"]["name"]
        if w["kind"] == "Deployment":  # Python wants a writable /tmp
            mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
            tmp = next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
            assert "emptyDir" in tmp


WEBHOOKS = {
    "location-rules.artifacts.o41.io": ("locations", ["UPDATE"], "/location-rules"),
    "location-delete.artifacts.o41.io": ("locations", ["DELETE"], "/location-delete"),
    "organization-picks.artifacts.o41.io": (
        "organizations",
        ["CREATE", "UPDATE"],
        "/organization-picks",
    ),
    "organization-delete.artifacts.o41.io": ("organizations", ["DELETE"], "/organization-delete"),
    "trustdomain-rules.artifacts.o41.io": (
        "trustdomains",
        ["CREATE", "UPDATE"],
        "/trustdomain-rules",
    ),
}


def test_webhook_rules_and_paths_match_the_operators_kopf_validators() -> None:
    """kopf's WebhookServer serves each handler on /<handler id> (see
    kopf/_kits/webhooks.py); the ids are those of o41/operator/admission.py."""
    import kopf

    import o41.operator.admission  # noqa: F401  registers the handlers

    registry: Any = kopf.get_default_registry()
    ids = {str(h.id) for h in registry._webhooks.get_all_handlers()}
    assert {p.lstrip("/") for _, _, p in WEBHOOKS.values()} <= ids

    docs = render()
    config = find(docs, "ValidatingWebhookConfiguration")
    operator_service = find(docs, "Service", "-operator")
    got = {}
    for hook in config["webhooks"]:
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == ["artifacts.o41.io"]
        assert rule["apiVersions"] == ["v1alpha1"]
        service = hook["clientConfig"]["service"]
        assert service["name"] == operator_service["metadata"]["name"]
        assert service["namespace"] == NAMESPACE
        assert service["port"] == operator_service["spec"]["ports"][0]["port"] == 443
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        got[hook["name"]] = (rule["resources"][0], rule["operations"], service["path"])
    assert got == WEBHOOKS


def test_generated_ca_signs_the_serving_certificate_for_the_service_name() -> None:
    docs = render()
    secret = find(docs, "Secret", "-webhook-tls")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    for hook in find(docs, "ValidatingWebhookConfiguration")["webhooks"]:
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"o41-artifacts-operator.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)


def test_cert_manager_switch_issues_the_certificate_and_injects_the_ca() -> None:
    docs = render("admission.tls.certManager.enabled=true")
    assert not [
        d for d in docs if d["metadata"]["name"].endswith("-webhook-tls") and d["kind"] == "Secret"
    ]
    cert = find(docs, "Certificate")
    issuer = find(docs, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert cert["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert f"o41-artifacts-operator.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    config = find(docs, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{cert['metadata']['name']}"
    )
    assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
    operator = find(docs, "Deployment", "-operator")
    tls = next(v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == cert["spec"]["secretName"]
    # an issuer of the user's: no Issuer of ours
    docs = render(
        "admission.tls.certManager.enabled=true",
        "admission.tls.certManager.issuerRef.name=corp-ca",
        "admission.tls.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert "Issuer" not in kinds(docs)
    assert find(docs, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def rules_of(docs: list[Doc], kind: str, suffix: str) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in find(docs, kind, suffix)["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege() -> None:
    docs = render()
    g = "artifacts.o41.io"
    ours = ("locations", "organizations", "trustdomains")
    crud = {(g, r, v) for r in ours for v in ("get", "list", "watch")}
    assert rules_of(docs, "ClusterRole", "-operator") == crud | {
        *((g, r, "patch") for r in ours),
        *((g, f"{r}/status", v) for r in ours for v in ("get", "patch")),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    # the placement service writes no Location, Organization or TrustDomain, status included
    assert rules_of(docs, "ClusterRole", "-placement") == crud | {
        ("authentication.k8s.io", "tokenreviews", "create"),
    }
    # only the operator writes the ConfigMaps its records live in; the placement service
    # reads them and writes its counts ConfigMap alone
    configmaps = {("", "configmaps", v) for v in ("get", "list", "create", "patch")}
    assert rules_of(docs, "Role", "-operator") == {("", "secrets", "get")} | configmaps
    placement_rules = find(docs, "Role", "-placement")["rules"]
    assert [r for r in placement_rules if r.get("resourceNames")] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["o41-version-counts"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    unnamed = [r for r in placement_rules if not r.get("resourceNames")]
    assert {(g, res, v) for r in unnamed for g in r["apiGroups"] for res in r["resources"]
            for v in r["verbs"]} == {
        ("", "secrets", "get"),
        *(("", "configmaps", v) for v in ("get", "list", "watch")),
    }  # fmt: skip
    counts = find(docs, "ConfigMap", "o41-version-counts")
    assert counts["metadata"]["namespace"] == NAMESPACE and "data" not in counts
    for suffix in ("-operator", "-placement"):
        role = find(docs, "Role", suffix)
        assert role["metadata"]["namespace"] == NAMESPACE
        binding = find(docs, "RoleBinding", suffix)
        (subject,) = binding["subjects"]
        assert subject["name"] == find(docs, "ServiceAccount", suffix)["metadata"]["name"]
    assert "Role" not in kinds(render("rbac.create=false"))


def test_price_overrides_reach_the_service_as_a_file_it_loads(tmp_path: Path) -> None:
    override = {"asOf": "2026-12-01", "clouds": {"aws": {"internet": 0.05}}}
    done = run_helm(
        "template",
        "o41",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set-json",
        f"placement.prices={json.dumps(override)}",
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    deployment = find(docs, "Deployment", "-placement")
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    assert env["O41_PRICES_FILE"] == "/etc/o41/prices.json"
    config = find(docs, "ConfigMap", "-prices")
    # the file the chart writes is one the service accepts, with the override applied
    from o41.webhook.usage.prices import load_prices

    path = tmp_path / "prices.json"
    path.write_text(config["data"]["prices.json"])
    prices = load_prices(str(path))
    assert prices.as_of == "2026-12-01"
    assert prices.of("aws").internet == 0.05
    # no override: no ConfigMap, no variable, the built-in table
    plain = render()
    assert not [
        d for d in plain if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-prices")
    ]
    names = {e["name"] for e in container(find(plain, "Deployment", "-placement"))["env"]}
    assert "O41_PRICES_FILE" not in names


# --- etcd's TLS ----------------------------------------------------------------------------

ETCD = "o41-artifacts-etcd"
PLACEMENT = "o41-artifacts-placement"
OPERATOR_METRICS = "o41-artifacts-operator-metrics"


def member_names(i: int) -> list[str]:
    """How member i is reached through the headless Service: the name the chart
    advertises (<pod>.<svc>.<ns>.svc) and its short and long forms."""
    pod = f"{ETCD}-{i}"
    return [
        f"{pod}.{ETCD}",
        f"{pod}.{ETCD}.{NAMESPACE}",
        f"{pod}.{ETCD}.{NAMESPACE}.svc",
        f"{pod}.{ETCD}.{NAMESPACE}.svc.cluster.local",
    ]


def decoded(secret: Doc) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def verifies_for(pem: dict[str, bytes], hostname: str, tmp: Path) -> bool:
    """Whether a client that trusts ``pem['ca.crt']`` accepts the certificate for
    ``hostname``: a real TLS handshake (OpenSSL's own name checks), in memory."""
    for name, data in pem.items():
        (tmp / name).write_bytes(data)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    client = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    s = server.wrap_bio(pipes[0], pipes[1], server_side=True)
    c = client.wrap_bio(pipes[2], pipes[3], server_hostname=hostname)
    for _ in range(10):
        for side, outgoing, incoming in ((c, pipes[3], pipes[0]), (s, pipes[1], pipes[2])):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError:
                return False
            incoming.write(outgoing.read())
        if c.version() and s.version():
            return True
    return False


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def secret_mounts(workload: Doc) -> dict[str, str]:
    """mountPath -> Secret name, for the workload's one container; each read-only, and
    each of etcd's TLS readable by the pod's group only."""
    pod = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    found = {}
    for mount in container(workload)["volumeMounts"]:
        volume = volumes.get(mount["name"], {})
        if "secret" in volume:
            assert mount["readOnly"] is True
            if volume["secret"]["secretName"].startswith(f"{ETCD}-"):
                assert volume["secret"]["defaultMode"] == 0o440  # the fsGroup reads it
            found[mount["mountPath"]] = volume["secret"]["secretName"]
    return found


def test_etcd_takes_only_the_placement_services_client_certificate_by_default(
    tmp_path: Path,
) -> None:
    docs = render()
    etcd = find(docs, "StatefulSet", "-etcd")
    args = container(etcd)["args"]
    mounts = secret_mounts(etcd)
    assert mounts == {
        "/etc/etcd/tls/server": f"{ETCD}-server-tls",
        "/etc/etcd/tls/peer": f"{ETCD}-peer-tls",
    }
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    for name, path in (
        ("--trusted-ca-file", "/etc/etcd/tls/server/ca.crt"),
        ("--cert-file", "/etc/etcd/tls/server/tls.crt"),
        ("--key-file", "/etc/etcd/tls/server/tls.key"),
        ("--peer-trusted-ca-file", "/etc/etcd/tls/peer/ca.crt"),
        ("--peer-cert-file", "/etc/etcd/tls/peer/tls.crt"),
        ("--peer-key-file", "/etc/etcd/tls/peer/tls.key"),
    ):
        assert flag(args, name) == path
    for name in ("--listen-client-urls", "--listen-peer-urls"):
        assert flag(args, name).startswith("https://")
    assert flag(args, "--listen-metrics-urls") == "http://0.0.0.0:2381"  # no certificate
    probe = container(etcd)["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": "metrics"}
    pod = etcd["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"]) == (
        10001,
        10001,
    )

    server = decoded(find(docs, "Secret", "-etcd-server-tls"))
    peer = decoded(find(docs, "Secret", "-etcd-peer-tls"))
    client = decoded(find(docs, "Secret", "-etcd-client-tls"))
    load = x509.load_pem_x509_certificate
    clients_ca, peers_ca = load(server["ca.crt"]), load(peer["ca.crt"])
    assert clients_ca != peers_ca  # a client's certificate is no peer's
    load(server["tls.crt"]).verify_directly_issued_by(clients_ca)
    load(client["tls.crt"]).verify_directly_issued_by(clients_ca)  # etcd's --trusted-ca-file
    assert load(client["ca.crt"]) == clients_ca  # what the service checks etcd with
    load(peer["tls.crt"]).verify_directly_issued_by(peers_ca)
    cn = NameOID.COMMON_NAME
    peer_cn = load(peer["tls.crt"]).subject.get_attributes_for_oid(cn)[0].value
    assert flag(args, "--peer-cert-allowed-cn") == peer_cn == f"{ETCD}-peer"
    assert load(client["tls.crt"]).subject.get_attributes_for_oid(cn)[0].value == PLACEMENT
    usages = load(client["tls.crt"]).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages.value
    # etcd's JSON gateway dials etcd with the serving certificate: it must be a client's too
    usages = load(server["tls.crt"]).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages.value

    # every name a member is reached by, and 127.0.0.1 (etcdctl in the pod), verify
    advertised = [
        flag(args, "--advertise-client-urls").replace("$(POD_NAME)", f"{ETCD}-{i}")
        for i in range(3)
    ]
    assert advertised == [f"https://{member_names(i)[2]}:2379" for i in range(3)]
    initial = flag(args, "--initial-cluster").split(",")
    assert initial == [f"{ETCD}-{i}=https://{member_names(i)[2]}:2380" for i in range(3)]
    for i in range(3):
        for name in [*member_names(i), "127.0.0.1"]:
            assert verifies_for(server, name, tmp_path), name
            assert verifies_for(peer, name, tmp_path), name
    assert verifies_for(server, f"{ETCD}.{NAMESPACE}.svc", tmp_path)
    assert not verifies_for(server, f"{ETCD}-0.elsewhere.{NAMESPACE}.svc", tmp_path)
    assert not verifies_for(client, f"{ETCD}-0.{ETCD}.{NAMESPACE}.svc", tmp_path)

    # the service: https:// URLs, the client Secret mounted where its variables point
    placement = find(docs, "Deployment", "-placement")
    c = container(placement)
    assert c["args"][c["args"].index("--etcd") + 1].split(",") == [
        f"https://{member_names(i)[2]}:2379" for i in range(3)
    ]
    assert secret_mounts(placement) == {"/etc/o41-etcd-tls": f"{ETCD}-client-tls"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert EtcdTls.from_environment(env) == EtcdTls(
        "/etc/o41-etcd-tls/ca.crt", "/etc/o41-etcd-tls/tls.crt", "/etc/o41-etcd-tls/tls.key"
    )
    # no other workload holds a client certificate
    operator = find(docs, "Deployment", "-operator")
    assert f"{ETCD}-client-tls" not in secret_mounts(operator).values()


def test_etcd_tls_can_be_turned_off_and_is_not_made_for_an_external_etcd() -> None:
    docs = render("etcd.tls.enabled=false")
    etcd = find(docs, "StatefulSet", "-etcd")
    args = container(etcd)["args"]
    assert not [a for a in args if "cert" in a or "tls" in a]
    assert flag(args, "--listen-client-urls") == "http://0.0.0.0:2379"
    assert "https" not in flag(args, "--initial-cluster")
    assert secret_mounts(etcd) == {}
    assert not [d for d in docs if d["kind"] == "Secret" and "-etcd-" in d["metadata"]["name"]]
    placement = find(docs, "Deployment", "-placement")
    assert not [e for e in container(placement)["env"] if e["name"] in TLS_FILES]
    assert (
        "http://" in container(placement)["args"][container(placement)["args"].index("--etcd") + 1]
    )
    # an external etcd: nothing of the chart's etcd TLS, whatever etcd.tls says
    docs = render("etcd.external.endpoints[0]=https://etcd.db.svc:2379")
    assert not [d for d in docs if "-etcd-" in d["metadata"]["name"]]


def test_etcd_certificates_from_cert_manager_with_a_ca_of_the_charts_own() -> None:
    docs = render("etcd.tls.certManager.enabled=true")
    assert not [d for d in docs if d["kind"] == "Secret" and "-etcd-" in d["metadata"]["name"]]
    certificates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    # the chain: self-signed -> the chart's CA -> a CA issuer of that CA
    assert issuers[f"{ETCD}-selfsigned"]["spec"] == {"selfSigned": {}}
    ca = certificates.pop(f"{ETCD}-ca")
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"]["name"] == f"{ETCD}-selfsigned"
    assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"  # leaves outlive its renewal
    assert issuers[f"{ETCD}-ca"]["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert set(certificates) == {f"{ETCD}-server-tls", f"{ETCD}-peer-tls", f"{ETCD}-client-tls"}
    for cert in certificates.values():
        assert cert["spec"]["issuerRef"] == {
            "name": f"{ETCD}-ca",
            "kind": "Issuer",
            "group": "cert-manager.io",
        }
        assert cert["spec"]["secretName"] == cert["metadata"]["name"]
    # the Secrets cert-manager writes are the ones etcd and the service mount
    etcd = find(docs, "StatefulSet", "-etcd")
    assert set(secret_mounts(etcd).values()) == {f"{ETCD}-server-tls", f"{ETCD}-peer-tls"}
    placement = find(docs, "Deployment", "-placement")
    assert set(secret_mounts(placement).values()) == {f"{ETCD}-client-tls"}
    server = certificates[f"{ETCD}-server-tls"]["spec"]
    peer = certificates[f"{ETCD}-peer-tls"]["spec"]
    client = certificates[f"{ETCD}-client-tls"]["spec"]
    for i in range(3):
        assert set(member_names(i)) <= set(server["dnsNames"]) & set(peer["dnsNames"])
    assert set(server["usages"]) >= {"server auth", "client auth"}
    assert set(peer["usages"]) >= {"server auth", "client auth"}
    assert "server auth" not in client["usages"] and "client auth" in client["usages"]
    assert client["commonName"] == PLACEMENT
    # one CA signs clients and peers here: only the peers' name passes the peer port
    assert flag(container(etcd)["args"], "--peer-cert-allowed-cn") == peer["commonName"]
    assert client["commonName"] != peer["commonName"]


def test_etcd_certificates_from_an_issuer_of_yours() -> None:
    docs = render(
        "etcd.tls.certManager.enabled=true",
        "etcd.tls.certManager.issuerRef.name=corp-ca",
        "etcd.tls.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert "Issuer" not in kinds(docs)
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    assert len(certificates) == 3
    for cert in certificates:
        assert cert["spec"]["issuerRef"] == {
            "name": "corp-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }


# --- NetworkPolicies -----------------------------------------------------------------------


def rules(policy: Doc) -> dict[int, list[Doc] | None]:
    """port -> the peers it is open to (None: from anywhere)."""
    found: dict[int, list[Doc] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            found[port["port"]] = rule.get("from")
    return found


def selects(policy: Doc, workload: Doc) -> bool:
    return bool(
        policy["spec"]["podSelector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
    )


def test_network_policies_by_default_keep_etcd_to_the_service_and_metrics_closed() -> None:
    docs = render()
    etcd, placement = find(docs, "StatefulSet", "-etcd"), find(docs, "Deployment", "-placement")
    operator = find(docs, "Deployment", "-operator")
    only = {"placement": placement, "etcd": etcd}
    etcd_policy = find(docs, "NetworkPolicy", "-etcd")
    assert selects(etcd_policy, etcd) and etcd_policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in container(etcd)["ports"]}
    assert rules(etcd_policy) == {
        ports["client"]: [
            {"podSelector": {"matchLabels": only["placement"]["spec"]["selector"]["matchLabels"]}}
        ],
        ports["peer"]: [
            {"podSelector": {"matchLabels": only["etcd"]["spec"]["selector"]["matchLabels"]}}
        ],
    }  # and nothing for the metrics port: the kubelet's probes come from the node
    placement_policy = find(docs, "NetworkPolicy", "-placement")
    assert selects(placement_policy, placement)
    assert rules(placement_policy) == {8080: None}  # every job calls it; /metrics is on 9090
    operator_policy = find(docs, "NetworkPolicy", "-operator")
    assert selects(operator_policy, operator)
    assert rules(operator_policy) == {9443: None}  # the API server, which no policy can name
    assert "NetworkPolicy" not in kinds(render("networkPolicy.enabled=false"))


def test_network_policies_let_in_the_scrapers_and_the_peers_you_name() -> None:
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    control_plane = {"ipBlock": {"cidr": "10.0.0.0/28"}}
    jobs = {"namespaceSelector": {"matchLabels": {"o41": "jobs"}}}
    done = run_helm(
        "template", "o41", str(CHART), "--namespace", NAMESPACE,
        "--set-json", f"networkPolicy.metrics.from={json.dumps([monitoring])}",
        "--set-json", f"networkPolicy.admission.from={json.dumps([control_plane])}",
        "--set-json", f"networkPolicy.placement.from={json.dumps([jobs])}",
        "--set", "metrics.serviceMonitor.enabled=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert rules(find(docs, "NetworkPolicy", "-etcd"))[2381] == [monitoring]
    assert rules(find(docs, "NetworkPolicy", "-placement")) == {8080: [jobs], 9090: [monitoring]}
    assert rules(find(docs, "NetworkPolicy", "-operator")) == {
        9443: [control_plane],
        9091: [monitoring],
    }
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {ETCD, PLACEMENT, OPERATOR_METRICS}
    for name, monitor in monitors.items():
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        service = find(docs, "Service", name[len("o41-artifacts") :])
        assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )


def test_a_service_monitor_the_policy_would_block_is_refused_at_install() -> None:
    done = run_helm("template", "o41", str(CHART), "--set", "metrics.serviceMonitor.enabled=true")
    assert done.returncode != 0
    assert "name the scrapers in networkPolicy.metrics.from" in done.stderr
    both = ("metrics.serviceMonitor.enabled=true", "networkPolicy.enabled=false")
    assert kinds(render(*both)).count("ServiceMonitor") == 3


def test_schema_refuses_unknown_tls_and_policy_keys() -> None:
    for bad, where in (
        ("etcd.tls.enable=true", "at '/etcd/tls'"),
        ("etcd.tls.certManager.issuerRef.kind=Vault", "/etcd/tls/certManager/issuerRef/kind"),
        ("networkPolicy.metrics.to=x", "at '/networkPolicy/metrics'"),
        ("metrics.placementPort=80", "/metrics/placementPort"),
        ("metrics.placementPort=8080", "metrics.placementPort must differ from"),
    ):
        done = run_helm("template", "o41", str(CHART), "--set", bad)
        assert done.returncode != 0
        assert where in done.stderr, done.stderr
