"""One real node beside the kwok nodes: kubelet, containerd + runc, CNI, kube-proxy and
CoreDNS, so the chart's pods really run (from the project's own images, never pulled).

Network safety, in place before the first pod starts:
- pods live on a bridge of the test bed's own (``BRIDGE``, ``POD_CIDR``); anything from
  that bridge or that range forwarded to another interface is dropped (mangle and filter
  FORWARD, first rule), so no pod packet leaves the machine;
- pods resolve names with CoreDNS only (the kubelet's resolvConf is a file of ours with
  CoreDNS's address), and CoreDNS serves cluster.local and the reverse zones with no
  upstream: any other name is NXDOMAIN;
- containerd has a dead proxy, so even a pull nobody asked for cannot reach a registry.
What pods reach on the machine listens on the bridge's own address (``GATEWAY``): CoreDNS,
a forwarder to the API server (the ``kubernetes`` Service's endpoint), storage stand-ins.

Everything the node changes on the machine (iptables, links, mounts, cgroups, sysctls,
system directories) is snapshotted first (``host.snapshot``) into a record under
``STATE``, and put back by ``stop()`` or, after a run that died, by ``cleanup()``. The
record is also the lock: one real node per machine (kube-proxy owns iptables chains of
fixed names).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from testbed import host
from testbed.images import Images, archive
from testbed.kube import ControlPlane, apply
from testbed.pki import Authority
from testbed.process import LOOPBACK, Server, free_port, wait_until

NODE_NAME = "o41-real-node"
BRIDGE = "o41-br0"
POD_CIDR = ipaddress.ip_network("10.241.0.0/24")
GATEWAY = "10.241.0.1"  # the bridge's address: the node's IP, CoreDNS, the API forwarder
NETWORK = "o41-pods"  # the CNI network's name
CGROUP_ROOT = "/o41-node"  # the kubelet's cgroup root: its pods go under /o41-node/kubepods
TAINT = {"key": "o41.io/real-node", "value": "true", "effect": "NoSchedule"}
# what a pod needs to run here: the taint's toleration and the node's name
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": "true", "effect": "NoSchedule"}
NODE_SELECTOR = {"kubernetes.io/hostname": NODE_NAME}
STATE = Path(os.environ.get("O41_REAL_NODE_STATE", "/run/o41-real-node"))
RECORD = STATE / "record.json"
DEAD_PROXY = "http://127.0.0.1:9"  # discard port: nothing listens, every pull fails at once
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
SAFETY_COMMENT = "o41 real node: pod traffic stays on the machine"


class NodeBusy(RuntimeError):
    """Another real node runs on this machine."""


def _run(*argv: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def preflight() -> list[str]:
    """Why a real node cannot run here (empty: it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("a real node needs root (kubelet, containerd, iptables, a bridge)")
    for tool in ("containerd", "ctr", "runc", "iptables", "ip6tables", "socat", "conntrack"):
        if not shutil.which(tool):
            problems.append(f"{tool} is missing: hack/install-debs.sh node")
    if not (CNI_BIN / "bridge").exists():
        problems.append(f"no CNI plugins in {CNI_BIN}: hack/install-debs.sh node")
    return problems


@dataclass
class RealNode:
    """A kubelet registered as ``NODE_NAME`` with the control plane. ``taint``: only pods
    that tolerate ``TAINT`` land on it (beside kwok nodes, which stay the default); without,
    it is a node like any other (the only one of a control plane without kwok nodes)."""

    control_plane: ControlPlane
    bins: Path
    directory: Path
    images: Images
    taint: bool = True
    servers: list[Server] = field(default_factory=list)
    started_in: float = 0.0  # seconds from start() to a Ready node with its proxy synced
    timings: dict[str, float] = field(default_factory=dict)  # seconds each part took
    leftovers: list[str] = field(default_factory=list)  # what stop() could not put back

    @property
    def containerd_socket(self) -> Path:
        return self.directory / "containerd" / "containerd.sock"

    @property
    def state_dir(self) -> Path:
        return self.directory / "containerd" / "state"

    def start(self, wait: float = 0.0) -> RealNode:
        """Start the node; ``wait``: seconds to wait for another run's node to go (one real
        node per machine) before raising ``NodeBusy``."""
        problems = preflight()
        if problems:
            raise RuntimeError("; ".join(problems))
        t0 = time.monotonic()
        while True:
            try:
                _claim(self.directory)
                break
            except NodeBusy:
                if time.monotonic() - t0 >= wait:
                    raise
                time.sleep(2)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _start(self) -> None:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        _check_addresses()
        # the network first, and its safety rules before anything could start a pod
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/{POD_CIDR.prefixlen}", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        ensure_safety_rules()
        host.make_cgroup(CGROUP_ROOT)
        ca = self.control_plane.authority
        assert ca is not None, "the control plane was not started here"
        self._write_cni()
        (d / "resolv.conf").write_text(f"nameserver {GATEWAY}\n")

        self._timed("containerd", self._start_containerd)
        for ref in self.images.all():
            self._timed(f"import {ref}", partial(self._import, ref))
        self._timed("coredns", lambda: self._start_coredns(ca))
        self._timed("api forwarder", self._start_api_forwarder)
        self._timed("kubelet", lambda: self._start_kubelet(ca))
        self._timed(
            "node Ready",
            lambda: wait_until(self._node_ready, timeout=120, what=f"node {NODE_NAME} to be Ready"),
        )
        self._timed("kube-proxy", lambda: self._start_kube_proxy(ca))
        ensure_safety_rules()  # first again, above the jumps kube-proxy inserted
        self._update_record()

    def _import(self, ref: str) -> None:
        _run(*self.ctr(), "images", "import", str(archive(ref)), timeout=600)

    def _timed(self, part: str, start: Callable[[], object]) -> None:
        t0 = time.monotonic()
        start()
        self.timings[part] = round(time.monotonic() - t0, 2)

    # --------------------------------------------------------------------------- parts

    def ctr(self) -> list[str]:
        return ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io"]

    def _write_cni(self) -> None:
        conf = self.directory / "cni" / "net.d"
        conf.mkdir(parents=True, exist_ok=True)
        network = {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # pods never need to leave: no NAT for them
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(POD_CIDR), "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.directory / "cni" / "ipam"),
                    },
                }
            ],
        }
        (conf / "10-o41.conflist").write_text(json.dumps(network, indent=2))

    def _start_containerd(self) -> None:
        base = self.directory / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        pause = self.images.pause
        config = f"""version = 2
root = "{base / "root"}"
state = "{self.state_dir}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "{free_port()}"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which("runc")}"
        Root = "{self.state_dir / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.directory / "cni" / "net.d"}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{base / "certs.d"}"
"""
        (base / "config.toml").write_text(config)
        (base / "certs.d").mkdir(exist_ok=True)
        server = Server(
            "containerd",
            ["containerd", "--config", str(base / "config.toml")],
            self.directory / "containerd.log",
            env={
                "HTTP_PROXY": DEAD_PROXY,
                "HTTPS_PROXY": DEAD_PROXY,
                "http_proxy": DEAD_PROXY,
                "https_proxy": DEAD_PROXY,
                "NO_PROXY": "",
                "no_proxy": "",
            },
        ).start()
        self.servers.append(server)
        self._update_record()
        server.wait_ready(lambda: bool(_run(*self.ctr(), "version", timeout=5)), timeout=60)

    def _kubeconfig(
        self, name: str, user: str, ca: Authority, organization: str | None = None
    ) -> Path:
        """A kubeconfig of ``user`` (a client certificate of the control plane's CA)."""
        pair = ca.issue(f"node-{name}", user, organization=organization, client=True)
        path = self.directory / f"{name}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "o41-testbed",
                    "cluster": {
                        "server": self.control_plane.server_url,
                        "certificate-authority": str(ca.cert_path),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
                }
            ],
            "contexts": [
                {"name": "o41-testbed", "context": {"cluster": "o41-testbed", "user": user}}
            ],
            "current-context": "o41-testbed",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    def _start_coredns(self, ca: Authority) -> None:
        user = "o41-testbed:coredns"
        kubeconfig = self._kubeconfig("coredns", user, ca)
        apply(self.control_plane.kubeconfig, *_coredns_rbac(user))
        ready = free_port()
        corefile = f"""cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {GATEWAY}
    errors
    ready {LOOPBACK}:{ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} o41-testbed
        pods insecure
        ttl 5
    }}
    cache 5
}}
.:53 {{
    bind {GATEWAY}
    errors
    # no upstream, ever: a name outside the cluster does not exist here
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
        (self.directory / "Corefile").write_text(corefile)
        server = Server(
            "coredns",
            [str(self.bins / "coredns"), "-conf", str(self.directory / "Corefile")],
            self.directory / "coredns.log",
        ).start()
        self.servers.append(server)
        self._update_record()
        server.wait_ready(lambda: _http_ok(f"http://{LOOPBACK}:{ready}/ready"), timeout=60)

    def _start_api_forwarder(self) -> None:
        """Pods reach the API server at the ``kubernetes`` Service (10.96.0.1:443), whose
        endpoint is this forwarder on the bridge's address: the API server itself listens
        on 127.0.0.1 only, which a pod cannot reach."""
        port = self.control_plane.api_port
        server = Server(
            "api-forwarder",
            [
                "socat",
                f"TCP-LISTEN:{port},bind={GATEWAY},reuseaddr,fork",
                f"TCP:{LOOPBACK}:{port}",
            ],
            self.directory / "api-forwarder.log",
        ).start()
        self.servers.append(server)
        self._update_record()
        server.wait_ready(lambda: _port_open(GATEWAY, port), timeout=30)
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "o41-testbed",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }
        apply(self.control_plane.kubeconfig, slice_)

    def _start_kubelet(self, ca: Authority) -> None:
        kubeconfig = self._kubeconfig(
            "kubelet", f"system:node:{NODE_NAME}", ca, organization="system:nodes"
        )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": GATEWAY,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK,
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca.cert_path)},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": CGROUP_ROOT,
            "failCgroupV1": False,  # this kernel mounts cgroup v1 (hybrid)
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "clusterDNS": [GATEWAY],
            "clusterDomain": "cluster.local",
            "resolvConf": str(self.directory / "resolv.conf"),
            "podLogsDir": str(self.directory / "pod-logs"),
            "volumePluginDir": str(self.directory / "volume-plugins"),
            "staticPodPath": "",
            "registerWithTaints": [TAINT] if self.taint else [],
            "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE here to lower it
            "imageGCHighThresholdPercent": 100,  # the imported images are all there is
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "shutdownGracePeriod": "0s",
            "protectKernelDefaults": False,
            "maxPods": 50,
        }
        path = self.directory / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=2))
        server = Server(
            "kubelet",
            [
                str(self.bins / "kubelet"),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.directory / 'kubelet'}",
                f"--cert-dir={self.directory / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                "--v=1",
            ],
            self.directory / "kubelet.log",
        ).start()
        self.servers.append(server)
        self._update_record()
        healthz = config["healthzPort"]
        server.wait_ready(lambda: _http_ok(f"http://{LOOPBACK}:{healthz}/healthz"), timeout=120)

    def _start_kube_proxy(self, ca: Authority) -> None:
        kubeconfig = self._kubeconfig("kube-proxy", "system:kube-proxy", ca)
        healthz, metrics = free_port(), free_port()
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "healthzBindAddress": f"{LOOPBACK}:{healthz}",
            "metricsBindAddress": f"{LOOPBACK}:{metrics}",
            "clusterCIDR": str(POD_CIDR),
            "nodePortAddresses": [f"{GATEWAY}/32"],  # never on the machine's own interfaces
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            # 0: leave the machine's conntrack settings as they are
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "oomScoreAdj": 0,
        }
        path = self.directory / "kube-proxy-config.json"
        path.write_text(json.dumps(config, indent=2))
        server = Server(
            "kube-proxy",
            [str(self.bins / "kube-proxy"), f"--config={path}", "--v=1"],
            self.directory / "kube-proxy.log",
        ).start()
        self.servers.append(server)
        self._update_record()
        server.wait_ready(lambda: _synced(f"http://{LOOPBACK}:{metrics}/metrics"), timeout=60)

    def _node_ready(self) -> bool:
        node: Any = self.control_plane.get(f"/api/v1/nodes/{NODE_NAME}")
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # -------------------------------------------------------------------------- volumes

    def local_volumes(self, count: int, size: str, owner: int = 10001) -> list[str]:
        """``count`` local PersistentVolumes on this node (no class: they bind claims that
        name none, as a StatefulSet's do with no default StorageClass); their directories
        belong to ``owner``. Returns their names."""
        names = []
        for i in range(count):
            name = f"{NODE_NAME}-pv-{i}"
            path = self.directory / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, owner, owner)
            path.chmod(0o700)
            apply(
                self.control_plane.kubeconfig,
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": name, "labels": {"o41.io/real-node": "true"}},
                    "spec": {
                        "capacity": {"storage": size},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "volumeMode": "Filesystem",
                        "local": {"path": str(path)},
                        "nodeAffinity": {
                            "required": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": [NODE_NAME],
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                    },
                },
            )
            names.append(name)
        return names

    # ----------------------------------------------------------------------------- stop

    def _update_record(self) -> None:
        record = json.loads(RECORD.read_text())
        record["pids"] = [{"name": s.name, "pid": s.pid, "argv0": s.argv[0]} for s in self.servers]
        _write_record(record)

    def stop(self) -> list[str]:
        """Stop every part and put the machine back as it was; returns what differs from
        the snapshot taken before the start (empty: nothing is left)."""
        with contextlib.suppress(Exception):
            self._forget_in_api()
        by_name = {s.name: s for s in self.servers}
        for name in ("kube-proxy", "kubelet"):
            if name in by_name:
                by_name[name].stop()
        host.kill_cgroup(CGROUP_ROOT)  # the pods' processes: containers and pause
        if "containerd" in by_name:
            by_name["containerd"].stop()
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()
        self.leftovers = cleanup()
        return self.leftovers

    def _forget_in_api(self) -> None:
        """The Node and its volumes leave the API with the node (the control plane may
        outlive it)."""
        kubeconfig = self.control_plane.kubeconfig
        from testbed.kube import kubectl

        kubectl(kubeconfig, "delete", "node", NODE_NAME, "--wait=false", check=False)
        kubectl(
            kubeconfig, "delete", "pv", "-l", "o41.io/real-node=true", "--wait=false", check=False
        )
        kubectl(
            kubeconfig,
            "delete",
            "endpointslice",
            "-n",
            "default",
            "kubernetes",
            "--wait=false",
            check=False,
        )


def _coredns_rbac(user: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "o41-testbed:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "o41-testbed:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "o41-testbed:coredns",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]


def _http_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as r:
        return bool(r.status == 200)


def _synced(metrics_url: str) -> bool:
    """kube-proxy has written its rules once (its jumps into FORWARD are in place)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(metrics_url, timeout=2) as r:
        text = r.read().decode()
    last = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{"
    return any(
        line.startswith(last) and 'ip_family="IPv4"' in line and float(line.split()[-1]) > 0
        for line in text.splitlines()
    )


def _port_open(address: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _check_addresses() -> None:
    """The pod range must be the test bed's alone: no route of the machine's may overlap."""
    for line in _run("ip", "-4", "route", "show").splitlines():
        target = line.split()[0]
        if target == "default":
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(target, strict=False).overlaps(POD_CIDR):
                raise RuntimeError(f"the machine routes {target}, which overlaps {POD_CIDR}")


def ensure_safety_rules() -> None:
    """DROP whatever comes from the pods' bridge or range and would leave by another
    interface, as the first rules of FORWARD in mangle (nothing adds ACCEPTs there) and in
    filter (where people look, and above kube-proxy's and CNI's jumps). Idempotent: run
    again after kube-proxy started, the rules move back to the top."""
    specs = [["-i", BRIDGE, "!", "-o", BRIDGE], ["-s", str(POD_CIDR), "!", "-o", BRIDGE]]
    for family, table, spec in [
        *(("iptables", t, s) for t in ("mangle", "filter") for s in reversed(specs)),
        ("ip6tables", "filter", ["-i", BRIDGE]),  # no IPv6 from the bridge, forwarded anywhere
    ]:
        rule = [*spec, "-m", "comment", "--comment", SAFETY_COMMENT, "-j", "DROP"]
        while _ok(family, "-w", "-t", table, "-D", "FORWARD", *rule):
            pass
        _run(family, "-w", "-t", table, "-I", "FORWARD", "1", *rule)


def _ok(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False, timeout=60).returncode == 0


def forward_rules() -> list[str]:
    """The FORWARD chains of mangle and filter, as ``iptables -S`` prints them."""
    return [
        f"{table}: {line}"
        for table in ("mangle", "filter")
        for line in _run("iptables", "-w", "-t", table, "-S", "FORWARD").splitlines()
    ]


# ------------------------------------------------------------------------------ record


def _write_record(record: dict[str, Any]) -> None:
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(RECORD)


def _claim(directory: Path) -> None:
    """Take the machine's one real node: snapshot the machine into a new record. A record
    whose processes are all gone is a dead run's: it is cleaned up first."""
    STATE.mkdir(parents=True, exist_ok=True)
    if RECORD.exists():
        try:
            record = json.loads(RECORD.read_text())
        except (OSError, ValueError):
            raise NodeBusy("another real node is being claimed right now") from None
        if running(record):
            raise NodeBusy(
                f"a real node of {record['directory']} runs on this machine (owner pid "
                f"{record.get('owner')}): stop it first (make dev-down), or "
                f"`python -m testbed node-clean` if it is gone"
            )
        left = cleanup()
        if left:
            raise RuntimeError(
                "a run that died left this on the machine, and it could not be put back "
                f"(see {RECORD}):\n" + "\n".join(left)
            )
    record = {
        "directory": str(directory),
        "owner": os.getpid(),
        "before": host.snapshot(),
        "pids": [],
    }
    draft = STATE / f"record.{os.getpid()}.json"
    draft.write_text(json.dumps(record, indent=1))
    try:
        os.link(draft, RECORD)  # atomic, and refused when another run was faster
    except FileExistsError:
        raise NodeBusy("another real node was claimed at the same moment") from None
    finally:
        draft.unlink()


def running(record: dict[str, Any]) -> bool:
    """Does the node of this record still live: a process it started, or, while it starts
    and has none yet, the process starting it?"""
    pids = record.get("pids", [])
    if pids:
        return any(_is(p) for p in pids)
    return _is({"pid": record.get("owner"), "argv0": ""})


def clean_dead_run() -> list[str]:
    """``cleanup()`` for a run that is gone: a live node (another session's, or a dev
    stack's still running) is never touched, and said so."""
    if not RECORD.exists():
        return []
    record = json.loads(RECORD.read_text())
    if running(record):
        raise NodeBusy(
            f"the real node of {record['directory']} is running (owner pid "
            f"{record.get('owner')}): not touched; stop it first"
        )
    return cleanup()


def _is(entry: dict[str, Any]) -> bool:
    """Is the recorded process still the one we started (same pid, same program)?"""
    pid = entry.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    argv0 = entry.get("argv0", "")
    return not argv0 or any(argv0.encode() in part for part in cmdline[:3])


def cleanup() -> list[str]:
    """Put the machine back as the record's snapshot found it, whatever state a run left:
    processes (by their recorded pids), the pods' processes and cgroups, mounts below the
    node's directory, the bridge, iptables rules and chains, sysctls, system directories.
    Returns what still differs from the snapshot; removes the record when nothing does.

    One clean-up at a time on the machine: a node that stops has no live process left
    before its clean-up is done, so another session's ``node-clean`` (``make dev-down``)
    may take it for a dead run's at that moment; it waits, then finds nothing to do."""
    STATE.mkdir(parents=True, exist_ok=True)
    with (STATE / "cleanup.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cleanup()


def _cleanup() -> list[str]:
    if not RECORD.exists():
        return []
    record = json.loads(RECORD.read_text())
    directory = Path(record["directory"])
    before = record["before"]
    for entry in record.get("pids", []):
        if _is(entry):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry["pid"], 9)
    host.kill_cgroup(CGROUP_ROOT)
    socket = directory / "containerd" / "containerd.sock"
    for pid in shims(socket):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    _wait_gone(CGROUP_ROOT)
    stuck = host.unmount_below(directory)
    # A pod's veth goes with its network namespace, but that can outlive every process in
    # it: a socket closed towards a peer that is gone keeps it for minutes. The veths on
    # the bridge go now (deleting one end deletes the pair), then the bridge.
    for line in _run("ip", "-o", "link", "show", "master", BRIDGE, check=False).splitlines():
        _run("ip", "link", "del", line.split(":")[1].strip().split("@")[0], check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
    host.restore_iptables(before)
    host.restore_sysctls(before["sysctls"])
    host.remove_new_entries(before["paths"], host.PATHS)
    for big in ("containerd", "kubelet", "volumes"):
        shutil.rmtree(directory / big, ignore_errors=True)
    left = host.diff(before, host.snapshot(), mount_roots=(str(directory),))
    left += [f"still mounted: {p}" for p in stuck]
    left += [f"still running: containerd shim pid {pid}" for pid in shims(socket)]
    if not left:
        RECORD.unlink(missing_ok=True)
    else:
        (directory / "teardown-leftovers.txt").write_text("\n".join(left) + "\n")
    return left


def shims(socket: Path) -> list[int]:
    """Pids of containerd's shims for this node's containerd: they run detached from it
    (their own session, re-parented), so they are known by the socket they report to."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "-address" in argv and argv[argv.index("-address") + 1 :][:1] == [str(socket)]:
            found.append(int(proc.name))
    return found


def _wait_gone(cgroup: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while host.cgroup_pids(cgroup) and time.monotonic() < deadline:
        time.sleep(0.1)
