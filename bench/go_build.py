"""The benches' Go programs (``bench/<name>/``), built for one run with the local toolchain
(modules from the Go proxy; ``bench/etcd_floor.py``, ``bench/go_hop.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(name: str, into: Path) -> Path:
    """``go build`` of ``bench/<name>/`` into the folder ``into``: the program's path."""
    program = into / name
    subprocess.run(
        ["go", "build", "-o", str(program), "."],
        cwd=HERE / name,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"},
    )
    return program
