"""etcd members on loopback: one for the API server, three for the state store's tests
(over plain HTTP, or over TLS with client certificates, as a production etcd is run)."""

from __future__ import annotations

import json
import ssl
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from o41.state import EtcdTls
from testbed.pki import Authority
from testbed.process import LOOPBACK, Server, free_port, wait_until


def _healthy(client_url: str, context: ssl.SSLContext | None, timeout: float = 1.0) -> bool:
    with urllib.request.urlopen(  # noqa: S310
        f"{client_url}/health", timeout=timeout, context=context
    ) as r:
        return bool(json.load(r).get("health") == "true")


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    scheme: str = "http"  # of the client URL: https when the cluster speaks TLS
    server: Server | None = field(default=None, repr=False)

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{LOOPBACK}:{self.client_port}"

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
    """``size`` etcd members on loopback; members can be killed and restarted by pid.

    ``tls``: clients speak TLS to the members (https:// URLs), and must show a certificate
    of the cluster's own throwaway CA (``--client-cert-auth``); :attr:`client_tls` is what
    a client needs. Members speak to each other over plain HTTP on loopback.
    """

    binary: Path
    directory: Path
    size: int = 3
    tls: bool = False
    token: str = "o41-testbed"  # noqa: S105 - a cluster token, not a secret
    members: list[EtcdMember] = field(default_factory=list)
    authority: Authority | None = field(default=None, repr=False)

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    @property
    def client_tls(self) -> EtcdTls:
        """The CA and a client certificate that this cluster accepts (``tls`` only)."""
        if self.authority is None:
            raise RuntimeError("this etcd cluster speaks plain HTTP")
        d = self.authority.directory
        return EtcdTls(str(d / "ca.crt"), str(d / "client.crt"), str(d / "client.key"))

    def _context(self) -> ssl.SSLContext | None:
        """What this test bed's own health and leader checks connect with."""
        if self.authority is None:
            return None
        tls = self.client_tls
        context = ssl.create_default_context(cafile=tls.ca_file)
        assert tls.cert_file is not None and tls.key_file is not None
        context.load_cert_chain(tls.cert_file, tls.key_file)
        return context

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self.authority = Authority.create(self.directory / "pki", "o41-testbed-etcd-ca")
            # also a client's: etcd's JSON gateway dials etcd with it (the leader query)
            self.authority.issue("server", "etcd", ips=(LOOPBACK,), client=True, server=True)
            self.authority.issue("client", "o41-placement", client=True)
        scheme = "https" if self.tls else "http"
        self.members = [
            EtcdMember(f"m{i}", free_port(), free_port(), self.directory / f"m{i}", scheme)
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
                *self._tls_flags(),
            ],
            log=self.directory / f"{m.name}.log",
        ).start()

    def _tls_flags(self) -> list[str]:
        if self.authority is None:
            return []
        d = self.authority.directory
        return [
            f"--cert-file={d / 'server.crt'}",
            f"--key-file={d / 'server.key'}",
            f"--trusted-ca-file={d / 'ca.crt'}",
            "--client-cert-auth",
        ]

    def _wait(self, m: EtcdMember, timeout: float) -> None:
        assert m.server is not None
        context = self._context()
        m.server.wait_ready(lambda: _healthy(m.client_url, context), timeout=timeout)

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
        context = self._context()
        for i, m in enumerate(self.members):
            if not m.alive():
                continue
            req = urllib.request.Request(  # noqa: S310
                f"{m.client_url}/v3/maintenance/status", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(req, timeout=2, context=context) as r:  # noqa: S310
                status = json.load(r)
            ids[int(status["header"]["member_id"])] = i
            # no "leader" (JSON leaves out proto3 zeros): this member knows none, mid-election
            known = int(status.get("leader", 0))
            if known:
                leader_id = known
        if leader_id is None or leader_id not in ids:
            raise RuntimeError("no live etcd member knows a leader")
        return ids[leader_id]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        context = self._context()
        wait_until(
            lambda: all(_healthy(m.client_url, context) for m in self.members if m.alive()),
            timeout=timeout,
            what="etcd members to be healthy",
        )

    def stop(self) -> None:
        for m in self.members:
            if m.server is not None:
                # the last member can hang on SIGTERM without a quorum: SIGKILL after 5 s
                m.server.stop(timeout=5)
