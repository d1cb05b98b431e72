"""``kubectl o41 admin rebuild``: etcd's index of versions rebuilt from the buckets'
record (docs/operations.md, "Rebuild from the buckets").

The rebuild needs what the placement service has: the buckets' credentials, the etcd
endpoints and its TLS files. So it runs as a Job made from the chart's placement
Deployment (its image, service account, volumes and environment), running ``python -m
o41.webhook.rebuild`` instead of the service, with labels of its own (no Service selects
its pod). This command makes the Job, waits for it and prints its log; its exit status is
the rebuild's (1: a location could not be read, run again once it answers).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from o41.restore.admin import Cluster, RestoreError, _selector, wait

Say = Callable[[str], None]
KEEP_FINISHED = 24 * 3600  # seconds a finished Job (and its log) stays for a look


def job_of(
    deployment: dict[str, Any], organizations: list[str], *, dry_run: bool
) -> dict[str, Any]:
    """The rebuild Job made from the placement Deployment ``deployment`` (a plain dict)."""
    meta = deployment["metadata"]
    release = meta["labels"].get("app.kubernetes.io/instance", "o41")
    template = copy.deepcopy(deployment["spec"]["template"])
    spec = template["spec"]
    container = spec["containers"][0]
    args = list(container.get("args") or [])
    keep = {"--etcd", "--secrets-namespace"}
    taken = [v for i, a in enumerate(args) if a in keep for v in (a, args[i + 1])]
    container["args"] = [
        "python", "-m", "o41.webhook.rebuild", *taken,
        *(a for o in organizations for a in ("--organization", o)),
        *(["--dry-run"] if dry_run else []),
    ]  # fmt: skip
    for probe in ("readinessProbe", "livenessProbe", "startupProbe", "ports"):
        container.pop(probe, None)
    spec["containers"] = [container]
    spec["restartPolicy"] = "Never"
    labels = {
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/part-of": "o41",
        "app.kubernetes.io/component": "rebuild",
    }
    template["metadata"] = {"labels": labels}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{release}-rebuild-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}",
            "namespace": meta["namespace"],
            "labels": labels,
        },
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": KEEP_FINISHED, "template": template},
    }


def rebuild(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    release: str,
    organizations: list[str],
    dry_run: bool,
    say: Say,
    timeout: float,
) -> int:
    """Run the rebuild Job and print its log: its exit status."""
    from kubernetes import client, config

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except config.ConfigException as e:
        raise RestoreError(f"no usable kubeconfig: {e}") from None
    cluster = Cluster(api)
    batch: Any = client.BatchV1Api(api)
    try:
        found = cluster.apps.list_namespaced_deployment(
            namespace, label_selector=_selector(release, "placement")
        ).items
    except client.ApiException as e:
        raise RestoreError(_refused(e, namespace)) from None
    if not found:
        raise RestoreError(
            f"no placement Deployment of release {release} in namespace {namespace}: check "
            "--release and --namespace"
        )
    job = job_of(cluster.plain(found[0]), organizations, dry_run=dry_run)
    name = job["metadata"]["name"]
    try:
        batch.create_namespaced_job(namespace, job)
    except client.ApiException as e:
        raise RestoreError(_refused(e, namespace)) from None
    say(f"job {namespace}/{name}: rebuilding{' (dry run)' if dry_run else ''}")
    selector = f"job-name={name}"

    def finished() -> bool:
        status = batch.read_namespaced_job_status(name, namespace).status
        return bool(status.succeeded or status.failed)

    wait(finished, timeout, f"job {name} to finish")
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
    if not pods:
        raise RestoreError(
            f"job {name} finished without a pod: kubectl -n {namespace} describe job {name}"
        )
    pod = pods[0]
    for line in cluster.core.read_namespaced_pod_log(pod.metadata.name, namespace).splitlines():
        say(line)
    terminated = pod.status.container_statuses[0].state.terminated
    return int(terminated.exit_code) if terminated is not None else 1


def _refused(e: Any, namespace: str) -> str:
    if e.status == 403:
        return (
            f"forbidden: a rebuild needs a platform admin's access to namespace {namespace} "
            "(Deployments, Jobs, Pods and their logs)"
        )
    return f"the API server refused: {e.status} {e.reason}"
