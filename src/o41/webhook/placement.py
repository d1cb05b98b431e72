"""Begin a write, commit it, read a version: thin views over the core and the storage.

Placement itself is ``o41.core.placement``; this module validates input, reads the
in-memory view of the cluster, signs URLs for the chosen bucket and keeps the records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from o41.api import NAME_PATTERN, LocationSpec
from o41.core.parts import (
    MAX_PARTS,
    PART_SIZE,
    composite_crc32,
    composite_matches,
    crc32_bytes,
    part_count,
    part_size_for,
    part_size_problem,
)
from o41.core.placement import PlacementRefused, place_write
from o41.core.places import Place, locality
from o41.jsonlimits import TooDeep, check_depth
from o41.locations import Location
from o41.state import Compare, Delete, LeaseNotFound, Put, Store, StoreUnavailable
from o41.storage import Bucket, SignedRequest, StorageError, open_bucket
from o41.webhook.auth import caller
from o41.webhook.batching import PutBatcher
from o41.webhook.counts import VersionCounts
from o41.webhook.errors import problem
from o41.webhook.keys import STORE
from o41.webhook.records import Pending, Version, new_version, pending_key, version_key
from o41.webhook.usage import Usage
from o41.webhook.view import OrganizationView, Secrets, View

log = logging.getLogger(__name__)

ARTIFACT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
MAX_SIZE = 5 * 1024**4  # 5 TiB, S3's object limit
UPLOAD_EXPIRES = 3600
DOWNLOAD_EXPIRES = 900
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


VIEW: web.AppKey[View] = web.AppKey("view", View)
SECRETS: web.AppKey[Secrets] = web.AppKey("secrets", Secrets)
USAGE: web.AppKey[Usage] = web.AppKey("usage", Usage)
BUCKETS: web.AppKey[dict[str, tuple[LocationSpec, Mapping[str, str] | None, Bucket]]] = web.AppKey(
    "buckets", dict
)
LEASES: web.AppKey[PendingLease] = web.AppKey("leases", PendingLease)
BATCHER: web.AppKey[PutBatcher] = web.AppKey("batcher", PutBatcher)
COUNTS: web.AppKey[VersionCounts] = web.AppKey("counts", VersionCounts)

routes = web.RouteTableDef()


class Model(BaseModel):
    """Strict: JSON types as declared (``size: "5"`` or ``size: true`` is refused, not
    converted), so a client's mistake is named instead of guessed at."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PlaceIn(Model):
    cloud: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,31}$")
    region: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    source: Literal["env", "skypilot", "metadata", "none"]


class BeginIn(Model):
    organization: str = Field(pattern=NAME_PATTERN, max_length=253)
    artifact: str = Field(pattern=ARTIFACT_PATTERN)
    place: PlaceIn
    size: int | None = Field(default=None, ge=0, le=MAX_SIZE)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    exclude: list[str] = Field(default_factory=list, max_length=100)
    part_size: int | None = Field(default=None, alias="partSize", ge=1)
    crc32: list[str] | None = Field(default=None, max_length=MAX_PARTS)


class CommitIn(Model):
    etags: list[str] = Field(default_factory=list, max_length=MAX_PARTS)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")


async def parse(request: web.Request, model: type[Model]) -> Any:
    """The body as ``model``, or a 400 that names every wrong field."""
    if request.content_type != "application/json":
        raise problem(415, "send a JSON body with Content-Type: application/json")
    try:
        raw = await request.read()
        check_depth(raw, what="the body")
        return model.model_validate_json(raw)
    except TooDeep as e:
        raise problem(400, f"invalid request: {e}") from None
    except ValidationError as e:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
            for err in e.errors(include_url=False)
        )
        raise problem(400, f"invalid request: {fields}") from None


def signed(req: SignedRequest) -> dict[str, Any]:
    return {"method": req.method, "url": req.url, "headers": dict(req.headers)}


def organization_for(request: web.Request, name: str) -> OrganizationView:
    """The organization, if the caller's namespace may use it."""
    org = request.app[VIEW].organizations.get(name)
    if org is None:
        raise problem(
            404, f"organization {name!r} does not exist: `kubectl get organizations` lists them"
        )
    namespace = caller(request).namespace
    if namespace not in org.namespaces:
        raise problem(
            403,
            f"namespace {namespace!r} may not use organization {name!r}: an administrator "
            f"adds it to spec.namespaces of Organization {name!r}",
        )
    return org


async def bucket_for(request: web.Request, location: Location) -> Bucket:
    """One Bucket per location, rebuilt when its spec or credentials change: the view
    replaces a Location's spec object on every change and the Secret cache its data
    object on every read, so identity tells, with no work on the hot path."""
    credentials = await request.app[SECRETS].credentials(location)
    cache = request.app[BUCKETS]
    hit = cache.get(location.name)
    if hit is not None and hit[0] is location.spec and hit[1] is credentials:
        return hit[2]
    bucket = open_bucket(location.bucket(credentials))
    cache[location.name] = (location.spec, credentials, bucket)
    return bucket


async def put_pending(request: web.Request, version: str, record: bytes) -> None:
    """Store a pending record under this minute's lease. A lease lost under the service
    (revoked or expired in etcd) is replaced once: begins never fail for it."""
    store, leases, batcher = request.app[STORE], request.app[LEASES], request.app[BATCHER]
    lease = await leases.current(store)
    try:
        await batcher.put(pending_key(version), record, lease=lease)
    except LeaseNotFound:
        log.warning("the lease of pending writes %x was gone from etcd; granting another", lease)
    else:
        return
    try:
        await batcher.put(pending_key(version), record, lease=await leases.renew(store, lease))
    except LeaseNotFound:
        raise problem(
            503, "the state store lost the lease of pending writes twice in a row; retry"
        ) from None


def storage_failed(location: str, e: StorageError) -> web.HTTPException:
    return problem(
        503,
        f"location {location!r} cannot take this request now ({e.reason}): {e}; "
        "begin again with it excluded",
        location=location,
        reason=str(e.reason),
    )


def upload_plan(body: BeginIn) -> tuple[int, int] | None:
    """(part size, parts) of a multipart write, None for a single PUT. The client may
    choose the part size (it must, to send each part's CRC32); the limits are S3's."""
    size, part_size, crc32 = body.size, body.part_size, body.crc32
    if part_size is None:
        if crc32 is not None:
            raise problem(400, "crc32 needs partSize: the CRC32 of each part of partSize bytes")
        if size is None or size <= PART_SIZE:
            return None
        part_size = part_size_for(size)
    else:
        if size is None:
            raise problem(400, "partSize needs size: declare the file's size in bytes")
        if why := part_size_problem(size, part_size):
            raise problem(400, why)
    parts = part_count(size, part_size)
    if crc32 is not None:
        if len(crc32) != parts:
            raise problem(
                400,
                f"crc32 has {len(crc32)} checksums, but {size} bytes in parts of {part_size} "
                f"are {parts} parts: send one per part, in order",
            )
        for n, checksum in enumerate(crc32, start=1):
            if crc32_bytes(checksum) is None:
                raise problem(
                    400,
                    f"crc32 of part {n} is {checksum[:20]!r}, not a CRC32: four big-endian "
                    "bytes in base64, like 'AAAAAA=='",
                )
    return part_size, parts


@routes.post("/v1/writes")
async def begin(request: web.Request) -> web.Response:
    """Choose the location for a new version and hand out pre-signed upload requests."""
    body: BeginIn = await parse(request, BeginIn)
    plan = upload_plan(body)
    org = organization_for(request, body.organization)
    view = request.app[VIEW]
    place = Place(
        body.place.cloud, body.place.region if body.place.cloud else None, body.place.source
    )
    locations = view.locations_of(org.name)
    try:
        chosen = place_write(
            place,
            [loc.facts for loc in locations],
            fallback=org.fallback,
            cloud_defaults=org.cloud_defaults,
            exclude=body.exclude,
            organization=f"organization {org.name!r}",
        )
    except PlacementRefused as e:
        raise problem(409, str(e)) from None
    location = view.locations[chosen.location]
    version = new_version()
    key = f"{body.artifact}/{version}"
    bucket = await bucket_for(request, location)
    try:
        if plan is not None:
            part_size, parts = plan
            started = await asyncio.to_thread(
                bucket.start_multipart,
                key,
                parts=parts,
                expires=UPLOAD_EXPIRES,
                crc32=body.crc32,
            )
            upload: dict[str, Any] = {
                "multipart": {
                    "partSize": part_size,
                    "parts": [signed(p) for p in started.parts],
                }
            }
            upload_id: str | None = started.upload_id
        else:
            parts = 1
            upload = {
                "single": signed(bucket.presign_put(key, expires=UPLOAD_EXPIRES, size=body.size))
            }
            upload_id = None
    except StorageError as e:
        raise storage_failed(location.name, e) from None
    pending = Pending(
        organization=org.name,
        artifact=body.artifact,
        version=version,
        namespace=caller(request).namespace,
        location=location.name,
        key=key,
        rule=str(chosen.rule),
        cloud=place.cloud,
        region=place.region,
        source=place.source,
        size=body.size,
        md5=body.md5,
        upload_id=upload_id,
        parts=parts,
        began=time.time(),
        crc32=body.crc32,
    )
    try:
        await put_pending(request, version, pending.dump())
    except StoreUnavailable as e:
        raise problem(503, f"the state store is unavailable ({e}); retry shortly") from None
    request.app[USAGE].add(
        org.name,
        "begin",
        {
            "cloud": place.cloud,
            "region": place.region,
            "source": place.source,
            "rule": str(chosen.rule),
            "location": location.name,
        },
        begins=1,
        warnings=1 if chosen.warning else 0,
    )
    return web.json_response(
        {
            "version": version,
            "location": location.name,
            "cloud": location.cloud,
            "region": location.region,
            "rule": str(chosen.rule),
            "warning": chosen.warning,
            "upload": upload,
            "expiresIn": UPLOAD_EXPIRES,
        },
        status=201,
    )


@routes.post("/v1/writes/{version}/commit")
async def commit(request: web.Request) -> web.Response:
    """Make a version readable, once the bucket really holds what was declared."""
    body: CommitIn = await parse(request, CommitIn)
    version = request.match_info["version"]
    store = request.app[STORE]
    try:
        found = await store.get(pending_key(version))
    except StoreUnavailable as e:
        raise problem(503, f"the state store is unavailable ({e}); retry shortly") from None
    if found is None:
        raise problem(
            404,
            f"no write {version!r} is waiting for its commit: it expired, was committed "
            "already, or never began; begin again",
        )
    pending = Pending.load(found.value)
    if pending.namespace != caller(request).namespace:
        raise problem(403, f"write {version!r} began in another namespace")
    location = request.app[VIEW].locations.get(pending.location)
    if location is None:
        raise problem(409, f"location {pending.location!r} is gone; begin again")
    bucket = await bucket_for(request, location)
    try:
        if pending.upload_id is not None:
            if len(body.etags) != pending.parts:
                raise problem(
                    400,
                    f"this multipart write has {pending.parts} parts: send the ETag header "
                    f"of each part's PUT answer, in order, as etags ({len(body.etags)} given)",
                )
            await asyncio.to_thread(
                bucket.complete_multipart,
                pending.key,
                pending.upload_id,
                body.etags,
                pending.crc32,
            )
        stat = await asyncio.to_thread(bucket.stat, pending.key)
    except StorageError as e:
        if e.reason == "UploadIncomplete":
            raise problem(
                409, f"the upload is incomplete: {e}; upload every part, then commit"
            ) from None
        raise storage_failed(location.name, e) from None
    if stat is None:
        raise problem(
            409,
            f"the object for {version!r} is not in the bucket: upload it with the request "
            "from begin, then commit",
        )
    if pending.size is not None and stat.size != pending.size:
        raise problem(
            409,
            f"the bucket holds {stat.size} bytes for {version!r}, but begin declared "
            f"{pending.size}: upload the whole file again, then commit",
        )
    if pending.crc32 and stat.crc32 and not composite_matches(stat.crc32, pending.crc32):
        raise problem(
            409,
            f"the bucket's copy of {version!r} has CRC32 {stat.crc32}, not "
            f"{composite_crc32(pending.crc32)} from the parts' checksums: a part was damaged "
            "on the way; upload it again, then commit",
        )
    declared = body.md5 or pending.md5
    if declared and stat.md5 and stat.md5 != declared:
        raise problem(
            409,
            f"the bucket's copy of {version!r} has MD5 {stat.md5}, not the uploaded "
            f"{declared}: it was damaged on the way; upload it again, then commit",
        )
    record = Version(
        organization=pending.organization,
        artifact=pending.artifact,
        version=version,
        location=pending.location,
        key=pending.key,
        size=stat.size,
        md5=stat.md5 or pending.md5,
        rule=pending.rule,
        cloud=pending.cloud,
        region=pending.region,
        source=pending.source,
        committed=time.time(),
    )
    vkey = version_key(pending.organization, pending.artifact, version)
    try:
        result = await store.txn(
            [Compare(pending_key(version), "mod", "==", found.mod_revision)],
            [Delete(pending_key(version)), Put(vkey, record.dump())],
        )
        if not result.succeeded and await store.get(vkey) is None:
            raise problem(409, f"write {version!r} changed while committing; commit again")
    except StoreUnavailable as e:
        raise problem(503, f"the state store is unavailable ({e}); retry shortly") from None
    if result.succeeded:  # only the commit that made the version counts it (not replays)
        request.app[COUNTS].committed(location.name)
        request.app[USAGE].add(
            pending.organization,
            "write",
            {
                "cloud": pending.cloud,
                "region": pending.region,
                "source": pending.source,
                "rule": pending.rule,
                "location": location.name,
                "locationCloud": location.cloud,
                "locationRegion": location.region,
            },
            versions=1,
            bytes=stat.size,
        )
    return web.json_response(
        {"version": version, "location": location.name, "size": stat.size, "md5": record.md5}
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}")
async def read(request: web.Request) -> web.Response:
    """Where a version lives, how far that is from the reader, and a download."""
    org = organization_for(request, request.match_info["organization"])
    q = request.query
    try:
        reader = PlaceIn.model_validate(
            {
                "cloud": q.get("cloud") or None,
                "region": q.get("region") or None,
                "source": q.get("source", "none"),
            }
        )
    except ValidationError as e:
        raise problem(
            400, f"invalid place in the query: {e.errors(include_url=False)[0]['msg']}"
        ) from None
    artifact, version = request.match_info["artifact"], request.match_info["version"]
    try:
        found = await request.app[STORE].get(version_key(org.name, artifact, version))
    except StoreUnavailable as e:
        raise problem(503, f"the state store is unavailable ({e}); retry shortly") from None
    if found is None:
        raise problem(
            404, f"organization {org.name!r} has no committed version {version!r} of {artifact!r}"
        )
    record = Version.load(found.value)
    location = request.app[VIEW].locations.get(record.location)
    if location is None:
        raise problem(503, f"location {record.location!r} is not known to the service yet")
    bucket = await bucket_for(request, location)
    try:
        download = bucket.presign_get(record.key, expires=DOWNLOAD_EXPIRES)
    except StorageError as e:
        raise storage_failed(location.name, e) from None
    place = Place(reader.cloud, reader.region if reader.cloud else None, reader.source)
    how_far = locality(place, location.cloud, location.region)
    request.app[USAGE].add(
        org.name,
        "read",
        {
            "cloud": place.cloud,
            "region": place.region,
            "source": place.source,
            "locality": str(how_far),
            "location": location.name,
            "locationCloud": location.cloud,
            "locationRegion": location.region,
        },
        reads=1,
        bytes=record.size,
    )
    return web.json_response(
        {
            "version": version,
            "location": location.name,
            "cloud": location.cloud,
            "region": location.region,
            "locality": str(how_far),
            "size": record.size,
            "md5": record.md5,
            "download": signed(download),
        }
    )


@routes.get("/v1/usage")
async def usage(request: web.Request) -> web.Response:
    """Both usage answers and the raw counters of one organization (``usage_page``)."""
    from o41.webhook import usage_page  # it imports this module

    return await usage_page.usage_json(request)
