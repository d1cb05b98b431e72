"""Writes and reads end to end: kubectl, the operator, the placement service (a real
process on a 3-member etcd), the stand-ins, and the `o41` CLI as a pod would run it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from o41.core.parts import crc32_b64
from testbed.kube import Kube
from testbed.product import NAMESPACE
from testbed.stores import S3Store

from fixtures.placement import BreakableEndpoint
from fixtures.world import API, World
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]


def test_writes_land_where_the_spec_says(world: World) -> None:
    region = world.write(b"region", world.team_a, ("aws", "us-west-2"))
    assert (region["location"], region["rule"], region["warning"]) == (world.west, "region", None)

    cloud = world.write(b"cloud", world.team_a, ("aws", "eu-west-1"))
    assert (cloud["location"], cloud["rule"], cloud["warning"]) == (world.east, "cloud", None)

    other = world.write(b"other cloud", world.team_a, ("azure", "westeurope"))
    assert (other["location"], other["rule"]) == (world.east, "fallback")
    assert "fallback" in other["warning"] and "azure/westeurope" in other["warning"]
    assert other["warning"] in other["stderr"]  # the client logs it

    unknown = world.write(b"unknown", world.team_a)  # no env, no SkyPilot, no DMI: none
    assert (unknown["location"], unknown["rule"]) == (world.east, "fallback")
    assert "unknown place" in unknown["warning"]


def test_reads_return_the_bytes_and_say_how_far(world: World, s3: S3Store) -> None:
    data = os.urandom(300_000)
    written = world.write(data, world.team_a, ("aws", "us-east-1"))
    assert written["location"] == world.east

    local, got = world.read(written["version"], world.team_a, ("aws", "us-east-1"))
    assert (local, got) == ({"location": world.east, "locality": "local"}, data)
    far, _ = world.read(written["version"], world.team_a, ("aws", "us-west-2"))
    assert far["locality"] == "cross-region"
    farther, got = world.read(written["version"], world.team_a, ("gcp", "us-central1"))
    assert farther["locality"] == "cross-cloud" and got == data

    records = world.usage(world.team_a)
    crossing = [
        r for r in records if r["kind"] == "read" and r["dims"]["locality"] == "cross-cloud"
    ]
    assert sum(r["counts"]["bytes"] for r in crossing) >= len(data)


def test_gcs_location_takes_writes_and_serves_reads(world: World) -> None:
    data = os.urandom(50_000)
    written = world.write(data, world.team_a, ("gcp", "us-central1"))
    assert (written["location"], written["rule"]) == (world.central, "region")
    found, got = world.read(written["version"], world.team_a, ("gcp", "us-central1"))
    assert found["locality"] == "local" and got == data


def test_a_large_file_goes_up_in_parallel_parts(world: World) -> None:
    data = os.urandom(64 * 1024 * 1024 + 5 * 1024 * 1024)  # two parts
    written = world.write(data, world.team_a, ("aws", "us-west-2"), artifact="big")
    _, got = world.read(written["version"], world.team_a, ("aws", "us-west-2"), artifact="big")
    assert got == data
    # parts were used: a single upload's commit carries its MD5, a multipart object has none
    # (S3's ETag of it is not one); and the bucket reports the parts' composite CRC32
    status, found = world.api(
        "GET", f"/v1/organizations/{world.org}/artifacts/big/versions/{written['version']}"
    )
    assert status == 200 and found["md5"] is None, found


def test_namespace_not_listed_is_refused(world: World) -> None:
    path = world.tmp / "f"
    path.write_bytes(b"x")
    done = world.o41(
        "write",
        "--org",
        world.org,
        "--artifact",
        "a",
        str(path),
        "--json",
        token=world.team_b,
        place=("aws", "us-east-1"),
    )
    assert done.returncode == 1
    assert "namespace 'team-b' may not use organization" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_broken_bucket_sends_the_write_on_and_it_succeeds(world: World, s3: S3Store) -> None:
    proxy = BreakableEndpoint(s3.endpoint).start()
    try:
        flaky = world.location(
            "nebius-flaky",
            "nebius",
            "eu-north1",
            {"s3Compatible": {"endpoint": proxy.url, "signingRegion": "us-east-1"}},
            world.credentials["s3"],
        )
        world.ready(flaky)
        fine = world.write(b"before", world.team_a, ("nebius", "eu-north1"))
        assert (fine["location"], fine["rule"]) == (flaky, "region")

        proxy.broken = True  # Ready stays True: lookups pass, uploads fail
        moved = world.write(b"after", world.team_a, ("nebius", "eu-north1"))
        assert proxy.refused >= 1
        assert (moved["location"], moved["rule"]) == (world.east, "fallback")
        assert f"without location {flaky}" in moved["stderr"]
        _, got = world.read(moved["version"], world.team_a, ("aws", "us-east-1"))
        assert got == b"after"
    finally:
        proxy.stop()


def test_retired_location_takes_no_writes_but_serves_reads(world: World) -> None:
    old = world.write(b"kept", world.team_a, ("aws", "us-west-2"), artifact="retire")
    assert old["location"] == world.west
    world.kube.kubectl(
        "patch", "location", world.west, "--type=merge", "-p", '{"spec":{"retired":true}}'
    )

    def moved() -> dict[str, Any] | None:
        new = world.write(b"new", world.team_a, ("aws", "us-west-2"), artifact="retire")
        return new if new["location"] == world.east else None

    new = wait_for(moved, 30, "writes to leave the retired location")
    assert new["rule"] == "cloud"
    found, got = world.read(old["version"], world.team_a, ("aws", "us-west-2"), artifact="retire")
    assert (found["location"], got) == (world.west, b"kept")
    world.kube.kubectl(
        "patch", "location", world.west, "--type=merge", "-p", '{"spec":{"retired":false}}'
    )


def test_an_unfinished_location_gets_no_writes(world: World) -> None:
    bad = world.location(
        "azure-bad",
        "azure",
        "westeurope",
        {"azureBlob": {"accountUrl": world.azure.account_url}},
        world.credentials["azure-wrong"],
    )
    wait_for(
        lambda: (
            json.loads(world.kube.kubectl("get", "location", bad, "-o", "json"))
            .get("status", {})
            .get("unfinished")
        ),
        60,
        "the location to be unfinished",
    )
    written = world.write(b"x", world.team_a, ("azure", "westeurope"))
    assert (written["location"], written["rule"]) == (world.east, "fallback")


def test_an_organization_without_a_fallback_refuses_writes(world: World, kube: Kube) -> None:
    empty = f"empty-{uuid.uuid4().hex[:6]}"
    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": API,
                "kind": "Organization",
                "metadata": {"name": empty},
                "spec": {"namespaces": ["team-a"]},
            }
        ),
    )
    path = world.tmp / "g"
    path.write_bytes(b"x")

    def refused() -> str | None:
        done = world.o41(
            "write",
            "--org",
            empty,
            "--artifact",
            "a",
            str(path),
            token=world.team_a,
            place=("aws", "us-east-1"),
        )
        return done.stderr if "no fallback location yet" in done.stderr else None

    message = wait_for(refused, 30, "the service to know the organization")
    assert "add a Location" in message


def test_bad_input_gets_a_clear_4xx_never_a_500(world: World) -> None:
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    no_token = world.tmp / "no-token"
    mib = 1024 * 1024

    def begin(**fields: Any) -> tuple[int, dict[str, Any]]:
        body = {"organization": world.org, "artifact": "a", "place": place, **fields}
        return world.api("POST", "/v1/writes", body)

    cases = [
        (world.api("POST", "/v1/writes", raw=b"{not json"), 400, "invalid request"),
        (world.api("POST", "/v1/writes", {"organization": world.org}), 400, "artifact"),
        (begin(artifact="../x"), 400, "artifact"),
        (begin(size=-1), 400, "size"),
        (begin(size="5"), 400, "size: Input should be a valid integer"),  # strict types
        (begin(size=True), 400, "size: Input should be a valid integer"),
        (begin(size=5.0), 400, "size: Input should be a valid integer"),
        (begin(size=100 * mib, partSize="16777216"), 400, "partSize: Input should be"),
        (begin(size=100 * mib, crc32=["AAAAAA=="]), 400, "crc32 needs partSize"),
        (begin(partSize=16 * mib), 400, "partSize needs size"),
        (begin(size=100 * mib, partSize=1024), 400, "at least 5 MiB"),
        (begin(size=100 * mib, partSize=50 * mib, crc32=["AAAAAA=="]), 400, "are 2 parts"),
        (
            begin(size=100 * mib, partSize=50 * mib, crc32=["AAAAAA==", "nope"]),
            400,
            "crc32 of part 2",
        ),
        (world.api("POST", "/v1/writes", raw=b"x", content_type="text/plain"), 415, "JSON"),
        (world.api("POST", "/v1/writes", {}, token=no_token), 401, "Bearer"),
        (world.api("POST", "/v1/writes", raw=b"x" * (2 * mib)), 413, "Maximum request body size"),
        (world.api("POST", "/v1/writes/nope/commit", {}), 404, "begin again"),
        (
            world.api("GET", f"/v1/organizations/{world.org}/artifacts/a/versions/nope"),
            404,
            "no committed version",
        ),
        (
            world.api("GET", "/v1/organizations/nobody/artifacts/a/versions/v"),
            404,
            "does not exist",
        ),
        (world.api("GET", "/v1/nowhere"), 404, "Not Found"),
    ]
    for (status, body), want_status, want in cases:
        assert status == want_status, (status, body)
        assert "error" in body and want in body["error"], body


def test_commit_checks_the_bucket_really_holds_the_object(world: World) -> None:
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    status, began = world.api(
        "POST",
        "/v1/writes",
        {"organization": world.org, "artifact": "unsent", "size": 10, "place": place},
    )
    assert status == 201, began
    version = began["version"]
    status, answer = world.api("POST", f"/v1/writes/{version}/commit", {})
    assert status == 409
    assert "not in the bucket" in answer["error"]
    # and it is not readable
    done = world.o41(
        "read",
        "--org",
        world.org,
        "--artifact",
        "unsent",
        "--version",
        version,
        "--output",
        str(world.tmp / "nothing"),
        token=world.team_a,
    )
    assert done.returncode == 1 and "no committed version" in done.stderr


def test_a_part_damaged_on_the_way_is_never_committed(world: World) -> None:
    """The pod declared each part's CRC32 at begin; the bucket got other bytes for part 2.
    S3 (and versitygw) refuses such a part at once, since its checksum header is signed
    into the part's URL; a commit without it fails. (A store that took the part would be
    stopped by the composite CRC32 check at commit.)"""
    part_size = 5 * 1024 * 1024
    parts = [os.urandom(part_size), os.urandom(1000)]
    declared = [crc32_b64(zlib.crc32(p)) for p in parts]
    status, began = world.api(
        "POST",
        "/v1/writes",
        {
            "organization": world.org,
            "artifact": "damaged",
            "size": part_size + 1000,
            "partSize": part_size,
            "crc32": declared,
            "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
        },
    )
    assert status == 201, began
    urls = began["upload"]["multipart"]["parts"]
    sent = [parts[0], b"\0" + parts[1][1:]]  # one byte flipped on the way
    etags, refused = [], []
    for req, data in zip(urls, sent, strict=True):
        put = urllib.request.Request(req["url"], data=data, method="PUT", headers=req["headers"])
        try:
            with urllib.request.urlopen(put, timeout=30) as r:
                etags.append(r.headers["ETag"])
        except urllib.error.HTTPError as e:
            refused.append((e.code, b"<Code>BadDigest</Code>" in e.read()))
            etags.append("")  # the pod has no ETag for a part the store refused
    assert refused == [(400, True)]

    status, answer = world.api("POST", f"/v1/writes/{began['version']}/commit", {"etags": etags})

    assert status == 409, answer
    assert "upload every part" in answer["error"]
    status, _ = world.api(
        "GET", f"/v1/organizations/{world.org}/artifacts/damaged/versions/{began['version']}"
    )
    assert status == 404


async def commit_together(world: World, version: str, n: int) -> list[int]:
    """``n`` commits of one write at once, as retries racing each other; their statuses."""
    headers = {"Authorization": f"Bearer {world.team_a.read_text()}"}
    url = f"{world.service.url}/v1/writes/{version}/commit"
    async with aiohttp.ClientSession(headers=headers) as session:

        async def one() -> int:
            async with session.post(url, json={}) as r:
                return r.status

        return list(await asyncio.gather(*(one() for _ in range(n))))


def test_concurrent_commits_of_one_version_count_it_once(world: World) -> None:
    """Commits of one write racing each other all answer as before (200 for those that
    read the write before it was committed, 404 for the later ones), but only the commit
    that made the version counts it in the usage."""
    region = f"race-{uuid.uuid4().hex[:6]}"  # the usage records of this test alone
    place = {"cloud": "aws", "region": region, "source": "env"}
    data = b"raced"
    versions = 0
    for _ in range(5):
        status, began = world.api(
            "POST",
            "/v1/writes",
            {"organization": world.org, "artifact": "raced", "size": len(data), "place": place},
        )
        assert status == 201, began
        single = began["upload"]["single"]
        put = urllib.request.Request(
            single["url"], data=data, method="PUT", headers=single["headers"]
        )
        urllib.request.urlopen(put, timeout=30).close()
        statuses = asyncio.run(commit_together(world, began["version"], 8))
        assert set(statuses) <= {200, 404} and 200 in statuses, statuses
        versions += 1
        if statuses.count(200) >= 2:
            break  # two commits got past the read of the pending write: the case at stake
    else:
        pytest.fail("in 5 tries, no two of 8 concurrent commits raced")
    writes = [
        r
        for r in world.usage(world.team_a)
        if r["kind"] == "write" and r["dims"]["region"] == region
    ]
    assert sum(r["counts"]["versions"] for r in writes) == versions
    assert sum(r["counts"]["bytes"] for r in writes) == versions * len(data)


def test_a_service_restart_loses_no_committed_version(world: World) -> None:
    data = os.urandom(10_000)
    written = world.write(data, world.team_a, ("aws", "us-east-1"), artifact="durable")
    world.service.stop()
    world.service.start()
    _, got = world.read(written["version"], world.team_a, artifact="durable")
    assert got == data


def test_a_location_shows_how_many_versions_it_holds(world: World, s3: S3Store) -> None:
    counted = world.location(
        "aws-counted",
        "aws",
        "ap-south-1",
        {"s3": {"endpoint": s3.endpoint}},
        world.credentials["s3"],
    )
    world.ready(counted)
    for i in range(3):
        written = world.write(b"%d" % i, world.team_a, ("aws", "ap-south-1"), artifact="counted")
        assert written["location"] == counted

    def shown() -> str | None:
        out = world.kube.kubectl("get", "location", counted, "-o", "wide")
        header, row = out.splitlines()[:2]
        start = header.index("VERSIONS")  # cells may be empty: cut at the header's offset
        cell = row[start:].split()[0]
        return cell if cell == "3" else None

    assert wait_for(shown, 30, "the VERSIONS column to show 3") == "3"


def test_pods_share_collections_through_the_service_scoped_to_their_namespace(
    world: World,
) -> None:
    """`from o41 import sky` in pods of one job, against the real service with real
    ServiceAccount tokens: they share a counter; another namespace sees nothing of it."""
    code = (
        "import json, sys\n"
        "from o41 import sky\n"
        "c = sky.counter('steps')\n"
        "for _ in range(int(sys.argv[1])): c.add(1)\n"
        "r = sky.registry('checkpoints')\n"
        "r.register(sys.argv[2], {'step': 7})\n"
        "print(json.dumps({'count': c.get(), 'names': sorted(r.list())}))\n"
    )

    def pod(token: Path, adds: int, name: str) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("O41_")}
        env.update(
            {
                "O41_ARTIFACTS_ENDPOINT": world.service.url,
                "O41_ARTIFACTS_TOKEN_FILE": str(token),
                "O41_COMPUTE": "train-42",
            }
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(adds), name],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    first = pod(world.team_a, 5, "a")
    second = pod(world.team_a, 3, "b")
    assert first["count"] == 5
    assert second == {"count": 8, "names": ["a", "b"]}
    other = pod(world.team_b, 1, "z")  # same compute and names, another namespace
    assert other == {"count": 1, "names": ["z"]}


def test_a_vm_writes_with_a_service_token_until_it_is_revoked(world: World) -> None:
    """Issue 31, point 3: a platform admin mints a token (kubectl o41 token create), a
    SkyPilot VM (no cluster, its place from SKYPILOT_CLUSTER_INFO) writes and reads with
    it as a secret env var, and once revoked it is refused."""
    admin = ("--namespace", NAMESPACE, "--kubeconfig", str(world.kube.kubeconfig))

    def token(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "o41.cli", "token", *args, *admin],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    made = token("create", "--org", world.org, "--subject", "sky-llama", "--ttl", "2h")
    assert made.returncode == 0, made.stderr
    token_id = made.stderr.split()[1]
    info = {"cluster_name": "sky-llama", "cloud": "GCP", "region": "us-central1", "zone": None}
    vm = {"O41_ARTIFACTS_TOKEN": made.stdout.strip(), "SKYPILOT_CLUSTER_INFO": json.dumps(info)}
    path = world.tmp / "vm-model"
    path.write_bytes(b"from a VM")
    args = ("--org", world.org, "--artifact", "vm-model")
    done = world.o41("write", *args, str(path), "--json", token=None, env=vm)
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    assert (written["location"], written["rule"]) == (world.central, "region")
    back = world.tmp / "vm-back"
    read = ("--version", written["version"], "--output", str(back))
    done = world.o41("read", *args, *read, "--json", token=None, env=vm)
    assert done.returncode == 0, done.stderr
    assert back.read_bytes() == b"from a VM"

    listed = token("list")
    assert token_id in listed.stdout and "sky-llama" in listed.stdout, listed.stderr
    revoked = token("revoke", token_id)
    assert revoked.returncode == 0, revoked.stderr

    def refused_now() -> subprocess.CompletedProcess[str] | None:
        done = world.o41("versions", *args, token=None, env=vm)
        return done if done.returncode else None

    refused = wait_for(refused_now, 30, "the service to refuse the revoked token")
    assert "was revoked" in refused.stderr and "Traceback" not in refused.stderr
    assert token("revoke", token_id).returncode == 1  # gone already: said, not a traceback
