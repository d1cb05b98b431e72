"""What issue 39 costs when nothing fails: small writes (begin, the PUT, commit) and strong
counter adds through this tree's client (retries, timeouts, operation ids), the same
without operation ids, and through the client of another tree (``--against DIR``:
``DIR/src``, e.g. the client before issue 39, ``git archive 65c0fef src | tar -x -C
DIR``), against the same service, same run.

The service is bench/directories.py's (the real app on 127.0.0.1, the embedded store, one
Location on versitygw). Each client runs in a process of its own, rounds alternate, and
each round prints the per-operation p50 and the load average; then the medians.

    .venv/bin/python bench/retry_cost.py --against /tmp/before [--writes 200] [--adds 2000]
        [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.directories import serve  # noqa: E402  # its service on versitygw

CLIENT = r"""
import json, sys, time
from o41 import artifacts
from o41.core.places import Place
endpoint, token, writes, adds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = artifacts.Client(endpoint, token, Place("aws", "us-east-1", "env"), 30)
if sys.argv[5:] == ["no-ids"]:  # this tree's retries without operation ids
    client.connection.operation_ids = False
data = b"x" * 1024
client.write("ml", "warm", data)
times = {"write": [], "counter.add": []}
for _ in range(writes):
    t = time.perf_counter(); client.write("ml", "small", data)
    times["write"].append(time.perf_counter() - t)
counter = client.collections.counter("steps")
counter.add(1)
for _ in range(adds):
    t = time.perf_counter(); counter.add(1)
    times["counter.add"].append(time.perf_counter() - t)
print(json.dumps(times))
"""


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def work(args: argparse.Namespace, endpoint: str, s3: Any, tmp: Path) -> None:
    token = tmp / "token"
    token.write_text("token-team-a")
    trees = {
        "this tree": ROOT / "src",
        "this tree, no ids": ROOT / "src",
        f"--against {args.against}": Path(args.against) / "src",
    }
    got: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            env = {
                **os.environ,
                "PYTHONPATH": str(trees[name]),
                "O41_ARTIFACTS_CACHE": "off",
                "O41_ARTIFACTS_PROGRESS": "0",
                "NO_PROXY": "*",
            }
            load = os.getloadavg()[0]
            done = subprocess.run(
                [sys.executable, "-c", CLIENT, endpoint, str(token), str(args.writes),
                 str(args.adds), *(["no-ids"] if name.endswith("no ids") else [])],
                env=env, capture_output=True, text=True, check=True, timeout=900,
            )  # fmt: skip
            times = json.loads(done.stdout.strip().splitlines()[-1])
            for op, values in times.items():
                got[name].setdefault(op, []).append(p50_ms(values))
            print(
                f"  round {r + 1} {name:<28} "
                + "  ".join(f"{op} p50 {p50_ms(v):6.3f} ms" for op, v in times.items())
                + f"  load {load:.2f}",
                flush=True,
            )
    print(f"p50 per operation, median of {args.rounds} alternated rounds")
    for name, ops in got.items():
        print(
            f"  {name:<28} "
            + "  ".join(f"{op} {statistics.median(v):6.3f} ms" for op, v in ops.items())
        )
    theirs = got[f"--against {args.against}"]
    for name in ("this tree", "this tree, no ids"):
        for op, values in got[name].items():
            ratio = statistics.median(values) / statistics.median(theirs[op])
            print(f"  {op}: {name} / the other = {ratio:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="another source tree (DIR/src)")
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--adds", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    args.files, args.size = 0, 0
    asyncio.run(serve(args, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
