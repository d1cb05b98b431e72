"""Bytes to and from pre-signed URLs: the connections a transfer keeps alive (its part
pool), what an upload sends (a file by its path, sent by the kernel, or bytes in memory,
cut into parts that go up in parallel), the parts' URLs signed again before they expire,
and the checksums: each part's CRC32 sent with the begin, and checked again on the way
back.

Standard library only (``http.client``; zlib-ng's CRC32 when installed): pods import this,
and the upload path must not depend on a cloud SDK. Memory stays bounded: a 1 MiB block
per upload thread, whatever the size of the file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from o41.client.errors import ArtifactError, ConfigError, Damaged, UploadFailed
from o41.client.progress import Callback, Progress
from o41.client.tls import system_context
from o41.core.parts import crc32_b64, part_count

try:  # zlib-ng's CRC32 costs 0.015 CPU seconds a GiB, the standard library's 0.21
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a pod without the wheel: the same CRC32, slower
    from zlib import crc32

BLOCK = 1024 * 1024
PARALLEL_PARTS = 8
# A part's URL is signed again by the service when it has less than this left, in batches
# of the next parts to go up: a multi-hour write never sends a part on an expired URL.
RESIGN_MARGIN = 300.0
RESIGN_BATCH = 64


def connection(
    url: str, timeout: float, context: ssl.SSLContext | None = None
) -> tuple[http.client.HTTPConnection, str]:
    """A connection to ``url``'s host and the request target. ``https``: checked with
    ``context`` (the placement service's, ``o41.client.tls.service_context``), by
    default the system's roots (the buckets' pre-signed URLs). Through the proxy the
    environment names for it (:func:`proxy_for`): an ``https`` URL through a CONNECT
    tunnel (TLS end to end, checked against the URL's host), a plain ``http`` one in
    absolute form. Not connected yet: ``connect()`` makes the connection, its tunnel and
    its TLS handshake, the requests come after."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtifactError(f"not an http(s) URL: {url[:80]!r}")
    proxy = proxy_for(parts)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        host, port = (parts.hostname, parts.port) if proxy is None else proxy.address
        conn = http.client.HTTPSConnection(
            host, port, timeout=timeout, blocksize=BLOCK, context=context or system_context()
        )
        if proxy is not None:
            conn.set_tunnel(parts.hostname, parts.port or 443, headers=proxy.headers)
    elif proxy is not None:
        conn = _AbsoluteForm(*proxy.address, proxy.headers, timeout=timeout, blocksize=BLOCK)
    else:
        conn = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=timeout, blocksize=BLOCK
        )
    return conn, target(parts)


def target(parts: urllib.parse.SplitResult) -> str:
    """The request target of a URL: its path and query, or the whole URL (absolute form)
    when a plain ``http`` request goes through a proxy (:func:`proxy_for`)."""
    path = parts.path or "/"
    path = f"{path}?{parts.query}" if parts.query else path
    if parts.scheme == "http" and proxy_for(parts) is not None:
        return f"http://{parts.netloc.rpartition('@')[2]}{path}"
    return path


class _AbsoluteForm(http.client.HTTPConnection):
    """A plain ``http`` connection to a proxy: its requests name whole URLs (the caller's
    target), each with the proxy's credentials, if any."""

    def __init__(
        self, host: str, port: int, proxy_headers: Mapping[str, str], **kwargs: Any
    ) -> None:
        super().__init__(host, port, **kwargs)
        self._proxy_headers = dict(proxy_headers)

    def putrequest(
        self, method: str, url: str, skip_host: bool = False, skip_accept_encoding: bool = False
    ) -> None:
        super().putrequest(method, url, skip_host, skip_accept_encoding)
        for name, value in self._proxy_headers.items():
            self.putheader(name, value)


class Proxy:
    """A proxy on the way: where it listens, and the header its credentials make."""

    def __init__(self, url: str) -> None:
        given = url if "://" in url else f"http://{url}"  # "proxy:3128", as requests takes it
        parts = urllib.parse.urlsplit(given)
        if parts.scheme != "http" or not parts.hostname:
            raise ConfigError(
                f"proxy {_shown(url)!r}: only http:// proxies are supported (an https:// URL "
                "still goes through one, in a CONNECT tunnel): fix HTTPS_PROXY or HTTP_PROXY"
            )
        self.url = _shown(given)
        self.address: tuple[str, int] = (parts.hostname, parts.port or 80)
        self.headers: dict[str, str] = {}
        if parts.username is not None:
            import base64

            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            basic = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Proxy-Authorization"] = f"Basic {basic}"


def _shown(url: str) -> str:
    """A proxy's URL without its password, to name it in a message."""
    scheme, sep, rest = url.rpartition("://")
    userinfo, at, hostport = rest.rpartition("@")
    return f"{scheme}{sep}{userinfo.partition(':')[0] + at if at else ''}{hostport}"


_PROXY_ENV = (
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
    "REQUEST_METHOD",
)
_proxies: tuple[tuple[str | None, ...], dict[str, str], dict[tuple[str, str], Proxy | None]] = (
    (None,) * len(_PROXY_ENV),
    {},
    {},
)
_proxies_lock = threading.Lock()


def proxy_for(parts: urllib.parse.SplitResult) -> Proxy | None:
    """The proxy a request to ``parts`` goes through, chosen as requests and urllib3 do
    (``urllib.request.getproxies_environment`` and ``proxy_bypass_environment``):
    ``https_proxy``/``HTTPS_PROXY`` for an ``https`` URL, ``http_proxy``/``HTTP_PROXY``
    for an ``http`` one, ``all_proxy``/``ALL_PROXY`` for either (the lowercase name
    first), unless ``no_proxy``/``NO_PROXY`` names the host (``*``, a name, a domain
    suffix, ``host:port``). None: straight there. The environment is read at each call
    (cheap while nothing there changed), so a variable set later is honoured."""
    global _proxies
    env = tuple(os.environ.get(name) for name in _PROXY_ENV)
    if not any(env[:6]):
        return None  # the common case: no proxy, and urllib.request never imported
    host = parts.hostname or ""
    hostport = f"{host}:{parts.port}" if parts.port else host
    with _proxies_lock:
        seen, proxies, chosen = _proxies
        if seen != env:
            import urllib.request

            proxies = urllib.request.getproxies_environment()
            chosen = {}
            _proxies = (env, proxies, chosen)
        key = (parts.scheme, hostport)
        if key not in chosen:
            from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]

            url = proxies.get(parts.scheme) or proxies.get("all")
            bypass = not url or proxy_bypass_environment(hostport, proxies)
            chosen[key] = None if bypass else Proxy(str(url))
        return chosen[key]


# A kept-alive connection the server closed while idle fails like this on its next use.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class Pool:
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
        body: Callable[[], Body] | None = None,
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
                conn, _ = connection(url, self.timeout)
                mine[key] = conn
                with self._lock:
                    self._opened.append(conn)
            data = body() if body is not None else None
            try:
                if data is not None and data.digest is None and parts.scheme == "http":
                    conn.putrequest(method, target(parts))
                    for name, value in headers.items():
                        conn.putheader(name, value)
                    conn.endheaders()
                    assert conn.sock is not None
                    data.sendfile(conn.sock)
                else:  # https (TLS is done in Python), or the bytes are hashed on the way
                    conn.request(method, target(parts), body=data, headers=dict(headers))
                return conn.getresponse()
            except STALE:
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


class Slice:
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


class BytesSlice:
    """``length`` bytes of a buffer from ``offset``, as :class:`Slice` reads a file."""

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


Body = Slice | BytesSlice


class Source:
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
    ) -> Body:
        if self.path is not None:
            return Slice(self.path, offset, length, progress, digest)
        assert self.data is not None
        return BytesSlice(self.data, offset, length, progress, digest)

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


def part_checksums(path: Path | Source, size: int, part_size: int) -> list[str]:
    """Each part's CRC32 (base64), read in parallel: the bucket checks every part against
    it. zlib releases the GIL, so this costs a fraction of the upload."""
    source = path if isinstance(path, Source) else Source(path=Path(path))

    def one(n: int) -> str:
        return source.crc32(n * part_size, min(part_size, size - n * part_size))

    with ThreadPoolExecutor(max_workers=PARALLEL_PARTS) as pool:
        return list(pool.map(one, range(part_count(size, part_size))))


class PartURLs:
    """The upload requests of a multipart write's parts, by number. A part whose URL is
    missing (a resume) or about to expire (a long write) is signed again by the service
    (``sign``: the numbers to sign, the service's answer), with the next parts of ``order``
    in the same call."""

    def __init__(
        self,
        sign: Callable[[list[int]], Mapping[str, Any]],
        order: Sequence[int],
        signed: Mapping[int, Mapping[str, Any]] | None = None,
        expires_in: float = 0.0,
    ) -> None:
        self._sign = sign
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
                answer = self._sign(batch)
                if stale:
                    self._urls.clear()
                self._urls.update({p["number"]: p for p in answer["parts"]})
                self._deadline = time.monotonic() + answer["expiresIn"] - RESIGN_MARGIN
                self.resigned += len(batch)
            return self._urls[n]


def recorded_parts(found: Mapping[str, Any]) -> tuple[int, list[str]] | None:
    """(part size, each part's CRC32) of a version whose writer recorded them, or None."""
    part_size, sums, size = found.get("partSize"), found.get("crc32"), found["size"]
    if not isinstance(part_size, int) or part_size <= 0 or not isinstance(sums, list):
        return None
    if len(sums) != part_count(size, part_size):
        return None  # not this object's parts: nothing to check against
    return part_size, sums


class PartCheck:
    """The CRC32 of each recorded part that a range covers whole, computed as the range's
    bytes come (zlib releases the GIL) and compared at the part's last byte. A part the
    range covers only in part is not checked."""

    def __init__(self, found: Mapping[str, Any], start: int) -> None:
        self._found = found
        recorded = recorded_parts(found)
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


def put(
    pool: Pool,
    req: Mapping[str, Any],
    body: Callable[[], Body],
    length: int,
    location: str,
) -> str:
    """One upload request (a part, a whole file) with the body ``body`` makes; its ETag.
    :class:`UploadFailed` when the bucket did not take it."""
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


def upload_parts(
    source: Source,
    size: int,
    part_size: int,
    parts: int,
    urls: PartURLs,
    location: str,
    kept: Mapping[int, str],
    timeout: float,
    callback: Callback | None = None,
) -> list[str]:
    """Send the parts not ``kept`` (number: ETag), PARALLEL_PARTS at a time; every part's
    ETag, in order. ``callback``: told the size, then the bytes as they go (the kept
    parts' at once)."""
    progress = Progress(size, f"upload to {location}", callback)
    progress(sum(min(part_size, size - (n - 1) * part_size) for n in kept))
    pool = Pool(timeout)

    def one(n: int) -> str:
        if n in kept:
            return kept[n]
        offset = (n - 1) * part_size
        length = min(part_size, size - offset)
        body = counted_once(lambda told: source.slice(offset, length, told), progress)
        return put(pool, urls[n], body, length, location)

    try:
        with ThreadPoolExecutor(max_workers=PARALLEL_PARTS) as threads:
            return list(threads.map(one, range(1, parts + 1)))
    except BaseException:
        progress(-progress.done)  # the write begins again elsewhere: counted from 0 there
        raise
    finally:
        pool.close()
        progress.close()


def counted_once(
    make: Callable[[Callable[[int], None]], Body], progress: Callable[[int], None]
) -> Callable[[], Body]:
    """A request's body for each of its attempts (``make(told)``: a body that tells
    ``told`` the bytes it sends), its bytes told to ``progress`` once: an attempt sent
    again takes back what the one before it had told."""
    told = [0]

    def tell(n: int) -> None:
        told[0] += n
        progress(n)

    def body() -> Body:
        if told[0]:
            progress(-told[0])
            told[0] = 0
        return make(tell)

    return body


def upload(
    source: Source,
    size: int,
    began: Mapping[str, Any],
    location: str,
    sign: Callable[[list[int]], Mapping[str, Any]],
    timeout: float,
    callback: Callback | None = None,
) -> tuple[list[str], str | None]:
    """Upload what the service's begin answered (``sign`` signs parts again, as
    :class:`PartURLs` asks); returns each part's ETag, and the MD5 of a single upload.
    ``callback``: told the size, then the bytes as they go."""
    spec: Mapping[str, Any] = began["upload"]
    if "multipart" in spec:
        multipart = spec["multipart"]
        count = len(multipart["parts"])
        signed = {n: multipart["parts"][n - 1] for n in range(1, count + 1)}
        urls = PartURLs(sign, range(1, count + 1), signed, began["expiresIn"])
        part_size = multipart["partSize"]
        return upload_parts(
            source, size, part_size, count, urls, location, {}, timeout, callback
        ), None
    if "single" not in spec:
        raise ArtifactError("the service answered no upload: update the client")
    progress = Progress(size, f"upload to {location}", callback)
    pool = Pool(timeout)
    hashes: list[Any] = []  # a retry hashes from the start again

    def whole(told: Callable[[int], None]) -> Body:
        hashes.append(hashlib.md5())  # noqa: S324 - integrity
        return source.slice(0, size, told, hashes[-1])

    try:
        put(pool, spec["single"], counted_once(whole, progress), size, location)
        return [], hashes[-1].hexdigest()
    except BaseException:
        progress(-progress.done)  # the write begins again elsewhere: counted from 0 there
        raise
    finally:
        pool.close()
        progress.close()
