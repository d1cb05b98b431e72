"""``/v1/usage``, ``/usage`` and ``/metrics`` of the real app, in-process, on a seeded history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from o41.core.usage import PriceError
from o41.webhook.telemetry import metrics
from o41.webhook.usage.counters import USAGE
from o41.webhook.usage.prices import DEFAULT_PRICES, PRICES_ENV, load_prices
from testbed.usage import EAST, EMPTY_ORG, GB, ORG, TB, bearer, hours_ago, seeded_app, write

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(aiohttp_client: Any) -> Client:
    made: Client = await aiohttp_client(seeded_app())
    return made


async def usage(client: Client, query: str) -> dict[str, Any]:
    r = await client.get(f"/v1/usage?{query}", headers=bearer())
    assert r.status == 200, await r.text()
    body: dict[str, Any] = await r.json()
    return body


async def raw_records(client: Client, query: str) -> list[dict[str, Any]]:
    """Every raw record of ``/v1/usage?records=true``, page by page."""
    found: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page = await usage(client, f"{query}&records=true&limit=5{cursor}")
        found += page["records"]
        if page["next"] is None:
            return found
        cursor = f"&cursor={page['next']}"


async def test_the_json_answers_both_questions_for_the_last_day(client: Client) -> None:
    day = await usage(client, f"organization={ORG}&window=24h")
    assert (day["organization"], day["window"]) == (ORG, "24h")
    # the net advice: westeurope's 500 GB kept local save $43.50 of writes, but a tenth of
    # the fallback's reads (its share of the bytes written there) would then leave Azure
    assert day["summary"] == (
        "A location in azure/westeurope would have kept 500 GB local, about $24.62 over this "
        "window (net of $18.96 more egress on reads and $0.08 less storage). 2.0 GB came from "
        "writers with an unknown cloud or region (about $0.18): no location can keep those "
        "local; set O41_ARTIFACTS_CLOUD and O41_ARTIFACTS_REGION for those jobs."
    )
    places = day["writes"]["places"]
    assert [(p["cloud"], p["region"], p["source"]) for p in places] == [
        ("aws", "us-west-2", "env"),
        ("azure", "westeurope", "metadata"),
        (None, None, "none"),
        ("aws", "us-east-1", "skypilot"),
    ]
    west = places[0]
    assert west["byRule"] == {"cloud": {"versions": 40, "bytes": 12 * TB // 10, "cost": 24.0}}
    assert west["leftRegion"]["cost"] == 24.0 and west["begins"] == 40
    assert places[1]["warnings"] == 5 and places[1]["leftRegion"]["cost"] == 43.5
    assert day["writes"]["total"]["bytes"] == 12 * TB // 10 + 500 * GB + 2 * GB + 3 * TB
    assert [s["source"] for s in day["writes"]["bySource"]] == [
        "env",
        "skypilot",
        "metadata",
        "none",
    ]
    matrix = {(c["readerCloud"], c["locationCloud"]): c for c in day["reads"]["matrix"]}
    assert matrix[("gcp", "aws")] == {
        "readerCloud": "gcp",
        "locationCloud": "aws",
        "reads": 10,
        "bytes": 800 * GB,
        "cost": 72.0,
    }
    assert matrix[("unknown", "gcp")]["cost"] == 0.12
    assert matrix[("aws", "aws")]["bytes"] == 2 * TB + 100 * GB
    assert day["reads"]["crossRegion"] == [
        {"cloud": "aws", "reads": 4, "bytes": 100 * GB, "cost": 2.0}
    ]
    assert day["prices"]["asOf"] == DEFAULT_PRICES.as_of
    assert "records" not in day  # summarised: the raw records only on request
    assert len(await raw_records(client, f"organization={ORG}&window=24h")) == 12


async def test_the_window_chooses_the_hours(client: Client) -> None:
    week = await usage(client, f"organization={ORG}")  # default 7d
    month = await usage(client, f"organization={ORG}&window=30d")
    assert week["window"] == "7d"
    assert len(await raw_records(client, f"organization={ORG}")) == 13
    assert len(await raw_records(client, f"organization={ORG}&window=30d")) == 14
    # 3 TB more from us-west-2 a day ago make it the costliest place this week
    assert week["summary"].startswith(
        "A location in aws/us-west-2 would have kept 4.2 TB local, about $63.28 over this window "
        "(net of $20.72 more egress on reads"
    )
    assert month["writes"]["total"]["versions"] - week["writes"]["total"]["versions"] == 7


async def test_who_may_read_usage(client: Client) -> None:
    assert (await client.get(f"/v1/usage?organization={ORG}")).status == 401
    other = await client.get(f"/v1/usage?organization={ORG}", headers=bearer("token-team-b"))
    assert other.status == 403 and "spec.namespaces" in (await other.json())["error"]
    missing = await client.get("/v1/usage?organization=nope", headers=bearer())
    assert missing.status == 404
    wrong = await client.get(f"/v1/usage?organization={ORG}&window=1y", headers=bearer())
    assert wrong.status == 400 and "24h, 7d, 30d" in (await wrong.json())["error"]


async def test_an_organization_without_usage_answers_empty(client: Client) -> None:
    quiet = await usage(client, f"organization={EMPTY_ORG}")
    assert quiet["writes"]["places"] == []
    assert await raw_records(client, f"organization={EMPTY_ORG}") == []
    assert quiet["summary"] == "No writes were committed in this window."
    page = await client.get(f"/usage?organization={EMPTY_ORG}", headers=bearer())
    text = await page.text()
    assert page.status == 200 and "id=empty" in text
    assert f"No usage recorded for {EMPTY_ORG} in the last 7d" in text


async def test_the_page_asks_for_a_token_and_keeps_it_in_a_cookie(client: Client) -> None:
    first = await client.get(f"/usage?organization={ORG}")
    assert first.status == 401 and "create token" in await first.text()
    assert "script-src" not in first.headers["Content-Security-Policy"]  # default-src 'none'

    bad = await client.post(
        "/usage", data={"token": "stolen", "organization": ORG}, allow_redirects=False
    )
    assert bad.status == 401 and "id=rejected" in await bad.text()

    foreign = await client.post(
        "/usage", data={"token": "token-team-a"}, headers={"Origin": "http://evil.example"}
    )
    assert foreign.status == 403

    ok = await client.post(
        "/usage", data={"token": "token-team-a", "organization": ORG}, allow_redirects=False
    )
    assert ok.status == 303 and ok.headers["Location"] == f"/usage?organization={ORG}"
    cookie = ok.cookies["o41_usage_token"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/usage"

    page = await client.get(f"/usage?organization={ORG}")  # the cookie jar sends it
    text = await page.text()
    assert page.status == 200
    assert "A location in aws/us-west-2 would have kept 4.2 TB local" in text
    for chart in ("places-chart", "sources-chart", "matrix-chart"):
        assert f'<svg id="{chart}"' in text
    assert "<table id=storage-prices>" in text and "<td>azure</td><td>0.018</td>" in text
    assert "<script" not in text and "http://" not in text.replace(
        "http://www.w3.org/2000/svg", ""
    ).replace("https://", "")

    listing = await client.get("/usage")
    assert ORG in await listing.text() and EMPTY_ORG in await listing.text()
    forbidden = await client.get("/usage?organization=nope")
    assert forbidden.status == 404 and "does not exist" in await forbidden.text()

    out = await client.post("/usage", data={"signout": "1"}, allow_redirects=False)
    assert out.status == 303
    assert (await client.get(f"/usage?organization={ORG}")).status == 401


async def test_the_page_escapes_what_clients_reported(aiohttp_client: Any) -> None:
    evil = write(hours_ago(0), ("aws", "<script>alert(1)</script>", "env"), "cloud", EAST, 1, GB)
    made: Client = await aiohttp_client(seeded_app([evil]))
    text = await (await made.get(f"/usage?organization={ORG}", headers=bearer())).text()
    assert "<script>" not in text and "&lt;script&gt;" in text


async def test_metrics_follow_the_usage_counters(client: Client) -> None:
    usage_counters = client.app[USAGE]
    org = "metrics-org"
    place = {"cloud": "aws", "region": "us-west-2", "source": "env"}
    usage_counters.add(
        org, "begin", {**place, "rule": "fallback", "location": "x"}, begins=2, warnings=2
    )
    usage_counters.add(
        org,
        "write",
        {
            **place,
            "rule": "fallback",
            "location": "x",
            "locationCloud": "gcp",
            "locationRegion": "r",
        },
        versions=2,
        bytes=3000,
    )
    usage_counters.add(
        org,
        "read",
        {
            "cloud": None,
            "region": None,
            "source": "none",
            "locality": "cross-cloud",
            "location": "x",
            "locationCloud": "gcp",
            "locationRegion": "r",
        },
        reads=1,
        bytes=500,
    )
    r = await client.get("/metrics")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(await r.text())
        for s in family.samples
        if s.labels.get("organization") == org
    }
    labels = (("cloud", "aws"), ("organization", org), ("region", "us-west-2"), ("source", "env"))
    with_rule = tuple(sorted((*labels, ("rule", "fallback"))))
    assert samples[("o41_begins_total", with_rule)] == 2
    assert samples[("o41_fallback_warnings_total", labels)] == 2
    assert samples[("o41_writes_total", with_rule)] == 2
    assert samples[("o41_write_bytes_total", with_rule)] == 3000
    unknown = (
        ("cloud", "unknown"),
        ("locality", "cross-cloud"),
        ("organization", org),
        ("region", "unknown"),
        ("source", "none"),
    )
    assert samples[("o41_reads_total", unknown)] == 1
    assert samples[("o41_read_bytes_total", unknown)] == 500


def test_the_label_set_cap_folds_new_series_into_other() -> None:
    m = metrics.UsageMetrics(max_label_sets=3)
    for i in range(10):
        m.observe(
            "o", "read", {"cloud": "aws", "region": f"r{i}", "locality": "local"}, {"reads": 1}
        )
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())
    }
    reads = [s for s in families["o41_reads"].samples if s.name == "o41_reads_total"]
    assert len(reads) == 4  # three label sets, then _other
    assert {s.labels["region"] for s in reads} == {"r0", "r1", "r2", "_other"}
    assert sum(s.value for s in reads) == 10
    assert next(s.value for s in reads if s.labels["region"] == "_other") == 7
    folded = families["o41_usage_label_sets_folded"].samples[0]
    assert folded.value == 7


def test_the_price_file_overrides_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    yaml_file = tmp_path / "prices.yaml"
    yaml_file.write_text("asOf: '2026-07-01'\nclouds:\n  aws:\n    internet: 0.05\n")
    monkeypatch.setenv(PRICES_ENV, str(yaml_file))
    table = load_prices()
    assert table.as_of == "2026-07-01" and table.of("aws").internet == 0.05
    assert table.of("gcp") == DEFAULT_PRICES.of("gcp")

    json_file = tmp_path / "prices.json"
    json_file.write_text(json.dumps({"default": {"internet": 0.2}}))
    assert load_prices(json_file).default.internet == 0.2

    json_file.write_text("{not json")
    with pytest.raises(PriceError, match="not valid JSON"):
        load_prices(json_file)
    json_file.write_text(json.dumps({"clouds": {"aws": {"internet": -1}}}))
    with pytest.raises(PriceError, match=r"prices.json.*clouds.aws.internet"):
        load_prices(json_file)
    with pytest.raises(PriceError, match="cannot read"):
        load_prices(tmp_path / "missing.json")
    monkeypatch.delenv(PRICES_ENV)
    assert load_prices() is DEFAULT_PRICES


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"token=&organization="),  # no boundary
        ("multipart/form-data; boundary=zz", b"garbage"),
        ("application/x-www-form-urlencoded", b"\xff\xfe=%%"),
    ],
)
async def test_a_broken_sign_in_form_is_a_400_page_not_a_500(
    client: Client, content_type: str, body: bytes
) -> None:
    answer = await client.post("/usage", data=body, headers={"Content-Type": content_type})
    assert answer.status == 400
    assert "send the sign-in form as the usage page does" in await answer.text()
