"""What every part of the ledger shares: its reserved prefix, canonical bytes, names."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from o41.core.versions import VERSION_PATTERN

RESERVED = ".o41/"
RECORDS = RESERVED + "versions/"
MANIFESTS = RESERVED + "manifests/"
JOURNAL = RESERVED + "journal/"
SCHEMA = 1  # bumped by any change to the fields: a reader refuses versions it does not know
MAX_MICROS = 2**53  # integers a JSON reader with doubles reads exactly

# As o41.kube.api.NAME_PATTERN (an Organization's name) and o41.webhook.cluster.scope's
# ARTIFACT_PATTERN: the core imports neither, and tests/core/test_core_ledger.py checks both.
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
