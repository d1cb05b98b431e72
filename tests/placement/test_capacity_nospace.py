"""etcd's NOSPACE alarm as the service meets it: writes refused with an error that names
the cause, reads still answered, and the documented recovery (docs/capacity.md) brings
writes back. One etcd member of the test bed with a 4 MiB quota."""

from __future__ import annotations

import base64
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.capacity import ORG, Etcd, PlacementService, begin, commit, write_dims  # noqa: E402
from o41.collections.keys import encode_key  # noqa: E402
from o41.state import StoreUnavailable  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.webhook.collections.quota import Limits  # noqa: E402
from o41.webhook.collections.service import Options  # noqa: E402
from o41.webhook.collections.standalone import make_app  # noqa: E402
from o41.webhook.records import version_key  # noqa: E402
from o41.webhook.usage.counters import Usage, rollup_prefix  # noqa: E402

pytestmark = pytest.mark.etcd

FULL = "database space exceeded"


@pytest.fixture
async def full(tmp_path: Path) -> AsyncIterator[tuple[Etcd, EtcdStore]]:
    etcd = Etcd(tmp_path, quota=4 * 1024**2).start()
    store = EtcdStore([etcd.url], timeout=10)
    try:
        yield etcd, store
    finally:
        await store.close()
        etcd.stop()


async def fill(store: EtcdStore) -> StoreUnavailable:
    """Put 256 kB values until etcd refuses one (4 MiB and some); the refusal."""
    for i in range(1000):
        try:
            await store.put(f"/o41/filler/{i}".encode(), b"x" * 256_000)
        except StoreUnavailable as e:
            return e
    raise AssertionError("etcd took 256 MB in a 4 MiB quota")


def entry(key: str, value: bytes = b"1") -> dict[str, str]:
    return {"key": encode_key(key), "value": base64.b64encode(value).decode()}


async def test_at_the_quota_writes_are_refused_saying_why_and_reads_still_work(
    full: tuple[Etcd, EtcdStore],
) -> None:
    etcd, store = full
    options = Options(limits=Limits(ops_per_second=0, bytes_per_second=0, entries=0, bytes=0))
    app = make_app([etcd.url], "team-a", options, store_timeout=10)
    async with (
        TestClient(TestServer(app, host="127.0.0.1")) as client,
        PlacementService(store) as service,
    ):
        status, kept = await service.begin("kept", b"committed before")
        assert status == 201
        assert (await service.commit(kept["version"]))[0] == 200
        status, waiting = await service.begin("waiting", b"uploaded before")
        assert status == 201
        lease = await store.lease_grant(600)
        first = await begin(store, lease, 0)
        await commit(store, first)
        r = await client.post("/v1/collections/c/dict/d/set", json=entry("before"))
        assert r.status == 200
        refused = await fill(store)
        assert FULL in str(refused)
        assert [a["alarm"] for a in etcd.alarms()] == ["NOSPACE"]

        # the service's writes: a commit, a begin, a collection's strong write
        for status, answer in (
            await service.commit(waiting["version"]),
            await service.begin("after", b"x"),
        ):
            assert status == 507, answer
            assert FULL in answer["error"]
            assert "it was not applied" in answer["error"]
            assert "docs/capacity.md" in answer["error"]
            assert "retry shortly" not in answer["error"]
        with pytest.raises(StoreUnavailable, match=FULL):
            await begin(store, lease, 1)
        r = await client.post("/v1/collections/c/dict/d/set", json=entry("after"))
        assert r.status == 507
        assert FULL in (await r.json())["error"]
        counters = Usage(store, interval=3600)
        counters.add(ORG, "write", write_dims(0), versions=1, bytes=1)
        await counters.flush()  # refused: kept for the next flush, not lost
        assert await store.range(rollup_prefix("hour")) == []
        assert await store.range(rollup_prefix("day")) == []

        # reads still work
        status, answer = await service.read("kept", kept["version"])
        assert (status, answer["location"]) == (200, "east")
        status, _ = await service.api("GET", "/v1/usage?organization=ml&window=24h")
        assert status == 200
        assert await store.get(version_key(ORG, first.artifact, first.version)) is not None
        r = await client.post("/v1/collections/c/dict/d/get", json={"key": encode_key("before")})
        assert r.status == 200 and (await r.json())["found"] is True

        # the recovery of docs/capacity.md: delete, compact, defragment, disarm
        await store.delete(b"/o41/filler/", prefix=True)
        etcd.compact_and_defrag()
        with pytest.raises(StoreUnavailable, match=FULL):  # not before the disarm
            await begin(store, lease, 2)
        etcd.disarm()
        assert etcd.alarms() == []
        await commit(store, await begin(store, lease, 3))
        await counters.flush()
        assert len(await store.range(rollup_prefix("hour"))) == 1  # the hour's record
        assert len(await store.range(rollup_prefix("day"))) == 1  # and the day's
        r = await client.post("/v1/collections/c/dict/d/set", json=entry("again"))
        assert r.status == 200
        status, again = await service.begin("again", b"y")
        assert status == 201
        assert (await service.commit(again["version"]))[0] == 200
