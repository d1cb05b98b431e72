"""The o41-remote chart's collections tier (issue 40, point 1), rendered: off by default
(the render is then byte for byte what it was before the tier existed), and with
``collections.enabled`` the tier's Deployment, Service, ServiceAccount and TokenReview-only
RBAC, a 3-member etcd over TLS with its certificates, PodDisruptionBudgets and
NetworkPolicies, and the hub ConfigMap's ``collectionsEndpoint``; no setting of artifacts
reaches the tier. The install is tests/chart/test_chart_remote.py's (a second control
plane) and tests/real/test_real_remote_tier.py's (real pods)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from test_chart import KUBE_VERSION, NAMESPACE, run_helm
from test_chart_hygiene import REMOTE as REMOTE_ROW
from test_chart_hygiene import Finding, _explain, checkov, documented, kube_score
from test_chart_remote import HUB, REMOTE

Doc = dict[str, Any]
TIER = "w-o41-remote-collections"
ETCD = "w-o41-remote-etcd"
ON = ("--set", f"hub.endpoint={HUB}", "--set", "collections.enabled=true")
VERSION = yaml.safe_load((REMOTE / "Chart.yaml").read_text())["version"]

# `helm template w charts/o41-remote -n ml --set hub.endpoint=...` as the chart rendered it
# before the tier (main at ade0cd5): the default must stay exactly this, so that an
# upgrade of an existing install changes nothing.
BEFORE = """---
# Source: o41-remote/templates/hub.yaml
# Where pods find the hub: mount it and point the SDK at it (docs/multi-cluster.md).
apiVersion: v1
kind: ConfigMap
metadata:
  name: w-o41-remote-hub
  namespace: ml
  labels:
    app.kubernetes.io/name: o41-remote
    app.kubernetes.io/instance: w
    app.kubernetes.io/managed-by: Helm
    app.kubernetes.io/part-of: o41-artifacts
    helm.sh/chart: o41-remote-{version}
data:
  endpoint: "{hub}"
  audience: "o41"
"""
BEFORE_DISCOVERY = """---
# Source: o41-remote/templates/discovery.yaml
# The hub's operator fetches this cluster's issuer keys without credentials (OIDC
# discovery and the JWKS: public keys only).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: w-o41-remote-issuer-discovery
  labels:
    app.kubernetes.io/name: o41-remote
    app.kubernetes.io/instance: w
    app.kubernetes.io/managed-by: Helm
    app.kubernetes.io/part-of: o41-artifacts
    helm.sh/chart: o41-remote-{version}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:service-account-issuer-discovery
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: Group
    name: system:unauthenticated
"""


def template(*args: str) -> str:
    done = run_helm("template", "w", str(REMOTE), "--namespace", "ml", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(*args: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(template(*args)) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(d["kind"], d["metadata"]["name"]) for d in docs])
    return found[0]


def container(workload: Doc) -> Doc:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    result: Doc = only
    return result


def test_off_by_default_the_render_is_byte_for_byte_what_it_was() -> None:
    before = BEFORE.format(version=VERSION, hub=HUB)
    assert template("--set", f"hub.endpoint={HUB}") == before
    assert template("--set", f"hub.endpoint={HUB}", "--set", "collections.enabled=false") == before
    with_discovery = template("--set", f"hub.endpoint={HUB}", "--set", "publicIssuerDiscovery=true")
    assert with_discovery == before + BEFORE_DISCOVERY.format(version=VERSION)


def test_enabled_it_renders_the_tier_its_etcd_and_the_endpoint_for_pods() -> None:
    docs = render(*ON)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        [
            ("ConfigMap", "w-o41-remote-hub"),
            ("ServiceAccount", TIER),
            ("ClusterRole", TIER),
            ("ClusterRoleBinding", TIER),
            ("Deployment", TIER),
            ("Service", TIER),
            ("PodDisruptionBudget", TIER),
            ("NetworkPolicy", TIER),
            ("ServiceAccount", ETCD),
            ("Service", ETCD),
            ("StatefulSet", ETCD),
            ("PodDisruptionBudget", ETCD),
            ("NetworkPolicy", ETCD),
            ("Secret", f"{ETCD}-server-tls"),
            ("Secret", f"{ETCD}-peer-tls"),
            ("Secret", f"{ETCD}-client-tls"),
        ]
    )
    hub = one(docs, "ConfigMap", "w-o41-remote-hub")
    assert hub["data"] == {
        "endpoint": HUB,
        "audience": "o41",
        "collectionsEndpoint": f"http://{TIER}.ml.svc:8080",
    }
    service = one(docs, "Service", TIER)
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http", 8080),
        ("metrics", 9090),
    ]

    tier = one(docs, "Deployment", TIER)
    assert tier["spec"]["replicas"] == 2
    spec = tier["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == TIER
    main = container(tier)
    assert main["image"] == f"ghcr.io/o41/o41-artifacts:{VERSION}"
    urls = ",".join(f"https://{ETCD}-{i}.{ETCD}.ml.svc:2379" for i in range(3))
    assert main["args"] == [
        "python", "-m", "o41.webhook", "--serve", "collections",
        "--host", "0.0.0.0", "--port", "8080", "--metrics-port", "9090",
        "--etcd", urls, "--audience", "o41", "--log-format", "text",
    ]  # fmt: skip
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["O41_ETCD_CA_FILE"] == "/etc/o41-etcd-tls/ca.crt"
    assert env["O41_ETCD_CERT_FILE"] == "/etc/o41-etcd-tls/tls.crt"
    assert env["O41_ETCD_KEY_FILE"] == "/etc/o41-etcd-tls/tls.key"
    assert env["O41_COLLECTIONS_QUOTA_ENTRIES"] == "50000"
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "etcd-tls": "/etc/o41-etcd-tls"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["etcd-tls"]["secret"] == {
        "secretName": f"{ETCD}-client-tls",
        "defaultMode": 0o440,
    }
    # the hub's service's contexts: non-root, read-only root, nothing dropped back
    assert spec["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert main["securityContext"] == {
        "runAsNonRoot": True, "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["resources"]["requests"]["memory"] == "128Mi"
    assert main["resources"]["limits"]["memory"] == "512Mi"

    etcd = one(docs, "StatefulSet", ETCD)
    assert etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    member = container(etcd)
    assert member["image"] == "quay.io/coreos/etcd:v3.6.16"
    assert member["securityContext"] == main["securityContext"]
    assert etcd["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    args = member["args"]
    for flag in ("--client-cert-auth", "--peer-client-cert-auth",
                 f"--peer-cert-allowed-cn={ETCD}-peer",
                 "--listen-client-urls=https://0.0.0.0:2379"):  # fmt: skip
        assert flag in args, flag
    peers = ",".join(f"{ETCD}-{i}=https://{ETCD}-{i}.{ETCD}.ml.svc:2380" for i in range(3))
    assert f"--initial-cluster={peers}" in args
    (claim,) = etcd["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    for name in (TIER, ETCD):
        assert one(docs, "PodDisruptionBudget", name)["spec"]["maxUnavailable"] == 1


def test_its_only_permission_is_to_create_tokenreviews() -> None:
    docs = render(*ON)
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    assert [r["rules"] for r in roles] == [
        [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
          "verbs": ["create"]}]
    ]  # fmt: skip
    (binding,) = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert binding["roleRef"]["name"] == TIER
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": TIER, "namespace": "ml"}]
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts[TIER]["automountServiceAccountToken"] is True  # its TokenReviews
    assert accounts[ETCD]["automountServiceAccountToken"] is False


def test_no_setting_of_artifacts_reaches_the_tier() -> None:
    main = container(one(render(*ON), "Deployment", TIER))
    flags = [a for a in main["args"] if a.startswith("--")]
    assert flags == ["--serve", "--host", "--port", "--metrics-port", "--etcd", "--audience",
                     "--log-format"]  # fmt: skip
    env = {e["name"] for e in main["env"]}
    assert not {n for n in env if n.startswith("O41_ARTIFACTS_")}
    assert "O41_PRICES_FILE" not in env
    assert not {n for n in env if n.startswith(("O41_TLS_", "O41_TRUST_", "O41_OWN_"))}


def test_etcd_is_reachable_only_from_the_tier() -> None:
    docs = render(*ON)
    policy = one(docs, "NetworkPolicy", ETCD)
    tier_pods = {"app.kubernetes.io/name": "o41-remote", "app.kubernetes.io/instance": "w",
                 "app.kubernetes.io/component": "collections"}  # fmt: skip
    members = {**tier_pods, "app.kubernetes.io/component": "etcd"}
    assert policy["spec"]["podSelector"]["matchLabels"] == members
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": 2379, "protocol": "TCP"}],
         "from": [{"podSelector": {"matchLabels": tier_pods}}]},
        {"ports": [{"port": 2380, "protocol": "TCP"}],
         "from": [{"podSelector": {"matchLabels": members}}]},
    ]  # fmt: skip
    # the tier's API port from any pod (every job calls it), its metrics port from no one
    tier = one(docs, "NetworkPolicy", TIER)
    assert tier["spec"]["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    scrapers = [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]
    docs = render(*ON, "--set", "collections.networkPolicy.metricsFrom[0]"
                  ".namespaceSelector.matchLabels.team=monitoring")  # fmt: skip
    assert {"ports": [{"port": 2381, "protocol": "TCP"}], "from": scrapers} in one(
        docs, "NetworkPolicy", ETCD
    )["spec"]["ingress"]
    assert not [
        d for d in render(*ON, "--set", "collections.networkPolicy.enabled=false")
        if d["kind"] == "NetworkPolicy"
    ]  # fmt: skip


def certificate(secret: Doc, key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"][key]))


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def cn(cert: x509.Certificate) -> object:
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def test_its_etcd_certificates_name_the_members_and_only_the_tier_holds_a_client_one() -> None:
    docs = render(*ON)
    server = one(docs, "Secret", f"{ETCD}-server-tls")
    peer = one(docs, "Secret", f"{ETCD}-peer-tls")
    client = one(docs, "Secret", f"{ETCD}-client-tls")
    clients_ca, peers_ca = certificate(server, "ca.crt"), certificate(peer, "ca.crt")
    assert clients_ca.subject != peers_ca.subject
    # the tier trusts what signed the members' serving certificate, and shows one of it
    assert certificate(client, "ca.crt") == clients_ca
    assert signed_by(certificate(server), clients_ca)
    assert signed_by(certificate(client), clients_ca)
    assert not signed_by(certificate(client), peers_ca)  # never a peer
    assert signed_by(certificate(peer), peers_ca)
    assert cn(certificate(client)) == TIER
    assert cn(certificate(peer)) == f"{ETCD}-peer"  # what --peer-cert-allowed-cn lets in
    names = certificate(server).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    dns = set(names.value.get_values_for_type(x509.DNSName))
    for i in range(3):
        assert f"{ETCD}-{i}.{ETCD}.ml.svc" in dns
    assert f"*.{ETCD}.ml.svc" in dns
    usages = certificate(client).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages.value


@pytest.mark.parametrize(
    "sets",
    [
        (),
        (
            "collections.etcd.persistence.enabled=false",
            "collections.pdb.enabled=false",
            "collections.etcd.pdb.enabled=false",
            "collections.networkPolicy.enabled=false",
            "collections.replicas=3",
        ),
        (
            f"image.digest=sha256:{'ab' * 32}",
            f"collections.etcd.image.digest=sha256:{'cd' * 32}",
            "global.imageRegistry=mirror.corp:5000",
            "global.imagePullSecrets[0]=corp",
            "podSecurityContext.runAsUser=null",
            "collections.networkPolicy.from[0].namespaceSelector.matchLabels.o41=jobs",
        ),
    ],
    ids=["defaults", "minimal", "production-knobs"],
)
def test_lint_and_the_enabled_render_match_the_kubernetes_1_37_schemas(
    sets: tuple[str, ...],
) -> None:
    argv = [*ON, *[a for s in sets for a in ("--set", s)]]
    lint = run_helm("lint", "--strict", str(REMOTE), *argv)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(*argv)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    if "global.imageRegistry=mirror.corp:5000" in sets:
        images = {container(d)["image"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
        assert images == {
            f"mirror.corp:5000/o41/o41-artifacts@sha256:{'ab' * 32}",
            f"mirror.corp:5000/coreos/etcd@sha256:{'cd' * 32}",
        }
        for d in docs:
            if d["kind"] in ("Deployment", "StatefulSet"):
                assert d["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "corp"}]


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (("collections.replica=3",), "additional properties 'replica' not allowed"),
        (("collections.etcd.image.digest=latest",), "/collections/etcd/image/digest"),
        (("collections.metricsPort=8080",), "collections.metricsPort must differ"),
        (("collections.logFormat=xml",), "/collections/logFormat"),
    ],
)
def test_bad_tier_values_are_refused_with_their_path(sets: tuple[str, ...], said: str) -> None:
    done = run_helm("template", "w", str(REMOTE), *ON, *[a for s in sets for a in ("--set", s)])
    assert done.returncode != 0 and said in done.stderr, done.stderr


def remote_findings(found: set[Finding]) -> set[Finding]:
    """The checkers' findings with the table's names of the remote chart's objects."""
    return {(tool, check, REMOTE_ROW + obj.removeprefix("w-o41-remote-"), what)
            for tool, check, obj, what in found}  # fmt: skip


def enabled_manifest(tmp_path: Path) -> Path:
    done = run_helm("template", "w", str(REMOTE), "--namespace", NAMESPACE, *ON)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "remote.yaml"
    out.write_text(done.stdout)
    return out


def test_kube_score_and_checkov_find_nothing_undocumented_in_the_tier(tmp_path: Path) -> None:
    """docs/chart.md's hygiene table holds the remote chart's rows too (objects
    remote-collections, remote-etcd): the same choices as the hub chart's."""
    allowed, fixed = documented()
    manifest = enabled_manifest(tmp_path)
    found = remote_findings(kube_score(manifest))
    mine = {f for f in allowed if f[0] == "kube-score" and f[2].startswith(REMOTE_ROW)}
    assert found == mine, _explain(found - mine, mine - found)
    found_checkov, attempts = checkov(manifest, tmp_path)
    assert attempts == [], attempts
    found = remote_findings(found_checkov)
    mine = {f for f in allowed if f[0] == "checkov" and f[2].startswith(REMOTE_ROW)}
    assert found == mine, _explain(found - mine, mine - found)
    assert not found & fixed
