"""CLI writes while the hub blinks (issue 39): ``o41 write`` processes, a few at a time,
while the placement service is SIGKILLed and started again and the leader of its 3-member
etcd is killed and restarted, over and over; how many writes exited 1, and why.

Starts a control plane, the S3 stand-in (versitygw), a 3-member etcd, the operator and the
service (all on 127.0.0.1). ``--against DIR`` runs the same writes with the client of
another source tree too (``DIR/src``, e.g. ``git archive 65c0fef src | tar -x -C DIR``:
the client before issue 39), alternated with this tree's in rounds, on the same stack and
under the same faults: before and after in one run.

    .venv/bin/python bench/hub_blink.py [--writes 200] [--parallel 8] [--rounds 1]
        [--against /tmp/before] [--no-etcd-faults]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import ControlPlane, apply, bin_dir, kubectl, service_account_token  # noqa: E402
from testbed.process import Server  # noqa: E402
from testbed.product import (  # noqa: E402
    OperatorProcess,
    PlacementProcess,
    install_crds,
    store_secrets,
)
from testbed.stores import start_s3  # noqa: E402


class Faults(threading.Thread):
    """Until stopped: the service SIGKILLed and started again (it answers again once ready,
    as a Deployment's pod would), then, unless ``etcd`` is None, the etcd leader killed
    and restarted a moment later; ``every`` seconds between faults."""

    def __init__(
        self, service: PlacementProcess, etcd: EtcdCluster | None, every: float = 3.0
    ) -> None:
        super().__init__(daemon=True)
        self.service, self.etcd, self.every = service, etcd, every
        self.stop = threading.Event()
        self.done: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(self.every):
            assert self.service.server is not None
            self.service.server.kill()
            killed = time.monotonic()
            self.service.start()  # waits until /readyz answers
            self.done.append(f"service killed, ready again in {time.monotonic() - killed:.1f} s")
            if self.etcd is None or self.stop.wait(self.every):
                continue
            leader = self.etcd.leader()
            self.etcd.kill(leader)
            self.stop.wait(2.0)
            self.etcd.restart(leader)
            self.done.append(f"etcd leader {leader} killed, restarted 2 s later")


def write(python_path: str, endpoint: str, token: Path, data: Path, env: dict[str, str]) -> str:
    """One ``o41 write``; "" when it exited 0, else its last line on stderr."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "o41.cli", "write", "--org", "bench", "--artifact", "blink"),
            *("--endpoint", endpoint, "--token-file", str(token), str(data), "--json"),
        ],
        env={**env, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode == 0:
        return ""
    lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}, nothing said"]
    return lines[-1]


def kind(error: str) -> str:
    """A failure's kind, for the table."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        error = json.loads(error)["error"]
    for words in (
        "Connection refused",
        "may or may not",
        "etcd did not answer",
        "state store",
        "timed out",
        "reset",
        "did not answer",
    ):
        if words in error:
            return words
    return error[:80]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=200, help="writes per client per round")
    parser.add_argument("--parallel", type=int, default=8, help="o41 write processes at once")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--kib", type=int, default=64, help="each write's size")
    parser.add_argument("--against", help="another source tree (DIR/src): its client too")
    parser.add_argument("--no-etcd-faults", action="store_true", help="kill the service only")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between faults")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="o41-bench-blink-"))
    bins = bin_dir()
    plane = ControlPlane(work / "kube", bins).start()
    s3 = start_s3(work / "s3")
    etcd = EtcdCluster(bins / "etcd", work / "etcd").start()
    started: list[Server] = []
    service: PlacementProcess | None = None
    try:
        kc = plane.kubeconfig
        install_crds(kc)
        store_secrets(kc, s3)
        operator = OperatorProcess(kc, work / "operator", check_interval=60).start()
        assert operator.server is not None
        started.append(operator.server)
        org = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": "bench"},
            "spec": {"namespaces": ["bench"]},
        }
        location = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Location",
            "metadata": {"name": "east"},
            "spec": {
                "organization": "bench",
                "cloud": "aws",
                "region": "us-east-1",
                "backend": {"s3": {"endpoint": s3.endpoint}},
                "credentials": {"secretName": "creds-s3"},
            },
        }
        apply(kc, org, location)
        kubectl(
            kc, "wait", "--for=jsonpath={.status.takesWrites}=true", "organization/bench",
            "--timeout=60s",
        )  # fmt: skip
        service = PlacementProcess(kc, etcd.endpoints, work / "placement").start()
        token = work / "token"
        token.write_text(service_account_token(kc, "bench"))
        data = work / "data"
        data.write_bytes(os.urandom(args.kib * 1024))
        env = {k: v for k, v in os.environ.items() if not k.startswith("O41_ARTIFACTS_")}
        env.update(O41_ARTIFACTS_CLOUD="aws", O41_ARTIFACTS_REGION="us-east-1")
        clients = {"this tree": str(ROOT / "src")}
        if args.against:
            clients = {f"--against {args.against}": str(Path(args.against) / "src"), **clients}
        # warm: one write each, no fault
        for path in clients.values():
            assert write(path, service.url, token, data, env) == "", "a write without faults"

        print(f"{os.cpu_count()} cores; load average before {os.getloadavg()}")
        results: dict[str, list[str]] = {name: [] for name in clients}
        took: dict[str, float] = collections.defaultdict(float)
        faults_done: list[str] = []
        for _ in range(args.rounds):
            for name, path in clients.items():
                faults = Faults(service, None if args.no_etcd_faults else etcd, args.every)
                faults.start()
                started_at = time.monotonic()
                url = service.url
                with ThreadPoolExecutor(args.parallel) as pool:
                    futures = [
                        pool.submit(write, path, url, token, data, env) for _ in range(args.writes)
                    ]
                    errors = [f.result() for f in futures]
                took[name] += time.monotonic() - started_at
                faults.stop.set()
                faults.join(120)
                faults_done += faults.done
                results[name] += errors
                etcd.wait_healthy()
        print(f"load average after {os.getloadavg()}")
        print(
            f"{args.rounds} round(s); each: {args.writes} writes of {args.kib} KiB, "
            f"{args.parallel} at a time, per client; faults every {args.every:g} s"
        )
        print(f"faults: {len(faults_done)}")
        for line in collections.Counter(f.split(",")[0] for f in faults_done).items():
            print(f"  {line[0]}: {line[1]}")
        readies = [
            float(f.rsplit(" in ", 1)[1].split(" s")[0]) for f in faults_done if "ready" in f
        ]
        if readies:
            print(f"  the service ready again after {min(readies):.1f}-{max(readies):.1f} s")
        print(f"{'client':<28} {'writes':>7} {'failed':>7} {'seconds':>8}  why")
        for name, errors in results.items():
            failed = [e for e in errors if e]
            why = collections.Counter(kind(e) for e in failed)
            print(
                f"{name:<28} {len(errors):>7} {len(failed):>7} {took[name]:>8.1f}  "
                + ", ".join(f"{n}x {w}" for w, n in why.most_common())
            )
            for e in failed[:3]:
                print(f"    e.g. {e[:300]}")
    finally:
        if service is not None and service.server is not None:
            service.server.stop()
        for server in reversed(started):
            server.stop()
        etcd.stop()
        s3.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
