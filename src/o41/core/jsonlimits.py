"""How deep a JSON text nests, measured before it is parsed.

A parser recurses once per ``[`` or ``{``: 100,000 of them in a request body make Python's
``json`` raise ``RecursionError``. Every JSON text the service is sent (request bodies,
WebSocket messages, the arrays inside encoded keys) is measured here first, so that too
deep a text is refused with a message, never parsed.

Cheap for what real clients send: a text with at most ``max_depth`` opening brackets
cannot nest deeper, which two ``count`` calls (C speed) tell. A text with more has its
strings removed (brackets inside them do not nest) and its arrays and objects counted;
past ``max_containers`` it is refused for that (no request of this API holds more than a
few), else the running depth of its at most ``max_containers`` brackets is measured.
"""

from __future__ import annotations

import itertools
import operator
import re

MAX_DEPTH = 32  # request bodies: ours nest 2 levels (a WebSocket message's args, a place)
MAX_CONTAINERS = 1000  # arrays and objects in one request body: ours have a handful

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")  # opening 2, closing 0: minus 1 is ±1


class TooDeep(ValueError):
    """A JSON text nested deeper, or holding more arrays and objects, than allowed."""


def check_depth(
    text: bytes | str,
    max_depth: int = MAX_DEPTH,
    what: str = "the JSON",
    max_containers: int = MAX_CONTAINERS,
) -> None:
    """Raise :class:`TooDeep`, saying what was wrong, if ``text`` nests deeper than
    ``max_depth`` levels or holds more than ``max_containers`` arrays and objects.
    Brackets inside strings do not count (nor do unbalanced closing ones)."""
    if isinstance(text, str):
        opening = text.count("[") + text.count("{")
    else:
        opening = text.count(b"[") + text.count(b"{")
    if opening <= max_depth:
        return  # cannot nest deeper than it has brackets
    data = text.encode(errors="surrogatepass") if isinstance(text, str) else text
    structure = _STRING.sub(b"", data)
    containers = structure.count(b"[") + structure.count(b"{")
    if containers > max_containers:
        raise TooDeep(
            f"{what} holds {containers} arrays and objects; at most {max_containers} are "
            "accepted: send a flatter request"
        )
    steps = structure.translate(_STEP, _NOT_BRACKETS)
    deepest = max(itertools.accumulate(map(operator.sub, steps, itertools.repeat(1))), default=0)
    if deepest > max_depth:
        raise TooDeep(
            f"{what} nests {deepest} levels deep (arrays and objects inside each other); "
            f"at most {max_depth} are accepted: send a flatter request"
        )
