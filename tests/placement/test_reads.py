"""Parallel ranged reads, each part checked against the CRC32 its writer recorded, on the
three real stand-ins: versitygw (S3, checks signatures), fake-gcs-server and Azurite.

The whole stack is real: the operator sets up one Location per stand-in, the placement
service (TokenReview against the API server, state in etcd) records each part's CRC32 at
commit and hands them to the reader with the signed download, and the client reads the
version as parallel ranges of whole parts. A part damaged in the bucket (the object
overwritten by the store's own client with the same size and one byte changed) is named
in the error, and nothing is left at the destination path.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from o41 import artifacts as sdk
from o41.client import reads as client_reads
from o41.client.artifacts import Artifacts
from o41.client.errors import Damaged
from o41.core.parts import PART_SIZE, crc32_b64
from o41.core.places import Place
from testbed.kube import Kube
from testbed.product import PlacementProcess
from testbed.stores import AzureStore, GcsStore, VersityStore

from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

MiB = 2**20
API = "artifacts.o41.io/v1alpha1"
SIZE = 2 * PART_SIZE + MiB  # three parts, the last one short
PLACES = {
    "s3": ("aws", "us-east-1"),
    "gcs": ("gcp", "us-central1"),
    "azure": ("azure", "westeurope"),
}


@dataclass
class Reads:
    org: str
    token: Path
    tmp: Path
    url: str
    overwrite: dict[str, Callable[[str, bytes], None]]  # store -> (download URL, new bytes)

    def client(self, store: str) -> Artifacts:
        return Artifacts(self.url, str(self.token), Place(*PLACES[store], "env"), timeout=60)

    def sdk(self, store: str) -> sdk.Client:
        return sdk.Client(self.url, str(self.token), Place(*PLACES[store], "env"), timeout=60)


def _path_of(url: str, skip: int) -> tuple[str, str]:
    """(bucket or container, key) of a path-style signed URL, after ``skip`` leading
    segments (Azurite's path starts with the account)."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
    segments = path.split("/", skip + 1)
    return segments[skip], segments[skip + 1]


@pytest.fixture(scope="module")
def reads(
    kube: Kube,
    operator: object,
    placement: PlacementProcess,
    credentials: dict[str, str],
    s3: VersityStore,
    gcs: GcsStore,
    azure: AzureStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Reads:
    tmp = tmp_path_factory.mktemp("reads")
    tag = uuid.uuid4().hex[:6]
    org, namespace = f"reads-{tag}", f"readers-{tag}"
    backends = {
        "s3": {"s3": {"endpoint": s3.endpoint}},
        "gcs": {"gcs": {"endpoint": gcs.endpoint, "project": gcs.project}},
        "azure": {"azureBlob": {"accountUrl": azure.account_url}},
    }
    objects: list[dict[str, object]] = [
        {
            "apiVersion": API,
            "kind": "Organization",
            "metadata": {"name": org},
            "spec": {"namespaces": [namespace]},
        }
    ]
    for store, (cloud, region) in PLACES.items():
        objects.append(
            {
                "apiVersion": API,
                "kind": "Location",
                "metadata": {"name": f"{org}-{store}"},
                "spec": {
                    "organization": org,
                    "cloud": cloud,
                    "region": region,
                    "backend": backends[store],
                    "credentials": {"secretName": credentials[store]},
                },
            }
        )
    for obj in objects:
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
    for store in PLACES:
        kube.kubectl("wait", "--for=condition=Ready", f"location/{org}-{store}", "--timeout=60s")
    kube.kubectl("create", "namespace", namespace)
    token = kube.token(namespace)
    token_file = tmp / "token"
    token_file.write_text(token)
    wait_for(
        lambda: (
            json.loads(kube.kubectl("get", "org", org, "-o", "json"))
            .get("status", {})
            .get("takesWrites")
        ),
        60,
        "the organization to take writes",
    )

    def s3_put(url: str, data: bytes) -> None:
        bucket, key = _path_of(url, 0)
        s3.client().put_object(Bucket=bucket, Key=key, Body=data)

    def gcs_put(url: str, data: bytes) -> None:
        bucket, key = _path_of(url, 0)
        gcs.client().bucket(bucket).blob(key).upload_from_string(data)

    def azure_put(url: str, data: bytes) -> None:
        container, blob = _path_of(url, 1)
        azure.client().get_blob_client(container, blob).upload_blob(data, overwrite=True)

    return Reads(
        org, token_file, tmp, placement.url, {"s3": s3_put, "gcs": gcs_put, "azure": azure_put}
    )


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of one part each, so that a 33 MiB version comes as three parallel ranges."""
    monkeypatch.setattr(client_reads, "RANGE_SIZE", PART_SIZE)


@pytest.mark.parametrize("store", list(PLACES))
def test_parts_are_recorded_checked_per_range_and_a_damaged_part_is_named(
    reads: Reads, store: str
) -> None:
    client = reads.client(store)
    data = bytearray(os.urandom(SIZE))
    source = reads.tmp / f"{store}.bin"
    source.write_bytes(data)
    written = client.write(reads.org, "ckpt", source)
    assert written.location == f"{reads.org}-{store}"

    # the service hands the reader each part's CRC32, as the writer computed them
    found = client.locate(reads.org, "ckpt", written.version)
    assert found["partSize"] == PART_SIZE
    assert found["crc32"] == [
        crc32_b64(zlib.crc32(data[i : i + PART_SIZE])) for i in range(0, SIZE, PART_SIZE)
    ]
    # ...but not in the listing (a page of versions stays small)
    page = client.versions_page(reads.org, "ckpt")
    assert "crc32" not in page["versions"][0]

    out = reads.tmp / f"{store}-back.bin"
    read = client.read(reads.org, "ckpt", written.version, out)
    assert read.size == SIZE and out.read_bytes() == data
    got, _ = client.read_bytes(reads.org, "ckpt", written.version)
    assert got == data
    second, _ = client.read_range(reads.org, "ckpt", written.version, PART_SIZE, PART_SIZE)
    assert second == data[PART_SIZE : 2 * PART_SIZE]
    assert reads.sdk(store).read_range(reads.org, "ckpt", "latest", SIZE - 10, 100) == data[-10:]

    # the bucket's copy is damaged in part 2: same size, one byte changed
    data[PART_SIZE + 12345] ^= 0xFF
    reads.overwrite[store](found["download"]["url"], bytes(data))
    out.write_bytes(b"the previous file")
    with pytest.raises(Damaged) as damaged:
        client.read(reads.org, "ckpt", written.version, out)
    assert damaged.value.part == 2
    message = str(damaged.value)
    assert "part 2 of 3" in message and f"bytes {PART_SIZE}-{2 * PART_SIZE - 1}" in message
    assert written.version in message and "damaged" in message
    assert out.read_bytes() == b"the previous file"  # untouched
    assert sorted(p.name for p in reads.tmp.iterdir() if "partial" in p.name) == []

    fresh = reads.tmp / f"{store}-fresh.bin"
    with pytest.raises(Damaged):
        client.read(reads.org, "ckpt", written.version, fresh)
    assert not fresh.exists()
    with pytest.raises(Damaged, match="part 2 of 3"):
        client.read_bytes(reads.org, "ckpt", written.version)
    with (
        pytest.raises(Damaged, match="part 2 of 3"),
        reads.sdk(store).open(reads.org, "ckpt", written.version) as f,
    ):
        f.read()
    with pytest.raises(Damaged, match="part 2 of 3"):
        client.read_range(reads.org, "ckpt", written.version, PART_SIZE, PART_SIZE)
    # the parts around it are intact, and a range of them reads
    first, _ = client.read_range(reads.org, "ckpt", written.version, 0, PART_SIZE)
    assert first == data[:PART_SIZE]
