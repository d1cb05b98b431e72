"""Commit a write: once the bucket really holds what was declared, one transaction turns
the pending record into the version (its record, its index key, the artifact's record,
the tag), and the counters and retention hear of it."""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import replace
from typing import Any, NamedTuple

from aiohttp import web

from o41 import logs
from o41.core.ledger import micros
from o41.core.versions import check_metadata, check_tag, index_suffix
from o41.core.writes import (
    Declared,
    Held,
    HeldPart,
    WriteRefused,
    check_commit,
    check_parts,
    etags_problem,
)
from o41.kube.locations import Location
from o41.state import Compare, Delete, KeyValue, LeaseNotFound, Put, Store, StoreUnavailable
from o41.webhook.buckets import OpenBucket, bucket_for
from o41.webhook.cluster.scope import organization_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed, problem
from o41.webhook.http.store import STORE
from o41.webhook.identity.auth import Caller
from o41.webhook.ledger import put_record
from o41.webhook.records import (
    ArtifactRecord,
    Committed,
    Pending,
    Tag,
    Version,
    artifact_key,
    committed_key,
    index_prefix,
    pending_key,
    tag_key,
    version_key,
)
from o41.webhook.retention import RETENTION
from o41.webhook.usage.counters import USAGE, location_dims
from o41.webhook.usage.counts import COUNTS
from o41.webhook.writes.answers import CommitOut
from o41.webhook.writes.bodies import CommitIn
from o41.webhook.writes.pending import LEASES


async def commit(app: web.Application, caller: Caller, version: str, body: CommitIn) -> CommitOut:
    """Make a version readable, once the bucket really holds what was declared."""
    store = app[STORE]
    try:
        c = await to_commit(app, caller, version, body.metadata, body.tag, directory=False)
    except AlreadyCommitted as e:
        return e.answer  # type: ignore[return-value]
    found, pending, metadata, tag, location, opened = c
    bucket = opened.bucket
    if pending.upload_id is not None:
        if why := etags_problem(pending.parts, body.etags):
            raise WriteRefused(why)
        upload_id = pending.upload_id
        await parts_as_recorded(opened, location, pending, upload_id)
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
    answer: CommitOut = {
        "version": version,
        "location": location.name,
        "size": held.size,
        "md5": record.md5,
        "tag": tag,
    }
    remembered = Committed(caller.tenant, pending.organization, False, dict(answer))
    succeeded = await make_version(
        store, pending, found.mod_revision, record, tag, caller.tenant, opened, remembered, app
    )
    if succeeded:  # only the commit that made the version counts it (not replays)
        count_write(app, pending, location, held.size)
    return answer


async def parts_as_recorded(
    opened: OpenBucket, location: Location, pending: Pending, upload_id: str
) -> None:
    """Before the parts are assembled, the bucket's listing of them against what the writer
    recorded at begin (:func:`check_parts`): a refusal keeps the write pending with its
    parts. Where a listing cannot be had (an upload a replayed commit assembled already)
    the assembly and the whole object's checks still decide."""
    if not pending.crc32 or not pending.part_size or pending.size is None:
        return  # nothing recorded to compare with
    try:
        held = await opened.call(
            location.name, lambda: opened.bucket.list_parts(pending.key, upload_id)
        )
    except LocationFailed:
        return
    check_parts(
        pending.version,
        pending.size,
        pending.part_size,
        pending.crc32,
        (HeldPart(p.number, p.size, p.crc32) for p in held),
    )


class AlreadyCommitted(Exception):
    """A commit retried after it landed: its first answer (issue 39)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("committed already")
        self.answer = answer


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
    caller: Caller,
    version: str,
    metadata: dict[str, Any] | None,
    tag: str | None,
    *,
    directory: bool,
) -> Committing:
    """The pending write a commit of ``version`` makes a version of (404: none; 403:
    another tenant's, or of an organization the caller may no longer use; 409: a
    directory's at the file's commit, or the reverse), the
    commit's ``metadata`` merged over begin's and its ``tag`` over begin's, checked."""
    found = await app[STORE].get(pending_key(version))
    if found is None:
        await _committed(app, caller, version, directory=directory)
        raise problem(
            404,
            f"no write {version!r} is waiting for its commit: it expired, was committed "
            "already, or never began; begin again",
        )
    pending = Pending.load(found.value)
    if pending.namespace != caller.tenant:
        raise problem(403, f"write {version!r} began in another namespace")
    organization_for(app, pending.organization, caller)  # still the caller's to use
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


async def _committed(
    app: web.Application, caller: Caller, version: str, *, directory: bool
) -> None:
    """A commit of ``version`` that landed already, by the caller's tenant, still of an
    organization it may use: :class:`AlreadyCommitted` with that commit's answer. Another
    tenant's commit is not told (the 404 of a write that is not there)."""
    kv = await app[STORE].get(committed_key(version))
    if kv is None:
        return
    made = Committed.load(kv.value)
    if made.namespace != caller.tenant or made.directory != directory:
        return
    organization_for(app, made.organization, caller)  # still the caller's to use
    raise AlreadyCommitted(made.answer)


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
        committed=micros(time.time()) / 1_000_000,  # exact in the record object too
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
# Commits of one artifact in this replica, one at a time: each PUTs its record between
# reading the counter and its transaction, so commits racing in one replica would mostly
# lose their compare and PUT again (bench/ledger.py: 8 writers of one artifact took 4.1
# tries a commit, and some gave up, with no lock; 2 before the record PUT). Replicas
# still race each other through the counter's compare.
_ARTIFACTS: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
    weakref.WeakValueDictionary()
)


async def make_version(
    store: Store,
    pending: Pending,
    pending_mod: int,
    record: Version,
    tag: str | None,
    namespace: str,
    opened: OpenBucket,
    remembered: Committed | None = None,
    app: web.Application | None = None,
) -> bool:
    """One transaction turns the pending write into the version: its record, its index
    key (the artifact's next commit sequence number, newest first), the artifact's record
    (its count and latest) and the tag given at write time. The artifact's record is
    guarded by its revision, so commits of one artifact take sequence numbers one at a
    time; one that loses to another commit of the artifact takes the next number. False
    when another commit of this very write made the version first (a replay).

    Before each transaction the version's record object is written to its bucket with
    the number the transaction will take (``o41.webhook.ledger``): a commit acknowledged
    has its record durable, and a transaction that loses its compare is followed by a PUT
    of the next number under the same key.

    ``remembered``: the commit's answer, kept by the same transaction under
    ``committed/<version>`` with the lease of pending writes (``app``'s), so a commit
    retried after it landed answers it again (:func:`to_commit`)."""
    org, artifact, version = pending.organization, pending.artifact, pending.version
    akey, vkey = artifact_key(org, artifact), version_key(org, artifact, version)
    async with _turn(org, artifact):
        for _ in range(COMMIT_ATTEMPTS):
            current = await store.get(akey)
            if current is None:
                guard = Compare(akey, "version", "==", 0)
                seq, previous = 1, None
            else:
                guard = Compare(akey, "mod", "==", current.mod_revision)
                head = ArtifactRecord.load(current.value)
                seq, previous = head.count + 1, head.latest
                if previous == version:  # made by a replay of this commit meanwhile
                    return await _replayed(store, vkey, opened)
            numbered = replace(record, seq=seq, previous=previous, by=namespace, tag=tag)
            await put_record(opened, record.location, numbered)
            listed = replace(  # a page of a listing stays small: what a listing shows
                numbered, part_size=None, crc32=None, previous=None, by=None, tag=None
            ).dump()
            made: list[Delete | Put] = [
                Delete(pending_key(version)),
                Put(vkey, numbered.dump()),
                Put(index_prefix(org, artifact) + index_suffix(seq, version).encode(), listed),
                Put(akey, ArtifactRecord(artifact, version, record.committed, seq).dump()),
            ]
            if tag is not None:
                moved = Tag(version, record.committed, namespace)
                made.append(Put(tag_key(org, artifact, tag), moved.dump()))
            pending_guard = Compare(pending_key(version), "mod", "==", pending_mod)
            if remembered is not None and app is not None:
                leases = app[LEASES]
                lease = await leases.current(store)
                kept = Put(committed_key(version), remembered.dump(), lease)
                try:
                    result = await store.txn([pending_guard, guard], [*made, kept])
                except LeaseNotFound:  # the transaction did not run: a new lease
                    lease = await leases.renew(store, lease)
                    kept = Put(committed_key(version), remembered.dump(), lease)
                    result = await store.txn([pending_guard, guard], [*made, kept])
            else:
                result = await store.txn([pending_guard, guard], made)
            if result.succeeded:
                return True
            if await store.get(vkey) is not None:
                return await _replayed(store, vkey, opened)
            still = await store.get(pending_key(version))
            if still is None or still.mod_revision != pending_mod:
                raise problem(409, f"write {version!r} changed while committing; commit again")
            # another version of the artifact took the sequence number: the next one
    raise StoreUnavailable(
        f"artifact {artifact!r} had {COMMIT_ATTEMPTS} commits in a row ahead of this one"
    )


def _turn(organization: str, artifact: str) -> asyncio.Lock:
    """The lock commits of one artifact take turns on in this replica."""
    lock = _ARTIFACTS.get((organization, artifact))
    if lock is None:
        lock = _ARTIFACTS[(organization, artifact)] = asyncio.Lock()
    return lock


async def _replayed(store: Store, vkey: bytes, opened: OpenBucket) -> bool:
    """Another commit of this write made the version: its record object is written again
    from etcd's record, since this commit's PUT may have landed after the winner's (the
    last PUT stands). False: this commit made nothing."""
    winner = await store.get(vkey)
    if winner is not None:
        made = Version.load(winner.value)
        await put_record(opened, made.location, made)
    return False
