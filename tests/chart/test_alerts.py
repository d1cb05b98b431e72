"""The chart's monitoring, rendered: the PrometheusRule's alerts unit-tested with
``promtool test rules`` (the test bed's pinned promtool, hack/testbed-bin.sh), the Grafana
dashboard's ConfigMap, and the operator's metrics Service and ServiceMonitor. That the
queries name only exported metrics is tests/placement/test_metrics.py's (it scrapes both servers).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from test_chart import CHART, Doc, find, kinds, render, run_helm
from testbed.kube import bin_dir

TESTS = Path(__file__).parent / "alerts" / "o41-artifacts.test.yaml"
ALERTS = {
    "O41LocationNotReady",
    "O41OrganizationWithoutFallback",
    "O41AdmissionRefusingByFailure",
    "O41FallbackShareHigh",
    "O41StateStoreUnavailable",
    "O41EventualWritesDropped",
    "O41EtcdNoSpace",
    "O41EtcdDatabaseNearQuota",
    "O41EtcdSnapshotStale",
    "O41OperatorDown",
    "O41PlacementErrorsHigh",
    "O41PlacementLatencyHigh",
    "O41PlacementDown",
    "O41EtcdDown",
}


def promtool() -> Path:
    path = bin_dir() / "promtool"
    assert path.exists(), "promtool is built by `make bins` (hack/testbed-bin.sh promtool)"
    return path


def promtool_test(
    groups: list[Doc], tmp_path: Path, tests: Path = TESTS
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the unit tests ``tests`` on ``groups`` (as rules.yaml)."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(tests, tmp_path / tests.name)
    return subprocess.run(
        [promtool(), "test", "rules", tests.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


SELECTOR = re.compile(r"\b([a-z_:][a-z0-9_:]*)\{([^}]*)\}")


def assert_scoped(groups: list[Doc], namespace: str, job: str) -> None:
    """Each metric an expression reads is matched on ``namespace`` and a job the regex
    ``job`` finds in its matchers, and no metric of it is read bare."""
    for group in groups:
        for rule in group["rules"]:
            reads = SELECTOR.findall(rule["expr"])
            assert reads, rule["alert"]
            for metric, matchers in reads:
                assert f'namespace="{namespace}"' in matchers, (rule["alert"], metric)
                assert re.search(job, matchers), (rule["alert"], metric)
            names = set(re.findall(r"\b((?:o41|etcd|up)[a-z0-9_:]*)\b(?=\{|\[)", rule["expr"]))
            assert names <= {m for m, _ in reads}, rule["alert"]


def rule_groups(*sets: str) -> list[Doc]:
    (rule,) = [d for d in render("monitoring.prometheusRule.enabled=true", *sets)
               if d["kind"] == "PrometheusRule"]  # fmt: skip
    groups: list[Doc] = rule["spec"]["groups"]
    return groups


def test_monitoring_is_off_by_default() -> None:
    docs = render()
    assert "PrometheusRule" not in kinds(docs)
    assert "ServiceMonitor" not in kinds(docs)
    assert not [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]


def test_every_alert_passes_its_promtool_unit_tests(tmp_path: Path) -> None:
    done = promtool_test(rule_groups(), tmp_path)
    check = subprocess.run(
        [promtool(), "check", "rules", "rules.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    # every alert of the chart has a test that makes it fire, and one where it must not
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == ALERTS
    names = {r["alert"] for g in rule_groups() for r in g["rules"]}
    assert names == ALERTS


def test_a_broken_alert_fails_its_promtool_test(tmp_path: Path) -> None:
    """The unit tests do test: a threshold moved makes them fail."""
    groups = rule_groups("monitoring.prometheusRule.fallbackShare=1")  # never over 100%
    done = promtool_test(groups, tmp_path)
    assert done.returncode != 0
    assert "O41FallbackShareHigh" in done.stdout + done.stderr


def test_thresholds_come_from_values() -> None:
    done = run_helm(
        "template", "o41", str(CHART), "--set", "monitoring.prometheusRule.enabled=true",
        "--set", "monitoring.prometheusRule.notReadyFor=30m",
        "--set-json", "monitoring.prometheusRule.etcdQuotaShare=0.7",
        "--set", "monitoring.prometheusRule.labels.release=kube-prometheus",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (rule,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert rules["O41LocationNotReady"]["for"] == "30m"
    assert rules["O41OrganizationWithoutFallback"]["for"] == "30m"
    assert rules["O41EtcdDatabaseNearQuota"]["expr"].endswith("> 0.7")
    assert all(r["labels"]["severity"] in ("info", "warning", "critical") for r in rules.values())
    done = run_helm(
        "template", "o41", str(CHART), "--set", "monitoring.prometheusRule.enabled=true",
        "--set", "monitoring.prometheusRule.fallbackShare=2",
    )  # fmt: skip
    assert done.returncode != 0 and "fallbackShare" in done.stderr


def test_the_dashboard_is_a_configmap_grafana_sidecar_loads() -> None:
    docs = render("monitoring.dashboard.enabled=true", "monitoring.dashboard.namespace=grafana")
    config = find(docs, "ConfigMap", "-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["namespace"] == "grafana"
    (raw,) = config["data"].values()
    board = json.loads(raw)
    assert board["uid"] == "o41-artifacts"
    titles = [p["title"] for p in board["panels"]]
    assert len(titles) == len(set(titles))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"


def test_the_operator_metrics_service_and_monitor_meet() -> None:
    docs = render(
        "metrics.serviceMonitor.enabled=true",
        "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.team=monitoring",
    )
    service = find(docs, "Service", "-operator-metrics")
    monitor = find(docs, "ServiceMonitor", "-operator-metrics")
    operator = find(docs, "Deployment", "-operator")
    (c,) = operator["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9091, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert ports["metrics"] == 9091
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    webhook = find(docs, "Service", "-operator")
    assert not selector.items() <= webhook["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("metrics.operatorPort=8080", "metrics.operatorPort must differ"),
        ("metrics.operatorPort=9443", "metrics.operatorPort must differ"),
        ("monitoring.dashboard.enable=true", "monitoring/dashboard"),
    ],
)
def test_schema_and_template_refuse_bad_monitoring_values(bad: str, says: str) -> None:
    done = run_helm("template", "o41", str(CHART), "--set", bad)
    assert done.returncode != 0
    assert says in done.stderr


def test_every_rule_reads_only_this_releases_series() -> None:
    """Each metric an expression reads is matched on the release's namespace and one of its
    jobs; without that scope the cluster's own etcd (job="kube-etcd") at its quota fires
    O41EtcdNoSpace, as the promtool case below shows."""
    assert_scoped(rule_groups(), "o41-system", r'job=~?"o41-artifacts-')


def test_without_the_scope_the_clusters_own_etcd_would_page(tmp_path: Path) -> None:
    """The kube-etcd series of the unit tests are a real trap: matchers that let any job in
    make O41EtcdNoSpace and O41EtcdDatabaseNearQuota fire for them, so the cases fail."""
    groups = rule_groups('monitoring.prometheusRule.selectors.etcd=namespace=~".+"')
    done = promtool_test(groups, tmp_path)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "O41EtcdNoSpace" in out and "kube-etcd" in out
    assert "O41EtcdDatabaseNearQuota" in out


def test_each_alert_has_a_runbook_section_in_operations_md() -> None:
    headings = {
        line[4:].strip().lower()
        for line in (CHART.parents[1] / "docs" / "operations.md").read_text().splitlines()
        if line.startswith("### ")
    }
    base = "https://github.com/o41/o41-artifacts/blob/main/docs/operations.md#"
    for group in rule_groups():
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            assert url == base + rule["alert"].lower()
            assert rule["alert"].lower() in headings, f"no '### {rule['alert']}' section"
    custom = rule_groups("monitoring.prometheusRule.runbookBaseURL=https://wiki.example/o41/")
    urls = {r["annotations"]["runbook_url"] for g in custom for r in g["rules"]}
    assert "https://wiki.example/o41#o41etcdnospace" in urls


def test_with_an_external_etcd_the_rules_read_no_etcd_member() -> None:
    groups = rule_groups("etcd.external.endpoints[0]=http://etcd.db.svc:2379")
    names = {r["alert"] for g in groups for r in g["rules"]}
    assert names == ALERTS - {"O41EtcdDatabaseNearQuota", "O41EtcdDown"}
    assert not [r for g in groups for r in g["rules"] if "etcd_mvcc" in r["expr"]]
