"""Directory versions and the ``o41://`` filesystem on the whole stack: the real service
process (TokenReview against the real API server, state in a 3-member etcd), Locations
on the S3 stand-in (versitygw, which checks signatures) and the GCS stand-in, the SDK and
pyarrow reading Parquet through fsspec."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from o41.artifacts import Client, Forbidden
from o41.core.places import Place

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]


def sdk(w: World, token: Path, place: Place) -> Client:
    return Client(w.service.url, str(token), place=place, timeout=60)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_pyarrow_reads_a_directory_version_on_versitygw_and_etcd(world: World) -> None:
    w = world
    east = Place("aws", "us-east-1", "env")
    client = sdk(w, w.team_a, east)
    data = w.tmp / "dataset"
    (data / "train").mkdir(parents=True)
    rows = pa.table({"step": list(range(200_000)), "loss": [1 / (i + 1) for i in range(200_000)]})
    pq.write_table(rows, data / "train" / "part-0.parquet", row_group_size=50_000)
    (data / "train" / "part 1 é.bin").write_bytes(os.urandom(3000))  # a key to quote
    (data / "meta.json").write_text('{"rows": 200000}')
    (data / "train" / "_SUCCESS").write_bytes(b"")  # a zero-byte object on versitygw
    written = client.write(w.org, "dataset", data, metadata={"epoch": 1}, tag="golden")
    assert (written.location, written.files) == (w.east, 4)

    listed = client.files(w.org, "dataset", "golden")
    assert [(f.path, f.md5) for f in listed.files] == sorted(
        (p, hashlib.md5(b).hexdigest()) for p, b in tree(data).items()
    )

    fs = fsspec.filesystem(
        "o41",
        endpoint=w.service.url,
        token_file=str(w.team_a),
        place={"cloud": "aws", "region": "us-east-1", "source": "env"},
        skip_instance_cache=True,
    )
    got = pq.read_table(f"{w.org}/dataset@golden/train/part-0.parquet", filesystem=fs)
    assert got.equals(rows)
    loss = pq.read_table(
        f"o41://{w.org}/dataset@latest/train/part-0.parquet", filesystem=fs, columns=["loss"]
    )
    assert loss.column("loss").to_pylist()[:3] == [1.0, 0.5, 1 / 3]
    assert sorted(fs.ls(f"{w.org}/dataset", detail=False)) == [
        f"{w.org}/dataset@latest/meta.json",
        f"{w.org}/dataset@latest/train",
    ]

    out = w.tmp / "dataset-back"
    read = client.read(w.org, "dataset", "golden", out)
    assert (read.version, read.files, tree(out)) == (written.version, 4, tree(data))

    # another namespace, not in the organization's spec.namespaces, reads none of it
    with pytest.raises(Forbidden):
        sdk(w, w.team_b, east).files(w.org, "dataset")
    base = f"/v1/organizations/{w.org}/artifacts/dataset/versions/latest/files"
    status, _ = w.api("GET", f"{base}/meta.json", token=w.team_b)
    assert status == 403


def test_a_directory_on_the_gcs_stand_in_and_a_half_directory(world: World) -> None:
    w = world
    gcp = Place("gcp", "us-central1", "env")
    client = sdk(w, w.team_a, gcp)
    ckpt = w.tmp / "ckpt"
    (ckpt / "shards").mkdir(parents=True)
    files = {f"shards/rank-{i}.pt": os.urandom(10_000 + i) for i in range(20)}
    files["empty"] = b""  # a zero-byte object on GCS
    for rel, b in files.items():
        (ckpt / rel).write_bytes(b)
    written = client.write(w.org, "ckpt", ckpt)
    assert (written.location, written.files) == (w.central, 21)
    out = w.tmp / "ckpt-back"
    client.read(w.org, "ckpt", "latest", out)
    assert tree(out) == files
    assert client.read_bytes(w.org, "ckpt", path="shards/rank-7.pt") == files["shards/rank-7.pt"]

    # begun, not committed: no version (etcd holds only the pending write)
    status, began = w.api(
        "POST",
        "/v1/directories",
        {
            "organization": w.org,
            "artifact": "half",
            "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
            "files": [{"path": "a", "size": 1, "md5": hashlib.md5(b"a").hexdigest()}],
        },
    )
    assert status == 201, began
    status, page = w.api("GET", f"/v1/organizations/{w.org}/artifacts/half/versions")
    assert (status, page["versions"]) == (200, [])
    status, body = w.api("POST", f"/v1/directories/{began['version']}/commit", {})
    assert status == 409 and "not in the bucket" in body["error"], body
