"""Strong operations that arrive together share one etcd transaction.

Under contention this is what keeps a hot counter or queue at one transaction per batch
instead of one compare-and-swap round (and its retries) per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from o41.collections.checks import Busy, counter_value
from o41.state.base import Compare, Get, Op, Put, Store

MAX_TXN_OPS = 100  # etcd refuses more than 128 operations in one transaction

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


class StrongCounter:
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
            self.known = (counter_value(found[0]), found[0].mod_revision) if found else (0, 0)
        raise Busy("the counter is contended by other replicas: try again")

    async def refresh(self) -> None:
        """Read the current value (linearizable): fails cleanly, writing nothing, when etcd
        has no majority; then a flush's transaction is unlikely to end in doubt."""
        kv = await self.store.get(self.key)
        self.known = (counter_value(kv), kv.mod_revision if kv else 0)


class StrongQueue:
    """Strong offers (batched, advancing ``seq``) and polls (batched claims) of one queue."""

    def __init__(self, store: Store, prefix: bytes) -> None:
        self.store = store
        self.seq_key = prefix + b"seq"
        self.items = prefix + b"q/"
        self.known: tuple[int, int] = (0, 0)  # last sequence number, mod revision of seq
        self.offers: Combiner[bytes, None] = Combiner(self.offer_batch, MAX_TXN_OPS - 1)
        self.polls: Combiner[None, bytes | None] = Combiner(self._poll, MAX_TXN_OPS)
        self.head = 0  # where this replica expects the head item (0: not known)
        self.others = False  # whether the last read found offers this replica did not make

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
            self.known = (counter_value(found[0]), found[0].mod_revision) if found else (0, 0)
        raise Busy("the queue is contended by other replicas: try again")

    async def refresh(self) -> None:
        kv = await self.store.get(self.seq_key)
        self.known = (counter_value(kv), kv.mod_revision if kv else 0)

    async def _poll(self, polls: list[None]) -> list[bytes | None]:
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
        while len(got) < len(polls):
            want = len(polls) - len(got)
            span = self.known[0] - self.head + 1  # items this replica knows were offered
            if self.head and (span >= 1 or self.others):
                if span >= 1 and not self.others:
                    want = min(want, span)
                taken = await self.store.take(self._key(self.head), self._key(self.head + want))
                if taken:
                    got += [kv.value for kv in taken]
                    self.head = _sequence(taken[-1].key) + 1
                    continue
            heads = await self.store.range(self.items, limit=1)
            if not heads:
                self.others = False
                break
            self.head = _sequence(heads[0].key)
            self.others = self.head > self.known[0]  # offers through other replicas
        return got + [None] * (len(polls) - len(got))

    def _key(self, sequence: int) -> bytes:
        return self.items + b"%020d" % sequence


def _sequence(key: bytes) -> int:
    """The sequence number of a queue item's key (``.../q/<20 digits>``)."""
    return int(key[-20:])
