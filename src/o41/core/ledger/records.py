"""A version's record object and a directory's manifest object: their keys, bytes and
strict parse."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from o41.core.directories import (
    DirectoryRefused,
    FileEntry,
    check_manifest,
    dump_manifest,
    load_manifest,
)
from o41.core.ledger.common import (
    _MD5,
    _SHA256,
    _VERSION,
    SCHEMA,
    LedgerRefused,
    VersionRef,
    _check_micros,
    _check_names,
    canonical,
    manifest_key,
    record_key,
    sha256,
)
from o41.core.parts import crc32_bytes
from o41.core.versions import VersionRefused, check_tag

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
    by: str | None  # None: written from etcd for a version committed before records
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
        for name in ("location", "source", "rule"):
            if not getattr(self, name):
                raise LedgerRefused(f"{name} is empty")
        if self.by == "":
            raise LedgerRefused("by is empty")
        if self.tag is not None and self.by is None:
            raise LedgerRefused(f"tag {self.tag!r} moved by nobody: a tagging commit has a tenant")
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
        "previous": record.previous,
        "by": record.by,
        "tag": record.tag,
        "manifest_sha256": None if record.manifest is None else record.manifest.sha256,
        "manifest_size": None if record.manifest is None else record.manifest.size,
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
            by=f.maybe_text("by"),
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
