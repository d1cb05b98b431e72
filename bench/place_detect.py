"""How long a pod waits for its place, and what importing the client costs at start-up.

    .venv/bin/python bench/place_detect.py [--runs N] [--import-runs N]

Detection runs with the cache reset before each run, against a tmp DMI directory and
loopback metadata fakes only (testbed/metadata.py): nothing leaves 127.0.0.1.
Import times are wall-clock times of a fresh interpreter, next to ``python -c pass``
(the floor), plus ``-X importtime``'s cumulative figure for the module itself. Bytecode
is cached in a tmp dir (``PYTHONPYCACHEPREFIX``), as for an installed package, even where
PYTHONDONTWRITEBYTECODE is set.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from o41.client import place  # noqa: E402
from testbed.metadata import AwsImds, AzureImds, GcpMetadata, closed_port_url  # noqa: E402

PYCACHE = tempfile.mkdtemp(prefix="o41-place-bench-pycache-")
PLACE_VARS = (place.ENV_CLOUD, place.ENV_REGION, place.ENV_SKYPILOT)
URL_VARS = (place.ENV_AWS_URL, place.ENV_GCP_URL, place.ENV_AZURE_URL)


def quantiles(samples: list[float]) -> tuple[float, float]:
    """Median and p95 of ``samples`` (seconds)."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def report(what: str, samples: list[float], suffix: str = "") -> None:
    median, p95 = quantiles(samples)
    print(
        f"{what:<44} median {median * 1e3:8.3f} ms  p95 {p95 * 1e3:8.3f} ms"
        f"  (n={len(samples)}){suffix}"
    )


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` (and clear the place variables) for the block, then restore."""
    names = set(values) | set(PLACE_VARS)
    saved = {name: os.environ.get(name) for name in names}
    for name in PLACE_VARS:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def time_detection(runs: int, check: Callable[[], None]) -> list[float]:
    samples = []
    for _ in range(runs):
        place.reset()
        started = time.perf_counter()
        place.detect_place()
        samples.append(time.perf_counter() - started)
    check()
    place.reset()
    return samples


def bench_detection(runs: int, metadata_runs: int, dmi_root: Path) -> None:
    closed = closed_port_url()
    no_cloud = dmi_root / "qemu"
    no_cloud.mkdir()
    (no_cloud / "sys_vendor").write_text("QEMU\n")
    (no_cloud / "product_name").write_text("Standard PC (Q35 + ICH9, 2009)\n")
    base = {place.ENV_DMI_DIR: str(no_cloud), **dict.fromkeys(URL_VARS, closed)}

    def expect(cloud: str | None, region: str | None, source: str) -> Callable[[], None]:
        def check() -> None:
            got = place.detect_place()
            assert (got.cloud, got.region, got.source) == (cloud, region, source), got

        return check

    env = {place.ENV_CLOUD: "aws", place.ENV_REGION: "us-east-1"}
    with environment({**base, **env}):
        report("env answers", time_detection(runs, expect("aws", "us-east-1", "env")))
    with environment(base):
        report("DMI names no cloud (none)", time_detection(runs, expect(None, None, "none")))

    clouds = [
        ("aws", "Amazon EC2", "sys_vendor", AwsImds("eu-west-1"), place.ENV_AWS_URL),
        ("gcp", "Google Compute Engine", "product_name", GcpMetadata(), place.ENV_GCP_URL),
        ("azure", place.AZURE_CHASSIS_TAG, "chassis_asset_tag", AzureImds(), place.ENV_AZURE_URL),
    ]
    for cloud, value, key, fake, var in clouds:
        dmi = dmi_root / cloud
        dmi.mkdir()
        (dmi / key).write_text(value + "\n")
        with fake, environment({**base, place.ENV_DMI_DIR: str(dmi), var: fake.url}):
            region = {"aws": "eu-west-1", "gcp": "us-central1", "azure": "westeurope"}[cloud]
            samples = time_detection(metadata_runs, expect(cloud, region, "metadata"))
            report(f"{cloud} metadata fake answers ({fake.count // metadata_runs} req)", samples)


def run_python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with bytecode cached outside the tree, as an installed package."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONPYCACHEPREFIX": PYCACHE}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )


def importtime(module: str, runs: int) -> tuple[list[float], list[float]]:
    """``-X importtime``'s self and cumulative times for ``module``, in seconds."""
    own: list[float] = []
    cumulative: list[float] = []
    for _ in range(runs):
        err = run_python(f"import {module}", "-X", "importtime").stderr
        for line in err.splitlines():
            parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
            if len(parts) == 3 and parts[2] == module:
                own.append(int(parts[0]) / 1e6)
                cumulative.append(int(parts[1]) / 1e6)
    return own, cumulative


def bench_imports(runs: int) -> None:
    """Fresh interpreters, interleaved so the floor and each import see the same load."""
    run_python("import o41.cli, o41.client.place")  # warm the bytecode cache once
    codes = {
        "python -c pass (floor)": "pass",
        "python -c 'import o41.core.places'": "import o41.core.places",
        "python -c 'import o41.client.place'": "import o41.client.place",
        "python -c 'import o41.cli'": "import o41.cli",
    }
    samples: dict[str, list[float]] = {label: [] for label in codes}
    for _ in range(runs):
        for label, code in codes.items():
            started = time.perf_counter()
            run_python(code)
            samples[label].append(time.perf_counter() - started)
    floor = statistics.median(samples["python -c pass (floor)"])
    for label, times in samples.items():
        over = statistics.median(times) - floor
        report(label, times, suffix="" if "floor" in label else f"  +{over * 1e3:.1f} ms")
    for module in ("o41.core.places", "o41.client.place", "o41.cli"):
        own, cumulative = importtime(module, runs)
        report(f"-X importtime self {module}", own)
        report(f"-X importtime cumulative {module}", cumulative)
    code = (
        "import sys, o41.cli, o41.client.place\n"
        "heavy = ('aiohttp', 'boto3', 'google', 'azure', 'kubernetes', 'http', 'ssl')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    print(f"{'heavy modules after both imports':<44} {run_python(code).stdout.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="detections per no-network case")
    parser.add_argument("--metadata-runs", type=int, default=100, help="detections per fake")
    parser.add_argument("--import-runs", type=int, default=30, help="fresh interpreters each")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]} on {sys.platform}")
    with tempfile.TemporaryDirectory(prefix="o41-place-bench-") as tmp:
        bench_detection(args.runs, args.metadata_runs, Path(tmp))
    try:
        bench_imports(args.import_runs)
    finally:
        shutil.rmtree(PYCACHE, ignore_errors=True)


if __name__ == "__main__":
    main()
