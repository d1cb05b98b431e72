"""The record backfill (issue 32): versions committed before the buckets held the record
have no record object, and a directory's manifest is in etcd. Once, in the background
at start, the service writes each such version's record object (and moves a directory's
manifest out of etcd into a manifest object beside its files), so a rebuild from the
buckets finds every version.

Per version, each step safe to repeat and to stop after: for a directory whose manifest
is still in etcd, PUT the manifest object, then PUT the record object, then one
transaction guarded by the version record's revision gives etcd's record the manifest's
hash and size and deletes etcd's copy; for any other version, a HEAD of its record
object, and a PUT when there is none. A version retention is
deleting is left to retention. It writes ``backfill/records`` after a full scan that
found nothing to write and nothing it could not reach, and later starts skip it.

Left, as for the index backfill: a replica of the release before, still running in a
rolling upgrade after that scan, commits versions without a record object;
``o41 admin rebuild --dry-run`` lists them ("in etcd, not in the buckets' records").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from aiohttp import web

from o41.core.directories import load_manifest
from o41.core.ledger import LedgerRefused, record_key
from o41.state import Compare, Delete, KeyValue, Put, StoreUnavailable
from o41.webhook.buckets import bucket_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed
from o41.webhook.http.store import STORE
from o41.webhook.ledger import put_manifest, put_record
from o41.webhook.records import PREFIX, Version, manifest_key

log = logging.getLogger("o41.webhook.backfill")  # its name is a log field: kept

DONE = PREFIX + b"backfill/records"
VERSIONS = PREFIX + b"versions/"
PAGE = 500
RETRY = 30.0  # seconds before a scan that could not reach everything starts again


async def backfill_records(app: web.Application) -> tuple[int, int]:
    """One scan: (versions whose record it wrote now, versions it could not finish).
    Writes the done key after a scan with neither."""
    store = app[STORE]
    if await store.get(DONE) is not None:
        return 0, 0
    await app[VIEW].synced.wait()
    written = failed = 0
    start = b""
    while True:
        page = await store.range(VERSIONS, limit=PAGE, start=start)
        for kv in page:
            try:
                written += await _one(app, kv)
            except LocationFailed as e:  # again at the next scan
                failed += 1
                log.warning("record backfill: %r not done: %s", kv.key.decode(errors="replace"), e)
            except (LedgerRefused, ValueError, TypeError) as e:  # no scan would do better
                log.warning("record backfill: %r left out: %s", kv.key.decode(errors="replace"), e)
        if len(page) < PAGE:
            break
        start = page[-1].key + b"\0"
    if written == failed == 0:
        await store.put(DONE, b"1")
    elif written:
        log.info("record backfill: wrote the record objects of %d versions", written)
    return written, failed


async def _one(app: web.Application, kv: KeyValue) -> int:
    """1 when it wrote this version's record object now."""
    version = Version.load(kv.value)
    if version.deleting is not None:
        return 0
    location = app[VIEW].locations.get(version.location)
    if location is None:
        raise LedgerRefused(f"location {version.location!r} is not known to the service")
    opened = await bucket_for(app, location)
    if version.files is None or version.manifest_sha256 is not None:
        key = record_key(version.organization, version.artifact, version.version)
        if await opened.call(location.name, lambda: opened.bucket.stat(key)) is not None:
            return 0
        await put_record(opened, location.name, version)
        return 1
    store = app[STORE]
    mkey = manifest_key(version.organization, version.artifact, version.version)
    found = await store.get(mkey)
    if found is None:
        raise LedgerRefused(f"directory version {version.version} has no manifest in etcd")
    entries = load_manifest(found.value)
    ref = await put_manifest(
        opened, location.name, version.organization, version.artifact, version.version, entries
    )
    moved = replace(version, manifest_sha256=ref.sha256, manifest_size=ref.size)
    await put_record(opened, location.name, moved)
    guard = Compare(kv.key, "mod", "==", kv.mod_revision)  # retention did not mark it
    done = await store.txn([guard], [Put(kv.key, moved.dump()), Delete(mkey)])
    return int(done.succeeded)


async def backfilling_records(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context: the record backfill in the background at start, again
    every ``RETRY`` seconds until a scan finds everything done."""

    async def run() -> None:
        while True:
            try:
                written, failed = await backfill_records(app)
            except StoreUnavailable as e:
                log.warning("record backfill stopped (%s); again in %.0f s", e, RETRY)
            else:
                if written == failed == 0:
                    return
                if not failed:
                    continue  # one more scan to see everything done, then the done key
            await asyncio.sleep(RETRY)

    task = asyncio.create_task(run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
