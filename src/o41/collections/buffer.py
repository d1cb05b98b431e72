"""The eventual writes this service replica acknowledged and etcd does not have yet, over
every collection: which collections hold some, how many (past ``max_buffer`` more are
refused), and which of them a flush under way has taken. The engine owns one; each
collection's copy (``replica.Replica``) adds to it, the engine's flush drains and requeues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from o41.collections.checks import Busy


class Holder(Protocol):
    """A collection's buffered writes, as the buffer counts them."""

    @property
    def prefix(self) -> bytes: ...

    @property
    def backlog(self) -> int:
        """Its writes not sent to etcd yet."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing to send."""
        ...


H = TypeVar("H", bound=Holder)


class Buffer(Generic[H]):
    """``count`` is the eventual writes waiting for etcd: one more per acknowledged write,
    recounted exactly (from the holders' backlogs) when a flush ends. ``wake`` is called
    when a full batch (``max_batch``) waits that no flush under way has taken."""

    def __init__(
        self, max_buffer: int, max_batch: int, wake: Callable[[], None] = lambda: None
    ) -> None:
        self.max_buffer, self.max_batch, self.wake = max_buffer, max_batch, wake
        self.count = 0
        self._in_flight = 0  # of ``count``: taken by the flush under way
        self._holders: dict[bytes, H] = {}
        self._seq = 0

    def admit(self) -> None:
        """Refuse an eventual write when too many wait for etcd."""
        if self.count >= self.max_buffer:
            raise Busy(
                f"{self.count} eventual writes are waiting for etcd on this replica: "
                "etcd is slow or unreachable; try again, or use strong consistency to wait"
            )

    def next_seq(self) -> int:
        """A number for a buffered write, larger than every earlier one's."""
        self._seq += 1
        return self._seq

    def add(self, holder: H) -> None:
        """``holder`` buffered one more write (admitted first): it goes with the next
        flush; a full batch wakes the flusher, not counting what a flush under way took,
        so a write arriving meanwhile goes with the next batch."""
        self.count += 1
        self._holders[holder.prefix] = holder
        if self.count - self._in_flight >= self.max_batch:
            self.wake()

    def discard(self, n: int) -> None:
        """``n`` buffered writes left without being written (a poll took this replica's
        own offer, a clear dropped the offers)."""
        self.count -= n

    def drain(self) -> list[H]:
        """For a flush: the holders with writes, which the buffer forgets until they are
        requeued; what is buffered now counts as in flight."""
        holders = list(self._holders.values())
        self._holders.clear()
        self._in_flight = self.count
        return holders

    def requeue(self, holders: Iterable[H]) -> None:
        """The flush ended: the drained ``holders`` that still have writes (not written,
        or arrived meanwhile) go with the next one, and the count is exact again."""
        for holder in holders:
            if not holder.idle:
                self._holders[holder.prefix] = holder
        self.count = sum(holder.backlog for holder in self._holders.values())
        self._in_flight = 0
