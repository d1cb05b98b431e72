"""examples/: valid for Kubernetes 1.37 and for our CRDs, as the API server itself judges
(`kubectl apply --dry-run=server` with the CRDs installed), and complete (an Organization,
a Location of every backend, each with its credentials Secret, and a Job)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from testbed.kube import Kube
from testbed.product import install_crds

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))


def documents() -> list[dict[str, Any]]:
    return [d for f in FILES for d in yaml.safe_load_all(f.read_text()) if d]


def test_examples_cover_every_backend_with_its_secret_and_a_job() -> None:
    docs = documents()
    locations = [d for d in docs if d["kind"] == "Location"]
    backends = {next(iter(d["spec"]["backend"])) for d in locations}
    assert backends == {"s3", "gcs", "azureBlob", "s3Compatible"}
    nebius = next(d for d in locations if "s3Compatible" in d["spec"]["backend"])
    assert nebius["spec"]["cloud"] == "nebius"
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    for location in locations:
        secret = secrets[location["spec"]["credentials"]["secretName"]]
        assert secret["metadata"]["namespace"] == "o41-system"
        assert all("PLACEHOLDER" in v for v in secret["stringData"].values())
    (org,) = [d for d in docs if d["kind"] == "Organization"]
    assert {d["spec"]["organization"] for d in locations} == {org["metadata"]["name"]}
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert job["metadata"]["namespace"] in org["spec"]["namespaces"]
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "from o41 import sky" in script
    assert "from o41 import artifacts" in script
    assert "artifacts.latest(ORG, name)" in script  # it resumes from the latest version
    assert "artifacts.write(ORG, name, ckpt, metadata=" in script  # a directory, every step
    assert "artifacts.write(" in script and "artifacts.read(" in script
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ORG"] in {d["spec"]["organization"] for d in locations}
    compile(script, "job.yaml", "exec")  # the Job's Python is at least valid Python


def test_builtin_kinds_match_the_kubernetes_1_37_schemas() -> None:
    for doc in documents():
        if doc["apiVersion"].startswith("artifacts.o41.io/"):
            continue
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


@pytest.mark.kube
def test_api_server_accepts_every_example(kube: Kube) -> None:
    install_crds(kube.kubeconfig)
    namespaces = {
        d["metadata"].get("namespace") for d in documents() if d["kind"] != "Namespace"
    } - {None}
    for ns in sorted(namespaces):
        kube.kubectl("create", "namespace", str(ns), check=False)
    for path in FILES:
        out = kube.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-o", "json", "-f", str(path)
        )
        applied = json.loads(out)
        items = applied.get("items", [applied])
        assert items, path
        assert all(i["metadata"]["name"] for i in items)
