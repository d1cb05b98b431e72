"""Retention on the whole stack: the rule set on the Organization with kubectl (the CRD's
schema admits it, refuses a bad one), read by the placement service process from its
watch, applied to versions written with the ``o41`` command into versitygw."""

from __future__ import annotations

import json

import pytest

from fixtures.world import World
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]


def listed(w: World, artifact: str) -> list[str]:
    status, page = w.api("GET", f"/v1/organizations/{w.org}/artifacts/{artifact}/versions")
    assert status == 200, page
    return [v["version"] for v in page["versions"]]


def test_a_rule_on_the_organization_deletes_old_versions_but_not_tagged_ones(
    world: World,
) -> None:
    w = world
    with pytest.raises(RuntimeError, match="keepVersions"):  # the CRD's schema refuses it
        w.organization(["team-a"], retention=[{"artifacts": "ckpt-*", "keepVersions": 0}])
    w.organization(["team-a"], retention=[{"artifacts": "ckpt-*", "keepVersions": 2}])

    def rule_in_force() -> bool:  # the service's watch of Organizations brought it
        status, page = w.api("GET", f"/v1/organizations/{w.org}/artifacts/ckpt-run/versions")
        return status == 200 and page["keepVersions"] == 2

    wait_for(rule_in_force, 30, "the service to know the rule")
    status, page = w.api("GET", f"/v1/organizations/{w.org}/artifacts/model-x/versions")
    assert (status, page["keepVersions"]) == (200, None), page  # no rule covers it

    first = w.write(b"one", w.team_a, ("aws", "us-east-1"), artifact="ckpt-run")
    status, tagged = w.api(
        "PUT",
        f"/v1/organizations/{w.org}/artifacts/ckpt-run/tags/best",
        {"version": first["version"]},
    )
    assert status == 200, tagged
    written = [first] + [
        w.write(f"v{n}".encode(), w.team_a, ("aws", "us-east-1"), artifact="ckpt-run")
        for n in range(3)
    ]
    versions = [x["version"] for x in written]
    other = [w.write(b"m", w.team_a, ("aws", "us-east-1"), artifact="model-x") for _ in range(3)]

    expected = [versions[3], versions[2], versions[0]]  # newest 2, and the tagged first
    wait_for(lambda: listed(w, "ckpt-run") == expected, 60, "retention to let v0 go")
    status, gone = w.api(
        "GET", f"/v1/organizations/{w.org}/artifacts/ckpt-run/versions/{versions[1]}"
    )
    assert status == 404, gone
    _, data = w.read("best", w.team_a, ("aws", "us-east-1"), artifact="ckpt-run")
    assert data == b"one"
    assert len(listed(w, "model-x")) == len(other)  # no rule matches it
    counted = wait_for(
        lambda: [r for r in w.usage(w.team_a) if r["kind"] == "retention"],
        30,
        "the deletion in the usage records",
    )
    assert sum(r["counts"]["versions"] for r in counted) == 1
    org = json.loads(w.kube.kubectl("get", "organization", w.org, "-o", "json"))
    assert org["spec"]["retention"] == [{"artifacts": "ckpt-*", "keepVersions": 2}]
