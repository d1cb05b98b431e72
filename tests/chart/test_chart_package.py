"""Shipping (issue 42, point 6): both charts packaged by hack/chart-package.sh (what `make
chart-package` runs, and pushes with CHART_REGISTRY=oci://...), versioned as the image:
chart version and appVersion are the project's version, the image's tag (hack/image.sh).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from o41 import __version__
from test_chart import CHART, REPO, run_helm

SCRIPT = REPO / "hack" / "chart-package.sh"
CHARTS = (CHART, CHART.parent / "o41-remote")


def project_version() -> str:
    found: list[str] = re.findall(
        r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M
    )
    (version,) = found
    return version


def test_chart_versions_follow_the_image() -> None:
    version = project_version()
    assert version == __version__
    # the image's tag is the same line of pyproject.toml (hack/image.sh's app_version)
    assert "app_version() { sed -n 's/^version = " in (REPO / "hack" / "image.sh").read_text()
    for chart in CHARTS:
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        assert (meta["version"], meta["appVersion"]) == (version, version), chart.name


def test_both_charts_package_and_the_package_renders_as_the_source(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    version = project_version()
    files = done.stdout.split()
    assert files == [str(tmp_path / f"{c.name}-{version}.tgz") for c in CHARTS]
    shown = run_helm("show", "chart", files[0])
    meta = yaml.safe_load(shown.stdout)
    assert (meta["name"], meta["version"], meta["appVersion"]) == (
        "o41-artifacts",
        version,
        version,
    )
    # the packaged chart renders what the source does (a deterministic render: no CA made)
    sets = ["--set", "certificates.generator=job"]
    packaged = run_helm("template", "o41", files[0], "-n", "o41-system", *sets)
    source = run_helm("template", "o41", str(CHART), "-n", "o41-system", *sets)
    assert packaged.returncode == 0, packaged.stderr
    assert packaged.stdout == source.stdout
    assert f"image: ghcr.io/o41/o41-artifacts:{version}" in packaged.stdout
    remote = run_helm("template", "o41", files[1], "--set", "hub.endpoint=https://hub.example")
    assert remote.returncode == 0, remote.stderr


def test_a_push_goes_only_to_an_oci_registry(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), str(tmp_path), "--push", "https://registry.example.com/charts"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--push takes an oci:// reference" in done.stderr
