"""Values: serialized by the client, stored and served as opaque bytes by the service.

The service never decodes a value. Clients write plain data as MessagePack, a format
that can only *describe* data: a reader builds exactly what the bytes spell out, so a
value written by any pod of the namespace can neither run code in a reader nor make it
allocate more than a small multiple of the value's own size (the old restricted pickle
let 46 bytes call ``bytearray(2**28)``). The first byte says the format:

========  =====================================================================
``M``     MessagePack plain data (the default)
``P``     a full pickle (``O41_COLLECTIONS_PICKLE=1``: every writer trusted)
``\\x80``  a pickle of a client before the format byte: read only with
          ``O41_COLLECTIONS_PICKLE=1``, refused otherwise (:class:`UnreadableValue`)
========  =====================================================================

What round-trips, with its MessagePack form (``ext n``: extension type ``n`` whose
payload is itself MessagePack unless said otherwise):

==============================  ==============================================
``None``, ``bool``, ``str``     nil, true/false, str
``int`` in [-2**63, 2**64)      int; larger: ``ext 6`` (signed big-endian bytes)
``float`` (NaN, ±inf, -0.0)     float 64
``bytes``                       bin
``list``, ``dict``              array, map (any keys of this table that hash)
``tuple``                       ``ext 1`` [items]
``set``, ``frozenset``          ``ext 2``, ``ext 3`` [items]
``bytearray``                   ``ext 4`` (the raw bytes)
``complex``                     ``ext 5`` [real, imag]
``decimal.Decimal``             ``ext 7`` (its text: NaN, sNaN, -0, exponents)
``fractions.Fraction``          ``ext 8`` [numerator, denominator]
``uuid.UUID``                   ``ext 9`` (16 bytes)
``datetime.date``               ``ext 10`` [year, month, day]
``datetime.time``               ``ext 11`` [hour, minute, second, µs, fold, tz]
``datetime.datetime``           ``ext 12`` [year … µs, fold, tz]
``datetime.timedelta``          ``ext 13`` [days, seconds, µs]
``datetime.timezone``           ``ext 14`` [offset as ext 13, name or nil]
``collections.OrderedDict``     ``ext 15`` {items}
``collections.Counter``         ``ext 16`` {items}
``collections.defaultdict``     ``ext 17`` [factory: 0 list, 1 dict, 2 set, 3 int, {items}]
``collections.deque``           ``ext 18`` [maxlen or nil, [items]]
``range``                       ``ext 19`` [start, stop, step] (a range, never a list)
``slice``                       ``ext 20`` [start, stop, step]
==============================  ==============================================

Anything else (a class instance, a NumPy array, a model, a ``datetime`` with another
``tzinfo`` than ``timezone``) is refused at write time with a :class:`TypeError`: convert
it, or, when every pod that can write to the namespace's collections is trusted, set
``O41_COLLECTIONS_PICKLE=1`` in every pod of the job (values are then full pickles, and
reading one can run code its writer chose).

Bounds: a serialized value is at most :data:`MAX_VALUE` bytes; every length a reader
meets is bounded by the bytes actually there (msgpack's ``max_*_len`` follow the value's
size), nothing is built from a count alone, and extension types nest at most
:data:`MAX_DEPTH` levels (msgpack's own arrays and maps: its unpacker's fixed stack, a
``StackError``). See docs/collections.md for the measured cost against pickle.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import os
import pickle
import uuid
from collections.abc import Callable
from typing import Any, cast

import msgpack

MAX_VALUE = 512 * 1024  # bytes, serialized
MAX_DEPTH = 100  # containers inside each other (the writer), extension types (the reader)
PROTOCOL = 5
ENV_PICKLE = "O41_COLLECTIONS_PICKLE"

PLAIN = b"M"
PICKLE = b"P"
LEGACY = 0x80  # the first byte of a pickle (protocol 2 and later): a client before the tag

_TUPLE, _SET, _FROZENSET, _BYTEARRAY, _COMPLEX, _BIGINT, _DECIMAL, _FRACTION = range(1, 9)
_UUID, _DATE, _TIME, _DATETIME, _TIMEDELTA, _TIMEZONE, _ORDERED, _COUNTER = range(9, 17)
_DEFAULTDICT, _DEQUE, _RANGE, _SLICE = range(17, 21)
_FACTORIES: tuple[type, ...] = (list, dict, set, int)


class ValueTooLarge(ValueError):
    """A serialized value over :data:`MAX_VALUE` bytes."""


class UnreadableValue(ValueError):
    """Stored bytes this reader does not load: not a value, a full pickle (or one of an
    older client) without ``O41_COLLECTIONS_PICKLE=1``, or past a bound."""


def full_pickle() -> bool:
    return os.environ.get(ENV_PICKLE, "") in ("1", "true", "yes")


def dumps(value: object) -> bytes:
    """``value`` as bytes; :class:`TypeError` for a type not stored, :class:`ValueTooLarge`
    past :data:`MAX_VALUE`."""
    if full_pickle():
        data = PICKLE + pickle.dumps(value, PROTOCOL)
    else:
        try:
            data = PLAIN + _Encoder().pack(value)
        except ValueError as e:  # msgpack's own nesting limit
            raise ValueError(f"value nested too deep to store: {e}") from None
    if len(data) > MAX_VALUE:
        raise ValueTooLarge(
            f"value too large: {len(data)} bytes serialized, the limit is {MAX_VALUE}; "
            "store large objects as artifacts and keep their names here"
        )
    return data


def loads(data: bytes) -> Any:
    """The value ``data`` holds; :class:`UnreadableValue` for bytes this reader refuses."""
    if len(data) > MAX_VALUE + 1:
        raise UnreadableValue(f"a stored value of {len(data)} bytes: over the limit")
    tag = data[:1]
    if tag == PLAIN:
        try:
            return _Decoder().unpack(memoryview(data)[1:])
        except UnreadableValue:
            raise
        except (ValueError, TypeError, OverflowError, IndexError, decimal.InvalidOperation) as e:
            # msgpack's FormatError, StackError, ExtraData are ValueErrors; an unhashable
            # map key a TypeError
            raise UnreadableValue(f"not a stored value ({type(e).__name__}: {e})") from None
    if tag == PICKLE or (data[:1] and data[0] == LEGACY):
        if full_pickle():
            return pickle.loads(data[1:] if tag == PICKLE else data)  # noqa: S301 - opted in
        older = "" if tag == PICKLE else "an older o41 client's pickle, "
        raise UnreadableValue(
            f"this value is {older}a full pickle and is not loaded: loading one can run "
            "code its writer chose. Set O41_COLLECTIONS_PICKLE=1 in this pod if every pod "
            "that can write this namespace's collections is trusted, or write the value "
            "again with this client (plain data)"
        )
    raise UnreadableValue(f"not a stored value (format byte {data[:1]!r})")


class _Encoder:
    """One value's encoding: types msgpack does not know go to :meth:`default`, which
    packs their contents with a packer of its own (the payload of an extension type)."""

    def __init__(self) -> None:
        self.depth = 0

    def pack(self, value: object) -> bytes:
        if _holds_buffer(value):
            value = _marked(value)
        # a packer a payload (a packer is not reentrant); never kept: it refers to us
        packer = msgpack.Packer(
            default=self.default,
            strict_types=True,
            use_bin_type=True,
            buf_size=1024 if self.depth else 256 * 1024,
        )
        packed: bytes = packer.pack(value)
        return packed

    def default(self, obj: Any) -> msgpack.ExtType:
        kind = type(obj)
        encode = _ENCODERS.get(kind)
        if encode is None:
            raise TypeError(
                f"values of type {kind.__module__}.{kind.__qualname__} are not stored: use "
                "plain data (see o41.collections.values), or set O41_COLLECTIONS_PICKLE=1 in "
                "every pod if every pod that can write this namespace's collections is trusted"
            )
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ValueError(f"more than {MAX_DEPTH} levels of tuples, sets and the like")
            code, payload = encode(self, obj)
        finally:
            self.depth -= 1
        return tuple.__new__(msgpack.ExtType, (code, payload))  # past its checks: ours hold


# msgpack packs a bytearray (and a memoryview) as bin, without asking ``default``, and bin
# reads back as bytes. So each list or dict about to be packed (the value, and each payload
# of an extension type) has its items' types looked at, at C speed; only one that holds a
# bytearray is copied, with each bytearray marked for ``default``. Other containers are
# looked into when their own payload is packed.
class _ByteArray:
    __slots__ = ("data",)

    def __init__(self, data: bytearray) -> None:
        self.data = bytes(data)


_BUFFERS: frozenset[type] = frozenset({bytearray, memoryview})
_SCANNED: frozenset[type] = _BUFFERS | {list, dict}


def _holds_buffer(obj: object, depth: int = 0) -> bool:
    kind = type(obj)
    if kind is list:
        items: Any = obj
    elif kind is dict:
        items = cast(dict[Any, Any], obj).values()  # keys hash: never a bytearray
    else:
        return kind in _BUFFERS
    if depth > MAX_DEPTH:
        raise ValueError(f"more than {MAX_DEPTH} levels of lists and dicts")
    kinds = set(map(type, items))
    if kinds.isdisjoint(_SCANNED):
        return False  # the usual case
    return not kinds.isdisjoint(_BUFFERS) or any(
        _holds_buffer(item, depth + 1) for item in items if type(item) in _SCANNED
    )


def _marked(obj: Any, depth: int = 0) -> Any:
    """``obj`` with each bytearray marked (a copy of the lists and dicts that hold one)."""
    kind = type(obj)
    if kind is bytearray:
        return _ByteArray(obj)
    if kind is memoryview:
        raise TypeError("values of type builtins.memoryview are not stored: store bytes(view)")
    if depth > MAX_DEPTH:
        raise ValueError(f"more than {MAX_DEPTH} levels of lists and dicts")
    if kind is list:
        return [_marked(item, depth + 1) for item in obj]
    if kind is dict:
        return {k: _marked(v, depth + 1) for k, v in obj.items()}
    return obj


def _items(self: _Encoder, obj: Any) -> bytes:
    return self.pack(list(obj))


def _mapping(self: _Encoder, obj: Any) -> bytes:
    return self.pack(dict(obj))


def _bigint(obj: int) -> bytes:
    return obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)


def _tz(obj: datetime.tzinfo | None) -> object:
    if obj is None or type(obj) is datetime.timezone:
        return obj
    raise TypeError(
        f"a time zone of type {type(obj).__qualname__} is not stored: use datetime.timezone "
        "(a fixed offset), or store the zone's name beside the value"
    )


def _defaultdict(self: _Encoder, obj: collections.defaultdict[Any, Any]) -> bytes:
    if obj.default_factory not in _FACTORIES:
        raise TypeError("a defaultdict is stored only with list, dict, set or int as its factory")
    return self.pack([_FACTORIES.index(obj.default_factory), dict(obj)])


_Encode = Callable[[_Encoder, Any], tuple[int, bytes]]
_ENCODERS: dict[type, _Encode] = {
    tuple: lambda e, o: (_TUPLE, _items(e, o)),
    set: lambda e, o: (_SET, _items(e, o)),
    frozenset: lambda e, o: (_FROZENSET, _items(e, o)),
    _ByteArray: lambda e, o: (_BYTEARRAY, o.data),
    complex: lambda e, o: (_COMPLEX, e.pack([o.real, o.imag])),
    int: lambda e, o: (_BIGINT, _bigint(o)),  # only the ints msgpack cannot hold
    decimal.Decimal: lambda e, o: (_DECIMAL, str(o).encode()),
    fractions.Fraction: lambda e, o: (_FRACTION, e.pack([o.numerator, o.denominator])),
    uuid.UUID: lambda e, o: (_UUID, o.bytes),
    datetime.date: lambda e, o: (_DATE, e.pack([o.year, o.month, o.day])),
    datetime.time: lambda e, o: (
        _TIME,
        e.pack([o.hour, o.minute, o.second, o.microsecond, o.fold, _tz(o.tzinfo)]),
    ),
    datetime.datetime: lambda e, o: (
        _DATETIME,
        e.pack(
            [
                o.year,
                o.month,
                o.day,
                o.hour,
                o.minute,
                o.second,
                o.microsecond,
                o.fold,
                _tz(o.tzinfo),
            ]
        ),
    ),
    datetime.timedelta: lambda e, o: (_TIMEDELTA, e.pack([o.days, o.seconds, o.microseconds])),
    datetime.timezone: lambda e, o: (_TIMEZONE, e.pack([*o.__getinitargs__(), None][:2])),
    collections.OrderedDict: lambda e, o: (_ORDERED, _mapping(e, o)),
    collections.Counter: lambda e, o: (_COUNTER, _mapping(e, o)),
    collections.defaultdict: lambda e, o: (_DEFAULTDICT, _defaultdict(e, o)),
    collections.deque: lambda e, o: (_DEQUE, e.pack([o.maxlen, list(o)])),
    range: lambda e, o: (_RANGE, e.pack([o.start, o.stop, o.step])),
    slice: lambda e, o: (_SLICE, e.pack([o.start, o.stop, o.step])),
}


class _Decoder:
    """One value's decoding: every extension type is rebuilt from what its payload holds
    (each payload is at most the bytes there are), never from a count alone."""

    def __init__(self) -> None:
        self.depth = 0

    def unpack(self, data: bytes | memoryview) -> Any:
        return msgpack.unpackb(
            data, ext_hook=self.ext_hook, strict_map_key=False, raw=False, use_list=True
        )

    def ext_hook(self, code: int, payload: bytes) -> Any:
        decode = _DECODERS.get(code)
        if decode is None:
            raise UnreadableValue(f"not a stored value (extension type {code})")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise UnreadableValue(
                    f"not a stored value: more than {MAX_DEPTH} levels of tuples, sets and the like"
                )
            return decode(self, payload)
        finally:
            self.depth -= 1

    def list(self, payload: bytes, length: int | None = None) -> list[Any]:
        found = self.unpack(payload)
        if not isinstance(found, list) or (length is not None and len(found) != length):
            raise ValueError("a malformed extension type")
        return found

    def map(self, payload: bytes) -> dict[Any, Any]:
        found = self.unpack(payload)
        if not isinstance(found, dict):
            raise ValueError("a malformed extension type")  # noqa: TRY004 - bytes, not a call
        return found


def _ints(values: list[Any]) -> list[int]:
    if not all(type(v) is int for v in values):
        raise ValueError("a malformed extension type: integers expected")
    return values


def _floats(values: list[Any]) -> list[float]:
    if not all(type(v) is float for v in values):
        raise ValueError("a malformed extension type: floats expected")
    return values


def _timezone(found: object) -> datetime.timezone | None:
    if found is not None and type(found) is not datetime.timezone:
        raise ValueError("a malformed time zone")
    return found


def _time(d: _Decoder, payload: bytes) -> datetime.time:
    *parts, tz = d.list(payload, 6)
    hour, minute, second, micro, fold = _ints(parts)
    return datetime.time(hour, minute, second, micro, _timezone(tz), fold=fold)


def _datetime(d: _Decoder, payload: bytes) -> datetime.datetime:
    *parts, tz = d.list(payload, 9)
    year, month, day, hour, minute, second, micro, fold = _ints(parts)
    return datetime.datetime(
        year, month, day, hour, minute, second, micro, _timezone(tz), fold=fold
    )


def _zone(d: _Decoder, payload: bytes) -> datetime.timezone:
    offset, name = d.list(payload, 2)
    if type(offset) is not datetime.timedelta or not (name is None or type(name) is str):
        raise ValueError("a malformed time zone")
    return datetime.timezone(offset) if name is None else datetime.timezone(offset, name)


def _default(d: _Decoder, payload: bytes) -> collections.defaultdict[Any, Any]:
    factory, items = d.list(payload, 2)
    if type(factory) is not int or not 0 <= factory < len(_FACTORIES) or type(items) is not dict:
        raise ValueError("a malformed defaultdict")
    return collections.defaultdict(_FACTORIES[factory], items)


def _deque(d: _Decoder, payload: bytes) -> collections.deque[Any]:
    maxlen, items = d.list(payload, 2)
    if not (maxlen is None or type(maxlen) is int) or type(items) is not list:
        raise ValueError("a malformed deque")
    return collections.deque(items, maxlen)


def _bytes_of(payload: bytes, length: int) -> bytes:
    if len(payload) != length:
        raise ValueError("a malformed extension type")
    return payload


def _fraction(d: _Decoder, payload: bytes) -> fractions.Fraction:
    numerator, denominator = _ints(d.list(payload, 2))
    return fractions.Fraction(numerator, denominator)


_Decode = Callable[[_Decoder, bytes], Any]
_DECODERS: dict[int, _Decode] = {
    _TUPLE: lambda d, p: tuple(d.list(p)),
    _SET: lambda d, p: set(d.list(p)),
    _FROZENSET: lambda d, p: frozenset(d.list(p)),
    _BYTEARRAY: lambda d, p: bytearray(p),
    _COMPLEX: lambda d, p: complex(*_floats(d.list(p, 2))),
    _BIGINT: lambda d, p: int.from_bytes(p, "big", signed=True),
    _DECIMAL: lambda d, p: decimal.Decimal(p.decode("ascii")),
    _FRACTION: _fraction,
    _UUID: lambda d, p: uuid.UUID(bytes=_bytes_of(p, 16)),
    _DATE: lambda d, p: datetime.date(*_ints(d.list(p, 3))),
    _TIME: _time,
    _DATETIME: _datetime,
    _TIMEDELTA: lambda d, p: datetime.timedelta(*_ints(d.list(p, 3))),
    _TIMEZONE: _zone,
    _ORDERED: lambda d, p: collections.OrderedDict(d.map(p)),
    _COUNTER: lambda d, p: collections.Counter(d.map(p)),
    _DEFAULTDICT: _default,
    _DEQUE: _deque,
    _RANGE: lambda d, p: range(*_ints(d.list(p, 3))),
    _SLICE: lambda d, p: slice(*d.list(p, 3)),
}
