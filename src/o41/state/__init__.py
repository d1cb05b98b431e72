"""The state store: etcd in a cluster, an embedded single-replica store in one process.

One small interface on etcd's own model (keys, revisions, transactions, leases, watches)
serves the placement service's records and the distributed collections. Replication and
consensus come from etcd; the embedded store gives the same semantics without them.
"""

from __future__ import annotations

from collections.abc import Mapping

from o41.state.base import (
    Compare,
    Consistency,
    Delete,
    EtcdTls,
    Get,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    Store,
    StoreFull,
    StoreUnavailable,
    TxnResult,
    WatchEvent,
    prefix_end,
)

__all__ = [
    "Compare",
    "Consistency",
    "Delete",
    "EtcdTls",
    "Get",
    "KeyValue",
    "LeaseNotFound",
    "Op",
    "Put",
    "Store",
    "StoreFull",
    "StoreUnavailable",
    "TxnResult",
    "WatchEvent",
    "open_store",
    "prefix_end",
    "store_settings",
]


def store_settings(endpoints: str, env: Mapping[str, str]) -> tuple[list[str], EtcdTls | None]:
    """A server's comma-separated etcd URLs and its TLS variables, checked before it starts
    (ValueError, saying what to fix: a mistake is one line, not a traceback)."""
    urls = [e for e in endpoints.split(",") if e]
    tls = EtcdTls.from_environment(env)
    if urls:
        from o41.state.etcd import connection_settings

        connection_settings(urls, tls)
    elif tls is not None:
        raise ValueError("etcd TLS files are given but no etcd endpoints: give https:// ones")
    return urls, tls


def open_store(
    endpoints: list[str] | None, timeout: float = 5.0, tls: EtcdTls | None = None
) -> Store:
    """etcd at ``endpoints`` (client URLs), or the embedded single-replica store when none.

    Every call of the etcd store is bounded by ``timeout`` seconds; past it, or when etcd
    has no majority, calls raise :class:`StoreUnavailable`. ``https://`` endpoints are
    spoken to over TLS (``tls``: the CA, and a client certificate if etcd asks for one).
    """
    if endpoints:
        from o41.state.etcd import EtcdStore

        return EtcdStore(endpoints, timeout=timeout, tls=tls)
    from o41.state.memory import MemoryStore

    return MemoryStore()
