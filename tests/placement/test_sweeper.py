"""No abandoned uploads, in the service: a multipart write whose pending lease expires has
its upload aborted in the stand-in bucket; a committed one is left alone; two replicas
sweep a write once. In-process, as tests/placement/test_writes.py (the embedded store, the real app,
``testbed.standin_bucket``); the same against versitygw is in
tests/storage/test_sweeper_stores.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from o41.core.parts import PART_SIZE
from o41.state import Store, WatchEvent
from o41.state.memory import MemoryStore
from o41.webhook.writes import pending, sweeper
from o41.webhook.writes.sweeper import SWEEPER
from test_state_store import next_event
from test_writes import Service, serve, usage_of
from testbed.locations import ORG

MiB = 2**20
PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


@pytest.fixture
def short_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending writes expire after one second (the lease is PENDING_TTL + 60 s)."""
    monkeypatch.setattr(pending, "PENDING_TTL", -59)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


async def begin_multipart(service: Service, artifact: str, parts_sent: int) -> dict[str, object]:
    """Begin a two-part write and upload ``parts_sent`` of its parts, as a pod would."""
    size = PART_SIZE + MiB
    body = {"organization": ORG, "artifact": artifact, "size": size, "place": PLACE}
    status, began = await service.api("POST", "/v1/writes", body)
    assert status == 201, began
    parts = began["upload"]["multipart"]["parts"]
    assert len(parts) == 2
    async with aiohttp.ClientSession() as s:
        for part in parts[:parts_sent]:
            async with s.put(part["url"], data=b"p" * PART_SIZE, headers=part["headers"]) as r:
                assert r.status == 200
    return dict(began)


def decided(service: Service) -> int:
    """How many pending deletes the service's sweeper has decided on."""
    assert service.app is not None
    return service.app[SWEEPER].seen


async def until(condition: object, seconds: float = 10) -> None:
    assert callable(condition)
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition never held")


@pytest.mark.usefixtures("short_leases")
async def test_an_expired_writes_upload_is_aborted(service: Service) -> None:
    began = await begin_multipart(service, "left", parts_sent=1)
    storage = service.storage
    upload_ids = {upload for upload, _ in storage.parts}
    assert len(upload_ids) == 1  # one part of the write is in the bucket
    await until(lambda: storage.aborted)
    assert storage.aborted == [(f"/bucket-east/left/{began['version']}", upload_ids.pop())]
    assert storage.parts == {}  # its parts are gone
    # the write cannot be committed any more: it is over
    status, _ = await service.api("POST", f"/v1/writes/{began['version']}/commit", {})
    assert status == 404
    records = await usage_of(service, "abandoned")
    assert [r["counts"] for r in records] == [
        {"uploads": 1, "bytes": PART_SIZE + MiB, "aborted": 1, "abortedBytes": PART_SIZE + MiB}
    ]
    assert records[0]["dims"] == {
        "location": "east",
        "locationCloud": "aws",
        "locationRegion": "us-east-1",
    }


@pytest.mark.parametrize("by", ["age", "record"])
async def test_a_committed_write_is_not_aborted(
    service: Service, tmp_path: Path, by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit deletes the pending record too: the sweeper takes a delete younger than
    any lease for a commit (``age``) and, for one as old as an expiry (``record``: every
    delete is, here), finds the version's record; it leaves the upload (and the object it
    became) alone."""
    if by == "record":
        monkeypatch.setattr(sweeper, "CLOCKS", 1e9)
    data = os.urandom(PART_SIZE + MiB)
    path = tmp_path / "big"
    path.write_bytes(data)
    written = await asyncio.to_thread(service.client("aws", "us-east-1").write, ORG, "kept", path)
    await until(lambda: decided(service) >= 1)  # the commit's delete
    assert service.storage.aborted == []
    out = tmp_path / "back"
    await asyncio.to_thread(
        service.client("aws", "us-east-1").read, ORG, "kept", written.version, out
    )
    assert out.read_bytes() == data
    assert await usage_of(service, "abandoned") == []


@pytest.mark.usefixtures("short_leases")
async def test_a_single_put_write_that_expires_aborts_nothing(service: Service) -> None:
    body = {"organization": ORG, "artifact": "small", "size": 5, "place": PLACE}
    status, began = await service.api("POST", "/v1/writes", body)
    assert status == 201 and "single" in began["upload"]
    await until(lambda: decided(service) >= 1)  # its lease expired, the record went
    assert service.storage.aborted == []


@pytest.mark.usefixtures("short_leases")
async def test_two_replicas_sweep_a_write_once(tmp_path: Path) -> None:
    """Two services on one store both see the lease expire; one aborts and counts."""
    store = MemoryStore()
    async with _two_services(tmp_path, store) as (one, two):
        await begin_multipart(one, "twice", parts_sent=1)
        await until(lambda: decided(one) >= 1 and decided(two) >= 1)  # both saw it
        assert len(one.storage.aborted) + len(two.storage.aborted) == 1
        counted = await usage_of(one, "abandoned")
        assert sum(r["counts"]["aborted"] for r in counted) == 1


class _two_services:
    def __init__(self, tmp_path: Path, store: MemoryStore) -> None:
        self._gens = [serve(tmp_path / n, store=store) for n in ("a", "b")]
        for n in ("a", "b"):
            (tmp_path / n).mkdir()

    async def __aenter__(self) -> tuple[Service, Service]:
        one, two = [await anext(g) for g in self._gens]
        return one, two

    async def __aexit__(self, *exc: object) -> None:
        for g in self._gens:
            await g.aclose()  # type: ignore[attr-defined]


async def test_a_watch_with_prev_kv_gives_what_a_delete_removed() -> None:
    """What the sweeper relies on, on the embedded store here and on etcd in
    tests/storage/test_sweeper_stores.py: an expiry's deletes carry the record they removed; a
    watch without prev_kv carries none."""
    store = MemoryStore()
    await prev_kv_events(store, b"/test/prev/")
    await store.close()


async def prev_kv_events(store: Store, p: bytes) -> None:
    # from a revision on: each watch sees what came after it, however late it starts
    since = await store.put(p.rstrip(b"/") + b"-marker", b"") + 1
    with_prev = store.watch(p, start_revision=since, prev_kv=True)
    without = store.watch(p, start_revision=since)
    deletes = store.watch(p, start_revision=since, prev_kv=True, deletes_only=True)
    only = asyncio.ensure_future(next_event(deletes))
    lease = await store.lease_grant(1)
    first = asyncio.ensure_future(next_event(with_prev))
    plain = asyncio.ensure_future(next_event(without))
    await store.put(p + b"a", b"record", lease=lease)
    put: WatchEvent = await first
    assert (put.kind, put.prev) == ("put", None)
    assert (await plain).prev is None
    gone = await next_event(with_prev)  # the lease expired
    assert gone.kind == "delete"
    assert gone.prev is not None and (gone.prev.key, gone.prev.value) == (p + b"a", b"record")
    assert (await next_event(without)).prev is None
    deleted = await only  # the put was not sent to this watch
    assert (deleted.kind, deleted.kv.key, deleted.prev) == ("delete", p + b"a", gone.prev)
    await deletes.aclose()  # type: ignore[attr-defined]
    await with_prev.aclose()  # type: ignore[attr-defined]
    await without.aclose()  # type: ignore[attr-defined]


async def test_a_lease_lost_young_is_left_to_the_buckets_rule(tmp_path: Path) -> None:
    """A pending record deleted long before any lease could expire is taken for a commit
    without a read of the store (commits cost the replicas nothing); its upload, if it was
    not one, is left to the bucket's lifecycle rule."""
    store = MemoryStore()
    async for service in serve(tmp_path, store=store):
        await begin_multipart(service, "young", parts_sent=1)
        lease = next(iter(store._leases))  # the pending writes' lease of this minute
        await store.lease_revoke(lease)  # etcd deletes a lost lease's keys the same way
        await until(lambda s=service: decided(s) >= 1)
        assert service.storage.aborted == []
        assert await usage_of(service, "abandoned") == []


async def begin_directory(
    service: Service, artifact: str, files: dict[str, bytes], sent: int
) -> dict[str, Any]:
    """Begin a directory write of ``files`` and upload the first ``sent`` of them."""
    body = {
        "organization": ORG,
        "artifact": artifact,
        "place": PLACE,
        "files": [
            {"path": p, "size": len(d), "md5": hashlib.md5(d).hexdigest()} for p, d in files.items()
        ],
    }
    status, began = await service.api("POST", "/v1/directories", body)
    assert status == 201, began
    uploads = {u["path"]: u for u in began["files"]}
    async with aiohttp.ClientSession() as s:
        for path in list(files)[:sent]:
            u = uploads[path]
            async with s.request(u["method"], u["url"], data=files[path]) as r:
                assert r.status == 200, await r.text()
    return dict(began)


DIRECTORY = {"a.bin": b"a" * 1000, "b/c.bin": b"c" * 2000, "d.bin": b"d" * 4000}


@pytest.mark.usefixtures("short_leases")
async def test_an_expired_directory_writes_files_are_deleted(service: Service) -> None:
    """A directory write whose lease expires: the files it had uploaded (plain objects,
    no bucket rule removes them) are deleted, counted once as an abandoned upload with the
    bytes the bucket held, and the write can no longer be committed."""
    began = await begin_directory(service, "left", DIRECTORY, sent=2)
    prefix = f"/bucket-east/left/{began['version']}/"
    storage = service.storage
    assert sorted(k for k in storage.objects if k.startswith(prefix)) == [
        prefix + "a.bin",
        prefix + "b/c.bin",
    ]
    await until(lambda: decided(service) >= 1)
    assert sorted(storage.deleted) == [prefix + "a.bin", prefix + "b/c.bin"]  # only those held
    assert not any(k.startswith(prefix) for k in storage.objects)
    assert service.app is not None and service.app[SWEEPER].swept == 1
    status, _ = await service.api("POST", f"/v1/directories/{began['version']}/commit", {})
    assert status == 404
    records = await usage_of(service, "abandoned")
    assert [r["counts"] for r in records] == [
        {"uploads": 1, "bytes": 3000, "aborted": 1, "abortedBytes": 3000}
    ]
    assert records[0]["dims"]["location"] == "east"


async def test_a_committed_directory_is_never_deleted(service: Service) -> None:
    """A directory's pending deletes are always looked up (no age shortcut): the commit's
    is found committed, and its files stay."""
    began = await begin_directory(service, "kept", DIRECTORY, sent=len(DIRECTORY))
    status, done = await service.api("POST", f"/v1/directories/{began['version']}/commit", {})
    assert status == 200, done
    await until(lambda: decided(service) >= 1)  # the commit's delete
    assert service.storage.deleted == []
    status, listed = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/kept/versions/latest/files"
    )
    assert status == 200 and len(listed["files"]) == 3
    assert await usage_of(service, "abandoned") == []


async def test_a_directory_lease_lost_young_is_cleaned_up(tmp_path: Path) -> None:
    """Unlike a multipart upload (which the bucket's rule aborts), a directory's files
    have no rule behind them: a pending directory write deleted young (a lease lost in the
    store) has its files deleted too, since no commit can follow the record's delete."""
    store = MemoryStore()
    async for service in serve(tmp_path, store=store):
        began = await begin_directory(service, "young", DIRECTORY, sent=1)
        lease = next(iter(store._leases))
        await store.lease_revoke(lease)
        await until(lambda s=service: decided(s) >= 1)
        assert service.storage.deleted == [f"/bucket-east/young/{began['version']}/a.bin"]
        status, _ = await service.api("POST", f"/v1/directories/{began['version']}/commit", {})
        assert status == 404


@pytest.mark.usefixtures("short_leases")
async def test_two_replicas_delete_an_expired_directory_once(tmp_path: Path) -> None:
    store = MemoryStore()
    async with _two_services(tmp_path, store) as (one, two):
        await begin_directory(one, "twice", DIRECTORY, sent=3)
        await until(lambda: decided(one) >= 1 and decided(two) >= 1)
        assert one.app is not None and two.app is not None
        assert one.app[SWEEPER].swept + two.app[SWEEPER].swept == 1
        counted = await usage_of(one, "abandoned")
        assert sum(r["counts"]["aborted"] for r in counted) == 1
        assert sum(r["counts"]["uploads"] for r in counted) == 1  # (each its own bucket)
