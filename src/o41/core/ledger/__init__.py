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

from o41.core.ledger.common import (
    ARTIFACT_PATTERN,
    JOURNAL,
    MANIFESTS,
    MAX_MICROS,
    ORGANIZATION_PATTERN,
    RECORDS,
    RESERVED,
    SCHEMA,
    ArtifactRef,
    LedgerRefused,
    TagRef,
    VersionRef,
    canonical,
    manifest_key,
    micros,
    record_key,
    sha256,
)
from o41.core.ledger.journal import (
    Deletion,
    Entry,
    TagMove,
    entry_bytes,
    entry_json,
    entry_key,
    parse_entry,
)
from o41.core.ledger.rebuild import (
    ArtifactState,
    Index,
    Rebuilt,
    SetAside,
    TagState,
    diff,
    doubtful,
    rebuild,
)
from o41.core.ledger.records import (
    ManifestRef,
    VersionRecord,
    manifest_object,
    parse_manifest,
    parse_record,
    version_fields,
)

__all__ = [
    "ARTIFACT_PATTERN",
    "JOURNAL",
    "MANIFESTS",
    "MAX_MICROS",
    "ORGANIZATION_PATTERN",
    "RECORDS",
    "RESERVED",
    "SCHEMA",
    "ArtifactRef",
    "ArtifactState",
    "Deletion",
    "Entry",
    "Index",
    "LedgerRefused",
    "ManifestRef",
    "Rebuilt",
    "SetAside",
    "TagMove",
    "TagRef",
    "TagState",
    "VersionRecord",
    "VersionRef",
    "canonical",
    "diff",
    "doubtful",
    "entry_bytes",
    "entry_json",
    "entry_key",
    "manifest_key",
    "manifest_object",
    "micros",
    "parse_entry",
    "parse_manifest",
    "parse_record",
    "rebuild",
    "record_key",
    "sha256",
    "version_fields",
]
