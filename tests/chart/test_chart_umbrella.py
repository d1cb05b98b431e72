"""Both charts as subcharts of an umbrella chart (file:// dependencies, as a platform team's
own chart pulls them in): Helm hands every subchart the umbrella's ``global`` values, which
the schemas must accept (before: "additional properties 'global' not allowed"), and
``global.imageRegistry`` and ``global.imagePullSecrets`` reach every pod. Rendered, then
installed on the test bed's API server (kwok runs the pods) until every workload is Ready.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from test_chart import CHART, Doc, run_helm
from test_chart_install import Release
from testbed.kube import Kube

REMOTE = CHART.parent / "o41-remote"
UMBRELLA_VALUES = {
    "global": {
        "imageRegistry": "mirror.corp.example:5000",
        "imagePullSecrets": ["corp-mirror", {"name": "corp-extra"}],
        "storageClass": "a key of another subchart's: left alone",
    },
    "o41-artifacts": {
        "imagePullSecrets": [{"name": "corp-extra"}],  # once in the pods, not twice
        "etcd": {"persistence": {"enabled": False}},
    },
    "o41-remote": {"hub": {"endpoint": "https://o41.hub.example"}},
}


def umbrella(where: Path) -> Path:
    chart = where / "platform"
    chart.mkdir()
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {"name": "o41-artifacts", "version": "*", "repository": f"file://{CHART}"},
                    {"name": "o41-remote", "version": "*", "repository": f"file://{REMOTE}"},
                ],
            }
        )
    )
    (chart / "values.yaml").write_text(yaml.safe_dump(UMBRELLA_VALUES))
    done = run_helm("dependency", "build", str(chart))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (chart / "charts").iterdir()) == [
        "o41-artifacts-0.1.0.tgz",
        "o41-remote-0.1.0.tgz",
    ]
    return chart


def pods(docs: list[Doc]) -> list[Doc]:
    return [
        d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
    ]


def test_the_umbrella_renders_with_globals(tmp_path: Path) -> None:
    chart = umbrella(tmp_path)
    done = run_helm("template", "platform", str(chart), "--namespace", "platform")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    specs = pods(docs)
    assert len(specs) == 3  # operator, placement, etcd
    for spec in specs:
        assert spec["imagePullSecrets"] == [{"name": "corp-mirror"}, {"name": "corp-extra"}]
        for c in spec["containers"]:
            assert c["image"].startswith("mirror.corp.example:5000/"), c["image"]
    images = {c["image"] for s in specs for c in s["containers"]}
    assert images == {
        "mirror.corp.example:5000/o41/o41-artifacts:0.1.0",
        "mirror.corp.example:5000/coreos/etcd:v3.6.16",
    }
    # the remote chart's objects are there too
    assert [d for d in docs if d["kind"] == "ConfigMap" and "hub" in d["metadata"]["name"]]


def test_a_wrong_global_is_still_refused(tmp_path: Path) -> None:
    done = run_helm(
        "template", "o41", str(CHART), "--set", "global.imageRegistry=not a registry"
    )  # fmt: skip
    assert done.returncode != 0
    assert "global.imageRegistry" in done.stderr or "global/imageRegistry" in done.stderr


@pytest.mark.kube
def test_the_umbrella_installs_and_its_pods_become_ready(
    kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> None:
    where = tmp_path_factory.mktemp("umbrella")
    chart = umbrella(where)
    namespace = f"o41-umbrella-{uuid.uuid4().hex[:6]}"
    rel = Release(kube, "platform", namespace, where)
    try:
        out = rel.helm(
            "install", "platform", str(chart), "--namespace", namespace, "--create-namespace"
        )  # fmt: skip
        assert "STATUS: deployed" in out.stdout
        rel.wait_ready("the umbrella's workloads to be ready")
        placement = rel.get("deployment", "platform-o41-artifacts-placement")
        spec = placement["spec"]["template"]["spec"]
        assert spec["containers"][0]["image"] == "mirror.corp.example:5000/o41/o41-artifacts:0.1.0"
        assert spec["imagePullSecrets"] == [{"name": "corp-mirror"}, {"name": "corp-extra"}]
    finally:
        rel.helm("uninstall", "platform", "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(autouse=True)
def _no_leftover_charts() -> Iterator[None]:
    # helm dependency build writes nothing into the repo's charts
    before = sorted(p.name for p in CHART.iterdir())
    yield
    assert sorted(p.name for p in CHART.iterdir()) == before
