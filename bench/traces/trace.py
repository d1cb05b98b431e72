"""Traces in SkyStore's CSV format: ``timestamp,op,issue_region,obj_key,size``.

One row per request, in time order (a file out of order is sorted, stably):

- ``timestamp``: seconds (an integer or decimal number, any epoch) or an ISO 8601 time;
- ``op``: ``write``/``PUT`` (a new version of the object; an earlier one is replaced, as
  an overwrite in S3 or a checkpoint rotated away), ``read``/``GET`` (the object's current
  version), ``delete``/``DELETE``; ``HEAD`` and other metadata requests move no bytes
  and are skipped;
- ``issue_region``: where the request comes from, ``cloud:region`` (``aws:us-east-1``);
- ``obj_key``: the object (an artifact, or one checkpoint of it);
- ``size``: bytes (a read's size is the version's; a delete's is ignored).

A header row is optional. A row that cannot be used stops the load with
:class:`TraceError` naming the file, the line and the field: a replay of a trace read
wrongly would prove nothing.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

Op = Literal["write", "read", "delete"]
COLUMNS = ("timestamp", "op", "issue_region", "obj_key", "size")
OPS: dict[str, Op | None] = {
    "write": "write",
    "put": "write",
    "read": "read",
    "get": "read",
    "delete": "delete",
    "head": None,  # metadata only: no bytes move
}


class TraceError(ValueError):
    """A trace row that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # seconds
    op: Op
    cloud: str
    region: str
    key: str
    size: int

    def row(self) -> list[str]:
        stamp = f"{self.time:.3f}".rstrip("0").rstrip(".")
        return [stamp, self.op, f"{self.cloud}:{self.region}", self.key, str(self.size)]


def _time(raw: str, where: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        try:
            parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(
                f"{where}: timestamp {raw!r} is neither seconds nor an ISO 8601 time"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return parsed.timestamp()
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: timestamp {raw!r} must be a finite number of seconds >= 0")
    return value


def _place(raw: str, where: str) -> tuple[str, str]:
    cloud, sep, region = raw.partition(":")
    if not sep or not cloud or not region or ":" in region:
        raise TraceError(
            f"{where}: issue_region {raw!r} must be cloud:region (for example aws:us-east-1)"
        )
    if cloud != cloud.lower():
        raise TraceError(f"{where}: cloud {cloud!r} must be lower-case (aws, gcp, azure...)")
    return cloud, region


def _size(raw: str, where: str, op: Op) -> int:
    if op == "delete" and raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{where}: size {raw!r} must be a whole number of bytes") from None
    if value < 0:
        raise TraceError(f"{where}: size {value} must be >= 0 bytes")
    return value


def parse(rows: Iterable[list[str]], name: str = "the trace") -> list[Event]:
    """The events of ``rows`` (CSV fields), sorted by time; TraceError on a bad row."""
    events = []
    for number, row in enumerate(rows, start=1):
        where = f"{name}, line {number}"
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        fields = [f.strip() for f in row]
        if number == 1 and [f.lower() for f in fields] == list(COLUMNS):
            continue
        if len(fields) != len(COLUMNS):
            raise TraceError(
                f"{where}: {len(fields)} fields, expected {len(COLUMNS)} ({','.join(COLUMNS)})"
            )
        stamp, raw_op, region, key, size = fields
        if raw_op.lower() not in OPS:
            raise TraceError(
                f"{where}: op {raw_op!r} is not one of write/PUT, read/GET, delete/DELETE, HEAD"
            )
        op = OPS[raw_op.lower()]
        if op is None:
            continue
        if not key:
            raise TraceError(f"{where}: obj_key is empty")
        cloud, reg = _place(region, where)
        events.append(Event(_time(stamp, where), op, cloud, reg, key, _size(size, where, op)))
    events.sort(key=lambda e: e.time)
    return events


def read_trace(file: TextIO, name: str = "the trace") -> list[Event]:
    return parse(csv.reader(file), name)


def load(path: str | Path) -> list[Event]:
    """The events of the CSV file at ``path``."""
    with Path(path).open(newline="") as f:
        return read_trace(f, str(path))


def write(events: Iterable[Event], file: TextIO) -> None:
    out = csv.writer(file, lineterminator="\n")
    out.writerow(COLUMNS)
    for e in events:
        out.writerow(e.row())


def rows(events: Iterable[Event]) -> Iterator[list[str]]:
    for e in events:
        yield e.row()
