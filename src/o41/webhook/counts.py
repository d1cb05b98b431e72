"""How many committed versions each Location holds, shown in its status.

Commits count in memory; every few seconds each replica adds its counts to the totals in
the state store (compare-and-swap) and writes the fresh totals to the Locations' status.
Replicas may write a total a moment apart; the next tick writes the newest again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from o41.state import Compare, Put, Store, StoreUnavailable
from o41.webhook.records import PREFIX

log = logging.getLogger(__name__)


def count_key(location: str) -> bytes:
    return PREFIX + b"counts/" + location.encode()


class VersionCounts:
    def __init__(self, store: Store, api: Any, interval: float = 5.0) -> None:
        self._store, self._api, self._interval = store, api, interval
        self._new: Counter[str] = Counter()

    def committed(self, location: str) -> None:
        self._new[location] += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush()
            except Exception as e:  # the API or the store is away: the next tick retries
                log.warning("version counts not written: %s", e)

    async def flush(self) -> None:
        new, self._new = self._new, Counter()
        for location, n in new.items():
            try:
                total = await self._add(location, n)
            except StoreUnavailable:
                self._new[location] += n
                raise
            await asyncio.to_thread(self._show, location, total)

    async def _add(self, location: str, n: int) -> int:
        key = count_key(location)
        for _ in range(20):
            current = await self._store.get(key)
            total = (int(current.value) if current else 0) + n
            guard = Compare(key, "mod", "==", current.mod_revision if current else 0)
            if (await self._store.txn([guard], [Put(key, str(total).encode())])).succeeded:
                return total
        raise StoreUnavailable(f"the count of {location} kept changing")

    def _show(self, location: str, total: int) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CustomObjectsApi(self._api).patch_cluster_custom_object_status(
                "artifacts.o41.io",
                "v1alpha1",
                "locations",
                location,
                {"status": {"versions": total}},
            )
        except ApiException as e:
            if e.status != 404:
                raise
