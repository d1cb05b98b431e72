"""Strong operations that arrive together share one etcd transaction.

Under contention this is what keeps a hot counter or queue at one transaction per batch
instead of one compare-and-swap round (and its retries) per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from o41.collections.checks import Busy, counter_value
from o41.collections.once import Memory, Txn, absent, dump, load
from o41.state.base import Compare, Delete, Get, KeyValue, Op, Put, Store, TxnResult

MAX_TXN_OPS = 100  # etcd refuses more than 128 operations in one transaction
READ_AHEAD = 32  # head items a keyed poll reads beyond its own, for the next polls (fewer
# when they are large: what it reads ahead fits in KNOWN_BYTES)
KNOWN_BYTES = 1 << 20  # a queue's items a replica keeps knowing (their keys and values)
KNOWN_ITEMS = 1024  # and how many at most

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
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R]]],
        limit: int,
        parallel: int = 1,
        weight: Callable[[T], int] | None = None,
    ) -> None:
        self._run = run
        self._limit = limit
        self._weight = weight  # a batch holds at most ``limit`` of it (default: 1 an item)
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
            size = self._limit
            if self._weight is not None:
                total = size = 0
                for item, _ in self._pending[: self._limit]:
                    total += self._weight(item)
                    if size and total > self._limit:
                        break
                    size += 1
            batch = self._pending[:size]
            del self._pending[:size]
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


class StrongCounter:
    """Strong adds to one counter, merged; the last value and revision seen are cached so
    a batch costs one transaction when nobody else wrote in between. An add may carry the
    key of its operation id (:mod:`o41.collections.once`): its answer is written in the
    batch's transaction, guarded on the key's absence."""

    def __init__(self, store: Store, key: bytes, memory: Memory | None = None) -> None:
        self.store, self.key = store, key
        self.memory = memory if memory is not None else Memory(store)
        self.known: tuple[int, int] = (0, 0)  # value, mod revision (0: absent)
        self.combiner: Combiner[tuple[int, bytes | None], int] = Combiner(self._add, MAX_TXN_OPS)

    async def _add(self, adds: list[tuple[int, bytes | None]]) -> list[int]:
        out: list[int | None] = [None] * len(adds)
        todo = list(range(len(adds)))
        for _ in range(100):
            apply, firsts = _firsts(adds, todo)
            value, mod = self.known
            running, answers = value, {}
            for i in apply:
                running += adds[i][0]
                answers[i] = running
            total = running - value

            def build(
                lease: int,
                value: int = value,
                mod: int = mod,
                total: int = total,
                answers: dict[int, int] = answers,
                firsts: dict[bytes, int] = firsts,
            ) -> Txn:
                ops: list[Op] = [Put(self.key, str(value + total).encode())]
                ops += [Put(k, dump({"value": answers[i]}), lease) for k, i in firsts.items()]
                return (
                    [Compare(self.key, "mod", "==", mod), *map(absent, firsts)],
                    ops,
                    [Get(self.key), *map(Get, firsts)],
                )

            if firsts:
                result = await self.memory.txn(build)
            else:
                result = await self.store.txn(*build(0))
            if result.succeeded:
                self.known = (value + total, result.revision)
                for i in todo:
                    op = adds[i][1]
                    out[i] = answers[i] if op is None else answers[firsts[op]]
                return [v for v in out if v is not None]
            found = result.results[0]
            self.known = (counter_value(found[0]), found[0].mod_revision) if found else (0, 0)
            todo = _settled(adds, todo, firsts, result, out, lambda a: int(a["value"]))
            if not todo:
                return [v for v in out if v is not None]
        raise Busy("the counter is contended by other replicas: try again")

    async def refresh(self) -> None:
        """Read the current value (linearizable): fails cleanly, writing nothing, when etcd
        has no majority; then a flush's transaction is unlikely to end in doubt."""
        kv = await self.store.get(self.key)
        self.known = (counter_value(kv), kv.mod_revision if kv else 0)


V = TypeVar("V")


def _firsts(
    items: Sequence[tuple[object, bytes | None]], todo: list[int]
) -> tuple[list[int], dict[bytes, int]]:
    """Of the items still to do, those a batch applies (every one without an operation
    key, and the first of each key: a repeat in the same batch answers as that first),
    and each key's first item."""
    apply: list[int] = []
    firsts: dict[bytes, int] = {}
    for i in todo:
        key = items[i][1]
        if key is None or key not in firsts:
            apply.append(i)
            if key is not None:
                firsts[key] = i
    return apply, firsts


def _settled(
    items: Sequence[tuple[object, bytes | None]],
    todo: list[int],
    firsts: dict[bytes, int],
    result: TxnResult,
    out: list[V | None],
    answer: Callable[[dict[str, Any]], V],
) -> list[int]:
    """After a batch lost its compares: the items whose operation was remembered already
    (the failure branch read their keys, after one ``Get`` of the batch's own) get the
    first answer; the others are left to do again."""
    done: dict[bytes, V] = {}
    for n, key in enumerate(firsts):
        found = result.results[1 + n]
        if found:
            done[key] = answer(load(found[0].value))
    left = []
    for i in todo:
        op = items[i][1]
        if op is not None and op in done:
            out[i] = done[op]
        else:
            left.append(i)
    return left


class StrongQueue:
    """Strong offers (batched, advancing ``seq``) and polls (batched claims) of one queue.
    An offer or a poll may carry the key of its operation id (:mod:`o41.collections.once`)."""

    def __init__(self, store: Store, prefix: bytes, memory: Memory | None = None) -> None:
        self.store = store
        self.memory = memory if memory is not None else Memory(store)
        self.seq_key = prefix + b"seq"
        self.items = prefix + b"q/"
        self.known: tuple[int, int] = (0, 0)  # last sequence number, mod revision of seq
        self.offers: Combiner[tuple[bytes, bytes | None], None] = Combiner(
            self.offer_batch, MAX_TXN_OPS - 1, weight=_weight
        )
        self.polls: Combiner[bytes | None, bytes | None] = Combiner(
            self._poll, MAX_TXN_OPS, weight=_weight_poll
        )
        self.head = 0  # where this replica expects the head item (0: not known)
        self.others = False  # whether the last read found offers this replica did not make
        # items known to be in etcd, by sequence (its offers, the heads it read): a poll
        # with an operation id claims them in one round trip (see _claim_once)
        self.known_items: dict[int, KeyValue] = {}
        self.known_bytes = 0
        self.item_size = 0  # the last item's key and value, in bytes: how far to read ahead

    async def offer_batch(self, offers: list[tuple[bytes, bytes | None]]) -> list[None]:
        """Offers in one transaction (an offer with an operation key and a repeat of it in
        the batch: one item; one whose key is in etcd already: none)."""
        todo = list(range(len(offers)))
        out: list[None] = [None] * len(offers)
        for _ in range(100):
            apply, firsts = _firsts(offers, todo)
            n, mod = self.known

            def build(
                lease: int,
                n: int = n,
                mod: int = mod,
                apply: list[int] = apply,
                firsts: dict[bytes, int] = firsts,
            ) -> Txn:
                ops: list[Op] = [Put(self.seq_key, str(n + len(apply)).encode())]
                ops += [
                    Put(self.items + b"%020d" % (n + 1 + j), offers[i][0])
                    for j, i in enumerate(apply)
                ]
                ops += [Put(k, b"{}", lease) for k in firsts]
                return (
                    [Compare(self.seq_key, "mod", "==", mod), *map(absent, firsts)],
                    ops,
                    [Get(self.seq_key), *map(Get, firsts)],
                )

            if firsts:
                result = await self.memory.txn(build)
            else:
                result = await self.store.txn(*build(0))
            if result.succeeded:
                self.known = (n + len(apply), result.revision)
                for j, i in enumerate(apply):
                    key = self.items + b"%020d" % (n + 1 + j)
                    self._learn(KeyValue(key, offers[i][0], result.revision, result.revision, 1))
                return [None] * len(offers)
            found = result.results[0]
            self.known = (counter_value(found[0]), found[0].mod_revision) if found else (0, 0)
            todo = _settled(offers, todo, firsts, result, out, lambda a: None)
            if not todo:
                return [None] * len(offers)
        raise Busy("the queue is contended by other replicas: try again")

    async def refresh(self) -> None:
        kv = await self.store.get(self.seq_key)
        self.known = (counter_value(kv), kv.mod_revision if kv else 0)

    async def _poll(self, polls: list[bytes | None]) -> list[bytes | None]:
        """Plain polls claim by a delete (:meth:`_claim`); polls with an operation key
        claim by a transaction that writes their answers (:meth:`_claim_once`)."""
        keyed = [key for key in polls if key is not None]
        if not keyed:
            return await self._claim(len(polls))
        plain = iter(await self._claim(len(polls) - len(keyed)) if len(keyed) < len(polls) else [])
        claimed = await self._claim_once(keyed)
        return [next(plain) if key is None else claimed[key] for key in polls]

    async def _claim_once(self, keys: list[bytes]) -> dict[bytes, bytes | None]:
        """Polls with operation keys: each claims a head item and writes its answer in one
        transaction, guarded on the key absent, the item unchanged and no item before the
        first (so they are the oldest); a key found answers what it remembers (a repeat of
        a poll that claimed its item before). The value a poll answers is written into its
        key, so it must be known before the claim: one round trip when this replica knows
        the head items (it offered them, or read them with an earlier poll's heads), else
        two (a read of the keys and of up to :data:`READ_AHEAD` heads, then the claim)."""
        answers: dict[bytes, bytes | None] = {}
        todo = list(dict.fromkeys(keys))
        heads = self._known_heads(len(todo))
        for _ in range(100):
            if not todo:
                return answers
            if not heads:
                more = min(READ_AHEAD, KNOWN_BYTES // max(self.item_size, 1))  # large items: fewer
                ahead = Get(self.items, prefix=True, limit=len(todo) + more)
                seen = await self.store.txn([], [*map(Get, todo), ahead])
                for key, found in zip(todo, seen.results, strict=False):
                    if found:
                        answers[key] = load(found[0].value).get("value")
                todo = [key for key in todo if key not in answers]
                self._read(seen.results[-1], ahead.limit)
                heads = list(seen.results[-1][: len(todo)])
                if not todo:
                    return answers
                if not heads:  # the queue was empty at that revision: nothing claimed
                    answers.update(dict.fromkeys(todo))
                    return answers
            pairs = list(zip(todo, heads, strict=False))
            older = Compare(self.items, "create", "==", 0, prefix=True, end=pairs[0][1].key)

            def build(
                lease: int, pairs: list[tuple[bytes, KeyValue]] = pairs, older: Compare = older
            ) -> Txn:
                return (
                    [absent(k) for k, _ in pairs]
                    + [Compare(kv.key, "mod", "==", kv.mod_revision) for _, kv in pairs]
                    + [older],
                    [Delete(kv.key) for _, kv in pairs]
                    + [Put(k, dump({"found": True, "value": kv.value}), lease) for k, kv in pairs],
                    [],
                )

            result = await self.memory.txn(build)
            heads = []
            if result.succeeded:
                for key, kv in pairs:
                    answers[key] = kv.value
                self.head = max(self.head, _sequence(pairs[-1][1].key) + 1)
                self.forget(self.head)
                todo = todo[len(pairs) :]
                heads = self._known_heads(len(todo))
            else:  # claimed by another poll, a repeat landed, or an older item: read again
                self.forget()
        raise Busy("the queue is contended by other replicas: try again")

    def _learn(self, kv: KeyValue) -> None:
        """Remember an item known to be in etcd (while they fit in :data:`KNOWN_BYTES` and
        :data:`KNOWN_ITEMS`)."""
        size = self.item_size = len(kv.key) + len(kv.value)
        if _sequence(kv.key) in self.known_items:
            self._drop([_sequence(kv.key)])
        if self.known_bytes + size <= KNOWN_BYTES and len(self.known_items) < KNOWN_ITEMS:
            self.known_items[_sequence(kv.key)] = kv
            self.known_bytes += size

    def _read(self, heads: Sequence[KeyValue], limit: int) -> None:
        """What a linearizable read of up to ``limit`` head items found: they are the
        items up to the last of them (a known one among them that it did not find is
        gone), and there is none after them if it found fewer."""
        if len(heads) < limit:
            self.forget()
        elif heads:
            last = _sequence(heads[-1].key)
            self._drop([q for q in self.known_items if q <= last])
        for kv in heads:
            self._learn(kv)

    def forget(self, before: int | None = None) -> None:
        """Forget the items before sequence ``before`` (claimed), or all (None: stale, or
        deleted by a clear)."""
        if before is None:
            self.known_items.clear()
            self.known_bytes = 0
        else:
            self._drop([q for q in self.known_items if q < before])

    def _drop(self, sequences: list[int]) -> None:
        for sequence in sequences:
            kv = self.known_items.pop(sequence)
            self.known_bytes -= len(kv.key) + len(kv.value)

    def _known_heads(self, want: int) -> list[KeyValue]:
        """Up to ``want`` known items of consecutive sequence numbers from the oldest
        known one (a gap could hide an item offered through another replica)."""
        if not self.known_items or not want:
            return []
        first = min(self.known_items)
        heads: list[KeyValue] = []
        while len(heads) < want and first + len(heads) in self.known_items:
            heads.append(self.known_items[first + len(heads)])
        return heads

    async def _claim(self, polls: int) -> list[bytes | None]:
        """Claim up to ``len(polls)`` head items at once, in one round trip when the head
        is where this replica expects it (the item after the last it claimed, or the first
        a read found): a delete of the keys from there, answering those it deleted (of
        concurrent deletes of a key exactly one gets it, so each item goes to one poller;
        and no item older than the head is left, so those are the oldest). When this
        replica knows of no offer past the head (and none came through others lately), it
        reads the head first instead, so that polls of an empty queue cost one round
        trip. A poller gets ``None`` only when a linearizable read found the queue empty
        (then it was empty at that instant)."""
        got: list[bytes | None] = []
        while len(got) < polls:
            want = polls - len(got)
            span = self.known[0] - self.head + 1  # items this replica knows were offered
            if self.head and (span >= 1 or self.others):
                if span >= 1 and not self.others:
                    want = min(want, span)
                taken = await self.store.take(self._key(self.head), self._key(self.head + want))
                if taken:
                    got += [kv.value for kv in taken]
                    self.head = _sequence(taken[-1].key) + 1
                    self.forget(self.head)
                    continue
            heads = await self.store.range(self.items, limit=1)
            if not heads:
                self.others = False
                break
            self.head = _sequence(heads[0].key)
            self.others = self.head > self.known[0]  # offers through other replicas
        return got + [None] * (polls - len(got))

    def _key(self, sequence: int) -> bytes:
        return self.items + b"%020d" % sequence


def _weight(offer: tuple[bytes, bytes | None]) -> int:
    """An offer's operations in a transaction: its item, and its answer's key if any."""
    return 1 if offer[1] is None else 2


def _weight_poll(poll: bytes | None) -> int:
    """A poll with an operation key claims its item and writes its answer: two."""
    return 1 if poll is None else 2


def _sequence(key: bytes) -> int:
    """The sequence number of a queue item's key (``.../q/<20 digits>``)."""
    return int(key[-20:])
