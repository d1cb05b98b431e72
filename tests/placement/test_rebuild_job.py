"""``kubectl o41 admin rebuild`` makes its Job from the chart's own placement Deployment
(rendered by helm here): the service's image, service account, volumes and environment
(the etcd endpoints and TLS files, the buckets' credentials come with them), running the
rebuild instead of the service, with labels no Service selects and no probes."""

from __future__ import annotations

from o41.restore.rebuild import job_of
from test_chart import container, find, render


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_rebuild_job_is_the_placement_pod_running_the_rebuild() -> None:
    docs = render("etcd.tls.enabled=true")
    deployment = find(docs, "Deployment", "-placement")
    job = job_of(deployment, ["ml", "vision"], dry_run=True)
    pod = job["spec"]["template"]["spec"]
    (rebuilding,) = pod["containers"]
    service = container(deployment)
    args = rebuilding["args"]
    assert args[:3] == ["python", "-m", "o41.webhook.rebuild"]
    etcd = service["args"][service["args"].index("--etcd") + 1]
    assert args[args.index("--etcd") + 1] == etcd
    assert args[-5:] == ["--organization", "ml", "--organization", "vision", "--dry-run"]
    assert "--host" not in args and "--port" not in args
    assert (rebuilding["image"], rebuilding.get("env")) == (service["image"], service.get("env"))
    assert rebuilding.get("volumeMounts") == service.get("volumeMounts")
    spec = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == spec["serviceAccountName"]
    assert pod["volumes"] == spec["volumes"]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    for probe in ("readinessProbe", "livenessProbe", "startupProbe", "ports"):
        assert probe not in rebuilding
    # no Service of the chart sends traffic to the rebuild's pod
    labels = job["spec"]["template"]["metadata"]["labels"]
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert not selects(svc["spec"].get("selector") or {"-": "-"}, labels)
    assert not selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert job["metadata"]["namespace"] == deployment["metadata"]["namespace"]
