"""Issue 32: versions committed before the buckets held the record get their record
object once, and a directory's manifest moves out of etcd into a manifest object; reads
answer the same before and after, and a rebuild then finds every version."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from o41.core.directories import FileEntry, dump_manifest
from o41.core.ledger import parse_record
from o41.webhook.http.store import STORE
from o41.webhook.records import Version, manifest_key, version_key
from o41.webhook.writes.records_backfill import DONE, backfill_records
from test_directories import sdk
from test_writes import Service, serve
from testbed.locations import ORG


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


async def as_before_issue_32(service: Service, version: str, *, directory: bool) -> None:
    """The version as the release before left it: no record object in its bucket, and a
    directory's manifest in etcd, not in a manifest object."""
    assert service.app is not None
    store = service.app[STORE]
    objects = service.storage.objects
    for key in [k for k in objects if k.startswith("/bucket-east/.o41/") and version in k]:
        del objects[key]
    vkey = version_key(ORG, "run", version)
    found = await store.get(vkey)
    assert found is not None
    record = Version.load(found.value)
    old = replace(record, previous=None, by=None, tag=None)
    if directory:
        old = replace(old, manifest_sha256=None, manifest_size=None)
        entries = await service_manifest(service, version)
        await store.put(manifest_key(ORG, "run", version), dump_manifest(entries))
    await store.put(vkey, old.dump())
    await store.delete(DONE)


async def service_manifest(service: Service, version: str) -> list[FileEntry]:
    status, listed = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/run/versions/{version}/files"
    )
    assert status == 200, listed
    return [FileEntry(f["path"], f["size"], f["md5"]) for f in listed["files"]]


async def test_versions_from_before_get_their_record_and_a_directory_its_manifest_object(
    service: Service, tmp_path: Path
) -> None:
    client = sdk(service)
    one = tmp_path / "one.bin"
    one.write_bytes(b"a file from before")
    root = tmp_path / "dir"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"alpha")
    (root / "sub" / "b.bin").write_bytes(b"\x00" * 300)
    file_version = (await asyncio.to_thread(client.write, ORG, "run", one)).version
    dir_version = (await asyncio.to_thread(client.write, ORG, "run", root)).version
    assert service.app is not None
    app, store = service.app, service.app[STORE]
    before = await service_manifest(service, dir_version)
    await as_before_issue_32(service, file_version, directory=False)
    await as_before_issue_32(service, dir_version, directory=True)
    assert await service_manifest(service, dir_version) == before  # read from etcd

    assert await backfill_records(app) == (2, 0)
    objects = service.storage.objects
    for version in (file_version, dir_version):
        key = f".o41/versions/{ORG}/run/{version}"
        record = parse_record(key, objects[f"/bucket-east/{key}"].data, "east")
        assert (record.version, record.by, record.previous) == (version, None, None)
    assert await store.get(manifest_key(ORG, "run", dir_version)) is None  # out of etcd
    moved = await store.get(version_key(ORG, "run", dir_version))
    assert moved is not None and Version.load(moved.value).manifest_sha256 is not None
    assert f"/bucket-east/.o41/manifests/{ORG}/run/{dir_version}" in objects
    assert await service_manifest(service, dir_version) == before  # read from the bucket

    assert await backfill_records(app) == (0, 0)  # a scan with nothing to do: done
    assert await store.get(DONE) is not None
    del objects[f"/bucket-east/.o41/versions/{ORG}/run/{file_version}"]
    assert await backfill_records(app) == (0, 0)  # once done, later starts skip it
