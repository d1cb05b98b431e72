"""The chart's placement service reached from outside the cluster (issue 31, the hub):
HTTPS on the service's own port, the CA bundle clients hold, NodePort and LoadBalancer,
Ingress and HTTPRoute, and the NetworkPolicy. Rendered with `helm template` as
test_chart.py does (no cluster; helm from the test bed)."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from test_chart import (
    CHART,
    FOREIGN_KINDS,
    KUBE_VERSION,
    NAMESPACE,
    Doc,
    container,
    decoded,
    find,
    render,
    run_helm,
    verifies_for,
)
from test_chart_hygiene import checkov, documented, kube_score, of_the_hub, rendered

NAME = "o41-artifacts-placement"
SERVICE_NAMES = [
    NAME,
    f"{NAME}.{NAMESPACE}",
    f"{NAME}.{NAMESPACE}.svc",
    f"{NAME}.{NAMESPACE}.svc.cluster.local",
]
TLS = "placement.tls.enabled=true"
NODE_PORT = (TLS, "placement.service.type=NodePort", "placement.service.nodePort=30443")
INGRESS = (
    "placement.ingress.enabled=true",
    "placement.ingress.host=o41.example.com",
    "placement.ingress.className=nginx",
    "placement.ingress.tls.secretName=o41-public-tls",
    "placement.ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/backend-protocol=HTTPS",
    "placement.externalURL=https://o41.example.com",
    TLS,
)
ROUTE = (
    "placement.httpRoute.enabled=true",
    "placement.httpRoute.parentRefs[0].name=public",
    "placement.httpRoute.parentRefs[0].namespace=gateways",
    "placement.httpRoute.hostnames[0]=o41.example.com",
)
# the objects only these values make, by kind and name
NEW = {
    ("Secret", f"{NAME}-tls"),
    ("Secret", f"{NAME}-tls-ca"),
    ("ConfigMap", f"{NAME}-ca"),
    ("Certificate", NAME),
    ("Service", f"{NAME}-metrics"),
    ("Ingress", NAME),
    ("HTTPRoute", NAME),
}


def names(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def refused(*sets: str) -> str:
    argv = ["template", "o41", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        argv += ["--set", s]
    done = run_helm(*argv)
    assert done.returncode != 0, "rendered, but should have been refused"
    return done.stderr


def env(deployment: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(deployment)["env"]}


# --- off by default --------------------------------------------------------------------


def test_tls_off_the_defaults_render_the_placement_service_as_before() -> None:
    """A single-cluster install upgrades with nothing changed: none of the new objects,
    the Service's ports, the container's port, probes, env, args and volumes as they were."""
    docs = render()
    assert not names(docs) & NEW
    service = find(docs, "Service", "-placement")
    assert service["spec"]["type"] == "ClusterIP"
    assert "annotations" not in service["metadata"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"},
    ]
    deployment = find(docs, "Deployment", "-placement")
    c = container(deployment)
    assert c["ports"][0] == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert not {"O41_TLS_CERT_FILE", "O41_TLS_KEY_FILE"} & set(env(deployment))
    assert "--usage-page" not in c["args"]
    assert "/etc/o41-tls" not in [m["mountPath"] for m in c["volumeMounts"]]


# --- HTTPS on the service's port --------------------------------------------------------


def test_tls_with_the_charts_ca_names_the_service_and_the_external_host(tmp_path: Path) -> None:
    docs = render(TLS, "placement.externalURL=https://o41.example.com:8443/")
    serving = find(docs, "Secret", "-placement-tls")
    assert serving["type"] == "kubernetes.io/tls"
    pem = decoded(serving)
    bundle = find(docs, "ConfigMap", "-placement-ca")["data"]["ca.crt"]
    assert bundle.encode() == pem["ca.crt"]  # what clients hold is what signed the service
    for host in [*SERVICE_NAMES, "o41.example.com"]:
        assert verifies_for(pem, host, tmp_path), host
    assert not verifies_for(pem, "elsewhere.example.com", tmp_path)
    assert serving["metadata"]["annotations"]["artifacts.o41.io/names"] == ",".join(
        [*SERVICE_NAMES, "o41.example.com"]
    )
    # the CA's key is in a Secret of its own, mounted nowhere
    ca = decoded(find(docs, "Secret", "-placement-tls-ca"))
    assert ca["tls.crt"] == pem["ca.crt"]
    assert (
        x509.load_pem_x509_certificate(ca["tls.crt"])
        .extensions.get_extension_for_class(x509.BasicConstraints)
        .value.ca
    )
    mounted = [
        v["secret"]["secretName"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        for v in d["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    ]
    assert f"{NAME}-tls-ca" not in mounted


def test_an_external_address_goes_into_the_certificate_as_an_ip(tmp_path: Path) -> None:
    docs = render(*NODE_PORT, "placement.externalURL=https://203.0.113.7:30443")
    pem = decoded(find(docs, "Secret", "-placement-tls"))
    cert = x509.load_pem_x509_certificate(pem["tls.crt"])
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in alt.get_values_for_type(x509.IPAddress)] == ["203.0.113.7"]
    assert verifies_for(pem, "203.0.113.7", tmp_path)


def test_tls_mounts_the_secret_sets_the_variables_and_probes_over_https() -> None:
    docs = render(TLS)
    deployment = find(docs, "Deployment", "-placement")
    c = container(deployment)
    assert env(deployment)["O41_TLS_CERT_FILE"] == "/etc/o41-tls/tls.crt"
    assert env(deployment)["O41_TLS_KEY_FILE"] == "/etc/o41-tls/tls.key"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/o41-tls"]
    assert mount["readOnly"] is True
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["secret"] == {"secretName": f"{NAME}-tls", "defaultMode": 0o440}
    assert c["ports"][0] == {"name": "https", "containerPort": 8080, "protocol": "TCP"}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    service = find(docs, "Service", "-placement")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0] == {
        "name": "https",
        "port": 8080,
        "targetPort": "https",
        "protocol": "TCP",
        "appProtocol": "https",
    }
    assert service["spec"]["ports"][1]["name"] == "metrics"  # ClusterIP: it stays here
    assert "--usage-page" not in c["args"]  # not exposed: the page stays (port-forward)


def test_tls_from_your_issuer_renders_a_certificate_and_no_generated_secret() -> None:
    docs = render(
        TLS,
        "placement.tls.certManager.issuerRef.name=corp-ca",
        "placement.tls.certManager.issuerRef.kind=ClusterIssuer",
        "placement.externalURL=https://203.0.113.7:8443",
    )
    certificate = find(docs, "Certificate", "-placement")
    spec = certificate["spec"]
    assert spec["secretName"] == f"{NAME}-tls"
    assert spec["dnsNames"] == SERVICE_NAMES
    assert spec["ipAddresses"] == ["203.0.113.7"]
    assert spec["usages"] == ["digital signature", "server auth"]
    assert spec["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert not {("Secret", f"{NAME}-tls"), ("Secret", f"{NAME}-tls-ca")} & names(docs)
    assert ("ConfigMap", f"{NAME}-ca") not in names(docs)  # no bundle given: none published
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    argv = ["template", "o41", str(CHART), "-n", NAMESPACE, "--set", TLS]
    argv += ["--set", "placement.tls.certManager.issuerRef.name=corp-ca"]
    argv += ["--set-string", f"placement.tls.certManager.caBundle={pem}"]
    done = run_helm(*argv)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert find(docs, "ConfigMap", "-placement-ca")["data"]["ca.crt"] == pem + "\n"


# --- exposure: NodePort, LoadBalancer, Ingress, HTTPRoute ------------------------------


def test_a_node_port_keeps_metrics_inside_and_turns_the_usage_page_off() -> None:
    docs = render(*NODE_PORT)
    service = find(docs, "Service", "-placement")
    assert service["spec"]["type"] == "NodePort"
    (api,) = service["spec"]["ports"]  # the metrics port is not on the exposed Service
    assert (api["name"], api["nodePort"], api["targetPort"]) == ("https", 30443, "https")
    metrics = find(docs, "Service", "-placement-metrics")
    assert metrics["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in metrics["spec"]["ports"]] == [9090]
    assert metrics["spec"]["selector"] == service["spec"]["selector"]
    args = container(find(docs, "Deployment", "-placement"))["args"]
    assert args[args.index("--usage-page") + 1] == "off"
    kept = container(
        find(render(*NODE_PORT, "placement.usagePage.exposed=true"), "Deployment", "-placement")
    )
    assert "--usage-page" not in kept["args"]


def test_a_load_balancer_takes_annotations_and_source_ranges() -> None:
    docs = render(
        TLS,
        "placement.service.type=LoadBalancer",
        "placement.service.annotations.service\\.beta\\.kubernetes\\.io/aws-load-balancer-scheme=internal",
        "placement.service.loadBalancerSourceRanges[0]=198.51.100.0/24",
    )
    service = find(docs, "Service", "-placement")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]
    assert service["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"
    }
    assert [p["name"] for p in service["spec"]["ports"]] == ["https"]
    assert find(docs, "Service", "-placement-metrics")


def routed(paths: list[tuple[str, str]]) -> None:
    """Exactly /v1/ by prefix and /openapi.json exactly: never /usage, /metrics, /healthz."""
    assert sorted(paths) == [("/openapi.json", "Exact"), ("/v1/", "Prefix")]


def test_the_ingress_routes_only_the_api_and_its_description() -> None:
    docs = render(*INGRESS)
    ingress = find(docs, "Ingress", "-placement")
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["o41.example.com"], "secretName": "o41-public-tls"}]
    assert ingress["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/backend-protocol": "HTTPS"
    }
    (rule,) = spec["rules"]
    assert rule["host"] == "o41.example.com"
    paths = rule["http"]["paths"]
    routed([(p["path"], p["pathType"]) for p in paths])
    for p in paths:
        assert p["backend"] == {"service": {"name": NAME, "port": {"name": "https"}}}
    assert find(docs, "Service", "-placement")["spec"]["type"] == "ClusterIP"
    # plain HTTP to the pods (TLS at the Ingress): the port is named http
    plain = find(render(*[s for s in INGRESS if s != TLS]), "Ingress", "-placement")
    for p in plain["spec"]["rules"][0]["http"]["paths"]:
        assert p["backend"]["service"]["port"] == {"name": "http"}


def test_the_http_route_routes_only_the_api_and_its_description() -> None:
    route = find(render(*ROUTE), "HTTPRoute", "-placement")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    spec = route["spec"]
    assert spec["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
    assert spec["hostnames"] == ["o41.example.com"]
    (rule,) = spec["rules"]
    routed(
        [
            (m["path"]["value"], m["path"]["type"].replace("PathPrefix", "Prefix"))
            for m in rule["matches"]
        ]
    )
    assert rule["backendRefs"] == [{"name": NAME, "port": 8080}]


# --- the NetworkPolicy ------------------------------------------------------------------


def api_rules(docs: list[Doc]) -> list[Any]:
    """The placement policy's rules for the API port: each rule's peers (None: anywhere)."""
    policy = find(docs, "NetworkPolicy", "-placement")
    return [r.get("from") for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 8080]


JOBS = "networkPolicy.placement.from[0].namespaceSelector.matchLabels.o41=jobs"
CONTROLLER = "networkPolicy.placement.externalFrom[0].namespaceSelector.matchLabels.team=ingress"


@pytest.mark.parametrize(
    "exposure", [INGRESS, ROUTE, NODE_PORT], ids=["ingress", "route", "nodeport"]
)
def test_the_policy_lets_outside_traffic_in_when_exposed(exposure: tuple[str, ...]) -> None:
    jobs = [{"namespaceSelector": {"matchLabels": {"o41": "jobs"}}}]
    controller = [{"namespaceSelector": {"matchLabels": {"team": "ingress"}}}]
    assert api_rules(render(JOBS)) == [jobs]  # not exposed: as before
    assert api_rules(render(*exposure)) == [None]  # from anywhere already
    assert api_rules(render(*exposure, JOBS)) == [jobs, None]  # outside: from anywhere
    assert api_rules(render(*exposure, JOBS, CONTROLLER)) == [jobs, controller]


# --- refusals and validity --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (("placement.service.type=NodePort",), "set placement.tls.enabled=true"),
        (("placement.service.type=LoadBalancer",), "set placement.tls.enabled=true"),
        (("placement.service.nodePort=30443",), "set type NodePort"),
        (
            (TLS, "placement.service.loadBalancerSourceRanges[0]=10.0.0.0/8"),
            "set type LoadBalancer",
        ),
        (("placement.ingress.enabled=true",), "needs placement.ingress.host"),
        (("placement.httpRoute.enabled=true",), "needs placement.httpRoute.parentRefs"),
        (("placement.tls.certManager.issuerRef.name=corp",), "set placement.tls.enabled=true"),
        ((TLS, "placement.tls.certManager.caBundle=x"), "name your issuer"),
        (("placement.externalURL=o41.example.com",), "externalURL"),
        (("placement.tls.enable=true",), "additional properties 'enable' not allowed"),
        (("placement.ingress.path=/",), "additional properties 'path' not allowed"),
        (("networkPolicy.placement.external=x",), "additional properties 'external' not allowed"),
    ],
)
def test_values_that_cannot_work_are_refused_saying_what_to_set(
    sets: tuple[str, ...], says: str
) -> None:
    assert says in refused(*sets)


@pytest.mark.parametrize(
    "sets",
    [
        (TLS, "placement.externalURL=https://o41.example.com"),
        (TLS, "placement.tls.certManager.issuerRef.name=corp-ca"),
        NODE_PORT,
        (
            TLS,
            "placement.service.type=LoadBalancer",
            "placement.service.loadBalancerSourceRanges[0]=198.51.100.0/24",
        ),
        INGRESS,
        (*ROUTE, JOBS, CONTROLLER),
    ],
    ids=["tls", "tls-issuer", "nodeport", "loadbalancer", "ingress", "httproute"],
)
def test_lint_and_the_kubernetes_1_37_schemas_pass_with_the_hub_values(
    sets: tuple[str, ...],
) -> None:
    lint = run_helm("lint", "--strict", str(CHART), *[a for s in sets for a in ("--set", s)])
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for doc in render(*sets):
        if doc["kind"] in FOREIGN_KINDS | {"HTTPRoute"}:  # no schema bundled: by shape above
            assert doc["apiVersion"].split("/")[0] in (
                "cert-manager.io",
                "monitoring.coreos.com",
                "gateway.networking.k8s.io",
            )
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_ca_bundle_is_a_pem_clients_can_load(tmp_path: Path) -> None:
    bundle = find(render(TLS), "ConfigMap", "-placement-ca")["data"]["ca.crt"]
    assert bundle.startswith("-----BEGIN CERTIFICATE-----\n")
    assert bundle.endswith("-----END CERTIFICATE-----\n")
    (tmp_path / "ca.crt").write_text(bundle)
    ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))  # loads, or raises
    assert base64.b64decode(find(render(TLS), "Secret", "-placement-tls")["data"]["ca.crt"])


# --- hygiene: kube-score and checkov on the hub's objects ---------------------------------

# kube-score's one finding on the hub's values, by choice: a NodePort Service is what
# placement.service.type=NodePort asks for (docs/chart.md, "Reaching the service from
# outside"); the table of "not fixed" rows is of the default chart, where it cannot happen.
NODE_PORT_FINDING = ("kube-score", "service-type", "placement", "The service is of type NodePort")


@pytest.mark.parametrize(
    ("sets", "extra"),
    [
        (
            (*NODE_PORT, "placement.externalURL=https://203.0.113.7:30443", *INGRESS[:-1], *ROUTE),
            {NODE_PORT_FINDING},
        ),
        (
            (
                TLS,
                "placement.service.type=LoadBalancer",
                "placement.tls.certManager.issuerRef.name=corp-ca",
            ),
            set(),
        ),
    ],
    ids=["nodeport-ingress-route", "loadbalancer-cert-manager"],
)
def test_kube_score_and_checkov_find_nothing_new_on_the_hubs_objects(
    sets: tuple[str, ...], extra: set[tuple[str, str, str, str]], tmp_path: Path
) -> None:
    allowed, _ = documented()
    manifest = rendered(tmp_path, *sets)
    assert kube_score(manifest) == of_the_hub(allowed, "kube-score") | extra
    found, attempts = checkov(manifest, tmp_path)
    assert attempts == []
    assert found == of_the_hub(allowed, "checkov")
