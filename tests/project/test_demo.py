"""The newcomer's path: `make demo` and `make dev-up`/`dev-down`, run as a new user runs
them (the same commands, as processes), checked by what they print and leave behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.kube import kubectl

pytestmark = [pytest.mark.kube, pytest.mark.etcd, pytest.mark.stores]

REPO = Path(__file__).resolve().parents[2]


def run_testbed(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_shows_every_headline_feature() -> None:
    done = run_testbed("demo", timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    # placement: the rules, with the writers' places said to be the demo's, not detected
    assert "SET BY THE DEMO" in out
    writes = [line for line in out.splitlines() if line.startswith("  from ")]
    assert len(writes) == 5, writes
    assert all("(set by the demo)" in w for w in writes if "unknown" not in w)
    assert re.search(r"aws/us-west-2 \(set by the demo\)\s+-> aws-us-west-2\s+rule=region", out)
    assert re.search(r"aws/eu-west-1 \(set by the demo\)\s+-> aws-us-east-1\s+rule=cloud", out)
    assert re.search(
        r"nebius/eu-north1 \(set by the demo\)\s+-> aws-us-east-1\s+rule=fallback\s+WARNING", out
    )
    # reads: how far, and the bytes compared
    assert "cross-cloud" in out and "local" in out
    assert re.search(r"verified: 9 of 9 reads gave back exactly the 2097152 bytes written", out)
    assert "BYTES DIFFER" not in out
    # a bucket breaks: the write lands elsewhere
    broken = out[out.index("== a bucket breaks") :]
    assert "beginning again without location gcp-us-central1" in broken
    assert "the write landed in aws-us-east-1 (rule=fallback) instead of gcp-us-central1" in broken
    assert "it costs money" in broken and "not the run" in broken
    # the collections: the spec's two examples
    assert "list() = [100, 200]" in out
    assert "lookup(200) = {'step': 200, 'loss': 0.005}" in out
    assert "counter 'processed' = 80, 3 checkpoints written one at a time" in out
    # the usage page: its URL and both answers
    assert re.search(
        r"http://127\.0\.0\.1:\d+/usage\?organization=ml   \(answers 200, text/html\)", out
    )
    assert "1. which places write to the fallback or another region:" in out
    assert "2. bytes that cross clouds on reads:" in out
    usage = out[out.index("== the usage page") :]
    assert re.search(r"nebius/eu-north1 \(env\): 1 of 1 versions left its region", usage)
    assert re.search(r"cross-cloud\s+\d+ reads", usage)
    assert "readers in gcp <- locations in aws" in usage
    assert "== stopping every process by its pid" in out


def test_dev_up_examples_become_ready_and_dev_down_removes_env(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    up = run_testbed("up", "--dir", str(directory), timeout=600)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        examples = directory / "examples.yaml"
        assert f"kubectl apply -f {examples}" in up.stdout
        env = dict(re.findall(r"^export (\w+)=(.*)$", (directory / "env").read_text(), re.M))
        kubeconfig = Path(env["KUBECONFIG"].strip("'"))
        assert kubectl(kubeconfig, "get", "locations", "-o", "name") == ""  # empty at first

        docs = [d for d in yaml.safe_load_all(examples.read_text()) if d]
        assert {d["kind"] for d in docs} == {"Secret", "Organization", "Location"}
        nebius = next(d for d in docs if d["metadata"]["name"] == "nebius-eu-north1")
        assert nebius["spec"]["backend"]["s3Compatible"]["signingRegion"] == "us-east-1"
        # the one command the output prints, as the user types it
        kubectl(kubeconfig, "apply", "-f", str(examples))
        names = [d["metadata"]["name"] for d in docs if d["kind"] == "Location"]
        for name in names:
            kubectl(
                kubeconfig, "wait", "--for=condition=Ready", f"location/{name}", "--timeout=120s"
            )
        kubectl(
            kubeconfig,
            "wait",
            "--for=jsonpath={.status.takesWrites}=true",
            "organization/ml",
            "--timeout=60s",
        )
        org = json.loads(kubectl(kubeconfig, "get", "organization/ml", "-o", "json"))
        assert org["status"]["fallback"] == "aws-us-east-1"
    finally:
        down = run_testbed("down", "--dir", str(directory), timeout=120)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    assert not (directory / "env").exists()
    assert not (directory / "examples.yaml").exists()
    assert not (directory / "pids.json").exists()
    pids = re.findall(r"\(pid (\d+)\)", down.stdout)
    assert pids
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid


def _zombie(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True
