"""Keys have one canonical text on every node, and are measured before they are parsed
(values: tests/collections/test_collections_values.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.collections.keys import (
    MAX_KEY,
    MAX_KEY_DEPTH,
    check_encoded,
    check_name,
    decode_key,
    encode_key,
)

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


def test_keys_nested_too_deep_are_refused_before_they_are_parsed() -> None:
    key: Any = "x"
    for _ in range(MAX_KEY_DEPTH):
        key = (key,)
    assert decode_key(check_encoded(encode_key(key))) == key  # the deepest that fits
    with pytest.raises(ValueError, match="key nested too deep"):
        encode_key((key,))
    deep: Any = ()
    for _ in range(100_000):
        deep = (deep,)
    with pytest.raises(ValueError, match="key nested too deep"):
        encode_key(deep)  # not a RecursionError
    for text in ("(" + "[" * 4000, "{" + "[" * 2000 + "]" * 2000, '(["s", ["i1"]]'):
        with pytest.raises(ValueError, match=r"not an encoded key.*a key's array"):
            check_encoded(text)
    with pytest.raises(ValueError, match="key too large"):
        decode_key("(" + "[" * MAX_KEY)
