"""Issue 41's table in one command: every row side by side with Skyward, in alternations.

Runs ``bench/skyward_side.py`` (under ``--skyward-python``, a Python 3.12 venv with
skyward 0.12.1 and casty 0.30.2: see that file) and ``bench/owners.py --services
before,owners`` one after the other, ``--alternations`` times, then prints for each row of
the issue (one worker: p50 ms; 16 workers: operations a second, hand-overs for the lock)
Skyward's, before's and owners' ranges over the alternations, and ours against Skyward's
*in the same alternation* (above 1: ahead), with its median: on a shared machine the
ratio of runs a minute apart is what holds still. Load averages as each run saw them.

    /work/main/.venv/bin/python bench/skyward_rows.py --before /tmp/o41-main/src \\
        --skyward-python /tmp/sky-venv/bin/python [--alternations 4] [--ops 1200]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

# each operation: Skyward's name for it, ours, and the name for the row of 16
# workers (None: "<operation>, 16 workers")
OPERATIONS = [
    ("strong get", "get", "strong get", None),
    ("strong set", "set", "strong set", None),
    ("counter add", "add", "counter add", None),
    ("queue offer", "offer", "queue offer", None),
    ("queue poll", "poll", "queue poll", None),
    ("lock acquire+release", "lock", "lock acquire+release", "16 workers on one lock"),
]
# (the row, Skyward's op, ours, workers)
ROWS = [
    (f"{what}, 1 worker" if n == 1 else (many or f"{what}, 16 workers"), theirs, ours, n)
    for what, theirs, ours, many in OPERATIONS
    for n in (1, 16)
]
SKYWARD = re.compile(r"skyward strong\s+(\w+)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+(\d+)")
OURS = re.compile(r"(before|owners)\s+(.+?)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+(\d+)\s")
LOAD = re.compile(r"load average at the (start|end): \(([\d.]+)")


@dataclass
class Row:
    """One row's figures, an entry an alternation."""

    skyward: list[float] = field(default_factory=list)
    ours: dict[str, list[float]] = field(default_factory=dict)
    ratio: list[float] = field(default_factory=list)  # owners against Skyward, above 1: ahead


def figures(text: str, pattern: re.Pattern[str]) -> dict[tuple[str, ...], float]:
    """A run's rows: p50 ms for one worker, operations a second for more."""
    found: dict[tuple[str, ...], float] = {}
    for m in pattern.finditer(text):
        *names, workers, p50, rate = m.groups()
        found[(*(n.strip() for n in names), workers)] = float(p50 if workers == "1" else rate)
    return found


def run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout


def span(values: list[float], workers: int) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:.3f}-{high:.3f} ms" if workers == 1 else f"{low:,.0f}-{high:,.0f}/s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the src folder of the 'before' tree")
    parser.add_argument("--skyward-python", required=True, help="Python with skyward, casty")
    parser.add_argument("--alternations", type=int, default=4)
    parser.add_argument("--ops", type=int, default=1200, help="per row and alternation")
    args = parser.parse_args()
    rows = {name: Row() for name, *_ in ROWS}
    loads: list[str] = []
    for _ in range(args.alternations):
        side = run(
            [
                args.skyward_python,
                str(HERE / "skyward_side.py"),
                "--ops",
                str(args.ops),
                "--rounds",
                "2",
            ]
        )
        ours = run(
            [
                sys.executable,
                str(HERE / "owners.py"),
                "--before",
                args.before,
                "--services",
                "before,owners",
                "--ops",
                str(args.ops),
                "--rounds",
                "2",
            ]
        )
        seen = [float(m.group(2)) for m in LOAD.finditer(side + ours)]
        loads.append(f"{seen[0]:.1f} -> {seen[-1]:.1f}" if seen else "?")
        sky, mine = figures(side, SKYWARD), figures(ours, OURS)
        for name, theirs, op, workers in ROWS:
            row, n = rows[name], str(workers)
            for label in ("before", "owners"):
                if (label, op, n) in mine:
                    row.ours.setdefault(label, []).append(mine[(label, op, n)])
            if (theirs, n) in sky and ("owners", op, n) in mine:
                a, b = sky[(theirs, n)], mine[("owners", op, n)]
                row.skyward.append(a)
                row.ratio.append(a / b if workers == 1 else b / a)
        print(f"alternation {len(loads)} done, load {loads[-1]}", flush=True)
    print(f"\nload averages (start -> end of each alternation): {', '.join(loads)}")
    print("| row | Skyward | before | owners | owners / Skyward (median) |")
    print("|---|---|---|---|---|")
    for name, _, _, workers in ROWS:
        row = rows[name]
        ratio = (
            f"{min(row.ratio):.2f}-{max(row.ratio):.2f}x ({statistics.median(row.ratio):.2f})"
            if row.ratio
            else "-"
        )
        print(
            f"| {name} | {span(row.skyward, workers)} | {span(row.ours.get('before', []), workers)}"
            f" | {span(row.ours.get('owners', []), workers)} | {ratio} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
