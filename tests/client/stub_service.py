"""A stand-in for the placement service that answers what a test scripts, on loopback, and
records what it was asked: what the client does when the service blinks (a 503 with
``Retry-After``, a 400, a connection closed after the request came, no answer at all) is
tested against it with the real client and the real ``o41`` command.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from testbed.process import LOOPBACK, free_port

CLOSE = "close"  # the request came; the connection closes without an answer
HANG = "hang"  # the request came; no answer, ever (until the stub stops)


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering


Script = Callable[[str, str, Any], "Answer | str"]


class StubService:
    """``script(method, path, body)`` says each answer: an :class:`Answer`, :data:`CLOSE`
    or :data:`HANG`. ``requests`` lists each ``(method, path)`` asked; ``https`` with a
    ``(certificate, key)`` pair serves TLS."""

    def __init__(
        self, script: Script, *, port: int | None = None, https: tuple[str, str] | None = None
    ) -> None:
        self.script = script
        self.port = port or free_port()
        self.requests: list[tuple[str, str]] = []
        self._stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                stub.requests.append((self.command, self.path))
                answer = stub.script(self.command, self.path, body)
                if answer == CLOSE:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if answer == HANG:
                    stub._stop.wait(120)
                    self.close_connection = True
                    return
                assert isinstance(answer, Answer)
                time.sleep(answer.delay)
                data = json.dumps(answer.body).encode()
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((LOOPBACK, self.port), Handler)
        self.scheme = "http"
        if https is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*https)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{LOOPBACK}:{self.port}"

    def asked(self, path: str) -> int:
        """How many requests came for ``path`` (without its query)."""
        return sum(1 for _, p in self.requests if p.partition("?")[0] == path)

    def start(self) -> StubService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> StubService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def page(version: str = "0193a1f0aa01-5d1c0e2b9a7f4c3e") -> dict[str, Any]:
    """A page of versions, as the service answers it."""
    return {
        "versions": [
            {
                "version": version,
                "committed": 1_700_000_000.0,
                "size": 7,
                "location": "aws-east",
                "writer": {"cloud": "aws", "region": "us-east-1", "source": "env"},
                "metadata": {},
            }
        ],
        "next": None,
    }
