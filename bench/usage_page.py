"""The usage page for a large history, next to a bare handler, same app, same run.

Seeds the embedded store with a month of hourly records for many writer places and
readers, then times ``GET /usage`` (store range, aggregation, HTML and SVG), ``GET
/v1/usage`` and ``GET /healthz`` (the ceiling) through the real app on 127.0.0.1.

    .venv/bin/python bench/usage_page.py [--places 60] [--days 30] [--rounds 5]
"""

from __future__ import annotations

import sys

# bench/collections.py would shadow the standard library's collections for this script
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from test_usage_support import (  # noqa: E402
    CENTRAL,
    EAST,
    ORG,
    bearer,
    hours_ago,
    read,
    seeded_app,
    write,
)

CLOUDS = {"aws": ["us-east-1", "us-west-2", "eu-west-1"], "gcp": ["us-central1", "europe-west4"]}


def history(places: int, days: int) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    where = [(c, r) for c, rs in CLOUDS.items() for r in rs]
    for h in range(days * 24):
        when = hours_ago(h)
        for p in range(places):
            cloud, region = where[p % len(where)]
            place = (cloud, f"{region}-{p}", ("env", "skypilot", "metadata", "none")[p % 4])
            found.append(write(when, place, "cloud", EAST, 3, 10**9))
            found.append(read(when, place, "cross-cloud", CENTRAL, 2, 10**8))
    return found


async def timed(client: TestClient, path: str, rounds: int) -> list[float]:  # type: ignore[type-arg]
    took = []
    for _ in range(rounds):
        start = time.perf_counter()
        r = await client.get(path, headers=bearer())
        await r.read()
        assert r.status == 200, r.status
        took.append(time.perf_counter() - start)
    return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--places", type=int, default=60)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    records = history(args.places, args.days)
    async with TestClient(TestServer(seeded_app(records), host="127.0.0.1")) as client:
        print(f"{len(records)} records ({args.places} places x {args.days * 24} hours x 2)")
        for path in (
            f"/usage?organization={ORG}&window=30d",
            f"/usage?organization={ORG}&window=24h",
            f"/v1/usage?organization={ORG}&window=30d",
            "/healthz",
        ):
            took = await timed(client, path, args.rounds)
            print(f"{path:45} median {statistics.median(took) * 1000:8.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
