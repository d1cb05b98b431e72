"""etcd is real: three members on loopback keep taking writes with one of them killed."""

from __future__ import annotations

import aetcd
import pytest

from o41.testbed.etcd import EtcdCluster

pytestmark = pytest.mark.etcd


async def test_writes_survive_killing_the_leader(etcd_cluster: EtcdCluster) -> None:
    leader = etcd_cluster.leader()
    follower = next(i for i in range(3) if i != leader)
    host, port = etcd_cluster.endpoints[follower].removeprefix("http://").split(":")
    async with aetcd.Client(host=host, port=int(port), timeout=10) as etcd:
        await etcd.put(b"/smoke/before", b"1")
        killed = etcd_cluster.kill(leader)
        assert killed > 0 and not etcd_cluster.members[leader].alive()

        for i in range(20):  # the next write may wait for an election; it must not fail
            await etcd.put(f"/smoke/after/{i}".encode(), str(i).encode())
        values = [kv.value for kv in await etcd.get_prefix(b"/smoke/after/")]
        assert sorted(int(v) for v in values) == list(range(20))

        etcd_cluster.restart(leader)
        etcd_cluster.wait_healthy()
    # the restarted member caught up: read it from that member alone
    host, port = etcd_cluster.endpoints[leader].removeprefix("http://").split(":")
    async with aetcd.Client(host=host, port=int(port), timeout=10) as etcd:
        got = await etcd.get(b"/smoke/after/19")
        assert got is not None and got.value == b"19"
