"""CRDs that `helm upgrade` updates (issue 42, point 3): ``crds.enabled`` renders the chart's
``crds/`` as templates too, with ``helm.sh/resource-policy: keep`` (``crds.keep``), as
cert-manager's chart does. Rendered here, then on the test bed: a release installed the
way the chart always installed them (from ``crds/``, which Helm never upgrades) adopts them
and is upgraded to a chart whose Location CRD has a new field; the API server then knows
the field.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from test_chart import CHART, Doc, render, run_helm
from test_chart_install import Release
from testbed.kube import Kube, kubectl_binary

CRDS = sorted((CHART / "crds").glob("*.yaml"))
LOCATIONS = "locations.artifacts.o41.io"


def crds(docs: list[Doc]) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}


def test_crds_are_templates_only_when_enabled_and_kept_by_default() -> None:
    assert not crds(render())
    rendered = crds(render("crds.enabled=true"))
    assert sorted(rendered) == sorted(p.name.removesuffix(".yaml") for p in CRDS)
    for path in CRDS:
        crd = rendered[path.name.removesuffix(".yaml")]
        # the very CRD of crds/ (the repo's generated one), with the release's labels
        assert crd["spec"] == yaml.safe_load(path.read_text())["spec"]
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    unkept = crds(render("crds.enabled=true", "crds.keep=false"))
    assert all("annotations" not in c["metadata"] for c in unkept.values())


def next_chart(where: Path) -> Path:
    """The chart as its next version would be: the Location CRD with one more field."""
    chart = where / "o41-artifacts"
    shutil.copytree(CHART, chart)
    path = chart / "crds" / f"{LOCATIONS}.yaml"
    crd = yaml.safe_load(path.read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["note"] = {"type": "string", "description": "a new field (test)"}
    path.write_text(yaml.safe_dump(crd))
    return chart


LOCATION = {
    "apiVersion": "artifacts.o41.io/v1alpha1",
    "kind": "Location",
    "metadata": {"name": "crd-upgrade-probe"},
    "spec": {
        "organization": "ml",
        "cloud": "gcp",
        "region": "us-central1",
        "backend": {"gcs": {"project": "placeholder-project"}},
        "credentials": {"secretName": "gcp-credentials"},
        "note": "known after the upgrade",
    },
}


def dry_run_location(kube: Kube) -> subprocess.CompletedProcess[str]:
    """A Location with the new field, created on the API server in dry-run (strict field
    validation: an unknown field is an error)."""
    return subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(kube.kubeconfig), "create", "--dry-run=server",
         "--validate=strict", "-o", "json", "-f", "-"],
        input=json.dumps(LOCATION), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def restore_crds(kube: Kube) -> Iterator[None]:
    """The test bed's CRDs are the session's: put back the repo's, unowned, afterwards."""
    yield
    for path in CRDS:
        kube.kubectl("replace", "-f", str(path), check=False)
        kube.kubectl("create", "-f", str(path), check=False)


@pytest.mark.kube
@pytest.mark.usefixtures("restore_crds")
def test_an_upgrade_with_crds_enabled_adds_a_crd_field(kube: Kube, tmp_path: Path) -> None:
    namespace = f"o41-crds-{uuid.uuid4().hex[:6]}"
    rel = Release(kube, "o41", namespace, tmp_path)
    base = ("--set", "etcd.persistence.enabled=false")
    try:
        # the release as it was: CRDs from crds/ (Helm makes them when missing, never updates)
        rel.helm("install", "o41", str(CHART), "--namespace", namespace, "--create-namespace",
                 *base)  # fmt: skip
        before = dry_run_location(kube)
        assert before.returncode != 0
        assert 'unknown field "spec.note"' in before.stderr

        chart = next_chart(tmp_path)
        # crds/ alone: `helm upgrade` leaves the CRDs as they were (Helm's documented rule)
        rel.helm("upgrade", "o41", str(chart), "--namespace", namespace, *base)
        assert dry_run_location(kube).returncode != 0

        # crds.enabled on CRDs nobody owns: refused, saying how to adopt them
        refused = rel.helm(
            "upgrade", "o41", str(chart), "--namespace", namespace, *base,
            "--set", "crds.enabled=true", check=False,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "adopt the CRDs once: kubectl label crd" in refused.stderr
        for path in CRDS:
            name = path.name.removesuffix(".yaml")
            kube.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")
            kube.kubectl(
                "annotate", "--overwrite", "crd", name, "meta.helm.sh/release-name=o41",
                f"meta.helm.sh/release-namespace={namespace}",
            )  # fmt: skip

        upgraded = rel.helm(
            "upgrade", "o41", str(chart), "--namespace", namespace, *base,
            "--set", "crds.enabled=true",
        )  # fmt: skip
        assert "STATUS: deployed" in upgraded.stdout
        crd = rel.get("crd", LOCATIONS, namespaced=False)
        (version,) = crd["spec"]["versions"]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert spec["note"]["type"] == "string"
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        after = dry_run_location(kube)
        assert after.returncode == 0, after.stderr
        assert json.loads(after.stdout)["spec"]["note"] == "known after the upgrade"
        rel.wait_ready("the upgraded release's workloads to be ready")

        # uninstall keeps the CRDs (the keep policy): no Location of any namespace goes
        rel.helm("uninstall", "o41", "--namespace", namespace)
        assert rel.get("crd", LOCATIONS, namespaced=False)["metadata"]["name"] == LOCATIONS
    finally:
        rel.helm("uninstall", "o41", "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_schema_refuses_an_unknown_crds_key() -> None:
    done = run_helm("template", "o41", str(CHART), "--set", "crds.upgrade=true")
    assert done.returncode != 0 and "crds" in done.stderr
