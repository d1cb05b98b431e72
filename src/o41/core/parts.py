"""How a large write is cut into parts, and the checksums that travel with them.

Pure rules shared by the client (which reads the file) and the placement service (which
signs one URL per part): both must cut the file at the same offsets. The limits are the
strictest of the three clouds' multipart APIs (S3's: 5 MiB to 5 GiB a part, 10,000 parts).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence

MIB = 1024 * 1024
PART_SIZE = 16 * MIB  # parts go up in parallel; larger for files over 10,000 parts
MIN_PART_SIZE = 5 * MIB
MAX_PART_SIZE = 5 * 1024 * MIB
MAX_PARTS = 10_000


def part_size_for(size: int) -> int:
    """The part size the client uses for a file of ``size`` bytes."""
    return max(PART_SIZE, -(-size // MAX_PARTS))


def part_count(size: int, part_size: int) -> int:
    return max(1, -(-size // part_size))


def part_size_problem(size: int, part_size: int) -> str | None:
    """Why ``part_size`` cannot carry ``size`` bytes, or None when it can."""
    if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
        return (
            f"partSize {part_size} is outside {MIN_PART_SIZE}..{MAX_PART_SIZE} bytes "
            "(every part but the last must be at least 5 MiB)"
        )
    if part_count(size, part_size) > MAX_PARTS:
        return (
            f"partSize {part_size} cuts {size} bytes into more than {MAX_PARTS} parts; "
            f"use at least {part_size_for(size)}"
        )
    return None


def crc32_b64(value: int) -> str:
    """A CRC32 the way S3 writes it: four big-endian bytes, base64."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


def crc32_bytes(checksum: str) -> bytes | None:
    """The four bytes of a base64 CRC32, or None when ``checksum`` is not one."""
    try:
        raw = base64.b64decode(checksum, validate=True)
    except ValueError:
        return None
    return raw if len(raw) == 4 else None


def composite_crc32(parts: Sequence[str]) -> str:
    """S3's checksum of a multipart object uploaded with CRC32 parts: the CRC32 of the
    parts' checksums, then ``-<number of parts>``."""
    joined = b"".join(crc32_bytes(p) or b"" for p in parts)
    return f"{crc32_b64(zlib.crc32(joined))}-{len(parts)}"


def composite_matches(reported: str, parts: Sequence[str]) -> bool:
    """Whether a bucket's reported checksum of a multipart object is the composite of
    ``parts``. S3 writes ``<base64>-<parts>``; some S3-compatible stores drop the count."""
    value, _, count = reported.partition("-")
    expected, _, n = composite_crc32(parts).partition("-")
    return value == expected and count in ("", n)
