"""Group commit: concurrent puts share one store transaction.

Under load many begins arrive together; one etcd transaction of N puts costs about what
one put costs, and each caller still returns only after its record is committed.

A put whose lease is gone (revoked or expired in etcd) fails the whole transaction; the
batch is then split by lease, so only the callers of the lost lease see ``LeaseNotFound``
(and can put again with a new one) while the others' records are committed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from o41.state import LeaseNotFound, Put, Store

MAX_BATCH = 100  # etcd refuses transactions over 128 operations by default


@dataclass
class PutBatcher:
    store: Store
    _queue: list[tuple[Put, asyncio.Future[int]]] = field(default_factory=list)
    _flushing: bool = False

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Put ``key`` with the others that arrive meanwhile; returns the revision."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((Put(key, value, lease), done))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await done

    async def _flush(self) -> None:
        try:
            while self._queue:
                # one turn of the loop first: requests already read from their sockets
                # reach the queue and share this transaction (no wait when idle)
                await asyncio.sleep(0)
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._commit(batch)
        finally:
            self._flushing = False

    async def _commit(self, batch: list[tuple[Put, asyncio.Future[int]]]) -> None:
        """One transaction for ``batch``; each caller gets the revision or the failure."""
        try:
            result = await self.store.txn([], [put for put, _ in batch])
        except LeaseNotFound as e:
            leases = {put.lease for put, _ in batch}
            if len(leases) == 1:
                self._fail(batch, e)
                return
            for lease in leases:  # whose? each lease's puts on their own
                await self._commit([item for item in batch if item[0].lease == lease])
            return
        except Exception as e:  # every caller of the batch sees the failure
            self._fail(batch, e)
            return
        for _, done in batch:
            if not done.done():
                done.set_result(result.revision)

    @staticmethod
    def _fail(batch: list[tuple[Put, asyncio.Future[int]]], error: Exception) -> None:
        for _, done in batch:
            if not done.done():
                done.set_exception(error)


BATCHER: web.AppKey[PutBatcher] = web.AppKey("batcher")
