"""Write and read artifact versions: the service places them, the bytes go straight to
the bucket through pre-signed requests, and a broken bucket costs money, not the run.

Standard library only (``http.client``; zlib-ng's CRC32 when installed): pods import this,
and the upload path must not depend on a cloud SDK. Large files stream with bounded memory
(a 1 MiB block per upload thread, 256 KiB per range being read); multipart parts upload in
parallel, large downloads come as parallel ranges of whole parts (over http all read by
one thread, as their sockets become readable), each part checked against the CRC32 its
writer recorded, both over kept-alive connections (one per thread, or range, and host).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import logging
import os
import selectors
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

# the endpoint and token a pod's clients use, defined once (the collections' client too)
from o41.collections.transport import ENV_ENDPOINT, ENV_TOKEN_FILE, SA_TOKEN
from o41.core.parts import PART_SIZE, crc32_b64, part_count, part_size_for
from o41.core.places import Place

try:  # zlib-ng's CRC32 costs 0.015 CPU seconds a GiB, the standard library's 0.21
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a pod without the wheel: the same CRC32, slower
    from zlib import crc32

log = logging.getLogger("o41")

BLOCK = 1024 * 1024
# What a download reads from the socket at a time (and writes at its offset). Measured on 2
# shared cores, 1 GiB from versitygw (bench/reads.py): blocks of 64-256 KiB cost the client
# ~0.7 s of system time, 512 KiB-1 MiB 1.8-2.7 s (the copies no longer stay in cache).
READ_BLOCK = 256 * 1024
PARALLEL_PARTS = 8
# Downloads: fewer, larger ranges than parts. Measured against versitygw on 2 shared cores
# (1 GiB, medians of alternated runs): 4 x 64 MiB ~800 MiB/s, 8 x 16 MiB ~250-320 MiB/s
# (its concurrent writes into one file cost 3-4x the kernel time), 2 x 64 ~670, 8 x 64 ~540.
RANGE_SIZE = 64 * 1024 * 1024
PARALLEL_RANGES = 4
# How parallel ranges are read over http: "selectors", one thread reading every range's
# socket as it becomes readable (measured faster with the control plane on the same 2
# cores; slower, ~1 GiB/s against ~1.2, when a core is free: docs/placement.md "Reads");
# "threads", a thread per range. https reads on threads (TLS in that loop: not measured).
RANGE_READER = "selectors"
MAX_BEGINS = 6  # each failed location is excluded; the list is short
# A part's URL is signed again by the service when it has less than this left, in batches
# of the next parts to go up: a multi-hour write never sends a part on an expired URL.
RESIGN_MARGIN = 300.0
RESIGN_BATCH = 64


class ArtifactError(Exception):
    """A refusal or failure the user can act on; the message says how."""


class TransportError(ArtifactError):
    """The placement service did not answer (refused, timed out, reset): retry."""


class ServiceError(ArtifactError):
    """The placement service refused or failed a request: ``status`` is its HTTP status,
    ``body`` its JSON answer (``body["error"]`` is the message)."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.status, self.body = status, body


class BadRequest(ServiceError):
    """400, 413, 415, 422: the request is wrong as sent; the message names the field."""


class Unauthorized(ServiceError):
    """401: no token, or one the cluster does not accept."""


class Forbidden(ServiceError):
    """403: the pod's namespace may not use the organization (or the write)."""


class NotFound(ServiceError):
    """404: no such organization, artifact, version or tag."""


class Conflict(ServiceError):
    """409: the state moved under the request (a tag another writer moved: ``current``
    is the version it points at now), or the upload is not complete yet."""

    @property
    def current(self) -> str | None:
        value = self.body.get("current")
        return value if isinstance(value, str) else None


class Unavailable(ServiceError):
    """429, 503 and other 5xx: retry shortly (a location that failed is named)."""


def service_error(status: int, message: str, body: Mapping[str, Any]) -> ServiceError:
    """The :class:`ServiceError` subclass of ``status``."""
    cls: type[ServiceError]
    if status in (400, 413, 415, 422):
        cls = BadRequest
    elif status == 401:
        cls = Unauthorized
    elif status == 403:
        cls = Forbidden
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 429 or status >= 500:
        cls = Unavailable
    else:
        cls = ServiceError
    return cls(status, message, body)


def _failed_location(e: ServiceError) -> str | None:
    """The location a 503 names as unable to take the write now (its bucket failed), so
    the write moves on without it; None for any other refusal."""
    location = e.body.get("location") if e.status == 503 else None
    return location if isinstance(location, str) and location else None


class UploadFailed(ArtifactError):
    """The bucket did not take the bytes: the write begins again elsewhere."""


@dataclass(frozen=True)
class Written:
    version: str
    location: str
    rule: str
    warning: str | None
    size: int
    tag: str | None = None


@dataclass(frozen=True)
class Read:
    version: str  # the version read (what ``latest`` or the tag named)
    location: str
    locality: str
    size: int
    tag: str | None = None  # the tag it was read by, if any


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtifactError(f"not an http(s) URL: {url[:80]!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout, blocksize=BLOCK)
    return conn, _target(parts)


def _target(parts: urllib.parse.SplitResult) -> str:
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


# A kept-alive connection the server closed while idle fails like this on its next use.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class _Pool:
    """Kept-alive connections for one transfer, one per thread and host: its parts and
    ranges reuse them instead of a TCP (and on https a TLS) handshake each. A response
    must be read to its end before the thread's next request."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Callable[[], _Body] | None = None,
    ) -> http.client.HTTPResponse:
        """The response to ``method url``; ``body`` makes the body (again, on a retry). A
        request on a reused connection that the server had closed is sent once more."""
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        mine: dict[tuple[str, str | None, int | None], http.client.HTTPConnection]
        mine = self._local.__dict__.setdefault("connections", {})
        for attempt in (1, 2):
            conn = mine.get(key)
            reused = conn is not None
            if conn is None:
                conn, _ = _connection(url, self.timeout)
                mine[key] = conn
                with self._lock:
                    self._opened.append(conn)
            data = body() if body is not None else None
            try:
                if data is not None and data.digest is None and parts.scheme == "http":
                    conn.putrequest(method, _target(parts))
                    for name, value in headers.items():
                        conn.putheader(name, value)
                    conn.endheaders()
                    assert conn.sock is not None
                    data.sendfile(conn.sock)
                else:  # https (TLS is done in Python), or the bytes are hashed on the way
                    conn.request(method, _target(parts), body=data, headers=dict(headers))
                return conn.getresponse()
            except _STALE:
                del mine[key]
                conn.close()
                if reused and attempt == 1:
                    continue
                raise
            except OSError:
                del mine[key]
                conn.close()
                raise
            finally:
                if data is not None:
                    data.close()
        raise AssertionError("unreachable")

    def forget(self, url: str) -> None:
        """Drop this thread's connection to ``url``'s host (after a failed read)."""
        parts = urllib.parse.urlsplit(url)
        mine = self._local.__dict__.get("connections", {})
        conn = mine.pop((parts.scheme, parts.hostname, parts.port), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            for conn in self._opened:
                conn.close()
            self._opened.clear()


class _Slice:
    """``length`` bytes of a file from ``offset``, read in blocks: a part never sits in
    memory whole."""

    def __init__(
        self,
        path: Path,
        offset: int,
        length: int,
        progress: Callable[[int], None],
        digest: Any = None,
    ) -> None:
        self._file: BinaryIO = path.open("rb")
        self._file.seek(offset)
        self._left = length
        self._progress = progress
        self.digest = digest  # hashed on the way out: no second pass over the file

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n < 0 else min(n, self._left)
        data = self._file.read(n)
        self._left -= len(data)
        self._progress(len(data))
        if self.digest is not None:
            self.digest.update(data)
        return data

    def sendfile(self, sock: socket.socket) -> None:
        """The slice from the page cache to the socket by the kernel (``os.sendfile``): no
        copy through Python, the larger part of a plain-http upload's CPU."""
        while self._left > 0:
            sent = sock.sendfile(self._file, self._file.tell(), min(self._left, 4 * BLOCK))
            if not sent:
                raise ConnectionResetError("the connection closed in the middle of a part")
            self._left -= sent
            self._progress(sent)

    def close(self) -> None:
        self._file.close()


class _BytesSlice:
    """``length`` bytes of a buffer from ``offset``, as :class:`_Slice` reads a file."""

    def __init__(
        self,
        data: memoryview,
        offset: int,
        length: int,
        progress: Callable[[int], None],
        digest: Any = None,
    ) -> None:
        self._data, self._at, self._end = data, offset, offset + length
        self._progress = progress
        self.digest = digest

    def read(self, n: int = -1) -> bytes:
        left = self._end - self._at
        n = left if n < 0 else min(n, left, BLOCK)
        chunk = bytes(self._data[self._at : self._at + n])
        self._at += n
        self._progress(n)
        if self.digest is not None:
            self.digest.update(chunk)
        return chunk

    def sendfile(self, sock: socket.socket) -> None:
        while self._at < self._end:
            n = min(self._end - self._at, 4 * BLOCK)
            sock.sendall(self._data[self._at : self._at + n])
            self._at += n
            self._progress(n)

    def close(self) -> None:
        pass


_Body = _Slice | _BytesSlice


class _Source:
    """What a write uploads: a file by its path (sent by the kernel, never copied) or
    bytes in memory; each part is a slice of it."""

    def __init__(self, path: Path | None = None, data: memoryview | None = None) -> None:
        self.path, self.data = path, data
        if path is not None:
            self.size = path.stat().st_size
        else:
            assert data is not None
            self.size = data.nbytes

    def slice(
        self, offset: int, length: int, progress: Callable[[int], None], digest: Any = None
    ) -> _Body:
        if self.path is not None:
            return _Slice(self.path, offset, length, progress, digest)
        assert self.data is not None
        return _BytesSlice(self.data, offset, length, progress, digest)

    def md5(self, offset: int, length: int) -> str:
        digest = hashlib.md5()  # noqa: S324 - the ETag of a part
        if self.data is not None:
            digest.update(self.data[offset : offset + length])
            return digest.hexdigest()
        assert self.path is not None
        left = length
        with self.path.open("rb") as f:
            f.seek(offset)
            while left > 0 and (block := f.read(min(BLOCK, left))):
                digest.update(block)
                left -= len(block)
        return digest.hexdigest()

    def crc32(self, offset: int, length: int) -> str:
        crc, left = 0, length
        if self.data is not None:
            return crc32_b64(crc32(self.data[offset : offset + length]))
        assert self.path is not None
        with self.path.open("rb") as f:
            f.seek(offset)
            while left > 0 and (block := f.read(min(BLOCK, left))):
                crc = crc32(block, crc)
                left -= len(block)
        return crc32_b64(crc)


def part_checksums(path: Path | _Source, size: int, part_size: int) -> list[str]:
    """Each part's CRC32 (base64), read in parallel: the bucket checks every part against
    it. zlib releases the GIL, so this costs a fraction of the upload."""
    source = path if isinstance(path, _Source) else _Source(path=Path(path))

    def one(n: int) -> str:
        return source.crc32(n * part_size, min(part_size, size - n * part_size))

    with ThreadPoolExecutor(max_workers=PARALLEL_PARTS) as pool:
        return list(pool.map(one, range(part_count(size, part_size))))


class _PartURLs:
    """The upload requests of a multipart write's parts, by number. A part whose URL is
    missing (a resume) or about to expire (a long write) is signed again by the service,
    with the next parts of ``order`` in the same call."""

    def __init__(
        self,
        client: Artifacts,
        version: str,
        order: Sequence[int],
        signed: Mapping[int, Mapping[str, Any]] | None = None,
        expires_in: float = 0.0,
    ) -> None:
        self._client, self._version = client, version
        self._urls: dict[int, Mapping[str, Any]] = dict(signed or {})
        self._order = list(order)
        self._at = {n: i for i, n in enumerate(self._order)}
        self._deadline = time.monotonic() + expires_in - RESIGN_MARGIN
        self._lock = threading.Lock()
        self.resigned = 0  # parts signed again, for the tests

    def __getitem__(self, n: int) -> Mapping[str, Any]:
        with self._lock:
            stale = time.monotonic() >= self._deadline
            if stale or n not in self._urls:
                i = self._at[n]
                batch = self._order[i : i + RESIGN_BATCH]
                answer = self._client.call(
                    "POST", f"/v1/writes/{_q(self._version)}/parts", {"parts": batch}
                )
                if stale:
                    self._urls.clear()
                self._urls.update({p["number"]: p for p in answer["parts"]})
                self._deadline = time.monotonic() + answer["expiresIn"] - RESIGN_MARGIN
                self.resigned += len(batch)
            return self._urls[n]


def _part_matches(source: _Source, offset: int, length: int, held: Mapping[str, Any]) -> bool:
    """Whether a part the bucket holds is this slice of the file: its size, and its CRC32
    or, failing that, its ETag when the ETag is an MD5 (S3 without KMS, GCS)."""
    if held.get("size") != length:
        return False
    if held.get("crc32"):
        return bool(source.crc32(offset, length) == held["crc32"])
    etag = str(held.get("etag") or "").strip('"').lower()
    if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
        return source.md5(offset, length) == etag
    return True  # Azure keeps no checksum of a block: its size is all there is


class Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self._lock = threading.Lock()
        self._shown = -1
        self._on = sys.stderr.isatty() and total > 0

    def __call__(self, n: int) -> None:
        if not self._on:
            return
        with self._lock:
            self.done += n
            percent = self.done * 100 // self.total
            if percent != self._shown:
                self._shown = percent
                bar = "#" * (percent // 4)
                sys.stderr.write(f"\r{self.label} [{bar:<25}] {percent:3d}%")
                if self.done >= self.total:
                    sys.stderr.write("\n")
                sys.stderr.flush()


class Artifacts:
    """The placement service as a pod sees it."""

    def __init__(
        self,
        endpoint: str | None = None,
        token_file: str | None = None,
        place: Place | None = None,
        timeout: float = 60.0,
    ) -> None:
        endpoint = endpoint or os.environ.get(ENV_ENDPOINT)
        if not endpoint:
            raise ArtifactError(
                f"no placement service endpoint: set {ENV_ENDPOINT} or pass --endpoint"
            )
        self.endpoint = endpoint.rstrip("/")
        self.token_file = token_file or os.environ.get(ENV_TOKEN_FILE) or SA_TOKEN
        self._place = place
        self.timeout = timeout

    @property
    def place(self) -> Place:
        if self._place is None:
            from o41.client.place import detect_place

            self._place = detect_place()
        return self._place

    def _token(self) -> str | None:
        try:  # read each time: projected tokens rotate
            return Path(self.token_file).read_text().strip() or None
        except OSError:
            return None

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        conn, target = _connection(self.endpoint + path, self.timeout)
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as e:
            raise TransportError(
                f"the placement service at {self.endpoint} did not answer: {e}; check "
                f"{ENV_ENDPOINT} and that the service runs, then retry"
            ) from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"error": raw[:200].decode(errors="replace")}
        if resp.status >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            raise service_error(resp.status, str(message or f"HTTP {resp.status}"), answer)
        return answer

    # ----------------------------------------------------------------------------- write

    def write(
        self,
        organization: str,
        artifact: str,
        path: str | Path,
        *,
        metadata: Mapping[str, Any] | None = None,
        tag: str | None = None,
        resume: str | None = None,
    ) -> Written:
        """Begin, upload straight to the bucket, commit. When the bucket fails, begin
        again with that location excluded. ``metadata`` (small JSON key/values) is kept
        with the version; ``tag`` is moved to it at commit. ``resume``: the version of a
        multipart write of this same file that did not finish (its pod died): only the
        parts its bucket does not hold yet are sent, then it commits."""
        source = _Source(path=Path(path))
        if resume is not None:
            return self._resume(organization, artifact, source, resume, metadata, tag)
        return self._write(organization, artifact, source, metadata, tag)

    def write_bytes(
        self,
        organization: str,
        artifact: str,
        data: bytes | bytearray | memoryview,
        *,
        metadata: Mapping[str, Any] | None = None,
        tag: str | None = None,
        resume: str | None = None,
    ) -> Written:
        """:meth:`write` of bytes in memory (no copy to a file)."""
        source = _Source(data=memoryview(data).cast("B"))
        if resume is not None:
            return self._resume(organization, artifact, source, resume, metadata, tag)
        return self._write(organization, artifact, source, metadata, tag)

    def _write(
        self,
        organization: str,
        artifact: str,
        source: _Source,
        metadata: Mapping[str, Any] | None,
        tag: str | None,
    ) -> Written:
        size = source.size
        request: dict[str, Any] = {
            "organization": organization,
            "artifact": artifact,
            "place": self.place.as_json(),
            "size": size,
        }
        if metadata is not None:
            request["metadata"] = dict(metadata)
        if tag is not None:
            request["tag"] = tag
        if size > PART_SIZE:
            request["partSize"] = part_size = part_size_for(size)
            request["crc32"] = part_checksums(source, size, part_size)
        exclude: list[str] = []
        for _ in range(MAX_BEGINS):
            try:
                began = self.call("POST", "/v1/writes", {**request, "exclude": exclude})
            except ServiceError as e:
                failed = _failed_location(e)
                if failed is None or failed in exclude:
                    raise
                log.warning("%s; beginning again without location %s", e, failed)
                exclude.append(failed)  # its bucket could not sign: the next one may
                continue
            if began.get("warning"):
                log.warning("%s", began["warning"])
            if "multipart" in began["upload"]:
                log.info(
                    "writing version %s of %s in parts; should this stop, write again with "
                    "resume=%r (o41 write --resume %s) to send only the missing parts",
                    began["version"],
                    artifact,
                    began["version"],
                    began["version"],
                )
            try:
                etags, md5 = self._upload(source, size, began, began["location"])
            except UploadFailed as e:
                log.warning("%s; beginning again without location %s", e, began["location"])
                exclude.append(began["location"])
                continue
            commit: dict[str, Any] = {"etags": etags}
            if md5:
                commit["md5"] = md5
            done = self.call("POST", f"/v1/writes/{began['version']}/commit", commit)
            return Written(
                began["version"],
                began["location"],
                began["rule"],
                began.get("warning"),
                size,
                done.get("tag"),
            )
        raise ArtifactError(f"gave up after {MAX_BEGINS} locations failed: {', '.join(exclude)}")

    def _resume(
        self,
        organization: str,
        artifact: str,
        source: _Source,
        version: str,
        metadata: Mapping[str, Any] | None,
        tag: str | None,
    ) -> Written:
        """Finish the pending multipart write ``version``: ask which parts its bucket
        holds, keep those that match the file, send the others, commit."""
        size = source.size
        found = self.call("GET", f"/v1/writes/{_q(version)}")
        if (found["organization"], found["artifact"]) != (organization, artifact):
            raise ArtifactError(
                f"write {version} is of {found['organization']}/{found['artifact']}, not "
                f"{organization}/{artifact}: resume it with those names"
            )
        if found["size"] != size:
            raise ArtifactError(
                f"write {version} began with {found['size']} bytes, but the file has {size}: "
                "resume with the same file, or write it again without resume"
            )
        if not found["multipart"] or not found["partSize"]:
            raise ArtifactError(
                f"write {version} is one PUT, not parts: write it again without resume"
            )
        part_size: int = found["partSize"]
        parts: int = found["parts"]
        kept: dict[int, str] = {}
        for held in found["present"]:
            n = held["number"]
            offset = (n - 1) * part_size
            if _part_matches(source, offset, min(part_size, size - offset), held):
                kept[n] = str(held.get("etag") or "")
        missing = [n for n in range(1, parts + 1) if n not in kept]
        log.info("resuming write %s: %d of %d parts are in the bucket", version, len(kept), parts)
        urls = _PartURLs(self, version, missing)
        etags = self._parts(source, size, part_size, parts, urls, found["location"], kept)
        commit: dict[str, Any] = {"etags": etags}
        if metadata is not None:
            commit["metadata"] = dict(metadata)
        if tag is not None:
            commit["tag"] = tag
        done = self.call("POST", f"/v1/writes/{_q(version)}/commit", commit)
        return Written(version, done["location"], found["rule"], None, size, done.get("tag"))

    def _parts(
        self,
        source: _Source,
        size: int,
        part_size: int,
        parts: int,
        urls: _PartURLs,
        location: str,
        kept: Mapping[int, str],
    ) -> list[str]:
        """Send the parts not ``kept`` (number: ETag); every part's ETag, in order."""
        progress = Progress(size, f"upload to {location}")
        pool = _Pool(self.timeout)

        def one(n: int) -> str:
            if n in kept:
                return kept[n]
            offset = (n - 1) * part_size
            length = min(part_size, size - offset)

            def body() -> _Body:
                return source.slice(offset, length, progress)

            return self._put(pool, urls[n], body, length, location)

        try:
            with ThreadPoolExecutor(max_workers=PARALLEL_PARTS) as threads:
                return list(threads.map(one, range(1, parts + 1)))
        finally:
            pool.close()

    def _upload(
        self, source: _Source, size: int, began: Mapping[str, Any], location: str
    ) -> tuple[list[str], str | None]:
        """Upload the file; returns each part's ETag, and the MD5 of a single upload."""
        upload: Mapping[str, Any] = began["upload"]
        if "multipart" in upload:
            spec = upload["multipart"]
            count = len(spec["parts"])
            signed = {n: spec["parts"][n - 1] for n in range(1, count + 1)}
            order = range(1, count + 1)
            urls = _PartURLs(self, began["version"], order, signed, began["expiresIn"])
            return self._parts(source, size, spec["partSize"], count, urls, location, {}), None
        progress = Progress(size, f"upload to {location}")
        pool = _Pool(self.timeout)
        try:
            if "single" in upload:
                hashes: list[Any] = []  # a retry hashes from the start again

                def whole() -> _Body:
                    hashes.append(hashlib.md5())  # noqa: S324 - integrity
                    return source.slice(0, size, progress, hashes[-1])

                self._put(pool, upload["single"], whole, size, location)
                return [], hashes[-1].hexdigest()
            raise ArtifactError("the service answered no upload: update the client")
        finally:
            pool.close()

    def _put(
        self,
        pool: _Pool,
        req: Mapping[str, Any],
        body: Callable[[], _Body],
        length: int,
        location: str,
    ) -> str:
        headers = {**req["headers"], "Content-Length": str(length)}
        try:
            resp = pool.request(req["method"], req["url"], headers, body)
            detail = resp.read()  # to its end: the connection serves the next part
        except OSError as e:
            pool.forget(req["url"])
            raise UploadFailed(f"upload to location {location} failed: {e}") from None
        if resp.status >= 300:
            raise UploadFailed(
                f"location {location} refused the upload (HTTP {resp.status}: "
                f"{detail[:200].decode(errors='replace')})"
            )
        return (resp.getheader("ETag") or "").strip()

    # ------------------------------------------------------------------------------ read

    def locate(self, organization: str, artifact: str, version: str) -> dict[str, Any]:
        """Where ``version`` (an id, ``latest`` or a tag) lives, and a signed download;
        the answer's ``version`` is the one the service resolved."""
        place = self.place
        query = urllib.parse.urlencode({k: v for k, v in place.as_json().items() if v is not None})
        found: dict[str, Any] = self.call(
            "GET",
            f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/versions/"
            f"{_q(version)}?{query}",
        )
        return found

    def read(self, organization: str, artifact: str, version: str, output: str | Path) -> Read:
        """Download a version (an id, ``latest`` or a tag) to ``output`` (written whole or
        not at all)."""
        found = self.locate(organization, artifact, version)
        got = download(found, output, self.timeout)
        return Read(found["version"], found["location"], found["locality"], got, found.get("tag"))

    def read_bytes(self, organization: str, artifact: str, version: str) -> tuple[bytes, Read]:
        """A version's bytes in memory, checked against its size, and its recorded parts'
        CRC32s or its MD5; a large version comes as parallel ranges straight into place."""
        found = self.locate(organization, artifact, version)
        data: bytes | bytearray | None = None
        if found["size"] > range_size(found) and (
            _recorded_parts(found) is not None or not found.get("md5")
        ):
            data = bytearray(found["size"])
            try:
                _into_memory(found, memoryview(data), 0, self.timeout, parallel=True)
            except _NoRanges:
                data = None
        if data is None:
            with RangeReader(found, self.timeout) as raw:
                data = raw.readall()
        return bytes(data) if isinstance(data, bytearray) else data, Read(
            found["version"], found["location"], found["locality"], len(data), found.get("tag")
        )

    def read_range(
        self, organization: str, artifact: str, version: str, start: int, length: int
    ) -> tuple[bytes, Read]:
        """``length`` bytes of a version from offset ``start`` (:func:`read_range`)."""
        found = self.locate(organization, artifact, version)
        data = read_range(found, start, length, self.timeout)
        return data, Read(
            found["version"], found["location"], found["locality"], len(data), found.get("tag")
        )

    # ------------------------------------------------------------------ versions and tags

    def versions_page(
        self, organization: str, artifact: str, cursor: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """One page of an artifact's versions, newest first (``next``: the next page's
        cursor, or None after the last)."""
        query = urllib.parse.urlencode({"limit": limit, **({"cursor": cursor} if cursor else {})})
        page: dict[str, Any] = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/versions?{query}"
        )
        return page

    def artifacts_page(
        self, organization: str, cursor: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        query = urllib.parse.urlencode({"limit": limit, **({"cursor": cursor} if cursor else {})})
        page: dict[str, Any] = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts?{query}"
        )
        return page

    def resolve(self, organization: str, artifact: str, ref: str) -> dict[str, Any]:
        """The version ``ref`` (an id, ``latest`` or a tag) names, with its metadata."""
        found: dict[str, Any] = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags/{_q(ref)}"
        )
        return found

    def tags(self, organization: str, artifact: str) -> list[dict[str, Any]]:
        found = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags"
        )
        tags: list[dict[str, Any]] = found["tags"]
        return tags

    def move_tag(
        self,
        organization: str,
        artifact: str,
        tag: str,
        version: str,
        expected: str | None = None,
        *,
        check: bool = False,
    ) -> dict[str, Any]:
        """Point ``tag`` at ``version``. With ``check``, only if it points at ``expected``
        now (None: only if it does not exist); a writer that lost gets :class:`Conflict`."""
        body: dict[str, Any] = {"version": version}
        if check:
            body["expected"] = expected
        moved: dict[str, Any] = self.call(
            "PUT",
            f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags/{_q(tag)}",
            body,
        )
        return moved

    def delete_tag(
        self, organization: str, artifact: str, tag: str, expected: str | None = None
    ) -> dict[str, Any]:
        query = f"?expected={_q(expected)}" if expected else ""
        deleted: dict[str, Any] = self.call(
            "DELETE",
            f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags/{_q(tag)}{query}",
        )
        return deleted


def download(found: Mapping[str, Any], output: str | Path, timeout: float = 60.0) -> int:
    """A located version (:meth:`Artifacts.locate`) to the file ``output``, written whole
    or not at all: the bytes go to ``output.o41-partial`` beside it, renamed over
    ``output`` once every check passed (a failure leaves ``output`` as it was). A version
    larger than one range comes as parallel ranges; its size, and each recorded part's
    CRC32 (else its MD5), are checked. Returns the size."""
    output = Path(output)
    partial = output.with_name(output.name + ".o41-partial")
    size: int = found["size"]
    progress = Progress(size, f"download from {found['location']}")
    pool = _Pool(timeout)
    try:
        whole = _recorded_parts(found) is None and found.get("md5")
        if whole or size <= range_size(found):
            got = _stream(pool, found, partial, progress)
        else:
            try:
                got = _ranges(pool, found, partial, progress)
            except _NoRanges:
                got = _stream(pool, found, partial, progress)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise ArtifactError(f"download from {found['location']} failed: {e}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        pool.close()
    partial.replace(output)
    return got


def _stream(pool: _Pool, found: Mapping[str, Any], partial: Path, progress: Progress) -> int:
    """The object in one GET, checked against the MD5 the service gave (single-part
    objects: the bucket's ETag), its recorded parts' CRC32s and the size."""
    req = found["download"]
    md5 = hashlib.md5() if found.get("md5") else None  # noqa: S324 - integrity
    check = _PartCheck(found, 0)
    got = 0
    resp = pool.request(req["method"], req["url"], req["headers"])
    if resp.status != 200:
        resp.read()
        raise ArtifactError(
            f"location {found['location']} answered HTTP {resp.status} to the download"
        )
    block = memoryview(bytearray(READ_BLOCK))  # one buffer, filled again and again
    with partial.open("wb") as out:
        while n := resp.readinto(block):
            out.write(block[:n])
            if md5 is not None:
                md5.update(block[:n])
            check.update(block[:n], got)
            got += n
            progress(n)
    if got != found["size"] or (md5 is not None and md5.hexdigest() != found["md5"]):
        raise Damaged(
            f"download of {found.get('version', 'the version')} is damaged ({got} of "
            f"{found['size']} bytes, or a bad checksum): read it again"
        )
    return got


def _ranges(pool: _Pool, found: Mapping[str, Any], partial: Path, progress: Progress) -> int:
    """The object as parallel ranges (:func:`range_size`), each written at its offset
    as it comes and each whole part checked against its recorded CRC32: memory stays
    at a block per thread."""
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.ftruncate(fd, found["size"])
        return _parallel_ranges(pool, found, _FileSink(fd), progress)
    finally:
        os.close(fd)


class Damaged(ArtifactError):
    """The bytes read are not those written: a part's CRC32 (or the object's MD5 or size)
    differs from what the writer recorded. ``part`` is the part's number (1-based), when
    one part is to blame."""

    def __init__(self, message: str, part: int | None = None) -> None:
        super().__init__(message)
        self.part = part


def _recorded_parts(found: Mapping[str, Any]) -> tuple[int, list[str]] | None:
    """(part size, each part's CRC32) of a version whose writer recorded them, or None."""
    part_size, sums, size = found.get("partSize"), found.get("crc32"), found["size"]
    if not isinstance(part_size, int) or part_size <= 0 or not isinstance(sums, list):
        return None
    if len(sums) != part_count(size, part_size):
        return None  # not this object's parts: nothing to check against
    return part_size, sums


def range_size(found: Mapping[str, Any]) -> int:
    """The size of the parallel ranges of a download: RANGE_SIZE, made a whole number of
    the version's recorded parts (so that every range can be checked part by part)."""
    recorded = _recorded_parts(found)
    if recorded is None:
        return RANGE_SIZE
    part_size = recorded[0]
    return max(part_size, RANGE_SIZE // part_size * part_size)


class _PartCheck:
    """The CRC32 of each recorded part that a range covers whole, computed as the range's
    bytes come (zlib releases the GIL) and compared at the part's last byte. A part the
    range covers only in part is not checked."""

    def __init__(self, found: Mapping[str, Any], start: int) -> None:
        self._found = found
        recorded = _recorded_parts(found)
        self._on = recorded is not None
        self._part_size, self._sums = recorded if recorded is not None else (1, [])
        self._n = start // self._part_size  # the part the next byte belongs to (0-based)
        self._crc: int | None = 0 if start % self._part_size == 0 else None  # None: partial
        self.checked = 0

    def update(self, view: memoryview, at: int) -> None:
        """``view`` holds the object's bytes from offset ``at``."""
        if not self._on:
            return
        size = self._found["size"]
        while len(view):
            part_end = min((self._n + 1) * self._part_size, size)
            take = min(len(view), part_end - at)
            if self._crc is not None:
                self._crc = crc32(view[:take], self._crc)
            at += take
            view = view[take:]
            if at == part_end:
                if self._crc is not None:
                    self._compare(self._crc)
                self._n += 1
                self._crc = 0

    def _compare(self, crc: int) -> None:
        got, recorded = crc32_b64(crc), self._sums[self._n]
        if got != recorded:
            first = self._n * self._part_size
            last = min(first + self._part_size, self._found["size"]) - 1
            raise Damaged(
                f"part {self._n + 1} of {len(self._sums)} (bytes {first}-{last}) of version "
                f"{self._found.get('version', '?')} at location {self._found.get('location', '?')}"
                f" has CRC32 {got}, but its writer recorded {recorded}: the bucket's copy is "
                "damaged. Nothing was written; read it again, and if this repeats, write the "
                "version again",
                part=self._n + 1,
            )
        self.checked += 1


class _FileSink:
    """Where ranges land in a file: each block written at its offset (``os.pwrite``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def buffer(self) -> memoryview:
        return memoryview(bytearray(READ_BLOCK))

    def into(self, block: memoryview, at: int, length: int) -> memoryview:
        return block[:length]

    def put(self, view: memoryview, at: int) -> None:
        while len(view):
            n = os.pwrite(self.fd, view, at)
            view, at = view[n:], at + n


class _MemorySink:
    """Where ranges land in memory: read straight into the buffer that holds the object's
    bytes from offset ``base`` on, no copy."""

    def __init__(self, out: memoryview, base: int = 0) -> None:
        self.out, self.base = out, base

    def buffer(self) -> memoryview:
        return self.out

    def into(self, block: memoryview, at: int, length: int) -> memoryview:
        return self.out[at - self.base : at - self.base + length]

    def put(self, view: memoryview, at: int) -> None:
        pass  # already there


_Sink = _FileSink | _MemorySink


def _check_head(
    resp: http.client.HTTPResponse, found: Mapping[str, Any], start: int, end: int
) -> str:
    """The answer's status and Content-Range are those of bytes ``start``-``end`` of this
    object (returned as a Content-Range says it, for the caller's own messages); raises
    :class:`_NoRanges` when the store answers with the whole object."""
    size = found["size"]
    if resp.status == 200 and not (start == 0 and end == size - 1):
        raise _NoRanges
    if resp.status not in (200, 206):
        raise ArtifactError(
            f"location {found['location']} answered HTTP {resp.status} to the download"
        )
    expected = f"bytes {start}-{end}/{size}"
    answered = resp.getheader("Content-Range", "").replace("bytes=", "bytes ")
    if resp.status == 206 and answered != expected:
        raise ArtifactError(
            f"location {found['location']} answered {resp.getheader('Content-Range')!r}"
            f" to a request for {expected}: the object changed? read it again"
        )
    return expected


def _get_range(
    pool: _Pool,
    found: Mapping[str, Any],
    start: int,
    end: int,
    sink: _Sink,
    progress: Callable[[int], None],
) -> int:
    """Bytes ``start`` to ``end`` (inclusive) of the object into ``sink``, each whole part
    checked; raises :class:`_NoRanges` when the store answers with the whole object."""
    req = found["download"]
    headers = {**req["headers"], "Range": f"bytes={start}-{end}"}
    resp = pool.request(req["method"], req["url"], headers)
    try:
        _check_head(resp, found, start, end)
    except _NoRanges:
        pool.forget(req["url"])  # the store ignores ranges
        raise
    except ArtifactError:
        resp.read()  # the connection stays usable for the next range
        raise
    check = _PartCheck(found, start)
    at, block = start, sink.buffer()
    try:
        while at <= end:
            into = sink.into(block, at, min(READ_BLOCK, end + 1 - at))
            n = resp.readinto(into)
            if not n:
                break
            view = into[:n]
            sink.put(view, at)
            check.update(view, at)
            at += n
            progress(n)
    except OSError:
        pool.forget(req["url"])
        raise
    except Damaged:
        pool.forget(req["url"])  # the rest of the answer is not read
        raise
    if at != end + 1:
        pool.forget(req["url"])
        raise ArtifactError(f"download of bytes {start}-{end} stopped at byte {at}: read it again")
    if not resp.isclosed() and resp.read():  # a chunked answer's last chunk: read it, so
        pool.forget(req["url"])  # that the connection takes the next range
        raise ArtifactError(f"the answer to bytes {start}-{end} went on past them: read it again")
    return at - start


def _parallel_ranges(
    pool: _Pool, found: Mapping[str, Any], sink: _Sink, progress: Callable[[int], None]
) -> int:
    """The whole object as ranges of :func:`range_size`, PARALLEL_RANGES at a time (one
    thread over http with RANGE_READER "selectors", else a thread each)."""
    if RANGE_READER == "selectors" and found["download"]["url"].startswith("http:"):
        return _selected_ranges(pool.timeout, found, sink, progress)
    size, step = found["size"], range_size(found)

    def one(number: int) -> int:
        start = number * step
        return _get_range(pool, found, start, min(size, start + step) - 1, sink, progress)

    with ThreadPoolExecutor(max_workers=PARALLEL_RANGES) as threads:
        return sum(threads.map(one, range(part_count(size, step))))


class _Reading:
    """One range in flight on its own connection, read by :func:`_selected_ranges` when
    its socket is readable."""

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        found: Mapping[str, Any],
        start: int,
        end: int,
        sink: _Sink,
        reused: bool,
    ) -> None:
        self.conn, self.found, self.start, self.end, self.sink = conn, found, start, end, sink
        self.reused = reused  # kept alive from an earlier range: the server may have closed it
        if conn.sock is None:
            conn.connect()
        assert conn.sock is not None
        self.sock: socket.socket = conn.sock
        self.at = start
        self.resp: http.client.HTTPResponse | None = None
        self.block = sink.buffer()
        self.check = _PartCheck(found, start)

    def send(self) -> None:
        req = self.found["download"]
        headers = {**req["headers"], "Range": f"bytes={self.start}-{self.end}"}
        self.conn.request(
            req["method"], _target(urllib.parse.urlsplit(req["url"])), headers=headers
        )

    def answered(self) -> int:
        """The response's head (it has come: the socket was readable), checked as
        :func:`_get_range` checks it; then the body bytes that came with it."""
        resp = self.resp = self.conn.getresponse()
        expected = _check_head(resp, self.found, self.start, self.end)
        if resp.chunked or resp.length is None:
            raise _NoRanges  # framed by chunks or by the close: left to http.client (one GET)
        if resp.length != self.end + 1 - self.start:
            raise ArtifactError(
                f"location {self.found['location']} answered {resp.length} bytes to a request "
                f"for {expected}: read it again"
            )
        self.sock.setblocking(False)  # from here on, read only what has come
        # reading the head may have buffered body bytes that the socket no longer shows
        return self.read()

    def read(self) -> int:
        """What has come (0 if nothing yet), written at its offset and checked."""
        assert self.resp is not None and self.resp.fp is not None
        into = self.sink.into(self.block, self.at, min(READ_BLOCK, self.end + 1 - self.at))
        n = self.resp.fp.readinto1(into)  # the buffered bytes, else one recv
        if n is None:
            return 0
        if not n:
            raise ArtifactError(
                f"download of bytes {self.start}-{self.end} stopped at byte {self.at}: "
                "read it again"
            )
        view = into[:n]
        self.sink.put(view, self.at)
        self.check.update(view, self.at)
        self.at += n
        return n

    @property
    def done(self) -> bool:
        return self.at > self.end

    def finish(self, timeout: float) -> http.client.HTTPConnection | None:
        """The connection, ready for the next range (None if the server closed it)."""
        assert self.resp is not None
        self.resp.close()  # read to its end: the connection stays open...
        if self.conn.sock is None:  # ...unless the server said it closes it
            return None
        self.sock.settimeout(timeout)
        return self.conn


def _selected_ranges(
    timeout: float, found: Mapping[str, Any], sink: _Sink, progress: Callable[[int], None]
) -> int:
    """The whole object as ranges of :func:`range_size`, PARALLEL_RANGES at a time on as
    many kept-alive connections, all read by this one thread as their sockets become
    readable: no GIL handed between threads per block, one writer to the file (measured
    with the control plane on the same 2 cores: docs/placement.md, "Reads")."""
    size, step = found["size"], range_size(found)
    todo = [(s, min(size, s + step) - 1) for s in range(0, size, step)][::-1]  # pop: first
    opened: list[http.client.HTTPConnection] = []
    got = 0
    with selectors.DefaultSelector() as selector:

        def begin(start: int, end: int, conn: http.client.HTTPConnection | None) -> None:
            reused = conn is not None
            if conn is None:
                conn, _ = _connection(found["download"]["url"], timeout)
                opened.append(conn)
            reading = _Reading(conn, found, start, end, sink, reused)
            try:
                reading.send()
            except _STALE:
                if not reused:
                    raise
                conn.close()
                begin(start, end, None)  # once more, on a new connection
                return
            selector.register(reading.sock, selectors.EVENT_READ, reading)

        try:
            while todo and len(opened) < PARALLEL_RANGES:
                begin(*todo.pop(), None)
            while selector.get_map():
                events = selector.select(timeout)
                if not events:
                    raise TimeoutError(f"the store sent nothing for {timeout:.0f} s")
                for key, _ in events:
                    reading: _Reading = key.data
                    if reading.resp is not None:
                        n = reading.read()
                    else:
                        try:
                            n = reading.answered()
                        except _STALE:  # closed while idle: the range on a new connection
                            if not reading.reused:
                                raise
                            selector.unregister(key.fileobj)
                            reading.conn.close()
                            begin(reading.start, reading.end, None)
                            continue
                    got += n
                    progress(n)
                    if reading.done:
                        selector.unregister(key.fileobj)
                        kept = reading.finish(timeout)
                        if todo:
                            begin(*todo.pop(), kept)
        finally:
            for conn in opened:
                conn.close()
    return got


def read_range(found: Mapping[str, Any], start: int, length: int, timeout: float = 60.0) -> bytes:
    """``length`` bytes of a located version (:meth:`Artifacts.locate`) from offset
    ``start`` (fewer at its end), in one ranged GET; each recorded part the range covers
    whole is checked against its CRC32 (:class:`Damaged` if it differs). For a reader that
    wants pieces of a version (a file system, a file object): locate once (the download
    URL lasts 15 minutes), then read ranges."""
    size = found["size"]
    if start < 0 or length < 0:
        raise ValueError("start and length must not be negative")
    length = max(0, min(length, size - start))
    if length == 0:
        return b""
    out = bytearray(length)
    try:
        _into_memory(found, memoryview(out), start, timeout, parallel=False)
    except _NoRanges:
        raise ArtifactError(
            f"location {found['location']} does not serve ranges: read the version whole"
        ) from None
    return bytes(out)


def _into_memory(
    found: Mapping[str, Any], out: memoryview, start: int, timeout: float, *, parallel: bool
) -> None:
    """The object's bytes from ``start`` into ``out`` (all of it, and in parallel ranges,
    with ``parallel``; else one ranged GET), checked part by part."""
    pool = _Pool(timeout)
    sink = _MemorySink(out, start)
    try:
        if parallel:
            _parallel_ranges(pool, found, sink, lambda n: None)
        else:
            _get_range(pool, found, start, start + len(out) - 1, sink, lambda n: None)
    except OSError as e:
        raise ArtifactError(
            f"download from {found['location']} failed: {e}; read it again"
        ) from None
    finally:
        pool.close()


class _NoRanges(Exception):
    """The store answered a ranged GET with the whole object."""


class RangeReader(io.RawIOBase):
    """A version's bytes as a file object, read from the bucket as they are asked for: one
    streaming GET from the current position, a ranged GET again after a seek. Read from
    start to end without seeking, the bytes are checked against the version's size and,
    when the service gave one, its MD5 (:class:`ArtifactError` at the end if they differ)."""

    def __init__(self, found: Mapping[str, Any], timeout: float) -> None:
        super().__init__()
        self._found = found
        self._size: int = found["size"]
        self._timeout = timeout
        self._pos = 0
        self._resp: http.client.HTTPResponse | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._md5: Any = hashlib.md5() if found.get("md5") else None  # noqa: S324 - integrity
        self._whole = True  # read from 0 without a seek: the MD5 can be checked
        self._check = _PartCheck(found, 0)  # the recorded parts read whole since the seek

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        pos = max(0, base + offset)
        if pos != self._pos:
            self._drop()
            self._whole = False
            self._pos = pos
        return self._pos

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._resp = None

    def _open(self) -> http.client.HTTPResponse:
        req = self._found["download"]
        conn, target = _connection(req["url"], self._timeout)
        headers = dict(req["headers"])
        if self._pos:
            headers["Range"] = f"bytes={self._pos}-"
        try:
            conn.request(req["method"], target, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise ArtifactError(
                f"download from {self._found['location']} failed: {e}; read it again"
            ) from None
        if resp.status not in (200, 206) or (self._pos and resp.status != 206):
            conn.close()
            raise ArtifactError(
                f"location {self._found['location']} answered HTTP {resp.status} to the "
                "download: read it again (the URL lasts 15 minutes)"
            )
        self._conn, self._resp = conn, resp
        self._check = _PartCheck(self._found, self._pos)
        return resp

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            self._finish()
            return 0
        resp = self._resp or self._open()
        try:
            n = resp.readinto(memoryview(buffer)[: self._size - self._pos])
        except OSError as e:
            self._drop()
            raise ArtifactError(
                f"download from {self._found['location']} failed: {e}; read it again"
            ) from None
        if n == 0:
            self._drop()
            raise ArtifactError(
                f"download of {self._found['version']} stopped at byte {self._pos} of "
                f"{self._size}: read it again"
            )
        if self._md5 is not None and self._whole:
            self._md5.update(memoryview(buffer)[:n])
        try:
            self._check.update(memoryview(buffer)[:n], self._pos)
        except Damaged:
            self._drop()
            raise
        self._pos += n
        if self._pos >= self._size:
            self._finish()
        return n

    def _finish(self) -> None:
        self._drop()
        if self._md5 is not None and self._whole and self._md5.hexdigest() != self._found["md5"]:
            self._md5 = None
            raise Damaged(
                f"download of {self._found['version']} is damaged (a bad checksum): read it again"
            )

    def readall(self) -> bytes:
        out = bytearray(self._size - self._pos)
        view, at = memoryview(out), 0
        while at < len(out):
            n = self.readinto(view[at:])
            at += n
        self._finish()
        return bytes(out)

    def close(self) -> None:
        self._drop()
        super().close()
