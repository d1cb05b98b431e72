"""Owners: one service replica answers a collection's strong reads from its memory.

A dict, set or registry (the keys under ``.../<kind>/<name>/e/``, its *entries*) may have
an **owner**: the replica whose key ``/o41/owners/<namespace>/<compute>/<kind>/<name>/e/owner``
exists, written under that replica's lease (etcd's election recipe: a create-if-absent
transaction, held while the lease is kept alive). Every write to the entries, by any
replica, strong or eventual, carries a guard in its own transaction (this module wraps the
engine's store and adds it, so no write path can forget it):

- a replica that owns them: the owner key's create revision is its own (its *epoch*);
- any other: no owner key.

So while the owner key exists, the owner's writes are the only writes to the entries. The
owner took a snapshot of the entries in the very transaction that made it owner, and it
applies each of its own writes to that copy when etcd answers it (per key, the newest
revision wins: answers may come back out of order). It answers a strong ``get`` or
``contains`` from that copy only

- after every write to the entries that was in flight through it when the read arrived
  has been answered (a committed write can be visible to others before its answer
  arrives here; a read that waits for it cannot miss it);
- while its lease is certainly alive: the lease is kept alive every ``ttl/4``; an answer
  granting ``t`` seconds to a keep-alive sent at ``s`` (monotonic) means the lease lives
  at least until ``s + t`` as etcd's leader counts, and the owner stops serving at
  ``s + t * (1 - drift) - margin``, so its clock may run ``drift`` slower than the
  leader's and it still stops ``margin`` seconds before the key can go;
- while no write of its own to the entries ended in doubt (a timeout: it may have been
  applied without this copy knowing): then it gives the entries up and reads from etcd.

Everything else (no owner, another replica's collection, a copy in doubt, a lease near
its end) reads from etcd, linearizably, as before: serving from memory is only ever an
optimisation of a read that would have been correct anyway.

A replica that meets another's owner key when it writes asks it to step aside (it puts
``.../e/resign``) and waits until the owner key is gone (the owner, which watches the
owners' keys, stops serving, then deletes its key) or has expired with its lease (a dead or
partitioned owner: at most ``ttl``); its write, which was not applied (its guard failed),
is then sent again. Both then stay away from owning that collection for ``cooldown``
seconds: a collection written through several replicas is served by etcd, as before.

A replica campaigns for the entries of a dict, set or registry when it answers a strong
read of them and nobody owns them (in the background: that read goes to etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from o41.collections.checks import ROOT, Busy
from o41.state.base import (
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
    TxnResult,
    WatchEvent,
)

log = logging.getLogger(__name__)

OWNERS = b"/o41/owners/"
OWNED_KINDS = (b"dict", b"set", b"registry")
TTL = 5  # seconds: the owner's lease; a dead owner holds writes through others this long
MARGIN = 1.0  # seconds: an owner stops serving this long before its lease could expire
DRIFT = 0.01  # how much slower than etcd's leader an owner's clock may run
COOLDOWN = 30.0  # seconds without owning a collection after it was wanted elsewhere
MAX_ENTRIES = 10_000  # a collection with more entries is not owned (memory, snapshot)
MAX_OWNED = 1000  # collections one replica owns at most
MAX_COPY_BYTES = 16 * 1024 * 1024  # a copy's values at most (beyond: given up, not owned)
MAX_BYTES = 256 * 1024 * 1024  # every copy of one replica together, at most
IDLE = 120.0  # seconds: a collection nobody read strongly through its owner is given up


def entries_of(key: bytes) -> bytes | None:
    """The entries prefix of a dict, set or registry (``.../<kind>/<name>/e/``) that
    ``key`` lies under (or is), else None."""
    if not key.startswith(ROOT):
        return None
    parts = key[len(ROOT) :].split(b"/", 5)
    if len(parts) < 6 or parts[2] not in OWNED_KINDS or parts[4] != b"e":
        return None
    return key[: len(ROOT) + sum(len(p) + 1 for p in parts[:5])]


def owner_key(entries: bytes) -> bytes:
    return OWNERS + entries[len(ROOT) :] + b"owner"


def resign_key(entries: bytes) -> bytes:
    return OWNERS + entries[len(ROOT) :] + b"resign"


@dataclass
class Owned:
    """This replica's copy of entries it owns: per key the newest revision it knows."""

    epoch: int  # the owner key's create revision
    data: dict[bytes, KeyValue]
    gone: dict[bytes, int] = field(default_factory=dict)  # deleted key -> revision
    cleared: int = 0  # the revision of the last delete of every entry
    used: float = 0.0  # when it last answered a read (the owner's clock)
    size: int = 0  # bytes of keys and values held

    def put(self, key: bytes, value: bytes, revision: int) -> None:
        old = self.data.get(key)
        if revision <= self.cleared or revision <= self.gone.get(key, 0):
            return
        if old is not None and old.mod_revision >= revision:
            return
        self.gone.pop(key, None)
        self.size += len(key) + len(value) - (0 if old is None else len(key) + len(old.value))
        self.data[key] = KeyValue(key, value, revision, revision, 1)

    def delete(self, key: bytes, prefix: bool, revision: int) -> None:
        if prefix:
            self.cleared = max(self.cleared, revision)
            for k in [k for k, kv in self.data.items() if k.startswith(key)]:
                if self.data[k].mod_revision < revision:
                    self.size -= len(k) + len(self.data.pop(k).value)
            return
        old = self.data.get(key)
        if old is not None and old.mod_revision >= revision:
            return
        if old is not None:
            self.size -= len(key) + len(self.data.pop(key).value)
        self.gone[key] = max(revision, self.gone.get(key, 0))

    def settle(self) -> None:
        """No write is in flight: no answer can come back out of order any more."""
        self.gone.clear()


@dataclass
class Stats:
    served: int = 0  # strong reads answered from an owner's copy
    campaigns: int = 0
    won: int = 0
    resigned: int = 0  # collections given up when another replica asked
    stepped_aside: int = 0  # writes that waited for another replica to give one up
    doubts: int = 0  # copies given up after a write in doubt
    lost: int = 0  # copies given up when the lease or the key was found gone


class OwnedStore:
    """The engine's store: ``store`` with the owner guard on every write to a dict's,
    set's or registry's entries, and this replica's ownership (see the module)."""

    def __init__(
        self,
        store: Store,
        *,
        campaign: bool = True,
        ttl: int = TTL,
        margin: float = MARGIN,
        drift: float = DRIFT,
        cooldown: float = COOLDOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.campaign = campaign
        self.ttl, self.margin, self.drift, self.cooldown = ttl, margin, drift, cooldown
        self.clock = clock
        self.me = uuid.uuid4().hex.encode()
        self.owned: dict[bytes, Owned] = {}
        self.inflight: dict[bytes, set[asyncio.Future[None]]] = {}
        self.lease = 0
        self.safe_until = -float("inf")
        self.stats = Stats()
        self._cool: dict[bytes, float] = {}
        self._campaigns: set[bytes] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._lease_lock: asyncio.Lock | None = None
        self._closed = False

    # reads from the owner's copy

    def serving(self, entries: bytes) -> Owned | None:
        owned = self.owned.get(entries)
        if owned is None or self.clock() >= self.safe_until:
            return None
        return owned

    async def read(self, entries: bytes, key: bytes) -> tuple[bool, KeyValue | None]:
        """``(True, the key's value or None)`` when this replica owns ``entries`` and may
        answer a strong read now; ``(False, None)``: read from etcd (and perhaps campaign
        for them, in the background)."""
        owned = self.owned.get(entries)
        if owned is None:
            self._maybe_campaign(entries)
            return False, None
        pending = self.inflight.get(entries)
        if pending:  # writes in flight through here when the read arrived: their answers
            await asyncio.wait(list(pending))
        if self.owned.get(entries) is not owned or self.serving(entries) is None:
            return False, None  # no await between this check and the answer
        self.stats.served += 1
        owned.used = self.clock()
        return True, owned.data.get(key)

    # the store's interface, the guard added to writes of owned kinds

    async def get(self, key: bytes, *, consistency: Consistency = "strong") -> KeyValue | None:
        return await self.store.get(key, consistency=consistency)

    async def range(
        self,
        prefix: bytes,
        *,
        limit: int = 0,
        consistency: Consistency = "strong",
        start: bytes = b"",
        end: bytes = b"",
    ) -> list[KeyValue]:
        return await self.store.range(
            prefix, limit=limit, consistency=consistency, start=start, end=end
        )

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        if entries_of(key) is None:
            return await self.store.put(key, value, lease=lease)
        return (await self.txn([], [Put(key, value, lease)])).revision

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        if entries_of(key) is None:
            return await self.store.delete(key, prefix=prefix)
        return len((await self.txn([], [Delete(key, prefix)])).results[0])

    async def take(self, start: bytes, end: bytes) -> list[KeyValue]:
        if entries_of(start) is not None:
            raise ValueError("a dict's, set's or registry's entries are not taken by range")
        return await self.store.take(start, end)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        touched = _touched(success, failure)
        if not touched:
            return await self.store.txn(compare, success, failure)
        if any(not isinstance(op, Get) for op in failure):
            raise ValueError("a write to owned entries reads only when its guards fail")
        return await self._guarded(list(compare), success, list(failure), touched)

    def _track(self, owned: list[bytes]) -> asyncio.Future[None] | None:
        """A write guarded on this replica's epoch is in flight: reads of those entries
        wait for its answer (a write guarded on no owner committed before this replica's
        copy was read, or fails: it needs no waiting for)."""
        if not owned:
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for entries in owned:
            self.inflight.setdefault(entries, set()).add(done)
        return done

    def _untrack(self, done: asyncio.Future[None] | None, owned: list[bytes]) -> None:
        if done is None:
            return
        done.set_result(None)
        for entries in owned:
            pending = self.inflight.get(entries)
            if pending is not None:
                pending.discard(done)
                if not pending:
                    del self.inflight[entries]
                    copy = self.owned.get(entries)
                    if copy is not None:
                        copy.settle()

    async def _guarded(
        self, compare: list[Compare], success: Sequence[Op], failure: list[Op], touched: list[bytes]
    ) -> TxnResult:
        deadline = self.clock() + 2 * self.ttl + 5
        while True:
            mine = {entries: self.owned.get(entries) for entries in touched}
            guards = [
                Compare(owner_key(e), "create", "==", o.epoch)
                if o is not None
                else Compare(owner_key(e), "version", "==", 0)
                for e, o in mine.items()
            ]
            ours = [e for e, o in mine.items() if o is not None]
            done = self._track(ours)  # before the transaction leaves
            try:
                result = await self.store.txn(
                    [*compare, *guards],
                    success,
                    [*failure, *(Get(owner_key(e)) for e in touched)],
                )
                if result.succeeded:
                    self._apply(mine, success, result.revision)
                    return result
            except LeaseNotFound:
                raise  # refused before anything was applied
            except BaseException:
                for entries, owned in mine.items():  # it may have been applied unseen
                    if owned is not None:
                        self._give_up(entries, owned, doubt=True)
                raise
            finally:
                self._untrack(done, ours)  # applied (or given up) before reads go on
            found = result.results[len(failure) :]
            failed = False
            for (entries, owned), kvs in zip(mine.items(), found, strict=True):
                kv = kvs[0] if kvs else None
                if owned is not None:
                    if kv is None or kv.create_revision != owned.epoch:
                        failed = True
                        self._give_up(entries, owned, doubt=False)
                        self.stats.lost += 1
                elif kv is not None:
                    failed = True
                    now = self.owned.get(entries)
                    if now is not None and now.epoch == kv.create_revision:
                        pass  # won meanwhile: sent again as the owner's
                    elif kv.value == self.me and entries in self._campaigns:
                        await asyncio.sleep(0.001)  # its campaign's answer: then an owner's
                    elif kv.value == self.me:  # a copy this replica gave up: the key goes
                        await self._release(entries, kv.create_revision)
                    else:
                        if self.clock() >= deadline:
                            raise Busy(
                                "another service replica owns this collection and did not "
                                "give it up in time: try again"
                            )
                        await self._step_aside(entries, kv)
            if not failed:  # the transaction's own guards failed: its answer as asked
                return TxnResult(False, result.revision, result.results[: len(failure)])

    def _apply(self, mine: dict[bytes, Owned | None], ops: Sequence[Op], revision: int) -> None:
        for op in ops:
            if isinstance(op, Get):
                continue
            entries = entries_of(op.key)
            owned = None if entries is None else mine.get(entries)
            if entries is None or owned is None or self.owned.get(entries) is not owned:
                continue
            if isinstance(op, Put):
                owned.put(op.key, op.value, revision)
                if owned.size > MAX_COPY_BYTES or len(owned.data) > MAX_ENTRIES:
                    self._cool[entries] = self.clock() + 10 * self.cooldown
                    self._give_up(entries, owned, doubt=False)  # too big to keep
            else:
                owned.delete(op.key, op.prefix, revision)

    # other replicas' owners

    async def _step_aside(self, entries: bytes, owner: KeyValue) -> None:
        """Ask the owner of ``entries`` to give them up, and wait until its key is gone
        (or replaced): at most its lease's TTL when it cannot answer."""
        self.stats.stepped_aside += 1
        self._cool[entries] = self.clock() + self.cooldown
        await self.store.put(resign_key(entries), self.me)
        key, pause = owner_key(entries), 0.001
        until = self.clock() + 2 * self.ttl + 5
        while self.clock() < until:
            await asyncio.sleep(pause)
            pause = min(0.05, pause * 2)
            now = await self.store.get(key)
            if now is None or now.create_revision != owner.create_revision:
                return
        raise Busy("another service replica owns this collection and did not give it up")

    # owning

    def _maybe_campaign(self, entries: bytes) -> None:
        if (
            not self.campaign
            or self._closed
            or entries in self._campaigns
            or len(self.owned) >= MAX_OWNED
            or self._cool.get(entries, 0.0) > self.clock()
        ):
            return
        self._campaigns.add(entries)
        self._spawn(self._campaign(entries))

    async def _campaign(self, entries: bytes) -> None:
        self.stats.campaigns += 1
        try:
            lease = await self._lease()
            key = owner_key(entries)
            result = await self.store.txn(
                [Compare(key, "version", "==", 0)],
                [
                    Put(key, self.me, lease),
                    Delete(resign_key(entries)),
                    Get(entries, prefix=True, limit=MAX_ENTRIES + 1),
                ],
            )
        except (StoreUnavailable, LeaseNotFound) as e:
            log.info("a campaign for %r failed: %s", entries, e)
            self._cool[entries] = self.clock() + 1.0
            return
        finally:
            self._campaigns.discard(entries)
        if not result.succeeded:  # another replica owns them
            self._cool[entries] = self.clock() + self.cooldown
            return
        snapshot = result.results[2]
        size = sum(len(kv.key) + len(kv.value) for kv in snapshot)
        held = sum(copy.size for copy in self.owned.values())
        if (
            len(snapshot) > MAX_ENTRIES
            or size > MAX_COPY_BYTES
            or held + size > MAX_BYTES
            or self._closed
        ):
            self._cool[entries] = self.clock() + 10 * self.cooldown
            await self._release(entries, result.revision)
            return
        self.owned[entries] = Owned(
            result.revision, {kv.key: kv for kv in snapshot}, used=self.clock(), size=size
        )
        self.stats.won += 1
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(result.revision + 1))

    async def _lease(self) -> int:
        if self._lease_lock is None:
            self._lease_lock = asyncio.Lock()
        async with self._lease_lock:
            if self.lease:
                return self.lease
            sent = self.clock()
            self.lease = await self.store.lease_grant(self.ttl)
            self.safe_until = sent + self.ttl * (1 - self.drift) - self.margin
            if self._keeper is None or self._keeper.done():
                self._keeper = asyncio.get_running_loop().create_task(self._keep())
            return self.lease

    async def _keep(self) -> None:
        """One keep-alive every ``ttl/4`` for every collection this replica owns."""
        while not self._closed:
            await asyncio.sleep(self.ttl / 4)
            self._sweep()
            lease = self.lease
            if not lease:
                continue
            sent = self.clock()
            try:
                ttl = await self.store.lease_keepalive(lease)
            except StoreUnavailable as e:  # serving stops by itself at safe_until
                log.info("the owners' lease was not kept alive: %s", e)
                continue
            if lease != self.lease:
                continue
            if ttl <= 0:
                log.warning("the owners' lease expired: its collections are read from etcd")
                self._lose_all()
            else:
                self.safe_until = max(self.safe_until, sent + ttl * (1 - self.drift) - self.margin)

    def _sweep(self) -> None:
        """Give up what nobody read lately; forget cooldowns that ended."""
        now = self.clock()
        for entries, owned in list(self.owned.items()):
            if now - owned.used > IDLE:
                self._give_up(entries, owned, doubt=False)
        for entries in [e for e, until in self._cool.items() if until <= now]:
            del self._cool[entries]

    def _lose_all(self) -> None:
        self.stats.lost += len(self.owned)
        self.owned.clear()
        self.lease = 0
        self.safe_until = -float("inf")

    async def _watch(self, revision: int) -> None:
        """Requests to step aside, for every collection this replica owns."""
        try:
            async for event in self.store.watch(OWNERS, start_revision=revision):
                key = event.kv.key
                if event.kind == "put" and key.endswith(b"/resign") and event.kv.value != self.me:
                    entries = ROOT + key[len(OWNERS) : -len(b"resign")]
                    owned = self.owned.get(entries)
                    if owned is not None:
                        self.stats.resigned += 1
                        self._cool[entries] = self.clock() + self.cooldown
                        self._give_up(entries, owned, doubt=False)
        except StoreUnavailable as e:
            log.warning("the owners' watch ended (%s): their collections are given up", e)
        finally:
            self._watcher = None
            if not self._closed:  # unheard requests would wait for the lease: end it
                for entries, copy in list(self.owned.items()):
                    self._give_up(entries, copy, doubt=False)
                lease, self.lease = self.lease, 0
                if lease:
                    self._spawn(self._revoke(lease))

    def _give_up(self, entries: bytes, owned: Owned, *, doubt: bool) -> None:
        """Stop serving ``entries`` at once, then delete the owner key (in the
        background: until then, or until the lease ends, others' writes wait)."""
        if self.owned.get(entries) is not owned:
            return
        del self.owned[entries]
        if doubt:
            self.stats.doubts += 1
            self._cool[entries] = max(self._cool.get(entries, 0.0), self.clock() + 1.0)
        self._spawn(self._release(entries, owned.epoch))

    async def _release(self, entries: bytes, epoch: int) -> None:
        key = owner_key(entries)
        for attempt in range(5):
            try:
                await self.store.txn(
                    [Compare(key, "create", "==", epoch)],
                    [Delete(key), Delete(resign_key(entries))],
                )
            except StoreUnavailable as e:
                log.info("giving up %r failed (%s): its lease bounds it", entries, e)
                await asyncio.sleep(0.05 * 2**attempt)
            else:
                return

    async def _revoke(self, lease: int) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.lease_revoke(lease)

    def _spawn(self, work: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # the rest of the store's interface

    async def lease_grant(self, ttl: int) -> int:
        return await self.store.lease_grant(ttl)

    async def lease_keepalive(self, lease: int) -> int:
        return await self.store.lease_keepalive(lease)

    async def lease_revoke(self, lease: int) -> None:
        await self.store.lease_revoke(lease)

    def watch(
        self,
        prefix: bytes,
        *,
        start_revision: int = 0,
        prev_kv: bool = False,
        deletes_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        return self.store.watch(
            prefix, start_revision=start_revision, prev_kv=prev_kv, deletes_only=deletes_only
        )

    async def stop(self) -> None:
        """Stop owning (other replicas need not wait for the lease): the lease is
        revoked, and every owner key with it. The wrapped store stays open."""
        self._closed = True
        self.owned.clear()
        for task in (self._keeper, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        lease, self.lease = self.lease, 0
        if lease:
            await self._revoke(lease)
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        await self.stop()
        await self.store.close()


def _touched(success: Iterable[Op], failure: Iterable[Op]) -> list[bytes]:
    """The owned kinds' entries that these operations write, in a stable order."""
    found: dict[bytes, None] = {}
    for op in (*success, *failure):
        if not isinstance(op, Get):
            entries = entries_of(op.key)
            if entries is not None:
                found[entries] = None
    return list(found)
