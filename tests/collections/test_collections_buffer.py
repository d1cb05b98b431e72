"""The eventual writes' buffer on its own: what it counts, refuses, drains and requeues."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.collections.buffer import Buffer
from o41.collections.checks import Busy


@dataclass(eq=False)
class Writes:
    """A collection's buffered writes, as few as the buffer needs to see."""

    prefix: bytes
    backlog: int = 0

    @property
    def idle(self) -> bool:
        return self.backlog == 0


def test_past_max_buffer_a_write_is_refused_naming_the_count() -> None:
    buffer: Buffer[Writes] = Buffer(max_buffer=2, max_batch=100)
    holder = Writes(b"d/")
    for _ in range(2):
        buffer.admit()
        holder.backlog += 1
        buffer.add(holder)
    with pytest.raises(Busy, match="2 eventual writes are waiting for etcd on this replica"):
        buffer.admit()
    buffer.discard(1)  # a poll took one of this replica's own offers
    buffer.admit()


def test_a_full_batch_wakes_the_flusher_but_not_what_a_flush_took() -> None:
    wakes: list[int] = []
    buffer: Buffer[Writes] = Buffer(max_buffer=100, max_batch=2, wake=lambda: wakes.append(1))
    holder = Writes(b"d/")
    holder.backlog = 1
    buffer.add(holder)
    assert wakes == []
    holder.backlog = 2
    buffer.add(holder)
    assert wakes == [1]
    assert buffer.drain() == [holder]  # the flush takes both
    holder.backlog = 3
    buffer.add(holder)  # arrives meanwhile: one waits, not a full batch
    assert wakes == [1]
    holder.backlog = 1  # the two were written
    buffer.requeue([holder])
    assert buffer.count == 1
    assert buffer.drain() == [holder]


def test_requeue_keeps_what_was_not_written_and_forgets_what_was() -> None:
    buffer: Buffer[Writes] = Buffer(max_buffer=100, max_batch=100)
    written, failed = Writes(b"a/", 1), Writes(b"b/", 1)
    buffer.add(written)
    buffer.add(failed)
    drained = buffer.drain()
    assert drained == [written, failed]
    assert buffer.drain() == []  # drained holders wait for their requeue
    written.backlog = 0
    buffer.requeue(drained)
    assert buffer.count == 1
    assert buffer.drain() == [failed]


def test_sequence_numbers_grow() -> None:
    buffer: Buffer[Writes] = Buffer(max_buffer=1, max_batch=1)
    first = buffer.next_seq()
    assert buffer.next_seq() > first


steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from([b"a/", b"b/", b"c/"])),
        st.tuples(st.just("take"), st.sampled_from([b"a/", b"b/", b"c/"])),
        st.tuples(st.just("flush"), st.sets(st.sampled_from([b"a/", b"b/", b"c/"]))),
    ),
    max_size=60,
)


@given(steps)
def test_the_count_is_exact_after_every_flush_and_never_below_the_backlog(
    ops: list[tuple[str, object]],
) -> None:
    """Writes, writes leaving unwritten and flushes (each writing some collections'
    backlogs, failing for the others) in any order: between flushes the count is at least
    what waits (a rewritten key is counted twice until the flush), after one it is exact,
    and every collection with writes goes with a flush."""
    buffer: Buffer[Writes] = Buffer(max_buffer=10_000, max_batch=10_000)
    holders = {p: Writes(p) for p in (b"a/", b"b/", b"c/")}
    for op, arg in ops:
        if op == "write":
            assert isinstance(arg, bytes)
            buffer.admit()
            holders[arg].backlog += 1
            buffer.add(holders[arg])
        elif op == "take":
            assert isinstance(arg, bytes)
            if holders[arg].backlog:
                holders[arg].backlog -= 1
                buffer.discard(1)
        else:
            assert isinstance(arg, set)
            drained = buffer.drain()
            assert {h.prefix for h in drained} >= {p for p, h in holders.items() if h.backlog}
            for holder in drained:
                if holder.prefix in arg:
                    holder.backlog = 0
            buffer.requeue(drained)
            assert buffer.count == sum(h.backlog for h in holders.values())
        assert buffer.count >= sum(h.backlog for h in holders.values())
