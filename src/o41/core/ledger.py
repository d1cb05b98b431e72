"""The buckets' own record of every version, and the rebuild of etcd's index from it, as
plain functions of data (issue 32; docs/operations.md "Backup and rebuild (issue 32): the
design"). No I/O here: the service writes and lists these objects, this module says what
they hold and what etcd should hold given them.

- A **record object** is one committed version as a small immutable JSON object in the
  version's own location, at ``.o41/versions/<org>/<artifact>/<version>``
  (:func:`record_key`); a directory version's **manifest** is an object of its own at
  ``.o41/manifests/<org>/<artifact>/<version>`` (:func:`manifest_key`), the record
  keeping its key, SHA-256, size and file count. The prefix ``.o41/`` cannot collide with
  a user's object: every user key starts with the artifact's name (``<artifact>/<version>``
  and, for a directory, ``<artifact>/<version>/<path>``; GCS's part objects
  ``<key>.o41part-...`` too), and an artifact's name starts with a letter or digit.
- A **journal entry** is one tag move or one retention deletion as a small immutable
  object in the organization's fallback location, at ``.o41/journal/<org>/<when,
  16 decimal digits of microseconds>-<first 16 hex of its SHA-256>``
  (:func:`entry_key`): keys sort in time order, and two replicas never write the same key
  for different entries, with no coordination (the key is a function of the content).
- :func:`rebuild` computes etcd's index (versions, ``latest``, sequence counters, tags,
  the versions retention deleted) from every record and entry found, in any order, with
  duplicates; :func:`diff` says how that index differs from etcd's, line by line.

Bytes are **canonical** JSON: keys sorted, no spaces, UTF-8, no NaN; a parse refuses any
other spelling, so a record's SHA-256 is a function of the record. Times are integer
microseconds since the epoch (``committed_us``, ``when_us``): exact in any JSON reader up
to 2^53 (the year 2255), where the service's float seconds carry a fraction of a
microsecond. Refusals are :class:`LedgerRefused` naming the object and the rule.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from o41.core.directories import (
    DirectoryRefused,
    FileEntry,
    check_manifest,
    dump_manifest,
    load_manifest,
)
from o41.core.parts import crc32_bytes
from o41.core.versions import VERSION_PATTERN, VersionRefused, check_tag

RESERVED = ".o41/"
RECORDS = RESERVED + "versions/"
MANIFESTS = RESERVED + "manifests/"
JOURNAL = RESERVED + "journal/"
SCHEMA = 1  # bumped by any change to the fields: a reader refuses versions it does not know
MAX_MICROS = 2**53  # integers a JSON reader with doubles reads exactly

# As o41.api.NAME_PATTERN (an Organization's name) and o41.webhook.http.scope's
# ARTIFACT_PATTERN: the core imports neither, and tests/test_core_ledger.py checks both.
ORGANIZATION_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ARTIFACT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"

_ORG = re.compile(ORGANIZATION_PATTERN)
_ARTIFACT = re.compile(ARTIFACT_PATTERN)
_VERSION = re.compile(VERSION_PATTERN)
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENTRY_NAME = re.compile(r"^([0-9]{16})-([0-9a-f]{16})$")
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode

VersionRef = tuple[str, str, str]  # organization, artifact, version
ArtifactRef = tuple[str, str]
TagRef = tuple[str, str, str]  # organization, artifact, tag


class LedgerRefused(ValueError):
    """A record, manifest or journal entry that cannot be read or written as it is; the
    message names the object and the rule, so a rebuild can say which it left out."""


def canonical(data: Any) -> bytes:
    """``data`` as canonical JSON: one spelling per value, so equal records hash equal."""
    try:
        return _CANONICAL(data).encode()
    except (ValueError, UnicodeEncodeError) as e:  # NaN, a lone surrogate
        raise LedgerRefused(f"not plain JSON: {e}") from None


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def micros(seconds: float) -> int:
    """The service's float seconds (``Version.committed``, ``Tag.set``) as microseconds."""
    return round(seconds * 1_000_000)


def _check_names(organization: str, artifact: str, version: str | None = None) -> None:
    if _ORG.fullmatch(organization) is None or len(organization) > 253:
        raise LedgerRefused(f"{organization[:80]!r} is not an organization's name")
    if _ARTIFACT.fullmatch(artifact) is None:
        raise LedgerRefused(f"{artifact[:80]!r} is not an artifact's name")
    if version is not None and _VERSION.fullmatch(version) is None:
        raise LedgerRefused(f"{version[:80]!r} is not a version id")


def _check_micros(name: str, value: int) -> None:
    if not 0 <= value < MAX_MICROS:
        raise LedgerRefused(f"{name} {value} is not microseconds since the epoch (0 to 2^53)")


def record_key(organization: str, artifact: str, version: str) -> str:
    """Where a version's record object lives in its location's bucket."""
    _check_names(organization, artifact, version)
    return f"{RECORDS}{organization}/{artifact}/{version}"


def manifest_key(organization: str, artifact: str, version: str) -> str:
    """Where a directory version's manifest object lives, next to its record's prefix."""
    _check_names(organization, artifact, version)
    return f"{MANIFESTS}{organization}/{artifact}/{version}"


# --- a version's record object ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ManifestRef:
    """A directory version's manifest object as its record names it: etcd needs only the
    hash and size to check the object it reads back."""

    key: str
    sha256: str
    size: int
    files: int


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """One committed version, as its record object holds it. ``previous`` is the version
    the artifact's record named ``latest`` when this commit read the sequence counter: it
    was committed (it came from etcd), so any record proves its predecessor's commit.
    ``tag`` and ``by``: the tag the commit moved here (in the commit's transaction), and
    the tenant that committed. Metadata is the user's JSON object: do not change it."""

    organization: str
    artifact: str
    version: str
    seq: int  # the artifact's commit sequence number; 0: committed before numbering
    previous: str | None
    location: str
    key: str  # the object's key, or a directory's prefix: always <artifact>/<version>
    size: int
    md5: str | None
    crc32: tuple[str, ...] | None
    part_size: int | None
    metadata: dict[str, Any] | None
    cloud: str | None
    region: str | None
    source: str
    rule: str
    committed_us: int
    by: str
    tag: str | None = None
    manifest: ManifestRef | None = None

    def __post_init__(self) -> None:
        _check_names(self.organization, self.artifact, self.version)
        if self.previous is not None and _VERSION.fullmatch(self.previous) is None:
            raise LedgerRefused(f"previous {self.previous[:80]!r} is not a version id")
        if self.previous == self.version:
            raise LedgerRefused(f"version {self.version} names itself as its previous")
        if self.seq < 0:
            raise LedgerRefused(f"sequence {self.seq} is below 0")
        if self.key != f"{self.artifact}/{self.version}":
            raise LedgerRefused(
                f"object key {self.key[:200]!r} is not {self.artifact}/{self.version}: a "
                "version's objects live under its artifact and id"
            )
        if self.size < 0:
            raise LedgerRefused(f"size {self.size} is below 0")
        if self.md5 is not None and _MD5.fullmatch(self.md5) is None:
            raise LedgerRefused(f"md5 {self.md5[:40]!r} is not 32 hex digits")
        if self.crc32 is not None:
            bad = [c for c in self.crc32 if crc32_bytes(c) is None]
            if bad:
                raise LedgerRefused(f"crc32 {bad[0][:20]!r} is not a base64 CRC32")
        if self.part_size is not None and self.part_size < 1:
            raise LedgerRefused(f"part size {self.part_size} is below 1")
        _check_micros("committed_us", self.committed_us)
        for name in ("location", "source", "rule", "by"):
            if not getattr(self, name):
                raise LedgerRefused(f"{name} is empty")
        if self.tag is not None:
            try:
                check_tag(self.tag)
            except VersionRefused as e:
                raise LedgerRefused(str(e)) from None
        if self.manifest is not None:
            m = self.manifest
            if m.key != manifest_key(self.organization, self.artifact, self.version):
                raise LedgerRefused(f"manifest key {m.key[:200]!r} is not this version's")
            if _SHA256.fullmatch(m.sha256) is None:
                raise LedgerRefused(f"manifest sha256 {m.sha256[:70]!r} is not 64 hex digits")
            if m.size < 2 or m.files < 1:
                raise LedgerRefused(f"manifest of {m.files} files in {m.size} bytes")
        canonical(self.metadata)  # plain JSON, or refused now rather than at write

    @property
    def ref(self) -> VersionRef:
        return (self.organization, self.artifact, self.version)

    @property
    def object_key(self) -> str:
        """This record object's own key."""
        return record_key(self.organization, self.artifact, self.version)

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "schema": SCHEMA,
            "organization": self.organization,
            "artifact": self.artifact,
            "version": self.version,
            "seq": self.seq,
            "previous": self.previous,
            "location": self.location,
            "key": self.key,
            "size": self.size,
            "md5": self.md5,
            "crc32": None if self.crc32 is None else list(self.crc32),
            "part_size": self.part_size,
            "metadata": self.metadata,
            "cloud": self.cloud,
            "region": self.region,
            "source": self.source,
            "rule": self.rule,
            "committed_us": self.committed_us,
            "by": self.by,
            "tag": self.tag,
            "manifest": None
            if m is None
            else {"key": m.key, "sha256": m.sha256, "size": m.size, "files": m.files},
        }

    def canonical(self) -> bytes:
        """The record object's bytes."""
        return canonical(self.to_json())

    def sha256(self) -> str:
        return sha256(self.canonical())


def version_fields(record: VersionRecord) -> dict[str, Any]:
    """The fields of etcd's version record (``o41.webhook.records.Version``) this record
    restores: ``Version(**version_fields(r))``. Nothing marked: retention's mark is etcd's."""
    return {
        "organization": record.organization,
        "artifact": record.artifact,
        "version": record.version,
        "location": record.location,
        "key": record.key,
        "size": record.size,
        "md5": record.md5,
        "rule": record.rule,
        "cloud": record.cloud,
        "region": record.region,
        "source": record.source,
        "committed": record.committed_us / 1_000_000,
        "metadata": record.metadata,
        "seq": record.seq,
        "files": None if record.manifest is None else record.manifest.files,
        "deleting": None,
        "part_size": record.part_size,
        "crc32": None if record.crc32 is None else list(record.crc32),
    }


def manifest_object(
    organization: str, artifact: str, version: str, entries: Iterable[FileEntry]
) -> tuple[ManifestRef, bytes]:
    """A directory's manifest object (its files sorted by path, as etcd stores them today)
    and what the version's record says of it."""
    try:
        checked = check_manifest(entries)
    except DirectoryRefused as e:
        raise LedgerRefused(str(e)) from None
    raw = dump_manifest(checked)
    key = manifest_key(organization, artifact, version)
    return ManifestRef(key, sha256(raw), len(raw), len(checked)), raw


def parse_manifest(ref: ManifestRef, raw: bytes) -> list[FileEntry]:
    """The files of a manifest object, if it is the one its record names."""
    if len(raw) != ref.size or sha256(raw) != ref.sha256:
        raise LedgerRefused(
            f"manifest object {ref.key} is {len(raw)} bytes of SHA-256 {sha256(raw)[:16]}..., "
            f"its record says {ref.size} bytes of {ref.sha256[:16]}...: not the manifest "
            "committed"
        )
    try:
        entries = check_manifest(load_manifest(raw))
    except (ValueError, TypeError, DirectoryRefused) as e:
        raise LedgerRefused(f"manifest object {ref.key} is not a manifest: {e}") from None
    if len(entries) != ref.files:
        raise LedgerRefused(
            f"manifest object {ref.key} lists {len(entries)} files, not {ref.files}"
        )
    return entries


# --- reading stored JSON, strictly --------------------------------------------------------


class _Fields:
    """One stored object's JSON fields, read by type; a refusal names the object."""

    def __init__(self, what: str, data: Any, names: Iterable[str]) -> None:
        self.what = what
        if not isinstance(data, dict):
            raise LedgerRefused(f"{what} is not a JSON object")
        wanted = set(names)
        missing, unknown = sorted(wanted - data.keys()), sorted(data.keys() - wanted)
        if missing:
            raise LedgerRefused(f"{what} lacks field {', '.join(missing)}")
        if unknown:
            raise LedgerRefused(f"{what} has unknown field {', '.join(unknown)[:200]}")
        self.data: dict[str, Any] = data

    @classmethod
    def stored(cls, what: str, raw: bytes, names: Iterable[str] | None) -> _Fields:
        """A stored object's fields, once its schema version is one this o41 reads
        (``names``: None, any fields)."""
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise LedgerRefused(f"{what} is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise LedgerRefused(f"{what} is not a JSON object")
        schema = data.get("schema")
        if isinstance(schema, bool) or schema != SCHEMA:
            raise LedgerRefused(
                f"{what} has schema version {json.dumps(schema)[:20]}; this o41 reads version "
                f"{SCHEMA}: rebuild with the o41 release that wrote it, or a newer one"
            )
        return cls(what, data, data.keys() if names is None else ("schema", *names))

    def _bad(self, name: str, kind: str) -> LedgerRefused:
        shown = json.dumps(self.data[name])[:60]
        return LedgerRefused(f"field {name!r} of {self.what} must be {kind}, not {shown}")

    def text(self, name: str) -> str:
        value = self.data[name]
        if not isinstance(value, str):
            raise self._bad(name, "text")
        return value

    def maybe_text(self, name: str) -> str | None:
        return None if self.data[name] is None else self.text(name)

    def number(self, name: str) -> int:
        value = self.data[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, "an integer")
        return value

    def maybe_number(self, name: str) -> int | None:
        return None if self.data[name] is None else self.number(name)

    def texts(self, name: str) -> tuple[str, ...] | None:
        value = self.data[name]
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(name, "a list of text")
        return tuple(value)

    def mapping(self, name: str) -> dict[str, Any] | None:
        value = self.data[name]
        if value is not None and not isinstance(value, dict):
            raise self._bad(name, "a JSON object or null")
        return value


def _built(what: str, build: Callable[[], Any]) -> Any:
    try:
        return build()
    except LedgerRefused as e:
        raise LedgerRefused(f"{what}: {e}") from None


def _check_spelling(what: str, raw: bytes, made: bytes) -> None:
    if raw != made:
        raise LedgerRefused(
            f"{what} is not in canonical form (keys sorted, no spaces, UTF-8): not written "
            "by o41, or changed since"
        )


_RECORD_FIELDS = tuple(f.name for f in fields(VersionRecord))


def parse_record(key: str, raw: bytes, location: str | None = None) -> VersionRecord:
    """The record object at ``key`` (found in ``location``, when given), or a refusal:
    not JSON, another schema version, a field missing, unknown or of the wrong type, a
    value out of its rules, a key or location other than its fields say, not canonical."""
    what = f"record object {key[:300]}"
    f = _Fields.stored(what, raw, _RECORD_FIELDS)
    manifest = f.mapping("manifest")
    ref: ManifestRef | None = None
    if manifest is not None:
        m = _Fields(f"the manifest of {what}", manifest, ("key", "sha256", "size", "files"))
        ref = ManifestRef(m.text("key"), m.text("sha256"), m.number("size"), m.number("files"))
    record: VersionRecord = _built(
        what,
        lambda: VersionRecord(
            organization=f.text("organization"),
            artifact=f.text("artifact"),
            version=f.text("version"),
            seq=f.number("seq"),
            previous=f.maybe_text("previous"),
            location=f.text("location"),
            key=f.text("key"),
            size=f.number("size"),
            md5=f.maybe_text("md5"),
            crc32=f.texts("crc32"),
            part_size=f.maybe_number("part_size"),
            metadata=f.mapping("metadata"),
            cloud=f.maybe_text("cloud"),
            region=f.maybe_text("region"),
            source=f.text("source"),
            rule=f.text("rule"),
            committed_us=f.number("committed_us"),
            by=f.text("by"),
            tag=f.maybe_text("tag"),
            manifest=ref,
        ),
    )
    if record.object_key != key:
        raise LedgerRefused(
            f"{what} holds version {record.version} of {record.organization}/"
            f"{record.artifact}, whose record is {record.object_key}: copied or renamed"
        )
    if location is not None and record.location != location:
        raise LedgerRefused(
            f"{what} was found in location {location!r} but says its version lives in "
            f"{record.location!r}: copied from another bucket"
        )
    _check_spelling(what, raw, record.canonical())
    return record


# --- the journal: tag moves and retention deletions -------------------------------------


@dataclass(frozen=True, slots=True)
class TagMove:
    """A tag moved to ``version`` (None: deleted) at ``when_us`` by tenant ``by``."""

    organization: str
    artifact: str
    tag: str
    version: str | None
    when_us: int
    by: str

    def __post_init__(self) -> None:
        _check_names(self.organization, self.artifact, self.version)
        try:
            check_tag(self.tag)
        except VersionRefused as e:
            raise LedgerRefused(str(e)) from None
        _check_micros("when_us", self.when_us)
        if not self.by:
            raise LedgerRefused("by is empty")


@dataclass(frozen=True, slots=True)
class Deletion:
    """Retention deleted ``version`` (which held sequence ``seq``) at ``when_us``. The
    sequence number is kept because the version's record object goes with its bytes."""

    organization: str
    artifact: str
    version: str
    seq: int
    when_us: int

    def __post_init__(self) -> None:
        _check_names(self.organization, self.artifact, self.version)
        if self.seq < 0:
            raise LedgerRefused(f"sequence {self.seq} is below 0")
        _check_micros("when_us", self.when_us)


Entry = TagMove | Deletion


def entry_json(entry: Entry) -> dict[str, Any]:
    common = {"schema": SCHEMA, "organization": entry.organization, "artifact": entry.artifact}
    if isinstance(entry, TagMove):
        return {
            **common,
            "kind": "tag",
            "tag": entry.tag,
            "version": entry.version,
            "when_us": entry.when_us,
            "by": entry.by,
        }
    return {
        **common,
        "kind": "deletion",
        "version": entry.version,
        "seq": entry.seq,
        "when_us": entry.when_us,
    }


def entry_bytes(entry: Entry) -> bytes:
    return canonical(entry_json(entry))


def entry_key(entry: Entry) -> str:
    """Sorts by time; a function of the content, so two replicas' entries never share a
    key unless they are the same entry (a retried PUT writes the same object again)."""
    digest = sha256(entry_bytes(entry))[:16]
    return f"{JOURNAL}{entry.organization}/{entry.when_us:016d}-{digest}"


def parse_entry(key: str, raw: bytes) -> Entry:
    """The journal entry at ``key``, or a refusal naming what is wrong with it."""
    what = f"journal entry {key[:300]}"
    try:
        kind = json.loads(raw).get("kind")
    except (UnicodeDecodeError, ValueError, AttributeError):
        kind = None
    entry: Entry
    if kind == "tag":
        f = _Fields.stored(
            what, raw, ("kind", "organization", "artifact", "tag", "version", "when_us", "by")
        )
        entry = _built(
            what,
            lambda: TagMove(
                f.text("organization"),
                f.text("artifact"),
                f.text("tag"),
                f.maybe_text("version"),
                f.number("when_us"),
                f.text("by"),
            ),
        )
    elif kind == "deletion":
        f = _Fields.stored(
            what, raw, ("kind", "organization", "artifact", "version", "seq", "when_us")
        )
        entry = _built(
            what,
            lambda: Deletion(
                f.text("organization"),
                f.text("artifact"),
                f.text("version"),
                f.number("seq"),
                f.number("when_us"),
            ),
        )
    else:
        _Fields.stored(what, raw, None)  # not JSON, not an object, another schema: says so
        raise LedgerRefused(f"{what} is of kind {kind!r}: neither 'tag' nor 'deletion'")
    _check_spelling(what, raw, entry_bytes(entry))
    if entry_key(entry) != key:
        raise LedgerRefused(
            f"{what} holds an entry whose key is {entry_key(entry)}: renamed, or changed "
            "since it was written"
        )
    return entry


# --- the rebuild -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TagState:
    version: str
    set_us: int
    by: str


@dataclass(frozen=True, slots=True)
class ArtifactState:
    """What etcd's artifact record holds (``count``: the last sequence number taken, the
    next commit takes ``count + 1``) and its versions, oldest first."""

    versions: tuple[str, ...]
    latest: str
    count: int
    committed_us: int  # latest's


@dataclass(frozen=True, slots=True)
class SetAside:
    """A record the rebuild did not restore, and why; its objects stay in the bucket."""

    record: VersionRecord
    reason: str


@dataclass(frozen=True)
class Index:
    """etcd's index in a shape both sides of :func:`diff` can give: each version's record
    fields (``version_fields``; from etcd, ``Version``'s), each artifact's ``(latest,
    count)``, each tag's version."""

    versions: Mapping[VersionRef, Mapping[str, Any]]
    artifacts: Mapping[ArtifactRef, tuple[str, int]]
    tags: Mapping[TagRef, str]


@dataclass(frozen=True)
class Rebuilt:
    """What etcd should hold: the versions restored, the artifacts, the tags; the versions
    retention deleted (absent; their sequence numbers stay taken); and what was left out."""

    records: Mapping[VersionRef, VersionRecord]
    artifacts: Mapping[ArtifactRef, ArtifactState]
    tags: Mapping[TagRef, TagState]
    deleted: Mapping[VersionRef, int]
    set_aside: tuple[SetAside, ...] = ()
    notes: tuple[str, ...] = ()

    def index(self) -> Index:
        return Index(
            {ref: version_fields(r) for ref, r in self.records.items()},
            {ref: (a.latest, a.count) for ref, a in self.artifacts.items()},
            {ref: t.version for ref, t in self.tags.items()},
        )


def _rank(record: VersionRecord) -> tuple[int, int, str]:
    """Oldest first: sequence, then commit time, then id (only ever needed for ties)."""
    return (record.seq, record.committed_us, record.version)


def _distinct(
    records: Iterable[VersionRecord], notes: list[str]
) -> dict[VersionRef, VersionRecord]:
    """One record per version. Two different ones for a version (the same key in two
    listings that disagree): the higher sequence, since a commit that retries PUTs its
    record again only with a higher number."""
    found: dict[VersionRef, dict[str, VersionRecord]] = defaultdict(dict)
    for r in records:
        found[r.ref][r.sha256()] = r
    chosen: dict[VersionRef, VersionRecord] = {}
    for ref, variants in found.items():
        best = max(variants.items(), key=lambda kv: (kv[1].seq, kv[0]))[1]
        if len(variants) > 1:
            notes.append(
                f"{ref[0]}/{ref[1]}: version {ref[2]} has {len(variants)} different record "
                f"objects; the one with sequence {best.seq} is used"
            )
        chosen[ref] = best
    return chosen


def rebuild(
    records: Iterable[VersionRecord],
    journal: Iterable[Entry],
    objects_check_out: Callable[[VersionRecord], bool],
) -> Rebuilt:
    """etcd's index from the buckets alone; the same for any order and any duplicates of
    the inputs. ``objects_check_out(record)``: whether the bucket holds the version as
    its record says. It is asked only about the records :func:`doubtful` returns, so the
    caller checks those first (in parallel, with I/O) and passes the answers.

    A version is **proven** committed when a record names it as ``previous``, a journal
    entry names it (a tag moved onto it, retention deleted it), or it was numbered before
    sequence numbers (``seq`` 0, written from etcd). Per artifact and sequence number:

    - a proven claimant wins it; the others are set aside (their commit's transaction
      never happened: they lost the number to the proven one);
    - with none proven (the newest number, or a version whose successor retention deleted),
      the claimants whose objects check out compete and the one committed last wins: a
      commit that failed after its PUT is followed by the commit that took its number.
    - the winner is restored, unless retention deleted it (absent, number still taken).

    ``latest``: the restored version of the highest sequence; the counter: the highest
    number won. A tag: its journal and the commit-time tags of the winners replayed in
    time order; a tag that ends on a version not restored (deleted by retention: the
    service never lets a tag stay there) is left out, with a note."""
    notes: list[str] = []
    chosen = _distinct(records, notes)
    entries = set(journal)
    deletions: dict[VersionRef, Deletion] = {}
    for e in sorted((e for e in entries if isinstance(e, Deletion)), key=entry_key):
        deletions.setdefault((e.organization, e.artifact, e.version), e)
    proven: set[VersionRef] = set(deletions)
    proven.update(
        (e.organization, e.artifact, e.version)
        for e in entries
        if isinstance(e, TagMove) and e.version is not None
    )
    for r in chosen.values():
        if r.previous is not None:
            proven.add((r.organization, r.artifact, r.previous))
        if r.seq == 0:
            proven.add(r.ref)

    # every claim on an artifact's sequence numbers: records, and deletions without one
    claims: dict[tuple[str, str, int], list[VersionRef]] = defaultdict(list)
    for r in chosen.values():
        if r.seq > 0:
            claims[(r.organization, r.artifact, r.seq)].append(r.ref)
    for ref, d in deletions.items():
        if ref not in chosen and d.seq > 0:
            claims[(d.organization, d.artifact, d.seq)].append(ref)

    winners: set[VersionRef] = {r.ref for r in chosen.values() if r.seq == 0}
    count: dict[ArtifactRef, int] = defaultdict(int)
    set_aside: list[SetAside] = []

    def order(ref: VersionRef) -> tuple[int, str]:
        r = chosen.get(ref)
        return (-1 if r is None else r.committed_us, ref[2])

    for (org, artifact, seq), refs in sorted(claims.items()):
        where = f"{org}/{artifact}"
        sure = [ref for ref in refs if ref in proven]
        winner: VersionRef | None
        if sure:
            winner = max(sure, key=order)
            if len(sure) > 1:
                notes.append(
                    f"{where}: sequence {seq} is claimed by {len(sure)} versions shown "
                    f"committed ({', '.join(sorted(v for _, _, v in sure))}); "
                    f"{winner[2]}, committed last, keeps it"
                )
            for ref in refs:
                if ref != winner and ref in chosen:  # a deletion without a record: none
                    set_aside.append(
                        SetAside(
                            chosen[ref],
                            f"sequence {seq} of {where} went to version {winner[2]}, "
                            "shown committed: this commit's transaction never happened",
                        )
                    )
        else:
            good = [ref for ref in sorted(refs) if objects_check_out(chosen[ref])]
            winner = max(good, key=order) if good else None
            for ref in refs:
                if ref == winner:
                    continue
                if ref in good:
                    assert winner is not None
                    why = (
                        f"sequence {seq} of {where} went to version {winner[2]}, committed "
                        "later: this commit's transaction never happened"
                    )
                else:
                    why = (
                        "nothing shows its commit happened and its objects are not in the "
                        "bucket as its record says"
                    )
                set_aside.append(SetAside(chosen[ref], why))
        if winner is not None:
            winners.add(winner)
            count[(org, artifact)] = max(count[(org, artifact)], seq)

    restored = {ref: chosen[ref] for ref in winners if ref not in deletions}
    deleted = {ref: chosen[ref].seq if ref in chosen else d.seq for ref, d in deletions.items()}

    by_artifact: dict[ArtifactRef, list[VersionRecord]] = defaultdict(list)
    for r in restored.values():
        by_artifact[(r.organization, r.artifact)].append(r)
    artifacts: dict[ArtifactRef, ArtifactState] = {}
    for aref, rs in by_artifact.items():
        rs.sort(key=_rank)
        artifacts[aref] = ArtifactState(
            tuple(r.version for r in rs), rs[-1].version, count[aref], rs[-1].committed_us
        )
    for aref in sorted(set(count) - set(artifacts)):
        notes.append(
            f"{aref[0]}/{aref[1]}: no version is left to restore (sequence numbers up to "
            f"{count[aref]} were taken): no artifact record"
        )

    won = [chosen[ref] for ref in winners if ref in chosen]  # not deletions without one
    tags = _replay(entries, won, restored, deletions, notes)
    set_aside.sort(key=lambda s: s.record.ref)
    return Rebuilt(restored, artifacts, tags, deleted, tuple(set_aside), tuple(sorted(notes)))


def _replay(
    entries: Iterable[Entry],
    winners: Iterable[VersionRecord],
    restored: Mapping[VersionRef, VersionRecord],
    deletions: Mapping[VersionRef, Deletion],
    notes: list[str],
) -> dict[TagRef, TagState]:
    """Each tag's last move, in time order (ties by object key), over the journal and the
    tags the winners' commits moved in their own transactions."""
    moves: list[tuple[int, str, TagRef, str | None, str]] = []
    for e in entries:
        if isinstance(e, TagMove):
            moves.append(
                (e.when_us, entry_key(e), (e.organization, e.artifact, e.tag), e.version, e.by)
            )
    for r in winners:
        if r.tag is not None:
            tref = (r.organization, r.artifact, r.tag)
            moves.append((r.committed_us, r.object_key, tref, r.version, r.by))
    last: dict[TagRef, tuple[int, str, TagRef, str | None, str]] = {}
    for move in sorted(moves):
        last[move[2]] = move
    tags: dict[TagRef, TagState] = {}
    for tref, (when, _, _, version, by) in last.items():
        if version is None:
            continue
        if (tref[0], tref[1], version) in restored:
            tags[tref] = TagState(version, when, by)
            continue
        gone = (
            "retention deleted it"
            if (tref[0], tref[1], version) in deletions
            else "no record restores it"
        )
        notes.append(
            f"{tref[0]}/{tref[1]}: tag {tref[2]} last pointed at version {version}, but "
            f"{gone}: the tag is left out"
        )
    return tags


def doubtful(records: Iterable[VersionRecord], journal: Iterable[Entry]) -> list[VersionRecord]:
    """The records :func:`rebuild` asks ``objects_check_out`` about, sorted: those no
    other record or entry shows committed, at a number no shown-committed one holds.
    Usually one an artifact (its newest version), plus any commit that failed after its
    PUT."""
    asked: dict[VersionRef, VersionRecord] = {}

    def ask(record: VersionRecord) -> bool:
        asked[record.ref] = record
        return True

    rebuild(records, journal, ask)
    return [asked[ref] for ref in sorted(asked)]


# --- the dry run -------------------------------------------------------------------------


def _shown(value: Any) -> str:
    text = canonical(value).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def _same(name: str, a: Any, b: Any) -> bool:
    if name == "committed":  # float seconds both, to the microsecond
        return isinstance(a, int | float) and isinstance(b, int | float) and micros(a) == micros(b)
    return canonical(a) == canonical(b)  # 1 and 1.0, true and 1 differ


def diff(rebuilt: Index, current: Index) -> list[str]:
    """What a rebuild would change in etcd, a line each, sorted by artifact: versions in
    the buckets' records and not in etcd or the reverse, fields that differ (retention's
    mark ``deleting`` is etcd's own: not compared), ``latest`` and the sequence counter,
    tags. Empty: etcd holds what the buckets say."""
    lines: list[tuple[str, str, int, str, str]] = []

    def add(org: str, artifact: str, rank: int, name: str, text: str) -> None:
        lines.append((org, artifact, rank, name, f"{org}/{artifact}: {text}"))

    for ref in rebuilt.versions.keys() | current.versions.keys():
        org, artifact, v = ref
        new, old = rebuilt.versions.get(ref), current.versions.get(ref)
        if old is None:
            assert new is not None
            seq = new.get("seq")
            add(
                org,
                artifact,
                1,
                v,
                f"version {v} (sequence {seq}) is in the buckets' records, not in etcd",
            )
        elif new is None:
            add(org, artifact, 1, v, f"version {v} is in etcd, not in the buckets' records")
        else:
            differ = [
                f"{n} {_shown(old.get(n))} in etcd, {_shown(new.get(n))} rebuilt"
                for n in sorted((new.keys() | old.keys()) - {"deleting"})
                if not _same(n, old.get(n), new.get(n))
            ]
            if differ:
                add(org, artifact, 1, v, f"version {v} differs: {'; '.join(differ)}")
    for aref in rebuilt.artifacts.keys() | current.artifacts.keys():
        org, artifact = aref
        new_a, old_a = rebuilt.artifacts.get(aref), current.artifacts.get(aref)
        if old_a is None:
            assert new_a is not None
            add(
                org,
                artifact,
                0,
                "",
                f"no artifact record in etcd; rebuilt: latest "
                f"{new_a[0]}, sequence counter {new_a[1]}",
            )
        elif new_a is None:
            add(
                org,
                artifact,
                0,
                "",
                f"artifact record in etcd (latest {old_a[0]}, "
                f"sequence counter {old_a[1]}), none rebuilt",
            )
        else:
            if old_a[0] != new_a[0]:
                add(org, artifact, 0, "latest", f"latest is {old_a[0]} in etcd, {new_a[0]} rebuilt")
            if old_a[1] != new_a[1]:
                add(
                    org,
                    artifact,
                    0,
                    "seq",
                    f"sequence counter is {old_a[1]} in etcd, {new_a[1]} rebuilt",
                )
    for tref in rebuilt.tags.keys() | current.tags.keys():
        org, artifact, tag = tref
        new_t, old_t = rebuilt.tags.get(tref), current.tags.get(tref)
        if old_t is None:
            add(org, artifact, 2, tag, f"tag {tag} is rebuilt (at {new_t}), not in etcd")
        elif new_t is None:
            add(org, artifact, 2, tag, f"tag {tag} is in etcd (at {old_t}), not rebuilt")
        elif old_t != new_t:
            add(org, artifact, 2, tag, f"tag {tag} points at {old_t} in etcd, {new_t} rebuilt")
    return [line[4] for line in sorted(lines)]
