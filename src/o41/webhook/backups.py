"""Scheduled etcd snapshots, taken by the placement service (docs/operations.md,
"Backups and restore").

Every replica runs :class:`Backups`; the one that wins a compare-and-swap on
:data:`LAST_KEY` (etcd's own transaction: no election of ours) takes the snapshot when the
last one is older than the interval, uploads it with a JSON sidecar to the fallback
location of the backup organization (the platform team's, never a tenant's: a snapshot
holds every tenant's records), records it in the key, and deletes snapshots beyond the
newest ``keep``. A claim that is never finished (the replica died) expires after
:data:`CLAIM_SECONDS`, then another replica takes over.

The last success is read from the key, so every replica reports the same time in
``/metrics``; the alert compares it with the interval. The embedded store (no etcd) has no
snapshot: the task says so once and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from o41.state import Compare, Put, StoreUnavailable
from o41.state.snapshot import (
    PREFIX,
    Snapshot,
    SnapshotError,
    newest_first,
    sidecar_key,
    snapshot_key,
    take,
)
from o41.webhook import telemetry
from o41.webhook.buckets import OpenBucket, bucket_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed
from o41.webhook.http.settings import SETTINGS
from o41.webhook.http.store import STORE

log = logging.getLogger(__name__)

LAST_KEY = b"/o41/placement/backup/last"
CLAIM_SECONDS = 900.0  # a claim older than this was abandoned (its replica died)
# config: no such organization or fallback; etcd_new: etcd has no record but the bucket
# has snapshots (a lost etcd not restored yet)
STAGES = ("config", "etcd_new", "claim", "snapshot", "upload", "record", "retention")


@dataclass
class Stats:
    """This replica's counts, and the last snapshot as the key says (every replica alike)."""

    last: Snapshot | None = None
    taken: int = 0
    failures: dict[str, int] | None = None

    def failed(self, stage: str) -> None:
        if self.failures is None:
            self.failures = {}
        self.failures[stage] = self.failures.get(stage, 0) + 1


class Backups:
    """The snapshot schedule of one replica; ``run`` until cancelled."""

    def __init__(self, app: web.Application, *, claim_seconds: float = CLAIM_SECONDS) -> None:
        self._app = app
        settings = app[SETTINGS]
        self.organization = settings.backup_organization
        self.interval = settings.backup_interval
        self.keep = settings.backup_keep
        self.directory = settings.backup_dir
        self.claim_seconds = claim_seconds
        self.replica = f"{socket.gethostname()}-{os.getpid()}"
        self.stats = Stats()
        self.enabled = bool(self.organization)
        self._taking = False

    @property
    def check_every(self) -> float:
        """Seconds between looks at the key: a quarter of the interval, at most a minute."""
        return min(60.0, max(0.5, self.interval / 4))

    async def run(self) -> None:
        settings = self._app[SETTINGS]
        if not self.enabled:
            return
        if not settings.etcd_endpoints:
            log.warning("backups: the embedded store has no snapshot API: no snapshots taken")
            self.enabled = False
            return
        while True:
            try:
                await self.tick()
            except Exception:  # the loop must outlive any one failure
                log.exception("backups: a pass failed")
            await asyncio.sleep(self.check_every)

    async def tick(self) -> Snapshot | None:
        """One look: refresh what the key says; take a snapshot if it is due and this
        replica wins the claim. The snapshot taken, if any."""
        store = self._app[STORE]
        try:
            kv = await store.get(LAST_KEY)
        except StoreUnavailable as e:
            log.warning("backups: cannot read %s (%s)", LAST_KEY.decode(), e)
            return None
        state = _state(kv.value if kv else None)
        self.stats.last = state.last
        now = time.time()
        if state.last is not None and now - state.last.taken < self.interval:
            return None
        # a claim of this replica's own that it is not working on came back with a
        # restored snapshot (taken while it was claimed): it is no claim now
        ours = state.claim_by == self.replica and not self._taking
        if state.claim_at is not None and now - state.claim_at < self.claim_seconds and not ours:
            return None  # another replica is taking it
        if kv is None and await self._backups_exist():
            return None
        claim = _encode(state.last, self.replica, now)
        guard = Compare(LAST_KEY, "mod", "==", kv.mod_revision) if kv else None
        try:
            won = await store.txn(
                [guard or Compare(LAST_KEY, "version", "==", 0)], [Put(LAST_KEY, claim)]
            )
        except StoreUnavailable as e:
            self.stats.failed("claim")
            log.warning("backups: the claim failed (%s)", e)
            return None
        if not won.succeeded:
            return None  # another replica claimed it first
        self._taking = True
        try:
            return await self._take(state.last, won.revision)
        finally:
            self._taking = False

    async def _backups_exist(self) -> bool:
        """etcd holds no record of any snapshot: a first install, or an etcd that was
        lost and made again empty. In the second case the bucket holds snapshots, and a
        snapshot of the empty etcd would become the "latest" (and retention would go on
        to delete the good ones): take none, and say to restore."""
        located = await self._fallback()
        if located is None:
            return True  # said there; nothing can be taken anyway
        location, opened = located
        bucket = opened.bucket
        try:
            listed = await opened.call(location, lambda: bucket.list_under(PREFIX))
        except LocationFailed as e:
            self.stats.failed("upload")
            log.warning("backups: cannot list location %s (%s)", location, e)
            return True
        found = newest_first(list(listed))
        if found:
            self.stats.failed("etcd_new")
            log.warning(
                "backups: etcd holds no record of a snapshot but location %s holds %d (the "
                "newest %s): etcd was lost and made again? No snapshot is taken until it "
                "is restored (kubectl o41 admin restore), or until those are deleted to "
                "start afresh (docs/operations.md, \"Backups and restore\")",
                location, len(found), found[0],
            )  # fmt: skip
        return bool(found)

    async def _take(self, previous: Snapshot | None, claimed: int) -> Snapshot | None:
        located = await self._fallback()
        if located is None:
            await self._release(previous, claimed)
            return None
        location, opened = located
        settings = self._app[SETTINGS]
        with tempfile.TemporaryDirectory(prefix="o41-snapshot-", dir=self.directory) as tmp:
            path = Path(tmp) / "snapshot.db"
            started = time.monotonic()
            try:
                taken = await take(settings.etcd_endpoints, settings.etcd_tls, path)
            except (StoreUnavailable, SnapshotError) as e:
                self.stats.failed("snapshot")
                log.warning("backups: etcd gave no snapshot (%s)", e)
                await self._release(previous, claimed)
                return None
            key = snapshot_key(taken.taken, taken.revision)
            snapshot = Snapshot(
                key, taken.taken, taken.revision, taken.size, taken.sha256, taken.etcd_version
            )
            bucket = opened.bucket
            try:
                await opened.call(location, lambda: bucket.upload(key, path))
                sidecar = snapshot.to_json()
                await opened.call(location, lambda: bucket.put(snapshot.sidecar, sidecar))
            except LocationFailed as e:
                self.stats.failed("upload")
                log.warning("backups: the upload to location %s failed (%s)", location, e)
                await self._release(previous, claimed)
                return None
        seconds = time.monotonic() - started
        try:
            done = await self._app[STORE].txn(
                [Compare(LAST_KEY, "mod", "==", claimed)],
                [Put(LAST_KEY, _encode(snapshot, None, None))],
            )
        except StoreUnavailable as e:
            self.stats.failed("record")
            log.warning("backups: snapshot %s uploaded but not recorded (%s)", key, e)
            return snapshot
        if not done.succeeded:
            log.warning("backups: snapshot %s uploaded; another replica took over the claim", key)
        self.stats.taken += 1
        self.stats.last = snapshot
        log.info(
            "backups: snapshot %s (revision %d, %d bytes) in location %s, %.1f s",
            key, snapshot.revision, snapshot.size, location, seconds,
        )  # fmt: skip
        await self._retain(location, opened)
        return snapshot

    async def _fallback(self) -> tuple[str, OpenBucket] | None:
        """The fallback in force of the backup organization and its open bucket, or None
        (said and counted) when it has none."""
        view = self._app[VIEW]
        org = view.organizations.get(self.organization)
        name = org.fallback if org else None
        location = view.locations.get(name) if name else None
        if location is None:
            self.stats.failed("config")
            why = "does not exist" if org is None else "has no fallback location"
            log.warning("backups: organization %s %s: no snapshot taken", self.organization, why)
            return None
        try:
            return location.name, await bucket_for(self._app, location)
        except Exception as e:  # the Secret of its credentials cannot be read
            self.stats.failed("config")
            log.warning("backups: cannot open location %s (%s)", location.name, e)
            return None

    async def _release(self, previous: Snapshot | None, claimed: int) -> None:
        """Give the claim back after a failure: the next look (any replica) tries again."""
        with contextlib.suppress(StoreUnavailable):
            await self._app[STORE].txn(
                [Compare(LAST_KEY, "mod", "==", claimed)],
                [Put(LAST_KEY, _encode(previous, None, None))],
            )

    async def _retain(self, location: str, opened: OpenBucket) -> None:
        """Delete the snapshots beyond the newest ``keep`` (and their sidecars): only
        after a successful upload, and only objects named as snapshots."""
        bucket = opened.bucket
        try:
            listed = await opened.call(location, lambda: bucket.list_under(PREFIX))
            for key in newest_first(list(listed))[self.keep :]:
                for gone in (key, sidecar_key(key)):
                    await opened.call(location, partial(bucket.delete, gone))
                log.info("backups: snapshot %s deleted (keep %d)", key, self.keep)
        except LocationFailed as e:
            self.stats.failed("retention")
            log.warning("backups: retention in location %s failed (%s)", location, e)


@dataclass(frozen=True)
class _State:
    last: Snapshot | None
    claim_by: str | None
    claim_at: float | None


def _state(value: bytes | None) -> _State:
    if not value:
        return _State(None, None, None)
    try:
        found = json.loads(value)
        last = found.get("last")
        claim = found.get("claim") or {}
        snapshot = (
            Snapshot.from_json(json.dumps(last).encode(), str(last.get("key"))) if last else None
        )
        return _State(snapshot, claim.get("by"), claim.get("at"))
    except (ValueError, AttributeError, SnapshotError) as e:
        log.warning("backups: %s holds no record of ours (%s): taken again", LAST_KEY, e)
        return _State(None, None, None)


def _encode(last: Snapshot | None, by: str | None, at: float | None) -> bytes:
    body: dict[str, Any] = {"last": json.loads(last.to_json()) if last else None}
    body["claim"] = {"by": by, "at": at} if by else None
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


BACKUPS: web.AppKey[Backups] = web.AppKey("backups")


async def backing_up(app: web.Application) -> AsyncIterator[None]:
    """The schedule's task, after the store and the view (``cleanup_ctx``)."""
    backups = Backups(app)
    app[BACKUPS] = backups
    COLLECTOR.follow(backups)
    task = asyncio.create_task(backups.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class BackupCollector(Collector):
    """The snapshot series of this process's schedule, read at scrape time. The families
    are always there; their samples only while backups are on."""

    def __init__(self) -> None:
        self._backups: weakref.ReferenceType[Backups] | None = None

    def follow(self, backups: Backups) -> None:
        self._backups = weakref.ref(backups)

    def collect(self) -> Iterable[Any]:
        backups = self._backups() if self._backups is not None else None
        last = GaugeMetricFamily(
            "o41_etcd_snapshot_last_success_timestamp_seconds",
            "When the last etcd snapshot was taken (from etcd: every replica says the same); "
            "0: none yet.",
        )
        size = GaugeMetricFamily(
            "o41_etcd_snapshot_last_size_bytes", "Size of the last etcd snapshot."
        )
        interval = GaugeMetricFamily(
            "o41_etcd_snapshot_interval_seconds", "Seconds between scheduled etcd snapshots."
        )
        taken = CounterMetricFamily(
            "o41_etcd_snapshots_taken", "etcd snapshots this replica took and uploaded."
        )
        failures = CounterMetricFamily(
            "o41_etcd_snapshot_failures",
            "Snapshot attempts of this replica that failed, by stage (config, etcd_new, "
            "claim, snapshot, upload, record, retention).",
            labels=["stage"],
        )
        if backups is not None and backups.enabled:
            stats = backups.stats
            last.add_metric([], stats.last.taken if stats.last else 0.0)
            size.add_metric([], stats.last.size if stats.last else 0.0)
            interval.add_metric([], backups.interval)
            taken.add_metric([], stats.taken)
            for stage in STAGES:
                failures.add_metric([stage], (stats.failures or {}).get(stage, 0))
        yield from (last, size, interval, taken, failures)


COLLECTOR = BackupCollector()
telemetry.REGISTRY.register(COLLECTOR)
