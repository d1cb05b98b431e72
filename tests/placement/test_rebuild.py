"""Issue 32: etcd's index is rebuilt from the buckets' record. Versions (in two clouds),
tags moved and deleted, metadata and a directory are written through the service as pods
write them; the organization's keys are deleted from the real etcd; ``python -m
o41.webhook.rebuild`` (as the chart's Job runs it) brings back the listing, every tag,
``latest`` and every read byte for byte, and the next commit takes the next number. A
record object whose transaction never happened comes back only if its bytes are there; a
location that cannot be listed is named and the rest rebuilt.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from o41.core.ledger import parse_record
from o41.state import open_store
from o41.webhook.records import PREFIX, Tag, tag_key
from testbed.etcd import EtcdCluster
from testbed.kube import Kube
from testbed.product import NAMESPACE, SAFE_ENV
from testbed.product import PlacementProcess as PlacementService
from testbed.stores import S3Store

from fixtures.placement import BreakableEndpoint
from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]


def rebuild(world: World, etcd: EtcdCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m o41.webhook.rebuild`` for the world's organization, as the Job runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "o41.webhook.rebuild",
            "--etcd",
            ",".join(etcd.endpoints),
            "--kubeconfig",
            str(world.kube.kubeconfig),
            "--secrets-namespace",
            NAMESPACE,
            "--organization",
            world.org,
            *args,
        ],
        env={**SAFE_ENV, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def lose_etcd(etcd: EtcdCluster, organization: str) -> None:
    """Every key etcd holds of the organization's versions, artifacts, tags, manifests."""

    async def go() -> None:
        store = open_store(etcd.endpoints)
        try:
            for kind in ("versions", "index", "artifacts", "tags", "manifests"):
                await store.delete(PREFIX + f"{kind}/{organization}/".encode(), prefix=True)
        finally:
            await store.close()

    asyncio.run(go())


def stale_tags(etcd: EtcdCluster, organization: str, tags: dict[str, str]) -> None:
    """Tags of ``model`` as an older etcd held them: set an hour before now."""

    async def go() -> None:
        store = open_store(etcd.endpoints)
        try:
            for tag, version in tags.items():
                stale = Tag(version, time.time() - 3600, "team-a")
                await store.put(tag_key(organization, "model", tag), stale.dump())
        finally:
            await store.close()

    asyncio.run(go())


def seen(world: World, artifact: str) -> dict[str, Any]:
    """What a user sees of an artifact: the listing (newest first), the tags, latest."""
    base = f"/v1/organizations/{world.org}/artifacts/{artifact}"
    status, listing = world.api("GET", f"{base}/versions?limit=100")
    assert status == 200, listing
    status, tags = world.api("GET", f"{base}/tags")
    assert status == 200, tags
    status, latest = world.api("GET", f"{base}/versions/latest")
    return {
        "versions": [
            (v["version"], v["location"], v["size"], v["md5"], v["metadata"], v.get("files"))
            for v in listing["versions"]
        ],
        "tags": sorted((t["tag"], t["version"]) for t in tags["tags"]),
        "latest": latest.get("version") if status == 200 else status,
    }


def write_dir(world: World, artifact: str, files: dict[str, bytes]) -> str:
    root = world.tmp / f"dir-{uuid.uuid4().hex[:6]}"
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    done = world.o41(
        "write", "--org", world.org, "--artifact", artifact, str(root), "--json",
        token=world.team_a, place=("aws", "us-east-1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    version: str = json.loads(done.stdout)["version"]
    return version


def read_dir(world: World, artifact: str, version: str) -> dict[str, bytes]:
    out = world.tmp / f"back-{uuid.uuid4().hex[:6]}"
    done = world.o41(
        "read", "--org", world.org, "--artifact", artifact, "--version", version,
        "--output", str(out), token=world.team_a, place=("aws", "us-east-1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def move_tag(world: World, artifact: str, tag: str, version: str) -> None:
    path = f"/v1/organizations/{world.org}/artifacts/{artifact}/tags/{tag}"
    status, answer = world.api("PUT", path, {"version": version})
    assert status == 200, answer


def test_a_lost_index_is_rebuilt_from_the_buckets_byte_for_byte(
    world: World, state_etcd: EtcdCluster
) -> None:
    model: dict[str, bytes] = {}
    for n, place in enumerate([("aws", "us-east-1"), ("gcp", "us-central1"), ("aws", "us-west-2")]):
        data = f"weights {n} ".encode() * (100 + n)
        model[world.write(data, world.team_a, place=place)["version"]] = data
    first, second, third = model
    move_tag(world, "model", "best", first)
    move_tag(world, "model", "best", second)  # moved twice: the journal replays both
    move_tag(world, "model", "prod", third)
    move_tag(world, "model", "gone", first)
    status, _ = world.api(
        "DELETE", f"/v1/organizations/{world.org}/artifacts/model/tags/gone"
    )  # a tag deleted stays deleted
    assert status == 200
    files = {"config.json": b'{"layers": 2}', "shards/0.bin": b"\x00\x01" * 3000}
    directory = write_dir(world, "ckpt", files)
    before = {a: seen(world, a) for a in ("model", "ckpt")}
    assert before["model"]["tags"] == [("best", second), ("prod", third)]

    lose_etcd(state_etcd, world.org)
    status, _ = world.api("GET", f"/v1/organizations/{world.org}/artifacts/model/versions/latest")
    assert status == 404  # the index is gone; the bytes are still in the buckets

    dry = rebuild(world, state_etcd, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for version in [*model, directory]:
        assert f"version {version} (sequence" in dry.stdout and "not in etcd" in dry.stdout
    assert "tag best is rebuilt (at " + second in dry.stdout
    status, _ = world.api("GET", f"/v1/organizations/{world.org}/artifacts/model/versions/latest")
    assert status == 404  # a dry run writes nothing

    # as etcd restored from a snapshot taken before the last tag moves: `best` still at
    # the first version, `gone` not yet deleted; the journal's newer moves win
    stale_tags(state_etcd, world.org, {"best": first, "gone": first})

    done = rebuild(world, state_etcd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "written: 4 versions, 2 artifact records, 3 tags" in done.stdout, done.stdout
    after = {a: seen(world, a) for a in ("model", "ckpt")}
    assert after == before
    for version, data in model.items():
        assert world.read(version, world.team_a, place=("aws", "us-east-1"))[1] == data
    assert read_dir(world, "ckpt", directory) == files

    again = rebuild(world, state_etcd, "--dry-run")  # etcd now holds what the buckets say
    assert "etcd holds what the buckets say" in again.stdout, again.stdout
    fourth = world.write(b"after the rebuild", world.team_a, place=("aws", "us-east-1"))["version"]
    listed = seen(world, "model")["versions"]
    assert [v[0] for v in listed] == [fourth, third, second, first]  # numbering went on


def test_a_record_whose_commit_never_happened_comes_back_only_with_its_bytes(
    world: World, state_etcd: EtcdCluster, s3: S3Store
) -> None:
    """The service PUT a version's record, then died before its transaction: the rebuild
    restores it when its object is whole in the bucket (the writer's bytes), and sets it
    aside when it is not."""
    committed = world.write(b"committed", world.team_a, place=("aws", "us-east-1"), artifact="orph")
    bucket = bucket_of(world, world.east)
    client = s3_client(s3)
    key = f".o41/versions/{world.org}/orph/{committed['version']}"
    record = parse_record(key, client.get_object(Bucket=bucket, Key=key)["Body"].read())
    # two commits that died after their PUT, numbered 2 and 3: one's bytes are there
    whole, torn = (f"{record.version[:13]}{uuid.uuid4().hex[:16]}" for _ in range(2))
    data = b"uploaded, never committed"
    client.put_object(Bucket=bucket, Key=f"orph/{whole}", Body=data)
    for version, seq, previous in ((whole, 2, record.version), (torn, 3, whole)):
        orphan = type(record)(
            **{
                **{f: getattr(record, f) for f in record.__dataclass_fields__},
                "version": version,
                "key": f"orph/{version}",
                "seq": seq,
                "previous": previous,
                "size": len(data),
                "md5": hashlib.md5(data).hexdigest(),
                "committed_us": record.committed_us + seq,
            }
        )
        client.put_object(Bucket=bucket, Key=orphan.object_key, Body=orphan.canonical())
    # the torn one names the whole one as previous: a record proves its predecessor, so
    # it is restored without a check; the torn one has no object: set aside
    done = rebuild(world, state_etcd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"set aside: .o41/versions/{world.org}/orph/{torn}" in done.stdout, done.stdout
    listed = [v[0] for v in seen(world, "orph")["versions"]]
    assert listed == [whole, record.version]
    assert world.read(whole, world.team_a, place=("aws", "us-east-1"), artifact="orph")[1] == data


def bucket_of(world: World, location: str) -> str:
    status = json.loads(world.kube.kubectl("get", "location", location, "-o", "json"))["status"]
    name: str = status["bucket"]
    return name


def s3_client(s3: S3Store) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name="us-east-1",
    )


def test_a_location_that_cannot_be_listed_is_named_and_the_rest_rebuilt(
    world: World, state_etcd: EtcdCluster, kube: Kube, s3: S3Store
) -> None:
    secret = f"creds-s3-{uuid.uuid4().hex[:6]}"
    keys = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}

    def credentials(values: dict[str, str]) -> None:
        world.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": NAMESPACE},
                "stringData": values,
            }
        )

    credentials(keys)
    south = world.location(
        f"aws-south-{uuid.uuid4().hex[:4]}",
        "aws",
        "sa-east-1",
        {"s3": {"endpoint": s3.endpoint}},
        secret,
    )
    world.ready(south)
    there = world.write(b"in the south", world.team_a, place=("aws", "sa-east-1"), artifact="far")
    assert there["location"] == south
    here = world.write(b"in the east", world.team_a, place=("aws", "us-east-1"), artifact="near")
    lose_etcd(state_etcd, world.org)
    credentials({**keys, "secretAccessKey": "not-the-key-" + "x" * 28})
    try:
        partial = rebuild(world, state_etcd)
        assert partial.returncode == 1, partial.stdout + partial.stderr
        assert f"UNREACHABLE location {south}" in partial.stdout, partial.stdout
        assert seen(world, "near")["latest"] == here["version"]  # the rest is rebuilt
        assert seen(world, "far")["latest"] == 404
    finally:
        credentials(keys)
    whole = rebuild(world, state_etcd)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert seen(world, "far")["latest"] == there["version"]


def test_a_service_killed_between_the_record_put_and_the_transaction_loses_nothing(
    world: World, state_etcd: EtcdCluster, kube: Kube, s3: S3Store, tmp_path_factory: Any
) -> None:
    """A service of its own, its Location's bucket behind a proxy that lets the record
    object's PUT reach the store and never answers it; the service is killed (SIGKILL)
    there, before its transaction. The writer was never told it committed; the version is
    not in etcd; the rebuild restores it, since its bytes are whole in the bucket."""
    proxy = BreakableEndpoint(s3.endpoint).start()
    own = PlacementService(
        kube.kubeconfig, state_etcd.endpoints, tmp_path_factory.mktemp("killed")
    ).start()
    try:
        west = world.location(
            f"aws-kill-{uuid.uuid4().hex[:4]}", "aws", "ap-south-1",
            {"s3": {"endpoint": proxy.url}}, world.credentials["s3"],
        )  # fmt: skip
        world.ready(west)
        data = b"checkpoint the service died committing"
        body = {
            "organization": world.org,
            "artifact": "killed",
            "size": len(data),
            "place": {"cloud": "aws", "region": "ap-south-1", "source": "env"},
        }
        status, began = call(own.url, world.team_a, "POST", "/v1/writes", body)
        assert status == 201 and began["location"] == west, began
        single = began["upload"]["single"]
        upload = urllib.request.Request(
            single["url"], data=data, method="PUT", headers=single["headers"]
        )
        urllib.request.urlopen(upload, timeout=30).close()
        proxy.hold = f"/.o41/versions/{world.org}/killed/"
        committing = threading.Thread(
            target=call,
            args=(own.url, world.team_a, "POST", f"/v1/writes/{began['version']}/commit", {}),
            daemon=True,
        )
        committing.start()
        assert proxy.held.wait(30), "the commit never PUT its record object"
        assert own.server is not None
        own.server.kill()  # between the record's PUT and the transaction
        committing.join(30)
        own.stop()
        proxy.release()
        version = began["version"]
        path = f"/v1/organizations/{world.org}/artifacts/killed/versions/{version}"
        status, _ = world.api("GET", path)
        assert status == 404  # never committed in etcd: nobody was told it was
        dry = rebuild(world, state_etcd, "--dry-run")
        line = f"version {version} (sequence 1) is in the buckets' records, not in etcd"
        assert line in dry.stdout, dry.stdout
        done = rebuild(world, state_etcd)
        assert done.returncode == 0, done.stdout + done.stderr
        assert seen(world, "killed")["latest"] == version
        back = world.read(version, world.team_a, place=("aws", "us-east-1"), artifact="killed")
        assert back[1] == data
    finally:
        own.stop()
        proxy.stop()


def call(url: str, token: Path, method: str, path: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": f"Bearer {token.read_text()}",
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        return 0, str(e)
