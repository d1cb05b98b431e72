"""How a large write is cut into parts, and the composite CRC32 of its parts."""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from moto.s3.models import MultipartChecksumBuilder

from o41.core.parts import (
    MAX_PART_SIZE,
    MAX_PARTS,
    MIB,
    MIN_PART_SIZE,
    PART_SIZE,
    composite_crc32,
    composite_matches,
    crc32_b64,
    crc32_bytes,
    part_count,
    part_size_for,
    part_size_problem,
)

MAX_OBJECT = 5 * 1024**4  # S3's 5 TiB


@given(st.integers(min_value=0, max_value=MAX_OBJECT))
def test_the_clients_part_size_is_always_acceptable(size: int) -> None:
    part_size = part_size_for(size)
    assert PART_SIZE <= part_size <= MAX_PART_SIZE
    assert part_count(size, part_size) <= MAX_PARTS
    assert part_size_problem(size, part_size) is None


@given(st.integers(min_value=1, max_value=MAX_OBJECT), st.integers(min_value=1))
def test_parts_cover_the_file_exactly(size: int, part_size: int) -> None:
    n = part_count(size, part_size)
    assert (n - 1) * part_size < size <= n * part_size


def test_small_files_use_16_mib_parts_and_huge_ones_grow_them() -> None:
    assert part_size_for(256 * MIB) == 16 * MIB
    assert part_count(256 * MIB, 16 * MIB) == 16
    assert part_count(0, 16 * MIB) == 1
    assert part_size_for(MAX_OBJECT) == -(-MAX_OBJECT // MAX_PARTS)


@pytest.mark.parametrize(
    ("size", "part_size", "says"),
    [
        (100 * MIB, MIN_PART_SIZE - 1, "at least 5 MiB"),
        (100 * MIB, MAX_PART_SIZE + 1, "outside"),
        (MAX_PARTS * MIN_PART_SIZE + 1, MIN_PART_SIZE, "more than 10000 parts"),
    ],
)
def test_a_bad_part_size_is_explained(size: int, part_size: int, says: str) -> None:
    problem = part_size_problem(size, part_size)
    assert problem is not None and says in problem


def test_crc32_round_trips_through_base64() -> None:
    value = zlib.crc32(b"hello")
    assert crc32_bytes(crc32_b64(value)) == value.to_bytes(4, "big")
    assert crc32_bytes("not base64!") is None
    assert crc32_bytes("AAAAAAAA") is None  # six bytes, not four


def test_composite_equals_an_independent_implementation() -> None:
    """moto's MultipartChecksumBuilder computes what S3 reports for a CRC32 multipart
    object; ours must agree on the same parts."""
    parts = [os.urandom(1000 + n) for n in range(5)]
    builder = MultipartChecksumBuilder("CRC32", None)
    for part in parts:
        builder.addPart(part)
    built = builder.build()
    assert built is not None
    kind, value, count = built
    ours = composite_crc32([crc32_b64(zlib.crc32(p)) for p in parts])
    assert kind == "COMPOSITE"
    assert ours == f"{value}-{count}"


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20))
def test_a_changed_part_changes_the_composite(parts: list[bytes]) -> None:
    checksums = [crc32_b64(zlib.crc32(p)) for p in parts]
    composite = composite_crc32(checksums)
    assert composite_matches(composite, checksums)
    assert composite_matches(composite.partition("-")[0], checksums)  # count dropped
    assert not composite_matches(composite.partition("-")[0] + "-0", checksums)
    damaged = [crc32_b64(zlib.crc32(parts[0] + b"x")), *checksums[1:]]
    assert not composite_matches(composite, damaged)
