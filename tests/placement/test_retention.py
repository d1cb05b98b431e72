"""Retention and the cleanup shown on the usage page, in-process (the embedded store, the
real app, ``testbed.standin_bucket``); against etcd and versitygw:
tests/storage/test_retention_stores.py.

The usage page shows what the sweeper counted (the uploads of expired writes: all of
them, and those whose abort the bucket took) and what retention deleted, by location.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from o41.core.parts import PART_SIZE
from o41.webhook.cluster.view import VIEW, organization_source
from o41.webhook.http.store import STORE
from o41.webhook.records import index_prefix, manifest_key, version_key
from o41.webhook.retention import RETENTION
from o41.webhook.usage.counters import USAGE
from test_directories import sdk
from test_sweeper import MiB, begin_multipart, short_leases, until
from test_writes import Service, serve
from testbed.locations import ORG

__all__ = ["short_leases"]


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


def rules(service: Service, keep: int) -> None:
    assert service.app is not None
    service.app[VIEW].put_organization(
        organization_source(
            {
                "metadata": {"name": ORG},
                "spec": {
                    "namespaces": ["team-a"],
                    "retention": [{"artifacts": "ckpt", "keepVersions": keep}],
                },
            }
        )
    )


@pytest.mark.usefixtures("short_leases")
async def test_the_usage_page_shows_abandoned_aborted_and_retained_bytes(
    service: Service, tmp_path: Path
) -> None:
    assert service.app is not None
    rules(service, 1)
    # an expired write, whose upload the sweeper aborts
    await begin_multipart(service, "left", parts_sent=1)
    await until(lambda: service.storage.aborted, 15)
    # two versions of a covered artifact: retention deletes the older one
    data = [os.urandom(1000), os.urandom(2000)]
    client = service.client("aws", "us-east-1")
    for n, chunk in enumerate(data):
        f = tmp_path / f"c{n}"
        f.write_bytes(chunk)
        await asyncio.to_thread(client.write, ORG, "ckpt", f)
    retention = service.app[RETENTION]
    await until(lambda: retention.deleted == 1, 15)
    await service.app[USAGE].flush()

    headers = {"Authorization": "Bearer token-team-a"}
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.get(f"{service.url}/v1/usage?organization={ORG}&window=24h") as r,
    ):
        assert r.status == 200
        answer = await r.json()
    assert answer["cleanup"] == [
        {
            "location": "east",
            "abandoned": {"uploads": 1, "bytes": PART_SIZE + MiB},
            "aborted": {"uploads": 1, "bytes": PART_SIZE + MiB},
            "notAborted": {"uploads": 0, "bytes": 0},
            "retention": {"versions": 1, "bytes": 1000},
        }
    ]
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.get(f"{service.url}/usage?organization={ORG}&window=24h") as r,
    ):
        assert r.status == 200
        text = await r.text()
    table = re.search(r"<table id=cleanup>.*?</table>", text, re.S)
    assert table is not None, text
    row = re.findall(r"<td>(.*?)</td>", table.group(0))
    assert row == ["east", "1", "17.8 MB", "1", "17.8 MB", "0 B", "1", "1.0 kB"]


async def test_retention_is_off_without_a_rule(service: Service, tmp_path: Path) -> None:
    assert service.app is not None
    client = service.client("aws", "us-east-1")
    f = tmp_path / "v"
    for n in range(3):
        f.write_bytes(b"v" * (n + 1))
        await asyncio.to_thread(client.write, ORG, "ckpt", f)
    assert await service.app[RETENTION].apply(ORG, "ckpt") == 0
    status, page = await service.api("GET", f"/v1/organizations/{ORG}/artifacts/ckpt/versions")
    assert status == 200 and len(page["versions"]) == 3
    assert service.storage.deleted == []


async def test_a_directory_version_is_deleted_whole_unless_kept(
    service: Service, tmp_path: Path
) -> None:
    """Directory versions (written by the SDK): the one no rule keeps loses every file
    under its prefix, its version and index records and its manifest; the tagged one, the
    newest N and ``latest`` keep all their files and stay readable."""
    assert service.app is not None
    client = sdk(service)
    written = []
    for n in range(4):
        root = tmp_path / f"d{n}"
        (root / "shards").mkdir(parents=True)
        (root / "config.json").write_bytes(b"{}" * (n + 1))
        (root / "shards" / "0.bin").write_bytes(b"s" * 100 * (n + 1))
        tag = "best" if n == 0 else None
        written.append((await asyncio.to_thread(client.write, ORG, "ckpt", root, tag=tag)).version)
    tagged, gone, newest, latest = written
    storage = service.storage

    def files_of(version: str) -> list[str]:
        prefix = f"/bucket-east/ckpt/{version}/"
        return sorted(k.removeprefix(prefix) for k in storage.objects if k.startswith(prefix))

    assert all(files_of(v) == ["config.json", "shards/0.bin"] for v in written)
    rules(service, 2)
    assert await service.app[RETENTION].apply(ORG, "ckpt") == 1
    assert files_of(gone) == []
    # its files, then its manifest and record objects last (issue 32)
    assert storage.deleted[2:] == [
        f"/bucket-east/.o41/manifests/{ORG}/ckpt/{gone}",
        f"/bucket-east/.o41/versions/{ORG}/ckpt/{gone}",
    ]
    assert sorted(storage.deleted[:2]) == [
        f"/bucket-east/ckpt/{gone}/config.json",
        f"/bucket-east/ckpt/{gone}/shards/0.bin",
    ]
    store = service.app[STORE]
    assert await store.get(version_key(ORG, "ckpt", gone)) is None
    assert await store.get(manifest_key(ORG, "ckpt", gone)) is None
    index = await store.range(index_prefix(ORG, "ckpt"))
    assert len(index) == 3 and not any(gone.encode() in kv.key for kv in index)
    status, page = await service.api("GET", f"/v1/organizations/{ORG}/artifacts/ckpt/versions")
    assert status == 200
    assert [v["version"] for v in page["versions"]] == [latest, newest, tagged]
    for kept in (tagged, newest, latest):
        assert files_of(kept) == ["config.json", "shards/0.bin"]
        assert f"/bucket-east/.o41/manifests/{ORG}/ckpt/{kept}" in storage.objects
        out = tmp_path / f"back-{kept}"
        await asyncio.to_thread(client.read, ORG, "ckpt", kept, out)
        assert (out / "shards" / "0.bin").exists()
    status, _ = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/ckpt/versions/{gone}/files"
    )
    assert status == 404
    assert await service.app[RETENTION].apply(ORG, "ckpt") == 0  # a second pass: nothing


async def test_a_rule_added_later_is_found_by_the_periodic_pass(
    service: Service, tmp_path: Path
) -> None:
    """No commit after the rule came: the periodic pass lists the artifacts a rule covers
    (and only those) and applies it."""
    assert service.app is not None
    client = service.client("aws", "us-east-1")
    f = tmp_path / "v"
    for artifact in ("ckpt", "ckpt", "ckpt", "model", "model"):
        f.write_bytes(b"v")
        await asyncio.to_thread(client.write, ORG, artifact, f)
    rules(service, 1)
    retention = service.app[RETENTION]
    covered = await retention._covered()
    assert covered == {(ORG, "ckpt")}
    assert [await retention.apply(*c) for c in covered] == [2]
    status, page = await service.api("GET", f"/v1/organizations/{ORG}/artifacts/model/versions")
    assert status == 200 and len(page["versions"]) == 2
