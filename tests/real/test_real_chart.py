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

import contextlib
import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41.client.artifacts import ArtifactError, Artifacts
from o41.core.places import Place
from o41.kube.location_record import record_name
from test_chart import CHART, REPO, helm
from test_real_node import finished, pod
from testbed.kube import SELF, ControlPlane, bin_dir, kubectl, service_account_token
from testbed.node import GATEWAY, NODE_NAME, RealNode
from testbed.stores import S3Store, start_moto

from support import wait_for

pytestmark = [pytest.mark.real, pytest.mark.kube]

# the names examples/job.yaml expects: release "o41" in o41-system
RELEASE, NAMESPACE = "o41", "o41-system"
FULLNAME = "o41-artifacts"  # release o41: the chart does not repeat it (o41.fullname)
EXAMPLES = REPO / "examples"


def examples(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def split(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


class OnTheNode:
    """What a release on the real node's cluster is looked at with (``node`` is the
    dataclass field of each release kind)."""

    node: RealNode

    @property
    def kubeconfig(self) -> Path:
        return self.node.control_plane.kubeconfig

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return kubectl(self.kubeconfig, *args, input=input, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def diagnose(self) -> str:
        """What a user would look at when something does not come up."""
        out = [self.kubectl("get", "pods,pvc,jobs", "-A", "-o", "wide", check=False)]
        out.append(self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False))
        return "\n".join(out)[-6000:]


@dataclass
class Installed(OnTheNode):
    node: RealNode
    s3: S3Store
    directory: Path

    def pods(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("pods", "-n", namespace)["items"]
        return items


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
def chart_site(
    real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The node made ready for the chart (an S3 stand-in pods reach, volumes for etcd's
    claims, the values); the release itself is :func:`installed`'s."""
    directory = tmp_path_factory.mktemp("real-chart")
    s3 = start_moto(directory / "s3", host=GATEWAY)  # where pods can reach it, and only there
    try:
        # the StatefulSet's claims (8Gi each, no class) bind these; there is no provisioner
        real_node.local_volumes(3, "8Gi")
        app, etcd = split(real_node.images.app), split(real_node.images.etcd)
        values = {
            "image": {"repository": app[0], "tag": app[1], "pullPolicy": "Never"},
            "etcd": {"image": {"repository": etcd[0], "tag": etcd[1], "pullPolicy": "Never"}},
        }
        (directory / "values.yaml").write_text(yaml.safe_dump(values))
        yield Installed(real_node, s3, directory)
    finally:
        kubeconfig = real_node.control_plane.kubeconfig
        helm_run(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        for namespace in ("ml-training", NAMESPACE):
            kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
        s3.stop()


@pytest.fixture
def installed(chart_site: Installed) -> Installed:
    """The release, installed once and again after a test that uninstalled it: no test
    depends on running after another."""
    kubeconfig = chart_site.kubeconfig
    if helm_run(kubeconfig, "status", RELEASE, "--namespace", NAMESPACE).returncode != 0:
        done = helm_run(
            kubeconfig, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--create-namespace", "-f", str(chart_site.directory / "values.yaml"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        (chart_site.directory / "install.out").write_text(done.stdout)
    return chart_site


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
            # Ready through a probe of its own, not merely started
            assert p["spec"]["containers"][0]["readinessProbe"], component
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

    def answered() -> subprocess.CompletedProcess[str] | None:
        done = subprocess.run(
            [*kubectl_argv(installed), "apply", "-f", "-"],
            input=json.dumps(organization), capture_output=True, text=True, check=False,
        )  # fmt: skip
        # until every kube-proxy has the new endpoint, the API server may find none
        return None if "failed calling webhook" in done.stderr else done

    done = wait_for(answered, timeout=60, what="the webhook's own answer")
    assert done.returncode != 0
    assert (
        'admission webhook "organization-picks.artifacts.o41.io" denied the request: '
        "fallback 'nowhere' does not exist: create the Location first"
    ) in done.stderr, done.stderr


def kubectl_argv(installed: Installed) -> list[str]:
    from testbed.kube import kubectl_binary

    return [kubectl_binary(), f"--kubeconfig={installed.kubeconfig}"]


def location_on_the_stand_in(s3: S3Store) -> list[dict[str, Any]]:
    """examples/location-s3.yaml, with the stand-in's credentials and endpoint."""
    secret, location = examples("location-s3.yaml")
    secret["stringData"] = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    location["spec"]["backend"]["s3"] = {"endpoint": s3.endpoint}
    return [secret, location]


@pytest.fixture
def example_location(installed: Installed) -> str:
    """examples/organization.yaml and a Location on the stand-in, Ready: what every test
    that writes needs, made here so that no test depends on another having run first."""
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    # Ready pods are not yet a reachable Service: kube-proxy programs the webhook's
    # endpoints a moment later (seconds on loaded cores; "connection refused" until then)
    organization = ("apply", "-f", str(EXAMPLES / "organization.yaml"))
    wait_for(
        lambda: subprocess.run([*kubectl_argv(installed), *organization], capture_output=True,
                               check=False).returncode == 0,
        timeout=120,
        what="the admission webhook to answer through its Service",
    )  # fmt: skip
    secret, location = location_on_the_stand_in(installed.s3)
    installed.kubectl("apply", "-f", "-", input=json.dumps(secret))
    installed.kubectl("apply", "-f", "-", input=json.dumps(location))
    name: str = location["metadata"]["name"]
    installed.kubectl("wait", "--for=condition=Ready", f"location/{name}", "--timeout=180s")
    return name


def test_the_example_organization_and_a_location_on_the_stand_in_become_ready(
    installed: Installed, example_location: str
) -> None:
    name = example_location
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
    assert f"location {name!r} cannot be deleted (" in done.stderr, done.stderr
    assert "is retired, never deleted" in done.stderr, done.stderr


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


def test_the_example_job_completes_on_real_pods(
    installed: Installed, example_location: str
) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
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
    if outcome != "Complete":
        failed = {
            p["metadata"]["name"]: installed.kubectl("logs", "-n", ns, p["metadata"]["name"])
            for p in pods
            if p["status"]["phase"] == "Failed"
        }
        raise AssertionError(f"job {ns}/{name}: {outcome}\n{failed}\n{installed.diagnose()}")
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
        # a directory checkpoint every step (STEPS=3), each of 4 files; the other's latest
        steps = [json.loads(x[6:]) for x in log.splitlines() if x.startswith("wrote ")]
        assert [(s["step"], s["files"]) for s in steps] == [(0, 4), (1, 4), (2, 4)], log
        assert "of the other pod from aws-us-east-1 at step 2" in log, log
    # every checkpoint's files are in the stand-in's bucket, uploaded by the pods themselves
    bucket = installed.json("location", "aws-us-east-1")["status"]["bucket"]
    keys = [o["Key"] for o in installed.s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    for index in ("0", "1"):
        assert sum(k.startswith(f"checkpoint-{index}/") for k in keys) == 3 * 4, keys


# --- lifecycle: what the chart promises while it is upgraded and its pods go -----------------


@dataclass
class WriteLoop:
    """Versions written one after another through the placement Service, as a pod would
    (its ServiceAccount token, its place), from a thread; every outcome is kept."""

    artifacts: Artifacts
    source: Path
    artifact: str
    written: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> WriteLoop:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_for(lambda: len(self.written) >= 3 or self.failed, timeout=60, what="writes")
        assert not self.failed, self.failed
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.written.append(self.artifacts.write("ml", self.artifact, self.source).version)
            except ArtifactError as e:
                self.failed.append(f"after {len(self.written)} writes: {e}")

    def more(self, count: int = 3) -> None:
        """Wait until ``count`` more writes were acknowledged."""
        target = len(self.written) + count
        wait_for(lambda: len(self.written) >= target, timeout=60, what=f"{count} more writes")

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=120)


def write_loop(installed: Installed, artifact: str) -> WriteLoop:
    """A loop writing as the Job's pods do: the default ServiceAccount of ml-training."""
    token = service_account_token(installed.kubeconfig, "ml-training", duration="1h")
    (installed.directory / "token").write_text(token)
    (installed.directory / "payload").write_bytes(os.urandom(4096))
    service = installed.json("service", f"{FULLNAME}-placement", "-n", NAMESPACE)
    # the test process reaches the Service's ClusterIP through kube-proxy's rules, as a pod
    endpoint = f"http://{service['spec']['clusterIP']}:8080"
    artifacts = Artifacts(
        endpoint=endpoint,
        token_file=str(installed.directory / "token"),
        place=Place("aws", "us-east-1", "env"),
        timeout=30,
    )
    return WriteLoop(artifacts, installed.directory / "payload", artifact)


def placement_pods(installed: Installed) -> list[dict[str, Any]]:
    return [
        p
        for p in installed.pods()
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "placement"
    ]


def rolled_out(installed: Installed, image: str, gone: set[str]) -> bool:
    """2 placement pods, all Ready, all of ``image``, none of the names in ``gone``."""
    pods = placement_pods(installed)
    return (
        len(pods) == 2
        and not {p["metadata"]["name"] for p in pods} & gone
        and all(p["spec"]["containers"][0]["image"] == image for p in pods)
        and all_ready(installed)
    )


def test_a_helm_upgrade_to_a_new_image_tag_rolls_the_service_with_no_failed_write(
    installed: Installed, example_location: str
) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    repository, tag = split(installed.node.images.app)
    new = f"{repository}:{tag}-next"  # the same bytes under a new tag, as a release would be
    subprocess.run([*installed.node.ctr(), "images", "tag", "--force",
                    installed.node.images.app, new], check=True, capture_output=True)  # fmt: skip
    old = {p["metadata"]["name"] for p in placement_pods(installed)}
    with write_loop(installed, "rolling") as loop:
        done = helm_run(
            installed.kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--reuse-values", "--set", f"image.tag={tag}-next",
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(lambda: rolled_out(installed, new, old), timeout=300, what="the rollout")
        loop.more()
    assert loop.failed == [], f"{len(loop.failed)} of {len(loop.written) + len(loop.failed)}"


def test_deleting_a_placement_pod_fails_no_write(
    installed: Installed, example_location: str
) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    pods = placement_pods(installed)
    image = pods[0]["spec"]["containers"][0]["image"]
    victim = pods[0]["metadata"]["name"]
    with write_loop(installed, "deleted-pod") as loop:
        installed.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--wait=false")
        wait_for(lambda: rolled_out(installed, image, {victim}), timeout=300, what="a new pod")
        loop.more()
    assert loop.failed == [], f"{len(loop.failed)} of {len(loop.written) + len(loop.failed)}"


def etcd_pod(installed: Installed, index: int) -> dict[str, Any] | None:
    """The member's pod, or None between its deletion and the StatefulSet's new one."""
    name = f"{FULLNAME}-etcd-{index}"
    found = installed.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json", check=False)
    return json.loads(found) if found.strip() else None


def test_deleting_an_etcd_member_loses_no_acknowledged_write(
    installed: Installed, example_location: str
) -> None:
    """The StatefulSet brings the member back on its claim; every write the service
    acknowledged meanwhile can be read back afterwards."""
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    first = etcd_pod(installed, 0)
    assert first is not None
    uid = first["metadata"]["uid"]
    with write_loop(installed, "etcd-member") as loop:
        installed.kubectl("delete", "pod", "-n", NAMESPACE, f"{FULLNAME}-etcd-0", "--wait=false")

        def back() -> bool:
            pod = etcd_pod(installed, 0)  # None for a moment: deleted, not yet made again
            return pod is not None and pod["metadata"]["uid"] != uid and all_ready(installed)

        wait_for(back, timeout=300, what="etcd-0 back and Ready")
        loop.more()
    acknowledged = list(loop.written)
    reader = loop.artifacts
    lost = []
    for version in acknowledged:
        try:
            reader.read("ml", "etcd-member", version, installed.directory / "read-back")
        except ArtifactError as e:
            lost.append(f"{version}: {e}")
    assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged writes lost"
    assert (installed.directory / "read-back").read_bytes() == loop.source.read_bytes()

    # strong collections answer again, to a real pod of the organization's namespace
    script = (
        "import json\n"
        "from o41 import sky\n"
        "counter = sky.counter('after-etcd')\n"
        "counter.add(2)\n"
        "shared = sky.dict('after-etcd')\n"
        "shared['member'] = 'back'\n"
        "print(json.dumps({'counter': counter.get(), 'member': shared['member']}))\n"
    )
    strong = pod("strong", "ml-training", installed.node.images.app, script)
    strong["spec"]["containers"][0]["env"] = [
        {"name": "O41_ARTIFACTS_ENDPOINT",
         "value": f"http://{FULLNAME}-placement.{NAMESPACE}.svc:8080"},
        {"name": "O41_COMPUTE", "value": "after-etcd"},
        {"name": "O41_ARTIFACTS_CLOUD", "value": "aws"},
        {"name": "O41_ARTIFACTS_REGION", "value": "us-east-1"},
    ]  # fmt: skip
    installed.kubectl("apply", "-f", "-", input=json.dumps(strong))
    assert finished(installed.kubeconfig, "ml-training", "strong") == "Succeeded"
    answer = json.loads(installed.kubectl("logs", "-n", "ml-training", "strong"))
    assert answer == {"counter": 2, "member": "back"}


def bucket_names(installed: Installed) -> set[str]:
    return {b["Name"] for b in installed.s3.client().list_buckets()["Buckets"]}


def test_deleting_the_operator_during_location_creations_makes_one_bucket_each(
    installed: Installed, example_location: str
) -> None:
    wait_for(lambda: all_ready(installed), timeout=300, what="the chart's pods to be Ready")
    before = bucket_names(installed)
    names = []
    for region in ("us-west-2", "eu-west-1", "ap-south-1"):
        _, location = location_on_the_stand_in(installed.s3)
        location["metadata"]["name"] = name = f"aws-{region}"
        location["spec"]["region"] = region
        installed.kubectl("apply", "-f", "-", input=json.dumps(location))
        names.append(name)
    [operator] = [
        p["metadata"]["name"]
        for p in installed.pods()
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    installed.kubectl("delete", "pod", "-n", NAMESPACE, operator, "--wait=false")
    for name in names:
        installed.kubectl("wait", "--for=condition=Ready", f"location/{name}", "--timeout=300s")
    made = bucket_names(installed) - before
    recorded = {installed.json("location", n)["status"]["bucket"] for n in names}
    assert made == recorded
    assert len(made) == len(names)


def test_helm_uninstall_keeps_the_crds_and_organizations_and_nothing_else(
    installed: Installed, example_location: str
) -> None:
    done = helm_run(installed.kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE,
                    "--wait")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for crd in ("locations.artifacts.o41.io", "organizations.artifacts.o41.io"):
        installed.kubectl("get", "crd", crd)
    assert installed.json("organization", "ml")["metadata"]["name"] == "ml"
    wait_for(lambda: not installed.pods(), timeout=120, what="the release's pods to go")
    location_uids = [loc["metadata"]["uid"] for loc in installed.json("locations")["items"]]
    left = installed.kubectl(
        "get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings,pdb,pvc",
        "-n", NAMESPACE, "-o", "name",
    ).split()  # fmt: skip
    assert sorted(left) == sorted(
        [
            "configmap/kube-root-ca.crt",  # Kubernetes' own, in every namespace
            "serviceaccount/default",
            "secret/aws-credentials",  # the user's, applied with the Location
            # the operator's record of each Location, owned by it: it stays with the Location
            *(f"configmap/{record_name(uid)}" for uid in location_uids),
            # a StatefulSet's claims outlive it (Kubernetes keeps them): the state store's data
            *(f"persistentvolumeclaim/data-{FULLNAME}-etcd-{i}" for i in range(3)),
        ]
    )
    cluster_wide = installed.kubectl(
        "get", "clusterroles,clusterrolebindings,validatingwebhookconfigurations", "-o", "name"
    )
    assert FULLNAME not in cluster_wide


# --- the hub: other clusters and VMs through an exposed TLS endpoint (issue 31) ------------

HUB_PORT = 30443  # the placement Service's node port on the real node


@pytest.fixture
def cluster_b(tmp_path: Path) -> Iterator[ControlPlane]:
    """A second cluster (its own API server, issuer and signing key) on loopback: its
    TokenRequest mints its pods' tokens; no pod of the hub can reach it."""
    plane = ControlPlane(tmp_path / "cluster-b", bin_dir(), nodes=0, issuer=SELF).start()
    try:
        yield plane
    finally:
        plane.stop()


@contextlib.contextmanager
def exposed(installed: Installed) -> Iterator[Path]:
    """The release upgraded as a hub (TLS on the service, a NodePort on the node; the
    chart's CA); its CA bundle's path. Back to the default values after."""
    kc, values = installed.kubeconfig, str(installed.directory / "values.yaml")
    hub = {
        "placement.tls.enabled": "true",
        "placement.service.type": "NodePort",
        "placement.service.nodePort": str(HUB_PORT),
        "placement.externalURL": f"https://{GATEWAY}:{HUB_PORT}",
    }
    sets = [a for k, v in hub.items() for a in ("--set", f"{k}={v}")]
    upgrade = ("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", values)
    done = helm_run(kc, *upgrade, *sets, "--wait", "--timeout", "5m")
    try:
        assert done.returncode == 0, done.stdout + done.stderr + installed.diagnose()
        ca = installed.kubectl(
            "get",
            "configmap",
            f"{FULLNAME}-placement-ca",
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.data.ca\\.crt}",
        )
        path = installed.directory / "hub-ca.crt"
        path.write_text(ca)
        yield path
    finally:
        back = helm_run(kc, *upgrade, "--wait", "--timeout", "5m")
        assert back.returncode == 0, back.stdout + back.stderr


def gcp_location_on_the_stand_in(s3: S3Store) -> dict[str, Any]:
    """A GCP location (GCS through its S3-compatible API), its bucket on the stand-in."""
    _, location = location_on_the_stand_in(s3)
    location["metadata"]["name"] = "gcp-europe-west4"
    location["spec"].update(
        cloud="gcp",
        region="europe-west4",
        backend={"s3Compatible": {"endpoint": s3.endpoint, "signingRegion": "us-east-1"}},
    )
    return location


def o41_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a process of another cluster or a VM runs it: no metadata address, no
    DMI; its place and token from ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("O41_", "SKYPILOT_"))}
    closed = "http://127.0.0.1:9"  # nothing listens there
    base.update(
        O41_ARTIFACTS_DMI_DIR="/nonexistent",
        O41_ARTIFACTS_AWS_METADATA_URL=closed,
        O41_ARTIFACTS_GCP_METADATA_URL=closed,
        O41_ARTIFACTS_AZURE_METADATA_URL=closed,
    )
    return subprocess.run(
        [sys.executable, "-m", "o41.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_hub_over_tls_on_a_node_port_serves_another_cluster_and_a_vm(
    installed: Installed, example_location: str, cluster_b: ControlPlane
) -> None:
    gcp = gcp_location_on_the_stand_in(installed.s3)
    installed.kubectl("apply", "-f", "-", input=json.dumps(gcp))
    installed.kubectl(
        "wait", "--for=condition=Ready", "location/gcp-europe-west4", "--timeout=180s"
    )
    with exposed(installed) as ca:
        endpoint = f"https://{GATEWAY}:{HUB_PORT}"
        hub = {"O41_ARTIFACTS_ENDPOINT": endpoint, "O41_ARTIFACTS_CA_FILE": str(ca)}
        # B's keys inline: the hub's pods cannot reach B's API server (this machine's loopback)
        added = o41_cli(
            "cluster",
            "add",
            "cluster-b",
            "--from-kubeconfig",
            str(cluster_b.kubeconfig),
            "--inline-keys",
            "--kubeconfig",
            str(installed.kubeconfig),
        )
        assert added.returncode == 0, added.stderr
        installed.kubectl(
            "wait", "--for=condition=Ready", "trustdomain/cluster-b", "--timeout=120s"
        )
        member = {"trustDomain": "cluster-b", "namespaces": ["ml-training"]}
        installed.kubectl(
            "patch",
            "organization",
            "ml",
            "--type",
            "merge",
            "-p",
            json.dumps({"spec": {"members": [member]}}),
        )
        data = installed.directory / "from-b"
        data.write_bytes(os.urandom(100_000))
        b_pod = {
            "O41_ARTIFACTS_TOKEN": cluster_b.pod_token("ml-training"),
            "O41_ARTIFACTS_CLOUD": "gcp",
            "O41_ARTIFACTS_REGION": "europe-west4",
        }

        def written() -> subprocess.CompletedProcess[str] | None:
            # the TrustDomain's keys reach every placement replica through its watch
            done = o41_cli(
                "write",
                "--org",
                "ml",
                "--artifact",
                "from-b",
                str(data),
                "--json",
                env={**hub, **b_pod},
            )
            return done if done.returncode == 0 else None

        wrote = json.loads(wait_for(written, 60, "a write of cluster B's pod").stdout)
        assert (wrote["location"], wrote["rule"]) == ("gcp-europe-west4", "region")

        a_token = service_account_token(installed.kubeconfig, "ml-training", duration="1h")
        a_pod = {
            "O41_ARTIFACTS_TOKEN": a_token,
            "O41_ARTIFACTS_CLOUD": "aws",
            "O41_ARTIFACTS_REGION": "us-east-1",
        }
        back = installed.directory / "back"
        read = o41_cli(
            "read",
            "--org",
            "ml",
            "--artifact",
            "from-b",
            "--version",
            wrote["version"],
            "--output",
            str(back),
            "--json",
            env={**hub, **a_pod},
        )
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout)["locality"] == "cross-cloud"
        assert back.read_bytes() == data.read_bytes()

        # the usage shows both: the write from gcp, the read from aws
        def both_counted() -> set[tuple[str, str]] | None:
            # each replica flushes its counters every few seconds (its usage interval)
            usage = get_json(f"{endpoint}/v1/usage?organization=ml&records=true", a_token, ca)
            seen = {(r["kind"], r["dims"].get("cloud")) for r in usage["records"]}
            return seen if {("write", "gcp"), ("read", "aws")} <= seen else None

        wait_for(both_counted, 60, "the usage to show B's write and A's read")

        # ml-training of the hub's cluster and of B: two tenants
        counter = f"{endpoint}/v1/collections/job/counter/steps"
        assert post(counter + "/add", {"n": 3}, a_token, ca)["value"] == 3
        assert post(counter + "/add", {"n": 1}, b_pod["O41_ARTIFACTS_TOKEN"], ca)["value"] == 1

        # a SkyPilot VM, with a service token
        made = o41_cli(
            "token",
            "create",
            "--org",
            "ml",
            "--subject",
            "sky-job",
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            str(installed.kubeconfig),
        )
        assert made.returncode == 0, made.stderr
        sky = {"cluster_name": "sky-job", "cloud": "AWS", "region": "us-east-1", "zone": None}
        vm = {"O41_ARTIFACTS_TOKEN": made.stdout.strip(), "SKYPILOT_CLUSTER_INFO": json.dumps(sky)}

        def vm_wrote() -> subprocess.CompletedProcess[str] | None:
            # its record reaches every replica through its watch
            done = o41_cli(
                "write",
                "--org",
                "ml",
                "--artifact",
                "from-vm",
                str(data),
                "--json",
                env={**hub, **vm},
            )
            return done if done.returncode == 0 else None

        vm_write = json.loads(wait_for(vm_wrote, 60, "a write of the VM").stdout)
        assert (vm_write["location"], vm_write["rule"]) == (example_location, "region")

        # outside, nothing answers without a token but health and the API's description
        assert get(f"{endpoint}/openapi.json", ca) == 200
        assert get(f"{endpoint}/usage", ca) == 404
        assert get(f"{endpoint}/metrics", ca) == 404


def post(url: str, body: dict[str, Any], token: str, ca: Path) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, context=context, timeout=30) as r:
        answer: dict[str, Any] = json.load(r)
        return answer


def get_json(url: str, token: str, ca: Path) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, context=context, timeout=30) as r:
        answer: dict[str, Any] = json.load(r)
        return answer


def get(url: str, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(url, context=context, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_gitops_apply_with_the_certificates_job_runs_and_keeps_its_cas(
    chart_site: Installed,
) -> None:
    """certificates.generator=job on real pods, applied as Argo CD does (kubectl apply of
    `helm template`): the Job runs the project's image and makes the webhook's and etcd's
    certificates, etcd's members form their cluster over TLS with them, the service reaches
    etcd with its client certificate, the API server calls the webhook with the caBundle the
    Job set; a second apply of a second render changes no CA and restarts no pod."""
    release, namespace = "gitops", "o41-gitops"
    site = chart_site

    def render() -> str:
        done = helm_run(
            site.kubeconfig, "template", release, str(CHART), "--namespace", namespace,
            "-f", str(site.directory / "values.yaml"),
            "--set", "certificates.generator=job", "--set", "etcd.persistence.enabled=false",
            "--set", "placement.replicas=1", "--include-crds",  # as Argo CD renders
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def apply(text: str) -> str:
        return site.kubectl("apply", "-n", namespace, "-f", "-", input=text)

    rendered = render()
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (job,) = [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
    (config,) = [
        d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    secrets = [f"{release}-o41-artifacts-webhook-tls"] + [
        f"{release}-o41-artifacts-etcd-{r}-tls" for r in ("server", "peer", "client")
    ]

    def workloads_ready() -> bool:
        pods = [
            p
            for p in site.pods(namespace)
            if not any(o["kind"] == "Job" for o in p["metadata"].get("ownerReferences", []))
        ]
        return len(pods) == 5 and all(
            {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready")
            == "True"
            for p in pods
        )

    def cas() -> dict[str, str]:
        found = {}
        for name in secrets:
            data = site.json("secret", name, "-n", namespace)["data"]
            found[name] = data["ca.crt"] + data["tls.crt"]
        for hook in site.json("validatingwebhookconfiguration", config)["webhooks"]:
            found[hook["name"]] = hook["clientConfig"]["caBundle"]
        return found

    site.kubectl("create", "namespace", namespace)
    try:
        apply(rendered)
        site.kubectl("wait", "--for=condition=Complete", f"job/{job}", "-n", namespace,
                     "--timeout=300s")  # fmt: skip
        log = site.kubectl("logs", f"job/{job}", "-n", namespace)
        assert "etcd TLS: made" in log and "webhook TLS: made" in log, log
        assert "caBundle set on" in log, log
        try:
            wait_for(workloads_ready, timeout=300, what="the GitOps release's pods to be Ready")
        except AssertionError as e:
            logs = [
                site.kubectl("logs", f"deploy/{release}-o41-artifacts-{c}", "-n", namespace,
                             "--tail=30", check=False)
                for c in ("operator", "placement")
            ]  # fmt: skip
            pods = site.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False)
            raise AssertionError(f"{e}\n{pods}\n{logs}\n{site.diagnose()}") from None
        organization = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": "gitops-picks-nothing"},
            "spec": {"namespaces": ["nobody"], "fallback": "nowhere"},
        }

        def answered() -> str | None:
            done = subprocess.run(
                [*kubectl_argv(site), "create", "--dry-run=server", "-f", "-"],
                input=json.dumps(organization), capture_output=True, text=True, check=False,
            )  # fmt: skip
            return None if "failed calling webhook" in done.stderr else done.stderr

        refusal = wait_for(answered, timeout=120, what="the webhook's answer over the Job's TLS")
        assert "fallback 'nowhere' does not exist" in refusal, refusal

        before = cas()
        uids = sorted(p["metadata"]["uid"] for p in site.pods(namespace))
        again = render()
        assert again == rendered
        out = apply(again)
        assert f"job.batch/{job} unchanged" in out, out
        assert f"statefulset.apps/{release}-o41-artifacts-etcd unchanged" in out, out
        assert cas() == before
        assert sorted(p["metadata"]["uid"] for p in site.pods(namespace)) == uids
        assert workloads_ready()
    finally:
        site.kubectl("delete", "-n", namespace, "--ignore-not-found", "--wait=false", "-f", "-",
                     input=rendered, check=False)  # fmt: skip
        site.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
