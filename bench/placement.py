"""The placement service under load, next to its ceiling on the same machine, same run.

Starts a control plane, the S3 stand-in, a 3-member etcd, the operator and the service
(all on 127.0.0.1), then prints:
- begin requests per second and p50/p99 with concurrent clients, and the same load
  against a bare aiohttp JSON handler (the ceiling);
- upload throughput of a 256 MiB file through the client vs boto3 to the same stand-in;
- the service's resident memory at rest.

    .venv/bin/python bench/placement.py [--seconds 10] [--clients 32] [--mib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aiohttp  # noqa: E402

from o41.client.artifacts import Artifacts  # noqa: E402
from o41.core.places import Place  # noqa: E402
from o41.testbed.etcd import EtcdCluster  # noqa: E402
from o41.testbed.kube import ControlPlane, apply, bin_dir, kubectl  # noqa: E402
from o41.testbed.process import LOOPBACK, Server, free_port, port_open  # noqa: E402
from o41.testbed.product import (  # noqa: E402
    OperatorProcess,
    PlacementProcess,
    install_crds,
    store_secrets,
)
from o41.testbed.stores import start_s3  # noqa: E402

BARE = """
from aiohttp import web
async def handler(request):
    await request.read()
    return web.json_response({"version": "0193a1b2c3d4-9f8e7d6c5b4a3f2e", "location": "x"})
app = web.Application()
app.router.add_post("/v1/writes", handler)
web.run_app(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), access_log=None)
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def load(
    url: str, body: bytes, headers: dict[str, str], clients: int, seconds: float
) -> tuple[float, list[float], int]:
    """``clients`` concurrent loops of POSTs for ``seconds``: (rps, latencies, errors)."""
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal errors
            while time.monotonic() < stop:
                start = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status >= 300:
                        errors += 1
                latencies.append(time.perf_counter() - start)

        began = time.monotonic()
        await asyncio.gather(*(one() for _ in range(clients)))
        elapsed = time.monotonic() - began
    return len(latencies) / elapsed, latencies, errors


def row(label: str, rps: float, latencies: list[float], errors: int) -> str:
    q = statistics.quantiles(latencies, n=100)
    return (
        f"{label:<34} {rps:8.0f} req/s  p50 {q[49] * 1000:6.1f} ms  "
        f"p99 {q[98] * 1000:6.1f} ms  errors {errors}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="uploads of each, alternated")
    parser.add_argument(
        "--store",
        choices=["etcd", "embedded"],
        default="etcd",
        help="embedded: the single-replica store, to see what etcd costs a begin",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="o41-bench-placement-"))
    bins = bin_dir()
    plane = ControlPlane(work / "kube", bins).start()
    s3 = start_s3(work / "s3")
    etcd = EtcdCluster(bins / "etcd", work / "etcd").start()
    started: list[Server] = []
    try:
        kc = plane.kubeconfig
        install_crds(kc)
        store_secrets(kc, s3)
        operator = OperatorProcess(kc, work / "operator", check_interval=60).start()
        assert operator.server is not None
        started.append(operator.server)
        org = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": "bench"},
            "spec": {"namespaces": ["bench"]},
        }
        location = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Location",
            "metadata": {"name": "east"},
            "spec": {
                "organization": "bench",
                "cloud": "aws",
                "region": "us-east-1",
                "backend": {"s3": {"endpoint": s3.endpoint}},
                "credentials": {"secretName": "creds-s3"},
            },
        }
        apply(kc, org, location)
        kubectl(
            kc,
            "wait",
            "--for=jsonpath={.status.takesWrites}=true",
            "organization/bench",
            "--timeout=60s",
        )
        endpoints = etcd.endpoints if args.store == "etcd" else []
        service = PlacementProcess(kc, endpoints, work / "placement").start()
        assert service.server is not None
        started.append(service.server)
        kubectl(kc, "create", "namespace", "bench")
        token = ""
        while not token:
            token = kubectl(kc, "-n", "bench", "create", "token", "default", check=False).strip()
        time.sleep(2)
        rest = rss_mb(service.server.pid)

        bare_port = free_port()
        bare = Server(
            "bare", [sys.executable, "-c", BARE, str(bare_port)], work / "bare.log"
        ).start()
        started.append(bare)
        bare.wait_ready(lambda: port_open(bare_port))

        body = json.dumps(
            {
                "organization": "bench",
                "artifact": "ckpt",
                "size": 1024,
                "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
            }
        ).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        asyncio.run(load(f"{service.url}/v1/writes", body, headers, 4, 1))  # warm caches
        ceiling = asyncio.run(
            load(
                f"http://{LOOPBACK}:{bare_port}/v1/writes",
                body,
                headers,
                args.clients,
                args.seconds,
            )
        )
        begin = asyncio.run(
            load(f"{service.url}/v1/writes", body, headers, args.clients, args.seconds)
        )

        big = work / "big.bin"
        with big.open("wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(1024 * 1024))
        token_file = work / "token"
        token_file.write_text(token)
        client = Artifacts(service.url, str(token_file), Place("aws", "us-east-1", "env"))
        s3c = s3.client()
        bucket = "boto3-baseline"
        s3c.create_bucket(Bucket=bucket)
        rates: dict[str, list[float]] = {"ours": [], "boto3": []}
        for _ in range(args.rounds):  # alternate, so both see the same noise
            t = time.monotonic()
            client.write("bench", "big", big)
            rates["ours"].append(args.mib / (time.monotonic() - t))
            t = time.monotonic()
            s3c.upload_file(str(big), bucket, "big")
            rates["boto3"].append(args.mib / (time.monotonic() - t))
        ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["boto3"])

        print(f"{os.cpu_count()} cores; {args.clients} concurrent clients for {args.seconds:.0f} s")
        print(row("ceiling: bare aiohttp JSON handler", *ceiling))
        print(row(f"begin (placement service, {args.store})", *begin))
        print(f"begin reaches {begin[0] / ceiling[0]:.0%} of the ceiling's requests per second")
        print(
            f"upload {args.mib} MiB, median of {args.rounds}: client {ours:.0f} MiB/s, "
            f"boto3 {theirs:.0f} MiB/s "
            f"({ours / theirs:.0%})"
        )
        print(
            f"service RSS at rest {rest:.0f} MB, after the load {rss_mb(service.server.pid):.0f} MB"
        )
    finally:
        for server in reversed(started):
            server.stop()
        etcd.stop()
        s3.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
