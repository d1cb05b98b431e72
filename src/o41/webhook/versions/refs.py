"""What a reference names: a version id, ``latest`` (the artifact's record names it) or a
tag, resolved for a read, a tag move or ``o41 tag``; scoped like every call (the
organization must exist and the caller's namespace be one of its namespaces)."""

from __future__ import annotations

import re

from aiohttp import web

from o41.core.versions import VersionRefused, ref_kind
from o41.webhook.cluster.scope import ARTIFACT_PATTERN, organization_for
from o41.webhook.http.errors import problem
from o41.webhook.http.store import STORE
from o41.webhook.identity.auth import Caller
from o41.webhook.records import ArtifactRecord as ArtifactRow
from o41.webhook.records import Tag, artifact_key, deleted_key, tag_key, version_key
from o41.webhook.records import Version as VersionRecord
from o41.webhook.versions.answers import ResolvedOut, VersionOut

_ARTIFACT = re.compile(ARTIFACT_PATTERN)


def check_artifact(artifact: str) -> str:
    if _ARTIFACT.fullmatch(artifact) is None:
        raise VersionRefused(
            f"artifact {artifact[:80]!r} is not an artifact name: 1 to 200 characters, a "
            "letter or digit first, then letters, digits, '.', '_' or '-'"
        )
    return artifact


def version_json(record: VersionRecord) -> VersionOut:
    """A version as listings and tags show it."""
    found: VersionOut = {
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
    return found


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
        if await store.get(deleted_key(organization, artifact, version)) is not None:
            raise deleted_by_retention(organization, artifact, version)
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
    app: web.Application, caller: Caller, organization: str, artifact: str, ref: str
) -> ResolvedOut:
    """The version a reference names, without a download (``o41 tag``, the SDK's resolve)."""
    org = organization_for(app, organization, caller)
    record, tag = await resolve(app, org.name, artifact, ref)
    return {**version_json(record), "requested": ref, "tag": tag}
