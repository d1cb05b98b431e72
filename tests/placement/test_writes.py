"""Begin, commit and read in-process: the real service app on the embedded store, the real
client, and a stand-in bucket served over HTTP on 127.0.0.1 (``testbed.standin_bucket``,
its Locations from ``testbed.locations``). No control plane, no etcd: ``make unit``
runs these."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from o41.client import reads, transfers
from o41.client.artifacts import Artifacts
from o41.client.errors import ArtifactError, Damaged, Unavailable
from o41.client.transfers import part_checksums
from o41.core.parts import PART_SIZE, crc32_b64
from o41.core.places import Place
from o41.state import Store
from o41.state.memory import MemoryStore
from o41.storage import MultipartUpload, ObjectStat, Part, Reason, StorageError
from o41.webhook.app import Settings, make_app
from o41.webhook.cluster.view import VIEW, Cluster, View, organization_source
from testbed.locations import ORG, Keys, location
from testbed.standin_bucket import StandInBucket, Storage, Stored
from testbed.usage import FakeReviewer


@dataclass
class Service:
    url: str
    storage: Storage
    token: Path
    app: web.Application | None = None

    def client(self, cloud: str | None, region: str | None) -> Artifacts:
        place = Place(cloud, region, "env" if cloud else "none")
        return Artifacts(self.url, str(self.token), place=place, timeout=30)

    async def api(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token.read_text()}", **kw.pop("headers", {})}
        async with (
            aiohttp.ClientSession(headers=headers) as s,
            s.request(method, self.url + path, json=body, **kw) as r,
        ):
            return r.status, await r.json(content_type=None)


async def serve(
    tmp_path: Path, opener: Any = None, store: Store | None = None
) -> AsyncIterator[Service]:
    storage = Storage()
    bucket_server = TestServer(storage.app(), host="127.0.0.1")
    await bucket_server.start_server()
    storage.url = str(bucket_server.make_url("")).rstrip("/")
    view = View()
    for n, (name, cloud, region) in enumerate(
        [("east", "aws", "us-east-1"), ("west", "aws", "us-west-2"), ("flaky", "nebius", "eu-n")],
        start=1,
    ):
        view.put_location(location(name, cloud, region, n))
    view.put_organization(
        organization_source({"metadata": {"name": ORG}, "spec": {"namespaces": ["team-a"]}})
    )
    view.synced.set()
    app = make_app(
        Settings(usage_interval=3600),
        FakeReviewer(),
        store=store or MemoryStore(),
        cluster=Cluster(view, Keys()),
        buckets=opener(storage) if opener else storage.opener,
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    token = tmp_path / "token"
    token.write_text("token-team-a")
    try:
        yield Service(str(server.make_url("")).rstrip("/"), storage, token, app)
    finally:
        await server.close()
        await bucket_server.close()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


async def usage_of(service: Service, kind: str) -> list[dict[str, Any]]:
    status, answer = await service.api(
        "GET", f"/v1/usage?organization={ORG}&records=true&limit=5000"
    )
    assert status == 200, answer
    return [r for r in answer["records"] if r["kind"] == kind]


async def test_a_write_and_its_read_in_process(service: Service, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "model"
    path.write_bytes(data)
    written = await asyncio.to_thread(service.client("aws", "us-west-2").write, ORG, "m", path)
    assert (written.location, written.rule, written.warning) == ("west", "region", None)

    out = tmp_path / "back"
    got = await asyncio.to_thread(
        service.client("gcp", "us-central1").read, ORG, "m", written.version, out
    )
    assert (got.location, got.locality, out.read_bytes()) == ("west", "cross-cloud", data)
    writes = await usage_of(service, "write")
    assert [(r["dims"]["rule"], r["counts"]) for r in writes] == [
        ("region", {"versions": 1, "bytes": len(data)})
    ]


async def test_a_large_file_goes_up_in_parts(service: Service, tmp_path: Path) -> None:
    data = os.urandom(PART_SIZE + 5 * 1024 * 1024)
    path = tmp_path / "big"
    path.write_bytes(data)
    written = await asyncio.to_thread(service.client("aws", "us-east-1").write, ORG, "big", path)
    key = f"big/{written.version}"
    assert service.storage.signed == [f"PUT {key} 1", f"PUT {key} 2"]  # two parts, no PUT
    out = tmp_path / "back"
    await asyncio.to_thread(
        service.client("aws", "us-east-1").read, ORG, "big", written.version, out
    )
    assert out.read_bytes() == data


async def test_a_read_checks_each_whole_part_it_covers(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each part's CRC32 from the write is checked by every read that covers the part
    whole; a range that covers a part only in part cannot check it. The real stand-ins:
    tests/placement/test_reads.py."""
    monkeypatch.setattr(reads, "RANGE_SIZE", PART_SIZE)
    data = bytearray(os.urandom(2 * PART_SIZE + 1024 * 1024))
    path = tmp_path / "big"
    path.write_bytes(data)
    client = service.client("aws", "us-east-1")
    written = await asyncio.to_thread(client.write, ORG, "big", path)
    (key,) = [k for k, v in service.storage.objects.items() if v.data == data]
    data[PART_SIZE - 1] ^= 1  # the last byte of part 1
    service.storage.objects[key] = Stored(bytes(data))

    out = tmp_path / "back"
    with pytest.raises(Damaged, match=r"part 1 of 3 \(bytes 0-") as damaged:
        await asyncio.to_thread(client.read, ORG, "big", written.version, out)
    assert damaged.value.part == 1 and not out.exists()
    assert not (tmp_path / "back.o41-partial").exists()
    with pytest.raises(Damaged, match="part 1 of 3"):
        await asyncio.to_thread(client.read_range, ORG, "big", written.version, 0, PART_SIZE)
    rest, _ = await asyncio.to_thread(
        client.read_range, ORG, "big", written.version, PART_SIZE, 2 * PART_SIZE
    )
    assert rest == data[PART_SIZE:]
    tail, _ = await asyncio.to_thread(  # part 1 in part, unchecked; part 2 whole, checked
        client.read_range, ORG, "big", written.version, PART_SIZE - 10, PART_SIZE + 10
    )
    assert tail == data[PART_SIZE - 10 : 2 * PART_SIZE]


async def test_a_location_that_cannot_sign_is_passed_over(service: Service, tmp_path: Path) -> None:
    """Its begin is a 503 naming it; the client begins again without it (issue 16)."""
    service.storage.unsignable.add("bucket-flaky")
    body = {
        "organization": ORG,
        "artifact": "a",
        "place": {"cloud": "nebius", "region": "eu-n", "source": "env"},
    }
    status, answer = await service.api("POST", "/v1/writes", body)
    assert (status, answer["location"], answer["reason"]) == (503, "flaky", "AccessDenied")

    path = tmp_path / "f"
    path.write_bytes(b"moved on")
    written = await asyncio.to_thread(service.client("nebius", "eu-n").write, ORG, "a", path)
    assert (written.location, written.rule) == ("east", "fallback")


async def test_a_commit_that_loses_the_race_counts_nothing(tmp_path: Path) -> None:
    """Two commits of one write both read the pending write before either commits: one
    makes the version, the other finds it made; the usage counts it once."""
    both_read = threading.Barrier(2, timeout=10)

    class Racing(StandInBucket):
        def stat(self, key: str) -> ObjectStat | None:
            both_read.wait()  # each commit has read the pending write by now
            return super().stat(key)

    def opener(storage: Storage) -> Any:
        return lambda ref: Racing(ref, storage)

    async for service in serve(tmp_path, opener):
        place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
        body = {"organization": ORG, "artifact": "r", "size": 5, "place": place}
        status, began = await service.api("POST", "/v1/writes", body)
        assert status == 201, began
        single = began["upload"]["single"]
        async with aiohttp.ClientSession() as s, s.put(single["url"], data=b"raced") as r:
            assert r.status == 200
        path = f"/v1/writes/{began['version']}/commit"
        answers = await asyncio.gather(*(service.api("POST", path, {}) for _ in range(2)))
        assert [a[0] for a in answers] == [200, 200], answers
        writes = await usage_of(service, "write")
        assert sum(r["counts"]["versions"] for r in writes) == 1
        assert sum(r["counts"]["bytes"] for r in writes) == 5


async def test_bad_input_gets_a_clear_4xx_in_process(service: Service) -> None:
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    mib = 1024 * 1024

    async def begin(**fields: Any) -> tuple[int, Any]:
        return await service.api(
            "POST", "/v1/writes", {"organization": ORG, "artifact": "a", "place": place, **fields}
        )

    cases = [
        (await begin(size=100 * mib, crc32=["AAAAAA=="]), 400, "crc32 needs partSize"),
        (await begin(partSize=16 * mib), 400, "partSize needs size"),
        (await begin(size=100 * mib, partSize=1024), 400, "at least 5 MiB"),
        (
            await service.api(
                "POST",
                "/v1/writes",
                data=b"x" * (2 * mib),
                headers={"Content-Type": "application/json"},
            ),
            413,
            "Maximum request body size",
        ),
        (await service.api("POST", "/v1/writes/nope/commit", {}), 404, "begin again"),
        (await service.api("GET", "/v1/nowhere"), 404, "Not Found"),
    ]
    for (status, body), want_status, want in cases:
        assert status == want_status, (status, body)
        assert want in body["error"], body


async def test_a_commit_before_the_upload_is_refused(service: Service) -> None:
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    body = {"organization": ORG, "artifact": "u", "size": 10, "place": place}
    status, began = await service.api("POST", "/v1/writes", body)
    assert status == 201
    status, answer = await service.api("POST", f"/v1/writes/{began['version']}/commit", {})
    assert status == 409 and "not in the bucket" in answer["error"]
    path = f"/v1/organizations/{ORG}/artifacts/u/versions/{began['version']}"
    status, answer = await service.api("GET", path)
    assert status == 404 and "no committed version" in answer["error"]


class PodDied(Exception):
    """Stands for the pod being killed in the middle of an upload."""


async def test_a_write_killed_after_some_parts_resumes_without_resending_them(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(3 * PART_SIZE + 1000)  # four parts
    path = tmp_path / "ckpt"
    path.write_bytes(data)
    monkeypatch.setattr(transfers, "PARALLEL_PARTS", 1)
    sent = 0
    real_put = transfers.put

    def dying_put(*args: Any) -> str:
        nonlocal sent
        if sent == 2:
            raise PodDied
        sent += 1
        return real_put(*args)

    began: list[str] = []
    real_call = Artifacts.call

    def call(self: Artifacts, method: str, path_: str, body: Any = None, **kw: Any) -> Any:
        answer = real_call(self, method, path_, body, **kw)
        if path_ == "/v1/writes":
            began.append(answer["version"])
        return answer

    monkeypatch.setattr(Artifacts, "call", call)
    monkeypatch.setattr(transfers, "put", dying_put)
    client = service.client("aws", "us-east-1")
    with pytest.raises(PodDied):
        await asyncio.to_thread(client.write, ORG, "ckpt", path)
    monkeypatch.setattr(transfers, "put", real_put)
    (version,) = began
    key = f"/bucket-east/ckpt/{version}"
    assert service.storage.puts == [f"{key} 1", f"{key} 2"]

    status, progress = await service.api("GET", f"/v1/writes/{version}")
    assert status == 200, progress
    assert [(p["number"], p["size"]) for p in progress["present"]] == [
        (1, PART_SIZE),
        (2, PART_SIZE),
    ]
    assert (progress["parts"], progress["partSize"]) == (4, PART_SIZE)

    written = await asyncio.to_thread(
        client.write, ORG, "ckpt", path, metadata={"step": 7}, resume=version
    )
    assert written.version == version and began == [version]  # no second begin
    assert service.storage.puts == [f"{key} {n}" for n in (1, 2, 3, 4)]  # 1 and 2 once
    out = tmp_path / "back"
    got = await asyncio.to_thread(client.read, ORG, "ckpt", "latest", out)
    assert got.version == version and out.read_bytes() == data


async def test_a_resume_sends_again_a_part_that_differs(service: Service, tmp_path: Path) -> None:
    """A part in the bucket that is not the file's (its ETag differs) is sent again."""
    data = os.urandom(PART_SIZE + 1000)
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    body = {"organization": ORG, "artifact": "d", "size": len(data), "place": place}
    body["partSize"] = PART_SIZE
    status, began = await service.api("POST", "/v1/writes", body)
    assert status == 201, began
    first = began["upload"]["multipart"]["parts"][0]
    async with aiohttp.ClientSession() as s, s.put(first["url"], data=b"x" * PART_SIZE) as r:
        assert r.status == 200
    path = tmp_path / "d"
    path.write_bytes(data)
    client = service.client("aws", "us-east-1")
    await asyncio.to_thread(client.write, ORG, "d", path, resume=began["version"])
    got, _ = await asyncio.to_thread(client.read_bytes, ORG, "d", began["version"])
    assert got == data
    key = f"/bucket-east/d/{began['version']}"
    assert sorted(service.storage.puts) == [f"{key} 1", f"{key} 1", f"{key} 2"]


class ListsPartChecksums(StandInBucket):
    """The stand-in listing each part's CRC32, as S3 lists the parts of an upload begun
    with CRC32 checksums."""

    def list_parts(self, key: str, upload: MultipartUpload | str) -> list[Part]:
        upload_id = upload if isinstance(upload, str) else upload.upload_id
        with self._storage.lock:
            held = {n: d for (u, n), d in self._storage.parts.items() if u == upload_id}
        return [
            replace(p, crc32=crc32_b64(zlib.crc32(held[p.number])))
            for p in super().list_parts(key, upload)
        ]


async def test_a_resume_or_commit_with_another_files_bytes_is_refused(tmp_path: Path) -> None:
    """Issue 43: parts of another file of the same size are refused by the resume before a
    byte is sent, and by the commit where the bucket shows each part's CRC32; the write
    stays pending, and its own file then resumes and commits."""

    def opener(storage: Storage) -> Any:
        return lambda ref: ListsPartChecksums(ref, storage)

    async for service in serve(tmp_path, opener=opener):
        began_with, other = os.urandom(PART_SIZE + 1000), os.urandom(PART_SIZE + 1000)
        path, other_path = tmp_path / "ckpt", tmp_path / "other"
        path.write_bytes(began_with)
        other_path.write_bytes(other)
        place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
        body = {"organization": ORG, "artifact": "c", "size": len(began_with), "place": place}
        body |= {"partSize": PART_SIZE, "crc32": part_checksums(path, len(began_with), PART_SIZE)}
        status, began = await service.api("POST", "/v1/writes", body)
        assert status == 201, began
        version = began["version"]
        client = service.client("aws", "us-east-1")

        # the SDK: refused before a byte is sent
        with pytest.raises(ArtifactError) as refused:
            await asyncio.to_thread(client.write, ORG, "c", other_path, resume=version)
        assert str(refused.value).startswith(f"write {version} began with another file: part 1")
        assert "resume with the file it began with" in str(refused.value)
        assert service.storage.puts == []

        # a client that sends them anyway: the commit refuses, 409, before assembling them
        etags = []
        async with aiohttp.ClientSession() as s:
            for n, part in enumerate(began["upload"]["multipart"]["parts"]):
                chunk = other[n * PART_SIZE : (n + 1) * PART_SIZE]
                async with s.put(part["url"], data=chunk, headers=part["headers"]) as r:
                    assert r.status == 200
                    etags.append(r.headers["ETag"])
        status, answer = await service.api("POST", f"/v1/writes/{version}/commit", {"etags": etags})
        assert status == 409, answer
        assert f"part 1 of 2 of write {version!r}" in answer["error"]
        assert "another file's bytes" in answer["error"] and "stays pending" in answer["error"]
        status, pending = await service.api("GET", f"/v1/writes/{version}")
        assert status == 200 and len(pending["present"]) == 2, pending
        status, _ = await service.api("GET", f"/v1/organizations/{ORG}/artifacts/c/versions/latest")
        assert status == 404

        written = await asyncio.to_thread(client.write, ORG, "c", path, resume=version)
        assert written.version == version
        got, _ = await asyncio.to_thread(client.read_bytes, ORG, "c", "latest")
        assert got == began_with


class FailsToAssemble(StandInBucket):
    """The stand-in while ``broken`` holds: it takes the parts, then fails to assemble
    them (an outage of the store at the commit)."""

    broken = True

    def complete_multipart(
        self,
        key: str,
        upload: MultipartUpload | str,
        etags: Sequence[str],
        crc32: Sequence[str] | None = None,
    ) -> None:
        if FailsToAssemble.broken:
            raise StorageError(Reason.BACKEND_ERROR, "the store is down", retryable=True)
        super().complete_multipart(key, upload, etags, crc32)


async def test_a_write_in_parts_that_fails_says_how_to_resume_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43: the version id a restarted job resumes with is a warning (default logging
    shows it) and is on the exception that ended the write, not only an INFO line."""

    def opener(storage: Storage) -> Any:
        return lambda ref: FailsToAssemble(ref, storage)

    async for service in serve(tmp_path, opener=opener):
        data = os.urandom(PART_SIZE + 1000)
        path = tmp_path / "ckpt"
        path.write_bytes(data)
        client = service.client("aws", "us-east-1")
        FailsToAssemble.broken = True
        with caplog.at_level(logging.WARNING, "o41"), pytest.raises(Unavailable) as failed:
            await asyncio.to_thread(client.write, ORG, "ckpt", path)
        version = failed.value.resume
        assert version is not None
        hint = f"resume={version!r} (o41 write --resume {version})"
        assert hint in str(failed.value) and "the store is down" in str(failed.value)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(hint in w for w in warned), warned

        FailsToAssemble.broken = False  # the store is back: the parts are not sent again
        sent = list(service.storage.puts)
        written = await asyncio.to_thread(client.write, ORG, "ckpt", path, resume=version)
        assert written.version == version and service.storage.puts == sent
        got, _ = await asyncio.to_thread(client.read_bytes, ORG, "ckpt", "latest")
        assert got == data


async def test_only_the_namespace_that_began_a_write_sees_or_resumes_it(
    service: Service, tmp_path: Path
) -> None:
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    body = {"organization": ORG, "artifact": "n", "size": 2 * PART_SIZE, "place": place}
    body["partSize"] = PART_SIZE
    status, began = await service.api("POST", "/v1/writes", body)
    assert status == 201, began
    version = began["version"]
    other = tmp_path / "other"
    other.write_text("token-team-b")
    theirs = Service(service.url, service.storage, other)
    for method, path, req in [
        ("GET", f"/v1/writes/{version}", None),
        ("POST", f"/v1/writes/{version}/parts", {"parts": [1]}),
    ]:
        status, answer = await theirs.api(method, path, req)
        assert status == 404 and "no write" in answer["error"], answer
        assert version in answer["error"]  # only the id they sent
        gone, missing = await theirs.api(method, path.replace(version, "0-nope"), req)
        assert gone == 404 and missing["error"].replace("0-nope", version) == answer["error"]
    status, answer = await service.api("POST", f"/v1/writes/{version}/parts", {"parts": [2, 1]})
    assert status == 200 and [p["number"] for p in answer["parts"]] == [2, 1], answer
    for bad, want in [([3], "parts 1..2"), ([1, 1], "twice"), ([], "parts")]:
        status, answer = await service.api("POST", f"/v1/writes/{version}/parts", {"parts": bad})
        assert status == 400 and want in answer["error"], answer


async def test_a_long_write_signs_its_parts_again_before_they_expire(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """URLs with less than the margin left are signed again by the service."""
    monkeypatch.setattr(transfers, "RESIGN_MARGIN", 3600.0)  # every URL is about to expire
    data = os.urandom(PART_SIZE + 1000)
    path = tmp_path / "long"
    path.write_bytes(data)
    client = service.client("aws", "us-east-1")
    written = await asyncio.to_thread(client.write, ORG, "long", path)
    key = f"long/{written.version}"
    signed = [s for s in service.storage.signed if s.startswith(f"PUT {key}")]
    assert len(signed) > 2  # the two parts of begin, and again
    got, _ = await asyncio.to_thread(client.read_bytes, ORG, "long", written.version)
    assert got == data


async def test_a_service_still_loading_its_view_asks_to_retry_and_the_client_waits(
    service: Service, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A service just started listens before it listed the cluster: answered from the
    # half-loaded view a begin would be a wrong 409 (seen on a restarted replica)
    assert service.app is not None
    synced = service.app[VIEW].synced
    synced.clear()
    status, body = await service.api(
        "POST", "/v1/writes", {"organization": ORG, "artifact": "m", "size": 3}
    )
    assert status == 503 and "still loading" in body["error"], body
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{service.url}/v1/organizations/{ORG}/artifacts") as r:
            assert (r.status, r.headers.get("Retry-After")) == (503, "1")
        async with s.get(f"{service.url}/healthz") as r:
            assert r.status == 200  # alive: not restarted by its probe while it loads
        async with s.get(f"{service.url}/readyz") as r:
            assert r.status == 503
    data = tmp_path / "m"
    data.write_bytes(b"abc")
    client = service.client("aws", "us-east-1")
    asyncio.get_running_loop().call_later(1.5, synced.set)  # loaded 1.5 s later
    with caplog.at_level(logging.WARNING, logger="o41"):
        written = await asyncio.to_thread(client.write, ORG, "m", data)
    assert written.location == "east"
    assert any("still loading" in r.getMessage() for r in caplog.records), caplog.text
