"""Group commit of the begins' pending records (o41.webhook.writes.batching)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from o41.state import Compare, LeaseNotFound, Op, StoreUnavailable, TxnResult
from o41.state.memory import MemoryStore
from o41.webhook.writes.batching import MAX_BATCH, PutBatcher


class CountingStore(MemoryStore):
    """The embedded store, counting transactions and able to fail the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions: list[int] = []  # operations in each
        self.fail_next = False

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self.transactions.append(len(success))
        if self.fail_next:
            self.fail_next = False
            raise StoreUnavailable("etcd did not answer a transaction within 5 s")
        return await super().txn(compare, success, failure)


async def test_concurrent_puts_share_transactions_and_each_is_committed() -> None:
    store = CountingStore()
    batcher = PutBatcher(store)
    n = 250
    revisions = await asyncio.gather(
        *(batcher.put(f"/k/{i}".encode(), f"v{i}".encode()) for i in range(n))
    )
    assert sum(store.transactions) == n
    assert len(store.transactions) < n  # shared, not one each
    assert max(store.transactions) <= MAX_BATCH  # etcd's limit on operations
    for i, revision in enumerate(revisions):
        found = await store.get(f"/k/{i}".encode())
        assert found is not None and found.value == f"v{i}".encode()
        assert found.mod_revision == revision


async def test_a_lone_put_goes_at_once() -> None:
    store = CountingStore()
    await PutBatcher(store).put(b"/alone", b"x")
    assert store.transactions == [1]


async def test_a_failed_transaction_fails_each_of_its_callers_and_the_next_batch_goes_on() -> None:
    store = CountingStore()
    batcher = PutBatcher(store)
    store.fail_next = True
    first = await asyncio.gather(
        *(batcher.put(f"/a/{i}".encode(), b"x") for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailable) for r in first)
    assert await store.get(b"/a/0") is None
    await batcher.put(b"/b", b"y")
    found = await store.get(b"/b")
    assert found is not None and found.value == b"y"


@pytest.mark.parametrize("n", [1, 3])
async def test_leases_travel_with_their_puts(n: int) -> None:
    store = CountingStore()
    lease = await store.lease_grant(60)
    batcher = PutBatcher(store)
    await asyncio.gather(*(batcher.put(f"/l/{i}".encode(), b"x", lease=lease) for i in range(n)))
    await store.lease_revoke(lease)
    assert await store.get(b"/l/0") is None  # gone with its lease


async def test_a_lost_lease_fails_only_the_puts_that_named_it() -> None:
    """A batch whose puts name two leases, one of them gone from the store: the callers of
    the lost lease see LeaseNotFound (and can put again with a new one); the others'
    records are committed."""
    store = CountingStore()
    kept, lost = await store.lease_grant(60), await store.lease_grant(60)
    await store.lease_revoke(lost)
    batcher = PutBatcher(store)
    results = await asyncio.gather(
        *(batcher.put(b"/m/%d" % i, b"x", lease=kept if i % 2 else lost) for i in range(6)),
        return_exceptions=True,
    )
    assert [isinstance(r, LeaseNotFound) for r in results] == [True, False] * 3
    assert [kv.key for kv in await store.range(b"/m/")] == [b"/m/1", b"/m/3", b"/m/5"]
