"""What the usage page keeps between two reads of the same window: merges of the periods
that are over (they no longer change) and the parsed records of the open ones (parsed
again only when flushed to since), so a page reads and parses little."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from o41.core.usage import Record, records_from
from o41.state import KeyValue

CLOSED_AFTER = 120.0  # seconds after its end before a period is taken as over: clock skew
CLOSED_KEPT = 3600.0  # seconds a merge of closed periods is kept
CLOSED_RECORDS = 400_000  # records kept in all merges, at most


def closed(granularity: Literal["hour", "day"], period: str, now: float) -> bool:
    """No replica adds to ``period`` any more: a flush goes to the hour and day of its own
    clock, so a period is over once it ended (and the clocks' skew passed)."""
    fmt = "%Y-%m-%dT%H" if granularity == "hour" else "%Y-%m-%d"
    start = dt.datetime.strptime(period, fmt).replace(tzinfo=dt.UTC)
    length = dt.timedelta(hours=1) if granularity == "hour" else dt.timedelta(days=1)
    return (start + length).timestamp() + CLOSED_AFTER <= now


class ClosedPeriods:
    """A replica's merges of closed periods' records, by organization and periods (one
    period, or a window's set), kept an hour and at most CLOSED_RECORDS records in all:
    the page then reads only the open hour or day from the store. Records
    of closed periods change only when the retention sweep folds records of the older
    layout in, which clears this replica's merges (others' expire within the hour)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, tuple[str, ...]], tuple[float, list[Any]]] = {}
        self._records = 0

    def get(self, key: tuple[str, tuple[str, ...]], now: float) -> list[Any] | None:
        hit = self._kept.get(key)
        if hit is None or now - hit[0] > CLOSED_KEPT:
            return None
        return hit[1]

    def put(self, key: tuple[str, tuple[str, ...]], value: list[Any], now: float) -> None:
        old = self._kept.pop(key, None)
        self._records -= len(old[1]) if old else 0
        self._kept[key] = (now, value)
        self._records += len(value)
        while self._records > CLOSED_RECORDS and len(self._kept) > 1:  # the oldest first
            _, dropped = self._kept.pop(next(iter(self._kept)))
            self._records -= len(dropped)

    def clear(self) -> None:
        self._kept.clear()
        self._records = 0


OPEN_ENTRIES = 100_000


class OpenRecords:
    """The page's parsed records of open periods by key, with the revision they were
    parsed at: a page parses again only the keys flushed to since the last."""

    def __init__(self) -> None:
        self._parsed: dict[bytes, tuple[int, Record | None]] = {}

    def split(self, kvs: list[KeyValue]) -> tuple[list[Record], list[KeyValue]]:
        """The records parsed already (at their key's revision), and the keys to parse."""
        kept: list[Record] = []
        fresh: list[KeyValue] = []
        for kv in kvs:
            hit = self._parsed.get(kv.key)
            if hit is not None and hit[0] == kv.mod_revision:
                if hit[1] is not None:
                    kept.append(hit[1])
            else:
                fresh.append(kv)
        return kept, fresh

    def keep(self, kvs: list[KeyValue], loaded: list[Any]) -> list[Record]:
        """The records of ``loaded`` (the values of ``kvs``), kept for the next page."""
        if len(self._parsed) + len(kvs) > OPEN_ENTRIES:
            self._parsed.clear()
        found = []
        for kv, raw in zip(kvs, loaded, strict=True):
            records = records_from([raw])
            record = records[0] if records else None
            self._parsed[kv.key] = (kv.mod_revision, record)
            if record is not None:
                found.append(record)
        return found
