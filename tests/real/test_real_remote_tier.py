"""The collections tier of a workload cluster on the test bed's real node (issue 40,
points 1 and 5): `helm install` of charts/o41-remote with ``collections.enabled`` (the
project's image and the test bed's etcd image, pullPolicy Never) into namespace ``ml``, as
docs/multi-cluster.md installs it; its 3 etcd members and 2 tier replicas Ready through
their own probes; a Job of ``ml`` (the project's image, the projected token of audience
``o41`` it mounts for the hub) runs ``o41.sky`` against O41_COLLECTIONS_ENDPOINT from the
chart's ConfigMap: a counter add, a dict set and get.

What it wrote is read back from the tier through its Service by the test process (a token
of ``ml``'s default ServiceAccount, audience o41), found in the tier's own etcd (read with
the chart's client certificate), and absent from everywhere else: the pod's "hub" (a
recorder on the node's bridge address, O41_ARTIFACTS_ENDPOINT) got no request at all, and
another namespace's tenant reads nothing under the same compute and names. Then an etcd
member's pod is deleted: the tier keeps answering strong operations while it is gone, and
the values are whole once it is back.

The volumes are local PersistentVolumes (no provisioner), removed at the end with the
release and the namespaces, so that the next module's install starts clean.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from o41.client.collections import Client
from o41.client.transport import HttpTransport
from test_chart import REPO
from test_real_backup import clear_volumes, gone
from test_real_chart import OnTheNode, helm_run, split
from test_real_node import pod
from testbed.kube import kubectl
from testbed.node import GATEWAY, NODE_NAME, RealNode

from support import wait_for

pytestmark = [pytest.mark.real, pytest.mark.kube]

REMOTE = REPO / "charts" / "o41-remote"
RELEASE, NAMESPACE, OTHER = "w", "ml", "ml-other"
TIER, ETCD = "w-o41-remote-collections", "w-o41-remote-etcd"
COMPUTE = "tier-40"
AUDIENCE = "o41"  # hub.audience's default: the tier's --audience


@dataclass
class Recorder:
    """A stand-in hub on the node's bridge address that answers 503 to everything and
    records each request: the pods' O41_ARTIFACTS_ENDPOINT, which sky.* must never use
    while the tier is there."""

    requests: list[str] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> str:
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                recorder.requests.append(f"{self.command} {self.path}")
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((GATEWAY, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://{GATEWAY}:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Tier(OnTheNode):
    node: RealNode
    directory: Path
    hub: Recorder
    hub_url: str

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("pods", "-n", NAMESPACE)["items"]
        return [p for p in items if p["metadata"]["labels"].get("app.kubernetes.io/instance")]

    def diagnose(self) -> str:
        out = [super().diagnose()]
        for p in self.pods():
            name = p["metadata"]["name"]
            out.append(f"--- {name}\n" + self.kubectl("logs", "-n", NAMESPACE, name,
                                                     "--tail=30", check=False))  # fmt: skip
        return "\n".join(out)[-8000:]

    def client(
        self, namespace: str = NAMESPACE, release: tuple[str, str] = (TIER, NAMESPACE)
    ) -> Client:
        """The tier ``release`` (its Service's name and namespace) through its Service, as a
        pod of ``namespace`` (its default ServiceAccount's token for the hub's audience):
        the test process reaches the ClusterIP through kube-proxy's rules, as a pod does."""
        self.kubectl("create", "namespace", namespace, check=False)  # ml-other: made here
        token = wait_for(  # a new namespace's default ServiceAccount comes a moment later
            lambda: self.kubectl("-n", namespace, "create", "token", "default",
                                 f"--audience={AUDIENCE}", "--duration=1h", check=False).strip(),
            60, f"a token of {namespace}/default",
        )  # fmt: skip
        service = self.json("service", release[0], "-n", release[1])
        endpoint = f"http://{service['spec']['clusterIP']}:8080"
        return Client(HttpTransport(endpoint, token=token, timeout=30), compute=COMPUTE)


def ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return pod["status"].get("phase") == "Running" and conditions.get("Ready") == "True"


def all_ready(tier: Tier) -> bool:
    pods = tier.pods()
    by = [p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods]
    return sorted(by) == ["collections"] * 2 + ["etcd"] * 3 and all(ready(p) for p in pods)


@pytest.fixture(scope="module")
def tier(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    directory = tmp_path_factory.mktemp("real-remote-tier")
    kubeconfig = real_node.control_plane.kubeconfig
    wait_for(lambda: gone(kubeconfig, "namespace", NAMESPACE, OTHER), 180,
             "an earlier run's namespaces to go")  # fmt: skip
    clear_volumes(real_node)
    real_node.local_volumes(3, "8Gi")
    hub = Recorder()
    hub_url = hub.start()
    try:
        app, etcd = split(real_node.images.app), split(real_node.images.etcd)
        values = {
            "hub": {"endpoint": "https://hub.o41.invalid"},
            "image": {"repository": app[0], "tag": app[1], "pullPolicy": "Never"},
            "collections": {
                "enabled": True,
                "etcd": {"image": {"repository": etcd[0], "tag": etcd[1], "pullPolicy": "Never"}},
            },
        }
        (directory / "values.yaml").write_text(yaml.safe_dump(values))
        done = helm_run(
            kubeconfig, "install", RELEASE, str(REMOTE), "--namespace", NAMESPACE,
            "--create-namespace", "-f", str(directory / "values.yaml"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "O41_COLLECTIONS_ENDPOINT" in done.stdout, done.stdout
        installed = Tier(real_node, directory, hub, hub_url)
        try:
            wait_for(lambda: all_ready(installed), 300, "the tier's and etcd's pods to be Ready")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{installed.diagnose()}") from None
        yield installed
    finally:
        helm_run(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        for namespace in (NAMESPACE, OTHER):
            kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
        wait_for(lambda: gone(kubeconfig, "namespace", NAMESPACE, OTHER), 180,
                 "the namespaces to go")  # fmt: skip
        clear_volumes(real_node)
        hub.stop()


SCRIPT = """
import json, os
from o41 import sky
steps = sky.counter("steps")
steps.add(3)
steps.add(4)
shared = sky.dict("shared")
shared["marker"] = os.environ["MARKER"]
print(json.dumps({"steps": steps.get(), "marker": shared["marker"]}))
"""


def job(tier: Tier, marker: str) -> dict[str, Any]:
    """A Job of ml, as docs/multi-cluster.md's pod spec: the projected token for the hub's
    audience, O41_COLLECTIONS_ENDPOINT from the chart's ConfigMap."""
    spec = pod("sky", NAMESPACE, tier.node.images.app, SCRIPT)["spec"]
    [main] = spec["containers"]
    main["env"] = [
        {"name": "O41_COLLECTIONS_ENDPOINT", "valueFrom": {"configMapKeyRef": {
            "name": "w-o41-remote-hub", "key": "collectionsEndpoint"}}},
        {"name": "O41_ARTIFACTS_ENDPOINT", "value": tier.hub_url},
        {"name": "O41_ARTIFACTS_TOKEN_FILE", "value": "/var/run/secrets/o41/token"},
        {"name": "O41_COMPUTE", "value": COMPUTE},
        {"name": "MARKER", "value": marker},
    ]  # fmt: skip
    main["volumeMounts"].append(
        {"name": "o41-token", "mountPath": "/var/run/secrets/o41", "readOnly": True}
    )
    spec["volumes"].append({"name": "o41-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": 3600,
                                 "path": "token"}}]}})  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sky", "namespace": NAMESPACE},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "sky"}},
                                                 "spec": spec}},
    }  # fmt: skip


def job_outcome(tier: Tier, name: str) -> str | None:
    status = tier.json("job", name, "-n", NAMESPACE).get("status", {})
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    if conditions.get("Complete") == "True":
        return "Complete"
    return "Failed" if conditions.get("Failed") == "True" else None


def etcd_values(tier: Tier) -> list[bytes]:
    """Every value in the tier's etcd, read from a member's pod address over TLS with the
    chart's client certificate (etcd's JSON gateway). The members' certificates name their
    DNS names and 127.0.0.1, not the pod's address: the name is not checked here, the CA
    and the client certificate are."""
    secret = tier.json("secret", f"{ETCD}-client-tls", "-n", NAMESPACE)["data"]
    files = {}
    for key in ("ca.crt", "tls.crt", "tls.key"):
        files[key] = tier.directory / f"etcd-{key}"
        files[key].write_bytes(base64.b64decode(secret[key]))
    context = ssl.create_default_context(cafile=str(files["ca.crt"]))
    context.check_hostname = False
    context.load_cert_chain(str(files["tls.crt"]), str(files["tls.key"]))
    ip = tier.json("pod", f"{ETCD}-1", "-n", NAMESPACE)["status"]["podIP"]
    zero = base64.b64encode(b"\0").decode()
    request = urllib.request.Request(
        f"https://{ip}:2379/v3/kv/range",
        data=json.dumps({"key": zero, "range_end": zero}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        kvs = json.loads(answer.read()).get("kvs", [])
    return [base64.b64decode(kv.get("value", "")) for kv in kvs]


def test_a_job_of_ml_uses_the_tier_and_its_values_are_there_and_nowhere_else(
    tier: Tier,
) -> None:
    # the pods: on the real node, from the project's image and the test bed's etcd's
    for p in tier.pods():
        component = p["metadata"]["labels"]["app.kubernetes.io/component"]
        want = tier.node.images.etcd if component == "etcd" else tier.node.images.app
        [status] = p["status"]["containerStatuses"]
        assert p["spec"]["nodeName"] == NODE_NAME
        assert status["image"].endswith(want.split("/", 1)[1]), status["image"]
        assert p["spec"]["securityContext"]["runAsUser"] == 10001
    marker = f"tier-{uuid.uuid4().hex[:12]}"
    tier.kubectl("apply", "-f", "-", input=json.dumps(job(tier, marker)))
    try:
        outcome = wait_for(lambda: job_outcome(tier, "sky"), 240, "job ml/sky to finish")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{tier.diagnose()}") from None
    log = tier.kubectl("logs", "-n", NAMESPACE, "job/sky", check=False)
    assert outcome == "Complete", f"{log}\n{tier.diagnose()}"
    assert json.loads(log.strip().splitlines()[-1]) == {"steps": 7, "marker": marker}

    # read back from the tier, through its Service, as another pod of ml would
    mine = tier.client()
    assert mine.counter("steps").get() == 7
    assert mine.dict("shared")["marker"] == marker
    # in the tier's own etcd
    assert any(marker.encode() in value for value in etcd_values(tier))
    # and nowhere else: the hub was never asked anything, another namespace sees nothing
    assert tier.hub.requests == []
    theirs = tier.client(OTHER)
    assert theirs.counter("steps").get() == 0
    assert theirs.dict("shared").get("marker") is None


def test_the_tier_keeps_answering_while_an_etcd_member_is_gone(tier: Tier) -> None:
    client = tier.client()
    counter = client.counter("through-a-loss")
    shared = client.dict("through-a-loss")
    counter.add(1)
    before = tier.json("pod", f"{ETCD}-0", "-n", NAMESPACE)["metadata"]["uid"]
    tier.kubectl("delete", "pod", f"{ETCD}-0", "-n", NAMESPACE, "--wait=false")

    def member() -> str:
        """old (the deleted pod, still terminating), away, or back (a new pod, Ready)."""
        found = tier.kubectl("get", "pod", f"{ETCD}-0", "-n", NAMESPACE, "-o", "json",
                             check=False)  # fmt: skip
        if not found.strip():
            return "away"
        pod = json.loads(found)
        if pod["metadata"]["uid"] == before:
            return "old"
        return "back" if ready(pod) else "away"

    # strong operations, one after another, each acknowledged, until the member is back
    done, while_away = 1, 0
    while (state := member()) != "back":
        counter.add(1)
        shared[f"k{done}"] = str(done)
        done += 1
        while_away += state == "away"
        assert done < 5000, "the member never came back"
    assert while_away > 0, "no operation happened while the member was gone"
    wait_for(lambda: all_ready(tier), 300, "every pod Ready again")
    assert counter.get() == done
    assert {k: shared[k] for k in (f"k{i}" for i in range(1, done))} == {
        f"k{i}": str(i) for i in range(1, done)
    }


def test_a_gitops_apply_with_the_certificates_job_gives_a_working_tier_and_keeps_its_cas(
    tier: Tier,
) -> None:
    """collections.etcd.tls.generator=job on real pods, applied as Argo CD does (kubectl
    apply of `helm template`): the Job runs the project's image and makes etcd's
    certificates, the members form their cluster over TLS with them, the tier reaches them
    with its client certificate and serves a job's collections; a second apply of a second
    render changes no CA and restarts no pod."""
    release, namespace = "g", "ml-gitops"

    def render() -> str:
        done = helm_run(
            tier.kubeconfig, "template", release, str(REMOTE), "--namespace", namespace,
            "-f", str(tier.directory / "values.yaml"),
            "--set", "collections.etcd.tls.generator=job",
            "--set", "collections.etcd.persistence.enabled=false",
            "--set", "collections.replicas=1",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def pods() -> dict[str, dict[str, Any]]:
        items = tier.json("pods", "-n", namespace)["items"]
        component = "app.kubernetes.io/component"
        return {p["metadata"]["name"]: p for p in items
                if p["metadata"]["labels"].get(component) != "certificates"}  # fmt: skip

    def workloads_ready() -> bool:
        found = pods()
        return len(found) == 4 and all(ready(p) for p in found.values())

    secrets = [f"{release}-o41-remote-etcd-{r}-tls" for r in ("server", "peer", "client")]

    def cas() -> dict[str, str]:
        data = {s: tier.json("secret", s, "-n", namespace)["data"] for s in secrets}
        return {s: d["ca.crt"] + d["tls.crt"] for s, d in data.items()}

    rendered = render()
    (job,) = [
        d["metadata"]["name"] for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Job"
    ]
    tier.kubectl("create", "namespace", namespace)
    try:
        tier.kubectl("apply", "-n", namespace, "-f", "-", input=rendered)
        tier.kubectl("wait", "--for=condition=Complete", f"job/{job}", "-n", namespace,
                     "--timeout=300s")  # fmt: skip
        log = tier.kubectl("logs", f"job/{job}", "-n", namespace)
        assert "etcd TLS: made" in log, log
        try:
            wait_for(workloads_ready, 300, "the GitOps-applied tier's and etcd's pods to be Ready")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{tier.diagnose()}") from None
        # the tier on the etcd the Job's certificates made: a strong write read back
        client = tier.client(namespace, (f"{release}-o41-remote-collections", namespace))
        client.counter("gitops").add(5)
        assert client.counter("gitops").get() == 5
        before, uids = cas(), {n: p["metadata"]["uid"] for n, p in pods().items()}

        # the next sync: a second render, the same text, applied again
        again = render()
        assert again == rendered
        tier.kubectl("apply", "-n", namespace, "-f", "-", input=again)
        assert cas() == before
        assert {n: p["metadata"]["uid"] for n, p in pods().items()} == uids
        assert workloads_ready() and client.counter("gitops").get() == 5
    finally:
        tier.kubectl("delete", "-n", namespace, "--wait=false", "--ignore-not-found", "-f", "-",
                     input=rendered, check=False)  # fmt: skip
        tier.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        wait_for(lambda: gone(tier.kubeconfig, "namespace", namespace), 180,
                 "the GitOps namespace to go")  # fmt: skip
