"""Directory versions, orchestrated: one begin places the whole directory in one location
and signs one upload per file (each an object under the version's prefix); one commit
checks every file in the bucket and makes the version and its manifest in the commit's one
transaction, so a reader finds no version or the whole directory; reads list the files
and sign their downloads, all at once or one file.

The rules (paths, bounds, the manifest) are ``o41.core.directories``; placement, the
pending write, the commit's transaction and scoping are those of ``o41.webhook.writes``
and ``o41.webhook.versions``, unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from pydantic import Field

from o41.api import NAME_PATTERN
from o41.core.directories import (
    MAX_FILE_SIZE,
    MAX_FILES,
    DirectoryRefused,
    FileEntry,
    check_manifest,
    check_path,
    dump_manifest,
    find,
    from_rows,
    load_manifest,
    manifest_rows,
    object_key,
    total_size,
)
from o41.core.places import Place, locality
from o41.core.versions import MAX_METADATA_BYTES, MAX_METADATA_KEYS, check_metadata, check_tag
from o41.core.writes import CommitRefused, Declared, Held, check_commit
from o41.locations import Location
from o41.state import Put
from o41.storage import ObjectStat
from o41.webhook.errors import problem
from o41.webhook.keys import STORE, VIEW
from o41.webhook.records import Version, manifest_key, new_version
from o41.webhook.scope import ARTIFACT_PATTERN, Model, organization_for
from o41.webhook.versions import resolve
from o41.webhook.writes import (
    DOWNLOAD_EXPIRES,
    UPLOAD_EXPIRES,
    OpenBucket,
    PlaceIn,
    bucket_for,
    count_begin,
    count_read,
    count_write,
    located,
    make_version,
    place_new,
    put_pending,
    signed,
    to_commit,
    version_of,
)

#: HEADs in flight at once when a commit checks files its listing disagrees on.
PARALLEL_CHECKS = 16


class FileIn(Model):
    path: str = Field(min_length=1, max_length=2048, description="Relative, '/' between names")
    size: int = Field(ge=0, le=MAX_FILE_SIZE)
    md5: str = Field(pattern=r"^[0-9a-f]{32}$", description="The file's MD5, hex")


class DirectoryBeginIn(Model):
    organization: str = Field(pattern=NAME_PATTERN, max_length=253)
    artifact: str = Field(pattern=ARTIFACT_PATTERN)
    place: PlaceIn
    files: list[FileIn] = Field(
        max_length=MAX_FILES,
        description=f"Every file of the directory (1 to {MAX_FILES}), each once",
    )
    exclude: list[str] = Field(default_factory=list, max_length=100)
    metadata: dict[str, Any] | None = Field(
        default=None,
        description=f"The user's JSON key/values: at most {MAX_METADATA_KEYS} keys, "
        f"{MAX_METADATA_BYTES} bytes as JSON",
    )
    tag: str | None = Field(default=None, max_length=200, description="Moved here at commit")


class DirectoryCommitIn(Model):
    metadata: dict[str, Any] | None = Field(
        default=None, description="Merged over the metadata given at begin"
    )
    tag: str | None = Field(default=None, max_length=200, description="Over begin's tag")


async def begin(app: web.Application, namespace: str, body: DirectoryBeginIn) -> dict[str, Any]:
    """Choose the one location of a directory version and sign one upload per file."""
    entries = check_manifest(FileEntry(f.path, f.size, f.md5) for f in body.files)
    metadata = check_metadata(body.metadata)
    tag = None if body.tag is None else check_tag(body.tag)
    placed = place_new(app, namespace, body.organization, body.place, body.exclude)
    location = placed.location
    version = new_version()
    prefix = f"{body.artifact}/{version}"
    opened = await bucket_for(app, location)
    bucket = opened.bucket

    def sign_all() -> list[dict[str, Any]]:
        return [
            {
                "path": e.path,
                **signed(
                    bucket.presign_put(
                        object_key(prefix, e.path), expires=UPLOAD_EXPIRES, size=e.size
                    )
                ),
            }
            for e in entries
        ]

    uploads = await opened.sign(location.name, sign_all)
    pending = placed.pending(
        namespace,
        body.artifact,
        version,
        key=prefix,
        size=total_size(entries),
        md5=None,
        upload_id=None,
        parts=len(entries),
        metadata=metadata,
        tag=tag,
        manifest=manifest_rows(entries),
    )
    await put_pending(app, version, pending.dump(), alone=True)
    count_begin(app, placed)
    return placed.answer(version, files=uploads)


async def _held(
    opened: OpenBucket, location: str, prefix: str, entries: list[FileEntry]
) -> list[ObjectStat | None]:
    """What the bucket holds for each file: one listing of the version's prefix (a
    request per 1,000 keys), then a HEAD of each file the listing shows with another size
    or MD5, since a listing's ETag may not be an MD5 (S3 with SSE-KMS) where a HEAD tells.
    S3, GCS and Azure list with strong consistency: a file the listing lacks is absent."""
    bucket = opened.bucket
    listed = await opened.call(location, lambda: bucket.list_under(prefix + "/"))
    held = [listed.get(object_key(prefix, e.path)) for e in entries]
    doubtful = [
        i
        for i, (e, h) in enumerate(zip(entries, held, strict=True))
        if h is not None and (h.size != e.size or (h.md5 is not None and h.md5 != e.md5))
    ]
    gate = asyncio.Semaphore(PARALLEL_CHECKS)

    async def head(i: int) -> None:
        key = object_key(prefix, entries[i].path)
        async with gate:
            held[i] = await opened.call(location, lambda: bucket.stat(key))

    await asyncio.gather(*(head(i) for i in doubtful))
    return held


def _check_files(version: str, entries: list[FileEntry], held: list[ObjectStat | None]) -> None:
    """Every file in the bucket as declared, or :class:`CommitRefused` naming them."""
    missing = [e.path for e, h in zip(entries, held, strict=True) if h is None]
    if missing:
        raise CommitRefused(
            f"{len(missing)} of the {len(entries)} files of {version!r} are not in the bucket "
            f"(the first: {missing[0][:200]!r}): upload them with the requests from begin, "
            "then commit"
        )
    for e, h in zip(entries, held, strict=True):
        assert h is not None
        check_commit(f"{version}/{e.path}", Declared(e.size, e.md5), Held(h.size, h.md5))


async def commit(
    app: web.Application, namespace: str, version: str, body: DirectoryCommitIn
) -> dict[str, Any]:
    """Make a directory version readable, once the bucket holds every file as declared:
    the version, its index key and its manifest in one transaction."""
    store = app[STORE]
    c = await to_commit(app, namespace, version, body.metadata, body.tag, directory=True)
    found, pending, metadata, tag, location, opened = c
    assert pending.manifest is not None
    entries = from_rows(pending.manifest)
    _check_files(version, entries, await _held(opened, location.name, pending.key, entries))
    size = total_size(entries)
    record = version_of(pending, size, None, metadata, files=len(entries))
    manifest = Put(
        manifest_key(pending.organization, pending.artifact, version), dump_manifest(entries)
    )
    made = await make_version(
        store, pending, found.mod_revision, record, tag, namespace, extra=[manifest]
    )
    if made:  # only the commit that made the version counts it (not replays)
        count_write(app, pending, location, size)
    return {
        "version": version,
        "location": location.name,
        "size": size,
        "md5": None,
        "files": len(entries),
        "tag": tag,
    }


# --- deletes (the sweeper's abandoned writes, retention's let-go versions) ---------------


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


# --- reads -------------------------------------------------------------------------------


async def _directory(
    app: web.Application, namespace: str, organization: str, artifact: str, ref: str
) -> tuple[str, Version, str | None, list[FileEntry], Location]:
    org = organization_for(app, organization, namespace)
    record, tag = await resolve(app, org.name, artifact, ref)
    if record.files is None:
        raise problem(
            409,
            f"version {record.version} of {artifact!r} is one file, not a directory: read it "
            f"with GET /v1/organizations/{org.name}/artifacts/{artifact}/versions/"
            f"{record.version}",
        )
    found = await app[STORE].get(manifest_key(org.name, artifact, record.version))
    if found is None:  # a version's record and its manifest are made in one transaction
        raise problem(503, f"the manifest of {record.version} is missing; retry shortly")
    location = app[VIEW].locations.get(record.location)
    if location is None:
        raise problem(503, f"location {record.location!r} is not known to the service yet")
    return org.name, record, tag, load_manifest(found.value), location


async def files(
    app: web.Application,
    namespace: str,
    organization: str,
    artifact: str,
    ref: str,
    reader: Place,
    *,
    download: bool,
) -> dict[str, Any]:
    """A directory version's files (path, size, MD5), sorted by path; with ``download``,
    a signed download of each (a read of the whole directory, counted as one)."""
    org, record, tag, entries, location = await _directory(
        app, namespace, organization, artifact, ref
    )
    how_far = str(locality(reader, location.cloud, location.region))
    listed: list[dict[str, Any]] = [{"path": e.path, "size": e.size, "md5": e.md5} for e in entries]
    if download:
        opened = await bucket_for(app, location)
        bucket = opened.bucket

        def sign_all() -> list[dict[str, Any]]:
            return [
                signed(bucket.presign_get(object_key(record.key, e.path), expires=DOWNLOAD_EXPIRES))
                for e in entries
            ]

        for row, req in zip(listed, await opened.sign(location.name, sign_all), strict=True):
            row["download"] = req
        count_read(app, org, reader, how_far, location, record, record.size)
    return {**located(record, location, how_far, ref, tag), "files": listed}


async def read_file(
    app: web.Application,
    namespace: str,
    organization: str,
    artifact: str,
    ref: str,
    path: str,
    reader: Place,
) -> dict[str, Any]:
    """One file of a directory version: where it lives, its size and MD5, a download."""
    check_path(path)
    org, record, tag, entries, location = await _directory(
        app, namespace, organization, artifact, ref
    )
    entry = find(entries, path)
    if entry is None:
        raise problem(
            404,
            f"version {record.version} of {artifact!r} has no file {path[:200]!r}: `o41 files "
            f"--org {org} --artifact {artifact} --version {record.version}` lists them",
        )
    how_far = str(locality(reader, location.cloud, location.region))
    opened = await bucket_for(app, location)
    download = await opened.sign(
        location.name,
        lambda: opened.bucket.presign_get(
            object_key(record.key, entry.path), expires=DOWNLOAD_EXPIRES
        ),
    )
    count_read(app, org, reader, how_far, location, record, entry.size)
    return {
        **located(record, location, how_far, ref, tag),
        "path": entry.path,
        "size": entry.size,
        "md5": entry.md5,
        "download": signed(download),
    }


__all__ = [
    "DirectoryBeginIn",
    "DirectoryCommitIn",
    "DirectoryRefused",
    "FileIn",
    "begin",
    "commit",
    "delete_files",
    "files",
    "read_file",
]
