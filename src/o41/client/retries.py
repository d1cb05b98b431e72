"""What a write does again when a bucket breaks, and against which location: a broken
bucket costs money, not the run.

A write (a file's or a directory's) begins again, at once and at most MAX_BEGINS times,
with every location that failed excluded: one the service names in a 503 (its bucket
could not sign) and one whose bucket did not take the bytes (:class:`UploadFailed`). The
service then places it by its rules among the others. Nothing waits between begins: the
next location is another bucket, not the same one later. A write whose pod died is
resumed by its version: the parts its bucket holds and that match the file are kept
(:func:`kept_parts`), only the others are sent. Not retried here: the commit, and reads
(the caller reads again); a kept-alive connection the server closed while idle is opened
again by the transfer itself (``o41.client.transfers.Pool``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from o41.client.errors import ArtifactError, ServiceError, UploadFailed
from o41.client.transfers import Source

log = logging.getLogger("o41")

MAX_BEGINS = 6  # each failed location is excluded; the list is short

T = TypeVar("T")


def failed_location(e: ServiceError) -> str | None:
    """The location a 503 names as unable to take the write now (its bucket failed), so
    the write moves on without it; None for any other refusal."""
    location = e.body.get("location") if e.status == 503 else None
    return location if isinstance(location, str) and location else None


def begin_elsewhere(
    begin: Callable[[list[str]], Mapping[str, Any]],
    upload: Callable[[Mapping[str, Any]], T],
) -> tuple[Mapping[str, Any], T]:
    """Begin a write (``begin``: the locations to exclude, the service's answer) and
    ``upload`` what it answered; when a location fails, begin again without it. Returns
    the begin that took the bytes and what ``upload`` returned; the commit is the
    caller's."""
    exclude: list[str] = []
    for _ in range(MAX_BEGINS):
        try:
            began = begin(exclude)
        except ServiceError as e:
            failed = failed_location(e)
            if failed is None or failed in exclude:
                raise
            log.warning("%s; beginning again without location %s", e, failed)
            exclude.append(failed)  # its bucket could not sign: the next one may
            continue
        if began.get("warning"):
            log.warning("%s", began["warning"])
        try:
            return began, upload(began)
        except UploadFailed as e:
            log.warning("%s; beginning again without location %s", e, began["location"])
            exclude.append(began["location"])
            continue
    raise ArtifactError(f"gave up after {MAX_BEGINS} locations failed: {', '.join(exclude)}")


def other_file(
    version: str, size: int, part_size: int, mine: Sequence[str], recorded: Sequence[str]
) -> str | None:
    """Why the file a resume was given is not the one write ``version`` began with (its
    parts' CRC32s, ``mine``, differ from those the write recorded at begin), or None:
    the refusal comes before a byte is sent, and the write stays pending."""
    for n, (have, had) in enumerate(zip(mine, recorded, strict=False), start=1):
        if have != had:
            first = (n - 1) * part_size
            last = min(first + part_size, size) - 1
            return (
                f"write {version} began with another file: part {n} of {len(recorded)} (bytes "
                f"{first}-{last}) has CRC32 {have} in this file, but the write recorded {had} "
                "at its begin. Nothing was sent and the write stays pending: resume with the "
                "file it began with, or write this one again without resume"
            )
    if len(mine) != len(recorded):
        return (
            f"write {version} recorded {len(recorded)} parts at its begin, but this file has "
            f"{len(mine)}: resume with the file it began with, or write this one again "
            "without resume"
        )
    return None


def part_matches(
    source: Source,
    offset: int,
    length: int,
    held: Mapping[str, Any],
    crc32: str | None = None,
) -> bool:
    """Whether a part the bucket holds is this slice of the file: its size, and its CRC32
    (``crc32``: the slice's, when known already) or, failing that, its ETag when the ETag
    is an MD5 (S3 without KMS, GCS)."""
    if held.get("size") != length:
        return False
    if held.get("crc32"):
        return bool((crc32 or source.crc32(offset, length)) == held["crc32"])
    etag = str(held.get("etag") or "").strip('"').lower()
    if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
        return source.md5(offset, length) == etag
    return True  # Azure keeps no checksum of a block: its size is all there is


def kept_parts(
    source: Source,
    size: int,
    part_size: int,
    present: list[Mapping[str, Any]],
    crc32: Sequence[str] | None = None,
) -> dict[int, str]:
    """What a resume keeps of the parts its bucket holds (``present``, as the service
    lists them): those that are this file's, by number, with their ETags. ``crc32``: the
    file's parts' CRC32s, when computed already."""
    kept: dict[int, str] = {}
    for held in present:
        n = held["number"]
        offset = (n - 1) * part_size
        known = crc32[n - 1] if crc32 is not None and n <= len(crc32) else None
        if part_matches(source, offset, min(part_size, size - offset), held, known):
            kept[n] = str(held.get("etag") or "")
    return kept
