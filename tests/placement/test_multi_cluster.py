"""Two clusters, one service (issue 31, point 5 without the real node): cluster A is the
session's control plane, with the operator and the placement service (the hub); cluster B
is a second control plane (its own etcd, API server, issuer and signing key) whose
TokenRequest mints the pods' tokens, audience ``o41``, bound to a pod object of B.

The operator of A fetches B's keys by OIDC discovery from B's API server (its CA as the
TrustDomain's caBundle), the service verifies B's tokens offline with them, and the
``o41`` CLI runs as the pods of both clusters run it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.kube import ControlPlane

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

DOMAIN = "cluster-b"


@pytest.fixture(scope="module")
def hub(world: World, cluster_b: ControlPlane) -> World:
    """A's organization admits team-a of B too; A trusts B's issuer."""
    world.trust(cluster_b, DOMAIN)
    world.organization(["team-a"], members=[{"trustDomain": DOMAIN, "namespaces": ["team-a"]}])
    return world


def pod_token(plane: ControlPlane, tmp: Path, namespace: str, audience: str | None = "o41") -> Path:
    path = tmp / f"b-{namespace}-{audience}"
    path.write_text(plane.pod_token(namespace, audience))
    return path


def test_a_pod_of_b_writes_in_gcp_and_a_pod_of_a_reads_it_cross_cloud(
    hub: World, cluster_b: ControlPlane
) -> None:
    b_token = pod_token(cluster_b, hub.tmp, "team-a")
    written = hub.write(b"written in cluster B", b_token, ("gcp", "us-central1"), "from-b")
    assert (written["location"], written["rule"]) == (hub.central, "region")

    read, data = hub.read(written["version"], hub.team_a, ("aws", "us-east-1"), "from-b")
    assert (read["location"], read["locality"], data) == (
        hub.central,
        "cross-cloud",
        b"written in cluster B",
    )
    records = hub.usage(hub.team_a)
    assert {("write", "gcp"), ("read", "aws")} <= {
        (r["kind"], r["dims"].get("cloud")) for r in records
    }


def test_team_a_of_a_and_team_a_of_b_have_disjoint_collections(
    hub: World, cluster_b: ControlPlane
) -> None:
    b_token = pod_token(cluster_b, hub.tmp, "team-a")
    counter = "/v1/collections/job/counter/steps"
    status, _ = hub.api("POST", f"{counter}/add", {"n": 5}, token=hub.team_a)
    assert status == 200
    status, answer = hub.api("POST", f"{counter}/get", {}, token=b_token)
    assert (status, answer.get("value")) == (200, 0), answer
    status, answer = hub.api("POST", f"{counter}/add", {"n": 2}, token=b_token)
    assert status == 200, answer
    status, answer = hub.api("POST", f"{counter}/get", {}, token=hub.team_a)
    assert (status, answer.get("value")) == (200, 5), answer


def test_tokens_of_b_the_hub_must_refuse(hub: World, cluster_b: ControlPlane) -> None:
    listing = f"/v1/organizations/{hub.org}/artifacts"
    # the API server's own audience (the default token): a credential to B, never taken
    status, answer = hub.api("GET", listing, token=pod_token(cluster_b, hub.tmp, "team-a", None))
    assert (status, answer["reason"], answer["trustDomain"]) == (401, "ApiServerAudience", DOMAIN)
    status, answer = hub.api("GET", listing, token=pod_token(cluster_b, hub.tmp, "team-a", "vault"))
    assert (status, answer["reason"]) == (401, "WrongAudience"), answer
    # a namespace of B that the organization does not list
    status, answer = hub.api("GET", listing, token=pod_token(cluster_b, hub.tmp, "research"))
    assert status == 403
    assert f"of trust domain '{DOMAIN}'" in answer["error"] and "spec.members" in answer["error"]


def o41(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "o41.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cluster_add_writes_the_trust_domain_from_the_workload_kubeconfig(
    hub: World, cluster_b: ControlPlane
) -> None:
    source = ("--from-kubeconfig", str(cluster_b.kubeconfig))
    planned = o41("cluster", "add", DOMAIN, *source, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    # B's issuer is its API server, which serves discovery to anyone: discovery, its CA
    assert yaml.safe_load(planned.stdout)["spec"] == {
        "issuer": cluster_b.service_account_issuer,
        "caBundle": cluster_b.ca_cert.read_text(),
    }
    applied = o41("cluster", "add", DOMAIN, *source, "--kubeconfig", str(hub.kube.kubeconfig))
    assert applied.stdout.strip() == f"trustdomain/{DOMAIN} updated", applied.stderr
    assert "keys by OIDC discovery" in applied.stderr
    hub.kube.kubectl("wait", "--for=condition=Ready", f"trustdomain/{DOMAIN}", "--timeout=60s")

    cluster_b.deny_public_issuer_discovery()
    try:  # discovery closed to anonymous callers: the keys inline, and how to open it
        planned = o41("cluster", "add", DOMAIN, *source, "--dry-run")
    finally:
        cluster_b.allow_public_issuer_discovery()
    keys = yaml.safe_load(planned.stdout)["spec"]["keys"]["jwks"]
    assert json.loads(keys) == json.loads(cluster_b.kubectl("get", "--raw", "/openid/v1/jwks"))
    assert "keys inline" in planned.stderr and "clusterrolebinding" in planned.stderr

    again = o41("cluster", "add", "again", *source, "--kubeconfig", str(hub.kube.kubeconfig))
    assert again.returncode == 1
    assert "the hub refused TrustDomain again" in again.stderr and DOMAIN in again.stderr
    assert "Traceback" not in again.stderr
