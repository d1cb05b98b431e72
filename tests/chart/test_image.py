"""The project's own image, built by `make image` (podman, Debian's packages, no registry),
run with the chart's security settings: uid 10001, read-only root, no capabilities,
no-new-privileges, a tmpfs /tmp. Both entry points and the `o41` CLI must work like that.
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41 import __version__
from testbed import images as image_build
from testbed.kube import Kube
from testbed.process import LOOPBACK, free_port
from testbed.product import install_crds

from support import wait_for

pytestmark = [pytest.mark.image]

# what the chart's securityContext asks for (templates/_helpers.tpl), as podman flags
AS_THE_CHART_RUNS_IT = [
    "--read-only",
    "--user", "10001:10001",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
    "--tmpfs", "/tmp",
    "--network", "host",
]  # fmt: skip


@pytest.fixture(scope="module")
def images() -> image_build.Images:
    return image_build.build()


def run(image: str, *argv: str, env: dict[str, str] | None = None) -> str:
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    done = image_build.podman("run", "--rm", *AS_THE_CHART_RUNS_IT, *flags, image, *argv)
    return done.stdout


def test_the_image_runs_as_uid_10001_with_no_capabilities_and_a_read_only_root(
    images: image_build.Images,
) -> None:
    probe = (
        "import os, json\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()"
        " if ':\\t' in l)\n"
        "try:\n"
        "    open('/usr/local/written', 'w')\n"
        "    root = 'writable'\n"
        "except OSError as e:\n"
        "    root = e.strerror\n"
        "open('/tmp/scratch', 'w').write('ok')\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'root': root,"
        " 'cap_eff': status['CapEff'].strip(), 'no_new_privs': status['NoNewPrivs'].strip()}))\n"
    )
    seen = json.loads(run(images.app, "python", "-c", probe))
    assert seen == {
        "uid": 10001,
        "gid": 10001,
        "root": "Read-only file system",
        "cap_eff": "0000000000000000",
        "no_new_privs": "1",
    }


def test_the_operator_entry_point_starts(images: image_build.Images) -> None:
    out = run(images.app, "python", "-m", "o41.operator", "--help")
    assert out.startswith("usage: python -m o41.operator")
    assert "--webhook-cert" in out
    # the handlers and the admission rules import as the real run imports them
    run(images.app, "python", "-c", "import o41.operator.handlers, o41.operator.admission")


def test_the_cli_finds_its_place_from_env_and_lists_its_commands(
    images: image_build.Images,
) -> None:
    place = run(
        images.app, "o41", "place", "--json",
        env={"O41_ARTIFACTS_CLOUD": "aws", "O41_ARTIFACTS_REGION": "us-east-1"},
    )  # fmt: skip
    assert json.loads(place) == {"cloud": "aws", "region": "us-east-1", "source": "env"}
    usage = run(images.app, "o41", "--help")
    for command in ("place", "write", "read"):
        assert command in usage


def test_the_etcd_image_runs_as_uid_10001(images: image_build.Images) -> None:
    out = run(images.etcd, "--version")
    assert "etcd Version: 3.6.16" in out


def self_contained_kubeconfig(kube: Kube, path: Path) -> Path:
    """The admin kubeconfig with its files inlined, readable by uid 10001 in a container."""
    config: dict[str, Any] = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    for section, key in ((cluster, "certificate-authority"), (user, "client-certificate"),
                         (user, "client-key")):  # fmt: skip
        section[f"{key}-data"] = base64.b64encode(Path(section.pop(key)).read_bytes()).decode()
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text(json.dumps(config))
    path.chmod(0o644)
    return path


@pytest.fixture
def placement_container(
    images: image_build.Images, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The placement service from the image, watching the test bed's control plane."""
    install_crds(kube.kubeconfig)
    directory = tmp_path_factory.mktemp("image")
    directory.chmod(0o755)
    kubeconfig = self_contained_kubeconfig(kube, directory / "kc" / "kubeconfig")
    port = free_port()
    name = f"o41-smoke-{uuid.uuid4().hex[:8]}"
    image_build.podman(
        "run", "-d", "--name", name, *AS_THE_CHART_RUNS_IT,
        "-v", f"{kubeconfig}:/etc/o41/kubeconfig:ro",
        images.app,
        "python", "-m", "o41.webhook", "--host", LOOPBACK, "--port", str(port),
        "--kubeconfig", "/etc/o41/kubeconfig", "--authentication", "none",
    )  # fmt: skip
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        logs = image_build.podman("logs", name, check=False)
        (directory / "placement.log").write_text(logs.stdout + logs.stderr)
        image_build.podman("rm", "-f", "-t", "5", name, check=False)


def get(url: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as r:
        return int(r.status), bytes(r.read())


@pytest.mark.kube
def test_the_placement_service_answers_health_ready_and_metrics(placement_container: str) -> None:
    status, body = wait_for(
        lambda: _answer(f"{placement_container}/healthz"), timeout=60, what="/healthz"
    )
    assert (status, json.loads(body)) == (200, {"status": "ok", "version": __version__})
    status, body = wait_for(
        lambda: _answer(f"{placement_container}/readyz", want=200), timeout=60, what="/readyz"
    )
    assert json.loads(body) == {"status": "ready"}
    status, body = get(f"{placement_container}/metrics")
    assert status == 200
    assert b"# TYPE" in body


def _answer(url: str, want: int | None = None) -> tuple[int, bytes] | None:
    try:
        answer = get(url)
    except OSError:
        return None
    return answer if want is None or answer[0] == want else None
