"""The placement service's records in the state store, and their keys.

- ``pending/<version>``: a write that began; bound to a lease, so a write never committed
  expires on its own.
- ``committed/<version>``: a write's commit, remembered (the tenant that committed it and
  the commit's answer) by the commit's own transaction under the lease of pending writes
  (about an hour): a commit retried after it landed answers it again (issue 39).
- ``versions/<org>/<artifact>/<version>``: a committed version: only these are readable.
- ``index/<org>/<artifact>/<inverted commit sequence>-<version>``: the same record again,
  newest first (``o41.core.versions.index_suffix``): a page of a listing is a range read
  with a limit over a window of sequence numbers.
- ``artifacts/<org>/<artifact>``: the artifact's name, its commit count and its latest
  version; every commit of the artifact moves it by compare-and-set, so commits take
  sequence numbers one at a time.
- ``manifests/<org>/<artifact>/<version>``: a directory version's files (path, size, MD5;
  ``o41.core.directories``), put by the commit's own transaction: directory versions
  committed before issue 32 only. Since then the manifest is an object in the version's
  bucket (``o41.webhook.ledger``) and the version's record keeps its SHA-256 and size.
- ``tags/<org>/<artifact>/<tag>``: the version a tag points at; moved by compare-and-set.
- a version's record with ``deleting`` set (and its index key, likewise): retention is
  deleting it (``o41.webhook.retention``); reads answer 404 "deleted by retention".
- ``backfill/index``: set once every version committed before the index has its index
  key (``o41.webhook.writes.backfill``).
- ``usage-by-hour/<hour>/<org>/<digest>``, ``usage-by-day/<day>/<org>/<digest>``: counters,
  merged by compare-and-swap (o41.webhook.usage.counters); ``usage/<org>/<hour>/<digest>``: the
  layout before, folded into those.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, fields
from typing import Any

from o41.core.jsontext import dumps

PREFIX = b"/o41/placement/"


def pending_key(version: str) -> bytes:
    return PREFIX + b"pending/" + version.encode()


def committed_key(version: str) -> bytes:
    return PREFIX + b"committed/" + version.encode()


def version_key(organization: str, artifact: str, version: str) -> bytes:
    return PREFIX + f"versions/{organization}/{artifact}/{version}".encode()


def versions_prefix(organization: str, artifact: str) -> bytes:
    return PREFIX + f"versions/{organization}/{artifact}/".encode()


def index_prefix(organization: str, artifact: str) -> bytes:
    return PREFIX + f"index/{organization}/{artifact}/".encode()


def manifest_key(organization: str, artifact: str, version: str) -> bytes:
    return PREFIX + f"manifests/{organization}/{artifact}/{version}".encode()


def deleted_key(organization: str, artifact: str, version: str) -> bytes:
    """Where a version retention deleted is remembered for a while (under a lease), so
    that a read of it says so instead of "no committed version"."""
    return PREFIX + f"deleted/{organization}/{artifact}/{version}".encode()


def artifact_key(organization: str, artifact: str) -> bytes:
    return PREFIX + f"artifacts/{organization}/{artifact}".encode()


def artifacts_prefix(organization: str) -> bytes:
    return PREFIX + f"artifacts/{organization}/".encode()


def tag_key(organization: str, artifact: str, tag: str) -> bytes:
    return PREFIX + f"tags/{organization}/{artifact}/{tag}".encode()


def tags_prefix(organization: str, artifact: str) -> bytes:
    return PREFIX + f"tags/{organization}/{artifact}/".encode()


def usage_prefix(organization: str) -> bytes:
    return PREFIX + f"usage/{organization}/".encode()


def new_version() -> str:
    """Sortable by time (ms, hex), unique by 64 random bits: ``0193a1b2c3d4-9f8e7d6c5b4a3f2e``."""
    return f"{int(time.time() * 1000):012x}-{secrets.token_hex(8)}"


def _names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls))
    return names


def _dump(record: Any) -> bytes:
    """A flat record as compact JSON; ``dataclasses.asdict`` deep-copies every field,
    which cost a begin a fifth of its time, and the standard library's encoder took 12 us
    of a pending record where orjson takes about 1 (``o41.core.jsontext``)."""
    return dumps({n: getattr(record, n) for n in _names(type(record))})


def _known(cls: type, raw: bytes) -> dict[str, Any]:
    """The fields of ``cls`` in a stored record. Fields a newer replica added are left
    out, so replicas of two versions can share the store during a rolling upgrade."""
    data: dict[str, Any] = json.loads(raw)
    names = _names(cls)
    return {k: v for k, v in data.items() if k in names}


_FIELDS: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class Pending:
    organization: str
    artifact: str
    version: str
    namespace: str
    location: str
    key: str
    rule: str
    cloud: str | None
    region: str | None
    source: str
    size: int | None
    md5: str | None
    upload_id: str | None
    parts: int
    began: float
    crc32: list[str] | None = None  # each part's, when the client sent them
    metadata: dict[str, Any] | None = None  # the user's, checked at begin
    tag: str | None = None  # moved to this version at commit
    part_size: int | None = None  # of a multipart write: a resume cuts the file the same
    manifest: list[list[Any]] | None = None  # a directory's [path, size, md5] rows

    def dump(self) -> bytes:
        return _dump(self)

    @classmethod
    def load(cls, raw: bytes) -> Pending:
        return cls(**_known(cls, raw))


@dataclass(frozen=True, slots=True)
class Version:
    organization: str
    artifact: str
    version: str
    location: str
    key: str
    size: int
    md5: str | None
    rule: str
    cloud: str | None
    region: str | None
    source: str
    committed: float
    metadata: dict[str, Any] | None = None
    seq: int = 0  # the artifact's commit sequence number (1, 2, ...); 0 before issue 17
    files: int | None = None  # a directory version's file count (its manifest: manifest_key)
    deleting: float | None = None  # when retention began deleting it: no longer readable
    # A multipart version's part size and each part's CRC32 (base64) as the writer sent
    # them at begin: a reader checks each range of whole parts. Kept in the version's own
    # record only (the listing index leaves them out: up to 10,000 checksums a version).
    part_size: int | None = None
    crc32: list[str] | None = None
    # What the version's record object in its bucket holds besides (issue 32,
    # o41.webhook.ledger): the artifact's latest when the commit took its number, the
    # tenant that committed, the tag the commit moved, a directory's manifest object.
    previous: str | None = None
    by: str | None = None
    tag: str | None = None
    manifest_sha256: str | None = None  # None: the manifest is in etcd (before issue 32)
    manifest_size: int | None = None

    def dump(self) -> bytes:
        return _dump(self)

    @classmethod
    def load(cls, raw: bytes) -> Version:
        return cls(**_known(cls, raw))


@dataclass(frozen=True, slots=True)
class Tag:
    version: str
    set: float  # when it was last moved
    namespace: str  # who moved it last

    def dump(self) -> bytes:
        return _dump(self)

    @classmethod
    def load(cls, raw: bytes) -> Tag:
        return cls(**_known(cls, raw))


@dataclass(frozen=True, slots=True)
class Committed:
    """A commit that landed, for its repeats: only the same tenant is answered it."""

    namespace: str  # the tenant that committed it
    organization: str
    directory: bool
    answer: dict[str, Any]  # what the commit answered

    def dump(self) -> bytes:
        return _dump(self)

    @classmethod
    def load(cls, raw: bytes) -> Committed:
        return cls(**_known(cls, raw))


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    artifact: str
    latest: str  # the version of the last commit: `latest`
    committed: float
    count: int = 0  # commits so far: the last version's sequence number

    def dump(self) -> bytes:
        return _dump(self)

    @classmethod
    def load(cls, raw: bytes) -> ArtifactRecord:
        return cls(**_known(cls, raw))
