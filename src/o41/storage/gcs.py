"""Google Cloud Storage (kind ``gcs``).

Pods get V4 signed URLs made with the location's service-account key
(``credentials["serviceAccount.json"]``). With ambient identity (Workload Identity), URLs
are signed through the IAM signBlob API instead, which needs
``iam.serviceAccounts.signBlob`` on the operator's own service account.

An ``endpoint`` override is for emulators (the CRD says so). A plain ``http://`` endpoint is
called without a token, like the SDK does for ``STORAGE_EMULATOR_HOST``: an OAuth token must
never travel in clear text. Signed URLs then point at that endpoint.

Multipart: the parts are objects ``<key>.o41part-<upload id>-<n>`` uploaded in parallel with
signed PUTs; the service composes them into ``key`` (at most 32 sources per compose, so more
parts are composed in a tree) and then deletes those part objects, and only those: the
random upload id in their names keeps two uploads of one key apart and can't match a user's
object. That, and a version retention lets go (``delete``), are the only deletes o41 makes.

Every part object is uploaded with a **Custom-Time** (``x-goog-custom-time``, signed into
its URL; intermediate composites get one too), and no other object o41 writes has one: the
bucket's lifecycle rule ``Delete`` on ``daysSinceCustomTime`` (set by ``ensure``) removes
the parts of an upload no one finished, and only those. GCS's own
``AbortIncompleteMultipartUpload`` action is for XML API multipart uploads, which o41 does
not make; ``ensure`` sets it as well, for any such upload in the bucket.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import json
import re
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import requests
from google.api_core import exceptions as gex
from google.auth import exceptions as gauth
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from o41.storage.base import (
    GCS_OWNER_LABEL,
    NO_RECORD,
    OCTET_STREAM,
    Answer,
    BucketRef,
    Creations,
    Ensured,
    MultipartUpload,
    ObjectStat,
    Part,
    Reason,
    SetupFailed,
    SignedRequest,
    StorageError,
    UploadIncomplete,
    check_bucket_name,
    check_days,
    check_key,
    check_parts,
    expires_at,
    landing,
    name_taken,
    owner_mark,
    scrub,
    upload_id_of,
)

GOOGLE_ENDPOINT = "https://storage.googleapis.com"
_SCOPES = ["https://www.googleapis.com/auth/devstorage.full_control"]
# (connect, read) seconds, and retries bounded to a few seconds in all: an unreachable
# endpoint must become EndpointUnreachable quickly, not after the SDK's default 120 s.
_TIMEOUT = (2.0, 60.0)
_RETRY = DEFAULT_RETRY.with_delay(initial=0.25, maximum=1.0, multiplier=2.0).with_timeout(3.0)
_COMPOSE_MAX = 32  # GCS's limit of sources per compose request
_UPLOAD_ID = re.compile(r"[0-9a-f]{16}")
# Where the owner mark goes when the endpoint drops bucket labels (fake-gcs-server does;
# Google never does). Read only for buckets without the label.
MARKER_OBJECT = ".o41-location"


CUSTOM_TIME = "x-goog-custom-time"


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def abort_rules(days: int) -> list[dict[str, Any]]:
    """The bucket's lifecycle rules that drop unfinished uploads after ``days``: o41's
    part objects (the only objects with a Custom-Time), and XML API multipart uploads."""
    return [
        {"action": {"type": "Delete"}, "condition": {"daysSinceCustomTime": days}},
        {"action": {"type": "AbortIncompleteMultipartUpload"}, "condition": {"age": days}},
    ]


def _is_abort_rule(rule: Any) -> bool:
    action = (rule.get("action") or {}).get("type")
    condition = rule.get("condition") or {}
    if action == "AbortIncompleteMultipartUpload":
        return True
    return action == "Delete" and set(condition) == {"daysSinceCustomTime"}


def open_bucket(ref: BucketRef) -> GcsBucket:
    return GcsBucket(ref)


def part_name(key: str, upload_id: str, number: int) -> str:
    return f"{key}.o41part-{upload_id}-{number:05d}"


class GcsBucket:
    """One GCS bucket. The client is built on first use."""

    def __init__(self, ref: BucketRef) -> None:
        if ref.kind != "gcs":
            raise ValueError(f"not a GCS location: {ref.kind}")
        self.ref = ref

    # ----------------------------------------------------------------------- client

    @property
    def _emulator(self) -> bool:
        return bool(self.ref.endpoint and self.ref.endpoint.startswith("http://"))

    @functools.cached_property
    def _signer(self) -> Any:
        """Service-account credentials from the Secret, or None for ambient identity."""
        if self.ref.credentials is None:
            return None
        raw = self.ref.credentials.get("serviceAccount.json")
        if not raw:
            raise SetupFailed(
                Reason.BAD_CREDENTIALS,
                "the credentials Secret lacks serviceAccount.json (a service-account key file).",
                retryable=False,
            )
        from google.oauth2 import service_account

        try:
            info = json.loads(raw)
            return service_account.Credentials.from_service_account_info(info, scopes=_SCOPES)  # type: ignore[no-untyped-call]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SetupFailed(
                Reason.BAD_CREDENTIALS,
                "serviceAccount.json in the credentials Secret is not a service-account key "
                "file (JSON with type, client_email, private_key and token_uri). Create a key "
                "for the service account and store the file as it was downloaded.",
                retryable=False,
            ) from e

    @functools.cached_property
    def _client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials

        signer = self._signer
        project = self.ref.project or (signer.project_id if signer is not None else None)
        if self._emulator:
            api_credentials: Any = AnonymousCredentials()  # type: ignore[no-untyped-call]
        elif signer is not None:
            api_credentials = signer
        else:
            import google.auth

            try:
                api_credentials, found = google.auth.default(scopes=_SCOPES)
            except gauth.DefaultCredentialsError as e:
                raise SetupFailed(
                    Reason.BAD_CREDENTIALS,
                    "no GCS credentials: set spec.credentials (serviceAccount.json) or give "
                    "the operator an identity (Workload Identity).",
                    retryable=False,
                ) from e
            project = project or found
        options = {"api_endpoint": self.ref.endpoint} if self.ref.endpoint else None
        return storage.Client(project=project, credentials=api_credentials, client_options=options)

    @property
    def _access_endpoint(self) -> str:
        return (self.ref.endpoint or GOOGLE_ENDPOINT).rstrip("/")

    @property
    def _bucket(self) -> Any:
        return self._client.bucket(self.ref.bucket)

    # ------------------------------------------------------------------------ setup

    def ensure(
        self,
        owner: str,
        creations: Creations = NO_RECORD,
        *,
        abort_uploads_after_days: int | None = None,
    ) -> Ensured:
        """Create the bucket (labelled, uniform access, public access prevention) in the
        region, or adopt ours; then check its location.

        ``abort_uploads_after_days``: the lifecycle rules of ``abort_rules`` (a ``Delete``
        of objects whose Custom-Time is that many days old: part objects only, module
        docstring; and ``AbortIncompleteMultipartUpload`` for XML API uploads), the
        bucket's other rules kept; None leaves its rules as they are. An endpoint that
        keeps no lifecycle rules (fake-gcs-server) earns a warning."""
        check_bucket_name("gcs", self.ref.bucket)
        check_days(abort_uploads_after_days)
        mark = owner_mark(owner)
        warnings: list[str] = []
        bucket, created = self._get_or_create(owner, mark, creations)
        if not created:
            created = self._check_owner(bucket, owner, mark, creations)
        if created and (bucket.labels or {}).get(GCS_OWNER_LABEL) != mark:
            # The endpoint dropped the labels we sent (fake-gcs-server has no labels;
            # Google keeps them, atomically with creation). Keep the mark in an object.
            self._write_marker(mark)
            warnings.append(
                f"{self._access_endpoint} does not keep bucket labels: the owner mark "
                f"is kept in object {MARKER_OBJECT} instead"
            )
        self._check_region(bucket)
        warnings += self._harden(bucket)
        if abort_uploads_after_days is not None:
            warnings += self._abort_rules(bucket, abort_uploads_after_days)
        return Ensured(
            bucket=self.ref.bucket,
            endpoint=self._access_endpoint,
            created=created,
            region_checked=True,
            warnings=tuple(warnings),
        )

    def check(self) -> None:
        with self._failing("checking"):
            self._client.get_bucket(self.ref.bucket, timeout=_TIMEOUT, retry=_RETRY)

    def _get_or_create(self, owner: str, mark: str, creations: Creations) -> tuple[Any, bool]:
        name = self.ref.bucket
        with self._failing("looking up", unless=(gex.NotFound, gex.Forbidden)) as answer:
            found = self._client.get_bucket(name, timeout=_TIMEOUT, retry=_RETRY)
        if answer.error is None:
            return found, False
        # Forbidden: someone else's bucket, or we may not read ours: create tells
        forbidden = isinstance(answer.error, gex.Forbidden)

        creations.record(name)
        new = self._client.bucket(name)
        new.labels = {GCS_OWNER_LABEL: mark}
        new.iam_configuration.uniform_bucket_level_access_enabled = True
        new.iam_configuration.public_access_prevention = "enforced"
        with self._failing("creating", unless=(gex.Conflict, ValueError)) as answer:
            # No retry: a create retried after a lost answer would conflict with itself.
            created = self._client.create_bucket(new, location=self.ref.region, timeout=_TIMEOUT)
        e = answer.error
        if e is None:
            return created, True
        if isinstance(e, ValueError):  # the SDK: "Client project not set"
            raise SetupFailed(
                Reason.BACKEND_ERROR,
                "no Google Cloud project to create the bucket in: set spec.backend.gcs.project "
                "or use a key file that names its project_id.",
                retryable=False,
            ) from e
        taken = name_taken("gcs", name, owner, None, elsewhere="another Google Cloud project")
        if forbidden:
            raise taken from e
        # A conflict: created meanwhile, maybe by our own earlier attempt.
        with self._failing("looking up", unless=(gex.Forbidden,)) as again:
            found = self._client.get_bucket(name, timeout=_TIMEOUT, retry=_RETRY)
        if again.error is None:
            return found, False
        raise taken from e

    def _check_owner(self, bucket: Any, owner: str, mark: str, creations: Creations) -> bool:
        """Pass for a bucket marked as ours; True when it is our own unmarked creation
        (a setup interrupted before writing the marker), which the caller marks."""
        found = (bucket.labels or {}).get(GCS_OWNER_LABEL)
        if found is None:
            found = self._read_marker()
        if found == mark:
            return False
        if found is None and creations.recorded(self.ref.bucket):
            return True
        raise name_taken("gcs", self.ref.bucket, owner, found)

    def _write_marker(self, mark: str) -> None:
        with self._failing("marking"):
            self._bucket.blob(MARKER_OBJECT).upload_from_string(
                mark.encode(), content_type="text/plain", timeout=_TIMEOUT, retry=_RETRY
            )

    def _read_marker(self) -> str | None:
        """The fallback owner mark, or None (absent, unreadable, or not one of ours)."""
        unreadable = (gex.NotFound, gex.Forbidden)
        with self._failing("reading the owner mark of", unless=unreadable) as answer:
            raw = self._bucket.blob(MARKER_OBJECT).download_as_bytes(
                end=127, timeout=_TIMEOUT, retry=_RETRY
            )
        if answer.error is not None:
            return None
        try:
            return bytes(raw).decode().strip() or None
        except UnicodeDecodeError:
            return None

    def _check_region(self, bucket: Any) -> None:
        """GCS answers regions upper-case (US-CENTRAL1); the spec uses lower case."""
        actual = str(bucket.location or "")
        if actual.lower() != self.ref.region.lower():
            raise SetupFailed(
                Reason.REGION_MISMATCH,
                f"GCS bucket {self.ref.bucket!r} is in {actual or 'an unknown location'}, but "
                f"the location declares {self.ref.region}. Set spec.bucket to another name, or "
                "declare the bucket's location in a new Location.",
                retryable=False,
            )

    def _harden(self, bucket: Any) -> list[str]:
        """Uniform bucket-level access and enforced public access prevention, also on an
        adopted bucket. Google applies a patch or refuses it (then we raise). An endpoint
        that accepts it and keeps nothing (fake-gcs-server) earns a warning instead."""
        iam = bucket.iam_configuration
        if iam.uniform_bucket_level_access_enabled and iam.public_access_prevention == "enforced":
            return []
        iam.uniform_bucket_level_access_enabled = True
        iam.public_access_prevention = "enforced"
        with self._failing("blocking public access to"):
            bucket.patch(timeout=_TIMEOUT, retry=_RETRY)
        iam = bucket.iam_configuration
        if iam.uniform_bucket_level_access_enabled and iam.public_access_prevention == "enforced":
            return []
        return [
            f"{self._access_endpoint} ignored uniform bucket-level access and public access "
            "prevention: check the bucket is private"
        ]

    def _abort_rules(self, bucket: Any, days: int) -> list[str]:
        """Keep ``abort_rules(days)`` among the bucket's lifecycle rules (others kept as
        they are); a patch only when they differ."""
        ours = abort_rules(days)
        rules = [dict(r) for r in bucket.lifecycle_rules]
        if [r for r in rules if _is_abort_rule(r)] == ours:
            return []
        bucket.lifecycle_rules = [r for r in rules if not _is_abort_rule(r)] + ours
        with self._failing("setting the lifecycle rules that drop unfinished uploads of"):
            bucket.patch(timeout=_TIMEOUT, retry=_RETRY)
        if [dict(r) for r in bucket.lifecycle_rules if _is_abort_rule(r)] == ours:
            return []
        return [
            f"{self._access_endpoint} keeps no lifecycle rules: the parts of uploads left "
            "unfinished are removed by the placement service only"
        ]

    # -------------------------------------------------------------------- transfers

    def presign_put(self, key: str, *, expires: int, size: int | None = None) -> SignedRequest:
        """A V4 signed PUT. Content-Type is signed; with ``size`` the signed header
        ``x-goog-content-length-range`` makes GCS refuse any other size."""
        check_key(key)
        at = expires_at(expires)
        headers = {"Content-Type": OCTET_STREAM}
        extra: dict[str, str] = {}
        if size is not None:
            if size < 0:
                raise ValueError("size must be >= 0")
            extra["x-goog-content-length-range"] = f"{size},{size}"
        url = self._sign(key, "PUT", expires, content_type=OCTET_STREAM, headers=extra)
        return SignedRequest("PUT", url, headers | extra, at)

    def presign_get(self, key: str, *, expires: int) -> SignedRequest:
        check_key(key)
        at = expires_at(expires)
        return SignedRequest("GET", self._sign(key, "GET", expires), {}, at)

    def start_multipart(
        self, key: str, *, parts: int, expires: int, crc32: Sequence[str] | None = None
    ) -> MultipartUpload:
        """Signed PUTs of the part objects; nothing is created until the pod uploads."""
        check_key(key)
        check_parts(parts)
        at = expires_at(expires)
        upload_id = secrets.token_hex(8)
        requests_ = tuple(
            self._part_request(key, upload_id, n, expires, at) for n in range(1, parts + 1)
        )
        return MultipartUpload(key=key, upload_id=upload_id, parts=requests_)

    def _part_request(
        self, key: str, upload_id: str, n: int, expires: int, at: dt.datetime
    ) -> SignedRequest:
        """A part object's signed PUT, with its Custom-Time: what the lifecycle rule of
        ``ensure`` tells part objects by."""
        marked = {CUSTOM_TIME: _now_rfc3339()}
        url = self._sign(
            part_name(key, upload_id, n), "PUT", expires, content_type=OCTET_STREAM, headers=marked
        )
        return SignedRequest("PUT", url, {"Content-Type": OCTET_STREAM, **marked}, at)

    def presign_parts(
        self,
        key: str,
        upload: MultipartUpload | str,
        numbers: Sequence[int],
        *,
        expires: int,
        crc32: Sequence[str] | None = None,
    ) -> tuple[SignedRequest, ...]:
        check_key(key)
        upload_id = self._upload_id(upload)
        for n in numbers:
            check_parts(n)
        at = expires_at(expires)
        return tuple(self._part_request(key, upload_id, n, expires, at) for n in numbers)

    def list_parts(self, key: str, upload: MultipartUpload | str) -> list[Part]:
        """The upload's part objects (``<key>.o41part-<id>-<n>``); their ETag is the
        MD5 of the part in hex, quoted, as the XML API's PUT answers it."""
        check_key(key)
        prefix = part_name(key, self._upload_id(upload), 0)[:-5]
        with self._failing("listing the parts in", cls=StorageError):
            blobs = list(
                self._client.list_blobs(self._bucket, prefix=prefix, timeout=_TIMEOUT, retry=_RETRY)
            )
        found = []
        for b in blobs:
            tail = b.name[len(prefix) :]
            if len(tail) == 5 and tail.isdigit():  # not an intermediate composite
                md5 = base64.b64decode(b.md5_hash).hex() if b.md5_hash else None
                found.append(Part(int(tail), int(b.size), f'"{md5}"' if md5 else None))
        return sorted(found, key=lambda p: p.number)

    def complete_multipart(
        self,
        key: str,
        upload: MultipartUpload | str,
        etags: Sequence[str],
        crc32: Sequence[str] | None = None,
    ) -> None:
        """Compose the parts into ``key``, then delete the parts (and any intermediate
        composites). Every part is checked to exist first, in one listing, so a missing
        part is ``UploadIncomplete`` whatever the endpoint answers to a bad compose."""
        check_key(key)
        upload_id = self._upload_id(upload)
        if not etags:
            raise UploadIncomplete("no parts were reported for the upload")
        bucket = self._bucket
        prefix = part_name(key, upload_id, 0)[:-5]
        names = [part_name(key, upload_id, n) for n in range(1, len(etags) + 1)]
        with self._failing("listing the parts in", cls=StorageError):
            present = {
                b.name
                for b in self._client.list_blobs(
                    bucket, prefix=prefix, timeout=_TIMEOUT, retry=_RETRY
                )
            }
        missing = [n for n, name in enumerate(names, start=1) if name not in present]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise UploadIncomplete(
                f"parts {shown} of {key!r} were not uploaded; upload them, then complete again"
            )

        temporary: list[str] = []
        sources = [bucket.blob(name) for name in names]
        level = 0
        with self._failing("composing an upload in", cls=StorageError):
            while len(sources) > _COMPOSE_MAX:
                composed = []
                for i in range(0, len(sources), _COMPOSE_MAX):
                    tmp = bucket.blob(f"{prefix}c{level}-{i // _COMPOSE_MAX:05d}")
                    tmp.content_type = OCTET_STREAM
                    tmp.custom_time = dt.datetime.now(dt.UTC)  # the lifecycle rule's mark
                    tmp.compose(sources[i : i + _COMPOSE_MAX], timeout=_TIMEOUT, retry=_RETRY)
                    temporary.append(tmp.name)
                    composed.append(tmp)
                sources, level = composed, level + 1
            dest = bucket.blob(key)
            dest.content_type = OCTET_STREAM
            # Composing the same sources again gives the same bytes: safe to retry.
            dest.compose(sources, timeout=_TIMEOUT, retry=_RETRY)
        self._delete_parts(names + temporary)

    def abort_multipart(self, key: str, upload: MultipartUpload | str) -> None:
        """Delete this upload's part objects: those under its own random prefix only."""
        check_key(key)
        prefix = part_name(key, self._upload_id(upload), 0)[:-5]
        with self._failing("listing the parts in", cls=StorageError):
            names = [
                b.name
                for b in self._client.list_blobs(
                    self._bucket, prefix=prefix, timeout=_TIMEOUT, retry=_RETRY
                )
            ]
        self._delete_parts(names)

    def _delete_parts(self, names: list[str]) -> None:
        bucket = self._bucket
        for name in names:
            assert ".o41part-" in name  # the one kind of object o41 deletes
            gone = (gex.NotFound,)  # deleted already
            with self._failing("deleting a part in", cls=StorageError, unless=gone):
                bucket.blob(name).delete(timeout=_TIMEOUT, retry=_RETRY)

    def delete(self, key: str) -> None:
        """Delete the object; one already gone (404) is done. Idempotent."""
        check_key(key)
        with self._failing("deleting an object of", cls=StorageError, unless=(gex.NotFound,)):
            self._bucket.blob(key).delete(timeout=_TIMEOUT, retry=_RETRY)

    def put(self, key: str, data: bytes) -> None:
        """One multipart upload whose metadata carries the bytes' md5Hash, which GCS checks
        (``checksum="md5"``; the SDK's default would send a CRC32C instead)."""
        check_key(key)
        with self._failing("writing an object to", cls=StorageError):
            self._bucket.blob(key).upload_from_string(
                data, content_type=OCTET_STREAM, checksum="md5", timeout=_TIMEOUT, retry=_RETRY
            )

    def get(self, key: str) -> bytes | None:
        check_key(key)
        absent = (gex.NotFound,)
        with self._failing("reading an object of", cls=StorageError, unless=absent) as answer:
            data: bytes = self._bucket.blob(key).download_as_bytes(timeout=_TIMEOUT, retry=_RETRY)
        return None if answer.error is not None else data

    def upload(self, key: str, path: Path) -> None:
        """The SDK's managed upload: resumable, in chunks, above 8 MiB; the SDK checks the
        whole object's checksum against the one GCS computed."""
        check_key(key)
        with self._failing("uploading a file to", cls=StorageError):
            self._bucket.blob(key).upload_from_filename(
                str(path), content_type=OCTET_STREAM, timeout=_TIMEOUT, retry=_RETRY
            )

    def download(self, key: str, path: Path) -> bool:
        check_key(key)
        absent = (gex.NotFound,)
        with landing(path) as temporary:
            doing = "downloading an object of"
            with self._failing(doing, cls=StorageError, unless=absent) as answer:
                self._bucket.blob(key).download_to_filename(
                    str(temporary), timeout=_TIMEOUT, retry=_RETRY
                )
            if answer.error is not None:
                return False
            temporary.replace(path)
        return True

    def stat(self, key: str) -> ObjectStat | None:
        check_key(key)
        with self._failing("reading an object of", cls=StorageError):
            blob = self._bucket.get_blob(key, timeout=_TIMEOUT, retry=_RETRY)
        if blob is None:
            return None
        md5 = base64.b64decode(blob.md5_hash).hex() if blob.md5_hash else None
        return ObjectStat(size=int(blob.size), etag=blob.etag, md5=md5, crc32c=blob.crc32c)

    def list_under(self, prefix: str) -> dict[str, ObjectStat]:
        check_key(prefix)
        found: dict[str, ObjectStat] = {}
        with self._failing("listing the objects of", cls=StorageError):
            for blob in self._client.list_blobs(
                self.ref.bucket, prefix=prefix, timeout=_TIMEOUT, retry=_RETRY
            ):
                md5 = base64.b64decode(blob.md5_hash).hex() if blob.md5_hash else None
                found[blob.name] = ObjectStat(
                    size=int(blob.size), etag=blob.etag, md5=md5, crc32c=blob.crc32c
                )
        return found

    def _upload_id(self, upload: MultipartUpload | str) -> str:
        upload_id = upload_id_of(upload)
        if not _UPLOAD_ID.fullmatch(upload_id):
            raise UploadIncomplete(f"{upload_id!r} is not an upload id of this backend")
        return upload_id

    def _sign(
        self,
        name: str,
        method: str,
        expires: int,
        *,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> str:
        """A V4 signed URL for ``name`` on this bucket's endpoint. Local RSA signing with
        a key file; with ambient identity, one IAM signBlob call per URL."""
        blob = self._bucket.blob(name)
        with self._failing("signing a URL for", cls=StorageError):
            url: str = blob.generate_signed_url(
                version="v4",
                method=method,
                expiration=dt.timedelta(seconds=expires),
                content_type=content_type,
                headers=dict(headers) if headers else None,  # the SDK adds Host to it
                api_access_endpoint=self._access_endpoint,
                **self._signing(),
            )
        return url

    def _signing(self) -> dict[str, Any]:
        if self._signer is not None:
            return {"credentials": self._signer}
        if self._emulator:
            raise StorageError(
                Reason.BAD_CREDENTIALS,
                "signing URLs needs serviceAccount.json in the credentials Secret when the "
                "endpoint is an emulator (no ambient identity there).",
                retryable=False,
            )
        import google.auth.transport.requests

        credentials = self._client._credentials
        if not credentials.valid:
            credentials.refresh(google.auth.transport.requests.Request())
        return {
            "service_account_email": credentials.service_account_email,
            "access_token": credentials.token,
        }

    # ------------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _failing(
        self,
        doing: str,
        *,
        cls: type[StorageError] = SetupFailed,
        unless: tuple[type[Exception], ...] = (),
    ) -> Iterator[Answer[Exception]]:
        """Any error of the block as the project's ``cls`` (``_raise``), except one of the
        ``unless`` types: that one is left in the yielded ``Answer`` for the caller."""
        answer: Answer[Exception] = Answer()
        try:
            yield answer
        except unless as e:
            answer.error = e
        except Exception as e:
            self._raise(e, doing, cls=cls)

    def _raise(
        self, e: Exception, doing: str, *, cls: type[StorageError] = SetupFailed
    ) -> NoReturn:
        if isinstance(e, StorageError):
            raise e
        if isinstance(e, gex.RetryError) and isinstance(e.cause, Exception):
            e = e.cause  # the retries ran out: what failed last is what matters
        reason, retryable, advice = _classify(e, self.ref)
        what = f"{doing} GCS bucket {self.ref.bucket!r} at {self._access_endpoint} failed"
        message = scrub(f"{what}: {_describe(e)}. {advice}", self.ref.secrets())
        raise cls(reason, message, retryable=retryable) from e


def _describe(e: Exception) -> str:
    if isinstance(e, gex.GoogleAPICallError):
        text = " ".join(str(e.message or "").split())[:200]
        return f"HTTP {e.code} {text}".strip()
    return type(e).__name__


def _classify(e: Exception, ref: BucketRef) -> tuple[Reason, bool, str]:
    if isinstance(e, gex.Unauthorized | gauth.RefreshError):
        return (
            Reason.BAD_CREDENTIALS,
            False,
            "Fix serviceAccount.json in the Secret (a current key of an existing account).",
        )
    if isinstance(e, gex.Forbidden):
        return (
            Reason.ACCESS_DENIED,
            False,
            "Grant the service account roles/storage.admin on the bucket (or the project, "
            "to create it).",
        )
    if isinstance(e, gex.NotFound):
        return (
            Reason.BUCKET_MISSING,
            False,
            f"The bucket {ref.bucket!r} does not exist; o41 never deletes buckets: find out "
            "who did, then retire this location.",
        )
    if isinstance(e, gex.GoogleAPICallError):
        code = int(e.code or 0)
        if code >= 500 or code == 429:
            return Reason.BACKEND_ERROR, True, "The service had a transient problem; retrying."
        return Reason.BACKEND_ERROR, False, "See the message in the GCS documentation."
    if isinstance(e, gauth.TransportError | requests.exceptions.ConnectionError):
        return (
            Reason.ENDPOINT_UNREACHABLE,
            True,
            "Check the endpoint URL and that the network lets the operator reach it.",
        )
    if isinstance(e, requests.exceptions.RequestException):
        return Reason.BACKEND_ERROR, True, "The connection failed mid-request; retrying."
    return Reason.BACKEND_ERROR, False, "Unexpected error."
