"""What the distributed collections cost, next to raw etcd on the same machine.

Starts a 3-member etcd and the collections service (a process of its own, on 127.0.0.1),
then prints, for 1 and 16 concurrent workers: p50/p99 latency and throughput of
- raw etcd puts and gets (aetcd, the service's own client library, connected to the leader:
  the ceiling);
- strong and eventual dict writes and reads, and counter adds, through the service (HTTP
  client of o41.sky, one keep-alive connection per worker thread);
and checks the targets: strong p50 <= 1.5x raw; eventual p50 <= 1/3 of strong; 16 workers
adding to one counter at least at the raw sequential put rate. For reference it also times
raw calls paced 0.3 ms apart: a service's etcd calls are never back to back (an HTTP round
trip apart), and an idle etcd and gRPC take longer to answer.

    .venv/bin/python bench/sky_collections.py [--ops 2000] [--workers 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aetcd  # noqa: E402

from o41.collections.client import Client, HttpTransport  # noqa: E402
from o41.testbed.etcd import EtcdCluster  # noqa: E402
from o41.testbed.kube import bin_dir  # noqa: E402
from o41.testbed.process import LOOPBACK, Server, free_port, port_open  # noqa: E402

VALUE = b"v" * 64
PACE = 0.0003  # seconds


@dataclass
class Result:
    name: str
    workers: int
    latencies: list[float]  # seconds
    elapsed: float

    def pct(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000

    @property
    def p50(self) -> float:
        return self.pct(50)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed

    def line(self) -> str:
        return (
            f"{self.name:<28} {self.workers:>7} {self.p50:>9.3f} {self.pct(99):>9.3f} "
            f"{self.rate:>10.0f}"
        )


# raw etcd: aetcd, as the service uses it, on the leader


async def raw_etcd(endpoint: str, ops: int, workers: int) -> list[Result]:
    host, port = endpoint.removeprefix("http://").split(":")
    results = []
    async with aetcd.Client(host=host, port=int(port), timeout=5) as etcd:
        for i in range(50):  # warm the channel
            await etcd.put(b"/bench/raw/warm/%d" % i, VALUE)

        async def run(
            name: str, n: int, op: Callable[[int, int], Awaitable[object]], pace: float = 0
        ) -> Result:
            latencies: list[float] = []

            async def worker(w: int) -> None:
                for i in range(ops // n):
                    if pace:
                        time.sleep(pace)  # noqa: ASYNC251 - idle time between calls, on purpose
                    started = time.perf_counter()
                    await op(w, i)
                    latencies.append(time.perf_counter() - started)

            started = time.perf_counter()
            await asyncio.gather(*(worker(w) for w in range(n)))
            return Result(name, n, latencies, time.perf_counter() - started)

        async def put(w: int, i: int) -> object:
            return await etcd.put(b"/bench/raw/%d/%d" % (w, i), VALUE)

        async def get(w: int, i: int) -> object:
            return await etcd.get(b"/bench/raw/%d/%d" % (w, i))

        for n in (1, workers):
            results.append(await run("raw etcd put", n, put))
            results.append(await run("raw etcd get", n, get))
        # not back to back: 0.3 ms idle between calls, as a service's calls are (an HTTP
        # round trip apart); etcd and gRPC then wake from idle on every call
        results.append(await run("raw etcd put, paced", 1, put, PACE))
        results.append(await run("raw etcd get, paced", 1, get, PACE))
    return results


# the service, from threads as pods would call it


def through_service(url: str, ops: int, workers: int) -> list[Result]:
    def client() -> Client:
        return Client(HttpTransport(url, token="bench"), "bench")

    def run(name: str, n: int, op: Callable[[Client, int, int], object]) -> Result:
        latencies: list[float] = []
        lock = threading.Lock()
        barrier = threading.Barrier(n)

        def worker(w: int) -> None:
            c = client()
            op(c, w, -1)  # connect, load the replica's copy
            mine = []
            barrier.wait()
            for i in range(ops // n):
                started = time.perf_counter()
                op(c, w, i)
                mine.append(time.perf_counter() - started)
            with lock:
                latencies.extend(mine)

        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(worker, range(n)))
        return Result(name, n, latencies, time.perf_counter() - started)

    def dict_set(consistency: str) -> Callable[[Client, int, int], object]:
        def op(c: Client, w: int, i: int) -> None:
            c.dict("bench", consistency)[f"{w}-{i % 500}"] = VALUE  # type: ignore[arg-type]

        return op

    def dict_get(consistency: str) -> Callable[[Client, int, int], object]:
        def op(c: Client, w: int, i: int) -> object:
            return c.dict("bench", consistency).get(f"{w}-{i % 500}")  # type: ignore[arg-type]

        return op

    def counter_add(consistency: str, shared: bool) -> Callable[[Client, int, int], object]:
        def op(c: Client, w: int, i: int) -> object:
            name = "hot" if shared else f"own-{w}"
            return c.counter(name, consistency).add(1)  # type: ignore[arg-type]

        return op

    results = []
    for n in (1, workers):
        for consistency in ("strong", "eventual"):
            results.append(run(f"dict set {consistency}", n, dict_set(consistency)))
            results.append(run(f"dict get {consistency}", n, dict_get(consistency)))
        for consistency in ("strong", "eventual"):
            results.append(
                run(f"counter add {consistency} (one)", n, counter_add(consistency, shared=True))
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="o41-bench-") as tmp:
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd", size=3).start()
        port = free_port()
        service = Server(
            name="collections service",
            argv=[
                sys.executable,
                "-m",
                "o41.webhook.collections",
                "--port",
                str(port),
                "--etcd",
                ",".join(cluster.endpoints),
            ],
            log=Path(tmp) / "service.log",
            env={"PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )
        try:
            service.start().wait_ready(lambda: port_open(port), timeout=60)
            leader = cluster.endpoints[cluster.leader()]
            print(f"etcd: 3 members on {LOOPBACK}, leader {leader}; {os.cpu_count()} CPUs")
            print(f"{'':<28} {'workers':>7} {'p50 ms':>9} {'p99 ms':>9} {'ops/s':>10}")
            raw = asyncio.run(raw_etcd(leader, args.ops, args.workers))
            for r in raw:
                print(r.line())
            mine = through_service(f"http://{LOOPBACK}:{port}", args.ops, args.workers)
            for r in mine:
                print(r.line())
        finally:
            service.stop()
            cluster.stop()

    by = {(r.name, r.workers): r for r in raw + mine}

    def ratio(a: str, b: str, n: int = 1) -> float:
        return by[(a, n)].p50 / by[(b, n)].p50

    print()
    checks = [
        ("strong set p50 / raw put p50", ratio("dict set strong", "raw etcd put"), "<= 1.5"),
        ("strong get p50 / raw get p50", ratio("dict get strong", "raw etcd get"), "<= 1.5"),
        (
            "eventual set p50 / strong set p50",
            ratio("dict set eventual", "dict set strong"),
            "<= 0.333",
        ),
        (
            "eventual get p50 / strong get p50",
            ratio("dict get eventual", "dict get strong"),
            "<= 0.333",
        ),
        (
            f"{args.workers} workers on one counter / raw sequential puts (rate)",
            by[("counter add strong (one)", args.workers)].rate / by[("raw etcd put", 1)].rate,
            ">= 1.0",
        ),
    ]
    print(
        "(for reference, against raw calls paced like a service's: strong set "
        f"{ratio('dict set strong', 'raw etcd put, paced'):.2f}x, strong get "
        f"{ratio('dict get strong', 'raw etcd get, paced'):.2f}x)"
    )
    ok = True
    for what, value, target in checks:
        bound = float(target.split()[1])
        met = value <= bound if target.startswith("<=") else value >= bound
        ok &= met
        print(f"{what:<62} {value:6.2f}  target {target:<8} {'met' if met else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
