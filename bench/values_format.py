"""What the collections' value format costs: MessagePack (``o41.collections.values``)
against the restricted pickle it replaced, and plain pickle for reference.

    .venv/bin/python bench/values_format.py [--repeat 7]

Prints, for typical values, the µs per dumps and per loads (the best of ``--repeat``
timings of many calls each) and the serialized size. The old format is rebuilt here as it
was (a pickler whose ``reducer_override`` refused other types, an unpickler resolving
only allowed constructors), to compare against what a reader paid before.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import io
import pickle
import timeit
from collections.abc import Callable
from typing import Any

from o41.collections import values

_OLD_GLOBALS = {
    ("builtins", name)
    for name in ("set", "frozenset", "list", "dict", "int", "bytearray", "complex", "range")
} | {("_codecs", "encode"), ("datetime", "datetime"), ("datetime", "timezone")}
_OLD_GLOBALS |= {("collections", "OrderedDict"), ("datetime", "timedelta")}


class _OldPickler(pickle.Pickler):
    """The restricted pickler as it was: a Python callback for every object pickle does
    not handle itself."""

    def reducer_override(self, obj: Any) -> Any:
        return NotImplemented


class _OldUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _OLD_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused {module}.{name}")


def old_dumps(value: object) -> bytes:
    buffer = io.BytesIO()
    _OldPickler(buffer, 5).dump(value)
    return buffer.getvalue()


def old_loads(data: bytes) -> Any:
    return _OldUnpickler(io.BytesIO(data)).load()


VALUES: dict[str, object] = {
    "small dict": {"step": 1200, "loss": 0.0431, "name": "run-7", "done": False},
    "1000 floats": [i * 0.5 for i in range(1000)],
    "100 KiB bytes": bytes(range(256)) * 400,
    "dict of 100 tuples": {f"k{i}": (i, i * 1.5, "x") for i in range(100)},
    "a datetime": datetime.datetime(2026, 12, 1, 12, 30, tzinfo=datetime.UTC),
    "nested (OrderedDict)": collections.OrderedDict(a=[1, 2, {"b": (3, 4)}], c={5, 6}),
}

FORMATS: dict[str, tuple[Callable[[object], bytes], Callable[[bytes], Any]]] = {
    "msgpack (new)": (values.dumps, values.loads),
    "restricted pickle (old)": (old_dumps, old_loads),
    "pickle, unrestricted": (lambda v: pickle.dumps(v, 5), pickle.loads),
}


def best(call: Callable[[], object], repeat: int) -> float:
    """µs per call: the best of ``repeat`` timings, each of enough calls for 0.05 s."""
    timer = timeit.Timer(call)
    number, _ = timer.autorange()
    number = max(1, number // 4)
    return min(timer.repeat(repeat, number)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'value':<22} {'format':<24} {'dumps µs':>9} {'loads µs':>9} {'bytes':>8}")
    for name, value in VALUES.items():
        for fmt, (dumps, loads) in FORMATS.items():
            data = dumps(value)
            assert loads(data) == value
            d = best(functools.partial(dumps, value), args.repeat)
            load = best(functools.partial(loads, data), args.repeat)
            print(f"{name:<22} {fmt:<24} {d:>9.2f} {load:>9.2f} {len(data):>8}")
        print()


if __name__ == "__main__":
    main()
