"""The Helm chart, rendered: lint, the schema of values, the Kubernetes 1.37 schemas, and
what the important templates say (no cluster needed; helm is the test bed's pinned one).
"""

from __future__ import annotations

import base64
import filecmp
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from o41.state import EtcdTls
from o41.testbed.kube import bin_dir

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "o41-artifacts"
NAMESPACE = "o41-system"
KUBE_VERSION = "1.37.0"  # the schemas kubernetes-validate bundles for our control plane
# Kinds of other projects' CRDs: no schema in kubernetes-validate; checked by their shape.
FOREIGN_KINDS = {"Certificate", "Issuer", "ServiceMonitor"}

Doc = dict[str, Any]


@cache
def helm() -> str:
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
        ("webhook.tls.certManager.enabled=true",),
        ("etcd.external.endpoints[0]=http://etcd.db.svc:2379", "networkPolicy.enabled=true"),
        ("networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true"),
        ("etcd.persistence.enabled=false", "placement.pdb.enabled=false", "rbac.create=false"),
        (
            "etcd.external.endpoints[0]=https://etcd.db.svc:2379",
            "etcd.external.tls.secretName=etcd-client",
            "placement.prices.asOf=2026-12-01",
        ),
    ],
    ids=["defaults", "cert-manager", "external-etcd", "netpol-monitor", "minimal", "etcd-tls"],
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
    done = run_helm("template", "o41", str(CHART), "--set", "webhook.failurePolicy=Maybe")
    assert done.returncode != 0
    assert "/webhook/failurePolicy" in done.stderr


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
        + ["Service"] * 3
        + ["PodDisruptionBudget"] * 2
        + ["StatefulSet", "Secret", "ValidatingWebhookConfiguration"]
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
            f"o41-o41-artifacts-etcd-{i}=http://o41-o41-artifacts-etcd-{i}"
            f".o41-o41-artifacts-etcd.{NAMESPACE}.svc:2380"
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
    assert volumes == [{"name": "data", "emptyDir": {}}]


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
    ]  # fmt: skip
    env = {e["name"]: e for e in c["env"]}
    assert env["O41_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    assert env["MALLOC_ARENA_MAX"]["value"] == "2"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"webhook": 9443, "health": 8080}
    tls = next(v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == find(docs, "Secret")["metadata"]["name"]


def test_placement_replicas_probes_args_and_pdb() -> None:
    docs = render("placement.replicas=5")
    placement = find(docs, "Deployment", "-placement")
    assert placement["spec"]["replicas"] == 5
    c = container(placement)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    etcd = "o41-o41-artifacts-etcd"
    endpoints = ",".join(f"http://{etcd}-{i}.{etcd}.{NAMESPACE}.svc:2379" for i in range(3))
    assert c["args"] == [
        "python", "-m", "o41.webhook", "--host", "0.0.0.0", "--port", "8080",
        "--etcd", endpoints, "--secrets-namespace", NAMESPACE,
        "--authentication", "tokenreview",
    ]  # fmt: skip
    pdb = find(docs, "PodDisruptionBudget", "-placement")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == placement["spec"]["selector"]
    service = find(docs, "Service", "-placement")
    assert service["spec"]["ports"][0]["port"] == 8080
    assert service["spec"]["selector"] == placement["spec"]["selector"]["matchLabels"]


def test_external_etcd_deploys_no_etcd_and_is_what_the_service_uses() -> None:
    urls = ["http://etcd-0.db.svc:2379", "http://etcd-1.db.svc:2379"]
    docs = render(*(f"etcd.external.endpoints[{i}]={u}" for i, u in enumerate(urls)))
    assert "StatefulSet" not in kinds(docs)
    assert not [d for d in docs if d["metadata"]["name"].endswith("-etcd")]
    args = container(find(docs, "Deployment", "-placement"))["args"]
    assert args[args.index("--etcd") + 1] == ",".join(urls)


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
    assert not [e for e in container(placement)["env"] if e["name"].startswith("O41_ETCD_")]
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
    assert f"o41-o41-artifacts-operator.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)


def test_cert_manager_switch_issues_the_certificate_and_injects_the_ca() -> None:
    docs = render("webhook.tls.certManager.enabled=true")
    assert "Secret" not in kinds(docs)
    cert = find(docs, "Certificate")
    issuer = find(docs, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert cert["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert f"o41-o41-artifacts-operator.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
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
        "webhook.tls.certManager.enabled=true",
        "webhook.tls.certManager.issuerRef.name=corp-ca",
        "webhook.tls.certManager.issuerRef.kind=ClusterIssuer",
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
    crud = {(g, r, v) for r in ("locations", "organizations") for v in ("get", "list", "watch")}
    assert rules_of(docs, "ClusterRole", "-operator") == crud | {
        (g, "locations", "patch"),
        (g, "organizations", "patch"),
        *((g, f"{r}/status", v) for r in ("locations", "organizations") for v in ("get", "patch")),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    # the placement service writes no Location or Organization, status included
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


def test_service_monitor_and_network_policies_when_enabled() -> None:
    assert "NetworkPolicy" not in kinds(render())
    docs = render("networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true")
    assert kinds(docs).count("NetworkPolicy") == 3
    etcd_policy = find(docs, "NetworkPolicy", "-etcd")
    client_rule = next(r for r in etcd_policy["spec"]["ingress"] if r["ports"][0]["port"] == 2379)
    placement = find(docs, "Deployment", "-placement")
    assert client_rule["from"] == [
        {"podSelector": {"matchLabels": placement["spec"]["selector"]["matchLabels"]}}
    ]
    monitor = find(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


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
    from o41.webhook.prices import load_prices

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
