"""Eventual consistency: this service replica's copy of a collection (kept fresh by an
etcd watch) and the writes it acknowledged before etcd has them, counted in the engine's
``buffer.Buffer``. The engine flushes them and tells the copy what it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass

from o41.collections.buffer import Buffer
from o41.collections.checks import counter_value
from o41.state.base import Get, KeyValue, Store, StoreUnavailable, WatchEvent

log = logging.getLogger(__name__)


@dataclass
class Buffered:
    value: bytes | None  # None: deleted
    seq: int
    flushed_at: int = 0  # the etcd revision that holds it, once written
    order: int = 0  # where it iterates among the buffered keys (first write)
    recreated: bool = False  # deleted then written again: it moves to the end


@dataclass
class CounterPending:
    reset: bool = False
    delta: int = 0


class Replica:
    """This service replica's copy of one collection's keys (``prefix``), with the eventual
    writes it acknowledged and has not seen come back from etcd yet."""

    def __init__(self, store: Store, buffer: Buffer[Replica], prefix: bytes) -> None:
        self.store, self.buffer, self.prefix = store, buffer, prefix
        self.mirror: dict[bytes, KeyValue] = {}
        # key -> (the revision this replica created it at, where it was first written): etcd
        # gives every key of one transaction the same create revision, so the keys one flush
        # created iterate in the order they were written here, not in the order of their bytes
        self.ranks: dict[bytes, tuple[int, int]] = {}
        self.revision = 0  # the mirror holds every event up to this revision
        self.loaded = asyncio.Event()
        self.overlay: dict[bytes, Buffered] = {}
        self.dirty: dict[bytes, None] = {}  # overlay keys not written yet, in order
        self.cleared: Buffered | None = None  # a buffered clear of the whole collection
        self.clear_dirty = False
        self.unseen: deque[tuple[int, bytes, int]] = deque()  # (revision, key, seq) written
        self.counter = CounterPending()
        self.counter_inflight: deque[tuple[int, CounterPending]] = deque()
        # the counter's step being written, and the counter's value when that write began:
        # meanwhile the step is neither buffered nor known written (see counter_value)
        self.counter_writing: CounterPending | None = None
        self.counter_before = 0
        self.offers: list[bytes] = []
        self.offers_writing: asyncio.Future[None] | None = None  # done when a flush wrote them
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
        store = self.store
        while True:
            try:
                snapshot = await store.txn([], [Get(self.prefix, prefix=True)])
                self.mirror = {kv.key: kv for kv in snapshot.results[0]}
                self.ranks = {k: r for k, r in self.ranks.items() if k in self.mirror}
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
                if kv.create_revision == kv.mod_revision:
                    self._created(kv)
            elif current is not None:
                del self.mirror[kv.key]
                self.ranks.pop(kv.key, None)
        self.revision = max(self.revision, kv.mod_revision)
        self._prune()

    def _created(self, kv: KeyValue) -> None:
        """``kv``'s key was created at its revision while this replica has a write of it:
        its rank among the keys of that transaction is the order it was written in. The
        watch says so even of a write whose answer never came (in doubt, sent again), whose
        second transaction's revision is not the key's create revision."""
        pending = self.overlay.get(kv.key)
        if pending is not None and pending.value is not None:
            self.ranks[kv.key] = (kv.create_revision, pending.order)

    def written(self, revision: int, writes: list[tuple[bytes, Buffered]]) -> None:
        """The engine wrote these buffered writes at ``revision``: each is dropped from the
        overlay once the copy has seen that revision (and it was not written again). A put
        ranks its key only if it has no rank yet: a new value of a key keeps the rank of
        its creation, as a dict keeps the place of a key set again."""
        for key, pending in writes:
            pending.flushed_at = revision
            if pending.value is None:
                self.ranks.pop(key, None)
            else:
                self.ranks.setdefault(key, (revision, pending.order))
            self.unseen.append((revision, key, pending.seq))
        self._prune()

    def clear_written(self, revision: int) -> None:
        """The engine wrote the buffered clear at ``revision``."""
        if self.cleared is not None:
            self.cleared.flushed_at = revision
        self.clear_dirty = False

    def counter_flushing(self, before: int) -> CounterPending:
        """The buffered counter step, handed to the engine to write; adds from now on are
        buffered apart. ``before``: the counter's value just read (linearizable), which
        reads count the step on until :meth:`counter_settled`."""
        step, self.counter = self.counter, CounterPending()
        self.counter_writing, self.counter_before = step, before
        return step

    def counter_written(self, revision: int, step: CounterPending) -> None:
        """The engine wrote the counter's ``step`` at ``revision``: reads add it until the
        copy has seen that revision."""
        self.counter_inflight.append((revision, step))
        self._prune()

    def counter_settled(self) -> None:
        """The write of :meth:`counter_flushing` ended: written (:meth:`counter_written`),
        buffered again, or dropped in doubt."""
        self.counter_writing = None

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
        kvs = await self.store.range(self.prefix, consistency="eventual")
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
        order = sorted(base.values(), key=lambda kv: (kv.create_revision, self._rank(kv), kv.key))
        out = {kv.key: kv.value for kv in order}
        for key, pending in sorted(self.overlay.items(), key=lambda item: item[1].order):
            if pending.value is None or pending.recreated:
                out.pop(key, None)
            if pending.value is not None:
                out[key] = pending.value
        return list(out.items())

    def _rank(self, kv: KeyValue) -> int:
        """Where ``kv`` was first written among the keys this replica created with it in one
        transaction (0 for a key another replica or a strong write created)."""
        rank = self.ranks.get(kv.key)
        return rank[1] if rank is not None and rank[0] == kv.create_revision else 0

    def write(self, key: bytes, value: bytes | None) -> None:
        self.buffer.admit()
        seq = self.buffer.next_seq()
        before = self.overlay.get(key)
        if before is None:
            pending = Buffered(value, seq, order=seq)
        elif before.value is None:  # deleted, now back: at the end, as in a dict
            pending = Buffered(value, seq, order=seq, recreated=value is not None)
        else:
            pending = Buffered(value, seq, order=before.order, recreated=before.recreated)
        self.overlay[key] = pending
        self.dirty[key] = None
        self.buffer.add(self)

    def clear(self) -> None:
        self.buffer.admit()
        self.overlay.clear()
        self.dirty.clear()
        self.unseen.clear()
        self.cleared = Buffered(None, self.buffer.next_seq())
        self.clear_dirty = True
        self.buffer.add(self)

    # counter

    async def counter_value(self, key: bytes) -> int:
        """The copy's value, the written steps it has not seen yet and the buffered one: a
        pod reads its own adds. While a step is being written it is in none of those (and
        the watch may bring it back before the write's answer): then the value the flush
        read before writing it, with the step on top."""
        copy = await self.snapshot()
        writing = self.counter_writing  # no await from here: one moment's state
        if writing is not None:
            value = (0 if writing.reset else self.counter_before) + writing.delta
        else:
            value = counter_value(copy.get(key))
            for _, step in self.counter_inflight:
                value = (0 if step.reset else value) + step.delta
        return (0 if self.counter.reset else value) + self.counter.delta

    def counter_write(self, delta: int, reset: bool) -> None:
        self.buffer.admit()
        if reset:
            self.counter = CounterPending(reset=True)
        self.counter.delta += delta
        self.buffer.add(self)

    # queue

    def offer(self, value: bytes) -> None:
        self.buffer.admit()
        self.offers.append(value)
        self.buffer.add(self)

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


class Changes:
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
