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
- lock: ``.../holder`` with the holder's session lease, waiters ``.../w/<owner>`` in
  arrival order; the holder key's mod revision is the fencing token (o41.collections.locks).

Leases never leave the service: etcd's lease ids are one space for every namespace, so a
client that could name one could keep alive or revoke another namespace's lock or the
placement service's own leases. A request finds a lease only through a key under its own
prefix (the holder key whose value is its owner, the slot whose value is its participant).

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
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from o41.collections import values
from o41.collections.buffer import Buffer
from o41.collections.checks import (
    BadRequest,
    Busy,
    Conflict,
    collection_prefix,
    consistency_arg,
    counter_value,
    float_arg,
    id_arg,
    int_arg,
    key_arg,
    operation_arg,
    value_arg,
)
from o41.collections.combining import MAX_TXN_OPS, Combiner, StrongCounter, StrongQueue
from o41.collections.locks import Locks
from o41.collections.once import (
    Memory,
    Recent,
    Txn,
    absent,
    dump,
    first,
    load,
    operation_key,
)
from o41.collections.owners import OwnedStore
from o41.collections.replica import Buffered, Changes, CounterPending, Replica
from o41.state.base import (
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    Store,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

NONE = values.dumps(None)  # how clients encode None (o41.collections.values)

MAX_PARTIES = 10_000
RELEASES_KEPT = 1000  # barrier generations whose released participants stay recorded


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
        owners: Literal["off", "guard", "on"] = "off",
        owner_ttl: int = 5,
    ) -> None:
        # o41.collections.owners. "guard": every write to a dict's, set's or registry's
        # entries carries the owner guard; "on": and this replica may own some (answering
        # their strong reads from memory); "off": neither (no replica may be "on" then)
        self.owned = OwnedStore(store, campaign=owners == "on", ttl=owner_ttl)
        self.store: Store = store if owners == "off" else self.owned
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.arrival_ttl = arrival_ttl
        self.idle = idle
        self.buffer: Buffer[Replica] = Buffer(max_buffer, max_batch, self._wake_flusher)
        self.stats = Stats()
        self.memory = Memory(self.store)  # where operations with ids keep their first answers
        self.recent = Recent()  # eventual operations' first answers on this replica
        # one batch in flight: what arrives meanwhile is the next batch, so a batch's size
        # follows the load (16 workers: +30% strong sets, +60% strong gets a second against
        # four in flight: docs/collections.md, "Strong and eventual")
        self._puts: Combiner[tuple[bytes, bytes, bytes | None], dict[str, Any]] = Combiner(
            self._put_batch, MAX_TXN_OPS, weight=_put_weight
        )
        self._gets: Combiner[bytes, KeyValue | None] = Combiner(self._get_batch, MAX_TXN_OPS)
        self.locks = Locks(self.store, max_wait, self.memory)
        self._counters: dict[bytes, StrongCounter] = {}
        self._queues: dict[bytes, StrongQueue] = {}
        self._replicas: dict[bytes, Replica] = {}
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
        operation_arg(args)  # checked whatever the operation (reads need none)
        handler = self._ops[kind].get(op)
        if handler is None:
            raise BadRequest(
                f"a {kind} has no operation {op!r}: {', '.join(sorted(self._ops[kind]))}"
            )
        result: dict[str, Any] = await handler(prefix, args)
        return result

    def operations(self) -> Mapping[str, Collection[str]]:
        """Each kind's operations, by name (what a caller may ask for)."""
        return self._ops

    @property
    def buffered(self) -> int:
        """Eventual writes acknowledged and not written to etcd yet."""
        return self.buffer.count

    async def _put_batch(
        self, items: list[tuple[bytes, bytes, bytes | None]]
    ) -> list[dict[str, Any]]:
        """Strong puts that arrived together, in one transaction: all commit at one
        revision, inside every request's lifetime (linearizable), for one round trip. Of
        two puts of one key, the later wins, as if it came right after the other. A put
        with an operation key writes it too, guarded on its absence: when one is there
        already (a repeat), that put is left out and the others go again."""
        if all(item[2] is None for item in items):
            if len(items) == 1:
                await self.store.put(items[0][0], items[0][1])
            else:
                await self.store.txn(
                    [], [Put(k, v) for k, v in {i[0]: i[1] for i in items}.items()]
                )
            return [{}] * len(items)
        todo = list(range(len(items)))
        for _ in range(100):
            firsts: dict[bytes, int] = {}
            puts: dict[bytes, bytes] = {}
            for i in todo:
                key, value, op = items[i]
                if op is None or op not in firsts:
                    puts[key] = value
                    if op is not None:
                        firsts[op] = i

            def build(
                lease: int, firsts: dict[bytes, int] = firsts, puts: dict[bytes, bytes] = puts
            ) -> Txn:
                return (
                    [absent(k) for k in firsts],
                    [Put(k, v) for k, v in puts.items()] + [Put(k, b"{}", lease) for k in firsts],
                    [Get(k) for k in firsts],
                )

            result = await self.memory.txn(build)
            if result.succeeded:
                break
            remembered = {k for n, k in enumerate(firsts) if result.results[n]}
            todo = [i for i in todo if items[i][2] not in remembered]
            if not todo:
                break
        else:
            raise Busy("these writes are contended: try again")
        return [{}] * len(items)

    def _operation(self, prefix: bytes, args: dict[str, Any]) -> bytes | None:
        """The key of this operation's first answer, if it carries an id."""
        operation = operation_arg(args)
        return None if operation is None else operation_key(_compute_base(prefix), operation)

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
            replica = self._replicas[prefix] = Replica(self.store, self.buffer, prefix)
            self._ensure_flusher()
        if follow:
            replica.start()
        replica.used = time.monotonic()
        return replica

    async def _get(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"e/" + key_arg(args)
        if consistency_arg(args) == "eventual":
            value = await self._replica(prefix + b"e/").lookup(key)
        else:
            served, kv = await self.owned.read(prefix + b"e/", key)
            if not served:
                kv = await self._gets.submit(key)
            value = None if kv is None else kv.value
        return {"found": value is not None, "value": value}

    async def _contains(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        found = await self._get(prefix, args)
        return {"found": found["found"]}

    async def _set(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key, value = prefix + b"e/" + key_arg(args), value_arg(args)
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(prefix + b"e/")

            async def write() -> dict[str, Any]:
                replica.write(key, value)
                return {}

            return await self.recent.once(once, write)
        return await self._puts.submit((key, value, once))

    async def _add(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        return await self._set(prefix, {**args, "value": b""})

    async def _setdefault(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key, value = prefix + b"e/" + key_arg(args), value_arg(args)
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(prefix + b"e/")

            async def write() -> dict[str, Any]:
                current = await replica.lookup(key)
                if current is None:
                    replica.write(key, value)
                    current = value
                return {"value": current}

            return await self.recent.once(once, write)
        if once is None:
            result = await self.store.txn(
                [Compare(key, "version", "==", 0)], [Put(key, value)], [Get(key)]
            )
            return {"value": value if result.succeeded else result.results[0][0].value}
        # remembered only when it set the key: a repeat after it found one is a fresh read
        result = await self.memory.txn(
            lambda lease: (
                [absent(once), absent(key)],
                [Put(key, value), Put(once, dump({"value": value}), lease)],
                [Get(once), Get(key)],
            )
        )
        if result.succeeded:
            return {"value": value}
        return first(result, 0) or {"value": result.results[1][0].value}

    async def _delete(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"e/" + key_arg(args)
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(prefix + b"e/")

            async def write() -> dict[str, Any]:
                found = await replica.lookup(key) is not None
                replica.write(key, None)
                return {"found": found}

            return await self.recent.once(once, write)
        if once is None:
            return {"found": await self.store.delete(key) > 0}
        # remembered only when it deleted the key (a miss had no effect)
        result = await self.memory.txn(
            lambda lease: (
                [absent(once), Compare(key, "version", ">", 0)],
                [Delete(key), Put(once, dump({"found": True}), lease)],
                [Get(once)],
            )
        )
        if result.succeeded:
            return {"found": True}
        return first(result, 0) or {"found": False}

    async def _pop(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"e/" + key_arg(args)
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(prefix + b"e/")

            async def write() -> dict[str, Any]:
                value = await replica.lookup(key)
                if value is not None:
                    replica.write(key, None)
                return {"found": value is not None, "value": value}

            return await self.recent.once(once, write)
        if once is not None:
            return await self._pop_once(key, once)
        result = await self.store.txn([], [Delete(key)])
        value = result.results[0][0].value if result.results[0] else None
        return {"found": value is not None, "value": value}

    async def _pop_once(self, key: bytes, once: bytes) -> dict[str, Any]:
        """A pop with an operation id: its answer (the value) is written with the delete,
        so the value is read first and the delete guarded on it unchanged (two round
        trips). Remembered only when it took a value."""
        for _ in range(100):
            seen = await self.store.txn([], [Get(once), Get(key)])
            if seen.results[0]:
                return load(seen.results[0][0].value)
            if not seen.results[1]:
                return {"found": False, "value": None}
            kv = seen.results[1][0]
            answer = {"found": True, "value": kv.value}

            def build(lease: int, kv: KeyValue = kv, answer: dict[str, Any] = answer) -> Txn:
                return (
                    [absent(once), Compare(key, "mod", "==", kv.mod_revision)],
                    [Delete(key), Put(once, dump(answer), lease)],
                    [Get(once)],
                )

            result = await self.memory.txn(build)
            if result.succeeded:
                return answer
            remembered = first(result, 0)
            if remembered is not None:
                return remembered
        raise Busy("this key is contended: try again")

    async def _entries(self, prefix: bytes, args: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        if consistency_arg(args) == "eventual":
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
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(prefix + b"e/")

            async def write() -> dict[str, Any]:
                replica.clear()
                return {}

            return await self.recent.once(once, write)
        if once is None:
            await self.store.delete(prefix + b"e/", prefix=True)
            return {}
        result = await self.memory.txn(
            lambda lease: (
                [absent(once)],
                [Delete(prefix + b"e/", prefix=True), Put(once, b"{}", lease)],
                [Get(once)],
            )
        )
        return {} if result.succeeded else first(result, 0) or {}

    # counter

    def _counter(self, key: bytes) -> StrongCounter:
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = StrongCounter(self.store, key, self.memory)
        return counter

    async def _counter_add(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        n = int_arg(args, "n", 1)
        key = prefix + b"value"
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(key)

            async def write() -> dict[str, Any]:
                replica.counter_write(n, reset=False)
                return {"value": await replica.counter_value(key)}

            return await self.recent.once(once, write)
        return {"value": await self._counter(key).combiner.submit((n, once))}

    async def _counter_get(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"value"
        if consistency_arg(args) == "eventual":
            return {"value": await self._replica(key).counter_value(key)}
        return {"value": counter_value(await self._gets.submit(key))}

    async def _counter_reset(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        key = prefix + b"value"
        if consistency_arg(args) == "eventual":
            self._replica(key).counter_write(0, reset=True)
        else:
            revision = await self.store.put(key, b"0")
            self._counter(key).known = (0, revision)
        return {}

    # queue

    def _queue(self, prefix: bytes) -> StrongQueue:
        queue = self._queues.get(prefix)
        if queue is None:
            queue = self._queues[prefix] = StrongQueue(self.store, prefix, self.memory)
        return queue

    async def _offer(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        value = value_arg(args)
        if value == NONE:
            raise BadRequest(
                "a queue does not take None: a poll answers None for an empty queue, so a "
                "None item could not be told from no item"
            )
        once = self._operation(prefix, args)
        if consistency_arg(args) == "eventual":
            replica = self._replica(prefix + b"q/", follow=False)

            async def write() -> dict[str, Any]:
                replica.offer(value)
                return {}

            return await self.recent.once(once, write)
        await self._queue(prefix).offers.submit((value, once))
        return {}

    async def _poll(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Always a claim in etcd (exactly-once delivery needs agreement); eventual polls
        also take this replica's own offers that are not written yet. With an operation
        id, a claim's answer is kept in etcd with it; an own offer's, in this replica's
        memory, as every eventual operation's."""
        once = self._operation(prefix, args)
        eventual = consistency_arg(args) == "eventual"
        if once is not None and eventual:
            first = self.recent.get(once)
            if first is not None:  # it took one of this replica's own offers
                return first
        value = await self._queue(prefix).polls.submit(once)
        if value is None and eventual:
            replica = self._replicas.get(prefix + b"q/")
            writing = None if replica is None else replica.offers_writing
            if writing is not None:  # its own offers, neither buffered nor in etcd yet
                await asyncio.shield(writing)
                value = await self._queue(prefix).polls.submit(once)
            if value is None and replica is not None and replica.offers:
                taken = {"found": True, "value": replica.offers.pop(0)}
                self.buffer.discard(1)
                if once is not None:  # an offer not in etcd yet: its answer in memory
                    self.recent.put(once, taken)
                return taken
        return {"found": value is not None, "value": value}

    async def _queue_len(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        if consistency_arg(args) == "eventual":
            kvs = await self.store.range(prefix + b"q/", consistency="eventual")
            replica = self._replicas.get(prefix + b"q/")
            return {"len": len(kvs) + (len(replica.offers) if replica else 0)}
        return {"len": len(await self.store.range(prefix + b"q/"))}

    async def _queue_clear(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        replica = self._replicas.get(prefix + b"q/")
        if replica is not None and replica.offers:
            self.buffer.discard(len(replica.offers))
            replica.offers.clear()
        await self.store.delete(prefix + b"q/", prefix=True)
        queue = self._queues.get(prefix)
        if queue is not None:
            queue.forget()
        return {}

    # barrier

    async def _barrier_wait(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Arrive (once per participant id, however often the request is retried) and wait
        up to ``timeout`` (at most ``max_wait``) for ``parties`` arrivals.

        ``final``: the participant gives up when this request times out, so it withdraws,
        atomically: either it withdrew and the generation cannot release with it, or the
        generation was released with it first. Otherwise the answer carries the generation
        for the next request of the same wait, which finds its arrival again by the slot's
        value (the participant) and keeps that slot's lease alive: no lease id ever leaves
        the service (they are etcd's, shared by every namespace).
        """
        no_lease(args)
        parties = int_arg(args, "parties", lo=1, hi=MAX_PARTIES)
        who = id_arg(args, "participant")
        wait = float_arg(args, "timeout", self.max_wait)
        deadline = time.monotonic() + min(wait, self.max_wait)
        final = bool(args.get("final", True)) and wait <= self.max_wait
        generation = int_arg(args, "generation", -1, lo=-1)  # where this participant arrived
        await self._barrier_parties(prefix, parties)
        gen_key, slots, me = prefix + b"gen", prefix + b"s/", who.encode()
        changes: Changes | None = None
        refreshed = -math.inf  # a slot found from an earlier request: refreshed at once
        lease = 0  # the lease of this participant's slot, found through the slot itself
        granted = 0  # a lease this request granted for its arrival
        mine: list[bytes] = []
        others = 0
        try:
            while True:
                snap = await self.store.txn(
                    [],
                    [Get(gen_key), Get(slots, prefix=True), Get(_released(prefix, generation))],
                )
                gen = counter_value(snap.results[0][0]) if snap.results[0] else 0
                taken = {kv.key: kv for kv in snap.results[1]}
                if 0 <= generation < gen:
                    index = _released_index(snap.results[2], who)
                    if index is not None:
                        return {"released": True, "index": index}
                    generation = -1  # the arrival expired before the release: arrive again
                mine = [k for k, kv in taken.items() if kv.value == me]
                others = len(taken) - len(mine)
                if not mine:
                    free = [i for i in range(parties) if slots + b"%06d" % i not in taken]
                    if free:
                        slot = slots + b"%06d" % free[0]
                        if not granted:
                            granted = await self.store.lease_grant(self.arrival_ttl)
                            refreshed = time.monotonic()
                        try:
                            arrival = await self.store.txn(
                                [_gen_is(gen_key, gen), Compare(slot, "version", "==", 0)],
                                [Put(slot, me, lease=granted)],
                            )
                        except LeaseNotFound:
                            granted = 0
                        else:
                            if arrival.succeeded:  # in ``gen``, even if it is released
                                generation = gen  # before the next read: look there first
                        continue  # read again: arrived, or lost the race for that slot
                    # a full generation (others are being released): wait for the next
                else:
                    generation = gen
                    lease = taken[mine[0]].lease
                    if len(taken) >= parties and await self._barrier_release(prefix, gen, taken):
                        continue  # the next read finds the release record
                if changes is None:
                    changes = Changes(self.store, prefix, snap.revision + 1)
                now = time.monotonic()
                if now >= deadline:
                    break
                if lease and now - refreshed > self.arrival_ttl / 3:
                    await self.store.lease_keepalive(lease)
                    refreshed = now
                await changes.wait(min(deadline - now, self.arrival_ttl / 3))
            if not final:
                if granted != lease:
                    await self._drop(granted)
                granted = lease = 0  # the slot stays held for the next request
                return {"released": False, "generation": generation}
            if mine:
                withdrawn = await self.store.txn(
                    [_gen_is(gen_key, generation)], [Delete(key) for key in mine]
                )
                if not withdrawn.succeeded:  # the generation moved on: released with it?
                    record = await self.store.get(_released(prefix, generation))
                    index = _released_index((record,) if record else (), who)
                    if index is not None:
                        return {"released": True, "index": index}
            return {"released": False, "timed_out": True, "arrived": others, "parties": parties}
        finally:
            if changes is not None:
                await changes.close()
            await self._drop(lease, granted)  # released or withdrawn: its slot is gone

    async def _drop(self, *leases: int) -> None:
        """Revoke leases this request found through its own keys or granted itself (a
        lease left over would hold nothing, but would live its TTL in etcd)."""
        for lease in {lease for lease in leases if lease}:
            try:
                await self.store.lease_revoke(lease)
            except StoreUnavailable as e:  # it expires with its TTL
                log.warning("a lease was not revoked (%s); it expires on its own", e)

    async def _barrier_parties(self, prefix: bytes, parties: int) -> None:
        key = prefix + b"parties"
        result = await self.store.txn(
            [Compare(key, "version", "==", 0)], [Put(key, str(parties).encode())], [Get(key)]
        )
        if not result.succeeded:
            have = counter_value(result.results[0][0])
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

    # lock (o41.collections.locks)

    async def _lock_acquire(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        no_lease(args)
        return await self.locks.acquire(prefix, _compute_base(prefix), args)

    async def _lock_keepalive(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        no_lease(args)
        return await self.locks.keepalive(prefix, args)

    async def _lock_release(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        no_lease(args)
        return await self.locks.release(prefix, args, self._operation(prefix, args))

    # the eventual writes: buffered, then written in batches

    def _wake_flusher(self) -> None:
        """A full batch waits (``self.buffer`` counts it): write it now."""
        if self._wake is not None:
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
        replicas = self.buffer.drain()
        ops: list[Op] = []
        owners: list[tuple[Replica, bytes, Buffered]] = []
        try:
            for replica in replicas:
                if replica.clear_dirty and replica.cleared is not None:
                    result = await self.store.txn([], [Delete(replica.prefix, prefix=True)])
                    replica.clear_written(result.revision)
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
            self.buffer.requeue(replicas)

    async def _write(self, ops: list[Op], owners: list[tuple[Replica, bytes, Buffered]]) -> None:
        """Puts and deletes are idempotent: a write that failed stays buffered and goes
        out again (the latest value of each key)."""
        result = await self.store.txn([], ops)
        self.stats.flushes += 1
        self.stats.flushed += len(ops)
        written: dict[Replica, list[tuple[bytes, Buffered]]] = {}
        for replica, key, pending in owners:
            written.setdefault(replica, []).append((key, pending))
        for replica, writes in written.items():
            replica.written(result.revision, writes)

    async def _flush_counter(self, replica: Replica) -> None:
        """An add is not idempotent: first a read that fails cleanly without a majority
        (then the add stays buffered); if the transaction itself ends in doubt, the add is
        dropped (at most once) and counted in ``stats.dropped``."""
        counter = self._counter(replica.prefix)
        if not replica.counter.reset:
            await counter.refresh()  # raises with nothing written: the add stays buffered
        # taken after the read (a reset meanwhile is in it); reads count it on that value
        step = replica.counter_flushing(counter.known[0])
        try:
            if step.reset:
                revision = await self.store.put(replica.prefix, str(step.delta).encode())
                counter.known = (step.delta, revision)
            else:
                await counter.combiner.submit((step.delta, None))
                revision = counter.known[1]
        except StoreUnavailable as e:
            if step.reset:  # a put is idempotent: buffer it again, merged with newer adds
                newer = replica.counter
                replica.counter = (
                    newer if newer.reset else CounterPending(True, step.delta + newer.delta)
                )
                raise
            self.stats.dropped += 1
            log.warning("an eventual counter add ended in doubt and was dropped: %s", e)
            return
        else:
            self.stats.flushed += 1
            replica.counter_written(revision, step)
        finally:
            replica.counter_settled()

    async def _flush_offers(self, replica: Replica) -> None:
        """Offers as counter adds: a clean failure keeps them, a doubtful one drops them."""
        queue = self._queue(replica.prefix[: -len(b"q/")])
        await queue.refresh()  # raises with nothing written: the offers stay buffered
        # while a chunk is written it is neither buffered nor known in etcd: an eventual
        # poll that finds neither waits for this write (read-your-writes), then claims
        written = replica.offers_writing = asyncio.get_running_loop().create_future()
        try:
            while replica.offers:
                chunk = replica.offers[: MAX_TXN_OPS - 1]
                del replica.offers[: len(chunk)]
                try:
                    await queue.offer_batch([(value, None) for value in chunk])
                except StoreUnavailable as e:
                    self.stats.dropped += len(chunk)
                    log.warning(
                        "%d eventual offers ended in doubt and were dropped: %s", len(chunk), e
                    )
                    raise
                self.stats.flushed += len(chunk)
        finally:
            replica.offers_writing = None
            written.set_result(None)

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
        await self.locks.drain(5.0)  # early lock releases still under way
        self._closed = True
        self.locks.close()
        await self.owned.stop()  # its lease revoked: no replica waits for it
        for replica in self._replicas.values():
            if replica.task is not None:
                replica.task.cancel()
                with contextlib.suppress(BaseException):
                    await replica.task


def no_lease(args: dict[str, Any]) -> None:
    """Refuse a request that names an etcd lease (as earlier clients did): lease ids
    are shared by every namespace, so the service never acts on one a client sends."""
    if "lease" in args:
        raise BadRequest(
            "lease: the service does not take lease ids from clients; a lock is named by "
            "its owner and token, a barrier's arrival by its participant: upgrade the o41 "
            "client in this image"
        )


def _put_weight(item: tuple[bytes, bytes, bytes | None]) -> int:
    """A strong put's operations in a transaction: its own, and its answer's if any."""
    return 1 if item[2] is None else 2


def _compute_base(prefix: bytes) -> bytes:
    """``.../<namespace>/<compute>/`` of a collection's ``.../<kind>/<name>/``."""
    return prefix[: prefix.rstrip(b"/").rsplit(b"/", 2)[0].__len__() + 1]


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


def _idle(holder: StrongCounter | StrongQueue) -> bool:
    if isinstance(holder, StrongCounter):
        return holder.combiner.idle
    return holder.offers.idle and holder.polls.idle
