"""The servers' logs: text (the default) or one JSON object per line (``--log-format json``).

A JSON line holds ``time`` (RFC 3339, UTC), ``level``, ``logger`` and ``message``, then what
is known of the work it is about: ``request_id``, ``organization``, ``location`` (docs of
each server). The placement service knows them per request (:data:`context`, set by its
request middleware); the operator's lines are formatted by kopf's own JSON formatter with
these same field names (``o41.operator.__main__``), the object a line is about as kopf's
``object`` reference.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: What a line may say of the work it is about, beyond time, level, logger and message.
CONTEXT = ("request_id", "organization", "location")

#: The work the running task is about (a request of the placement service): field -> value.
context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "o41_log_context", default=None
)


def known(**fields: str | None) -> None:
    """Say what the running task's work is about (those of :data:`CONTEXT`); its later
    lines carry it. Outside of :func:`about`, nothing is kept."""
    current = context.get()
    if current is not None:
        current.update({k: v for k, v in fields.items() if v and k in CONTEXT})


@contextmanager
def about(**fields: str | None) -> Iterator[dict[str, str]]:
    """A unit of work (a request): its lines carry ``fields`` and what :func:`known` adds."""
    mine = {k: v for k, v in fields.items() if v and k in CONTEXT}
    token = context.set(mine)
    try:
        yield mine
    finally:
        context.reset(token)


def format_time(created: float) -> str:
    return dt.datetime.fromtimestamp(created, dt.UTC).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; an exception's traceback is its ``exception`` field."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": format_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(context.get() or {})
        for key in CONTEXT:  # given with extra={...} on the call
            value = getattr(record, key, None)
            if value:
                line[key] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT)


def configure(log_format: str, level: int = logging.INFO) -> None:
    """The root logger writes to stderr in ``log_format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
