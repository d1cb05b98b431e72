"""The embedded single-replica store: etcd's model (revisions, transactions, leases, watch)
in one process, for tests, demos and laptops.

Same semantics as :class:`o41.state.etcd.EtcdStore` (the contract tests run the same
functions on both), minus replication: it lives and dies with its process. All methods
run on the event loop that uses the store; it is not thread-safe.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from o41.state.base import (
    Compare,
    Consistency,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    StoreUnavailable,
    TxnResult,
    WatchEvent,
    prefix_end,
)

HISTORY = 100_000  # watch events kept for watches that start in the past


@dataclass
class _Lease:
    ttl: int
    keys: set[bytes] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


class MemoryStore:
    """A single-replica store with etcd's semantics; see the module docstring."""

    def __init__(self) -> None:
        self._data: dict[bytes, KeyValue] = {}
        self._keys: list[bytes] = []  # sorted, for ranges
        self._revision = 1  # etcd starts at 1 with an empty store
        self._history: deque[WatchEvent] = deque(maxlen=HISTORY)
        self._watchers: list[tuple[bytes, bytes, asyncio.Queue[WatchEvent | None]]] = []
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x1000)
        self._closed = False

    # reads

    async def get(self, key: bytes, *, consistency: Consistency = "strong") -> KeyValue | None:
        self._check()
        return self._data.get(key)

    async def range(
        self,
        prefix: bytes,
        *,
        limit: int = 0,
        consistency: Consistency = "strong",
        start: bytes = b"",
        end: bytes = b"",
    ) -> list[KeyValue]:
        self._check()
        return self._range(prefix, True, limit, start, end)

    def _range(
        self, key: bytes, prefix: bool, limit: int = 0, start: bytes = b"", before: bytes = b""
    ) -> list[KeyValue]:
        if not prefix:
            kv = self._data.get(key)
            return [] if kv is None else [kv]
        end = prefix_end(key)
        if before and (end == b"\0" or before < end):
            end = before
        lo = bisect.bisect_left(self._keys, max(key, start))
        hi = len(self._keys) if end == b"\0" else bisect.bisect_left(self._keys, end)
        if limit:
            hi = min(hi, lo + limit)
        return [self._data[k] for k in self._keys[lo:hi]]

    # writes

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        self._check()
        self._check_lease(lease)
        self._revision += 1
        self._put(key, value, lease)
        return self._revision

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        self._check()
        found = self._range(key, prefix)
        if found:
            self._revision += 1
            for kv in found:
                self._delete(kv.key)
        return len(found)

    async def take(self, start: bytes, end: bytes) -> list[KeyValue]:
        self._check()
        lo = bisect.bisect_left(self._keys, start)
        found = [self._data[k] for k in self._keys[lo : bisect.bisect_left(self._keys, end)]]
        if found:
            self._revision += 1
            for kv in found:
                self._delete(kv.key)
        return found

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check()
        ok = all(self._compare(c) for c in compare)
        ops = success if ok else failure
        _check_duplicates(ops)
        for op in ops:
            if isinstance(op, Put):
                self._check_lease(op.lease)
        writes = any(
            isinstance(op, Put) or (isinstance(op, Delete) and self._range(op.key, op.prefix))
            for op in ops
        )
        if writes:
            self._revision += 1
        results: list[tuple[KeyValue, ...]] = []
        for op in ops:
            if isinstance(op, Get):
                results.append(tuple(self._range(op.key, op.prefix, op.limit)))
            elif isinstance(op, Put):
                self._put(op.key, op.value, op.lease)
                results.append(())
            else:
                found = self._range(op.key, op.prefix)
                for kv in found:
                    self._delete(kv.key)
                results.append(tuple(found))
        return TxnResult(ok, self._revision, tuple(results))

    def _compare(self, c: Compare) -> bool:
        if c.prefix:  # as etcd: every key of the range, or one absent key if none
            found = self._range(c.key, True, before=c.end)
            return (
                all(self._compare_kv(c, kv) for kv in found) if found else self._compare_kv(c, None)
            )
        return self._compare_kv(c, self._data.get(c.key))

    def _compare_kv(self, c: Compare, kv: KeyValue | None) -> bool:
        if c.target == "value":
            if kv is None:
                return False  # as etcd: a value compare on a missing key fails
            have: bytes | int = kv.value
        elif c.target == "version":
            have = kv.version if kv else 0
        elif c.target == "create":
            have = kv.create_revision if kv else 0
        else:
            have = kv.mod_revision if kv else 0
        want = c.value
        if isinstance(have, bytes) != isinstance(want, bytes):
            raise TypeError(f"compare {c.target} of {c.key!r} with {type(want).__name__}")
        if c.op == "==":
            return have == want
        if c.op == "!=":
            return have != want
        if c.op == "<":
            return have < want  # type: ignore[operator]
        return have > want  # type: ignore[operator]

    def _put(self, key: bytes, value: bytes, lease: int) -> None:
        old = self._data.get(key)
        if old is None:
            bisect.insort(self._keys, key)
            kv = KeyValue(key, value, self._revision, self._revision, 1, lease)
        else:
            kv = KeyValue(key, value, old.create_revision, self._revision, old.version + 1, lease)
            if old.lease and old.lease != lease and old.lease in self._leases:
                self._leases[old.lease].keys.discard(key)
        if lease:
            self._leases[lease].keys.add(key)
        self._data[key] = kv
        self._emit(WatchEvent("put", kv, old))

    def _delete(self, key: bytes) -> None:
        old = self._data.pop(key)
        del self._keys[bisect.bisect_left(self._keys, key)]
        if old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._emit(WatchEvent("delete", KeyValue(key, b"", 0, self._revision, 0), old))

    # leases

    async def lease_grant(self, ttl: int) -> int:
        self._check()
        lease_id = next(self._lease_ids)
        lease = _Lease(max(1, int(ttl)))
        self._leases[lease_id] = lease
        self._arm(lease_id, lease)
        return lease_id

    async def lease_keepalive(self, lease: int) -> int:
        self._check()
        found = self._leases.get(lease)
        if found is None:
            return 0  # as etcd: an expired lease answers TTL 0
        self._arm(lease, found)
        return found.ttl

    async def lease_revoke(self, lease: int) -> None:
        self._check()
        self._expire(lease)

    def _arm(self, lease_id: int, lease: _Lease) -> None:
        if lease.timer is not None:
            lease.timer.cancel()
        loop = asyncio.get_running_loop()
        lease.timer = loop.call_later(lease.ttl, self._expire, lease_id)

    def _expire(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return
        if lease.timer is not None:
            lease.timer.cancel()
        if lease.keys:
            self._revision += 1
            for key in sorted(lease.keys):
                if key in self._data:
                    self._delete(key)

    def _check_lease(self, lease: int) -> None:
        if lease and lease not in self._leases:
            raise LeaseNotFound(f"lease {lease:x} not found: it expired or was revoked")

    # watch

    async def watch(
        self,
        prefix: bytes,
        *,
        start_revision: int = 0,
        prev_kv: bool = False,
        deletes_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        self._check()
        end = prefix_end(prefix)
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        if start_revision:
            oldest = self._history[0].kv.mod_revision if self._history else self._revision + 1
            if start_revision < oldest and len(self._history) == self._history.maxlen:
                raise StoreUnavailable(f"revision {start_revision} was compacted")
            for event in self._history:
                if event.kv.mod_revision >= start_revision and _within(event.kv.key, prefix, end):
                    queue.put_nowait(event)
        entry = (prefix, end, queue)
        self._watchers.append(entry)
        try:
            while True:
                found = await queue.get()
                if found is None:
                    return
                if deletes_only and found.kind == "put":
                    continue
                yield found if prev_kv or found.prev is None else replace(found, prev=None)
        finally:
            self._watchers.remove(entry)

    def _emit(self, event: WatchEvent) -> None:
        self._history.append(event)
        for prefix, end, queue in self._watchers:
            if _within(event.kv.key, prefix, end):
                queue.put_nowait(event)

    async def close(self) -> None:
        self._closed = True
        for lease in self._leases.values():
            if lease.timer is not None:
                lease.timer.cancel()
        for _, _, queue in self._watchers:
            queue.put_nowait(None)

    def _check(self) -> None:
        if self._closed:
            raise StoreUnavailable("the embedded store is closed")


def _within(key: bytes, prefix: bytes, end: bytes) -> bool:
    return key >= prefix and (end == b"\0" or key < end)


def _check_duplicates(ops: Sequence[Op]) -> None:
    """etcd refuses a transaction that puts one key twice, or puts a key it also deletes;
    so does this store (overlapping deletes are allowed)."""
    puts: set[bytes] = set()
    deletes: list[tuple[bytes, bytes]] = []
    for op in ops:
        if isinstance(op, Put):
            if op.key in puts or any(_within(op.key, lo, hi) for lo, hi in deletes):
                raise ValueError("duplicate key given in txn request")
            puts.add(op.key)
        elif isinstance(op, Delete):
            lo = op.key
            hi = prefix_end(op.key) if op.prefix else op.key + b"\0"
            if any(_within(k, lo, hi) for k in puts):
                raise ValueError("duplicate key given in txn request")
            deletes.append((lo, hi))
