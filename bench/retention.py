"""A retention pass and the index backfill, on a 3-member test-bed etcd and versitygw,
next to their ceilings, same run.

- **Retention**: an artifact of ``--versions`` versions (objects in versitygw, records
  in etcd, as commits leave them) under a rule keeping 10; one pass of the service's
  ``Retention.apply`` deletes the rest. The ceiling: the same number of objects and
  record pairs deleted with nothing else (one S3 DeleteObject and one etcd transaction
  deleting both keys per version, one after another as the pass does).
- **Backfill**: ``--legacy`` version records as a release before the index left them (no
  sequence number, no index key); one ``backfill`` indexes them all. The ceiling: the
  same scan of the records and one put per index key, unguarded.

- **A directory version**: ``--files`` small files under one version's prefix (objects in
  versitygw, its record with ``files``, its manifest and index key in etcd), the oldest of
  ``KEEP + 1``; one pass deletes its files and records. The ceiling: the same listing and
  deletes (16 at a time, as the pass does) and one etcd transaction for its three keys.

    .venv/bin/python bench/retention.py [--versions 300] [--legacy 5000] [--files 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from aiohttp import web  # noqa: E402

from o41.core.versions import index_suffix  # noqa: E402
from o41.state import Delete, Put, Store  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.storage import BucketRef, open_bucket  # noqa: E402
from o41.webhook.app import Settings, make_app  # noqa: E402
from o41.webhook.cluster.view import Cluster, View, organization_source  # noqa: E402
from o41.webhook.records import (  # noqa: E402
    ArtifactRecord,
    artifact_key,
    index_prefix,
    manifest_key,
    version_key,
)
from o41.webhook.retention import RETENTION  # noqa: E402
from o41.webhook.writes import backfill  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402
from testbed.stores import start_s3  # noqa: E402

ORG = "ml"
KEEP = 10


class NoKeys:
    async def credentials(self, location: Any) -> None:
        return None


def record(artifact: str, i: int, seq: int) -> tuple[str, bytes]:
    committed = 1_700_000_000 + i
    version = f"{int(committed * 1000):012x}-{i:016x}"
    body = {
        "organization": ORG,
        "artifact": artifact,
        "version": version,
        "location": "east",
        "key": f"{artifact}/{version}",
        "size": 3,
        "md5": None,
        "rule": "region",
        "cloud": "aws",
        "region": "us-east-1",
        "source": "env",
        "committed": committed,
        "seq": seq,
    }
    return version, json.dumps(body, separators=(",", ":")).encode()


async def directories(store: Store, bucket: Any, artifact: str, files: int) -> list[str]:
    """``KEEP + 1`` directory versions as commits leave them, the oldest of ``files``
    files, the others of one: objects, record (``files``), manifest, index key."""
    versions = []
    for i in range(KEEP + 1):
        version, body = record(artifact, i, i + 1)
        count = files if i == 0 else 1
        rows = [[f"shard-{j:05d}.bin", 3, "900150983cd24fb0d6963f7d28e17f72"] for j in range(count)]
        await asyncio.gather(
            *(
                asyncio.to_thread(_put_object, bucket, f"{artifact}/{version}/{row[0]}")
                for row in rows
            )
        )
        made = json.dumps({**json.loads(body), "size": 3 * count, "files": count}).encode()
        await store.txn(
            [],
            [
                Put(version_key(ORG, artifact, version), made),
                Put(index_prefix(ORG, artifact) + index_suffix(i + 1, version).encode(), made),
                Put(manifest_key(ORG, artifact, version), json.dumps(rows).encode()),
            ],
        )
        versions.append(version)
    latest = ArtifactRecord(artifact, versions[-1], 0, KEEP + 1).dump()
    await store.put(artifact_key(ORG, artifact), latest)
    return versions


async def committed(store: Store, bucket: Any, artifact: str, n: int) -> list[str]:
    """``n`` versions as commits leave them: object, record, index key, artifact record."""
    versions = []
    for i in range(n):
        version, body = record(artifact, i, i + 1)
        await asyncio.to_thread(_put_object, bucket, f"{artifact}/{version}")
        await store.txn(
            [],
            [
                Put(version_key(ORG, artifact, version), body),
                Put(index_prefix(ORG, artifact) + index_suffix(i + 1, version).encode(), body),
            ],
        )
        versions.append(version)
    latest = ArtifactRecord(artifact, versions[-1], 0, n).dump()
    await store.put(artifact_key(ORG, artifact), latest)
    return versions


def _put_object(bucket: Any, key: str) -> None:
    import urllib.request

    req = bucket.presign_put(key, expires=600, size=3)
    request = urllib.request.Request(req.url, data=b"abc", method="PUT", headers=req.headers)
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=300)
    parser.add_argument("--legacy", type=int, default=5000)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="o41-bench-") as tmp:
        s3 = start_s3(Path(tmp) / "s3")
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd").start()
        store = EtcdStore(cluster.endpoints)
        try:
            await run(args, store, s3)
        finally:
            await store.close()
            cluster.stop()
            s3.stop()


async def run(args: argparse.Namespace, store: EtcdStore, s3: Any) -> None:
    from testbed.locations import location

    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    ref = BucketRef(
        "s3", "o41-bench-retention", "us-east-1", endpoint=s3.endpoint, credentials=creds
    )
    bucket = open_bucket(ref)
    bucket.ensure("loc-bench")
    view = View()
    view.put_location(location("east", "aws", "us-east-1", 1))
    spec = {"namespaces": ["default"], "retention": [{"artifacts": "*", "keepVersions": KEEP}]}
    view.put_organization(organization_source({"metadata": {"name": ORG}, "spec": spec}))
    view.synced.set()
    app = make_app(
        Settings(authentication="none", usage_interval=3600, retention_interval=3600),
        store=store,
        cluster=Cluster(view, NoKeys()),
        buckets=lambda _: bucket,
    )
    runner = web.AppRunner(app)  # starts the app's contexts (store, retention) unserved
    await runner.setup()
    try:
        n = args.versions
        await committed(store, bucket, "a", n)
        t = time.perf_counter()
        deleted = await app[RETENTION].apply(ORG, "a")
        took = time.perf_counter() - t
        assert deleted == n - KEEP, deleted

        versions = await committed(store, bucket, "b", n)
        t = time.perf_counter()
        for i, version in enumerate(versions[: n - KEEP]):
            await asyncio.to_thread(bucket.delete, f"b/{version}")
            await store.txn(
                [],
                [
                    Delete(version_key(ORG, "b", version)),
                    Delete(index_prefix(ORG, "b") + index_suffix(i + 1, version).encode()),
                ],
            )
        bare = time.perf_counter() - t
        print(
            f"retention: {deleted} of {n} versions deleted in one pass in {took:.2f} s "
            f"({took / deleted * 1000:.1f} ms each) | ceiling, the bare deletes (S3 "
            f"DeleteObject + one etcd txn each): {bare:.2f} s ({bare / deleted * 1000:.1f} ms "
            "each)",
            flush=True,
        )

        f = args.files
        dirs = await directories(store, bucket, "d", f)
        t = time.perf_counter()
        deleted = await app[RETENTION].apply(ORG, "d")
        took = time.perf_counter() - t
        assert deleted == 1, deleted
        assert not bucket.list_under(f"d/{dirs[0]}/")
        versions = await directories(store, bucket, "e", f)
        t = time.perf_counter()
        listed = await asyncio.to_thread(bucket.list_under, f"e/{versions[0]}/")
        gate = asyncio.Semaphore(16)

        async def one(key: str) -> None:
            async with gate:
                await asyncio.to_thread(bucket.delete, key)

        await asyncio.gather(*(one(k) for k in listed))
        await store.txn(
            [],
            [
                Delete(version_key(ORG, "e", versions[0])),
                Delete(index_prefix(ORG, "e") + index_suffix(1, versions[0]).encode()),
                Delete(manifest_key(ORG, "e", versions[0])),
            ],
        )
        bare = time.perf_counter() - t
        print(
            f"retention of a directory version of {f} files: one pass deleted it in "
            f"{took:.2f} s | ceiling, the bare listing, deletes (16 at a time) and one etcd "
            f"txn: {bare:.2f} s",
            flush=True,
        )

        m = args.legacy
        batch: list[Put] = []
        for i in range(m):
            version, body = record("old", i, 0)
            batch.append(Put(version_key(ORG, "old", version), body))
            if len(batch) == 100:
                await store.txn([], batch)
                batch = []
        if batch:
            await store.txn([], batch)
        await store.delete(backfill.DONE)
        t = time.perf_counter()
        indexed = await backfill.backfill(store)
        took = time.perf_counter() - t
        assert indexed == m, indexed
        t = time.perf_counter()
        again = await backfill.backfill(store)
        noop = time.perf_counter() - t
        assert again == 0
        t = time.perf_counter()
        start = b""
        while True:
            page = await store.range(backfill.VERSIONS, limit=backfill.PAGE, start=start)
            for kv in page:
                await store.put(b"/bench/ceiling/" + kv.key, kv.value)
            if len(page) < backfill.PAGE:
                break
            start = page[-1].key + b"\0"
        bare = time.perf_counter() - t
        print(
            f"backfill: {indexed} legacy versions indexed in {took:.2f} s; the second start's "
            f"scan (nothing to do, writes the done key) {noop:.2f} s | ceiling, the same scan "
            f"and one unguarded put per version: {bare:.2f} s",
            flush=True,
        )
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
