"""Read a version: resolve the reference, say where it lives and how far that is from the
reader, sign its download, and count the read (``o41.core.advice`` relies on the count)."""

from __future__ import annotations

from aiohttp import web

from o41.core.places import Locality, Place, locality
from o41.kube.locations import Location
from o41.webhook.buckets import DOWNLOAD_EXPIRES, bucket_for, signed
from o41.webhook.cluster.scope import organization_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import problem
from o41.webhook.identity.auth import Caller
from o41.webhook.records import Version
from o41.webhook.usage.counters import USAGE, location_dims
from o41.webhook.versions.refs import resolve
from o41.webhook.writes.answers import DirectoryReadOut, Located, Parts, ReadOut


def parts_json(record: Version) -> Parts:
    """A multipart version's ``partSize`` and ``crc32`` (each part's, base64), when its
    writer sent them: the reader checks each part it downloads whole against them."""
    if not record.crc32 or not record.part_size:
        return {}
    return {"partSize": record.part_size, "crc32": record.crc32}


async def read(
    app: web.Application,
    caller: Caller,
    organization: str,
    artifact: str,
    ref: str,
    reader: Place,
    *,
    again: bool = False,
) -> ReadOut | DirectoryReadOut:
    """Where a version lives, how far that is from the reader, and a download. ``ref`` is
    a version id, ``latest`` or a tag, resolved here; the answer names the version.
    ``again``: a download signed again for a read begun (:func:`count_read`)."""
    org = organization_for(app, organization, caller)
    record, tag = await resolve(app, org.name, artifact, ref)
    version = record.version
    location = app[VIEW].locations.get(record.location)
    if location is None:
        raise problem(503, f"location {record.location!r} is not known to the service yet")
    how_far = locality(reader, location.cloud, location.region)
    if record.files is not None:  # a directory: its files are read one by one, or all
        return {
            **located(record, location, how_far, ref, tag),
            "download": None,
            "files": record.files,
        }
    opened = await bucket_for(app, location)
    download = await opened.sign(
        location.name, lambda: opened.bucket.presign_get(record.key, expires=DOWNLOAD_EXPIRES)
    )
    count_read(
        app, caller, org.name, reader, str(how_far), location, record, record.size, again=again
    )
    return {
        "version": version,
        "location": location.name,
        "cloud": location.cloud,
        "region": location.region,
        "locality": how_far,
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
    record: Version, location: Location, how_far: Locality, ref: str, tag: str | None
) -> Located:
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


#: How long a read's count covers the downloads signed again for it: the URL's own life,
#: and as long again for a read that went on slowly.
COUNT_COVERS = 2 * DOWNLOAD_EXPIRES


def count_read(
    app: web.Application,
    caller: Caller,
    organization: str,
    reader: Place,
    how_far: str,
    location: Location,
    record: Version,
    size: int,
    *,
    path: str = "",
    again: bool = False,
) -> None:
    """A read of ``size`` bytes of ``record`` (``path``: one file of a directory version)
    in the usage counters. ``again``: the client signs a download again for a read it
    began (an expired URL, the rest of a read that stopped): not counted when this replica
    counted that read, or its whole directory version, within :data:`COUNT_COVERS`."""
    usage = app[USAGE]
    key = (caller.tenant, organization, record.version, path)
    whole = (caller.tenant, organization, record.version, "")
    if again and usage.lately.seen((key, whole), COUNT_COVERS):
        return
    usage.lately.note(key)
    usage.add(
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
