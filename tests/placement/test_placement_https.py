"""The placement service over HTTPS on its own port (issue 31: the hub reached from other
clusters and VMs), and clients that check it with ``O41_ARTIFACTS_CA_FILE``.

Real parts: certificates of a throwaway CA (``testbed.pki``), the service app served
by an aiohttp TCPSite with the very context ``python -m o41.webhook`` gives it
(``o41.webhook.http.tls``) on 127.0.0.1, the ``o41`` CLI in a subprocess, the SDK, the
collections' client over wss, and ``python -m o41.webhook`` itself as a process. The
buckets are the stand-in over plain HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509

from o41.client.artifacts import Artifacts
from o41.client.collections import Client, HttpTransport, Unavailable
from o41.client.errors import ArtifactError, TransportError
from o41.core.places import Place
from o41.state.memory import MemoryStore
from o41.webhook.app import Settings, make_app
from o41.webhook.cluster.view import Cluster, View, organization_source
from o41.webhook.http.tls import Reloading, ServingTls
from testbed.locations import ORG, Keys, location
from testbed.pki import Authority, CertPair
from testbed.process import LOOPBACK, free_port
from testbed.standin_bucket import Storage
from testbed.usage import FakeReviewer

from support import wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-team-a"  # testbed.usage's: namespace team-a, listed by the Organization


@dataclass
class Hub:
    url: str
    ca: Authority
    token: Path
    tls: Reloading


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority.create(tmp_path / "hub-ca")


def serving(ca: Authority, stem: str = "hub") -> CertPair:
    """A serving certificate for 127.0.0.1 only (no DNS name: ``localhost`` mismatches)."""
    return ca.issue(stem, "o41-placement", ips=(LOOPBACK,))


@pytest.fixture
async def hub(tmp_path: Path, ca: Authority) -> AsyncIterator[Hub]:
    """The service app (embedded store, a stand-in bucket) over HTTPS on 127.0.0.1."""
    storage = Storage()
    buckets = TestServer(storage.app(), host=LOOPBACK)
    await buckets.start_server()
    storage.url = str(buckets.make_url("")).rstrip("/")
    view = View()
    view.put_location(location("west", "aws", "us-west-2", 1))
    view.put_organization(
        organization_source({"metadata": {"name": ORG}, "spec": {"namespaces": ["team-a"]}})
    )
    view.synced.set()
    pair = serving(ca)
    files = tmp_path / "serving"
    files.mkdir()
    shutil.copy(pair.cert, files / "tls.crt")
    shutil.copy(pair.key, files / "tls.key")
    tls = Reloading(ServingTls(str(files / "tls.crt"), str(files / "tls.key")), check_every=0)
    app = make_app(
        Settings(usage_interval=3600, tls=tls.tls),
        FakeReviewer(),
        store=MemoryStore(),
        cluster=Cluster(view, Keys()),
        buckets=storage.opener,
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port, ssl_context=tls.base).start()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    try:
        yield Hub(f"https://{LOOPBACK}:{port}", ca, token, tls)
    finally:
        await runner.cleanup()
        await buckets.close()


async def o41(hub: Hub, *args: str, ca_file: str | None = None) -> tuple[int, str, str]:
    """The ``o41`` command in a process, as a VM would run it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("O41_", "SKYPILOT_", "SSL_"))}
    env.update(
        {
            "PYTHONPATH": str(ROOT / "src"),
            "O41_ARTIFACTS_ENDPOINT": hub.url,
            "O41_ARTIFACTS_TOKEN_FILE": str(hub.token),
            "O41_ARTIFACTS_CLOUD": "aws",
            "O41_ARTIFACTS_REGION": "us-west-2",
            **({"O41_ARTIFACTS_CA_FILE": ca_file} if ca_file else {}),
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "o41.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_writes_and_reads_over_https_with_the_hubs_ca_file(
    hub: Hub, tmp_path: Path
) -> None:
    data = os.urandom(200_000)
    (tmp_path / "model").write_bytes(data)
    ca_file = str(hub.ca.cert_path)
    code, out, err = await o41(
        hub, "write", "--org", ORG, "--artifact", "m", str(tmp_path / "model"), ca_file=ca_file
    )
    assert code == 0, err
    version = out.split()[0] if out.split() else ""
    code, _, err = await o41(
        hub, "read", "--org", ORG, "--artifact", "m", "--version", "latest",
        "--output", str(tmp_path / "back"), ca_file=ca_file,
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "back").read_bytes() == data
    assert version


async def test_the_cli_without_the_ca_file_fails_in_one_line_naming_the_variable(
    hub: Hub, tmp_path: Path
) -> None:
    (tmp_path / "model").write_bytes(b"x")
    code, _, err = await o41(hub, "write", "--org", ORG, "--artifact", "m", str(tmp_path / "model"))
    assert code == 1
    assert "Traceback" not in err
    assert err.startswith("o41 write: the placement service at https://127.0.0.1:"), err
    assert "certificate verify failed" in err
    assert "set O41_ARTIFACTS_CA_FILE to the hub's CA bundle" in err
    assert "placement-ca, key ca.crt" in err


async def test_a_ca_file_of_another_ca_or_none_at_all_is_refused_naming_the_file(
    hub: Hub, tmp_path: Path
) -> None:
    (tmp_path / "model").write_bytes(b"x")
    stranger = Authority.create(tmp_path / "another-ca")
    args = ("write", "--org", ORG, "--artifact", "m", str(tmp_path / "model"))
    code, _, err = await o41(hub, *args, ca_file=str(stranger.cert_path))
    assert code == 1
    assert "Traceback" not in err
    assert f"O41_ARTIFACTS_CA_FILE={stranger.cert_path} does not vouch for" in err

    code, _, err = await o41(hub, *args, ca_file=str(tmp_path / "missing.crt"))
    assert code == 1
    assert "Traceback" not in err
    assert f"O41_ARTIFACTS_CA_FILE={tmp_path / 'missing.crt'} cannot be read" in err

    (tmp_path / "junk.crt").write_text("not a certificate\n")
    code, _, err = await o41(hub, *args, ca_file=str(tmp_path / "junk.crt"))
    assert code == 1
    assert "holds no usable CA certificate" in err


async def test_the_sdk_takes_the_ca_file_as_an_argument_and_names_a_wrong_host(
    hub: Hub, tmp_path: Path
) -> None:
    place = Place("aws", "us-west-2", "env")
    sdk = Artifacts(hub.url, str(hub.token), place=place, ca_file=str(hub.ca.cert_path))
    written = await asyncio.to_thread(sdk.write_bytes, ORG, "sdk", b"weights")
    assert written.location == "west"
    # the certificate names 127.0.0.1 only: the same service as "localhost" is refused
    port = hub.url.rsplit(":", 1)[1]
    by_name = Artifacts(
        f"https://localhost:{port}", str(hub.token), place=place, ca_file=str(hub.ca.cert_path)
    )
    with pytest.raises(TransportError) as refused:
        await asyncio.to_thread(by_name.write_bytes, ORG, "sdk", b"weights")
    assert "has a certificate for another name" in str(refused.value)
    assert "placement.externalURL" in str(refused.value)


async def test_an_http_endpoint_ignores_the_ca_file_and_an_unreadable_one_is_an_error(
    hub: Hub, tmp_path: Path
) -> None:
    sdk = Artifacts(hub.url, str(hub.token), ca_file=str(tmp_path / "nope.crt"))
    with pytest.raises(ArtifactError, match="cannot be read"):
        await asyncio.to_thread(sdk.call, "GET", "/healthz")


async def test_collections_over_wss_with_the_ca_file_and_refused_without(hub: Hub) -> None:
    def use(ca_file: str | None) -> HttpTransport:
        transport = HttpTransport(hub.url, token=TOKEN, ca_file=ca_file)
        client = Client(transport, "job-1")
        client.dict("checkpoints")["step-1"] = b"w" * 100_000  # several TLS records
        assert client.dict("checkpoints")["step-1"] == b"w" * 100_000
        assert client.counter("steps").add(2) == 2
        return transport

    transport = await asyncio.to_thread(use, str(hub.ca.cert_path))
    assert transport.websocket  # the upgrade went through: wss, not POSTs
    with pytest.raises(Unavailable) as refused:
        await asyncio.to_thread(use, None)
    assert "set O41_ARTIFACTS_CA_FILE to the hub's CA bundle" in str(refused.value)


async def test_one_client_checks_the_hub_with_one_ca_file_for_artifacts_and_collections(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: the CA file given once to ``artifacts.Client`` is what its collections
    check the hub with too (wss, the same connection); without it both sides are refused,
    with the same error, saying what to set."""
    from o41 import artifacts, sky

    monkeypatch.setenv("O41_COMPUTE", "job-1")
    monkeypatch.delenv("O41_ARTIFACTS_CA_FILE", raising=False)
    place = Place("aws", "us-west-2", "env")

    def both(ca_file: str | None) -> tuple[str, int]:
        client = artifacts.Client(hub.url, str(hub.token), place=place, ca_file=ca_file)
        written = client.write(ORG, "one-ca", b"weights")
        return written.location, client.collections.counter("steps").add(1)

    assert await asyncio.to_thread(both, str(hub.ca.cert_path)) == ("west", 1)

    client = artifacts.Client(hub.url, str(hub.token), place=place)  # the system's CAs
    refused = []
    for side in (
        lambda: client.write(ORG, "one-ca", b"weights"),
        lambda: client.collections.counter("steps").add(1),
    ):
        with pytest.raises(sky.TransportError) as error:
            await asyncio.to_thread(side)
        refused.append(str(error.value))
    assert all("set O41_ARTIFACTS_CA_FILE to the hub's CA bundle" in m for m in refused)


def peer_serial(url: str, ca_file: Path) -> int:
    """The serial number of the certificate a new connection to ``url`` is shown."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_renewed_files_serve_new_connections_and_a_broken_pair_keeps_the_old(
    hub: Hub, tmp_path: Path
) -> None:
    ca_file = hub.ca.cert_path
    first = await asyncio.to_thread(peer_serial, hub.url, ca_file)
    files = Path(hub.tls.tls.cert_file).parent
    # a key that does not match the certificate (the kubelet mid-swap): the old one serves
    other = serving(hub.ca, "other")
    shutil.copy(other.cert, files / "tls.crt")
    assert await asyncio.to_thread(peer_serial, hub.url, ca_file) == first
    assert hub.tls.reloads == 0
    shutil.copy(other.key, files / "tls.key")  # now a whole pair: taken, no restart
    renewed = await asyncio.to_thread(peer_serial, hub.url, ca_file)
    assert renewed != first
    assert renewed == x509.load_pem_x509_certificate(other.cert.read_bytes()).serial_number
    assert hub.tls.reloads == 1


def test_serving_files_are_checked_at_start_saying_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="O41_TLS_CERT_FILE is set but O41_TLS_KEY_FILE is not"):
        ServingTls.from_environment({"O41_TLS_CERT_FILE": "/x"})
    with pytest.raises(ValueError, match="cannot read the serving certificate"):
        ServingTls.from_environment(
            {"O41_TLS_CERT_FILE": str(tmp_path / "a"), "O41_TLS_KEY_FILE": str(tmp_path / "b")}
        )
    ca = Authority.create(tmp_path / "ca")
    one, two = serving(ca, "one"), serving(ca, "two")
    with pytest.raises(ValueError, match="do not load"):
        ServingTls.from_environment(
            {"O41_TLS_CERT_FILE": str(one.cert), "O41_TLS_KEY_FILE": str(two.key)}
        )
    assert ServingTls.from_environment({}) is None


# --- python -m o41.webhook, the process the chart runs -------------------------------------


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose API server is a closed port of 127.0.0.1: the service starts and
    serves /healthz; its view never loads (so /readyz stays 503), which is all we need."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: none, cluster: {{server: "https://{LOOPBACK}:{free_port()}"}}}}]
users: [{{name: none, user: {{token: none}}}}]
contexts: [{{name: none, context: {{cluster: none, user: none}}}}]
current-context: none
"""
    )
    return path


@dataclass
class Process:
    url: str
    metrics: str
    proc: subprocess.Popen[bytes]


@pytest.fixture
def process(tmp_path: Path, ca: Authority, kubeconfig: Path) -> Iterator[Process]:
    with serve(tmp_path, ca, kubeconfig, metrics_port=True) as running:
        yield running


@contextlib.contextmanager
def serve(
    tmp_path: Path, ca: Authority, kubeconfig: Path, *, metrics_port: bool
) -> Iterator[Process]:
    """``python -m o41.webhook`` over HTTPS, with ``--metrics-port`` or without."""
    pair = serving(ca)
    port, metrics = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("O41_", "SSL_"))}
    env.update(
        {
            "PYTHONPATH": str(ROOT / "src"),
            "O41_TLS_CERT_FILE": str(pair.cert),
            "O41_TLS_KEY_FILE": str(pair.key),
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "*",
        }
    )
    log = (tmp_path / "service.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "o41.webhook", "--host", LOOPBACK, "--port", str(port),
            *(("--metrics-port", str(metrics)) if metrics_port else ()),
            "--kubeconfig", str(kubeconfig), "--usage-page", "off",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    running = Process(f"https://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{metrics}", proc)
    context = ssl.create_default_context(cafile=str(ca.cert_path))

    def answers() -> bool | None:
        if proc.poll() is not None:
            raise AssertionError("the service exited")  # its log says why
        try:
            return status(running.url + "/healthz", context) == 200
        except (OSError, urllib.error.URLError):
            return None

    try:
        try:
            wait_for(answers, 60, "the service to answer over HTTPS", interval=0.2)
        except AssertionError:
            log.close()
            pytest.fail((tmp_path / "service.log").read_text()[-3000:])
        yield running
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def status(url: str, context: ssl.SSLContext | None = None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_the_process_serves_https_on_its_port_and_plain_metrics_on_its_own(
    process: Process, ca: Authority
) -> None:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    assert status(process.url + "/healthz", context) == 200
    assert status(process.url + "/openapi.json", context) == 200
    # exposed with --usage-page off: no token form; /metrics lives on the metrics port only
    assert status(process.url + "/usage", context) == 404
    assert status(process.url + "/metrics", context) == 404
    # the API waits for the view of the cluster (never loaded here): 503, retry later
    assert status(process.url + "/v1/usage?organization=ml", context) == 503
    assert status(process.metrics + "/metrics") == 200  # plain HTTP, cluster-internal

    # TLS 1.2 at least: a client that would take TLS 1.1 (security level 0) gets through
    # when it may offer 1.2, and not when 1.1 is its most
    def capped(version: ssl.TLSVersion) -> ssl.SSLContext:
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.load_verify_locations(str(ca.cert_path))
        client.set_ciphers("DEFAULT:@SECLEVEL=0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            client.minimum_version = ssl.TLSVersion.TLSv1_1
            client.maximum_version = version
        return client

    assert status(process.url + "/healthz", capped(ssl.TLSVersion.TLSv1_2)) == 200
    with pytest.raises(urllib.error.URLError) as refused:
        status(process.url + "/healthz", capped(ssl.TLSVersion.TLSv1_1))
    assert isinstance(refused.value.reason, ssl.SSLError), refused.value.reason
    # plain HTTP to the TLS port is no answer
    with pytest.raises((OSError, urllib.error.URLError)):
        status(process.url.replace("https:", "http:") + "/healthz")


def test_metrics_are_never_on_the_tls_port_even_without_a_metrics_port(
    tmp_path: Path, ca: Authority, kubeconfig: Path
) -> None:
    """Issue 37, point 7: /metrics names every organization; the TLS port is the exposed
    one, so without --metrics-port the service serves /metrics nowhere (and says so)."""
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    with serve(tmp_path, ca, kubeconfig, metrics_port=False) as running:
        assert status(running.url + "/healthz", context) == 200
        assert status(running.url + "/metrics", context) == 404
        with pytest.raises((OSError, urllib.error.URLError)):  # nor on a port of its own
            status(running.metrics + "/metrics")
    assert "/metrics is not served: the API port is TLS" in (tmp_path / "service.log").read_text()


def test_the_process_refuses_half_a_tls_setting_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "o41.webhook", "--port", "1"],
        env={"PYTHONPATH": str(ROOT / "src"), "O41_TLS_CERT_FILE": str(tmp_path / "tls.crt")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "O41_TLS_CERT_FILE is set but O41_TLS_KEY_FILE is not" in done.stderr
