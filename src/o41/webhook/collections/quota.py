"""Limits on the collections: bytes and entries per namespace, operations and bytes per
second per token.

Every namespace shares the one etcd (the chart's has a 2 GiB quota; past it, every
namespace's writes fail), so each namespace may store at most ``bytes`` (keys and values,
as etcd stores them) in at most ``entries`` keys, and each token may send at most
``ops_per_second`` operations and ``bytes_per_second`` bytes of keys and values to each
replica (a token bucket of two seconds' worth).

Accuracy against cost: a strong operation must not pay an etcd round trip more, so the
check is made in memory, against this replica's estimate of the namespace's usage: the
last count (a paged range of the namespace's keys, linearizable, or serializable while
etcd has no majority, made in the background
every ``recount`` seconds while this replica takes the namespace's writes, bounded by the
quota) plus every write this replica admitted since that count began, each counted as new
(a key written again counts twice until the next count). The first write of a namespace
on a replica waits for a first count. A write the estimate would refuse counts again
first: at once after a delete through this replica, else at most once a second; so room
freed by deletes is found by the next write. What a replica cannot see is what the
others admitted since its count: with N replicas a namespace can go over its limit by at
most what the other N-1 admit within one ``recount`` interval, which each bounds by the
limit minus the usage it counted, and by its tokens' ``bytes_per_second``
(docs/collections.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from o41.collections.checks import ROOT, CollectionError
from o41.state import Consistency, Store, StoreUnavailable

log = logging.getLogger("o41.webhook.quota")  # its name is a log field: kept

MiB = 1024 * 1024
MIN_RECOUNT = 1.0  # seconds: a refusal recounts first, at most this often per namespace
IDLE = 600.0  # seconds without a write after which a replica stops counting a namespace
BURST = 2.0  # seconds of rate a token bucket holds
PAGE_BYTES = 4 * MiB  # what one page of a count aims at (etcd answers at most 64 MiB here)
CHART = "placement.collectionLimits"
ENV = {
    "bytes": "O41_COLLECTIONS_QUOTA_BYTES",
    "entries": "O41_COLLECTIONS_QUOTA_ENTRIES",
    "ops_per_second": "O41_COLLECTIONS_RATE_OPS",
    "bytes_per_second": "O41_COLLECTIONS_RATE_BYTES",
    "recount": "O41_COLLECTIONS_QUOTA_RECOUNT",
}
CHART_KEYS = {
    "bytes": "bytesPerNamespace",
    "entries": "entriesPerNamespace",
    "ops_per_second": "opsPerSecondPerToken",
    "bytes_per_second": "bytesPerSecondPerToken",
}
# the operations that can store more: every other one reads, deletes or releases
GROWING = frozenset(
    {
        ("dict", "set"),
        ("dict", "setdefault"),
        ("set", "add"),
        ("registry", "register"),
        ("queue", "offer"),
        ("counter", "add"),
        ("counter", "reset"),
        ("barrier", "wait"),
        ("lock", "acquire"),
    }
)
# the operations that can make room: after one, a refusal may recount at once
FREEING = frozenset(
    {
        ("dict", "delete"),
        ("dict", "pop"),
        ("dict", "clear"),
        ("set", "remove"),
        ("set", "clear"),
        ("registry", "unregister"),
        ("registry", "clear"),
        ("queue", "poll"),
        ("queue", "clear"),
        ("counter", "reset"),
        ("lock", "release"),
    }
)
_KEY_OVERHEAD = 64  # bytes a write may add beyond its key and value (sub-keys, a counter)


class LimitReached(CollectionError):
    """A namespace's quota, or a token's rate (then ``retry_after`` is set)."""

    status = 429

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Limits:
    """0 turns a limit off."""

    bytes: int = 32 * MiB  # per namespace: keys and values
    entries: int = 50_000  # per namespace: etcd keys
    ops_per_second: float = 5_000  # per token, per replica
    bytes_per_second: float = 2 * MiB  # per token, per replica: keys and values sent
    recount: float = 10.0  # seconds between counts of a namespace this replica writes to

    @classmethod
    def from_environment(cls, env: Mapping[str, str], defaults: Limits | None = None) -> Limits:
        base = defaults or cls()
        found: dict[str, Any] = {}
        for name, variable in ENV.items():
            text = env.get(variable, "").strip()
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{variable} must be a number, not {text!r}") from None
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{variable} must be 0 (no limit) or more, not {text!r}")
            found[name] = int(value) if name in ("bytes", "entries") else value
        return Limits(**{**base.__dict__, **found})

    def public(self) -> dict[str, float]:
        return {CHART_KEYS[k]: getattr(self, k) for k in CHART_KEYS}


def size(n: float) -> str:
    """Bytes for people: ``512 B``, ``3.2 MiB``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", MiB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


@dataclass
class Usage:
    """This replica's view of one namespace: the last count, and what it admitted since
    that count began."""

    counted_bytes: int = 0
    counted_entries: int = 0
    counted_at: float | None = None  # monotonic; None: never counted
    since_bytes: int = 0
    since_entries: int = 0
    written: float = 0.0  # monotonic, the last write admitted
    freed: bool = False  # this replica deleted something since the count began
    counting: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def bytes(self) -> int:
        return self.counted_bytes + self.since_bytes

    @property
    def entries(self) -> int:
        return self.counted_entries + self.since_entries


@dataclass
class _Bucket:
    ops: float
    bytes: float
    at: float


class Quota:
    """The limits of one replica, over its state store; see the module docstring."""

    def __init__(self, store: Store, limits: Limits) -> None:
        self.store = store
        self.limits = limits
        self.namespaces: dict[str, Usage] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._ops_burst = limits.ops_per_second * BURST
        self._bytes_burst = max(limits.bytes_per_second * BURST, 2 * MiB)  # a value fits
        self.counts = 0  # how many counts were made (tests, logs)

    # the rate, per token

    def take(self, token: str, nbytes: int) -> None:
        """One operation of ``nbytes`` bytes for ``token``, or :class:`LimitReached` with
        how long to wait (nothing is taken then)."""
        ops_rate, bytes_rate = self.limits.ops_per_second, self.limits.bytes_per_second
        if not ops_rate and not bytes_rate:
            return
        now = time.monotonic()
        ops_burst, bytes_burst = self._ops_burst, self._bytes_burst
        bucket = self._buckets.get(token)
        if bucket is None:
            if len(self._buckets) > 10_000:
                self._forget_full_buckets(now)
            bucket = self._buckets[token] = _Bucket(ops_burst, bytes_burst, now)
        elapsed, bucket.at = now - bucket.at, now
        bucket.ops = min(ops_burst, bucket.ops + elapsed * ops_rate)
        bucket.bytes = min(bytes_burst, bucket.bytes + elapsed * bytes_rate)
        wait = 0.0
        if ops_rate and bucket.ops < 1:
            wait = (1 - bucket.ops) / ops_rate
        if bytes_rate and bucket.bytes < nbytes:
            wait = max(wait, (nbytes - bucket.bytes) / bytes_rate)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise LimitReached(
                f"this token sends more than {ops_rate:g} operations or {size(bytes_rate)} "
                "of keys and values a second to this replica of the service: slow down "
                f"and try again in {retry} s (the platform team sets the rate: "
                f"{CHART}.{CHART_KEYS['ops_per_second']} and "
                f".{CHART_KEYS['bytes_per_second']})",
                retry_after=retry,
            )
        bucket.ops -= 1
        bucket.bytes -= nbytes

    def _forget_full_buckets(self, now: float) -> None:
        """Tokens idle long enough to have refilled (their bucket is as new)."""
        self._buckets = {t: b for t, b in self._buckets.items() if now - b.at < BURST}

    # the quota, per namespace

    def fits(self, namespace: str, nbytes: int) -> bool:
        """The hot path of :meth:`admit`, without a coroutine: count a write of one entry
        and ``nbytes`` bytes if it fits the estimate of a counted namespace; False when
        :meth:`admit` must decide (count first, or refuse)."""
        usage = self.namespaces.get(namespace)
        if usage is None or usage.counted_at is None:
            return False
        limits = self.limits
        if (limits.bytes and usage.counted_bytes + usage.since_bytes + nbytes > limits.bytes) or (
            limits.entries and usage.counted_entries + usage.since_entries >= limits.entries
        ):
            return False
        usage.since_bytes += nbytes
        usage.since_entries += 1
        usage.written = time.monotonic()
        return True

    async def admit(self, namespace: str, nbytes: int, entries: int = 1) -> None:
        """Count a write of ``nbytes`` more bytes and ``entries`` more keys for
        ``namespace``, or refuse it with :class:`LimitReached` saying the usage, the
        limit and what to do."""
        limits = self.limits
        if not limits.bytes and not limits.entries:
            return
        usage = self.namespaces.get(namespace)
        if usage is None:
            usage = self.namespaces[namespace] = Usage(written=time.monotonic())
        if usage.counted_at is None:
            await self.count(namespace)  # the first write here: once per replica
        if self._over(usage, nbytes, entries) is not None:
            assert usage.counted_at is not None
            if usage.freed or time.monotonic() - usage.counted_at >= MIN_RECOUNT:
                await self.count(namespace)  # deletes may have made room
            reason = self._over(usage, nbytes, entries)
            if reason is not None:
                raise LimitReached(reason)
        usage.since_bytes += nbytes
        usage.since_entries += entries
        usage.written = time.monotonic()

    def freed(self, namespace: str) -> None:
        """This replica ran an operation that can make room in ``namespace``: a write
        refused next counts again at once instead of within :data:`MIN_RECOUNT`."""
        usage = self.namespaces.get(namespace)
        if usage is not None:
            usage.freed = True

    def _over(self, usage: Usage, nbytes: int, entries: int) -> str | None:
        limits, advice = (
            self.limits,
            (
                "delete entries or clear collections this namespace no longer needs, or ask the "
                "platform team to raise "
            ),
        )
        if limits.bytes and usage.bytes + nbytes > limits.bytes:
            return (
                f"this namespace's collections hold {size(usage.bytes)} of its "
                f"{size(limits.bytes)} quota, and this write needs {size(nbytes)} more: "
                f"{advice}{CHART}.{CHART_KEYS['bytes']} (GET /v1/collections/usage shows the "
                "usage)"
            )
        if limits.entries and usage.entries + entries > limits.entries:
            return (
                f"this namespace's collections hold {usage.entries} entries, its quota is "
                f"{limits.entries}: {advice}{CHART}.{CHART_KEYS['entries']} "
                "(GET /v1/collections/usage shows the usage)"
            )
        return None

    async def count(self, namespace: str) -> Usage:
        """Count ``namespace``'s keys and bytes now (one count at a time per namespace:
        callers meanwhile wait for it)."""
        usage = self.namespaces.get(namespace)
        if usage is None:  # asked for its usage, not written here: not counted again
            usage = self.namespaces[namespace] = Usage()
        if usage.counting is None:
            usage.counting = asyncio.get_running_loop().create_task(self._count(usage, namespace))
        task = usage.counting
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and usage.counting is task:
                usage.counting = None
        return usage

    async def _count(self, usage: Usage, namespace: str) -> None:
        since_bytes, since_entries = usage.since_bytes, usage.since_entries
        usage.freed = False
        prefix = ROOT + namespace.encode() + b"/"
        try:
            try:
                nbytes, entries = await self._sizes(prefix, "strong")
            except StoreUnavailable:  # no majority: what the nearest member has
                nbytes, entries = await self._sizes(prefix, "eventual")
        except Exception as e:
            # the store cannot be read (not even one member): go on from what is known,
            # and count again soon
            log.warning("counting the collections of %s failed: %s", namespace, e)
            if usage.counted_at is None:
                usage.counted_at = time.monotonic() - self.limits.recount
            return
        self.counts += 1
        usage.counted_bytes, usage.counted_entries = nbytes, entries
        usage.since_bytes -= since_bytes
        usage.since_entries -= since_entries
        usage.counted_at = time.monotonic()

    async def _sizes(self, prefix: bytes, consistency: Consistency) -> tuple[int, int]:
        """The bytes and keys under ``prefix``, a page at a time (of about
        :data:`PAGE_BYTES`): a linearizable count sees every write and delete before it."""
        entries = nbytes = 0
        start, limit = b"", 64
        while True:
            page = await self.store.range(prefix, limit=limit, consistency=consistency, start=start)
            page_bytes = sum(len(kv.key) + len(kv.value) for kv in page)
            entries += len(page)
            nbytes += page_bytes
            if len(page) < limit:
                return nbytes, entries
            start = page[-1].key + b"\0"
            limit = max(1, min(4096, PAGE_BYTES * len(page) // max(1, page_bytes)))

    async def run(self) -> None:
        """Count again, in the background, the namespaces this replica writes for, every
        ``recount`` seconds; forget those without a write for :data:`IDLE` seconds."""
        tick = max(0.05, min(1.0, self.limits.recount / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for namespace, usage in list(self.namespaces.items()):
                if now - usage.written > IDLE and usage.counting is None:
                    del self.namespaces[namespace]
                elif usage.counted_at is not None and now - usage.counted_at >= max(
                    self.limits.recount, MIN_RECOUNT
                ):
                    with contextlib.suppress(Exception):
                        await self.count(namespace)


def cost(namespace: str, compute: str, kind: str, name: str, op: str, args: Any) -> int:
    """The bytes a write may add (over-estimated: its key as etcd stores it, its value, a
    little for the keys beside); 0 for an operation that stores nothing more."""
    if (kind, op) not in GROWING:
        return 0
    key = args.get("key") if isinstance(args, dict) else None
    value = args.get("value") if isinstance(args, dict) else None
    return (
        len(ROOT)
        + len(namespace)
        + len(compute)
        + len(kind)
        + len(name)
        + (len(key) if isinstance(key, str) else 0)
        + (len(value) if isinstance(value, bytes) else 0)
        + _KEY_OVERHEAD
    )


def sent(args: Any) -> int:
    """The bytes of keys and values an operation sends (what the rate counts)."""
    if not isinstance(args, dict):
        return 0
    key, value = args.get("key"), args.get("value")
    return (len(key) if isinstance(key, str) else 0) + (
        len(value) if isinstance(value, bytes) else 0
    )


def from_environment(defaults: Limits | None = None) -> Limits:
    return Limits.from_environment(os.environ, defaults)
