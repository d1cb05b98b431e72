"""The operator's records of its Locations (``o41.kube.location_record``), kept in ConfigMaps
of its namespace and cached here.

The operator is their only writer (RBAC: only its ServiceAccount may write ConfigMaps in
its namespace), so the cache, loaded at startup, stays the truth; admission reads the API
anyway, since a refusal to delete must not depend on a cache. Synchronous, like
``Cluster``: called from kopf's sync handlers or through ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from o41.kube.location_record import SELECTOR, LocationRecord, parse, record_name
from o41.kube.locations import condition
from o41.operator.cluster import Cluster
from o41.operator.model import now

log = logging.getLogger(__name__)


class Records:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._cache: dict[str, LocationRecord] = {}

    def load(self) -> int:
        """Read every record of the namespace (at startup, before any handler runs)."""
        for configmap in self._cluster.list_configmaps(SELECTOR):
            record = parse(configmap)
            if record is not None:
                self._cache[record.uid] = record
        return len(self._cache)

    def cached(self, uid: str) -> LocationRecord | None:
        return self._cache.get(uid)

    def read(self, uid: str) -> LocationRecord | None:
        """The record as stored now (admission)."""
        configmap = self._cluster.read_configmap(record_name(uid))
        record = parse(configmap) if configmap is not None else None
        if record is not None:
            self._cache[uid] = record
        return record

    def ensure(self, name: str, uid: str, status: Mapping[str, Any]) -> LocationRecord:
        """The Location's record, created on first sight.

        A Location set up by an operator that kept all this in status (before records
        existed) gets its ``readySince`` from there. Status is user-writable, but this can
        only make a location look older, never deletable or writable: writable needs a
        setup that succeeded, which only this operator records.
        """
        found = self._cache.get(uid) or self.read(uid)
        if found is not None:
            return found
        record = LocationRecord(uid=uid, location=name, ready_since=_ready_before(status))
        namespace = self._cluster.namespace
        if not self._cluster.create_configmap(record.configmap(namespace)):
            record = self.read(uid) or record  # created meanwhile (another handler)
        self._cache[uid] = record
        return record

    def save(self, record: LocationRecord) -> LocationRecord:
        """Write the record's changes. ``readySince`` is never taken back."""
        current = self._cache.get(record.uid)
        if current is not None and current.ever_ready and not record.ever_ready:
            record = record.with_(ready_since=current.ready_since)
        if record == current:
            return record
        self._write(record)
        self._cache[record.uid] = record
        return record

    def restore(self, uid: str) -> LocationRecord | None:
        """Put the record back as this operator wrote it, if it went missing or someone
        else changed it (only the operator should be able to; a namespace admin can).
        A ``readySince`` found there is kept: it can only protect a location more."""
        mine = self._cache.get(uid)
        if mine is None:
            return None
        configmap = self._cluster.read_configmap(record_name(uid))
        stored = parse(configmap) if configmap is not None else None
        if stored == mine:
            return mine
        if stored is not None and stored.ever_ready and not mine.ever_ready:
            mine = mine.with_(ready_since=stored.ready_since)
        log.warning("the record of location %r was changed or removed: restored", mine.location)
        self._write(mine)
        self._cache[uid] = mine
        return mine

    def _write(self, record: LocationRecord) -> None:
        body = record.configmap(self._cluster.namespace)
        data: dict[str, str | None] = dict(record.data())
        if data["readySince"] is None:
            del data["readySince"]  # never removed, even by a stale record
        patch = {
            "metadata": {
                k: body["metadata"][k] for k in ("labels", "annotations", "ownerReferences")
            },
            "data": data,
        }
        name = record_name(record.uid)
        if not self._cluster.patch_configmap(name, patch):
            self._cluster.create_configmap(body)  # removed meanwhile: made again

    def forget(self, uid: str) -> None:
        """The Location is gone (its record goes with it: the owner reference)."""
        self._cache.pop(uid, None)


def _ready_before(status: Mapping[str, Any]) -> str | None:
    if status.get("readySince"):
        return str(status["readySince"])
    if condition(status).get("status") == "True" or int(status.get("versions") or 0) > 0:
        return now()
    return None
