"""Locks: one lease per client session, waiters in arrival order, a hand-over in one write.

Keys under a lock's prefix ``L``:

- ``L/holder``: the holder's owner id, with its session's lease. The fencing token is the
  key's mod revision: every acquisition and every hand-over writes it, so each holder
  gets a larger token than the holders before it.
- ``L/w/<owner>``: a waiter, with its session's lease, ordered by create revision (the
  order of arrival; a retried request keeps its place: a put keeps the create revision).

A session is the client's (``session``, a random id per client): its lease is granted once
(``<compute prefix>session/<session>/<ttl>``, a key under the caller's own namespace and
compute holds it, so a lease is only ever found through the caller's own keys) and kept
alive by the holder's keep-alives and by the service while a waiter of it waits. When the
client dies, its session lease expires after ``ttl`` and its holder and waiter keys go.
A request without a session (a client from before) gets a lease of its own, revoked when
it holds nothing any more, as before.

The recipe (etcd's concurrency mutex, with the hand-over done by the releaser): an
acquire is one transaction, the holder key if it is free, else a waiter key (and a read
of the holder and the waiters). A release is one transaction that, when this replica
knows the first waiter, hands the lock over to it (the holder key rewritten with that
waiter's owner and lease, its waiter key deleted), guarded on the holder and on that
waiter's key; otherwise it deletes the holder key, and the first waiter (by create
revision) claims it when its replica's watch sees the deletion. Each replica keeps one
watch per lock it has waiters on, and wakes only the waiter concerned: the one handed the
lock, or the first when the holder key went (its lease expired).

Fewer transactions (issue 18): an early release (the SDK's) is answered before etcd has
it; when this replica knows no waiter it lingers :data:`LINGER`, and an acquire through
this replica meanwhile takes the lock over in one transaction (guarded on the releaser
and on no waiter key in etcd), else it goes to etcd in the background, retried while etcd
cannot answer. A waiter arriving while this replica follows the held lock writes its key
in the next hand-over's transaction (or alone after :data:`ARRIVAL_WAIT`, or at once
when the lock is seen free).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from o41.collections.checks import float_arg, id_arg, int_arg
from o41.collections.once import Memory, absent, dump, load
from o41.state.base import (
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    Put,
    Store,
    StoreUnavailable,
    WatchEvent,
)

log = logging.getLogger(__name__)


class View:
    """This replica's copy of one lock's holder and waiters, fed by a watch while it has
    waiters here; per key the newest revision wins (events, snapshots and this replica's
    own transactions may arrive in any order)."""

    def __init__(self, store: Store, prefix: bytes) -> None:
        self.store = store
        self.prefix = prefix
        self.holder_key = prefix + b"holder"
        self.waiting = prefix + b"w/"
        self.holder: KeyValue | None = None
        self.waiters: dict[bytes, KeyValue] = {}
        self.seen: dict[bytes, int] = {}  # key -> revision of what is known of it
        self.local: dict[bytes, asyncio.Event] = {}  # owner -> its waiting request here
        self.task: asyncio.Task[None] | None = None
        self.broken = False
        self.arriving: list[_Arrival] = []  # waiters whose keys ride the next hand-over
        self._timer: asyncio.TimerHandle | None = None

    # what is known

    def first(self) -> KeyValue | None:
        if not self.waiters:
            return None
        return min(self.waiters.values(), key=lambda kv: kv.create_revision)

    def _set(self, key: bytes, kv: KeyValue | None, revision: int) -> None:
        if revision < self.seen.get(key, 0):
            return
        self.seen[key] = revision
        if key == self.holder_key:
            self.holder = kv
        elif key.startswith(self.waiting):
            if kv is None:
                self.waiters.pop(key, None)
            else:
                self.waiters[key] = kv

    def put(self, kv: KeyValue) -> None:
        self._set(kv.key, kv, kv.mod_revision)
        self._wake()

    def delete(self, key: bytes, revision: int) -> None:
        self._set(key, None, revision)
        if key == self.holder_key and self.holder is None and self.arriving:
            self._write_arrivals()  # the lock is free: they may be first
        self._wake()

    # arrivals that ride the next hand-over

    def deferrable(self, owner: bytes) -> bool:
        """Whether a new waiter's key can wait for the next hand-over through this
        replica: the lock is held by another, and the watch follows it."""
        h = self.holder
        return (
            not self.broken
            and self.task is not None
            and not self.task.done()
            and h is not None
            and h.value != owner
        )

    def arrive(self, key: bytes, owner: bytes, lease: int) -> asyncio.Future[int]:
        """Queue a waiter's key for the next transaction on this lock (a hand-over), or
        on its own after :data:`ARRIVAL_WAIT`: its create revision, once written."""
        loop = asyncio.get_running_loop()
        arrival = _Arrival(key, owner, lease, loop.create_future())
        self.arriving.append(arrival)
        if self._timer is None:
            self._timer = loop.call_later(ARRIVAL_WAIT, self._write_arrivals)
        return arrival.done

    def take_arrivals(self) -> list[_Arrival]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        taken, self.arriving = self.arriving, []
        return taken

    def settle(self, arrivals: list[_Arrival], revision: int) -> None:
        """The arrivals' keys were written at ``revision`` (their create revision)."""
        for a in arrivals:
            self.put(KeyValue(a.key, a.owner, revision, revision, 1, a.lease))
            if not a.done.done():
                a.done.set_result(revision)

    @staticmethod
    def fail(arrivals: list[_Arrival], error: BaseException) -> None:
        for a in arrivals:
            if not a.done.done():
                a.done.set_exception(error)

    def _write_arrivals(self) -> None:
        taken = self.take_arrivals()
        if taken:
            asyncio.get_running_loop().create_task(self._write(taken))

    async def _write(self, arrivals: list[_Arrival]) -> None:
        try:
            result = await self.store.txn(
                [], [Put(a.key, a.owner, lease=a.lease) for a in arrivals]
            )
        except (StoreUnavailable, LeaseNotFound) as e:
            self.fail(arrivals, e)
        else:
            self.settle(arrivals, result.revision)

    def load(self, holder: tuple[KeyValue, ...], waiters: tuple[KeyValue, ...], rev: int) -> None:
        """A snapshot read at revision ``rev``."""
        self._set(self.holder_key, holder[0] if holder else None, rev)
        now = {kv.key: kv for kv in waiters}
        for key in set(self.waiters) - set(now):
            self._set(key, None, rev)
        for key, kv in now.items():
            self._set(key, kv, rev)
        self._wake()

    def _wake(self) -> None:
        """Only the waiter concerned: the one the lock is handed to, or the first when
        the holder key is gone; and a waiter whose key went (its lease expired)."""
        if self.holder is not None:
            event = self.local.get(self.holder.value)
            if event is not None:
                event.set()
        else:
            first = self.first()
            if first is not None and first.value in self.local:
                self.local[first.value].set()
        for owner, event in self.local.items():
            if self.waiting + owner not in self.waiters:
                event.set()

    # the watch

    def follow(self, revision: int) -> None:
        if self.task is None or self.task.done():
            self.broken = False
            self.task = asyncio.get_running_loop().create_task(self._pump(revision))

    async def _pump(self, revision: int) -> None:
        try:
            async for change in self.store.watch(self.prefix, start_revision=revision):
                self._event(change)
        except StoreUnavailable as e:
            log.info("a lock's watch ended (%s); its waiters read again", e)
        finally:
            self.broken = True
            for waiter in self.local.values():
                waiter.set()

    def _event(self, event: WatchEvent) -> None:
        if event.kind == "put":
            self.put(event.kv)
        else:
            self.delete(event.kv.key, event.kv.mod_revision)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None


LINGER = 0.002  # seconds an early release waits for an acquire through this replica
ARRIVAL_WAIT = 0.01  # seconds a new waiter's key waits for a hand-over to ride with


@dataclass
class _Arrival:
    """A waiter whose key is written with the next transaction on its lock."""

    key: bytes
    owner: bytes
    lease: int
    done: asyncio.Future[int]


@dataclass
class _Leaving:
    """An early release not sent to etcd yet: an acquire through this replica within
    :data:`LINGER` takes the lock over from it in one transaction."""

    owner: bytes
    token: int
    args: dict[str, Any]
    timer: asyncio.TimerHandle | None = None


class Locks:
    """The lock operations of an engine (acquire, keepalive, release)."""

    def __init__(self, store: Store, max_wait: float, memory: Memory | None = None) -> None:
        self.store = store
        self.memory = memory if memory is not None else Memory(store)
        self.max_wait = max_wait
        self._views: dict[bytes, View] = {}
        self._sessions: dict[bytes, int] = {}  # session key -> its lease (a cache)
        self._releasing: set[asyncio.Task[None]] = set()  # early releases under way
        self._leaving: dict[bytes, _Leaving] = {}  # lock prefix -> an early release lingering
        self._closed = False

    # sessions

    async def _session_lease(self, key: bytes, ttl: int) -> int:
        """The lease of a session: granted once, found through its key after."""
        lease = self._sessions.get(key)
        if lease:
            return lease
        found = await self.store.get(key)
        if found is not None and found.lease:
            self._sessions[key] = found.lease
            return found.lease
        lease = await self.store.lease_grant(ttl)
        made = await self.store.txn(
            [Compare(key, "version", "==", 0)], [Put(key, b"", lease=lease)], [Get(key)]
        )
        if not made.succeeded and made.results[0] and made.results[0][0].lease:
            await self._drop(lease)  # another request of this session was first
            lease = made.results[0][0].lease
        self._sessions[key] = lease
        return lease

    async def _drop(self, lease: int) -> None:
        if not lease:
            return
        try:
            await self.store.lease_revoke(lease)
        except StoreUnavailable as e:  # it expires with its TTL
            log.warning("a lease was not revoked (%s); it expires on its own", e)

    def _view(self, prefix: bytes) -> View:
        view = self._views.get(prefix)
        if view is None:
            view = self._views[prefix] = View(self.store, prefix)
        return view

    def _done_waiting(self, view: View, owner: bytes) -> None:
        if any(a.owner == owner for a in view.arriving):  # cancelled before its key went
            view.arriving = [a for a in view.arriving if a.owner != owner]
        view.local.pop(owner, None)
        if not view.local:  # nobody waits here: no watch (a later waiter reads again)
            view.stop()
            self._views.pop(view.prefix, None)

    # acquire

    async def acquire(self, prefix: bytes, base: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Take the lock for ``owner`` (its session's lease), waiting up to ``timeout``
        (at most ``max_wait``) in arrival order. Retrying with the same owner is safe (a
        holder is answered its token; a waiter keeps its place)."""
        owner = id_arg(args, "owner").encode()
        session = args.get("session")
        shared = session is not None
        sid = id_arg(args, "session").encode() if shared else owner
        ttl = int_arg(args, "ttl", 30, lo=1, hi=3600)
        wait = float_arg(args, "timeout", self.max_wait)
        deadline = time.monotonic() + min(wait, self.max_wait)
        session_key = base + (b"session/s/" if shared else b"session/o/") + sid + b"/%d" % ttl
        holder, me = prefix + b"holder", prefix + b"w/" + owner
        view: View | None = None
        event = asyncio.Event()
        mine = 0  # my waiter key's create revision, 0: none
        refreshed = time.monotonic()
        held = False
        lease = 0
        try:
            while True:
                lease = await self._session_lease(session_key, ttl)
                leaving = self._leaving.pop(prefix, None)
                if leaving is not None:
                    token = await self._take_over(prefix, leaving, owner, me, mine, lease)
                    if token:
                        held = True
                        return {"acquired": True, "token": token}
                    if token is None:  # the session's lease expired: a new one
                        self._sessions.pop(session_key, None)
                        continue
                following = self._views.get(prefix)
                if not mine and following is not None and following.deferrable(owner):
                    if view is None:  # wait here, and ride the next hand-over's transaction
                        view = following
                        view.local[owner] = event
                    try:
                        mine = await view.arrive(me, owner, lease)
                    except LeaseNotFound:
                        self._sessions.pop(session_key, None)
                        continue
                    refreshed = time.monotonic()
                else:
                    try:
                        result = await self.store.txn(
                            [Compare(holder, "version", "==", 0)],
                            # arriving again (a watch ended): the waiter key of before goes
                            [Put(holder, owner, lease=lease), *([Delete(me)] if mine else [])],
                            [
                                Get(holder),
                                Put(me, owner, lease=lease),
                                Get(prefix + b"w/", prefix=True),
                            ],
                        )
                    except LeaseNotFound:
                        self._sessions.pop(session_key, None)  # it expired: a new one
                        continue
                    refreshed = time.monotonic()
                    if result.succeeded:
                        held = True
                        return {"acquired": True, "token": result.revision}
                    current = result.results[0][0] if result.results[0] else None
                    if current is not None and current.value == owner:  # retried: ours already
                        held = True
                        await self._withdraw(me, 0)
                        return {"acquired": True, "token": current.mod_revision}
                    mine = next(kv.create_revision for kv in result.results[2] if kv.key == me)
                    if view is None:
                        view = self._view(prefix)
                        view.local[owner] = event
                    view.load(result.results[0], result.results[2], result.revision)
                    view.follow(result.revision + 1)
                while True:
                    event.clear()
                    h = view.holder
                    if h is not None and h.value == owner:
                        held = True
                        return {"acquired": True, "token": h.mod_revision}
                    waiting = view.waiters.get(me)
                    if view.broken or waiting is None or waiting.create_revision != mine:
                        break  # read again (and arrive again if the key went)
                    if h is None and view.first() is waiting:
                        try:
                            claim = await self._claim(view, holder, me, owner, mine, lease)
                        except LeaseNotFound:  # the session's lease expired: arrive again
                            self._sessions.pop(session_key, None)
                            break
                        if claim is not None:
                            held = True
                            return {"acquired": True, "token": claim}
                        continue
                    now = time.monotonic()
                    if now >= deadline:
                        gone = await self._withdraw(me, mine, holder)
                        if gone is not None and gone.value == owner:  # handed over meanwhile
                            held = True
                            return {"acquired": True, "token": gone.mod_revision}
                        mine = 0
                        return {"acquired": False}
                    if now - refreshed > ttl / 3:
                        await self.store.lease_keepalive(lease)
                        refreshed = now
                    with contextlib.suppress(TimeoutError):  # no task per wait, as wait_for
                        async with asyncio.timeout(min(deadline - now, ttl / 3)):
                            await event.wait()
        finally:
            if view is not None:
                self._done_waiting(view, owner)
            if not shared and not held:
                await self._drop(lease)
                self._sessions.pop(session_key, None)

    async def _take_over(
        self, prefix: bytes, leaving: _Leaving, owner: bytes, me: bytes, mine: int, lease: int
    ) -> int | None:
        """An acquire that finds this lock's early release still lingering here takes the
        lock from the releaser in one transaction, the release and the acquisition at
        once, if nobody waits in etcd (else the release goes ahead and this acquire
        arrives as any other): its token, 0 when it did not, None when its session's
        lease is gone (the release then goes ahead too)."""
        if leaving.timer is not None:
            leaving.timer.cancel()
        holder = prefix + b"holder"
        try:
            result = await self.store.txn(
                [
                    Compare(holder, "value", "==", leaving.owner),
                    Compare(holder, "mod", "==", leaving.token),
                    Compare(prefix + b"w/", "create", "==", 0, prefix=True),  # no waiter
                ],
                [Put(holder, owner, lease=lease), *([Delete(me)] if mine else [])],
            )
        except LeaseNotFound:
            self._leave(prefix, leaving)
            return None
        except StoreUnavailable:
            self._leave(prefix, leaving)  # retried until etcd answers
            raise
        if not result.succeeded:
            self._leave(prefix, leaving)
            return 0
        view = self._views.get(prefix)
        if view is not None:
            view.put(KeyValue(holder, owner, result.revision, result.revision, 1, lease))
        return result.revision

    async def _claim(
        self, view: View, holder: bytes, me: bytes, owner: bytes, mine: int, lease: int
    ) -> int | None:
        """The first waiter takes a free lock: its token, or None (read again)."""
        result = await self.store.txn(
            [Compare(holder, "version", "==", 0), Compare(me, "create", "==", mine)],
            [Put(holder, owner, lease=lease), Delete(me)],
            [Get(holder), Get(view.waiting, prefix=True)],
        )
        if result.succeeded:
            view.put(KeyValue(holder, owner, result.revision, result.revision, 1, lease))
            view.delete(me, result.revision)
            return result.revision
        view.load(result.results[0], result.results[1], result.revision)
        return None

    async def _withdraw(self, me: bytes, mine: int, holder: bytes = b"") -> KeyValue | None:
        """Delete this waiter's key (``mine``: only that very key, 0: whatever is there);
        when it was gone already, the holder (it may have been handed the lock)."""
        guard = [Compare(me, "create", "==", mine)] if mine else []
        result = await self.store.txn(guard, [Delete(me)], [Get(holder)] if holder else [])
        if not result.succeeded and result.results and result.results[0]:
            return result.results[0][0]
        return None

    # keepalive, release

    def _held(self, prefix: bytes, args: dict[str, Any]) -> tuple[bytes, bytes, int]:
        return prefix + b"holder", id_arg(args, "owner").encode(), int_arg(args, "token", lo=1)

    async def keepalive(self, prefix: bytes, args: dict[str, Any]) -> dict[str, Any]:
        """Refresh the holder's lease, found through the holder key, if ``owner`` with this
        token still holds the lock."""
        holder, owner, token = self._held(prefix, args)
        current = await self.store.get(holder)
        if current is None or current.value != owner or current.mod_revision != token:
            return {"alive": False, "ttl": 0}
        ttl = await self.store.lease_keepalive(current.lease) if current.lease else 0
        return {"alive": ttl > 0, "ttl": ttl}

    async def release(
        self, prefix: bytes, args: dict[str, Any], once: bytes | None = None
    ) -> dict[str, Any]:
        """Free the lock if ``owner`` with this token holds it, in one transaction: handed
        over to the first waiter when this replica knows it, else deleted (the first waiter
        claims it). Whether it was still held.

        ``early``: answered at once (``{"accepted": true}``), before etcd has taken the
        transaction: nobody else can acquire the lock until it has, so the caller loses
        nothing by not waiting. The transaction is retried while etcd cannot answer (it is
        guarded on the owner and token, so a repeat that finds it done does nothing); if
        this replica dies first, the holder key goes with its lease."""
        holder, owner, token = self._held(prefix, args)
        if args.get("early") is not True or self._closed:
            return await self._release(prefix, holder, owner, token, args, once)
        leaving = _Leaving(owner, token, args)
        view = self._views.get(prefix)
        known = view is not None and not view.broken and view.first() is not None
        if known or "session" not in args or prefix in self._leaving:
            self._leave(prefix, leaving)  # handed over now (or an old client's own lease)
            # the hand-over's transaction leaves before this answer: the next holder
            # waits on the transaction, nobody on the answer
            await asyncio.sleep(0)
        else:  # an acquire through this replica within LINGER takes it over in one txn
            self._leaving[prefix] = leaving
            leaving.timer = asyncio.get_running_loop().call_later(
                LINGER, self._leave, prefix, leaving
            )
        return {"accepted": True}

    def _leave(self, prefix: bytes, leaving: _Leaving) -> None:
        """Send an early release to etcd now (in the background, retried)."""
        if self._leaving.get(prefix) is leaving:
            del self._leaving[prefix]
        if leaving.timer is not None:
            leaving.timer.cancel()
            leaving.timer = None
        task = asyncio.get_running_loop().create_task(
            self._release_for_sure(
                prefix, prefix + b"holder", leaving.owner, leaving.token, leaving.args
            )
        )
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_for_sure(
        self, prefix: bytes, holder: bytes, owner: bytes, token: int, args: dict[str, Any]
    ) -> None:
        """An early release, retried (with a growing pause, at most 1 s) until etcd has
        answered it; given up only when the service closes (the lease then bounds it)."""
        pause = 0.05
        while True:
            try:
                await self._release(prefix, holder, owner, token, args)
            except StoreUnavailable as e:
                if self._closed:
                    log.warning("a lock's release was not written (%s); its lease bounds it", e)
                    return
                log.info("a lock's release failed (%s); trying again in %g s", e, pause)
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)
            else:
                return

    async def drain(self, within: float) -> None:
        """Send the lingering early releases, and wait (at most ``within`` seconds) for
        those under way."""
        for prefix, leaving in list(self._leaving.items()):
            self._leave(prefix, leaving)
        if self._releasing:
            await asyncio.wait(set(self._releasing), timeout=within)

    async def _release(
        self,
        prefix: bytes,
        holder: bytes,
        owner: bytes,
        token: int,
        args: dict[str, Any],
        once: bytes | None = None,
    ) -> dict[str, Any]:
        """``once``: the key of the release's operation id, written with the release and
        guarded on its absence; a repeat answers what it remembers (the effect itself is
        guarded on the owner and token already)."""
        mine = [Compare(holder, "value", "==", owner), Compare(holder, "mod", "==", token)]
        remember: list[Put] = []
        recall: list[Get] = []
        if once is not None:
            mine.append(absent(once))
            remember = [Put(once, dump({"released": True}), await self.memory.current())]
            recall = [Get(once)]
        view = self._views.get(prefix)
        successor = view.first() if view is not None and not view.broken else None
        if view is not None and successor is not None:
            # the waiters that arrived here meanwhile write their keys in this transaction
            arrivals = view.take_arrivals()
            puts = [Put(a.key, a.owner, lease=a.lease) for a in arrivals]
            try:
                result = await self.store.txn(
                    [*mine, Compare(successor.key, "create", "==", successor.create_revision)],
                    [
                        Put(holder, successor.value, lease=successor.lease),
                        Delete(successor.key),
                        *puts,
                        *remember,
                    ],
                    [Get(holder), *puts, *recall],
                )
            except LeaseNotFound as e:  # a session just expired: free it plainly
                if arrivals:  # perhaps an arrival's: they arrive again, this goes on alone
                    view.fail(arrivals, e)
                    return await self._release(prefix, holder, owner, token, args, once)
                view.delete(successor.key, view.seen.get(successor.key, 0) + 1)
                successor = None
            except BaseException as e:
                view.fail(arrivals, e if isinstance(e, Exception) else StoreUnavailable(str(e)))
                raise
            else:
                view.settle(arrivals, result.revision)
        if view is not None and successor is not None:
            if result.succeeded:
                view.put(KeyValue(holder, successor.value, 0, result.revision, 0, successor.lease))
                view.delete(successor.key, result.revision)
                return {"released": True}
            if recall and result.results[-1]:  # a repeat: released before
                return load(result.results[-1][0].value)
            current = result.results[0][0] if result.results[0] else None
            if current is None or current.value != owner or current.mod_revision != token:
                return {"released": False}
            # that waiter went meanwhile: free it plainly
        result = await self.store.txn(mine, [Delete(holder), *remember], recall)
        if not result.succeeded and recall and result.results[0]:
            return load(result.results[0][0].value)
        if result.succeeded:
            view = self._views.get(prefix)  # a waiter may have arrived meanwhile
            if view is not None:
                view.delete(holder, result.revision)
            deleted = result.results[0]
            if "session" not in args and deleted and deleted[0].lease:
                await self._drop(deleted[0].lease)  # a lease of its own, as before sessions
        return {"released": result.succeeded}

    def close(self) -> None:
        self._closed = True
        for view in self._views.values():
            view.stop()
        self._views.clear()
