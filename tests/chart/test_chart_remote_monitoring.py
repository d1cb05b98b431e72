"""The o41-remote chart's monitoring of its collections tier, rendered: ServiceMonitors for
the tier and its etcd that meet their Services' metrics ports, and a PrometheusRule whose
O41Tier* alerts pass ``promtool test rules`` (tests/chart/alerts/o41-remote.test.yaml), read
only this release's series and each have a runbook in docs/operations.md. That their
metric names are what a real tier and etcd export is tests/collections/test_collections_tier.py's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from test_alerts import assert_scoped, promtool, promtool_test
from test_chart import REPO, run_helm
from test_chart_remote_tier import ETCD, ON, TIER, Doc, one, render

TESTS = Path(__file__).parent / "alerts" / "o41-remote.test.yaml"
ALERTS = {
    "O41TierErrorsHigh",
    "O41TierDown",
    "O41TierStateStoreUnavailable",
    "O41TierEventualWritesDropped",
    "O41TierEtcdNoSpace",
    "O41TierEtcdDatabaseNearQuota",
    "O41TierEtcdDown",
}
SCRAPERS = "collections.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring"


def sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def rule_groups(*values: str, more: tuple[str, ...] = ()) -> list[Doc]:
    """The rendered rules, with ``--set`` of ``values`` and the helm flags ``more``."""
    docs = render(*ON, *sets("collections.prometheusRule.enabled=true", *values), *more)
    groups: list[Doc] = one(docs, "PrometheusRule", TIER)["spec"]["groups"]
    return groups


def test_off_by_default_even_with_the_tier_and_lint_clean_when_on() -> None:
    kinds = {d["kind"] for d in render(*ON)}
    assert kinds.isdisjoint({"ServiceMonitor", "PrometheusRule"})
    on = sets("collections.serviceMonitor.enabled=true", SCRAPERS)
    on += sets("collections.prometheusRule.enabled=true")
    lint = run_helm("lint", "--strict", str(REPO / "charts" / "o41-remote"), *ON, *on)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_every_alert_passes_its_promtool_unit_tests(tmp_path: Path) -> None:
    groups = rule_groups()
    done = promtool_test(groups, tmp_path, TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    check = subprocess.run(
        [promtool(), "check", "rules", "rules.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout
    # every alert has a case that makes it fire, and the rule names are the documented ones
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == ALERTS
    assert {r["alert"] for g in groups for r in g["rules"]} == ALERTS


@pytest.mark.parametrize(
    ("flags", "alert"),
    [
        (("--set", "collections.prometheusRule.errorRatio=1"), "O41TierErrorsHigh"),  # > 100%
        (("--set-json", "collections.prometheusRule.etcdQuotaShare=0.9"),
         "O41TierEtcdDatabaseNearQuota"),
        (("--set", "collections.prometheusRule.targetDownFor=30m"), "O41TierDown"),
    ],
)  # fmt: skip
def test_a_moved_threshold_fails_its_promtool_test(
    flags: tuple[str, str], alert: str, tmp_path: Path
) -> None:
    """The unit tests do test: the thresholds come from values, and one moved fails them."""
    done = promtool_test(rule_groups(more=flags), tmp_path, TESTS)
    assert done.returncode != 0
    assert alert in done.stdout + done.stderr


def test_every_rule_reads_only_this_releases_series() -> None:
    assert_scoped(rule_groups(), "ml", rf'job="({TIER}|{ETCD})"')


def test_scraped_another_way_the_selectors_replace_the_jobs(tmp_path: Path) -> None:
    groups = rule_groups(
        'collections.prometheusRule.selectors.tier=app="tier"',
        'collections.prometheusRule.selectors.etcd=app="tier-etcd"',
    )
    exprs = [r["expr"] for g in groups for r in g["rules"]]
    assert all("job=" not in e for e in exprs)
    assert any('up{app="tier-etcd"}' in e for e in exprs)
    assert any('o41_http_requests_total{app="tier",status=~"5.."}' in e for e in exprs)
    # the unit tests' series carry the default jobs: with other selectors nothing fires
    assert promtool_test(groups, tmp_path, TESTS).returncode != 0


def test_each_alert_has_a_runbook_section_in_operations_md() -> None:
    headings = {
        line[4:].strip().lower()
        for line in (REPO / "docs" / "operations.md").read_text().splitlines()
        if line.startswith("### ")
    }
    base = "https://github.com/o41/o41-artifacts/blob/main/docs/operations.md#"
    for group in rule_groups("collections.prometheusRule.labels.release=kube-prometheus"):
        for rule in group["rules"]:
            assert rule["annotations"]["runbook_url"] == base + rule["alert"].lower()
            assert rule["alert"].lower() in headings, f"no '### {rule['alert']}' section"
            assert rule["labels"]["severity"] in ("info", "warning", "critical")
    custom = rule_groups("collections.prometheusRule.runbookBaseURL=https://wiki.example/o41/")
    urls = {r["annotations"]["runbook_url"] for g in custom for r in g["rules"]}
    assert "https://wiki.example/o41#o41tierdown" in urls


def test_the_service_monitors_meet_the_tier_and_etcd_services() -> None:
    on = "collections.serviceMonitor.enabled=true"
    docs = render(*ON, *sets(on, SCRAPERS, "collections.serviceMonitor.labels.release=kube-p"))
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sorted(m["metadata"]["name"] for m in monitors) == sorted([TIER, ETCD])
    for monitor in monitors:
        service = one(docs, "Service", monitor["metadata"]["name"])
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
        # the selector picks this Service only (the tier's and etcd's differ by component)
        others = [d for d in docs if d["kind"] == "Service" and d is not service]
        assert not [o for o in others if selector.items() <= o["metadata"]["labels"].items()]
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
        assert monitor["metadata"]["labels"]["release"] == "kube-p"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # the NetworkPolicies let the scrapers in on both metrics ports
    scrapers = [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]
    for name, port in {TIER: 9090, ETCD: 2381}.items():
        ingress = one(docs, "NetworkPolicy", name)["spec"]["ingress"]
        (rule,) = [r for r in ingress if {"port": port, "protocol": "TCP"} in r["ports"]]
        assert rule["from"] == scrapers


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("serviceMonitor.enabled=true", "name the scrapers in collections.networkPolicy"),
        ("prometheusRule.errorRatio=2", "/collections/prometheusRule/errorRatio"),
        ("prometheusRule.targetDownFor=soon", "/collections/prometheusRule/targetDownFor"),
        ("prometheusRule.runbook=x", "additional properties 'runbook' not allowed"),
    ],
)
def test_bad_monitoring_values_are_refused_with_what_to_set(value: str, said: str) -> None:
    remote = str(REPO / "charts" / "o41-remote")
    done = run_helm("template", "w", remote, *ON, "--set", f"collections.{value}")
    assert done.returncode != 0 and said in done.stderr, done.stderr
