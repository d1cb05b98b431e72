# mypy: ignore-errors
"""Skyward's collections, for a side-by-side with ``bench/owners.py`` (issue 41).

Skyward 0.12.1 (its collections are casty 0.30.2's, replicated to 3 nodes, majority
writes) on 3 nodes on 127.0.0.1: node 0 in this process, where the measuring threads call
Skyward's synchronous facade (``skyward.worker.distributed``) as code running on a
Skyward node does; nodes 1 and 2 in processes of their own. No provider: nothing leaves
the machine. Prints p50, p99, operations a second and the CPU per operation of node 0 and
of nodes 1-2, for a strong dict get and set, a counter add, a queue offer and poll (of
the queue the offers of the same round filled) and a lock's acquire+release (with
``--workers``: that many on one lock, hand-overs a second), 1 and ``--workers`` workers,
in alternated rounds. Needs Python 3.12 and the two packages, in a venv of their own:

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/sky-venv
    /tmp/sky-venv/bin/pip install skyward==0.12.1 casty==0.30.2
    /tmp/sky-venv/bin/python bench/skyward_side.py [--ops 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import casty
from casty.model import Cluster

TICK = os.sysconf("SC_CLK_TCK")
VALUE = b"v" * 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def node(port: int, seeds: tuple[str, ...], hold=None) -> None:
    system = casty.ActorSystem(cluster=Cluster(bind=f"127.0.0.1:{port}", seeds=seeds))
    async with system:
        if hold is not None:
            await hold(system)
        await asyncio.Event().wait()  # until the process ends


def measure(sky, what: str, n: int, ops: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        d = sky.dict("bench-strong")
        counter, queue = sky.counter("bench-hot"), sky.queue(f"bench-queue-{n}")
        mutex = sky.lock(f"bench-lock-{n}", ttl=30, timeout=60)
        mine = []
        for i in range(ops // n):
            key = f"k{(w * 31 + i) % 500}"
            started = time.perf_counter()
            if what == "get":
                d.get(key)
            elif what == "set":
                d[key] = VALUE
            elif what == "add":
                counter.add(1)
            elif what == "offer":
                queue.offer(b"x")
            elif what == "poll":  # of the queue the offers of the same round filled
                queue.poll()
            else:  # "lock": one acquire and one release (``with lock: pass``)
                with mutex:
                    pass
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(worker, range(n)))
    return latencies, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--node", nargs=2, help="run a helper node: PORT SEED")
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    if args.node:
        asyncio.run(node(int(args.node[0]), (args.node[1],)))
        return 0
    print(f"load average at the start: {os.getloadavg()}")
    ports = [free_port() for _ in range(3)]
    seed = f"127.0.0.1:{ports[0]}"
    loop = asyncio.new_event_loop()
    bound = threading.Event()

    async def hold(system) -> None:
        from skyward.worker import distributed

        distributed.bind(system, asyncio.get_running_loop())
        bound.set()

    threading.Thread(
        target=lambda: loop.run_until_complete(node(ports[0], (), hold)), daemon=True
    ).start()
    assert bound.wait(30)
    helpers = [
        subprocess.Popen([sys.executable, __file__, "--node", str(p), seed]) for p in ports[1:]
    ]
    try:
        from skyward.worker import distributed as sky

        system = sky.cluster().collections._system
        deadline = time.monotonic() + 60
        while len(system.members) < 3:
            assert time.monotonic() < deadline, "the 3 nodes never met"
            time.sleep(0.2)
        d = sky.dict("bench-strong")
        for i in range(500):
            d[f"k{i}"] = VALUE
        kinds = ("get", "set", "add", "offer", "poll", "lock")
        rows = [(what, n) for n in (1, args.workers) for what in kinds]
        for what, n in rows:
            measure(sky, what, n, 64)  # warm
        pooled = {row: ([], 0.0, 0.0, 0.0) for row in rows}
        for _ in range(args.rounds):
            for row in rows:
                mine, theirs = cpu(os.getpid()), sum(cpu(h.pid) for h in helpers)
                latencies, elapsed = measure(sky, *row, args.ops // args.rounds)
                got, took, c0, c1 = pooled[row]
                pooled[row] = (
                    got + latencies,
                    took + elapsed,
                    c0 + cpu(os.getpid()) - mine,
                    c1 + sum(cpu(h.pid) for h in helpers) - theirs,
                )
        print(f"load average at the end: {os.getloadavg()}")
        print(
            f"{'':<16} {'op':<6} {'workers':>7} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>8} "
            f"{'node0 us/op':>12} {'nodes1-2 us/op':>15}"
        )
        for (what, n), (latencies, elapsed, c0, c1) in pooled.items():
            latencies.sort()
            count = len(latencies)
            print(
                f"{'skyward strong':<16} {what:<6} {n:>7} {latencies[count // 2] * 1000:>8.3f} "
                f"{latencies[int(count * 0.99)] * 1000:>8.3f} {count / elapsed:>8.0f} "
                f"{c0 / count * 1e6:>12.0f} {c1 / count * 1e6:>15.0f}"
            )
    finally:
        for h in helpers:
            h.terminate()
        for h in helpers:
            h.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
