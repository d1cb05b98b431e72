"""The collections through the real service: an aiohttp app on 127.0.0.1, called by the
real client over its WebSocket and by one POST per operation, on a 3-member etcd (and on
the embedded store: same semantics).

Every operation of every collection, in both consistencies; the spec's examples; many
workers on one counter; a queue drained by concurrent pollers; barriers and locks;
refusals as JSON; namespace isolation; a linearizability check of a concurrent history.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pytest

from linearizability import Operation, check_dict
from o41 import sky
from o41.client.collections import Client, Conflict, Consistency, Unavailable, ValueTooLarge
from o41.state.etcd import EtcdStore
from o41.state.memory import MemoryStore
from o41.webhook.collections import routes
from test_collections_support import ServiceThread
from testbed.etcd import EtcdCluster

from support import wait_for

CONSISTENCIES: list[Consistency] = ["strong", "eventual"]


@pytest.fixture(
    params=[
        "memory",
        "memory-owners",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("etcd-owners", marks=pytest.mark.etcd),
    ]
)
def service(request: pytest.FixtureRequest) -> Iterator[ServiceThread]:
    """The service on either store; "-owners": with O41_COLLECTIONS_OWNERS=on (a replica
    answers the strong reads of the dicts it owns from memory, issue 41)."""
    if request.param.startswith("memory"):
        make: Callable[[], Any] = MemoryStore
    else:
        cluster: EtcdCluster = request.getfixturevalue("state_etcd")
        make = lambda: EtcdStore(cluster.endpoints, timeout=5)  # noqa: E731
    owners: Literal["off", "on"] = "on" if request.param.endswith("-owners") else "off"
    running = ServiceThread(make, routes.Options(owners=owners)).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def compute() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["websocket", "post"])
def client(service: ServiceThread, compute: str, request: pytest.FixtureRequest) -> Client:
    return service.client(compute=compute, websocket=request.param == "websocket")


# every operation


@pytest.mark.parametrize("consistency", CONSISTENCIES)
def test_dict(client: Client, consistency: Consistency) -> None:
    d = client.dict("d", consistency)
    assert len(d) == 0 and d.get("x") is None and "x" not in d and d.get("x", 7) == 7
    with pytest.raises(KeyError):
        d["x"]
    d["a"] = 1
    d[2] = [1, 2]
    d[("t", 3)] = {"s": b"b"}
    d[None] = 1.5
    assert d["a"] == 1 and d[2] == [1, 2] and d[("t", 3)] == {"s": b"b"} and d[None] == 1.5
    assert "a" in d and len(d) == 4
    assert list(d) == ["a", 2, ("t", 3), None]  # insertion order, as a dict's
    d["a"] = 10  # a new value keeps its place
    assert list(d.keys()) == ["a", 2, ("t", 3), None]
    assert list(d.values()) == [10, [1, 2], {"s": b"b"}, 1.5]
    assert dict(d.items()) == {"a": 10, 2: [1, 2], ("t", 3): {"s": b"b"}, None: 1.5}
    assert d.pop("a") == 10
    assert d.pop("a", "gone") == "gone"
    with pytest.raises(KeyError):
        d.pop("a")
    del d[2]
    with pytest.raises(KeyError):
        del d[2]
    assert d.setdefault("n", 5) == 5
    assert d.setdefault("n", 6) == 5
    d.update({"u": 1}, v=2)
    assert d["u"] == 1 and d["v"] == 2
    assert d == {("t", 3): {"s": b"b"}, None: 1.5, "n": 5, "u": 1, "v": 2}
    d.clear()
    assert len(d) == 0 and list(d.items()) == []
    d["after"] = True  # usable after a clear
    assert dict(d) == {"after": True}


@pytest.mark.parametrize("consistency", CONSISTENCIES)
def test_set(client: Client, consistency: Consistency) -> None:
    s = client.set("s", consistency)
    assert len(s) == 0 and 1 not in s
    s.add(1)
    s.add("b")
    s.add(("x", 1))
    s.add(1)
    assert s.items() == {1, "b", ("x", 1)} and len(s) == 3 and 1 in s and set(s) == s.items()
    s.remove(1)
    with pytest.raises(KeyError):
        s.remove(1)
    s.discard(1)
    s.discard("b")
    assert s.items() == {("x", 1)}
    s.clear()
    assert s.items() == set()


@pytest.mark.parametrize("consistency", CONSISTENCIES)
def test_counter(client: Client, consistency: Consistency) -> None:
    c = client.counter("c", consistency)
    assert c.get() == 0
    assert c.add() == 1
    assert c.add(41) == 42
    assert c.add(-2) == 40
    assert c.get() == 40 and int(c) == 40
    c.reset()
    assert c.get() == 0
    assert c.add(3) == 3
    with pytest.raises(TypeError):
        c.add(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("consistency", CONSISTENCIES)
def test_queue(client: Client, consistency: Consistency) -> None:
    q = client.queue("q", consistency)
    assert q.poll() is None and len(q) == 0
    with pytest.raises(ValueError, match="does not take None"):
        q.offer(None)  # poll's None means empty: a None item could not be told from it
    assert len(q) == 0
    for item in ("a", {"b": 1}, ["c"]):
        q.offer(item)
    wait_for(lambda: len(q) == 3, 30, "the queue to hold three items", interval=0.02)
    assert q.poll() == "a"
    assert q.poll() == {"b": 1}
    assert q.poll() == ["c"]
    assert q.poll() is None
    q.offer(1)
    q.offer(2)
    q.clear()
    assert q.poll() is None and len(q) == 0
    q.offer(3)  # usable after a clear, order kept
    q.offer(4)
    assert [q.poll(), q.poll(), q.poll()] == [3, 4, None]


@pytest.mark.parametrize("consistency", CONSISTENCIES)
def test_registry(client: Client, consistency: Consistency) -> None:
    r = client.registry("checkpoints", consistency)
    assert r.list() == [] and r.lookup(1) is None and r.lookup(1, "none") == "none"
    r.register(9, None)  # registered with None: told from a missing name by the default
    assert r.lookup(9, "missing") is None and r.lookup(8, "missing") == "missing" and 9 in r
    assert r.unregister(9) is True
    r.register(2, {"w": [0.5]})
    r.register(1, "one")
    r.register(3, b"three")
    assert r.list() == [2, 1, 3]  # registration order
    assert r.lookup(2) == {"w": [0.5]} and 1 in r and len(r) == 3
    r.register(2, "replaced")
    assert r.lookup(2) == "replaced" and r.list() == [2, 1, 3]
    assert r.unregister(1) is True
    assert r.unregister(1) is False
    assert r.list() == [2, 3]


def run_threads(n: int, target: Callable[[int], Any]) -> list[Any]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(target, range(n)))


def test_barrier_releases_together_and_again(client: Client) -> None:
    indexes = run_threads(3, lambda _: client.barrier("b", 3).wait(timeout=60))
    assert sorted(indexes) == [0, 1, 2]
    indexes = run_threads(3, lambda _: client.barrier("b", 3).wait())  # the next round
    assert sorted(indexes) == [0, 1, 2]


def test_barrier_never_releases_early(service: ServiceThread, client: Client, compute: str) -> None:
    passed: list[int] = []

    def participant(_: int) -> None:
        client.barrier("early", 3).wait(timeout=60)
        passed.append(1)

    threads = [threading.Thread(target=participant, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    slots = f"/o41/collections/team-a/{compute}/barrier/early/s/".encode()
    wait_for(
        lambda: len(service.run(service.store.range(slots))) == 2, 30, "two arrivals", interval=0.02
    )
    assert passed == []  # two of three arrived: nobody passed
    client.barrier("early", 3).wait(timeout=60)
    for t in threads:
        t.join(60)
    assert len(passed) == 2


def test_barrier_times_out_cleanly(service: ServiceThread, client: Client, compute: str) -> None:
    with pytest.raises(TimeoutError, match="0 of the other 1"):
        client.barrier("alone", 2).wait(timeout=0.2)
    slots = f"/o41/collections/team-a/{compute}/barrier/alone/s/".encode()
    assert service.run(service.store.range(slots)) == []  # it withdrew
    with pytest.raises(TimeoutError):  # so it does not count for the next participant
        client.barrier("alone", 2).wait(timeout=0.2)
    assert sorted(run_threads(2, lambda _: client.barrier("alone", 2).wait(30))) == [0, 1]
    with pytest.raises(Conflict, match="2 parties, not 3"):
        client.barrier("alone", 3).wait(timeout=1)


def test_lock(client: Client) -> None:
    with client.lock("l", ttl=10) as held:
        first = held.token
        assert held.held
        assert client.lock("l").acquire(timeout=0) is False
    assert not held.held
    with pytest.raises(RuntimeError, match="not held"):
        _ = held.token
    with client.lock("l") as again:
        assert again.token > first
    counter = client.dict("guarded")
    counter["n"] = 0

    def critical(_: int) -> None:
        for _ in range(10):
            with client.lock("l", timeout=60):
                counter["n"] = counter["n"] + 1  # a read-modify-write: exclusive or wrong

    run_threads(4, critical)
    assert counter["n"] == 40


def test_lock_waiters_are_served_in_arrival_order(client: Client, service: ServiceThread) -> None:
    """Waiters get the lock in the order they arrived (their keys' create revisions), one
    after the other: a release hands it to the first, not to whoever asks next."""
    first = client.lock("line", ttl=10)
    assert first.acquire(timeout=0)
    order: list[int] = []
    tokens: list[int] = []
    threads = []
    waiters = f"/o41/collections/team-a/{client.compute}/lock/line/w/".encode()
    for w in range(4):

        def wait(w: int = w) -> None:
            with client.lock("line", ttl=10, timeout=60) as held:
                order.append(w)
                tokens.append(held.token)

        threads.append(threading.Thread(target=wait))
        threads[-1].start()
        wait_for(
            lambda w=w: len(service.run(service.store.range(waiters))) == w + 1,  # type: ignore[misc]
            10,
            f"waiter {w} in line",
            interval=0.01,
        )
    first.release()
    for t in threads:
        t.join(60)
    assert order == [0, 1, 2, 3]
    assert tokens == sorted(tokens) and tokens[0] > 0
    assert service.run(service.store.range(waiters)) == []


@pytest.mark.etcd
@pytest.mark.parametrize("through", ["baba", "bbb"])
def test_lock_waiters_through_two_replicas_keep_arrival_order(
    state_etcd: EtcdCluster, through: str
) -> None:
    """Waiters reaching the lock through two replicas of the service: each replica hands
    the lock to the first waiter it sees in etcd, its own or the other's; a replica with
    no waiter of its own frees it, and the first waiter's replica claims it for it."""
    services = [
        ServiceThread(lambda: EtcdStore(state_etcd.endpoints, timeout=5)).start() for _ in range(2)
    ]
    try:
        compute = f"job-{uuid.uuid4().hex[:10]}"
        a, b = (s.client(compute=compute) for s in services)
        first = a.lock("two", ttl=10)
        assert first.acquire(timeout=0)
        waiters = f"/o41/collections/team-a/{compute}/lock/two/w/".encode()
        order: list[str] = []
        threads = []
        for w, via in enumerate(a if c == "a" else b for c in through):

            def wait(name: str = f"{w}", via: Client = via) -> None:
                with via.lock("two", ttl=10, timeout=60):
                    order.append(name)

            threads.append(threading.Thread(target=wait))
            threads[-1].start()
            wait_for(
                lambda w=w: len(services[0].run(services[0].store.range(waiters))) == w + 1,  # type: ignore[misc]
                10,
                f"waiter {w} in line",
                interval=0.01,
            )
        first.release()
        for t in threads:
            t.join(60)
        assert order == [str(w) for w in range(len(through))]
    finally:
        for s in services:
            s.stop()


def test_a_holder_whose_lease_is_lost_is_told(client: Client, service: ServiceThread) -> None:
    """The lease goes (etcd lost it, or a keep-alive came too late): the lock object says
    so, with the fencing token it held, and the next waiter gets a larger one."""
    lock = client.lock("lost", ttl=3)
    assert lock.acquire(timeout=0)
    token = lock.token
    holder = f"/o41/collections/team-a/{client.compute}/lock/lost/holder".encode()
    kv = service.run(service.store.get(holder))
    assert kv is not None and kv.lease
    service.run(service.store.lease_revoke(kv.lease))
    wait_for(lambda: lock.lost, 10, "the holder to be told", interval=0.05)
    print(f"told the lease was lost, token {lock.lost_token}")
    assert lock.lost_token == token and not lock.held
    with client.lock("lost", timeout=10) as after:
        assert after.token > token
    lock.release()  # says nothing wrong: it was not held any more


def test_lock_times_out(client: Client) -> None:
    with (
        client.lock("busy"),
        pytest.raises(TimeoutError, match=r"not acquired within 0\.2 s"),
        client.lock("busy", timeout=0.2),
    ):
        pass


# the spec's examples, as written


def write_checkpoint() -> None:
    """The spec's stand-in for real work."""


@sky.function
def save_checkpoint(step: int, model: Any) -> Any:
    checkpoints = sky.registry("checkpoints")
    checkpoints.register(step, model)
    return checkpoints.list()


@sky.function
def worker_step(batch: list[Any]) -> None:
    processed = sky.counter("processed")
    processed.add(len(batch))
    with sky.lock("checkpoint"):
        write_checkpoint()


def test_spec_examples(client: Client) -> None:
    sky.configure(client)
    try:
        assert save_checkpoint(1, {"weights": [0.1, 0.2]}) == [1]
        assert save_checkpoint(2, {"weights": [0.3, 0.4]}) == [1, 2]
        run_threads(4, lambda i: worker_step(list(range(i + 1))))
        assert sky.counter("processed").get() == 1 + 2 + 3 + 4

        models = sky.registry("checkpoints")
        latest_step = max(models.list())
        model = models.lookup(latest_step)
        assert model == {"weights": [0.3, 0.4]}
        assert sky.queue("empty").poll() is None
    finally:
        sky.configure(None)


# concurrency


def test_many_workers_on_one_counter_sum_exactly(client: Client) -> None:
    def worker(_: int) -> list[int]:
        c = client.counter("hot")
        return [c.add(1) for _ in range(50)]

    seen = [v for values in run_threads(16, worker) for v in values]
    assert client.counter("hot").get() == 16 * 50
    assert sorted(seen) == list(range(1, 16 * 50 + 1))  # every add saw its own value


def test_queue_drained_by_concurrent_pollers_delivers_each_item_once(client: Client) -> None:
    producers, per_producer, pollers = 4, 100, 8
    done = threading.Event()

    def produce(p: int) -> None:
        q = client.queue("work")
        for i in range(per_producer):
            q.offer((p, i))

    def poll(_: int) -> list[tuple[int, int]]:
        q, got = client.queue("work"), []
        while True:
            finished = done.is_set()  # before the poll: every offer was made by then
            item = q.poll()
            if item is not None:
                got.append(item)
            elif finished:  # (a second poll here used to drop the item it found)
                return got

    with ThreadPoolExecutor(producers + pollers) as pool:
        polling = [pool.submit(poll, i) for i in range(pollers)]
        list(pool.map(produce, range(producers)))
        done.set()
        results = [f.result(120) for f in polling]
    delivered = [item for got in results for item in got]
    assert sorted(delivered) == [(p, i) for p in range(producers) for i in range(per_producer)]
    for got in results:  # FIFO: each poller sees each producer's items in order
        for p in range(producers):
            mine = [i for q, i in got if q == p]
            assert mine == sorted(mine)


# refusals


def raw(
    url: str, path: str, body: bytes | None = None, token: str | None = "token-a"
) -> tuple[int, Any]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", path, body if body is not None else b"{}", headers)
    response = conn.getresponse()
    status, data = response.status, response.read()
    conn.close()
    return status, json.loads(data)


def test_refusals_are_clear_json(service: ServiceThread, client: Client) -> None:
    url = service.url
    status, body = raw(url, "/v1/collections/job/dict/d/get", token=None)
    assert status == 401 and "bearer token" in body["error"]
    status, body = raw(url, "/v1/collections/job/dict/d/get", token="forged")
    assert status == 401
    status, body = raw(url, "/v1/collections/job/dict/bad%20name!/len")
    assert status == 400 and "bad collection name" in body["error"]
    status, body = raw(url, "/v1/collections/-job/dict/d/len")
    assert status == 400 and "bad compute name" in body["error"]
    status, body = raw(url, "/v1/collections/job/tree/d/len")
    assert status == 400 and "unknown collection kind" in body["error"]
    status, body = raw(url, "/v1/collections/job/dict/d/explode")
    assert status == 400 and "no operation 'explode'" in body["error"]
    status, body = raw(url, "/v1/collections/job/dict/d/get", json.dumps({"key": "i007"}).encode())
    assert status == 400 and "canonical" in body["error"]
    status, body = raw(
        url, "/v1/collections/job/dict/d/get", json.dumps({"key": ["list"]}).encode()
    )
    assert status == 400
    status, body = raw(url, "/v1/collections/job/dict/d/get", b"not json")
    assert status == 400 and "JSON object" in body["error"]
    big = base64.b64encode(b"x" * (600 * 1024)).decode()
    status, body = raw(
        url, "/v1/collections/job/dict/d/set", json.dumps({"key": "sk", "value": big}).encode()
    )
    assert status == 413 and "value too large" in body["error"]
    status, body = raw(
        url, "/v1/collections/job/dict/d/set", json.dumps({"key": "sk", "value": "!!"}).encode()
    )
    assert status == 400 and "base64" in body["error"]
    status, body = raw(
        url,
        "/v1/collections/job/dict/d/get",
        json.dumps({"key": "sk", "consistency": "weak"}).encode(),
    )
    assert status == 400 and "consistency" in body["error"]
    status, body = raw(url, "/v1/collections/job/counter/c/add", json.dumps({"n": "1"}).encode())
    assert status == 400 and "integer" in body["error"]

    d = client.dict("d")
    with pytest.raises(TypeError, match="unhashable key of type 'list'"):
        d[[1]] = 1
    with pytest.raises(TypeError, match="no stable encoding"):
        d[object()] = 1
    with pytest.raises(ValueTooLarge, match="value too large"):
        d["big"] = b"x" * (600 * 1024)
    with pytest.raises(TypeError, match="are not stored"):
        d["obj"] = object()
    with pytest.raises(ValueError, match="bad dict name"):
        client.dict("a/b")
    with pytest.raises(ValueError, match="consistency"):
        client.dict("d", "weak")  # type: ignore[arg-type]


def test_namespaces_are_isolated(service: ServiceThread, compute: str) -> None:
    a, b = service.client("token-a", compute), service.client("token-b", compute)
    a.dict("shared")["k"] = "a's"
    a.counter("shared").add(5)
    a.queue("shared").offer("a's")
    a.registry("shared").register("model", "a's")
    a.set("shared").add("a's")
    assert "k" not in b.dict("shared") and len(b.dict("shared")) == 0
    assert b.counter("shared").get() == 0
    assert b.queue("shared").poll() is None
    assert b.registry("shared").list() == []
    assert b.set("shared").items() == set()
    assert b.dict("shared", "eventual").get("k") is None
    with a.lock("shared"), b.lock("shared", timeout=0):  # each namespace its own lock
        pass
    b.dict("shared")["k"] = "b's"
    assert a.dict("shared")["k"] == "a's" and a.queue("shared").poll() == "a's"
    keys = service.run(service.store.range(b"/o41/collections/"))
    namespaces = {kv.key.split(b"/")[3] for kv in keys if compute.encode() in kv.key}
    assert namespaces == {b"team-a", b"team-b"}


# eventual: another replica sees the writes within the flush window and a watch


@pytest.mark.etcd
def test_eventual_writes_reach_other_replicas(state_etcd: EtcdCluster, compute: str) -> None:
    replicas = [
        ServiceThread(lambda: EtcdStore(state_etcd.endpoints, timeout=5)).start() for _ in range(2)
    ]
    try:
        one, two = (r.client(compute=compute) for r in replicas)
        one.dict("scratch", "eventual")["k"] = "v1"
        assert one.dict("scratch", "eventual")["k"] == "v1"  # read your write, same replica
        wait_for(
            lambda: two.dict("scratch").get("k") == "v1",
            30,
            "the write to reach etcd",
            interval=0.02,
        )
        wait_for(
            lambda: two.dict("scratch", "eventual").get("k") == "v1",
            30,
            "replica two's copy",
            interval=0.02,
        )
        two.dict("scratch")["k"] = "v2"  # strong, through the other replica
        wait_for(
            lambda: one.dict("scratch", "eventual").get("k") == "v2",
            30,
            "replica one's copy",
            interval=0.02,
        )
        for _ in range(10):
            one.counter("hits", "eventual").add(1)
            two.counter("hits", "eventual").add(1)
        wait_for(
            lambda: one.counter("hits").get() == 20,
            30,
            "both replicas' adds in etcd",
            interval=0.02,
        )
        wait_for(
            lambda: two.counter("hits", "eventual").get() == 20,
            30,
            "the copies to agree",
            interval=0.02,
        )
        assert replicas[0].engine.stats.dropped == 0
    finally:
        for r in replicas:
            r.stop()


# linearizability of a concurrent history


def test_concurrent_dict_history_is_linearizable(client: Client, service: ServiceThread) -> None:
    keys = ["x", "y", "z"]
    history: list[Operation] = []
    lock = threading.Lock()

    def worker(process: int) -> None:
        rng = random.Random(process)
        d = client.dict("lin")
        for i in range(40):
            key = rng.choice(keys)
            f = rng.choice(["get", "set", "set", "delete", "pop", "contains", "setdefault"])
            arg = f"{process}.{i}" if f in ("set", "setdefault") else None
            call = time.monotonic()
            try:
                result: Any
                if f == "get":
                    result = d.get(key)
                elif f == "set":
                    d[key] = arg
                    result = None
                elif f == "delete":
                    try:
                        del d[key]
                        result = True
                    except KeyError:
                        result = False
                elif f == "pop":
                    result = d.pop(key, None)
                elif f == "contains":
                    result = key in d
                else:
                    result = d.setdefault(key, arg)
                ret = time.monotonic()
            except Unavailable:
                result, ret = None, float("inf")
            with lock:
                history.append(Operation(key, f, arg, result, call, ret, process))

    run_threads(8, worker)
    assert len(history) == 8 * 40
    assert check_dict(history) == []
    owned = service.engine.owned
    if owned.campaign:  # the owner did answer strong reads from memory meanwhile
        assert owned.stats.served > 0
