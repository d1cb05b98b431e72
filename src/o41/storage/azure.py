"""Azure Blob Storage (kind ``azure_blob``): a container in an existing storage account.

The account key (``credentials["accountKey"]``) authenticates the service and signs the
service SAS URLs pods get. Ambient identity is refused for now: SAS without the key means
user delegation SAS, which needs azure-identity and Entra ID, and neither can be exercised
here (Azurite has no Entra ID).

The region is the storage account's, chosen when the account was made; the blob data plane
cannot tell it (that takes the management API and an ARM identity), so ``ensure`` reports
``region_checked=False`` and trusts the Location's spec.

Multipart = Put Block per part (one SAS URL each, with ``comp=block&blockid=...``) and Put
Block List by the service. Block ids are base64 of ``<upload id>-<n>``: fixed width, as
Azure requires within a blob, and distinct per upload, so two uploads of one key never
share a block. Uncommitted blocks need no cleanup: Azure discards them after a week.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import functools
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

from azure.core import exceptions as aex
from azure.core.credentials import AzureNamedKeyCredential
from azure.storage.blob import (
    BlobBlock,
    BlobSasPermissions,
    BlobServiceClient,
    ContentSettings,
    ExponentialRetry,
    generate_blob_sas,
)

from o41.storage.base import (
    AZURE_OWNER_METADATA,
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

# A SAS valid from a few minutes ago: a pod's clock may run behind the service's.
_CLOCK_SKEW = dt.timedelta(minutes=5)
# upload/download: blocks (and ranges) of 8 MiB above 8 MiB, as boto3's managed transfer,
# this many at once. The SDK's defaults send up to 64 MiB in one request.
_TRANSFER_PART = 8 * 2**20
_TRANSFER_CONCURRENCY = 8
_UPLOAD_ID = re.compile(r"[0-9a-f]{16}")
_BAD_CREDENTIALS = {"AuthenticationFailed", "InvalidAuthenticationInfo"}
_DENIED = {
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "AuthorizationSourceIPMismatch",
    "AuthorizationProtocolMismatch",
    "AuthorizationResourceTypeMismatch",
    "AuthorizationServiceMismatch",
    "InsufficientAccountPermissions",
    "AccountIsDisabled",
    "KeyBasedAuthenticationNotPermitted",
}
_MISSING = {"ContainerNotFound", "ResourceNotFound"}
_TRANSIENT = {"ContainerBeingDeleted", "ServerBusy", "OperationTimedOut", "InternalError"}


def open_bucket(ref: BucketRef) -> AzureBucket:
    return AzureBucket(ref)


def raw_block_id(upload_id: str, number: int) -> str:
    """The block id before base64: the SDK's block calls take it in this form."""
    return f"{upload_id}-{number:05d}"


def block_id(upload_id: str, number: int) -> str:
    """The block id as it goes on the wire (``blockid=``), base64 of the raw one."""
    return base64.b64encode(raw_block_id(upload_id, number).encode()).decode()


def _looks_like_key(key: str) -> bool:
    """Base64 of at least 16 bytes (Azure's keys are 64): a typo fails here, not as a
    signing error inside the SDK."""
    try:
        return len(base64.b64decode(key, validate=True)) >= 16
    except (binascii.Error, ValueError):
        return False


def account_name_of(account_url: str) -> str:
    """``https://acct.blob.core.windows.net`` -> acct; the emulator's path-style
    ``http://127.0.0.1:10000/devstoreaccount1`` -> devstoreaccount1."""
    parts = urlsplit(account_url)
    path = parts.path.strip("/")
    if path:
        return path.split("/")[0]
    return (parts.hostname or "").split(".")[0]


class AzureBucket:
    """One container. The SDK client is built on first use."""

    def __init__(self, ref: BucketRef) -> None:
        if ref.kind != "azure_blob":
            raise ValueError(f"not an Azure Blob location: {ref.kind}")
        if not ref.account_url:
            raise ValueError("an azure_blob location needs account_url")
        self.ref = ref
        self.account_url = ref.account_url.rstrip("/")

    # ----------------------------------------------------------------------- client

    @functools.cached_property
    def _key(self) -> tuple[str, str]:
        """(account name, account key), checked before any call."""
        creds = self.ref.credentials
        if creds is None:
            raise SetupFailed(
                Reason.BAD_CREDENTIALS,
                "azureBlob locations need spec.credentials with accountKey: pods get SAS URLs "
                "signed with the account key (ambient identity with user delegation SAS is "
                "not supported yet).",
                retryable=False,
            )
        key = creds.get("accountKey") or ""
        if not _looks_like_key(key):
            raise SetupFailed(
                Reason.BAD_CREDENTIALS,
                "accountKey in the credentials Secret is missing or not a storage account key "
                "(base64, as the portal or `az storage account keys list` shows it).",
                retryable=False,
            )
        name = creds.get("accountName") or account_name_of(self.account_url)
        return name, key

    @functools.cached_property
    def _service(self) -> Any:
        name, key = self._key
        # Fail fast: 2 s to connect, one retry after ~1 s (the SDK default waits 15 s+).
        retry = ExponentialRetry(
            initial_backoff=1, increment_base=2, retry_total=1, random_jitter_range=1
        )
        return BlobServiceClient(
            self.account_url,
            credential=AzureNamedKeyCredential(name, key),
            retry_policy=retry,
            connection_timeout=2,
            read_timeout=60,
            max_single_put_size=_TRANSFER_PART,
            max_block_size=_TRANSFER_PART,
        )

    @property
    def _container(self) -> Any:
        return self._service.get_container_client(self.ref.bucket)

    # ------------------------------------------------------------------------ setup

    def ensure(
        self,
        owner: str,
        creations: Creations = NO_RECORD,
        *,
        abort_uploads_after_days: int | None = None,
    ) -> Ensured:
        """Create the container (private, marked) or adopt ours. The region cannot be
        checked from the data plane (``region_checked=False``). The metadata comes with
        the create call, so no crash leaves an unmarked container: ``creations`` is not
        needed, and an unmarked container is never adopted.

        ``abort_uploads_after_days`` sets nothing: Azure discards a blob's uncommitted
        blocks after 7 days by itself, and a multipart write commits its blocks only all
        at once (Put Block List at commit), so an unfinished one leaves no blob."""
        check_bucket_name("azure_blob", self.ref.bucket)
        check_days(abort_uploads_after_days)
        mark = owner_mark(owner)
        container = self._container
        props = self._properties()
        created = False
        if props is None:
            with self._failing("creating", unless=_exists) as answer:
                # No public_access argument: the container is private.
                container.create_container(metadata={AZURE_OWNER_METADATA: mark})
            created = answer.error is None
            if not created:
                props = self._properties()  # created meanwhile
        if not created:
            if props is None:
                raise SetupFailed(
                    Reason.BACKEND_ERROR,
                    f"container {self.ref.bucket!r} came and went while being created; retrying.",
                    retryable=True,
                )
            found = {k.lower(): v for k, v in (props.metadata or {}).items()}.get(
                AZURE_OWNER_METADATA
            )
            if found != mark:
                raise name_taken("azure_blob", self.ref.bucket, owner, found)
            if props.public_access:
                self._make_private()
        return Ensured(
            bucket=self.ref.bucket,
            endpoint=self.account_url,
            created=created,
            region_checked=False,
        )

    def check(self) -> None:
        if self._properties() is None:
            raise SetupFailed(
                Reason.BUCKET_MISSING,
                f"container {self.ref.bucket!r} no longer exists; its versions are lost. o41 "
                "never deletes containers: find out who did, then retire this location.",
                retryable=False,
            )

    def _properties(self) -> Any:
        with self._failing("looking up", unless=_not_found) as answer:
            props = self._container.get_container_properties()
        return None if answer.error is not None else props

    def _make_private(self) -> None:
        """Turn off anonymous access on an adopted container, keeping its stored access
        policies (they back SAS tokens someone may hold)."""
        with self._failing("making private"):
            policy = self._container.get_container_access_policy()
            identifiers = {i.id: i.access_policy for i in policy.get("signed_identifiers", [])}
            self._container.set_container_access_policy(
                signed_identifiers=identifiers, public_access=None
            )

    # -------------------------------------------------------------------- transfers

    def presign_put(self, key: str, *, expires: int, size: int | None = None) -> SignedRequest:
        """Put Blob with a create+write SAS. ``x-ms-blob-type: BlockBlob`` is required by
        Azure. A SAS cannot bind the size, so ``size`` is not enforced here: the service
        checks it with ``stat`` at commit."""
        check_key(key)
        if size is not None and size < 0:
            raise ValueError("size must be >= 0")
        at = expires_at(expires)
        url = self._sas_url(key, BlobSasPermissions(create=True, write=True), at)
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": OCTET_STREAM}
        return SignedRequest("PUT", url, headers, at)

    def presign_get(self, key: str, *, expires: int) -> SignedRequest:
        check_key(key)
        at = expires_at(expires)
        return SignedRequest("GET", self._sas_url(key, BlobSasPermissions(read=True), at), {}, at)

    def start_multipart(
        self, key: str, *, parts: int, expires: int, crc32: Sequence[str] | None = None
    ) -> MultipartUpload:
        """One Put Block URL per part; nothing happens on Azure until the pod uploads."""
        check_key(key)
        check_parts(parts)
        at = expires_at(expires)
        upload_id = secrets.token_hex(8)
        return MultipartUpload(
            key=key,
            upload_id=upload_id,
            parts=self._blocks(key, upload_id, range(1, parts + 1), at),
        )

    def _blocks(
        self, key: str, upload_id: str, numbers: Iterable[int], at: dt.datetime
    ) -> tuple[SignedRequest, ...]:
        base = self._sas_url(key, BlobSasPermissions(write=True), at)
        return tuple(
            SignedRequest(
                "PUT",
                f"{base}&comp=block&blockid={quote(block_id(upload_id, n), safe='')}",
                {"Content-Type": OCTET_STREAM},
                at,
            )
            for n in numbers
        )

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
        return self._blocks(key, upload_id, numbers, expires_at(expires))

    def list_parts(self, key: str, upload: MultipartUpload | str) -> list[Part]:
        """The blob's uncommitted blocks of this upload (Put Block answers no ETag)."""
        check_key(key)
        upload_id = self._upload_id(upload)
        blob = self._service.get_blob_client(self.ref.bucket, key)
        with self._failing("listing the blocks of", cls=StorageError, unless=_not_found) as answer:
            _, uncommitted = blob.get_block_list("uncommitted")
        if answer.error is not None:
            return []  # no block yet: Azure knows no blob
        found = []
        for block in uncommitted:
            raw = block.id
            with contextlib.suppress(binascii.Error, ValueError):  # decoded or not, by SDK
                raw = base64.b64decode(raw, validate=True).decode()
            head, _, number = raw.rpartition("-")
            if head == upload_id and number.isdigit():
                found.append(Part(int(number), int(block.size)))
        return sorted(found, key=lambda p: p.number)

    def complete_multipart(
        self,
        key: str,
        upload: MultipartUpload | str,
        etags: Sequence[str],
        crc32: Sequence[str] | None = None,
    ) -> None:
        """Put Block List of the upload's blocks, in order. Put Block answers no ETag, so
        only the number of ``etags`` is used."""
        check_key(key)
        upload_id = self._upload_id(upload)
        if not etags:
            raise UploadIncomplete("no parts were reported for the upload")
        # BlobBlock takes the raw id: the SDK base64-encodes it, giving the ids the URLs carry.
        blocks = [BlobBlock(block_id=raw_block_id(upload_id, n)) for n in range(1, len(etags) + 1)]
        doing = "completing an upload to"
        with self._failing(doing, cls=StorageError, unless=_bad_block_list) as answer:
            self._service.get_blob_client(self.ref.bucket, key).commit_block_list(
                blocks, content_settings=ContentSettings(content_type=OCTET_STREAM)
            )
        if answer.error is not None:
            raise UploadIncomplete(
                f"Azure refused the block list of {key!r}: a part was not uploaded; upload "
                "it, then complete again"
            ) from answer.error

    def abort_multipart(self, key: str, upload: MultipartUpload | str) -> None:
        """Nothing to delete: Azure discards uncommitted blocks by itself after 7 days."""
        check_key(key)
        self._upload_id(upload)

    def delete(self, key: str) -> None:
        """Delete the blob; one already gone is done. Idempotent."""
        check_key(key)
        blob = self._service.get_blob_client(self.ref.bucket, key)
        with self._failing("deleting an object of", cls=StorageError, unless=_not_found):
            blob.delete_blob()

    def put(self, key: str, data: bytes) -> None:
        """Put Blob with Content-MD5 (``validate_content``): Azure refuses bytes that
        differ, and keeps the MD5 as the blob's."""
        check_key(key)
        blob = self._service.get_blob_client(self.ref.bucket, key)
        with self._failing("writing an object to", cls=StorageError):
            blob.upload_blob(
                data,
                overwrite=True,
                validate_content=True,
                content_settings=ContentSettings(content_type=OCTET_STREAM),
            )

    def get(self, key: str) -> bytes | None:
        check_key(key)
        blob = self._service.get_blob_client(self.ref.bucket, key)
        with self._failing("reading an object of", cls=StorageError, unless=_not_found) as answer:
            data: bytes = blob.download_blob().readall()
        return None if answer.error is not None else data

    def upload(self, key: str, path: Path) -> None:
        """The SDK's managed upload: above ``_TRANSFER_PART``, Put Block in parallel, each
        block with its Content-MD5, then Put Block List."""
        check_key(key)
        blob = self._service.get_blob_client(self.ref.bucket, key)
        with self._failing("uploading a file to", cls=StorageError), path.open("rb") as file:
            blob.upload_blob(
                file,
                length=path.stat().st_size,
                overwrite=True,
                validate_content=True,
                max_concurrency=_TRANSFER_CONCURRENCY,
                content_settings=ContentSettings(content_type=OCTET_STREAM),
            )

    def download(self, key: str, path: Path) -> bool:
        check_key(key)
        blob = self._service.get_blob_client(self.ref.bucket, key)
        with landing(path) as temporary:
            doing = "downloading an object of"
            with self._failing(doing, cls=StorageError, unless=_not_found) as answer:
                stream = blob.download_blob(max_concurrency=_TRANSFER_CONCURRENCY)
                with temporary.open("wb") as file:
                    stream.readinto(file)
            if answer.error is not None:
                return False
            temporary.replace(path)
        return True

    def stat(self, key: str) -> ObjectStat | None:
        check_key(key)
        with self._failing("reading an object of", cls=StorageError, unless=_not_found) as answer:
            props = self._service.get_blob_client(self.ref.bucket, key).get_blob_properties()
        if answer.error is not None:
            return None
        md5 = props.content_settings.content_md5
        return ObjectStat(
            size=int(props.size), etag=props.etag, md5=bytes(md5).hex() if md5 else None
        )

    def list_under(self, prefix: str) -> dict[str, ObjectStat]:
        check_key(prefix)
        found: dict[str, ObjectStat] = {}
        with self._failing("listing the blobs of", cls=StorageError):
            for props in self._container.list_blobs(name_starts_with=prefix):
                md5 = props.content_settings.content_md5
                found[props.name] = ObjectStat(
                    size=int(props.size), etag=props.etag, md5=bytes(md5).hex() if md5 else None
                )
        return found

    def _upload_id(self, upload: MultipartUpload | str) -> str:
        upload_id = upload_id_of(upload)
        if not _UPLOAD_ID.fullmatch(upload_id):
            raise UploadIncomplete(f"{upload_id!r} is not an upload id of this backend")
        return upload_id

    def _sas_url(self, key: str, permission: BlobSasPermissions, at: dt.datetime) -> str:
        """The blob's URL (encoded by the SDK, as the SAS expects) with a service SAS."""
        name, account_key = self._key
        sas = generate_blob_sas(
            name,
            self.ref.bucket,
            key,
            account_key=account_key,
            permission=permission,
            expiry=at,
            start=dt.datetime.now(dt.UTC) - _CLOCK_SKEW,
        )
        url: str = self._service.get_blob_client(self.ref.bucket, key).url
        return f"{url}?{sas}"

    # ------------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _failing(
        self,
        doing: str,
        *,
        cls: type[StorageError] = SetupFailed,
        unless: Callable[[Exception], bool] = lambda e: False,
    ) -> Iterator[Answer[Exception]]:
        """Any error of the block as the project's ``cls`` (``_raise``), except an Azure
        answer ``unless`` picks: that one is left in the yielded ``Answer`` for the caller."""
        answer: Answer[Exception] = Answer()
        try:
            yield answer
        except Exception as e:
            if not unless(e):
                self._raise(e, doing, cls=cls)
            answer.error = e

    def _raise(
        self, e: Exception, doing: str, *, cls: type[StorageError] = SetupFailed
    ) -> NoReturn:
        if isinstance(e, StorageError):
            raise e
        reason, retryable, advice = _classify(e, self.ref)
        code = _code(e)
        status = getattr(getattr(e, "response", None), "status_code", None)
        detail = f"{code or type(e).__name__}" + (f" (HTTP {status})" if status else "")
        what = f"{doing} Azure container {self.ref.bucket!r} at {self.account_url} failed"
        message = scrub(f"{what}: {detail}. {advice}", self.ref.secrets())
        raise cls(reason, message, retryable=retryable) from e


def _not_found(e: Exception) -> bool:
    return isinstance(e, aex.ResourceNotFoundError)


def _exists(e: Exception) -> bool:
    """The container exists (created meanwhile), and is not on its way out."""
    return isinstance(e, aex.ResourceExistsError) and _code(e) != "ContainerBeingDeleted"


def _bad_block_list(e: Exception) -> bool:
    """A part was not uploaded."""
    return isinstance(e, aex.HttpResponseError) and _code(e) == "InvalidBlockList"


def _code(e: Exception) -> str:
    """The storage error code as a plain string (the SDK gives a str-valued enum)."""
    code = getattr(e, "error_code", None)
    return str(getattr(code, "value", code) or "")


def _authentication_failed(e: Exception, code: str) -> bool:
    """A wrong key. Azure answers AuthenticationFailed; Azurite answers AuthorizationFailure
    with Azure's AuthenticationFailed wording ("Server failed to authenticate the
    request..."), which Azure's own AuthorizationFailure (firewall, disabled shared key)
    never uses. The wording comes in the body, or in the reason phrase for HEAD requests."""
    if code in _BAD_CREDENTIALS or isinstance(e, aex.ClientAuthenticationError):
        return True
    text = str(getattr(e, "message", "") or getattr(getattr(e, "response", None), "reason", ""))
    return code == "AuthorizationFailure" and "failed to authenticate" in text


def _classify(e: Exception, ref: BucketRef) -> tuple[Reason, bool, str]:
    code = _code(e)
    status = int(getattr(getattr(e, "response", None), "status_code", None) or 0)
    if _authentication_failed(e, code):
        return (
            Reason.BAD_CREDENTIALS,
            False,
            "Fix accountKey in the Secret (a current key of this storage account).",
        )
    if code in _DENIED or status == 403:
        return (
            Reason.ACCESS_DENIED,
            False,
            "The account refuses the request: check its firewall, that shared-key access is "
            "allowed, and that the account is enabled.",
        )
    if code in _MISSING or isinstance(e, aex.ResourceNotFoundError):
        return (
            Reason.BUCKET_MISSING,
            False,
            f"The container {ref.bucket!r} (or the account) does not exist.",
        )
    if isinstance(e, aex.ServiceRequestError):  # nothing was sent: connect/DNS/TLS failed
        return (
            Reason.ENDPOINT_UNREACHABLE,
            True,
            "Check accountUrl and that the network lets the operator reach it.",
        )
    if code in _TRANSIENT or status >= 500 or status == 429:
        return Reason.BACKEND_ERROR, True, "The service had a transient problem; retrying."
    if isinstance(e, aex.ServiceResponseError):
        return Reason.BACKEND_ERROR, True, "The connection failed mid-request; retrying."
    return Reason.BACKEND_ERROR, False, "See the error code in the Azure Storage documentation."
