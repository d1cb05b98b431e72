"""How many committed versions each Location holds, shown in its status.

Commits count in memory; every few seconds each replica adds its counts to the totals in
the state store (compare-and-swap) and writes the fresh totals to one ConfigMap in the
release namespace (``o41.kube.location_record.COUNTS``), the only object the service may write
in Kubernetes; the operator copies them into each Location's ``status.versions``. The
service has no write on Location status at all. Totals only grow, so a replica never
lowers one another replica wrote (compare-and-swap on the ConfigMap's resourceVersion).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from aiohttp import web

from o41.kube.location_record import COUNTS as CONFIGMAP
from o41.state import Compare, Put, Store, StoreUnavailable
from o41.webhook.records import PREFIX

log = logging.getLogger("o41.webhook.counts")  # its name is a log field: kept


def count_key(location: str) -> bytes:
    return PREFIX + b"counts/" + location.encode()


class VersionCounts:
    def __init__(self, store: Store, api: Any, namespace: str, interval: float = 5.0) -> None:
        self._store, self._api, self._interval = store, api, interval
        self._namespace = namespace
        self._new: Counter[str] = Counter()
        self._unshown: dict[str, int] = {}  # totals stored but not yet in the ConfigMap

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
        pending = Counter(new)
        try:
            for location, n in new.items():
                self._unshown[location] = await self._add(location, n)
                del pending[location]
        finally:
            self._new.update(pending)  # what the store has not taken: the next tick
            if self._unshown:
                shown = dict(self._unshown)
                await asyncio.to_thread(self._show, shown)
                for k, v in shown.items():
                    if self._unshown.get(k) == v:
                        del self._unshown[k]

    async def _add(self, location: str, n: int) -> int:
        key = count_key(location)
        for _ in range(20):
            current = await self._store.get(key)
            total = (int(current.value) if current else 0) + n
            guard = Compare(key, "mod", "==", current.mod_revision if current else 0)
            if (await self._store.txn([guard], [Put(key, str(total).encode())])).succeeded:
                return total
        raise StoreUnavailable(f"the count of {location} kept changing")

    def _show(self, totals: dict[str, int]) -> None:
        """Raise the ConfigMap's totals to these (never lower one)."""
        for _ in range(10):
            if self._raise_once(totals):
                return
        raise RuntimeError(f"ConfigMap {CONFIGMAP} kept changing; the next tick writes again")

    def _raise_once(self, totals: dict[str, int]) -> bool:
        """One compare-and-swap; False on a conflict (another replica wrote first)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self._api)
        try:
            found = core.read_namespaced_config_map(CONFIGMAP, self._namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            found = None
        try:
            if found is None:  # the chart makes it; a cluster without the chart may not
                body = client.V1ConfigMap(
                    metadata=client.V1ObjectMeta(
                        name=CONFIGMAP, labels={"app.kubernetes.io/part-of": "o41-artifacts"}
                    ),
                    data={k: str(v) for k, v in totals.items()},
                )
                core.create_namespaced_config_map(self._namespace, body)
                return True
            data = dict(found.data or {})
            raised = {k: str(v) for k, v in totals.items() if v > _count(data.get(k))}
            if raised:  # found carries its resourceVersion: a conflict, not a lost update
                found.data = {**data, **raised}
                core.replace_namespaced_config_map(CONFIGMAP, self._namespace, found)
        except ApiException as e:
            if e.status != 409:
                raise
            return False
        return True


COUNTS: web.AppKey[VersionCounts] = web.AppKey("counts")


def _count(raw: str | None) -> int:
    return int(raw) if raw and raw.isdigit() else 0
