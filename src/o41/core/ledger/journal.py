"""The fallback's journal: tag moves and retention deletions as immutable objects whose
keys sort in time order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from o41.core.ledger.common import (
    JOURNAL,
    SCHEMA,
    LedgerRefused,
    _check_micros,
    _check_names,
    canonical,
    sha256,
)
from o41.core.ledger.records import (
    _built,
    _check_spelling,
    _Fields,
)
from o41.core.versions import VersionRefused, check_tag

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
