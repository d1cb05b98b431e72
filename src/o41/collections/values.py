"""Values: pickled by the client, stored and served as opaque bytes by the service.

The service never unpickles anything. Clients load values with a *restricted* unpickler
that can build only plain data, so a value written by any pod of the namespace cannot run
code in a reader. What round-trips (and what a write accepts):

- ``None``, ``bool``, ``int``, ``float`` (NaN and infinities too), ``complex``, ``str``,
  ``bytes``, ``bytearray``;
- ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` of the above, nested at will,
  with ``collections.OrderedDict``, ``deque``, ``Counter`` and ``defaultdict`` (of
  ``list``, ``dict``, ``set``, ``int``);
- ``range``, ``slice``, ``datetime.date``/``time``/``datetime``/``timedelta``/``timezone``,
  ``decimal.Decimal``, ``fractions.Fraction``, ``uuid.UUID``.

Anything else (a class instance, a NumPy array, a model) is refused at write time with a
:class:`TypeError`: convert it (``array.tolist()``, ``model.state_dict()`` as plain data,
or bytes you serialize yourself), or, when every pod that can write to the namespace's
collections is trusted, set ``O41_COLLECTIONS_PICKLE=1`` in every pod of the job: then
values are full pickles, and reading one can run code its writer chose.

Serialized values are limited to :data:`MAX_VALUE` bytes (etcd is for coordination, not
for checkpoints: put large objects in artifacts and store their names here).
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import io
import os
import pickle
import uuid
from typing import Any

MAX_VALUE = 512 * 1024  # bytes, serialized
PROTOCOL = 5
ENV_PICKLE = "O41_COLLECTIONS_PICKLE"

_ALLOWED_TYPES: frozenset[type] = frozenset(
    {
        complex,
        bytearray,
        range,
        slice,
        datetime.date,
        datetime.time,
        datetime.datetime,
        datetime.timedelta,
        datetime.timezone,
        decimal.Decimal,
        fractions.Fraction,
        uuid.UUID,
        uuid.SafeUUID,
        collections.OrderedDict,
        collections.deque,
        collections.Counter,
        collections.defaultdict,
    }
)
# the globals a reader may resolve: constructors of plain values, nothing that runs code
_ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {(t.__module__, t.__qualname__) for t in _ALLOWED_TYPES}
    | {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "list"),
        ("builtins", "dict"),
        ("builtins", "int"),
        ("builtins", "bytearray"),
        ("_codecs", "encode"),  # how protocol < 3 spells bytes: encodes text, nothing else
    }
)
_DEFAULT_FACTORIES = (list, dict, set, int)


class ValueTooLarge(ValueError):
    """A serialized value over :data:`MAX_VALUE` bytes."""


def full_pickle() -> bool:
    return os.environ.get(ENV_PICKLE, "") in ("1", "true", "yes")


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if isinstance(obj, type) and (obj.__module__, obj.__qualname__) in _ALLOWED_GLOBALS:
            return NotImplemented  # a reference to an allowed constructor
        if kind in _ALLOWED_TYPES:
            if kind is collections.defaultdict and obj.default_factory not in _DEFAULT_FACTORIES:
                raise TypeError(
                    "a defaultdict is stored only with list, dict, set or int as its factory"
                )
            return NotImplemented
        raise TypeError(
            f"values of type {kind.__module__}.{kind.__qualname__} are not stored: use plain "
            "data (see o41.collections.values), or set O41_COLLECTIONS_PICKLE=1 in every pod "
            "if every pod that can write this namespace's collections is trusted"
        )


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = "builtins" if module == "__builtin__" else module  # protocols 0-2
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: only plain data is loaded (a value written "
            "with O41_COLLECTIONS_PICKLE=1 needs it in the reader too)"
        )


def dumps(value: object) -> bytes:
    """``value`` as bytes; :class:`TypeError` for a type not stored, :class:`ValueTooLarge`
    past :data:`MAX_VALUE`."""
    if full_pickle():
        data = pickle.dumps(value, PROTOCOL)
    else:
        buffer = io.BytesIO()
        _PlainPickler(buffer, PROTOCOL).dump(value)
        data = buffer.getvalue()
    if len(data) > MAX_VALUE:
        raise ValueTooLarge(
            f"value too large: {len(data)} bytes serialized, the limit is {MAX_VALUE}; "
            "store large objects as artifacts and keep their names here"
        )
    return data


def loads(data: bytes) -> Any:
    """The value ``data`` holds (plain data only, unless full pickles are on)."""
    if full_pickle():
        return pickle.loads(data)  # noqa: S301 - opted in: every writer is trusted
    return _PlainUnpickler(io.BytesIO(data)).load()
