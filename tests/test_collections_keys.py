"""Keys have one canonical text on every node; values round-trip as plain data and never
load code."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import os
import pickle
import subprocess
import sys
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.collections import values
from o41.collections.keys import MAX_KEY, check_encoded, check_name, decode_key, encode_key

scalar_keys = (
    st.none() | st.booleans() | st.integers() | st.text() | st.binary() | st.floats(allow_nan=False)
)
keys = st.recursive(
    scalar_keys,
    lambda inner: st.lists(inner, max_size=4).map(tuple) | st.frozensets(inner, max_size=4),
    max_leaves=12,
)


@given(keys)
def test_keys_round_trip_canonically(key: Any) -> None:
    text = encode_key(key)
    back = decode_key(text)
    assert back == key and type(back) is type(key)
    assert check_encoded(text) == text
    assert encode_key(back) == text


def test_equal_keys_encode_alike_on_every_node() -> None:
    # hash() is salted per process; the encoding is not
    key = ("a", frozenset({3, 1, 2}), b"\x00", -0.0)
    script = f"from o41.collections.keys import encode_key; print(encode_key({key!r}))"
    texts = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert texts == {encode_key(key)}
    assert encode_key(-0.0) == encode_key(0.0)
    assert len({encode_key(1), encode_key(1.0), encode_key(True)}) == 3  # by type and value


def test_keys_refused_clearly() -> None:
    with pytest.raises(TypeError, match="unhashable key of type 'list'"):
        encode_key([1])
    with pytest.raises(TypeError, match="unhashable key of type 'dict'"):
        encode_key(({},))
    with pytest.raises(TypeError, match="no stable encoding"):
        encode_key(object())
    with pytest.raises(ValueError, match="NaN"):
        encode_key(float("nan"))
    with pytest.raises(ValueError, match="key too large"):
        encode_key("x" * MAX_KEY)
    for bad in ("", "i007", "i1.5", "q", "(notjson", "d-0.0", 5):
        with pytest.raises(ValueError, match="key"):
            check_encoded(bad)
    with pytest.raises(ValueError, match="bad collection name"):
        check_name("collection", "a/b")
    assert check_name("compute", "train-7.a_b") == "train-7.a_b"


PLAIN = [
    None,
    True,
    1,
    2**80,
    1.5,
    float("inf"),
    1 + 2j,
    "text",
    b"bytes",
    bytearray(b"ba"),
    [1, [2, "x"]],
    (1, (2,)),
    {"a": {1: [b"x"]}, (1, 2): None},
    {1, 2},
    frozenset({"a"}),
    range(3),
    slice(1, 5, 2),
    datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC),
    datetime.date(2024, 5, 1),
    datetime.time(1, 2),
    datetime.timedelta(seconds=5),
    decimal.Decimal("1.25"),
    fractions.Fraction(1, 3),
    uuid.UUID(int=7),
    collections.OrderedDict(a=1),
    collections.deque([1, 2]),
    collections.Counter("aab"),
    collections.defaultdict(list, a=[1]),
]


@pytest.mark.parametrize("value", PLAIN, ids=lambda v: type(v).__name__)
def test_plain_values_round_trip(value: Any) -> None:
    back = values.loads(values.dumps(value))
    assert back == value and type(back) is type(value)


class Model:
    pass


class Exploit:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_other_values_are_refused_and_never_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(values.ENV_PICKLE, raising=False)
    with pytest.raises(TypeError, match="are not stored"):
        values.dumps(Model())
    with pytest.raises(TypeError, match="factory"):
        values.dumps(collections.defaultdict(Model))
    with pytest.raises(pickle.UnpicklingError, match=r"refused to load posix\.system"):
        values.loads(pickle.dumps(Exploit()))  # what a hostile writer could store
    with pytest.raises(values.ValueTooLarge, match="value too large"):
        values.dumps(b"x" * values.MAX_VALUE)

    monkeypatch.setenv(values.ENV_PICKLE, "1")  # every writer trusted: full pickles
    assert isinstance(values.loads(values.dumps(Model())), Model)
