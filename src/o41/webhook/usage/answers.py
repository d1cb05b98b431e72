"""What ``GET /v1/usage`` answers: both answers of the usage page for a window, or a page
of the window's raw counter records. Each answer's one description, built here from the
report of ``o41.core.usage`` and made the document's schemas by ``o41.webhook.openapi``;
the report's parts inside (places, reads, prices...) are the core's own JSON."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from pydantic import Field
from typing_extensions import TypedDict

from o41.core.usage import WINDOWS, Record, Report


class UsageRecord(TypedDict):
    """A stored counter record: of one hour (``hour``) or one day (``day``), UTC."""

    kind: str
    hour: NotRequired[Annotated[str, Field(description="YYYY-MM-DDTHH, on an hourly record.")]]
    day: NotRequired[Annotated[str, Field(description="YYYY-MM-DD, on a daily record.")]]
    dims: dict[str, str]
    counts: dict[str, int]


# "from" is a keyword: the functional form
Window = TypedDict(
    "Window",
    {
        "organization": str,
        "window": Annotated[str, Field(json_schema_extra={"enum": list(WINDOWS)})],
        "from": Annotated[str, Field(description="The window's first hour, YYYY-MM-DDTHH.")],
        "to": Annotated[str, Field(description="The window's last hour (this one).")],
    },
)


class UsageWrites(TypedDict):
    """What was written from where: in all, the part that left its writer's region, by
    writer place, by how writers found their place."""

    total: dict[str, Any]
    leftRegion: dict[str, Any]
    places: list[dict[str, Any]]
    bySource: list[dict[str, Any]]


class UsageOut(Window):
    """Both answers of the usage page for the window."""

    summary: Annotated[str, Field(description="Where a new location pays, in words.")]
    saving: Annotated[
        dict[str, Any] | None,
        Field(description="The region the summary names, what it keeps and saves, net."),
    ]
    writes: UsageWrites
    reads: dict[str, Any]
    cleanup: Annotated[
        list[dict[str, Any]],
        Field(
            description="Per location: the uploads of expired writes (abandoned, aborted, "
            "notAborted: uploads and the bytes their writes declared) and the versions "
            "retention deleted (versions, bytes)."
        ),
    ]
    prices: dict[str, Any]


class UsageRecordsOut(Window):
    """With ``records=true``: a page of the window's raw counter records."""

    records: list[UsageRecord]
    next: Annotated[str | None, Field(description="The cursor of the next page; null on the last.")]


def report_json(organization: str, report: Report) -> UsageOut:
    """Both answers of ``report``, as ``/v1/usage`` answers them."""
    return {
        "organization": organization,
        "window": report.window,
        "from": report.first_hour,
        "to": report.last_hour,
        "summary": report.summary,
        "saving": report.saving.as_json() if report.saving else None,
        "writes": {
            "total": report.written.as_json("versions"),
            "leftRegion": report.left_region.as_json("versions"),
            "places": [p.as_json() for p in report.places],
            "bySource": [s.as_json() for s in report.sources],
        },
        "reads": report.reads.as_json(),
        "cleanup": [c.as_json() for c in report.cleanups],
        "prices": report.prices.as_json(),
    }


def record_json(record: Record) -> UsageRecord:
    """A counter record as ``/v1/usage?records=true`` answers it."""
    if record.daily:
        return {
            "kind": record.kind,
            "day": record.hour,
            "dims": dict(record.dims),
            "counts": dict(record.counts),
        }
    return {
        "kind": record.kind,
        "hour": record.hour,
        "dims": dict(record.dims),
        "counts": dict(record.counts),
    }
