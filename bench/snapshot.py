"""etcd snapshot and restore at scale (issue 32): how long the placement service's snapshot
and a member's restore take, measured against ceilings in the same run.

One etcd member of the test bed's binary on 127.0.0.1, filled with ``--versions`` versions'
worth of keys as the service writes them (o41.webhook.records: each version's record and
its listing index entry, one artifact record per 100 versions), then:

- snapshot: ``o41.state.snapshot.take`` (the service's path: the Maintenance Snapshot
  stream to a file, its SHA-256, the exact revision from ``etcdutl snapshot status``),
  against the bare stream read and thrown away, and a copy of the same bytes on disk;
- restore: ``etcdutl snapshot restore`` as the members' init container runs it (bumped
  revision), against a copy of the same bytes into a new directory.

    .venv/bin/python bench/snapshot.py [--versions 100000] [--rounds 3]

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]
# the fill's transactions of 100 puts may take over the service's 1 s per attempt
os.environ.setdefault("O41_ETCD_ATTEMPT_SECONDS", "60")

from o41.state import Put  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.state.snapshot import take  # noqa: E402
from o41.webhook.records import (  # noqa: E402
    ArtifactRecord,
    Version,
    artifact_key,
    index_prefix,
    version_key,
)
from testbed.kube import bin_dir  # noqa: E402
from testbed.process import LOOPBACK, Server, free_port, wait_until  # noqa: E402

BATCH = 100  # ops per transaction (etcd's --max-txn-ops is 128)
PARALLEL = 16


def version(i: int) -> Version:
    return Version(
        organization="ml",
        artifact=f"model-{i // 100}",
        version=f"{int(time.time() * 1e6) + i:016x}{secrets.token_hex(8)}",
        location="aws-us-east-1",
        key=f"model-{i // 100}/v{i}",
        size=2_147_483_648,
        md5=secrets.token_hex(16),
        rule="region",
        cloud="aws",
        region="us-east-1",
        source="env",
        committed=time.time(),
        metadata={"step": i, "loss": 0.125},
        seq=i % 100 + 1,
    )


async def fill(store: EtcdStore, versions: int) -> int:
    """Write the keys; their bytes (keys and values)."""
    gate, written = asyncio.Semaphore(PARALLEL), 0

    async def one(start: int) -> None:
        nonlocal written
        ops = []
        for i in range(start, min(start + BATCH // 2, versions)):
            v = version(i)
            raw = v.dump()
            index = index_prefix(v.organization, v.artifact) + f"{(1 << 40) - v.seq:013d}".encode()
            ops += [Put(version_key(v.organization, v.artifact, v.version), raw), Put(index, raw)]
            if v.seq == 1:
                record = ArtifactRecord(v.artifact, v.version, v.committed, count=100).dump()
                ops.append(Put(artifact_key(v.organization, v.artifact), record))
        written += sum(len(o.key) + len(o.value) for o in ops)
        async with gate:
            await store.txn([], ops)

    await asyncio.gather(*(one(s) for s in range(0, versions, BATCH // 2)))
    return written


async def bare_stream(endpoint: str) -> int:
    import grpc.aio  # type: ignore[import-untyped]
    from aetcd import rpc

    async with grpc.aio.insecure_channel(endpoint.removeprefix("http://")) as channel:
        size = 0
        async for chunk in rpc.MaintenanceStub(channel).Snapshot(rpc.SnapshotRequest()):
            size += len(chunk.blob)
        return size


def timed(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("O41_ETCDUTL", str(bin_dir() / "etcdutl"))
    work = Path(tempfile.mkdtemp(prefix="o41-bench-snapshot-"))
    client, peer = f"http://{LOOPBACK}:{free_port()}", f"http://{LOOPBACK}:{free_port()}"
    server = Server(
        "etcd",
        [str(bin_dir() / "etcd"), "--name=m0", f"--data-dir={work / 'm0'}",
         f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
         f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
         f"--initial-cluster=m0={peer}", "--log-level=warn",
         "--quota-backend-bytes=8589934592"],
        log=work / "etcd.log",
    ).start()  # fmt: skip
    store = EtcdStore([client], timeout=60)
    try:
        wait_until(server.alive, timeout=10, what="etcd")
        deadline = time.monotonic() + 30
        while True:
            try:
                await store.get(b"/")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        started = time.perf_counter()
        written = await fill(store, args.versions)
        print(
            f"{args.versions} versions: {written / 2**20:.1f} MiB of keys and values written "
            f"in {time.perf_counter() - started:.1f} s"
        )
        rows = []
        for r in range(args.rounds):
            path = work / f"snap-{r}.db"
            t0 = time.perf_counter()
            taken = await take([client], None, path)
            service = time.perf_counter() - t0
            t0 = time.perf_counter()
            await bare_stream(client)
            bare = time.perf_counter() - t0
            copy = timed(lambda path=path: shutil.copyfile(path, work / "copy.db"))
            restored = work / f"restored-{r}"
            restore = timed(
                lambda path=path, restored=restored: subprocess.run(
                    [
                        str(bin_dir() / "etcdutl"),
                        "snapshot",
                        "restore",
                        str(path),
                        f"--data-dir={restored}",
                        "--name=m0",
                        f"--initial-cluster=m0={peer}",
                        f"--initial-advertise-peer-urls={peer}",
                        "--bump-revision=1000000000",
                        "--mark-compacted",
                    ],
                    check=True,
                    capture_output=True,
                )
            )
            (work / f"c{r}").mkdir()
            copy_in = timed(lambda path=path, r=r: shutil.copyfile(path, work / f"c{r}" / "db"))
            rows.append((taken.size, service, bare, copy, restore, copy_in))
            shutil.rmtree(restored)
        print(f"snapshot size: {rows[0][0] / 2**20:.1f} MiB (revision {taken.revision})")
        print("round  snapshot(service)  bare stream  copy of the bytes  restore(etcdutl)  copy in")
        for n, (_, service, bare, copy, restore, copy_in) in enumerate(rows, 1):
            print(
                f"{n:>5}  {service:>15.2f} s  {bare:>9.2f} s  {copy:>15.2f} s  "
                f"{restore:>14.2f} s  {copy_in:>5.2f} s"
            )
    finally:
        await store.close()
        server.stop(timeout=5)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
