"""Operations applied once (issue 39, point 2), on the engine over the embedded store and
over a 3-member etcd: an operation sent again with the same id (a retry whose answer was
lost) is answered its first answer and acts once, whether the repeat comes through the
same replica (engine) or another one on the same store, one after the other or at the
same time; another tenant's same id is another operation; a bad id is a 400. A property
test (hypothesis) runs random histories with random repeats against a model where a repeat
of an operation that acted changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from o41.collections.checks import BadRequest
from o41.collections.engine import Engine
from o41.collections.once import Recent
from o41.core.operations import REMEMBERED_FOR, check_operation
from o41.state import Store
from o41.state.etcd import EtcdStore
from o41.state.memory import MemoryStore
from test_collections_engine import Counting
from testbed.etcd import EtcdCluster

Replicas = tuple[Engine, Engine]


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[Replicas]:
    """Two engines (two service replicas) on one store."""
    stores: list[Store]
    if request.param == "memory":
        shared = MemoryStore()
        stores = [shared, shared]
    else:
        cluster: EtcdCluster = request.getfixturevalue("state_etcd")
        stores = [EtcdStore(cluster.endpoints, timeout=5) for _ in range(2)]
    engines = (Engine(stores[0]), Engine(stores[1]))
    try:
        yield engines
    finally:
        for engine in engines:
            await engine.close()
        for store in dict.fromkeys(stores):
            await store.close()


def op() -> str:
    return uuid.uuid4().hex


class Job:
    """One compute's collections through either replica."""

    def __init__(self, replicas: Replicas, namespace: str = "team-a") -> None:
        self.replicas = replicas
        self.namespace = namespace
        self.compute = f"job-{uuid.uuid4().hex[:10]}"

    def __call__(self, what: str, via: int = 0, **args: Any) -> Awaitable[dict[str, Any]]:
        kind, name, operation = what.split(".")
        engine = self.replicas[via]
        return engine.call(self.namespace, self.compute, kind, name, operation, args)


def test_an_operation_id_is_32_lowercase_hex() -> None:
    good = uuid.uuid4().hex
    assert check_operation(good) == good
    for bad in (good.upper(), good[:31], good + "0", "x" * 32, 12, None, ""):
        with pytest.raises(ValueError, match="32 lowercase hexadecimal"):
            check_operation(bad)


async def test_a_bad_id_is_refused_saying_what_is_wrong(replicas: Replicas) -> None:
    job = Job(replicas)
    for bad in ("ABC", uuid.uuid4().hex.upper(), 7, uuid.uuid4().hex[:-1]):
        with pytest.raises(BadRequest, match="operation must be"):
            await job("counter.c.add", operation=bad)
    assert (await job("counter.c.get"))["value"] == 0


REPEATS = ["same replica", "other replica", "concurrently"]


async def twice(job: Job, what: str, how: str, **args: Any) -> list[dict[str, Any]]:
    """The same operation (one id) sent twice, as ``how`` says."""
    args = {"operation": op(), **args}
    if how == "concurrently":
        return list(await asyncio.gather(job(what, 0, **args), job(what, 1, **args)))
    first = await job(what, 0, **args)
    return [first, await job(what, 0 if how == "same replica" else 1, **args)]


@pytest.mark.parametrize("how", REPEATS)
async def test_counter_add(replicas: Replicas, how: str) -> None:
    job = Job(replicas)
    await job("counter.c.add", n=10)
    a, b = await twice(job, "counter.c.add", how, n=5)
    assert a == b == {"value": 15}
    assert (await job("counter.c.get"))["value"] == 15


@pytest.mark.parametrize("how", REPEATS)
async def test_queue_offer_and_poll(replicas: Replicas, how: str) -> None:
    job = Job(replicas)
    a, b = await twice(job, "queue.q.offer", how, value=b"one")
    assert a == b == {}
    await job("queue.q.offer", value=b"two")
    assert (await job("queue.q.len"))["len"] == 2
    a, b = await twice(job, "queue.q.poll", how)
    assert a == b == {"found": True, "value": b"one"}
    assert await job("queue.q.poll") == {"found": True, "value": b"two"}
    empty = await twice(job, "queue.q.poll", how)
    assert empty == [{"found": False, "value": None}] * 2


async def test_polls_with_ids_take_the_oldest_item_whatever_a_replica_knew(
    replicas: Replicas,
) -> None:
    """A replica claims the items it offered, or read ahead, in one round trip, guarded on
    each item unchanged and no older item left: an item another replica claimed, or one it
    offered in between, sends the poll back to etcd's head instead."""
    job = Job(replicas)
    for value in (b"a", b"b"):
        await job("queue.q.offer", 0, value=value, operation=op())
    await job("queue.q.offer", 1, value=b"c", operation=op())  # unknown to replica 0
    assert await job("queue.q.poll", 1, operation=op()) == {"found": True, "value": b"a"}
    await job("queue.q.offer", 0, value=b"d", operation=op())
    got = [await job("queue.q.poll", 0, operation=op()) for _ in range(5)]
    assert [g["value"] for g in got] == [b"b", b"c", b"d", None, None]
    await job("queue.q.offer", 0, value=b"e", operation=op())
    await job("queue.q.clear", 1)
    await job("queue.q.offer", 1, value=b"f", operation=op())
    assert await job("queue.q.poll", 0, operation=op()) == {"found": True, "value": b"f"}


async def test_a_poll_with_an_id_of_an_item_this_replica_offered_is_one_round_trip() -> None:
    store = Counting()
    engine = Engine(store)
    try:
        job = Job((engine, engine))
        for value in (b"x", b"y"):
            await job("queue.q.offer", value=value, operation=op())
        before = store.txns
        assert await job("queue.q.poll", operation=op()) == {"found": True, "value": b"x"}
        assert await job("queue.q.poll", operation=op()) == {"found": True, "value": b"y"}
        assert store.txns - before == 2
    finally:
        await engine.close()


@pytest.mark.parametrize("how", REPEATS)
@pytest.mark.parametrize("kind", ["dict", "registry"])
async def test_set_and_delete(replicas: Replicas, how: str, kind: str) -> None:
    job = Job(replicas)
    put, remove = ("set", "delete") if kind == "dict" else ("register", "unregister")
    args: dict[str, Any] = {"operation": op(), "key": "sk", "value": b"first"}
    assert await job(f"{kind}.m.{put}", **args) == {}
    await job(f"{kind}.m.{put}", key="sk", value=b"second")  # another writer, after
    answers = await asyncio.gather(*(job(f"{kind}.m.{put}", v, **args) for v in (0, 1)))
    assert answers == [{}, {}]
    lookup = "get" if kind == "dict" else "lookup"
    assert (await job(f"{kind}.m.{lookup}", key="sk"))["value"] == b"second"  # not undone
    a, b = await twice(job, f"{kind}.m.{remove}", how, key="sk")
    assert a == b == {"found": True}
    assert (await job(f"{kind}.m.{lookup}", key="sk"))["found"] is False


async def test_a_repeat_does_not_undo_a_later_write(replicas: Replicas) -> None:
    """delete, pop, setdefault and clear sent again after another writer acted: the
    repeat answers the first answer and leaves the other writer's write."""
    job = Job(replicas)
    await job("dict.d.set", key="sk", value=b"v1")
    delete: dict[str, Any] = {"operation": op(), "key": "sk"}
    assert await job("dict.d.delete", **delete) == {"found": True}
    await job("dict.d.set", key="sk", value=b"v2")
    assert await job("dict.d.delete", 1, **delete) == {"found": True}
    pop: dict[str, Any] = {"operation": op(), "key": "sk"}
    assert await job("dict.d.pop", **pop) == {"found": True, "value": b"v2"}
    await job("dict.d.set", key="sk", value=b"v3")
    assert await job("dict.d.pop", 1, **pop) == {"found": True, "value": b"v2"}
    assert (await job("dict.d.get", key="sk"))["value"] == b"v3"
    await job("dict.d.delete", key="sk")
    default: dict[str, Any] = {"operation": op(), "key": "sd", "value": b"d1"}
    assert await job("dict.d.setdefault", **default) == {"value": b"d1"}
    await job("dict.d.delete", key="sd")
    assert await job("dict.d.setdefault", 1, **default) == {"value": b"d1"}
    assert (await job("dict.d.get", key="sd"))["found"] is False  # not set again
    clear: dict[str, Any] = {"operation": op()}
    await job("dict.d.clear", **clear)
    await job("dict.d.set", key="safter", value=b"x")
    assert await job("dict.d.clear", 1, **clear) == {}
    assert (await job("dict.d.len"))["len"] == 1


async def test_an_operation_that_changed_nothing_is_not_remembered(replicas: Replicas) -> None:
    """A delete of a missing key acted on nothing: its repeat is the one time it acts."""
    job = Job(replicas)
    args: dict[str, Any] = {"operation": op(), "key": "sk"}
    assert await job("dict.d.delete", **args) == {"found": False}
    await job("dict.d.set", key="sk", value=b"v")
    assert await job("dict.d.delete", 1, **args) == {"found": True}


async def test_lock_acquire_and_release(replicas: Replicas) -> None:
    job = Job(replicas)
    owner = uuid.uuid4().hex
    acquire: dict[str, Any] = {"operation": op(), "owner": owner, "ttl": 10, "timeout": 0}
    first = await job("lock.l.acquire", **acquire)
    again = await job("lock.l.acquire", 1, **acquire)
    assert first["acquired"] and again == first  # the same token
    release: dict[str, Any] = {"operation": op(), "owner": owner, "token": first["token"]}
    assert await job("lock.l.release", **release) == {"released": True}
    assert await job("lock.l.release", 1, **release) == {"released": True}
    other = await job("lock.l.acquire", owner=uuid.uuid4().hex, ttl=10, timeout=0)
    assert other["acquired"] and other["token"] > first["token"]
    # a repeat of the old release does not free the new holder's lock
    assert await job("lock.l.release", **release) == {"released": True}
    assert (await job("lock.l.acquire", owner=owner, ttl=10, timeout=0))["acquired"] is False


async def test_barrier_arrival(replicas: Replicas) -> None:
    job = Job(replicas)
    args: dict[str, Any] = {"operation": op(), "parties": 1, "participant": "p0", "timeout": 5}
    a = await job("barrier.b.wait", **args)
    b = await job("barrier.b.wait", 1, **args)
    assert a == {"released": True, "index": 0} and b["released"]


async def test_another_tenants_same_id_is_another_operation(replicas: Replicas) -> None:
    mine, theirs = Job(replicas), Job(replicas, "team-b")
    theirs.compute = mine.compute
    same = op()
    assert await mine("counter.c.add", n=2, operation=same) == {"value": 2}
    assert await theirs("counter.c.add", 1, n=3, operation=same) == {"value": 3}
    assert await mine("counter.c.add", 1, n=2, operation=same) == {"value": 2}
    assert (await theirs("counter.c.get"))["value"] == 3
    same = op()
    await mine("queue.q.offer", value=b"mine", operation=same)
    await theirs("queue.q.offer", value=b"theirs", operation=same)
    assert (await theirs("queue.q.len"))["len"] == 1


async def test_the_remembered_answer_is_leased(replicas: Replicas) -> None:
    """Bounded in time: the key of an id is under a lease of REMEMBERED_FOR + 60 s."""
    job = Job(replicas)
    same = op()
    await job("counter.c.add", operation=same)
    key = f"/o41/operations/team-a/{job.compute}/{same}".encode()  # no key of the quota
    kv = await replicas[0].store.get(key)
    assert kv is not None and kv.lease and len(kv.value) < 64
    assert replicas[0].memory.lease == kv.lease
    assert REMEMBERED_FOR == 600


async def test_repeats_in_one_batch_and_of_remembered_ops() -> None:
    """Many adds and offers arriving together are combined: a repeat in the same batch
    answers as its first, a repeat of an add remembered before is left out of the batch,
    and the batch still costs few transactions."""
    store = Counting()
    engine = Engine(store)
    try:
        job = Job((engine, engine))
        ids = [op() for _ in range(10)]
        done = await job("counter.c.add", n=1, operation=ids[0])  # remembered before
        adds = [job("counter.c.add", n=1, operation=ids[i % 10]) for i in range(50)]
        adds += [job("counter.c.add", n=1) for _ in range(20)]
        before = store.txns
        answers = await asyncio.gather(*adds)
        assert (await job("counter.c.get"))["value"] == 30  # 10 ids, 20 without
        assert store.txns - before <= 12
        for i in range(50):
            assert answers[i] == answers[i % 10]
        assert answers[0] == done
        ids = [op() for _ in range(10)]  # an id names one operation: new ones
        offers = [
            job("queue.q.offer", value=b"%d" % (i % 7), operation=ids[i % 7]) for i in range(70)
        ]
        await asyncio.gather(*offers)
        assert (await job("queue.q.len"))["len"] == 7
        ids = [op() for _ in range(10)]
        polls = [job("queue.q.poll", operation=ids[i % 5]) for i in range(40)]
        polled = await asyncio.gather(*polls)
        assert sorted({p["value"] for p in polled}) == [b"%d" % i for i in range(5)]
        assert (await job("queue.q.len"))["len"] == 2
    finally:
        await engine.close()


async def test_eventual_repeats_through_the_same_replica(replicas: Replicas) -> None:
    """Eventual writes are acknowledged before etcd has them: the replica that took one
    remembers its id (in memory) and answers a repeat its first answer."""
    job = Job(replicas)
    args: dict[str, Any] = {"operation": op(), "n": 4, "consistency": "eventual"}
    a = await job("counter.c.add", **args)
    b = await job("counter.c.add", **args)
    assert a == b
    offer: dict[str, Any] = {"operation": op(), "value": b"x", "consistency": "eventual"}
    await job("queue.q.offer", **offer)
    await job("queue.q.offer", **offer)
    # a poll takes the replica's own offer before etcd has it; its repeat answers that
    # item again and takes no other
    await job("queue.q.offer", value=b"y", consistency="eventual")
    poll: dict[str, Any] = {"operation": op(), "consistency": "eventual"}
    first = await job("queue.q.poll", **poll)
    assert first["found"] and await job("queue.q.poll", **poll) == first
    await replicas[0].flush()
    assert (await job("counter.c.get"))["value"] == 4
    assert (await job("queue.q.len"))["len"] == 1


# property: random histories with random repeats, against a model


Step = tuple[str, int, int]  # operation, argument, which earlier step to repeat (-1: new)


@st.composite
def histories(draw: st.DrawFn) -> list[Step]:
    steps: list[Step] = []
    for i in range(draw(st.integers(1, 30))):
        name = draw(st.sampled_from(["add", "offer", "poll", "set", "delete", "pop"]))
        again = draw(st.integers(-1, i - 1)) if i and draw(st.booleans()) else -1
        steps.append((name, draw(st.integers(0, 3)), again))
    return steps


class Model:
    """What the collections hold if each operation acts once: a repeat of one that acted
    is answered its first answer; a repeat of one that changed nothing acts now."""

    def __init__(self) -> None:
        self.counter = 0
        self.queue: list[bytes] = []
        self.dict: dict[str, bytes] = {}
        self.serial = 0

    def run(self, name: str, arg: int) -> tuple[dict[str, Any], bool]:
        """The answer, and whether it changed anything."""
        key = f"s{arg}"
        if name == "add":
            self.counter += arg + 1
            return {"value": self.counter}, True
        if name == "offer":
            self.serial += 1
            self.queue.append(b"%d" % self.serial)
            return {}, True
        if name == "poll":
            if not self.queue:
                return {"found": False, "value": None}, False
            return {"found": True, "value": self.queue.pop(0)}, True
        if name == "set":
            self.dict[key] = b"%d" % arg
            return {}, True
        if name == "delete":
            found = self.dict.pop(key, None) is not None
            return {"found": found}, found
        value = self.dict.pop(key, None)
        return {"found": value is not None, "value": value}, value is not None


def request(name: str, arg: int, serial: int) -> tuple[str, dict[str, Any]]:
    key = f"s{arg}"
    requests: dict[str, tuple[str, dict[str, Any]]] = {
        "add": ("counter.c.add", {"n": arg + 1}),
        "offer": ("queue.q.offer", {"value": b"%d" % serial}),
        "poll": ("queue.q.poll", {}),
        "set": ("dict.d.set", {"key": key, "value": b"%d" % arg}),
        "delete": ("dict.d.delete", {"key": key}),
        "pop": ("dict.d.pop", {"key": key}),
    }
    return requests[name]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(history=histories(), via=st.lists(st.integers(0, 1), min_size=30, max_size=30))
def test_random_histories_with_repeats_act_once(history: list[Step], via: list[int]) -> None:
    async def run() -> None:
        store = MemoryStore()
        engines = (Engine(store), Engine(store))
        job, model = Job(engines), Model()
        sent: dict[int, tuple[str, dict[str, Any], dict[str, Any], bool]] = {}
        root: list[int] = []  # each step's first sending
        try:
            for i, (name, arg, again) in enumerate(history):
                if again >= 0:
                    r = root[again]
                    root.append(r)
                    what, args, first, acted = sent[r]
                    answer = await job(what, via[i], **args)
                    if acted:
                        assert answer == first, (i, what)
                    else:  # it acted on nothing before: now it is the one time it acts
                        expected, acted = model.run(history[r][0], history[r][1])
                        assert answer == expected, (i, what)
                        sent[r] = (what, args, answer, acted)
                    continue
                root.append(i)
                what, args = request(name, arg, model.serial + 1)
                args["operation"] = op()
                expected, acted = model.run(name, arg)
                answer = await job(what, via[i], **args)
                assert answer == expected, (i, what)
                sent[i] = (what, args, answer, acted)
            assert (await job("counter.c.get"))["value"] == model.counter
            assert (await job("queue.q.len"))["len"] == len(model.queue)
            assert dict((await job("dict.d.items"))["items"]) == model.dict
        finally:
            for engine in engines:
                await engine.close()

    asyncio.run(run())


def test_eventual_ids_are_bounded_in_count_and_bytes() -> None:
    recent = Recent(size=3, budget=1000)
    for i in range(5):
        recent.put(b"k%d" % i, {"value": i})
    assert [recent.get(b"k%d" % i) for i in range(5)] == [
        None,
        None,
        *({"value": i} for i in (2, 3, 4)),
    ]
    recent.put(b"big", {"found": True, "value": b"x" * 800})
    assert recent.get(b"big") is not None and recent.held <= 1000
    assert sum(recent.get(b"k%d" % i) is not None for i in range(5)) <= 1
