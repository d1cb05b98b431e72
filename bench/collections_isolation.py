"""Isolation in the hub (issue 40, point 3): the placement service's begin and commit
while a job floods its collections, with the collections in the index's etcd (one shared
etcd, as today) and in an etcd of their own (``--collections-etcd``), one run.

Starts, all on 127.0.0.1 and stopped by pid at the end: a control plane, the S3 stand-in
(versitygw, the writes' bytes go to its gateway's own port), the CRDs, the operator (an
Organization and a Location that takes writes), the index's 3-member etcd, the
collections' 3-member etcd, and two hubs (the real ``python -m o41.webhook``, TokenReview):
``shared`` on the index's etcd alone, ``apart`` with ``--collections-etcd`` too.

Phases, one after the other in each of ``--rounds`` rounds (the order turned every round):
- ``quiet/shared``, ``quiet/apart``: the begin/commit load alone, on each hub;
- ``flood/shared``, ``flood/apart``: the same load while ``--flood-workers`` (16) workers
  hammer a strong counter (half of them: ``add(1)``) and a strong queue (the others:
  ``offer`` then ``poll``) through the same hub, each its own WebSocket (the real client,
  in a process of its own, started for the phase and stopped by its pid after it).
The load: ``--writers`` concurrent writers, each looping begin (``POST /v1/writes``, 1 KiB
declared with its MD5), the PUT of the bytes to the signed URL (not timed), and commit
(``POST /v1/writes/{version}/commit``) for ``--seconds``; begin's and commit's p50/p99 are
of every round's requests pooled, and how many operations the flood made a second.

``--flood-via replica``: the flood goes to a second replica of each hub (same etcds)
instead of the measured one: what the etcd alone carries over, without the replica's own
CPU shared with the flood.

Printed: each phase's p50/p99, the flood's rate, the CPU (in cores, from /proc) the
index's etcd, the collections' etcd and the measured hub spent during it; the ratios
flood/quiet for each layout, apart/shared under flood; the load average at the start and
the end. The flood's hub has no rate limit
(``O41_COLLECTIONS_RATE_OPS=0``): one token's 5,000 a second would otherwise cap it.

The machine is the limit of what this shows: the etcds, the hubs, the flood and the
writers share the same cores, so a flood takes CPU from the index's etcd whichever etcd it
writes to; what an etcd apart removes is the flood's share of the index's Raft log, its
disk (none here: ``--unsafe-no-fsync``) and its leader's queue.

    PYTHONPATH=src:. .venv/bin/python bench/collections_isolation.py [--seconds 6]
        [--rounds 5] [--writers 4] [--flood-workers 16] [--flood-via same|replica]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import aiohttp  # noqa: E402

from bench.collections_tier import TREE_ENV, client  # noqa: E402
from bench.owners import cpu_seconds  # noqa: E402
from bench.sky_collections import Result  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import ControlPlane, apply, bin_dir, kubectl, service_account_token  # noqa: E402
from testbed.product import OperatorProcess, PlacementProcess, install_crds, store_secrets  # noqa: E402
from testbed.stores import start_s3  # noqa: E402

NAMESPACE = "bench"
SIZE = 1024
NO_RATE = {"O41_COLLECTIONS_RATE_OPS": "0", "O41_COLLECTIONS_RATE_BYTES": "0"}

# ---------------------------------------------------------------------------- the flood


def flood(spec: dict[str, Any]) -> None:
    """The flood, in a process of its own: ``workers`` threads, each the real client on a
    WebSocket of its own; half add to one counter, half offer to and poll one queue. Says
    ``ready`` once every worker made its first operation, runs ``seconds``, then prints
    how many operations were made and stops."""
    workers, seconds = int(spec["workers"]), float(spec["seconds"])
    go, stop = threading.Event(), threading.Event()
    counts = [0] * workers
    ready = threading.Barrier(workers + 1)
    errors: list[str] = []

    def work(w: int) -> None:
        c = client(spec["url"], spec["token"], "flood")
        counter, queue = c.counter("flood"), c.queue("flood")

        def one() -> None:
            if w % 2 == 0:
                counter.add(1)
            else:
                queue.offer(b"x" * 64)
                queue.poll()

        try:
            one()
        except Exception as e:  # said once ready: the phase then has no flood
            errors.append(f"{type(e).__name__}: {e}")
        ready.wait()
        go.wait()
        n = 0
        while not stop.is_set():
            try:
                one()
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.1)
                continue
            n += 1 if w % 2 == 0 else 2
        counts[w] = n

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    ready.wait()
    print("ready", flush=True)
    began = time.monotonic()
    go.set()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(30)
    took = time.monotonic() - began
    print(json.dumps({"ops": sum(counts), "seconds": took, "errors": errors[:5]}), flush=True)


class Flood:
    """The flood's process, started for one phase, stopped by its pid."""

    def __init__(self, url: str, token: str, workers: int, seconds: float) -> None:
        spec = {"url": url, "token": token, "workers": workers, "seconds": seconds}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--flood-child", json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **TREE_ENV},
            start_new_session=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"the flood did not start: {line!r}")

    def result(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        out, _ = self.process.communicate(timeout=timeout)
        found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


# ------------------------------------------------------------------------- the writers


async def writes(
    url: str, token: str, writers: int, seconds: float
) -> tuple[list[float], list[float], int]:
    """``writers`` loops of begin, PUT, commit for ``seconds``: (begin latencies, commit
    latencies, failures)."""
    data = os.urandom(SIZE)
    md5 = hashlib.md5(data).hexdigest()
    begin_body = {
        "organization": "bench",
        "artifact": "isolation",
        "size": SIZE,
        "md5": md5,
        "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
    }
    headers = {"Authorization": f"Bearer {token}"}
    begins: list[float] = []
    commits: list[float] = []
    failed = 0
    problems: list[str] = []
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * writers)) as s:

        async def one() -> None:
            nonlocal failed
            while time.monotonic() < stop:
                t = time.perf_counter()
                async with s.post(f"{url}/v1/writes", json=begin_body, headers=headers) as r:
                    answer = await r.read()
                    if r.status >= 300:
                        failed += 1
                        problems.append(f"begin {r.status}: {answer[:200]!r}")
                        await asyncio.sleep(0.1)
                        continue
                begins.append(time.perf_counter() - t)
                began = json.loads(answer)
                put = began["upload"]["single"]
                async with s.put(put["url"], data=data, headers=put["headers"]) as r:
                    put_answer = await r.read()
                    if r.status >= 300:
                        failed += 1
                        problems.append(f"PUT {r.status}: {put_answer[:200]!r}")
                        continue
                t = time.perf_counter()
                commit = f"{url}/v1/writes/{began['version']}/commit"
                async with s.post(commit, json={"md5": md5}, headers=headers) as r:
                    answer = await r.read()
                    if r.status >= 300:
                        failed += 1
                        problems.append(f"commit {r.status}: {answer[:200]!r}")
                        continue
                commits.append(time.perf_counter() - t)

        await asyncio.gather(*(one() for _ in range(writers)))
    if problems:
        print(f"  {len(problems)} failed, e.g. {problems[0]}", flush=True)
    return begins, commits, failed


# ---------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=6.0, help="of each phase")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writers", type=int, default=4, help="concurrent begin/commit loops")
    parser.add_argument("--flood-workers", type=int, default=16)
    parser.add_argument("--flood-via", choices=["same", "replica"], default="same")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--flood-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood_child:
        flood(json.loads(args.flood_child))
        return 0

    print(f"{os.cpu_count()} CPUs; load average at the start {os.getloadavg()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="o41-bench-isolation-"))
    bins = bin_dir()
    stoppable: list[Any] = []
    try:
        plane = ControlPlane(work / "kube", bins)
        stoppable.append(plane)
        plane.start()
        s3 = start_s3(work / "s3")
        stoppable.append(s3)
        kc = plane.kubeconfig
        install_crds(kc)
        store_secrets(kc, s3)
        operator = OperatorProcess(kc, work / "operator", check_interval=60)
        stoppable.append(operator)
        operator.start()
        gateway = s3.gateway("us-east-1")  # its own port: the region router is Python
        apply(
            kc,
            {
                "apiVersion": "artifacts.o41.io/v1alpha1",
                "kind": "Organization",
                "metadata": {"name": "bench"},
                "spec": {"namespaces": [NAMESPACE]},
            },
            {
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
            },
        )
        kubectl(
            kc, "wait", "--for=jsonpath={.status.takesWrites}=true", "organization/bench",
            "--timeout=60s",
        )  # fmt: skip
        index = EtcdCluster(bins / "etcd", work / "etcd-index", size=3)
        stoppable.append(index)
        index.start()
        apart = EtcdCluster(bins / "etcd", work / "etcd-collections", size=3)
        stoppable.append(apart)
        apart.start()
        layouts = {
            "shared": (),
            "apart": ("--collections-etcd", ",".join(apart.endpoints)),
        }
        hubs: dict[str, PlacementProcess] = {}
        flooded: dict[str, PlacementProcess] = {}
        env = {**TREE_ENV, **NO_RATE}
        for layout, extra in layouts.items():
            replicas = 2 if args.flood_via == "replica" else 1
            for n in range(replicas):
                hub = PlacementProcess(
                    kc, index.endpoints, work / f"hub-{layout}-{n}", env=env, extra=extra
                )
                stoppable.append(hub)
                hub.start()
                hubs.setdefault(layout, hub)
                flooded[layout] = hub  # the second replica, when there is one
        token = service_account_token(kc, NAMESPACE)
        for hub in hubs.values():  # warm: connections, the view's caches
            asyncio.run(writes(hub.url, token, 2, 1.0))
        phases = [(q, layout) for q in ("quiet", "flood") for layout in layouts]
        pooled: dict[tuple[str, str], list[tuple[list[float], list[float], int]]] = {}
        rates: dict[str, list[float]] = {layout: [] for layout in layouts}
        load_start = os.getloadavg()
        # CPU seconds spent during each phase by: the index's etcd (3 members), the
        # collections' etcd apart, the measured hub
        groups = {
            "index etcd": [m.pid for m in index.members],
            "collections etcd": [m.pid for m in apart.members],
        }
        cpu: dict[tuple[str, str], dict[str, float]] = {}
        for r in range(args.rounds):
            order = phases[r % len(phases) :] + phases[: r % len(phases)]
            for q, layout in order:
                url = hubs[layout].url
                running = None
                if q == "flood":
                    running = Flood(
                        flooded[layout].url, token, args.flood_workers, args.seconds + 0.5
                    )
                measured_hub = hubs[layout].server
                assert measured_hub is not None
                pids = {**groups, "hub": [measured_hub.pid]}
                spent = {name: sum(cpu_seconds(p) for p in found) for name, found in pids.items()}
                started = time.monotonic()
                try:
                    measured = asyncio.run(writes(url, token, args.writers, args.seconds))
                    took = time.monotonic() - started
                    acc = cpu.setdefault((q, layout), {"seconds": 0.0})
                    acc["seconds"] += took
                    for name, found in pids.items():
                        now = sum(cpu_seconds(p) for p in found)
                        acc[name] = acc.get(name, 0.0) + now - spent[name]
                    if running is not None:
                        done = running.result(timeout=60)
                        rates[layout].append(done["ops"] / done["seconds"])
                        if done["errors"]:
                            print(f"  the flood's errors ({layout}): {done['errors']}")
                finally:
                    if running is not None:
                        running.stop()
                pooled.setdefault((q, layout), []).append(measured)
                b, c, f = measured
                print(
                    f"round {r + 1} {q}/{layout}: {len(b)} begins, {len(c)} commits, {f} "
                    f"failed; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        load_end = os.getloadavg()
    finally:
        for part in reversed(stoppable):
            part.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)

    report(pooled, rates, cpu, args, load_start, load_end)
    return 0


def report(
    pooled: dict[tuple[str, str], list[tuple[list[float], list[float], int]]],
    rates: dict[str, list[float]],
    cpu: dict[tuple[str, str], dict[str, float]],
    args: argparse.Namespace,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> None:
    def result(key: tuple[str, str], which: int) -> Result:
        latencies = [x for part in pooled[key] for x in (part[0] if which == 0 else part[1])]
        return Result("", args.writers, latencies, 1.0)

    print()
    print(
        f"bench/collections_isolation.py: {args.rounds} rounds of 4 phases of "
        f"{args.seconds:g} s, {args.writers} writers (begin, PUT 1 KiB, commit) on one hub; "
        f"flood: {args.flood_workers} workers on a strong counter and a strong queue through "
        f"{'the same hub' if args.flood_via == 'same' else 'a second replica of the hub'}; "
        f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end"
    )
    print()
    print(
        "| phase | begin p50 / p99 | commit p50 / p99 | writes | flood ops/s | CPU (cores): "
        "index etcd / collections etcd / hub |"
    )
    print("|---|---|---|---|---|---|")
    for q in ("quiet", "flood"):
        for layout in ("shared", "apart"):
            key = (q, layout)
            b, c = result(key, 0), result(key, 1)
            failed = sum(part[2] for part in pooled[key])
            flood_rate = (
                f"{sum(rates[layout]) / len(rates[layout]):,.0f}"
                if q == "flood" and rates[layout]
                else "-"
            )
            where = "one etcd (today)" if layout == "shared" else "collections' etcd apart"
            print(
                f"| {q}, {where} | {b.p50:.2f} / {b.pct(99):.2f} ms | {c.p50:.2f} / "
                f"{c.pct(99):.2f} ms | {len(c.latencies)}"
                + (f" ({failed} failed)" if failed else "")
                + f" | {flood_rate} | "
                + " / ".join(
                    f"{cpu[key][name] / cpu[key]['seconds']:.2f}"
                    for name in ("index etcd", "collections etcd", "hub")
                )
                + " |"
            )
    print()
    for layout in ("shared", "apart"):
        quiet_b, flood_b = result(("quiet", layout), 0), result(("flood", layout), 0)
        quiet_c, flood_c = result(("quiet", layout), 1), result(("flood", layout), 1)
        print(
            f"{layout}: flood/quiet begin p50 {flood_b.p50 / quiet_b.p50:.2f}x, p99 "
            f"{flood_b.pct(99) / quiet_b.pct(99):.2f}x; commit p50 "
            f"{flood_c.p50 / quiet_c.p50:.2f}x, p99 {flood_c.pct(99) / quiet_c.pct(99):.2f}x"
        )

    def p50s(key: tuple[str, str], which: int) -> str:
        found = [part[0] if which == 0 else part[1] for part in pooled[key]]
        return "/".join(f"{Result('', 1, x, 1.0).p50:.0f}" if x else "-" for x in found)

    print(
        "round by round, p50 ms (begin; commit): "
        + ", ".join(
            f"{q}/{layout} {p50s((q, layout), 0)}; {p50s((q, layout), 1)}"
            for q in ("quiet", "flood")
            for layout in ("shared", "apart")
        )
    )
    shared_b, apart_b = result(("flood", "shared"), 0), result(("flood", "apart"), 0)
    shared_c, apart_c = result(("flood", "shared"), 1), result(("flood", "apart"), 1)
    print(
        f"under the flood, apart/shared: begin p50 {apart_b.p50 / shared_b.p50:.2f}x, p99 "
        f"{apart_b.pct(99) / shared_b.pct(99):.2f}x; commit p50 "
        f"{apart_c.p50 / shared_c.p50:.2f}x, p99 {apart_c.pct(99) / shared_c.pct(99):.2f}x"
    )


if __name__ == "__main__":
    sys.exit(main())
