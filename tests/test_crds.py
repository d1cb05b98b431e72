"""The CRDs in crds/ are generated from o41.api, and the API server accepts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41.crd import rendered

from fixtures.kube import Kube
from support import wait_for

CRDS = Path(__file__).resolve().parents[1] / "crds"


def test_crds_are_generated_from_the_models() -> None:
    expected = rendered()
    on_disk = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    assert on_disk == expected, "crds/ drifted from o41/api.py: run `python -m o41.crd crds/`"


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
    for name in ("locations.artifacts.o41.io", "organizations.artifacts.o41.io"):
        kube.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    resources = kube.kubectl("api-resources", "--api-group=artifacts.o41.io", "-o", "wide")
    assert "loc,locs" in resources and "org,orgs" in resources
    assert "o41" in kube.kubectl("api-resources", "--categories=o41", "-o", "name")

    # the API server publishes a new CRD's OpenAPI a moment after it is Established
    def explained() -> str | None:
        out = kube.kubectl("explain", "location.spec.retired", check=False)
        return out if "takes no new writes" in out else None

    assert "retired" in wait_for(explained, 60, "kubectl explain to show the description")
    crd = json.loads(kube.kubectl("get", "crd", "locations.artifacts.o41.io", "-o", "json"))
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:6] == ["Organization", "Cloud", "Region", "Ready", "Role", "Retired"]
