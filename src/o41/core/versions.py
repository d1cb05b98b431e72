"""The rules of an artifact's versions, tags and metadata, as plain functions of data.

- A **reference** names a version three ways: its id (``0193a1b2c3d4-9f8e7d6c5b4a3f2e``),
  ``latest`` (the newest committed version) or a **tag** (``best``, ``production``).
- A version's **metadata** is a small JSON object given at write time (``step``, ``epoch``,
  ``metrics``): at most :data:`MAX_METADATA_KEYS` keys matching :data:`METADATA_KEY`, at
  most :data:`MAX_METADATA_BYTES` bytes as compact JSON.
- The **index** of an artifact's versions sorts newest first: each version's key starts
  with its inverted commit sequence number (1, 2, ... per artifact), so a page is a range
  read with a limit over a window of :data:`WINDOW` numbers, however many versions there
  are (etcd counts every key of a range: the window bounds that too).
- A listing's **cursor** is the last key it showed, encoded; a cursor is accepted only
  for the listing it came from (:func:`cursor_key` checks it against the caller's prefix).

Refusals are :class:`VersionRefused` (HTTP 400) with a message that names the limit.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

VERSION_PATTERN = r"^[0-9a-f]{12}-[0-9a-f]{16}$"
TAG_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,62}$"
METADATA_KEY = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
MAX_METADATA_KEYS = 64
MAX_METADATA_BYTES = 8 * 1024
LATEST = "latest"
MAX_PAGE = 1000
DEFAULT_PAGE = 100

_VERSION = re.compile(VERSION_PATTERN)
_TAG = re.compile(TAG_PATTERN)
_KEY = re.compile(METADATA_KEY)
_INDEX = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{12}-[0-9a-f]{16}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")  # an artifact's name
_EVER = (1 << 64) - 1
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_STRICT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

RefKind = Literal["version", "latest", "tag"]


class VersionRefused(ValueError):
    """A reference, tag, metadata or cursor that cannot be served as sent; the message
    names the rule and the fix."""


def is_version(text: str) -> bool:
    return _VERSION.fullmatch(text) is not None


def check_tag(tag: str) -> str:
    """``tag`` if it can name a tag: its pattern and length, and neither ``latest`` nor
    a version id (a reference must mean one thing)."""
    if tag == LATEST:
        raise VersionRefused(
            "'latest' always names the newest committed version; it cannot be a tag: "
            "choose another name"
        )
    if is_version(tag):
        raise VersionRefused(f"tag {tag[:80]!r} looks like a version id: choose another name")
    if _TAG.fullmatch(tag) is None:
        raise VersionRefused(
            f"tag {tag[:80]!r} is not a tag name: 1 to 63 characters, a letter first, then "
            "letters, digits, '.', '_' or '-'"
        )
    return tag


def ref_kind(ref: str) -> RefKind:
    """What ``ref`` names; a reference that is none of the three is refused."""
    if is_version(ref):
        return "version"
    if ref == LATEST:
        return "latest"
    try:
        check_tag(ref)
    except VersionRefused:
        raise VersionRefused(
            f"{ref[:80]!r} is not a version: give a version id "
            "(like 0193a1b2c3d4-9f8e7d6c5b4a3f2e), 'latest' or a tag name"
        ) from None
    return "tag"


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The metadata as stored, or a refusal naming the limit it broke."""
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_KEYS:
        raise VersionRefused(
            f"metadata has {len(metadata)} keys; at most {MAX_METADATA_KEYS} are kept: "
            "put the rest in the artifact itself"
        )
    for key in metadata:
        if _KEY.fullmatch(key) is None:
            raise VersionRefused(
                f"metadata key {key[:80]!r} is not allowed: 1 to 64 characters, a letter or "
                "'_' first, then letters, digits, '_', '.' or '-'"
            )
    try:
        size = len(_STRICT(dict(metadata)).encode())
    except ValueError:  # NaN, Infinity, an integer past 4300 digits, a lone surrogate
        raise VersionRefused(
            "metadata must be plain JSON: finite numbers (no NaN or Infinity), integers of "
            "at most 4300 digits, text without lone surrogates"
        ) from None
    if size > MAX_METADATA_BYTES:
        raise VersionRefused(
            f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} bytes are kept: "
            "put large values (a config, a report) in the artifact itself"
        )
    return dict(metadata)


# --- the index: newest first -------------------------------------------------------------

#: A read of the index spans at most this many commit sequence numbers (etcd counts every
#: key of a range, whatever its limit: a window keeps a page's cost off the artifact's size).
WINDOW = 2048


def index_suffix(seq: int, version: str) -> str:
    """The part of a version's index key after its artifact's prefix: the inverted commit
    sequence number (1, 2, ... per artifact; newest sorts first), then the version id."""
    return f"{_EVER - seq:016x}-{version}"


def suffix_position(suffix: str) -> int:
    """The inverted sequence number at the start of an index suffix."""
    return int(suffix[:16], 16)


def newest_position(count: int) -> int:
    """Where the index of an artifact with ``count`` commits starts."""
    return _EVER - count


def window_end(position: int) -> str | None:
    """The first suffix past the window that starts at ``position``; None when the window
    reaches past the oldest version (sequence 1)."""
    end = position + WINDOW
    return None if end >= _EVER else f"{end:016x}"


def page_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_PAGE
    if not 1 <= limit <= MAX_PAGE:
        raise VersionRefused(f"limit must be between 1 and {MAX_PAGE}; {limit} is not")
    return limit


def encode_cursor(listing: str, last: str) -> str:
    """The cursor after ``last`` (the suffix of the last key shown) of ``listing`` (what
    was listed: ``versions/ORG/ARTIFACT`` or ``artifacts/ORG``)."""
    raw = _COMPACT({"of": listing, "after": last}).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def cursor_key(listing: str, cursor: str, what: Literal["versions", "artifacts"]) -> str:
    """The suffix a cursor of ``listing`` continues after; a cursor of another listing
    (another artifact or organization) or a damaged one is refused."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        of, after = data["of"], data["after"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise VersionRefused(
            "the cursor is damaged: pass the 'next' of the previous page as it was, or "
            "leave it out to start from the first page"
        ) from None
    if not isinstance(of, str) or not isinstance(after, str) or of != listing:
        raise VersionRefused(
            "the cursor belongs to another listing: pass the 'next' of this listing's "
            "previous page, or leave it out to start from the first page"
        )
    pattern = _INDEX if what == "versions" else _NAME
    if pattern.fullmatch(after) is None:
        raise VersionRefused("the cursor is damaged: leave it out to start from the first page")
    return after
