"""Operation ids: what makes a retried operation apply once (issue 39).

A client that retries a non-idempotent operation (a counter add, a queue offer or poll, a
dict write, ...) sends the same id with every attempt, in the field :data:`OPERATION_FIELD`
of the operation's arguments: 32 lowercase hexadecimal characters (``uuid4().hex``). The
service writes the operation's first answer under that id, in the very transaction of its
effect, and answers a repeat with it; an id is remembered for :data:`REMEMBERED_FOR`
seconds (at most a minute more). Pure rules, no I/O."""

from __future__ import annotations

import re

OPERATION_FIELD = "operation"
"""The argument that carries an operation's id (the client's constant of the same name)."""

REMEMBERED_FOR = 600
"""Seconds a first answer is kept for its repeats, at least (its lease: one a minute, so at
most 60 s more). A retry comes within the client's retry deadline, a few minutes."""

_ID = re.compile(r"[0-9a-f]{32}")


def check_operation(value: object) -> str:
    """``value`` as an operation id, or :class:`ValueError` saying what is wrong."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        if not isinstance(value, str):
            raise ValueError(
                f"{OPERATION_FIELD} must be a text of 32 lowercase hexadecimal characters "
                f"(uuid4().hex), not {type(value).__name__}"
            )
        shown = value[:40] + ("..." if len(value) > 40 else "")
        raise ValueError(
            f"{OPERATION_FIELD} must be 32 lowercase hexadecimal characters (uuid4().hex), "
            f"not {shown!r} ({len(value)} characters)"
        )
    return value
