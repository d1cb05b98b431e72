"""Write a directory version: one begin places the whole directory in one location and
signs one upload per file (each an object under the version's prefix); one commit checks
every file in the bucket, writes the manifest as an object beside them, and makes the
version in the commit's one transaction, so a reader finds no version or the whole
directory. Placement, the pending
write and the commit's transaction are the write path's (``o41.webhook.writes``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from aiohttp import web
from pydantic import Field

from o41.core.directories import (
    MAX_FILE_SIZE,
    MAX_FILES,
    FileEntry,
    check_manifest,
    from_rows,
    manifest_rows,
    object_key,
    total_size,
)
from o41.core.versions import MAX_METADATA_BYTES, MAX_METADATA_KEYS, check_metadata, check_tag
from o41.core.writes import CommitRefused, Declared, Held, check_commit
from o41.kube.api import NAME_PATTERN
from o41.storage import ObjectStat
from o41.webhook.buckets import PARALLEL_CHECKS, UPLOAD_EXPIRES, OpenBucket, bucket_for, signed
from o41.webhook.cluster.scope import ARTIFACT_PATTERN
from o41.webhook.directories.answers import DirectoryBeginOut, DirectoryCommitOut, SignedFile
from o41.webhook.http.bodies import Model
from o41.webhook.http.store import STORE
from o41.webhook.identity.auth import Caller
from o41.webhook.ledger import put_manifest
from o41.webhook.records import Committed, new_version
from o41.webhook.writes.begin import count_begin, place_new
from o41.webhook.writes.bodies import PlaceIn
from o41.webhook.writes.commit import (
    AlreadyCommitted,
    count_write,
    make_version,
    to_commit,
    version_of,
)
from o41.webhook.writes.pending import put_pending


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


async def begin(app: web.Application, caller: Caller, body: DirectoryBeginIn) -> DirectoryBeginOut:
    """Choose the one location of a directory version and sign one upload per file."""
    entries = check_manifest(FileEntry(f.path, f.size, f.md5) for f in body.files)
    metadata = check_metadata(body.metadata)
    tag = None if body.tag is None else check_tag(body.tag)
    placed = place_new(app, caller, body.organization, body.place, body.exclude)
    location = placed.location
    version = new_version()
    prefix = f"{body.artifact}/{version}"
    opened = await bucket_for(app, location)
    bucket = opened.bucket

    def sign_all() -> list[SignedFile]:
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
        caller.tenant,
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
    return {**placed.answer(version), "files": uploads, "expiresIn": UPLOAD_EXPIRES}


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
    app: web.Application, caller: Caller, version: str, body: DirectoryCommitIn
) -> DirectoryCommitOut:
    """Make a directory version readable, once the bucket holds every file as declared:
    its manifest object first (beside its files), then the version and its index key in
    one transaction."""
    store = app[STORE]
    try:
        c = await to_commit(app, caller, version, body.metadata, body.tag, directory=True)
    except AlreadyCommitted as e:
        return e.answer  # type: ignore[return-value]
    found, pending, metadata, tag, location, opened = c
    assert pending.manifest is not None
    entries = from_rows(pending.manifest)
    _check_files(version, entries, await _held(opened, location.name, pending.key, entries))
    size = total_size(entries)
    manifest = await put_manifest(
        opened, location.name, pending.organization, pending.artifact, version, entries
    )
    record = replace(
        version_of(pending, size, None, metadata, files=len(entries)),
        manifest_sha256=manifest.sha256,
        manifest_size=manifest.size,
    )
    answer: DirectoryCommitOut = {
        "version": version,
        "location": location.name,
        "size": size,
        "md5": None,
        "files": len(entries),
        "tag": tag,
    }
    remembered = Committed(caller.tenant, pending.organization, True, dict(answer))
    made = await make_version(
        store, pending, found.mod_revision, record, tag, caller.tenant, opened, remembered, app
    )
    if made:  # only the commit that made the version counts it (not replays)
        count_write(app, pending, location, size)
    return answer
