"""Each Location's ``status.versions``, copied from the placement service's counts.

The placement service counts commits and writes the totals to one ConfigMap in the
release namespace (``o41.kube.location_record.COUNTS``, the only ConfigMap it may write); the
operator, which alone writes Location status, copies them into ``status.versions``. One
writer per status field, and the placement service needs no write on Location status.
The count is for people (``kubectl get locations -o wide``): no rule decides from it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

from o41.kube.location_record import COUNTS
from o41.operator.cluster import Cluster

INTERVAL = float(os.environ.get("O41_COUNTS_INTERVAL", "5"))

log = logging.getLogger(__name__)


class ShownCounts:
    """Each Location's ``status.versions`` as its last event showed it (kept in kopf's
    memo, set up at start-up), so only a count that changed is patched."""

    def __init__(self) -> None:
        self._shown: dict[str, int] = {}

    def seen(self, name: str, status: Mapping[str, Any]) -> None:
        self._shown[name] = int(status.get("versions") or 0)

    def forget(self, name: str) -> None:
        self._shown.pop(name, None)

    def changed(self, counts: Mapping[str, int]) -> dict[str, int]:
        """The totals of known Locations that differ from what their status shows."""
        return {n: t for n, t in counts.items() if n in self._shown and self._shown[n] != t}


def counts_of(configmap: Mapping[str, Any] | None) -> dict[str, int]:
    """The totals the ConfigMap holds; a value that is not a count is skipped."""
    data: Mapping[str, str] = (configmap or {}).get("data") or {}
    return {name: int(raw) for name, raw in data.items() if raw.isdigit() and len(raw) < 19}


async def copy_once(cluster: Cluster, shown: ShownCounts) -> int:
    """Patch the status of every known Location whose count changed; how many."""
    counts = counts_of(await asyncio.to_thread(cluster.read_configmap, COUNTS))
    changed = shown.changed(counts)
    for name, total in changed.items():
        await asyncio.to_thread(cluster.patch_status, "locations", name, {"versions": total})
        shown.seen(name, {"versions": total})
    return len(changed)


async def copy_counts(cluster: Cluster, shown: ShownCounts, interval: float) -> None:
    while True:
        try:
            await copy_once(cluster, shown)
        except Exception as e:  # the API server is away: the next round copies them
            log.warning("version counts not copied into status: %s", e)
        await asyncio.sleep(interval)
