"""Both ways of reading a download's parallel ranges (one thread over selectors, the
default over http; a thread per range, which https uses) keep the same promises: each
part checked, the file whole or not at all, bounded connections, the whole object from a
store that ignores ranges, a kept-alive connection the store closed opened again.

A small HTTP/1.1 server in this process stands in for the bucket (no test bed needed):
it serves one object's ranges and counts connections; it can ignore ranges, or close
each connection after one answer without saying so (as a store closes an idle one).
"""

from __future__ import annotations

import os
import sys
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from o41.client import reads
from o41.client.errors import Damaged
from o41.client.reads import download
from o41.core.parts import crc32_b64
from testbed.process import LOOPBACK

PART = 256 * 1024
SIZE = 6 * PART + 1000  # seven parts, the last one short


class Store(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, data: bytes) -> None:
        super().__init__((LOOPBACK, 0), Handler)
        self.data = data
        self.connections = 0
        self.ranges = 0
        self.ignore_ranges = False
        self.one_answer = False  # close after each answer, without "Connection: close"
        self.chunked = False  # answer in chunks, without a Content-Length
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that stops reading (at a damaged part) resets its connections:
        expected here; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive connections
    server: Store

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        data, asked = self.server.data, self.headers.get("Range")
        if asked and not self.server.ignore_ranges:
            first, last = (int(x) for x in asked.removeprefix("bytes=").split("-"))
            body = data[first : last + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            with self.server.lock:
                self.server.ranges += 1
        else:
            body = data
            self.send_response(200)
        if self.server.chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for at in range(0, len(body), 100_000):
                chunk = body[at : at + 100_000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        if self.server.one_answer:
            self.close_connection = True


@pytest.fixture
def store() -> Iterator[Store]:
    server = Store(os.urandom(SIZE))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(params=["selectors", "threads"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on both readers, with ranges of two parts, two at a time."""
    monkeypatch.setattr(reads, "RANGE_READER", request.param)
    monkeypatch.setattr(reads, "RANGE_SIZE", 2 * PART)
    monkeypatch.setattr(reads, "PARALLEL_RANGES", 2)
    monkeypatch.setattr(reads, "READ_BLOCK", 64 * 1024)
    return str(request.param)


def found(store: Store, data: bytes | None = None) -> dict[str, Any]:
    """What the service answers for the object: size, part size, each part's CRC32."""
    data = store.data if data is None else data
    sums = [crc32_b64(zlib.crc32(data[i : i + PART])) for i in range(0, SIZE, PART)]
    url = f"http://{LOOPBACK}:{store.server_address[1]}/bucket/key?X-Amz-Signature=x"
    return {
        "version": "v1",
        "location": "east",
        "size": SIZE,
        "md5": None,
        "partSize": PART,
        "crc32": sums,
        "download": {"method": "GET", "url": url, "headers": {}},
    }


def test_ranges_come_back_whole_on_at_most_their_connections(
    store: Store, reader: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.bin"
    assert download(found(store), out) == SIZE
    assert out.read_bytes() == store.data
    assert store.ranges == 4  # 2-part ranges of 7 parts
    assert store.connections <= 2  # kept alive: PARALLEL_RANGES, not one per range
    assert not (tmp_path / "out.bin.o41-partial").exists()


def test_a_damaged_part_is_named_and_nothing_is_written(
    store: Store, reader: str, tmp_path: Path
) -> None:
    recorded = found(store)
    damaged = bytearray(store.data)
    damaged[4 * PART + 7] ^= 0xFF  # part 5
    store.data = bytes(damaged)
    out = tmp_path / "out.bin"
    out.write_bytes(b"the previous file")
    with pytest.raises(Damaged, match="part 5 of 7") as raised:
        download(recorded, out)
    assert raised.value.part == 5
    assert out.read_bytes() == b"the previous file"
    assert not (tmp_path / "out.bin.o41-partial").exists()


def test_a_store_that_ignores_ranges_gives_the_whole_object(
    store: Store, reader: str, tmp_path: Path
) -> None:
    store.ignore_ranges = True
    out = tmp_path / "out.bin"
    assert download(found(store), out) == SIZE
    assert out.read_bytes() == store.data


def test_ranges_answered_in_chunks_are_read_by_http_client(
    store: Store, reader: str, tmp_path: Path
) -> None:
    """Chunked answers (no Content-Length): the chunks' framing is not the object's bytes.
    The selectors reader leaves them to http.client (one GET, checked); threads read them
    through http.client as they are."""
    store.chunked = True
    out = tmp_path / "out.bin"
    assert download(found(store), out) == SIZE
    assert out.read_bytes() == store.data


def test_a_connection_the_store_closed_is_opened_again(
    store: Store, reader: str, tmp_path: Path
) -> None:
    """Each answer closes its connection without saying so: the next range on it is sent
    again on a new one, and the download succeeds."""
    store.one_answer = True
    out = tmp_path / "out.bin"
    assert download(found(store), out) == SIZE
    assert out.read_bytes() == store.data
    assert store.connections == 4  # one per range: each was closed after its answer


def test_read_bytes_in_memory_are_checked_too(store: Store, reader: str) -> None:
    """The in-memory path (read_bytes) reads the ranges straight into place."""
    out = bytearray(SIZE)
    reads.into_memory(found(store), memoryview(out), 0, 10.0, parallel=True)
    assert bytes(out) == store.data
