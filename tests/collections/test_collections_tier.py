"""A workload cluster's collections tier, end to end as processes (issue 40, points 1, 2
and 5 without the real node).

Cluster A is the session's control plane with the hub (``world``: the operator and the
placement service). Cluster B is a second control plane (its own API server, issuer and
signing key) whose TokenRequest mints the pods' tokens, audience ``o41``; its collections
tier runs as ``python -m o41.webhook --serve collections --kubeconfig <B's> --audience
o41`` on a 3-member etcd of its own. B's pods reach the hub through a loopback relay that
adds a fixed delay each way (the WAN). A pod of B runs ``sky.*`` and ``o41 write`` as a pod
does, with nothing but its environment saying where each goes.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from o41.client.collections import Client
from o41.client.connection import Connection
from test_chart_remote_monitoring import rule_groups
from test_metrics import NAME, scrape
from testbed.etcd import EtcdCluster
from testbed.kube import ControlPlane
from testbed.product import PlacementProcess, TierProcess
from testbed.relay import Relay

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

DOMAIN = "tier-b"  # the hub's TrustDomain for cluster B
DELAY = 0.02  # seconds each way between B and the hub
COLLECTION_ROOTS = (b"/o41/collections/", b"/o41/operations/", b"/o41/owners/")


@pytest.fixture(scope="module")
def tier_etcd(etcd_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(etcd_binary, tmp_path_factory.mktemp("tier-etcd"), size=3).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def tier(
    cluster_b: ControlPlane, tier_etcd: EtcdCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TierProcess]:
    process = TierProcess(
        cluster_b.kubeconfig, tier_etcd.endpoints, tmp_path_factory.mktemp("tier")
    ).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def hub(world: World, cluster_b: ControlPlane) -> World:
    """A trusts B's issuer; A's organization admits ``ml`` of A and ``ml`` of B."""
    world.trust(cluster_b, DOMAIN)
    world.organization(["team-a", "ml"], members=[{"trustDomain": DOMAIN, "namespaces": ["ml"]}])
    return world


@pytest.fixture(scope="module")
def relay(hub: World) -> Iterator[Relay]:
    with Relay(hub.service.url, delay=DELAY) as r:
        yield r


def b_token(
    plane: ControlPlane, tmp: Path, namespace: str = "ml", audience: str | None = "o41"
) -> Path:
    path = tmp / f"b-{namespace}-{audience}-{uuid.uuid4().hex[:6]}"
    path.write_text(plane.pod_token(namespace, audience))
    return path


def call(
    url: str, path: str, body: Any = None, *, token: Path | None = None, method: str = "POST"
) -> tuple[int, dict[str, Any]]:
    """One call as a pod makes it: (status, JSON answer), errors too."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token.read_text().strip()}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def counter(url: str, token: Path, compute: str, name: str) -> int:
    status, answer = call(url, f"/v1/collections/{compute}/counter/{name}/get", {}, token=token)
    assert status == 200, answer
    return int(answer["value"])


def pod_env(hub: World, **more: str) -> dict[str, str]:
    """A pod of B's environment: its place by env, nothing of this machine's O41_*."""
    env = hub.pod_environ("gcp", "us-central1", strip=("O41_", "SKYPILOT_"))
    for kept in ("O41_ARTIFACTS_CACHE", "O41_ARTIFACTS_PROGRESS", "O41_ARTIFACTS_RETRY_DEADLINE"):
        env[kept] = os.environ[kept]
    env.update(more)
    return env


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


POD = """
import json
from o41 import sky

steps = sky.counter("steps")
steps.add(3)
seen = sky.dict("seen")
seen["epoch"] = 7
with sky.lock("checkpoint", ttl=10) as held:
    token = held.token
print(json.dumps({"steps": steps.get(), "epoch": seen["epoch"], "fencing": token}))
"""


def test_a_pod_of_b_uses_its_tier_for_collections_and_the_hub_for_artifacts(
    hub: World, cluster_b: ControlPlane, tier: TierProcess, relay: Relay
) -> None:
    token = b_token(cluster_b, hub.tmp)
    compute = f"train-{uuid.uuid4().hex[:6]}"
    env = pod_env(
        hub,
        O41_ARTIFACTS_ENDPOINT=relay.url,  # the hub, far away
        O41_COLLECTIONS_ENDPOINT=tier.url,  # this cluster's tier
        O41_ARTIFACTS_TOKEN_FILE=str(token),  # one token, audience o41, serves both
        O41_COMPUTE=compute,
    )
    done = run([sys.executable, "-c", POD], env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["steps"], answer["epoch"]) == (3, 7)
    assert answer["fencing"] > 0
    status = run([sys.executable, "-m", "o41.cli", "status"], env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines() == [
        f"artifacts: {relay.url} (the hub, $O41_ARTIFACTS_ENDPOINT)",
        f"collections: {tier.url} (this cluster's collections tier, $O41_COLLECTIONS_ENDPOINT)",
        status.stdout.splitlines()[2],
    ]
    assert status.stdout.splitlines()[2].startswith("  reached: namespace 'ml' holds ")
    refused = run(
        [sys.executable, "-m", "o41.cli", "status"],
        {**env, "O41_COLLECTIONS_TOKEN_FILE": str(hub.token("ml"))},
    )  # a token of cluster A for B's tier: said so
    assert refused.returncode == 1
    assert refused.stdout.splitlines()[2].startswith("  refused (401): the token was not ")
    # the collections are in B's tier, and nothing of them reached the hub
    assert counter(tier.url, token, compute, "steps") == 3
    assert counter(hub.service.url, token, compute, "steps") == 0
    hub_connections = relay.connections

    # artifacts: to the hub through the relay, the same pod's environment
    upload = hub.tmp / f"weights-{compute}"
    upload.write_bytes(b"weights written in cluster B")
    cli = [sys.executable, "-m", "o41.cli"]
    wrote = run(
        [*cli, "write", "--org", hub.org, "--artifact", compute, str(upload), "--json"], env
    )
    assert wrote.returncode == 0, wrote.stderr
    version = json.loads(wrote.stdout)["version"]
    out = hub.tmp / f"read-{compute}"
    read = run(
        [*cli, "read", "--org", hub.org, "--artifact", compute, "--version", version,
         "--output", str(out), "--json"],
        env,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert out.read_bytes() == b"weights written in cluster B"
    assert relay.connections > hub_connections  # the hub was reached through the relay
    # and the version is the hub's: a pod of A reads it there
    _, data = hub.read(version, hub.team_a, artifact=compute)
    assert data == b"weights written in cluster B"


def test_ml_of_the_tier_and_ml_of_the_hub_are_different_state(
    hub: World, cluster_b: ControlPlane, tier: TierProcess
) -> None:
    b = b_token(cluster_b, hub.tmp)
    a = hub.token("ml")
    path = "/v1/collections/job/counter/shared-name"
    assert call(tier.url, f"{path}/add", {"n": 5}, token=b)[0] == 200
    assert call(hub.service.url, f"{path}/add", {"n": 2}, token=a)[0] == 200
    assert call(hub.service.url, f"{path}/add", {"n": 40}, token=b)[0] == 200  # B's ml at the hub
    assert counter(tier.url, b, "job", "shared-name") == 5
    assert counter(hub.service.url, a, "job", "shared-name") == 2
    assert counter(hub.service.url, b, "job", "shared-name") == 40
    status, usage = call(tier.url, "/v1/collections/usage", token=b, method="GET")
    assert (status, usage["namespace"]) == (200, "ml")  # the tier's tenant: the namespace


def test_the_tier_refuses_what_is_not_a_token_of_its_cluster(
    hub: World, cluster_b: ControlPlane, tier: TierProcess
) -> None:
    path = "/v1/collections/job/counter/c/get"
    refused = [
        hub.token("ml"),  # cluster A's
        b_token(cluster_b, hub.tmp, audience=None),  # B's, for B's API server, not o41
    ]
    forged = hub.tmp / "forged"
    forged.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl")
    for token in refused:
        status, answer = call(tier.url, path, {}, token=token)
        assert status == 401, answer
        assert "a collections tier takes the tokens of its own cluster" in answer["error"]
    status, answer = call(tier.url, path, {}, token=forged)
    assert status == 401, answer
    status, answer = call(tier.url, path, {})
    assert status == 401 and "missing bearer token" in answer["error"]


def test_the_tier_serves_nothing_of_artifacts(
    hub: World, cluster_b: ControlPlane, tier: TierProcess
) -> None:
    token = b_token(cluster_b, hub.tmp)
    for method, path in (
        ("POST", "/v1/writes"),
        ("GET", f"/v1/organizations/{hub.org}/artifacts"),
        ("GET", "/v1/usage"),
    ):
        status, answer = call(
            tier.url, path, {} if method == "POST" else None, token=token, method=method
        )
        assert status == 404, answer
        assert "this is a collections tier" in answer["error"]
        assert "artifact calls to the hub" in answer["error"]
    assert call(tier.url, "/readyz", method="GET") == (200, {"status": "ready"})


def test_the_remote_charts_alerts_read_only_what_the_tier_and_its_etcd_export(
    tier: TierProcess, tier_etcd: EtcdCluster
) -> None:
    """The o41-remote chart's O41Tier* rules (tests/chart/test_chart_remote_monitoring.py)
    name only metrics a real tier and its etcd export: a misspelt name would never fire."""
    exported = scrape(f"{tier.url}/metrics")[1] | scrape(f"{tier_etcd.endpoints[0]}/metrics")[1]
    used = {n for g in rule_groups() for r in g["rules"] for n in NAME.findall(r["expr"])}
    assert {"o41_http_requests_total", "etcd_mvcc_db_total_size_in_bytes"} <= used
    assert not sorted(used - exported), (
        f"the tier's alerts read names nobody exports: {used - exported}"
    )


def test_the_tier_keeps_serving_strong_operations_when_its_etcd_loses_a_member(
    hub: World, cluster_b: ControlPlane, tier: TierProcess, tier_etcd: EtcdCluster
) -> None:
    token = b_token(cluster_b, hub.tmp)
    client = Client.over(
        Connection(tier.url, token_file=str(token), retry_deadline=30),
        f"lossy-{uuid.uuid4().hex[:6]}",
    )
    steps = client.counter("steps")
    assert steps.add(1) == 1
    lost = tier_etcd.leader()  # the hardest member to lose: a new leader is elected
    tier_etcd.kill(lost)
    try:
        for _ in range(5):
            steps.add(1)
        assert steps.get() == 6
        with client.lock("checkpoint", ttl=10) as held:
            assert held.token > 0
        client.dict("seen")["after"] = "the loss"
        assert client.dict("seen")["after"] == "the loss"
        assert call(tier.url, "/readyz", method="GET")[0] == 200
    finally:
        tier_etcd.restart(lost)


def _keys(etcd: EtcdCluster, prefix: bytes) -> int:
    """How many keys under ``prefix`` etcd holds (its JSON gateway, count only)."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    body = {
        "key": base64.b64encode(prefix).decode(),
        "range_end": base64.b64encode(end).decode(),
        "count_only": True,
    }
    request = urllib.request.Request(
        f"{etcd.endpoints[0]}/v3/kv/range", data=json.dumps(body).encode(), method="POST"
    )
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(request, timeout=10) as answer:
        return int(json.load(answer).get("count", 0))


def test_collections_etcd_puts_the_hubs_collections_apart_from_its_index(
    hub: World, etcd_binary: Path, tmp_path: Path
) -> None:
    index = EtcdCluster(etcd_binary, tmp_path / "index", size=1).start()
    apart = EtcdCluster(etcd_binary, tmp_path / "collections", size=1).start()
    service = PlacementProcess(
        hub.kube.kubeconfig,
        index.endpoints,
        tmp_path,
        extra=("--collections-etcd", ",".join(apart.endpoints)),
    )
    try:
        service.start()
        path = "/v1/collections/job/counter/apart"
        assert call(service.url, f"{path}/add", {"n": 4}, token=hub.team_a)[0] == 200
        assert counter(service.url, hub.team_a, "job", "apart") == 4
        upload = tmp_path / "upload"
        upload.write_bytes(b"indexed")
        env = pod_env(hub, O41_ARTIFACTS_TOKEN_FILE=str(hub.team_a))
        wrote = run(
            [sys.executable, "-m", "o41.cli", "write", "--org", hub.org, "--artifact",
             "apart", str(upload), "--endpoint", service.url, "--json"],
            env,
        )  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        assert _keys(apart, b"/o41/collections/") > 0
        assert _keys(index, b"/o41/placement/") > 0  # the index is in use
        for root in COLLECTION_ROOTS:
            assert _keys(index, root) == 0, root
        assert _keys(apart, b"/o41/placement/") == 0
    finally:
        service.stop()
        apart.stop()
        index.stop()


def test_the_tier_speaks_tls_to_its_etcd(state_etcd_tls: EtcdCluster, tmp_path: Path) -> None:
    """Its etcd over TLS with a client certificate (the O41_ETCD_* files, as the hub's)."""
    process = TierProcess(
        tmp_path / "no-kubeconfig",
        state_etcd_tls.endpoints,
        tmp_path,
        env=state_etcd_tls.client_tls.environment(),
        extra=("--authentication", "none"),  # no cluster needed: the store is the point
    )
    process.start()
    try:
        compute = f"tls-{uuid.uuid4().hex[:6]}"
        path = f"/v1/collections/{compute}/counter/steps"
        status, answer = call(process.url, f"{path}/add", {"n": 3})
        assert status == 200, answer
        status, answer = call(process.url, f"{path}/get", {})
        assert (status, answer["value"]) == (200, 3)
    finally:
        process.stop()
