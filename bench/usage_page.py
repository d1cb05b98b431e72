"""The usage page for a large history, next to a bare handler, same app, same run.

Seeds the embedded store with the rolled-up counters of a history of many writer places
and readers, as the service's flushes leave them: hourly records for the last
``--hourly-days`` days and daily records for every day, the keys and values exactly as
``o41.webhook.usage.counters.Usage`` writes them. Then times ``GET /usage`` (store ranges,
aggregation, the net advice, HTML and SVG), ``GET /v1/usage`` (summarised, and a page of
raw records) and ``GET /healthz`` (the ceiling) through the real app on 127.0.0.1, and
prints the store's size for that history (with ``--etcd``, the history is in one etcd
member of the test bed's binary instead, and the size is etcd's own dbSize after
compaction and defragmentation; the page then reads from etcd). Before each request,
``--changed`` counters are flushed again, as other replicas' flushes would change the open
day between two loads;
``first`` is the first request (nothing merged yet), the medians over ``--rounds`` (wall,
and this process's CPU time: on a shared machine the wall time follows the load).

Each place, every hour: a begin, a write of one 1 GB version (rule region, cloud or
fallback by place), a cross-cloud read from the gcp location and a cross-region read from
the aws one: three events an hour (the writes and reads; a begin is the write's start).

    .venv/bin/python bench/usage_page.py [--places 500] [--days 30] [--rounds 7] [--etcd]
"""

from __future__ import annotations

import sys

# bench/collections.py would shadow the standard library's collections for this script
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from o41.state import Put, Store  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.state.memory import MemoryStore  # noqa: E402
from o41.webhook.usage.counters import USAGE, Dims, digest_of, period_prefix  # noqa: E402
from testbed.usage import CENTRAL, EAST, ORG, bearer, hours_ago, seeded_app  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from capacity import Etcd  # type: ignore[import-not-found]  # noqa: E402  (bench/ is no package)

CLOUDS = {"aws": ["us-east-1", "us-west-2", "eu-west-1"], "gcp": ["us-central1", "europe-west4"]}
RULES = ("region", "cloud", "fallback")
SOURCES = ("env", "skypilot", "metadata", "none")
# docs/capacity.md: a usage record of 340 B (key and value) takes 358 B of etcd's dbSize
# after compaction and defragmentation
ETCD_OVERHEAD = 358 - 340


def place_hour(p: int) -> list[tuple[str, dict[str, str], dict[str, int]]]:
    """What place ``p`` counts in one hour: (kind, dims, counts)."""
    where = [(c, r) for c, rs in CLOUDS.items() for r in rs]
    cloud, region = where[p % len(where)]
    place = {"cloud": cloud, "region": f"{region}-{p}", "source": SOURCES[p % 4]}
    rule = RULES[p % 3]
    name, loc_cloud, loc_region = EAST
    at = {"location": name, "locationCloud": loc_cloud, "locationRegion": loc_region}
    writer = {"writerCloud": place["cloud"], "writerRegion": place["region"]}
    central = {"location": CENTRAL[0], "locationCloud": CENTRAL[1], "locationRegion": CENTRAL[2]}
    read = {"reads": 1, "bytes": 10**8}
    return [
        ("begin", {**place, "rule": rule, "location": name}, {"begins": 1, "warnings": 0}),
        ("write", {**place, "rule": rule, **at}, {"versions": 1, "bytes": 10**9}),
        ("read", {**place, "locality": "cross-cloud", **central, **writer}, read),
        ("read", {**place, "locality": "cross-region", **at, **writer}, read),
    ]


def history(places: int, days: int, hourly_days: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """The store's keys and values for the history, in key order, and its events."""
    found: list[tuple[bytes, bytes]] = []
    events = 0
    rows = [
        (kind, dims, counts, digest_of(kind, _dims(dims)))
        for p in range(places)
        for kind, dims, counts in place_hour(p)
    ]
    for h in range(days * 24):
        when = hours_ago(h)
        for _, _, counts, _ in rows:
            events += counts.get("versions", 0) + counts.get("reads", 0)
        if h >= hourly_days * 24:
            continue
        for kind, dims, counts, digest in rows:
            record = {"kind": kind, "hour": when, "dims": dims, "counts": counts}
            found.append((period_prefix("hour", when, ORG) + digest.encode(), _dump(record)))
    day_hours: dict[str, int] = {}
    for h in range(days * 24):
        day = hours_ago(h)[:10]
        day_hours[day] = day_hours.get(day, 0) + 1
    for day, n in day_hours.items():
        for kind, dims, counts, digest in rows:
            totals = {k: v * n for k, v in counts.items()}
            record = {"kind": kind, "day": day, "dims": dims, "counts": totals}
            found.append((period_prefix("day", day, ORG) + digest.encode(), _dump(record)))
    found.sort()
    return found, events


def _dims(dims: dict[str, str]) -> Dims:
    return tuple(sorted(dims.items()))


def _dump(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


async def timed(
    client: TestClient,  # type: ignore[type-arg]
    path: str,
    rounds: int,
    changes: list[tuple[str, dict[str, str | None], dict[str, int]]],
) -> list[tuple[float, float]]:
    """Wall and CPU seconds (this process: the service and the client) of each round,
    each after a flush of ``changes`` (counters of the history counted again,
    as other replicas' flushes would between two page loads)."""
    took = []
    usage = client.app[USAGE]
    for _ in range(rounds):
        for kind, dims, counts in changes:
            usage.add(ORG, kind, dims, **counts)
        await usage.flush()
        start, cpu = time.perf_counter(), time.process_time()
        r = await client.get(path, headers=bearer())
        await r.read()
        assert r.status == 200, r.status
        took.append((time.perf_counter() - start, time.process_time() - cpu))
    return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--places", type=int, default=500)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--hourly-days", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--changed",
        type=int,
        default=200,
        help="counters flushed before each request (of 4 per place), as the replicas would",
    )
    parser.add_argument(
        "--etcd",
        action="store_true",
        help="keep the history in a real etcd member (measured dbSize; the page reads etcd)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    kvs, events = history(args.places, args.days, args.hourly_days)
    hourly = [kv for kv in kvs if b"/usage-by-hour/" in kv[0]]
    daily = [kv for kv in kvs if b"/usage-by-day/" in kv[0]]
    if args.etcd:
        with tempfile.TemporaryDirectory(prefix="o41-usage-etcd-") as directory:
            etcd = Etcd(Path(directory)).start()
            try:
                store = EtcdStore([etcd.url], timeout=60)
                await seed_etcd(store, kvs)
                empty = etcd.db_size()
                print(f"etcd dbSize after seeding {empty / 2**20:8.1f} MiB", end="  ")
                packed = etcd.compact_and_defrag()
                print(f"after compaction and defragmentation {packed / 2**20:8.1f} MiB")
                await measure(args, store, kvs, events, began, hourly, daily)
                await store.close()
            finally:
                etcd.stop()
        return
    memory = MemoryStore()
    for key, value in kvs:  # in key order: appended, no insertion in the middle
        await memory.put(key, value)
    # The embedded store keeps the history in this process, which etcd does not: without
    # this, each of Python's full collections walks its million objects (~100 ms a time).
    gc.freeze()
    await measure(args, memory, kvs, events, began, hourly, daily)


async def seed_etcd(store: Store, kvs: list[tuple[bytes, bytes]]) -> None:
    """The history into etcd, 100 puts a transaction (etcd's limit is 128), four at a time."""
    batches = [kvs[i : i + 100] for i in range(0, len(kvs), 100)]
    gate = asyncio.Semaphore(4)

    async def one(batch: list[tuple[bytes, bytes]]) -> None:
        async with gate:
            await store.txn((), [Put(k, v) for k, v in batch])

    await asyncio.gather(*(one(b) for b in batches))


async def measure(
    args: argparse.Namespace,
    store: Store,
    kvs: list[tuple[bytes, bytes]],
    events: int,
    began: float,
    hourly: list[tuple[bytes, bytes]],
    daily: list[tuple[bytes, bytes]],
) -> None:
    """The page's and the API's times on ``store`` holding the history."""
    print(
        f"history: {events:,} events ({args.places} places x {args.days} days x 24 h x 3), "
        f"seeded in {time.perf_counter() - began:.0f} s"
    )
    for name, part in (("hourly", hourly), ("daily", daily), ("all", kvs)):
        size = sum(len(k) + len(v) for k, v in part)
        print(
            f"  {name:6} records {len(part):9,}  keys+values {size / 2**20:8.1f} MiB  "
            f"etcd dbSize ~{(size + ETCD_OVERHEAD * len(part)) / 2**20:8.1f} MiB"
        )
    every = [row for p in range(args.places) for row in place_hour(p)]
    changes: list[tuple[str, dict[str, str | None], dict[str, int]]] = [
        (kind, dict(dims), counts)
        for kind, dims, counts in every[:: max(1, len(every) // max(1, args.changed))][
            : args.changed
        ]
    ]
    print(f"before each request: {len(changes)} of the {len(every)} counters flushed again")
    app = seeded_app([], store=store)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for path in (
            f"/usage?organization={ORG}&window=30d",
            f"/v1/usage?organization={ORG}&window=30d",
            f"/usage?organization={ORG}&window=7d",
            f"/usage?organization={ORG}&window=24h",
            f"/v1/usage?organization={ORG}&window=30d&records=true&limit=1000",
            "/healthz",
        ):
            took = await timed(client, path, args.rounds, changes)
            wall = [w for w, _ in took]
            cpu = [c for _, c in took]
            print(
                f"{path:62} first {wall[0] * 1000:7.1f} ms  "
                f"median {statistics.median(wall) * 1000:7.1f} ms "
                f"(cpu {statistics.median(cpu) * 1000:6.1f} ms)"
            )
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    asyncio.run(main())
