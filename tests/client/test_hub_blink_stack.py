"""Issue 39, points 1, 2 and 4, on the whole stack: a placement service of its own (a
second replica beside the world's, on the same 3-member etcd, the real API server's
TokenReview, the S3 stand-in) SIGKILLed and started again while ``o41 write`` processes
run, and a pod's collection operations with them: no write fails, no operation fails or
is applied twice (a commit sent again after it landed answers its version; a counter's
adds carry operation ids), every version written reads back. And the same stack through
a forward proxy: the service's calls and the bucket's uploads and downloads go through
it, or straight there with ``NO_PROXY``.
bench/hub_blink.py measures the same with more writes, the etcd leader killed too, and the
client from before issue 39 beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from testbed.etcd import EtcdCluster
from testbed.kube import Kube
from testbed.product import PlacementProcess
from testbed.proxy import ForwardProxy

from fixtures.world import World
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

WRITES = 24  # o41 write processes, PARALLEL at a time, across two restarts of the service
PARALLEL = 4


@pytest.fixture(scope="module")
def replica(
    kube: Kube, state_etcd: EtcdCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlacementProcess]:
    """A placement service of this module's own, to kill: the world's stays up."""
    service = PlacementProcess(
        kube.kubeconfig, state_etcd.endpoints, tmp_path_factory.mktemp("blink")
    ).start()
    try:
        yield service
    finally:
        if service.server is not None:
            service.server.stop()


def environ(world: World, **more: str) -> dict[str, str]:
    env = world.pod_environ("aws", "us-east-1", ("O41_", "SKYPILOT_"))
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):  # this machine's
        env.pop(name, None)
        env.pop(name.upper(), None)
    env.update(more)
    return env


def o41(
    world: World, service: str, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "o41.cli", *args, "--json"),
            *("--endpoint", service, "--token-file", str(world.team_a)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_service_killed_and_restarted_mid_run_loses_no_write(
    world: World, replica: PlacementProcess, tmp_path: Path
) -> None:
    env = environ(world)
    artifact = f"blink-{uuid.uuid4().hex[:6]}"
    files = []
    for i in range(WRITES):
        path = tmp_path / f"w{i}"
        path.write_bytes(os.urandom(32 * 1024))
        files.append(path)
    stop = threading.Event()
    restarts: list[float] = []

    def blink() -> None:
        """The service SIGKILLed, then started again (ready 1-3 s later), twice."""
        for _ in range(2):
            if stop.wait(1.5):
                return
            assert replica.server is not None
            replica.server.kill()
            killed = time.monotonic()
            replica.start()
            restarts.append(time.monotonic() - killed)

    counted: list[str] = []

    def pod() -> None:
        """A pod's collection operations through the blinks: a dict written and read
        back, and a counter's adds, which carry operation ids: each applied once."""
        code = (
            "import time\n"
            "from o41 import sky\n"
            "d, c = sky.dict('blink'), sky.counter('blink')\n"
            "for i in range(60):\n"
            "    d[f'k{i}'] = i; assert d[f'k{i}'] == i; c.add(i); time.sleep(0.05)\n"
            "print(len(d), c.get())\n"
        )
        pod_env = {
            **env,
            "O41_ARTIFACTS_ENDPOINT": replica.url,
            "O41_ARTIFACTS_TOKEN_FILE": str(world.team_a),
            "O41_COMPUTE": f"blink-{uuid.uuid4().hex[:6]}",
        }
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=pod_env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        counted.append(done.stdout.strip() if done.returncode == 0 else done.stderr)

    blinking = threading.Thread(target=blink)
    collections = threading.Thread(target=pod)
    blinking.start()
    collections.start()
    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            done = list(
                pool.map(
                    lambda p: o41(
                        world, replica.url, "write", "--org", world.org, "--artifact",
                        artifact, str(p), env=env,
                    ),
                    files,
                )
            )  # fmt: skip
    finally:
        stop.set()
        blinking.join(120)
        collections.join(600)
    failed = [d.stderr.strip().splitlines()[-1] for d in done if d.returncode != 0]
    assert len(restarts) == 2, "the service was not restarted twice during the writes"
    retried = sum("attempt " in d.stderr for d in done)
    print(f"{WRITES} writes, {retried} retried, {len(failed)} failed; ready after {restarts} s")
    # a refused connection, a reset, a begin, a commit or a read cut off: none of them
    # fails a write (a commit sent again after it landed answers its version)
    assert failed == [], failed
    assert retried, "no write met the blinks: nothing was tested"
    # every write of the dict went in; the adds, 0 + 1 + ... + 59, each counted once
    assert counted == [f"60 {sum(range(60))}"], counted
    for d, path in zip(done, files, strict=True):  # every version written reads back
        if d.returncode != 0:
            continue
        version = json.loads(d.stdout)["version"]
        _, got = world.read(version, world.team_a, artifact=artifact)
        assert got == path.read_bytes()


def test_a_rolling_restart_of_two_replicas_and_an_etcd_leader_kill_lose_no_write(
    world: World,
    replica: PlacementProcess,
    kube: Kube,
    state_etcd: EtcdCluster,
    tmp_path: Path,
) -> None:
    """A rollout: two replicas restarted one after the other (SIGTERM, as a Deployment
    does, then SIGKILL of the second), the etcd leader killed between them, while writes
    go to both: none fails, none is applied twice (each version reads back its bytes and
    the artifact counts exactly the writes)."""
    second = PlacementProcess(kube.kubeconfig, state_etcd.endpoints, tmp_path / "second").start()
    env = environ(world)
    artifact = f"rollout-{uuid.uuid4().hex[:6]}"
    files = []
    for i in range(WRITES):
        path = tmp_path / f"w{i}"
        path.write_bytes(os.urandom(16 * 1024))
        files.append(path)
    done_faults: list[str] = []

    def began(service: PlacementProcess) -> bool:
        log = service.directory / f"placement-{service.starts}.log"
        return log.exists() and "POST /v1/writes " in log.read_text()

    def new_leader(old: int) -> bool:
        with contextlib.suppress(OSError, RuntimeError):
            return state_etcd.leader() != old
        return False

    def roll() -> None:
        assert replica.server is not None and second.server is not None
        wait_for(lambda: began(replica), 120, "writes to reach the first replica")
        replica.server.stop()  # SIGTERM: drains, then goes
        replica.start()
        done_faults.append("first replica restarted")
        leader = state_etcd.leader()
        state_etcd.kill(leader)
        wait_for(lambda: new_leader(leader), 30, "the other members to elect a leader")
        state_etcd.restart(leader)
        done_faults.append(f"etcd leader {leader} killed and restarted")
        second.server.kill()
        second.start()
        done_faults.append("second replica SIGKILLed and restarted")

    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            futures = [
                pool.submit(
                    o41, world, (replica.url, second.url)[i % 2], "write", "--org", world.org,
                    "--artifact", artifact, str(p), env=env,
                )
                for i, p in enumerate(files)
            ]  # fmt: skip
            roll()  # from this thread, which outlives the servers it starts
            done = [f.result() for f in futures]
    finally:
        if second.server is not None:
            second.server.stop()
        state_etcd.wait_healthy()
    failed = [d.stderr.strip().splitlines()[-1] for d in done if d.returncode != 0]
    print(f"{WRITES} writes through {done_faults}: {len(failed)} failed")
    assert len(done_faults) == 3
    assert failed == [], failed
    versions = [json.loads(d.stdout)["version"] for d in done]
    assert len(set(versions)) == WRITES
    for version, path in zip(versions, files, strict=True):
        _, got = world.read(version, world.team_a, artifact=artifact)
        assert got == path.read_bytes()
    listed = world.o41("versions", "--org", world.org, "--artifact", artifact, "--json",
                       token=world.team_a)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["versions"]) == WRITES  # each write once


def test_the_stack_through_a_proxy_and_past_it(world: World, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024)
    path = tmp_path / "ckpt"
    path.write_bytes(data)
    service = world.service.url
    artifact = f"proxied-{uuid.uuid4().hex[:6]}"
    with ForwardProxy() as proxy:
        env = environ(world, HTTP_PROXY=proxy.url)
        written = o41(
            world, service, "write", "--org", world.org, "--artifact", artifact, str(path),
            env=env,
        )  # fmt: skip
        assert written.returncode == 0, written.stderr
        out = tmp_path / "back"
        read = o41(
            world, service, "read", "--org", world.org, "--artifact", artifact,
            "--version", "latest", "--output", str(out), env=env,
        )  # fmt: skip
        assert read.returncode == 0, read.stderr
        assert out.read_bytes() == data
        through = list(proxy.forwarded)
        # past it: NO_PROXY names the hosts
        env = environ(world, HTTP_PROXY=proxy.url, NO_PROXY="127.0.0.1,localhost")
        again = o41(
            world, service, "write", "--org", world.org, "--artifact", artifact, str(path),
            env=env,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert proxy.forwarded == through and proxy.tunnels == []
    calls = [f for f in through if f.split()[1].startswith(service)]
    bucket = [f for f in through if not f.split()[1].startswith(service)]
    assert f"POST {service}/v1/writes" in calls, through
    assert any(c.startswith(f"POST {service}/v1/writes/") and c.endswith("/commit") for c in calls)
    assert any(b.startswith("PUT ") for b in bucket), through  # the upload
    assert any(b.startswith("GET ") for b in bucket), through  # the download
