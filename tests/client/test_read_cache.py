"""Issue 39, point 5: a version read once on a node is read from its cache after.

The service runs in process (the real app on the embedded store) with its stand-in
bucket, which records every GET and the bytes it sent, and the usage API says what the
service counted. Eight processes reading one version at once fetch it once and all get
its bytes; the usage counts one read of its bytes; ``latest`` is still asked of the
service; the least recently used entry goes when the cache is full; a damaged entry is
fetched again, never served; the cache off reads from the bucket every time;
``open``, ``read_bytes``, directory versions and ``o41://`` use it.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from o41 import artifacts as sdk
from o41.client.cache import Cache, parse_size
from o41.client.errors import ConfigError
from o41.core.places import Place
from o41.filesystem import O41FileSystem
from test_writes import Service, serve, usage_of
from testbed.locations import ORG

MiB = 2**20
RANKS = 8


@pytest.fixture
async def service(tmp_path: Path) -> Any:
    async for s in serve(tmp_path):
        yield s


def _client(service: Service, cache: Any) -> sdk.Client:
    return sdk.Client(
        service.url, str(service.token), Place("gcp", "us-central1", "env"), 30, cache=cache
    )


def _rank(
    url: str, token: str, cache: str | bool, version: str, out: str
) -> tuple[str, str, float]:
    """One rank of a job: reads the version to its own output (another process)."""
    started = time.monotonic()
    client = sdk.Client(url, token, Place("gcp", "us-central1", "env"), 60, cache=cache)
    read = client.read(ORG, "ckpt", version, out)
    digest = hashlib.sha256(Path(out).read_bytes()).hexdigest()
    return read.locality, digest, time.monotonic() - started


def _ranks(service: Service, cache: str | bool, version: str, tmp: Path) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(RANKS) as pool:
        args = [
            (service.url, str(service.token), cache, version, str(tmp / f"rank-{i}"))
            for i in range(RANKS)
        ]
        return pool.starmap(_rank, args)


def _gets_of(service: Service, version: str, since: int = 0) -> list[tuple[str, str | None, int]]:
    return [g for g in service.storage.gets[since:] if version in g[0]]


async def _write(
    service: Service, tmp_path: Path, size: int, name: str = "ckpt"
) -> tuple[str, bytes]:
    data = os.urandom(size)
    path = tmp_path / f"w-{os.urandom(3).hex()}"
    path.write_bytes(data)
    written = await asyncio.to_thread(_client(service, False).write, ORG, name, path)
    return written.version, data


async def _read_bytes_counted(service: Service) -> int:
    return sum(r["counts"].get("bytes", 0) for r in await usage_of(service, "read"))


async def test_eight_ranks_reading_one_version_at_once_fetch_it_once(
    service: Service, tmp_path: Path
) -> None:
    size = 24 * MiB
    version, data = await _write(service, tmp_path, size)
    want = hashlib.sha256(data).hexdigest()
    cache = tmp_path / "node-cache"

    t0 = time.monotonic()
    got = await asyncio.to_thread(_ranks, service, str(cache), version, tmp_path)
    cached_s = time.monotonic() - t0
    assert [digest for _, digest, _ in got] == [want] * RANKS
    fetched = sum(n for _, _, n in _gets_of(service, version))
    assert fetched == size, fetched  # once, for the eight
    assert sorted(loc for loc, _, _ in got).count("cached") == RANKS - 1
    counted = await _read_bytes_counted(service)
    assert counted == size  # the usage counts what was fetched: one read

    before = len(service.storage.gets)
    t0 = time.monotonic()
    got = await asyncio.to_thread(_ranks, service, False, version, tmp_path)
    uncached_s = time.monotonic() - t0
    assert [digest for _, digest, _ in got] == [want] * RANKS
    assert sum(n for _, _, n in _gets_of(service, version, before)) == RANKS * size
    assert await _read_bytes_counted(service) == counted + RANKS * size
    print(
        f"{RANKS} ranks, one {size // MiB} MiB version: with the cache {fetched // MiB} MiB "
        f"fetched in {cached_s:.2f} s, without {RANKS * size // MiB} MiB in {uncached_s:.2f} s"
    )


async def test_latest_is_asked_of_the_service_and_a_hit_signs_nothing(
    service: Service, tmp_path: Path
) -> None:
    client = _client(service, tmp_path / "cache")
    first, data = await _write(service, tmp_path, 3 * MiB)
    out = tmp_path / "a"
    assert (
        await asyncio.to_thread(client.read, ORG, "ckpt", "latest", out)
    ).locality == "cross-cloud"
    signed = len(service.storage.signed)
    gets = len(service.storage.gets)
    hit = await asyncio.to_thread(client.read, ORG, "ckpt", "latest", tmp_path / "b")
    assert (hit.version, hit.locality) == (first, "cached")
    assert (tmp_path / "b").read_bytes() == data
    assert len(service.storage.signed) == signed and len(service.storage.gets) == gets
    assert await asyncio.to_thread(client.read_bytes, ORG, "ckpt", "latest") == data
    with await asyncio.to_thread(client.open, ORG, "ckpt", "latest") as f:
        assert (f.version, f.locality, f.read()) == (first, "cached", data)
    assert len(service.storage.gets) == gets

    second, newer = await _write(service, tmp_path, 2 * MiB)  # latest moves: asked, fetched
    back = await asyncio.to_thread(client.read, ORG, "ckpt", "latest", tmp_path / "c")
    assert (back.version, back.locality) == (second, "cross-cloud")
    assert (tmp_path / "c").read_bytes() == newer
    assert await _read_bytes_counted(service) == 3 * MiB + 2 * MiB


async def test_the_least_recently_used_version_goes_when_the_cache_is_full(
    service: Service, tmp_path: Path
) -> None:
    size = 4 * MiB
    cache = Cache(tmp_path / "cache", limit=int(2.5 * size))
    client = _client(service, cache)
    a, _ = await _write(service, tmp_path, size)
    b, _ = await _write(service, tmp_path, size)
    c, data_c = await _write(service, tmp_path, size)
    for v in (a, b, a):  # a is used last: b is the least recently used
        await asyncio.to_thread(client.read_bytes, ORG, "ckpt", v)
    await asyncio.to_thread(client.read_bytes, ORG, "ckpt", c)
    held = {cache.entry(ORG, "ckpt", v).present(): v for v in (a, b, c)}
    assert [cache.entry(ORG, "ckpt", v).present() for v in (a, b, c)] == [True, False, True], held
    assert cache.size() <= cache.limit
    gets = len(_gets_of(service, b))
    await asyncio.to_thread(client.read_bytes, ORG, "ckpt", b)  # fetched again
    assert len(_gets_of(service, b)) > gets
    assert await asyncio.to_thread(client.read_bytes, ORG, "ckpt", c) == data_c


async def test_a_damaged_entry_is_fetched_again_never_served(
    service: Service, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = Cache(tmp_path / "cache")
    client = _client(service, cache)
    version, data = await _write(service, tmp_path, 2 * MiB)
    await asyncio.to_thread(client.read_bytes, ORG, "ckpt", version)
    entry = cache.entry(ORG, "ckpt", version)
    damaged = bytearray(entry.data.read_bytes())  # one byte flipped on the disk
    damaged[12_345] ^= 0xFF
    entry.data.write_bytes(bytes(damaged))
    gets = len(_gets_of(service, version))
    assert await asyncio.to_thread(client.read_bytes, ORG, "ckpt", version) == data
    assert len(_gets_of(service, version)) == gets + 1
    assert "is damaged" in caplog.text
    entry.data.write_bytes(data[:-1])  # a byte short
    assert await asyncio.to_thread(client.read, ORG, "ckpt", version, tmp_path / "o")
    assert (tmp_path / "o").read_bytes() == data
    assert len(_gets_of(service, version)) == gets + 2


async def test_the_cache_off_reads_from_the_bucket_every_time(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for off in ("off", "0", "false", "None"):
        monkeypatch.setenv("O41_ARTIFACTS_CACHE", off)
        assert Cache.from_env() is None
    monkeypatch.delenv("O41_ARTIFACTS_CACHE")
    assert Cache.from_env() is not None
    assert Cache.from_env().root == tmp_path / "home" / ".cache" / "o41" / "artifacts"  # type: ignore[union-attr]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("O41_ARTIFACTS_CACHE_SIZE", "2GiB")
    found = Cache.from_env()
    assert found is not None and found.root == tmp_path / "xdg" / "o41" / "artifacts"
    assert found.limit == 2 * 2**30
    assert (parse_size("500MB"), parse_size("1K"), parse_size("7")) == (500 * 10**6, 1024, 7)
    with pytest.raises(ConfigError, match="O41_ARTIFACTS_CACHE_SIZE"):
        parse_size("lots")

    monkeypatch.setenv("O41_ARTIFACTS_CACHE", "off")
    client = _client(service, None)
    version, data = await _write(service, tmp_path, MiB)
    for n in (1, 2):
        back = await asyncio.to_thread(client.read, ORG, "ckpt", version, tmp_path / f"o{n}")
        assert back.locality == "cross-cloud" and (tmp_path / f"o{n}").read_bytes() == data
    assert len(_gets_of(service, version)) == 2
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()


async def test_directories_and_o41_paths_use_the_cache(service: Service, tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    client = _client(service, cache)
    ckpt = tmp_path / "ckpt"
    (ckpt / "shards").mkdir(parents=True)
    files = {"config.json": b'{"layers": 2}', "shards/model.bin": os.urandom(300_000)}
    for p, d in files.items():
        (ckpt / p).write_bytes(d)
    written = await asyncio.to_thread(client.write, ORG, "run", ckpt)
    first = await asyncio.to_thread(client.read, ORG, "run", "latest", tmp_path / "r1")
    counted = await _read_bytes_counted(service)
    gets, signed = len(service.storage.gets), len(service.storage.signed)
    again = await asyncio.to_thread(client.read, ORG, "run", "latest", tmp_path / "r2")
    assert (first.locality, again.locality, again.files) == ("cross-cloud", "cached", 2)
    for p, d in files.items():
        assert (tmp_path / "r2" / p).read_bytes() == d
    one = await asyncio.to_thread(client.read_bytes, ORG, "run", "latest", path="shards/model.bin")
    assert one == files["shards/model.bin"]
    await asyncio.to_thread(
        client.read_file, ORG, "run", written.version, "config.json", tmp_path / "c"
    )
    assert (tmp_path / "c").read_bytes() == files["config.json"]

    def through_o41() -> None:
        fs = O41FileSystem(
            service.url, str(service.token), place={"cloud": "gcp", "region": "us-central1"},
            cache=cache, skip_instance_cache=True,
        )  # fmt: skip
        path = f"{ORG}/run@latest/shards/model.bin"
        with fs.open(path, "rb") as f:
            f.seek(1000)
            assert f.read(10) == files["shards/model.bin"][1000:1010]
        assert fs.cat_file(f"{ORG}/run@latest/config.json") == files["config.json"]
        fs.get_file(path, str(tmp_path / "got"))
        assert (tmp_path / "got").read_bytes() == files["shards/model.bin"]

    await asyncio.to_thread(through_o41)
    assert (len(service.storage.gets), len(service.storage.signed)) == (gets, signed)
    assert await _read_bytes_counted(service) == counted  # hits are no reads


async def test_a_cache_folder_it_cannot_write_reads_from_the_bucket(
    service: Service, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a pod with a read-only root filesystem: the default folder cannot be made there
    # (here: a file stands where a folder of the path must be, ENOTDIR, which root cannot
    # write past either); the reads must still return the bytes, from the bucket
    (tmp_path / "ro").write_bytes(b"")
    client = _client(service, Cache(tmp_path / "ro" / "o41" / "artifacts"))
    version, data = await _write(service, tmp_path, MiB)
    for n in (1, 2):
        back = await asyncio.to_thread(client.read, ORG, "ckpt", version, tmp_path / f"o{n}")
        assert back.locality == "cross-cloud" and (tmp_path / f"o{n}").read_bytes() == data
    assert await asyncio.to_thread(client.read_bytes, ORG, "ckpt", version) == data
    assert len(_gets_of(service, version)) >= 3  # every read went to the bucket
    said = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(said) == 1 and "O41_ARTIFACTS_CACHE" in said[0], said
