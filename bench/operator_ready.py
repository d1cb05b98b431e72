"""How fast a Location becomes Ready, and what the operator costs in memory.

Starts its own control plane, S3 stand-in and operator (all on 127.0.0.1), then prints:
- time from `kubectl apply` of one Location to Ready (median, p95), next to the floor:
  `kubectl apply` alone, and one bare create_bucket against the same stand-in;
- 200 Locations applied at once: time until all are Ready;
- the operator's resident memory at rest and after the 200.

    .venv/bin/python bench/operator_ready.py [--single 20] [--bulk 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from kubernetes import client, config, watch  # noqa: E402

from testbed.kube import ControlPlane, Kube, bin_dir  # noqa: E402
from testbed.product import OperatorProcess, store_secrets  # noqa: E402
from testbed.stores import start_s3  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class ReadyWatch:
    """Records when each Location first shows Ready=True, from a watch (no polling lag)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.ready: dict[str, float] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # the control plane stops at the end of the bench
            return

    def _watch(self) -> None:
        objects = client.CustomObjectsApi(self.api)
        for event in watch.Watch().stream(  # type: ignore[no-untyped-call]
            objects.list_cluster_custom_object, "artifacts.o41.io", "v1alpha1", "locations"
        ):
            obj: dict[str, Any] = event["object"]
            conditions = obj.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                with self.cond:
                    self.ready.setdefault(obj["metadata"]["name"], time.monotonic())
                    self.cond.notify_all()

    def wait(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.ready for n in names):
                if not self.cond.wait(deadline - time.monotonic()):
                    raise TimeoutError(f"{sum(n in self.ready for n in names)} of {len(names)}")


def location(name: str, org: str, endpoint: str, region: str) -> dict[str, Any]:
    return {
        "apiVersion": "artifacts.o41.io/v1alpha1",
        "kind": "Location",
        "metadata": {"name": name},
        "spec": {
            "organization": org,
            "cloud": "aws",
            "region": region,
            "backend": {"s3": {"endpoint": endpoint}},
            "credentials": {"secretName": "creds-s3"},
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--single", type=int, default=20)
    parser.add_argument("--bulk", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="o41-bench-operator-"))
    plane = ControlPlane(work / "kube", bin_dir()).start()
    s3 = start_s3(work / "s3")
    operator: OperatorProcess | None = None
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))  # type: ignore[no-untyped-call]
        kube = Kube(plane.kubeconfig, api)
        kube.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        kube.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        store_secrets(plane.kubeconfig, s3)
        operator = OperatorProcess(plane.kubeconfig, work / "operator", check_interval=60).start()
        assert operator.server is not None
        time.sleep(3)  # let it settle before reading its memory at rest
        rest = rss_mb(operator.server.pid)
        watcher = ReadyWatch(api)
        org = "bench"
        kube.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "artifacts.o41.io/v1alpha1",
                    "kind": "Organization",
                    "metadata": {"name": org},
                    "spec": {"namespaces": ["default"]},
                }
            ),
        )

        # the floor: kubectl apply alone (a ConfigMap), and one bare bucket creation
        floor_apply = []
        for i in range(args.single):
            start = time.monotonic()
            kube.kubectl("create", "configmap", f"floor-{i}", "--from-literal=a=b")
            floor_apply.append(time.monotonic() - start)
        floor_bucket = []
        s3c = s3.client()
        for i in range(args.single):
            start = time.monotonic()
            s3c.create_bucket(Bucket=f"floor-{i}-{uuid.uuid4().hex[:6]}")
            floor_bucket.append(time.monotonic() - start)

        single = []
        for i in range(args.single):
            name = f"one-{i}"
            start = time.monotonic()
            kube.kubectl(
                "apply", "-f", "-", input=json.dumps(location(name, org, s3.endpoint, "us-east-1"))
            )
            watcher.wait([name], timeout=60)
            single.append(watcher.ready[name] - start)

        regions = ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-south-1"]
        names = [f"bulk-{i}" for i in range(args.bulk)]
        items = [location(n, org, s3.endpoint, regions[i % 5]) for i, n in enumerate(names)]
        start = time.monotonic()
        kube.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        applied = time.monotonic() - start
        watcher.wait(names, timeout=600)
        bulk = max(watcher.ready[n] for n in names) - start
        after = rss_mb(operator.server.pid)

        def row(label: str, values: list[float]) -> str:
            median, p95 = statistics.median(values) * 1000, pct(values, 95) * 1000
            return f"{label:<40} median {median:7.0f} ms  p95 {p95:7.0f} ms"

        print(f"{os.cpu_count()} cores")
        print(row("floor: kubectl create configmap", floor_apply))
        print(row("floor: create_bucket on the stand-in", floor_bucket))
        print(row(f"apply -> Ready, one Location (n={args.single})", single))
        print(
            f"{args.bulk} Locations at once: applied in {applied:.1f} s, Ready after {bulk:.1f} s"
        )
        total = args.single + args.bulk
        print(f"operator RSS at rest {rest:.0f} MB, after {total} Locations {after:.0f} MB")
    finally:
        if operator is not None:
            operator.stop()
        s3.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
