"""Operations applied once (issue 39): the first answer of an operation that carries an
id (``operation``, :mod:`o41.core.operations`) is written in the transaction of its
effect, under ``/o41/operations/<namespace>/<compute>/<id>`` (the caller's own namespace
and compute: another tenant's same id is another key), guarded by a compare that the key does not
exist. A repeat, through this replica or another, finds the key: the transaction's compare
fails, the failure branch reads the key, and the repeat answers the first answer with no
second effect. Of two concurrent attempts, one transaction wins; the other finds the key.

Bounded in time: the keys live under a lease of the minute they were written in, granted
with a TTL of :data:`REMEMBERED_FOR` + 60 s (one grant a minute per replica, none for an
operation without an id). In space: one key per operation of at most a value's size (the
answer: ``{}``, a found flag, a counter's value or a polled value), outside the
namespace's quota (an answer is the service's bookkeeping, gone with its lease, not what
the tenant stores): at most the token's operation rate times the lease's TTL.

An operation whose first attempt changed nothing (a delete of a missing key, a poll of an
empty queue, a setdefault of a key that is there) writes no key: it had no effect, so a
repeat that does act is the only time it acted.

Eventual writes are acknowledged before etcd has them: their ids are remembered by the
replica that acknowledged them, in memory (:class:`Recent`), so a repeat through the same
replica answers the first answer; a repeat through another replica may apply again.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from o41.collections.checks import ROOT
from o41.core.operations import REMEMBERED_FOR
from o41.state.base import Compare, LeaseNotFound, Op, Store, TxnResult

KEPT_LOCALLY = 100_000  # eventual operations' ids one replica remembers, at most
KEPT_BYTES = 64 * 2**20  # and the bytes of their answers (a pop's value), at most

Txn = tuple[Sequence[Compare], Sequence[Op], Sequence[Op]]  # compares, success, failure
Build = Callable[[int], Txn]  # a transaction, given the lease of the answers it writes


#: Where remembered answers live: beside the collections, not among a namespace's keys.
OPERATIONS_ROOT = b"/o41/operations/"


def operation_key(base: bytes, operation: str) -> bytes:
    """Where the first answer of ``operation`` lives; ``base``: the compute's prefix
    (``/o41/collections/<namespace>/<compute>/``). Kept apart from the namespace's keys
    so that they count in no quota: a job adding to a counter a hundred times a second
    would otherwise fill its 50,000 entries with remembered answers in eight minutes."""
    return OPERATIONS_ROOT + base.removeprefix(ROOT) + operation.encode()


def absent(key: bytes) -> Compare:
    return Compare(key, "version", "==", 0)


def dump(answer: dict[str, Any]) -> bytes:
    """An answer as the key's value: JSON, bytes as ``{"b": <base64>}``."""
    return json.dumps(_plain(answer), separators=(",", ":")).encode()


def load(raw: bytes) -> dict[str, Any]:
    found = _bytes(json.loads(raw))
    assert isinstance(found, dict)
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _bytes(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {"b"}:
            return base64.b64decode(value["b"])
        return {k: _bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bytes(v) for v in value]
    return value


class Memory:
    """The lease the remembered answers of one minute share (granted by this replica,
    never named by a client), and transactions that use it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.minute, self.lease = -1, 0
        self._granting = asyncio.Lock()

    async def current(self) -> int:
        minute = int(time.time() // 60)
        if minute == self.minute and self.lease:
            return self.lease
        return await self._replace(minute, self.lease)

    async def _replace(self, minute: int, stale: int) -> int:
        async with self._granting:
            if minute == self.minute and self.lease and self.lease != stale:
                return self.lease  # replaced while this one waited
            lease = await self.store.lease_grant(REMEMBERED_FOR + 60)
            self.minute, self.lease = minute, lease
            return lease

    async def txn(self, build: Build) -> TxnResult:
        """The transaction ``build`` makes with the current lease; built again with a new
        lease once when etcd no longer has that one (revoked, or expired under a clock
        jump): the transaction then did not run."""
        lease = await self.current()
        try:
            return await self.store.txn(*build(lease))
        except LeaseNotFound:
            lease = await self._replace(int(time.time() // 60), lease)
        return await self.store.txn(*build(lease))

    async def remembered(self, key: bytes) -> dict[str, Any] | None:
        found = await self.store.get(key)
        return None if found is None else load(found.value)


def first(result: TxnResult, index: int) -> dict[str, Any] | None:
    """The remembered answer a failure branch's ``Get`` at ``index`` found, if any."""
    found = result.results[index]
    return load(found[0].value) if found else None


class Recent:
    """Eventual operations' first answers on this replica: at most :data:`KEPT_LOCALLY`
    of them and :data:`KEPT_BYTES` of their values, each for :data:`REMEMBERED_FOR`
    seconds (the oldest go first)."""

    def __init__(self, size: int = KEPT_LOCALLY, budget: int = KEPT_BYTES) -> None:
        self.size, self.budget, self.held = size, budget, 0
        self._answers: OrderedDict[bytes, tuple[float, dict[str, Any]]] = OrderedDict()
        self._acting: dict[bytes, asyncio.Future[dict[str, Any]]] = {}

    def get(self, key: bytes) -> dict[str, Any] | None:
        now = time.monotonic()
        while self._answers:
            oldest, (when, _) = next(iter(self._answers.items()))
            if now - when <= REMEMBERED_FOR:
                break
            self._forget(oldest)
        found = self._answers.get(key)
        return None if found is None else found[1]

    def put(self, key: bytes, answer: dict[str, Any]) -> None:
        if key in self._answers:
            self._forget(key)
        self._answers[key] = (time.monotonic(), answer)
        self.held += _size(answer)
        while self._answers and (len(self._answers) > self.size or self.held > self.budget):
            self._forget(next(iter(self._answers)))

    def _forget(self, key: bytes) -> None:
        _, answer = self._answers.pop(key)
        self.held -= _size(answer)

    async def once(
        self, key: bytes | None, act: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """``act``'s answer, or the answer it gave for ``key`` before."""
        if key is None:
            return await act()
        found = self.get(key)
        if found is not None:
            return found
        acting = self._acting.get(key)
        if acting is not None:  # a concurrent repeat: the first attempt's answer
            return await asyncio.shield(acting)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._acting[key] = future
        try:
            answer = await act()
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            del self._acting[key]
        self.put(key, answer)
        future.set_result(answer)
        return answer


def _size(answer: dict[str, Any]) -> int:
    """What an answer holds, roughly: its value's bytes and a little for the rest."""
    value = answer.get("value")
    return 100 + (len(value) if isinstance(value, bytes) else 0)
