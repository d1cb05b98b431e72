"""How a version's bytes come back from its bucket, through the download URL the service
signed (:meth:`o41.client.artifacts.Artifacts.locate`): to a file whole or not at all
(:func:`download`), a piece of it (:func:`read_range`), all of it into memory
(:func:`into_memory`), or as a file object read as it is asked for (:class:`RangeReader`).

A large version comes as parallel ranges of whole parts, each part checked against the
CRC32 its writer recorded, by one of two range readers: over http one thread reads every
range's socket as it becomes readable (``selectors``), else a thread reads each range.
Memory stays bounded (256 KiB per range being read); connections are kept alive.

A read that fails part-way goes on from the bytes it has: a connection cut, a timeout or
a 5xx from the bucket is tried again (ATTEMPTS in a row without a byte more, with
backoff) for only the bytes still missing, each part still checked whole (the bytes of a
part read before the cut are read back from where they landed and checked with the
rest); a download URL the bucket refuses (400, 403: it expired during a long read) is
asked of the service again (``relocate``). A download to a file that fails anyway keeps
what it read in ``OUTPUT.o41-partial`` and which bytes those are in
``OUTPUT.o41-partial.json`` (the version, its size and checksums): the next download of
the same version to the same output continues from them. Neither is ever taken for the
file: the output appears, by a rename, only once every byte is there and checked.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import logging
import os
import random
import selectors
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from o41.client.errors import ArtifactError, Damaged
from o41.client.transfers import (
    STALE,
    PartCheck,
    Pool,
    connection,
    recorded_parts,
    target,
)

log = logging.getLogger("o41")

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

#: What a download to ``OUTPUT`` keeps while it is not whole: the bytes at their offsets
#: in ``OUTPUT.o41-partial``, which of them it holds in ``OUTPUT.o41-partial.json``.
PARTIAL = ".o41-partial"
#: Tries in a row that bring no byte more before a read gives up (a try that brings bytes
#: starts the count again); BACKOFF seconds before the second, doubled each time up to
#: BACKOFF_MAX, with full jitter.
ATTEMPTS = 5
BACKOFF = 0.5
BACKOFF_MAX = 8.0
#: A download's partial state is saved at most this often while bytes come (and at each
#: failure), so a process killed outright loses at most this long's worth of bytes.
SAVE_EVERY = 1.0

#: Asks the service for the version's read answer again (a fresh download URL).
Relocate = Callable[[], Mapping[str, Any]]


# --- what a read holds ------------------------------------------------------------------


class Spans:
    """The byte ranges of an object a read holds, as sorted, merged ``[start, end)``
    pairs; added to from several threads."""

    def __init__(self, spans: list[list[int]] | None = None) -> None:
        self._spans: list[list[int]] = []
        self._lock = threading.Lock()
        for start, end in spans or []:
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        with self._lock:
            merged: list[list[int]] = []
            placed = False
            for s, e in self._spans:
                if e < start or s > end:  # apart
                    if s > end and not placed:
                        merged.append([start, end])
                        placed = True
                    merged.append([s, e])
                else:  # touching or overlapping: one span
                    start, end = min(s, start), max(e, end)
            if not placed:
                merged.append([start, end])
            merged.sort()
            self._spans = merged

    def missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The ranges of ``[lo, hi)`` not held, as (first, last) byte offsets."""
        with self._lock:
            spans = [list(s) for s in self._spans]
        gaps, at = [], lo
        for s, e in spans:
            if e <= at:
                continue
            if s >= hi:
                break
            if s > at:
                gaps.append((at, min(s, hi) - 1))
            at = max(at, e)
        if at < hi:
            gaps.append((at, hi - 1))
        return gaps

    def clear(self) -> None:
        with self._lock:
            self._spans = []

    @property
    def total(self) -> int:
        with self._lock:
            return sum(e - s for s, e in self._spans)

    def as_json(self) -> list[list[int]]:
        with self._lock:
            return [list(s) for s in self._spans]


def fingerprint(found: Mapping[str, Any]) -> dict[str, Any]:
    """What names a version's bytes: a partial file of another version (or another file
    of a directory version) is never continued."""
    crc = found.get("crc32")
    return {
        "version": found.get("version"),
        "path": found.get("path"),
        "size": found["size"],
        "md5": found.get("md5"),
        "partSize": found.get("partSize"),
        "crc32": hashlib.sha256(json.dumps(crc).encode()).hexdigest()[:32] if crc else None,
    }


class Partial:
    """A download to ``output`` while it is not whole: ``output.o41-partial`` holds the
    bytes at their offsets, ``output.o41-partial.json`` the version they are of and which
    bytes are there. Opened again for the same version, it goes on from them; for any other
    (or with no state beside it), it starts again from nothing."""

    def __init__(self, output: Path, found: Mapping[str, Any]) -> None:
        self.output = output
        self.path = output.with_name(output.name + PARTIAL)
        self.state = output.with_name(output.name + PARTIAL + ".json")
        self.key = fingerprint(found)
        self.size: int = found["size"]
        self.spans = Spans()
        self.fd = -1
        self._saved_at = 0.0
        self._lock = threading.Lock()

    def open(self) -> int:
        """The partial file, open for reading and writing, ``size`` bytes long; ``spans``
        is what it holds (nothing, unless it was this version's)."""
        held = self._load()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        if held is None or os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, 0)
            os.ftruncate(self.fd, self.size)
            held = Spans()
        elif held.total:
            log.info(
                "continuing the download of %s from the %d of %d bytes in %s",
                self.key["version"],
                held.total,
                self.size,
                self.path,
            )
        self.spans = held
        self.save()
        return self.fd

    def _load(self) -> Spans | None:
        try:
            state = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("of") != self.key:
            return None
        try:
            return Spans([[int(s), int(e)] for s, e in state.get("have", [])])
        except (TypeError, ValueError):
            return None

    def reset(self) -> None:
        """Hold nothing (the store answered the whole object where a part was asked for)."""
        self.spans.clear()
        self.save()

    def save(self) -> None:
        with self._lock:
            self._saved_at = time.monotonic()
            data = json.dumps({"of": self.key, "have": self.spans.as_json()})
            tmp = self.state.with_name(f"{self.state.name}.{os.getpid()}.tmp")
            tmp.write_text(data)
            os.replace(tmp, self.state)

    def tick(self) -> None:
        """Bytes came: saved if the last save is older than SAVE_EVERY."""
        if time.monotonic() - self._saved_at >= SAVE_EVERY:
            self.save()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def finish(self) -> None:
        """Whole and checked: the partial file becomes the output."""
        self.close()
        os.replace(self.path, self.output)
        self.state.unlink(missing_ok=True)

    def drop(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.state.unlink(missing_ok=True)


def partial_of(output: str | Path) -> Path:
    """Where a download to ``output`` keeps its bytes while it is not whole."""
    output = Path(output)
    return output.with_name(output.name + PARTIAL)


# --- where the bytes land ---------------------------------------------------------------


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

    def back(self, start: int, end: int) -> Iterator[memoryview]:
        """Bytes ``start`` to ``end`` (exclusive) as they landed, a block at a time."""
        while start < end:
            data = os.pread(self.fd, min(READ_BLOCK * 4, end - start), start)
            if not data:
                raise ArtifactError(f"{end - start} bytes of the partial download are gone")
            yield memoryview(data)
            start += len(data)


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

    def back(self, start: int, end: int) -> Iterator[memoryview]:
        yield self.out[start - self.base : end - self.base]


_Sink = _FileSink | _MemorySink


def _seeded(found: Mapping[str, Any], start: int, sink: _Sink) -> PartCheck:
    """The check of the parts from ``start`` on: a part that begins before ``start`` (a
    read that goes on after a cut) is checked whole all the same, its first bytes read
    back from where they landed (a part checked only in part would not be checked)."""
    recorded = recorded_parts(found)
    if recorded is None:
        return PartCheck(found, start)
    part_start = start - start % recorded[0]
    if part_start < 0 or part_start < getattr(sink, "base", 0):
        return PartCheck(found, start)  # the part begins before what this read holds
    check = PartCheck(found, part_start)
    at = part_start
    for view in sink.back(part_start, start):
        check.update(view, at)
        at += len(view)
    return check


# --- what went wrong, and whether to try again -----------------------------------------


class NoRanges(Exception):
    """The store answered a ranged GET with the whole object."""


class _Answered(ArtifactError):
    """The bucket answered the download with a status other than 200 or 206."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Cut(ArtifactError):
    """An answer ended before its last byte (the connection was cut)."""


def _refused(e: BaseException) -> bool:
    """The bucket refused the download URL: it expired (a long read), or was signed for
    something else. Asking the service for a fresh one is the fix for the first."""
    return isinstance(e, _Answered) and e.status in (400, 401, 403)


def _transient(e: BaseException) -> bool:
    """Worth trying again for the bytes still missing."""
    if isinstance(e, _Answered):
        status = e.status or 0
        return status in (408, 429) or status >= 500
    return isinstance(e, OSError | http.client.HTTPException | _Cut | TimeoutError)


def backoff(failures: int) -> float:
    """Seconds before the next try after ``failures`` in a row: full jitter."""
    return random.uniform(0, min(BACKOFF_MAX, BACKOFF * 2 ** (failures - 1)))  # noqa: S311


def _fill(
    found: Mapping[str, Any],
    spans: Spans,
    lo: int,
    hi: int,
    fetch: Callable[[Mapping[str, Any], list[tuple[int, int]]], None],
    relocate: Relocate | None,
    saved: Callable[[], None] = lambda: None,
) -> Mapping[str, Any]:
    """Fetch (``fetch(found, missing)``) what ``spans`` lacks of ``[lo, hi)`` until it is
    all there: a try that fails on the way (a cut, a timeout, a 5xx) is followed by another
    for what is still missing, ATTEMPTS in a row without a byte more at most; a URL the
    bucket refuses is asked of the service again (``relocate``), once between tries that
    bring bytes. Returns the read answer last used."""
    stalled, relocated = 0, False
    while missing := spans.missing(lo, hi):
        before = spans.total
        try:
            fetch(found, missing)
        except Damaged:
            raise
        except Exception as e:
            saved()
            progressed = spans.total > before
            if _refused(e) and relocate is not None and (progressed or not relocated):
                log.info(
                    "the download URL of %s was refused (%s): asking the service for a new one",
                    found.get("version"),
                    e,
                )
                found, relocated = relocate(), True
                continue
            if not _transient(e):
                raise
            stalled = 0 if progressed else stalled + 1
            if stalled >= ATTEMPTS:
                raise
            wait = backoff(stalled or 1)
            log.info(
                "download of %s stopped at %d of %d bytes (%s): going on in %.1f s",
                found.get("version"),
                spans.total,
                found["size"],
                e,
                wait,
            )
            time.sleep(wait)
            continue
        relocated = False
    return found


# --- a version to a file ----------------------------------------------------------------


def download(
    found: Mapping[str, Any],
    output: str | Path,
    timeout: float = 60.0,
    *,
    relocate: Relocate | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """A located version (:meth:`Artifacts.locate`) to the file ``output``, written whole
    or not at all: the bytes go to ``output.o41-partial`` beside it, renamed over
    ``output`` once every check passed (a failure leaves ``output`` as it was). A version
    larger than one range comes as parallel ranges; its size, and each recorded part's
    CRC32 (else its MD5), are checked.

    A try that fails on the way goes on for the missing bytes (:func:`_fill`); ``relocate``
    asks the service for a fresh URL when the bucket refuses this one. A download that
    fails anyway keeps its bytes for the next download of the same version to ``output``,
    which goes on from them (:class:`Partial`); damaged bytes are not kept. ``progress`` is
    called with each count of bytes that came (the bytes kept from before first).
    Returns the size."""
    output = Path(output)
    size: int = found["size"]
    partial = Partial(output, found)
    pool = Pool(timeout)
    step = (lambda n: None) if progress is None else progress
    try:
        sink = _FileSink(partial.open())
        if partial.spans.total:
            step(partial.spans.total)

        def came(n: int) -> None:
            step(n)
            partial.tick()

        stream = (recorded_parts(found) is None and bool(found.get("md5"))) or size <= range_size(
            found
        )

        def fetch(found: Mapping[str, Any], missing: list[tuple[int, int]]) -> None:
            nonlocal stream
            if not stream:
                try:
                    _ranges(pool, found, missing, sink, partial.spans, came)
                except NoRanges:
                    stream = True
                    partial.reset()
                    missing = [(0, size - 1)] if size else []
                else:
                    return
            if len(missing) != 1 or missing[0][1] != size - 1:
                partial.reset()  # a stream goes on from its end only
                missing = [(0, size - 1)] if size else []
            _stream(pool, found, missing[0][0] if missing else 0, sink, partial, came)

        found = _fill(found, partial.spans, 0, size, fetch, relocate, partial.save)
        if size == 0 and not partial.spans.total:
            _stream(pool, found, 0, sink, partial, step)
        partial.finish()
    except Damaged:
        partial.drop()  # damaged bytes are not worth keeping
        raise
    except (OSError, http.client.HTTPException) as e:
        partial.close()
        raise ArtifactError(
            f"download from {found['location']} failed: {e or type(e).__name__}; {_kept(partial)}"
        ) from None
    except ArtifactError as e:
        partial.close()
        e.args = (f"{e}; {_kept(partial)}", *e.args[1:])
        raise
    except BaseException:
        partial.close()
        raise
    finally:
        pool.close()
    return size


def _kept(partial: Partial) -> str:
    held = partial.spans.total
    if not held:
        return "read it again"
    return (
        f"the {held} of {partial.size} bytes read are kept in {partial.path.name}: reading "
        "the version to the same output again goes on from them"
    )


def _damaged(found: Mapping[str, Any], differs: str, *, written: bool = False) -> Damaged:
    what = f"version {found.get('version', '?')}"
    if found.get("path"):  # a file of a directory version
        what = f"file {found['path']} of {what}"
    then = "Read" if written else "Nothing was written; read"
    return Damaged(
        f"{what} at location {found.get('location', '?')} has {differs}: the bucket's copy "
        f"is damaged. {then} it again, and if this repeats, write the version again"
    )


def _stream(
    pool: Pool,
    found: Mapping[str, Any],
    start: int,
    sink: _FileSink,
    partial: Partial,
    progress: Callable[[int], None],
) -> None:
    """The object in one GET from byte ``start`` (the bytes before it are those the
    partial file holds), checked against the MD5 the service gave (single-part objects:
    the bucket's ETag), its recorded parts' CRC32s and the size."""
    req, size = found["download"], found["size"]
    headers = dict(req["headers"])
    if start:
        headers["Range"] = f"bytes={start}-"
    resp = pool.request(req["method"], req["url"], headers)
    try:
        if resp.status == 200:
            if start:  # the store ignores ranges: the whole object, from its first byte
                partial.reset()
                start = 0
        elif resp.status != 206 or not start:
            resp.read()
            raise _Answered(
                f"location {found['location']} answered HTTP {resp.status} to the download",
                resp.status,
            )
        if resp.status == 206:
            total = resp.getheader("Content-Range", "").rpartition("/")[2]
            if total.isdigit() and int(total) != size:
                raise _damaged(found, f"{total} bytes where its writer wrote {size}")
        declared = resp.getheader("Content-Length")
        if (
            resp.status == 200
            and declared is not None
            and declared.isdigit()
            and int(declared) != size
        ):
            raise _damaged(found, f"{declared} bytes where its writer wrote {size}")
        md5 = hashlib.md5() if found.get("md5") else None  # noqa: S324 - integrity
        if md5 is not None:
            for view in sink.back(0, start):
                md5.update(view)
        check = _seeded(found, start, sink)
        at = start
        block = memoryview(bytearray(READ_BLOCK))  # one buffer, filled again and again
        try:
            while n := resp.readinto(block):
                view = block[:n]
                if at + n > size:
                    raise _damaged(found, f"more than the {size} bytes its writer wrote")
                sink.put(view, at)
                if md5 is not None:
                    md5.update(view)
                check.update(view, at)
                partial.spans.add(at, at + n)
                at += n
                progress(n)
        except http.client.IncompleteRead as e:
            raise _Cut(f"the download stopped at byte {at} of {size}") from e
        if at != size:
            if resp.getheader("Content-Length") is None and resp.status == 200:
                raise _damaged(found, f"{at} bytes where its writer wrote {size}")
            raise _Cut(f"the download stopped at byte {at} of {size}")
        if md5 is not None and md5.hexdigest() != found["md5"]:
            raise _damaged(found, f"MD5 {md5.hexdigest()}, but its writer recorded {found['md5']}")
    except (OSError, http.client.HTTPException, ArtifactError):
        pool.forget(req["url"])
        raise


def _ranges(
    pool: Pool,
    found: Mapping[str, Any],
    missing: list[tuple[int, int]],
    sink: _Sink,
    spans: Spans,
    progress: Callable[[int], None],
    parallel: bool = True,
) -> None:
    """The ``missing`` ranges of the object, cut at the multiples of :func:`range_size`
    (every range a whole number of parts, but for a read that goes on inside one)."""
    step = range_size(found)
    jobs: list[tuple[int, int]] = []
    for first, last in missing:
        at = first
        while at <= last:
            end = min(last, (at // step + 1) * step - 1) if parallel else last
            jobs.append((at, end))
            at = end + 1
    if parallel and len(jobs) > 1:
        _parallel_ranges(pool, found, jobs, sink, spans, progress)
    else:
        for start, end in jobs:
            _get_range(pool, found, start, end, sink, spans, progress)


def range_size(found: Mapping[str, Any]) -> int:
    """The size of the parallel ranges of a download: RANGE_SIZE, made a whole number of
    the version's recorded parts (so that every range can be checked part by part)."""
    recorded = recorded_parts(found)
    if recorded is None:
        return RANGE_SIZE
    part_size = recorded[0]
    return max(part_size, RANGE_SIZE // part_size * part_size)


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
        raise _Answered(
            f"location {found['location']} answered HTTP {resp.status} to the download",
            resp.status,
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
    spans: Spans,
    progress: Callable[[int], None],
) -> int:
    """Bytes ``start`` to ``end`` (inclusive) of the object into ``sink``, each whole part
    checked; raises :class:`NoRanges` when the store answers with the whole object."""
    req = found["download"]
    headers = {**req["headers"], "Range": f"bytes={start}-{end}"}
    check = _seeded(found, start, sink)
    resp = pool.request(req["method"], req["url"], headers)
    try:
        _check_head(resp, found, start, end)
    except NoRanges:
        pool.forget(req["url"])  # the store ignores ranges
        raise
    except ArtifactError:
        resp.read()  # the connection stays usable for the next range
        raise
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
            spans.add(at, at + n)
            at += n
            progress(n)
    except (OSError, http.client.HTTPException, Damaged):
        pool.forget(req["url"])  # the rest of the answer is not read
        raise
    if at != end + 1:
        pool.forget(req["url"])
        raise _Cut(f"download of bytes {start}-{end} stopped at byte {at}")
    if not resp.isclosed() and resp.read():  # a chunked answer's last chunk: read it, so
        pool.forget(req["url"])  # that the connection takes the next range
        raise ArtifactError(f"the answer to bytes {start}-{end} went on past them: read it again")
    return at - start


def _parallel_ranges(
    pool: Pool,
    found: Mapping[str, Any],
    jobs: list[tuple[int, int]],
    sink: _Sink,
    spans: Spans,
    progress: Callable[[int], None],
) -> None:
    """The ranges ``jobs``, PARALLEL_RANGES at a time (one thread over http with
    RANGE_READER "selectors", else a thread each)."""
    if RANGE_READER == "selectors" and found["download"]["url"].startswith("http:"):
        _selected_ranges(pool.timeout, found, jobs, sink, spans, progress)
        return

    def one(job: tuple[int, int]) -> int:
        return _get_range(pool, found, job[0], job[1], sink, spans, progress)

    with ThreadPoolExecutor(max_workers=PARALLEL_RANGES) as threads:
        for _ in threads.map(one, jobs):
            pass


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
        spans: Spans,
        reused: bool,
    ) -> None:
        self.conn, self.found, self.start, self.end, self.sink = conn, found, start, end, sink
        self.spans = spans
        self.reused = reused  # kept alive from an earlier range: the server may have closed it
        if conn.sock is None:
            conn.connect()
        assert conn.sock is not None
        self.sock: socket.socket = conn.sock
        self.at = start
        self.resp: http.client.HTTPResponse | None = None
        self.block = sink.buffer()
        self.check = _seeded(found, start, sink)

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
            raise _Cut(f"download of bytes {self.start}-{self.end} stopped at byte {self.at}")
        view = into[:n]
        self.sink.put(view, self.at)
        self.check.update(view, self.at)
        self.spans.add(self.at, self.at + n)
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
    timeout: float,
    found: Mapping[str, Any],
    jobs: list[tuple[int, int]],
    sink: _Sink,
    spans: Spans,
    progress: Callable[[int], None],
) -> None:
    """The ranges ``jobs``, PARALLEL_RANGES at a time on as many kept-alive connections,
    all read by this one thread as their sockets become readable: no GIL handed between
    threads per block, one writer to the file (measured with the control plane on the
    same 2 cores: docs/placement.md, "Reads")."""
    todo = jobs[::-1]  # pop: the first
    opened: list[http.client.HTTPConnection] = []
    with selectors.DefaultSelector() as selector:

        def begin(start: int, end: int, conn: http.client.HTTPConnection | None) -> None:
            reused = conn is not None
            if conn is None:
                conn, _ = connection(found["download"]["url"], timeout)
                opened.append(conn)
            reading = _Reading(conn, found, start, end, sink, spans, reused)
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
                    progress(n)
                    if reading.done:
                        selector.unregister(key.fileobj)
                        kept = reading.finish(timeout)
                        if todo:
                            begin(*todo.pop(), kept)
        finally:
            for conn in opened:
                conn.close()


# --- pieces and memory ------------------------------------------------------------------


def read_range(
    found: Mapping[str, Any],
    start: int,
    length: int,
    timeout: float = 60.0,
    *,
    relocate: Relocate | None = None,
) -> bytes:
    """``length`` bytes of a located version (:meth:`Artifacts.locate`) from offset
    ``start`` (fewer at its end), in one ranged GET (another for what is missing, should
    it stop); each recorded part the range covers whole is checked against its CRC32
    (:class:`Damaged` if it differs). For a reader that wants pieces of a version (a file
    system, a file object): locate once (the download URL lasts 15 minutes), then read
    ranges."""
    size = found["size"]
    if start < 0 or length < 0:
        raise ValueError("start and length must not be negative")
    length = max(0, min(length, size - start))
    if length == 0:
        return b""
    out = bytearray(length)
    try:
        into_memory(found, memoryview(out), start, timeout, parallel=False, relocate=relocate)
    except NoRanges:
        raise ArtifactError(
            f"location {found['location']} does not serve ranges: read the version whole"
        ) from None
    return bytes(out)


def into_memory(
    found: Mapping[str, Any],
    out: memoryview,
    start: int,
    timeout: float,
    *,
    parallel: bool,
    relocate: Relocate | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """The object's bytes from ``start`` into ``out`` (all of it, and in parallel ranges,
    with ``parallel``; else one ranged GET), checked part by part; a try that stops on
    the way goes on for what is missing."""
    pool = Pool(timeout)
    sink = _MemorySink(out, start)
    spans = Spans()
    step = (lambda n: None) if progress is None else progress

    def fetch(found: Mapping[str, Any], missing: list[tuple[int, int]]) -> None:
        _ranges(pool, found, missing, sink, spans, step, parallel)

    try:
        _fill(found, spans, start, start + len(out), fetch, relocate)
    except (OSError, http.client.HTTPException) as e:
        raise ArtifactError(
            f"download from {found['location']} failed: {e or type(e).__name__}; read it again"
        ) from None
    finally:
        pool.close()


class RangeReader(io.RawIOBase):
    """A version's bytes as a file object, read from the bucket as they are asked for: one
    streaming GET from the current position, a ranged GET again after a seek. Read from
    start to end without seeking, the bytes are checked against the version's size and,
    when the service gave one, its MD5 (:class:`Damaged` at the end if they differ). An
    answer cut on the way is asked for again from where it stopped (the checks go on),
    ATTEMPTS in a row at most; a URL the bucket refuses is asked of the service again
    (``relocate``)."""

    def __init__(
        self, found: Mapping[str, Any], timeout: float, relocate: Relocate | None = None
    ) -> None:
        super().__init__()
        self._found = found
        self._size: int = found["size"]
        self._timeout = timeout
        self._relocate = relocate
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
            self._check = PartCheck(self._found, pos)
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
        except (OSError, http.client.HTTPException):
            conn.close()
            raise
        if resp.status not in (200, 206) or (self._pos and resp.status != 206):
            conn.close()
            raise _Answered(
                f"location {self._found['location']} answered HTTP {resp.status} to the "
                "download: read it again",
                resp.status,
            )
        self._conn, self._resp = conn, resp
        return resp

    def _next(self, buffer: memoryview) -> int:
        """Bytes from the current answer (a new one from ``_pos`` when there is none)."""
        resp = self._resp or self._open()
        try:
            n = resp.readinto(buffer)
        except http.client.IncompleteRead as e:
            raise _Cut(f"the download stopped at byte {self._pos}") from e
        if n == 0:
            raise _Cut(
                f"download of {self._found['version']} stopped at byte {self._pos} of {self._size}"
            )
        return n

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            self._finish()
            return 0
        view = memoryview(buffer)[: self._size - self._pos]
        stalled, relocated = 0, False
        while True:
            try:
                n = self._next(view)
                break
            except Exception as e:
                self._drop()
                if _refused(e) and self._relocate is not None and not relocated:
                    self._found, relocated = dict(self._relocate()), True
                    continue
                stalled += 1
                if not _transient(e) or stalled >= ATTEMPTS:
                    if isinstance(e, ArtifactError):
                        raise
                    raise ArtifactError(
                        f"download from {self._found['location']} failed: {e}; read it again"
                    ) from None
                time.sleep(backoff(stalled))
        if self._md5 is not None and self._whole:
            self._md5.update(view[:n])
        try:
            self._check.update(view[:n], self._pos)
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
            raise _damaged(
                self._found,
                f"MD5 {got}, but its writer recorded {self._found['md5']}",
                written=True,
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
