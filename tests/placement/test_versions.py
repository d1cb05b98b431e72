"""Versions, latest, tags and metadata in-process: the real service app on the embedded
store, the SDK (``o41.artifacts.Client``) and a stand-in bucket over HTTP (``make unit``
runs these)."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from o41.artifacts import Client, Conflict, NotFound, Version
from o41.core.places import Place
from o41.core.versions import WINDOW, encode_cursor, index_suffix
from o41.state import KeyValue
from o41.state.memory import MemoryStore
from test_writes import Service, serve
from testbed.locations import ORG

PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


def sdk(service: Service) -> Client:
    return Client(
        service.url, str(service.token), place=Place("aws", "us-east-1", "env"), timeout=30
    )


async def call(fn: Any, *args: Any, **kw: Any) -> Any:
    """The SDK is synchronous: run it off the loop that serves the app."""
    return await asyncio.to_thread(fn, *args, **kw)


async def write_many(client: Client, artifact: str, n: int) -> list[str]:
    def run() -> list[str]:
        return [
            client.write(ORG, artifact, f"step {i}".encode(), metadata={"step": i}).version
            for i in range(n)
        ]

    return await asyncio.to_thread(run)


async def test_versions_list_newest_first_a_page_at_a_time(service: Service) -> None:
    client = sdk(service)
    written = await write_many(client, "ckpt", 25)

    pages = await call(lambda: list(client.pages(ORG, "ckpt", page_size=10)))
    assert [len(p.versions) for p in pages] == [10, 10, 5]
    assert pages[-1].next is None and all(p.next for p in pages[:-1])
    listed = [v.version for p in pages for v in p.versions]
    assert listed == written[::-1]  # newest first, each once
    first: Version = pages[0].versions[0]
    assert first.metadata == {"step": 24}
    assert (first.location, first.size, first.writer) == (
        "east",
        7,
        Place("aws", "us-east-1", "env"),
    )
    assert first.committed > 0

    latest = await call(client.latest, ORG, "ckpt")
    assert latest is not None and latest.version == written[-1]
    assert await call(client.read_bytes, ORG, "ckpt", "latest") == b"step 24"
    assert await call(client.latest, ORG, "never-written") is None

    status, body = await service.api("GET", f"/v1/organizations/{ORG}/artifacts")
    assert status == 200, body
    assert [(a["artifact"], a["lastVersion"]) for a in body["artifacts"]] == [("ckpt", written[-1])]


async def test_a_page_of_many_versions_is_one_short_range_read(tmp_path: Path) -> None:
    """The first page of an artifact with thousands of versions is one range read of
    page + 1 keys over a bounded window of the index, not over the artifact's versions
    (etcd counts every key of a range, whatever its limit); the next pages continue."""
    ranges: list[tuple[int, int]] = []

    class Counting(MemoryStore):
        async def range(self, prefix: bytes, **kw: Any) -> list[KeyValue]:
            found = await super().range(prefix, **kw)
            if b"/index/" in prefix and "limit" in kw:  # the service's reads
                span = await super().range(prefix, start=kw["start"], end=kw["end"])
                ranges.append((len(found), len(span)))
            return found

    store = Counting()
    old = 5000
    async for service in serve(tmp_path, store=store):
        client = sdk(service)
        (first,) = await write_many(client, "many", 1)
        # thousands older than the real ones, as commits leave them (sequence numbers 1..)
        record = json.loads((await store.range(b"/o41/placement/index/ml/many/"))[0].value)
        await store.delete(b"/o41/placement/index/ml/many/", prefix=True)
        for seq in range(1, old + 1):
            version = f"{seq:012x}-{seq:016x}"
            body = json.dumps({**record, "version": version, "seq": seq})
            key = f"/o41/placement/index/ml/many/{index_suffix(seq, version)}"
            await store.put(key.encode(), body.encode())
        found = await store.get(b"/o41/placement/artifacts/ml/many")
        assert found is not None
        artifact = json.loads(found.value)
        await store.put(
            b"/o41/placement/artifacts/ml/many", json.dumps({**artifact, "count": old}).encode()
        )
        del first
        written = await write_many(client, "many", 3)  # sequence numbers 5001 to 5003
        ranges.clear()
        page = await call(next, client.pages(ORG, "many", page_size=50))
        assert [v.version for v in page.versions[:3]] == written[::-1]
        assert [v.version for v in page.versions[3:5]] == [
            f"{n:012x}-{n:016x}" for n in (old, old - 1)
        ]
        assert len(page.versions) == 50 and ranges == [(51, WINDOW)]  # one bounded read

        ranges.clear()
        seen = [v.version for v in await call(list, client.versions(ORG, "many", page_size=1000))]
        assert len(seen) == old + 3 == len(set(seen))
        assert all(span <= WINDOW for _, span in ranges)


async def test_a_cursor_is_accepted_only_by_its_own_listing(service: Service) -> None:
    client = sdk(service)
    await write_many(client, "a", 3)
    await write_many(client, "b", 3)
    base = f"/v1/organizations/{ORG}/artifacts"
    status, page = await service.api("GET", f"{base}/a/versions?limit=1")
    assert status == 200 and page["next"]
    status, body = await service.api("GET", f"{base}/a/versions?limit=1&cursor={page['next']}")
    assert status == 200 and len(body["versions"]) == 1

    forged_org = encode_cursor("versions/other/a", "0" * 16 + "-" + "0" * 12 + "-" + "0" * 16)
    traversal = encode_cursor(f"versions/{ORG}/a", "../../tags/x")
    status, artifacts_page = await service.api("GET", f"{base}?limit=1")
    assert status == 200 and artifacts_page["next"]
    cases = [
        (f"{base}/b/versions?cursor={page['next']}", "another listing"),  # another artifact's
        (f"{base}/a/versions?cursor={artifacts_page['next']}", "another listing"),
        (f"{base}/a/versions?cursor={forged_org}", "another listing"),  # another org's
        (f"{base}/a/versions?cursor={traversal}", "damaged"),
        (f"{base}/a/versions?cursor=%%%%", "damaged"),
        (f"{base}/a/versions?cursor=bm90IGpzb24", "damaged"),
        (f"{base}/a/versions?limit=0", "between 1 and 1000"),
        (f"{base}/a/versions?limit=many", "whole number"),
        (f"{base}/..hidden/versions", "not an artifact name"),
    ]
    for path, want in cases:
        status, body = await service.api("GET", path)
        assert status == 400 and want in body["error"], (path, status, body)


async def test_metadata_is_bounded_and_a_refused_write_writes_nothing(service: Service) -> None:
    async def begin(**fields: Any) -> tuple[int, Any]:
        body = {"organization": ORG, "artifact": "m", "place": PLACE, "size": 1, **fields}
        return await service.api("POST", "/v1/writes", body)

    async def raw_begin(metadata: bytes) -> tuple[int, Any]:
        head = json.dumps({"organization": ORG, "artifact": "m", "place": PLACE, "size": 1})
        body = head[:-1].encode() + b', "metadata": ' + metadata + b"}"
        return await service.api(
            "POST", "/v1/writes", data=body, headers={"Content-Type": "application/json"}
        )

    cases = [
        (await begin(metadata={f"k{i}": i for i in range(65)}), "at most 64"),
        (await begin(metadata={"big": "x" * 9000}), "at most 8192 bytes"),
        (await begin(metadata={"has space": 1}), "metadata key 'has space'"),
        (await begin(metadata={"x" * 65: 1}), "1 to 64 characters"),
        (await begin(tag="t" * 64), "1 to 63 characters"),
        (await begin(tag="-dash"), "not a tag name"),
        (await begin(tag="latest"), "cannot be a tag"),
        (await begin(tag="0193a1b2c3d4-9f8e7d6c5b4a3f2e"), "looks like a version id"),
        (await begin(metadata=[1, 2]), "metadata"),
        (await raw_begin(b'{"x": NaN}'), "finite numbers"),
        (await raw_begin(b'{"x": -Infinity}'), "finite numbers"),
        (await raw_begin(b'{"x": "\\ud800"}'), "Invalid JSON"),
        (await raw_begin(b'{"x": ' + b"9" * 5000 + b"}"), "Invalid JSON"),
    ]
    for (status, body), want in cases:
        assert status == 400 and want in body["error"], (status, body)
    assert service.storage.signed == []  # no upload was ever signed
    status, listed = await service.api("GET", f"/v1/organizations/{ORG}/artifacts/m/versions")
    assert (status, listed["versions"]) == (200, [])

    ok = {f"k{i}": i for i in range(64)}
    written = await call(sdk(service).write, ORG, "m", b"fine", metadata=ok)
    found = await call(sdk(service).resolve, ORG, "m", written.version)
    assert found.metadata == ok


async def test_tags_resolve_move_by_compare_and_set_and_delete(service: Service) -> None:
    client = sdk(service)
    v1, v2, v3 = await write_many(client, "model", 3)
    moved = await call(client.tag, ORG, "model", "best", v1, expected=None)
    assert (moved.version, moved.previous) == (v1, None)

    got = await call(client.read, ORG, "model", "best", service.token.parent / "out")
    assert (got.version, got.tag) == (v1, "best")
    assert (service.token.parent / "out").read_bytes() == b"step 0"

    def opened() -> tuple[str, str | None, bytes]:
        with client.open(ORG, "model", "best") as f:
            return f.version, f.tag, f.read()

    assert await call(opened) == (v1, "best", b"step 0")

    # the tag is expected at v1: moved; expected at v1 again: it is at v2 now, refused
    moved = await call(client.tag, ORG, "model", "best", v2, expected=v1)
    assert (moved.version, moved.previous) == (v2, v1)
    with pytest.raises(Conflict) as lost:
        await call(client.tag, ORG, "model", "best", v3, expected=v1)
    assert lost.value.current == v2 and f"points at version {v2}" in str(lost.value)
    with pytest.raises(Conflict):
        await call(client.tag, ORG, "model", "best", v3, expected=None)  # it exists

    # unconditional, and by "latest"
    assert (await call(client.tag, ORG, "model", "best", "latest")).version == v3
    assert [(t.tag, t.version) for t in await call(client.tags, ORG, "model")] == [("best", v3)]

    assert await call(client.delete_tag, ORG, "model", "best") == v3
    with pytest.raises(NotFound) as missing:
        await call(client.read_bytes, ORG, "model", "best")
    assert "has no tag 'best'" in str(missing.value)
    with pytest.raises(NotFound):
        await call(client.delete_tag, ORG, "model", "best")


async def test_two_racing_tag_moves_end_with_one_winner(tmp_path: Path) -> None:
    """Both moves read the tag before either writes (a store that yields on every get):
    the transaction's guard lets exactly one through; the other is a 409 naming the
    winner's version."""

    class Slow(MemoryStore):
        async def get(self, key: bytes, **kw: Any) -> KeyValue | None:
            found = await super().get(key, **kw)
            await asyncio.sleep(0.05)
            return found

    async for service in serve(tmp_path, store=Slow()):
        v1, v2, v3 = await write_many(sdk(service), "race", 3)
        path = f"/v1/organizations/{ORG}/artifacts/race/tags/prod"
        assert (await service.api("PUT", path, {"version": v1}))[0] == 200
        answers = await asyncio.gather(
            service.api("PUT", path, {"version": v2, "expected": v1}),
            service.api("PUT", path, {"version": v3, "expected": v1}),
        )
        assert sorted(a[0] for a in answers) == [200, 409], answers
        (winner,) = [a[1]["version"] for a in answers if a[0] == 200]
        (loser,) = [a[1] for a in answers if a[0] == 409]
        assert loser["current"] == winner and winner in loser["error"]
        status, now = await service.api("GET", path)
        assert (status, now["version"], now["tag"]) == (200, winner, "prod")

        # two creations of a tag that must not exist yet: one wins
        path = f"/v1/organizations/{ORG}/artifacts/race/tags/first"
        answers = await asyncio.gather(
            service.api("PUT", path, {"version": v1, "expected": None}),
            service.api("PUT", path, {"version": v2, "expected": None}),
        )
        assert sorted(a[0] for a in answers) == [200, 409], answers


async def test_a_tag_given_at_write_time_moves_at_commit(service: Service, tmp_path: Path) -> None:
    client = sdk(service)
    path = tmp_path / "weights"
    path.write_bytes(b"w" * 1000)
    first = await call(client.write, ORG, "w", path, tag="production")
    assert first.tag == "production"
    with path.open("rb") as handle:  # a file object that is not a BytesIO: spooled first
        spooled = await call(client.write, ORG, "w", handle)
    assert await call(client.read_bytes, ORG, "w", spooled.version) == b"w" * 1000
    second = await call(client.write, ORG, "w", io.BytesIO(b"second"), tag="production")
    found = await call(client.resolve, ORG, "w", "production")
    assert (found.version, found.tag) == (second.version, "production")

    # a tag at commit (over begin's), with metadata merged over begin's
    status, began = await service.api(
        "POST",
        "/v1/writes",
        {"organization": ORG, "artifact": "w", "place": PLACE, "size": 3, "metadata": {"a": 1}},
    )
    assert status == 201
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.put(began["upload"]["single"]["url"], data=b"abc") as r,
    ):
        assert r.status == 200
    status, done = await service.api(
        "POST",
        f"/v1/writes/{began['version']}/commit",
        {"tag": "candidate", "metadata": {"b": 2}},
    )
    assert (status, done["tag"]) == (200, "candidate"), done
    found = await call(client.resolve, ORG, "w", "candidate")
    assert (found.version, found.metadata) == (began["version"], {"a": 1, "b": 2})


async def test_a_read_by_ref_names_the_version_and_unknown_ones_are_clear(
    service: Service,
) -> None:
    client = sdk(service)
    (only,) = await write_many(client, "r", 1)
    base = f"/v1/organizations/{ORG}/artifacts/r/versions"
    status, body = await service.api("GET", f"{base}/latest")
    assert (status, body["version"], body["requested"], body["tag"]) == (200, only, "latest", None)
    assert body["metadata"] == {"step": 0}
    cases = [
        (f"{base}/0193a1b2c3d4-9f8e7d6c5b4a3f2e", 404, "no committed version"),
        (f"{base}/nosuchtag", 404, "has no tag 'nosuchtag'"),
        (f"{base}/has%20space", 400, "not a version"),
        (f"/v1/organizations/{ORG}/artifacts/empty/versions/latest", 404, "no 'latest'"),
        (f"/v1/organizations/{ORG}/artifacts/r/tags/nosuchtag", 404, "o41 tag"),
        ("/v1/organizations/nobody/artifacts/r/versions", 404, "does not exist"),
    ]
    for path, want_status, want in cases:
        status, body = await service.api("GET", path)
        assert status == want_status and want in body["error"], (path, status, body)
    tags = f"/v1/organizations/{ORG}/artifacts/r/tags"
    for body, want in [
        ({"version": "nosuchtag"}, "not at another tag"),
        ({"version": only, "expected": "latest"}, "expected must be a version id"),
        ({"version": "0193a1b2c3d4-9f8e7d6c5b4a3f2e"}, "no committed version"),
    ]:
        status, answer = await service.api("PUT", f"{tags}/t", body)
        assert status in (400, 404) and want in answer["error"], (body, answer)
    status, answer = await service.api("PUT", f"{tags}/{'x' * 70}", {"version": only})
    assert status == 400 and "1 to 63 characters" in answer["error"]
    status, listed = await service.api("GET", tags)
    assert (status, listed["tags"]) == (200, [])  # nothing was written


async def test_open_streams_and_seeks(service: Service) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    client = sdk(service)
    written = await call(client.write, ORG, "big", data)

    def use() -> None:
        with client.open(ORG, "big") as f:
            assert f.version == written.version and f.size == len(data)
            assert f.read(10) == data[:10]
            assert f.raw.tell() < len(data)  # reading began before the whole was down
            f.seek(2 * 1024 * 1024)
            assert f.read(100) == data[2 * 1024 * 1024 : 2 * 1024 * 1024 + 100]
            f.seek(-7, io.SEEK_END)
            assert f.read() == data[-7:]
        with client.open(ORG, "big", written.version) as f:
            assert f.read() == data  # whole, checked against its MD5

    await asyncio.to_thread(use)


async def test_concurrent_commits_of_one_artifact_each_take_a_sequence_number(
    tmp_path: Path,
) -> None:
    """Commits of one artifact race for its record: each that loses takes the next
    number, so all are listed once, newest first, and latest is the last one numbered."""

    class Slow(MemoryStore):
        async def get(self, key: bytes, **kw: Any) -> KeyValue | None:
            found = await super().get(key, **kw)
            await asyncio.sleep(0.01)  # every commit reads the artifact before any writes
            return found

    async for service in serve(tmp_path, store=Slow()):
        client = sdk(service)
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(8) as clients:  # not the loop's: the app's bucket calls use it
            written = await asyncio.gather(
                *(
                    loop.run_in_executor(clients, client.write, ORG, "hot", f"v{i}".encode())
                    for i in range(8)
                )
            )
        listed = await call(lambda c=client: list(c.versions(ORG, "hot")))
        assert sorted(v.version for v in listed) == sorted(w.version for w in written)
        latest = await call(client.latest, ORG, "hot")
        assert latest is not None and latest.version == listed[0].version
        status, body = await service.api("GET", f"/v1/organizations/{ORG}/artifacts")
        assert status == 200 and body["artifacts"][0]["lastVersion"] == listed[0].version
