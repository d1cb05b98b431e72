"""What a strong set or get would cost through a service not written in Python (issue 41).

Starts a 3-member etcd on 127.0.0.1, the collections service (``python -m
o41.webhook.collections``, owners off: a strong set is one etcd ``Put``, a strong get one
linearizable ``Range``) and ``bench/go_hop/``, a Go stand-in that speaks the same
WebSocket protocol for a dict's set and get and makes the same one etcd call per
operation with etcd's own Go client (no tenants, quota or owners: the least such a
service could do). The same o41.sky client measures both, 1 and ``--workers`` workers,
in alternated rounds: p50, p99, operations a second.

The gap between the two is what the Python service and its gRPC client cost; Skyward's
figures for the same rows come from ``bench/skyward_side.py`` (run it alongside).

    .venv/bin/python bench/go_hop.py [--ops 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench.go_build import build  # noqa: E402
from bench.sky_collections import Result, Service, dict_get, dict_set  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402
from testbed.process import LOOPBACK, Server, free_port, port_open  # noqa: E402
from testbed.product import CollectionsProcess  # noqa: E402

OPERATIONS = (("strong set", dict_set("strong")), ("strong get", dict_get("strong")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=2000, help="per row, over all rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    per_round = args.ops // args.rounds
    with tempfile.TemporaryDirectory(prefix="o41-go-hop-") as tmp:
        program = build("go_hop", Path(tmp))
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd", size=3).start()
        port = free_port()
        go = Server(
            "go stand-in",
            [str(program), f"{LOOPBACK}:{port}", cluster.endpoints[cluster.leader()]],
            Path(tmp) / "go.log",
        )
        python = CollectionsProcess(cluster.endpoints, Path(tmp) / "python.log")
        try:
            go.start()
            go.wait_ready(lambda: port_open(port), timeout=60)
            python.start()
            print(f"load average at the start: {os.getloadavg()}", flush=True)
            services = {"go": Service(f"http://{LOOPBACK}:{port}"), "python": Service(python.url)}
            rows = [
                (label, what, n, svc.measure(what, n, op))
                for n in (1, args.workers)
                for what, op in (
                    ("strong set", dict_set("strong")),
                    ("strong get", dict_get("strong")),
                )
                for label, svc in services.items()
            ]
            for *_, measure in rows:
                measure(max(args.workers, 32))  # connect, write the keys the gets read
            pooled: dict[tuple[str, str, int], list[Result]] = {}
            for _ in range(args.rounds):
                for label, what, n, measure in rows:
                    pooled.setdefault((label, what, n), []).append(measure(per_round))
            print(f"load average at the end: {os.getloadavg()}")
        finally:
            python.stop()
            go.stop()
            cluster.stop()
    print(f"{args.rounds} alternated rounds of {per_round} operations each, pooled")
    print(
        f"{'service':<8} {'operation':<12} {'workers':>7} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>8}"
    )
    for (label, what, n), parts in pooled.items():
        r = Result.merged(parts)
        print(f"{label:<8} {what:<12} {n:>7} {r.p50:>8.3f} {r.pct(99):>8.3f} {r.rate:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
