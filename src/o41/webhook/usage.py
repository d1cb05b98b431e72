"""Usage counters: by organization, writer place, place.source, rule, locality and bytes.

Counted in memory on the hot path and merged into the state store every few seconds by
compare-and-swap, so many service replicas add up. A replica that dies loses at most its
last few seconds of counters (never a version): counters are for the usage page, not
billing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from typing import Any

from o41.state import Compare, Put, Store, StoreUnavailable
from o41.webhook import metrics
from o41.webhook.records import usage_prefix

log = logging.getLogger(__name__)

Dims = tuple[tuple[str, str], ...]


def hour(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H", time.gmtime(now))


class Usage:
    def __init__(self, store: Store, interval: float = 5.0) -> None:
        self._store, self._interval = store, interval
        self._counts: dict[tuple[str, str, Dims], Counter[str]] = defaultdict(Counter)

    def add(self, organization: str, kind: str, dims: dict[str, str | None], **counts: int) -> None:
        key = (organization, kind, tuple(sorted((k, v or "") for k, v in dims.items())))
        self._counts[key].update(counts)
        metrics.observe(organization, kind, dims, counts)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()

    async def flush(self) -> None:
        pending, self._counts = self._counts, defaultdict(Counter)
        when = hour(time.time())
        for (org, kind, dims), counts in pending.items():
            try:
                await self._merge(org, kind, when, dims, counts)
            except StoreUnavailable as e:  # keep them for the next flush
                log.warning("usage not flushed (%s); keeping it for the next try", e)
                self._counts[(org, kind, dims)].update(counts)

    async def _merge(
        self, org: str, kind: str, when: str, dims: Dims, counts: Counter[str]
    ) -> None:
        digest = hashlib.sha256(json.dumps([kind, dims]).encode()).hexdigest()[:24]
        key = usage_prefix(org) + f"{when}/{digest}".encode()
        for _ in range(20):  # CAS loop: other replicas merge into the same key
            current = await self._store.get(key)
            record: dict[str, Any] = (
                json.loads(current.value)
                if current
                else {"kind": kind, "hour": when, "dims": dict(dims), "counts": {}}
            )
            for name, n in counts.items():
                record["counts"][name] = record["counts"].get(name, 0) + n
            guard = Compare(key, "mod", "==", current.mod_revision if current else 0)
            result = await self._store.txn([guard], [Put(key, json.dumps(record).encode())])
            if result.succeeded:
                return
        raise StoreUnavailable(f"usage key {key!r} kept changing")

    async def report(self, organization: str) -> list[dict[str, Any]]:
        """Every counter record of ``organization``, this replica's unflushed ones included."""
        with contextlib.suppress(StoreUnavailable):
            await self.flush()
        records = await self._store.range(usage_prefix(organization))
        return [json.loads(kv.value) for kv in records]
