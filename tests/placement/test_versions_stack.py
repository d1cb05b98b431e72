"""Versions, latest, tags and metadata on the whole stack: the real service process
(TokenReview against the real API server, state in a 3-member etcd), Locations on the S3
stand-in (versitygw, which checks signatures), the ``o41`` command and the SDK."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from o41.artifacts import Client, Conflict, Forbidden
from o41.core.places import Place
from o41.core.versions import encode_cursor

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]


def sdk(w: World, token: Path) -> Client:
    return Client(w.service.url, str(token), place=Place("aws", "us-east-1", "env"), timeout=60)


def test_versions_latest_and_tags_through_the_command(world: World) -> None:
    w = world
    art = ["--org", w.org, "--artifact", "run"]
    versions = []
    for step in range(3):
        f = w.tmp / f"run-{step}"
        f.write_bytes(f"weights {step}".encode())
        done = w.o41(
            "write",
            *art,
            str(f),
            "--metadata",
            f"step={step}",
            "--tag",
            "newest",
            "--json",
            token=w.team_a,
            place=("aws", "us-east-1"),
        )
        assert done.returncode == 0, done.stderr
        versions.append(json.loads(done.stdout)["version"])

    done = w.o41("versions", *art, "--limit", "2", "--json", token=w.team_a)
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)
    assert [v["version"] for v in page["versions"]] == versions[:0:-1]
    assert [v["metadata"]["step"] for v in page["versions"]] == [2, 1]
    assert page["versions"][0]["location"] == w.east
    assert page["versions"][0]["writer"] == {"cloud": "aws", "region": "us-east-1", "source": "env"}

    # a cursor of this listing, used for another artifact or organization: refused
    base = f"/v1/organizations/{w.org}/artifacts"
    status, body = w.api("GET", f"{base}/other/versions?cursor={page['next']}")
    assert status == 400 and "another listing" in body["error"]
    forged = encode_cursor("versions/someone-else/run", "0" * 16 + "-" + "0" * 12 + "-" + "0" * 16)
    status, body = w.api("GET", f"{base}/run/versions?cursor={forged}")
    assert status == 400 and "another listing" in body["error"]

    found, got = w.read("latest", w.team_a, ("aws", "us-east-1"), artifact="run")
    assert (found["version"], got) == (versions[2], b"weights 2")
    found, got = w.read("newest", w.team_a, ("aws", "us-east-1"), artifact="run")
    assert (found["version"], found["tag"], got) == (versions[2], "newest", b"weights 2")

    done = w.o41("tag", *art, "best", versions[0], "--expect-absent", token=w.team_a)
    assert done.returncode == 0, done.stderr
    done = w.o41(
        "tag", *art, "best", versions[1], "--expect", versions[2], "--json", token=w.team_a
    )
    refused = json.loads(done.stderr)
    assert (done.returncode, refused["status"], refused["current"]) == (1, 409, versions[0])

    # another namespace, not in the organization's spec.namespaces, sees none of it
    for path in (f"{base}", f"{base}/run/versions", f"{base}/run/tags", f"{base}/run/tags/best"):
        status, body = w.api("GET", path, token=w.team_b)
        assert status == 403 and "may not use organization" in body["error"], (path, body)
    status, body = w.api("PUT", f"{base}/run/tags/best", {"version": versions[2]}, token=w.team_b)
    assert status == 403
    with pytest.raises(Forbidden):
        sdk(w, w.team_b).tag(w.org, "run", "best", versions[2])
    status, body = w.api("GET", f"{base}/run/tags/best")
    assert (status, body["version"]) == (200, versions[0])


def test_the_sdk_streams_from_the_bucket_and_tags_race_on_etcd(world: World) -> None:
    w = world
    client = sdk(w, w.team_a)
    data = os.urandom(5 * 1024 * 1024 + 3)
    first = client.write(w.org, "sdk", data, metadata={"step": 1, "metrics": {"loss": 0.5}})
    second = client.write(w.org, "sdk", data[::-1], metadata={"step": 2})
    latest = client.latest(w.org, "sdk")
    assert latest is not None and (latest.version, latest.metadata) == (second.version, {"step": 2})

    with client.open(w.org, "sdk", first.version) as f:  # ranged GETs on versitygw
        assert f.read(4) == data[:4]
        f.seek(4 * 1024 * 1024)
        assert f.read(10) == data[4 * 1024 * 1024 : 4 * 1024 * 1024 + 10]
    assert client.read_bytes(w.org, "sdk") == data[::-1]
    assert [v.version for v in client.versions(w.org, "sdk", page_size=1)] == [
        second.version,
        first.version,
    ]

    client.tag(w.org, "sdk", "prod", first.version, expected=None)
    client.tag(w.org, "sdk", "prod", second.version, expected=first.version)
    with pytest.raises(Conflict) as lost:
        client.tag(w.org, "sdk", "prod", first.version, expected=first.version)
    assert lost.value.current == second.version
    assert client.resolve(w.org, "sdk", "prod").version == second.version
    assert client.delete_tag(w.org, "sdk", "prod", expected=second.version) == second.version
    assert [t.tag for t in client.tags(w.org, "sdk")] == []
