"""Directory versions in-process: the real service app on the embedded store, the SDK and
the ``o41`` command, and a stand-in bucket over HTTP (``make unit`` runs these). A
directory is one version in one location; readers see no version or all of it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from o41.artifacts import BadRequest, Client, Conflict, Damaged, Error, NotFound
from o41.cli import main
from o41.core.directories import MAX_FILES, MAX_PATH_BYTES
from o41.core.ledger import parse_record
from o41.core.places import Place
from o41.webhook.http.store import STORE
from test_writes import Service, serve
from testbed.locations import ORG
from testbed.standin_bucket import Stored

PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


def sdk(service: Service) -> Client:
    return Client(
        service.url, str(service.token), place=Place("aws", "us-east-1", "env"), timeout=30
    )


def checkpoint(root: Path) -> dict[str, bytes]:
    """A sharded checkpoint as save_pretrained leaves one: nested, an empty file, a link
    inside the directory."""
    files = {
        "config.json": b'{"layers": 2}',
        "model-00001-of-00002.safetensors": os.urandom(200_000),
        "model-00002-of-00002.safetensors": os.urandom(70_001),
        "optimizer/rank-0.pt": os.urandom(5000),
        "optimizer/rank-1.pt": os.urandom(5000),
        "deep/er/still/empty.bin": b"",
        "name with spaces é.txt": b"unicode and spaces",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "latest.json").symlink_to("config.json")  # inside: its bytes, under its name
    files["latest.json"] = files["config.json"]
    (root / "empty-folder").mkdir()  # not kept: a version holds files
    return files


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def test_a_directory_is_one_version_read_whole_or_file_by_file(
    service: Service, tmp_path: Path
) -> None:
    client = sdk(service)
    files = checkpoint(tmp_path / "ckpt")
    written = await asyncio.to_thread(
        client.write, ORG, "run", tmp_path / "ckpt", metadata={"step": 7}, tag="best"
    )
    assert (written.files, written.size, written.location, written.tag) == (
        len(files),
        sum(map(len, files.values())),
        "east",
        "best",
    )
    # each file is an object under the version's prefix, all in the one location, with
    # the version's record object and its manifest object beside them (issue 32)
    keys = sorted(k for k in service.storage.objects if k.startswith("/bucket-east/"))
    ledger = [k for k in keys if k.startswith("/bucket-east/.o41/")]
    assert ledger == [
        f"/bucket-east/.o41/manifests/{ORG}/run/{written.version}",
        f"/bucket-east/.o41/versions/{ORG}/run/{written.version}",
    ]
    keys = [k for k in keys if k not in ledger]
    assert len(keys) == len(files)
    assert all(f"/run/{written.version}/" in k for k in keys)
    raw = service.storage.objects[ledger[1]].data
    record = parse_record(ledger[1].removeprefix("/bucket-east/"), raw, "east")
    assert record.manifest is not None and record.manifest.files == len(files)
    assert (record.tag, record.metadata, record.seq) == ("best", {"step": 7}, 1)

    latest = await asyncio.to_thread(client.latest, ORG, "run")
    assert latest is not None
    assert (latest.version, latest.files, latest.metadata) == (written.version, 8, {"step": 7})

    listed = await asyncio.to_thread(client.files, ORG, "run", "best")
    assert listed.version == written.version and listed.tag == "best"
    assert [f.path for f in listed.files] == sorted(files)
    assert {f.path: (f.size, f.md5) for f in listed.files} == {
        p: (len(d), hashlib.md5(d).hexdigest()) for p, d in files.items()
    }

    out = tmp_path / "back"
    got = await asyncio.to_thread(client.read, ORG, "run", "latest", out)
    assert (got.version, got.files, got.size) == (written.version, 8, written.size)
    assert tree(out) == files
    assert not (tmp_path / "back.o41-partial").exists()

    shard = "model-00001-of-00002.safetensors"
    one = await asyncio.to_thread(client.read_bytes, ORG, "run", written.version, path=shard)
    assert one == files[shard]

    def seek_and_read() -> tuple[bytes, bytes, int]:
        with client.open(ORG, "run", "best", path=shard) as f:
            head = f.read(8)
            f.seek(150_000)
            return head, f.read(16), f.size

    head, middle, size = await asyncio.to_thread(seek_and_read)
    assert (head, middle, size) == (files[shard][:8], files[shard][150_000:150_016], 200_000)
    dest = tmp_path / "space.txt"
    await asyncio.to_thread(client.read_file, ORG, "run", "latest", "name with spaces é.txt", dest)
    assert dest.read_bytes() == b"unicode and spaces"

    # the version read route names a directory (no download); a file it does not hold is a
    # 404 naming the command that lists them; a directory read into a full folder: refused
    status, body = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/run/versions/latest"
    )
    assert (status, body["download"], body["files"]) == (200, None, 8)
    with pytest.raises(NotFound, match="o41 files"):
        await asyncio.to_thread(client.read_bytes, ORG, "run", "latest", path="nope.bin")
    with pytest.raises(Error, match="directory of 8 files"):
        await asyncio.to_thread(client.open, ORG, "run", "latest")
    with pytest.raises(Error, match="not an empty directory"):
        await asyncio.to_thread(client.read, ORG, "run", "latest", out)

    # another namespace sees none of it
    status, body = await service.api(
        "GET",
        f"/v1/organizations/{ORG}/artifacts/run/versions/latest/files",
        headers={"Authorization": "Bearer token-team-b"},
    )
    assert status == 403


async def test_a_reader_never_sees_half_a_directory(service: Service, tmp_path: Path) -> None:
    """Begun and half uploaded, a directory is no version: listings, latest, the files
    route and a read by id find nothing; a commit before the last file is refused and
    writes nothing; once every file is in and it commits, all of it is there at once."""
    files = {f"shard-{i:02d}.bin": os.urandom(1000 + i) for i in range(10)}
    began_status, began = await service.api(
        "POST",
        "/v1/directories",
        {
            "organization": ORG,
            "artifact": "half",
            "place": PLACE,
            "files": [
                {"path": p, "size": len(d), "md5": hashlib.md5(d).hexdigest()}
                for p, d in files.items()
            ],
        },
    )
    assert began_status == 201, began
    version = began["version"]
    uploads = {u["path"]: u for u in began["files"]}
    assert sorted(uploads) == sorted(files)

    import aiohttp

    async with aiohttp.ClientSession() as s:

        async def put(path: str) -> None:
            u = uploads[path]
            async with s.request(u["method"], u["url"], data=files[path]) as r:
                assert r.status == 200

        for path in sorted(files)[:6]:
            await put(path)

        async def nothing_yet() -> None:
            base = f"/v1/organizations/{ORG}/artifacts/half"
            status, page = await service.api("GET", f"{base}/versions")
            assert (status, page["versions"]) == (200, [])
            for path in ("/versions/latest", f"/versions/{version}/files", "/tags/latest"):
                status, body = await service.api("GET", base + path)
                assert status == 404, (path, body)

        await nothing_yet()
        status, body = await service.api("POST", f"/v1/directories/{version}/commit", {})
        assert status == 409 and "4 of the 10 files" in body["error"], body
        await nothing_yet()
        status, body = await service.api("POST", f"/v1/writes/{version}/commit", {})
        assert status == 409 and "/v1/directories/" in body["error"]

        for path in sorted(files)[6:]:
            await put(path)
    status, done = await service.api("POST", f"/v1/directories/{version}/commit", {})
    assert status == 200, done
    assert (done["files"], done["size"]) == (10, sum(map(len, files.values())))
    status, listed = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/half/versions/latest/files"
    )
    assert status == 200
    assert [(f["path"], f["size"]) for f in listed["files"]] == [
        (p, len(files[p])) for p in sorted(files)
    ]
    out = tmp_path / "out"
    await asyncio.to_thread(sdk(service).read, ORG, "half", version, out)
    assert tree(out) == files


async def test_a_damaged_file_is_refused_at_commit(service: Service) -> None:
    data = b"the real bytes"
    status, began = await service.api(
        "POST",
        "/v1/directories",
        {
            "organization": ORG,
            "artifact": "bad",
            "place": PLACE,
            "files": [{"path": "a.bin", "size": len(data), "md5": hashlib.md5(data).hexdigest()}],
        },
    )
    assert status == 201
    import aiohttp

    u = began["files"][0]
    async with aiohttp.ClientSession() as s, s.put(u["url"], data=b"other  bytes!!") as r:
        assert r.status == 200
    status, body = await service.api("POST", f"/v1/directories/{began['version']}/commit", {})
    assert status == 409 and "a.bin" in body["error"] and "MD5" in body["error"], body


async def test_every_read_of_a_damaged_file_raises_damaged(
    service: Service, tmp_path: Path
) -> None:
    """Issue 43: a file of a directory version whose bytes in the bucket are not those
    written is ``Damaged`` however it is read (the whole directory, ``read_file``,
    ``read_bytes(path=)``, ``open(path=)``), named as the version names it, and nothing
    is left at the output."""
    client = sdk(service)
    ckpt = tmp_path / "ckpt"
    (ckpt / "shards").mkdir(parents=True)
    model = os.urandom(70_000)
    (ckpt / "shards" / "model.bin").write_bytes(model)
    (ckpt / "config.json").write_bytes(b'{"layers": 2}')
    written = await asyncio.to_thread(client.write, ORG, "dmg", ckpt)
    key = f"/bucket-east/dmg/{written.version}/shards/model.bin"
    damaged = bytearray(model)
    damaged[12_345] ^= 0xFF  # same size, one byte changed
    service.storage.objects[key] = Stored(bytes(damaged))

    whole, one = tmp_path / "restore", tmp_path / "model.bin"
    reads = {
        "read": lambda: client.read(ORG, "dmg", "latest", whole),
        "read_file": lambda: client.read_file(ORG, "dmg", "latest", "shards/model.bin", one),
        "read_bytes": lambda: client.read_bytes(ORG, "dmg", "latest", path="shards/model.bin"),
        "open": lambda: client.open(ORG, "dmg", "latest", path="shards/model.bin").read(),
    }
    for how, read in reads.items():
        with pytest.raises(Damaged) as raised:
            await asyncio.to_thread(read)
        message = str(raised.value)
        assert f"file shards/model.bin of version {written.version}" in message, (how, message)
        assert "o41-partial" not in message and "damaged" in message, (how, message)
    left = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.iterdir()))
    assert left == ["ckpt", "token"]  # no output, no partial file or folder left

    service.storage.objects[key] = Stored(model[:-1])  # a byte short
    with pytest.raises(Damaged, match="69999 bytes where its writer wrote 70000"):
        await asyncio.to_thread(reads["read_file"])


def _begin(files: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"organization": ORG, "artifact": "bad", "place": PLACE, "files": files, **more}


def _file(path: str, size: int = 1) -> dict[str, Any]:
    return {"path": path, "size": size, "md5": "0" * 32}


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ([], "no files"),
        ([_file("../etc/passwd")], "'..'"),
        ([_file("a/../../b")], "'..'"),
        ([_file("/etc/passwd")], "absolute"),
        ([_file("a//b")], "empty name"),
        ([_file("a/./b")], "'.'"),
        ([_file("a\\b")], "backslash"),
        ([_file("a\nb")], "control character"),
        ([_file("x" * (MAX_PATH_BYTES + 1))], f"at most {MAX_PATH_BYTES}"),
        ([_file("a"), _file("a")], "given twice"),
        ([_file("a"), _file("a/b")], "a file and a folder"),
        ([_file(f"f{i}") for i in range(MAX_FILES + 1)], f"at most {MAX_FILES}"),
        ([{"path": "a", "size": 1, "md5": "nope"}], "md5"),
        ([_file("a", 6 * 1024**3)], "size"),
    ],
)
async def test_bad_directories_are_refused_and_nothing_is_written(
    service: Service, files: list[dict[str, Any]], says: str
) -> None:
    status, body = await service.api("POST", "/v1/directories", _begin(files))
    assert status == 400 and says in body["error"], body
    assert service.storage.signed == []  # nothing signed
    assert service.app is not None
    assert await service.app[STORE].range(b"/o41/placement/pending/") == []


def test_the_client_refuses_bad_directories_before_sending(tmp_path: Path) -> None:
    """No service at all: each refusal comes before a request is made."""
    client = Client("http://127.0.0.1:9", str(tmp_path / "token"), place=Place(None, None, "none"))
    empty = tmp_path / "empty"
    (empty / "only" / "folders").mkdir(parents=True)
    with pytest.raises(Error, match="has no files"):
        client.write(ORG, "a", empty)
    leaves = tmp_path / "leaves"
    leaves.mkdir()
    (tmp_path / "secret").write_text("outside")
    (leaves / "ok.txt").write_text("ok")
    (leaves / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(Error, match="outside"):
        client.write(ORG, "a", leaves)
    up = tmp_path / "up"
    (up / "sub").mkdir(parents=True)
    (up / "f").write_text("f")
    (up / "sub" / "parent").symlink_to("..")  # inside, but a loop
    with pytest.raises(Error, match="loop"):
        client.write(ORG, "a", up)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "back\\slash").write_text("x")
    with pytest.raises(Error, match="backslash"):
        client.write(ORG, "a", bad)
    with pytest.raises(Error, match=r"'\.\.'"):
        client.read_bytes(ORG, "a", "latest", path="../x")
    deep = tmp_path / "deep"
    long = deep.joinpath(*["d" * 100] * 5)  # 5 folders of 100 bytes: a path over 512
    long.mkdir(parents=True)
    (long / "weights.bin").write_bytes(b"w")
    with pytest.raises(Error, match=f"at most {MAX_PATH_BYTES}"):
        client.write(ORG, "a", deep)
    many = tmp_path / "many"
    many.mkdir()
    for i in range(MAX_FILES + 1):
        (many / f"{i}").touch()
    with pytest.raises(Error, match=f"more than {MAX_FILES} files"):
        client.write(ORG, "a", many)


async def test_the_command_writes_lists_and_reads_a_directory(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = checkpoint(tmp_path / "ckpt")
    common = ["--endpoint", service.url, "--token-file", str(service.token)]
    art = ["--org", ORG, "--artifact", "cli", *common]
    os.environ["O41_ARTIFACTS_CLOUD"], os.environ["O41_ARTIFACTS_REGION"] = "aws", "us-east-1"
    try:
        rc = await asyncio.to_thread(main, ["write", *art, str(tmp_path / "ckpt"), "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["files"] == len(files)
        rc = await asyncio.to_thread(main, ["files", *art, "--version", "latest", "--json"])
        listed = json.loads(capsys.readouterr().out)
        assert rc == 0 and [f["path"] for f in listed["files"]] == sorted(files)
        rc = await asyncio.to_thread(main, ["files", *art, "--version", "latest"])
        text = capsys.readouterr().out
        assert rc == 0 and "config.json" in text and str(len(files["config.json"])) in text
        back = tmp_path / "back"
        rc = await asyncio.to_thread(
            main, ["read", *art, "--version", "latest", "--output", str(back)]
        )
        assert rc == 0 and "8 files" in capsys.readouterr().out
        assert tree(back) == files
        one = tmp_path / "one"
        rc = await asyncio.to_thread(
            main,
            [
                "read",
                *art,
                "--version",
                out["version"],
                "--path",
                "config.json",
                "--output",
                str(one),
            ],
        )
        capsys.readouterr()
        assert rc == 0 and one.read_bytes() == files["config.json"]
        rc = await asyncio.to_thread(
            main, ["write", *art, str(tmp_path / "nothing-here"), "--json"]
        )
        err = json.loads(capsys.readouterr().err)
        assert rc == 1 and err["status"] is None
    finally:
        del os.environ["O41_ARTIFACTS_CLOUD"], os.environ["O41_ARTIFACTS_REGION"]


async def test_a_file_version_is_not_a_directory(service: Service) -> None:
    client = sdk(service)
    await asyncio.to_thread(client.write, ORG, "plain", b"one file")
    with pytest.raises(Conflict, match="one file, not a directory"):
        await asyncio.to_thread(client.files, ORG, "plain")
    status, body = await service.api(
        "GET", f"/v1/organizations/{ORG}/artifacts/plain/versions/latest/files/a%5Cb"
    )
    assert status == 400 and "backslash" in body["error"], body
    with pytest.raises(BadRequest, match="download must be"):
        await asyncio.to_thread(
            client._api.call,
            "GET",
            f"/v1/organizations/{ORG}/artifacts/plain/versions/latest/files?download=yes",
        )


async def test_a_retired_location_keeps_serving_its_directories(
    service: Service, tmp_path: Path
) -> None:
    from o41.kube.location_record import LocationRecord
    from o41.kube.locations import read_location
    from o41.webhook.cluster.view import VIEW

    files = checkpoint(tmp_path / "ckpt")
    west = Client(service.url, str(service.token), place=Place("aws", "us-west-2", "env"))
    written = await asyncio.to_thread(west.write, ORG, "moved", tmp_path / "ckpt")
    assert written.location == "west"
    assert service.app is not None
    created = "2026-01-02T00:00:00Z"
    retired = {
        "metadata": {"name": "west", "uid": "uid-west", "creationTimestamp": created},
        "spec": {
            "organization": ORG,
            "cloud": "aws",
            "region": "us-west-2",
            "bucket": "bucket-west",
            "backend": {"s3": {}},
            "retired": True,
        },
    }
    service.app[VIEW].put_location(
        read_location(retired, LocationRecord("uid-west", "west", ready=True, ready_since=created))
    )
    out = tmp_path / "back"
    got = await asyncio.to_thread(west.read, ORG, "moved", written.version, out)
    assert (got.location, tree(out)) == ("west", files)
    again = await asyncio.to_thread(west.write, ORG, "moved", tmp_path / "ckpt")
    assert again.location == "east"  # no new writes to a retired location: the cloud's default


async def test_a_listing_whose_etags_are_no_md5s_is_checked_by_heads(tmp_path: Path) -> None:
    """S3 with SSE-KMS lists ETags that look like MD5s and are not: the commit asks the
    bucket (a HEAD) about each file its listing disagrees on, and accepts what the HEAD
    says is right; the listing alone decides nothing."""
    from testbed.standin_bucket import StandInBucket, Storage

    heads: list[str] = []

    class Kms(StandInBucket):
        def list_under(self, prefix: str) -> dict[str, Any]:
            from o41.storage import ObjectStat

            listed = super().list_under(prefix)
            return {k: ObjectStat(size=s.size, md5="f" * 32) for k, s in listed.items()}

        def stat(self, key: str) -> Any:
            heads.append(key)
            found = super().stat(key)
            return None if found is None else type(found)(size=found.size)  # no MD5 shown

    def opener(storage: Storage) -> Any:
        return lambda ref: Kms(ref, storage)

    async for service in serve(tmp_path, opener):
        files = checkpoint(tmp_path / "ckpt")
        written = await asyncio.to_thread(sdk(service).write, ORG, "kms", tmp_path / "ckpt")
        assert written.files == len(files) and len(heads) == len(files)
