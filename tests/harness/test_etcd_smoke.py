"""etcd is real: three members on loopback keep taking writes with one of them killed."""

from __future__ import annotations

import time

import aetcd
import aetcd.exceptions
import pytest

from testbed.etcd import EtcdCluster

pytestmark = pytest.mark.etcd


async def put_retrying(etcd: aetcd.Client, key: bytes, value: bytes, deadline: float) -> int:
    """Put, retrying the errors a leader change causes; returns how many tries failed."""
    failures = 0
    while True:
        try:
            await etcd.put(key, value)
            return failures
        # the request in flight when the leader dies fails: timed out, refused, or its
        # stream reset (CANCELLED); aetcd raises ClientError subclasses for all of them
        except aetcd.exceptions.ClientError:
            failures += 1
            if time.monotonic() > deadline:
                raise


async def test_writes_survive_killing_the_leader(etcd_cluster: EtcdCluster) -> None:
    leader = etcd_cluster.leader()
    follower = next(i for i in range(3) if i != leader)
    host, port = etcd_cluster.endpoints[follower].removeprefix("http://").split(":")
    async with aetcd.Client(host=host, port=int(port), timeout=5) as etcd:
        await etcd.put(b"/smoke/before", b"1")
        killed = etcd_cluster.kill(leader)
        assert killed > 0 and not etcd_cluster.members[leader].alive()

        deadline = time.monotonic() + 30
        failures = 0
        for i in range(20):  # a write in flight during the election may fail; none after
            failures += await put_retrying(etcd, f"/smoke/after/{i}".encode(), b"%d" % i, deadline)
        values = [kv.value for kv in await etcd.get_prefix(b"/smoke/after/")]
        assert sorted(int(v) for v in values) == list(range(20))
        assert failures <= 2, f"{failures} failed tries: the survivors did not elect a leader"
        assert etcd_cluster.leader() != leader

        etcd_cluster.restart(leader)
        etcd_cluster.wait_healthy()
    # the restarted member caught up: read it from that member alone
    host, port = etcd_cluster.endpoints[leader].removeprefix("http://").split(":")
    async with aetcd.Client(host=host, port=int(port), timeout=5) as etcd:
        got = await etcd.get(b"/smoke/after/19")
        assert got is not None and got.value == b"19"
