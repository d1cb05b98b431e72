"""The index backfill: versions committed before the index existed (their record has no
commit sequence number, ``seq == 0``, and no index key) read by id but are not listed
and have no ``latest``. The service gives each an index key, once (docs/artifacts.md
"Versions committed before the index").

Such a version cannot take a sequence number below the ones commits have taken since
(they start at 1), so it takes the **legacy band**: the index position after sequence 1
(``ffffffffffffffff``), then its inverted commit time in milliseconds and the random half
of its id (``<16 f>-<inverted ms, 12 hex>-<random, 16 hex>``, the shape of every index
key). Listings show them after every version committed since, newest first among
themselves. The suffix is a function of the record, so a key is put at most once:

- each put is a transaction guarded by the version record's revision and the index key's
  absence, so two replicas backfilling at once, or a pass repeated after a crash, put
  nothing twice, and a version retention is deleting is not indexed again;
- an artifact with no record (``artifacts/ORG/ARTIFACT``, which ``latest`` and the
  artifacts listing read) gets one naming its newest legacy version (created only when
  absent, moved only while no commit has numbered a version: count 0).

It runs in the background at every start of a replica until one full scan of the
versions finds nothing to do; then it writes ``backfill/index`` and later starts skip it.
Left: a replica of the release before the index, still running in a rolling upgrade
after that scan, commits versions that stay unlisted (read by id) until the key is
deleted and a replica restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from o41.state import Compare, Put, Store, StoreUnavailable
from o41.webhook.http.store import STORE
from o41.webhook.records import PREFIX, ArtifactRecord, Version, artifact_key, index_prefix

log = logging.getLogger("o41.webhook.backfill")  # its name is a log field: kept

DONE = PREFIX + b"backfill/index"
VERSIONS = PREFIX + b"versions/"
LEGACY = "f" * 16  # the index position after sequence 1: older than every numbered commit
PAGE = 500
RETRY = 30.0  # seconds before a backfill stopped by the store starts again


def legacy_suffix(record: Version) -> str:
    """The index suffix of a version committed before the index: the legacy band, newest
    commit first."""
    inverted = (1 << 48) - 1 - int(record.committed * 1000)
    return f"{LEGACY}-{max(inverted, 0):012x}-{record.version[-16:]}"


async def backfill(store: Store) -> int:
    """Index every version committed before the index; how many it indexed now. Writes
    the done key after a full scan that found nothing to index."""
    if await store.get(DONE) is not None:
        return 0
    indexed, start = 0, b""
    newest: dict[tuple[str, str], Version] = {}
    banded: dict[tuple[str, str], set[bytes]] = {}  # each artifact's legacy keys, read once
    while True:
        page = await store.range(VERSIONS, limit=PAGE, start=start)
        for kv in page:
            try:
                record = Version.load(kv.value)
            except (ValueError, TypeError):
                log.warning("backfill: the version record %r is unreadable; skipped", kv.key)
                continue
            if record.seq or record.deleting is not None:
                continue
            org, artifact = record.organization, record.artifact
            key = index_prefix(org, artifact) + legacy_suffix(record).encode()
            held = banded.get((org, artifact))
            if held is None:
                band = index_prefix(org, artifact) + LEGACY.encode()
                found = await store.range(index_prefix(org, artifact), start=band)
                held = banded[(org, artifact)] = {kv.key for kv in found}
            best = newest.get((org, artifact))
            if best is None or record.committed > best.committed:
                newest[(org, artifact)] = record
            if key in held:
                continue  # indexed by an earlier start: no transaction
            result = await store.txn(
                [Compare(kv.key, "mod", "==", kv.mod_revision), Compare(key, "version", "==", 0)],
                [Put(key, kv.value)],
            )
            indexed += int(result.succeeded)
        if len(page) < PAGE:
            break
        start = page[-1].key + b"\0"
    for record in newest.values():
        await _name_latest(store, record)
    if indexed == 0:
        await store.put(DONE, b"1")
    else:
        log.info("backfill: indexed %d versions committed before the index", indexed)
    return indexed


async def _name_latest(store: Store, record: Version) -> None:
    """The artifact's record, for an artifact whose versions are all legacy ones."""
    akey = artifact_key(record.organization, record.artifact)
    fresh = ArtifactRecord(record.artifact, record.version, record.committed, 0).dump()
    found = await store.get(akey)
    if found is None:
        await store.txn([Compare(akey, "version", "==", 0)], [Put(akey, fresh)])
        return
    current = ArtifactRecord.load(found.value)
    if current.count == 0 and current.committed < record.committed:
        await store.txn([Compare(akey, "mod", "==", found.mod_revision)], [Put(akey, fresh)])


async def backfilling(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context: the backfill runs once in the background at start."""

    async def run() -> None:
        while True:
            try:
                await backfill(app[STORE])
            except StoreUnavailable as e:
                log.warning("backfill of the index stopped (%s); again in %.0f s", e, RETRY)
                await asyncio.sleep(RETRY)
            else:
                return

    task = asyncio.create_task(run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
