"""A pending write: the record a begin leaves in the state store until its commit, under a
lease that makes a write never committed expire on its own; and what a resume asks of it
(the parts its bucket holds, fresh upload URLs)."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from o41.core.writes import WriteRefused
from o41.state import LeaseNotFound, Store, StoreUnavailable
from o41.webhook.buckets import UPLOAD_EXPIRES, bucket_for, signed
from o41.webhook.cluster.scope import organization_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import problem
from o41.webhook.http.store import STORE
from o41.webhook.identity.auth import Caller
from o41.webhook.records import Pending, pending_key
from o41.webhook.writes.answers import PartsOut, PresentPart, ProgressOut
from o41.webhook.writes.batching import BATCHER
from o41.webhook.writes.bodies import PartsIn

log = logging.getLogger("o41.webhook.writes")  # its name is a log field: kept

PENDING_TTL = UPLOAD_EXPIRES + 600  # a write never committed expires with its lease


class PendingLease:
    """The lease of one minute of pending records, shared by that minute's begins: expiry
    is what matters, and a lease grant is a round trip to the store. It is the service's
    own: no client ever learns or names it (issue 14: a lease id that reached a client was
    revoked by another namespace)."""

    def __init__(self) -> None:
        self.minute, self.lease = -1, 0
        self._granting = asyncio.Lock()

    async def current(self, store: Store) -> int:
        minute = int(time.time() // 60)
        if minute == self.minute and self.lease:
            return self.lease
        return await self._replace(store, minute, self.lease)

    async def renew(self, store: Store, lost: int) -> int:
        """A new lease in place of ``lost`` (revoked or expired in etcd under the
        service); the begins that saw the same loss share one grant."""
        return await self._replace(store, int(time.time() // 60), lost)

    async def _replace(self, store: Store, minute: int, stale: int) -> int:
        async with self._granting:
            if minute == self.minute and self.lease and self.lease != stale:
                return self.lease  # replaced while this begin waited
            lease = await store.lease_grant(PENDING_TTL + 60)
            self.minute, self.lease = minute, lease
            return lease


LEASES: web.AppKey[PendingLease] = web.AppKey("leases")


async def put_pending(
    app: web.Application, version: str, record: bytes, *, alone: bool = False
) -> None:
    """Store a pending record under this minute's lease. A lease lost under the service
    (revoked or expired in etcd) is replaced once: begins never fail for it. ``alone``:
    a put of its own, not batched with other begins' (a directory's record, whose
    manifest may be most of a request etcd takes)."""
    store, leases, batcher = app[STORE], app[LEASES], app[BATCHER]
    put = store.put if alone else batcher.put
    lease = await leases.current(store)
    try:
        await put(pending_key(version), record, lease=lease)
    except LeaseNotFound:
        log.warning("the lease of pending writes %x was gone from etcd; granting another", lease)
    else:
        return
    try:
        await put(pending_key(version), record, lease=await leases.renew(store, lease))
    except LeaseNotFound:
        raise StoreUnavailable("it lost the lease of pending writes twice in a row") from None


# --- resuming a write --------------------------------------------------------------------


async def pending_of(app: web.Application, caller: Caller, version: str) -> Pending:
    """The caller's pending write ``version``: a write of another tenant is answered as
    one that does not exist, so its id tells nothing; one of an organization the caller
    may no longer use is refused as that organization would be."""
    found = await app[STORE].get(pending_key(version))
    pending = None if found is None else Pending.load(found.value)
    if pending is None or pending.namespace != caller.tenant:
        raise problem(
            404,
            f"no write {version!r} of this namespace is waiting for its commit: it expired, "
            "was committed already, or never began; begin again",
        )
    organization_for(app, pending.organization, caller)
    return pending


def resign_expires(pending: Pending) -> int:
    """Re-signed URLs last no longer than the pending write they upload to."""
    left = int(pending.began + PENDING_TTL - time.time())
    if left < 1:
        raise problem(404, f"write {pending.version!r} expired; begin again")
    return min(UPLOAD_EXPIRES, left)


async def progress(app: web.Application, caller: Caller, version: str) -> ProgressOut:
    """A pending write and the parts its bucket holds already: what a resume skips."""
    pending = await pending_of(app, caller, version)
    present: list[PresentPart] = []
    if pending.upload_id is not None:
        location = app[VIEW].locations.get(pending.location)
        if location is None:
            raise problem(409, f"location {pending.location!r} is gone; begin again")
        opened = await bucket_for(app, location)
        upload_id = pending.upload_id
        held = await opened.call(
            location.name, lambda: opened.bucket.list_parts(pending.key, upload_id)
        )
        present = [
            {"number": p.number, "size": p.size, "etag": p.etag, "crc32": p.crc32}
            for p in held
            if 1 <= p.number <= pending.parts
        ]
    return {
        "version": version,
        "organization": pending.organization,
        "artifact": pending.artifact,
        "location": pending.location,
        "rule": pending.rule,
        "size": pending.size,
        "multipart": pending.upload_id is not None,
        "partSize": pending.part_size,
        "parts": pending.parts,
        "crc32": pending.crc32,  # each part's, as its writer recorded them: a resume compares
        "present": present,
        "expiresIn": max(0, int(pending.began + PENDING_TTL - time.time())),
    }


async def resign(app: web.Application, caller: Caller, version: str, body: PartsIn) -> PartsOut:
    """Fresh upload requests for some parts of a pending multipart write."""
    pending = await pending_of(app, caller, version)
    if pending.upload_id is None:
        raise WriteRefused(
            f"write {version!r} is one PUT, not parts: begin again to upload it again"
        )
    numbers = body.parts
    if wrong := [n for n in numbers if not 1 <= n <= pending.parts]:
        raise WriteRefused(
            f"write {version!r} has parts 1..{pending.parts}; part {wrong[0]} is not one of them"
        )
    if len(set(numbers)) != len(numbers):
        raise WriteRefused("parts names a part twice: name each once")
    expires = resign_expires(pending)
    location = app[VIEW].locations.get(pending.location)
    if location is None:
        raise problem(409, f"location {pending.location!r} is gone; begin again")
    opened = await bucket_for(app, location)
    upload_id = pending.upload_id
    requests = await opened.sign(
        location.name,
        lambda: opened.bucket.presign_parts(
            pending.key, upload_id, numbers, expires=expires, crc32=pending.crc32
        ),
    )
    return {
        "version": version,
        "parts": [{"number": n, **signed(r)} for n, r in zip(numbers, requests, strict=True)],
        "expiresIn": expires,
    }
