"""Issue 39, point 3: a read that fails part-way goes on from the bytes it has.

The service runs in process (the real app on the embedded store) with its stand-in
bucket (``testbed.standin_bucket``: it checks each URL's signature and expiry, 403
otherwise) behind a TCP relay on loopback that counts the bytes it passes and can cut
every connection after some bytes. Then: a download cut on the way finishes in the same
call, with no byte fetched twice; one that fails anyway keeps ``OUTPUT.o41-partial`` and
the next read of the version fetches only what it lacked; a download URL that expires
during a read is asked of the service again; every byte comes back right (each part's
CRC32 checked, the part cut in two included). The same against versitygw (S3's own
SigV4 and expiry): ``test_a_read_cut_and_expired_on_versitygw_goes_on``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from o41.client import reads
from o41.client.artifacts import Artifacts
from o41.client.errors import ArtifactError
from o41.core.parts import PART_SIZE, crc32_b64
from o41.storage import BucketRef, bucket_name, open_bucket, sigv4
from test_writes import Service, serve, usage_of
from testbed.locations import ORG
from testbed.process import LOOPBACK, free_port
from testbed.stores import VersityStore

MiB = 2**20
SIZE = 2 * PART_SIZE + 3 * MiB  # three parts of 16 MiB, the last one short


class Relay:
    """A TCP relay on loopback in front of ``upstream`` (host, port): counts the bytes
    it passes back (``down``); ``budget``: the bytes it passes back in all before it
    cuts every connection (None: no limit); ``per_connection``: the bytes each connection
    passes back before it is cut."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.down = 0
        self.budget: int | None = None
        self.per_connection: int | None = None
        self.cuts = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> Relay:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, LOOPBACK, self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    def _allowance(self, n: int, passed: int) -> int:
        """How many of ``n`` bytes this connection may pass back now."""
        with self._lock:
            allowed = n
            if self.budget is not None:
                allowed = min(allowed, max(0, self.budget - self.down))
            if self.per_connection is not None:
                allowed = min(allowed, max(0, self.per_connection - passed))
            self.down += allowed
            return allowed

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            return

        async def up() -> None:
            while block := await cr.read(1 << 16):
                uw.write(block)
                await uw.drain()

        async def down() -> None:
            passed = 0
            while block := await ur.read(1 << 16):
                allowed = self._allowance(len(block), passed)
                if allowed:
                    cw.write(block[:allowed])
                    await cw.drain()
                    passed += allowed
                if allowed < len(block):
                    with self._lock:
                        self.cuts += 1
                    break
            cw.close()
            uw.close()

        try:
            await asyncio.gather(up(), down())
        except (ConnectionError, OSError):
            pass
        finally:
            cw.close()
            uw.close()


@pytest.fixture
async def relayed(tmp_path: Path) -> AsyncIterator[tuple[Service, Relay]]:
    """The service, its stand-in bucket reached through a relay (the URLs it signs name
    the relay: the stand-in's signatures cover the path and expiry, not the host)."""
    async for service in serve(tmp_path):
        host, port = service.storage.url.removeprefix("http://").rsplit(":", 1)
        relay = Relay((host, int(port))).start()
        service.storage.url = relay.url
        try:
            yield service, relay
        finally:
            relay.stop()


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of one part, two at a time; retries without the backoff's wait."""
    monkeypatch.setattr(reads, "RANGE_SIZE", PART_SIZE)
    monkeypatch.setattr(reads, "PARALLEL_RANGES", 2)
    monkeypatch.setattr(reads, "BACKOFF", 0.001)


async def _written(service: Service, tmp_path: Path, size: int = SIZE) -> tuple[str, bytes]:
    data = os.urandom(size)
    path = tmp_path / f"model-{uuid.uuid4().hex[:6]}"
    path.write_bytes(data)
    client = service.client("aws", "us-east-1")
    written = await asyncio.to_thread(client.write, ORG, "ckpt", path)
    return written.version, data


def _body_bytes(service: Service, since: int) -> int:
    """What the bucket sent in answer to the GETs after the ``since``-th."""
    return sum(n for _, _, n in service.storage.gets[since:])


@pytest.mark.parametrize("reader", ["selectors", "threads"])
async def test_a_download_cut_on_the_way_finishes_without_fetching_a_byte_twice(
    relayed: tuple[Service, Relay], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    service, relay = relayed
    monkeypatch.setattr(reads, "RANGE_READER", reader)
    version, data = await _written(service, tmp_path)
    cap = 5 * MiB + 12_345
    relay.per_connection = cap  # every connection cut inside a part
    out = tmp_path / "back"
    before, down = len(service.storage.gets), relay.down
    client: Artifacts = service.client("gcp", "us-central1")
    got = await asyncio.to_thread(client.read, ORG, "ckpt", version, out)
    assert got.size == SIZE and out.read_bytes() == data
    # each connection passes at most `cap`; at most PARALLEL_RANGES are open at the end,
    # uncut: the others were all cut
    assert relay.cuts >= SIZE // cap - reads.PARALLEL_RANGES, relay.cuts
    # every connection is cut before a part's end (16 MiB): a read that began a part or a
    # range again would never finish; each try asked for what was missing, so what came
    # is the version and what was in flight on the other connection when one was cut
    assert relay.down - down < SIZE * 1.25
    assert all(rng is not None for _, rng, _ in service.storage.gets[before:])
    assert not (tmp_path / "back.o41-partial").exists()
    assert not (tmp_path / "back.o41-partial.json").exists()


async def test_a_failed_download_keeps_its_bytes_and_the_next_read_fetches_only_the_rest(
    relayed: tuple[Service, Relay], tmp_path: Path
) -> None:
    service, relay = relayed
    version, data = await _written(service, tmp_path)
    client: Artifacts = service.client("gcp", "us-central1")
    out = tmp_path / "back"
    out.write_bytes(b"the previous file")
    relay.budget = relay.down + 21 * MiB + 777  # then every connection is cut at once
    with pytest.raises(ArtifactError, match=r"are kept in back\.o41-partial") as failed:
        await asyncio.to_thread(client.read, ORG, "ckpt", version, out)
    assert "the version to the same output again goes on from them" in str(failed.value)
    assert out.read_bytes() == b"the previous file"  # never taken for the file
    state = json.loads((tmp_path / "back.o41-partial.json").read_text())
    assert state["of"]["version"] == version and state["of"]["size"] == SIZE
    held = sum(e - s for s, e in state["have"])
    assert 20 * MiB < held <= 21 * MiB + 777

    relay.budget = None
    await asyncio.sleep(0.5)  # the cut tries' requests the bucket still answered
    down = relay.down
    got = await asyncio.to_thread(client.read, ORG, "ckpt", version, out)
    assert got.size == SIZE and out.read_bytes() == data
    fetched = relay.down - down  # what came through the relay: bodies and heads
    assert SIZE - held <= fetched < SIZE - held + 16 * 1024, (fetched, SIZE - held)
    print(f"resumed read: {held} bytes kept, {fetched} fetched of {SIZE}")
    assert not (tmp_path / "back.o41-partial").exists()
    assert not (tmp_path / "back.o41-partial.json").exists()


async def test_a_partial_file_of_another_version_is_not_continued(
    relayed: tuple[Service, Relay], tmp_path: Path
) -> None:
    service, relay = relayed
    first, _ = await _written(service, tmp_path)
    second, data = await _written(service, tmp_path)
    client: Artifacts = service.client("gcp", "us-central1")
    out = tmp_path / "back"
    relay.budget = relay.down + 9 * MiB
    with pytest.raises(ArtifactError):
        await asyncio.to_thread(client.read, ORG, "ckpt", first, out)
    relay.budget = None
    await asyncio.sleep(0.5)  # the cut tries' requests the bucket still answered
    before = len(service.storage.gets)
    await asyncio.to_thread(client.read, ORG, "ckpt", second, out)
    assert out.read_bytes() == data
    assert _body_bytes(service, before) == SIZE  # all of it: the partial was another's


async def test_a_download_url_that_expires_during_a_read_is_signed_again(
    relayed: tuple[Service, Relay], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = relayed
    version, data = await _written(service, tmp_path)
    monkeypatch.setattr("o41.webhook.writes.read.DOWNLOAD_EXPIRES", 1)
    monkeypatch.setattr(reads, "PARALLEL_RANGES", 1)
    monkeypatch.setattr(reads, "RANGE_READER", "threads")
    slept: list[float] = []

    class Slow:  # a reader slower than the URL's life: the next range finds it expired
        def set_size(self, size: int) -> None:
            pass

        def relative_update(self, inc: int = 1) -> None:
            if not slept:
                slept.append(2.2)
                time.sleep(2.2)

    client: Artifacts = service.client("gcp", "us-central1")
    signed = len([s for s in service.storage.signed if s.startswith("GET")])
    out = tmp_path / "back"
    got = await asyncio.to_thread(client.read, ORG, "ckpt", version, out, callback=Slow())
    assert got.size == SIZE and out.read_bytes() == data
    gets_signed = [s for s in service.storage.signed if s.startswith("GET")][signed:]
    assert len(gets_signed) >= 2, gets_signed  # the first URL, and one signed again
    # the usage page counts the read once: the bucket sent its bytes once in all
    assert await counted(service) == (1, SIZE)

    def read_on_and_off() -> tuple[bytes, bytes]:  # a file object signs again too
        with client.open(ORG, "ckpt", version)[0] as raw:
            first = raw.read(MiB)
            time.sleep(2.2)
            raw.seek(PART_SIZE)  # a new GET on the expired URL
            return first, raw.read(MiB)

    first, rest = await asyncio.to_thread(read_on_and_off)
    assert first == data[:MiB] and rest == data[PART_SIZE : PART_SIZE + MiB]
    # another read, counted as one more; its URL signed again is not a third
    assert await counted(service) == (2, 2 * SIZE)


async def test_a_download_signed_again_counts_only_a_read_counted_lately(
    relayed: tuple[Service, Relay], tmp_path: Path
) -> None:
    """``?again=true`` spares the count of a read this replica counted lately; said of a
    read it never counted, it is counted as the read it is; any other value is a 400."""
    service, _ = relayed
    version, _ = await _written(service, tmp_path)
    client: Artifacts = service.client("gcp", "us-central1")
    await asyncio.to_thread(client.locate, ORG, "ckpt", version, again=True)
    assert await counted(service) == (1, SIZE)  # never read before: counted
    await asyncio.to_thread(client.locate, ORG, "ckpt", version, again=True)
    assert await counted(service) == (1, SIZE)  # the same read's URL again
    await asyncio.to_thread(client.locate, ORG, "ckpt", version)
    assert await counted(service) == (2, 2 * SIZE)  # a read of its own
    status, answer = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/ckpt/versions/{version}?again=yes"
    )
    assert status == 400 and "again must be true or false" in answer["error"], answer


async def counted(service: Service) -> tuple[int, int]:
    """The reads and bytes the usage page counts for the organization."""
    records = await usage_of(service, "read")
    return (
        sum(r["counts"].get("reads", 0) for r in records),
        sum(r["counts"].get("bytes", 0) for r in records),
    )


# --- versitygw: S3's own signatures and expiry ------------------------------------------


@pytest.fixture
def gateway(s3: VersityStore) -> Iterator[tuple[Any, Relay]]:
    """A bucket on versitygw whose endpoint is a relay (the URLs are signed for it)."""
    relay = Relay((LOOPBACK, int(s3.gateway("us-east-1").rsplit(":", 1)[1]))).start()
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    ref = BucketRef(
        "s3", bucket_name("s3", "resume", str(uuid.uuid4())), "us-east-1", endpoint=relay.url,
        credentials=creds,
    )  # fmt: skip
    bucket = open_bucket(ref)
    bucket.ensure("loc-resume")
    try:
        yield bucket, relay
    finally:
        relay.stop()


@pytest.mark.stores
def test_a_read_cut_and_expired_on_versitygw_goes_on(
    gateway: tuple[Any, Relay], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, relay = gateway
    size = 3 * PART_SIZE
    data = os.urandom(size)
    bucket.put("ckpt/v1", data)
    sums = [
        crc32_b64(__import__("zlib").crc32(data[i : i + PART_SIZE]))
        for i in range(0, size, PART_SIZE)
    ]

    creds = bucket.ref.credentials

    def found(expired: bool = False) -> dict[str, Any]:
        """The read answer, its URL signed as the service signs one (SigV4, 5 minutes);
        ``expired``: signed 301 s ago."""
        now = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=301 if expired else 0)
        url = sigv4.presign(
            "GET", bucket._object_base + "ckpt/v1", {}, access_key=creds["accessKeyId"],
            secret_key=creds["secretAccessKey"], token=None, region="us-east-1", expires=300,
            now=now,
        )  # fmt: skip
        return {
            "version": "v1", "location": "versity", "size": size, "md5": None,
            "partSize": PART_SIZE, "crc32": sums,
            "download": {"method": "GET", "url": url, "headers": {}},
        }  # fmt: skip

    out = tmp_path / "back"
    relay.budget = relay.down + PART_SIZE + 5 * MiB
    with pytest.raises(ArtifactError, match="kept in"):
        reads.download(found(), out, 30.0)
    held = sum(
        e - s for s, e in json.loads((tmp_path / "back.o41-partial.json").read_text())["have"]
    )
    relay.budget = None
    relocated: list[int] = []

    def relocate() -> dict[str, Any]:
        relocated.append(1)
        return found()

    down = relay.down  # the next read starts with an expired URL: versitygw says 403
    assert reads.download(found(expired=True), out, 30.0, relocate=relocate) == size
    assert relocated == [1]
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()
    # only what it lacked: a part fetched again would be MiBs; the slack is the answers'
    # heads and the first read's last relayed blocks (64 KiB each) still in flight
    assert relay.down - down < size - held + 256 * 1024, (relay.down - down, size - held)
