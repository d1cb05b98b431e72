"""Owners (issue 41) before and after, in one run: three collections services on one
3-member etcd (127.0.0.1), measured in alternated rounds with the same client:

- ``before``: the service of another source tree (``--before``, e.g. an export of main:
  ``git archive <commit> src | tar -x -C /tmp/o41-main``), no owners, no guard;
- ``guarded``: this tree with ``O41_COLLECTIONS_OWNERS=guard`` (every write carries the
  owner guard, nobody owns: what the guard costs);
- ``owners``: this tree with ``O41_COLLECTIONS_OWNERS=on`` (the replica owns the dicts
  it reads). (``off``, the default, is ``before``'s code path.)

For each, p50/p99 and throughput of strong get and set, eventual get, counter add, a
lock's acquire+release (with ``--workers``: that many on one lock, hand-overs a second) and
a queue's offer and poll (of a queue filled first), 1 and ``--workers`` workers (the
o41.sky client over its WebSocket, one connection per worker thread), and the CPU each
service process and etcd's three members spent per operation (from /proc; a poll's
includes the offers that fill its queue before the round's clock starts). Raw etcd puts
and gets on the leader are measured in the same rounds for reference. Prints the load
average before and after.

    .venv/bin/python bench/owners.py --before /tmp/o41-main/src [--ops 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench.sky_collections import (  # noqa: E402
    RawEtcd,
    Result,
    Service,
    counter_add,
    dict_get,
    dict_set,
    lock_cycle,
    queue_offer,
    queue_poll,
)
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402
from testbed.product import CollectionsProcess  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="the src folder of the 'before' tree")
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--services", default="before,guarded,owners", help="which of them, comma-separated"
    )
    parser.add_argument(
        "--rows", default="", help="only these operations, comma-separated (strong get,...)"
    )
    args = parser.parse_args()
    chosen = args.services.split(",")
    only = [r for r in args.rows.split(",") if r]
    per_round = args.ops // args.rounds
    print(f"load average at the start: {os.getloadavg()}")

    with tempfile.TemporaryDirectory(prefix="o41-owners-") as tmp:
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd", size=3)
        cluster.start()
        services = {
            "before": CollectionsProcess(
                cluster.endpoints, Path(tmp) / "before.log", env={"PYTHONPATH": args.before}
            ),
            "guarded": CollectionsProcess(
                cluster.endpoints,
                Path(tmp) / "guarded.log",
                env={"O41_COLLECTIONS_OWNERS": "guard"},
            ),
            "owners": CollectionsProcess(
                cluster.endpoints, Path(tmp) / "owners.log", env={"O41_COLLECTIONS_OWNERS": "on"}
            ),
        }
        raw: RawEtcd | None = None
        try:
            services = {label: s for label, s in services.items() if label in chosen}
            for s in services.values():
                s.start()
            raw = RawEtcd(cluster.endpoints[cluster.leader()], None)
            etcd_pids = [m.pid for m in cluster.members]
            rows: list[tuple[str, str, int, Callable[[int], Result], int]] = []
            for n in (1, args.workers):
                rows.append(("raw etcd", "get", n, raw.measure("raw get", n, "get"), 0))
                rows.append(("raw etcd", "put", n, raw.measure("raw put", n, "put"), 0))
                for label, s in services.items():
                    assert s.server is not None
                    pid = s.server.pid
                    # a compute each: the services share etcd, and one from before the
                    # owners writes without their guard (as no replica may mid-way
                    # through a rolling update, docs/collections.md)
                    svc = Service(s.url, f"bench-{label}")
                    ops: list[tuple[str, Callable[..., object]]] = [
                        ("strong get", dict_get("strong")),
                        ("strong set", dict_set("strong")),
                        ("eventual get", dict_get("eventual")),
                        ("counter add", counter_add("strong")),
                        ("lock acquire+release", lock_cycle(f"bench-lock-{n}")),
                        ("queue offer", queue_offer(f"bench-offers-{n}")),
                        # each worker first offers what it polls in the round (untimed)
                        ("queue poll", queue_poll(f"bench-polls-{n}", per_round // n + 1)),
                    ]
                    for what, op in ops:
                        if only and what not in only:
                            continue
                        rows.append((label, what, n, svc.measure(what, n, op), pid))
            # warm: the service reads each dict once (the owner is elected), every client connects
            for _, _, _, measure, _ in rows:
                measure(max(args.workers, 32))
            pooled: dict[tuple[str, str, int], list[Result]] = {}
            cpu: dict[tuple[str, str, int], list[float]] = {}
            for _ in range(args.rounds):
                for label, what, n, measure, pid in rows:
                    before_cpu = cpu_seconds(pid) if pid else 0.0
                    before_etcd = sum(cpu_seconds(p) for p in etcd_pids)
                    result = measure(per_round)
                    spent = [
                        (cpu_seconds(pid) - before_cpu) if pid else 0.0,
                        sum(cpu_seconds(p) for p in etcd_pids) - before_etcd,
                    ]
                    pooled.setdefault((label, what, n), []).append(result)
                    acc = cpu.setdefault((label, what, n), [0.0, 0.0, 0.0])
                    acc[0] += spent[0]
                    acc[1] += spent[1]
                    acc[2] += len(result.latencies)
        finally:
            if raw is not None:
                raw.close()
            for s in services.values():
                s.stop()
            cluster.stop()

    print(f"load average at the end: {os.getloadavg()}")
    print(
        f"{args.rounds} alternated rounds of {per_round} operations each, pooled; CPU per "
        "operation from /proc (the service process; etcd: its three members)"
    )
    header = f"{'':<10} {'operation':<22} {'workers':>7} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>8}"
    print(header + f" {'svc us/op':>10} {'etcd us/op':>10}")
    for key, parts in pooled.items():
        label, what, n = key
        r = Result.merged(parts)
        svc_cpu, etcd_cpu, count = cpu[key]
        print(
            f"{label:<10} {what:<22} {n:>7} {r.p50:>8.3f} {r.pct(99):>8.3f} {r.rate:>8.0f}"
            f" {svc_cpu / count * 1e6 if label != 'raw etcd' else 0:>10.0f}"
            f" {etcd_cpu / count * 1e6:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
