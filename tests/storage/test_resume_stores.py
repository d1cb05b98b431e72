"""A resume with another file of the same size, on the four kinds of bucket: the S3
stand-in (versitygw, part checksums signed), an S3-compatible Location on versitygw (no
part checksums), fake-gcs-server and Azurite, behind the real placement service process
(TokenReview against the API server, state in etcd).

The write is begun as a killed job left it: the begin (each part's CRC32 recorded) and its
first part in the bucket, no commit. ``write(..., resume=V)`` of another file of the same
size must be refused before a byte is sent (issue 43: on GCS, Azure and S3-compatible
stores it used to commit a version nobody could read), leaving the write pending,
``latest`` and the tag where they were; the file it began with then resumes.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from o41 import artifacts as sdk
from o41.client.artifacts import Artifacts
from o41.client.transfers import Pool, Source, part_checksums, put
from o41.core.parts import PART_SIZE
from o41.core.places import Place
from testbed.kube import Kube
from testbed.product import PlacementProcess
from testbed.stores import AzureStore, GcsStore, VersityStore

from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

API = "artifacts.o41.io/v1alpha1"
SIZE = PART_SIZE + 2**20  # two parts
PLACES = {
    "s3": ("aws", "us-east-1"),
    "s3-compatible": ("nebius", "eu-north1"),
    "gcs": ("gcp", "us-central1"),
    "azure": ("azure", "westeurope"),
}


@dataclass
class Resumes:
    org: str
    token: Path
    tmp: Path
    url: str

    def api(self, store: str) -> Artifacts:
        return Artifacts(self.url, str(self.token), Place(*PLACES[store], "env"), timeout=60)

    def sdk(self, store: str) -> sdk.Client:
        return sdk.Client(self.url, str(self.token), Place(*PLACES[store], "env"), timeout=60)


@pytest.fixture(scope="module")
def resumes(
    kube: Kube,
    operator: object,
    placement: PlacementProcess,
    credentials: dict[str, str],
    s3: VersityStore,
    gcs: GcsStore,
    azure: AzureStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Resumes:
    tmp = tmp_path_factory.mktemp("resumes")
    tag = uuid.uuid4().hex[:6]
    org, namespace = f"resumes-{tag}", f"resumers-{tag}"
    backends: dict[str, tuple[dict[str, Any], str]] = {
        "s3": ({"s3": {"endpoint": s3.endpoint}}, credentials["s3"]),
        "s3-compatible": (
            {"s3Compatible": {"endpoint": s3.endpoint, "signingRegion": "us-east-1"}},
            credentials["s3"],
        ),
        "gcs": ({"gcs": {"endpoint": gcs.endpoint, "project": gcs.project}}, credentials["gcs"]),
        "azure": ({"azureBlob": {"accountUrl": azure.account_url}}, credentials["azure"]),
    }
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "Organization",
            "metadata": {"name": org},
            "spec": {"namespaces": [namespace]},
        }
    ]
    for store, (cloud, region) in PLACES.items():
        backend, secret = backends[store]
        objects.append(
            {
                "apiVersion": API,
                "kind": "Location",
                "metadata": {"name": f"{org}-{store}"},
                "spec": {
                    "organization": org,
                    "cloud": cloud,
                    "region": region,
                    "backend": backend,
                    "credentials": {"secretName": secret},
                },
            }
        )
    for obj in objects:
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
    for store in PLACES:
        kube.kubectl("wait", "--for=condition=Ready", f"location/{org}-{store}", "--timeout=60s")
    kube.kubectl("create", "namespace", namespace)
    token_file = tmp / "token"
    token_file.write_text(kube.token(namespace))
    wait_for(
        lambda: (
            json.loads(kube.kubectl("get", "org", org, "-o", "json"))
            .get("status", {})
            .get("takesWrites")
        ),
        60,
        "the organization to take writes",
    )
    return Resumes(org, token_file, tmp, placement.url)


def begin_as_a_killed_job(r: Resumes, store: str, artifact: str, path: Path) -> str:
    """Begin the write of ``path`` in parts (each part's CRC32 recorded) and put its
    first part in the bucket, as a job killed mid-upload leaves it: the version id."""
    api = r.api(store)
    began = api.call(
        "POST",
        "/v1/writes",
        {
            "organization": r.org,
            "artifact": artifact,
            "place": api.place.as_json(),
            "size": SIZE,
            "partSize": PART_SIZE,
            "crc32": part_checksums(path, SIZE, PART_SIZE),
        },
    )
    assert began["location"] == f"{r.org}-{store}", began
    first = began["upload"]["multipart"]["parts"][0]
    pool = Pool(60)
    try:
        put(
            pool,
            first,
            lambda: Source(path=path).slice(0, PART_SIZE, lambda n: None),
            PART_SIZE,
            began["location"],
        )
    finally:
        pool.close()
    version: str = began["version"]
    return version


@pytest.mark.parametrize("store", list(PLACES))
def test_a_resume_with_another_file_of_the_same_size_is_refused_before_a_byte_is_sent(
    resumes: Resumes, store: str
) -> None:
    r, artifact = resumes, f"ckpt-{store}"
    client = r.sdk(store)
    committed = client.write(r.org, artifact, b"the last good checkpoint", tag="best")
    began_with, other = r.tmp / f"{store}-began.bin", r.tmp / f"{store}-other.bin"
    began_with.write_bytes(os.urandom(SIZE))
    other.write_bytes(os.urandom(SIZE))  # same size, same cut: new weights
    version = begin_as_a_killed_job(r, store, artifact, began_with)
    before = r.api(store).call("GET", f"/v1/writes/{version}")
    assert [p["number"] for p in before["present"]] == [1]

    with pytest.raises(sdk.Error) as refused:
        client.write(r.org, artifact, other, resume=version, tag="best")
    message = str(refused.value)
    assert message.startswith(f"write {version} began with another file: part 1 of 2 (bytes "), (
        message
    )
    assert "Nothing was sent and the write stays pending" in message
    assert "resume with the file it began with, or write this one again without resume" in message
    # nothing of the other file reached the bucket; nothing was committed, nothing moved
    after = r.api(store).call("GET", f"/v1/writes/{version}")
    assert after["present"] == before["present"]
    assert client.resolve(r.org, artifact, "latest").version == committed.version
    assert client.resolve(r.org, artifact, "best").version == committed.version

    written = client.write(r.org, artifact, began_with, resume=version, tag="best")
    assert written.version == version
    assert client.resolve(r.org, artifact, "best").version == version
    assert client.read_bytes(r.org, artifact, "latest") == began_with.read_bytes()
