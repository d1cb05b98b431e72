"""One write and one read, orchestrated: the state store, the location's bucket, signing
and the usage counters around the rules of ``o41.core`` (placement, the upload plan, the
commit's checks, locality).

The views (``o41.webhook.placement``) parse a request, call one function here and answer
with what it returns. A refusal is raised as the core's exception, a state store's failure
as ``StoreUnavailable`` and a bucket's as ``LocationFailed``: ``o41.webhook.errors`` maps
all of them to HTTP answers, in one place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple, TypeVar

from aiohttp import web
from pydantic import Field

from o41 import logs
from o41.api import NAME_PATTERN, LocationSpec
from o41.core.parts import MAX_PARTS
from o41.core.placement import Placement, place_write
from o41.core.places import Place, locality
from o41.core.versions import (
    MAX_METADATA_BYTES,
    MAX_METADATA_KEYS,
    check_metadata,
    check_tag,
    index_suffix,
)
from o41.core.writes import (
    Declared,
    Held,
    UploadPlan,
    WriteRefused,
    check_commit,
    etags_problem,
    normal_place,
    signs_locally,
    upload_plan,
)
from o41.locations import Location
from o41.state import Compare, Delete, KeyValue, LeaseNotFound, Put, Store, StoreUnavailable
from o41.storage import Bucket, BucketRef, SignedRequest, StorageError, open_bucket
from o41.webhook import telemetry
from o41.webhook.errors import LocationFailed, problem
from o41.webhook.keys import (
    BATCHER,
    BUCKETS,
    COUNTS,
    LEASES,
    RETENTION,
    SECRETS,
    STORE,
    USAGE,
    VIEW,
)
from o41.webhook.records import (
    ArtifactRecord,
    Pending,
    Tag,
    Version,
    artifact_key,
    index_prefix,
    new_version,
    pending_key,
    tag_key,
    version_key,
)
from o41.webhook.scope import ARTIFACT_PATTERN, Model, organization_for
from o41.webhook.versions import resolve

log = logging.getLogger(__name__)

MAX_SIZE = 5 * 1024**4  # 5 TiB, S3's object limit
UPLOAD_EXPIRES = 3600
DOWNLOAD_EXPIRES = 900
PENDING_TTL = UPLOAD_EXPIRES + 600  # a write never committed expires with its lease

T = TypeVar("T")


# --- the requests ------------------------------------------------------------------------


class PlaceIn(Model):
    cloud: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,31}$")
    region: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    source: Literal["env", "skypilot", "metadata", "none"]

    @property
    def place(self) -> Place:
        return normal_place(self.cloud, self.region, self.source)


class BeginIn(Model):
    organization: str = Field(pattern=NAME_PATTERN, max_length=253)
    artifact: str = Field(pattern=ARTIFACT_PATTERN)
    place: PlaceIn
    size: int | None = Field(default=None, ge=0, le=MAX_SIZE)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    exclude: list[str] = Field(default_factory=list, max_length=100)
    part_size: int | None = Field(default=None, alias="partSize", ge=1)
    crc32: list[str] | None = Field(default=None, max_length=MAX_PARTS)
    metadata: dict[str, Any] | None = Field(
        default=None,
        description=f"The user's JSON key/values (step, epoch, metrics): at most "
        f"{MAX_METADATA_KEYS} keys, {MAX_METADATA_BYTES} bytes as JSON",
    )
    tag: str | None = Field(
        default=None, max_length=200, description="A tag moved to this version at commit"
    )


class PartsIn(Model):
    parts: list[int] = Field(
        min_length=1,
        max_length=MAX_PARTS,
        description="The numbers (1-based) of the parts to sign again",
    )


class CommitIn(Model):
    etags: list[str] = Field(default_factory=list, max_length=MAX_PARTS)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    metadata: dict[str, Any] | None = Field(
        default=None, description="Merged over the metadata given at begin"
    )
    tag: str | None = Field(
        default=None, max_length=200, description="A tag moved to this version (over begin's)"
    )


# --- the service's state -----------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class OpenBucket:
    """A location's bucket, and whether it signs URLs without a network call."""

    bucket: Bucket
    signs_locally: bool

    async def sign(self, location: str, call: Callable[[], T]) -> T:
        """``call`` (a presign) inline when it is pure computation, in a thread when it
        may touch the network (GCS's ambient identity: one IAM call per URL)."""
        try:
            signed = call() if self.signs_locally else await asyncio.to_thread(call)
        except StorageError as e:
            telemetry.bucket_failed(location, "sign", e.reason)
            raise LocationFailed(location, e) from None
        telemetry.signed(location)
        return signed

    async def call(self, location: str, call: Callable[[], T]) -> T:
        """A request to the bucket, in a thread (the SDKs are synchronous)."""
        try:
            return await asyncio.to_thread(call)
        except StorageError as e:
            telemetry.bucket_failed(location, "call", e.reason)
            raise LocationFailed(location, e) from None


Opener = Callable[[BucketRef], Bucket]


class Buckets:
    """One open bucket per location, rebuilt when its spec or credentials change: the view
    replaces a Location's spec object on every change and the Secret cache its data object
    on every read, so identity tells, with no work on the hot path."""

    def __init__(self, opener: Opener = open_bucket) -> None:
        self._opener = opener
        self._open: dict[str, tuple[LocationSpec, Mapping[str, str] | None, OpenBucket]] = {}

    def of(self, location: Location, credentials: Mapping[str, str] | None) -> OpenBucket:
        hit = self._open.get(location.name)
        if hit is not None and hit[0] is location.spec and hit[1] is credentials:
            return hit[2]
        ref = location.bucket(credentials)
        opened = OpenBucket(self._opener(ref), signs_locally(ref.kind, credentials))
        self._open[location.name] = (location.spec, credentials, opened)
        return opened


async def bucket_for(app: web.Application, location: Location) -> OpenBucket:
    return app[BUCKETS].of(location, await app[SECRETS].credentials(location))


def location_dims(location: Location) -> dict[str, str | None]:
    """Where a usage counter's bytes are stored: its location and that location's place."""
    return {
        "location": location.name,
        "locationCloud": location.cloud,
        "locationRegion": location.region,
    }


def signed(req: SignedRequest) -> dict[str, Any]:
    return {"method": req.method, "url": req.url, "headers": dict(req.headers)}


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


# --- begin, commit, read -----------------------------------------------------------------


async def upload(
    opened: OpenBucket, location: str, key: str, plan: UploadPlan, body: BeginIn
) -> tuple[dict[str, Any], str | None]:
    """The signed upload requests of ``plan``, and the multipart upload's id."""
    bucket = opened.bucket
    if not plan.multipart:
        single = await opened.sign(
            location, lambda: bucket.presign_put(key, expires=UPLOAD_EXPIRES, size=body.size)
        )
        return {"single": signed(single)}, None
    started = await opened.call(
        location,
        lambda: bucket.start_multipart(
            key, parts=plan.parts, expires=UPLOAD_EXPIRES, crc32=body.crc32
        ),
    )
    parts = [signed(p) for p in started.parts]
    return {"multipart": {"partSize": plan.part_size, "parts": parts}}, started.upload_id


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a new version goes: the caller's organization, the writer's place, the rule
    that chose the location, and the location."""

    organization: str
    place: Place
    chosen: Placement
    location: Location

    def pending(self, namespace: str, artifact: str, version: str, **more: Any) -> Pending:
        """The pending write of ``version`` placed here (``more``: its upload's fields)."""
        return Pending(
            organization=self.organization,
            artifact=artifact,
            version=version,
            namespace=namespace,
            location=self.location.name,
            rule=str(self.chosen.rule),
            cloud=self.place.cloud,
            region=self.place.region,
            source=self.place.source,
            began=time.time(),
            **more,
        )

    def answer(self, version: str, **uploads: Any) -> dict[str, Any]:
        """What a begin answers: the version, where it goes and how, its uploads."""
        return {
            "version": version,
            "location": self.location.name,
            "cloud": self.location.cloud,
            "region": self.location.region,
            "rule": str(self.chosen.rule),
            "warning": self.chosen.warning,
            **uploads,
            "expiresIn": UPLOAD_EXPIRES,
        }


def place_new(
    app: web.Application, namespace: str, organization: str, place_in: PlaceIn, exclude: list[str]
) -> Placed:
    """The location of a new version, by the rules of ``o41.core.placement``."""
    org = organization_for(app, organization, namespace)
    view, place = app[VIEW], place_in.place
    chosen = place_write(
        place,
        [loc.facts for loc in view.locations_of(org.name)],
        fallback=org.fallback,
        cloud_defaults=org.cloud_defaults,
        exclude=exclude,
        organization=f"organization {org.name!r}",
    )
    location = view.locations[chosen.location]
    logs.known(organization=org.name, location=location.name)
    return Placed(org.name, place, chosen, location)


def count_begin(app: web.Application, placed: Placed) -> None:
    chosen = placed.chosen
    app[USAGE].add(
        placed.organization,
        "begin",
        {**placed.place.as_json(), "rule": str(chosen.rule), "location": placed.location.name},
        begins=1,
        warnings=1 if chosen.warning else 0,
    )


async def begin(app: web.Application, namespace: str, body: BeginIn) -> dict[str, Any]:
    """Choose the location for a new version and hand out pre-signed upload requests."""
    plan = upload_plan(body.size, body.part_size, body.crc32)
    metadata = check_metadata(body.metadata)
    tag = None if body.tag is None else check_tag(body.tag)
    placed = place_new(app, namespace, body.organization, body.place, body.exclude)
    location = placed.location
    version = new_version()
    key = f"{body.artifact}/{version}"
    opened = await bucket_for(app, location)
    requests, upload_id = await upload(opened, location.name, key, plan, body)
    pending = placed.pending(
        namespace,
        body.artifact,
        version,
        key=key,
        size=body.size,
        md5=body.md5,
        upload_id=upload_id,
        parts=plan.parts,
        crc32=body.crc32,
        metadata=metadata,
        tag=tag,
        part_size=plan.part_size,
    )
    await put_pending(app, version, pending.dump())
    count_begin(app, placed)
    return placed.answer(version, upload=requests)


async def pending_of(app: web.Application, namespace: str, version: str) -> Pending:
    """The caller's pending write ``version``: a write of another namespace is answered
    as one that does not exist, so its id tells nothing."""
    found = await app[STORE].get(pending_key(version))
    pending = None if found is None else Pending.load(found.value)
    if pending is None or pending.namespace != namespace:
        raise problem(
            404,
            f"no write {version!r} of this namespace is waiting for its commit: it expired, "
            "was committed already, or never began; begin again",
        )
    return pending


def resign_expires(pending: Pending) -> int:
    """Re-signed URLs last no longer than the pending write they upload to."""
    left = int(pending.began + PENDING_TTL - time.time())
    if left < 1:
        raise problem(404, f"write {pending.version!r} expired; begin again")
    return min(UPLOAD_EXPIRES, left)


async def progress(app: web.Application, namespace: str, version: str) -> dict[str, Any]:
    """A pending write and the parts its bucket holds already: what a resume skips."""
    pending = await pending_of(app, namespace, version)
    present: list[dict[str, Any]] = []
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
        "present": present,
        "expiresIn": max(0, int(pending.began + PENDING_TTL - time.time())),
    }


async def resign(
    app: web.Application, namespace: str, version: str, body: PartsIn
) -> dict[str, Any]:
    """Fresh upload requests for some parts of a pending multipart write."""
    pending = await pending_of(app, namespace, version)
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


async def commit(
    app: web.Application, namespace: str, version: str, body: CommitIn
) -> dict[str, Any]:
    """Make a version readable, once the bucket really holds what was declared."""
    store = app[STORE]
    c = await to_commit(app, namespace, version, body.metadata, body.tag, directory=False)
    found, pending, metadata, tag, location, opened = c
    bucket = opened.bucket
    if pending.upload_id is not None:
        if why := etags_problem(pending.parts, body.etags):
            raise WriteRefused(why)
        upload_id = pending.upload_id
        await opened.call(
            location.name,
            lambda: bucket.complete_multipart(pending.key, upload_id, body.etags, pending.crc32),
        )
    stat = await opened.call(location.name, lambda: bucket.stat(pending.key))
    held = check_commit(
        version,
        Declared(pending.size, body.md5 or pending.md5, pending.crc32),
        None if stat is None else Held(stat.size, stat.md5, stat.crc32),
    )
    record = version_of(pending, held.size, held.md5 or pending.md5, metadata)
    succeeded = await make_version(store, pending, found.mod_revision, record, tag, namespace)
    if succeeded:  # only the commit that made the version counts it (not replays)
        count_write(app, pending, location, held.size)
    return {
        "version": version,
        "location": location.name,
        "size": held.size,
        "md5": record.md5,
        "tag": tag,
    }


class Committing(NamedTuple):
    """What a commit works from: the pending write (and its key, whose revision guards
    the commit), the metadata and tag it commits with, and its location's bucket."""

    found: KeyValue
    pending: Pending
    metadata: dict[str, Any] | None
    tag: str | None
    location: Location
    opened: OpenBucket


async def to_commit(
    app: web.Application,
    namespace: str,
    version: str,
    metadata: dict[str, Any] | None,
    tag: str | None,
    *,
    directory: bool,
) -> Committing:
    """The pending write a commit of ``version`` makes a version of (404: none; 403:
    another namespace's; 409: a directory's at the file's commit, or the reverse), the
    commit's ``metadata`` merged over begin's and its ``tag`` over begin's, checked."""
    found = await app[STORE].get(pending_key(version))
    if found is None:
        raise problem(
            404,
            f"no write {version!r} is waiting for its commit: it expired, was committed "
            "already, or never began; begin again",
        )
    pending = Pending.load(found.value)
    if pending.namespace != namespace:
        raise problem(403, f"write {version!r} began in another namespace")
    logs.known(organization=pending.organization, location=pending.location)
    if directory and pending.manifest is None:
        raise problem(
            409, f"write {version!r} is one file: commit it at /v1/writes/{version}/commit"
        )
    if not directory and pending.manifest is not None:
        raise problem(
            409, f"write {version!r} is a directory: commit it at /v1/directories/{version}/commit"
        )
    merged = pending.metadata
    if metadata is not None:
        merged = check_metadata({**(merged or {}), **metadata})
    tag = pending.tag if tag is None else check_tag(tag)
    location = app[VIEW].locations.get(pending.location)
    if location is None:
        raise problem(409, f"location {pending.location!r} is gone; begin again")
    return Committing(found, pending, merged, tag, location, await bucket_for(app, location))


def version_of(
    pending: Pending,
    size: int,
    md5: str | None,
    metadata: dict[str, Any] | None,
    files: int | None = None,
) -> Version:
    """The record of the version ``pending`` becomes, committed now."""
    return Version(
        organization=pending.organization,
        artifact=pending.artifact,
        version=pending.version,
        location=pending.location,
        key=pending.key,
        size=size,
        md5=md5,
        rule=pending.rule,
        cloud=pending.cloud,
        region=pending.region,
        source=pending.source,
        committed=time.time(),
        metadata=metadata,
        files=files,
        # a reader checks each range of whole parts against these
        part_size=pending.part_size if pending.crc32 else None,
        crc32=pending.crc32,
    )


def count_write(app: web.Application, pending: Pending, location: Location, size: int) -> None:
    """A committed version in the counters: the location's, and the usage page's."""
    app[COUNTS].committed(location.name)
    app[RETENTION].committed(pending.organization, pending.artifact)
    app[USAGE].add(
        pending.organization,
        "write",
        {
            "cloud": pending.cloud,
            "region": pending.region,
            "source": pending.source,
            "rule": pending.rule,
            **location_dims(location),
        },
        versions=1,
        bytes=size,
    )


COMMIT_ATTEMPTS = 20


async def make_version(
    store: Store,
    pending: Pending,
    pending_mod: int,
    record: Version,
    tag: str | None,
    namespace: str,
    extra: Sequence[Put] = (),
) -> bool:
    """One transaction turns the pending write into the version: its record, its index
    key (the artifact's next commit sequence number, newest first), the artifact's record
    (its count and latest) and the tag given at write time. The artifact's record is
    guarded by its revision, so commits of one artifact take sequence numbers one at a
    time; one that loses to another commit of the artifact takes the next number. False
    when another commit of this very write made the version first (a replay). ``extra``:
    more keys the version comes with (a directory's manifest)."""
    org, artifact, version = pending.organization, pending.artifact, pending.version
    akey, vkey = artifact_key(org, artifact), version_key(org, artifact, version)
    for _ in range(COMMIT_ATTEMPTS):
        current = await store.get(akey)
        if current is None:
            guard = Compare(akey, "version", "==", 0)
            seq = 1
        else:
            guard = Compare(akey, "mod", "==", current.mod_revision)
            seq = ArtifactRecord.load(current.value).count + 1
        numbered = replace(record, seq=seq)
        listed = replace(numbered, part_size=None, crc32=None).dump()  # a page stays small
        made: list[Delete | Put] = [
            Delete(pending_key(version)),
            Put(vkey, numbered.dump()),
            Put(index_prefix(org, artifact) + index_suffix(seq, version).encode(), listed),
            Put(akey, ArtifactRecord(artifact, version, record.committed, seq).dump()),
            *extra,
        ]
        if tag is not None:
            moved = Tag(version, record.committed, namespace)
            made.append(Put(tag_key(org, artifact, tag), moved.dump()))
        pending_guard = Compare(pending_key(version), "mod", "==", pending_mod)
        result = await store.txn([pending_guard, guard], made)
        if result.succeeded:
            return True
        if await store.get(vkey) is not None:
            return False  # made by a replay of this commit
        still = await store.get(pending_key(version))
        if still is None or still.mod_revision != pending_mod:
            raise problem(409, f"write {version!r} changed while committing; commit again")
        # another version of the artifact took the sequence number: the next one
    raise StoreUnavailable(
        f"artifact {artifact!r} had {COMMIT_ATTEMPTS} commits in a row ahead of this one"
    )


def parts_json(record: Version) -> dict[str, Any]:
    """A multipart version's ``partSize`` and ``crc32`` (each part's, base64), when its
    writer sent them: the reader checks each part it downloads whole against them."""
    if not record.crc32 or not record.part_size:
        return {}
    return {"partSize": record.part_size, "crc32": record.crc32}


async def read(
    app: web.Application,
    namespace: str,
    organization: str,
    artifact: str,
    ref: str,
    reader: Place,
) -> dict[str, Any]:
    """Where a version lives, how far that is from the reader, and a download. ``ref`` is
    a version id, ``latest`` or a tag, resolved here; the answer names the version."""
    org = organization_for(app, organization, namespace)
    record, tag = await resolve(app, org.name, artifact, ref)
    version = record.version
    location = app[VIEW].locations.get(record.location)
    if location is None:
        raise problem(503, f"location {record.location!r} is not known to the service yet")
    how_far = locality(reader, location.cloud, location.region)
    if record.files is not None:  # a directory: its files are read one by one, or all
        return {
            **located(record, location, str(how_far), ref, tag),
            "download": None,
            "files": record.files,
        }
    opened = await bucket_for(app, location)
    download = await opened.sign(
        location.name, lambda: opened.bucket.presign_get(record.key, expires=DOWNLOAD_EXPIRES)
    )
    count_read(app, org.name, reader, str(how_far), location, record, record.size)
    return {
        "version": version,
        "location": location.name,
        "cloud": location.cloud,
        "region": location.region,
        "locality": str(how_far),
        "size": record.size,
        "md5": record.md5,
        **parts_json(record),
        "download": signed(download),
        "requested": ref,
        "tag": tag,
        "committed": record.committed,
        "metadata": record.metadata or {},
    }


def located(
    record: Version, location: Location, how_far: str, ref: str, tag: str | None
) -> dict[str, Any]:
    """What every read answer says of the version it read and where it lives."""
    return {
        "version": record.version,
        "location": location.name,
        "cloud": location.cloud,
        "region": location.region,
        "locality": how_far,
        "size": record.size,
        "md5": record.md5,
        "requested": ref,
        "tag": tag,
        "committed": record.committed,
        "metadata": record.metadata or {},
    }


def count_read(
    app: web.Application,
    organization: str,
    reader: Place,
    how_far: str,
    location: Location,
    record: Version,
    size: int,
) -> None:
    """A read of ``size`` bytes of ``record`` in the usage counters."""
    app[USAGE].add(
        organization,
        "read",
        {
            **reader.as_json(),
            "locality": how_far,
            **location_dims(location),
            **{"writerCloud": record.cloud, "writerRegion": record.region},
        },
        reads=1,
        bytes=size,
    )
