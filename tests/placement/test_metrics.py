"""``/metrics`` of both servers, scraped as Prometheus does, after real load: the placement
service (a real process on a 3-member etcd) and the operator (a real process with its
admission webhook), with writes, reads, a refused request, an admission refusal, a
Location that cannot be set up and collection operations. The Grafana dashboard and the
alert rules of the chart may use only the names these scrapes show.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from test_chart import CHART, run_helm
from testbed.etcd import EtcdCluster
from testbed.kube import Kube
from testbed.product import PlacementProcess as PlacementService
from testbed.stores import AzureStore, GcsStore, S3Store

from fixtures.operator import Operator
from fixtures.world import World
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
# the names of a family's samples, which a family with no sample yet still will have
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def scrape(url: str) -> tuple[Samples, set[str]]:
    """The samples of one scrape, by (name, labels), and every name it exports (each
    family's name and its samples' names: ``_total``, ``_bucket``, ``_count``, ...)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    samples: Samples = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
        for s in family.samples:
            names.add(s.name)
            samples[s.name, frozenset(s.labels.items())] = s.value
    return samples, names


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def labelled(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls) in samples if n == name]


class Load:
    """The world of test_placement, and what the load did to it."""

    def __init__(self, world: World, operator: Operator, azure: AzureStore) -> None:
        self.world, self.operator = world, operator
        self.service_url = f"{world.service.url}/metrics"
        self.broken = f"{world.org}-azure-bad"
        self.lonely = f"lonely-{uuid.uuid4().hex[:6]}"
        self.azure = azure


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
    w = World(kube, credentials, s3, gcs, azure, placement, tmp_path_factory.mktemp("metrics"))
    w.organization(["team-a"])
    w.east = w.location(
        "aws-east", "aws", "us-east-1", {"s3": {"endpoint": s3.endpoint}}, credentials["s3"]
    )
    w.central = w.location(
        "gcp-central",
        "gcp",
        "us-central1",
        {"gcs": {"endpoint": gcs.endpoint, "project": gcs.project}},
        credentials["gcs"],
    )
    w.ready(w.east, w.central)
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


def collection(world: World, kind: str, name: str, op: str, **args: Any) -> tuple[int, Any]:
    return world.api("POST", f"/v1/collections/train-1/{kind}/{name}/{op}", args)


async def websocket_open(world: World, url: str) -> tuple[Samples, dict[str, Any]]:
    """Scrape while one collections WebSocket is open, after one operation on it."""
    token = world.team_a.read_text()
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"{world.service.url}/v1/collections", headers=headers) as ws,
    ):
        message = {"id": 1, "compute": "train-1", "kind": "counter", "name": "ws", "op": "add"}
        await ws.send_str(json.dumps({**message, "args": {"n": 2}}))
        answer = json.loads((await ws.receive()).data)
        during, _ = await asyncio.to_thread(scrape, url)
    return during, answer


@pytest.fixture(scope="module")
def load(world: World, operator: Operator, azure: AzureStore) -> Iterator[dict[str, Any]]:
    """Scrapes of both servers before and after the load, and during an open WebSocket."""
    o = Load(world, operator, azure)
    before, _ = scrape(o.service_url)
    op_before, _ = scrape(operator.metrics_url)

    # placement: writes by the region rule and by the fallback, a read, refusals
    region = world.write(b"r" * 1000, world.team_a, place=("aws", "us-east-1"))
    fallback = world.write(b"f" * 2000, world.team_a, place=("azure", "westeurope"))
    assert region["location"] == world.east and fallback["location"] == world.east
    _, data = world.read(region["version"], world.team_a, place=("gcp", "us-central1"))
    assert data == b"r" * 1000
    # a listing: a range read of the store whatever ran before (the quota's count of a
    # namespace's collections, also a range, happens only when no recent count exists)
    status, listed = world.api("GET", f"/v1/organizations/{world.org}/artifacts/model/versions")
    assert status == 200 and len(listed["versions"]) == 2, listed
    (world.tmp / "small").write_bytes(b"s")
    refused = world.o41(
        "write", "--org", world.org, "--artifact", "a", str(world.tmp / "small"),
        token=world.team_b, place=("aws", "us-east-1"),
    )  # fmt: skip
    assert refused.returncode != 0
    status, _ = world.api("GET", "/v1/no-such-route")
    assert status == 404
    status, _ = world.api("POST", "/v1/writes", {"organization": world.org}, token=world.team_b)
    assert status in (400, 403)

    # collections: strong and eventual, and a name the engine has no operation for
    value = base64.b64encode(b"\x01").decode()
    assert collection(world, "dict", "d", "set", key="sa", value=value)[0] == 200
    assert collection(world, "dict", "d", "get", key="sa")[0] == 200
    for _ in range(3):
        status, _ = collection(world, "counter", "steps", "add", n=1, consistency="eventual")
        assert status == 200
    assert collection(world, "counter", "steps", "no-such-op")[0] == 400
    during, answer = asyncio.run(websocket_open(world, o.service_url))
    assert answer["status"] == 200

    # operator: an admission refusal, a Location that cannot be set up, an organization
    # with no fallback
    world.kube.kubectl("delete", "org", world.org, "--wait=false", check=False)
    assert world.kube.kubectl("get", "org", world.org, "-o", "name").strip()  # refused
    world.apply(
        {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Location",
            "metadata": {"name": o.broken},
            "spec": {
                "organization": world.org,
                "cloud": "azure",
                "region": "westeurope",
                "backend": {"azureBlob": {"accountUrl": azure.account_url}},
                "credentials": {"secretName": world.credentials["azure-wrong"]},
            },
        }
    )
    world.apply(
        {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": o.lonely},
            "spec": {"namespaces": ["team-z"]},
        }
    )

    def operator_settled() -> tuple[Samples, set[str]] | None:
        got = scrape(operator.metrics_url)
        samples = got[0]
        failed = total(samples, "o41_operator_location_failures_total", phase="setup")
        lonely = labelled(samples, "o41_operator_organization_fallback")
        seen = any(ls == {"organization": o.lonely} for ls in lonely)
        return got if failed > before_failures and seen else None

    before_failures = total(op_before, "o41_operator_location_failures_total", phase="setup")
    op_after, op_names = wait_for(operator_settled, 60, "the operator to count the failure")

    def flushed() -> tuple[Samples, set[str]] | None:
        got = scrape(o.service_url)
        done = total(got[0], "o41_collections_eventual_flushed_total")
        return got if done >= total(before, "o41_collections_eventual_flushed_total") + 1 else None

    after, names = wait_for(flushed, 30, "the eventual writes to reach etcd")
    yield {
        "load": o,
        "before": before,
        "during": during,
        "after": after,
        "names": names,
        "op_before": op_before,
        "op_after": op_after,
        "op_names": op_names,
    }
    world.kube.kubectl("delete", "location", o.broken, "--wait=false", check=False)
    world.kube.kubectl("delete", "org", o.lonely, "--wait=false", check=False)


def grew(load: dict[str, Any], name: str, by: float = 1, **labels: str) -> float:
    """How much ``name`` (with ``labels``) grew during the load; asserts at least ``by``."""
    delta = total(load["after"], name, **labels) - total(load["before"], name, **labels)
    seen = sorted(map(str, labelled(load["after"], name)))
    assert delta >= by, f"{name}{labels} grew by {delta}, expected at least {by}; has {seen}"
    return delta


def test_placement_service_exports_red_series_by_route_template(load: dict[str, Any]) -> None:
    grew(load, "o41_http_requests_total", 2, route="/v1/writes", method="POST", status="201")
    grew(load, "o41_http_requests_total", 2, route="/v1/writes/{version}/commit", status="200")
    grew(load, "o41_http_requests_total", 1, route="unmatched", status="404")
    refused = sum(
        grew(load, "o41_http_requests_total", 0, route="/v1/writes", status=s)
        for s in ("400", "403")
    )
    assert refused >= 2  # the CLI's refusal and the API's
    grew(load, "o41_http_request_duration_seconds_count", 2, route="/v1/writes")
    buckets = labelled(load["after"], "o41_http_request_duration_seconds_bucket")
    assert {"route": "/v1/writes", "method": "POST", "le": "+Inf"} in buckets
    routes = {ls["route"] for ls in labelled(load["after"], "o41_http_requests_total")}
    assert not any("no-such-route" in r or load["load"].world.org in r for r in routes)
    # every route label is a template of the app or "unmatched": never a raw path
    assert all(r == "unmatched" or r.startswith("/") for r in routes)
    assert not any(re.search(r"/v\d+-[0-9a-f]{6}", r) for r in routes)
    assert total(load["after"], "o41_http_requests_in_flight") >= 0


def test_placement_service_exports_domain_series(load: dict[str, Any]) -> None:
    world: World = load["load"].world
    org = world.org
    assert grew(load, "o41_begins_total", 1, organization=org, rule="region") == 1
    assert grew(load, "o41_begins_total", 1, organization=org, rule="fallback") == 1
    assert grew(load, "o41_writes_total", 1, organization=org, rule="fallback") == 1
    grew(load, "o41_write_bytes_total", 3000, organization=org)
    grew(load, "o41_reads_total", 1, organization=org)
    grew(load, "o41_bucket_signatures_total", 3, location=world.east)  # 2 uploads, 1 read
    for op in ("txn", "get", "range"):
        grew(load, "o41_state_store_requests_total", 1, operation=op)
        grew(load, "o41_state_store_request_duration_seconds_count", 1, operation=op)
    assert "o41_state_store_failures_total" in load["names"]
    assert "o41_bucket_failures_total" in load["names"]
    ops = "o41_collections_operations_total"
    grew(load, ops, 1, kind="dict", op="set", consistency="strong", outcome="ok")
    grew(load, ops, 1, kind="dict", op="get", consistency="strong", outcome="ok")
    grew(load, ops, 3, kind="counter", op="add", consistency="eventual", outcome="ok")
    grew(load, ops, 1, kind="counter", op="other", outcome="refused")  # never the raw name
    assert not any(ls.get("op") == "no-such-op" for ls in labelled(load["after"], ops))
    grew(load, "o41_collections_operation_duration_seconds_count", 3, kind="counter", op="add")
    grew(load, "o41_collections_eventual_flushed_total", 1)
    assert total(load["after"], "o41_collections_eventual_dropped_total") == 0
    assert total(load["after"], "o41_collections_eventual_buffered") >= 0
    assert total(load["during"], "o41_collections_websockets") >= 1
    assert total(load["after"], "o41_collections_websockets") == 0
    grew(load, "o41_collections_websockets_opened_total", 1)
    grew(load, "process_cpu_seconds_total", 0.0001)
    assert total(load["after"], "process_resident_memory_bytes") > 10_000_000
    assert "python_gc_collections_total" in load["names"]


def test_operator_exports_locations_admission_and_setup_series(load: dict[str, Any]) -> None:
    o: Load = load["load"]
    world = o.world
    before, after = load["op_before"], load["op_after"]
    org = world.org
    # the only aws Location is the fallback and the aws default
    assert total(after, "o41_operator_locations", organization=org, cloud="aws",
                 ready="true", role="fallback,default") == 1  # fmt: skip
    assert total(after, "o41_operator_locations", organization=org, ready="true") == 2
    east = "o41_operator_location_ready"
    assert total(after, east, location=world.east, role="fallback,default") == 1
    assert total(after, east, location=world.central, cloud="gcp", role="default") == 1
    # its role is the operator's to decide (the only azure Location may be the azure
    # default before it is Ready); it is there, and not Ready
    (broken,) = [ls for ls in labelled(after, east) if ls["location"] == o.broken]
    assert (broken["organization"], broken["cloud"]) == (org, "azure")
    assert total(after, east, location=o.broken) == 0
    assert total(after, "o41_operator_locations", organization=org, ready="false") == 1
    assert total(after, "o41_operator_organization_fallback", organization=org) == 1
    assert total(after, "o41_operator_organization_takes_writes", organization=org) == 1
    assert total(after, "o41_operator_organization_fallback", organization=o.lonely) == 0
    failures = "o41_operator_location_failures_total"
    reasons = {ls["reason"] for ls in labelled(after, failures) if ls["phase"] == "setup"}
    assert reasons and all(re.fullmatch(r"[A-Z][A-Za-z]+", r) for r in reasons)
    refused = "o41_operator_admission_requests_total"
    grew_by = total(after, refused, handler="organization-delete", verdict="refused") - total(
        before, refused, handler="organization-delete", verdict="refused"
    )
    assert grew_by >= 1
    assert total(after, refused, verdict="allowed") >= 1
    assert total(after, "o41_operator_admission_duration_seconds_count") >= 1
    assert total(after, "o41_operator_location_setup_duration_seconds_count", outcome="ok") >= 2
    assert total(after, "o41_operator_location_setup_duration_seconds_count", outcome="failed") > 0
    assert "o41_operator_location_check_duration_seconds_bucket" in load["op_names"]
    assert "o41_operator_reconcile_errors_total" in load["op_names"]
    assert total(after, "process_resident_memory_bytes") > 10_000_000


# --- the chart's dashboard and alerts use only these names -------------------------------

NAME = re.compile(r"\b((?:o41|process|python|etcd)_[a-zA-Z0-9_:]+)\b")


def rendered(*values: str) -> list[dict[str, Any]]:
    sets = [a for v in values for a in ("--set", v)]
    done = run_helm("template", "o41", str(CHART), *sets)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def etcd_names(state_etcd: EtcdCluster) -> set[str]:
    return scrape(f"{state_etcd.endpoints[0]}/metrics")[1]


def dashboard_queries() -> list[str]:
    docs = rendered("monitoring.dashboard.enabled=true")
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]
    assert len(maps) == 1
    (config,) = maps
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    (raw,) = config["data"].values()
    board = json.loads(raw)
    assert board["title"] and board["panels"]
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    queries += [v["query"] for v in board.get("templating", {}).get("list", []) if "query" in v]
    return [q if isinstance(q, str) else q["query"] for q in queries]


def alert_expressions() -> list[str]:
    docs = rendered("monitoring.prometheusRule.enabled=true")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


@pytest.mark.parametrize("what", ["dashboard", "alerts"])
def test_the_dashboard_and_alerts_use_only_exported_names(
    what: str, load: dict[str, Any], state_etcd: EtcdCluster
) -> None:
    exported = load["names"] | load["op_names"] | etcd_names(state_etcd)
    queries = dashboard_queries() if what == "dashboard" else alert_expressions()
    assert len(queries) >= 6
    used = {n for q in queries for n in NAME.findall(q)}
    assert used, queries
    missing = sorted(used - exported)
    assert not missing, f"the {what} queries names nobody exports: {missing}"
