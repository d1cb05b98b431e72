"""The rules of one write, as plain functions of data: which locations take it, how it is
uploaded (one PUT or parts of which size), whether its commit is accepted, and the place
it came from. The service (``o41.webhook.writes``) calls these and does the I/O.

Refusals are exceptions whose message says what the user can do: :class:`WriteRefused`
is the caller's mistake (HTTP 400), :class:`CommitRefused` a state the caller can fix by
uploading again (HTTP 409).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from o41.core.organization import LocationFacts
from o41.core.parts import (
    PART_SIZE,
    composite_crc32,
    composite_matches,
    crc32_bytes,
    part_count,
    part_size_for,
    part_size_problem,
)
from o41.core.places import Place, Source


class WriteRefused(ValueError):
    """The request cannot be served as sent; the message names the field and the fix."""


class CommitRefused(Exception):
    """The bucket does not (yet) hold what begin declared; upload again, then commit."""


# --- which locations take writes ------------------------------------------------------


def takes_writes(location: LocationFacts, exclude: Collection[str] = ()) -> bool:
    """May take this new version: Ready, not retired, not unfinished, not excluded."""
    return location.writable and location.name not in exclude


def writable(
    locations: Iterable[LocationFacts], exclude: Collection[str] = ()
) -> dict[str, LocationFacts]:
    """The locations that take writes, by name, in their given order."""
    return {loc.name: loc for loc in locations if takes_writes(loc, exclude)}


def writable_places(locations: Iterable[LocationFacts]) -> set[tuple[str, str]]:
    """The (cloud, region) pairs where a location takes writes now."""
    return {(loc.cloud, loc.region) for loc in locations if loc.writable}


# --- the place a write or read comes from ------------------------------------------------


def normal_place(cloud: str | None, region: str | None, source: Source) -> Place:
    """The place as the rules read it: a region without a cloud says nothing (the same
    region name exists in several clouds), so it is dropped."""
    return Place(cloud, region if cloud else None, source)


# --- the upload plan -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UploadPlan:
    """How a version goes up: ``parts`` parts of ``part_size`` bytes (the last may be
    shorter), or one PUT when ``multipart`` is false (then ``parts`` is 1)."""

    multipart: bool
    parts: int = 1
    part_size: int | None = None


SINGLE = UploadPlan(multipart=False)


def upload_plan(
    size: int | None, part_size: int | None = None, crc32: Sequence[str] | None = None
) -> UploadPlan:
    """A single PUT or parts. The client may choose the part size (it must, to send each
    part's CRC32); the limits are S3's. Raises :class:`WriteRefused`."""
    if part_size is None:
        if crc32 is not None:
            raise WriteRefused("crc32 needs partSize: the CRC32 of each part of partSize bytes")
        if size is None or size <= PART_SIZE:
            return SINGLE
        part_size = part_size_for(size)
    else:
        if size is None:
            raise WriteRefused("partSize needs size: declare the file's size in bytes")
        if why := part_size_problem(size, part_size):
            raise WriteRefused(why)
    parts = part_count(size, part_size)
    if crc32 is not None:
        if len(crc32) != parts:
            raise WriteRefused(
                f"crc32 has {len(crc32)} checksums, but {size} bytes in parts of {part_size} "
                f"are {parts} parts: send one per part, in order"
            )
        for n, checksum in enumerate(crc32, start=1):
            if crc32_bytes(checksum) is None:
                raise WriteRefused(
                    f"crc32 of part {n} is {checksum[:20]!r}, not a CRC32: four big-endian "
                    "bytes in base64, like 'AAAAAA=='"
                )
    return UploadPlan(multipart=True, parts=parts, part_size=part_size)


def etags_problem(parts: int, etags: Sequence[str]) -> str | None:
    """Why the ETags sent to commit a multipart write cannot finish it, or None."""
    if len(etags) != parts:
        return (
            f"this multipart write has {parts} parts: send the ETag header of each part's "
            f"PUT answer, in order, as etags ({len(etags)} given)"
        )
    return None


# --- whether a commit is accepted ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Declared:
    """What begin (and commit) declared of the version."""

    size: int | None = None
    md5: str | None = None
    crc32: Sequence[str] | None = None  # each part's, for a multipart write


@dataclass(frozen=True, slots=True)
class Held:
    """What the bucket says it holds for the version's key."""

    size: int
    md5: str | None = None
    crc32: str | None = None  # S3's, ``<base64>-<parts>`` for a multipart object


def check_commit(version: str, declared: Declared, held: Held | None) -> Held:
    """The bucket's object when it is what was declared; :class:`CommitRefused` saying
    what differs otherwise. A checksum the bucket does not report is not compared."""
    if held is None:
        raise CommitRefused(
            f"the object for {version!r} is not in the bucket: upload it with the request "
            "from begin, then commit"
        )
    if declared.size is not None and held.size != declared.size:
        raise CommitRefused(
            f"the bucket holds {held.size} bytes for {version!r}, but begin declared "
            f"{declared.size}: upload the whole file again, then commit"
        )
    if declared.crc32 and held.crc32 and not composite_matches(held.crc32, declared.crc32):
        raise CommitRefused(
            f"the bucket's copy of {version!r} has CRC32 {held.crc32}, not "
            f"{composite_crc32(declared.crc32)} from the parts' checksums: a part was damaged "
            "on the way; upload it again, then commit"
        )
    if declared.md5 and held.md5 and held.md5 != declared.md5:
        raise CommitRefused(
            f"the bucket's copy of {version!r} has MD5 {held.md5}, not the uploaded "
            f"{declared.md5}: it was damaged on the way; upload it again, then commit"
        )
    return held


@dataclass(frozen=True, slots=True)
class HeldPart:
    """A part of an unfinished upload as the bucket lists it: its size and, where the
    bucket keeps one (S3), its CRC32."""

    number: int
    size: int
    crc32: str | None = None


def check_parts(
    version: str, size: int, part_size: int, recorded: Sequence[str], held: Iterable[HeldPart]
) -> None:
    """Refuse (:class:`CommitRefused`) before the parts are assembled when one the bucket
    holds is not the bytes its writer recorded at begin: another size than the cut
    gives, or a CRC32 (where the bucket shows one) other than the recorded one. Nothing
    is committed, the write stays pending and its parts stay, so a resume with the file
    it began with still works. Missing parts are the assembly's to refuse."""
    parts = len(recorded)
    for part in held:
        n = part.number
        if not 1 <= n <= parts:
            continue
        offset = (n - 1) * part_size
        expected = min(part_size, size - offset)
        if part.size != expected:
            raise CommitRefused(
                f"part {n} of {parts} of write {version!r} is {part.size} bytes in the bucket, "
                f"but the write's part {n} is {expected} bytes (bytes {offset}-"
                f"{offset + expected - 1}): nothing was committed and the write stays pending; "
                "resume it with the file it began with, or write the file again without resume"
            )
        if part.crc32 and part.crc32 != recorded[n - 1]:
            raise CommitRefused(
                f"part {n} of {parts} of write {version!r} (bytes {offset}-"
                f"{offset + expected - 1}) has CRC32 {part.crc32} in the bucket, but its writer "
                f"recorded {recorded[n - 1]} at begin: these are another file's bytes (a resume "
                "with another file of the same size?). Nothing was committed and the write "
                "stays pending: resume it with the file it began with, or write the new file "
                "again without resume"
            )


# --- how a URL is signed -----------------------------------------------------------------


def signs_locally(kind: str, credentials: Collection[str] | None) -> bool:
    """Whether a bucket of ``kind`` with a Secret holding ``credentials`` (its keys)
    signs URLs without a network call. Keys in the Secret sign locally (S3's access key,
    GCS's serviceAccount.json, Azure's account key); ambient identity may not: GCS signs
    each URL through IAM signBlob, S3 refreshes its role's credentials from the metadata
    service."""
    if credentials is None:
        return False
    if kind == "gcs":
        return "serviceAccount.json" in credentials
    return True
