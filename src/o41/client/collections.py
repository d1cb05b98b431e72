"""The synchronous collection objects ``o41.sky`` hands out.

They reach the service through a transport (:mod:`o41.client.transport`): over HTTP, the
:class:`~o41.client.connection.Connection` the artifacts client uses too
(:meth:`Client.over`). Keys are encoded and values serialized here, on the client; the
service only sees canonical key texts and opaque bytes. A value over the size limit is
refused before it is sent, with the error the service's 413 is (``ValueTooLarge``).
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import ItemsView, Iterator, KeysView, MutableMapping, MutableSet, ValuesView
from types import TracebackType
from typing import Any, ClassVar, Literal

from o41.client.connection import Connection
from o41.client.endpoints import collections_route
from o41.client.errors import (
    CollectionError,
    Conflict,
    InvalidRequest,
    LimitReached,
    NotAllowed,
    NotFound,
    TransportError,
    Unavailable,
    ValueTooLarge,
)
from o41.client.transport import MAX_WAIT, EmbeddedTransport, HttpTransport, Transport
from o41.collections import values
from o41.collections.keys import check_name, decode_key, encode_key

log = logging.getLogger(__name__)

NO_NONE = (
    "a queue does not take None: poll() answers None for an empty queue, so a None item "
    'could not be told from no item; offer a value of its own (a sentinel such as "" or 0)'
)

Consistency = Literal["strong", "eventual"]
ENV_COMPUTE = "O41_COMPUTE"
ENV_PODINFO = "O41_PODINFO_LABELS"
PODINFO_LABELS = "/etc/podinfo/labels"

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


def _dumps(value: Any) -> bytes:
    """``value`` serialized; over the limit, the error the service would answer."""
    try:
        return values.dumps(value)
    except values.ValueTooLarge as e:
        raise ValueTooLarge(413, str(e), {"error": str(e)}) from None


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

    def _call_within(self, deadline: float | None, op: str, **args: Any) -> builtins.dict[str, Any]:
        """:meth:`_call`, retried while the service cannot answer for at most ``deadline``
        seconds (None: the connection's retry deadline)."""
        args["consistency"] = self.consistency
        return self._client.transport.call(
            self._client.compute, self.kind, self.name, op, args, deadline=deadline
        )

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
        self._call("set", key=encode_key(key), value=_dumps(value))

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
        found = self._call("setdefault", key=encode_key(key), value=_dumps(default))
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
        """Append ``item``; never blocks (the queue is unbounded). ``None`` is refused
        (``ValueError``): ``poll`` answers ``None`` for an empty queue."""
        if item is None:
            raise ValueError(NO_NONE)
        self._call("offer", value=_dumps(item))

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
        self._call("register", key=encode_key(name), value=_dumps(value))

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
        generation = -1
        while True:
            remaining = MAX_WAIT * 2 if deadline is None else max(0.0, deadline - time.monotonic())
            answer = self._call_within(
                None if deadline is None else remaining,  # a blink: retried within the wait
                "wait",
                parties=self.parties,
                participant=participant,
                timeout=min(remaining, MAX_WAIT),
                final=remaining <= MAX_WAIT,
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
            generation = int(answer["generation"])  # the service finds its arrival again

    def __repr__(self) -> str:
        return f"sky.barrier({self.name!r}, {self.parties})"


class Lock(_Collection):
    """A lease on a name across the compute, as a context manager.

    Held while the block runs (the client's session lease is kept alive from one thread
    per client), released when it exits; if the holder dies, the lease expires after
    ``ttl`` seconds and the next waiter (in arrival order) gets the lock. If the lease is
    lost while held, ``lost`` turns true and ``lost_token`` says the token it held.
    ``token`` is a fencing token: each holder gets a larger one than the holders before
    it, so a resource can refuse writes from a holder that lost the lock.
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
        self._owner = ""  # this acquisition's id: the service finds the lease through it
        self.lost = False
        self.lost_token: int | None = None  # the fencing token held when the lease was lost
        self._alive = 0.0  # when a keep-alive last got through

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
        while True:
            remaining = MAX_WAIT * 2 if deadline is None else max(0.0, deadline - time.monotonic())
            answer = self._call_within(
                None if deadline is None else remaining,  # a blink: retried within the wait
                "acquire",
                owner=owner,
                session=self._client.session,
                ttl=self.ttl,
                timeout=min(remaining, MAX_WAIT),
            )
            if answer["acquired"]:
                self._token, self._owner, self.lost = int(answer["token"]), owner, False
                self.lost_token = None
                self._client.keeper.hold(self)
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False  # else the service waited its longest: ask again

    def _held(self) -> builtins.dict[str, Any]:
        """What names this holder to the service: no lease id, which stays there."""
        return {"owner": self._owner, "token": self._token, "session": self._client.session}

    def _refresh(self) -> bool:
        """One keep-alive (from the client's keeper thread): whether to go on."""
        try:
            # retried only while the lease may still be alive; the keeper refreshes others
            within = max(0.0, self.ttl / 3)
            if self._call_within(within, "keepalive", **self._held())["alive"]:
                self._alive = time.monotonic()
                return True
            why = "the service says its lease is gone"
        except CollectionError as e:
            if time.monotonic() - self._alive < self.ttl:
                return True  # a blip: the next refresh may still make it in time
            why = f"no keep-alive got through for {self.ttl} s ({e})"
        self._lost(why)
        return False

    def _lost(self, why: str) -> None:
        self.lost, self.lost_token = True, self._token
        log.warning("lock %r lost (token %s): %s", self.name, self._token, why)

    def release(self) -> None:
        if self._token is None:
            raise RuntimeError(f"lock {self.name!r} is not held")
        self._client.keeper.drop(self)
        held = self._held()
        self._token, self._owner = None, ""
        # answered before etcd has freed it (nobody can take it before that: see locks.py),
        # and not waited for: its answer is read before the next operation's
        args = {**held, "early": True, "consistency": self.consistency}
        send_later = getattr(self._client.transport, "send_later", None)
        if send_later is None:
            self._client.transport.call(self._client.compute, self.kind, self.name, "release", args)
        else:
            send_later(self._client.compute, self.kind, self.name, "release", args)

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


class _Keeper:
    """One thread per client refreshes every lock it holds, each every third of its TTL
    (no thread started per acquisition). When the service says a lease is gone, or no
    refresh got through for a whole TTL, that lock is lost: said by its ``lost`` and
    ``lost_token`` (the fencing token it held), and logged."""

    def __init__(self) -> None:
        self._due: builtins.dict[Lock, float] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wakes_at = 0.0  # when the thread wakes next by itself

    def hold(self, lock: Lock) -> None:
        with self._changed:
            lock._alive = time.monotonic()
            due = self._due[lock] = lock._alive + lock.ttl / 3
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="o41-locks", daemon=True)
                self._thread.start()
            elif due < self._wakes_at:  # else it wakes in time anyway: no thread switch
                self._changed.notify()

    def drop(self, lock: Lock) -> None:
        with self._changed:
            self._due.pop(lock, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [lock for lock, at in self._due.items() if at <= now]
                if not due:
                    wait = max(0.01, min(self._due.values(), default=now + 60) - now)
                    self._wakes_at = now + wait
                    self._changed.wait(wait)
                    continue
                for lock in due:
                    self._due[lock] = now + lock.ttl / 3
            for lock in due:
                if lock not in self._due:
                    continue  # released meanwhile
                if not lock._refresh():
                    self.drop(lock)


def _identity() -> str:
    """Unique per call, readable in etcd: host, process and a random part."""
    return f"{socket.gethostname()[:60]}/{os.getpid()}/{uuid.uuid4().hex}"


class Client:
    """The collections of one compute, through one transport (:meth:`over` a
    :class:`~o41.client.connection.Connection`: the placement service; an
    :class:`EmbeddedTransport`: in this process)."""

    def __init__(self, transport: Transport, compute: str = "local") -> None:
        self.transport = transport
        self.compute = check_name("compute", compute)
        # this client's session: its locks share one etcd lease, granted once
        self.session = _identity()
        self.keeper = _Keeper()

    @classmethod
    def over(
        cls, connection: Connection, compute: str | None = None, *, websocket: bool = True
    ) -> Client:
        """The collections of ``compute`` (default: this pod's,
        :func:`compute_from_environment`) at the service ``connection`` reaches, with its
        token and TLS: the connection an artifacts client uses serves both."""
        transport = HttpTransport(connection=connection, websocket=websocket)
        return cls(transport, compute_from_environment() if compute is None else compute)

    @classmethod
    def from_environment(cls) -> Client:
        """The collections of this pod's compute where the environment says
        (:func:`o41.client.endpoints.collections_route`): this cluster's collections tier
        at ``$O41_COLLECTIONS_ENDPOINT``, else the hub at ``$O41_ARTIFACTS_ENDPOINT``, with
        the pod's token; with neither, embedded in this process."""
        connection = collections_route().connection
        if connection is not None:
            return cls.over(connection)
        return cls(EmbeddedTransport(), compute_from_environment())

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
    "LimitReached",
    "Lock",
    "NotAllowed",
    "NotFound",
    "Queue",
    "Registry",
    "Set",
    "TransportError",
    "Unavailable",
    "ValueTooLarge",
]
