"""Loopback stand-ins for the AWS, GCP and Azure metadata services, and a silent one.

They refuse what the real services refuse, so a client that forgets a header fails here
as it would on the cloud: IMDSv2 wants a token PUT with a TTL header (else 400) and the
token on every GET (else 401); GCP wants ``Metadata-Flavor: Google`` (else 403) and says
it back; Azure wants ``Metadata: true`` and an ``api-version`` (else 400). All three
refuse a request carrying ``X-Forwarded-For``, as the real ones do against proxies.
Every fake counts the requests it got, so a test can show detection ran once.

The test bed's, for the tests of place detection and bench/place_detect.py; ``isolate`` is
for a test (it takes pytest's ``monkeypatch``), pytest is not needed to import this.
"""

from __future__ import annotations

import secrets
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self
from urllib.parse import parse_qs, urlsplit

from testbed.process import LOOPBACK

if TYPE_CHECKING:
    import pytest


@dataclass(frozen=True)
class Seen:
    """One request a fake received."""

    method: str
    path: str
    headers: dict[str, str]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as the real services
    disable_nagle_algorithm = True  # else the body waits 40 ms on the client's delayed ACK

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows failures, not every request."""

    def _serve(self) -> None:
        fake = self.server.fake
        fake.record(Seen(self.command, self.path, dict(self.headers.items())))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, body, headers = fake.respond(self.command, self.path, self.headers)
        if fake.delay:
            fake.pause()
        data = body.encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _serve
    do_PUT = _serve
    do_POST = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: MetadataFake) -> None:
        super().__init__((LOOPBACK, 0), _Handler)
        self.fake = fake


Answer = tuple[int, str, dict[str, str]]


class MetadataFake:
    """A metadata service on 127.0.0.1; use as a context manager, read ``url``."""

    name: ClassVar[str] = "metadata"

    def __init__(self, *, refuse_with: int | None = None, delay: float = 0.0) -> None:
        self.refuse_with = refuse_with  # answer every request with this status
        self.delay = delay  # seconds before each answer: a slow service
        self._stopping = threading.Event()
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, f"{self.name} fake is not started"
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def answer(self, method: str, path: str, headers: object) -> Answer:
        raise NotImplementedError

    def respond(self, method: str, path: str, headers: object) -> Answer:
        if self.refuse_with is not None:
            return self.refuse_with, "refused", {}
        return self.answer(method, path, headers)

    def pause(self) -> None:
        """Hold an answer back for ``delay`` seconds, or until the fake stops."""
        self._stopping.wait(self.delay)

    def start(self) -> Self:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},  # so ``stop`` returns at once
            name=f"{self.name}-fake",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _header(headers: object, name: str) -> str | None:
    get = getattr(headers, "get", None)
    value = get(name) if get is not None else None
    return value if isinstance(value, str) else None


class AwsImds(MetadataFake):
    """IMDSv2: PUT /latest/api/token (TTL header 1..21600), then GETs with the token."""

    name = "aws-imds"

    def __init__(self, region: str = "eu-west-1", **kw: Any) -> None:
        super().__init__(**kw)
        self.region = region
        self.tokens: set[str] = set()

    def answer(self, method: str, path: str, headers: object) -> Answer:
        if _header(headers, "X-Forwarded-For") is not None:
            return 403, "Forbidden", {}
        if path == "/latest/api/token":
            if method != "PUT":
                return 405, "Method Not Allowed", {}
            ttl = _header(headers, "X-aws-ec2-metadata-token-ttl-seconds")
            if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return 400, "Bad Request", {}
            issued = secrets.token_urlsafe(32)
            with self._lock:
                self.tokens.add(issued)
            return 200, issued, {"X-aws-ec2-metadata-token-ttl-seconds": ttl}
        if method != "GET":
            return 405, "Method Not Allowed", {}
        token = _header(headers, "X-aws-ec2-metadata-token")
        with self._lock:
            valid = token is not None and token in self.tokens
        if not valid:
            return 401, "Unauthorized", {}
        if path == "/latest/meta-data/placement/region":
            return 200, self.region, {}
        if path == "/latest/meta-data/placement/availability-zone":
            return 200, self.region + "a", {}
        return 404, "Not Found", {}


class GcpMetadata(MetadataFake):
    """GCP: every request needs ``Metadata-Flavor: Google``; every answer carries it."""

    name = "gcp-metadata"

    def __init__(
        self,
        zone: str = "projects/123456789/zones/us-central1-a",
        *,
        flavor_header: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.zone = zone
        self.flavor_header = flavor_header  # False: something that is not GCP's server

    def answer(self, method: str, path: str, headers: object) -> Answer:
        flavor = {"Metadata-Flavor": "Google"} if self.flavor_header else {}
        if _header(headers, "X-Forwarded-For") is not None:
            return 403, "Forbidden", flavor
        if _header(headers, "Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", flavor
        if method != "GET":
            return 405, "Method Not Allowed", flavor
        if urlsplit(path).path == "/computeMetadata/v1/instance/zone":
            return 200, self.zone, flavor
        return 404, "Not Found", flavor


class AzureImds(MetadataFake):
    """Azure IMDS: needs ``Metadata: true`` and an api-version, answers text on format=text."""

    name = "azure-imds"

    def __init__(self, location: str = "westeurope", **kw: Any) -> None:
        super().__init__(**kw)
        self.location = location

    def answer(self, method: str, path: str, headers: object) -> Answer:
        if _header(headers, "X-Forwarded-For") is not None:
            return 400, '{"error": "Bad request. XForwardedFor header present"}', {}
        if _header(headers, "Metadata") != "true":
            return 400, '{"error": "Bad request. Required metadata header not specified"}', {}
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        if "api-version" not in query:
            return 400, '{"error": "Bad request. api-version was not specified"}', {}
        if method != "GET":
            return 405, "Method Not Allowed", {}
        if parts.path == "/metadata/instance/compute/location" and query.get("format") == ["text"]:
            return 200, self.location, {}
        return 404, "Not Found", {}


class SilentServer:
    """Accepts connections and never answers: a metadata service that hangs.

    Like the IMDSv2 token PUT from a container when the hop limit is 1. Counts the
    connections it accepted.
    """

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(16)
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-fake", daemon=True)
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        self._listener.settimeout(0.05)
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopping.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._listener.close()


class TrickleServer(SilentServer):
    """Answers one byte every ``interval`` seconds, forever: each read succeeds in time.

    A client with per-read timeouts waits on it for ever; only a deadline on the whole
    exchange ends the wait.
    """

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__()
        self.interval = interval
        self.sent = 0

    def _accept(self) -> None:
        self._listener.settimeout(0.05)
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nX-Padding: "
        try:
            conn.sendall(head)
            while not self._stopping.wait(self.interval):
                conn.sendall(b"a")
                self.sent += 1
        except OSError:
            return  # the client hung up: what a deadline does


def closed_port_url() -> str:
    """A loopback URL where nothing listens: connections are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    return f"http://{LOOPBACK}:{port}"


METADATA_URL_VARS = (
    "O41_ARTIFACTS_AWS_METADATA_URL",
    "O41_ARTIFACTS_GCP_METADATA_URL",
    "O41_ARTIFACTS_AZURE_METADATA_URL",
)
PLACE_VARS = ("O41_ARTIFACTS_CLOUD", "O41_ARTIFACTS_REGION", "SKYPILOT_CLUSTER_INFO")
_LOOPBACK_HOSTS = frozenset({LOOPBACK, "localhost", "::1"})


def isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Point every place input at loopback fixtures: no test can reach a real cloud.

    The DMI directory becomes an empty tmp dir, the three metadata URLs a closed loopback
    port, the place variables are cleared, and any connection to a non-loopback host is
    refused and recorded in the returned list (the caller asserts it stays empty).
    """
    dmi = tmp_path / "dmi"
    dmi.mkdir(exist_ok=True)
    monkeypatch.setenv("O41_ARTIFACTS_DMI_DIR", str(dmi))
    closed = closed_port_url()
    for var in METADATA_URL_VARS:
        monkeypatch.setenv(var, closed)
    for var in PLACE_VARS:
        monkeypatch.delenv(var, raising=False)

    escapes: list[str] = []
    real = socket.create_connection

    def loopback_only(address: tuple[str, int], *args: Any, **kw: Any) -> socket.socket:
        if address[0] not in _LOOPBACK_HOSTS:
            escapes.append(f"{address[0]}:{address[1]}")
            raise ConnectionRefusedError(f"test refused a connection to {address[0]}")
        return real(address, *args, **kw)

    monkeypatch.setattr(socket, "create_connection", loopback_only)
    return escapes


def write_dmi(directory: Path, **files: str) -> Path:
    """Write DMI strings as the kernel shows them (one line, newline-terminated)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (directory / name).write_text(value + "\n")
    return directory
