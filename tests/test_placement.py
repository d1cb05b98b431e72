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
from o41.testbed.kube import Kube
from o41.testbed.process import free_port
from o41.testbed.product import PlacementProcess as PlacementService
from o41.testbed.stores import AzureStore, GcsStore, S3Store

from fixtures.placement import BreakableEndpoint
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

API = "artifacts.o41.io/v1alpha1"


class World:
    """One organization with locations in several clouds and regions, and pod tokens."""

    east: str
    west: str
    central: str
    team_a: Path
    team_b: Path

    def __init__(
        self,
        kube: Kube,
        credentials: dict[str, str],
        s3: S3Store,
        gcs: GcsStore,
        azure: AzureStore,
        service: PlacementService,
        tmp: Path,
    ) -> None:
        self.kube, self.service, self.tmp = kube, service, tmp
        self.org = f"ml-{uuid.uuid4().hex[:6]}"
        self.s3, self.gcs, self.azure, self.credentials = s3, gcs, azure, credentials
        self.closed = f"http://127.0.0.1:{free_port()}"  # metadata URLs: nothing listens

    def apply(self, obj: dict[str, Any]) -> None:
        self.kube.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def location(
        self, name: str, cloud: str, region: str, backend: dict[str, Any], secret: str
    ) -> str:
        name = f"{self.org}-{name}"
        self.apply(
            {
                "apiVersion": API,
                "kind": "Location",
                "metadata": {"name": name},
                "spec": {
                    "organization": self.org,
                    "cloud": cloud,
                    "region": region,
                    "backend": backend,
                    "credentials": {"secretName": secret},
                },
            }
        )
        return name

    def organization(self, namespaces: list[str], **spec: Any) -> None:
        self.apply(
            {
                "apiVersion": API,
                "kind": "Organization",
                "metadata": {"name": self.org},
                "spec": {"namespaces": namespaces, **spec},
            }
        )

    def pod_environ(self, cloud: str, region: str, strip: tuple[str, ...]) -> dict[str, str]:
        """This process's environment without the variables starting with ``strip``, as a
        pod's of ``cloud``/``region`` set by env (no DMI, no metadata address answers)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(strip)}
        env.update(
            {
                "O41_ARTIFACTS_DMI_DIR": str(self.tmp / "no-dmi"),
                "O41_ARTIFACTS_AWS_METADATA_URL": self.closed,
                "O41_ARTIFACTS_GCP_METADATA_URL": self.closed,
                "O41_ARTIFACTS_AZURE_METADATA_URL": self.closed,
                "O41_ARTIFACTS_CLOUD": cloud,
                "O41_ARTIFACTS_REGION": region,
            }
        )
        return env

    def ready(self, *names: str) -> None:
        for name in names:
            self.kube.kubectl("wait", "--for=condition=Ready", f"location/{name}", "--timeout=60s")

    def token(self, namespace: str) -> Path:
        token = self.kube.token(namespace)
        path = self.tmp / f"token-{namespace}"
        path.write_text(token)
        return path

    def o41(
        self, *args: str, token: Path, place: tuple[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("O41_ARTIFACTS_", "SKYPILOT_"))
        }
        env.update(
            {
                "O41_ARTIFACTS_DMI_DIR": str(self.tmp / "no-dmi"),
                "O41_ARTIFACTS_AWS_METADATA_URL": self.closed,
                "O41_ARTIFACTS_GCP_METADATA_URL": self.closed,
                "O41_ARTIFACTS_AZURE_METADATA_URL": self.closed,
            }
        )
        if place:
            env["O41_ARTIFACTS_CLOUD"], env["O41_ARTIFACTS_REGION"] = place
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "o41.cli",
                *args,
                "--endpoint",
                self.service.url,
                "--token-file",
                str(token),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def write(
        self,
        data: bytes,
        token: Path,
        place: tuple[str, str] | None = None,
        artifact: str = "model",
    ) -> dict[str, Any]:
        path = self.tmp / f"upload-{uuid.uuid4().hex[:6]}"
        path.write_bytes(data)
        done = self.o41(
            "write",
            "--org",
            self.org,
            "--artifact",
            artifact,
            str(path),
            "--json",
            token=token,
            place=place,
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        result["stderr"] = done.stderr
        return result

    def read(
        self,
        version: str,
        token: Path,
        place: tuple[str, str] | None = None,
        artifact: str = "model",
    ) -> tuple[dict[str, Any], bytes]:
        out = self.tmp / f"download-{uuid.uuid4().hex[:6]}"
        done = self.o41(
            "read",
            "--org",
            self.org,
            "--artifact",
            artifact,
            "--version",
            version,
            "--output",
            str(out),
            "--json",
            token=token,
            place=place,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), out.read_bytes()

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: Path | None = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        """One call to the service as a pod makes it: (status, JSON answer), errors too.
        ``body`` is sent as JSON, ``raw`` as it is; ``token`` defaults to team-a's."""
        headers = {"Content-Type": content_type}
        token = token or self.team_a
        if token.exists():
            headers["Authorization"] = f"Bearer {token.read_text()}"
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.service.url}{path}", data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def usage(self, token: Path) -> list[dict[str, Any]]:
        req = urllib.request.Request(
            f"{self.service.url}/v1/usage?organization={self.org}&records=true&limit=5000",
            headers={"Authorization": f"Bearer {token.read_text()}"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            records: list[dict[str, Any]] = json.load(r)["records"]
            return records


@pytest.fixture(scope="module")
def world(
    kube: Kube,
    credentials: dict[str, str],
    s3: S3Store,
    gcs: GcsStore,
    azure: AzureStore,
    placement: PlacementService,
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    w = World(kube, credentials, s3, gcs, azure, placement, tmp_path_factory.mktemp("world"))
    w.organization(["team-a"])
    w.east = w.location(
        "aws-east", "aws", "us-east-1", {"s3": {"endpoint": s3.endpoint}}, credentials["s3"]
    )
    w.west = w.location(
        "aws-west", "aws", "us-west-2", {"s3": {"endpoint": s3.endpoint}}, credentials["s3"]
    )
    w.central = w.location(
        "gcp-central",
        "gcp",
        "us-central1",
        {"gcs": {"endpoint": gcs.endpoint, "project": gcs.project}},
        credentials["gcs"],
    )
    w.ready(w.east, w.west, w.central)
    w.team_a = w.token("team-a")
    w.team_b = w.token("team-b")
    wait_for(
        lambda: (
            json.loads(w.kube.kubectl("get", "org", w.org, "-o", "json"))
            .get("status", {})
            .get("takesWrites")
        ),
        60,
        "the organization to take writes",
    )
    return w


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
