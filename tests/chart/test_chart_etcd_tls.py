"""The chart's etcd as the chart renders it, started for real: the certificates of
``helm template`` (decoded from its Secrets) and exactly the arguments and environment of
its StatefulSet, rewritten only where a pod's addresses and paths become loopback ones.

Each member's ports (2379 client, 2380 peer, 2381 metrics) and DNS name become
127.0.0.1:<a free port>; the mount paths become the directories the Secrets were decoded
into (what the kubelet would mount there). The members' certificates are valid for
127.0.0.1 (as kubeadm's etcd certificates are), so the rewritten URLs verify.

What is shown: the placement service's store, with the URLs and TLS variables the chart
gives it, reads and writes; a client without the certificate is refused (plain HTTP, TLS
without a client certificate, a certificate of another CA), and nothing it sent is written;
metrics and health answer over plain HTTP on their own port, and on no other; a peer with a
certificate of another CA cannot join, while the same steps with the chart's peer
certificate do join.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.client
import json
import re
import socket
import ssl
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from o41.client.collections import Client
from o41.client.transport import HttpTransport
from o41.state import EtcdTls, StoreUnavailable, store_settings
from o41.state.etcd import EtcdStore
from test_chart import NAMESPACE, Doc, container, find, render
from testbed.kube import Kube
from testbed.pki import Authority
from testbed.process import LOOPBACK, Server, free_port
from testbed.product import SAFE_ENV, install_crds

from support import wait_for

pytestmark = [pytest.mark.etcd]

SRC = str(Path(__file__).resolve().parents[2] / "src")

ETCD = "o41-artifacts-etcd"
PORTS = (2379, 2380, 2381)  # client, peer, metrics: as the StatefulSet names them
URL = re.compile(r"(https?)://([^:/,\s]+):(\d+)")
ENV_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def member_of(host: str, own: int) -> int:
    """Which member a host of the rendered URLs is: 0.0.0.0 is the member itself."""
    if host == "0.0.0.0":
        return own
    found = re.fullmatch(rf"{ETCD}-(\d+)\.{ETCD}\.{NAMESPACE}\.svc", host)
    assert found, f"a rendered URL names a host the test cannot map: {host}"
    return int(found.group(1))


def decode_secret(secret: Doc, directory: Path) -> Path:
    """The Secret's files, as a mounted secret volume holds them (mode 0440)."""
    directory.mkdir(parents=True)
    for name, data in secret["data"].items():
        path = directory / name
        path.write_bytes(base64.b64decode(data))
        path.chmod(0o440)
    return directory


@dataclass
class Members:
    """Loopback ports for the members of the rendered StatefulSet, and the rewriting of
    its arguments onto them."""

    docs: list[Doc]
    directory: Path
    ports: dict[tuple[int, int], int] = field(default_factory=dict)  # (member, port) -> port
    servers: dict[int, Server] = field(default_factory=dict)

    @property
    def statefulset(self) -> Doc:
        return find(self.docs, "StatefulSet", "-etcd")

    def port(self, member: int, rendered: int) -> int:
        key = (member, rendered)
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]

    def url(self, member: int, rendered: int, scheme: str = "https") -> str:
        return f"{scheme}://{LOOPBACK}:{self.port(member, rendered)}"

    def rewrite(self, text: str, own: int, mounts: dict[str, Path]) -> str:
        """Addresses to loopback ports, mount paths to directories; nothing else."""

        def address(m: re.Match[str]) -> str:
            scheme, host, port = m.group(1), m.group(2), int(m.group(3))
            assert port in PORTS, m.group(0)
            return self.url(member_of(host, own), port, scheme)

        text = URL.sub(address, text)
        for mount_path, local in mounts.items():
            text = text.replace(mount_path, str(local))
        return text

    def mounts(self, member: int) -> dict[str, Path]:
        """Each mount of the etcd container: the data volume a directory of the member's
        own, a secret volume the directory its Secret was decoded into."""
        pod = self.statefulset["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        found: dict[str, Path] = {}
        for mount in container(self.statefulset)["volumeMounts"]:
            volume = volumes.get(mount["name"], {})
            if "secret" in volume:
                found[mount["mountPath"]] = (
                    self.directory / "secrets" / volume["secret"]["secretName"]
                )
            else:
                assert mount["name"] == "data"
                found[mount["mountPath"]] = self.directory / f"member-{member}"
        return found

    def environment(self, member: int) -> dict[str, str]:
        env: dict[str, str] = {}
        for e in container(self.statefulset).get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            else:
                assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, e
                env[e["name"]] = f"{ETCD}-{member}"
        return env

    def argv(self, member: int) -> list[str]:
        """The container's command and arguments for this member: $(VAR) expanded from its
        environment as the kubelet does, then rewritten onto loopback."""
        c = container(self.statefulset)
        env = self.environment(member)
        mounts = self.mounts(member)
        args = [ENV_REF.sub(lambda m: env[m.group(1)], a) for a in c["args"]]
        command = [Path(c["command"][0]).name]
        return command + [self.rewrite(a, member, mounts) for a in args]

    def start(self, member: int, binary: Path, argv: list[str] | None = None) -> Server:
        argv = argv or self.argv(member)
        server = Server(
            f"chart etcd {member}",
            [str(binary), *argv[1:]],
            self.directory / f"member-{member}.log",
            env=self.environment(member),
        ).start()
        self.servers[member] = server
        return server

    def ready(self, member: int) -> bool:
        """The StatefulSet's readiness probe, over plain HTTP on the metrics port."""
        probe = container(self.statefulset)["readinessProbe"]["httpGet"]
        named = {p["name"]: p["containerPort"] for p in container(self.statefulset)["ports"]}
        url = f"{self.url(member, named[probe['port']], 'http')}{probe['path']}"
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop(timeout=5)


@dataclass
class ChartEtcd:
    members: Members
    secrets: dict[str, Path]  # Secret name -> its decoded directory
    binary: Path

    @property
    def docs(self) -> list[Doc]:
        return self.members.docs

    def placement_store_settings(self) -> tuple[list[str], EtcdTls | None]:
        """What the placement service's container is given: its --etcd argument and its
        environment, its mount of the client Secret rewritten to the decoded directory."""
        placement = find(self.docs, "Deployment", "-placement")
        c = container(placement)
        pod = placement["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {
            m["mountPath"]: self.secrets[volumes[m["name"]]["secret"]["secretName"]]
            for m in c["volumeMounts"]
            if "secret" in volumes[m["name"]]
        }
        etcd = self.members.rewrite(c["args"][c["args"].index("--etcd") + 1], -1, {})
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        env = {k: self.members.rewrite(v, -1, mounts) for k, v in env.items()}
        return store_settings(etcd, env)

    def placement_process(self, kubeconfig: Path, directory: Path) -> tuple[Server, int, int]:
        """``python -m o41.webhook`` with the container's arguments and environment: its
        addresses on loopback, its mounted client Secret the decoded one, and a kubeconfig
        in place of the pod's in-cluster ServiceAccount. Its API port and metrics port."""
        c = container(find(self.docs, "Deployment", "-placement"))
        argv = list(c["args"])
        api, metrics = free_port(), free_port()
        for flag, value in (
            ("--host", LOOPBACK),
            ("--port", str(api)),
            ("--metrics-port", str(metrics)),
        ):
            argv[argv.index(flag) + 1] = value
        endpoints, tls = self.placement_store_settings()
        argv[argv.index("--etcd") + 1] = ",".join(endpoints)
        assert tls is not None
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        env.update(tls.environment())
        assert argv[:3] == ["python", "-m", "o41.webhook"]
        server = Server(
            "chart placement",
            [sys.executable, *argv[1:], "--kubeconfig", str(kubeconfig)],
            directory / "placement.log",
            env={**SAFE_ENV, **env, "PYTHONPATH": SRC},
        )
        return server, api, metrics

    def store(self, timeout: float = 5.0) -> EtcdStore:
        endpoints, tls = self.placement_store_settings()
        return EtcdStore(endpoints, timeout=timeout, tls=tls)

    def secret_files(self, suffix: str) -> EtcdTls:
        (name,) = [n for n in self.secrets if n.endswith(suffix)]
        d = self.secrets[name]
        return EtcdTls(str(d / "ca.crt"), str(d / "tls.crt"), str(d / "tls.key"))


def start_chart_etcd(
    docs: list[Doc], secrets: dict[str, Path], binary: Path, directory: Path
) -> ChartEtcd:
    """The rendered StatefulSet's members on loopback, ready by its own readiness probe."""
    members = Members(docs, directory)
    replicas = members.statefulset["spec"]["replicas"]
    try:
        for i in range(replicas):
            members.start(i, binary)
        for i in range(replicas):
            members.servers[i].wait_ready(functools.partial(members.ready, i), timeout=60)
    except BaseException:
        members.stop()
        raise
    return ChartEtcd(members, secrets, binary)


@pytest.fixture(scope="module")
def chart_etcd(etcd_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartEtcd]:
    """The defaults: the chart's generated CAs and certificates, decoded from its Secrets."""
    directory = tmp_path_factory.mktemp("chart-etcd")
    docs = render()
    secrets = {
        d["metadata"]["name"]: decode_secret(d, directory / "secrets" / d["metadata"]["name"])
        for d in docs
        if d["kind"] == "Secret" and d["metadata"]["name"].startswith(f"{ETCD}-")
    }
    etcd = start_chart_etcd(docs, secrets, etcd_binary, directory)
    try:
        yield etcd
    finally:
        etcd.members.stop()


def issue_as_cert_manager(certificate: Doc, ca: Authority, directory: Path) -> Path:
    """What cert-manager's CA issuer writes for a rendered Certificate: its Secret's files,
    with the certificate's common name, names, addresses and usages, signed by ``ca``."""
    spec = certificate["spec"]
    usages = set(spec["usages"])
    pair = ca.issue(
        spec["secretName"],
        spec["commonName"],
        dns=tuple(spec.get("dnsNames", ())),
        ips=tuple(spec.get("ipAddresses", ())),
        client="client auth" in usages,
        server="server auth" in usages,
    )
    directory.mkdir(parents=True)
    for name, source in (("ca.crt", ca.cert_path), ("tls.crt", pair.cert), ("tls.key", pair.key)):
        (directory / name).write_bytes(source.read_bytes())
        (directory / name).chmod(0o440)
    return directory


@pytest.fixture(scope="module")
def cert_manager_etcd(
    etcd_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartEtcd]:
    """``etcd.tls.certManager.enabled``: one CA for clients and peers (as with an issuer of
    the user's), the certificates as the rendered Certificates ask for them."""
    directory = tmp_path_factory.mktemp("cert-manager-etcd")
    docs = render("etcd.tls.certManager.enabled=true")
    ca = Authority.create(directory / "ca", "stand-in for cert-manager's CA issuer")
    secrets = {
        d["spec"]["secretName"]: issue_as_cert_manager(
            d, ca, directory / "secrets" / d["spec"]["secretName"]
        )
        for d in docs
        if d["kind"] == "Certificate" and not d["spec"].get("isCA")
    }
    etcd = start_chart_etcd(docs, secrets, etcd_binary, directory)
    try:
        yield etcd
    finally:
        etcd.members.stop()


# --- TLS handshakes, spoken by hand -------------------------------------------------------


def _complete(answer: bytes) -> bool:
    """Whether ``answer`` holds a whole HTTP response with a Content-Length (a busy server
    may keep the connection open a while after it)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def https_get(port: int, path: str, ca: str, cert: tuple[str, str] | None) -> str:
    """GET over TLS to 127.0.0.1:port checking the server against ``ca``, showing ``cert``
    (certificate, key) or none; the status line and body, or the TLS error etcd caused."""
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(*cert)
    try:
        with (
            socket.create_connection((LOOPBACK, port), timeout=30) as raw,
            context.wrap_socket(raw, server_hostname=LOOPBACK) as tls,
        ):
            tls.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode()
            )
            answer = b""
            while not _complete(answer) and (chunk := tls.recv(65536)):
                answer += chunk
            return answer.decode(errors="replace")
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
        return f"refused: {e}"


def test_the_rendered_members_form_a_cluster_over_tls(chart_etcd: ChartEtcd) -> None:
    members = chart_etcd.members
    args = container(members.statefulset)["args"]
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    # what a member was started with: the rendered flags, in order, only rewritten
    flags = {a.partition("=")[0]: a.partition("=")[2] for a in members.argv(0)[1:]}
    assert list(flags) == [a.split("=", 1)[0] for a in args]
    for flag in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls"):
        assert flags[flag].startswith("https://127.0.0.1:"), flags[flag]
    assert flags["--listen-metrics-urls"].startswith("http://127.0.0.1:")
    server = chart_etcd.secret_files("-server-tls")
    assert server.ca_file and server.cert_file and server.key_file
    said = https_get(
        members.port(0, 2379), "/version", server.ca_file, (server.cert_file, server.key_file)
    )
    assert said.startswith("HTTP/1.1 200"), said
    assert '"etcdserver":"3.6' in said


async def test_the_placement_services_store_reads_and_writes_with_what_the_chart_gives_it(
    chart_etcd: ChartEtcd,
) -> None:
    endpoints, tls = chart_etcd.placement_store_settings()
    assert [e.rsplit(":", 1)[0] for e in endpoints] == ["https://127.0.0.1"] * 3
    assert tls is not None and tls.cert_file and tls.key_file
    store = chart_etcd.store()
    try:
        revision = await store.put(b"/chart-tls/a", b"written over TLS")
        kv = await store.get(b"/chart-tls/a")
        assert kv is not None and kv.value == b"written over TLS"
        assert kv.mod_revision == revision
        assert [k.key for k in await store.range(b"/chart-tls/")] == [b"/chart-tls/a"]
        assert await store.delete(b"/chart-tls/a") == 1
    finally:
        await store.close()


@pytest.mark.parametrize("client", ["plain-http", "tls-without-a-certificate", "another-ca"])
async def test_a_client_without_the_certificate_is_refused_and_writes_nothing(
    chart_etcd: ChartEtcd, client: str, tmp_path: Path
) -> None:
    members = chart_etcd.members
    good = chart_etcd.secret_files("-client-tls")
    key = f"/chart-tls/refused/{client}".encode()
    if client == "plain-http":
        endpoints, tls = [members.url(i, 2379, "http") for i in range(3)], None
    elif client == "tls-without-a-certificate":
        endpoints, tls = [members.url(i, 2379) for i in range(3)], EtcdTls(good.ca_file)
    else:
        other = Authority.create(tmp_path / "other-ca").issue(
            "client", "o41-artifacts-placement", client=True
        )
        endpoints = [members.url(i, 2379) for i in range(3)]
        tls = EtcdTls(good.ca_file, str(other.cert), str(other.key))
    store = EtcdStore(endpoints, timeout=2, tls=tls)
    try:
        with pytest.raises(StoreUnavailable):
            await store.put(key, b"should not be written")
        with pytest.raises(StoreUnavailable):
            await store.get(key)
    finally:
        await store.close()
    # what etcd says on the wire, by hand: a TLS alert, not an answer
    if client == "plain-http":
        status, body = http_status(f"{endpoints[0]}/version")
        assert (status, body) == (0, "closed without an answer")
    else:
        assert good.ca_file is not None
        cert = None if tls is None or tls.cert_file is None else (tls.cert_file, tls.key_file or "")
        said = https_get(members.port(0, 2379), "/version", good.ca_file, cert)
        assert said.startswith("refused:"), said
        expected = "CERTIFICATE_REQUIRED" if cert is None else "UNKNOWN_CA"
        assert expected in said.upper(), said
    # nothing was written: read back with the placement service's certificate
    store = chart_etcd.store()
    try:
        assert await store.get(key) is None
    finally:
        await store.close()


def test_metrics_and_health_answer_over_plain_http_on_their_own_port_only(
    chart_etcd: ChartEtcd,
) -> None:
    members = chart_etcd.members
    with urllib.request.urlopen(f"{members.url(0, 2381, 'http')}/metrics", timeout=5) as r:
        body = r.read().decode()
    assert "etcd_server_has_leader 1" in body
    # the kubelet's probes, as rendered, without a certificate
    c = container(members.statefulset)
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in (c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]):
        url = f"{members.url(1, named[probe['port']], 'http')}{probe['path']}"
        assert http_status(url)[0] == 200, url
    # the same path on the client port wants the client certificate
    good = chart_etcd.secret_files("-client-tls")
    assert good.ca_file is not None
    said = https_get(members.port(0, 2379), "/metrics", good.ca_file, None)
    assert said.startswith("refused:") and "CERTIFICATE_REQUIRED" in said.upper(), said


def member_api(chart_etcd: ChartEtcd, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's JSON gateway, with the placement service's certificate."""
    good = chart_etcd.secret_files("-client-tls")
    context = ssl.create_default_context(cafile=good.ca_file)
    assert good.cert_file and good.key_file
    context.load_cert_chain(good.cert_file, good.key_file)
    request = urllib.request.Request(
        f"{chart_etcd.members.url(0, 2379)}{path}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as r:
            result: dict[str, Any] = json.load(r)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path}: {e.code} {e.read().decode()}") from None
    return result


def add_member(chart_etcd: ChartEtcd, member: int) -> str:
    """`etcdctl member add`: once the members have been connected long enough for etcd to
    take a new one (it answers 503 "unhealthy cluster" until then); the new member's id."""

    def add() -> str | None:
        try:
            url = chart_etcd.members.url(member, 2380)
            added = member_api(chart_etcd, "/v3/cluster/member/add", {"peerURLs": [url]})
        except AssertionError as e:
            if "unhealthy cluster" in str(e):
                return None
            raise
        return str(added["member"]["ID"])

    return wait_for(add, timeout=60, what=f"etcd to take member {member}")


def joining_argv(chart_etcd: ChartEtcd, member: int) -> list[str]:
    """The rendered arguments of a member joining the running cluster: the member's own,
    with the cluster's members and itself in --initial-cluster and state ``existing``
    (how etcd adds a member: `etcdctl member add`, then start it so)."""
    members = chart_etcd.members
    argv = members.argv(member)
    initial = next(i for i, a in enumerate(argv) if a.startswith("--initial-cluster="))
    argv[initial] += f",{ETCD}-{member}={members.url(member, 2380)}"
    argv[argv.index("--initial-cluster-state=new")] = "--initial-cluster-state=existing"
    return argv


def test_a_peer_with_a_certificate_of_another_ca_cannot_join(
    chart_etcd: ChartEtcd, tmp_path: Path
) -> None:
    members = chart_etcd.members
    peer = chart_etcd.secret_files("-peer-tls")
    assert peer.cert_file and peer.key_file and peer.ca_file
    # by hand first: the peer port answers the chart's peer certificate only
    port = members.port(0, 2380)
    assert https_get(port, "/members", peer.ca_file, (peer.cert_file, peer.key_file)).startswith(
        "HTTP/1.1 200"
    )
    client = chart_etcd.secret_files("-client-tls")
    assert client.cert_file and client.key_file
    said = https_get(port, "/members", peer.ca_file, (client.cert_file, client.key_file))
    assert said.startswith("refused:") and "UNKNOWN_CA" in said.upper(), said

    # a fourth member with a certificate of another CA, named as a peer and valid for its
    # address: only the CA differs from the chart's; it trusts the members' CA
    names = ("localhost",)
    rogue = Authority.create(tmp_path / "rogue-ca").issue(
        "peer", f"{ETCD}-peer", dns=names, ips=(LOOPBACK,), client=True, server=True
    )
    rogue_dir = tmp_path / "rogue-peer"
    rogue_dir.mkdir()
    (rogue_dir / "ca.crt").write_bytes(Path(peer.ca_file).read_bytes())
    (rogue_dir / "tls.crt").write_bytes(rogue.cert.read_bytes())
    (rogue_dir / "tls.key").write_bytes(rogue.key.read_bytes())
    peer_dir = str(Path(peer.cert_file).parent)

    rogue_id = add_member(chart_etcd, 3)
    argv = [a.replace(peer_dir, str(rogue_dir)) for a in joining_argv(chart_etcd, 3)]
    server = members.start(3, chart_etcd.binary, argv)
    try:
        rejected = "rejected connection on peer endpoint"

        def refused() -> bool:
            logs = [members.servers[i].tail(400) for i in range(3)]
            return any(rejected in log and "unknown authority" in log for log in logs)

        wait_for(refused, timeout=60, what="the members to refuse the rogue peer")
        listed = member_api(chart_etcd, "/v3/cluster/member/list", {})["members"]
        unstarted = [m for m in listed if m["ID"] == rogue_id]
        assert unstarted and not unstarted[0].get("name"), listed  # it never joined
        assert all(members.ready(i) for i in range(3))
    finally:
        server.stop(timeout=5)
        member_api(chart_etcd, "/v3/cluster/member/remove", {"ID": rogue_id})

    # the same steps with the chart's own peer certificate: it joins (as a fifth member:
    # etcd answers "member not found" when a removed member's peer URL is added again)
    good_id = add_member(chart_etcd, 4)
    server = members.start(4, chart_etcd.binary, joining_argv(chart_etcd, 4))
    try:

        def joined() -> bool:
            listed = member_api(chart_etcd, "/v3/cluster/member/list", {})["members"]
            return any(m["ID"] == good_id and m.get("name") == f"{ETCD}-4" for m in listed)

        wait_for(joined, timeout=60, what="the member with the chart's certificate to join")
    finally:
        member_api(chart_etcd, "/v3/cluster/member/remove", {"ID": good_id})
        server.stop(timeout=5)


def same_bytes(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and Path(a).read_bytes() == Path(b).read_bytes()


async def test_with_cert_managers_certificates_one_ca_serves_and_the_peer_port_takes_peers_only(
    cert_manager_etcd: ChartEtcd,
) -> None:
    """With one CA for everything, a client certificate is a good certificate at the peer
    port too: --peer-cert-allowed-cn lets in only those named as peers."""
    store = cert_manager_etcd.store()
    try:
        await store.put(b"/chart-tls/cert-manager", b"x")
        kv = await store.get(b"/chart-tls/cert-manager")
        assert kv is not None and kv.value == b"x"
    finally:
        await store.close()
    members = cert_manager_etcd.members
    peer = cert_manager_etcd.secret_files("-peer-tls")
    client = cert_manager_etcd.secret_files("-client-tls")
    assert same_bytes(peer.ca_file, client.ca_file)  # one CA
    assert peer.cert_file and peer.key_file and client.cert_file and client.key_file
    port = members.port(0, 2380)
    ok = https_get(port, "/members", peer.ca_file or "", (peer.cert_file, peer.key_file))
    assert ok.startswith("HTTP/1.1 200"), ok
    said = https_get(port, "/members", peer.ca_file or "", (client.cert_file, client.key_file))
    assert said.startswith("refused:") and "BAD_CERTIFICATE" in said.upper(), said
    wait_for(
        lambda: "client certificate authentication failed" in members.servers[0].tail(200),
        timeout=10,
        what="etcd to log why it refused the client certificate on the peer port",
    )


def http_status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except http.client.RemoteDisconnected:
        return 0, "closed without an answer"


@pytest.mark.kube
def test_the_placement_service_runs_with_its_rendered_arguments_and_keeps_metrics_apart(
    chart_etcd: ChartEtcd, kube: Kube, tmp_path: Path
) -> None:
    """The service as the chart starts it: its collections go to the chart's etcd over TLS
    with the chart's client certificate, and /metrics is on the metrics port only."""
    install_crds(kube.kubeconfig)
    server, api, metrics = chart_etcd.placement_process(kube.kubeconfig, tmp_path)
    namespace = f"chart-tls-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    try:
        server.start().wait_ready(
            lambda: http_status(f"http://{LOOPBACK}:{api}/readyz")[0] == 200, timeout=60
        )
        kube.kubectl("create", "serviceaccount", "job", "-n", namespace)
        token = kube.kubectl("create", "token", "job", "-n", namespace).strip()
        client = Client(HttpTransport(f"http://{LOOPBACK}:{api}", token=token), "tls-job")
        client.dict("checkpoints")["step-1"] = b"weights"
        assert client.dict("checkpoints")["step-1"] == b"weights"

        status, body = http_status(f"http://{LOOPBACK}:{metrics}/metrics")
        assert status == 200 and "# TYPE o41_begins_total counter" in body
        status, _ = http_status(f"http://{LOOPBACK}:{api}/metrics")
        assert status == 404
        assert "over TLS: check" not in server.tail(400)
    finally:
        server.stop()
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    # the entry is in the chart's etcd, read back with the chart's client certificate
    async def entries() -> int:
        store = chart_etcd.store()
        try:
            found = await store.range(
                f"/o41/collections/{namespace}/tls-job/dict/checkpoints/".encode()
            )
            return len(found)
        finally:
            await store.close()

    assert asyncio.run(entries()) == 1
