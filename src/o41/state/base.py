"""The state store's interface, on etcd's own model (keys, revisions, transactions,
leases, watches), and the TLS settings of a connection to etcd: what the placement
service's records and the collections' engine are written against. A module of its own,
so that a backend and whoever uses the interface import it without the package's
factory, which imports every backend (issue 38)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Consistency = Literal["strong", "eventual"]
"""How a read is answered. ``strong``: linearizable, it sees every write acknowledged
before it began. ``eventual``: one member answers from what it has applied (etcd's
serializable read), so it may lag the writes acknowledged by the majority; what it
answers is still the whole store as of one earlier revision (never a mix, never a value
that was not written), a member never answers an older revision than it answered before,
and it catches up once that member has applied the log."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction guard on one key: ``target`` of ``key`` ``op`` ``value``.

    target "version" with value 0 means "the key does not exist". ``prefix``: every key
    under ``key`` must pass, as etcd compares a range; none there compares as one absent
    key (so ``Compare(p, "version", "==", 0, prefix=True)``: nothing under ``p``).
    ``end`` (with ``prefix``): only the keys under ``key`` that sort before it.
    """

    key: bytes
    target: Literal["value", "version", "create", "mod"]
    op: Literal["==", "!=", "<", ">"]
    value: bytes | int
    prefix: bool = False
    end: bytes = b""


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: bytes
    prefix: bool = False
    limit: int = 0  # with ``prefix``: at most this many keys, the first in key order (0: all)


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    # one entry per op of the branch that ran: Get -> list of KeyValue, Put -> [], Delete ->
    # the deleted KeyValues (prev_kv)
    results: tuple[tuple[KeyValue, ...], ...]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    kv: KeyValue
    prev: KeyValue | None = None  # the key before this event, from a watch with prev_kv


class StoreUnavailable(Exception):
    """The store cannot answer now (etcd lost its majority, a timeout): retry later.

    A write that failed this way may or may not have been applied; callers that are not
    idempotent check before retrying.
    """


class StoreFull(StoreUnavailable):
    """etcd's space quota is reached (its NOSPACE alarm): every write is refused, and was
    not applied, until an administrator frees space; reads still work. Retrying does not
    help (docs/capacity.md: compact, defragment, disarm)."""


class Store(Protocol):
    async def get(self, key: bytes, *, consistency: Consistency = "strong") -> KeyValue | None: ...

    async def range(
        self,
        prefix: bytes,
        *,
        limit: int = 0,
        consistency: Consistency = "strong",
        start: bytes = b"",
        end: bytes = b"",
    ) -> list[KeyValue]:
        """The keys under ``prefix`` in key order, from ``start`` (a key under it) on when
        given (a page after the last key of the previous: ``last + b"\0"``), and before
        ``end`` when given. etcd counts every key of the range, whatever the ``limit``:
        a bounded ``end`` keeps a short read short under a long prefix."""
        ...

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int: ...

    async def delete(self, key: bytes, *, prefix: bool = False) -> int: ...

    async def take(self, start: bytes, end: bytes) -> list[KeyValue]:
        """Delete the keys in [``start``, ``end``) and answer them as they were, in key
        order (etcd's DeleteRange with its previous values, one round trip): of
        concurrent takes of one key, exactly one gets it."""
        ...

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult: ...

    async def lease_grant(self, ttl: int) -> int: ...

    async def lease_keepalive(self, lease: int) -> int: ...

    async def lease_revoke(self, lease: int) -> None: ...

    def watch(
        self,
        prefix: bytes,
        *,
        start_revision: int = 0,
        prev_kv: bool = False,
        deletes_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix`` from ``start_revision`` (0: from now). With ``prev_kv``,
        each event's ``prev`` is the key as it was before it (None if it did not exist);
        with ``deletes_only``, no puts are sent (etcd filters them out)."""
        ...

    async def close(self) -> None: ...


class LeaseNotFound(Exception):
    """A put named a lease that does not exist (it expired or was revoked)."""


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd (``https://`` endpoints): the CA that signed etcd's serving certificate
    (None: the system's roots), and this client's certificate and key when etcd asks for
    them (``--client-cert-auth``). Paths to PEM files."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> EtcdTls | None:
        """From ``O41_ETCD_CA_FILE``, ``O41_ETCD_CERT_FILE`` and ``O41_ETCD_KEY_FILE``
        (the chart sets them from ``etcd.external.tls``); None when none is set."""
        found = cls(*(env.get(f"O41_ETCD_{n}_FILE") or None for n in _TLS_NAMES))
        return found if found != cls() else None

    def environment(self) -> dict[str, str]:
        """The variables :meth:`from_environment` reads (a server's environment)."""
        files = zip(_TLS_NAMES, (self.ca_file, self.cert_file, self.key_file), strict=True)
        return {f"O41_ETCD_{name}_FILE": path for name, path in files if path}


_TLS_NAMES = ("CA", "CERT", "KEY")
