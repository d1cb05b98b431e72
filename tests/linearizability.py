"""A linearizability checker for histories of dict operations, one register per key.

Wing & Gong's search with Lowe's memoization (as in Knossos and Porcupine): walk the
history's call and return events in time order; at a call, try to linearize that operation
now (its result must be what the register gives); at a return of an operation not yet
linearized, undo the last choice. A state (set of linearized operations, register value)
seen before is not explored twice. Keys are independent (P-compositionality): a dict history
is linearizable iff each key's sub-history is.

An operation whose outcome is unknown (it failed with "may or may not have been applied")
has no return (it may take effect at any time after its call, or never) and no result to
match.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

MISSING: Any = "<missing>"


@dataclass
class Operation:
    """One call: ``f`` in get, set, delete, pop, contains, setdefault."""

    key: Hashable
    f: str
    arg: Any = None
    result: Any = None
    call: float = 0.0
    ret: float = math.inf  # math.inf: the outcome is unknown
    process: int = 0

    @property
    def unknown(self) -> bool:
        return self.ret == math.inf


def step(state: Any, op: Operation) -> tuple[bool, Any]:
    """Apply ``op`` to a register holding ``state``: (the result matches, the new state)."""
    expected, new = apply(state, op.f, op.arg)
    return op.unknown or expected == op.result, new


def apply(state: Any, f: str, arg: Any) -> tuple[Any, Any]:
    """What ``f(arg)`` returns on a register holding ``state``, and the new state."""
    if f == "get":
        expected, new = (None if state is MISSING else state), state
    elif f == "set":
        expected, new = None, arg
    elif f == "delete":
        expected, new = state is not MISSING, MISSING
    elif f == "pop":
        expected, new = (None if state is MISSING else state), MISSING
    elif f == "contains":
        expected, new = state is not MISSING, state
    elif f == "setdefault":
        new = arg if state is MISSING else state
        expected = new
    else:
        raise ValueError(f"unknown operation {f!r}")
    return expected, new


@dataclass
class _Entry:
    op: Operation
    index: int
    is_call: bool
    time: float
    match: _Entry | None = None
    prev: _Entry | None = field(default=None, repr=False)
    next: _Entry | None = field(default=None, repr=False)


def _lift(entry: _Entry) -> None:
    """Take a call and its return out of the list."""
    for e in (entry, entry.match):
        assert e is not None and e.prev is not None
        e.prev.next = e.next
        if e.next is not None:
            e.next.prev = e.prev


def _unlift(entry: _Entry) -> None:
    for e in (entry.match, entry):
        assert e is not None and e.prev is not None
        e.prev.next = e
        if e.next is not None:
            e.next.prev = e


def check_register(history: list[Operation], initial: Any = MISSING) -> bool:
    """Whether one key's ``history`` is linearizable, starting from ``initial``."""
    if not history:
        return True
    events: list[_Entry] = []
    for i, op in enumerate(history):
        call = _Entry(op, i, True, op.call)
        ret = _Entry(op, i, False, op.ret)
        call.match, ret.match = ret, call
        events += [call, ret]
    # by time; at a tie a return goes first (the operations did not overlap)
    events.sort(key=lambda e: (e.time, e.is_call))
    head = _Entry(history[0], -1, False, -math.inf)
    previous = head
    for e in events:
        previous.next, e.prev = e, previous
        previous = e

    state = initial
    linearized = 0
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[_Entry, Any]] = []
    entry = head.next
    while head.next is not None:
        assert entry is not None
        if entry.is_call:
            ok, new_state = step(state, entry.op)
            if ok:
                bits = linearized | (1 << entry.index)
                if (bits, _hashable(new_state)) not in cache:
                    cache.add((bits, _hashable(new_state)))
                    stack.append((entry, state))
                    state, linearized = new_state, bits
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:  # a return before its operation was linearized: undo the last choice
            if not stack:
                return False
            undone, state = stack.pop()
            linearized &= ~(1 << undone.index)
            _unlift(undone)
            entry = undone.next
    return True


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def check_dict(history: Iterable[Operation]) -> list[Hashable]:
    """The keys whose sub-history is not linearizable (empty: the history is)."""
    by_key: dict[Hashable, list[Operation]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    return [key for key, ops in by_key.items() if not check_register(ops)]
