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
import time

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


class about:
    """A unit of work (a request): its lines carry ``fields`` and what :func:`known` adds.
    A class, not a ``contextmanager`` generator: entered once a request, where the
    generator's machinery cost about 3 us (issue 41)."""

    __slots__ = ("_token", "fields")

    def __init__(self, **fields: str | None) -> None:
        self.fields = {k: v for k, v in fields.items() if v and k in CONTEXT}

    def __enter__(self) -> dict[str, str]:
        self._token = context.set(self.fields)
        return self.fields

    def __exit__(self, *exc: object) -> None:
        context.reset(self._token)


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


class TextFormatter(logging.Formatter):
    """``TEXT``, its time as ``logging.Formatter`` writes it (``2026-12-07 03:14:45,123``,
    local time), the part to the second made once a second rather than on every line:
    ``time.strftime`` was a fifth of the access line's cost (issue 41)."""

    def __init__(self) -> None:
        super().__init__(TEXT)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second[0]:
            self._second = (second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second)))
        return f"{self._second[1]},{int(record.msecs):03d}"


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure(log_format: str, level: int = logging.INFO) -> None:
    """The root logger writes to stderr in ``log_format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
