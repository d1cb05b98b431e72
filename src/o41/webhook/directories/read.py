"""Read a directory version: its files (path, size, MD5) with a download of each, or one
file; the manifest is read from its bucket (from the store for a version committed before
issue 32), the downloads signed at once."""

from __future__ import annotations

from aiohttp import web

from o41.core.directories import FileEntry, check_path, find, object_key
from o41.core.places import Place, locality
from o41.kube.locations import Location
from o41.webhook.buckets import DOWNLOAD_EXPIRES, Signed, bucket_for, signed
from o41.webhook.cluster.scope import organization_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.directories.answers import FileOut, FileReadOut, FilesOut
from o41.webhook.http.errors import problem
from o41.webhook.identity.auth import Caller
from o41.webhook.ledger import manifest
from o41.webhook.records import Version
from o41.webhook.versions.refs import resolve
from o41.webhook.writes.read import count_read, located


async def _directory(
    app: web.Application, caller: Caller, organization: str, artifact: str, ref: str
) -> tuple[str, Version, str | None, list[FileEntry], Location]:
    org = organization_for(app, organization, caller)
    record, tag = await resolve(app, org.name, artifact, ref)
    if record.files is None:
        raise problem(
            409,
            f"version {record.version} of {artifact!r} is one file, not a directory: read it "
            f"with GET /v1/organizations/{org.name}/artifacts/{artifact}/versions/"
            f"{record.version}",
        )
    location = app[VIEW].locations.get(record.location)
    if location is None:
        raise problem(503, f"location {record.location!r} is not known to the service yet")
    return org.name, record, tag, await manifest(app, record, location), location


async def files(
    app: web.Application,
    caller: Caller,
    organization: str,
    artifact: str,
    ref: str,
    reader: Place,
    *,
    download: bool,
) -> FilesOut:
    """A directory version's files (path, size, MD5), sorted by path; with ``download``,
    a signed download of each (a read of the whole directory, counted as one)."""
    org, record, tag, entries, location = await _directory(app, caller, organization, artifact, ref)
    how_far = locality(reader, location.cloud, location.region)
    listed: list[FileOut] = [{"path": e.path, "size": e.size, "md5": e.md5} for e in entries]
    if download:
        opened = await bucket_for(app, location)
        bucket = opened.bucket

        def sign_all() -> list[Signed]:
            return [
                signed(bucket.presign_get(object_key(record.key, e.path), expires=DOWNLOAD_EXPIRES))
                for e in entries
            ]

        for row, req in zip(listed, await opened.sign(location.name, sign_all), strict=True):
            row["download"] = req
        count_read(app, caller, org, reader, str(how_far), location, record, record.size)
    return {**located(record, location, how_far, ref, tag), "files": listed}


async def read_file(
    app: web.Application,
    caller: Caller,
    organization: str,
    artifact: str,
    ref: str,
    path: str,
    reader: Place,
    *,
    again: bool = False,
) -> FileReadOut:
    """One file of a directory version: where it lives, its size and MD5, a download
    (``again``: signed again for a read begun, ``o41.webhook.writes.read.count_read``)."""
    check_path(path)
    org, record, tag, entries, location = await _directory(app, caller, organization, artifact, ref)
    entry = find(entries, path)
    if entry is None:
        raise problem(
            404,
            f"version {record.version} of {artifact!r} has no file {path[:200]!r}: `o41 files "
            f"--org {org} --artifact {artifact} --version {record.version}` lists them",
        )
    how_far = locality(reader, location.cloud, location.region)
    opened = await bucket_for(app, location)
    download = await opened.sign(
        location.name,
        lambda: opened.bucket.presign_get(
            object_key(record.key, entry.path), expires=DOWNLOAD_EXPIRES
        ),
    )
    count_read(
        app,
        caller,
        org,
        reader,
        str(how_far),
        location,
        record,
        entry.size,
        path=entry.path,
        again=again,
    )
    return {
        **located(record, location, how_far, ref, tag),
        "path": entry.path,
        "size": entry.size,
        "md5": entry.md5,
        "download": signed(download),
    }
