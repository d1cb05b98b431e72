"""The chart's backup values, rendered (docs/operations.md, "Backups and restore"): the
placement service told where and how often, its scratch volume, the restore step
`kubectl o41 admin restore` adds to the chart's etcd, and the install notes' warning while
backups are off."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from o41.restore.admin import Release, add_step, remove_step, restore_step
from test_chart import CHART, NAMESPACE, container, find, helm, render, run_helm
from testbed.kube import Kube


@pytest.mark.kube
def test_backups_are_off_by_default_and_the_notes_say_so(kube: Kube) -> None:
    placement = container(find(render(), "Deployment", "-placement"))
    assert not [a for a in placement["args"] if a.startswith("--backup")]

    def notes(*sets: str) -> str:
        # a namespace of its own: an earlier test's objects in the chart's namespace
        # (not the release's) would stop even a dry-run install
        namespace = f"notes-{uuid.uuid4().hex[:8]}"
        argv = [helm(), "install", "o41", str(CHART), "-n", namespace, "--dry-run=client"]
        for s in sets:
            argv += ["--set", s]
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=120,
            env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split("NOTES:", 1)[1]

    assert "WARNING: backups are OFF (backup.organization is empty)" in notes()
    on = notes("backup.organization=platform", "backup.interval=2h")
    assert "WARNING: backups" not in on
    assert "Backups: an etcd snapshot every 2h into the fallback location of organization " in on


def test_backups_on_tell_the_service_and_give_it_room() -> None:
    docs = render("backup.organization=platform", "backup.interval=30m", "backup.keep=5")
    deployment = find(docs, "Deployment", "-placement")
    placement = container(deployment)
    args = placement["args"]
    flags = {args[i]: args[i + 1] for i, a in enumerate(args) if a.startswith("--backup")}
    assert flags == {
        "--backup-organization": "platform",
        "--backup-interval": "1800",
        "--backup-keep": "5",
        "--backup-dir": "/var/lib/o41/backup",
    }
    mounts = {m["name"]: m["mountPath"] for m in placement["volumeMounts"]}
    assert mounts["backup-scratch"] == "/var/lib/o41/backup"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["backup-scratch"]["emptyDir"] == {"sizeLimit": "3Gi"}


def test_the_restore_step_runs_each_member_with_its_own_cluster_flags() -> None:
    """`kubectl o41 admin restore` adds the step for the restore only: the chart's etcd
    has none (an app upgrade never rolls etcd), and the step it adds is made of the
    chart's own etcd flags, data volume and security context."""
    docs = render()
    statefulset = find(docs, "StatefulSet", "-etcd")
    spec = statefulset["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    image = container(find(docs, "Deployment", "-placement"))["image"]
    step = restore_step(statefulset, image, "IfNotPresent")
    assert step["command"] == ["python", "-m", "o41.restore.member"]
    assert step["image"] == image
    args = dict(a.split("=", 1) for a in step["args"])
    etcd = spec["containers"][0]
    flags = dict(a.split("=", 1) for a in etcd["args"] if "=" in a)
    for flag in ("--initial-cluster", "--initial-cluster-token", "--initial-advertise-peer-urls",
                 "--data-dir"):  # fmt: skip
        assert args[flag] == flags[flag], flag
    assert args["--name"] == "$(POD_NAME)"
    assert step["securityContext"] == etcd["securityContext"]
    assert {"name": "data", "mountPath": "/var/lib/etcd"} in step["volumeMounts"]

    release = Release(NAMESPACE, "o41", statefulset, "platform", image)
    ops = add_step(release, step)
    assert [(o["op"], o["path"]) for o in ops] == [
        ("add", "/spec/template/spec/initContainers"),
        ("add", "/spec/template/spec/volumes/-"),
        ("replace", "/spec/replicas"),
    ]
    assert ops[1]["value"]["secret"]["secretName"] == "o41-artifacts-etcd-restore"
    # and out again, from the object as it then is
    patched = json.loads(json.dumps(statefulset))
    patched["spec"]["template"]["spec"]["initContainers"] = [step]
    patched["spec"]["template"]["spec"]["volumes"].append(ops[1]["value"])
    removed = remove_step(patched)
    assert [o["op"] for o in removed] == ["test", "remove", "test", "remove"]
    assert removed[1]["path"] == "/spec/template/spec/initContainers/0"


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("backup.interval=1d", "backup/interval"),
        ("backup.keep=0", "backup/keep"),
        ("backup.organization=Not_A_Name", "backup/organization"),
    ],
)
def test_the_schema_refuses_bad_backup_values(bad: str, says: str) -> None:
    done = run_helm("template", "o41", str(CHART), "--set", bad)
    assert done.returncode != 0
    assert says in done.stderr
