"""Tags: move one to a version (compare-and-set when the caller says what it expects),
delete one, list an artifact's. A move never lands on a version retention is deleting:
its transaction is guarded by the version record's revision (``o41.webhook.retention``).
Each move and deletion is journaled in the organization's fallback location after its
transaction and before the answer (``o41.webhook.ledger``), for a rebuild of etcd."""

from __future__ import annotations

import time

from aiohttp import web
from pydantic import Field

from o41.core.ledger import TagMove, micros
from o41.core.versions import VersionRefused, check_tag, ref_kind
from o41.state import Compare, Delete, Put
from o41.webhook.cluster.scope import organization_for
from o41.webhook.http.bodies import Model
from o41.webhook.http.errors import LocationFailed, problem
from o41.webhook.http.store import STORE
from o41.webhook.identity.auth import Caller
from o41.webhook.ledger import write_entry
from o41.webhook.records import Tag, tag_key, tags_prefix, version_key
from o41.webhook.records import Version as VersionRecord
from o41.webhook.versions.answers import TagDeleted, TagMoved, TagOut, TagsOut
from o41.webhook.versions.refs import check_artifact, deleted_by_retention, resolve


class TagIn(Model):
    """Move a tag to ``version`` (an id or ``latest``). With ``expected``, only if the tag
    points at that version now; ``expected: null`` only if the tag does not exist yet;
    without ``expected``, whatever it points at."""

    version: str = Field(min_length=1, max_length=200)
    expected: str | None = Field(default=None, max_length=200)


def _tag_json(artifact: str, tag: str, record: Tag) -> TagOut:
    return {"artifact": artifact, "tag": tag, "version": record.version, "set": record.set}


async def list_tags(
    app: web.Application, caller: Caller, organization: str, artifact: str
) -> TagsOut:
    org = organization_for(app, organization, caller)
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
    caller: Caller,
    organization: str,
    artifact: str,
    tag: str,
    body: TagIn,
) -> TagMoved:
    """Point ``tag`` at a version, by compare-and-set when the body says what it expects."""
    org = organization_for(app, organization, caller)
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
        if now is not None and now.version == target.version:
            return await _moved_already(app, org.name, artifact, tag, now, body.expected, target)
        raise _lost(artifact, tag, now, body.expected)
    record = Tag(version=target.version, set=micros(time.time()) / 1e6, namespace=caller.tenant)
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
        moved = None if again is None else Tag.load(again.value)
        previous = body.expected if expects else (None if now is None else now.version)
        if expects and moved is not None and moved.version == target.version:
            return await _moved_already(app, org.name, artifact, tag, moved, previous, target)
        raise _lost(artifact, tag, moved, previous)
    move = TagMove(org.name, artifact, tag, target.version, micros(record.set), caller.tenant)
    await _journal(app, move, target.location)
    return {
        **_tag_json(artifact, tag, record),
        "previous": None if now is None else now.version,
    }


async def _moved_already(
    app: web.Application,
    organization: str,
    artifact: str,
    tag: str,
    now: Tag,
    expected: str | None,
    target: VersionRecord,
) -> TagMoved:
    """A compare-and-set whose tag names the wanted version already (a move retried after
    it landed, its answer lost; or another writer made the same move): success, as the
    first answer was, with ``expected`` as the version before. Its journal entry is written
    again (the same entry, the same object): the first may have failed with a 503."""
    move = TagMove(organization, artifact, tag, now.version, micros(now.set), now.namespace)
    await _journal(app, move, target.location)
    return {**_tag_json(artifact, tag, now), "previous": expected}


async def delete_tag(
    app: web.Application,
    caller: Caller,
    organization: str,
    artifact: str,
    tag: str,
    expected: str | None,
) -> TagDeleted:
    """Delete a tag (only if it points at ``expected``, when given)."""
    org = organization_for(app, organization, caller)
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
    pointed = await store.get(version_key(org.name, artifact, now.version))
    near = org.fallback if pointed is None else VersionRecord.load(pointed.value).location
    gone = TagMove(org.name, artifact, tag, None, micros(time.time()), caller.tenant)
    await _journal(app, gone, near or "")
    return {"artifact": artifact, "tag": tag, "deleted": now.version}


async def _journal(app: web.Application, move: TagMove, near: str) -> None:
    """The move in the organization's journal, after its transaction (a move that lost
    its compare is never journaled); a 503 that says the tag did move when the journal's
    bucket refuses, since a rebuild from the buckets would not know of it."""
    try:
        await write_entry(app, move, near)
    except LocationFailed as e:
        raise problem(
            503,
            f"tag {move.tag!r} of {move.artifact!r} was "
            f"{'deleted' if move.version is None else 'moved to ' + move.version}, but its "
            f"journal entry could not be written ({e}): do the same again once the location "
            "answers, so that a rebuild from the buckets knows of it",
        ) from None


def tag_name(tag: str | None) -> str | None:
    """A tag given at write time, checked before anything is written."""
    return None if tag is None else check_tag(tag)
