"""A whole etcd lost and restored from a scheduled snapshot, on the test bed's real node
(issue 32): the chart installed with backups on (a short interval) into a "platform"
Organization of its own; versions, tags and a directory version written through the
placement Service as a pod would; a snapshot object awaited in the platform's bucket;
the etcd StatefulSet and its claims deleted, made again by `helm upgrade`, then
`kubectl o41 admin restore --snapshot latest --yes`; the listing, every tag, `latest` and
every read byte-identical to before.

The node's volumes are local PersistentVolumes (Retain, no provisioner): enough of them
are made up front for the three sets of claims the test makes, and all are removed,
their directories emptied, at the end, so that the next module's install starts clean.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41.client.artifacts import Artifacts
from o41.client.directories import read_dir, write_dir
from o41.core.places import Place
from o41.state.snapshot import PREFIX, newest_first
from test_chart import CHART
from test_real_chart import (
    EXAMPLES,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    Installed,
    all_ready,
    helm_run,
    location_on_the_stand_in,
    split,
)
from testbed.kube import kubectl, kubectl_binary, service_account_token
from testbed.node import GATEWAY, RealNode
from testbed.stores import start_moto

from support import wait_for

pytestmark = [pytest.mark.real, pytest.mark.kube]

INTERVAL = "5s"  # short: the test waits for two snapshots
VOLUMES = 12  # four sets of claims: the install, two `helm upgrade`s, the restore's
ETCD = f"{FULLNAME}-etcd"
LOCATIONS = ("aws-us-east-1", "platform-backups")  # examples/location-s3.yaml's, the platform's


def gone(kubeconfig: Path, *what: str) -> bool:
    found = kubectl(kubeconfig, "get", *what, "--ignore-not-found", "-o", "name", check=False)
    return not found.strip()


def clear_volumes(node: RealNode) -> None:
    """No real-node PersistentVolume left, and their directories empty."""
    kubeconfig = node.control_plane.kubeconfig
    kubectl(kubeconfig, "delete", "pv", "-l", "o41.io/real-node=true", "--wait=true", check=False)
    root = node.directory / "volumes"
    if root.exists():
        for volume in root.iterdir():
            for child in volume.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()


@pytest.fixture(scope="module")
def backed_up(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The release with backups on, into Organization "platform" and its Location."""
    directory = tmp_path_factory.mktemp("real-backup")
    kubeconfig = real_node.control_plane.kubeconfig
    wait_for(
        lambda: gone(kubeconfig, "namespace", NAMESPACE),
        180,
        "an earlier release's namespace to go",
    )
    clear_volumes(real_node)
    real_node.local_volumes(VOLUMES, "8Gi")
    s3 = start_moto(directory / "s3", host=GATEWAY)
    try:
        app, etcd = split(real_node.images.app), split(real_node.images.etcd)
        values = {
            "image": {"repository": app[0], "tag": app[1], "pullPolicy": "Never"},
            "etcd": {"image": {"repository": etcd[0], "tag": etcd[1], "pullPolicy": "Never"}},
            "backup": {"organization": "platform", "interval": INTERVAL, "keep": 3},
        }
        (directory / "values.yaml").write_text(yaml.safe_dump(values))
        done = helm_run(
            kubeconfig, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--create-namespace", "-f", str(directory / "values.yaml"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Backups: an etcd snapshot every {INTERVAL}" in done.stdout, done.stdout
        installed = Installed(real_node, s3, directory)
        try:
            wait_for(lambda: all_ready(installed), 300, "the chart's pods to be Ready")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{installed.diagnose()}") from None
        organizations(installed)
        yield installed
    finally:
        helm_run(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        for namespace in ("ml-training", NAMESPACE):
            kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
        wait_for(
            lambda: gone(kubeconfig, "namespace", NAMESPACE, "ml-training"),
            180,
            "the namespaces to go",
        )
        kubectl(kubeconfig, "delete", "organization", "platform", "ml", check=False)
        forget_locations(kubeconfig)
        clear_volumes(real_node)
        s3.stop()


def forget_locations(kubeconfig: Path) -> None:
    """This module's Locations gone, once the chart (its webhook and operator) is: a
    Location is never deleted while the operator runs, and one left here (its stand-in
    stopped) would be the next module's organization's first, so its fallback."""
    for name in LOCATIONS:
        kubectl(kubeconfig, "delete", "location", name, "--wait=false", check=False)
        kubectl(kubeconfig, "patch", "location", name, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
    wait_for(
        lambda: all(gone(kubeconfig, "location", n) for n in LOCATIONS), 60, "the Locations to go"
    )


def organizations(installed: Installed) -> None:
    """ml (examples/organization.yaml) and the platform team's own, each with a Location
    on the stand-in, Ready."""
    organization = ("apply", "-f", str(EXAMPLES / "organization.yaml"))
    wait_for(
        lambda: subprocess.run([kubectl_binary(), f"--kubeconfig={installed.kubeconfig}",
                                *organization], capture_output=True, check=False).returncode == 0,
        timeout=120,
        what="the admission webhook to answer through its Service",
    )  # fmt: skip
    secret, location = location_on_the_stand_in(installed.s3)
    platform = json.loads(json.dumps(location))
    platform["metadata"]["name"] = "platform-backups"
    platform["spec"]["organization"] = "platform"
    org = {
        "apiVersion": "artifacts.o41.io/v1alpha1",
        "kind": "Organization",
        "metadata": {"name": "platform"},
        "spec": {"namespaces": [NAMESPACE]},
    }
    for obj in (secret, location, org, platform):
        installed.kubectl("apply", "-f", "-", input=json.dumps(obj))
    for name in (location["metadata"]["name"], "platform-backups"):
        installed.kubectl("wait", "--for=condition=Ready", f"location/{name}", "--timeout=180s")


def snapshots(installed: Installed) -> list[dict[str, Any]]:
    """The sidecars in the platform's bucket, newest first."""
    bucket = installed.json("location", "platform-backups")["status"]["bucket"]
    client = installed.s3.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=PREFIX).get("Contents", [])
    found = []
    for key in newest_first([o["Key"] for o in listed]):
        sidecar = [o for o in listed if o["Key"] == key + ".json"]
        if sidecar:
            body = client.get_object(Bucket=bucket, Key=key + ".json")["Body"].read()
            found.append(json.loads(body))
    return found


def service_client(installed: Installed) -> Artifacts:
    installed.kubectl("create", "namespace", "ml-training", check=False)
    token = service_account_token(installed.kubeconfig, "ml-training", duration="1h")
    (installed.directory / "token").write_text(token)
    service = installed.json("service", f"{FULLNAME}-placement", "-n", NAMESPACE)
    return Artifacts(
        endpoint=f"http://{service['spec']['clusterIP']}:8080",
        token_file=str(installed.directory / "token"),
        place=Place("aws", "us-east-1", "env"),
        timeout=30,
    )


def everything(api: Artifacts, scratch: Path) -> dict[str, Any]:
    """What a user sees: each artifact's listing, tags and latest, every version's bytes."""
    seen: dict[str, Any] = {}
    for artifact in ("model", "data"):
        versions = api.versions_page("ml", artifact, limit=1000)["versions"]
        seen[f"{artifact} versions"] = versions
        seen[f"{artifact} tags"] = sorted(api.tags("ml", artifact), key=lambda t: t["tag"])
        seen[f"{artifact} latest"] = api.resolve("ml", artifact, "latest")["version"]
    for v in seen["model versions"]:
        seen[f"model {v['version']}"] = api.read_bytes("ml", "model", v["version"])[0]
    for v in seen["data versions"]:
        out = scratch / f"read-{len(list(scratch.iterdir()))}"
        read_dir(api, "ml", "data", v["version"], out)
        seen[f"data {v['version']}"] = {
            str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
        }
    return seen


def lose_etcd(installed: Installed, api: Artifacts) -> None:
    """etcd lost: its StatefulSet and every member's claim; then the runbook's first step,
    the StatefulSet made again (empty members), answering with nothing in it."""
    kubeconfig = installed.kubeconfig
    installed.kubectl("delete", "statefulset", ETCD, "-n", NAMESPACE, "--wait=true")
    claims = [f"data-{ETCD}-{i}" for i in range(3)]
    installed.kubectl("delete", "pvc", *claims, "-n", NAMESPACE, "--wait=true")
    etcd_pods = ("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=etcd")
    wait_for(lambda: gone(kubeconfig, *etcd_pods), 120, "the etcd pods to go")
    done = helm_run(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--reuse-values")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the loss is real: the members made again hold nothing, and the service says so
    wait_for(lambda: _quietly(lambda: _not_found(api)), 180, "the empty etcd to answer")


def plugin(installed: Installed, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl o41 ...`` with the platform admin's kubeconfig."""
    return subprocess.run(
        [kubectl_binary(), "o41", *args, "--namespace", NAMESPACE, "--release", RELEASE,
         f"--kubeconfig={installed.kubeconfig}"],
        capture_output=True, text=True, check=False, timeout=900,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip


def test_a_lost_etcd_comes_back_from_its_snapshot_and_the_buckets_with_every_version_and_byte(
    backed_up: Installed,
) -> None:
    installed, kubeconfig = backed_up, backed_up.kubeconfig
    api = service_client(installed)
    # versions, tags, a directory version, as the Job's pods write them
    for n in range(3):
        api.write_bytes("ml", "model", os.urandom(2048 + n), tag="best" if n == 1 else None)
    api.move_tag("ml", "model", "prod", "latest")
    tree = installed.directory / "tree"
    (tree / "shards").mkdir(parents=True)
    (tree / "index.json").write_text('{"rows": 3}')
    for n in range(3):
        (tree / "shards" / f"{n}.bin").write_bytes(os.urandom(1000 + n))
    write_dir(api, "ml", "data", tree, tag="v1")
    scratch = installed.directory / "reads"
    scratch.mkdir()
    before = everything(api, scratch)
    written = time.time()

    # a snapshot taken after the writes, in the platform's own bucket (never ml's)
    taken = wait_for(
        lambda: [s for s in snapshots(installed) if s["taken"] > written],
        timeout=120,
        what="a snapshot after the writes",
    )[0]
    ml_bucket = installed.json("location", "aws-us-east-1")["status"]["bucket"]
    ml_keys = installed.s3.client().list_objects_v2(Bucket=ml_bucket).get("Contents", [])
    assert not [o for o in ml_keys if o["Key"].startswith(PREFIX)]
    # writes after that snapshot (in none restored below): a version, a tag moved onto
    # it, a tag deleted; only the buckets' records and journal know of them
    api.write_bytes("ml", "model", os.urandom(4096))
    api.move_tag("ml", "model", "prod", "latest")
    api.delete_tag("ml", "model", "best")
    everything_written = everything(api, scratch)
    assert everything_written != before

    lose_etcd(installed, api)
    started = time.monotonic()
    restore = plugin(installed, "admin", "restore", "--snapshot", taken["key"], "--yes")
    took = time.monotonic() - started
    assert restore.returncode == 0, restore.stdout + restore.stderr + installed.diagnose()
    assert f"restored etcd from {taken['key']}: revision {taken['revision']}" in restore.stdout
    assert "Traceback" not in restore.stderr
    print(f"restore took {took:.1f} s:\n{restore.stdout}")
    assert gone(kubeconfig, "secret", f"{ETCD}-restore", "-n", NAMESPACE)
    # the restore step was the restore's only: the StatefulSet is the chart's again
    statefulset = installed.json("statefulset", ETCD, "-n", NAMESPACE)
    assert "initContainers" not in statefulset["spec"]["template"]["spec"]
    restored = wait_for(
        lambda: _quietly(lambda: everything(api, scratch)), 120, "the service to read etcd again"
    )
    assert restored == before  # the snapshot's state: the later writes are not in it
    assert all_ready(installed)
    # and the schedule goes on from the restored etcd, its revisions far above the old
    again = wait_for(
        lambda: [s for s in snapshots(installed) if s["revision"] > 1_000_000_000],
        timeout=120,
        what="a snapshot of the restored etcd",
    )
    assert again[0]["taken"] > taken["taken"]

    # the writes after the snapshot, from the buckets' records and journal
    dry = plugin(installed, "admin", "rebuild", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr + installed.diagnose()
    assert "is in the buckets' records, not in etcd" in dry.stdout, dry.stdout
    started = time.monotonic()
    rebuilt = plugin(installed, "admin", "rebuild")
    print(f"rebuild after the restore took {time.monotonic() - started:.1f} s:\n{rebuilt.stdout}")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert everything(api, scratch) == everything_written  # 0 acknowledged commits lost

    # the whole etcd lost again, and rebuilt from the buckets alone: no snapshot
    lose_etcd(installed, api)
    started = time.monotonic()
    alone = plugin(installed, "admin", "rebuild")
    print(f"rebuild from nothing took {time.monotonic() - started:.1f} s:\n{alone.stdout}")
    assert alone.returncode == 0, alone.stdout + alone.stderr + installed.diagnose()
    assert "written: 5 versions" in alone.stdout, alone.stdout
    assert everything(api, scratch) == everything_written
    again_dry = plugin(installed, "admin", "rebuild", "--organization", "ml", "--dry-run")
    assert "etcd holds what the buckets say" in again_dry.stdout, again_dry.stdout


def _not_found(api: Artifacts) -> bool:
    from o41.client.errors import NotFound

    try:
        page = api.versions_page("ml", "model")
    except NotFound:
        return True
    return not page["versions"]


def _quietly(call: Any) -> Any:
    try:
        return call()
    except Exception:
        return None
