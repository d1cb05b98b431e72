"""What the write path answers: each answer's one description. The views build these
(plain dicts at runtime, their keys checked by mypy) and ``o41.webhook.openapi`` makes the
document's schemas of them; a field added here is in both."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from typing_extensions import TypedDict

from o41.core.placement import Rule
from o41.core.places import Locality
from o41.webhook.buckets import Signed

UploadsLast = Annotated[int, Field(description="Seconds the upload URLs last.")]


class PlacedOut(TypedDict):
    """Where a new version goes, as every begin (a file's, a directory's) answers it."""

    version: str
    location: str
    cloud: str
    region: str
    rule: Rule
    warning: Annotated[
        str | None,
        Field(description="Set when the fallback took the write: the client logs it."),
    ]


class Multipart(TypedDict):
    partSize: int
    parts: list[Signed]


class Upload(TypedDict, total=False):
    """Exactly one of ``single`` (one PUT) or ``multipart`` (one PUT per part)."""

    single: Signed
    multipart: Multipart


class BeginOut(PlacedOut):
    upload: Upload
    expiresIn: UploadsLast


class PresentPart(TypedDict):
    number: int
    size: int
    etag: Annotated[str | None, Field(description="As the part's PUT answered it; null on Azure.")]
    crc32: Annotated[
        str | None, Field(description="The part's CRC32 where the bucket checked one.")
    ]


class ProgressOut(TypedDict):
    """A pending write and the parts its bucket holds: a resume sends only the others."""

    version: str
    organization: str
    artifact: str
    location: str
    rule: str
    size: int | None
    multipart: bool
    partSize: int | None
    parts: Annotated[int, Field(description="How many parts the write has in all.")]
    crc32: Annotated[
        list[str] | None,
        Field(
            description="Each part's CRC32 as its writer recorded it at begin (null: none "
            "sent); a resume refuses a file whose parts differ."
        ),
    ]
    present: list[PresentPart]
    expiresIn: Annotated[int, Field(description="Seconds left to commit it.")]


class SignedPart(Signed):
    number: int


class PartsOut(TypedDict):
    version: str
    parts: list[SignedPart]
    expiresIn: UploadsLast


class CommitOut(TypedDict):
    version: str
    location: str
    size: int
    md5: str | None
    tag: Annotated[str | None, Field(description="The tag moved to this version, if any.")]


class Located(TypedDict):
    """What every read answer says of the version it read and where it lives."""

    version: str
    location: str
    cloud: str
    region: str
    locality: Locality
    size: Annotated[
        int, Field(description="Bytes: of the version (a directory's: of all its files).")
    ]
    md5: str | None
    requested: Annotated[
        str, Field(description="The reference asked for: an id, 'latest' or a tag.")
    ]
    tag: Annotated[str | None, Field(description="The tag it resolved, when it was one.")]
    committed: Annotated[float, Field(description="Seconds since the epoch.")]
    metadata: dict[str, Any]


class Parts(TypedDict, total=False):
    """A multipart version's parts, when its writer sent their CRC32s."""

    partSize: Annotated[
        int,
        Field(description="A multipart version's part size, when its parts' CRC32s are recorded."),
    ]
    crc32: Annotated[
        list[str],
        Field(
            description="Each part's CRC32 (base64, big-endian) as written: a reader checks "
            "every part it downloads whole. Absent for single-PUT versions (use md5)."
        ),
    ]


class ReadOut(Located, Parts):
    """A version of one file, and its download."""

    download: Signed


class DirectoryReadOut(Located):
    """A directory version: read its files (the files route)."""

    download: None
    files: Annotated[int, Field(description="How many files it has.")]
