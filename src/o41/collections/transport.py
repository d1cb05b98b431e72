"""How the collection objects reach the service: two transports, one behaviour.

:class:`HttpTransport` talks to the placement service (standard library only, one
keep-alive connection per thread); :class:`EmbeddedTransport` runs the service's own engine
on the embedded store in a thread of this process (laptops, tests, demos). Refusals come
back as the exceptions below, whichever transport carried the call.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import threading
import time
import urllib.parse
from typing import Any, Protocol

from o41.collections import values

ENV_ENDPOINT = "O41_ARTIFACTS_ENDPOINT"
ENV_TOKEN_FILE = "O41_ARTIFACTS_TOKEN_FILE"  # noqa: S105 - a variable name
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 - a path
MAX_WAIT = 25.0  # seconds one waiting request may last; longer waits are several requests
HTTP_TIMEOUT = MAX_WAIT + 35.0
TOKEN_REFRESH = 60.0  # kubelet rotates projected tokens: read the file again this often
IDLE_CONNECTION = 30.0  # below the server's keep-alive (75 s): no reuse of a closed one

# operations that may be sent twice without harm (a stale keep-alive connection is retried)
_IDEMPOTENT = frozenset(
    {
        "get",
        "set",
        "setdefault",
        "contains",
        "len",
        "items",
        "keys",
        "clear",
        "add",
        "lookup",
        "register",
        "list",
        "reset",
        "wait",
        "acquire",
        "keepalive",
        "release",
    }
)
_NOT_IDEMPOTENT = {("counter", "add")}


class CollectionError(Exception):
    """A collection operation was refused or failed; the message says why and what to do."""

    status = 0


class InvalidRequest(CollectionError, ValueError):
    """A bad name, key or argument (HTTP 400)."""

    status = 400


ValueTooLarge = values.ValueTooLarge  # a value over the size limit (HTTP 413)


class Conflict(CollectionError, ValueError):
    """The request contradicts the collection (a barrier's parties; HTTP 409)."""

    status = 409


class NotAllowed(CollectionError, PermissionError):
    """The service did not accept this pod's token (HTTP 401/403)."""

    status = 401


class Unavailable(CollectionError, ConnectionError):
    """The collections cannot answer now: etcd lost its majority, or the service is down.

    A write that failed this way may or may not have been applied.
    """

    status = 503


def error_for(status: int, message: str) -> Exception:
    """The exception for an HTTP refusal of the service."""
    if status == 413:
        return ValueTooLarge(message)
    kinds: dict[int, type[CollectionError]] = {
        400: InvalidRequest,
        401: NotAllowed,
        403: NotAllowed,
        409: Conflict,
        503: Unavailable,
        504: Unavailable,
    }
    error = kinds.get(status, CollectionError)(message)
    error.status = status
    return error


class Transport(Protocol):
    def call(
        self, compute: str, kind: str, name: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]: ...


# over HTTP


class _Connection:
    """One keep-alive HTTP/1.1 connection, spoken directly on a socket.

    ``http.client`` spends about as long building and parsing messages as a loopback
    round trip takes; the service's answers are small JSON with a Content-Length, so a
    few lines do (chunked answers from a proxy are read too).
    """

    def __init__(self, host: str, port: int, https: bool, timeout: float) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if https:
            import ssl

            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.used_at = time.monotonic()
        self.fresh = True

    def dropped(self) -> bool:
        """The server closed this idle connection (readable before we asked: EOF)."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send ``request``; the answer's status, body and whether the connection stays."""
        self.fresh = False
        self.sock.sendall(request)
        line = self.reader.readline(65537)
        if not line:
            raise ConnectionResetError("the service closed the connection")
        status = int(line.split(None, 2)[1])
        length, chunked, keep = -1, False, True
        while True:
            header = self.reader.readline(65537)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = value.strip().lower() != b"close"
        if chunked:
            body = b""
            while size := int(self.reader.readline(65537).split(b";")[0], 16):
                body += self.reader.read(size)
                self.reader.readline(65537)
            while self.reader.readline(65537) not in (b"\r\n", b"\n", b""):
                pass  # trailers
        elif length >= 0:
            body = self.reader.read(length)
            if len(body) < length:
                raise ConnectionResetError("the service closed the connection mid-answer")
        else:
            body, keep = self.reader.read(), False
        self.used_at = time.monotonic()
        return status, body, keep

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class HttpTransport:
    """The placement service at ``endpoint``, authenticated by the pod's ServiceAccount
    token (``token``, or read from ``token_file``: by default ``$O41_ARTIFACTS_TOKEN_FILE``
    or the mounted ServiceAccount token). One connection per thread, kept alive."""

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        timeout: float = HTTP_TIMEOUT,
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {endpoint[:80]!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._base = parts.path.rstrip("/")
        self._hostport = parts.netloc.rpartition("@")[2]
        self._timeout = timeout
        self._token = token
        self._token_file = token_file or os.environ.get(ENV_TOKEN_FILE) or SA_TOKEN
        self._token_read = (0.0, "")
        self._local = threading.local()

    def _bearer(self) -> str:
        if self._token is not None:
            return self._token
        read_at, token = self._token_read
        if time.monotonic() - read_at > TOKEN_REFRESH:
            try:
                with open(self._token_file) as f:
                    token = f.read().strip()
            except OSError:
                token = ""
            self._token_read = (time.monotonic(), token)
        return token

    def _connection(self) -> _Connection:
        """This thread's connection; a new one if the last is gone or idle too long."""
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is not None and (
            time.monotonic() - conn.used_at > IDLE_CONNECTION or conn.dropped()
        ):
            conn.close()
            conn = None
        if conn is None:
            try:
                conn = _Connection(self._host, self._port, self._https, self._timeout)
            except OSError as e:
                raise Unavailable(
                    f"cannot reach the collections service at {self._hostport}: {e}"
                ) from None
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def call(
        self, compute: str, kind: str, name: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        if isinstance(args.get("value"), bytes):
            args = {**args, "value": base64.b64encode(args["value"]).decode()}
        body = json.dumps(args, separators=(",", ":")).encode()
        token = self._bearer()
        head = (
            f"POST {self._base}/v1/collections/{compute}/{kind}/{name}/{op} HTTP/1.1\r\n"
            f"Host: {self._hostport}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            + (f"Authorization: Bearer {token}\r\n" if token else "")
            + "\r\n"
        )
        request = head.encode() + body
        retry_safe = op in _IDEMPOTENT and (kind, op) not in _NOT_IDEMPOTENT
        for attempt in (1, 2):
            conn = self._connection()
            reused = not conn.fresh
            try:
                status, data, keep = conn.exchange(request)
            except (OSError, ValueError, IndexError) as e:
                conn.close()
                self._local.conn = None
                if attempt == 1 and reused and retry_safe:
                    continue  # a kept-alive connection that died: once more, afresh
                raise Unavailable(
                    f"the collections service at {self._hostport} did not answer "
                    f"({type(e).__name__}: {e})"
                    + ("" if retry_safe else "; the write may or may not have been applied")
                ) from None
            if not keep:
                conn.close()
                self._local.conn = None
            if status != 200:
                try:
                    message = json.loads(data)["error"]
                except (ValueError, KeyError, TypeError):
                    message = data[:200].decode(errors="replace") or f"HTTP {status}"
                raise error_for(status, message)
            result: dict[str, Any] = json.loads(data)
            if isinstance(result.get("value"), str):
                result["value"] = base64.b64decode(result["value"])
            if "items" in result:
                result["items"] = [(k, base64.b64decode(v)) for k, v in result["items"]]
            return result
        raise AssertionError("unreachable")


# in this process


class EmbeddedTransport:
    """The service's engine on the embedded single-replica store, in a thread of this
    process: the same operations and semantics, without a cluster. Everyone is
    ``namespace``; the collections live as long as the process."""

    def __init__(self, namespace: str = "default", **engine_options: Any) -> None:
        import asyncio

        from o41.collections.engine import Engine
        from o41.state.memory import MemoryStore

        self.namespace = namespace
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="o41-collections", daemon=True
        )
        self._thread.start()
        self.store = MemoryStore()
        self.engine = Engine(self.store, **engine_options)

    def call(
        self, compute: str, kind: str, name: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        import asyncio

        from o41.collections.checks import CollectionError as Refused
        from o41.state import StoreUnavailable

        future = asyncio.run_coroutine_threadsafe(
            self.engine.call(self.namespace, compute, kind, name, op, args), self._loop
        )
        try:
            return future.result()
        except Refused as e:
            raise error_for(e.status, str(e)) from None
        except StoreUnavailable as e:
            raise Unavailable(str(e)) from None

    def close(self) -> None:
        import asyncio

        async def stop() -> None:
            await self.engine.close()
            await self.store.close()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()
