"""The rules of versions, tags, metadata and cursors (``o41.core.versions``): pure
functions, checked on many inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.versions import (
    WINDOW,
    VersionRefused,
    check_metadata,
    check_tag,
    cursor_key,
    encode_cursor,
    index_suffix,
    newest_position,
    ref_kind,
    suffix_position,
    window_end,
)

VERSION = "0193a1b2c3d4-9f8e7d6c5b4a3f2e"
seqs = st.integers(min_value=1, max_value=2**62)


@given(seqs, seqs)
def test_the_index_sorts_newest_first(a: int, b: int) -> None:
    first, second = index_suffix(a, VERSION), index_suffix(b, VERSION)
    assert (first < second) == (a > b)
    assert suffix_position(first) == newest_position(a)


@given(seqs)
def test_a_cursor_comes_back_to_its_own_listing_only(seq: int) -> None:
    suffix = index_suffix(seq, VERSION)
    cursor = encode_cursor("versions/ml/a", suffix)
    assert cursor_key("versions/ml/a", cursor, "versions") == suffix
    for other in ("versions/ml/b", "versions/other/a", "artifacts/ml"):
        with pytest.raises(VersionRefused, match="another listing"):
            cursor_key(other, cursor, "versions")


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "%%%",
        encode_cursor("versions/ml/a", "../x"),
        encode_cursor("versions/ml/a", "0" * 16),
        "eyJvZiI6MX0",  # {"of":1}
        "W10",  # []
    ],
)
def test_a_damaged_cursor_is_refused(cursor: str) -> None:
    with pytest.raises(VersionRefused):
        cursor_key("versions/ml/a", cursor, "versions")


def test_a_window_ends_past_the_oldest_version() -> None:
    assert window_end(newest_position(WINDOW - 1)) is None  # it reaches sequence 1
    end = window_end(newest_position(10 * WINDOW))
    assert end is not None and int(end, 16) == newest_position(9 * WINDOW)


@pytest.mark.parametrize(
    ("ref", "kind"),
    [(VERSION, "version"), ("latest", "latest"), ("best", "tag"), ("v1.2_rc-3", "tag")],
)
def test_a_reference_means_one_thing(ref: str, kind: str) -> None:
    assert ref_kind(ref) == kind


@pytest.mark.parametrize("tag", ["latest", VERSION, "-x", "1abc", "a" * 64, "a/b", "", "é"])
def test_tags_that_cannot_be(tag: str) -> None:
    with pytest.raises(VersionRefused):
        check_tag(tag)
    if tag not in ("latest", VERSION):
        with pytest.raises(VersionRefused, match="not a version"):
            ref_kind(tag)


def test_metadata_limits_name_the_limit() -> None:
    assert check_metadata(None) is None
    assert check_metadata({"step": 3, "metrics": {"loss": 0.1}}) == {
        "step": 3,
        "metrics": {"loss": 0.1},
    }
    cases: list[tuple[dict[str, object], str]] = [
        ({f"k{i}": 0 for i in range(65)}, "at most 64"),
        ({"x": "y" * 8200}, "at most 8192 bytes"),
        ({"1x": 0}, "metadata key '1x'"),
        ({"x": float("nan")}, "finite numbers"),
    ]
    for metadata, limit in cases:
        with pytest.raises(VersionRefused, match=limit):
            check_metadata(metadata)
