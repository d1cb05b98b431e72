"""The collections when things die: a lock holder, the etcd leader, two etcd members of
three, a replica of the service holding buffered eventual writes.

Each test has an etcd cluster of its own (they kill members) and a real service: in a
thread, or as a process of its own when the service itself is killed.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from o41.collections.client import Unavailable
from o41.state.etcd import EtcdStore
from o41.testbed.etcd import EtcdCluster
from test_collections_support import ServiceProcess, ServiceThread

from support import wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(300)]


@pytest.fixture
def service(etcd_cluster: EtcdCluster) -> Iterator[ServiceThread]:
    running = ServiceThread(lambda: EtcdStore(etcd_cluster.endpoints, timeout=2)).start()
    try:
        yield running
    finally:
        running.stop()


HOLDER = """
import sys
from o41.collections.client import Client, HttpTransport
lock = Client(HttpTransport(sys.argv[1], token="token-a"), "job-1").lock("leader", ttl=2)
lock.acquire()
print(lock.token, flush=True)
sys.stdin.read()  # hold the lock until killed
"""


def test_a_killed_lock_holder_is_followed_after_the_ttl(service: ServiceThread) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, service.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        first = int(holder.stdout.readline())
        client = service.client(compute="job-1")
        assert client.lock("leader").acquire(timeout=0) is False  # held by the other process
        holder.kill()  # SIGKILL: no release, no more keep-alives
        holder.wait()
        with client.lock("leader", timeout=60) as lock:  # the lease runs out, then it is ours
            assert lock.token > first
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_killing_the_leader_loses_no_acknowledged_strong_write(
    etcd_cluster: EtcdCluster, service: ServiceThread
) -> None:
    client = service.client(compute="job-1")
    acked: dict[str, int] = {}
    adds_acked, adds_tried = [0], [0]
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def writer(w: int) -> None:
        d, c = client.dict("work"), client.counter("work")
        i = 0
        while not stop.is_set():
            key = f"{w}-{i}"
            try:
                d[key] = i
                with lock:
                    acked[key] = i
            except Unavailable as e:
                failures.append(str(e))
            with lock:
                adds_tried[0] += 1
            try:
                c.add(1)
                with lock:
                    adds_acked[0] += 1
            except Unavailable as e:
                failures.append(str(e))
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) >= 50, 30, "writes before the kill", interval=0.02)
        leader = etcd_cluster.leader()
        etcd_cluster.kill(leader)
        before = len(acked)
        wait_for(lambda: len(acked) >= before + 100, 60, "writes after the kill", interval=0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    d = client.dict("work")
    stored = dict(d.items())
    assert all(stored.get(k) == v for k, v in acked.items())
    assert adds_acked[0] <= client.counter("work").get() <= adds_tried[0]
    assert all("state store" in f or "did not answer" in f for f in failures)


def test_without_majority_strong_fails_cleanly_and_recovers(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    # the service in a process of its own: this process restarts etcd members, and must
    # not fork while gRPC calls run in it
    service = ServiceProcess(
        etcd_cluster.endpoints, tmp_path / "service.log", "--store-timeout", "2"
    ).start()
    try:
        client = service.client()
        d, scratch = client.dict("d"), client.dict("d", "eventual")
        d["before"] = 1
        assert scratch["before"] == 1  # the service replica's copy is loaded
        survivor = etcd_cluster.leader()
        dead = [i for i in range(3) if i != survivor]
        for i in dead:
            etcd_cluster.kill(i)

        with pytest.raises(Unavailable, match="state store cannot answer"):
            d["during"] = 2
        with pytest.raises(Unavailable, match="state store cannot answer"):
            d.get("before")
        with pytest.raises(Unavailable):
            client.counter("c").add(1)
        assert scratch["before"] == 1  # eventual reads: this replica's copy
        scratch["buffered"] = 3  # eventual writes: acknowledged, buffered until etcd is back

        etcd_cluster.restart(dead[0])

        def strong_works() -> bool:
            try:
                d["after"] = 4
            except Unavailable:
                return False
            return True

        wait_for(strong_works, 60, "strong writes to work again", interval=0.02)
        assert d["before"] == 1 and d["after"] == 4
        wait_for(
            lambda: d.get("buffered") == 3,
            30,
            "the buffered eventual write to reach etcd",
            interval=0.02,
        )
        assert client.counter("c").add(1) >= 1
    finally:
        service.stop()


def test_eventual_loss_window_is_what_a_killed_replica_buffered(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """A replica acknowledges eventual writes from memory and writes them to etcd in
    batches (here: at 50 writes, or hourly). SIGKILLed, it loses exactly what it had not
    written yet; nothing strong; and a clean stop (SIGTERM) loses nothing."""
    options = ("--flush-interval", "3600", "--max-batch", "50")
    first = ServiceProcess(etcd_cluster.endpoints, tmp_path / "one.log", *options).start()
    try:
        client = first.client()
        scratch, strong = client.dict("scratch", "eventual"), client.dict("scratch")
        for i in range(50):  # the 50th write starts a batch
            scratch[f"flushed-{i}"] = i
        wait_for(lambda: len(strong) == 50, 30, "the batch of 50 in etcd", interval=0.02)
        for i in range(20):
            scratch[f"buffered-{i}"] = i  # acknowledged, in memory only
            strong[f"strong-{i}"] = i
        assert scratch["buffered-19"] == 19  # the replica serves its own writes
        first.kill()
    finally:
        first.stop()

    second = ServiceProcess(etcd_cluster.endpoints, tmp_path / "two.log", *options).start()
    try:
        survived = dict(second.client().dict("scratch").items())
        assert {k for k in survived if k.startswith("flushed-")} == {
            f"flushed-{i}" for i in range(50)
        }
        assert {k for k in survived if k.startswith("strong-")} == {
            f"strong-{i}" for i in range(20)
        }
        assert not any(k.startswith("buffered-") for k in survived)  # the loss window

        scratch = second.client().dict("clean", "eventual")
        for i in range(20):
            scratch[i] = i
        second.stop()  # SIGTERM: the buffer is written out before exit
    finally:
        second.stop()

    third = ServiceProcess(etcd_cluster.endpoints, tmp_path / "three.log").start()
    try:
        assert dict(third.client().dict("clean").items()) == {i: i for i in range(20)}
    finally:
        third.stop()
