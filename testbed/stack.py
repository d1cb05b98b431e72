"""The whole local stack: control plane, state-store etcd and the three storage stand-ins.

``up`` starts it and records every pid in ``<dir>/pids.json``; ``down`` stops those pids
(SIGTERM, then SIGKILL). ``<dir>/env`` holds shell ``export`` lines for people and scripts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.etcd import EtcdCluster
from testbed.kube import ControlPlane, bin_dir
from testbed.node import RealNode
from testbed.process import Server
from testbed.stores import AzureStore, GcsStore, S3Store, start_azure, start_gcs, start_s3

_PARTS = ("kube", "state-etcd", "s3", "gcs", "azure", "operator", "placement", "node")


@dataclass
class Stack:
    directory: Path
    control_plane: ControlPlane | None = None
    state_store: EtcdCluster | None = None
    s3: S3Store | None = None
    gcs: GcsStore | None = None
    azure: AzureStore | None = None
    extra: list[Server] = field(default_factory=list)
    endpoint: str | None = None  # the placement service, once the product runs
    real_node: RealNode | None = None

    def start(self) -> Stack:
        self.directory.mkdir(parents=True, exist_ok=True)
        for part in _PARTS:  # the data of a stack that is gone means nothing now
            shutil.rmtree(self.directory / part, ignore_errors=True)
        bins = bin_dir()
        try:
            self.control_plane = ControlPlane(self.directory / "kube", bins).start()
            self.state_store = EtcdCluster(bins / "etcd", self.directory / "state-etcd").start()
            self.s3 = start_s3(self.directory / "s3")
            self.gcs = start_gcs(self.directory / "gcs")
            self.azure = start_azure(self.directory / "azure")
        except BaseException:
            self.stop()
            raise
        self._write_records()
        return self

    def start_real_node(self) -> Stack:
        """A real node (kubelet, containerd, kube-proxy, CoreDNS) beside the kwok nodes,
        with the project's images imported (built first if missing)."""
        from testbed import images

        assert self.control_plane is not None
        built = images.build()
        try:
            self.real_node = RealNode(
                self.control_plane, self.control_plane.bins, self.directory / "node", built
            ).start()
        finally:
            self._write_records()
        return self

    def start_product(self) -> Stack:
        """CRDs, the stand-ins' credentials as Secrets, the operator and the placement
        service (state in the 3-member etcd), as the chart would install them."""
        from testbed.product import (
            OperatorProcess,
            PlacementProcess,
            install_crds,
            store_secrets,
        )

        assert self.control_plane and self.state_store and self.s3 and self.gcs and self.azure
        kubeconfig = self.control_plane.kubeconfig
        install_crds(kubeconfig)
        store_secrets(kubeconfig, self.s3, self.gcs, self.azure)
        operator = OperatorProcess(kubeconfig, self.directory / "operator", check_interval=30)
        operator.start()
        assert operator.server is not None
        self.extra.append(operator.server)
        service = PlacementProcess(
            kubeconfig, self.state_store.endpoints, self.directory / "placement"
        ).start()
        assert service.server is not None
        self.extra.append(service.server)
        self.endpoint = service.url
        self._write_records()
        from testbed.examples import manifest

        self.examples.write_text(manifest(self.s3, self.gcs, self.azure))
        return self

    @property
    def examples(self) -> Path:
        """Locations on the stand-ins, written by :meth:`start_product` (testbed.examples)."""
        return self.directory / "examples.yaml"

    def servers(self) -> list[Server]:
        found: list[Server] = []
        if self.control_plane is not None:
            found += self.control_plane.servers
            if self.control_plane.etcd is not None:
                found += [m.server for m in self.control_plane.etcd.members if m.server]
        if self.state_store is not None:
            found += [m.server for m in self.state_store.members if m.server]
        found += [s.server for s in (self.s3, self.gcs, self.azure) if s is not None]
        if self.real_node is not None:
            found += self.real_node.servers
        return found + self.extra

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.control_plane is not None:
            env["KUBECONFIG"] = str(self.control_plane.kubeconfig)
        if self.state_store is not None:
            env["O41_ETCD_ENDPOINTS"] = ",".join(self.state_store.endpoints)
        if self.endpoint is not None:
            env["O41_ARTIFACTS_ENDPOINT"] = self.endpoint
        for store in (self.s3, self.gcs, self.azure):
            if store is not None:
                env.update(store.env())
        return env

    def _write_records(self) -> None:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env().items())]
        (self.directory / "env").write_text("\n".join(lines) + "\n")
        pids = [{"name": s.name, "pid": s.pid} for s in self.servers() if s.alive()]
        (self.directory / "pids.json").write_text(json.dumps(pids, indent=2))

    def stop(self) -> None:
        for server in reversed(self.extra):
            server.stop()
        if self.real_node is not None:
            self.real_node.stop()
        for store in (self.azure, self.gcs, self.s3):
            if store is not None:
                store.stop()
        if self.state_store is not None:
            self.state_store.stop()
        if self.control_plane is not None:
            self.control_plane.stop()


class StillRunning(Exception):
    """A recorded process outlived SIGKILL (stuck in the kernel): its record is kept."""


def stop_recorded(directory: Path, timeout: float = 10.0) -> list[str]:
    """Stop every process ``up`` recorded in ``directory``; returns what was stopped."""
    for written in ("env", "examples.yaml"):  # they name processes and keys that are gone
        (directory / written).unlink(missing_ok=True)
    record = directory / "pids.json"
    if not record.exists():
        return _clean_real_node()
    entries = json.loads(record.read_text())
    stopped = []
    for entry in entries:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(entry["pid"], signal.SIGTERM)
            stopped.append(f"{entry['name']} (pid {entry['pid']})")
    _wait_gone([e["pid"] for e in entries], timeout)
    for entry in entries:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(entry["pid"], signal.SIGKILL)
    # SIGKILL is delivered, not done: a process leaves only once the kernel has torn it down
    left = _wait_gone([e["pid"] for e in entries], timeout)
    if left:
        raise StillRunning(f"still running after SIGKILL: pids {left} (recorded in {record})")
    record.unlink()
    return stopped + _clean_real_node()


def _clean_real_node() -> list[str]:
    """A real node's machine-wide changes (pods, bridge, iptables, mounts, cgroups) go once
    its processes are stopped; what could not be put back is said, not hidden. Another
    session's node, still running, is left alone."""
    from testbed import node

    if not node.RECORD.exists():
        return []
    try:
        left = node.clean_dead_run()
    except node.NodeBusy as e:
        return [str(e)]
    if left:
        return [f"the real node left (see {node.RECORD}):", *left]
    return ["the real node's bridge, iptables rules, mounts and cgroups"]


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until every pid has exited (or ``timeout`` passes); returns those still running."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (exited, not yet reaped by its parent) does not."""
    # a child of ours that exited is a zombie until reaped: reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(") ", 1)[1][:1] not in ("Z", "X")
