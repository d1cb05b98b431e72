"""An attacker with an ordinary ServiceAccount token, kubectl and curl.

Each test is one thing a tenant tries against the running service and operator: another
namespace's data, forged tokens, odd names, replays, racing admissions. What it must see:
a clear 4xx that says why, never another tenant's data, never a 5xx.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from test_fuzz import _forged_token
from testbed.kube import Kube
from testbed.product import PlacementProcess as PlacementService
from testbed.stores import AzureStore, GcsStore, S3Store

from fixtures.world import API, World
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


class Tenants:
    """Two organizations, each with its own namespace and Location."""

    def __init__(self, a: World, b: World) -> None:
        self.a, self.b = a, b


@pytest.fixture(scope="module")
def tenants(
    kube: Kube,
    credentials: dict[str, str],
    s3: S3Store,
    gcs: GcsStore,
    azure: AzureStore,
    placement: PlacementService,
    tmp_path_factory: pytest.TempPathFactory,
) -> Tenants:
    worlds = []
    for ns in ("attack-a", "attack-b"):
        w = World(kube, credentials, s3, gcs, azure, placement, tmp_path_factory.mktemp(ns))
        w.organization([ns])
        w.east = w.location(
            "east", "aws", "us-east-1", {"s3": {"endpoint": s3.endpoint}}, credentials["s3"]
        )
        w.ready(w.east)
        w.team_a = w.token(ns)
        worlds.append(w)
    for w in worlds:
        org = w.org

        def takes_writes(org: str = org) -> bool:
            status = json.loads(kube.kubectl("get", "org", org, "-o", "json")).get("status", {})
            return bool(status.get("takesWrites"))

        wait_for(takes_writes, 60, "the organization to take writes")
    return Tenants(*worlds)


def _begin(w: World, token: Path, org: str) -> tuple[int, dict[str, Any]]:
    body = {"organization": org, "artifact": "secret", "place": PLACE, "size": 5}
    return w.api("POST", "/v1/writes", body, token=token)


def test_a_tenant_cannot_use_read_or_commit_another_tenants_writes(tenants: Tenants) -> None:
    a, b = tenants.a, tenants.b
    written = a.write(b"of a's", a.team_a, ("aws", "us-east-1"), artifact="secret")

    status, body = _begin(a, b.team_a, a.org)
    assert status == 403 and "may not use organization" in body["error"]

    path = f"/v1/organizations/{a.org}/artifacts/secret/versions/{written['version']}"
    status, body = a.api("GET", path, token=b.team_a)
    assert status == 403 and "may not use organization" in body["error"]
    assert "download" not in body

    # b's own organization does not hold a's version under its name either
    status, body = a.api(
        "GET",
        f"/v1/organizations/{b.org}/artifacts/secret/versions/{written['version']}",
        token=b.team_a,
    )
    assert status == 404 and "no committed version" in body["error"]

    status, body = a.api("GET", f"/v1/usage?organization={a.org}", token=b.team_a)
    assert status == 403

    # a write a began cannot be committed by b, and a's commit still works afterwards
    status, begun = _begin(a, a.team_a, a.org)
    assert status == 201, begun
    status, body = a.api("POST", f"/v1/writes/{begun['version']}/commit", {}, token=b.team_a)
    assert status == 403 and "another namespace" in body["error"]
    status, body = a.api("POST", f"/v1/writes/{begun['version']}/commit", {}, token=a.team_a)
    assert status == 409 and "not in the bucket" in body["error"]  # a's to finish, still


def test_forged_and_foreign_tokens_are_refused_on_every_route(tenants: Tenants) -> None:
    a = tenants.a
    forged = a.tmp / "forged"
    forged.write_text(_forged_token())
    garbage = a.tmp / "garbage"
    garbage.write_text("x" * 8000)
    routes = [
        ("POST", "/v1/writes", {"organization": a.org, "artifact": "x", "place": PLACE}),
        ("POST", "/v1/writes/0193a1b2c3d4-9f8e7d6c5b4a3f2e/commit", {}),
        ("GET", f"/v1/organizations/{a.org}/artifacts/x/versions/v", None),
        ("GET", f"/v1/usage?organization={a.org}", None),
        ("POST", "/v1/collections/job/dict/d/get", {"key": "s:k"}),
    ]
    for token in (forged, garbage):
        for method, path, body in routes:
            status, answer = a.api(method, path, body, token=token)
            assert status == 401, (token.name, method, path, status, answer)
            assert "not accepted" in answer["error"]


@pytest.mark.parametrize(
    "artifact",
    ["..", ".hidden", "a%2Fb", "a%00b", "%C3%A9t%C3%A9", "%ED%A0%80", "x" * 300, "%25%25"],
)
def test_odd_artifact_names_are_refused_or_not_found_never_a_5xx(
    tenants: Tenants, artifact: str
) -> None:
    a = tenants.a
    for version in ("v", "..", "%2F..%2F", "%ED%A0%80", "0" * 500):
        status, body = a.api(
            "GET", f"/v1/organizations/{a.org}/artifacts/{artifact}/versions/{version}"
        )
        assert status in (400, 404), (artifact, version, status, body)
        assert body["error"]
    decoded = urllib.parse.unquote(artifact, errors="surrogateescape")
    status, body = a.api(
        "POST",
        "/v1/writes",
        {"organization": a.org, "artifact": decoded, "place": PLACE},
    )
    assert status == 400, (artifact, status, body)
    # a name that is no valid text is refused as JSON, every other by its field
    surrogate = any("\ud800" <= c <= "\udfff" for c in decoded)
    assert ("JSON" if surrogate else "artifact") in body["error"], body


@pytest.mark.parametrize("version", ["%ED%A0%80", "..%2F..%2Fversions", "x" * 2000, "%00"])
def test_odd_version_ids_on_commit_are_refused_never_a_5xx(tenants: Tenants, version: str) -> None:
    status, body = tenants.a.api("POST", f"/v1/writes/{version}/commit", {})
    assert status in (400, 404), (version, status, body)
    assert body["error"]


def test_racing_locations_of_a_new_organization_end_with_one_fallback(
    kube: Kube, credentials: dict[str, str], s3: S3Store
) -> None:
    """Eight Locations applied at once to a new organization: exactly one is its fallback,
    exactly one is the cloud's default, whatever order the admissions ran in."""
    org = f"race-{uuid.uuid4().hex[:6]}"
    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": API, "kind": "Organization", "metadata": {"name": org}, "spec": {}}
        ),
    )

    def location(i: int) -> str:
        name = f"{org}-l{i}"
        obj = {
            "apiVersion": API,
            "kind": "Location",
            "metadata": {"name": name},
            "spec": {
                "organization": org,
                "cloud": "aws",
                "region": f"us-east-{i % 2 + 1}",
                "backend": {"s3": {"endpoint": s3.endpoint}},
                "credentials": {"secretName": credentials["s3"]},
            },
        }
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
        return name

    with ThreadPoolExecutor(8) as pool:
        names = set(pool.map(location, range(8)))
    for name in names:
        kube.kubectl("wait", "--for=condition=Ready", f"location/{name}", "--timeout=120s")

    def settled() -> dict[str, Any] | None:
        status = json.loads(kube.kubectl("get", "org", org, "-o", "json")).get("status", {})
        return status if status.get("locations") == 8 and status.get("takesWrites") else None

    status = wait_for(settled, 60, "the organization to count its eight locations")
    assert status["fallback"] in names
    assert set(status["cloudDefaults"]) == {"aws"} and status["cloudDefaults"]["aws"] in names
    roles = [
        set(
            (
                json.loads(kube.kubectl("get", "location", n, "-o", "json"))["status"].get("role")
                or ""
            ).split(",")
        )
        for n in names
    ]
    assert sum("fallback" in r for r in roles) == 1, roles
    assert sum("default" in r for r in roles) == 1, roles
