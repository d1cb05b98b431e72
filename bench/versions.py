"""The first page of an artifact's versions at 10, 100 and 100,000 versions, next to its
ceiling, same run.

The real service app (``make_app``, on 127.0.0.1) lists ``GET .../versions?limit=100``
over HTTP, on the embedded store and on a 3-member test-bed etcd (``--no-etcd``: the
embedded store only). The versions' index keys are put straight into the store, as
commits put them. Printed per store and size: the median and p99 of the listing over
HTTP; the ceiling, a bare range read of the same 101 keys with the store's client
(``Store.range(prefix, limit=101)``); and what a listing that read every version of the
artifact would cost (one range with no limit).

    .venv/bin/python bench/versions.py [--versions 100000] [--rounds 200] [--no-etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aiohttp  # noqa: E402
from aiohttp.test_utils import TestServer  # noqa: E402

from o41.core.versions import index_suffix  # noqa: E402
from o41.state import Put, Store  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.state.memory import MemoryStore  # noqa: E402
from o41.webhook.app import Settings, make_app  # noqa: E402
from o41.webhook.cluster.view import Cluster, View, organization_source  # noqa: E402
from o41.webhook.records import ArtifactRecord, artifact_key, index_prefix  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402

ORG = "ml"
PAGE = 100


class NoKeys:
    async def credentials(self, location: Any) -> None:
        return None


def record(i: int) -> tuple[str, bytes]:
    committed = 1_700_000_000 + i / 1000
    version = f"{int(committed * 1000):012x}-{i:016x}"
    body = {
        "organization": ORG,
        "artifact": "a",
        "version": version,
        "location": "east",
        "key": f"a/{version}",
        "size": 1 << 20,
        "md5": None,
        "rule": "region",
        "cloud": "aws",
        "region": "us-east-1",
        "source": "env",
        "committed": committed,
        "metadata": {"step": i, "epoch": i // 1000, "loss": 1 / (i + 1)},
        "seq": i + 1,
    }
    return version, json.dumps(body, separators=(",", ":")).encode()


async def fill(store: Store, artifact: str, n: int) -> None:
    """``n`` versions as commits leave them: each one's index key (sequence 1 to n) and
    the artifact's record with its count."""
    prefix = index_prefix(ORG, artifact)
    batch: list[Put] = []
    version = ""
    for i in range(n - 1, -1, -1):  # oldest last: each key sorts after the ones before
        v, body = record(i)
        version = version or v
        batch.append(Put(prefix + index_suffix(i + 1, v).encode(), body))
        if len(batch) == 100:  # etcd's --max-txn-ops is 128
            await store.txn([], batch)
            batch = []
    if batch:
        await store.txn([], batch)
    await store.put(artifact_key(ORG, artifact), ArtifactRecord(artifact, version, 0, n).dump())


async def timed(call: Callable[[], Awaitable[Any]], rounds: int) -> tuple[float, float]:
    for _ in range(5):
        await call()  # warm
    took = []
    for _ in range(rounds):
        t = time.perf_counter()
        await call()
        took.append(time.perf_counter() - t)
    took.sort()
    return statistics.median(took) * 1000, took[int(len(took) * 0.99) - 1] * 1000


async def bench(name: str, store: Store, sizes: list[int], rounds: int) -> None:
    view = View()
    view.put_organization(
        organization_source({"metadata": {"name": ORG}, "spec": {"namespaces": ["default"]}})
    )
    view.synced.set()
    app = make_app(
        Settings(authentication="none", usage_interval=3600),
        store=store,
        cluster=Cluster(view, NoKeys()),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as session:
            for n in sizes:
                artifact = f"a{n}"
                t = time.perf_counter()
                await fill(store, artifact, n)
                filled = time.perf_counter() - t
                url = f"{base}/v1/organizations/{ORG}/artifacts/{artifact}/versions?limit={PAGE}"

                async def listing(url: str = url, n: int = n) -> None:
                    async with session.get(url) as r:
                        body = await r.json()
                        assert r.status == 200 and len(body["versions"]) == min(PAGE, n), body

                prefix = index_prefix(ORG, artifact)

                exact = prefix + f"{(1 << 64) - 1 - n + PAGE + 1:016x}".encode()

                async def ceiling(prefix: bytes = prefix, exact: bytes = exact) -> None:
                    await store.range(prefix, limit=PAGE + 1, end=exact)

                async def unbounded(prefix: bytes = prefix) -> None:
                    await store.range(prefix, limit=PAGE + 1)

                async def everything(prefix: bytes = prefix) -> None:
                    await store.range(prefix)

                http50, http99 = await timed(listing, rounds)
                raw50, raw99 = await timed(ceiling, rounds)
                open50, _ = await timed(unbounded, rounds)
                all50, _ = await timed(everything, max(3, rounds // 50))
                print(
                    f"{name:<8} {n:>7} versions (put in {filled:5.1f} s): first page over "
                    f"HTTP p50 {http50:6.2f} ms p99 {http99:6.2f} ms | ceiling (a range of "
                    f"exactly its {PAGE + 1} keys) p50 {raw50:6.2f} ms p99 {raw99:6.2f} ms | "
                    f"the prefix with limit {PAGE + 1}, no window: p50 {open50:6.2f} ms | "
                    f"every version {all50:8.1f} ms",
                    flush=True,
                )
    finally:
        await server.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--no-etcd", action="store_true")
    args = parser.parse_args()
    sizes = [10, PAGE, args.versions]  # 100: a full first page, as at 100,000
    memory = MemoryStore()
    await bench("embedded", memory, sizes, args.rounds)
    await memory.close()
    if args.no_etcd:
        return
    with tempfile.TemporaryDirectory(prefix="o41-bench-") as tmp:
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd").start()
        try:
            store = EtcdStore(cluster.endpoints)
            try:
                await bench("etcd", store, sizes, args.rounds)
            finally:
                await store.close()
        finally:
            cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
