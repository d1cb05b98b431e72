"""``kubectl o41 admin restore``: the chart's etcd StatefulSet restored from one snapshot.

With a platform admin's kubeconfig: find the snapshot in the backup organization's
locations (every one of them, not only the fallback in force: the fallback can move), make
a Secret with a signed GET URL of it and its SHA-256, scale the StatefulSet to 0, delete
its claims, add the restore step (an init container on the app image, which carries
etcdutl: ``o41.restore.member``) and scale it back, wait for every member Ready, take the
step out again (one rolling restart of the members, on their restored data), delete the
Secret, wait for the service's /healthz. Without ``--yes`` it prints the plan and changes
nothing.

Why the step is added for the restore only, not kept in the chart: an init container on
the app image would tie etcd's pod template to the app's tag, and every upgrade of the
app would roll the etcd members (a leader change under writes each time).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from o41.kube.locations import Location, read_location
from o41.state.snapshot import (
    PREFIX,
    Snapshot,
    SnapshotError,
    newest_first,
    parse_key,
    sidecar_key,
)
from o41.storage import Bucket, StorageError, open_bucket

GROUP, VERSION = "artifacts.o41.io", "v1alpha1"
STEP = "o41-restore"  # the init container's and its Secret volume's name
REQUEST = "/etc/o41-restore"  # where the step reads the Secret
JSON_PATCH = "application/json-patch+json"
URL_EXPIRES = 6 * 3600  # the members fetch it while the StatefulSet comes back
Say = Callable[[str], None]


class RestoreError(Exception):
    """A restore that cannot go on; the message says what to do."""


@dataclass(frozen=True)
class Found:
    location: str
    snapshot: Snapshot
    bucket: Bucket


@dataclass(frozen=True)
class Release:
    namespace: str
    name: str
    statefulset: dict[str, Any]
    organization: str
    image: str = ""  # the app's (the placement service's): it carries etcdutl
    pull: str = "IfNotPresent"

    @property
    def etcd(self) -> str:
        return str(self.statefulset["metadata"]["name"])

    @property
    def replicas(self) -> int:
        return int(self.statefulset["spec"].get("replicas") or 1)

    @property
    def secret(self) -> str:
        return f"{self.etcd}-restore"

    @property
    def selector(self) -> str:
        labels = self.statefulset["spec"]["selector"]["matchLabels"]
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    def claims(self) -> list[str]:
        templates = self.statefulset["spec"].get("volumeClaimTemplates") or []
        return [
            f"{t['metadata']['name']}-{self.etcd}-{i}"
            for t in templates
            for i in range(self.replicas)
        ]


def restore_step(statefulset: dict[str, Any], image: str, pull: str) -> dict[str, Any]:
    """The init container that restores a member: etcd's own cluster flags (read from
    the etcd container, so they are the chart's exactly), the app image, the etcd
    container's security context and resources, its data volume and the Secret."""
    etcd = statefulset["spec"]["template"]["spec"]["containers"][0]
    flags = dict(a.split("=", 1) for a in etcd.get("args") or [] if a.startswith("--") and "=" in a)
    wanted = ("--data-dir", "--initial-cluster", "--initial-cluster-token",
              "--initial-advertise-peer-urls")  # fmt: skip
    missing = [f for f in wanted if f not in flags]
    if missing:
        raise RestoreError(f"the etcd container has no {', '.join(missing)}: not the chart's?")
    data = flags["--data-dir"]
    mounts = [m for m in etcd.get("volumeMounts") or [] if data.startswith(m["mountPath"])]
    if not mounts:
        raise RestoreError(f"no volume of the etcd container holds its data dir {data}")
    return {
        "name": STEP,
        "image": image,
        "imagePullPolicy": pull,
        "command": ["python", "-m", "o41.restore.member"],
        "args": ["--name=$(POD_NAME)", f"--request={REQUEST}"]
        + [f"{f}={flags[f]}" for f in wanted],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": etcd.get("resources") or {},
        "securityContext": etcd.get("securityContext") or {},
        "volumeMounts": [
            {"name": mounts[0]["name"], "mountPath": mounts[0]["mountPath"]},
            {"name": STEP, "mountPath": REQUEST, "readOnly": True},
        ],
    }


def add_step(release: Release, step: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch: the step in, and the StatefulSet back to its replicas."""
    pod = release.statefulset["spec"]["template"]["spec"]
    volume = {"name": STEP, "secret": {"secretName": release.secret, "defaultMode": 0o440}}
    ops: list[dict[str, Any]] = []
    for field, value in (("initContainers", step), ("volumes", volume)):
        if pod.get(field):
            ops.append({"op": "add", "path": f"/spec/template/spec/{field}/-", "value": value})
        else:
            ops.append({"op": "add", "path": f"/spec/template/spec/{field}", "value": [value]})
    ops.append({"op": "replace", "path": "/spec/replicas", "value": release.replicas})
    return ops


def remove_step(live: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch taking the step out of the StatefulSet as it is now (each removal
    guarded by a test of the name at that index)."""
    pod = live["spec"]["template"]["spec"]
    ops: list[dict[str, Any]] = []
    for field in ("initContainers", "volumes"):
        for i, item in reversed(list(enumerate(pod.get(field) or []))):
            if item.get("name") == STEP:
                path = f"/spec/template/spec/{field}/{i}"
                ops += [{"op": "test", "path": f"{path}/name", "value": STEP},
                        {"op": "remove", "path": path}]  # fmt: skip
    return ops


class Cluster:
    """The Kubernetes calls a restore makes (plain dicts out)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.api = api
        # Any: the client's models are typed with every field optional; these calls read
        # objects the API server filled in
        self.apps: Any = client.AppsV1Api(api)
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    def plain(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)


def _selector(release: str, component: str) -> str:
    return f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"


def find_release(
    cluster: Cluster, namespace: str, release: str, organization: str | None
) -> Release:
    found = cluster.apps.list_namespaced_stateful_set(
        namespace, label_selector=_selector(release, "etcd")
    ).items
    if len(found) != 1:
        raise RestoreError(
            f"no etcd StatefulSet of release {release} in namespace {namespace}: check "
            "--release and --namespace; if it was deleted, make it again first (helm upgrade "
            f"{release} ... --reuse-values), then run this again (an external etcd is "
            "restored with its own tools)"
        )
    statefulset = cluster.plain(found[0])
    placement = cluster.apps.list_namespaced_deployment(
        namespace, label_selector=_selector(release, "placement")
    ).items
    if not placement:
        raise RestoreError(
            f"no placement Deployment of release {release} in namespace {namespace}: its "
            "image (which carries etcdutl) restores the members"
        )
    service = placement[0].spec.template.spec.containers[0]
    args = list(service.args or [])
    if not organization and "--backup-organization" in args:
        organization = str(args[args.index("--backup-organization") + 1])
    if not organization:
        raise RestoreError(
            f"release {release} takes no backups (backup.organization is empty), so there "
            "is no snapshot to restore; name the organization that holds them with "
            "--organization"
        )
    pull = str(service.image_pull_policy or "IfNotPresent")
    return Release(namespace, release, statefulset, organization, str(service.image), pull)


def locations_of(cluster: Cluster, organization: str) -> list[Location]:
    from kubernetes.client.exceptions import ApiException

    try:
        listed = cluster.custom.list_cluster_custom_object(GROUP, VERSION, "locations")
    except ApiException as e:
        if e.status != 404:
            raise
        raise RestoreError(
            "this cluster has no Locations (the chart's CRDs are not installed): "
            "check --kubeconfig and --context"
        ) from None
    return [
        read_location(obj)
        for obj in listed.get("items", [])
        if (obj.get("spec") or {}).get("organization") == organization
    ]


def _credentials(cluster: Cluster, namespace: str, location: Location) -> dict[str, str] | None:
    name = location.credentials_secret
    if not name:
        return None
    secret = cluster.core.read_namespaced_secret(name, namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def find_snapshot(
    cluster: Cluster, release: Release, wanted: str, say: Say, opener: Any = open_bucket
) -> Found:
    """The snapshot ``wanted`` (a key, its file name, or ``latest``) in any location of
    the backup organization; a location that cannot be read is said and skipped."""
    locations = locations_of(cluster, release.organization)
    if not locations:
        raise RestoreError(
            f"organization {release.organization} (backup.organization) has no Location: "
            "no snapshot can be there"
        )
    candidates: list[tuple[str, str, Bucket]] = []
    for location in locations:
        try:
            ref = location.bucket(_credentials(cluster, release.namespace, location))
            bucket = opener(ref)
            keys = newest_first(list(bucket.list_under(PREFIX)))
        except StorageError as e:
            say(f"location {location.name}: cannot list its snapshots ({e}); skipped")
            continue
        candidates += [(k, location.name, bucket) for k in keys]
    if not candidates:
        raise RestoreError(
            f"no snapshot in the locations of organization {release.organization} "
            f"({', '.join(sorted(v.name for v in locations))}): none was taken yet "
            "(see o41_etcd_snapshot_failures_total and the placement service's log)"
        )
    candidates.sort(key=lambda c: parse_key(c[0]) or (0.0, 0), reverse=True)
    if wanted == "latest":
        chosen = [candidates[0]]
    else:
        chosen = [c for c in candidates if wanted in (c[0], c[0].removeprefix(PREFIX))]
    if not chosen:
        newest = ", ".join(c[0].removeprefix(PREFIX) for c in candidates[:5])
        raise RestoreError(f"no snapshot {wanted!r}; the newest are: {newest}")
    key, where, bucket = chosen[0]
    try:
        sidecar = bucket.get(sidecar_key(key))
    except StorageError as e:
        raise RestoreError(f"location {where}: cannot read {sidecar_key(key)}: {e}") from None
    if sidecar is None:
        raise RestoreError(f"snapshot {key} has no sidecar: its upload never finished")
    try:
        return Found(where, Snapshot.from_json(sidecar, key), bucket)
    except SnapshotError as e:
        raise RestoreError(str(e)) from None


def plan(release: Release, found: Found) -> list[str]:
    s = found.snapshot
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s.taken))
    return [
        f"snapshot {s.key} in location {found.location} (organization {release.organization})",
        f"  taken {when}, etcd revision {s.revision}, {s.size} bytes, etcd {s.etcd_version}",
        f"restore plan for StatefulSet {release.namespace}/{release.etcd} "
        f"({release.replicas} members):",
        f"  1. make Secret {release.secret} (a signed URL of the snapshot, its SHA-256)",
        f"  2. scale {release.etcd} to 0 and wait for its pods to go",
        f"  3. delete its claims: {', '.join(release.claims()) or '(none: no persistence)'}",
        f"  4. add the restore step (init container {STEP}, image {release.image}) and "
        f"scale it back to {release.replicas}: each member restores from the snapshot",
        f"  5. wait for every member Ready; take the step out (the members restart once on "
        f"their data); delete {release.secret}; wait for the service's /healthz",
        "Everything etcd took after the snapshot is lost: the rebuild from the buckets "
        "recovers versions written since (docs/operations.md).",
    ]


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RestoreError(f"{what} did not happen in {timeout:.0f} s")
        time.sleep(1.0)


def execute(cluster: Cluster, release: Release, found: Found, say: Say, timeout: float) -> None:
    """Steps 1-5 of the plan."""
    from kubernetes.client.exceptions import ApiException

    ns, s = release.namespace, found.snapshot
    signed = found.bucket.presign_get(s.key, expires=URL_EXPIRES)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": release.secret, "labels": {"app.kubernetes.io/part-of": "o41"}},
        "stringData": {
            "url": signed.url, "sha256": s.sha256, "key": s.key, "revision": str(s.revision),
        },
    }  # fmt: skip
    try:
        cluster.core.create_namespaced_secret(ns, secret)
    except ApiException as e:
        if e.status != 409:
            raise
        cluster.core.replace_namespaced_secret(release.secret, ns, secret)
    say(f"made Secret {release.secret}")
    scale(cluster, release, 0)
    wait(lambda: not pods(cluster, release), timeout, f"the pods of {release.etcd} to go")
    say(f"scaled {release.etcd} to 0")
    for claim in release.claims():
        try:
            cluster.core.delete_namespaced_persistent_volume_claim(claim, ns)
        except ApiException as e:
            if e.status != 404:
                raise
    wait(lambda: not claims_left(cluster, release), timeout, "the claims to be deleted")
    say(f"deleted claims {', '.join(release.claims()) or '(none)'}")
    step = restore_step(release.statefulset, release.image, release.pull)
    cluster.apps.patch_namespaced_stateful_set(
        release.etcd, ns, add_step(release, step), _content_type=JSON_PATCH
    )
    say(f"scaled {release.etcd} to {release.replicas} with the restore step")
    wait(lambda: ready(cluster, release), timeout, f"every member of {release.etcd} Ready")
    say("every member restored and Ready")
    live = cluster.plain(cluster.apps.read_namespaced_stateful_set(release.etcd, ns))
    cluster.apps.patch_namespaced_stateful_set(
        release.etcd, ns, remove_step(live), _content_type=JSON_PATCH
    )
    wait(lambda: rolled(cluster, release), timeout, f"{release.etcd} without the restore step")
    cluster.core.delete_namespaced_secret(release.secret, ns)
    say(f"took the restore step out (members restarted on their data); deleted {release.secret}")
    wait(lambda: healthy(cluster, release), timeout, "the placement service's /healthz")
    say("the placement service answers /healthz")


def scale(cluster: Cluster, release: Release, replicas: int) -> None:
    cluster.apps.patch_namespaced_stateful_set_scale(
        release.etcd,
        release.namespace,
        {"spec": {"replicas": replicas}},
        _content_type="application/merge-patch+json",
    )


def pods(cluster: Cluster, release: Release) -> list[Any]:
    items: list[Any] = cluster.core.list_namespaced_pod(
        release.namespace, label_selector=release.selector
    ).items
    return items


def claims_left(cluster: Cluster, release: Release) -> bool:
    names = {
        c.metadata.name
        for c in cluster.core.list_namespaced_persistent_volume_claim(release.namespace).items
    }
    return bool(names & set(release.claims()))


def rolled(cluster: Cluster, release: Release) -> bool:
    """Every member on the StatefulSet's current template, and Ready."""
    found = cluster.apps.read_namespaced_stateful_set(release.etcd, release.namespace)
    status = found.status
    return (
        status.observed_generation == found.metadata.generation
        and status.current_revision == status.update_revision
        and int(status.updated_replicas or 0) == release.replicas
        and int(status.ready_replicas or 0) == release.replicas
    )


def ready(cluster: Cluster, release: Release) -> bool:
    status = cluster.apps.read_namespaced_stateful_set(release.etcd, release.namespace).status
    return int(status.ready_replicas or 0) == release.replicas


def healthy(cluster: Cluster, release: Release) -> bool:
    """/healthz of the placement Service, through the API server's service proxy."""
    from kubernetes.client.exceptions import ApiException

    services = cluster.core.list_namespaced_service(
        release.namespace, label_selector=_selector(release.name, "placement")
    ).items
    for service in services:
        port = service.spec.ports[0]
        scheme = "https" if port.name == "https" else "http"
        try:
            cluster.core.connect_get_namespaced_service_proxy_with_path(
                f"{scheme}:{service.metadata.name}:{port.port}", release.namespace, "healthz"
            )
        except ApiException:
            continue
        else:
            return True
    return False


API_ERRORS = {
    403: "forbidden: a restore needs a platform admin's kubeconfig (the chart's namespace: "
    "StatefulSets, claims, Secrets; Locations)",
    401: "unauthorized: the kubeconfig's credentials were refused",
}


def restore(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    release: str,
    snapshot: str,
    organization: str | None,
    yes: bool,
    say: Say,
    timeout: float = 600.0,
) -> Snapshot | None:
    """The whole command: the snapshot restored (None: only the plan was printed).
    RestoreError, with what to do, for every failure."""
    import urllib3
    from kubernetes import config
    from kubernetes.client.exceptions import ApiException

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except Exception as e:  # no kubeconfig, or a broken one
        raise RestoreError(f"cannot load the kubeconfig: {e}") from None
    try:
        cluster = Cluster(api)
        found_release = find_release(cluster, namespace, release, organization)
        found = find_snapshot(cluster, found_release, snapshot, say)
        for line in plan(found_release, found):
            say(line)
        if not yes:
            say("nothing done: run again with --yes to restore")
            return None
        execute(cluster, found_release, found, say, timeout)
    except ApiException as e:
        why = API_ERRORS.get(e.status, e.reason)
        raise RestoreError(f"the API server answered {e.status}: {why}") from None
    except (OSError, urllib3.exceptions.HTTPError) as e:
        raise RestoreError(f"cannot reach the API server: {e}") from None
    finally:
        api.close()
    return found.snapshot
