"""What every backend shares: the bucket reference, results, errors and names.

No cloud SDK is imported here, so the operator's admission webhook and the placement core
can validate names and handle errors without loading boto3, google or azure.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import re
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar, get_args

Kind = Literal["s3", "gcs", "azure_blob", "s3_compatible"]
KINDS: tuple[Kind, ...] = get_args(Kind)

OCTET_STREAM = "application/octet-stream"
CRC32_HEADER = "x-amz-checksum-crc32"  # a part's CRC32, signed into its S3 URL
# Both S3 (SigV4) and GCS (V4) refuse signed URLs valid for longer than 7 days.
MAX_EXPIRES = 7 * 24 * 3600
# S3's limit on parts; GCS and Azure allow at least as many.
MAX_PARTS = 10_000
# Keys leave room for the GCS part suffix (".o41part-<16 hex>-<5 digits>") under the
# clouds' 1024-byte limit.
MAX_KEY_BYTES = 960

# The owner marks, one per backend, each in the syntax that backend allows.
S3_OWNER_TAG = "o41.io/location"
GCS_OWNER_LABEL = "o41-location"
AZURE_OWNER_METADATA = "o41location"  # metadata names must be C# identifiers: no dot or dash

# The ID of the one lifecycle rule o41 keeps in a bucket: it aborts multipart uploads left
# unfinished (docs/storage.md, "Abandoned uploads"). Every other rule is the user's and stays.
ABORT_RULE_ID = "o41-abort-incomplete-uploads"


class Reason(StrEnum):
    """Why setup or an operation failed: CamelCase, as a Kubernetes condition reason."""

    BAD_CREDENTIALS = "BadCredentials"
    NAME_TAKEN = "NameTaken"
    INVALID_BUCKET_NAME = "InvalidBucketName"
    REGION_MISMATCH = "RegionMismatch"
    ENDPOINT_UNREACHABLE = "EndpointUnreachable"
    ACCESS_DENIED = "AccessDenied"
    BUCKET_MISSING = "BucketMissing"
    BACKEND_ERROR = "BackendError"
    UPLOAD_INCOMPLETE = "UploadIncomplete"


class StorageError(Exception):
    """A bucket operation failed. ``reason`` is CamelCase; ``retryable`` says whether the
    same call may succeed later without anyone changing the spec, the Secret or IAM.

    The message says what went wrong and what to do about it, and never carries a
    credential: backends build it from error codes and their own words, then scrub it.
    """

    def __init__(self, reason: Reason | str, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.reason = str(reason)
        self.message = message
        self.retryable = retryable

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.reason!r}, {self.message!r}, retryable={self.retryable})"
        )


class SetupFailed(StorageError):
    """Raised by ``ensure`` and ``check``: the location cannot become (or stay) Ready."""


class UploadIncomplete(StorageError):
    """``complete_multipart`` found parts missing or wrong: the client's fault, not the
    bucket's, so the placement service must not exclude the location for it."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.UPLOAD_INCOMPLETE, message, retryable=False)


E = TypeVar("E", bound=Exception)


class Answer(Generic[E]):
    """What a backend's ``_failing`` block yields: the SDK error its caller said it handles
    itself (a lookup's 404, a create's "already yours"), left in ``error`` instead of
    becoming a ``StorageError``; None when the call succeeded."""

    def __init__(self) -> None:
        self.error: E | None = None


@dataclass(frozen=True)
class BucketRef:
    """Everything needed to talk to one location's bucket.

    ``credentials`` is the decoded Secret data (keys per backend as documented on
    ``o41.kube.api.SecretRef``); ``None`` means the process's ambient identity. It is kept out of
    ``repr`` so a logged ref never leaks a key.
    """

    kind: Kind
    bucket: str
    region: str
    endpoint: str | None = None  # None: the cloud's public endpoint
    credentials: Mapping[str, str] | None = field(default=None, repr=False, hash=False)
    project: str | None = None  # gcs
    account_url: str | None = None  # azure_blob
    signing_region: str | None = None  # s3_compatible
    addressing_style: str = "path"  # s3_compatible (and s3 with an endpoint override)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown backend kind {self.kind!r}; expected one of {KINDS}")
        if self.addressing_style not in ("path", "virtual"):
            raise ValueError(
                f"addressing_style must be path or virtual, not {self.addressing_style!r}"
            )

    def secrets(self) -> list[str]:
        """The credential values, for scrubbing messages."""
        return [v for v in (self.credentials or {}).values() if isinstance(v, str) and v]


@dataclass(frozen=True)
class Ensured:
    """Result of ``ensure``. ``region_checked`` is False where the backend cannot tell the
    bucket's region (Azure data plane, S3-compatible endpoints whose region is a tag).
    ``warnings`` are hardening steps the endpoint does not support, for an Event."""

    bucket: str
    endpoint: str
    created: bool
    region_checked: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class SignedRequest:
    """One request a pod makes with a plain HTTP client: no credentials, only this."""

    method: str
    url: str
    headers: Mapping[str, str]
    expires_at: dt.datetime


@dataclass(frozen=True)
class MultipartUpload:
    """A large write: one signed request per part, all uploadable in parallel.

    Part ``n`` (1-based) is ``parts[n - 1]``. ``upload_id`` is all the service needs to
    finish it later (with the part count), so it can live in the placement state.
    """

    key: str
    upload_id: str
    parts: tuple[SignedRequest, ...]


@dataclass(frozen=True)
class Part:
    """A part of an unfinished multipart upload that the bucket holds: its number
    (1-based), size and ETag (as the part's PUT answered it; None where the backend keeps
    none for a part, as Azure's blocks), and its CRC32 (base64) where the bucket checked
    one (S3 with part checksums)."""

    number: int
    size: int
    etag: str | None = None
    crc32: str | None = None


@dataclass(frozen=True)
class ObjectStat:
    """What the bucket says about an object. Checksums are given where the backend keeps
    them for this object: ``md5`` as hex, ``crc32c`` base64 (big-endian), as GCS shows it;
    ``crc32`` as S3 shows it (``<base64>-<parts>`` for a multipart object)."""

    size: int
    etag: str | None = None
    md5: str | None = None
    crc32c: str | None = None
    crc32: str | None = None


class Creations(Protocol):
    """A write-ahead record of bucket creations, kept outside the buckets (the operator
    keeps it in its record of the Location, never in status: docs/operator.md).

    Where the owner mark is a second call after creating (S3-compatible stores, endpoints
    that drop labels), a crash in between leaves an unmarked bucket. ``ensure`` records a
    creation after it found no bucket and before it creates one; a bucket found unmarked
    is adopted (and marked) only when its creation was recorded, so no one else's unmarked
    bucket is ever taken.
    """

    def recorded(self, bucket: str) -> bool: ...

    def record(self, bucket: str) -> None: ...


class NoRecord:
    """No record kept (tests, scripts): nothing is recorded, so an unmarked bucket is
    never adopted."""

    def recorded(self, bucket: str) -> bool:
        return False

    def record(self, bucket: str) -> None:
        pass


NO_RECORD = NoRecord()


class Bucket(Protocol):
    """One location's bucket. Synchronous (the SDKs are); callers run it in threads."""

    ref: BucketRef

    def ensure(
        self,
        owner: str,
        creations: Creations = NO_RECORD,
        *,
        abort_uploads_after_days: int | None = None,
    ) -> Ensured:
        """Create the bucket in ``ref.region`` if needed and mark it as ``owner``'s; adopt
        it when it already carries that mark, or when it carries none and ``creations``
        says an earlier attempt was creating it. Idempotent.

        ``abort_uploads_after_days``: keep the bucket's rule that drops multipart uploads
        left unfinished that many days (S3: a lifecycle rule of ID ``ABORT_RULE_ID``, the
        bucket's other rules kept); None leaves the bucket's rules as they are. A store
        that takes no such rule is a warning."""
        ...

    def check(self) -> None:
        """Raise ``SetupFailed`` if the bucket is gone, unreachable or forbidden."""
        ...

    def presign_put(self, key: str, *, expires: int, size: int | None = None) -> SignedRequest:
        """A single-request upload of ``key``."""
        ...

    def start_multipart(
        self, key: str, *, parts: int, expires: int, crc32: Sequence[str] | None = None
    ) -> MultipartUpload:
        """Start a multipart upload of ``key`` with ``parts`` parts. ``crc32``: each
        part's CRC32 (base64), for backends that check them per part (S3); the others
        take no CRC32 per part and ignore them."""
        ...

    def complete_multipart(
        self,
        key: str,
        upload: MultipartUpload | str,
        etags: Sequence[str],
        crc32: Sequence[str] | None = None,
    ) -> None:
        """Assemble the parts into ``key``. ``etags`` holds one entry per part, in order:
        the ETag header each part's PUT answered (S3 needs them; GCS and Azure use the count).
        ``crc32``: the checksums given to ``start_multipart``, if any."""
        ...

    def abort_multipart(self, key: str, upload: MultipartUpload | str) -> None:
        """Drop an unfinished upload's parts (only those; never an object of the user's)."""
        ...

    def list_parts(self, key: str, upload: MultipartUpload | str) -> list[Part]:
        """The parts of an unfinished upload the bucket holds now, by number."""
        ...

    def presign_parts(
        self,
        key: str,
        upload: MultipartUpload | str,
        numbers: Sequence[int],
        *,
        expires: int,
        crc32: Sequence[str] | None = None,
    ) -> tuple[SignedRequest, ...]:
        """Fresh upload requests for parts ``numbers`` (1-based) of an upload begun by
        ``start_multipart``, the same as it signed: a long write re-signs the parts it
        has still to send. ``crc32``: every part's, as given to ``start_multipart``."""
        ...

    def presign_get(self, key: str, *, expires: int) -> SignedRequest:
        """A download of ``key``."""
        ...

    def stat(self, key: str) -> ObjectStat | None:
        """Size and checksums of ``key``, or None when there is no such object."""
        ...

    def list_under(self, prefix: str) -> dict[str, ObjectStat]:
        """Every object whose key starts with ``prefix``, by key: its size and the
        checksums a listing shows (fewer than :meth:`stat` may: S3's listing cannot tell
        an MD5 ETag from an SSE-KMS one, so its ``md5`` is only a hint)."""
        ...

    def delete(self, key: str) -> None:
        """Delete the object ``key`` (a version retention lets go). Idempotent: a key with
        no object is not an error."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` as the object ``key`` in one request (small objects: records,
        manifests, journal entries; up to 5 MiB), the store checking its MD5 (S3
        Content-MD5, GCS md5Hash, Azure Content-MD5); an existing object is replaced."""
        ...

    def get(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None when there is no such object."""
        ...

    def upload(self, key: str, path: Path) -> None:
        """Write the file at ``path`` as ``key``, in parts when it is large (the SDK's
        managed transfer: boto3 upload_file, GCS upload_from_filename, Azure upload_blob
        with max_concurrency): etcd snapshots."""
        ...

    def download(self, key: str, path: Path) -> bool:
        """Write ``key``'s bytes to ``path``; False when there is no such object. ``path``
        gets the whole object or is left as it was, never part of one."""
        ...


# ------------------------------------------------------------------------------- helpers


def expires_at(expires: int) -> dt.datetime:
    """Check an expiry in seconds and turn it into a UTC time."""
    if not 1 <= expires <= MAX_EXPIRES:
        raise ValueError(f"expires must be 1..{MAX_EXPIRES} seconds, got {expires}")
    return dt.datetime.fromtimestamp(time.time() + expires, dt.UTC)  # now() + timedelta: 2x


def check_key(key: str) -> None:
    """Refuse keys no backend would store the same way: empty or too long."""
    if not key or len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"object keys must be 1..{MAX_KEY_BYTES} bytes of UTF-8")


@contextlib.contextmanager
def landing(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` for a download to land in, removed at the end: the
    caller moves it onto ``path`` once complete, so a failed or absent download leaves
    ``path`` as it was (no partial snapshot for a restore to pick up)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.o41-download")
    try:
        yield temporary
    finally:
        temporary.unlink(missing_ok=True)


def check_days(days: int | None) -> None:
    if days is not None and not 1 <= days <= 3650:
        raise ValueError(f"abort_uploads_after_days must be 1..3650 or None, got {days}")


def check_parts(parts: int) -> None:
    if not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"parts must be 1..{MAX_PARTS}, got {parts}")


def upload_id_of(upload: MultipartUpload | str) -> str:
    return upload.upload_id if isinstance(upload, MultipartUpload) else upload


def scrub(text: str, secrets: Sequence[str]) -> str:
    """Replace any credential value (and any line of a multi-line one, such as a PEM key)
    that an SDK echoed into ``text``. A last line of defence: messages are built from codes."""
    pieces = {s for s in secrets if len(s) >= 6}
    for secret in list(pieces):
        pieces.update(line.strip() for line in secret.splitlines() if len(line.strip()) >= 6)
    for piece in sorted(pieces, key=len, reverse=True):
        text = text.replace(piece, "***")
    return text


_OWNER_OK = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def owner_mark(owner: str) -> str:
    """The owner string as stored in the bucket's mark.

    GCS label values are the strictest of the three (<= 63 characters of ``[a-z0-9_-]``), so
    every backend stores this same form: the owner itself when it fits, otherwise a readable
    prefix plus a hash of the whole, which is stable and still tells owners apart.
    """
    if not owner:
        raise ValueError("owner must not be empty")
    if _OWNER_OK.fullmatch(owner):
        return owner
    slug = re.sub(r"[^a-z0-9_-]+", "-", owner.lower()).strip("-_")[:46]
    digest = hashlib.sha256(owner.encode()).hexdigest()[:16]
    return f"{slug}-{digest}" if slug else f"o{digest}"


def name_taken(
    kind: str, bucket: str, owner: str, found: str | None, *, elsewhere: str | None = None
) -> SetupFailed:
    """The one message for a bucket that exists and is not ours (``found``: the owner mark
    it carries, if any; ``elsewhere``: who else holds the name), with the ways out."""
    if found or elsewhere:
        why = f"it belongs to {elsewhere}" if elsewhere else f"it is marked for {found!r}"
        way_out = "Set spec.bucket to another name."
    else:
        why = "it carries no o41 owner mark"
        way_out = (
            "Set spec.bucket to another name. If o41 created it in an interrupted setup, "
            f"mark it to adopt it: {_mark_hint(kind, owner)}."
        )
    return SetupFailed(
        Reason.NAME_TAKEN,
        f"{kind} bucket {bucket!r} already exists and is not this location's: {why}. {way_out}",
        retryable=False,
    )


def _mark_hint(kind: str, owner: str) -> str:
    mark = owner_mark(owner)
    if kind == "gcs":
        return f"label {GCS_OWNER_LABEL}={mark}"
    if kind == "azure_blob":
        return f"container metadata {AZURE_OWNER_METADATA}={mark}"
    return f"bucket tag {S3_OWNER_TAG}={mark}"


# --------------------------------------------------------------------------------- names

# GCS refuses "google" and "close misspellings" anywhere in a name, and "goog" as a prefix.
_GOOGLISH = re.compile(r"g[o0]+g[l1][e3]?")
_NAME_UID_HEX = 16  # 64 bits of the uid's hash: collisions need ~4e9 locations
_PREFIX = "o41-"


def bucket_name(kind: Kind, location_name: str, location_uid: str) -> str:
    """The generated bucket (or container) name of a location.

    ``o41-<readable part of the name>-<16 hex of sha256(uid)>``: valid for every backend
    (the strictest rules of S3, GCS and Azure containers at once), stable for the same
    inputs so a retried setup finds its own bucket, and unique through the uid, which
    Kubernetes never reuses. ``kind`` is checked but does not change the name, so a name
    reads the same across clouds.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown backend kind {kind!r}")
    if not location_uid:
        raise ValueError("location_uid must not be empty")
    digest = hashlib.sha256(location_uid.encode()).hexdigest()[:_NAME_UID_HEX]
    room = 63 - len(_PREFIX) - 1 - _NAME_UID_HEX
    stem = _slug(location_name)[:room].strip("-")
    name = f"{_PREFIX}{stem}-{digest}" if stem else f"{_PREFIX}{digest}"
    problem = bucket_name_problem(kind, name)
    assert problem is None, problem  # by construction
    return name


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower())
    while True:  # removing one misspelling of "google" can join the halves of another
        cleaned = _GOOGLISH.sub("-", slug)
        if cleaned == slug:
            break
        slug = cleaned
    return re.sub(r"-{2,}", "-", slug).strip("-")


_S3_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_GCS_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
_AZURE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_S3_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_name_problem(kind: Kind, name: str) -> str | None:
    """Why ``name`` is not a valid bucket (or container) name for ``kind``; None if it is.

    For the admission webhook (a user-given spec.bucket) and for ``ensure``, so a bad name
    fails before any call with a message that says which rule it breaks.
    """
    if not 3 <= len(name) <= 63:
        return "must be 3 to 63 characters long"
    if kind == "azure_blob":
        if not _AZURE_NAME.fullmatch(name):
            return (
                "Azure container names use lowercase letters, digits and single hyphens, "
                "and start and end with a letter or digit"
            )
        return None
    pattern = _GCS_NAME if kind == "gcs" else _S3_NAME
    if not pattern.fullmatch(name):
        allowed = (
            "letters, digits, dots, hyphens and underscores"
            if kind == "gcs"
            else ("letters, digits, dots and hyphens")
        )
        return f"must use lowercase {allowed}, and start and end with a letter or digit"
    if ".." in name or ".-" in name or "-." in name:
        return "must not have a dot next to a dot or a hyphen"
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        pass
    else:
        return "must not look like an IP address"
    if kind == "gcs":
        if name.startswith("goog") or _GOOGLISH.search(name):
            return 'must not start with "goog" or contain "google" or a misspelling of it'
        return None
    if name.startswith(_S3_BAD_PREFIXES) or name.endswith(_S3_BAD_SUFFIXES):
        return "uses a prefix or suffix that S3 reserves"
    return None


def check_bucket_name(kind: Kind, name: str) -> None:
    """``bucket_name_problem`` as a ``SetupFailed``."""
    problem = bucket_name_problem(kind, name)
    if problem is not None:
        raise SetupFailed(
            Reason.INVALID_BUCKET_NAME,
            f"bucket name {name!r} is not valid for {kind}: it {problem}. Set spec.bucket "
            "to a valid name, or leave it empty to get a generated one.",
            retryable=False,
        )
