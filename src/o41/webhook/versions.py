"""An organization's artifacts, an artifact's versions newest first, ``latest`` and tags,
orchestrated on the state store around the rules of ``o41.core.versions``.

Every call is scoped like a write or a read: the organization must exist and the
caller's namespace must be one of its namespaces (``scope.organization_for``); keys are
built from the organization and the artifact, never taken from the request, and a
listing's cursor is accepted only for the listing it came from.
"""

from __future__ import annotations

import re
import time
from typing import Any

from aiohttp import web
from pydantic import Field

from o41.core.retention import keep_for
from o41.core.versions import (
    LATEST,
    VersionRefused,
    check_tag,
    cursor_key,
    encode_cursor,
    newest_position,
    page_limit,
    ref_kind,
    suffix_position,
    window_end,
)
from o41.state import Compare, Delete, KeyValue, Put
from o41.webhook.errors import problem
from o41.webhook.keys import STORE
from o41.webhook.records import ArtifactRecord as ArtifactRow
from o41.webhook.records import (
    Tag,
    artifact_key,
    artifacts_prefix,
    index_prefix,
    tag_key,
    tags_prefix,
    version_key,
)
from o41.webhook.records import Version as VersionRecord
from o41.webhook.scope import ARTIFACT_PATTERN, Model, organization_for

_ARTIFACT = re.compile(ARTIFACT_PATTERN)


class TagIn(Model):
    """Move a tag to ``version`` (an id or ``latest``). With ``expected``, only if the tag
    points at that version now; ``expected: null`` only if the tag does not exist yet;
    without ``expected``, whatever it points at."""

    version: str = Field(min_length=1, max_length=200)
    expected: str | None = Field(default=None, max_length=200)


def check_artifact(artifact: str) -> str:
    if _ARTIFACT.fullmatch(artifact) is None:
        raise VersionRefused(
            f"artifact {artifact[:80]!r} is not an artifact name: 1 to 200 characters, a "
            "letter or digit first, then letters, digits, '.', '_' or '-'"
        )
    return artifact


def version_json(record: VersionRecord, tags: list[str] | None = None) -> dict[str, Any]:
    """A version as listings and tags show it."""
    found: dict[str, Any] = {
        "version": record.version,
        "location": record.location,
        "size": record.size,
        "md5": record.md5,
        "committed": record.committed,
        "writer": {"cloud": record.cloud, "region": record.region, "source": record.source},
        "rule": record.rule,
        "metadata": record.metadata or {},
    }
    if record.files is not None:  # a directory version: how many files
        found["files"] = record.files
    if tags is not None:
        found["tags"] = tags
    return found


async def _page(
    app: web.Application, prefix: bytes, listing: str, what: Any, cursor: str | None, limit: int
) -> tuple[list[KeyValue], str | None]:
    """One page of the keys under ``prefix`` (limit + 1 read, to know if there is more)."""
    start = b""
    if cursor:
        start = prefix + cursor_key(listing, cursor, what).encode() + b"\0"
    found = await app[STORE].range(prefix, limit=limit + 1, start=start)
    more = len(found) > limit
    found = found[:limit]
    following = None
    if more and found:
        following = encode_cursor(listing, found[-1].key[len(prefix) :].decode())
    return found, following


async def list_versions(
    app: web.Application,
    namespace: str,
    organization: str,
    artifact: str,
    cursor: str | None,
    limit: int | None,
) -> dict[str, Any]:
    """One page of an artifact's versions, newest first, and the cursor of the next.

    The index is read in windows of ``WINDOW`` sequence numbers from where the page
    starts (the newest, or just after the cursor's key), each a range read with a limit:
    etcd counts every key of a range whatever its limit, so the window, not the artifact's
    size, bounds what a page costs."""
    org = organization_for(app, organization, namespace)
    check_artifact(artifact)
    size = page_limit(limit)
    listing = f"versions/{org.name}/{artifact}"
    prefix = index_prefix(org.name, artifact)
    store = app[STORE]
    if cursor:
        after = cursor_key(listing, cursor, "versions")
        start, position = prefix + after.encode() + b"\0", suffix_position(after)
    else:
        found = await store.get(artifact_key(org.name, artifact))
        if found is None:
            return {
                "organization": org.name,
                "artifact": artifact,
                "versions": [],
                "next": None,
                "keepVersions": keep_for(org.retention, artifact),
            }
        position = newest_position(ArtifactRow.load(found.value).count)
        start = prefix
    rows: list[KeyValue] = []
    while len(rows) <= size:
        end = window_end(position)
        rows += await store.range(
            prefix,
            limit=size + 1 - len(rows),
            start=start,
            end=b"" if end is None else prefix + end.encode(),
        )
        if end is None:
            break
        start, position = prefix + end.encode(), int(end, 16)
    following = None
    if len(rows) > size:
        rows = rows[:size]
        following = encode_cursor(listing, rows[-1].key[len(prefix) :].decode())
    return {
        "organization": org.name,
        "artifact": artifact,
        "versions": [
            version_json(r)
            for r in (VersionRecord.load(kv.value) for kv in rows)
            if r.deleting is None  # retention is deleting it
        ],
        "next": following,
        "keepVersions": keep_for(org.retention, artifact),  # what the rule lets go shows
    }


async def list_artifacts(
    app: web.Application, namespace: str, organization: str, cursor: str | None, limit: int | None
) -> dict[str, Any]:
    """One page of an organization's artifacts, by name."""
    org = organization_for(app, organization, namespace)
    size = page_limit(limit)
    found, following = await _page(
        app, artifacts_prefix(org.name), f"artifacts/{org.name}", "artifacts", cursor, size
    )
    rows = [ArtifactRow.load(kv.value) for kv in found]
    return {
        "organization": org.name,
        "artifacts": [
            {"artifact": r.artifact, "lastVersion": r.latest, "lastCommitted": r.committed}
            for r in rows
        ],
        "next": following,
    }


async def newest(app: web.Application, organization: str, artifact: str) -> VersionRecord | None:
    """The newest committed version: the artifact's record names it."""
    store = app[STORE]
    found = await store.get(artifact_key(organization, artifact))
    if found is None:
        return None
    latest = ArtifactRow.load(found.value).latest
    record = await store.get(version_key(organization, artifact, latest))
    return None if record is None else VersionRecord.load(record.value)


def _no_version(organization: str, artifact: str, ref: str) -> web.HTTPException:
    return problem(
        404,
        f"organization {organization!r} has no committed version {ref!r} of {artifact!r}: "
        f"`o41 versions --org {organization} --artifact {artifact}` lists them",
    )


async def resolve(
    app: web.Application, organization: str, artifact: str, ref: str
) -> tuple[VersionRecord, str | None]:
    """The version ``ref`` names (an id, ``latest`` or a tag), and the tag when it was
    one; the organization is the caller's, checked already."""
    store = app[STORE]
    kind = ref_kind(ref)
    check_artifact(artifact)
    if kind == "latest":
        record = await newest(app, organization, artifact)
        if record is None:
            raise problem(
                404,
                f"artifact {artifact!r} of organization {organization!r} has no committed "
                "version yet, so no 'latest': write one first",
            )
        return record, None
    tag = None
    version = ref
    if kind == "tag":
        found = await store.get(tag_key(organization, artifact, ref))
        if found is None:
            raise problem(
                404,
                f"artifact {artifact!r} of organization {organization!r} has no tag {ref!r} "
                f"(and no committed version {ref!r}): `o41 tag --org {organization} "
                f"--artifact {artifact}` lists its tags",
            )
        tag, version = ref, Tag.load(found.value).version
    got = await store.get(version_key(organization, artifact, version))
    if got is None:
        raise _no_version(organization, artifact, version)
    record = VersionRecord.load(got.value)
    if record.deleting is not None:
        raise deleted_by_retention(organization, artifact, version)
    return record, tag


def deleted_by_retention(organization: str, artifact: str, version: str) -> web.HTTPException:
    return problem(
        404,
        f"version {version!r} of {artifact!r} was deleted by the retention rule of "
        f"organization {organization!r} (it keeps the newest versions and tagged ones): "
        f"`o41 versions --org {organization} --artifact {artifact}` lists those kept",
    )


async def describe(
    app: web.Application, namespace: str, organization: str, artifact: str, ref: str
) -> dict[str, Any]:
    """The version a reference names, without a download (``o41 tag``, the SDK's resolve)."""
    org = organization_for(app, organization, namespace)
    record, tag = await resolve(app, org.name, artifact, ref)
    return {**version_json(record), "requested": ref, "tag": tag}


# --- tags --------------------------------------------------------------------------------


def _tag_json(artifact: str, tag: str, record: Tag) -> dict[str, Any]:
    return {"artifact": artifact, "tag": tag, "version": record.version, "set": record.set}


async def list_tags(
    app: web.Application, namespace: str, organization: str, artifact: str
) -> dict[str, Any]:
    org = organization_for(app, organization, namespace)
    check_artifact(artifact)
    prefix = tags_prefix(org.name, artifact)
    found = await app[STORE].range(prefix, limit=1000)
    return {
        "organization": org.name,
        "artifact": artifact,
        "tags": [
            _tag_json(artifact, kv.key[len(prefix) :].decode(), Tag.load(kv.value)) for kv in found
        ],
    }


def _lost(artifact: str, tag: str, current: Tag | None, expected: str | None) -> web.HTTPException:
    now = "does not exist" if current is None else f"points at version {current.version}"
    wanted = "not to exist" if expected is None else f"to point at version {expected}"
    return problem(
        409,
        f"tag {tag!r} of {artifact!r} {now}, not as expected ({wanted}): another writer "
        "moved it; read it again and decide",
        current=None if current is None else current.version,
    )


async def move_tag(
    app: web.Application,
    namespace: str,
    organization: str,
    artifact: str,
    tag: str,
    body: TagIn,
) -> dict[str, Any]:
    """Point ``tag`` at a version, by compare-and-set when the body says what it expects."""
    org = organization_for(app, organization, namespace)
    check_artifact(artifact)
    check_tag(tag)
    store = app[STORE]
    expects = "expected" in body.model_fields_set
    if expects and body.expected is not None and ref_kind(body.expected) != "version":
        raise VersionRefused(
            f"expected must be a version id or null (the tag must not exist), not "
            f"{body.expected[:80]!r}"
        )
    if ref_kind(body.version) == "tag":
        raise VersionRefused(
            f"a tag points at a version id or 'latest', not at another tag ({body.version!r}): "
            "resolve that tag first"
        )
    target, _ = await resolve(app, org.name, artifact, body.version)
    # the version's record unchanged since it was read: retention marks it before it
    # deletes it, so a tag never lands on a version being deleted (webhook/retention.py)
    vkey = version_key(org.name, artifact, target.version)
    held = await store.get(vkey)
    if held is None or VersionRecord.load(held.value).deleting is not None:
        raise deleted_by_retention(org.name, artifact, target.version)
    key = tag_key(org.name, artifact, tag)
    current = await store.get(key)
    now = None if current is None else Tag.load(current.value)
    if expects and (None if now is None else now.version) != body.expected:
        raise _lost(artifact, tag, now, body.expected)
    record = Tag(version=target.version, set=time.time(), namespace=namespace)
    guard = (
        Compare(key, "version", "==", 0)
        if current is None
        else Compare(key, "mod", "==", current.mod_revision)
    )
    unchanged = Compare(vkey, "mod", "==", held.mod_revision)
    result = await store.txn([guard, unchanged], [Put(key, record.dump())], [])
    if not result.succeeded:
        now_held = await store.get(vkey)
        if now_held is None or now_held.mod_revision != held.mod_revision:
            raise deleted_by_retention(org.name, artifact, target.version)
        again = await store.get(key)
        raise _lost(
            artifact,
            tag,
            None if again is None else Tag.load(again.value),
            body.expected if expects else (None if now is None else now.version),
        )
    return {
        **_tag_json(artifact, tag, record),
        "previous": None if now is None else now.version,
    }


async def delete_tag(
    app: web.Application,
    namespace: str,
    organization: str,
    artifact: str,
    tag: str,
    expected: str | None,
) -> dict[str, Any]:
    """Delete a tag (only if it points at ``expected``, when given)."""
    org = organization_for(app, organization, namespace)
    check_artifact(artifact)
    check_tag(tag)
    if expected is not None and ref_kind(expected) != "version":
        raise VersionRefused(f"expected must be a version id, not {expected[:80]!r}")
    store = app[STORE]
    key = tag_key(org.name, artifact, tag)
    current = await store.get(key)
    if current is None:
        raise problem(404, f"artifact {artifact!r} of organization {org.name!r} has no tag {tag!r}")
    now = Tag.load(current.value)
    if expected is not None and now.version != expected:
        raise _lost(artifact, tag, now, expected)
    result = await store.txn([Compare(key, "mod", "==", current.mod_revision)], [Delete(key)])
    if not result.succeeded:
        again = await store.get(key)
        raise _lost(artifact, tag, None if again is None else Tag.load(again.value), now.version)
    return {"artifact": artifact, "tag": tag, "deleted": now.version}


def tag_name(tag: str | None) -> str | None:
    """A tag given at write time, checked before anything is written."""
    return None if tag is None else check_tag(tag)


__all__ = [
    "LATEST",
    "TagIn",
    "delete_tag",
    "describe",
    "list_artifacts",
    "list_tags",
    "list_versions",
    "move_tag",
    "resolve",
    "tag_name",
]
