"""The locations' buckets as the service uses them: opened once per location, called in
threads, signing inline when it needs no network; a bucket's failure is raised as
``LocationFailed``, which ``o41.webhook.http.errors`` answers. Writes, reads, retention
and the sweeper all reach buckets through here; a signed request is answered as
:class:`Signed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from typing_extensions import TypedDict

from o41.core.directories import object_key
from o41.core.writes import signs_locally
from o41.kube.api import LocationSpec
from o41.kube.locations import Location
from o41.storage import Bucket, BucketRef, SignedRequest, StorageError, open_bucket
from o41.webhook import telemetry
from o41.webhook.cluster.view import SECRETS
from o41.webhook.http.errors import LocationFailed

UPLOAD_EXPIRES = 3600
DOWNLOAD_EXPIRES = 900
#: Requests in flight at once on one directory version's objects (HEADs, deletes).
PARALLEL_CHECKS = 16

T = TypeVar("T")


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


BUCKETS: web.AppKey[Buckets] = web.AppKey("buckets")


async def bucket_for(app: web.Application, location: Location) -> OpenBucket:
    return app[BUCKETS].of(location, await app[SECRETS].credentials(location))


class Signed(TypedDict):
    """A pre-signed request: send it as it is, with these headers."""

    method: str
    url: str
    headers: dict[str, str]


def signed(req: SignedRequest) -> Signed:
    return {"method": req.method, "url": req.url, "headers": dict(req.headers)}


async def delete_files(
    opened: OpenBucket, location: str, prefix: str, paths: list[str] | None = None
) -> tuple[int, int]:
    """Delete the objects of a directory version under ``prefix`` that the bucket holds:
    those of ``paths`` (its manifest), or every one under the prefix (None). One listing
    (S3, GCS and Azure list with strong consistency), then the deletes, ``PARALLEL_CHECKS``
    at a time; each is idempotent, so a repeat after a stop finishes the rest. (objects,
    bytes) deleted; :class:`LocationFailed` if the listing or any delete failed."""
    bucket = opened.bucket
    listed = await opened.call(location, lambda: bucket.list_under(prefix + "/"))
    if paths is not None:
        wanted = {object_key(prefix, p) for p in paths}
        listed = {k: v for k, v in listed.items() if k in wanted}
    gate = asyncio.Semaphore(PARALLEL_CHECKS)

    async def one(key: str) -> None:
        async with gate:
            await opened.call(location, lambda: bucket.delete(key))

    done = await asyncio.gather(*(one(k) for k in sorted(listed)), return_exceptions=True)
    for failed in done:
        if isinstance(failed, BaseException):
            raise failed
    return len(listed), sum(s.size for s in listed.values())
