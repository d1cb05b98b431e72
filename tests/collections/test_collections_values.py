"""Values: every documented type round-trips exactly through MessagePack (hypothesis), a
hostile value is refused before anything big is built (tracemalloc's peak, not a clock),
pickles load only where every writer is trusted."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import math
import os
import pickle
import tracemalloc
import uuid
import zoneinfo
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from o41.collections import values
from o41.collections.values import MAX_VALUE, UnreadableValue, ValueTooLarge


@pytest.fixture(autouse=True)
def plain_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(values.ENV_PICKLE, raising=False)


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same value, type for type, NaN for NaN, -0.0 for -0.0, in
    the same order, with the same fold, time zone, factory and maxlen."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, datetime.datetime | datetime.time):
        return repr(a) == repr(b) and a.fold == b.fold
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, collections.deque):
        return a.maxlen == b.maxlen and same(list(a), list(b))
    if isinstance(a, dict):
        if isinstance(a, collections.defaultdict) and a.default_factory is not b.default_factory:
            return False
        return same(list(a.items()), list(b.items()))
    if isinstance(a, set | frozenset):
        return a == b and all(any(same(x, y) for y in b) for x in a)
    if isinstance(a, slice):
        return same((a.start, a.stop, a.step), (b.start, b.stop, b.step))
    return bool(a == b) and repr(a) == repr(b)


def round_trip(value: Any) -> Any:
    return values.loads(values.dumps(value))


zones = (
    st.builds(
        datetime.timezone,
        st.timedeltas(
            min_value=datetime.timedelta(hours=-23), max_value=datetime.timedelta(hours=23)
        ),
    )
    | st.builds(
        datetime.timezone,
        st.timedeltas(
            min_value=datetime.timedelta(hours=-23), max_value=datetime.timedelta(hours=23)
        ),
        st.text(max_size=5),
    )
    | st.just(datetime.UTC)
)
ints = st.integers() | st.integers(min_value=-(2**200), max_value=2**200)
hashable_scalars = (
    st.none()
    | st.booleans()
    | ints
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False)
    | st.fractions()
    | st.uuids()
    | st.dates()
    | st.datetimes(timezones=st.none() | zones, allow_imaginary=True)
    | st.times(timezones=st.none() | zones)
    | st.timedeltas()
    | zones
    | st.builds(range, st.integers(), st.integers(), st.integers().filter(bool))
)
hashables = st.recursive(
    hashable_scalars,
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=8,
)
scalars = (
    hashable_scalars
    | st.floats()  # NaN, infinities, -0.0
    | st.complex_numbers()
    | st.decimals()  # NaN, sNaN, infinities, exponents
    | st.binary().map(bytearray)
)
defaultdicts = st.tuples(
    st.sampled_from([list, dict, set, int]), st.dictionaries(hashables, scalars, max_size=3)
).map(lambda fi: collections.defaultdict(fi[0], fi[1]))


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
        | st.dictionaries(hashables, inner, max_size=4).map(collections.OrderedDict)
        | st.dictionaries(hashables, st.integers(), max_size=4).map(collections.Counter)
        | st.lists(inner, max_size=4).flatmap(
            lambda items: st.sampled_from([None, len(items), len(items) + 2]).map(
                lambda maxlen: collections.deque(items, maxlen)
            )
        )
        | st.tuples(inner, inner, inner).map(lambda t: slice(*t))
    )


plain = st.recursive(scalars | defaultdicts, containers, max_leaves=20)


@settings(max_examples=400)
@given(plain)
def test_every_documented_type_round_trips_exactly(value: Any) -> None:
    back = round_trip(value)
    assert same(back, value), (value, back)


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        -0.0,
        2**64 - 1,
        2**64,
        -(2**63),
        -(2**63) - 1,
        10**400,
        decimal.Decimal("-0"),
        decimal.Decimal("sNaN"),
        decimal.Decimal("1.000E+999999"),
        fractions.Fraction(-(10**50), 3),
        complex(float("nan"), float("-inf")),
        datetime.datetime(2024, 11, 3, 1, 30, fold=1),
        datetime.datetime.max.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=5), "X")),
        datetime.time(23, 59, 59, 999999, tzinfo=datetime.UTC),
        datetime.timedelta.min,
        uuid.UUID(int=7),
        collections.defaultdict(int, {"a": 1}),
        collections.deque([1, 2, 3], maxlen=3),
        range(0, 10**30, 7),
        slice(None, "b", (1,)),
        {(1, 2): {frozenset({b"x"}): [None]}},
        [(), set(), frozenset(), {}, [], bytearray(), b"", ""],
    ],
    ids=repr,
)
def test_edges_round_trip(value: Any) -> None:
    assert same(round_trip(value), value)


class Model:
    pass


def test_what_is_not_plain_data_is_refused_when_written() -> None:
    with pytest.raises(TypeError, match=r"\.Model are not stored"):
        values.dumps({"model": Model()})
    with pytest.raises(TypeError, match="factory"):
        values.dumps(collections.defaultdict(Model))
    zoned = datetime.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo("UTC"))
    with pytest.raises(TypeError, match="time zone of type ZoneInfo"):
        values.dumps(zoned)
    with pytest.raises(TypeError, match="are not stored"):
        values.dumps(memoryview(b"x"))
    with pytest.raises(ValueTooLarge, match="value too large"):
        values.dumps(b"x" * MAX_VALUE)
    deep: Any = ()
    for _ in range(values.MAX_DEPTH + 1):
        deep = (deep,)
    with pytest.raises(ValueError, match="nested too deep"):
        values.dumps(deep)
    deep_list: Any = []
    for _ in range(600):
        deep_list = [deep_list]
    with pytest.raises(ValueError, match="nested too deep"):
        values.dumps(deep_list)


class Exploit:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def pickled(call: Callable[..., Any], *args: Any) -> bytes:
    """What a hostile writer stores: a pickle that calls ``call(*args)`` when loaded."""

    class Call:
        def __reduce__(self) -> tuple[Any, ...]:
            return (call, args)

    return pickle.dumps(Call(), 5)


def nested_tuples(levels: int) -> bytes:
    payload: bytes = msgpack.packb([])
    for _ in range(levels):
        payload = msgpack.packb([msgpack.ExtType(1, payload)])
    return values.PLAIN + payload


# the attacks on the old restricted unpickler (46 bytes made every reader build 256 MiB),
# and what the new format can be sent instead
BYTEARRAY_ATTACK = pickled(bytearray, 2**28)

ATTACKS = {
    "bytearray(2**28)": BYTEARRAY_ATTACK,
    "list(range(10**10))": pickled(list, range(10**10)),
    "frozenset(range(10**10))": pickled(frozenset, range(10**10)),
    "deque(range(10**10))": pickled(collections.deque, range(10**10)),
    "set(range(10**10))": pickled(set, range(10**10)),
    "dict.fromkeys(range(10**10))": pickled(dict.fromkeys, range(10**10)),
    "os.system": pickle.dumps(Exploit(), 5),
    # the same in the new format: lengths that the bytes are not there for
    "ext 4 of 256 MiB": values.PLAIN + b"\xc9\x10\x00\x00\x00\x04",
    "bin of 256 MiB": values.PLAIN + b"\xc6\x10\x00\x00\x00",
    "str of 256 MiB": values.PLAIN + b"\xdb\x10\x00\x00\x00",
    "array of 2**32-1": values.PLAIN + b"\xdd\xff\xff\xff\xff",
    "map of 2**32-1": values.PLAIN + b"\xdf\xff\xff\xff\xff",
    "tuple of 2**32-1": values.PLAIN + b"\xc7\x05\x01\xdd\xff\xff\xff\xff",
    "unknown extension": values.PLAIN + msgpack.packb(msgpack.ExtType(99, b"")),
    "nested arrays": values.PLAIN + b"\x91" * 100_000,
    "nested tuples": nested_tuples(values.MAX_DEPTH + 1),
    "a list as a map key": values.PLAIN + b"\x81\x91\x01\x01",
    "a bad date": values.PLAIN + msgpack.packb(msgpack.ExtType(10, msgpack.packb([2024, 13, 1]))),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_hostile_values_are_refused_without_a_big_allocation(name: str) -> None:
    data = ATTACKS[name]
    tracemalloc.start()
    try:
        with pytest.raises(UnreadableValue) as refused:
            values.loads(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, f"{name}: {peak} bytes at the peak"
    message = str(refused.value)
    assert "not a stored value" in message or "not loaded" in message


def test_a_range_is_read_as_a_range_never_built() -> None:
    huge = range(0, 10**10)
    tracemalloc.start()
    try:
        back = round_trip(huge)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert back == huge and type(back) is range and peak < 1024 * 1024


def test_what_a_value_at_the_limit_decodes_to_is_bounded() -> None:
    # the most objects per byte: empty maps, one byte each
    worst = values.PLAIN + b"\xdd" + (MAX_VALUE - 6).to_bytes(4) + b"\x80" * (MAX_VALUE - 6)
    tracemalloc.start()
    try:
        back = values.loads(worst)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(back) == MAX_VALUE - 6
    assert peak < 100 * MAX_VALUE, peak  # about 72 bytes a byte: a dict and its slot


def test_pickles_load_only_where_every_writer_is_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = pickle.dumps({"a": 1}, 5)  # a value of a client before the format byte
    with pytest.raises(UnreadableValue, match="an older o41 client's pickle"):
        values.loads(legacy)
    monkeypatch.setenv(values.ENV_PICKLE, "1")
    assert values.loads(legacy) == {"a": 1}
    trusted = values.dumps(Model())
    assert trusted[:1] == values.PICKLE and isinstance(values.loads(trusted), Model)
    assert values.loads(values.dumps(1.5)) == 1.5
    monkeypatch.delenv(values.ENV_PICKLE)
    with pytest.raises(UnreadableValue, match="O41_COLLECTIONS_PICKLE=1 in this pod"):
        values.loads(trusted)
    plain = values.dumps({"a": (1, 2)})
    assert plain[:1] == values.PLAIN
    monkeypatch.setenv(values.ENV_PICKLE, "1")
    assert values.loads(plain) == {"a": (1, 2)}  # plain data reads anywhere
