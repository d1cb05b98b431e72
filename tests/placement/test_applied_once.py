"""Artifacts' calls retried after they landed (issue 39, point 2), in-process (the real
service app on the embedded store, a stand-in bucket over HTTP): a commit sent again after
it made the version answers that version, counted once, to the tenant that committed it,
and the 404 of before to any other; the same for a directory's commit; a tag moved by
compare-and-set and sent again answers success."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from o41.webhook.http.store import STORE
from o41.webhook.records import committed_key
from test_writes import Service, serve, usage_of
from testbed.locations import ORG

PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


def other_tenant(service: Service, tmp_path: Path) -> Service:
    token = tmp_path / "other"
    token.write_text("token-team-b")
    return Service(service.url, service.storage, token)


async def uploaded(service: Service, artifact: str, data: bytes, **more: Any) -> str:
    """A write begun and its bytes in the bucket: its id, ready to commit."""
    body = {"organization": ORG, "artifact": artifact, "size": len(data), "place": PLACE, **more}
    status, began = await service.api("POST", "/v1/writes", body)
    assert status == 201, began
    async with (
        aiohttp.ClientSession() as s,
        s.put(began["upload"]["single"]["url"], data=data) as r,
    ):
        assert r.status == 200
    return str(began["version"])


async def test_a_commit_sent_again_answers_its_version_once(
    service: Service, tmp_path: Path
) -> None:
    version = await uploaded(service, "again", b"landed", tag="prod")
    path = f"/v1/writes/{version}/commit"
    status, first = await service.api("POST", path, {})
    assert status == 200, first
    for _ in range(2):  # its answer lost: the client sends it again
        status, again = await service.api("POST", path, {})
        assert (status, again) == (200, first)
    assert first["version"] == version and first["tag"] == "prod" and first["size"] == 6
    writes = await usage_of(service, "write")
    assert sum(r["counts"]["versions"] for r in writes) == 1  # counted once
    status, page = await service.api("GET", f"/v1/organizations/{ORG}/artifacts/again/versions")
    assert [v["version"] for v in page["versions"]] == [version]

    # another tenant learns nothing of it: the 404 of a write that is not there
    status, theirs = await other_tenant(service, tmp_path).api("POST", path, {})
    assert status == 404 and "is waiting for its commit" in theirs["error"], theirs
    assert "location" not in theirs and "east" not in str(theirs)
    status, missing = await service.api("POST", "/v1/writes/0-nope/commit", {})
    assert missing["error"].replace("0-nope", version) == theirs["error"]

    # remembered under the pending writes' lease (about an hour), then forgotten
    assert service.app is not None
    kv = await service.app[STORE].get(committed_key(version))
    assert kv is not None and kv.lease
    await service.app[STORE].lease_revoke(kv.lease)
    status, gone = await service.api("POST", path, {})
    assert status == 404, gone


async def test_a_directory_commit_sent_again_answers_its_version(
    service: Service, tmp_path: Path
) -> None:
    files = {"a.bin": b"alpha", "b/c.bin": b"gamma!"}
    status, began = await service.api(
        "POST",
        "/v1/directories",
        {
            "organization": ORG,
            "artifact": "dir-again",
            "place": PLACE,
            "files": [
                {"path": p, "size": len(d), "md5": hashlib.md5(d).hexdigest()}
                for p, d in files.items()
            ],
        },
    )
    assert status == 201, began
    async with aiohttp.ClientSession() as s:
        for u in began["files"]:
            async with s.request(u["method"], u["url"], data=files[u["path"]]) as r:
                assert r.status == 200
    path = f"/v1/directories/{began['version']}/commit"
    status, first = await service.api("POST", path, {})
    assert status == 200 and first["files"] == 2, first
    status, again = await service.api("POST", path, {})
    assert (status, again) == (200, first)
    # the file route: nothing waits for its commit, and a directory is not answered there
    status, wrong = await service.api("POST", f"/v1/writes/{began['version']}/commit", {})
    assert status == 404, wrong
    status, theirs = await other_tenant(service, tmp_path).api("POST", path, {})
    assert status == 404, theirs
    writes = await usage_of(service, "write")
    assert sum(r["counts"]["versions"] for r in writes) == 1


async def test_a_tag_compare_and_set_sent_again_answers_success(service: Service) -> None:
    versions = []
    for n in range(2):
        version = await uploaded(service, "tagged", b"v%d" % n)
        status, _ = await service.api("POST", f"/v1/writes/{version}/commit", {})
        assert status == 200
        versions.append(version)
    v1, v2 = versions
    path = f"/v1/organizations/{ORG}/artifacts/tagged/tags/prod"
    status, created = await service.api("PUT", path, {"version": v1, "expected": None})
    assert status == 200 and created["previous"] is None, created
    status, again = await service.api("PUT", path, {"version": v1, "expected": None})
    assert status == 200 and again == created, again
    status, moved = await service.api("PUT", path, {"version": v2, "expected": v1})
    assert status == 200 and moved["previous"] == v1
    status, again = await service.api("PUT", path, {"version": v2, "expected": v1})
    assert status == 200 and again == moved, again
    # a compare-and-set that did not land still loses: the tag names another version
    status, lost = await service.api("PUT", path, {"version": v1, "expected": None})
    assert status == 409 and lost["current"] == v2, lost
