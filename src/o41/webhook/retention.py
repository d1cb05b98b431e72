"""Retention: deletes the versions an organization's rule lets go (``o41.core.retention``
decides which), object and records, in whatever location holds them (a retired one too).
docs/artifacts.md "Retention".

A version is deleted in three steps, each safe to repeat and to stop after:

1. **Mark**: its record and its index key get ``deleting`` (a transaction guarded by the
   record's revision). From then on a read answers 404 "deleted by retention", and a tag
   can no longer be moved onto it: ``move_tag`` guards its transaction with the version
   record's revision too, so a tag move that read the version before the mark loses.
2. **Check the tags again**, after the mark: a tag move onto the version that won its
   transaction did so before the mark, so the tags read now show every tag that will
   ever point at it. If one does, the mark is taken back and the version stays.
3. **Journal** the deletion in the organization's fallback location (its sequence
   number stays taken in a rebuild; the entry's time is the mark's, so a repeat writes
   the same object), **delete** the object in the location's bucket (idempotent: a key
   with no object is not an error), the version's manifest and record objects last
   (``o41.webhook.ledger``), then both etcd records in one transaction guarded by the
   marked revision, which also leaves a small key (``deleted/ORG/ARTIFACT/VERSION``, under
   a lease of :data:`DELETED_REMEMBERED`) so that a read of the version says retention
   deleted it rather than that it never was.
   A directory version's objects are every one under its prefix (``<artifact>/<version>/``,
   one listing, deletes in parallel, each idempotent); its ``manifests/`` record goes in
   that same last transaction, so a stop halfway through its files leaves the marked
   record and the manifest, and the next pass lists and deletes what is left.

A stop between the steps leaves a marked record: the read path answers it clearly (404,
"deleted by retention") and the next pass (after a commit of the artifact, or the
periodic pass) finishes it. No step deletes a record before its object, so no record
ever points at nothing unmarked, and nothing a rule keeps is touched.

Passes run after every commit of an artifact a rule covers (in the background: a commit
never waits for them) and every ``Settings.retention_interval`` seconds over the
artifacts the rules match (rules changed, a bucket that failed, a pass stopped halfway).
Each replica runs its own; their steps are compare-and-set, so two never delete twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from aiohttp import web

from o41.core.ledger import Deletion, micros, record_key
from o41.core.ledger import manifest_key as manifest_object_key
from o41.core.retention import Row, choose, keep_for
from o41.state import Compare, Delete, KeyValue, LeaseNotFound, Put, StoreUnavailable
from o41.webhook.buckets import bucket_for, delete_files
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed
from o41.webhook.http.settings import SETTINGS
from o41.webhook.http.store import STORE
from o41.webhook.ledger import write_entry
from o41.webhook.records import (
    ArtifactRecord,
    Tag,
    Version,
    artifact_key,
    artifacts_prefix,
    deleted_key,
    index_prefix,
    manifest_key,
    tags_prefix,
    version_key,
)
from o41.webhook.usage.counters import USAGE, location_dims

log = logging.getLogger(__name__)

BATCH = 200  # index keys read at a time
#: How long a deleted version reads as "deleted by the retention rule" (then as "no
#: committed version"): its key is small, but a rule that deletes a version every few
#: minutes for years must not fill etcd. One lease a day, shared by that day's deletions.
DELETED_REMEMBERED = 30 * 24 * 3600
MAX_TAGS = 10_000  # tags read per artifact (more: the artifact is left alone, logged)


class Retention:
    """The service's retention passes; ``run`` until cancelled."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._wanted: set[tuple[str, str]] = set()
        self._wake = asyncio.Event()
        self.deleted = 0  # versions this replica deleted (tests, logs)
        self.passes = 0  # passes this replica finished
        self._remembered = (-1, 0)  # (day, lease) the deleted versions' keys go under

    async def _remembering(self, lost: int = 0) -> int:
        """The lease of today's deleted versions' keys; a new one in place of ``lost``
        (expired or revoked in etcd under the service)."""
        day, lease = self._remembered
        today = int(time.time() // 86400)
        if day == today and lease and lease != lost:
            return lease
        lease = await self._app[STORE].lease_grant(DELETED_REMEMBERED + 86400)
        self._remembered = (today, lease)
        return lease

    def committed(self, organization: str, artifact: str) -> None:
        """A commit of ``artifact``: a pass over it soon, if a rule covers it."""
        org = self._app[VIEW].organizations.get(organization)
        if org is None or keep_for(org.retention, artifact) is None:
            return
        self._wanted.add((organization, artifact))
        self._wake.set()

    async def run(self) -> None:
        interval = self._app[SETTINGS].retention_interval
        last_sweep = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
            self._wake.clear()
            wanted, self._wanted = self._wanted, set()
            if time.monotonic() - last_sweep >= interval:
                last_sweep = time.monotonic()
                try:
                    wanted |= await self._covered()
                except Exception:  # the loop must outlive any one failure
                    log.exception("retention could not list the covered artifacts")
            for organization, artifact in sorted(wanted):
                try:
                    await self.apply(organization, artifact)
                except StoreUnavailable as e:
                    log.warning(
                        "retention of %s/%s stopped (%s); again later", organization, artifact, e
                    )
                except Exception:
                    log.exception("retention of %s/%s failed", organization, artifact)

    async def _covered(self) -> set[tuple[str, str]]:
        """Every artifact some organization's rule covers."""
        store, found = self._app[STORE], set[tuple[str, str]]()
        for org in list(self._app[VIEW].organizations.values()):
            if not org.retention:
                continue
            prefix, start = artifacts_prefix(org.name), b""
            try:
                while True:
                    page = await store.range(prefix, limit=BATCH, start=start)
                    for kv in page:
                        name = kv.key[len(prefix) :].decode()
                        if keep_for(org.retention, name) is not None:
                            found.add((org.name, name))
                    if len(page) < BATCH:
                        break
                    start = page[-1].key + b"\0"
            except StoreUnavailable as e:
                log.warning("retention could not list the artifacts of %s (%s)", org.name, e)
        return found

    async def apply(self, organization: str, artifact: str) -> int:
        """One pass over ``artifact``: how many versions it deleted."""
        org = self._app[VIEW].organizations.get(organization)
        keep = None if org is None else keep_for(org.retention, artifact)
        if keep is None:
            return 0
        store = self._app[STORE]
        protected = await self._protected(organization, artifact)
        if protected is None:
            return 0
        prefix, start, kept, deleted = index_prefix(organization, artifact), b"", 0, 0
        while True:
            page = await store.range(prefix, limit=BATCH, start=start)
            rows = {Version.load(kv.value).version: kv for kv in page}
            decision = choose(
                [Row(v, Version.load(kv.value).deleting is not None) for v, kv in rows.items()],
                keep,
                protected,
                kept,
            )
            kept = decision.kept
            for version in decision.restore:
                await self._restore(rows[version], version)
            for version in decision.delete:
                deleted += await self._delete(organization, artifact, rows[version])
            if len(page) < BATCH:
                break
            start = page[-1].key + b"\0"
        self.passes += 1
        return deleted

    async def _protected(self, organization: str, artifact: str) -> set[str] | None:
        """The versions tags point at, and ``latest``; None: too many tags to be sure."""
        store = self._app[STORE]
        tags = await store.range(tags_prefix(organization, artifact), limit=MAX_TAGS + 1)
        if len(tags) > MAX_TAGS:
            log.warning(
                "artifact %s/%s has more than %d tags: retention leaves it alone",
                organization,
                artifact,
                MAX_TAGS,
            )
            return None
        protected = {Tag.load(kv.value).version for kv in tags}
        found = await store.get(artifact_key(organization, artifact))
        if found is not None:
            protected.add(ArtifactRecord.load(found.value).latest)
        return protected

    async def _delete(self, organization: str, artifact: str, index: KeyValue) -> int:
        """Mark, check the tags again, delete the object, delete the records: 1 when this
        call deleted the version."""
        app, store = self._app, self._app[STORE]
        listed = Version.load(index.value)
        vkey = version_key(organization, artifact, listed.version)
        current = await store.get(vkey)
        if current is None:  # an index key left without its record: drop it
            await store.txn(
                [Compare(index.key, "mod", "==", index.mod_revision)], [Delete(index.key)]
            )
            return 0
        record = Version.load(current.value)
        if record.deleting is None:
            marked = replace(record, deleting=time.time())
            result = await store.txn(
                [Compare(vkey, "mod", "==", current.mod_revision)],
                [Put(vkey, marked.dump()), Put(index.key, marked.dump())],
            )
            if not result.succeeded:
                return 0  # changed meanwhile: the next pass decides again
            record = marked
            again = await store.get(vkey)
            if again is None:
                return 0
            current = again
        protected = await self._protected(organization, artifact)
        if protected is None or record.version in protected:
            await self._restore(await store.get(index.key) or index, record.version)
            return 0
        location = app[VIEW].locations.get(record.location)
        if location is None:
            log.warning(
                "retention: version %s lives in location %r, which the service does not know; "
                "it stays marked",
                record.version,
                record.location,
            )
            return 0
        records: list[Delete] = [Delete(vkey), Delete(index.key)]
        assert record.deleting is not None
        gone = Deletion(organization, artifact, record.version, record.seq, micros(record.deleting))
        try:
            await write_entry(app, gone, location.name)  # the same entry if repeated
            opened = await bucket_for(app, location)
            if record.files is None:
                await opened.call(location.name, lambda: opened.bucket.delete(record.key))
            else:  # a directory: every object under its prefix, then its manifest too
                await delete_files(opened, location.name, record.key)
                records.append(Delete(manifest_key(organization, artifact, record.version)))
            for key in ledger_keys(record):  # the bucket's record last: a rebuild needs it
                await opened.call(location.name, functools.partial(opened.bucket.delete, key))
        except LocationFailed as e:
            log.warning("retention: version %s not deleted: %s", record.version, e)
            return 0
        guard = [Compare(vkey, "mod", "==", current.mod_revision)]
        said = json.dumps({"deleted": record.deleting, "seq": record.seq}).encode()
        remembered = deleted_key(organization, artifact, record.version)
        lease = await self._remembering()
        try:
            result = await store.txn(guard, [*records, Put(remembered, said, lease=lease)])
        except LeaseNotFound:
            lease = await self._remembering(lost=lease)
            result = await store.txn(guard, [*records, Put(remembered, said, lease=lease)])
        if not result.succeeded:
            return 0  # another replica's pass finished it
        app[USAGE].add(
            organization, "retention", location_dims(location), versions=1, bytes=record.size
        )
        self.deleted += 1
        log.info(
            "retention deleted version %s of %s/%s (%d bytes, location %s)",
            record.version,
            organization,
            artifact,
            record.size,
            location.name,
        )
        return 1

    async def _restore(self, index: KeyValue, version: str) -> None:
        """Take back the mark of a version a tag points at now."""
        store = self._app[STORE]
        listed = Version.load(index.value)
        vkey = version_key(listed.organization, listed.artifact, version)
        current = await store.get(vkey)
        if current is None:
            return
        record = Version.load(current.value)
        if record.deleting is None:
            return
        kept = replace(record, deleting=None).dump()
        await store.txn(
            [Compare(vkey, "mod", "==", current.mod_revision)],
            [Put(vkey, kept), Put(index.key, kept)],
        )
        log.info("retention kept version %s: a tag points at it", version)


def ledger_keys(record: Version) -> list[str]:
    """The version's objects of the buckets' record: its manifest object, then its record
    object (deleted last, once nothing else of the version is left)."""
    org, artifact, version = record.organization, record.artifact, record.version
    keys = [] if record.manifest_sha256 is None else [manifest_object_key(org, artifact, version)]
    return [*keys, record_key(org, artifact, version)]


RETENTION: web.AppKey[Retention] = web.AppKey("retention")


async def retaining(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context (after the store's): retention runs while the service
    does."""
    retention = Retention(app)
    app[RETENTION] = retention
    task = asyncio.create_task(retention.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
