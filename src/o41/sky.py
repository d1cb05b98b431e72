"""Distributed collections for the functions of a compute: ``from o41 import sky``.

.. code-block:: python

    @sky.function
    def worker_step(batch):
        processed = sky.counter("processed")
        processed.add(len(batch))
        with sky.lock("checkpoint"):
            write_checkpoint()

``sky.dict``, ``sky.set``, ``sky.counter``, ``sky.queue``, ``sky.registry``,
``sky.barrier(name, parties)`` and ``sky.lock(name, ttl=30, timeout=None)`` each take
``consistency="strong"`` (the default) or ``"eventual"``. A compute is the pods of one job;
collections are shared by the compute's pods and private to its namespace.

In a pod, calls go to this cluster's collections tier at ``$O41_COLLECTIONS_ENDPOINT``
when the cluster has one (near the job), else to the placement service (the hub) at
``$O41_ARTIFACTS_ENDPOINT``, with the pod's ServiceAccount token
(:mod:`o41.client.endpoints`; ``o41 status`` says which); the compute comes from
``$O41_COMPUTE`` or the pod's Job (see
:func:`o41.client.collections.compute_from_environment`). With neither variable the
collections are embedded in the process (same API and semantics, one replica): laptops,
tests and demos. An artifacts client's connection serves
the collections too: ``sky.configure(artifacts.Client(...).collections)``, or
``sky.configure(sky.Client.over(connection))``.

Errors are the client's one hierarchy (``o41.client.errors``): ``sky.CollectionError`` is
its root, the same class as ``artifacts.Error``, and a refusal is the same class whichever
side it came from (``sky.Conflict`` is ``artifacts.Conflict``). See docs/collections.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

from o41.client.collections import (
    Barrier,
    Client,
    CollectionError,
    Conflict,
    Counter,
    Dict,
    EmbeddedTransport,
    HttpTransport,
    InvalidRequest,
    LimitReached,
    Lock,
    NotAllowed,
    NotFound,
    Queue,
    Registry,
    Set,
    TransportError,
    Unavailable,
    ValueTooLarge,
    compute_from_environment,
)

Consistency = Literal["strong", "eventual"]
"""How hard a write is acknowledged before the call returns.

"strong" (the default): etcd's majority committed it, so a value read back after a write is
the value written, and it survives losing a minority of etcd members. "eventual": one
replica of the placement service acknowledged it and writes it to etcd within a bounded
window; reads take that replica's copy. Cheaper, and enough for a scratchpad.
"""

DistributedDict = Dict
DistributedSet = Set
DistributedCounter = Counter
DistributedQueue = Queue
DistributedRegistry = Registry
DistributedBarrier = Barrier
DistributedLock = Lock

_default: Client | None = None
_default_lock = threading.Lock()


def client() -> Client:
    """This process's collections client, made from the environment on first use."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Client.from_environment()
    return _default


def configure(new: Client | None) -> None:
    """Use ``new`` for the module-level factories (``None``: from the environment again):
    a :class:`Client`, such as an artifacts client's ``collections`` (the same connection
    to the service) or ``Client.over(connection, compute)``."""
    global _default
    with _default_lock:
        _default = new


def dict(name: str, consistency: Consistency = "strong") -> Dict:
    """A dict shared by the compute: mapping operations, ``get``, ``pop``, ``items``,
    ``clear``."""
    return client().dict(name, consistency)


def set(name: str, consistency: Consistency = "strong") -> Set:
    """A set shared by the compute: ``add``, ``remove``, ``in``, ``items``, ``clear``."""
    return client().set(name, consistency)


def counter(name: str, consistency: Consistency = "strong") -> Counter:
    """An integer shared by the compute: ``add``, ``get``, ``reset``."""
    return client().counter(name, consistency)


def queue(name: str, consistency: Consistency = "strong") -> Queue:
    """A FIFO queue shared by the compute: ``offer``, ``poll`` (``None`` when empty),
    ``len``, ``clear``; nothing blocks."""
    return client().queue(name, consistency)


def registry(name: str, consistency: Consistency = "strong") -> Registry:
    """A named place to leave objects for the other nodes to find: ``register``,
    ``lookup``, ``unregister``, ``list``."""
    return client().registry(name, consistency)


def barrier(name: str, parties: int, consistency: Consistency = "strong") -> Barrier:
    """Wait until ``parties`` participants have arrived: ``wait(timeout=None)``."""
    return client().barrier(name, parties, consistency)


def lock(
    name: str, ttl: int = 30, timeout: float | None = None, consistency: Consistency = "strong"
) -> Lock:
    """A lease on ``name`` across the compute, as a context manager: released when the
    block exits, expired ``ttl`` seconds after its holder died; ``timeout``: how long to
    wait for it (``None``: as long as it takes)."""
    return client().lock(name, ttl, timeout, consistency)


F = TypeVar("F", bound=Callable[..., Any])


@overload
def function(fn: F, /) -> F: ...
@overload
def function(fn: None = None, /) -> Callable[[F], F]: ...
def function(fn: F | None = None, /) -> F | Callable[[F], F]:
    """Mark ``fn`` as a function that runs on the compute.

    The pods of the job run it themselves, so here it runs as is, in the calling process:
    the decorator only marks it (``fn.__o41_function__`` is ``True``). The collections it
    uses are those of this pod's compute. ``@sky.function`` and ``@sky.function()`` both
    work.
    """

    def mark(f: F) -> F:
        f.__o41_function__ = True  # type: ignore[attr-defined]
        return f

    return mark if fn is None else mark(fn)


__all__ = [
    "Barrier",
    "Client",
    "CollectionError",
    "Conflict",
    "Consistency",
    "Counter",
    "Dict",
    "DistributedBarrier",
    "DistributedCounter",
    "DistributedDict",
    "DistributedLock",
    "DistributedQueue",
    "DistributedRegistry",
    "DistributedSet",
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
    "barrier",
    "client",
    "compute_from_environment",
    "configure",
    "counter",
    "dict",
    "function",
    "lock",
    "queue",
    "registry",
    "set",
]
