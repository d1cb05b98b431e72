"""`kubectl o41 admin restore`'s answers to a user's mistakes, on the test bed's control
plane: one line each, exit status 1, never a traceback. (The restore itself, on real
pods: tests/real/test_real_backup.py.)"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import yaml

from o41.cli import main
from testbed.kube import Kube

pytestmark = pytest.mark.kube


def restore(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["admin", "restore", *args], prog="kubectl o41")
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out + out.err


def test_a_missing_kubeconfig_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, said = restore(capsys, "--kubeconfig", "/nonexistent/kubeconfig")
    assert code == 1
    assert "admin restore: cannot load the kubeconfig" in said


def etcd_statefulset(namespace: str, release: str) -> dict[str, object]:
    labels = {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "etcd"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": f"{release}-etcd", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 0,
            "serviceName": f"{release}-etcd",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "etcd", "image": "etcd"}]},
            },
        },
    }


def placement(namespace: str, release: str) -> dict[str, object]:
    """The service as the chart runs it with backups off: no --backup-organization."""
    labels = {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "placement"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{release}-placement", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "placement",
                            "image": "o41",
                            "args": ["python", "-m", "o41.webhook"],
                        }
                    ]
                },
            },
        },
    }


def test_what_is_missing_is_said(
    kube: Kube, crds: None, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"restore-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", namespace)
    common = ("--kubeconfig", str(kube.kubeconfig), "--namespace", namespace)
    code, said = restore(capsys, *common)
    assert code == 1
    assert f"no etcd StatefulSet of release o41 in namespace {namespace}" in said
    assert "helm upgrade o41 ... --reuse-values" in said

    kube.kubectl("apply", "-f", "-", input=json.dumps(etcd_statefulset(namespace, "o41")))
    code, said = restore(capsys, *common)
    assert code == 1
    assert f"no placement Deployment of release o41 in namespace {namespace}" in said

    kube.kubectl("apply", "-f", "-", input=json.dumps(placement(namespace, "o41")))
    code, said = restore(capsys, *common)
    assert code == 1
    assert "release o41 takes no backups (backup.organization is empty)" in said

    code, said = restore(capsys, *common, "--organization", "nobody-here")
    assert code == 1
    assert "organization nobody-here (backup.organization) has no Location" in said


def test_someone_not_an_admin_is_told_so(
    kube: Kube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"restore-{secrets.token_hex(3)}"
    token = kube.token(namespace)
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": "nobody", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "nobody"
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    code, said = restore(capsys, "--kubeconfig", str(tmp_path / "kubeconfig"), "-n", namespace)
    assert code == 1
    assert "the API server answered 403: forbidden: a restore needs a platform admin's" in said
