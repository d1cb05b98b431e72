"""An in-process stand-in for a location's bucket, behaving like storage where the
placement service and the client can tell: presigned URLs served over HTTP on 127.0.0.1
(403 for a URL it did not sign or one past its expiry, 404 for a missing object, ranges
with 206), multipart uploads whose parts are PUT one by one and assembled at commit
(``UploadIncomplete`` when a part is missing), and ``stat`` with the size, the MD5 of a
single upload and S3's composite CRC32 of a multipart one.

``Storage`` is the server (one per test, all buckets in it); ``StandInBucket`` is the
service's side of the ``o41.storage.Bucket`` protocol. A location named in
``Storage.unsignable`` cannot sign (as a GCS bucket whose IAM signBlob is refused).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote, urlencode

from aiohttp import web

from o41.core.parts import composite_crc32, crc32_b64
from o41.storage import (
    BucketRef,
    Ensured,
    MultipartUpload,
    ObjectStat,
    Part,
    Reason,
    SignedRequest,
    StorageError,
)

KEY = secrets.token_bytes(16)


def _signature(method: str, path: str, expires: int, extra: str = "") -> str:
    return hmac.new(KEY, f"{method} {path} {expires} {extra}".encode(), "sha256").hexdigest()


@dataclass
class Stored:
    data: bytes
    crc32: str | None = None  # the composite of a multipart object


@dataclass
class Storage:
    """The stand-in's HTTP side and its objects (shared with the buckets' threads)."""

    url: str = ""
    objects: dict[str, Stored] = field(default_factory=dict)
    parts: dict[tuple[str, int], bytes] = field(default_factory=dict)  # (upload id, n)
    unsignable: set[str] = field(default_factory=set)  # buckets that cannot sign
    broken: set[str] = field(default_factory=set)  # buckets whose PUTs fail once sent (500)
    signed: list[str] = field(default_factory=list)  # what each URL was for, in order
    aborted: list[tuple[str, str]] = field(default_factory=list)  # (path, upload id)
    puts: list[str] = field(default_factory=list)  # each PUT received: "<path> <part>"
    gets: list[tuple[str, str | None, int]] = field(default_factory=list)  # path, Range, bytes
    deleted: list[str] = field(default_factory=list)  # each object deleted, by path
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{path:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, q = request.rel_url.raw_path, request.query  # as signed: quoted
        expires = int(q.get("expires", "0"))
        extra = f"{q.get('uploadId', '')}/{q.get('partNumber', '')}"
        want = _signature(request.method, path, expires, extra)
        if not hmac.compare_digest(q.get("signature", ""), want) or expires < time.time():
            return web.Response(status=403, text="<Code>SignatureDoesNotMatch</Code>")
        if request.method == "PUT":
            data = await request.read()
            with self.lock:
                self.puts.append(f"{path} {q.get('partNumber', '')}".strip())
            if path.split("/")[1] in self.broken:  # the body came: the client sent it all
                return web.Response(status=500, text="<Code>InternalError</Code>")
            with self.lock:
                if "uploadId" in q:
                    self.parts[(q["uploadId"], int(q["partNumber"]))] = data
                else:
                    self.objects[path] = Stored(data)
            etag = hashlib.md5(data).hexdigest()  # noqa: S324 - an ETag, as S3's
            return web.Response(headers={"ETag": f'"{etag}"'})
        with self.lock:
            found = self.objects.get(path)
        if found is None:
            return web.Response(status=404, text="<Code>NoSuchKey</Code>")
        if rng := request.headers.get("Range"):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end = int(first), min(int(last or len(found.data) - 1), len(found.data) - 1)
            with self.lock:
                self.gets.append((path, rng, end + 1 - start))
            return web.Response(
                status=206,
                body=found.data[start : end + 1],
                headers={"Content-Range": f"bytes {start}-{end}/{len(found.data)}"},
            )
        with self.lock:
            self.gets.append((path, None, len(found.data)))
        return web.Response(body=found.data)

    def opener(self, ref: BucketRef) -> StandInBucket:
        return StandInBucket(ref, self)


class StandInBucket:
    def __init__(self, ref: BucketRef, storage: Storage) -> None:
        self.ref, self._storage = ref, storage

    def _path(self, key: str) -> str:
        return f"/{self.ref.bucket}/{quote(key)}"

    def _sign(self, method: str, key: str, expires: int, **more: str) -> SignedRequest:
        if self.ref.bucket in self._storage.unsignable:
            raise StorageError(
                Reason.ACCESS_DENIED,
                "the signer was refused (iam.serviceAccounts.signBlob)",
                retryable=False,
            )
        at = int(time.time()) + expires
        path = self._path(key)
        extra = f"{more.get('uploadId', '')}/{more.get('partNumber', '')}"
        query = urlencode({**more, "expires": at, "signature": _signature(method, path, at, extra)})
        self._storage.signed.append(f"{method} {key} {more.get('partNumber', '')}".strip())
        when = dt.datetime.fromtimestamp(at, dt.UTC)
        return SignedRequest(method, f"{self._storage.url}{path}?{query}", {}, when)

    def ensure(
        self,
        owner: str,
        creations: object = None,
        *,
        abort_uploads_after_days: int | None = None,
    ) -> Ensured:
        raise NotImplementedError("the service never creates buckets")

    def check(self) -> None:
        pass

    def presign_put(self, key: str, *, expires: int, size: int | None = None) -> SignedRequest:
        return self._sign("PUT", key, expires)

    def presign_get(self, key: str, *, expires: int) -> SignedRequest:
        return self._sign("GET", key, expires)

    def start_multipart(
        self, key: str, *, parts: int, expires: int, crc32: Sequence[str] | None = None
    ) -> MultipartUpload:
        upload = secrets.token_hex(8)
        signed = tuple(
            self._sign("PUT", key, expires, uploadId=upload, partNumber=str(n))
            for n in range(1, parts + 1)
        )
        return MultipartUpload(key, upload, signed)

    def complete_multipart(
        self,
        key: str,
        upload: MultipartUpload | str,
        etags: Sequence[str],
        crc32: Sequence[str] | None = None,
    ) -> None:
        upload_id = upload if isinstance(upload, str) else upload.upload_id
        with self._storage.lock:
            parts = [self._storage.parts.get((upload_id, n)) for n in range(1, len(etags) + 1)]
            if any(p is None for p in parts):
                raise StorageError(
                    Reason.UPLOAD_INCOMPLETE, "a part was never uploaded", retryable=True
                )
            data = [p for p in parts if p is not None]
            checksums = [crc32_b64(zlib.crc32(p)) for p in data]
            self._storage.objects[self._path(key)] = Stored(
                b"".join(data), composite_crc32(checksums) if crc32 else None
            )

    def abort_multipart(self, key: str, upload: MultipartUpload | str) -> None:
        upload_id = upload if isinstance(upload, str) else upload.upload_id
        with self._storage.lock:
            for part in [p for p in self._storage.parts if p[0] == upload_id]:
                del self._storage.parts[part]
            self._storage.aborted.append((self._path(key), upload_id))

    def presign_parts(
        self,
        key: str,
        upload: MultipartUpload | str,
        numbers: Sequence[int],
        *,
        expires: int,
        crc32: Sequence[str] | None = None,
    ) -> tuple[SignedRequest, ...]:
        upload_id = upload if isinstance(upload, str) else upload.upload_id
        return tuple(
            self._sign("PUT", key, expires, uploadId=upload_id, partNumber=str(n)) for n in numbers
        )

    def list_parts(self, key: str, upload: MultipartUpload | str) -> list[Part]:
        upload_id = upload if isinstance(upload, str) else upload.upload_id
        with self._storage.lock:
            held = [(n, p) for (u, n), p in self._storage.parts.items() if u == upload_id]
        return [
            Part(n, len(p), f'"{hashlib.md5(p).hexdigest()}"')  # noqa: S324 - as S3's ETags
            for n, p in sorted(held)
        ]

    def delete(self, key: str) -> None:
        with self._storage.lock:
            self._storage.objects.pop(self._path(key), None)
            self._storage.deleted.append(self._path(key))

    def stat(self, key: str) -> ObjectStat | None:
        with self._storage.lock:
            found = self._storage.objects.get(self._path(key))
        if found is None:
            return None
        md5 = None if found.crc32 else hashlib.md5(found.data).hexdigest()  # noqa: S324
        return ObjectStat(size=len(found.data), md5=md5, crc32=found.crc32)

    def list_under(self, prefix: str) -> dict[str, ObjectStat]:
        start = self._path(prefix)
        with self._storage.lock:
            held = {p: o for p, o in self._storage.objects.items() if p.startswith(start)}
        base = f"/{self.ref.bucket}/"
        return {
            unquote(p.removeprefix(base)): ObjectStat(
                size=len(o.data),
                md5=None if o.crc32 else hashlib.md5(o.data).hexdigest(),  # noqa: S324
            )
            for p, o in held.items()
        }

    def put(self, key: str, data: bytes) -> None:
        with self._storage.lock:
            self._storage.objects[self._path(key)] = Stored(bytes(data))

    def get(self, key: str) -> bytes | None:
        with self._storage.lock:
            found = self._storage.objects.get(self._path(key))
        return None if found is None else found.data

    def upload(self, key: str, path: Path) -> None:
        self.put(key, path.read_bytes())

    def download(self, key: str, path: Path) -> bool:
        data = self.get(key)
        if data is None:
            return False
        path.write_bytes(data)
        return True
