"""The ``o41://`` fsspec filesystem in-process (the real service app on the embedded store,
a stand-in bucket over HTTP), read by consumers no one here wrote: pyarrow's Parquet
reader and fsspec's own ``open``. The filesystem is found through its entry point."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from o41.artifacts import Client
from o41.core.places import Place
from o41.filesystem import O41FileSystem, parse
from test_writes import Service, serve
from testbed.locations import ORG


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


def table(rows: int) -> pa.Table:
    return pa.table(
        {
            "step": pa.array(range(rows), pa.int64()),
            "loss": pa.array([1.0 / (i + 1) for i in range(rows)], pa.float64()),
            "note": pa.array([f"row {i}" for i in range(rows)]),
        }
    )


def o41fs(service: Service) -> Any:
    return fsspec.filesystem(
        "o41",
        endpoint=service.url,
        token_file=str(service.token),
        place={"cloud": "aws", "region": "us-east-1", "source": "env"},
        skip_instance_cache=True,
    )


def test_paths() -> None:
    assert parse("ml/run@best/data/part-0.parquet") == ("ml", "run", "best", "data/part-0.parquet")
    assert parse("ml/run") == ("ml", "run", "latest", "")
    assert parse("ml") == ("ml", None, "latest", "")
    with pytest.raises(ValueError, match="artifact name"):
        parse("ml/../x")


async def test_pyarrow_reads_parquet_from_a_directory_version(
    service: Service, tmp_path: Path
) -> None:
    data = tmp_path / "dataset"
    (data / "train").mkdir(parents=True)
    pq.write_table(table(500_000), data / "train" / "part-0.parquet", row_group_size=100_000)
    pq.write_table(table(10), data / "train" / "part-1.parquet")
    (data / "README.md").write_text("a dataset")
    client = Client(service.url, str(service.token), place=Place("aws", "us-east-1", "env"))
    written = await asyncio.to_thread(client.write, ORG, "ds", data, tag="v1")
    size = (data / "train" / "part-0.parquet").stat().st_size
    ranged: list[tuple[str, str | None, int]] = []

    def read() -> tuple[Any, ...]:
        fs = o41fs(service)
        assert isinstance(fs, O41FileSystem)
        got = pq.read_table("ml/ds@v1/train/part-0.parquet", filesystem=fs)
        service.storage.gets.clear()
        one_column = pq.read_table(
            f"ml/ds@{written.version}/train/part-0.parquet",
            filesystem=fs,
            columns=["loss"],
            buffer_size=0,
        )
        ranged.extend(service.storage.gets)
        folder = pq.read_table("ml/ds@v1/train", filesystem=fs)  # a dataset of two files
        assert folder.num_rows == 500_010
        listed = fs.ls("ml/ds@latest", detail=False)
        train = fs.ls("o41://ml/ds@latest/train")
        info = fs.info("o41://ml/ds/train/part-0.parquet")
        with fsspec.open(
            "o41://ml/ds@v1/README.md",
            "rb",
            endpoint=service.url,
            token_file=str(service.token),
            place={"cloud": "aws", "region": "us-east-1", "source": "env"},
        ) as f:
            readme = f.read()
        return got, one_column, listed, train, info, readme

    got, one_column, listed, train, info, readme = await asyncio.to_thread(read)
    assert got.equals(table(500_000))
    assert one_column.column_names == ["loss"] and one_column.num_rows == 500_000
    assert listed == ["ml/ds@latest/README.md", "ml/ds@latest/train"] or sorted(listed) == [
        "ml/ds@latest/README.md",
        "ml/ds@latest/train",
    ]
    assert sorted(t["name"] for t in train) == [
        "ml/ds@latest/train/part-0.parquet",
        "ml/ds@latest/train/part-1.parquet",
    ]
    assert (info["type"], info["size"], info["version"]) == ("file", size, written.version)
    assert readme == b"a dataset"

    # without a copy: one column of the file came as ranged GETs (the footer, then the
    # column's pages), never the whole object
    assert ranged and all(rng is not None for _, rng, _ in ranged), ranged
    assert sum(n for _, _, n in ranged) < size * 0.7, [(r, n) for _, r, n in ranged]


async def test_writing_through_the_filesystem_commits_on_close(service: Service) -> None:
    def write_and_read() -> tuple[Any, ...]:
        fs = o41fs(service)
        buffer = io.BytesIO()
        pq.write_table(table(100), buffer)
        with fs.open("o41://ml/single@best", "wb") as f:
            f.write(buffer.getvalue()[:100])
            f.write(buffer.getvalue()[100:])
        written = f.written
        back = pq.read_table("ml/single@best", filesystem=fs)

        def fails() -> None:
            with fs.open("ml/single", "wb") as g:  # nothing written
                g.write(b"half")
                raise RuntimeError("the job failed")

        with pytest.raises(RuntimeError):
            fails()
        versions = [
            v.version for v in Client(service.url, str(service.token)).versions(ORG, "single")
        ]
        with pytest.raises(ValueError, match="never written twice"):
            fs.open(f"ml/single@{written.version}", "wb")
        with pytest.raises(FileNotFoundError):
            fs.info("ml/single@nosuchtag")
        with pytest.raises(FileNotFoundError):
            fs.info("ml/single@best/inside")
        return written, back, versions

    written, back, versions = await asyncio.to_thread(write_and_read)
    assert back.equals(table(100))
    assert written.tag == "best" and versions == [written.version]


async def test_a_write_that_fails_publishes_nothing_however_it_was_opened(
    service: Service,
) -> None:
    """Issue 43: fsspec's ``OpenFile`` closes the file without the exception; a crashed
    save must still publish nothing and move no tag, and ``@latest`` is no place to write."""
    options = {
        "endpoint": service.url,
        "token_file": str(service.token),
        "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
    }
    client = Client(service.url, str(service.token))

    def state() -> tuple[str, str, list[str]]:
        versions = [v.version for v in client.versions(ORG, "metrics")]
        return (
            client.resolve(ORG, "metrics", "nightly").version,
            client.resolve(ORG, "metrics", "latest").version,
            versions,
        )

    def crashes(how: str) -> None:
        if how == "fsspec.open":
            with fsspec.open("o41://ml/metrics@nightly", "wb", **options) as f:
                f.write(b"half of a")
                raise RuntimeError("the job died mid-save")
        elif how == "text":
            with fsspec.open("o41://ml/metrics@nightly", "w", **options) as f:
                f.write("half of a")
                raise RuntimeError("the job died mid-save")
        elif how == "finally":
            g = fsspec.open("o41://ml/metrics@nightly", "wb", **options).open()
            try:
                g.write(b"half of a")
                raise RuntimeError("the job died mid-save")
            finally:
                g.close()
        elif how == "transaction":
            fs = o41fs(service)
            with fs.transaction:
                with fs.open("ml/metrics@nightly", "wb") as h:
                    h.write(b"whole, but the transaction fails")
                raise RuntimeError("the job died after the save")

    def run() -> tuple[Any, ...]:
        with fsspec.open("o41://ml/metrics@nightly", "wb", **options) as f:
            f.write(b"the first whole file")
        before = state()
        for how in ("fsspec.open", "text", "finally", "transaction"):
            with pytest.raises(RuntimeError, match="the job died"):
                crashes(how)
            assert state() == before, how

        fs = o41fs(service)
        d = fs.open("ml/metrics@nightly", "wb")
        d.write(b"not wanted")
        d.discard()
        assert d.written is None and state() == before

        # a file opened while an exception is being handled still commits
        try:
            raise KeyError("handled")
        except KeyError:
            with fsspec.open("o41://ml/metrics@nightly", "wb", **options) as e:
                e.write(b"the fallback save")
        after_except = state()
        # a transaction that ends well commits its files
        with fs.transaction, fs.open("ml/metrics@nightly", "wb") as t:
            t.write(b"the transaction's save")
        after_transaction = state()

        with pytest.raises(ValueError, match="'latest'") as refused:
            fs.open("ml/metrics@latest", "wb")
        with (
            pytest.raises(ValueError, match="'latest'"),
            fsspec.open("o41://ml/metrics@latest", "wb", **options) as f,
        ):
            f.write(b"never")
        return before, after_except, after_transaction, str(refused.value)

    before, after_except, after_transaction, refused = await asyncio.to_thread(run)
    assert len(before[2]) == 1 and before[0] == before[1] == before[2][0]
    assert after_except[0] == after_except[1] != before[0] and len(after_except[2]) == 2
    assert after_transaction[0] != after_except[0] and len(after_transaction[2]) == 3
    got = await asyncio.to_thread(client.read_bytes, ORG, "metrics", "nightly")
    assert got == b"the transaction's save"
    assert "never written twice" in refused
    assert await asyncio.to_thread(lambda: len(list(client.versions(ORG, "metrics")))) == 3
