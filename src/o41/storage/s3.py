"""Amazon S3 (kind ``s3``) and S3-compatible endpoints (kind ``s3_compatible``).

On AWS the client talks to the bucket's regional endpoint with SigV4 for ``ref.region``, so
presigned URLs work in every region (including opt-in ones, where only regional endpoints
and SigV4 are accepted). An S3-compatible endpoint is taken as given: its region is a tag
of the location, requests are signed for ``signing_region`` (or the region), and the
endpoint decides where the bucket lives, so ``ensure`` cannot check the region there.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import botocore.handlers
import botocore.session
from botocore import exceptions as bex
from botocore.config import Config

from o41.storage import sigv4
from o41.storage.base import (
    ABORT_RULE_ID,
    CRC32_HEADER,
    NO_RECORD,
    OCTET_STREAM,
    S3_OWNER_TAG,
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

# Fail fast when the endpoint is down: the operator reports EndpointUnreachable in seconds
# and retries later, instead of blocking a worker thread for minutes. max_attempts counts
# the first attempt ("standard" mode), so this is one retry.
_CONFIG = Config(
    signature_version="s3v4",
    connect_timeout=2,
    read_timeout=60,
    retries={"max_attempts": 2, "mode": "standard"},
    # botocore >= 1.36 adds CRC checksums to uploads by default; presigned URLs would then
    # need them and several S3-compatible stores reject them. Checksums only when required.
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
)
_PUBLIC_ACCESS_BLOCK = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}
_SSE_S3 = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}

_BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "InvalidSecurity",
    "InvalidClientTokenId",
}
_DENIED = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "Forbidden", "403"}
_MISSING = {"NoSuchBucket", "404", "NotFound"}
_WRONG_REGION = {
    "AuthorizationHeaderMalformed",  # signed for a region the endpoint isn't in
    "PermanentRedirect",
    "301",
    "IllegalLocationConstraintException",
    "InvalidLocationConstraint",
}
_TRANSIENT = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException", "OperationAborted"}
_EXISTS = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}
_BAD_UPLOAD = {"InvalidPart", "InvalidPartOrder", "EntityTooSmall", "NoSuchUpload"}
# What an S3-compatible store answers for an S3 feature it lacks (R2, MinIO for some calls).
_NOT_IMPLEMENTED = {"NotImplemented", "501"}


_session_lock = threading.Lock()


@functools.cache
def _session() -> Any:
    """One botocore session for the process: it parses S3's service model once (building a
    session per bucket cost ~1 MB and tens of ms each, which 200 Locations multiply)."""
    return botocore.session.get_session()


@functools.lru_cache(maxsize=256)
def _client_for(
    region: str,
    endpoint: str | None,
    style: str,
    access_key: str | None,
    secret_key: str | None,
    token: str | None,
) -> Any:
    """A client per (region, endpoint, credentials); clients are thread-safe, sessions not."""
    config = _CONFIG.merge(
        Config(s3={"addressing_style": style, "us_east_1_regional_endpoint": "regional"})
    )
    with _session_lock:
        client = _session().create_client(
            "s3",
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            aws_session_token=token,
            config=config,
        )
    if endpoint is not None:
        client.meta.events.register("before-call.s3", _no_region_redirect)
    # no "Expect: 100-continue" (botocore adds it to every body): the service PUTs small
    # objects (records, manifests), where it only adds a round trip, and a store that
    # closes a kept-alive connection after its "100 Continue" fails each retry of the PUT
    # (tests/storage/test_storage_transfers.py's relay does: the record PUT failed 6 times in 6)
    client.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
    return client


def _no_region_redirect(context: dict[str, Any], **_: Any) -> None:
    """botocore answers "wrong signing region" by signing again for the region the error
    names, and succeeds. On AWS that only follows a bucket to its region (the region check
    then reports it); on one fixed endpoint it hides that the endpoint wants another
    signing region, while the URLs signed for pods (for ``signing_region``) all fail
    there. So a client of an endpoint override takes the error as it is: RegionMismatch."""
    context.setdefault("s3_redirect", {})["redirected"] = True


def open_bucket(ref: BucketRef) -> S3Bucket:
    return S3Bucket(ref)


class S3Bucket:
    """One S3 bucket. The boto3 client is built on first use and is thread-safe."""

    def __init__(self, ref: BucketRef) -> None:
        if ref.kind not in ("s3", "s3_compatible"):
            raise ValueError(f"not an S3 location: {ref.kind}")
        if ref.kind == "s3_compatible" and not ref.endpoint:
            raise ValueError("an s3_compatible location needs an endpoint")
        self.ref = ref

    # ----------------------------------------------------------------------- client

    @property
    def signing_region(self) -> str:
        if self.ref.kind == "s3_compatible":
            return self.ref.signing_region or self.ref.region
        return self.ref.region

    @functools.cached_property
    def _client(self) -> Any:
        ref = self.ref
        keys: dict[str, str | None] = {}
        if ref.credentials is not None:
            missing = [k for k in ("accessKeyId", "secretAccessKey") if not ref.credentials.get(k)]
            if missing:
                raise SetupFailed(
                    Reason.BAD_CREDENTIALS,
                    f"the credentials Secret lacks {', '.join(missing)}: an S3 Secret needs "
                    "accessKeyId and secretAccessKey (sessionToken is optional).",
                    retryable=False,
                )
            keys = {
                "aws_access_key_id": ref.credentials["accessKeyId"],
                "aws_secret_access_key": ref.credentials["secretAccessKey"],
                "aws_session_token": ref.credentials.get("sessionToken") or None,
            }
        if ref.kind == "s3" and ref.endpoint is None:
            # AWS: virtual-hosted style, the recommended one; dotted names break its TLS
            # certificate, so they stay on path style.
            style = "path" if "." in ref.bucket else "virtual"
        else:
            style = ref.addressing_style
        try:
            return _client_for(
                self.signing_region,
                ref.endpoint,
                style,
                keys.get("aws_access_key_id"),
                keys.get("aws_secret_access_key"),
                keys.get("aws_session_token"),
            )
        except ValueError as e:  # botocore: "Invalid endpoint: ..."
            raise SetupFailed(
                Reason.ENDPOINT_UNREACHABLE,
                f"S3 endpoint {ref.endpoint!r} is not a usable URL; fix spec.backend.",
                retryable=False,
            ) from e

    @property
    def _where(self) -> str:
        return self.ref.endpoint or f"AWS S3 {self.ref.region}"

    # ------------------------------------------------------------------------ setup

    def ensure(
        self,
        owner: str,
        creations: Creations = NO_RECORD,
        *,
        abort_uploads_after_days: int | None = None,
    ) -> Ensured:
        """Create the bucket or adopt ours; then check its region, harden it and keep its
        rule that aborts unfinished uploads."""
        ref = self.ref
        check_bucket_name(ref.kind, ref.bucket)
        check_days(abort_uploads_after_days)
        mark = owner_mark(owner)
        present = self._head_bucket()
        created = False
        if present is not True:
            creations.record(ref.bucket)
            created = self._create(owner, mark, head_forbidden=present is None)
        if created:
            self._ensure_tag(mark)
        else:
            created = self._check_owner(owner, mark, creations)
        region_checked = self._check_region()
        warnings = self._harden(created)
        if abort_uploads_after_days is not None:
            warnings += self._abort_rule(abort_uploads_after_days)
        return Ensured(
            bucket=ref.bucket,
            endpoint=str(self._client.meta.endpoint_url),
            created=created,
            region_checked=region_checked,
            warnings=warnings,
        )

    def check(self) -> None:
        with self._failing("checking", missing=_gone(self.ref)):
            self._head()

    def _head(self) -> None:
        """HeadBucket. Its error answers have no body, so a 400 carries no error code (a
        request signed for a region the endpoint does not serve answers that): then the
        same question is asked once more as a ListObjectsV2 of no keys, whose error says."""
        try:
            self._client.head_bucket(Bucket=self.ref.bucket)
        except bex.ClientError as e:
            if _status(e) != 400 or _code(e) not in ("", "400", "BadRequest"):
                raise
            self._client.list_objects_v2(Bucket=self.ref.bucket, MaxKeys=0)
            raise  # the second question passed: the first answer stands

    def _head_bucket(self) -> bool | None:
        """True: exists and readable; False: no such bucket; None: exists, not readable
        (someone else's, or our credentials may not read it: create_bucket tells which)."""
        with self._failing("looking up", unless=_statuses(403, 404)) as answer:
            self._head()
        if answer.error is None:
            return True
        return False if _status(answer.error) == 404 else None

    def _create(self, owner: str, mark: str, *, head_forbidden: bool) -> bool:
        """Create the bucket; False if it turned out to exist already in our account."""
        ref = self.ref
        params: dict[str, Any] = {"Bucket": ref.bucket}
        if ref.kind == "s3":
            config: dict[str, Any] = {"Tags": [{"Key": S3_OWNER_TAG, "Value": mark}]}
            # Tags at creation close the window in which a crash leaves an unmarked bucket.
            if ref.region != "us-east-1":  # AWS refuses us-east-1 as a LocationConstraint
                config["LocationConstraint"] = ref.region
            params["CreateBucketConfiguration"] = config

        def answered(e: bex.ClientError) -> bool:
            code = _code(e)
            return code in _EXISTS or (head_forbidden and code in _DENIED)

        with self._failing("creating", unless=answered) as answer:
            self._client.create_bucket(**params)
        e = answer.error
        if e is None:
            return True
        if _code(e) == "BucketAlreadyOwnedByYou":
            return False
        if _code(e) == "BucketAlreadyExists":
            raise name_taken(
                ref.kind, ref.bucket, owner, None, elsewhere="another AWS account"
            ) from e
        raise SetupFailed(
            Reason.ACCESS_DENIED,
            f"S3 bucket {ref.bucket!r} at {self._where}: the credentials may neither "
            "read nor create it. It may belong to another account (then set "
            "spec.bucket to another name), or the credentials lack s3:ListBucket "
            "and s3:CreateBucket.",
            retryable=False,
        ) from e

    def _tags(self) -> dict[str, str]:
        with self._failing("reading the tags of", unless=_codes("NoSuchTagSet")) as answer:
            got = self._client.get_bucket_tagging(Bucket=self.ref.bucket)
        if answer.error is not None:
            return {}
        return {t["Key"]: t["Value"] for t in got.get("TagSet", [])}

    def _check_owner(self, owner: str, mark: str, creations: Creations) -> bool:
        """Pass for a bucket marked as ours; True when it is our own unmarked creation
        (a setup interrupted before tagging), which is marked now."""
        tags = self._tags()
        found = tags.get(S3_OWNER_TAG)
        if found == mark:
            return False
        if found is None and creations.recorded(self.ref.bucket):
            self._ensure_tag(mark, tags)
            return True
        raise name_taken(self.ref.kind, self.ref.bucket, owner, found)

    def _ensure_tag(self, mark: str, tags: dict[str, str] | None = None) -> None:
        """Mark a bucket we just created, keeping any other tags (``tags``: as just read).
        Stand-ins (moto) and S3-compatible stores ignore tags given at creation, hence
        the separate call."""
        tags = self._tags() if tags is None else tags
        if tags.get(S3_OWNER_TAG) == mark:
            return
        tags[S3_OWNER_TAG] = mark
        tag_set = [{"Key": k, "Value": v} for k, v in tags.items()]
        with self._failing("tagging"):
            self._client.put_bucket_tagging(Bucket=self.ref.bucket, Tagging={"TagSet": tag_set})

    def _check_region(self) -> bool:
        """On AWS, the bucket must be in the declared region. An S3-compatible endpoint's
        region is a tag the user chose and GetBucketLocation answers vary by vendor, so
        nothing is checked there (False)."""
        if self.ref.kind != "s3":
            return False
        with self._failing("reading the region of"):
            got = self._client.get_bucket_location(Bucket=self.ref.bucket)
        # AWS's legacy answers: no constraint means us-east-1, "EU" means eu-west-1.
        actual = got.get("LocationConstraint") or "us-east-1"
        actual = {"EU": "eu-west-1"}.get(actual, actual)
        if actual != self.ref.region:
            raise SetupFailed(
                Reason.REGION_MISMATCH,
                f"S3 bucket {self.ref.bucket!r} is in {actual}, but the location declares "
                f"{self.ref.region}. Set spec.bucket to another name, or declare the "
                "bucket's region in a new Location.",
                retryable=False,
            )
        return True

    def _harden(self, created: bool) -> tuple[str, ...]:
        """Block public access; default encryption SSE-S3 unless the bucket has one.

        An adopted bucket keeps a default encryption it already has (it may be SSE-KMS by
        choice). Only a "NotImplemented" answer from a store that is not AWS (an
        S3-compatible endpoint, or an ``s3`` endpoint override outside amazonaws.com such as
        the test bed's versitygw) is tolerated, as a warning: AWS implements both calls, so
        there a failure is an error.
        """
        warnings: list[str] = []
        ref = self.ref
        lacking = self._not_implemented
        with self._failing("blocking public access to", unless=lacking) as answer:
            self._client.put_public_access_block(
                Bucket=ref.bucket, PublicAccessBlockConfiguration=_PUBLIC_ACCESS_BLOCK
            )
        if answer.error is not None:
            warnings.append(
                f"{self._where} has no public access block; check the bucket is private"
            )
        if created or not self._has_encryption(warnings):
            with self._failing("setting default encryption on", unless=lacking) as answer:
                self._client.put_bucket_encryption(
                    Bucket=ref.bucket, ServerSideEncryptionConfiguration=_SSE_S3
                )
            if answer.error is not None:
                warnings.append(f"{self._where} does not take a default encryption setting")
        return tuple(dict.fromkeys(warnings))

    def _has_encryption(self, warnings: list[str]) -> bool:
        none = "ServerSideEncryptionConfigurationNotFoundError"

        def answered(e: bex.ClientError) -> bool:
            return _code(e) == none or self._not_implemented(e)

        with self._failing("reading the encryption of", unless=answered) as answer:
            self._client.get_bucket_encryption(Bucket=self.ref.bucket)
        if answer.error is not None and _code(answer.error) == none:
            return False
        if answer.error is not None:
            warnings.append(f"{self._where} does not take a default encryption setting")
        return True

    def _abort_rule(self, days: int) -> tuple[str, ...]:
        """The lifecycle rule ``ABORT_RULE_ID``: abort multipart uploads ``days`` after
        they began (AbortIncompleteMultipartUpload, every key). PutBucketLifecycle
        replaces the whole configuration, so the bucket's rules are read first and every
        other rule is put back as it was; nothing is written when ours is already there.
        A store that is not AWS and answers NotImplemented (versitygw) is a warning."""
        ref = self.ref
        none = "NoSuchLifecycleConfiguration"

        def answered(e: bex.ClientError) -> bool:
            return _code(e) == none or self._not_implemented(e)

        lacking = (
            f"{self._where} takes no lifecycle rules: multipart uploads left unfinished "
            "are aborted by the placement service only"
        )
        with self._failing("reading the lifecycle rules of", unless=answered) as answer:
            got = self._client.get_bucket_lifecycle_configuration(Bucket=ref.bucket)
        if answer.error is not None and _code(answer.error) != none:
            return (lacking,)
        rules: list[dict[str, Any]] = [] if answer.error is not None else list(got["Rules"])
        ours = {
            "ID": ABORT_RULE_ID,
            "Status": "Enabled",
            "Filter": {"Prefix": ""},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": days},
        }
        if any(_same_abort_rule(rule, days) for rule in rules):
            return ()
        kept = [rule for rule in rules if rule.get("ID") != ABORT_RULE_ID]
        extra: dict[str, Any] = {}
        if answer.error is None and got.get("TransitionDefaultMinimumObjectSize"):
            extra["TransitionDefaultMinimumObjectSize"] = got["TransitionDefaultMinimumObjectSize"]
        doing = "setting the lifecycle rule that aborts unfinished uploads of"
        with self._failing(doing, unless=self._not_implemented) as answer:
            self._client.put_bucket_lifecycle_configuration(
                Bucket=ref.bucket, LifecycleConfiguration={"Rules": [*kept, ours]}, **extra
            )
        return () if answer.error is None else (lacking,)

    def _not_implemented(self, e: bex.ClientError) -> bool:
        return not self._on_aws and (_code(e) in _NOT_IMPLEMENTED or _status(e) == 501)

    @property
    def _on_aws(self) -> bool:
        """AWS itself: kind ``s3`` with no endpoint, or an override on AWS's own domains
        (FIPS, dual-stack endpoints)."""
        if self.ref.kind != "s3":
            return False
        host = (urlsplit(self.ref.endpoint).hostname or "") if self.ref.endpoint else ""
        return not self.ref.endpoint or any(
            host == d or host.endswith("." + d) for d in ("amazonaws.com", "amazonaws.com.cn")
        )

    # -------------------------------------------------------------------- transfers

    def presign_put(self, key: str, *, expires: int, size: int | None = None) -> SignedRequest:
        """A presigned PutObject. Content-Type is signed (and moto needs it to keep the
        body); with ``size``, Content-Length is signed too, so S3 refuses any other size."""
        check_key(key)
        at = expires_at(expires)
        params: dict[str, Any] = {
            "Bucket": self.ref.bucket,
            "Key": key,
            "ContentType": OCTET_STREAM,
        }
        headers = {"Content-Type": OCTET_STREAM}
        if size is not None:
            if size < 0:
                raise ValueError("size must be >= 0")
            params["ContentLength"] = size
            headers["Content-Length"] = str(size)
        url = self._presign_object("PUT", key, headers, expires)
        return SignedRequest("PUT", url, headers, at)

    def presign_get(self, key: str, *, expires: int) -> SignedRequest:
        check_key(key)
        at = expires_at(expires)
        url = self._presign_object("GET", key, {}, expires)
        return SignedRequest("GET", url, {}, at)

    def start_multipart(
        self, key: str, *, parts: int, expires: int, crc32: Sequence[str] | None = None
    ) -> MultipartUpload:
        """CreateMultipartUpload by the service, one presigned UploadPart URL per part.
        Every part but the last must be at least 5 MiB (S3's rule). With ``crc32`` (one
        base64 CRC32 per part) the upload is created with the CRC32 algorithm and each
        part's checksum header is signed into its URL: S3 refuses a part whose bytes
        differ, and the object keeps a composite checksum. S3-compatible stores differ in
        what they do with checksums, so there they are left out (parts checked by size)."""
        check_key(key)
        check_parts(parts)
        if crc32 is not None and len(crc32) != parts:
            raise ValueError(f"{len(crc32)} part checksums for {parts} parts")
        crc32 = crc32 if self._part_checksums else None
        at = expires_at(expires)
        extra = {"ChecksumAlgorithm": "CRC32"} if crc32 is not None else {}
        with self._failing("starting an upload to", cls=StorageError):
            started = self._client.create_multipart_upload(
                Bucket=self.ref.bucket, Key=key, ContentType=OCTET_STREAM, **extra
            )
        upload_id = str(started["UploadId"])
        requests = tuple(
            self._part_request(key, upload_id, n, expires, at, crc32) for n in range(1, parts + 1)
        )
        return MultipartUpload(key=key, upload_id=upload_id, parts=requests)

    def _part_request(
        self,
        key: str,
        upload_id: str,
        n: int,
        expires: int,
        at: dt.datetime,
        crc32: Sequence[str] | None,
    ) -> SignedRequest:
        headers = {"Content-Type": OCTET_STREAM}
        if crc32 is not None:
            headers[CRC32_HEADER] = crc32[n - 1]
        params = {"partNumber": str(n), "uploadId": upload_id}
        url = self._presign_object("PUT", key, headers, expires, params)
        return SignedRequest("PUT", url, headers, at)

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
        for n in numbers:
            check_parts(n)
        crc32 = crc32 if self._part_checksums else None
        at = expires_at(expires)
        upload_id = upload_id_of(upload)
        return tuple(self._part_request(key, upload_id, n, expires, at, crc32) for n in numbers)

    def list_parts(self, key: str, upload: MultipartUpload | str) -> list[Part]:
        """ListParts, every page: what S3 holds of the upload now."""
        check_key(key)
        found: list[Part] = []
        marker = 0
        while True:
            with self._failing("listing the parts of an upload to", cls=StorageError):
                page = self._client.list_parts(
                    Bucket=self.ref.bucket,
                    Key=key,
                    UploadId=upload_id_of(upload),
                    PartNumberMarker=marker,
                )
            found += [
                Part(int(p["PartNumber"]), int(p["Size"]), p.get("ETag"), p.get("ChecksumCRC32"))
                for p in page.get("Parts", [])
            ]
            if not page.get("IsTruncated"):
                return found
            marker = int(page["NextPartNumberMarker"])

    def complete_multipart(
        self,
        key: str,
        upload: MultipartUpload | str,
        etags: Sequence[str],
        crc32: Sequence[str] | None = None,
    ) -> None:
        check_key(key)
        if not etags:
            raise UploadIncomplete("no parts were reported for the upload")
        parts: list[dict[str, Any]] = [
            {"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)
        ]
        if crc32 is not None and self._part_checksums:  # again, as the upload was created
            for part, checksum in zip(parts, crc32, strict=True):
                part["ChecksumCRC32"] = checksum
        doing, bad = "completing an upload to", _codes(*_BAD_UPLOAD)
        with self._failing(doing, cls=StorageError, unless=bad) as answer:
            self._client.complete_multipart_upload(
                Bucket=self.ref.bucket,
                Key=key,
                UploadId=upload_id_of(upload),
                MultipartUpload={"Parts": parts},
            )
        if answer.error is not None:
            raise UploadIncomplete(
                f"S3 refused to assemble {key!r}: {_code(answer.error)} (a part is missing, "
                "too small or its ETag differs; upload the parts again)."
            ) from answer.error

    def abort_multipart(self, key: str, upload: MultipartUpload | str) -> None:
        """AbortMultipartUpload: S3 drops the parts. Idempotent."""
        check_key(key)
        gone = _codes("NoSuchUpload")  # aborted already
        with self._failing("aborting an upload to", cls=StorageError, unless=gone):
            self._client.abort_multipart_upload(
                Bucket=self.ref.bucket, Key=key, UploadId=upload_id_of(upload)
            )

    def delete(self, key: str) -> None:
        """DeleteObject: S3 answers 204 for a key with no object too. Idempotent."""
        check_key(key)
        absent = _statuses(404)
        with self._failing("deleting an object of", cls=StorageError, unless=absent):
            self._client.delete_object(Bucket=self.ref.bucket, Key=key)

    def put(self, key: str, data: bytes) -> None:
        """PutObject with Content-MD5: S3 refuses bytes that differ from what was sent
        (botocore no longer adds it by itself, ``_CONFIG``)."""
        check_key(key)
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()  # noqa: S324 - integrity
        with self._failing("writing an object to", cls=StorageError):
            self._client.put_object(
                Bucket=self.ref.bucket,
                Key=key,
                Body=data,
                ContentMD5=md5,
                ContentType=OCTET_STREAM,
            )

    def get(self, key: str) -> bytes | None:
        check_key(key)
        absent = _statuses(404)
        with self._failing("reading an object of", cls=StorageError, unless=absent) as answer:
            body: bytes = self._client.get_object(Bucket=self.ref.bucket, Key=key)["Body"].read()
        return None if answer.error is not None else body

    def upload(self, key: str, path: Path) -> None:
        """boto3's managed transfer (what ``upload_file`` runs): multipart above 8 MiB,
        parts in parallel, each with its CRC32 on AWS (``_part_checksums``). The manager
        is used directly so a refusal stays a ClientError, which ``_failing`` classifies
        (``upload_file`` wraps it in S3UploadFailedError)."""
        check_key(key)
        extra = {"ContentType": OCTET_STREAM}
        if self._part_checksums:
            extra["ChecksumAlgorithm"] = "CRC32"
        with self._failing("uploading a file to", cls=StorageError), self._transfer() as transfer:
            transfer.upload(str(path), self.ref.bucket, key, extra_args=extra).result()

    def download(self, key: str, path: Path) -> bool:
        """boto3's managed transfer (what ``download_file`` runs): ranges in parallel for
        a large object."""
        check_key(key)
        absent = _statuses(404)  # its HeadObject: no error code, only the status
        with landing(path) as temporary:
            doing = "downloading an object of"
            failing = self._failing(doing, cls=StorageError, unless=absent)
            with failing as answer, self._transfer() as transfer:
                transfer.download(self.ref.bucket, key, str(temporary)).result()
            if answer.error is not None:
                return False
            temporary.replace(path)
        return True

    def _transfer(self) -> Any:
        """A boto3 transfer manager on this bucket's client. Classic, never CRT (chosen
        by "auto" on some EC2 types): CRT sends through an HTTP client of its own, without
        this client's timeouts, retries and redirect rule."""
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(preferred_transfer_client="classic")
        return create_transfer_manager(self._client, config)

    def stat(self, key: str) -> ObjectStat | None:
        check_key(key)
        absent = _statuses(404)
        with self._failing("reading an object of", cls=StorageError, unless=absent) as answer:
            head = self._client.head_object(Bucket=self.ref.bucket, Key=key, ChecksumMode="ENABLED")
        if answer.error is not None:
            return None
        etag = head.get("ETag")
        md5 = None
        # The ETag is the MD5 of the bytes only for single-part objects without SSE-KMS/C.
        if etag and head.get("ServerSideEncryption") in (None, "AES256"):
            bare = etag.strip('"')
            if len(bare) == 32 and "-" not in bare:
                md5 = bare.lower()
        if head.get("ContentLength") is None:  # a proxy in the way dropped it
            raise StorageError(
                Reason.BACKEND_ERROR,
                f"{self._where} answered a lookup of {key!r} without its size",
                retryable=True,
            )
        return ObjectStat(
            size=int(head["ContentLength"]),
            etag=etag,
            md5=md5,
            crc32c=head.get("ChecksumCRC32C"),
            crc32=head.get("ChecksumCRC32"),
        )

    def list_under(self, prefix: str) -> dict[str, ObjectStat]:
        check_key(prefix)
        found: dict[str, ObjectStat] = {}
        with self._failing("listing the objects of", cls=StorageError):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.ref.bucket, Prefix=prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    etag = obj.get("ETag")
                    bare = (etag or "").strip('"')
                    md5 = bare.lower() if len(bare) == 32 and "-" not in bare else None
                    found[obj["Key"]] = ObjectStat(size=int(obj["Size"]), etag=etag, md5=md5)
        return found

    @property
    def _part_checksums(self) -> bool:
        """CRC32 part checksums on AWS only: its behaviour with them is documented."""
        return self.ref.kind == "s3"

    @functools.cached_property
    def _object_base(self) -> str:
        """This bucket's object URL prefix (endpoint, addressing style), resolved once by
        botocore's endpoint rules: resolving them is most of what a presign costs."""
        probe = "o41-probe"
        url: str = self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.ref.bucket, "Key": probe}, ExpiresIn=60
        )
        base = url.split("?", 1)[0]
        assert base.endswith("/" + probe), base
        return base[: -len(probe)]

    def _presign_object(
        self,
        method: str,
        key: str,
        headers: dict[str, str],
        expires: int,
        params: dict[str, str] | None = None,
    ) -> str:
        """SigV4 query signing (o41.storage.sigv4) on the URL botocore resolved once, with
        the credentials botocore holds (explicit, or ambient and refreshed)."""
        try:  # _failing's rule, without its generator: every begin signs here (issue 41)
            credentials = self._client._request_signer._credentials.get_frozen_credentials()
            return sigv4.presign(
                method,
                self._object_base + quote(key, safe="/~"),
                headers,
                access_key=credentials.access_key,
                secret_key=credentials.secret_key,
                token=credentials.token,
                region=self.signing_region,
                expires=expires,
                params=params,
            )
        except Exception as e:
            self._raise(e, "signing a URL for", cls=StorageError)

    # ------------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _failing(
        self,
        doing: str,
        *,
        missing: str | None = None,
        cls: type[StorageError] = SetupFailed,
        unless: Callable[[bex.ClientError], bool] = lambda e: False,
    ) -> Iterator[Answer[bex.ClientError]]:
        """Any error of the block as the project's ``cls`` (``_raise``), except an S3
        answer ``unless`` picks: that one is left in the yielded ``Answer`` for the caller."""
        answer: Answer[bex.ClientError] = Answer()
        try:
            yield answer
        except bex.ClientError as e:
            if not unless(e):
                self._raise(e, doing, missing=missing, cls=cls)
            answer.error = e
        except Exception as e:
            self._raise(e, doing, missing=missing, cls=cls)

    def _raise(
        self,
        e: Exception,
        doing: str,
        *,
        missing: str | None = None,
        cls: type[StorageError] = SetupFailed,
    ) -> NoReturn:
        if isinstance(e, StorageError):
            raise e
        reason, retryable, advice = _classify(e, self.ref, missing)
        what = f"{doing} S3 bucket {self.ref.bucket!r} at {self._where} failed"
        message = scrub(f"{what}: {_describe(e)}. {advice}", self.ref.secrets())
        raise cls(reason, message, retryable=retryable) from e


def _same_abort_rule(rule: dict[str, Any], days: int) -> bool:
    """``rule`` is o41's, enabled, for every key, aborting after ``days``."""
    prefix = (rule.get("Filter") or {}).get("Prefix", rule.get("Prefix", ""))
    return (
        rule.get("ID") == ABORT_RULE_ID
        and rule.get("Status") == "Enabled"
        and not prefix
        and set(rule.get("Filter") or {}) <= {"Prefix"}
        and (rule.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation") == days
    )


def _codes(*codes: str) -> Callable[[bex.ClientError], bool]:
    """An ``unless`` of ``_failing``: S3 answered one of ``codes``."""
    return lambda e: _code(e) in codes


def _statuses(*statuses: int) -> Callable[[bex.ClientError], bool]:
    """An ``unless`` of ``_failing``: S3 answered one of the HTTP ``statuses``."""
    return lambda e: _status(e) in statuses


def _code(e: bex.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: bex.ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _describe(e: Exception) -> str:
    """Error code and status only: never the SDK's full text, which may echo a request."""
    if isinstance(e, bex.ClientError):
        return f"{_code(e) or 'error'} (HTTP {_status(e)})"
    return type(e).__name__


def _gone(ref: BucketRef) -> str:
    return (
        f"the bucket {ref.bucket!r} no longer exists; its versions are lost. o41 never "
        "deletes buckets: find out who did, then retire this location"
    )


def _classify(e: Exception, ref: BucketRef, missing: str | None) -> tuple[Reason, bool, str]:
    """(reason, retryable, advice) for an SDK exception."""
    if isinstance(e, bex.ClientError):
        code, status = _code(e), _status(e)
        if code in _BAD_CREDENTIALS or status == 401:
            return Reason.BAD_CREDENTIALS, False, "Fix accessKeyId/secretAccessKey in the Secret."
        if code in _DENIED:
            return (
                Reason.ACCESS_DENIED,
                False,
                "Grant the credentials access to the bucket (s3:CreateBucket, s3:ListBucket, "
                "s3:GetBucketLocation, s3:PutBucketTagging, s3:PutBucketPublicAccessBlock, "
                "s3:PutEncryptionConfiguration, s3:GetLifecycleConfiguration, "
                "s3:PutLifecycleConfiguration, s3:PutObject, s3:GetObject, "
                "s3:AbortMultipartUpload).",
            )
        if code in _MISSING:
            return Reason.BUCKET_MISSING, False, (missing or "The bucket does not exist.")
        if code in _WRONG_REGION:
            hint = "signingRegion" if ref.kind == "s3_compatible" else "spec.region"
            return (
                Reason.REGION_MISMATCH,
                False,
                f"The endpoint wants another region: check {hint}.",
            )
        if code == "InvalidBucketName":
            return Reason.INVALID_BUCKET_NAME, False, "Set spec.bucket to a valid name."
        if code in _TRANSIENT or status >= 500 or status == 429:
            return Reason.BACKEND_ERROR, True, "The service had a transient problem; retrying."
        return Reason.BACKEND_ERROR, False, "See the error code in the S3 documentation."
    if isinstance(e, bex.ConnectionError):
        return (
            Reason.ENDPOINT_UNREACHABLE,
            True,
            "Check the endpoint URL and that the network lets the operator reach it.",
        )
    if isinstance(e, bex.NoCredentialsError | bex.PartialCredentialsError):
        return (
            Reason.BAD_CREDENTIALS,
            False,
            "No credentials: set spec.credentials or give the operator an identity (IRSA).",
        )
    if isinstance(e, bex.CredentialRetrievalError):
        return Reason.BAD_CREDENTIALS, True, "The ambient identity could not be loaded."
    if isinstance(e, bex.HTTPClientError):
        return Reason.BACKEND_ERROR, True, "The connection failed mid-request; retrying."
    return Reason.BACKEND_ERROR, False, "Unexpected error."
