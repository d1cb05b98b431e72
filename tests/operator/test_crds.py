"""The CRDs in crds/ are generated from o41.kube.api, and the API server accepts them."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41.kube.crd import (
    IMMUTABLE,
    ISSUER_IMMUTABLE,
    ONE_KEY_SOURCE,
    TRUST_DOMAIN_NAME_RULE,
    rendered,
)
from testbed.kube import Kube, kubectl_binary

from support import wait_for

CRDS = Path(__file__).resolve().parents[2] / "crds"


def test_crds_are_generated_from_the_models() -> None:
    expected = rendered()
    on_disk = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    assert on_disk == expected, (
        "crds/ drifted from o41/kube/api.py: run `python -m o41.kube.crd crds/`"
    )


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    def walk(node: dict[str, Any], path: str) -> list[str]:
        missing = []
        for name, child in (node.get("properties") or {}).items():
            where = f"{path}.{name}"
            if name not in ("apiVersion", "kind", "metadata", "status", "conditions") and (
                path.startswith(".spec") and "description" not in child
            ):
                missing.append(where)
            missing += walk(child, where)
        return missing

    for text in rendered().values():
        crd = yaml.safe_load(text)
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert walk(schema["properties"]["spec"], ".spec") == []


@pytest.mark.kube
def test_api_server_accepts_the_crds_with_names_and_columns(kube: Kube) -> None:
    kube.kubectl("apply", "--server-side", "-f", str(CRDS))
    for plural in ("locations", "organizations", "trustdomains"):
        crd = f"crd/{plural}.artifacts.o41.io"
        kube.kubectl("wait", "--for=condition=Established", crd, "--timeout=60s")
    resources = kube.kubectl("api-resources", "--api-group=artifacts.o41.io", "-o", "wide")
    assert "loc,locs" in resources and "org,orgs" in resources and "td,tds" in resources
    assert "o41" in kube.kubectl("api-resources", "--categories=o41", "-o", "name")

    # the API server publishes a new CRD's OpenAPI a moment after it is Established
    def explained() -> str | None:
        out = kube.kubectl("explain", "location.spec.retired", check=False)
        return out if "takes no new writes" in out else None

    assert "retired" in wait_for(explained, 60, "kubectl explain to show the description")
    crd = json.loads(kube.kubectl("get", "crd", "locations.artifacts.o41.io", "-o", "json"))
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:6] == ["Organization", "Cloud", "Region", "Ready", "Role", "Retired"]
    crd = json.loads(kube.kubectl("get", "crd", "trustdomains.artifacts.o41.io", "-o", "json"))
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Issuer", "Ready", "Reason", "Keys", "Fetched", "Age"]


# --- immutability: what says where the versions live, refused by CEL in the API server ---

CLOSED = "http://127.0.0.1:9"  # loopback, nothing listens: no operator call leaves the host

BACKENDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "s3": ("aws", "us-east-1", {"s3": {"endpoint": CLOSED}}),
    "gcs": ("gcp", "us-central1", {"gcs": {"endpoint": CLOSED}}),
    "azureBlob": ("azure", "westeurope", {"azureBlob": {"accountUrl": f"{CLOSED}/acct"}}),
    "s3Compatible": ("nebius", "eu-north1", {"s3Compatible": {"endpoint": CLOSED}}),
}


def immutable(field: str) -> str:
    """The whole line kubectl prints for a refused change of ``field``."""
    return IMMUTABLE.format(field=field)


def new_location(kube: Kube, kind: str, **spec: Any) -> str:
    cloud, region, backend = BACKENDS[kind]
    name = f"cel-{kind.lower()}-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "artifacts.o41.io/v1alpha1",
        "kind": "Location",
        "metadata": {"name": name},
        "spec": {
            "organization": "cel-checks",
            "cloud": cloud,
            "region": region,
            "backend": backend,
            "credentials": {"secretName": "first"},
            **spec,
        },
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(body))
    return name


def patch(kube: Kube, name: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            kubectl_binary(),
            f"--kubeconfig={kube.kubeconfig}",
            "patch",
            "location",
            name,
            "--type=merge",
            "-p",
            json.dumps({"spec": spec}),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="module")
def crds_installed(kube: Kube) -> None:
    kube.kubectl("apply", "--server-side", "-f", str(CRDS))
    kube.kubectl(
        "wait", "--for=condition=Established", "crd/locations.artifacts.o41.io", "--timeout=60s"
    )


# (backend kind, the change, the field named in the refusal)
CHANGES = [
    ("s3", {"backend": {"s3": {"endpoint": "http://127.0.0.1:10"}}}, "spec.backend.s3.endpoint"),
    ("s3", {"backend": {"s3": {"endpoint": None}}}, "spec.backend.s3.endpoint"),
    ("gcs", {"backend": {"gcs": {"endpoint": "http://127.0.0.1:10"}}}, "spec.backend.gcs.endpoint"),
    ("gcs", {"backend": {"gcs": {"project": "another"}}}, "spec.backend.gcs.project"),
    (
        "azureBlob",
        {"backend": {"azureBlob": {"accountUrl": "http://127.0.0.1:9/other"}}},
        "spec.backend.azureBlob.accountUrl",
    ),
    (
        "s3Compatible",
        {"backend": {"s3Compatible": {"endpoint": "http://127.0.0.1:10"}}},
        "spec.backend.s3Compatible.endpoint",
    ),
    (
        "s3Compatible",
        {"backend": {"s3Compatible": {"signingRegion": "us-east-1"}}},
        "spec.backend.s3Compatible.signingRegion",
    ),
    (
        "s3Compatible",
        {"backend": {"s3Compatible": {"addressingStyle": "virtual"}}},
        "spec.backend.s3Compatible.addressingStyle",
    ),
    ("s3", {"bucket": "someone-elses"}, "spec.bucket"),
    ("s3", {"organization": "another"}, "spec.organization"),
    (
        "s3",
        {"cloud": "nebius", "backend": {"s3": None, "s3Compatible": {"endpoint": CLOSED}}},
        "spec.cloud",
    ),
    ("s3", {"region": "eu-west-1"}, "spec.region"),
]


@pytest.mark.kube
@pytest.mark.parametrize(("kind", "change", "field"), CHANGES, ids=[c[2] for c in CHANGES])
def test_what_says_where_versions_live_cannot_change(
    kube: Kube, crds_installed: None, kind: str, change: dict[str, Any], field: str
) -> None:
    name = new_location(kube, kind)
    before = kube.kubectl("get", "location", name, "-o", "jsonpath={.spec}")
    done = patch(kube, name, change)
    assert done.returncode != 0
    # a rule on the field itself shows the refused value first; one on its parent does not
    key = field.removeprefix("spec.")
    shown = f'"{change[key]}": ' if key in ("organization", "cloud", "region") else ""
    assert done.stderr.startswith(f'The Location "{name}" is invalid: '), done.stderr
    assert f"{field}: Invalid value: {shown}{immutable(field)}" in done.stderr, done.stderr
    assert kube.kubectl("get", "location", name, "-o", "jsonpath={.spec}") == before


@pytest.mark.kube
@pytest.mark.parametrize(
    "change",
    [
        {"backend": {"s3": None, "s3Compatible": {"endpoint": CLOSED}}},  # s3 -> s3Compatible
        {"backend": {"s3": None, "gcs": {"endpoint": CLOSED}}, "cloud": "gcp"},
    ],
    ids=["s3-to-s3Compatible", "s3-to-gcs"],
)
def test_the_backend_kind_cannot_change(
    kube: Kube, crds_installed: None, change: dict[str, Any]
) -> None:
    name = new_location(kube, "s3")
    done = patch(kube, name, change)
    assert done.returncode != 0
    kind = immutable("the backend kind (s3, gcs, azureBlob or s3Compatible)")
    assert done.stderr.startswith(f'The Location "{name}" is invalid: '), done.stderr
    assert f"spec.backend: Invalid value: {kind}" in done.stderr, done.stderr
    assert (
        "s3" in json.loads(kube.kubectl("get", "location", name, "-o", "json"))["spec"]["backend"]
    )


@pytest.mark.kube
def test_an_optional_field_cannot_be_added_later(kube: Kube, crds_installed: None) -> None:
    """Absent at creation and set later is a change too (a rule on the field itself would
    not run then: it has no old value)."""
    name = new_location(kube, "s3Compatible")
    done = patch(kube, name, {"backend": {"s3Compatible": {"signingRegion": "auto"}}})
    assert immutable("spec.backend.s3Compatible.signingRegion") in done.stderr, done.stderr
    name = new_location(kube, "gcs")
    done = patch(kube, name, {"backend": {"gcs": {"project": "p"}}})
    assert immutable("spec.backend.gcs.project") in done.stderr, done.stderr


@pytest.mark.kube
def test_credentials_can_change(kube: Kube, crds_installed: None) -> None:
    for kind in BACKENDS:
        name = new_location(kube, kind)
        done = patch(kube, name, {"credentials": {"secretName": "rotated"}})
        assert done.returncode == 0, done.stderr
        got = json.loads(kube.kubectl("get", "location", name, "-o", "json"))["spec"]
        assert got["credentials"] == {"secretName": "rotated"}
        # the same backend again (kubectl apply of an unchanged file) is no change
        done = patch(kube, name, {"backend": BACKENDS[kind][2]})
        assert done.returncode == 0, done.stderr


# --- TrustDomain: what one object can check alone -----------------------------------------


def trust_domain(kube: Kube, name: str, **spec: Any) -> subprocess.CompletedProcess[str]:
    body = {
        "apiVersion": "artifacts.o41.io/v1alpha1",
        "kind": "TrustDomain",
        "metadata": {"name": name},
        "spec": {"issuer": f"{CLOSED.replace('http:', 'https:')}/{name}", **spec},
    }
    return subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kube.kubeconfig}", "apply", "-f", "-"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="module")
def trust_domain_crd(kube: Kube) -> None:
    kube.kubectl("apply", "--server-side", "-f", str(CRDS))
    kube.kubectl(
        "wait", "--for=condition=Established", "crd/trustdomains.artifacts.o41.io", "--timeout=60s"
    )


@pytest.mark.kube
@pytest.mark.parametrize("name", ["cluster.b", "x" * 64])
def test_a_trust_domain_name_is_a_dns_label(kube: Kube, trust_domain_crd: None, name: str) -> None:
    """It prefixes the tenants `<trustDomain>:<namespace>`; a dot or 64 characters would
    make a tenant name other code cannot split or store."""
    done = trust_domain(kube, name)
    assert done.returncode != 0
    assert TRUST_DOMAIN_NAME_RULE["message"] in done.stderr, done.stderr


@pytest.mark.kube
def test_a_trust_domains_issuer_cannot_change_and_its_keys_have_one_source(
    kube: Kube, trust_domain_crd: None
) -> None:
    name = f"cel-td-{uuid.uuid4().hex[:6]}"
    assert trust_domain(kube, name).returncode == 0
    done = trust_domain(kube, name, issuer="https://127.0.0.1:9/another")
    assert done.stderr.startswith(f'The TrustDomain "{name}" is invalid: '), done.stderr
    shown = 'spec.issuer: Invalid value: "https://127.0.0.1:9/another": '
    assert shown + ISSUER_IMMUTABLE in done.stderr, done.stderr
    both = {"jwksURL": "https://127.0.0.1:9/keys", "jwks": '{"keys": []}'}
    done = trust_domain(kube, name, keys=both)
    assert f"spec.keys: Invalid value: {ONE_KEY_SOURCE}" in done.stderr, done.stderr
