"""A forward proxy on loopback, as a pod's ``HTTPS_PROXY`` or ``HTTP_PROXY`` names one: it
tunnels ``CONNECT host:port`` (an ``https`` URL, or a WebSocket) and forwards a request in
absolute form (``GET http://host:port/path``, a plain ``http`` URL), and records each, so
that a test can tell what went through it and what did not (``NO_PROXY``).

The standard library only, a thread per connection; it forwards to loopback addresses
alone (what the test bed runs), and answers 403 to anything else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import socketserver
import threading
import urllib.parse
from types import TracebackType

from testbed.process import LOOPBACK, free_port

__all__ = ["ForwardProxy"]


class ForwardProxy:
    """``http://127.0.0.1:<port>``: ``tunnels`` lists each CONNECT's ``host:port``,
    ``forwarded`` each absolute-form request's ``METHOD URL``, ``authorizations`` each
    ``Proxy-Authorization`` header it was sent."""

    def __init__(self) -> None:
        self.port = free_port()
        self.tunnels: list[str] = []
        self.forwarded: list[str] = []
        self.authorizations: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((LOOPBACK, self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> ForwardProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> ForwardProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(60)
        reader = client.makefile("rb")
        line = reader.readline(65537).decode("latin-1").strip()
        headers: list[tuple[str, str]] = []
        while (header := reader.readline(65537)) not in (b"\r\n", b"\n", b""):
            name, _, value = header.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        parts = line.split()
        if len(parts) != 3:
            return
        method, target, version = parts
        for name, value in headers:
            if name.lower() == "proxy-authorization":
                with self._lock:
                    self.authorizations.append(value)
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            with self._lock:
                self.tunnels.append(target)
            upstream = self._dial(client, host.strip("[]"), int(port))
            if upstream is None:
                return
            client.sendall(f"{version} 200 Connection established\r\n\r\n".encode())
            self._pipe(client, upstream)  # nothing comes before the 200: no bytes buffered
            return
        url = urllib.parse.urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        with self._lock:
            self.forwarded.append(f"{method} {target}")
        upstream = self._dial(client, url.hostname, url.port or 80)
        if upstream is None:
            return
        length = 0
        kept = []
        for name, value in headers:
            lower = name.lower()
            if lower == "content-length":
                length = int(value)
            if lower in ("proxy-authorization", "proxy-connection", "connection", "keep-alive"):
                continue
            kept.append(f"{name}: {value}")
        path = url.path or "/"
        if url.query:
            path += f"?{url.query}"
        head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close"])
        upstream.sendall(head.encode("latin-1") + b"\r\n\r\n")
        left = length
        while left > 0:
            chunk = reader.read(min(left, 1 << 20))
            if not chunk:
                break
            upstream.sendall(chunk)
            left -= len(chunk)
        self._answer(client, upstream)

    def _dial(self, client: socket.socket, host: str, port: int) -> socket.socket | None:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:  # the test bed's traffic stays on this machine
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return None
        try:
            return socket.create_connection((host, port), timeout=60)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return None

    @staticmethod
    def _answer(client: socket.socket, upstream: socket.socket) -> None:
        """The origin's answer, its head saying ``Connection: close`` (this proxy closes
        after each answer), then its body as it comes until the origin closes."""
        with upstream:
            reader = upstream.makefile("rb")
            status = reader.readline(65537)
            lines = [status]
            while (header := reader.readline(65537)) not in (b"\r\n", b"\n", b""):
                if header.split(b":", 1)[0].strip().lower() not in (b"connection", b"keep-alive"):
                    lines.append(header)
            lines.append(b"Connection: close\r\n\r\n")
            client.sendall(b"".join(lines))
            while chunk := reader.read1(1 << 20):
                client.sendall(chunk)

    @staticmethod
    def _pipe(client: socket.socket, upstream: socket.socket) -> None:
        """Bytes both ways until either side closes."""
        with upstream:
            sockets = [client, upstream]
            while True:
                readable, _, _ = select.select(sockets, [], [], 60)
                if not readable:
                    return
                for sock in readable:
                    with contextlib.suppress(OSError):
                        data = sock.recv(1 << 16)
                        if data:
                            (upstream if sock is client else client).sendall(data)
                            continue
                    return
