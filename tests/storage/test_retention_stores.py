"""Retention and the index backfill against real parts: the service's app in-process with
its state in a 3-member etcd, its Locations' buckets in versitygw (the S3 stand-in, which
checks every signature). Objects are looked at with boto3, records with the store's own
client.

- retention keeps the newest N versions, tagged ones and ``latest``, deletes the others'
  objects and records, in a retired location too, and leaves an artifact no rule covers;
- a pass stopped between deleting the object and the record leaves a record the read path
  answers clearly (404, "deleted by the retention rule"), and the next pass finishes it;
- a tag moved onto a version while retention deletes it: either the move loses (404) or
  the version stays, never a tag pointing at nothing;
- versions committed before the index are indexed once, listed newest first after the
  ones committed since, and the backfill is idempotent.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from o41.state.etcd import EtcdStore
from o41.storage import BucketRef, open_bucket
from o41.webhook import retention as retention_module
from o41.webhook.cluster.view import VIEW, organization_source
from o41.webhook.http.store import STORE
from o41.webhook.records import Version, index_prefix, version_key
from o41.webhook.retention import RETENTION
from o41.webhook.usage.counters import USAGE
from o41.webhook.writes import backfill as backfill_module
from test_storage import offline as offline
from test_sweeper import short_leases, until
from test_writes import Service, serve, usage_of
from testbed.etcd import EtcdCluster
from testbed.locations import ORG, location
from testbed.stores import VersityStore

__all__ = ["offline", "short_leases"]

pytestmark = [pytest.mark.stores, pytest.mark.etcd]

EAST = {"cloud": "aws", "region": "us-east-1", "source": "env"}
WEST = {"cloud": "aws", "region": "us-west-2", "source": "env"}
RULES = [{"artifacts": "ckpt-*", "keepVersions": 2}]


@dataclass
class World:
    service: Service
    store: EtcdStore
    sdk: Any  # boto3's S3 client on versitygw
    buckets: dict[str, str]  # location -> its bucket
    prefix: bytes  # this test's own state prefix (a fresh organization)

    @property
    def app(self) -> Any:
        assert self.service.app is not None
        return self.service.app

    def objects(self, location: str) -> set[str]:
        """The location's objects of versions (not the buckets' record under .o41/)."""
        return {k for k in self.keys(location) if not k.startswith(".o41/")}

    def ledger(self, location: str) -> set[str]:
        """The buckets' record in the location: record, manifest and journal objects."""
        return {k for k in self.keys(location) if k.startswith(".o41/")}

    def keys(self, location: str) -> set[str]:
        listed = self.sdk.list_objects_v2(Bucket=self.buckets[location]).get("Contents", [])
        return {o["Key"] for o in listed}

    async def write(self, artifact: str, data: bytes, place: dict[str, str]) -> str:
        body = {"organization": ORG, "artifact": artifact, "size": len(data), "place": place}
        status, began = await self.service.api("POST", "/v1/writes", body)
        assert status == 201, began
        single = began["upload"]["single"]
        import aiohttp

        async with (
            aiohttp.ClientSession() as s,
            s.put(single["url"], data=data, headers=single["headers"]) as r,
        ):
            assert r.status == 200, await r.text()
        version = str(began["version"])
        status, done = await self.service.api("POST", f"/v1/writes/{version}/commit", {})
        assert status == 200, done
        return version

    async def listed(self, artifact: str) -> list[str]:
        status, page = await self.service.api(
            "GET", f"/v1/organizations/{ORG}/artifacts/{artifact}/versions"
        )
        assert status == 200, page
        return [v["version"] for v in page["versions"]]

    async def read(self, artifact: str, ref: str) -> tuple[int, Any]:
        return await self.service.api(
            "GET",
            f"/v1/organizations/{ORG}/artifacts/{artifact}/versions/{ref}"
            "?cloud=aws&region=us-east-1&source=env",
        )


def set_rules(app: Any, rules: list[dict[str, Any]]) -> None:
    app[VIEW].put_organization(
        organization_source(
            {"metadata": {"name": ORG}, "spec": {"namespaces": ["team-a"], "retention": rules}}
        )
    )


@pytest.fixture
async def world(
    s3: VersityStore, state_etcd: EtcdCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[World]:
    # every key of the service under a prefix of this test's own: etcd is shared
    prefix = f"/o41-test-{uuid.uuid4().hex[:8]}/".encode()
    for module in (
        "records",
        "writes.backfill",
        "writes.sweeper",
        "usage.counters",
        "usage.counts",
    ):
        mod = __import__(f"o41.webhook.{module}", fromlist=["x"])
        if hasattr(mod, "PREFIX"):
            monkeypatch.setattr(mod, "PREFIX", prefix)
    _prefixed(monkeypatch, prefix)
    tag = uuid.uuid4().hex[:8]
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    buckets: dict[str, str] = {}

    def ref(given: BucketRef) -> BucketRef:
        name = f"ret-{tag}-{given.bucket}"
        return BucketRef("s3", name, given.region, endpoint=s3.endpoint, credentials=creds)

    def opener(_: object) -> Any:
        def made(given: BucketRef) -> Any:
            bucket = open_bucket(ref(given))
            if given.bucket not in buckets.values():
                bucket.ensure(f"loc-{given.bucket}")
            buckets[given.bucket.removeprefix("bucket-")] = ref(given).bucket
            return bucket

        return made

    store = EtcdStore(state_etcd.endpoints, timeout=5)
    try:
        async for service in serve(tmp_path, opener, store=store):
            assert service.app is not None
            set_rules(service.app, RULES)
            yield World(service, store, s3.client("us-east-1"), buckets, prefix)
    finally:
        await store.close()


def _prefixed(monkeypatch: pytest.MonkeyPatch, prefix: bytes) -> None:
    """The key functions of records, bound to ``prefix``."""
    from o41.webhook import records
    from o41.webhook.usage import counters as usage
    from o41.webhook.writes import sweeper

    monkeypatch.setattr(records, "PREFIX", prefix)
    monkeypatch.setattr(sweeper, "PENDING_PREFIX", prefix + b"pending/")
    monkeypatch.setattr(sweeper, "SWEPT_PREFIX", prefix + b"swept/")
    monkeypatch.setattr(backfill_module, "DONE", prefix + b"backfill/index")
    monkeypatch.setattr(backfill_module, "VERSIONS", prefix + b"versions/")
    monkeypatch.setattr(usage, "_LEGACY", prefix + b"usage/")


def retire(app: Any, name: str, cloud: str, region: str, n: int) -> None:
    made = location(name, cloud, region, n)
    spec = made.spec.model_copy(update={"retired": True})
    from dataclasses import replace

    app[VIEW].put_location(replace(made, spec=spec))


async def test_retention_keeps_the_newest_tagged_and_latest_in_every_location(
    world: World,
) -> None:
    w = world
    old = [await w.write("ckpt-a", f"old {n}".encode(), WEST) for n in range(2)]
    status, moved = await w.service.api(
        "PUT", f"/v1/organizations/{ORG}/artifacts/ckpt-a/tags/best", {"version": old[1]}
    )
    assert status == 200, moved
    retire(w.app, "west", "aws", "us-west-2", 2)  # its versions stay, and follow the rule
    new = [await w.write("ckpt-a", f"new {n}".encode(), EAST) for n in range(3)]
    others = [await w.write("model", f"m {n}".encode(), EAST) for n in range(4)]

    retention = w.app[RETENTION]
    await until(lambda: retention.deleted >= 2, 30)
    await retention.apply(ORG, "ckpt-a")  # a pass more: nothing left to do
    assert retention.deleted == 2

    assert await w.listed("ckpt-a") == [new[2], new[1], old[1]]
    assert w.objects("west") == {f"ckpt-a/{old[1]}"}  # the retired location's old one: gone
    assert {f"ckpt-a/{v}" for v in new[1:]} <= w.objects("east")
    assert f"ckpt-a/{new[0]}" not in w.objects("east")
    assert {f"model/{v}" for v in others} <= w.objects("east")  # no rule: every version
    assert len(await w.listed("model")) == 4
    # the buckets' record follows (issue 32): the deleted versions' record objects are
    # gone with their bytes, and each deletion is a journal entry in the fallback
    records = {k for loc in ("east", "west") for k in w.ledger(loc) if "/versions/" in k}
    assert {f".o41/versions/{ORG}/ckpt-a/{v}" for v in (old[1], *new[1:])} <= records
    assert not {f".o41/versions/{ORG}/ckpt-a/{v}" for v in (old[0], new[0])} & records
    journal = [
        json.loads(w.sdk.get_object(Bucket=w.buckets[loc], Key=k)["Body"].read())
        for loc in ("east", "west")
        for k in w.ledger(loc)
        if "/journal/" in k
    ]
    deleted = sorted(e["version"] for e in journal if e["kind"] == "deletion")
    assert deleted == sorted([old[0], new[0]])

    for gone in (old[0], new[0]):  # a read says retention deleted it (issue 43)
        status, answer = await w.read("ckpt-a", gone)
        assert status == 404, answer
        assert answer["error"].startswith(
            f"version {gone!r} of 'ckpt-a' was deleted by the retention rule of organization"
        ), answer
        assert await w.store.get(version_key(ORG, "ckpt-a", gone)) is None
    status, answer = await w.read("ckpt-a", "best")
    assert status == 200 and answer["version"] == old[1]
    status, answer = await w.read("ckpt-a", "latest")
    assert status == 200 and answer["version"] == new[2]
    keys = await w.store.range(index_prefix(ORG, "ckpt-a"))
    assert len(keys) == 3  # no index key left without its version

    await w.app[USAGE].flush()
    counted = await usage_of(w.service, "retention")
    assert sum(r["counts"]["versions"] for r in counted) == 2
    assert sum(r["counts"]["bytes"] for r in counted) == len(b"old 0") + len(b"new 0")
    assert {r["dims"]["location"] for r in counted} == {"east", "west"}


async def test_a_pass_stopped_after_the_object_leaves_a_clear_record_and_is_finished(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    set_rules(w.app, [])  # off while writing
    versions = [await w.write("ckpt-b", f"b {n}".encode(), EAST) for n in range(3)]
    set_rules(w.app, [{"artifacts": "ckpt-b", "keepVersions": 2}])
    store = w.store
    real_txn = store.txn

    class Crash(Exception):
        pass

    async def crashing_txn(compares: Any, success: Any, failure: Any = ()) -> Any:
        first = version_key(ORG, "ckpt-b", versions[0])
        if any(type(op).__name__ == "Delete" and op.key == first for op in success):
            raise Crash  # the service died between the object's delete and the records'
        return await real_txn(compares, success, failure)

    monkeypatch.setattr(w.app[STORE], "txn", crashing_txn)
    with pytest.raises(Crash):
        await w.app[RETENTION].apply(ORG, "ckpt-b")
    monkeypatch.setattr(w.app[STORE], "txn", real_txn)

    assert f"ckpt-b/{versions[0]}" not in w.objects("east")  # the object went first
    status, answer = await w.read("ckpt-b", versions[0])
    assert status == 404 and "deleted by the retention rule" in answer["error"], answer
    assert await w.listed("ckpt-b") == versions[:0:-1]  # not listed
    status, answer = await w.service.api(
        "PUT", f"/v1/organizations/{ORG}/artifacts/ckpt-b/tags/t", {"version": versions[0]}
    )
    assert status == 404 and "deleted by the retention rule" in answer["error"]

    assert await w.app[RETENTION].apply(ORG, "ckpt-b") == 1  # the next pass finishes it
    assert await w.store.get(version_key(ORG, "ckpt-b", versions[0])) is None
    assert len(await w.store.range(index_prefix(ORG, "ckpt-b"))) == 2
    status, answer = await w.read("ckpt-b", versions[0])  # still says why (issue 43)
    assert status == 404 and "deleted by the retention rule" in answer["error"], answer


async def test_a_tag_moved_onto_a_version_while_retention_deletes_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tag moves after retention read the tags and before it marked the version: the
    check after the mark finds it, the version stays whole."""
    w = world
    set_rules(w.app, [])
    versions = [await w.write("ckpt-c", f"c {n}".encode(), EAST) for n in range(3)]
    set_rules(w.app, [{"artifacts": "ckpt-c", "keepVersions": 1}])
    retention = w.app[RETENTION]
    real = retention_module.Retention._protected
    calls = 0

    async def racing(self: Any, organization: str, artifact: str) -> set[str] | None:
        nonlocal calls
        seen = await real(self, organization, artifact)
        calls += 1
        if calls == 1:  # retention has read the tags: another writer moves one now
            status, body = await w.service.api(
                "PUT",
                f"/v1/organizations/{ORG}/artifacts/ckpt-c/tags/keep",
                {"version": versions[0], "expected": None},
            )
            assert status == 200, body
        return seen

    monkeypatch.setattr(retention_module.Retention, "_protected", racing)
    deleted = await retention.apply(ORG, "ckpt-c")
    assert deleted == 1  # versions[1]; versions[0] was restored once the tag was seen
    assert await w.listed("ckpt-c") == [versions[2], versions[0]]
    status, answer = await w.read("ckpt-c", "keep")
    assert status == 200 and answer["version"] == versions[0]
    assert f"ckpt-c/{versions[0]}" in w.objects("east")
    record = await w.store.get(version_key(ORG, "ckpt-c", versions[0]))
    assert record is not None and Version.load(record.value).deleting is None


async def test_versions_committed_before_the_index_are_indexed_once(world: World) -> None:
    w = world
    store = w.store
    now = time.time()
    legacy = []
    for n in range(3):  # as the release before the index committed them: no seq, no index
        version = f"{int((now - 100 + n) * 1000):012x}-{uuid.uuid4().hex[:16]}"
        key = f"old/{version}"
        w.sdk.put_object(Bucket=await _bucket(w, "east"), Key=key, Body=f"old {n}".encode())
        record = {
            "organization": ORG,
            "artifact": "old",
            "version": version,
            "location": "east",
            "key": key,
            "size": len(f"old {n}"),
            "md5": None,
            "rule": "region",
            "cloud": "aws",
            "region": "us-east-1",
            "source": "env",
            "committed": now - 100 + n,
        }
        await store.put(version_key(ORG, "old", version), json.dumps(record).encode())
        legacy.append(version)
    status, answer = await w.read("old", legacy[0])
    assert status == 200  # read by id ...
    assert await w.listed("old") == []  # ... but not listed
    await store.delete(w.prefix + b"backfill/index")  # this test's start saw none of them

    assert await backfill_module.backfill(store) == 3
    assert await w.listed("old") == legacy[::-1]
    status, answer = await w.read("old", "latest")
    assert status == 200 and answer["version"] == legacy[2]

    since = await w.write("old", b"since", EAST)  # committed after: listed first
    assert await w.listed("old") == [since, *legacy[::-1]]
    assert await backfill_module.backfill(store) == 0  # idempotent; marks itself done
    assert await store.get(w.prefix + b"backfill/index") is not None
    assert len(await store.range(index_prefix(ORG, "old"))) == 4
    status, page = await w.service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/old/versions?limit=2"
    )
    assert [v["version"] for v in page["versions"]] == [since, legacy[2]]
    status, rest = await w.service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/old/versions?limit=2&cursor={page['next']}"
    )
    assert [v["version"] for v in rest["versions"]] == [legacy[1], legacy[0]]


async def _bucket(w: World, location: str) -> str:
    if location not in w.buckets:  # opened on first use: a write opens it
        await w.write("warm", b"x", EAST)
    return w.buckets[location]


async def test_tags_moved_while_passes_run_never_point_at_a_deleted_version(
    world: World,
) -> None:
    """Tag moves onto old versions race retention passes on etcd (every step a round
    trip, so they interleave): every move that won still reads, every version deleted had
    no tag that won, and the ones kept are exactly the newest, ``latest`` and the tagged."""
    w = world
    set_rules(w.app, [])
    versions = [await w.write("ckpt-race", f"r {n}".encode(), EAST) for n in range(12)]
    set_rules(w.app, [{"artifacts": "ckpt-race", "keepVersions": 2}])
    retention = w.app[RETENTION]
    won: dict[str, str] = {}  # tag -> version, for the moves answered 200
    lost = 0

    async def move(n: int, version: str) -> None:
        nonlocal lost
        tag = f"t{n}"
        status, body = await w.service.api(
            "PUT",
            f"/v1/organizations/{ORG}/artifacts/ckpt-race/tags/{tag}",
            {"version": version, "expected": None},
        )
        if status == 200:
            won[tag] = version
        else:
            assert status == 404, body
            assert "retention" in body["error"] or "no committed version" in body["error"]
            lost += 1

    async def passes() -> None:
        for _ in range(3):
            await retention.apply(ORG, "ckpt-race")

    old = versions[:-2]
    await asyncio.gather(passes(), *(move(n, v) for n, v in enumerate(old * 2)))
    await retention.apply(ORG, "ckpt-race")  # settle: a last pass after every move

    for tag, version in won.items():
        status, answer = await w.read("ckpt-race", tag)
        assert status == 200 and answer["version"] == version, (tag, answer)
    tagged = set(won.values())
    kept = set(await w.listed("ckpt-race"))
    assert kept == set(versions[-2:]) | tagged
    objects = w.objects("east")
    for version in versions:
        assert (f"ckpt-race/{version}" in objects) == (version in kept)
    print(f"\n{len(won)} tag moves won, {lost} lost to retention, {len(kept)} versions kept")


def _directory(root: Path, n: int) -> Path:
    (root / "shards").mkdir(parents=True)
    (root / "config.json").write_bytes(b"{}" * (n + 1))
    for i in range(3):
        (root / "shards" / f"{i}.bin").write_bytes(bytes([i]) * 1000 * (n + 1))
    return root


async def test_a_directory_version_is_deleted_files_then_records_and_a_stop_is_finished(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Directory versions in versitygw, records in etcd: a pass that stops halfway through
    the files of the version it lets go (a delete the bucket refused) leaves it marked (a
    clear 404, unlisted, its manifest kept), the next pass deletes the rest of its files
    and then its version, index and manifest records; the kept ones stay whole."""
    from o41.storage import StorageError
    from o41.storage.base import Reason
    from o41.storage.s3 import S3Bucket
    from test_directories import sdk

    w = world
    set_rules(w.app, [])  # off while writing
    client = sdk(w.service)
    versions = [
        (
            await asyncio.to_thread(client.write, ORG, "ckpt-d", _directory(tmp_path / f"{n}", n))
        ).version
        for n in range(3)
    ]
    gone = versions[0]

    def files_of(version: str) -> set[str]:
        prefix = f"ckpt-d/{version}/"
        return {k.removeprefix(prefix) for k in w.objects("east") if k.startswith(prefix)}

    every = {"config.json", "shards/0.bin", "shards/1.bin", "shards/2.bin"}
    assert all(files_of(v) == every for v in versions)
    set_rules(w.app, [{"artifacts": "ckpt-d", "keepVersions": 2}])

    real_delete = S3Bucket.delete

    def refusing(self: S3Bucket, key: str) -> None:
        if key.endswith("shards/1.bin"):
            raise StorageError(Reason.BACKEND_ERROR, "refused", retryable=True)
        real_delete(self, key)

    monkeypatch.setattr(S3Bucket, "delete", refusing)
    assert await w.app[RETENTION].apply(ORG, "ckpt-d") == 0  # stopped halfway
    assert files_of(gone) == {"shards/1.bin"}
    status, answer = await w.service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/ckpt-d/versions/{gone}/files"
    )
    assert status == 404 and "deleted by the retention rule" in answer["error"], answer
    assert await w.listed("ckpt-d") == versions[:0:-1]
    record = f".o41/versions/{ORG}/ckpt-d/{gone}"
    manifest = f".o41/manifests/{ORG}/ckpt-d/{gone}"
    assert {record, manifest} <= w.ledger("east")  # deleted last: still there

    monkeypatch.setattr(S3Bucket, "delete", real_delete)
    assert await w.app[RETENTION].apply(ORG, "ckpt-d") == 1  # the next pass finishes it
    assert files_of(gone) == set()
    assert await w.store.get(version_key(ORG, "ckpt-d", gone)) is None
    assert not {record, manifest} & w.ledger("east")
    assert len(await w.store.range(index_prefix(ORG, "ckpt-d"))) == 2
    for kept in versions[1:]:
        assert files_of(kept) == every
        out = tmp_path / f"back-{kept}"
        await asyncio.to_thread(client.read, ORG, "ckpt-d", kept, out)
        assert (out / "shards" / "2.bin").read_bytes() == b"\2" * 1000 * (versions.index(kept) + 1)
    await w.app[USAGE].flush()
    counted = await usage_of(w.service, "retention")
    assert [r["counts"] for r in counted] == [{"versions": 1, "bytes": 3002}]


@pytest.mark.usefixtures("short_leases")
async def test_an_expired_directory_writes_files_are_gone_from_versitygw(world: World) -> None:
    """The sweeper on etcd's watch: a directory write that uploaded two of its three files
    and expired leaves nothing in the bucket, counted once as abandoned."""
    from test_sweeper import DIRECTORY, begin_directory

    w = world
    began = await begin_directory(w.service, "left-d", DIRECTORY, sent=2)
    prefix = f"left-d/{began['version']}/"
    assert {k for k in w.objects("east") if k.startswith(prefix)} == {
        prefix + "a.bin",
        prefix + "b/c.bin",
    }
    await until(lambda: not any(k.startswith(prefix) for k in w.objects("east")), 20)
    await w.app[USAGE].flush()
    counted = await usage_of(w.service, "abandoned")
    assert [r["counts"] for r in counted] == [
        {"uploads": 1, "bytes": 3000, "aborted": 1, "abortedBytes": 3000}
    ]
