"""No abandoned uploads: the multipart upload of a write whose pending lease expired is
aborted in its location's bucket, and the files a directory write whose lease expired had
uploaded are deleted (issue 17, docs/storage.md "Abandoned uploads").

A pending record (``records.pending_key``) lives under a lease; when the lease expires
the store deletes the record. The sweeper watches the pending prefix for deletes with
the record as it was (``prev_kv``) and tells the two kinds of delete apart:

- by age, with no call: a lease lives at least ``PENDING_TTL`` from its write's begin, so
  a delete younger than that (less a margin for the replicas' clocks) is a commit. A
  commit costs no replica a read. (A lease lost in etcd under the service deletes young
  records too; their uploads are left to the bucket's lifecycle rule.)
- by what else the store holds, for a delete as old as an expiry: a commit deletes the
  pending record in the transaction that writes the version's record, so a delete whose
  version record exists was a commit (one made in the lease's last minutes), and any other
  was an expiry whose upload no one will finish.

Had a commit been taken for an expiry, its abort would do no harm either: a completed S3
upload answers NoSuchUpload, a composed GCS write has no part objects left.

A directory write's files are plain objects (one PUT each, under
``<artifact>/<version>/``), which no bucket rule removes: for its deletes the sweeper skips
the age shortcut and always looks for the version record (one read per directory commit),
so a lease lost young is cleaned up too. Its files are deleted only after that read found
no version and after the claim below: a commit's transaction is guarded by the pending
record's revision, so once the record is gone no commit can make the version, and the
files the sweeper deletes belong to a write that can never be read. The deletes are those
of the manifest's files that the bucket holds (one listing, then deletes in parallel);
``bytes`` counts what the bucket held.

Every replica sees every delete. One claims the sweep with a compare-and-set on a
``swept/<version>`` key (under the pending writes' lease, so claims go away on their
own) and only it aborts and counts; an abort is idempotent on every backend anyway (S3
answers NoSuchUpload, taken as done; GCS finds no part objects left; Azure has nothing
to drop), so a sweep repeated after a lost answer does no harm. What the sweeper misses
(no replica running when a lease expired, a bucket that refused the abort) the bucket's
lifecycle rule catches after ``operator.abortIncompleteUploadsAfterDays`` (S3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from o41.state import Compare, KeyValue, LeaseNotFound, Put, StoreUnavailable
from o41.webhook.buckets import bucket_for, delete_files
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed
from o41.webhook.http.store import STORE
from o41.webhook.records import PREFIX, Pending, version_key
from o41.webhook.usage.counters import USAGE, location_dims
from o41.webhook.writes import pending as pending_writes  # its PENDING_TTL: read at each sweep
from o41.webhook.writes.pending import LEASES

log = logging.getLogger("o41.webhook.sweeper")  # its name is a log field: kept

PENDING_PREFIX = PREFIX + b"pending/"
SWEPT_PREFIX = PREFIX + b"swept/"
RETRY = 1.0  # seconds between watches when the store is away
FRESH_AFTER = 3  # failed watches in a row before watching from now (history compacted)
CLOCKS = 120.0  # seconds the replicas' clocks may differ (``Pending.began`` is the begin's)


def swept_key(version: str) -> bytes:
    return SWEPT_PREFIX + version.encode()


class Sweeper:
    """Watches the pending writes; ``run`` until cancelled."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self.swept = 0  # uploads this replica aborted (tests, logs)
        self.seen = 0  # pending deletes it has decided on (a commit, an expiry, another's)

    async def run(self) -> None:
        store = self._app[STORE]
        start, failures = 0, 0
        while True:
            try:
                events = store.watch(
                    PENDING_PREFIX, start_revision=start, prev_kv=True, deletes_only=True
                )
                async for event in events:
                    failures = 0
                    start = event.kv.mod_revision + 1
                    if event.kind == "delete" and event.prev is not None:
                        await self.sweep(event.prev)
                        self.seen += 1
            except StoreUnavailable as e:
                failures += 1
                if failures >= FRESH_AFTER:
                    start = 0  # the deletes in between are left to the buckets' rule
                log.warning("the sweeper's watch of pending writes failed (%s); again", e)
            await asyncio.sleep(RETRY)  # also when the watch ended: the store is closing

    async def sweep(self, record: KeyValue) -> bool:
        """Clean up after the pending write ``record`` unless it was committed or another
        replica claimed it: abort its multipart upload, or delete the files of a directory
        write; True if this replica did."""
        try:
            pending = Pending.load(record.value)
        except (ValueError, TypeError) as e:
            log.warning("a pending record %r is unreadable (%s); left", record.key, e)
            return False
        if pending.upload_id is None and pending.manifest is None:
            return False  # a single PUT: no upload to abort
        try:
            return await self._sweep(pending)
        except StoreUnavailable as e:
            log.warning("write %s not swept (%s); the bucket's rule will", pending.version, e)
            return False

    async def _sweep(self, pending: Pending) -> bool:
        app, store = self._app, self._app[STORE]
        directory = pending.manifest is not None
        # A directory's files are plain objects no bucket rule removes: its deletes are
        # always looked up (one read per directory commit), a lease lost young included.
        if not directory and time.time() < pending.began + pending_writes.PENDING_TTL - CLOCKS:
            return False  # too young to have expired: a commit
        committed = version_key(pending.organization, pending.artifact, pending.version)
        if await store.get(committed) is not None:
            return False  # the commit's transaction deleted it
        # No commit can follow: a commit's transaction is guarded by the pending record,
        # which is gone. So the files are deleted only after this claim, never before.
        if not await self._claim(pending.version):
            return False
        location = app[VIEW].locations.get(pending.location)
        dims: dict[str, str | None] = {"location": pending.location}
        size, aborted = pending.size or 0, False
        what = "files" if directory else "upload"  # for the logs
        if location is None:
            log.warning(
                "write %s expired in location %r, which is gone: its %s not cleaned up",
                pending.version,
                pending.location,
                what,
            )
        else:
            dims = location_dims(location)
            try:
                opened = await bucket_for(app, location)
                if pending.manifest is not None:
                    paths = [str(row[0]) for row in pending.manifest]
                    _, size = await delete_files(opened, location.name, pending.key, paths)
                else:
                    upload_id = pending.upload_id
                    assert upload_id is not None
                    await opened.call(
                        location.name,
                        lambda: opened.bucket.abort_multipart(pending.key, upload_id),
                    )
                aborted = True
            except LocationFailed as e:
                log.warning(
                    "the %s of expired write %s not cleaned up: %s", what, pending.version, e
                )
            except Exception as e:  # the Secret cannot be read now, and the like
                log.warning(
                    "the %s of expired write %s not cleaned up (%s)",
                    what,
                    pending.version,
                    type(e).__name__,
                )
        app[USAGE].add(
            pending.organization,
            "abandoned",
            dims,
            uploads=1,
            bytes=size,
            aborted=int(aborted),
            abortedBytes=size if aborted else 0,
        )
        if aborted:
            self.swept += 1
            log.info("cleaned up the %s of expired write %s", what, pending.version)
        return aborted

    async def _claim(self, version: str) -> bool:
        """One replica sweeps each write: the first to create its ``swept`` key."""
        store, leases = self._app[STORE], self._app[LEASES]
        key = swept_key(version)
        lease = await leases.current(store)
        for attempt in range(2):
            try:
                result = await store.txn(
                    [Compare(key, "version", "==", 0)], [Put(key, b"", lease=lease)]
                )
            except LeaseNotFound:
                if attempt:
                    raise StoreUnavailable("it lost the lease of pending writes twice") from None
                lease = await leases.renew(store, lease)
                continue
            return result.succeeded
        return False


SWEEPER: web.AppKey[Sweeper] = web.AppKey("sweeper")


async def sweeping(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context (after the store's): the sweeper runs while the service
    does."""
    sweeper = Sweeper(app)
    app[SWEEPER] = sweeper
    task = asyncio.create_task(sweeper.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
