"""The synchronous collection objects ``o41.sky`` hands out, and how they reach the service.

Two transports, one behaviour: :class:`HttpTransport` talks to the placement service
(standard library only, one keep-alive connection per thread), :class:`EmbeddedTransport`
runs the service's own engine on the embedded store in a thread of this process (laptops,
tests, demos). Keys are encoded and values serialized here, on the client; the service only
sees canonical key texts and opaque bytes.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
import select
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import ItemsView, Iterator, KeysView, MutableMapping, MutableSet, ValuesView
from types import TracebackType
from typing import Any, ClassVar, Literal, Protocol

from o41.collections import values
from o41.collections.keys import check_name, decode_key, encode_key

Consistency = Literal["strong", "eventual"]

ENV_ENDPOINT = "O41_ARTIFACTS_ENDPOINT"
ENV_TOKEN_FILE = "O41_ARTIFACTS_TOKEN_FILE"  # noqa: S105 - a variable name
ENV_COMPUTE = "O41_COMPUTE"
ENV_PODINFO = "O41_PODINFO_LABELS"
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 - a path
PODINFO_LABELS = "/etc/podinfo/labels"
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
        self, compute: str, kind: str, name: str, op: str, args: builtins.dict[str, Any]
    ) -> builtins.dict[str, Any]: ...


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
        self, compute: str, kind: str, name: str, op: str, args: builtins.dict[str, Any]
    ) -> builtins.dict[str, Any]:
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
            result: builtins.dict[str, Any] = json.loads(data)
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
        self, compute: str, kind: str, name: str, op: str, args: builtins.dict[str, Any]
    ) -> builtins.dict[str, Any]:
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


# the compute


def compute_from_environment(environ: Any = None, podinfo: str | None = None) -> str:
    """The compute this pod belongs to: the pods of one job share one.

    In order: ``$O41_COMPUTE``; the Job's name from a downward-API labels file
    (``$O41_PODINFO_LABELS``, default ``/etc/podinfo/labels``: the label
    ``batch.kubernetes.io/job-name``, or the older ``job-name``); in a Kubernetes pod, the
    Job's name from the pod's host name (``<job>-<index>`` for Indexed Jobs, whose pods have
    ``$JOB_COMPLETION_INDEX``; ``<job>-<5 random characters>`` otherwise); else ``local``.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_COMPUTE)
    if explicit:
        return check_name("compute", explicit)
    labels = _labels(podinfo or env.get(ENV_PODINFO) or PODINFO_LABELS)
    for label in ("batch.kubernetes.io/job-name", "job-name"):
        if labels.get(label):
            return check_name("compute", labels[label])
    host = env.get("HOSTNAME", "")
    if env.get("KUBERNETES_SERVICE_HOST") and "-" in host:
        job, _, suffix = host.rpartition("-")
        if env.get("JOB_COMPLETION_INDEX") is not None and suffix != env["JOB_COMPLETION_INDEX"]:
            job = job.rpartition("-")[0] or job  # <job>-<index>-<random>
        return check_name("compute", job)
    return "local"


def _labels(path: str) -> builtins.dict[str, str]:
    """A downward-API labels file: ``key="value"`` lines."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            try:
                found[key.strip()] = json.loads(value.strip())
            except ValueError:
                found[key.strip()] = value.strip().strip('"')
    return found


# the collections


class _Collection:
    kind: ClassVar[str]

    def __init__(self, client: Client, name: str, consistency: Consistency = "strong") -> None:
        if consistency not in ("strong", "eventual"):
            raise ValueError(f"consistency must be 'strong' or 'eventual', not {consistency!r}")
        self._client = client
        self.name = check_name(self.kind, name)
        self.consistency: Consistency = consistency

    def _call(self, op: str, **args: Any) -> builtins.dict[str, Any]:
        args["consistency"] = self.consistency
        return self._client.transport.call(self._client.compute, self.kind, self.name, op, args)

    def __repr__(self) -> str:
        return f"sky.{self.kind}({self.name!r}, consistency={self.consistency!r})"


_MISSING: Any = object()


class Dict(_Collection, MutableMapping[Any, Any]):
    """A dict shared by the compute. Iteration follows insertion order, as a dict's.

    ``keys()``, ``values()`` and ``items()`` are snapshots taken in one call.
    """

    kind = "dict"

    def __getitem__(self, key: Any) -> Any:
        found = self._call("get", key=encode_key(key))
        if not found["found"]:
            raise KeyError(key)
        return values.loads(found["value"])

    def get(self, key: Any, default: Any = None) -> Any:
        found = self._call("get", key=encode_key(key))
        return values.loads(found["value"]) if found["found"] else default

    def __setitem__(self, key: Any, value: Any) -> None:
        self._call("set", key=encode_key(key), value=values.dumps(value))

    def __delitem__(self, key: Any) -> None:
        if not self._call("delete", key=encode_key(key))["found"]:
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return bool(self._call("contains", key=encode_key(key))["found"])

    def __len__(self) -> int:
        return int(self._call("len")["len"])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._snapshot())

    def _snapshot(self) -> builtins.dict[Any, Any]:
        return {decode_key(k): values.loads(v) for k, v in self._call("items")["items"]}

    def keys(self) -> KeysView[Any]:
        return builtins.dict.fromkeys(decode_key(k) for k in self._call("keys")["keys"]).keys()

    def values(self) -> ValuesView[Any]:
        return self._snapshot().values()

    def items(self) -> ItemsView[Any, Any]:
        return self._snapshot().items()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        found = self._call("pop", key=encode_key(key))
        if found["found"]:
            return values.loads(found["value"])
        if default is _MISSING:
            raise KeyError(key)
        return default

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """Atomic: of many concurrent callers, one value wins and all get it."""
        found = self._call("setdefault", key=encode_key(key), value=values.dumps(default))
        return values.loads(found["value"])

    def clear(self) -> None:
        self._call("clear")


class Set(_Collection, MutableSet[Any]):
    """A set shared by the compute; members are keys (hashable, see the key encoding)."""

    kind = "set"

    def add(self, value: Any) -> None:
        self._call("add", key=encode_key(value))

    def remove(self, value: Any) -> None:
        if not self._call("remove", key=encode_key(value))["found"]:
            raise KeyError(value)

    def discard(self, value: Any) -> None:
        self._call("remove", key=encode_key(value))

    def __contains__(self, value: object) -> bool:
        return bool(self._call("contains", key=encode_key(value))["found"])

    def items(self) -> builtins.set[Any]:
        """The members, in one call."""
        return {decode_key(k) for k in self._call("items")["keys"]}

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items())

    def __len__(self) -> int:
        return int(self._call("len")["len"])

    def clear(self) -> None:
        self._call("clear")


class Counter(_Collection):
    """An integer shared by the compute; concurrent adds all count."""

    kind = "counter"

    def add(self, n: int = 1) -> int:
        """Add ``n`` (may be negative); the value just after this add."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"a counter adds integers, not {type(n).__name__}")
        return int(self._call("add", n=n)["value"])

    def get(self) -> int:
        return int(self._call("get")["value"])

    def reset(self) -> None:
        self._call("reset")

    def __int__(self) -> int:
        return self.get()


class Queue(_Collection):
    """A FIFO queue shared by the compute; each item is polled by exactly one caller."""

    kind = "queue"

    def offer(self, item: Any) -> None:
        """Append ``item``; never blocks (the queue is unbounded)."""
        self._call("offer", value=values.dumps(item))

    def poll(self) -> Any:
        """The head item, removed; ``None`` when the queue is empty (never blocks)."""
        found = self._call("poll")
        return values.loads(found["value"]) if found["found"] else None

    def __len__(self) -> int:
        return int(self._call("len")["len"])

    def clear(self) -> None:
        self._call("clear")


class Registry(_Collection):
    """A named place to leave objects for the other nodes to find."""

    kind = "registry"

    def register(self, name: Any, value: Any) -> None:
        """Leave ``value`` under ``name`` (replacing what was there)."""
        self._call("register", key=encode_key(name), value=values.dumps(value))

    def lookup(self, name: Any, default: Any = None) -> Any:
        """The value registered under ``name``; ``default`` when there is none."""
        found = self._call("lookup", key=encode_key(name))
        return values.loads(found["value"]) if found["found"] else default

    def unregister(self, name: Any) -> bool:
        """Remove ``name``; whether it was registered."""
        return bool(self._call("unregister", key=encode_key(name))["found"])

    def list(self) -> builtins.list[Any]:
        """The names on offer, in the order they were first registered."""
        return [decode_key(k) for k in self._call("list")["keys"]]

    def __contains__(self, name: object) -> bool:
        return bool(self._call("contains", key=encode_key(name))["found"])

    def __len__(self) -> int:
        return int(self._call("len")["len"])


class Barrier(_Collection):
    """``parties`` participants wait until all of them have arrived; then all go on, and
    the barrier is ready for the next round. Always strong."""

    kind = "barrier"

    def __init__(
        self, client: Client, name: str, parties: int, consistency: Consistency = "strong"
    ) -> None:
        super().__init__(client, name, consistency)
        if isinstance(parties, bool) or not isinstance(parties, int) or parties < 1:
            raise ValueError(f"parties must be a positive integer, not {parties!r}")
        self.parties = parties

    def wait(self, timeout: float | None = None) -> int:
        """Arrive and wait for the others; this participant's arrival index (0 ..
        parties-1). Past ``timeout`` seconds, :class:`TimeoutError`, and this participant
        has withdrawn (it will not count towards a later release)."""
        participant = _identity()
        deadline = None if timeout is None else time.monotonic() + timeout
        lease, generation = 0, -1
        while True:
            remaining = MAX_WAIT * 2 if deadline is None else max(0.0, deadline - time.monotonic())
            answer = self._call(
                "wait",
                parties=self.parties,
                participant=participant,
                timeout=min(remaining, MAX_WAIT),
                final=remaining <= MAX_WAIT,
                lease=lease,
                generation=generation,
            )
            if answer["released"]:
                return int(answer["index"])
            if answer.get("timed_out"):
                raise TimeoutError(
                    f"barrier {self.name!r}: {answer['arrived']} of the other "
                    f"{self.parties - 1} participants arrived within {timeout:g} s; this "
                    "participant withdrew"
                )
            lease, generation = int(answer["lease"]), int(answer["generation"])

    def __repr__(self) -> str:
        return f"sky.barrier({self.name!r}, {self.parties})"


class Lock(_Collection):
    """A lease on a name across the compute, as a context manager.

    Held while the block runs (the lease is kept alive from a thread), released when it
    exits; if the holder dies, the lease expires after ``ttl`` seconds and the next waiter
    gets the lock. ``token`` is a fencing token: each holder gets a larger one than the
    holders before it, so a resource can refuse writes from a holder that lost the lock.
    Always strong.
    """

    kind = "lock"

    def __init__(
        self,
        client: Client,
        name: str,
        ttl: int = 30,
        timeout: float | None = None,
        consistency: Consistency = "strong",
    ) -> None:
        super().__init__(client, name, consistency)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= 3600:
            raise ValueError(f"ttl must be whole seconds in [1, 3600], not {ttl!r}")
        self.ttl = ttl
        self.timeout = timeout
        self._token: int | None = None
        self._lease = 0
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self.lost = False

    @property
    def token(self) -> int:
        """The fencing token of the held lock (its key's etcd revision)."""
        if self._token is None:
            raise RuntimeError(f"lock {self.name!r} is not held")
        return self._token

    @property
    def held(self) -> bool:
        return self._token is not None and not self.lost

    def acquire(self, timeout: float | None = _MISSING) -> bool:
        """Take the lock, waiting up to ``timeout`` seconds (the lock's own by default;
        ``None``: as long as it takes); whether it was taken."""
        if self._token is not None:
            raise RuntimeError(f"lock {self.name!r} is already held by this object")
        timeout = self.timeout if timeout is _MISSING else timeout
        owner = _identity()
        deadline = None if timeout is None else time.monotonic() + timeout
        lease = 0
        while True:
            remaining = MAX_WAIT * 2 if deadline is None else max(0.0, deadline - time.monotonic())
            answer = self._call(
                "acquire",
                owner=owner,
                ttl=self.ttl,
                timeout=min(remaining, MAX_WAIT),
                final=remaining <= MAX_WAIT,
                lease=lease,
            )
            if answer["acquired"]:
                self._token, self._lease, self.lost = (
                    int(answer["token"]),
                    int(answer["lease"]),
                    False,
                )
                self._stop.clear()
                self._keeper = threading.Thread(
                    target=self._keep, name=f"o41-lock-{self.name}", daemon=True
                )
                self._keeper.start()
                return True
            if "lease" not in answer:
                return False
            lease = int(answer["lease"])

    def _keep(self) -> None:
        """Refresh the lease every third of its TTL while held."""
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self._call("keepalive", lease=self._lease)["alive"]:
                    self.lost = True
                    return
            except CollectionError:
                continue  # a blip: the next refresh may still make it in time

    def release(self) -> None:
        if self._token is None:
            raise RuntimeError(f"lock {self.name!r} is not held")
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()
        lease, self._token, self._lease = self._lease, None, 0
        self._call("release", lease=lease)

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise TimeoutError(f"lock {self.name!r} not acquired within {self.timeout:g} s")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"sky.lock({self.name!r}, ttl={self.ttl}, timeout={self.timeout})"


def _identity() -> str:
    """Unique per call, readable in etcd: host, process and a random part."""
    return f"{socket.gethostname()[:60]}/{os.getpid()}/{uuid.uuid4().hex}"


class Client:
    """The collections of one compute, through one transport."""

    def __init__(self, transport: Transport, compute: str = "local") -> None:
        self.transport = transport
        self.compute = check_name("compute", compute)

    @classmethod
    def from_environment(cls) -> Client:
        """The placement service at ``$O41_ARTIFACTS_ENDPOINT`` with the pod's token, for
        the compute of this pod; without that variable, collections embedded in this
        process."""
        endpoint = os.environ.get(ENV_ENDPOINT)
        transport: Transport = HttpTransport(endpoint) if endpoint else EmbeddedTransport()
        return cls(transport, compute_from_environment())

    def dict(self, name: str, consistency: Consistency = "strong") -> Dict:
        return Dict(self, name, consistency)

    def set(self, name: str, consistency: Consistency = "strong") -> Set:
        return Set(self, name, consistency)

    def counter(self, name: str, consistency: Consistency = "strong") -> Counter:
        return Counter(self, name, consistency)

    def queue(self, name: str, consistency: Consistency = "strong") -> Queue:
        return Queue(self, name, consistency)

    def registry(self, name: str, consistency: Consistency = "strong") -> Registry:
        return Registry(self, name, consistency)

    def barrier(self, name: str, parties: int, consistency: Consistency = "strong") -> Barrier:
        return Barrier(self, name, parties, consistency)

    def lock(
        self,
        name: str,
        ttl: int = 30,
        timeout: float | None = None,
        consistency: Consistency = "strong",
    ) -> Lock:
        return Lock(self, name, ttl, timeout, consistency)


__all__ = [
    "Barrier",
    "Client",
    "CollectionError",
    "Conflict",
    "Counter",
    "Dict",
    "EmbeddedTransport",
    "HttpTransport",
    "InvalidRequest",
    "Lock",
    "NotAllowed",
    "Queue",
    "Registry",
    "Set",
    "Unavailable",
    "ValueTooLarge",
]
