"""A directory of 1,000 small files vs the same bytes as one file, same run.

The real service app (``make_app`` on 127.0.0.1, the embedded store) places the writes on
a Location on the S3 stand-in (versitygw, which checks every signature); the SDK writes
and reads: the directory as one version (one begin that signs a PUT per file, the files
in parallel, one commit that checks each file in the bucket), and the same bytes as one
file. The ceiling: boto3 putting and getting the same 1,000 objects straight to the same
gateway with as many threads as the client uses (no service, no checksums), and one
object of the same bytes. Rounds alternate; medians are printed, and the service's share
of the directory's write (begin and commit as the client timed them).

    .venv/bin/python bench/directories.py [--files 1000] [--size 4096] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from aiohttp.test_utils import TestServer  # noqa: E402

from o41.client.artifacts import Artifacts  # noqa: E402
from o41.client.directories import PARALLEL_FILES, read_dir, write_dir  # noqa: E402
from o41.core.places import Place  # noqa: E402
from o41.kube.location_record import LocationRecord  # noqa: E402
from o41.kube.locations import Location, read_location  # noqa: E402
from o41.state.memory import MemoryStore  # noqa: E402
from o41.webhook.app import Settings, make_app  # noqa: E402
from o41.webhook.cluster.view import Cluster, View, organization_source  # noqa: E402
from o41.webhook.identity import auth  # noqa: E402
from testbed.stores import start_s3  # noqa: E402

ORG, BUCKET = "ml", "bench-directories"
T = TypeVar("T")


class Reviewer:
    async def review(self, token: str) -> auth.Caller | None:
        return auth.Caller("team-a", "default")


class Keys:
    def __init__(self, keys: Mapping[str, str]) -> None:
        self.keys = keys

    async def credentials(self, location: Location) -> Mapping[str, str] | None:
        return self.keys


class Timed(Artifacts):
    """The client, timing its calls to the service by route."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.timings: dict[str, float] = {}

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        idempotent: bool | None = None,
    ) -> Any:
        t = time.perf_counter()
        try:
            return super().call(method, path, body, idempotent=idempotent)
        finally:
            route = "commit" if path.endswith("/commit") else path.split("?")[0].rsplit("/", 1)[-1]
            self.timings[route] = self.timings.get(route, 0.0) + time.perf_counter() - t


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


def run(args: argparse.Namespace, endpoint: str, s3: Any, tmp: Path) -> None:
    source = tmp / "dir"
    source.mkdir()
    blobs = [os.urandom(args.size) for _ in range(args.files)]
    for i, b in enumerate(blobs):
        (source / f"shard-{i // 100:02d}" / f"f{i:05d}.bin").parent.mkdir(exist_ok=True)
        (source / f"shard-{i // 100:02d}" / f"f{i:05d}.bin").write_bytes(b)
    one = tmp / "one.bin"
    one.write_bytes(b"".join(blobs))
    token = tmp / "token"
    token.write_text("t")
    place = Place("aws", "us-east-1", "env")
    client = s3.client()
    results: dict[str, list[float]] = {}
    service: dict[str, list[float]] = {"begin": [], "commit": [], "files": []}

    def note(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)

    keys = [f"raw/f{i:05d}.bin" for i in range(args.files)]

    def raw_put() -> None:
        with ThreadPoolExecutor(PARALLEL_FILES) as pool:
            list(pool.map(lambda kb: client.put_object(Bucket=BUCKET, Key=kb[0], Body=kb[1]),
                          zip(keys, blobs, strict=True)))  # fmt: skip

    def raw_get() -> None:
        def get(key: str) -> bytes:
            data: bytes = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            return data

        with ThreadPoolExecutor(PARALLEL_FILES) as pool:
            list(pool.map(get, keys))

    whole = b"".join(blobs)

    def one_round(r: int) -> None:
        api = Timed(endpoint, str(token), place=place, timeout=60)
        seconds, written = timed(lambda: write_dir(api, ORG, "dir", source))
        note("directory write", seconds)
        service["begin"].append(api.timings.get("directories", 0.0))
        service["commit"].append(api.timings.get("commit", 0.0))
        out = tmp / f"back-{r}"
        api.timings.clear()
        note("directory read", timed(lambda: read_dir(api, ORG, "dir", written.version, out))[0])
        service["files"].append(api.timings.get("files", 0.0))
        shutil.rmtree(out)
        seconds, single = timed(lambda: api.write(ORG, "one", one))
        note("one file write", seconds)
        note("one file read", timed(lambda: api.read(ORG, "one", single.version, tmp / "o"))[0])
        note(f"ceiling: boto3 {args.files} puts", timed(raw_put)[0])
        note(f"ceiling: boto3 {args.files} gets", timed(raw_get)[0])
        put = timed(lambda: client.put_object(Bucket=BUCKET, Key="raw/one.bin", Body=whole))
        note("ceiling: boto3 one put", put[0])
        get = timed(lambda: client.get_object(Bucket=BUCKET, Key="raw/one.bin")["Body"].read())
        note("ceiling: boto3 one get", get[0])

    for r in range(args.rounds):
        one_round(r)

    total = args.files * args.size
    print(
        f"{args.files} files of {args.size} bytes ({total / 2**20:.1f} MiB) vs one file of "
        f"the same bytes; {args.rounds} rounds, medians; {PARALLEL_FILES} files in flight"
    )
    print(f"{'':<28} {'seconds':>8} {'files/s':>9} {'MiB/s':>7}")
    for name, times in results.items():
        m = statistics.median(times)
        many = " puts" in name or " gets" in name or name.startswith("directory")
        rate = f"{args.files / m:9.0f}" if many else f"{'':>9}"
        print(f"{name:<28} {m:8.3f} {rate} {total / 2**20 / m:7.1f}")
    print(
        "the service's share of a directory: begin (sign {n} PUTs) {b:.3f} s, commit "
        "(list {n} objects) {c:.3f} s, the files' downloads signed {f:.3f} s".format(
            n=args.files,
            b=statistics.median(service["begin"]),
            c=statistics.median(service["commit"]),
            f=statistics.median(service["files"]),
        )
    )


async def serve(
    args: argparse.Namespace,
    work: Callable[[argparse.Namespace, str, Any, Path], None] | None = None,
) -> None:
    """The service on 127.0.0.1 with one Location on versitygw, while ``work(args,
    endpoint, s3, tmp)`` runs in a thread (default: this bench's rounds)."""
    with tempfile.TemporaryDirectory(prefix="o41-bench-dirs-") as tmpdir:
        tmp = Path(tmpdir)
        s3 = start_s3(tmp / "s3")
        try:
            s3.client().create_bucket(Bucket=BUCKET)
            created = "2026-01-01T00:00:00Z"
            view = View()
            obj = {
                "metadata": {"name": "east", "uid": "uid-east", "creationTimestamp": created},
                "spec": {
                    "organization": ORG,
                    "cloud": "aws",
                    "region": "us-east-1",
                    "bucket": BUCKET,
                    "backend": {"s3": {"endpoint": s3.endpoint}},
                },
            }
            record = LocationRecord("uid-east", "east", ready=True, ready_since=created)
            view.put_location(read_location(obj, record))
            view.put_organization(
                organization_source({"metadata": {"name": ORG}, "spec": {"namespaces": ["team-a"]}})
            )
            view.synced.set()
            keys = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
            app = make_app(
                Settings(usage_interval=3600),
                Reviewer(),
                store=MemoryStore(),
                cluster=Cluster(view, Keys(keys)),
            )
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            try:
                endpoint = str(server.make_url("")).rstrip("/")
                await asyncio.to_thread(work or run, args, endpoint, s3, tmp)
            finally:
                await server.close()
        finally:
            s3.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--size", type=int, default=4096, help="bytes per file")
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
