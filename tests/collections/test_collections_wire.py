"""The collections' message JSON: orjson's text reads back as the standard library's, and
what orjson refuses still goes through the standard library with the same meaning."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.collections import wire

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(plain)
def test_a_message_reads_back_as_it_was_written(message: object) -> None:
    assert wire.loads(wire.dumps(message)) == message
    assert json.loads(wire.dumps(message)) == message  # what the standard library reads


def test_orjson_is_used_where_it_is_installed() -> None:
    assert wire.FAST  # a dependency: the fast path is the one under test
    assert wire.dumps({"a": [1, "b"]}) == b'{"a":[1,"b"]}'


@pytest.mark.parametrize(
    "message",
    [
        {"n": 2**70},  # past 64 bits: orjson refuses, the service answers a clear 400
        {"key": "s\ud800"},  # a lone surrogate: orjson refuses, json escapes it
    ],
    ids=["big-int", "surrogate"],
)
def test_what_orjson_refuses_goes_through_the_standard_library(message: object) -> None:
    text = wire.dumps(message)
    assert text == json.dumps(message, separators=(",", ":")).encode()
    assert wire.loads(text) == message


def test_texts_only_the_standard_library_reads_mean_what_they_meant() -> None:
    assert wire.loads(b'{"n": 1180591620717411303424}') == {"n": 2**70}
    assert math.isnan(wire.loads("NaN"))
    with pytest.raises(ValueError, match="Expecting value"):
        wire.loads(b"not json")
