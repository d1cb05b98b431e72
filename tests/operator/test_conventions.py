"""The Kubernetes API conventions a platform team checks, as they check them: ``kubectl
explain`` on every field, ``observedGeneration``, ``lastChecked``, the Organization's
columns, Events that ``kubectl describe`` shows, the operator's readiness, and
``o41 status`` / ``kubectl o41 status``.

Real kube-apiserver, the real operator process, the storage stand-ins as the clouds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from o41.operator import health
from test_operator import Cluster, org_status, unique
from testbed.kube import Kube, kubectl_binary
from testbed.process import LOOPBACK, free_port

from fixtures.operator import Operator
from support import wait_for

RESOURCES = ("location", "organization")


def explain(kube: Kube, path: str) -> str:
    return kube.kubectl("explain", path)


def fields(kube: Kube, resource: str) -> list[str]:
    """Every field path of ``resource`` from ``kubectl explain --recursive`` (ObjectMeta's
    own fields left out: Kubernetes describes them)."""
    out = kube.kubectl("explain", resource, "--recursive")
    tree = out.split("FIELDS:", 1)[1].splitlines()
    paths: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in tree:
        m = re.match(r"^( +)([A-Za-z0-9]+)\s", line)
        if not m:
            continue
        depth, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        path = ".".join([*(n for _, n in stack), name])
        stack.append((depth, name))
        if path.startswith("metadata."):
            continue
        paths.append(path)
    return paths


def description(out: str) -> str:
    text = out.split("DESCRIPTION:", 1)[1]
    text = re.split(r"\n(FIELDS|ENUM):", text, maxsplit=1)[0]
    return text.strip()


@pytest.mark.kube
def test_kubectl_explain_describes_every_field(kube: Kube, crds: None) -> None:
    def published() -> bool:  # the API server publishes a CRD's OpenAPI a moment late
        return "lastChecked" in kube.kubectl("explain", "location.status", check=False)

    wait_for(published, 60, "kubectl explain to know location.status.lastChecked")
    empty = []
    checked = 0
    for resource in RESOURCES:
        paths = fields(kube, resource)
        assert "spec.backend.s3Compatible.signingRegion" in paths or resource != "location"
        assert "status.conditions.observedGeneration" in paths
        for path in ["", *paths]:
            where = f"{resource}.{path}" if path else resource
            said = description(explain(kube, where))
            checked += 1
            if not said or said == "<empty>":
                empty.append(where)
    assert empty == [], f"kubectl explain shows no description for: {empty}"
    assert checked > 50
    print(f"kubectl explain: {checked} fields described")


# --- with the operator ---------------------------------------------------------------------


@pytest.fixture
def cluster(
    operator: Operator,
    kube: Kube,
    credentials: dict[str, str],
    s3: Any,
    gcs: Any,
    azure: Any,
) -> Cluster:
    return Cluster(kube, credentials, s3, gcs, azure)


@pytest.mark.kube
@pytest.mark.stores
def test_organization_shows_the_generation_it_observed_and_its_cloud_defaults(
    cluster: Cluster,
) -> None:
    org, aws, gcp = unique("org"), unique("aws"), unique("gcp")
    cluster.organization(org)
    cluster.location(aws, org)
    cluster.location(gcp, org, "gcs")
    cluster.ready(aws)
    cluster.ready(gcp)
    status = org_status(cluster, org, cloudDefaults={"aws": aws, "gcp": gcp})
    generation = cluster.get("organization", org)["metadata"]["generation"]
    assert status["observedGeneration"] == generation
    assert [c["observedGeneration"] for c in status["conditions"]] == [generation]

    columns = cluster.columns("organization", org)
    assert json.loads(columns["CLOUD DEFAULTS"]) == {"aws": aws, "gcp": gcp}
    assert columns["FALLBACK"] == aws

    # a change of spec: the status says it acted on the new generation
    cluster.organization(org, namespaces=["default", "ml"])
    newer = cluster.get("organization", org)["metadata"]["generation"]
    assert newer > generation
    status = org_status(cluster, org, observedGeneration=newer)
    assert status["conditions"][0]["observedGeneration"] == newer


@pytest.mark.kube
@pytest.mark.stores
def test_a_location_shows_its_last_check_and_the_generation_of_its_conditions(
    cluster: Cluster,
) -> None:
    org, loc = unique("org"), unique("aws")
    cluster.organization(org)
    cluster.location(loc, org)
    ready = cluster.ready(loc)
    generation = ready["metadata"]["generation"]
    assert ready["status"]["observedGeneration"] == generation
    assert [c["observedGeneration"] for c in ready["status"]["conditions"]] == [generation]

    def checked() -> str | None:
        found: str | None = cluster.get("location", loc).get("status", {}).get("lastChecked")
        return found

    first: str = wait_for(checked, 60, "the first periodic check")  # every 5 s on the test bed

    def moved() -> str | None:
        now = checked()
        return now if now != first else None

    later: str = wait_for(moved, 90, "a later check")  # lastChecked: every 5 checks
    assert dt.datetime.fromisoformat(later) > dt.datetime.fromisoformat(first)


@pytest.mark.kube
@pytest.mark.stores
def test_events_are_in_default_and_kubectl_describe_shows_them(cluster: Cluster) -> None:
    org, loc = unique("org"), unique("aws")
    cluster.organization(org)
    cluster.location(loc, org)
    cluster.ready(loc)
    org_status(cluster, org, takesWrites=True)

    def described(kind: str, name: str, reason: str) -> str | None:
        done = cluster.run("describe", kind, name)
        return done.stdout if reason in done.stdout.split("Events:", 1)[-1] else None

    out = wait_for(lambda: described("location", loc, "BucketCreated"), 30, "the Event")
    assert "Normal" in out.split("Events:", 1)[1]
    wait_for(lambda: described("organization", org, "TakesWrites"), 30, "the org's Event")
    events = cluster.events(loc)
    assert {e["metadata"]["namespace"] for e in events} == {"default"}
    assert all("namespace" not in e["involvedObject"] for e in events)
    assert {e["involvedObject"]["kind"] for e in events} == {"Location"}


# --- readiness -------------------------------------------------------------------------------


@pytest.mark.kube
@pytest.mark.stores
def test_the_running_operator_is_ready(operator: Operator) -> None:
    with urllib.request.urlopen(operator.readiness, timeout=5) as r:
        assert (r.status, json.loads(r.read())) == (200, {"status": "ready"})


class Listener:
    """A TCP listener on loopback that accepts connections (a webhook server's port)."""

    def __init__(self) -> None:
        import socket

        self.port = free_port()
        self.sock = socket.create_server((LOOPBACK, self.port))

    def close(self) -> None:
        self.sock.close()


async def _readyz(readiness: health.Readiness) -> tuple[int, dict[str, Any]]:
    served = health.app(readiness, "/readyz")
    runner = web.AppRunner(served)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    try:
        import aiohttp

        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{LOOPBACK}:{port}/readyz") as r,
        ):
            return r.status, await r.json()
    finally:
        await runner.cleanup()


@pytest.mark.kube
async def test_readiness_waits_for_the_start_up_the_webhook_and_the_watches(
    kube: Kube, crds: None
) -> None:
    """The checks of /readyz against the real API server: the names the indexes hold are
    what a kopf index would hold (a set here)."""
    from kubernetes import client

    def lister(plural: str) -> list[dict[str, Any]]:
        found: dict[str, Any] = client.CustomObjectsApi(kube.api).list_cluster_custom_object(  # type: ignore[assignment]
            "artifacts.o41.io", "v1alpha1", plural
        )
        items: list[dict[str, Any]] = found["items"]
        return items

    org = unique("ready-org")
    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "artifacts.o41.io/v1alpha1",
                "kind": "Organization",
                "metadata": {"name": org},
                "spec": {},
            }
        ),
    )
    started = threading.Event()
    listener = Listener()
    webhook_port = free_port()  # nothing listens yet
    # every object the other tests left is indexed, ours not: the problem must name it
    # (the answer shows the first five missing names only)
    indexed: dict[str, set[str]] = {
        "locations": {o["metadata"]["name"] for o in lister("locations")},
        "organizations": {
            o["metadata"]["name"] for o in lister("organizations") if o["metadata"]["name"] != org
        },
    }
    readiness = health.Readiness(started, (LOOPBACK, webhook_port), lister, grace=0)
    try:
        status, body = await _readyz(readiness)
        assert (status, body["problems"]) == (503, ["the operator's start-up has not finished"])

        started.set()
        readiness.indexes = {k: (lambda v=v: v) for k, v in indexed.items()}  # type: ignore[misc]
        status, body = await _readyz(readiness)
        assert status == 503
        assert (
            f"does not accept connections on ('{LOOPBACK}', {webhook_port})" in body["problems"][0]
        )
        assert any(org in p and "organizations" in p for p in body["problems"])

        readiness.webhook = (LOOPBACK, listener.port)
        indexed["organizations"].update(o["metadata"]["name"] for o in lister("organizations"))
        indexed["locations"].update(o["metadata"]["name"] for o in lister("locations"))
        status, body = await _readyz(readiness)
        assert (status, body) == (200, {"status": "ready"})
    finally:
        listener.close()
        kube.kubectl("delete", "organization", org, "--wait=false", check=False)


# --- o41 status ------------------------------------------------------------------------------


def status_command(
    kube: Kube, *args: str, plugin: bool = False
) -> subprocess.CompletedProcess[str]:
    """``o41 status`` as a user runs it, or ``kubectl o41 status`` (the plugin on PATH)."""
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [kubectl_binary(), "o41"] if plugin else [str(bin_dir / "o41")]
    return subprocess.run(
        [*command, "status", *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.kube
@pytest.mark.stores
def test_o41_status_prints_the_organization_its_locations_and_warnings(
    cluster: Cluster, kube: Kube
) -> None:
    org, good, bad = unique("org"), unique("aws"), unique("azure")
    cluster.organization(org)
    cluster.location(good, org)
    cluster.ready(good)
    cluster.location(bad, org, "azure-wrong")
    org_status(cluster, org, takesWrites=True)

    def failed() -> dict[str, Any] | None:
        conditions = cluster.get("location", bad).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["status"] == "False"), None)

    reason = wait_for(failed, 60, "the wrong Azure key to fail")["reason"]
    wait_for(
        lambda: cluster.get("location", good).get("status", {}).get("lastChecked"),
        60,
        "a periodic check",
    )

    def printed() -> list[str] | None:
        done = status_command(kube, org)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        return (
            lines
            if any(line.startswith("Warnings: ") and "none" not in line for line in lines)
            else None
        )

    lines = wait_for(printed, 30, "o41 status to show the warning")
    assert lines[0] == f"Organization: {org}"
    assert lines[1] == (
        f"  Ready:         True (FallbackReady): takes writes; fallback is {good!r}"
    )
    assert "  Takes writes:  yes" in lines
    assert f"  Fallback:      {good}" in lines
    at = lines.index("  Cloud defaults:")
    # azure has no default: its only location never became Ready
    assert lines[at + 1 : at + 3] == [f"    aws: {good}", "  Namespaces:    default"]
    assert "Locations: 2" in lines
    mine = next(line for line in lines if line.startswith(f"  {good}  "))
    assert re.fullmatch(
        rf"  {good}  aws/us-east-1  Ready=True  role=fallback,default  reason=BucketReady  "
        r"last check \d+s ago",
        mine,
    ), mine
    theirs = next(line for line in lines if line.startswith(f"  {bad}  "))
    assert f"Ready=False  role=-  reason={reason}  last check never" in theirs
    warning = next(line for line in lines if f"Location/{bad}  {reason}: " in line)
    assert re.match(r"  \d+[smhd] ago  Location/", warning)

    # the same through kubectl, as its plugin
    plugin = status_command(kube, org, plugin=True)
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout.splitlines()[0] == f"Organization: {org}"


@pytest.mark.kube
def test_o41_status_of_an_organization_that_is_not_there(kube: Kube, crds: None) -> None:
    done = status_command(kube, "no-such-org")
    assert done.returncode == 1
    assert done.stderr.strip() == "o41 status: organization 'no-such-org' not found"
    assert done.stdout == ""
