"""How a version's bytes come back from its bucket, through the download URL the service
signed (:meth:`o41.client.artifacts.Artifacts.locate`): to a file whole or not at all
(:func:`download`), a piece of it (:func:`read_range`), all of it into memory
(:func:`into_memory`), or as a file object read as it is asked for (:class:`RangeReader`).

A large version comes as parallel ranges of whole parts, each part checked against the
CRC32 its writer recorded, by one of two range readers: over http one thread reads every
range's socket as it becomes readable (``selectors``), else a thread reads each range.
Memory stays bounded (256 KiB per range being read); connections are kept alive.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import selectors
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from o41.client.errors import ArtifactError, Damaged
from o41.client.transfers import (
    STALE,
    PartCheck,
    Pool,
    Progress,
    connection,
    recorded_parts,
    target,
)
from o41.core.parts import part_count

# What a download reads from the socket at a time (and writes at its offset). Measured on 2
# shared cores, 1 GiB from versitygw (bench/reads.py): blocks of 64-256 KiB cost the client
# ~0.7 s of system time, 512 KiB-1 MiB 1.8-2.7 s (the copies no longer stay in cache).
READ_BLOCK = 256 * 1024
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
    pool = Pool(timeout)
    try:
        whole = recorded_parts(found) is None and found.get("md5")
        if whole or size <= range_size(found):
            got = _stream(pool, found, partial, progress)
        else:
            try:
                got = _ranges(pool, found, partial, progress)
            except NoRanges:
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


def _stream(pool: Pool, found: Mapping[str, Any], partial: Path, progress: Progress) -> int:
    """The object in one GET, checked against the MD5 the service gave (single-part
    objects: the bucket's ETag), its recorded parts' CRC32s and the size."""
    req = found["download"]
    md5 = hashlib.md5() if found.get("md5") else None  # noqa: S324 - integrity
    check = PartCheck(found, 0)
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


def _ranges(pool: Pool, found: Mapping[str, Any], partial: Path, progress: Progress) -> int:
    """The object as parallel ranges (:func:`range_size`), each written at its offset
    as it comes and each whole part checked against its recorded CRC32: memory stays
    at a block per thread."""
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.ftruncate(fd, found["size"])
        return _parallel_ranges(pool, found, _FileSink(fd), progress)
    finally:
        os.close(fd)


def range_size(found: Mapping[str, Any]) -> int:
    """The size of the parallel ranges of a download: RANGE_SIZE, made a whole number of
    the version's recorded parts (so that every range can be checked part by part)."""
    recorded = recorded_parts(found)
    if recorded is None:
        return RANGE_SIZE
    part_size = recorded[0]
    return max(part_size, RANGE_SIZE // part_size * part_size)


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
    :class:`NoRanges` when the store answers with the whole object."""
    size = found["size"]
    if resp.status == 200 and not (start == 0 and end == size - 1):
        raise NoRanges
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
    pool: Pool,
    found: Mapping[str, Any],
    start: int,
    end: int,
    sink: _Sink,
    progress: Callable[[int], None],
) -> int:
    """Bytes ``start`` to ``end`` (inclusive) of the object into ``sink``, each whole part
    checked; raises :class:`NoRanges` when the store answers with the whole object."""
    req = found["download"]
    headers = {**req["headers"], "Range": f"bytes={start}-{end}"}
    resp = pool.request(req["method"], req["url"], headers)
    try:
        _check_head(resp, found, start, end)
    except NoRanges:
        pool.forget(req["url"])  # the store ignores ranges
        raise
    except ArtifactError:
        resp.read()  # the connection stays usable for the next range
        raise
    check = PartCheck(found, start)
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
    pool: Pool, found: Mapping[str, Any], sink: _Sink, progress: Callable[[int], None]
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
        self.check = PartCheck(found, start)

    def send(self) -> None:
        req = self.found["download"]
        headers = {**req["headers"], "Range": f"bytes={self.start}-{self.end}"}
        self.conn.request(req["method"], target(urllib.parse.urlsplit(req["url"])), headers=headers)

    def answered(self) -> int:
        """The response's head (it has come: the socket was readable), checked as
        :func:`_get_range` checks it; then the body bytes that came with it."""
        resp = self.resp = self.conn.getresponse()
        expected = _check_head(resp, self.found, self.start, self.end)
        if resp.chunked or resp.length is None:
            raise NoRanges  # framed by chunks or by the close: left to http.client (one GET)
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
                conn, _ = connection(found["download"]["url"], timeout)
                opened.append(conn)
            reading = _Reading(conn, found, start, end, sink, reused)
            try:
                reading.send()
            except STALE:
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
                        except STALE:  # closed while idle: the range on a new connection
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
        into_memory(found, memoryview(out), start, timeout, parallel=False)
    except NoRanges:
        raise ArtifactError(
            f"location {found['location']} does not serve ranges: read the version whole"
        ) from None
    return bytes(out)


def into_memory(
    found: Mapping[str, Any], out: memoryview, start: int, timeout: float, *, parallel: bool
) -> None:
    """The object's bytes from ``start`` into ``out`` (all of it, and in parallel ranges,
    with ``parallel``; else one ranged GET), checked part by part."""
    pool = Pool(timeout)
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


class NoRanges(Exception):
    """The store answered a ranged GET with the whole object."""


class RangeReader(io.RawIOBase):
    """A version's bytes as a file object, read from the bucket as they are asked for: one
    streaming GET from the current position, a ranged GET again after a seek. Read from
    start to end without seeking, the bytes are checked against the version's size and,
    when the service gave one, its MD5 (:class:`Damaged` at the end if they differ)."""

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
        self._check = PartCheck(found, 0)  # the recorded parts read whole since the seek

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
        conn, target = connection(req["url"], self._timeout)
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
        self._check = PartCheck(self._found, self._pos)
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
            got, self._md5 = self._md5.hexdigest(), None
            what = f"version {self._found['version']}"
            if self._found.get("path"):  # a file of a directory version
                what = f"file {self._found['path']} of {what}"
            raise Damaged(
                f"{what} at location {self._found['location']} has MD5 {got}, but its writer "
                f"recorded {self._found['md5']}: the bucket's copy is damaged. Read it again, "
                "and if this repeats, write the version again"
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
