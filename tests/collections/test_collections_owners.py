"""Owners (issue 41): a replica that owns a dict answers its strong reads from memory, and
nothing it answers is ever stale. Over the embedded store and a 3-member etcd: reads served
without a round trip, writes through another replica (the owner steps aside), a
linearizable history of two replicas; and the owner's failures: partitioned from the store
(its lease expires mid-operation, others write meanwhile), killed, a write of its own in
doubt, and its clock slow within the margin (and, to show the checks can fail, beyond it).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from linearizability import Operation, check_dict
from o41.collections import values
from o41.collections.checks import CollectionError, collection_prefix
from o41.collections.engine import Engine
from o41.collections.keys import encode_key
from o41.collections.owners import owner_key
from o41.state import (
    Compare,
    Delete,
    KeyValue,
    Op,
    Put,
    Store,
    StoreUnavailable,
    TxnResult,
    WatchEvent,
)
from o41.state.etcd import EtcdStore
from o41.state.memory import MemoryStore
from testbed.etcd import EtcdCluster

NS, COMPUTE = "team-a", "job-owners"


class Cut:
    """A store whose calls stall while ``cut`` (a partition between a replica and etcd,
    or a replica that stopped: nothing it sends arrives, nothing comes back); ``doubt``:
    the next write is applied and then fails as a timeout would."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cut = False
        self.doubt = False
        self.held: asyncio.Event | None = None  # writes applied, their answers held
        self.reads = 0

    async def _gate(self) -> None:
        while self.cut:  # noqa: ASYNC110 (a flag the test flips, like a cable)
            await asyncio.sleep(0.01)

    async def get(self, key: bytes, **kw: Any) -> KeyValue | None:
        await self._gate()
        self.reads += 1
        return await self.store.get(key, **kw)

    async def range(self, prefix: bytes, **kw: Any) -> list[KeyValue]:
        await self._gate()
        self.reads += 1
        return await self.store.range(prefix, **kw)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        await self._gate()
        return await self.store.put(key, value, lease=lease)

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        await self._gate()
        return await self.store.delete(key, prefix=prefix)

    async def take(self, start: bytes, end: bytes) -> list[KeyValue]:
        await self._gate()
        return await self.store.take(start, end)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        await self._gate()
        result = await self.store.txn(compare, success, failure)
        writes = any(isinstance(op, (Put, Delete)) for op in success)
        if self.doubt and writes:
            self.doubt = False
            raise StoreUnavailable("no answer in time: it may or may not have been applied")
        if self.held is not None and writes:
            await self.held.wait()
        return result

    async def lease_grant(self, ttl: int) -> int:
        await self._gate()
        return await self.store.lease_grant(ttl)

    async def lease_keepalive(self, lease: int) -> int:
        await self._gate()
        return await self.store.lease_keepalive(lease)

    async def lease_revoke(self, lease: int) -> None:
        await self._gate()
        await self.store.lease_revoke(lease)

    async def watch(self, prefix: bytes, **kw: Any) -> AsyncIterator[WatchEvent]:
        async for event in self.store.watch(prefix, **kw):
            await self._gate()
            yield event

    async def close(self) -> None:
        pass


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Store, Store, Store]]:
    """Two replicas' stores (each behind a :class:`Cut`) and a third to look with."""
    raw: list[Store]
    if request.param == "memory":
        shared = MemoryStore()
        raw = [shared, shared, shared]
    else:
        cluster: EtcdCluster = request.getfixturevalue("state_etcd")
        raw = [EtcdStore(cluster.endpoints, timeout=5) for _ in range(3)]
    try:
        yield raw[0], raw[1], raw[2]
    finally:
        for store in dict.fromkeys(raw):
            await store.close()


def engines(
    a: Store, b: Store, ttl: int = 2, clock: Callable[[], float] | None = None
) -> tuple[Engine, Engine, Cut, Cut]:
    cut_a, cut_b = Cut(a), Cut(b)
    ea = Engine(cut_a, owners="on", owner_ttl=ttl)
    eb = Engine(cut_b, owners="on", owner_ttl=ttl)
    if clock is not None:
        ea.owned.clock = clock
    return ea, eb, cut_a, cut_b


async def call(engine: Engine, name: str, op: str, key: str, value: Any = None) -> Any:
    args: dict[str, Any] = {"key": encode_key(key)}
    if value is not None:
        args["value"] = values.dumps(value)
    answer = await engine.call(NS, COMPUTE, "dict", name, op, args)
    if "value" in answer and isinstance(answer["value"], bytes):
        answer["value"] = values.loads(answer["value"])
    return answer


async def owns(engine: Engine, name: str, within: float = 5.0) -> None:
    """Read through ``engine`` until it owns ``name``'s entries."""
    entries = collection_prefix(NS, COMPUTE, "dict", name) + b"e/"
    deadline = time.monotonic() + within
    while engine.owned.serving(entries) is None:
        assert time.monotonic() < deadline, "the replica never came to own the dict"
        await call(engine, name, "get", "probe")
        await asyncio.sleep(0.01)


async def test_an_owner_answers_strong_reads_from_memory(stores: tuple[Store, ...]) -> None:
    ea, eb, cut_a, _ = engines(stores[0], stores[1])
    try:
        name = "served"
        await call(ea, name, "set", "k", 1)
        await owns(ea, name)
        before, served = cut_a.reads, ea.owned.stats.served
        for i in range(20):
            await call(ea, name, "set", "k", i)
            assert (await call(ea, name, "get", "k"))["value"] == i
            assert (await call(ea, name, "contains", "k"))["found"]
        assert (await call(ea, name, "delete", "k"))["found"]
        assert not (await call(ea, name, "get", "k"))["found"]
        assert cut_a.reads == before  # not one read went to the store
        assert ea.owned.stats.served - served == 41
        # the other replica reads from etcd and sees the same
        await call(ea, name, "set", "k", "last")
        assert (await call(eb, name, "get", "k"))["value"] == "last"
    finally:
        await ea.close()
        await eb.close()


async def test_a_write_through_another_replica_makes_the_owner_step_aside(
    stores: tuple[Store, ...],
) -> None:
    ea, eb, _, _ = engines(stores[0], stores[1])
    try:
        name = "aside"
        await call(ea, name, "set", "k", 1)
        await owns(ea, name)
        started = time.monotonic()
        await call(eb, name, "set", "k", 2)  # its guard fails: it asks, A gives up
        took = time.monotonic() - started
        assert ea.owned.stats.resigned == 1
        assert eb.owned.stats.stepped_aside == 1
        assert took < 1.0  # asked and answered, not a lease's expiry
        assert (await call(ea, name, "get", "k"))["value"] == 2
        entries = collection_prefix(NS, COMPUTE, "dict", name) + b"e/"
        assert ea.owned.serving(entries) is None  # and stays away for its cooldown
        assert await stores[2].get(owner_key(entries)) is None
    finally:
        await ea.close()
        await eb.close()


async def history(
    engines_: Sequence[Engine],
    name: str,
    seconds: float,
    workers: int = 6,
    during: Callable[[], Any] | None = None,
    op_timeout: float = 8.0,
    route: Callable[[str, random.Random], Engine | None] | None = None,
) -> list[Operation]:
    """Random dict operations on three keys, through the engines at random (or where
    ``route`` sends each, None: a read instead), for ``seconds``; an operation that fails
    or takes longer than ``op_timeout`` has an unknown outcome."""
    found: list[Operation] = []
    counter = itertools.count()
    stop = time.monotonic() + seconds

    async def worker(w: int) -> None:
        rng = random.Random(w)
        while time.monotonic() < stop:
            key = rng.choice("xyz")
            f = rng.choice(["get", "get", "get", "set", "delete", "pop", "contains", "setdefault"])
            engine = rng.choice(engines_) if route is None else route(f, rng)
            if engine is None:
                f, engine = "get", rng.choice(engines_)
            arg = f"{w}.{next(counter)}" if f in ("set", "setdefault") else None
            start = time.monotonic()
            try:
                async with asyncio.timeout(op_timeout):
                    answer = await call(engine, name, f, key, arg)
            except (TimeoutError, StoreUnavailable, CollectionError):
                found.append(Operation(key, f, arg, None, start, math.inf, w))
                continue
            result: Any
            if f == "get":
                result = answer["value"] if answer["found"] else None
            elif f == "set":
                result = None
            elif f in ("delete", "contains"):
                result = answer["found"]
            elif f == "pop":
                result = answer["value"] if answer["found"] else None
            else:
                result = answer["value"]
            found.append(Operation(key, f, arg, result, start, time.monotonic(), w))
            await asyncio.sleep(rng.random() * 0.003)

    tasks = [asyncio.create_task(worker(w)) for w in range(workers)]
    if during is not None:
        await during()
    await asyncio.gather(*tasks)
    return found


async def test_two_replicas_history_is_linearizable(stores: tuple[Store, ...]) -> None:
    ea, eb, _, _ = engines(stores[0], stores[1])
    try:
        name = "lin2"
        await owns(ea, name)
        ops = await history([ea, ea, ea, eb], name, 2.0)
        assert check_dict(ops) == []
        assert ea.owned.stats.served > 0  # the owner did answer from memory
    finally:
        await ea.close()
        await eb.close()


async def watch_owner_gone(store: Store, entries: bytes) -> float:
    """When the owner key of ``entries`` is deleted (monotonic time)."""
    async for event in store.watch(owner_key(entries)):
        if event.kind == "delete":
            return time.monotonic()
    raise AssertionError("the watch ended")


AFTER = "written after the lease"


async def partitioned(
    stores: tuple[Store, ...], clock: Callable[[], float] | None, heal: bool
) -> tuple[list[Operation], list[float], float, Any, Engine, Engine]:
    """A owns the dict, is cut from the store mid-run (its lease expires while its reads,
    writes and keep-alives stall) and, with ``heal``, comes back; B writes all along.
    Answers: the history, when A answered from memory as the owner elected first (once
    healed, it may be elected again, with a copy read anew), when that owner key went,
    and what B read back of its write after that."""
    ttl = 2
    ea, eb, cut_a, _ = engines(stores[0], stores[1], ttl=ttl, clock=clock)
    name = f"cut-{uuid.uuid4().hex[:6]}"
    entries = collection_prefix(NS, COMPUTE, "dict", name) + b"e/"
    await owns(ea, name)
    served_at: list[float] = []  # when A answered from the copy of its first election
    read, epoch = ea.owned.read, ea.owned.owned[entries].epoch

    async def spy(entries_: bytes, key: bytes) -> tuple[bool, KeyValue | None]:
        served, kv = await read(entries_, key)
        copy = ea.owned.owned.get(entries_)
        if served and copy is not None and copy.epoch == epoch:
            served_at.append(time.monotonic())
        return served, kv

    ea.owned.read = spy  # type: ignore[method-assign,assignment]
    gone = asyncio.create_task(watch_owner_gone(stores[2], entries))
    phase: dict[str, Engine | None] = {"writer": ea}

    def route(f: str, rng: random.Random) -> Engine | None:
        if f in ("get", "contains"):
            return rng.choice((ea, ea, eb))
        return phase["writer"]

    async def fault() -> None:
        await asyncio.sleep(0.4)
        phase["writer"] = None  # A's last writes are answered (its reads would wait for them)
        await asyncio.sleep(0.1)
        cut_a.cut = True  # what A has in flight stalls; its lease ends meanwhile
        phase["writer"] = eb  # B's writes ask A to step aside: A cannot hear it
        await asyncio.sleep(ttl + 2.0)
        if heal:
            cut_a.cut = False

    # long enough for B to write after the lease, on a loaded machine too
    ops = await history([ea, eb], name, ttl + 8.0, during=fault, op_timeout=5.0, route=route)
    async with asyncio.timeout(20):
        gone_at = await gone
        # liveness, apart from the history (whose writes are drawn at random, and whose
        # workers spend 5 s on each read routed to the cut A): with A still cut when
        # killed, B's write after the lease lands, and B reads it back
        await call(eb, name, "set", "x", AFTER)
        after = (await call(eb, name, "get", "x"))["value"]
    cut_a.cut = False  # killed: what is left of it may close
    return ops, served_at, gone_at, after, ea, eb


@pytest.mark.parametrize("heal", [True, False], ids=["partition", "killed"])
async def test_an_owner_cut_from_the_store_stops_serving_before_its_lease_ends(
    stores: tuple[Store, ...], heal: bool
) -> None:
    ops, served_at, gone_at, after, ea, eb = await partitioned(stores, None, heal)
    try:
        assert served_at, "the owner never answered from memory"
        assert max(served_at) < gone_at  # never served once its key could be gone
        assert check_dict(ops) == []
        assert after == AFTER  # the other replica writes once the lease is gone
    finally:
        await ea.close()
        await eb.close()


async def test_a_slow_clock_within_the_margin_is_safe(stores: tuple[Store, ...]) -> None:
    """A's clock runs 30% slow: with TTL 2 s it believes 1.0 s of safety (2 x 0.99 - 1)
    where 1.4 s of real time pass, still before the lease can end."""
    base = time.monotonic()
    ops, served_at, gone_at, after, ea, eb = await partitioned(
        stores, lambda: base + (time.monotonic() - base) * 0.7, heal=True
    )
    try:
        assert max(served_at) < gone_at
        assert check_dict(ops) == []
        assert after == AFTER
    finally:
        await ea.close()
        await eb.close()


async def test_a_clock_slower_than_the_margin_allows_is_caught() -> None:
    """The checks have teeth: a clock running at a third of the speed outlives the lease
    (1.0 s believed is 3 s real): A answers a value B overwrote after the key went. On
    the embedded store only, whose lease lasts exactly its TTL (etcd may grant more)."""
    shared = MemoryStore()
    stores = (shared, shared, shared)
    base = time.monotonic()
    ea, eb, cut_a, _ = engines(
        stores[0], stores[1], clock=lambda: base + (time.monotonic() - base) / 3
    )
    try:
        name = "skewed"
        entries = collection_prefix(NS, COMPUTE, "dict", name) + b"e/"
        await call(ea, name, "set", "k", "old")
        await owns(ea, name)
        cut_a.cut = True
        deadline = time.monotonic() + 5
        while await stores[2].get(owner_key(entries)) is not None:  # the lease expires
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await call(eb, name, "set", "k", "new")  # acknowledged
        served, kv = await ea.owned.read(entries, entries + encode_key("k").encode())
        assert served
        assert kv is not None
        assert values.loads(kv.value) == "old"  # stale: what the margin is for
    finally:
        cut_a.cut = False
        await ea.close()
        await eb.close()


async def test_a_write_in_doubt_makes_the_owner_read_from_the_store(
    stores: tuple[Store, ...],
) -> None:
    ea, eb, cut_a, _ = engines(stores[0], stores[1])
    try:
        name = "doubt"
        await call(ea, name, "set", "k", 1)
        await owns(ea, name)
        cut_a.doubt = True  # applied, then "no answer in time"
        with pytest.raises(StoreUnavailable, match="may or may not"):
            await call(ea, name, "set", "k", 2)
        assert ea.owned.stats.doubts == 1
        assert (await call(ea, name, "get", "k"))["value"] == 2  # from the store
    finally:
        await ea.close()
        await eb.close()


async def test_a_read_waits_for_the_owners_writes_in_flight(stores: tuple[Store, ...]) -> None:
    """A write committed in the store is visible to others before its answer reaches the
    owner: a read through the owner after another replica saw it must see it too."""
    ea, eb, cut_a, _ = engines(stores[0], stores[1])
    try:
        name = "inflight"
        await call(ea, name, "set", "k", "old")
        await owns(ea, name)
        cut_a.held = asyncio.Event()
        writing = asyncio.create_task(call(ea, name, "set", "k", "new"))
        async with asyncio.timeout(5):
            while (await call(eb, name, "get", "k"))["value"] != "new":  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        reading = asyncio.create_task(call(ea, name, "get", "k"))
        await asyncio.sleep(0.05)
        assert not reading.done()  # it waits for the write's answer
        cut_a.held.set()
        await writing
        assert (await reading)["value"] == "new"
        assert ea.owned.stats.served > 0
    finally:
        await ea.close()
        await eb.close()


WRITES = [
    ("dict", "set", {"value": b"v"}),
    ("dict", "setdefault", {"value": b"v"}),
    ("dict", "delete", {}),
    ("dict", "pop", {}),
    ("dict", "clear", {}),
    ("set", "add", {}),
    ("set", "remove", {}),
    ("registry", "register", {"value": b"v"}),
    ("registry", "unregister", {}),
]


@pytest.mark.parametrize("once", [False, True], ids=["plain", "with-id"])
@pytest.mark.parametrize(("kind", "op", "extra"), WRITES, ids=[f"{k}-{o}" for k, o, _ in WRITES])
async def test_every_write_path_carries_the_guard(
    kind: str, op: str, extra: dict[str, Any], once: bool
) -> None:
    """Whatever the write (with an operation id or not, strong or eventual), through a
    replica that does not own the collection it makes the owner step aside first."""
    store = MemoryStore()
    ea, eb, _, _ = engines(store, store)
    try:
        for consistency in ("strong", "eventual"):
            name = f"{kind}-{op}-{consistency}"
            key = encode_key("k")
            entries = collection_prefix(NS, COMPUTE, kind, name) + b"e/"
            read = "lookup" if kind == "registry" else "contains"
            seed = {"dict": "set", "set": "add", "registry": "register"}[kind]
            value = {} if kind == "set" else {"value": b"x"}
            await eb.call(NS, COMPUTE, kind, name, seed, {"key": key, **value})  # there to take
            deadline = time.monotonic() + 5
            while eb.owned.serving(entries) is None:
                assert time.monotonic() < deadline
                await eb.call(NS, COMPUTE, kind, name, read, {"key": key})
                await asyncio.sleep(0.01)
            args: dict[str, Any] = {"key": key, "consistency": consistency, **extra}
            if kind == "set" and op == "add":
                args.pop("consistency")
            if once:
                args["operation"] = uuid.uuid4().hex
            if consistency == "eventual" and op in ("setdefault", "pop", "delete", "remove"):
                continue  # these read the eventual copy: the same writes as set, below
            resigned = eb.owned.stats.resigned
            await ea.call(NS, COMPUTE, kind, name, op, args)
            await ea.flush()
            assert eb.owned.stats.resigned == resigned + 1, (kind, op, consistency)
            assert eb.owned.serving(entries) is None
    finally:
        await ea.close()
        await eb.close()


async def test_an_owner_gives_up_what_nobody_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from o41.collections import owners

    monkeypatch.setattr(owners, "IDLE", 0.2)
    store = MemoryStore()
    ea, eb, _, _ = engines(store, store)
    try:
        name = "idle"
        entries = collection_prefix(NS, COMPUTE, "dict", name) + b"e/"
        await owns(ea, name)
        assert await store.get(owner_key(entries)) is not None
        await asyncio.sleep(1.5)  # a keep-alive's turn (every TTL/4 = 0.5 s) finds it idle
        assert ea.owned.owned == {}
        assert await store.get(owner_key(entries)) is None  # others need not ask
    finally:
        await ea.close()
        await eb.close()


def test_the_owners_setting_is_off_guard_or_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from o41.webhook.collections.service import Options

    monkeypatch.delenv("O41_COLLECTIONS_OWNERS", raising=False)
    assert Options.from_environment().owners == "off"  # the default: no guard, no owners
    for value in ("off", "guard", "on"):
        monkeypatch.setenv("O41_COLLECTIONS_OWNERS", value)
        assert Options.from_environment().owners == value
    monkeypatch.setenv("O41_COLLECTIONS_OWNERS", "1")
    with pytest.raises(ValueError, match="off, guard or on"):
        Options.from_environment()
    store = MemoryStore()
    assert Engine(store, owners="off").store is store  # no guard: the writes of before
    guarded = Engine(store, owners="guard")
    assert guarded.store is guarded.owned
    assert not guarded.owned.campaign


@pytest.mark.etcd
async def test_an_owner_answers_through_an_etcd_election(etcd_cluster: EtcdCluster) -> None:
    """etcd's leader killed: the owner's lease lives on (a new leader renews every lease),
    nothing can be written meanwhile, and the owner goes on answering strong reads from
    its copy, within its safe time, without waiting for the election."""
    stores = [EtcdStore(etcd_cluster.endpoints, timeout=5) for _ in range(2)]
    ea = Engine(stores[0], owners="on", owner_ttl=5)
    eb = Engine(stores[1], owners="on", owner_ttl=5)
    try:
        name = "election"
        await call(ea, name, "set", "x", "before")
        await owns(ea, name)
        await asyncio.to_thread(etcd_cluster.kill, etcd_cluster.leader())
        served = ea.owned.stats.served
        slowest = 0.0
        for _ in range(50):  # right after the kill, while etcd elects a leader
            started = time.monotonic()
            assert (await call(ea, name, "get", "x"))["value"] == "before"
            slowest = max(slowest, time.monotonic() - started)
        assert ea.owned.stats.served - served == 50
        assert slowest < 0.5  # no read waited for the election (a call to the dead leader: 1 s)

        def route(f: str, rng: random.Random) -> Engine | None:
            return rng.choice((ea, ea, eb)) if f in ("get", "contains") else ea

        ops = await history([ea, eb], name, 4.0, op_timeout=6.0, route=route)
        ops.insert(0, Operation("x", "set", "before", None, -2.0, -1.0, -1))
        assert check_dict(ops) == []
        assert any(o.f == "set" and not o.unknown for o in ops[1:])  # writes went on
    finally:
        await ea.close()
        await eb.close()
        for store in stores:
            await store.close()


async def test_an_owner_keeps_no_copy_larger_than_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from o41.collections import owners

    monkeypatch.setattr(owners, "MAX_COPY_BYTES", 10_000)
    store = MemoryStore()
    ea, eb, _, _ = engines(store, store)
    try:
        await call(ea, "small", "set", "k", "v")
        await owns(ea, "small")
        small = collection_prefix(NS, COMPUTE, "dict", "small") + b"e/"
        assert 0 < ea.owned.owned[small].size < 100
        for i in range(3):  # grows past the bound through its owner: given up
            await call(ea, "small", "set", f"big{i}", "x" * 4000)
        assert ea.owned.serving(small) is None
        assert (await call(ea, "small", "get", "big2"))["value"] == "x" * 4000  # from etcd
        for i in range(3):  # too big to be owned at all
            await call(ea, "large", "set", f"big{i}", "x" * 4000)
        for _ in range(20):
            await call(ea, "large", "get", "big0")
            await asyncio.sleep(0.01)
        large = collection_prefix(NS, COMPUTE, "dict", "large") + b"e/"
        assert ea.owned.serving(large) is None
        assert ea.owned.stats.campaigns >= 2
        assert await store.get(owner_key(large)) is None  # released at once
    finally:
        await ea.close()
        await eb.close()
