"""The buckets' record of versions, as the service writes and reads it (issue 32;
docs/operations.md "Backup and rebuild"). ``o41.core.ledger`` says what the objects hold;
this module puts them where they go:

- a version's **record object** in its own location, by the commit, before the etcd
  transaction that makes the version (``make_version``): an acknowledged commit has its
  record durable. Its content is a function of etcd's version record (:func:`record_of`),
  so a commit that finds another commit of the same write made the version first writes
  the winner's record again (the last PUT is the truth);
- a directory version's **manifest object** beside it (etcd keeps its SHA-256 and size),
  read back by the read path and kept in memory by its hash (:class:`Manifests`);
- a **journal entry** per tag move and per retention deletion, in the organization's
  fallback location (the version's own location when the organization has none).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from aiohttp import web

from o41.core.directories import FileEntry, load_manifest
from o41.core.ledger import (
    Entry,
    LedgerRefused,
    ManifestRef,
    VersionRecord,
    entry_bytes,
    entry_key,
    manifest_key,
    manifest_object,
    micros,
    parse_manifest,
)
from o41.kube.locations import Location
from o41.webhook.buckets import OpenBucket, bucket_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed, problem
from o41.webhook.http.store import STORE
from o41.webhook.records import Version
from o41.webhook.records import manifest_key as etcd_manifest_key


def record_of(version: Version) -> VersionRecord:
    """The record object of ``version`` as etcd holds it (``LedgerRefused``: a record
    the ledger cannot hold, such as an object key of another shape)."""
    manifest = None
    if version.manifest_sha256 is not None:
        manifest = ManifestRef(
            manifest_key(version.organization, version.artifact, version.version),
            version.manifest_sha256,
            version.manifest_size or 0,
            version.files or 0,
        )
    return VersionRecord(
        organization=version.organization,
        artifact=version.artifact,
        version=version.version,
        seq=version.seq,
        previous=version.previous,
        location=version.location,
        key=version.key,
        size=version.size,
        md5=version.md5,
        crc32=None if version.crc32 is None else tuple(version.crc32),
        part_size=version.part_size,
        metadata=version.metadata,
        cloud=version.cloud,
        region=version.region,
        source=version.source,
        rule=version.rule,
        committed_us=micros(version.committed),
        by=version.by,
        tag=version.tag,
        manifest=manifest,
    )


PUT_ATTEMPTS = 3


async def put_object(opened: OpenBucket, location: str, key: str, raw: bytes) -> None:
    """PUT one small object of the record, again on a failure the store says may pass (a
    kept-alive connection it had closed: the PUT of the same bytes is idempotent), up to
    ``PUT_ATTEMPTS`` times; then ``LocationFailed``."""
    for attempt in range(1, PUT_ATTEMPTS + 1):
        try:
            await opened.call(location, lambda: opened.bucket.put(key, raw))
        except LocationFailed as e:
            if attempt == PUT_ATTEMPTS or not e.error.retryable:
                raise
        else:
            return


async def put_record(opened: OpenBucket, location: str, version: Version) -> None:
    """Write ``version``'s record object to its location (``LocationFailed`` if the
    bucket refuses: the commit then fails, and may be retried)."""
    record = record_of(version)
    await put_object(opened, location, record.object_key, record.canonical())


async def put_manifest(
    opened: OpenBucket,
    location: str,
    organization: str,
    artifact: str,
    version: str,
    entries: Iterable[FileEntry],
) -> ManifestRef:
    """Write a directory version's manifest object; what its record says of it."""
    ref, raw = manifest_object(organization, artifact, version, entries)
    await put_object(opened, location, ref.key, raw)
    return ref


async def write_entry(app: web.Application, entry: Entry, near: str) -> str:
    """Journal ``entry`` in its organization's fallback location (``near``, the version's
    location, when the organization has none): the location it went to."""
    view = app[VIEW]
    org = view.organizations.get(entry.organization)
    name = org.fallback if org is not None and org.fallback else near
    location = view.locations.get(name) or view.locations.get(near)
    if location is None:
        raise problem(503, f"location {name!r} is not known to the service yet; retry shortly")
    opened = await bucket_for(app, location)
    await put_object(opened, location.name, entry_key(entry), entry_bytes(entry))
    return location.name


class Manifests:
    """Directory manifests read from buckets, kept by their SHA-256 (an object never
    changes under its hash) up to ``budget`` bytes, least recently used out first."""

    def __init__(self, budget: int = 64 * 2**20) -> None:
        self._budget = budget
        self._held = 0
        self._kept: OrderedDict[str, tuple[int, list[FileEntry]]] = OrderedDict()

    def get(self, sha: str) -> list[FileEntry] | None:
        hit = self._kept.get(sha)
        if hit is None:
            return None
        self._kept.move_to_end(sha)
        return hit[1]

    def keep(self, sha: str, size: int, entries: list[FileEntry]) -> None:
        if size > self._budget or sha in self._kept:
            return
        self._kept[sha] = (size, entries)
        self._held += size
        while self._held > self._budget:
            _, (dropped, _) = self._kept.popitem(last=False)
            self._held -= dropped


MANIFESTS: web.AppKey[Manifests] = web.AppKey("manifests")


async def manifest(app: web.Application, version: Version, location: Location) -> list[FileEntry]:
    """A directory version's files: from its manifest object (checked against the hash
    and size its record keeps), or from etcd for a version committed before issue 32."""
    if version.manifest_sha256 is None:
        key = etcd_manifest_key(version.organization, version.artifact, version.version)
        found = await app[STORE].get(key)
        if found is None:  # the record and this manifest are made in one transaction
            raise problem(503, f"the manifest of {version.version} is missing; retry shortly")
        return load_manifest(found.value)
    record = record_of(version)
    ref = record.manifest
    assert ref is not None
    cache = app[MANIFESTS]
    hit = cache.get(ref.sha256)
    if hit is not None:
        return hit
    opened = await bucket_for(app, location)
    raw = await opened.call(location.name, lambda: opened.bucket.get(ref.key))
    if raw is None:
        raise problem(
            503,
            f"the manifest object of version {version.version} is missing from location "
            f"{location.name!r} ({ref.key}): the bucket lost it; an administrator can see "
            "what else is missing with `o41 admin rebuild --dry-run`",
        )
    try:
        entries = parse_manifest(ref, raw)
    except LedgerRefused as e:
        raise problem(503, f"version {version.version}'s manifest cannot be read: {e}") from None
    cache.keep(ref.sha256, ref.size, entries)
    return entries
