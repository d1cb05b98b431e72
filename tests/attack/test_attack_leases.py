"""Attacks on leases (issue 14, item 1), against the real service on the real 3-member etcd.

etcd's lease ids are one space for every namespace and for the placement service's own
records, and they are nearly sequential: a client that could name one walked them, kept
another namespace's lock alive or released it, and revoked the service's lease of pending
writes (every begin answered 500 for the rest of the minute, commits of writes begun in it
404). Now no lease id leaves the service and none is taken from a client: a lock's holder is
named by its owner and fencing token, a barrier's arrival by its participant, and the lease
is found through a key under the caller's own prefix. Each test here fails on the code
before that change.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from aiohttp import web

from o41.collections.keys import encode_key
from o41.state import KeyValue
from o41.state.etcd import EtcdStore
from o41.webhook.collections import routes
from o41.webhook.records import pending_key
from test_collections_support import ServiceThread
from testbed.etcd import EtcdCluster
from testbed.kube import Kube
from testbed.product import PlacementProcess
from testbed.stores import AzureStore, GcsStore, S3Store

from fixtures.world import World
from support import wait_for

T = TypeVar("T")
REFUSED = "does not take lease ids"
PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


def post(url: str, token: str, path: str, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One collections operation as any pod can send it: (status, JSON answer)."""
    req = urllib.request.Request(
        f"{url}/v1/collections/{path}",
        data=json.dumps(args).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def near(*leases: int, by: int = 20) -> list[int]:
    """Lease ids around each of ``leases``, walked downward as the attack did."""
    ids = {x for lease in leases for x in range(lease - by, lease + by + 1)}
    return sorted(ids, reverse=True)


# a lock and a barrier of one namespace, attacked from another


class Waits:
    """Counts the barrier waits that reach the service, by HTTP path."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.seen[request.path] = self.seen.get(request.path, 0) + 1
        return await handler(request)


@pytest.fixture
def waits() -> Waits:
    return Waits()


@pytest.fixture
def service(state_etcd: EtcdCluster, waits: Waits) -> Iterator[ServiceThread]:
    """The collections' routes on etcd; a wait lasts at most 0.5 s per request, so a
    barrier wait of a few seconds is many requests."""
    running = ServiceThread(
        lambda: EtcdStore(state_etcd.endpoints, timeout=5),
        routes.Options(max_wait=0.5),
        middlewares=[waits.middleware],
    ).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def compute() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def only(service: ServiceThread, prefix: bytes) -> KeyValue | None:
    found = service.run(service.store.range(prefix))
    return found[0] if len(found) == 1 else None


@pytest.mark.etcd
def test_another_namespace_can_neither_release_nor_keep_alive_a_lock(
    service: ServiceThread, compute: str
) -> None:
    lock = service.client("token-a", compute).lock("shared", ttl=30)
    assert lock.acquire(timeout=0)
    holder = f"/o41/collections/team-a/{compute}/lock/shared/holder".encode()
    before = only(service, holder)
    assert before is not None and before.lease
    path = f"{compute}/lock/shared"
    try:
        for x in near(before.lease):  # B walks the ids round A's lease
            tries: list[tuple[str, dict[str, Any]]] = [
                ("keepalive", {"lease": x}),
                ("release", {"lease": x}),
                ("acquire", {"owner": "b", "timeout": 0, "lease": x}),
            ]
            for op, args in tries:
                status, body = post(service.url, "token-b", f"{path}/{op}", args)
                assert (status, REFUSED in body.get("error", "")) == (400, True), (x, op, body)
        # even with A's very owner and token: they name a holder in B's namespace, none
        mine = {"owner": before.value.decode(), "token": lock.token}
        assert post(service.url, "token-b", f"{path}/release", mine) == (200, {"released": False})
        assert post(service.url, "token-b", f"{path}/keepalive", mine) == (
            200,
            {"alive": False, "ttl": 0},
        )
        assert only(service, holder) == before  # same holder, same lease
        assert service.run(service.store.lease_keepalive(before.lease)) > 0
        assert lock.held
        assert service.client("token-a", compute).lock("shared").acquire(timeout=0) is False
    finally:
        lock.release()
    # its owner's release works (answered before etcd frees the lock: that follows at once)
    wait_for(lambda: only(service, holder) is None, 5, "the owner's release", interval=0.01)


@pytest.mark.etcd
def test_another_namespace_cannot_withdraw_or_expire_an_arrival(
    service: ServiceThread, compute: str, waits: Waits
) -> None:
    """A's participant waits over many requests (each finds its slot again by its value
    and keeps that slot's lease alive); B, sending the slot's lease id and its
    neighbours, or A's participant id, cannot take A's arrival away."""
    a = service.client("token-a", compute, websocket=False)
    released: list[int] = []
    first = threading.Thread(target=lambda: released.append(a.barrier("meet", 2).wait(60)))
    first.start()
    slots = f"/o41/collections/team-a/{compute}/barrier/meet/s/".encode()
    arrival = wait_for(lambda: only(service, slots), 30, "A's arrival", interval=0.02)
    participant = arrival.value.decode()
    path = f"{compute}/barrier/meet/wait"
    for x in near(arrival.lease):
        args = {"parties": 2, "participant": participant, "timeout": 0, "lease": x}
        status, body = post(service.url, "token-b", path, args)
        assert (status, REFUSED in body.get("error", "")) == (400, True), (x, body)
    alone = post(
        service.url, "token-b", path, {"parties": 2, "participant": participant, "timeout": 0}
    )
    assert alone == (
        200,
        {"released": False, "timed_out": True, "arrived": 0, "parties": 2},
    )  # B's own barrier of that name: A's arrival is not there
    route = f"/v1/collections/{path}"
    start = waits.seen.get(route, 0)
    wait_for(lambda: waits.seen.get(route, 0) >= start + 3, 30, "A's wait to ask again")
    assert only(service, slots) == arrival  # the same arrival: never withdrawn or expired
    second = a.barrier("meet", 2).wait(60)
    first.join(60)
    assert sorted([*released, second]) == [0, 1]
    assert only(service, slots) is None


# the placement service's own lease, out of every client's reach


def on_store(etcd: EtcdCluster, use: Callable[[EtcdStore], Awaitable[T]]) -> T:
    """``use`` on a store of the service's etcd, opened from outside the service."""

    async def run() -> T:
        store = EtcdStore(etcd.endpoints, timeout=5)
        try:
            return await use(store)
        finally:
            await store.close()

    return asyncio.run(run())


def revoke(etcd: EtcdCluster, lease: int) -> None:
    on_store(etcd, lambda store: store.lease_revoke(lease))


def pending_of(etcd: EtcdCluster, version: str) -> KeyValue | None:
    return on_store(etcd, lambda store: store.get(pending_key(version)))


@pytest.fixture(scope="module")
def world(
    kube: Kube,
    credentials: dict[str, str],
    s3: S3Store,
    gcs: GcsStore,
    azure: AzureStore,
    placement: PlacementProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    w = World(kube, credentials, s3, gcs, azure, placement, tmp_path_factory.mktemp("leases"))
    w.organization(["team-a"])
    w.east = w.location(
        "aws-east", "aws", "us-east-1", {"s3": {"endpoint": s3.endpoint}}, credentials["s3"]
    )
    w.ready(w.east)
    w.team_a = w.token("team-a")
    wait_for(
        lambda: (
            json.loads(w.kube.kubectl("get", "org", w.org, "-o", "json"))
            .get("status", {})
            .get("takesWrites")
        ),
        60,
        "the organization to take writes",
    )
    return w


def begin(world: World, artifact: str, data: bytes) -> tuple[int, dict[str, Any]]:
    body = {"organization": world.org, "artifact": artifact, "size": len(data), "place": PLACE}
    return world.api("POST", "/v1/writes", body)


def upload(began: dict[str, Any], data: bytes) -> None:
    single = began["upload"]["single"]
    put = urllib.request.Request(single["url"], data=data, method="PUT", headers=single["headers"])
    with urllib.request.urlopen(put, timeout=30) as r:
        assert r.status == 200


def commit(world: World, version: str) -> tuple[int, dict[str, Any]]:
    return world.api("POST", f"/v1/writes/{version}/commit", {})


@pytest.mark.kube
@pytest.mark.stores
@pytest.mark.etcd
def test_no_client_reaches_the_services_pending_lease(
    world: World, state_etcd: EtcdCluster
) -> None:
    """The reported attack, from a namespace that belongs to no Organization: walk lease
    ids from its own lock's down past the service's lease of pending writes, with every
    operation that takes arguments. Begins go on, and a write begun before commits."""
    rogue_ns = f"rogue-{uuid.uuid4().hex[:6]}"
    rogue = world.token(rogue_ns).read_text()
    data = b"begun before the walk"
    status, before = begin(world, "walked", data)
    assert status == 201, before
    upload(before, data)
    pending = pending_of(state_etcd, before["version"])
    assert pending is not None and pending.lease
    url = world.service.url

    status, held = post(url, rogue, "walk/lock/grab/acquire", {"owner": "rogue", "timeout": 0})
    assert (status, held.get("acquired")) == (200, True), held
    holder = on_store(
        state_etcd,
        lambda store: store.get(f"/o41/collections/{rogue_ns}/walk/lock/grab/holder".encode()),
    )
    assert holder is not None
    mine = {"owner": "rogue", "token": held["token"]}
    named: list[tuple[str, dict[str, Any]]] = [  # each lock and barrier op, all it takes
        ("lock/grab/keepalive", mine),
        ("lock/grab/release", mine),
        ("lock/other/acquire", {"owner": "x", "ttl": 5, "timeout": 0}),
        ("barrier/b/wait", {"parties": 2, "participant": "x", "timeout": 0}),
    ]
    answers = [
        (x, path, *post(url, rogue, f"walk/{path}", {**args, "lease": x}))
        for x in near(holder.lease, pending.lease, by=25)
        for path, args in named
    ]
    key, value = encode_key("k"), base64.b64encode(b"v").decode()
    others: list[tuple[str, dict[str, Any]]] = [  # these have no lease to name
        ("dict/d/set", {"key": key, "value": value}),
        ("dict/d/get", {"key": key}),
        ("dict/d/pop", {"key": key}),
        ("dict/d/clear", {}),
        ("set/s/add", {"key": key}),
        ("counter/c/add", {"n": 1}),
        ("counter/c/reset", {}),
        ("queue/q/offer", {"value": value}),
        ("queue/q/poll", {}),
        ("registry/r/register", {"key": key, "value": value}),
        ("registry/r/unregister", {"key": key}),
    ]
    ignored = [
        (path, *post(url, rogue, f"walk/{path}", {**args, "lease": pending.lease}))
        for path, args in others
    ]

    # every organization's writes go on: begins, and commits of writes begun before
    status, after = begin(world, "walked", b"after")
    assert status == 201, after
    status, committed = commit(world, before["version"])
    assert status == 200, committed
    _, got = world.read(before["version"], world.team_a, artifact="walked")
    assert got == data
    # what the attacker saw: no lease id, each one it sent refused, the rest ignored
    assert "lease" not in held, held
    for x, path, status, body in answers:
        assert (status, REFUSED in body.get("error", "")) == (400, True), (x, path, body)
    assert [(path, status) for path, status, _ in ignored] == [(path, 200) for path, _ in others]
    assert post(url, rogue, "walk/lock/grab/release", mine) == (200, {"released": True})


@pytest.mark.kube
@pytest.mark.stores
@pytest.mark.etcd
def test_a_lost_pending_lease_is_replaced_and_begins_go_on(
    world: World, state_etcd: EtcdCluster
) -> None:
    """The service's lease of pending writes revoked from outside (on the store itself,
    which only the service's certificate reaches): the next begin grants another and
    answers 201, and its write commits."""
    data = b"after the lease was lost"
    for _ in range(3):
        minute = int(time.time() // 60)
        status, lost = begin(world, "lost", b"x")
        assert status == 201, lost
        pending = pending_of(state_etcd, lost["version"])
        assert pending is not None and pending.lease
        revoke(state_etcd, pending.lease)
        status, began = begin(world, "lost", data)
        if int(time.time() // 60) == minute:
            break  # else a new minute's lease would have hidden the loss: again
    else:
        pytest.fail("three tries each crossed a minute")
    assert status == 201, began
    replaced = pending_of(state_etcd, began["version"])
    assert replaced is not None and replaced.lease not in (0, pending.lease)
    upload(began, data)
    status, committed = commit(world, began["version"])
    assert status == 200, committed
    _, got = world.read(began["version"], world.team_a, artifact="lost")
    assert got == data
    # the write begun under the revoked lease lost its record with it: begin again
    status, gone = commit(world, lost["version"])
    assert status == 404 and "begin again" in gone["error"]
