"""What an operation id costs (issue 39, point 2): the same operations with and without an
id, in one run, on a 3-member etcd on 127.0.0.1, through the collections' engine (the
service's code under its routes, in this process; the HTTP hop is the same either way).

An id adds one Put (its first answer, under this minute's lease) and one Compare to the
transaction the operation makes anyway; a pop and a poll with an id read the value before
they claim it (two round trips: the answer holds the value). Each measurement runs in
``--rounds`` slices, with and without ids alternating, so a slow minute of a shared
machine weighs on both; p50 and p99 of one operation (one worker) and the throughput of
``--workers`` concurrent workers (their operations combined into few transactions).

    .venv/bin/python bench/operation_ids.py [--ops 1000] [--workers 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from o41.collections.engine import Engine  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402

Op = Callable[[Engine, str, int, bool], Awaitable[Any]]


def args_of(with_id: bool, **args: Any) -> dict[str, Any]:
    return {**args, "operation": uuid.uuid4().hex} if with_id else args


async def counter_add(engine: Engine, compute: str, i: int, with_id: bool) -> Any:
    return await engine.call("bench", compute, "counter", "c", "add", args_of(with_id, n=1))


async def queue_offer(engine: Engine, compute: str, i: int, with_id: bool) -> Any:
    args = args_of(with_id, value=b"item-%d" % i)
    return await engine.call("bench", compute, "queue", "q", "offer", args)


async def queue_poll(engine: Engine, compute: str, i: int, with_id: bool) -> Any:
    return await engine.call("bench", compute, "queue", "q", "poll", args_of(with_id))


async def dict_set(engine: Engine, compute: str, i: int, with_id: bool) -> Any:
    args = args_of(with_id, key=f"s{i}", value=b"v")
    return await engine.call("bench", compute, "dict", "d", "set", args)


async def dict_pop(engine: Engine, compute: str, i: int, with_id: bool) -> Any:
    args = args_of(with_id, key=f"s{i}")
    return await engine.call("bench", compute, "dict", "d", "pop", args)


async def timed(engine: Engine, op: Op, compute: str, n: int, with_id: bool) -> list[float]:
    took = []
    for i in range(n):
        start = time.perf_counter()
        await op(engine, compute, i, with_id)
        took.append(time.perf_counter() - start)
    return took


async def rate(engine: Engine, op: Op, compute: str, n: int, workers: int, with_id: bool) -> float:
    async def work(w: int) -> None:
        for i in range(w, n, workers):
            await op(engine, compute, i, with_id)

    start = time.perf_counter()
    await asyncio.gather(*(work(w) for w in range(workers)))
    return n / (time.perf_counter() - start)


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


async def run(endpoints: list[str], ops: int, workers: int, rounds: int) -> None:
    store = EtcdStore(endpoints, timeout=10)
    engine = Engine(store)
    compute = f"bench-{uuid.uuid4().hex[:8]}"
    slice_ = max(1, ops // rounds)
    # fills: a poll and a pop need something to take
    fills: dict[str, Op] = {"queue.poll": queue_offer, "dict.pop": dict_set}
    cases: list[tuple[str, Op]] = [
        ("counter.add", counter_add),
        ("queue.offer", queue_offer),
        ("queue.poll", queue_poll),
        ("dict.set", dict_set),
        ("dict.pop", dict_pop),
    ]
    await counter_add(engine, compute, 0, True)  # the first lease grant, out of the way
    print(f"{ops} operations per measurement, {rounds} rounds, {workers} workers for rates")
    print(f"{'operation':12} {'':8} {'p50 ms':>8} {'p99 ms':>8} {'ops/s x' + str(workers):>12}")
    try:
        for name, op in cases:
            lat: dict[bool, list[float]] = {False: [], True: []}
            rates: dict[bool, list[float]] = {False: [], True: []}
            for r in range(rounds):
                for with_id in (r % 2 == 0, r % 2 == 1):
                    where = f"{compute}-{name.replace('.', '-')}-{int(with_id)}-{r}"
                    if name in fills:
                        await rate(engine, fills[name], where, slice_ * 2, workers, False)
                    lat[with_id] += await timed(engine, op, where, slice_, with_id)
                    if name in fills:
                        await rate(engine, fills[name], where + "r", slice_, workers, False)
                    rates[with_id].append(
                        await rate(engine, op, where + "r", slice_, workers, with_id)
                    )
            row = {}
            for with_id in (False, True):
                p50, p99 = pct(lat[with_id], 0.5), pct(lat[with_id], 0.99)
                per_second = statistics.median(rates[with_id])
                row[with_id] = (p50, per_second)
                label = "id" if with_id else "no id"
                print(f"{name:12} {label:8} {p50:8.2f} {p99:8.2f} {per_second:12.0f}")
            print(
                f"{'':12} {'id/no id':8} {row[True][0] / row[False][0]:8.2f} {'':8} "
                f"{row[True][1] / row[False][1]:12.2f}"
            )
    finally:
        await engine.close()
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=1000, help="operations per measurement")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4, help="slices, ids alternating")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        cluster = EtcdCluster(bin_dir() / "etcd", Path(directory), size=3).start()
        try:
            asyncio.run(run(cluster.endpoints, options.ops, options.workers, options.rounds))
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
