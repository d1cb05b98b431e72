"""Rolled-up usage: the flushes' hour and day records, retention, the fold of the older
layout, and the raw records of ``/v1/usage`` page by page, on the embedded store."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from o41.state.memory import MemoryStore
from o41.webhook.http.store import STORE
from o41.webhook.records import usage_prefix
from o41.webhook.usage.counters import USAGE, Usage, day, hour, period_prefix, rollup_prefix
from testbed.usage import EMPTY_ORG, ORG, bearer, history, seeded_app, stored

Client = TestClient[web.Request, web.Application]
DIMS: dict[str, str | None] = {
    "cloud": "aws",
    "region": "us-west-2",
    "source": "env",
    "rule": "region",
}


async def values(store: MemoryStore, prefix: bytes) -> list[dict[str, Any]]:
    return [json.loads(kv.value) for kv in await store.range(prefix)]


async def test_each_flush_adds_to_the_hour_and_the_day_and_replicas_add_up() -> None:
    store = MemoryStore()
    replicas = [Usage(store), Usage(store), Usage(store)]
    for i, usage in enumerate(replicas):
        usage.add(ORG, "write", DIMS, versions=1, bytes=10 + i)
    await asyncio.gather(*(u.flush() for u in replicas))  # merging into the same keys
    now = time.time()
    (in_hour,) = await values(store, period_prefix("hour", hour(now), ORG))
    (in_day,) = await values(store, period_prefix("day", day(now), ORG))
    assert (in_hour["kind"], in_hour["hour"], in_hour["dims"]) == ("write", hour(now), DIMS)
    assert in_hour["counts"] == in_day["counts"] == {"versions": 3, "bytes": 33}
    assert in_day["day"] == day(now) and "hour" not in in_day


async def test_the_sweep_deletes_what_is_past_its_retention_only() -> None:
    store = MemoryStore()
    usage = Usage(store, hourly_days=2, daily_days=31)
    now = time.time()
    kept_hour, old_hour = hour(now - 86400), hour(now - 3 * 86400)
    kept_day, old_day = day(now - 30 * 86400), day(now - 40 * 86400)
    for prefix in (
        period_prefix("hour", kept_hour, ORG),
        period_prefix("hour", old_hour, ORG),
        period_prefix("hour", old_hour, EMPTY_ORG),
        period_prefix("day", kept_day, ORG),
        period_prefix("day", old_day, ORG),
    ):
        await store.put(prefix + b"d1", b"{}")
    assert await usage.sweep(now) == 2  # one old hour (both organizations), one old day
    left = [kv.key for kv in await store.range(rollup_prefix("hour"))]
    assert left == [period_prefix("hour", kept_hour, ORG) + b"d1"]
    left = [kv.key for kv in await store.range(rollup_prefix("day"))]
    assert left == [period_prefix("day", kept_day, ORG) + b"d1"]
    assert await usage.sweep(now) == 0  # idempotent: every replica may run it


async def test_records_of_the_older_layout_are_folded_into_the_new_keys() -> None:
    store = MemoryStore()
    usage = Usage(store)
    now = time.time()
    record = {"kind": "write", "hour": hour(now), "dims": DIMS, "counts": {"bytes": 5}}
    stale = dict(record, hour=hour(now - 500 * 86400))
    await store.put(usage_prefix(ORG) + f"{hour(now)}/abc".encode(), json.dumps(record).encode())
    await store.put(usage_prefix(ORG) + f"{stale['hour']}/abd".encode(), json.dumps(stale).encode())
    await store.put(usage_prefix(ORG) + b"x/y/z", b"not json")
    usage.add(ORG, "write", DIMS, bytes=1)
    await usage.flush()
    assert await usage.sweep(now) == 3
    assert await store.range(usage_prefix(ORG)) == []
    (in_hour,) = await values(store, period_prefix("hour", hour(now), ORG))
    (in_day,) = await values(store, period_prefix("day", day(now), ORG))
    assert in_hour["counts"] == in_day["counts"] == {"bytes": 6}  # the same dimensions


async def test_the_raw_records_come_in_pages_with_a_cursor(aiohttp_client: Any) -> None:
    client: Client = await aiohttp_client(seeded_app())
    query = f"/v1/usage?organization={ORG}&window=30d&records=true"
    seen: list[dict[str, Any]] = []
    cursor = ""
    for _ in range(20):
        r = await client.get(f"{query}&limit=4{cursor}", headers=bearer())
        page = await r.json()
        assert r.status == 200 and len(page["records"]) <= 4
        seen += page["records"]
        if page["next"] is None:
            break
        cursor = f"&cursor={page['next']}"
    everything = await (await client.get(f"{query}&limit=5000", headers=bearer())).json()
    assert seen == everything["records"] and len(seen) == 14
    assert {r["kind"] for r in seen} == {"begin", "write", "read"}
    summary = await (await client.get(f"/v1/usage?organization={ORG}", headers=bearer())).json()
    assert "records" not in summary and summary["summary"]
    assert len(json.dumps(summary)) < 20_000  # the answers, not the history


async def test_a_cursor_of_another_organization_or_a_wrong_page_is_refused(
    aiohttp_client: Any,
) -> None:
    app = seeded_app()
    client: Client = await aiohttp_client(app)
    for key, value in stored(history(), org=EMPTY_ORG):  # team-a sees both organizations
        await app[STORE].put(key, value)
    first = await (
        await client.get(
            f"/v1/usage?organization={EMPTY_ORG}&records=true&limit=1", headers=bearer()
        )
    ).json()
    assert first["next"]
    for bad, named in (
        (f"organization={ORG}&records=true&cursor={first['next']}", "cursor"),
        (f"organization={ORG}&records=true&cursor=%%%", "cursor"),
        (f"organization={ORG}&records=true&cursor=L28-", "cursor"),
        (f"organization={ORG}&records=true&limit=0", "limit"),
        (f"organization={ORG}&records=true&limit=9999999", "limit"),
        (f"organization={ORG}&records=true&limit=ten", "limit"),
        (f"organization={ORG}&records=yes", "records"),
    ):
        r = await client.get(f"/v1/usage?{bad}", headers=bearer())
        assert r.status == 400, bad
        assert named in (await r.json())["error"]
    other = await client.get(
        f"/v1/usage?organization={ORG}&records=true&cursor={first['next']}",
        headers=bearer("token-team-b"),
    )
    assert other.status == 403  # who may read comes first


async def test_a_damaged_record_is_skipped_not_a_500(aiohttp_client: Any) -> None:
    app = seeded_app()
    client: Client = await aiohttp_client(app)
    before = await (await client.get(f"/v1/usage?organization={ORG}", headers=bearer())).json()
    now = time.time()
    for prefix in (
        period_prefix("day", day(now), ORG),  # open: parsed by revision
        period_prefix("day", day(now - 2 * 86400), ORG),  # closed: merged once
    ):
        await app[STORE].put(prefix + b"damaged", b'1],[{"kind"')
        await app[STORE].put(prefix + b"damaged2", b"[]")
    app[USAGE].closed.clear()
    after = await (await client.get(f"/v1/usage?organization={ORG}", headers=bearer())).json()
    assert after["writes"] == before["writes"] and after["reads"] == before["reads"]
    page = await client.get(f"/usage?organization={ORG}&window=30d", headers=bearer())
    assert page.status == 200


class _HeldStore(MemoryStore):
    """The embedded store, its transactions held until ``go`` is set: a flush caught
    mid-merge, as a slow etcd leaves the periodic one."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()

    async def txn(self, *args: Any, **kwargs: Any) -> Any:
        self.waiting.set()
        await self.go.wait()
        return await super().txn(*args, **kwargs)


async def test_a_flush_waits_for_the_one_that_took_its_counts() -> None:
    store = _HeldStore()
    usage = Usage(store)
    usage.add(ORG, "write", DIMS, versions=1, bytes=7)
    periodic = asyncio.ensure_future(usage.flush())  # takes the counts, then is held
    await store.waiting.wait()
    page = asyncio.ensure_future(usage.flush())  # a usage page's, finding nothing pending
    await asyncio.sleep(0)
    assert not page.done()  # it must not answer before the counts are in the store
    store.go.set()
    await page
    (in_hour,) = await values(store, period_prefix("hour", hour(time.time()), ORG))
    assert in_hour["counts"] == {"versions": 1, "bytes": 7}
    await periodic
