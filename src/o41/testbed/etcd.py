"""etcd members on loopback: one for the API server, three for the state store's tests."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from o41.testbed.process import LOOPBACK, Server, free_port, wait_until


def _healthy(client_url: str, timeout: float = 1.0) -> bool:
    with urllib.request.urlopen(f"{client_url}/health", timeout=timeout) as r:  # noqa: S310
        return bool(json.load(r).get("health") == "true")


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    server: Server | None = field(default=None, repr=False)

    @property
    def client_url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    @property
    def pid(self) -> int:
        assert self.server is not None
        return self.server.pid

    def alive(self) -> bool:
        return self.server is not None and self.server.alive()


@dataclass
class EtcdCluster:
    """``size`` etcd members on loopback; members can be killed and restarted by pid."""

    binary: Path
    directory: Path
    size: int = 3
    token: str = "o41-testbed"  # noqa: S105 - a cluster token, not a secret
    members: list[EtcdMember] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.members = [
            EtcdMember(f"m{i}", free_port(), free_port(), self.directory / f"m{i}")
            for i in range(self.size)
        ]
        try:
            for m in self.members:
                self._launch(m, state="new")
            for m in self.members:
                self._wait(m, timeout)
        except BaseException:
            self.stop()  # the members that did start must not outlive a failed start
            raise
        return self

    def _launch(self, m: EtcdMember, state: str) -> None:
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        m.server = Server(
            name=f"etcd {m.name}",
            argv=[
                str(self.binary),
                f"--name={m.name}",
                f"--data-dir={m.data_dir}",
                f"--listen-client-urls={m.client_url}",
                f"--advertise-client-urls={m.client_url}",
                f"--listen-peer-urls={m.peer_url}",
                f"--initial-advertise-peer-urls={m.peer_url}",
                f"--initial-cluster={initial}",
                f"--initial-cluster-state={state}",
                f"--initial-cluster-token={self.token}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--heartbeat-interval=50",
                "--election-timeout=500",
            ],
            log=self.directory / f"{m.name}.log",
        ).start()

    def _wait(self, m: EtcdMember, timeout: float) -> None:
        assert m.server is not None
        m.server.wait_ready(lambda: _healthy(m.client_url), timeout=timeout)

    def kill(self, index: int) -> int:
        """SIGKILL one member (a crash); returns its pid."""
        m = self.members[index]
        assert m.server is not None
        pid = m.server.pid
        m.server.kill()
        return pid

    def restart(self, index: int, timeout: float = 30.0) -> None:
        """Start a killed member again on its data directory and wait until it is healthy."""
        m = self.members[index]
        if m.alive():
            return
        self._launch(m, state="existing")
        self._wait(m, timeout)

    def leader(self) -> int:
        """Index of the current leader, asked of the members themselves."""
        ids: dict[int, int] = {}
        leader_id: int | None = None
        for i, m in enumerate(self.members):
            if not m.alive():
                continue
            req = urllib.request.Request(  # noqa: S310
                f"{m.client_url}/v3/maintenance/status", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(req, timeout=2) as r:  # noqa: S310
                status = json.load(r)
            ids[int(status["header"]["member_id"])] = i
            leader_id = int(status["leader"])
        if leader_id is None or leader_id not in ids:
            raise RuntimeError("no live etcd member knows a leader")
        return ids[leader_id]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        wait_until(
            lambda: all(_healthy(m.client_url) for m in self.members if m.alive()),
            timeout=timeout,
            what="etcd members to be healthy",
        )

    def stop(self) -> None:
        for m in self.members:
            if m.server is not None:
                # the last member can hang on SIGTERM without a quorum: SIGKILL after 5 s
                m.server.stop(timeout=5)
