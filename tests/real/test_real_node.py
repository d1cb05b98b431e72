"""A real node in the test bed: the kubelet registers, pods run from the project's image,
cluster DNS and Services work, nothing a pod sends leaves the machine, and the machine is
put back as it was, also after a run that died (every process SIGKILLed mid-flight)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import host, node
from testbed.kube import kubectl
from testbed.node import GATEWAY, NODE_NAME, NODE_SELECTOR, TOLERATION, RealNode

from support import wait_for

pytestmark = [pytest.mark.real, pytest.mark.kube]

# what the chart asks of every container
RESTRICTED = {
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def pod(name: str, namespace: str, image: str, script: str, **spec: Any) -> dict[str, Any]:
    """A pod of the project's image that runs ``script`` with Python, on the real node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": NODE_SELECTOR,
            "tolerations": [TOLERATION],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", script],
                    "securityContext": RESTRICTED,
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            **spec,
        },
    }


def finished(kubeconfig: Path, namespace: str, name: str, timeout: float = 120) -> str:
    """Wait for the pod to finish; returns its phase."""

    def phase() -> str | None:
        got = kubectl(kubeconfig, "get", "pod", name, "-n", namespace,
                      "-o", "jsonpath={.status.phase}")  # fmt: skip
        return got if got in ("Succeeded", "Failed") else None

    return wait_for(phase, timeout=timeout, what=f"pod {namespace}/{name} to finish")


def logs(kubeconfig: Path, namespace: str, name: str) -> str:
    return kubectl(kubeconfig, "logs", "-n", namespace, name)


@pytest.fixture
def namespace(real_node: RealNode) -> Iterator[str]:
    name = f"real-{uuid.uuid4().hex[:6]}"
    kubeconfig = real_node.control_plane.kubeconfig
    kubectl(kubeconfig, "create", "namespace", name)
    try:
        yield name
    finally:
        kubectl(kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def test_the_node_registers_ready_with_its_kubelet_and_containerd(real_node: RealNode) -> None:
    nodes = json.loads(real_node.control_plane.kubectl("get", "nodes", "-o", "json"))["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(by_name) == {NODE_NAME}  # the fixture's control plane has no kwok node
    real = by_name[NODE_NAME]
    info = real["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6")
    ready = {c["type"]: c["status"] for c in real["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert {"type": "InternalIP", "address": GATEWAY} in real["status"]["addresses"]
    assert "taints" not in real["spec"]  # beside kwok nodes it has one: make dev-up REAL_NODE=1


def test_a_pod_sees_cluster_dns_only_and_reaches_the_api_through_its_service(
    real_node: RealNode, namespace: str
) -> None:
    script = """
import json, socket, ssl, urllib.error, urllib.request
seen = {"resolv": open("/etc/resolv.conf").read().split("\\n")}
for name in ("kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
             "pypi.org", "metadata.google.internal"):
    try:
        seen[name] = socket.gethostbyname(name)
    except OSError as e:
        seen[name] = type(e).__name__
sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
request = urllib.request.Request(
    "https://kubernetes.default.svc/api/v1/namespaces/default/pods",
    headers={"Authorization": "Bearer " + open(sa + "token").read()},
)
try:
    urllib.request.urlopen(request, context=ssl.create_default_context(cafile=sa + "ca.crt"))
except urllib.error.HTTPError as e:
    seen["api"] = [e.code, json.load(e)["message"]]
print(json.dumps(seen))
"""
    kubeconfig = real_node.control_plane.kubeconfig
    kubectl(kubeconfig, "apply", "-f", "-",
            input=json.dumps(pod("dns", namespace, real_node.images.app, script)))  # fmt: skip
    assert finished(kubeconfig, namespace, "dns") == "Succeeded"
    seen = json.loads(logs(kubeconfig, namespace, "dns"))
    assert [line for line in seen["resolv"] if line.startswith("nameserver")] == [
        f"nameserver {GATEWAY}"
    ]
    assert seen["kubernetes.default.svc"] == "10.96.0.1"
    assert seen["kubernetes.default.svc.cluster.local"] == "10.96.0.1"
    # CoreDNS has no upstream: no name outside the cluster resolves
    assert seen["pypi.org"] == "gaierror"
    assert seen["metadata.google.internal"] == "gaierror"
    # TLS to the API server checked with the pod's CA, and its projected token accepted:
    # the pod's ServiceAccount is known and merely not allowed to list pods
    assert seen["api"][0] == 403
    assert f"system:serviceaccount:{namespace}:default" in seen["api"][1]


def test_a_service_reaches_a_pod_by_its_dns_name(real_node: RealNode, namespace: str) -> None:
    kubeconfig = real_node.control_plane.kubeconfig
    app = real_node.images.app
    serve = (
        "import http.server, os\n"
        "os.chdir('/tmp'); open('/tmp/hello', 'w').write('hello from a real pod')\n"
        "http.server.test(http.server.SimpleHTTPRequestHandler, port=8080, bind='0.0.0.0')\n"
    )
    fetch = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://echo.{namespace}.svc:8080/hello').read().decode())\n"
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo", "namespace": namespace},
        "spec": {"selector": {"app": "echo"}, "ports": [{"port": 8080, "targetPort": 8080}]},
    }
    server = pod("echo", namespace, app, serve)
    server["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/hello", "port": 8080},
        "periodSeconds": 1,
    }
    both = {"apiVersion": "v1", "kind": "List", "items": [service, server]}
    kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(both))
    kubectl(kubeconfig, "wait", "-n", namespace, "--for=condition=Ready", "pod/echo",
            "--timeout=120s")  # fmt: skip
    kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(pod("fetch", namespace, app, fetch)))
    assert finished(kubeconfig, namespace, "fetch") == "Succeeded"
    assert logs(kubeconfig, namespace, "fetch").strip() == "hello from a real pod"


def drops() -> int:
    """Packets the safety rule of mangle FORWARD dropped so far."""
    out = subprocess.run(
        ["iptables", "-w", "-t", "mangle", "-L", "FORWARD", "-v", "-x", "-n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sum(int(line.split()[0]) for line in out.splitlines() if node.SAFETY_COMMENT in line)


def test_nothing_a_pod_sends_leaves_the_machine(real_node: RealNode, namespace: str) -> None:
    # the safety rules come first in FORWARD, before any rule of kube-proxy or CNI
    for table in ("mangle", "filter"):
        first = [r for r in node.forward_rules() if r.startswith(f"{table}: -A")][:2]
        assert len(first) == 2, first
        assert all(node.SAFETY_COMMENT in r and r.endswith("-j DROP") for r in first), first
    before = drops()
    script = """
import json, socket
seen = {}
# TEST-NET-3 (never routed) and the cloud metadata address
for address in (("203.0.113.10", 443), ("169.254.169.254", 80)):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(address)
        seen[address[0]] = "connected"
    except OSError as e:
        seen[address[0]] = type(e).__name__
print(json.dumps(seen))
"""
    kubeconfig = real_node.control_plane.kubeconfig
    kubectl(kubeconfig, "apply", "-f", "-",
            input=json.dumps(pod("out", namespace, real_node.images.app, script)))  # fmt: skip
    assert finished(kubeconfig, namespace, "out") == "Succeeded"
    seen = json.loads(logs(kubeconfig, namespace, "out"))
    assert seen == {"203.0.113.10": "TimeoutError", "169.254.169.254": "TimeoutError"}
    assert drops() > before  # dropped by the rule, not lost on the way


def test_node_clean_leaves_a_running_node_alone(real_node: RealNode) -> None:
    """`make node-clean` (or another session's `make dev-down`) while this node runs."""
    done = subprocess.run(
        [sys.executable, "-m", "testbed", "node-clean"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"the real node of {real_node.directory} is running" in done.stdout
    assert "not touched" in done.stdout
    assert node.BRIDGE in host.snapshot()["links"]
    assert all(server.alive() for server in real_node.servers)


def test_a_run_that_dies_leaves_nothing_once_cleaned_up(
    real_node: RealNode, namespace: str
) -> None:
    """Every process of the node SIGKILLed while a pod runs (what a killed test run
    leaves: the pods and containerd's shims outlive it), then ``node-clean``: the machine is
    as the snapshot before the node found it. The node then starts again."""
    kubeconfig = real_node.control_plane.kubeconfig
    sleeper = pod("sleeper", namespace, real_node.images.app, "import time; time.sleep(600)")
    kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(sleeper))
    kubectl(kubeconfig, "wait", "-n", namespace, "--for=condition=Ready", "pod/sleeper",
            "--timeout=120s")  # fmt: skip
    before = json.loads(node.RECORD.read_text())["before"]
    assert host.cgroup_pids(node.CGROUP_ROOT), "the pod's processes run in the node's cgroup"

    for server in real_node.servers:
        os.killpg(server.pid, signal.SIGKILL)
    for server in real_node.servers:
        assert server.proc is not None
        server.proc.wait()
    real_node.servers.clear()
    assert host.cgroup_pids(node.CGROUP_ROOT), "the pod outlived its kubelet, as after a crash"

    done = subprocess.run(
        [sys.executable, "-m", "testbed", "node-clean"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "nothing left"), done.stderr
    after = host.snapshot()
    assert host.diff(before, after, mount_roots=(str(real_node.directory),)) == []
    assert after["iptables"] == before["iptables"]
    assert after["ip6tables"] == before["ip6tables"]
    assert node.BRIDGE not in after["links"]
    assert not [m for m in after["mounts"] if m.startswith(str(real_node.directory))]
    assert not [c for c in after["cgroups"] if c.endswith(node.CGROUP_ROOT.strip("/"))]
    assert node.shims(real_node.containerd_socket) == []
    assert not node.RECORD.exists()

    # the next run finds a clean machine
    real_node.start()
    wait_for(lambda: "Ready" in real_node.control_plane.kubectl("get", "node", NODE_NAME),
             timeout=60, what="the node again")  # fmt: skip
