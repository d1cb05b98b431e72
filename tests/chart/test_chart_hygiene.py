"""The chart as a platform team's linters see it: kube-score and checkov on the rendered
default chart, each finding fixed or documented in docs/chart.md ("Hygiene"); checkov
strictly offline; the image digest, kubeVersion and the generated values table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from test_chart import CHART, KUBE_VERSION, NAMESPACE, find, render, run_helm
from testbed.kube import bin_dir

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "chart.md"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
PREFIX = "o41-artifacts-"  # release o41: the objects' names are PREFIX + component
# rows of the o41-remote chart's objects (remote-collections, remote-etcd): its own test,
# tests/chart/test_chart_remote_tier.py, checks them
REMOTE = "remote-"
DIGEST = "sha256:" + "ab" * 32

Finding = tuple[str, str, str, str]  # tool, check, object (component), what it says

# Imported first by every Python process checkov starts (PYTHONPATH): name lookups and
# TCP/UDP connects fail, and each attempt is written to O41_NET_LOG.
NETWORK_GUARD = """
import os, socket
_log = os.environ["O41_NET_LOG"]
def _refuse(what):
    with open(_log, "a") as f:
        f.write(f"{os.getpid()} {what}\\n")
    raise OSError(f"network refused by the test: {what}")
def _connect(self, address, _orig=socket.socket.connect):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(f"connect {address!r}")
    return _orig(self, address)
def _connect_ex(self, address, _orig=socket.socket.connect_ex):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(f"connect {address!r}")
    return _orig(self, address)
def _getaddrinfo(host, *args, **kwargs):
    _refuse(f"getaddrinfo {host!r}")
socket.socket.connect = _connect
socket.socket.connect_ex = _connect_ex
socket.getaddrinfo = _getaddrinfo
socket.create_connection = lambda address, *a, **k: _refuse(f"create_connection {address!r}")
"""


def documented() -> tuple[set[Finding], set[Finding]]:
    """The rows of docs/chart.md's hygiene table: (not fixed: the allowlist, fixed)."""
    text = DOC.read_text()
    start = text.index("## Hygiene: kube-score and checkov")
    table = text[start : text.index("\n## ", start + 1)]
    allowed: set[Finding] = set()
    fixed: set[Finding] = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] not in {"kube-score", "checkov"}:
            continue
        tool, check, objects, finding, verdict = cells
        rows = {(tool, check.strip("`"), o.strip(), finding) for o in objects.split(",")}
        if verdict.startswith("not fixed"):
            allowed |= rows
        else:
            assert verdict.startswith("fixed"), line
            fixed |= rows
    return allowed, fixed


def of_the_hub(findings: set[Finding], tool: str) -> set[Finding]:
    """The table's rows of ``tool`` for the hub chart's objects (not the remote chart's,
    whose rows start with ``remote-``)."""
    return {f for f in findings if f[0] == tool and not f[2].startswith(REMOTE)}


def rendered(tmp_path: Path, *sets: str) -> Path:
    argv = ["template", "o41", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        argv += ["--set", s]
    done = run_helm(*argv)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "chart.yaml"
    out.write_text(done.stdout)
    return out


def component(name: str) -> str:
    """The table's name of an object: operator, placement, etcd (or the whole name)."""
    return name.removeprefix(PREFIX)


def checkov_object(resource: str) -> str:
    """checkov names a resource Kind.namespace.name, or Kind.name when cluster-scoped."""
    rest = resource.split(".", 1)[1]
    return component(rest.removeprefix(f"{NAMESPACE}."))


def kube_score(manifest: Path) -> set[Finding]:
    binary = bin_dir() / "kube-score"
    if not binary.exists():
        pytest.fail("kube-score is not built: run `hack/testbed-bin.sh kube-score`")
    done = subprocess.run(
        [str(binary), "score", str(manifest), "--output-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: some check is critical
    found: set[Finding] = set()
    for obj in json.loads(done.stdout):
        for check in obj["checks"]:
            if check["skipped"] or check["grade"] >= 10:  # 10: all OK
                continue
            for comment in check["comments"] or [{"summary": check["check"]["name"]}]:
                found.add(
                    (
                        "kube-score",
                        check["check"]["id"],
                        component(obj["object_meta"]["name"]),
                        comment["summary"],
                    )
                )
    return found


@cache
def no_network() -> list[str]:
    """A prefix that runs a command in a network namespace of its own (no interface but a
    loopback that is down), where we may (root): what the guard cannot see, such as a C
    library's own sockets, has nowhere to go either. Empty where unshare is refused."""
    try:
        done = subprocess.run(["unshare", "--net", "--", "true"], capture_output=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    return ["unshare", "--net", "--"] if done.returncode == 0 else []


def checkov(manifest: Path, tmp_path: Path, *extra: str) -> tuple[set[Finding], list[str]]:
    """checkov offline on ``manifest``: its failed checks, and every network attempt."""
    if not CHECKOV.exists():
        pytest.fail("checkov is not installed: run `make checkov` (.venv-checkov)")
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(NETWORK_GUARD)
    net_log = tmp_path / "network.log"
    net_log.touch()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BC_", "PRISMA_", "CKV_", "CHECKOV_")) and k != "PYTHONPATH"
    }
    env |= {
        "PYTHONPATH": str(guard),
        "O41_NET_LOG": str(net_log),
        "BC_SKIP_MAPPING": "TRUE",
        "CKV_SKIP_PACKAGE_UPDATE_CHECK": "TRUE",
        "HOME": str(tmp_path),  # no checkov config of the machine's user
        "HTTPS_PROXY": "http://127.0.0.1:9",  # and were anything to slip by, a dead proxy
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    done = subprocess.run(
        [
            *no_network(),
            str(CHECKOV),
            "--skip-download",
            "--skip-results-upload",
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--file",
            manifest.name,
            *extra,
        ],
        cwd=manifest.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    assert report["summary"]["resource_count"] > 10, report["summary"]
    found = {
        ("checkov", f["check_id"], checkov_object(f["resource"]), f["check_name"])
        for f in report["results"]["failed_checks"]
    }
    return found, net_log.read_text().splitlines()


def _explain(unlisted: set[Finding], stale: set[Finding]) -> str:
    lines = ["docs/chart.md's hygiene table and the checkers disagree:"]
    lines += [f"  new (fix it, or add a 'not fixed: why' row): {f}" for f in sorted(unlisted)]
    lines += [f"  documented but gone (delete the row): {f}" for f in sorted(stale)]
    return "\n".join(lines)


def test_checkov_runs_without_a_network_where_the_machine_allows() -> None:
    if os.geteuid() == 0:  # root: CI and the dev machines
        assert no_network(), "unshare --net is refused to root"


def test_the_table_parses_into_findings_of_both_tools() -> None:
    allowed, fixed = documented()
    assert {t for t, *_ in allowed} == {"kube-score", "checkov"}
    assert ("checkov", "CKV_K8S_43", "operator", "Image should use digest") in allowed
    assert not allowed & fixed


def test_kube_score_finds_nothing_undocumented_on_the_default_chart(tmp_path: Path) -> None:
    allowed, fixed = documented()
    found = kube_score(rendered(tmp_path))
    mine = of_the_hub(allowed, "kube-score")
    assert found == mine, _explain(found - mine, mine - found)
    assert not found & fixed


def test_checkov_finds_nothing_undocumented_and_never_touches_the_network(
    tmp_path: Path,
) -> None:
    allowed, fixed = documented()
    found, attempts = checkov(rendered(tmp_path), tmp_path)
    assert attempts == [], attempts
    mine = of_the_hub(allowed, "checkov")
    assert found == mine, _explain(found - mine, mine - found)
    assert not found & fixed


def test_the_network_guard_does_stop_a_connect(tmp_path: Path) -> None:
    """The guard checkov runs under refuses and records, as the test above relies on."""
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(NETWORK_GUARD)
    log = tmp_path / "network.log"
    log.touch()
    probe = "import urllib.request; urllib.request.urlopen('http://pypi.org/', timeout=2)"
    done = subprocess.run(
        [str(CHECKOV.parent / "python"), "-c", probe],
        env={"PYTHONPATH": str(guard), "O41_NET_LOG": str(log), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "'pypi.org'" in log.read_text()


def test_image_digest_pins_every_image_and_satisfies_checkov(tmp_path: Path) -> None:
    sets = (f"image.digest={DIGEST}", f"etcd.image.digest={DIGEST}", "image.tag=ignored")
    docs = render(*sets)
    images = {
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/o41/o41-artifacts@{DIGEST}", f"quay.io/coreos/etcd@{DIGEST}"}
    found, attempts = checkov(rendered(tmp_path, *sets), tmp_path, "--check", "CKV_K8S_43")
    assert attempts == []
    assert found == set()
    # without a digest: repository:tag, as before
    docs = render("image.tag=1.2.3")
    assert {
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
    } == {"ghcr.io/o41/o41-artifacts:1.2.3", "quay.io/coreos/etcd:v3.6.16"}


@pytest.mark.parametrize("bad", ["latest", "sha256:abc", "md5:" + "0" * 32])
def test_the_schema_refuses_what_is_not_a_digest(bad: str) -> None:
    done = run_helm("template", "o41", str(CHART), "--set", f"image.digest={bad}")
    assert done.returncode != 0
    assert "/image/digest" in done.stderr


def test_kube_version_is_declared_and_enforced() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    done = run_helm("template", "o41", str(CHART), "--kube-version", "1.29.0")
    assert done.returncode != 0
    assert "incompatible with Kubernetes v1.29.0" in done.stderr
    for ok in ("1.30.0", KUBE_VERSION):
        assert run_helm("template", "o41", str(CHART), "--kube-version", ok).returncode == 0
    # and with no cluster and no flag: helm's own default version (its client-go's, 1.37) passes
    assert run_helm("template", "o41", str(CHART)).returncode == 0


def test_every_secret_volume_has_a_default_mode() -> None:
    for d in render():
        if d["kind"] not in {"Deployment", "StatefulSet"}:
            continue
        for v in d["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in v:
                assert v["secret"]["defaultMode"] == 0o440, (d["metadata"]["name"], v)
    operator = find(render(), "Deployment", "-operator")
    tls = next(v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert tls["secret"]["defaultMode"] == 0o440


def test_placement_replicas_prefer_other_nodes_unless_affinity_is_given() -> None:
    placement = find(render(), "Deployment", "-placement")
    anti = placement["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == (placement["spec"]["selector"]["matchLabels"])
    )
    mine = find(render("placement.affinity.nodeAffinity.x=y"), "Deployment", "-placement")
    assert mine["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {"x": "y"}}


def test_the_values_table_is_generated_from_values_yaml() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "values-table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = DOC.read_text()
    # every key of values.yaml has its row, with its default
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert re.search(r"^\| `image.digest` \| string \| `\"\"` \| sha256:", text, re.M)
    assert "| `placement.replicas` | integer | `2` |" in text
    for top in values:
        assert f"| `{top}" in text, top


def test_the_usage_docs_port_forward_the_service_the_chart_makes() -> None:
    service = find(render(), "Service", "-placement")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    usage = (REPO / "docs" / "usage.md").read_text()
    command = f"kubectl -n {NAMESPACE} port-forward svc/{service['metadata']['name']} {port}:{port}"
    assert command in usage
    assert f"http://localhost:{port}/usage" in usage
