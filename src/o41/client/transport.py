"""How the collection objects reach the service: two transports, one behaviour.

:class:`HttpTransport` talks to the placement service (the standard library, one
keep-alive connection per thread, a WebSocket when the service takes it);
:class:`EmbeddedTransport` runs the service's own engine
on the embedded store in a thread of this process (laptops, tests, demos). Refusals come
back as the client's one hierarchy (``o41.client.errors``, the same classes the artifacts
calls raise), whichever transport carried the call; the HTTP transport reaches the
service through an ``o41.client.connection.Connection`` (its endpoint, token, TLS, proxy,
timeouts and retry deadline): an operation the service could not answer is sent again as
``o41.client.backoff`` says (one that is not idempotent only when it provably was not
run), and so is the WebSocket's reconnect.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import select
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from typing import Any, Protocol

from o41.client import backoff
from o41.client.backoff import Retries, operation_id
from o41.client.connection import Connection, connection_of
from o41.client.errors import (
    CollectionError,
    Conflict,
    ConnectError,
    InvalidRequest,
    LimitReached,
    NotAllowed,
    ServiceError,
    TransportError,
    Unavailable,
    ValueTooLarge,
    retry_after_seconds,
    service_error,
)
from o41.collections import wire

_log = logging.getLogger(__name__)

MAX_WAIT = 25.0  # seconds one waiting request may last; longer waits are several requests
HTTP_TIMEOUT = MAX_WAIT + 35.0  # the longest a waiting request's answer takes, by default
# operations that wait on the service: their ``timeout`` argument is added to the read timeout
_WAITING = frozenset({"wait", "acquire"})
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


def idempotent(kind: str, op: str) -> bool:
    """Whether an operation may be sent twice without harm (then it is retried whatever
    happened to its first sending; any other only when it provably was not run)."""
    return op in _IDEMPOTENT and (kind, op) not in _NOT_IDEMPOTENT


__all__ = [  # and the errors (o41.client.errors) by the names the collections gave them
    "CollectionError",
    "Conflict",
    "EmbeddedTransport",
    "HttpTransport",
    "InvalidRequest",
    "LimitReached",
    "NotAllowed",
    "Transport",
    "TransportError",
    "Unavailable",
    "ValueTooLarge",
]


class Transport(Protocol):
    def call(
        self,
        compute: str,
        kind: str,
        name: str,
        op: str,
        args: dict[str, Any],
        *,
        deadline: float | None = None,
    ) -> dict[str, Any]: ...


# over HTTP

WS_PATH = "/v1/collections"
RECONNECT = 4000  # the service's close code: the operation in flight was not run
PROTOCOL = wire.PROTOCOL.encode()  # a service that takes quiet messages chooses it
_SYNC = b"o41: answers so far"  # a ping's payload: its pong comes after every answer before
CONFIRM_WITHIN = 5.0  # seconds closing waits for that pong
CLOSE_DEADLINE = 5.0  # seconds closing retries what it still has to send
_Sent = tuple[str, str, str, str, dict[str, Any]]  # compute, kind, name, op, args
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455's
_TEXT, _CLOSE, _PING, _PONG = 0x1, 0x8, 0x9, 0xA


class _Unsent(Exception):
    """``error`` ended an operation before it was sent (the connection or its WebSocket
    upgrade was refused): sending it again is safe, whatever the operation."""

    def __init__(self, error: CollectionError) -> None:
        super().__init__(str(error))
        self.error = error


class _Closed(Exception):
    """The service closed the WebSocket in place of an answer (``code``: why)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"closed by the service ({code} {reason})".strip())
        self.code = code


class _Socket:
    """One keep-alive HTTP/1.1 connection, spoken directly on a socket, which may be
    upgraded to a WebSocket (RFC 6455, client side: masked frames out, none compressed).

    ``http.client`` spends about as long building and parsing messages as a loopback
    round trip takes; the service's answers are small JSON with a Content-Length, so a
    few lines do (chunked answers from a proxy are read too).
    """

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext | None,
        timeout: float,
        connect_timeout: float | None = None,
        proxy: Any = None,
    ) -> None:
        """``context``: TLS with it (``o41.client.tls.service_context``); None: plain.
        ``connect_timeout``: for the connection, a proxy's tunnel and the TLS handshake
        (default ``timeout``), then ``timeout`` for each answer. ``proxy``: through it
        (``o41.client.transfers.Proxy``), in a CONNECT tunnel, ``http`` too: a WebSocket
        goes through a proxy no other way."""
        limit = timeout if connect_timeout is None else connect_timeout
        sock = socket.create_connection(
            (host, port) if proxy is None else proxy.address, timeout=limit
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if proxy is not None:
                _tunnel(sock, host, port, proxy.headers)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(timeout)
        self.sock = sock
        self.timeout = timeout
        self.retry_after: bytes | None = None  # the last refusal's Retry-After header
        self.reader = sock.makefile("rb")
        self.used_at = time.monotonic()
        self.fresh = True
        self.websocket = False
        self.quiet = False  # the service answers a quiet message only when it refuses it
        self.token = ""  # the token the service knows this WebSocket by (renewed in band)
        # operations sent without waiting for their answers, which come first (in order)
        self.deferred: list[_Sent] = []
        # quiet operations sent since the last answer, by id: answered only if refused
        self.unconfirmed: dict[str, _Sent] = {}
        self.sent = 0  # quiet messages sent: their ids

    def dropped(self) -> bool:
        """The server closed this idle connection (readable before we asked: EOF, or a
        WebSocket's close)."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send ``request``; the answer's status, body and whether the connection stays."""
        self.fresh = False
        self.sock.sendall(request)
        status, headers = self._head()
        self.retry_after = headers.get(b"retry-after")
        body, keep = self._body(headers)
        self.used_at = time.monotonic()
        return status, body, keep

    def _head(self) -> tuple[int, dict[bytes, bytes]]:
        line = self.reader.readline(65537)
        if not line:
            raise ConnectionResetError("the service closed the connection")
        status = int(line.split(None, 2)[1])
        headers: dict[bytes, bytes] = {}
        while True:
            header = self.reader.readline(65537)
            if header in (b"\r\n", b"\n", b""):
                return status, headers
            name, _, value = header.partition(b":")
            headers[name.strip().lower()] = value.strip()

    def _body(self, headers: dict[bytes, bytes]) -> tuple[bytes, bool]:
        keep = headers.get(b"connection", b"").lower() != b"close"
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            body = b""
            while size := int(self.reader.readline(65537).split(b";")[0], 16):
                body += self.reader.read(size)
                self.reader.readline(65537)
            while self.reader.readline(65537) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return body, keep
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            body = self.reader.read(length)
            if len(body) < length:
                raise ConnectionResetError("the service closed the connection mid-answer")
            return body, keep
        return self.reader.read(), False

    # WebSocket

    def upgrade(self, head: str) -> tuple[int, bytes]:
        """Ask to speak WebSocket (``head``: the request line and headers, without the
        upgrade's); 101 and no body when the service agreed, else its refusal."""
        key = base64.b64encode(os.urandom(16))
        self.sock.sendall(
            head.encode() + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: " + PROTOCOL + b"\r\n"
            b"Sec-WebSocket-Key: " + key + b"\r\n\r\n"
        )
        status, headers = self._head()
        if status != 101:
            self.retry_after = headers.get(b"retry-after")
            return status, self._body(headers)[0]
        accept = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())  # noqa: S324 - RFC 6455
        if headers.get(b"sec-websocket-accept") != accept:
            raise ConnectionResetError("the WebSocket handshake's answer does not match")
        self.websocket = True
        self.quiet = headers.get(b"sec-websocket-protocol") == PROTOCOL
        return status, b""

    def send(self, payload: bytes, opcode: int = _TEXT) -> None:
        """One whole message, in one frame, masked as a client's must be."""
        self.fresh = False
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0xFE, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0xFF, n)
        mask = os.urandom(4)
        pad = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(pad, "big")).to_bytes(n, "big")
        self.sock.sendall(head + mask + masked)

    def receive(self, pong: bytes | None = None) -> bytes:
        """The next data message (pings answered on the way); :class:`_Closed` if the
        service closed the WebSocket instead. ``pong``: or b"" once a pong of that payload
        came."""
        parts: list[bytes] = []
        while True:
            first, second = self._exactly(2)
            if second & 0x80:
                raise ConnectionResetError("the service sent a masked WebSocket frame")
            n = second & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._exactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._exactly(8))
            data = self._exactly(n)
            opcode = first & 0x0F
            if opcode == _CLOSE:
                code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1005
                raise _Closed(code, data[2:].decode(errors="replace"))
            if opcode == _PING:
                self.send(data, _PONG)
            elif opcode == _PONG:
                if pong is not None and data == pong and not parts:
                    return b""
            else:
                parts.append(data)
                if first & 0x80:  # the message's last frame
                    self.used_at = time.monotonic()
                    return b"".join(parts)

    def _exactly(self, n: int) -> bytes:
        data = self.reader.read(n)
        if len(data) < n:
            raise ConnectionResetError("the service closed the connection mid-answer")
        return data

    def close(self) -> None:
        if self.websocket:
            with contextlib.suppress(OSError):
                self.send(struct.pack("!H", 1000), _CLOSE)
        self.reader.close()
        self.sock.close()


def _tunnel(sock: socket.socket, host: str, port: int, headers: dict[str, str]) -> None:
    """Ask the proxy at the other end of ``sock`` for a tunnel to ``host:port`` (CONNECT,
    RFC 9110 9.3.6); an :class:`OSError` saying the proxy's answer when it refused."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:  # nothing follows the answer's head before we speak
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionResetError("the proxy closed the connection instead of a tunnel")
        head += chunk
        if len(head) > 65536:
            raise ConnectionResetError("the proxy's answer to CONNECT has no end")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[1].startswith("2"):
        raise ConnectionRefusedError(f"the proxy refused a tunnel to {authority}: {status_line}")


class HttpTransport:
    """The placement service that ``connection`` reaches (or one made of ``endpoint``,
    ``token``, ``token_file`` and ``ca_file``: :class:`~o41.client.connection.Connection`
    says each, and what it reads from the environment), authenticated by its token: the
    pod's ServiceAccount token by default, read again every ``TOKEN_REFRESH`` seconds.
    One connection per thread, kept alive, upgraded to a WebSocket (``websocket=True``,
    unless the service or a proxy on the way refuses: then one POST per operation).
    ``timeout``: seconds to wait for an answer (default: the connection's; a waiting
    request's wait, up to ``MAX_WAIT``, comes on top). Connected within the connection's
    ``connect_timeout``, through the proxy the environment names; an operation the service
    could not answer is sent again within the connection's ``retry_deadline``."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        timeout: float | None = None,
        websocket: bool = True,
        ca_file: str | None = None,
        connection: Connection | None = None,
    ) -> None:
        self.connection = connection_of(
            connection, endpoint=endpoint, token=token, token_file=token_file, ca_file=ca_file
        )
        parts = urllib.parse.urlsplit(self.connection.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {self.connection.url[:80]!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._base = parts.path.rstrip("/")
        self._hostport = parts.netloc.rpartition("@")[2]
        self._timeout = self.connection.timeout if timeout is None else timeout
        self._local = threading.local()
        self.websocket = websocket  # turned off for good if the service refuses to upgrade

    def _bearer(self) -> str:
        return self.connection.bearer(TOKEN_REFRESH)

    def _head(self, method: str, path: str, token: str | None = None) -> str:
        token = self._bearer() if token is None else token
        return f"{method} {self._base}{path} HTTP/1.1\r\nHost: {self._hostport}\r\n" + (
            f"Authorization: Bearer {token}\r\n" if token else ""
        )

    def _connection(self) -> _Socket:
        """This thread's connection; a new one if the last is gone or idle too long."""
        conn: _Socket | None = getattr(self._local, "conn", None)
        if conn is not None and (
            time.monotonic() - conn.used_at > IDLE_CONNECTION
            or (not conn.deferred and not conn.unconfirmed and conn.dropped())  # else answers
        ):
            self._drop(conn)
            conn = None
        if conn is None:
            conn = self._open()
            if self.websocket and not self._upgraded(conn):
                conn = self._open()  # refused: POST from now on, on a fresh connection
            self._local.conn = conn
        return conn

    def _open(self) -> _Socket:
        from o41.client.transfers import proxy_for

        context = self.connection.tls()  # a CA file that cannot be used: CaFileError
        proxy = proxy_for(urllib.parse.urlsplit(self.connection.url))
        try:
            return _Socket(
                self._host,
                self._port,
                context,
                self._timeout,
                self.connection.connect_timeout,
                proxy,
            )
        except OSError as e:
            shown = f"{'https' if self._https else 'http'}://{self._hostport}"
            raise self.connection.unreached(e, shown) from None

    def _upgraded(self, conn: _Socket) -> bool:
        """Whether the service took the WebSocket; if not because it does not speak it
        here (an older service, a proxy that does not pass WebSockets), POST from now on."""
        token = self._bearer()
        try:
            status, body = conn.upgrade(self._head("GET", WS_PATH, token))
        except (OSError, ValueError, IndexError) as e:
            conn.close()
            raise ConnectError(  # the operation was not sent: safe to send again
                f"the collections service at {self._hostport} did not answer the WebSocket's "
                f"upgrade ({type(e).__name__}: {e})"
            ) from None
        if status == 101:
            conn.token = token
            return True
        conn.close()
        if status in (401, 403) or status >= 500:
            raise _Unsent(_refusal(status, _answer_of(status, body, conn.retry_after)))
        self.websocket = False
        return False

    def _exchange(
        self,
        conn: _Socket,
        compute: str,
        kind: str,
        name: str,
        op: str,
        args: dict[str, Any],
        operation: str | None = None,
    ) -> tuple[int, Any, dict[str, Any]]:
        """One operation on ``conn``: the status, and the result (200) or the refusal's
        answer (its ``error``, and what else the service said). ``operation``: its id, sent
        among its arguments (the service answers a repeat with the first answer)."""
        if operation is not None:  # the service keeps its first answer under it
            args = {**args, backoff.OPERATION_FIELD: operation}
        if conn.websocket:
            self._renew(conn)
            message = {"compute": compute, "kind": kind, "name": name, "op": op, "args": args}
            conn.send(wire.dumps(message))
            self._settle(conn)
            answer = self._answer(conn)
            if not isinstance(answer, dict):
                raise ValueError("the answer is not a JSON object")
            status = answer.get("status", 0)
            if status != 200:
                return status, None, {**answer, "error": answer.get("error") or f"status {status}"}
            return status, answer.get("result"), {}
        body = json.dumps(args, separators=(",", ":")).encode()
        head = self._head("POST", f"/v1/collections/{compute}/{kind}/{name}/{op}")
        status, data, keep = conn.exchange(
            head.encode()
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        if not keep:
            self._drop(conn)
        if status != 200:
            return status, None, _answer_of(status, data, conn.retry_after)
        return status, json.loads(data), {}

    def _renew(self, conn: _Socket) -> None:
        """The token file changed (the kubelet rotated it): hand the new token to the
        service in band, so this WebSocket outlives the token it began with. A service
        that does not take it (an older one answers 400) gets a new connection instead."""
        token = self._bearer()
        if not token or token == conn.token:
            return
        self._settle(conn)
        conn.send(wire.dumps({"id": "auth", "auth": token}))
        answer = self._answer(conn)
        status = answer.get("status") if isinstance(answer, dict) else None
        if status == 200:
            conn.token = token
            return
        if status == 400:  # an older service: a new connection's upgrade carries it
            raise _Closed(RECONNECT, "the service takes a new token only at the upgrade")
        self._drop(conn)
        message = answer.get("error") if isinstance(answer, dict) else None
        raise _refusal(401, {"error": str(message or "the new token was not accepted")})

    def _answer(self, conn: _Socket) -> Any:
        """The answer to the operation just sent: refusals of quiet operations sent before
        it come first (by their ids; each is sent again, waiting, after this one), and
        those not refused by then were taken (answers come in order)."""
        while True:
            answer = wire.loads(conn.receive())
            if not self._refused(conn, answer):
                conn.unconfirmed.clear()
                return answer

    def _confirm(self, conn: _Socket) -> None:
        """Learn which quiet operations were refused without sending one: a ping, whose
        pong the service sends after the answers to every message before it."""
        if not conn.unconfirmed:
            return
        conn.sock.settimeout(CONFIRM_WITHIN)  # else they are sent again, waiting
        conn.send(_SYNC, _PING)
        while message := conn.receive(pong=_SYNC):
            self._refused(conn, wire.loads(message))
        conn.unconfirmed.clear()

    def _refused(self, conn: _Socket, answer: Any) -> bool:
        """Whether ``answer`` refuses a quiet operation sent on ``conn`` (found by its id);
        if so, that operation is sent again, waiting, after the one at hand."""
        ident = answer.get("id") if conn.unconfirmed and isinstance(answer, dict) else None
        refused = conn.unconfirmed.pop(ident, None) if isinstance(ident, str) else None
        if refused is not None:
            self._redo().append(refused)
        return refused is not None

    def _settle(self, conn: _Socket) -> None:
        """Read the answers of the operations sent without waiting (they come before the
        next one's); one refused is sent again, waiting, after the operation at hand."""
        while conn.deferred:
            answer = wire.loads(conn.receive())
            sent = conn.deferred.pop(0)
            if not isinstance(answer, dict) or answer.get("status") != 200:
                self._redo().append(sent)

    def _redo(self) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        redo: list[tuple[str, str, str, str, dict[str, Any]]] | None = getattr(
            self._local, "redo", None
        )
        if redo is None:
            redo = self._local.redo = []
        return redo

    def _send_again(self, deadline: float | None = None) -> None:
        """The operations sent without waiting that were refused or whose answer was lost
        with the connection: sent again, waiting for the answer (they are idempotent),
        retried within ``deadline`` (default: the connection's)."""
        redo = self._redo()
        while redo:
            compute, kind, name, op, args = redo.pop(0)
            args = {k: v for k, v in args.items() if k != "early"}  # answered after etcd now
            try:
                self.call(compute, kind, name, op, args, deadline=deadline)
            except CollectionError as e:
                _log.warning("%s %s of %s/%s failed again: %s", kind, op, compute, name, e)

    def send_later(self, compute: str, kind: str, name: str, op: str, args: dict[str, Any]) -> None:
        """Send an idempotent operation without waiting for its answer (a lock's early
        release): sent quiet where the service takes it (answered only if refused), else
        its answer is read before the next operation's on this thread's connection; it is
        sent again, waiting, if it was refused or the connection went before the next
        answer. Over HTTP POSTs: :meth:`call`."""
        conn = self._connection()
        if not conn.websocket:
            self.call(compute, kind, name, op, args)
            return
        message: dict[str, Any] = {
            "compute": compute,
            "kind": kind,
            "name": name,
            "op": op,
            "args": args,
        }
        ident = ""
        if conn.quiet:  # answered only if refused: no answer to wake this thread for
            conn.sent += 1
            ident = f"q{conn.sent}"
            message.update(id=ident, quiet=True)
        try:
            conn.send(wire.dumps(message))
        except OSError:
            self._drop(conn)
            self.call(compute, kind, name, op, args)
            return
        if conn.quiet:
            conn.unconfirmed[ident] = (compute, kind, name, op, args)
        else:
            conn.deferred.append((compute, kind, name, op, args))

    def _drop(self, conn: _Socket) -> None:
        # their answers are lost: send them again
        self._redo().extend([*conn.deferred, *conn.unconfirmed.values()])
        conn.deferred.clear()
        conn.unconfirmed.clear()
        conn.close()
        self._local.conn = None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            with contextlib.suppress(OSError, ValueError, IndexError, _Closed):
                self._settle(conn)
                self._confirm(conn)
            self._drop(conn)
            if self._redo():
                with contextlib.suppress(CollectionError):
                    # no waiting at close for a service that is gone: an early release
                    # lost here ends with its lease's TTL
                    self._send_again(deadline=CLOSE_DEADLINE)
                conn = getattr(self._local, "conn", None)
                if conn is not None:
                    conn.close()
                    self._local.conn = None

    def call(
        self,
        compute: str,
        kind: str,
        name: str,
        op: str,
        args: dict[str, Any],
        *,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """One operation; sent again while the service cannot answer, within ``deadline``
        seconds (by default, and at most, the connection's ``retry_deadline``), as
        ``o41.client.backoff`` says: one that is not :func:`idempotent` only when it
        provably was not run."""
        if isinstance(args.get("value"), bytes):
            args = {**args, "value": base64.b64encode(args["value"]).decode()}
        safe = idempotent(kind, op)
        operation = None if safe else operation_id()
        wait = float(args.get("timeout") or 0.0) if op in _WAITING else 0.0
        retries = Retries(
            self.connection.retry_deadline
            if deadline is None
            else min(deadline, self.connection.retry_deadline),
            f"{kind} {op} of {compute}/{name}",
        )
        while True:
            try:
                return self._call(compute, kind, name, op, args, safe, wait, operation)
            except _Unsent as unsent:
                error, again = unsent.error, retries.again(unsent.error, True)
            except CollectionError as e:
                error, again = e, retries.again(e, safe or self.connection.operation_ids)
            if not again:
                raise error from None

    def _call(
        self,
        compute: str,
        kind: str,
        name: str,
        op: str,
        args: dict[str, Any],
        retry_safe: bool,
        wait: float,
        operation: str | None,
    ) -> dict[str, Any]:
        """One attempt of :meth:`call` (a kept-alive connection found closed, or a WebSocket
        the service closed before running the operation, is tried again at once)."""
        sent = operation if self.connection.operation_ids else None
        for attempt in range(3):
            try:
                conn = self._connection()
            except ConnectError:
                raise  # not sent, and said so
            except CollectionError as e:
                raise _Unsent(e) from None  # a refused upgrade: the operation was not sent
            reused = not conn.fresh
            try:
                conn.sock.settimeout(conn.timeout + wait)  # a waiting request's wait on top
                status, result, refused = self._exchange(conn, compute, kind, name, op, args, sent)
            except CollectionError:
                raise  # a refusal (a new token not accepted): said as it is
            except _Closed as e:
                self._drop(conn)
                if e.code == 1009:
                    raise _refusal(
                        400,
                        {
                            "error": "the operation is over the service's message size "
                            "limit: send smaller values"
                        },
                    ) from None
                if e.code == RECONNECT:
                    self.connection.forget_token()  # perhaps for a new token: read it again
                    continue  # not run: send it again, afresh
                failure: Exception = e
            except (OSError, ValueError, IndexError) as e:
                self._drop(conn)
                failure = e
            else:
                if conn.sock.fileno() >= 0:
                    conn.sock.settimeout(conn.timeout)
                if self._redo():
                    self._send_again()
                if status != 200:
                    raise _refusal(status, refused)
                return _decoded(result)
            if self._redo():
                with contextlib.suppress(CollectionError):
                    self._send_again()
            if attempt == 0 and reused and retry_safe:
                continue  # a kept-alive connection that died: once more, afresh
            if isinstance(failure, TimeoutError):
                why = f"no answer within {conn.timeout + wait:g} s"
            else:
                why = f"{type(failure).__name__}: {failure}"
            raise TransportError(
                f"the collections service at {self._hostport} did not answer ({why})"
                + ("" if retry_safe else "; the operation may or may not have been applied")
            ) from None
        raise ConnectError(  # the service closed it each time before running it
            f"the collections service at {self._hostport} kept closing the connection "
            "(restarting?) before running the operation"
        )


def _answer_of(status: int, body: bytes, retry_after: bytes | None = None) -> dict[str, Any]:
    """A refusal's JSON answer: its ``error`` (else the start of the body as the error)
    and what else it said; ``retry_after``: its ``Retry-After`` header, as the
    WebSocket's answers say it (``retry_after``, in seconds)."""
    found: dict[str, Any] = {"error": body[:200].decode(errors="replace") or f"HTTP {status}"}
    try:
        answer = json.loads(body)
        if isinstance(answer, dict) and "error" in answer:
            found = {**answer, "error": str(answer["error"])}
    except ValueError:
        pass
    if retry_after is not None and "retry_after" not in found:
        seconds = retry_after_seconds(retry_after.decode(errors="replace"))
        if seconds is not None:
            found["retry_after"] = seconds
    return found


def _refusal(status: int, answer: dict[str, Any]) -> ServiceError:
    """The client's error (``o41.client.errors``, the one map from a status) of a refusal
    ``answer`` with ``status``."""
    return service_error(status, str(answer.get("error") or f"HTTP {status}"), answer)


def _decoded(result: dict[str, Any]) -> dict[str, Any]:
    """An answer with its values as bytes again."""
    if isinstance(result.get("value"), str):
        result["value"] = base64.b64decode(result["value"])
    if "items" in result:
        result["items"] = [(k, base64.b64decode(v)) for k, v in result["items"]]
    return result


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
        self,
        compute: str,
        kind: str,
        name: str,
        op: str,
        args: dict[str, Any],
        *,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """One operation, in this process (``deadline``: taken, and unused: nothing here
        blinks)."""
        import asyncio

        from o41.collections.checks import CollectionError as Refused
        from o41.state.base import StoreUnavailable

        future = asyncio.run_coroutine_threadsafe(
            self.engine.call(self.namespace, compute, kind, name, op, args), self._loop
        )
        try:
            return future.result()
        except Refused as e:  # the engine's refusals, as the service would answer them
            raise _refusal(e.status, {"error": str(e)}) from None
        except StoreUnavailable as e:
            raise _refusal(503, {"error": str(e)}) from None

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
