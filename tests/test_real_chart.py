"""The chart for real, as a user installs it, on the test bed's real node: `helm install`
with the default values except the image (the local build, pullPolicy Never) and the
stand-in's credentials. The operator, the placement service (2 replicas) and the 3-member
etcd StatefulSet run as real pods from the project's own image, Ready through their own
probes; the API server calls the admission webhook through its Service with the chart's
TLS; examples/organization.yaml and a copy of examples/location-s3.yaml pointed at a
stand-in become Ready; examples/job.yaml runs as a real Job and completes.

The stand-in (moto's S3) listens on the real node's bridge address, which pods reach (and
nothing outside the machine does). The Job's pods get their place by env (aws/us-east-1),
so their client never looks at DMI or a metadata address.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41.testbed.kube import kubectl
from o41.testbed.node import GATEWAY, NODE_NAME, RealNode
from o41.testbed.stores import S3Store, start_s3
from test_chart import CHART, REPO, helm

from support import wait_for

pytestmark = [pytest.mark.real, pytest.mark.kube]

# the names examples/job.yaml expects: release "o41" in o41-system
RELEASE, NAMESPACE = "o41", "o41-system"
FULLNAME = f"{RELEASE}-o41-artifacts"
EXAMPLES = REPO / "examples"


def examples(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def split(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


@dataclass
class Installed:
    node: RealNode
    s3: S3Store
    directory: Path

    @property
    def kubeconfig(self) -> Path:
        return self.node.control_plane.kubeconfig

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return kubectl(self.kubeconfig, *args, input=input, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def pods(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("pods", "-n", namespace)["items"]
        return items

    def diagnose(self) -> str:
        """What a user would look at when something does not come up."""
        out = [self.kubectl("get", "pods,pvc,jobs", "-A", "-o", "wide", check=False)]
        out.append(self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False))
        return "\n".join(out)[-6000:]


def helm_run(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm(), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )


@pytest.fixture(scope="module")
def installed(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    directory = tmp_path_factory.mktemp("real-chart")
    s3 = start_s3(directory / "s3", host=GATEWAY)  # where pods can reach it, and only there
    try:
        # the StatefulSet's claims (8Gi each, no class) bind these; there is no provisioner
        real_node.local_volumes(3, "8Gi")
        app, etcd = split(real_node.images.app), split(real_node.images.etcd)
        values = {
            "image": {"repository": app[0], "tag": app[1], "pullPolicy": "Never"},
            "etcd": {"image": {"repository": etcd[0], "tag": etcd[1], "pullPolicy": "Never"}},
        }
        (directory / "values.yaml").write_text(yaml.safe_dump(values))
        done = helm_run(
            real_node.control_plane.kubeconfig, "install", RELEASE, str(CHART),
            "--namespace", NAMESPACE, "--create-namespace", "-f", str(directory / "values.yaml"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        (directory / "install.out").write_text(done.stdout)
        yield Installed(real_node, s3, directory)
    finally:
        kubeconfig = real_node.control_plane.kubeconfig
        helm_run(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        for namespace in ("ml-training", NAMESPACE):
            kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
        s3.stop()


def all_ready(installed: Installed) -> bool:
    pods = installed.pods()
    return len(pods) == 6 and all(
        p["status"].get("phase") == "Running"
        and {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready")
        == "True"
        for p in pods
    )


def test_the_charts_pods_run_ready_on_the_real_node_from_the_projects_image(
    installed: Installed,
) -> None:
    try:
        wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{installed.diagnose()}") from None
    by_component: dict[str, list[dict[str, Any]]] = {}
    for p in installed.pods():
        component = p["metadata"]["labels"]["app.kubernetes.io/component"]
        by_component.setdefault(component, []).append(p)
    assert {k: len(v) for k, v in by_component.items()} == {
        "operator": 1,
        "placement": 2,
        "etcd": 3,
    }
    images = installed.node.images
    for component, pods in by_component.items():
        want = images.etcd if component == "etcd" else images.app
        for p in pods:
            assert p["spec"]["nodeName"] == NODE_NAME
            [status] = p["status"]["containerStatuses"]
            assert status["image"].endswith(want.split("/", 1)[1]), status["image"]
            assert status["ready"] is True
            assert p["spec"]["securityContext"]["runAsUser"] == 10001
    # the workloads report what a user checks with `kubectl get deploy,sts`
    placement = installed.json("deployment", f"{FULLNAME}-placement", "-n", NAMESPACE)
    assert placement["status"]["readyReplicas"] == 2
    etcd = installed.json("statefulset", f"{FULLNAME}-etcd", "-n", NAMESPACE)
    assert etcd["status"]["readyReplicas"] == 3
    claims = installed.json("pvc", "-n", NAMESPACE)["items"]
    assert sorted(c["status"]["phase"] for c in claims) == ["Bound"] * 3


def test_the_api_server_calls_the_webhook_through_its_service(installed: Installed) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    organization = {
        "apiVersion": "artifacts.o41.io/v1alpha1",
        "kind": "Organization",
        "metadata": {"name": "picks-nothing"},
        "spec": {"namespaces": ["nobody"], "fallback": "nowhere"},
    }
    done = subprocess.run(
        [*kubectl_argv(installed), "apply", "-f", "-"],
        input=json.dumps(organization), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        'admission webhook "organization-picks.artifacts.o41.io" denied the request: '
        "fallback 'nowhere' does not exist: create the Location first"
    ) in done.stderr, done.stderr


def kubectl_argv(installed: Installed) -> list[str]:
    from o41.testbed.kube import kubectl_binary

    return [kubectl_binary(), f"--kubeconfig={installed.kubeconfig}"]


def location_on_the_stand_in(s3: S3Store) -> list[dict[str, Any]]:
    """examples/location-s3.yaml, with the stand-in's credentials and endpoint."""
    secret, location = examples("location-s3.yaml")
    secret["stringData"] = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    location["spec"]["backend"]["s3"] = {"endpoint": s3.endpoint}
    return [secret, location]


def test_the_example_organization_and_a_location_on_the_stand_in_become_ready(
    installed: Installed,
) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    installed.kubectl("apply", "-f", str(EXAMPLES / "organization.yaml"))
    secret, location = location_on_the_stand_in(installed.s3)
    installed.kubectl("apply", "-f", "-", input=json.dumps(secret))
    installed.kubectl("apply", "-f", "-", input=json.dumps(location))
    name = location["metadata"]["name"]
    installed.kubectl("wait", "--for=condition=Ready", f"location/{name}", "--timeout=180s")

    table = installed.kubectl("get", "loc", name)
    header, row = table.splitlines()
    assert header.split() == ["NAME", "ORGANIZATION", "CLOUD", "REGION", "READY", "ROLE",
                              "RETIRED", "AGE"]  # fmt: skip
    # the first Location of an organization is its fallback, and its cloud's default
    assert row.split()[:7] == [name, "ml", "aws", "us-east-1", "True", "fallback,default",
                               "false"]  # fmt: skip
    # the operator (a pod) made the bucket on the stand-in
    bucket = installed.json("location", name)["status"]["bucket"]
    assert bucket in {b["Name"] for b in installed.s3.client().list_buckets()["Buckets"]}

    # and the webhook refuses what the rules forbid, with its reason
    done = subprocess.run(
        [*kubectl_argv(installed), "delete", "location", name],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"location {name!r} cannot be deleted (it is Ready" in done.stderr, done.stderr


def the_example_job(installed: Installed) -> list[dict[str, Any]]:
    """examples/job.yaml with the local image and the pods' place set by env."""
    namespace, job = examples("job.yaml")
    [container] = job["spec"]["template"]["spec"]["containers"]
    container["image"] = installed.node.images.app
    container["imagePullPolicy"] = "Never"
    container["env"] += [
        {"name": "O41_ARTIFACTS_CLOUD", "value": "aws"},
        {"name": "O41_ARTIFACTS_REGION", "value": "us-east-1"},
    ]
    return [namespace, job]


def test_the_example_job_completes_on_real_pods(installed: Installed) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    installed.kubectl("wait", "--for=condition=Ready", "location/aws-us-east-1", "--timeout=180s")
    namespace, job = the_example_job(installed)
    installed.kubectl("apply", "-f", "-", input=json.dumps(namespace))
    installed.kubectl("apply", "-f", "-", input=json.dumps(job))
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]

    def finished() -> str | None:
        status = installed.json("job", name, "-n", ns).get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if conditions.get("Complete") == "True":
            return "Complete"
        return "Failed" if conditions.get("Failed") == "True" else None

    try:
        outcome = wait_for(finished, timeout=300, what=f"job {ns}/{name} to finish")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{installed.diagnose()}") from None
    pods = installed.pods(ns)
    logs = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: installed.kubectl(
            "logs", "-n", ns, p["metadata"]["name"]
        )
        for p in pods
        if p["status"]["phase"] == "Succeeded"
    }
    assert outcome == "Complete", (logs, installed.diagnose())
    status = installed.json("job", name, "-n", ns)["status"]
    assert status["succeeded"] == 2
    assert status.get("failed", 0) == 0
    assert set(logs) == {"0", "1"}
    for index, log in logs.items():
        wrote = json.loads(log.split("wrote ", 1)[1].splitlines()[0])
        # the place came from env: the region rule picked the Location of aws/us-east-1
        assert (wrote["location"], wrote["rule"], wrote["warning"]) == (
            "aws-us-east-1",
            "region",
            None,
        ), index
        assert "counter: 2" in log, log
    # both versions are in the stand-in's bucket, uploaded by the pods themselves
    bucket = installed.json("location", "aws-us-east-1")["status"]["bucket"]
    keys = [o["Key"] for o in installed.s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert len(keys) >= 2, keys
