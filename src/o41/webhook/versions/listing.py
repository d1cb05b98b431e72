"""An organization's artifacts, and an artifact's versions newest first, a page at a time.
Keys are built from the organization and the artifact, never taken from the request, and
a listing's cursor is accepted only for the listing it came from."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from o41.core.retention import keep_for
from o41.core.versions import (
    cursor_key,
    encode_cursor,
    newest_position,
    page_limit,
    suffix_position,
    window_end,
)
from o41.state import KeyValue
from o41.webhook.cluster.scope import organization_for
from o41.webhook.http.store import STORE
from o41.webhook.identity.auth import Caller
from o41.webhook.records import ArtifactRecord as ArtifactRow
from o41.webhook.records import Version as VersionRecord
from o41.webhook.records import artifact_key, artifacts_prefix, index_prefix
from o41.webhook.versions.answers import ArtifactsOut, VersionsOut
from o41.webhook.versions.refs import check_artifact, version_json


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
    caller: Caller,
    organization: str,
    artifact: str,
    cursor: str | None,
    limit: int | None,
) -> VersionsOut:
    """One page of an artifact's versions, newest first, and the cursor of the next.

    The index is read in windows of ``WINDOW`` sequence numbers from where the page
    starts (the newest, or just after the cursor's key), each a range read with a limit:
    etcd counts every key of a range whatever its limit, so the window, not the artifact's
    size, bounds what a page costs."""
    org = organization_for(app, organization, caller)
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
    app: web.Application, caller: Caller, organization: str, cursor: str | None, limit: int | None
) -> ArtifactsOut:
    """One page of an organization's artifacts, by name."""
    org = organization_for(app, organization, caller)
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
