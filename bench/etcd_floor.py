"""What a strong write or read costs at its floor (issue 41): one 3-member etcd on
127.0.0.1, sequential puts and gets on its leader from etcd's own Go client
(``bench/etcd_floor/``, built here with ``go build``) and from the service's
``o41.state.etcd.EtcdStore`` (aetcd), alternated in one run.

The gap between the two is the Python gRPC client's share; what the service and the sky
client add over ``EtcdStore`` is ``bench/owners.py``'s (strong set against raw etcd put),
and Skyward's numbers come from ``bench/skyward_side.py``.

    .venv/bin/python bench/etcd_floor.py [--alternations 3] [--ops 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench.go_build import build  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402

VALUE = b"v" * 64


def percentile(samples: list[float], p: float) -> float:
    return sorted(samples)[int((len(samples) - 1) * p)] * 1000


async def python_round(endpoint: str, ops: int) -> str:
    store = EtcdStore([endpoint], timeout=5)
    puts: list[float] = []
    gets: list[float] = []
    try:
        for i in range(ops):
            key = f"/bench/p{i % 50}".encode()
            start = time.perf_counter()
            await store.put(key, VALUE)
            puts.append(time.perf_counter() - start)
            start = time.perf_counter()
            await store.get(key)
            gets.append(time.perf_counter() - start)
    finally:
        await store.close()
    return (
        f"EtcdStore  put p50 {percentile(puts, 0.5):.3f} ms p99 {percentile(puts, 0.99):.3f} ms"
        f" | get p50 {percentile(gets, 0.5):.3f} ms p99 {percentile(gets, 0.99):.3f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alternations", type=int, default=3)
    parser.add_argument("--ops", type=int, default=1000, help="per Python round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        program = build("etcd_floor", Path(tmp))
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd", size=3).start()
        try:
            leader = cluster.endpoints[cluster.leader()]
            print(f"load average at the start: {os.getloadavg()}", flush=True)
            for _ in range(args.alternations):
                subprocess.run([str(program), leader], check=True, timeout=300)
                print(asyncio.run(python_round(leader, args.ops)), flush=True)
            print(f"load average at the end: {os.getloadavg()}", flush=True)
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
