"""Issue 39, point 6: a transfer's progress, through tqdm and a caller's callback.

A callback (``fsspec.callbacks.Callback``) on ``write``, ``read`` and ``read_bytes`` is
told the size once and the bytes as they go, adding up to the size (a write in parts,
a read in parallel ranges, a read from the cache alike); with progress off nothing is
printed; not on a terminal, the bar is a line now and then, never carriage returns.
The service runs in process with its stand-in bucket."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from fsspec.callbacks import Callback

from o41 import artifacts as sdk
from o41.client import progress, reads
from o41.client.progress import Progress
from o41.core.parts import PART_SIZE
from o41.core.places import Place
from test_writes import Service, serve
from testbed.locations import ORG


@pytest.fixture
async def service(tmp_path: Path) -> Any:
    async for s in serve(tmp_path):
        yield s


class Counted(Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.total = 0

    def set_size(self, size: int) -> None:
        self.sizes.append(size)

    def relative_update(self, inc: int = 1) -> None:
        self.total += inc


async def test_a_callback_is_told_the_size_and_bytes_adding_up_to_it(
    service: Service,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("O41_ARTIFACTS_PROGRESS", "1")  # a callback given: no bar all the same
    monkeypatch.setattr(reads, "RANGE_SIZE", PART_SIZE)
    size = PART_SIZE + 3 * 2**20  # two parts, two ranges
    data = os.urandom(size)
    path = tmp_path / "model"
    path.write_bytes(data)
    client = sdk.Client(service.url, str(service.token), Place("aws", "us-east-1", "env"), 30,
                        cache=tmp_path / "cache")  # fmt: skip

    up = Counted()
    written = await asyncio.to_thread(client.write, ORG, "m", path, callback=up)
    assert (up.sizes, up.total) == ([size], size)
    for what in ("fetched", "cached"):
        down = Counted()
        got = await asyncio.to_thread(
            client.read, ORG, "m", written.version, tmp_path / what, callback=down
        )
        assert (down.sizes, down.total) == ([size], size), what
        assert got.locality == ("cached" if what == "cached" else "local")
    off = sdk.Client(
        service.url, str(service.token), Place("aws", "us-east-1", "env"), 30, cache=False
    )
    mem = Counted()
    assert await asyncio.to_thread(off.read_bytes, ORG, "m", written.version, callback=mem) == data
    assert (mem.sizes, mem.total) == ([size], size)
    assert capsys.readouterr().err == ""


async def test_a_write_begun_again_elsewhere_counts_its_bytes_once(
    service: Service, tmp_path: Path
) -> None:
    """A bucket that fails the upload once it came: the write begins again at another
    location and sends it all again; the callback's bytes still add up to the size."""
    service.storage.broken.add("bucket-flaky")
    size = PART_SIZE + 2**20  # in parts
    path = tmp_path / "model"
    path.write_bytes(os.urandom(size))
    client = sdk.Client(service.url, str(service.token), Place("nebius", "eu-n", "env"), 30)
    up = Counted()
    written = await asyncio.to_thread(client.write, ORG, "m", path, callback=up)
    assert written.location != "flaky"  # begun again elsewhere, after the bytes went once
    assert any(p.startswith("/bucket-flaky/") for p in service.storage.puts)
    assert up.total == size and set(up.sizes) == {size}


def test_progress_off_prints_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(progress, "LOG_DELAY", 0.0)
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    for off in ("0", "off", "false"):
        monkeypatch.setenv("O41_ARTIFACTS_PROGRESS", off)
        with Progress(1000, "download from east") as p:
            for _ in range(10):
                p(100)
    assert capsys.readouterr().err == ""


def test_off_a_terminal_the_bar_is_lines_without_carriage_returns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("O41_ARTIFACTS_PROGRESS", "1")
    monkeypatch.setattr(progress, "LOG_DELAY", 0.0)
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    with Progress(1000, "download from east") as p:
        for _ in range(4):
            p(250)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines and all(line.startswith("download from east") for line in lines), err
    assert "100%" in lines[-1]

    monkeypatch.setattr(progress, "LOG_DELAY", 3600.0)  # a transfer shorter than the delay
    with Progress(1000, "download from east") as p:
        p(1000)
    assert capsys.readouterr().err == ""
