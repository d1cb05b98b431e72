"""The collections' semantics over a :class:`o41.state.Store`, as the placement service
runs them: async, no HTTP, values as opaque bytes, keys as canonical texts.

Layout: every collection lives under
``/o41/collections/<namespace>/<compute>/<kind>/<name>/``; the namespace always comes from
the authenticated caller, never from the request.

- dict, set, registry: one key per entry, ``.../e/<encoded key>``; iteration follows
  creation order (etcd's create_revision), like a Python dict.
- counter: one key ``.../value`` (decimal). Concurrent adds that reach one service replica
  are merged into one compare-and-swap transaction: contention costs one etcd round trip
  per batch, not one per add.
- queue: ``.../seq`` and items ``.../q/<20-digit sequence>``; offers are batched into one
  transaction that advances the sequence; polls claim the head items by a conditional
  delete (each item goes to exactly one poller).
- barrier: ``.../parties``, ``.../gen`` (the generation), arrival slots ``.../s/<slot>``
  held by leases, and ``.../r/<generation>`` (who was released).
- lock: ``.../holder`` with the holder's lease; the key's create revision is the fencing
  token.

Consistency: "strong" goes to etcd on every call (majority commit, linearizable reads).
"eventual" is acknowledged by this replica: writes are buffered and written to etcd in
batches at least every ``flush_interval`` seconds; reads come from this replica's copy of
the collection, kept fresh by an etcd watch. What is buffered when the replica dies is lost
(the loss window: at most ``flush_interval`` plus one etcd write; longer while etcd is
unreachable, up to ``max_buffer`` writes, then eventual writes are refused). Barriers and
locks are always strong. See docs/collections.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from o41.collections import keys
from o41.collections.keys import check_encoded
from o41.collections.values import MAX_VALUE
from o41.state import (
    Compare,
    Consistency,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    Store,
    StoreUnavailable,
    WatchEvent,
)

log = logging.getLogger(__name__)

ROOT = b"/o41/collections/"
KINDS = ("dict", "set", "counter", "queue", "registry", "barrier", "lock")
MAX_TXN_OPS = 100  # etcd refuses more than 128 operations in one transaction
MAX_PARTIES = 10_000
RELEASES_KEPT = 1000  # barrier generations whose released participants stay recorded


class CollectionError(Exception):
    """A refusal with an HTTP status; the message says what to do."""

    status = 400


class BadRequest(CollectionError):
    status = 400


class TooLarge(CollectionError):
    status = 413


class Conflict(CollectionError):
    status = 409


class Busy(CollectionError):
    status = 503


def check_name(what: str, name: object) -> str:
    try:
        return keys.check_name(what, name)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def collection_prefix(namespace: str, compute: str, kind: str, name: str) -> bytes:
    """Where one collection's keys live; ``namespace`` is the caller's, authenticated."""
    if not namespace or "/" in namespace:
        raise BadRequest(f"bad namespace {namespace!r}")
    check_name("compute", compute)
    check_name("collection", name)
    if kind not in KINDS:
        raise BadRequest(f"unknown collection kind {kind!r}: one of {', '.join(KINDS)}")
    return ROOT + f"{namespace}/{compute}/{kind}/{name}/".encode()


# arguments


def _key(args: dict[str, Any]) -> bytes:
    try:
        return check_encoded(args.get("key")).encode()
    except ValueError as e:
        raise BadRequest(str(e)) from None


def _value(args: dict[str, Any]) -> bytes:
    value = args.get("value")
    if not isinstance(value, bytes):
        raise BadRequest("a value is required (bytes, base64 in JSON)")
    if len(value) > MAX_VALUE:
        raise TooLarge(
            f"value too large: {len(value)} bytes serialized, the limit is {MAX_VALUE}; store "
            "large objects as artifacts and keep their names here"
        )
    return value


def _int(
    args: dict[str, Any],
    name: str,
    default: int | None = None,
    lo: int = -(2**63),
    hi: int = 2**63 - 1,
) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be an integer in [{lo}, {hi}]")
    return value


def _float(args: dict[str, Any], name: str, default: float) -> float:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise BadRequest(f"{name} must be a number of seconds >= 0")
    return float(value)


def _id(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= 200:
        raise BadRequest(f"{name} must be a string of 1-200 characters")
    return value


def _consistency(args: dict[str, Any]) -> Consistency:
    value = args.get("consistency", "strong")
    if value not in ("strong", "eventual"):
        raise BadRequest(f"consistency must be 'strong' or 'eventual', not {value!r}")
    return "eventual" if value == "eventual" else "strong"


def _counter_value(kv: KeyValue | None) -> int:
    return int(kv.value) if kv is not None and kv.value else 0


# batching

T = TypeVar("T")
R = TypeVar("R")


class Combiner(Generic[T, R]):
    """Requests that arrive while ``parallel`` batches are in flight form the next batch.

    Under contention this is what keeps a hot counter or queue at one etcd transaction per
    batch instead of one compare-and-swap round (and its retries) per request, and many
    concurrent strong writes or reads at one transaction per batch (group commit) instead
    of one gRPC call each. Alone, a request runs at once, in a batch of one.
    """

    def __init__(
        self, run: Callable[[list[T]], Awaitable[Sequence[R]]], limit: int, parallel: int = 1
    ) -> None:
        self._run = run
        self._limit = limit
        self._parallel = parallel
        self._running = 0  # batches in flight
        self._pending: list[tuple[T, asyncio.Future[R]]] = []

    async def submit(self, item: T) -> R:
        if self._running < self._parallel and not self._pending:
            self._running += 1  # alone: run in this very task, no hand-over
            try:
                return (await self._run([item]))[0]
            finally:
                self._running -= 1
                self._more()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._more()
        return await future

    def _more(self) -> None:
        """Start a batch of what waits, if a slot is free."""
        if self._pending and self._running < self._parallel:
            self._running += 1
            asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            batch = self._pending[: self._limit]
            del self._pending[: self._limit]
            try:
                results = await self._run([item for item, _ in batch])
            except Exception as e:  # each waiter gets the failure
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                return
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self._running -= 1
            self._more()

    @property
    def idle(self) -> bool:
        return not self._running and not self._pending


class _Counter:
    """Strong adds to one counter, merged; the last value and revision seen are cached so
    a batch costs one transaction when nobody else wrote in between."""

    def __init__(self, store: Store, key: bytes) -> None:
        self.store, self.key = store, key
        self.known: tuple[int, int] = (0, 0)  # value, mod revision (0: absent)
        self.combiner: Combiner[int, int] = Combiner(self._add, MAX_TXN_OPS)

    async def _add(self, deltas: list[int]) -> list[int]:
        total = sum(deltas)
        for _ in range(100):
            value, mod = self.known
            result = await self.store.txn(
                [Compare(self.key, "mod", "==", mod)],
                [Put(self.key, str(value + total).encode())],
                [Get(self.key)],
            )
            if result.succeeded:
                self.known = (value + total, result.revision)
                out, running = [], value
                for d in deltas:
                    running += d
                    out.append(running)
                return out
            found = result.results[0]
            self.known = (_counter_value(found[0]), found[0].mod_revision) if found else (0, 0)
        raise Busy("the counter is contended by other replicas: try again")

    async def refresh(self) -> None:
        """Read the current value (linearizable): fails cleanly, writing nothing, when etcd
        has no majority; then a flush's transaction is unlikely to end in doubt."""
        kv = await self.store.get(self.key)
        self.known = (_counter_value(kv), kv.mod_revision if kv else 0)


class _Queue:
    """Strong offers (batched, advancing ``seq``) and polls (batched claims) of one queue."""

    def __init__(self, store: Store, prefix: bytes) -> None:
        self.store = store
        self.seq_key = prefix + b"seq"
        self.items = prefix + b"q/"
        self.known: tuple[int, int] = (0, 0)  # last sequence number, mod revision of seq
        self.offers: Combiner[bytes, None] = Combiner(self.offer_batch, MAX_TXN_OPS - 1)
        self.polls: Combiner[None, bytes | None] = Combiner(self._poll, MAX_TXN_OPS)

    async def offer_batch(self, values: list[bytes]) -> list[None]:
        for _ in range(100):
            n, mod = self.known
            ops: list[Op] = [Put(self.seq_key, str(n + len(values)).encode())]
            ops += [Put(self.items + b"%020d" % (n + 1 + i), v) for i, v in enumerate(values)]
            result = await self.store.txn(
                [Compare(self.seq_key, "mod", "==", mod)], ops, [Get(self.seq_key)]
            )
            if result.succeeded:
                self.known = (n + len(values), result.revision)
                return [None] * len(values)
            found = result.results[0]
            self.known = (_counter_value(found[0]), found[0].mod_revision) if found else (0, 0)
        raise Busy("the queue is contended by other replicas: try again")

    async def refresh(self) -> None:
        kv = await self.store.get(self.seq_key)
        self.known = (_counter_value(kv), kv.mod_revision if kv else 0)

    async def _poll(self, polls: list[None]) -> list[bytes | None]:
        """Claim up to ``len(polls)`` head items at once. A poller gets ``None`` only when a
        linearizable read found the queue empty (then it was empty at that instant)."""
        got: list[bytes | None] = []
        conflicts = 0
        while len(got) < len(polls):
            want = len(polls) - len(got) if conflicts < 3 else 1
            heads = await self.store.range(self.items, limit=want)
            if not heads:
                break
            claim = await self.store.txn(
                [Compare(kv.key, "mod", "==", kv.mod_revision) for kv in heads],
                [Delete(kv.key) for kv in heads],
            )
            if claim.succeeded:
                got += [kv.value for kv in heads]
            else:
                conflicts += 1  # another replica claimed one of them: look again
        return got + [None] * (len(polls) - len(got))


# eventual: this replica's copy of a collection, and its buffered writes


@dataclass
class _Pending:
    value: bytes | None  # None: deleted
    seq: int
    flushed_at: int = 0  # the etcd revision that holds it, once written
    order: int = 0  # where it iterates among the buffered keys (first write)
    recreated: bool = False  # deleted then written again: it moves to the end


@dataclass
class _CounterPending:
    reset: bool = False
    delta: int = 0


class Replica:
    """This service replica's copy of one collection's keys (``prefix``), with the eventual
    writes it acknowledged and has not seen come back from etcd yet."""

    def __init__(self, engine: Engine, prefix: bytes) -> None:
        self.engine, self.prefix = engine, prefix
        self.mirror: dict[bytes, KeyValue] = {}
        self.revision = 0  # the mirror holds every event up to this revision
        self.loaded = asyncio.Event()
        self.overlay: dict[bytes, _Pending] = {}
        self.dirty: dict[bytes, None] = {}  # overlay keys not written yet, in order
        self.cleared: _Pending | None = None  # a buffered clear of the whole collection
        self.clear_dirty = False
        self.unseen: deque[tuple[int, bytes, int]] = deque()  # (revision, key, seq) written
        self.counter = _CounterPending()
        self.counter_inflight: deque[tuple[int, _CounterPending]] = deque()
        self.offers: list[bytes] = []
        self.used = time.monotonic()
        self.task: asyncio.Task[None] | None = None
        self.failing = False  # the last load failed: reads do not wait for the next

    # the copy

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._follow())

    async def ready(self) -> bool:
        """True once the copy is loaded; False if etcd did not give it within a second."""
        self.used = time.monotonic()
        self.start()
        if self.loaded.is_set() or self.failing:
            return self.loaded.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.loaded.wait(), 1.0)
        return self.loaded.is_set()

    async def _follow(self) -> None:
        backoff = 0.1
        store = self.engine.store
        while True:
            try:
                snapshot = await store.txn([], [Get(self.prefix, prefix=True)])
                self.mirror = {kv.key: kv for kv in snapshot.results[0]}
                self.revision = snapshot.revision
                self._prune()
                self.loaded.set()
                self.failing = False
                backoff = 0.1
                async for event in store.watch(self.prefix, start_revision=self.revision + 1):
                    self._apply(event)
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as e:
                self.failing = True
                log.info("copy of %r: %s; reloading", self.prefix, e)
            except Exception:
                self.failing = True
                log.exception("copy of %r failed; reloading", self.prefix)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _apply(self, event: WatchEvent) -> None:
        kv = event.kv
        current = self.mirror.get(kv.key)
        if current is None or current.mod_revision < kv.mod_revision:
            if event.kind == "put":
                self.mirror[kv.key] = kv
            elif current is not None:
                del self.mirror[kv.key]
        self.revision = max(self.revision, kv.mod_revision)
        self._prune()

    def _prune(self) -> None:
        """Drop what was written and has come back through the watch: the copy has it."""
        while self.unseen and self.unseen[0][0] <= self.revision:
            _, key, seq = self.unseen.popleft()
            pending = self.overlay.get(key)
            if pending is not None and pending.seq == seq and key not in self.dirty:
                del self.overlay[key]
        cleared = self.cleared
        if cleared is not None and not self.clear_dirty and 0 < cleared.flushed_at <= self.revision:
            self.cleared = None
        while self.counter_inflight and self.counter_inflight[0][0] <= self.revision:
            self.counter_inflight.popleft()

    async def snapshot(self) -> dict[bytes, KeyValue]:
        """The keys as this replica sees them (its copy, or a serializable read while the
        copy is loading), before its own buffered writes."""
        if await self.ready():
            return self.mirror
        kvs = await self.engine.store.range(self.prefix, consistency="eventual")
        return {kv.key: kv for kv in kvs}

    # entries (dict, set, registry)

    async def lookup(self, key: bytes) -> bytes | None:
        pending = self.overlay.get(key)
        if pending is not None:
            return pending.value
        if self.cleared is not None:
            return None
        kv = (await self.snapshot()).get(key)
        return None if kv is None else kv.value

    async def entries(self) -> list[tuple[bytes, bytes]]:
        base = {} if self.cleared is not None else await self.snapshot()
        order = sorted(base.values(), key=lambda kv: (kv.create_revision, kv.key))
        out = {kv.key: kv.value for kv in order}
        for key, pending in sorted(self.overlay.items(), key=lambda item: item[1].order):
            if pending.value is None or pending.recreated:
                out.pop(key, None)
            if pending.value is not None:
                out[key] = pending.value
        return list(out.items())

    def write(self, key: bytes, value: bytes | None) -> None:
        self.engine.admit()
        self.engine.buffered += 1
        seq = self.engine.next_seq()
        before = self.overlay.get(key)
        if before is None:
            pending = _Pending(value, seq, order=seq)
        elif before.value is None:  # deleted, now back: at the end, as in a dict
            pending = _Pending(value, seq, order=seq, recreated=value is not None)
        else:
            pending = _Pending(value, seq, order=before.order, recreated=before.recreated)
        self.overlay[key] = pending
        self.dirty[key] = None
        self.engine.wrote(self)

    def clear(self) -> None:
        self.engine.admit()
        self.engine.buffered += 1
        self.overlay.clear()
        self.dirty.clear()
        self.unseen.clear()
        self.cleared = _Pending(None, self.engine.next_seq())
        self.clear_dirty = True
        self.engine.wrote(self)

    # counter

    async def counter_value(self, key: bytes) -> int:
        kv = (await self.snapshot()).get(key)
        value = _counter_value(kv)
        for _, step in self.counter_inflight:
            value = (0 if step.reset else value) + step.delta
        return (0 if self.counter.reset else value) + self.counter.delta

    def counter_write(self, delta: int, reset: bool) -> None:
        self.engine.admit()
        self.engine.buffered += 1
        if reset:
            self.counter = _CounterPending(reset=True)
        self.counter.delta += delta
        self.engine.wrote(self)

    # queue

    def offer(self, value: bytes) -> None:
        self.engine.admit()
        self.offers.append(value)
        self.engine.buffered += 1
        self.engine.wrote(self)

    @property
    def backlog(self) -> int:
        """Buffered writes not yet sent to etcd."""
        counter = 1 if self.counter.reset or self.counter.delta else 0
        return len(self.dirty) + int(self.clear_dirty) + counter + len(self.offers)

    @property
    def idle(self) -> bool:
        return (
            not self.dirty
            and not self.clear_dirty
            and not self.offers
            and not self.counter.reset
            and not self.counter.delta
        )


class _Changes:
    """Wakes a waiter when anything under a prefix changes (a watch pumped into an event)."""

    def __init__(self, store: Store, prefix: bytes, start_revision: int) -> None:
        self._event = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._pump(store, prefix, start_revision)
        )

    async def _pump(self, store: Store, prefix: bytes, start_revision: int) -> None:
        try:
            async for _ in store.watch(prefix, start_revision=start_revision):
                self._event.set()
        finally:
            self._event.set()  # a broken watch wakes the waiter: it reads again

    async def wait(self, seconds: float) -> None:
        """Until something changed or ``seconds`` passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), max(0.0, seconds))
        self._event.clear()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


@dataclass
class Stats:
    """What the eventual path did (for tests, benchmarks and logs)."""

    flushes: int = 0
    flushed: int = 0  # writes that reached etcd
    dropped: int = 0  # counter adds and queue offers whose write ended in doubt
    failures: int = 0
    lost_on_close: int = 0


class Engine:
    """The collections of every namespace and compute, over one store; see the module
    docstring. ``call`` is the whole interface: HTTP routes and the embedded client use it.
    """

    def __init__(
        self,
        store: Store,
        *,
        flush_interval: float = 0.05,
        max_batch: int = MAX_TXN_OPS,
        max_buffer: int = 10_000,
        max_wait: float = 25.0,
        arrival_ttl: int = 15,
        idle: float = 120.0,
    ) -> None:
        self.store = store
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.max_buffer = max_buffer
        self.max_wait = max_wait
        self.arrival_ttl = arrival_ttl
        self.idle = idle
        self.buffered = 0
        self.stats = Stats()
        self._seq = 0
        self._puts: Combiner[tuple[bytes, bytes], None] = Combiner(
            self._put_batch, MAX_TXN_OPS, parallel=4
        )
        self._gets: Combiner[bytes, KeyValue | None] = Combiner(
            self._get_batch, MAX_TXN_OPS, parallel=4
        )
        self._counters: dict[bytes, _Counter] = {}
        self._queues: dict[bytes, _Queue] = {}
        self._replicas: dict[bytes, Replica] = {}
        self._dirty: dict[bytes, Replica] = {}
        self._wake: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._flush_lock: asyncio.Lock | None = None
        self._closed = False
        self._ops: dict[str, dict[str, Callable[[bytes, dict[str, Any]], Awaitable[Any]]]] = {
            "dict": {
                "get": self._get,
                "set": self._set,
                "setdefault": self._setdefault,
                "delete": self._delete,
                "pop": self._pop,
                "contains": self._contains,
                "len": self._len,
                "items": self._items,
                "keys": self._keys,
                "clear": self._clear,
            },
            "set": {
                "add": self._add,
                "remove": self._delete,
                "contains": self._contains,
                "len": self._len,
                "items": self._keys,
                "clear": self._clear,
            },
            "registry": {
                "register": self._set,
                "lookup": self._get,
                "unregister": self._delete,
                "list": self._keys,
                "contains": self._contains,
                "len": self._len,
                "clear": self._clear,
            },
            "counter": {
                "add": self._counter_add,
                "get": self._counter_get,
                "reset": self._counter_reset,
            },
            "queue": {
                "offer": self._offer,
                "poll": self._poll,
                "len": self._queue_len,
                "clear": self._queue_clear,
            },
            "barrier": {"wait": self._barrier_wait},
            "lock": {
                "acquire": self._lock_acquire,
                "keepalive": self._lock_keepalive,
                "release": self._lock_release,
            },
        }

    # the interface

    async def call(
        self,
        namespace: str,
        compute: str,
        kind: str,
        name: str,
        op: str,
        args: dict[str, Any],
    ) -> dict[str, Any]:
        """Run ``op`` on one collection. Raises :class:`CollectionError` (a refusal with an
        HTTP status) or :class:`o41.state.StoreUnavailable` (etcd cannot answer now)."""
        if self._closed:
            raise Busy("the collections are shutting down: try again")
        prefix = collection_prefix(namespace, compute, kind, name)
        handler = self._ops[kind].get(op)
        if handler is None:
            raise BadRequest(
                f"a {kind} has no operation {op!r}: {', '.join(sorted(self._ops[kind]))}"
            )
        result: dict[str, Any] = await handler(prefix, args)
        return result

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _put_batch(self, items: list[tuple[bytes, bytes]]) -> list[None]:
        """Strong puts that arrived together, in one transaction: all commit at one
        revision, inside every request's lifetime (linearizable), for one round trip. Of
        two puts of one key, the later wins, as if it came right after the other."""
        if len(items) == 1:
            await self.store.put(*items[0])
        else:
            await self.store.txn([], [Put(k, v) for k, v in dict(items).items()])
        return [None] * len(items)

    async def _get_batch(self, keys: list[bytes]) -> list[KeyValue | None]:
        """Strong reads that arrived together, in one transaction: one linearizable read
        (one quorum confirmation) at one revision for all of them."""
        if len(keys) == 1:
            return [await self.store.get(keys[0])]
        result = await self.store.txn([], [Get(k) for k in keys])
        return [found[0] if found else None for found in result.results]

    # dict, set, registry

    def _replica(self, prefix: bytes, follow: bool = True) -> Replica:
        """This replica's copy of the keys under ``prefix``; ``follow``: keep the copy
        (a queue's replica only buffers offers)."""
        replica = self._replicas.get(prefix)
        if replica is None:
            replica = self._replicas[prefix] = Replica(self, prefix)
            self._ensure_flusher()
        if follow:
            replica.start()
        replica.used = time.monotonic()
        return replica

    async def _get(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"e/" + _key(args)
        if _consistency(args) == "eventual":
            value = await self._replica(prefix + b"e/").lookup(key)
        else:
            kv = await self._gets.submit(key)
            value = None if kv is None else kv.value
        return {"found": value is not None, "value": value}

    async def _contains(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        found = await self._get(prefix, args)
        return {"found": found["found"]}

    async def _set(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key, value = prefix + b"e/" + _key(args), _value(args)
        if _consistency(args) == "eventual":
            self._replica(prefix + b"e/").write(key, value)
        else:
            await self._puts.submit((key, value))
        return {}

    async def _add(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        return await self._set(prefix, {**args, "value": b""})

    async def _setdefault(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key, value = prefix + b"e/" + _key(args), _value(args)
        if _consistency(args) == "eventual":
            replica = self._replica(prefix + b"e/")
            current = await replica.lookup(key)
            if current is None:
                replica.write(key, value)
                current = value
            return {"value": current}
        result = await self.store.txn(
            [Compare(key, "version", "==", 0)], [Put(key, value)], [Get(key)]
        )
        return {"value": value if result.succeeded else result.results[0][0].value}

    async def _delete(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"e/" + _key(args)
        if _consistency(args) == "eventual":
            replica = self._replica(prefix + b"e/")
            found = await replica.lookup(key) is not None
            replica.write(key, None)
            return {"found": found}
        return {"found": await self.store.delete(key) > 0}

    async def _pop(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"e/" + _key(args)
        if _consistency(args) == "eventual":
            replica = self._replica(prefix + b"e/")
            value = await replica.lookup(key)
            if value is not None:
                replica.write(key, None)
        else:
            result = await self.store.txn([], [Delete(key)])
            value = result.results[0][0].value if result.results[0] else None
        return {"found": value is not None, "value": value}

    async def _entries(self, prefix: bytes, args: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        if _consistency(args) == "eventual":
            found = await self._replica(prefix + b"e/").entries()
        else:
            kvs = await self.store.range(prefix + b"e/")
            kvs.sort(key=lambda kv: (kv.create_revision, kv.key))
            found = [(kv.key, kv.value) for kv in kvs]
        skip = len(prefix) + 2
        return [(key[skip:], value) for key, value in found]

    async def _items(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        return {"items": [(k.decode(), v) for k, v in await self._entries(prefix, args)]}

    async def _keys(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        return {"keys": [k.decode() for k, _ in await self._entries(prefix, args)]}

    async def _len(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        return {"len": len(await self._entries(prefix, args))}

    async def _clear(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        if _consistency(args) == "eventual":
            self._replica(prefix + b"e/").clear()
        else:
            await self.store.delete(prefix + b"e/", prefix=True)
        return {}

    # counter

    def _counter(self, key: bytes) -> _Counter:
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = _Counter(self.store, key)
        return counter

    async def _counter_add(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        n = _int(args, "n", 1)
        key = prefix + b"value"
        if _consistency(args) == "eventual":
            replica = self._replica(key)
            replica.counter_write(n, reset=False)
            return {"value": await replica.counter_value(key)}
        return {"value": await self._counter(key).combiner.submit(n)}

    async def _counter_get(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"value"
        if _consistency(args) == "eventual":
            return {"value": await self._replica(key).counter_value(key)}
        return {"value": _counter_value(await self._gets.submit(key))}

    async def _counter_reset(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"value"
        if _consistency(args) == "eventual":
            self._replica(key).counter_write(0, reset=True)
        else:
            revision = await self.store.put(key, b"0")
            self._counter(key).known = (0, revision)
        return {}

    # queue

    def _queue(self, prefix: bytes) -> _Queue:
        queue = self._queues.get(prefix)
        if queue is None:
            queue = self._queues[prefix] = _Queue(self.store, prefix)
        return queue

    async def _offer(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        value = _value(args)
        if _consistency(args) == "eventual":
            self._replica(prefix + b"q/", follow=False).offer(value)
        else:
            await self._queue(prefix).offers.submit(value)
        return {}

    async def _poll(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Always a claim in etcd (exactly-once delivery needs agreement); eventual polls
        also take this replica's own offers that are not written yet."""
        value = await self._queue(prefix).polls.submit(None)
        if value is None and _consistency(args) == "eventual":
            replica = self._replicas.get(prefix + b"q/")
            if replica is not None and replica.offers:
                value = replica.offers.pop(0)
                self.buffered -= 1
        return {"found": value is not None, "value": value}

    async def _queue_len(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        if _consistency(args) == "eventual":
            kvs = await self.store.range(prefix + b"q/", consistency="eventual")
            replica = self._replicas.get(prefix + b"q/")
            return {"len": len(kvs) + (len(replica.offers) if replica else 0)}
        return {"len": len(await self.store.range(prefix + b"q/"))}

    async def _queue_clear(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        replica = self._replicas.get(prefix + b"q/")
        if replica is not None and replica.offers:
            self.buffered -= len(replica.offers)
            replica.offers.clear()
        await self.store.delete(prefix + b"q/", prefix=True)
        return {}

    # barrier

    async def _barrier_wait(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Arrive (once per participant id, however often the request is retried) and wait
        up to ``timeout`` (at most ``max_wait``) for ``parties`` arrivals.

        ``final``: the participant gives up when this request times out, so it withdraws,
        atomically: either it withdrew and the generation cannot release with it, or the
        generation was released with it first. Otherwise the answer carries the lease and
        generation for the next request of the same wait.
        """
        parties = _int(args, "parties", lo=1, hi=MAX_PARTIES)
        who = _id(args, "participant")
        wait = _float(args, "timeout", self.max_wait)
        deadline = time.monotonic() + min(wait, self.max_wait)
        final = bool(args.get("final", True)) and wait <= self.max_wait
        lease = _int(args, "lease", 0, lo=0)
        generation = _int(args, "generation", -1, lo=-1)  # where this participant arrived
        await self._barrier_parties(prefix, parties)
        if not lease or await self.store.lease_keepalive(lease) <= 0:
            lease = await self.store.lease_grant(self.arrival_ttl)
        gen_key, slots = prefix + b"gen", prefix + b"s/"
        changes: _Changes | None = None
        refreshed = time.monotonic()
        mine: list[bytes] = []
        others = 0
        try:
            while True:
                snap = await self.store.txn(
                    [],
                    [Get(gen_key), Get(slots, prefix=True), Get(_released(prefix, generation))],
                )
                gen = _counter_value(snap.results[0][0]) if snap.results[0] else 0
                taken = {kv.key: kv for kv in snap.results[1]}
                if 0 <= generation < gen:
                    index = _released_index(snap.results[2], who)
                    if index is not None:
                        await self.store.lease_revoke(lease)
                        return {"released": True, "index": index}
                    generation = -1  # the arrival expired before the release: arrive again
                mine = [k for k, kv in taken.items() if kv.value.decode() == who]
                others = len(taken) - len(mine)
                if not mine:
                    free = [i for i in range(parties) if slots + b"%06d" % i not in taken]
                    if free:
                        slot = slots + b"%06d" % free[0]
                        try:
                            await self.store.txn(
                                [_gen_is(gen_key, gen), Compare(slot, "version", "==", 0)],
                                [Put(slot, who.encode(), lease=lease)],
                            )
                        except LeaseNotFound:
                            lease = await self.store.lease_grant(self.arrival_ttl)
                        continue  # read again: arrived, or lost the race for that slot
                    # a full generation (others are being released): wait for the next
                else:
                    generation = gen
                    if len(taken) >= parties and await self._barrier_release(prefix, gen, taken):
                        continue  # the next read finds the release record
                if changes is None:
                    changes = _Changes(self.store, prefix, snap.revision + 1)
                now = time.monotonic()
                if now >= deadline:
                    break
                if now - refreshed > self.arrival_ttl / 3:
                    await self.store.lease_keepalive(lease)
                    refreshed = now
                await changes.wait(min(deadline - now, self.arrival_ttl / 3))
        finally:
            if changes is not None:
                await changes.close()
        if not final:
            return {"released": False, "lease": lease, "generation": generation}
        if mine:
            withdrawn = await self.store.txn(
                [_gen_is(gen_key, generation)], [Delete(key) for key in mine]
            )
            if not withdrawn.succeeded:  # the generation moved on: released with it?
                record = await self.store.get(_released(prefix, generation))
                index = _released_index((record,) if record else (), who)
                if index is not None:
                    await self.store.lease_revoke(lease)
                    return {"released": True, "index": index}
        await self.store.lease_revoke(lease)
        return {"released": False, "timed_out": True, "arrived": others, "parties": parties}

    async def _barrier_parties(self, prefix: bytes, parties: int) -> None:
        key = prefix + b"parties"
        result = await self.store.txn(
            [Compare(key, "version", "==", 0)], [Put(key, str(parties).encode())], [Get(key)]
        )
        if not result.succeeded:
            have = _counter_value(result.results[0][0])
            if have != parties:
                raise Conflict(
                    f"this barrier was created for {have} parties, not {parties}: use one "
                    "number of parties per barrier name"
                )

    async def _barrier_release(self, prefix: bytes, gen: int, taken: dict[bytes, KeyValue]) -> bool:
        """Release generation ``gen`` if its slots are still held by the very arrivals seen
        (none withdrew or expired meanwhile): one transaction advances the generation,
        frees the slots and records who was released, with their arrival index."""
        released = {kv.value.decode(): i for i, (_, kv) in enumerate(sorted(taken.items()))}
        ops: list[Op] = [
            Put(prefix + b"gen", str(gen + 1).encode()),
            Delete(prefix + b"s/", prefix=True),
            Put(_released(prefix, gen), json.dumps(released).encode()),
        ]
        if gen >= RELEASES_KEPT:
            ops.append(Delete(_released(prefix, gen - RELEASES_KEPT)))
        result = await self.store.txn(
            [_gen_is(prefix + b"gen", gen)]
            + [Compare(kv.key, "create", "==", kv.create_revision) for kv in taken.values()],
            ops,
        )
        return result.succeeded

    # lock

    async def _lock_acquire(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Take the lock for ``owner`` with a lease of ``ttl`` seconds, waiting up to
        ``timeout`` (at most ``max_wait``). Retrying with the same owner is safe."""
        owner = _id(args, "owner").encode()
        ttl = _int(args, "ttl", 30, lo=1, hi=3600)
        wait = _float(args, "timeout", self.max_wait)
        deadline = time.monotonic() + min(wait, self.max_wait)
        final = bool(args.get("final", True)) and wait <= self.max_wait
        lease = _int(args, "lease", 0, lo=0)
        if not lease or await self.store.lease_keepalive(lease) <= 0:
            lease = await self.store.lease_grant(ttl)
        holder = prefix + b"holder"
        changes: _Changes | None = None
        refreshed = time.monotonic()
        try:
            while True:
                try:
                    result = await self.store.txn(
                        [Compare(holder, "version", "==", 0)],
                        [Put(holder, owner, lease=lease)],
                        [Get(holder)],
                    )
                except LeaseNotFound:
                    lease = await self.store.lease_grant(ttl)
                    continue
                if result.succeeded:
                    return {"acquired": True, "token": result.revision, "lease": lease}
                current = result.results[0][0]
                if current.value == owner:  # a retried request: it is ours already
                    return {
                        "acquired": True,
                        "token": current.create_revision,
                        "lease": current.lease,
                    }
                if changes is None:
                    changes = _Changes(self.store, holder, result.revision + 1)
                now = time.monotonic()
                if now >= deadline:
                    break
                if now - refreshed > ttl / 3:
                    await self.store.lease_keepalive(lease)
                    refreshed = now
                await changes.wait(min(deadline - now, ttl / 3))
        finally:
            if changes is not None:
                await changes.close()
        if final:
            await self.store.lease_revoke(lease)
            return {"acquired": False}
        return {"acquired": False, "lease": lease}

    async def _lock_keepalive(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        ttl = await self.store.lease_keepalive(_int(args, "lease", lo=1))
        return {"alive": ttl > 0, "ttl": ttl}

    async def _lock_release(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        await self.store.lease_revoke(_int(args, "lease", lo=1))
        return {}

    # the eventual writes: buffered, then written in batches

    def admit(self) -> None:
        """Refuse an eventual write when too many wait for etcd (``buffered`` counts writes
        since the last flush, recounted exactly at each flush)."""
        if self.buffered >= self.max_buffer:
            raise Busy(
                f"{self.buffered} eventual writes are waiting for etcd on this replica: "
                "etcd is slow or unreachable; try again, or use strong consistency to wait"
            )

    def wrote(self, replica: Replica) -> None:
        self._dirty[replica.prefix] = replica
        if self.buffered >= self.max_batch and self._wake is not None:
            self._wake.set()

    def _ensure_flusher(self) -> None:
        if self._flusher is None and not self._closed:
            self._wake = asyncio.Event()
            self._flush_lock = asyncio.Lock()
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        assert self._wake is not None
        backoff = self.flush_interval
        last_sweep = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), backoff)
            self._wake.clear()
            try:
                await self.flush()
                backoff = self.flush_interval
            except StoreUnavailable as e:
                self.stats.failures += 1
                log.warning("eventual writes wait for etcd: %s", e)
                backoff = min(max(backoff * 2, 0.1), 2.0)
            except Exception:
                self.stats.failures += 1
                log.exception("writing eventual writes failed")
                backoff = min(max(backoff * 2, 0.1), 2.0)
            if time.monotonic() - last_sweep > min(self.idle, 10.0):
                last_sweep = time.monotonic()
                self._sweep()

    def _sweep(self) -> None:
        """Forget copies nobody read or wrote lately (their watches end)."""
        now = time.monotonic()
        for prefix, replica in list(self._replicas.items()):
            if now - replica.used > self.idle and replica.idle and not replica.overlay:
                if replica.task is not None:
                    replica.task.cancel()
                del self._replicas[prefix]
        for table in (self._counters, self._queues):
            if len(table) > 10_000:  # caches of last values: cheap to lose
                for key in [k for k, v in table.items() if _idle(v)]:
                    del table[key]

    async def flush(self) -> None:
        """Write every buffered eventual write to etcd now (and wait for it)."""
        if self._flush_lock is None:
            return
        async with self._flush_lock:
            await self._flush()

    async def _flush(self) -> None:
        replicas = list(self._dirty.values())
        self._dirty.clear()
        ops: list[Op] = []
        owners: list[tuple[Replica, bytes, _Pending]] = []
        try:
            for replica in replicas:
                if replica.clear_dirty and replica.cleared is not None:
                    result = await self.store.txn([], [Delete(replica.prefix, prefix=True)])
                    replica.cleared.flushed_at = result.revision
                    replica.clear_dirty = False
                    self.stats.flushed += 1
                for key in list(replica.dirty):
                    pending = replica.overlay[key]
                    del replica.dirty[key]
                    value = pending.value
                    ops.append(Delete(key) if value is None else Put(key, value))
                    owners.append((replica, key, pending))
                    if len(ops) >= MAX_TXN_OPS:
                        await self._write(ops, owners)
                        ops, owners = [], []
                if replica.counter.reset or replica.counter.delta:
                    await self._flush_counter(replica)
                if replica.offers:
                    await self._flush_offers(replica)
            if ops:
                await self._write(ops, owners)
                ops, owners = [], []
        finally:
            for replica, key, pending in owners:  # not written: still buffered
                if replica.overlay.get(key) is pending and key not in replica.dirty:
                    replica.dirty[key] = None
            for replica in replicas:
                if not replica.idle:
                    self._dirty[replica.prefix] = replica
            self.buffered = sum(r.backlog for r in self._dirty.values())

    async def _write(self, ops: list[Op], owners: list[tuple[Replica, bytes, _Pending]]) -> None:
        """Puts and deletes are idempotent: a write that failed stays buffered and goes
        out again (the latest value of each key)."""
        result = await self.store.txn([], ops)
        self.stats.flushes += 1
        self.stats.flushed += len(ops)
        for replica, key, pending in owners:
            pending.flushed_at = result.revision
            replica.unseen.append((result.revision, key, pending.seq))
        for replica in {r for r, _, _ in owners}:
            replica._prune()

    async def _flush_counter(self, replica: Replica) -> None:
        """An add is not idempotent: first a read that fails cleanly without a majority
        (then the add stays buffered); if the transaction itself ends in doubt, the add is
        dropped (at most once) and counted in ``stats.dropped``."""
        step = replica.counter
        counter = self._counter(replica.prefix)
        if not step.reset:
            await counter.refresh()  # raises with nothing written: the add stays buffered
        replica.counter = _CounterPending()
        try:
            if step.reset:
                revision = await self.store.put(replica.prefix, str(step.delta).encode())
                counter.known = (step.delta, revision)
            else:
                await counter.combiner.submit(step.delta)
                revision = counter.known[1]
        except StoreUnavailable as e:
            if step.reset:  # a put is idempotent: buffer it again, merged with newer adds
                newer = replica.counter
                replica.counter = (
                    newer if newer.reset else _CounterPending(True, step.delta + newer.delta)
                )
                raise
            self.stats.dropped += 1
            log.warning("an eventual counter add ended in doubt and was dropped: %s", e)
            return
        self.stats.flushed += 1
        replica.counter_inflight.append((revision, step))
        replica._prune()

    async def _flush_offers(self, replica: Replica) -> None:
        """Offers as counter adds: a clean failure keeps them, a doubtful one drops them."""
        queue = self._queue(replica.prefix[: -len(b"q/")])
        await queue.refresh()  # raises with nothing written: the offers stay buffered
        while replica.offers:
            chunk = replica.offers[: MAX_TXN_OPS - 1]
            del replica.offers[: len(chunk)]
            try:
                await queue.offer_batch(chunk)
            except StoreUnavailable as e:
                self.stats.dropped += len(chunk)
                log.warning("%d eventual offers ended in doubt and were dropped: %s", len(chunk), e)
                raise
            self.stats.flushed += len(chunk)

    async def close(self) -> None:
        """Write out what is buffered (on a clean shutdown nothing acknowledged is lost),
        then stop the copies' watches."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(BaseException):
                await self._flusher
        try:
            await self.flush()
        except Exception:
            self.stats.lost_on_close = self.buffered
            log.exception("%d eventual writes not written at shutdown", self.buffered)
        self._closed = True
        for replica in self._replicas.values():
            if replica.task is not None:
                replica.task.cancel()
                with contextlib.suppress(BaseException):
                    await replica.task


def _released(prefix: bytes, generation: int) -> bytes:
    return prefix + b"r/%020d" % max(generation, 0)


def _released_index(record: tuple[KeyValue, ...], who: str) -> int | None:
    """``who``'s arrival index if the release record names it."""
    if not record:
        return None
    index = json.loads(record[0].value).get(who)
    return index if isinstance(index, int) else None


def _gen_is(key: bytes, gen: int) -> Compare:
    """A guard that the barrier's generation is ``gen`` (a missing key is generation 0)."""
    if gen == 0:
        return Compare(key, "version", "==", 0)
    return Compare(key, "value", "==", str(gen).encode())


def _idle(holder: _Counter | _Queue) -> bool:
    if isinstance(holder, _Counter):
        return holder.combiner.idle
    return holder.offers.idle and holder.polls.idle
