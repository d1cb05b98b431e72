"""The state store's contract: the same tests on the embedded store and on a real etcd.

Keys, revisions, versions, transactions (compares and both branches), leases (keep-alive,
revoke, expiry), watches from a past revision: what the collections and the placement
service rely on, with etcd's own answers as the reference.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from o41.state import (
    Compare,
    Delete,
    Get,
    LeaseNotFound,
    Put,
    Store,
    StoreUnavailable,
    WatchEvent,
    open_store,
    prefix_end,
)
from o41.state.etcd import EtcdStore
from o41.state.memory import MemoryStore
from testbed.etcd import EtcdCluster

T = TypeVar("T")


@pytest.fixture(
    params=[
        "memory",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("etcd-tls", marks=pytest.mark.etcd),
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        made: Store = MemoryStore()
    elif request.param == "etcd":
        cluster: EtcdCluster = request.getfixturevalue("state_etcd")
        made = EtcdStore(cluster.endpoints, timeout=5)
    else:  # over TLS, with a client certificate
        cluster = request.getfixturevalue("state_etcd_tls")
        made = EtcdStore(cluster.endpoints, timeout=5, tls=cluster.client_tls)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
def p() -> bytes:
    return f"/test/{uuid.uuid4().hex}/".encode()


async def next_event(events: AsyncIterator[WatchEvent], seconds: float = 10) -> WatchEvent:
    return await asyncio.wait_for(anext(events), seconds)


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


def test_open_store_picks_the_backend() -> None:
    assert isinstance(open_store(None), MemoryStore)
    assert isinstance(open_store(["http://127.0.0.1:1"]), EtcdStore)
    assert isinstance(open_store(["https://127.0.0.1:1"]), EtcdStore)  # test_state_etcd_tls
    with pytest.raises(ValueError, match="etcd client URL"):
        EtcdStore(["unix:///run/etcd.sock"])


async def until_caught_up(
    read: Callable[[], Awaitable[T]], caught_up: Callable[[T], bool], seconds: float = 10
) -> list[T]:
    """Every answer of an eventual ``read``, up to the first that is ``caught_up`` or the
    deadline: an eventual read may lag, then catches up (o41.state.Consistency). The caller
    checks that each answer was a state that was."""
    deadline = time.monotonic() + seconds
    answers = [await read()]
    while not caught_up(answers[-1]) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the poll interval of a wait on a condition
        answers.append(await read())
    return answers


async def test_put_get_revisions_and_versions(store: Store, p: bytes) -> None:
    assert await store.get(p + b"k") is None
    r1 = await store.put(p + b"k", b"one")
    r2 = await store.put(p + b"k", b"two")
    assert r2 > r1
    kv = await store.get(p + b"k")
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"two", r1, r2, 2)
    # an eventual read may lag (o41.state.Consistency): a state that was, then the write

    async def read() -> tuple[bytes, int] | None:
        kv = await store.get(p + b"k", consistency="eventual")
        return None if kv is None else (kv.value, kv.mod_revision)

    answers = await until_caught_up(read, lambda seen: seen == (b"two", r2))
    assert all(seen in (None, (b"one", r1), (b"two", r2)) for seen in answers), answers
    assert answers[-1] == (b"two", r2)
    assert await store.delete(p + b"k") == 1
    assert await store.delete(p + b"k") == 0
    assert await store.get(p + b"k") is None
    r3 = await store.put(p + b"k", b"three")  # created again: a new life
    kv = await store.get(p + b"k")
    assert kv is not None and (kv.create_revision, kv.version) == (r3, 1)


async def test_range_is_sorted_limited_and_prefix_exact(store: Store, p: bytes) -> None:
    for k in (b"b", b"a", b"c/x", b"c"):
        await store.put(p + b"r/" + k, k)
    await store.put(p + b"rr", b"outside")  # shares the bytes "r" but not the prefix "r/"
    got = await store.range(p + b"r/")
    assert [kv.key for kv in got] == [p + b"r/" + k for k in (b"a", b"b", b"c", b"c/x")]
    assert [kv.value for kv in await store.range(p + b"r/", limit=2)] == [b"a", b"b"]
    window = await store.range(p + b"r/", start=p + b"r/b", end=p + b"r/c/")
    assert [kv.value for kv in window] == [b"b", b"c"]  # from start, before end
    beyond = await store.range(p + b"r/", end=p + b"s")  # an end past the prefix: the prefix's
    assert len(beyond) == 4
    assert await store.delete(p + b"r/", prefix=True) == 4
    assert await store.range(p + b"r/") == []
    assert await store.get(p + b"rr") is not None


async def test_an_eventual_range_is_one_earlier_revision_then_catches_up(
    store: Store, p: bytes
) -> None:
    """An eventual read may lag (one member answers from what it has applied), but what it
    answers is the store at one revision: the writes up to some point, none after it, and
    it reaches the last write (o41.state.Consistency)."""
    order = [b"b", b"a", b"c/x", b"c"]
    revisions = {p + b"r/" + k: await store.put(p + b"r/" + k, k) for k in order}

    async def read() -> dict[bytes, int]:
        kvs = await store.range(p + b"r/", consistency="eventual")
        return {kv.key: kv.mod_revision for kv in kvs}

    answers = await until_caught_up(read, lambda got: len(got) == len(order))
    for got in answers:
        assert all(revisions[key] == rev for key, rev in got.items())  # as written, no other
        upto = max(got.values(), default=0)
        assert set(got) == {key for key, rev in revisions.items() if rev <= upto}  # a prefix
    seen = [len(got) for got in answers]
    assert seen[-1] == len(order), seen
    assert seen == sorted(seen)  # the one member it asks never goes back


async def test_a_prefix_compare_is_over_every_key_under_it(store: Store, p: bytes) -> None:
    """Compare(prefix=True), as etcd compares a range: each key under the prefix must
    pass; none there compares as one absent key (a value compare then fails)."""
    empty = Compare(p + b"w/", "create", "==", 0, prefix=True)
    assert (await store.txn([empty], [])).succeeded
    await store.put(p + b"w/a", b"1")
    await store.put(p + b"wx", b"outside the prefix")
    assert not (await store.txn([empty], [])).succeeded
    assert (await store.txn([Compare(p + b"w/", "version", ">", 0, prefix=True)], [])).succeeded
    await store.put(p + b"w/b", b"2")
    assert not (
        await store.txn([Compare(p + b"w/", "value", "==", b"1", prefix=True)], [])
    ).succeeded
    assert not (
        await store.txn([Compare(p + b"v/", "value", "==", b"", prefix=True)], [])
    ).succeeded


async def test_a_prefix_compare_with_an_end_is_over_the_keys_before_it(
    store: Store, p: bytes
) -> None:
    """``end`` narrows the range to the keys under the prefix that sort before it (a
    queue's "no item older than this one")."""
    await store.put(p + b"q/02", b"x")
    await store.put(p + b"q/05", b"y")

    def none_before(end: bytes) -> Compare:
        return Compare(p + b"q/", "create", "==", 0, prefix=True, end=end)

    assert (await store.txn([none_before(p + b"q/02")], [])).succeeded
    assert not (await store.txn([none_before(p + b"q/03")], [])).succeeded
    await store.delete(p + b"q/02")
    assert (await store.txn([none_before(p + b"q/05")], [])).succeeded
    assert not (await store.txn([none_before(p + b"q/06")], [])).succeeded
    assert not (await store.txn([none_before(p + b"r")], [])).succeeded  # past the prefix


async def test_txn_compares_and_branches(store: Store, p: bytes) -> None:
    k = p + b"t"
    # a missing key: version, create and mod compare as 0; a value compare fails
    absent = await store.txn([Compare(k, "version", "==", 0)], [Put(k, b"1")], [Get(k)])
    assert absent.succeeded and absent.results == ((),)
    assert not (await store.txn([Compare(p + b"none", "value", "==", b"")], [], [])).succeeded
    assert (await store.txn([Compare(p + b"none", "mod", "==", 0)], [], [])).succeeded
    kv = await store.get(k)
    assert kv is not None and kv.mod_revision == absent.revision

    stale = await store.txn(
        [Compare(k, "mod", "==", kv.mod_revision - 1)], [Put(k, b"x")], [Get(k)]
    )
    assert not stale.succeeded and [x.value for x in stale.results[0]] == [b"1"]
    assert stale.revision == absent.revision  # a failed guard writes nothing

    ok = await store.txn(
        [Compare(k, "value", "==", b"1"), Compare(k, "version", ">", 0)],
        [Put(k, b"2"), Put(p + b"u", b"u"), Get(k)],
    )
    assert ok.succeeded and ok.revision > absent.revision
    assert ok.results[0] == () and ok.results[1] == ()
    assert [x.value for x in ok.results[2]] == [b"2"]
    two = await store.get(k)
    u = await store.get(p + b"u")
    assert two is not None and u is not None and two.mod_revision == u.mod_revision == ok.revision

    gone = await store.txn([Compare(k, "create", "==", kv.create_revision)], [Delete(k)])
    assert gone.succeeded and [x.value for x in gone.results[0]] == [b"2"]
    assert await store.get(k) is None
    assert (await store.txn([], [Delete(p, prefix=True)])).results[0][0].key == p + b"u"

    with pytest.raises(ValueError, match="duplicate key"):
        await store.txn([], [Put(k, b"a"), Put(k, b"b")])
    with pytest.raises(ValueError, match="duplicate key"):
        await store.txn([], [Delete(p, prefix=True), Put(k, b"b")])


async def test_leases_keepalive_revoke_and_expiry(store: Store, p: bytes) -> None:
    lease = await store.lease_grant(30)
    await store.put(p + b"a", b"a", lease=lease)
    await store.put(p + b"b", b"b", lease=lease)
    kv = await store.get(p + b"a")
    assert kv is not None and kv.lease == lease
    assert await store.lease_keepalive(lease) > 0
    await store.lease_revoke(lease)
    assert await store.range(p) == []
    assert await store.lease_keepalive(lease) == 0
    await store.lease_revoke(lease)  # revoking twice is fine
    with pytest.raises(LeaseNotFound):
        await store.put(p + b"c", b"c", lease=lease)
    with pytest.raises(LeaseNotFound):
        await store.txn([], [Put(p + b"c", b"c", lease=lease)])

    short = await store.lease_grant(1)
    revision = await store.put(p + b"short", b"s", lease=short)
    events = store.watch(p, start_revision=revision + 1)
    event = await next_event(events)  # the lease runs out: its key goes
    assert (event.kind, event.kv.key) == ("delete", p + b"short")
    assert await store.get(p + b"short") is None
    await events.aclose()  # type: ignore[attr-defined]


async def test_watch_from_a_past_revision_in_order(store: Store, p: bytes) -> None:
    first = await store.put(p + b"w/1", b"a")
    await store.put(p + b"w/2", b"b")
    await store.put(p + b"other", b"not watched")
    await store.delete(p + b"w/1")
    events = store.watch(p + b"w/", start_revision=first)
    seen = [await next_event(events) for _ in range(3)]
    assert [(e.kind, e.kv.key, e.kv.value) for e in seen] == [
        ("put", p + b"w/1", b"a"),
        ("put", p + b"w/2", b"b"),
        ("delete", p + b"w/1", b""),
    ]
    assert [e.kv.mod_revision for e in seen] == sorted(e.kv.mod_revision for e in seen)
    later = await store.put(p + b"w/3", b"c")
    event = await next_event(events)
    assert (event.kind, event.kv.key, event.kv.mod_revision) == ("put", p + b"w/3", later)
    await events.aclose()  # type: ignore[attr-defined]


async def test_memory_store_closed_refuses() -> None:
    store = MemoryStore()
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.get(b"k")


# etcd only: failures of members


def endpoint_index(store: EtcdStore) -> int:
    return store._current


@pytest.mark.etcd
async def test_etcd_fails_over_when_the_member_in_use_dies(etcd_cluster: EtcdCluster) -> None:
    store = EtcdStore(etcd_cluster.endpoints, timeout=5)
    try:
        await store.leader_known()
        await store.put(b"/fo/before", b"1")
        in_use = endpoint_index(store)
        assert in_use == etcd_cluster.leader()
        etcd_cluster.kill(in_use)
        deadline = time.monotonic() + 30
        written = 0
        failures = 0
        while written < 20:  # a write in flight during the election may fail; then none
            try:
                await store.put(b"/fo/after/%d" % written, b"x")
                written += 1
            except StoreUnavailable:
                failures += 1
                assert time.monotonic() < deadline
        assert failures <= 2
        assert endpoint_index(store) != in_use
        assert len(await store.range(b"/fo/after/")) == 20
        got = await store.get(b"/fo/before", consistency="eventual")
        assert got is not None and got.value == b"1"
    finally:
        await store.close()


@pytest.mark.etcd
async def test_etcd_without_majority_fails_in_bounded_time_then_recovers(
    etcd_cluster: EtcdCluster,
) -> None:
    store = EtcdStore(etcd_cluster.endpoints, timeout=2)
    try:
        await store.put(b"/maj/acked", b"1")
        survivor = etcd_cluster.leader()
        dead = [i for i in range(3) if i != survivor]
        for i in dead:
            etcd_cluster.kill(i)
        for attempt in (store.put(b"/maj/lost", b"x"), store.get(b"/maj/acked")):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"did not answer|failed"):
                await attempt
            assert time.monotonic() - started < 10  # bounded: never a hang
        # the member left alone still answers serializable reads
        stale = await store.get(b"/maj/acked", consistency="eventual")
        assert stale is not None and stale.value == b"1"
        etcd_cluster.restart(dead[0])
        deadline = time.monotonic() + 30
        while True:
            try:
                await store.put(b"/maj/after", b"2")
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "etcd did not recover"
        acked = await store.get(b"/maj/acked")
        assert acked is not None and acked.value == b"1"
    finally:
        await store.close()
