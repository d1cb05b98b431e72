"""The chart's production knobs (issue 42, point 4), rendered and, where the API server is
the judge, installed on the test bed: security contexts as values (the fixed UID, GID and
fsGroup can be unset, as OpenShift's restricted SCC wants, and Pod Security "restricted"
still admits the pods), topologySpreadConstraints per component, PDBs, priorityClassName,
extraArgs, extra volumes and mounts, ServiceAccounts of one's own, probe timings, and the
objects' names (a release named o41 gives o41-artifacts-*, not o41-o41-artifacts-*).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from test_chart import CHART, Doc, find, render, run_helm
from test_chart_install import Release
from testbed.kube import Kube

from support import wait_for

COMPONENTS = {"operator": "Deployment", "placement": "Deployment", "etcd": "StatefulSet"}
OPENSHIFT = (
    "podSecurityContext.runAsUser=null",
    "podSecurityContext.runAsGroup=null",
    "podSecurityContext.fsGroup=null",
)


def workloads(docs: list[Doc]) -> dict[str, Doc]:
    return {c: find(docs, kind, f"-{c}") for c, kind in COMPONENTS.items()}


def pod(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "sets", "prefix"),
    [
        ("o41", (), "o41-artifacts"),
        ("o41-artifacts", (), "o41-artifacts"),
        ("team-a", (), "team-a-o41-artifacts"),
        ("o41", ("fullnameOverride=o41-o41-artifacts",), "o41-o41-artifacts"),
        ("o41", ("fullnameOverride=storage",), "storage"),
    ],
)
def test_names_do_not_repeat_the_release(release: str, sets: tuple[str, ...], prefix: str) -> None:
    docs = render(*sets, release=release)
    names = {c: w["metadata"]["name"] for c, w in workloads(docs).items()}
    assert names == {c: f"{prefix}-{c}" for c in COMPONENTS}
    assert find(docs, "Service", "-placement")["metadata"]["name"] == f"{prefix}-placement"


# --- security contexts --------------------------------------------------------------------


def test_security_contexts_default_to_the_images_user() -> None:
    for w in workloads(render()).values():
        ctx = pod(w)["securityContext"]
        assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (10001, 10001, 10001)
        for c in pod(w)["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_an_openshift_like_context_leaves_the_ids_to_the_platform() -> None:
    docs = render(*OPENSHIFT, "containerSecurityContext.seccompProfile=null")
    for w in workloads(docs).values():
        ctx = pod(w)["securityContext"]
        assert ctx == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        for c in pod(w)["containers"]:
            assert "seccompProfile" not in c["securityContext"]
            assert c["securityContext"]["readOnlyRootFilesystem"] is True


# --- scheduling, disruption, arguments, volumes, probes -----------------------------------


def test_spread_priority_args_volumes_and_probes_per_component() -> None:
    sets = []
    for c in COMPONENTS:
        sets += [
            f"{c}.topologySpreadConstraints[0].maxSkew=1",
            f"{c}.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            f"{c}.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
            f"{c}.priorityClassName=o41-critical",
            f"{c}.extraArgs[0]=--extra-{c}",
            f"{c}.extraVolumes[0].name=corp-ca",
            f"{c}.extraVolumes[0].configMap.name=corp-ca",
            f"{c}.extraVolumeMounts[0].name=corp-ca",
            f"{c}.extraVolumeMounts[0].mountPath=/etc/corp-ca",
            f"{c}.livenessProbe.timeoutSeconds=17",
            f"{c}.readinessProbe.periodSeconds=11",
        ]
    docs = render(*sets, "etcd.pdb.maxUnavailable=2", "etcd.replicas=5")
    for c, w in workloads(docs).items():
        spec = pod(w)
        (spread,) = spec["topologySpreadConstraints"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"
        # the component's own pods, as the workload selects them
        assert spread["labelSelector"]["matchLabels"] == w["spec"]["selector"]["matchLabels"]
        assert spec["priorityClassName"] == "o41-critical"
        (container,) = spec["containers"]
        assert container["args"][-1] == f"--extra-{c}"
        assert {"name": "corp-ca", "configMap": {"name": "corp-ca"}} in spec["volumes"]
        assert {"name": "corp-ca", "mountPath": "/etc/corp-ca"} in container["volumeMounts"]
        assert container["livenessProbe"]["timeoutSeconds"] == 17
        assert container["readinessProbe"]["periodSeconds"] == 11
        assert "httpGet" in container["livenessProbe"] and "httpGet" in container["readinessProbe"]
    assert find(docs, "PodDisruptionBudget", "-etcd")["spec"]["maxUnavailable"] == 2


def test_a_spread_that_names_its_pods_is_kept() -> None:
    docs = render(
        "etcd.topologySpreadConstraints[0].maxSkew=1",
        "etcd.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
        "etcd.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "etcd.topologySpreadConstraints[0].labelSelector.matchLabels.mine=yes",
    )
    (spread,) = pod(find(docs, "StatefulSet", "-etcd"))["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": {"mine": "yes"}}
    assert "topologySpreadConstraints" not in pod(find(render(), "StatefulSet", "-etcd"))


def test_probe_timings_are_checked_by_the_schema() -> None:
    done = run_helm("template", "o41", str(CHART), "--set", "operator.livenessProbe.exec=x")
    assert done.returncode != 0 and "livenessProbe" in done.stderr


# --- ServiceAccounts ---------------------------------------------------------------------


def test_service_accounts_of_ones_own() -> None:
    docs = render(
        "serviceAccounts.placement.create=false",
        "serviceAccounts.placement.name=platform-placement",
        "serviceAccounts.operator.name=o41-operator-sa",
    )
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts == {"o41-operator-sa", "o41-artifacts-etcd"}
    w = workloads(docs)
    assert pod(w["placement"])["serviceAccountName"] == "platform-placement"
    assert pod(w["operator"])["serviceAccountName"] == "o41-operator-sa"
    bound = {
        (d["metadata"]["name"], s["name"])
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in d["subjects"]
    }
    assert {s for _, s in bound} == {"platform-placement", "o41-operator-sa"}
    assert pod(w["etcd"])["automountServiceAccountToken"] is False
    (etcd_sa,) = [
        d for d in docs if d["kind"] == "ServiceAccount" and "etcd" in d["metadata"]["name"]
    ]
    assert etcd_sa["automountServiceAccountToken"] is False


def test_no_service_account_made_and_none_named_is_refused() -> None:
    done = run_helm(
        "template", "o41", str(CHART), "--set", "serviceAccounts.operator.create=false"
    )  # fmt: skip
    assert done.returncode != 0
    assert "serviceAccounts.operator.create is false" in done.stderr


# --- on the test bed's API server ----------------------------------------------------------


def restricted_namespace(kube: Kube) -> str:
    namespace = f"o41-restricted-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    kube.kubectl(
        "label", "namespace", namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    return namespace


def install(rel: Release, *sets: str, check: bool = True) -> str:
    argv = ["install", rel.name, str(CHART), "--namespace", rel.namespace]
    for s in ("etcd.persistence.enabled=false", *sets):
        argv += ["--set", s]
    done = rel.helm(*argv, check=check)
    return done.stdout + done.stderr


@pytest.mark.kube
def test_an_openshift_like_context_is_admitted_by_pod_security_restricted(
    kube: Kube, tmp_path: Path
) -> None:
    """Pod Security "restricted" enforced on the namespace: the pods without fixed IDs are
    admitted and become Ready; the same chart with privilege escalation allowed is refused
    with the API server's own message."""
    namespace = restricted_namespace(kube)
    rel = Release(kube, "o41", namespace, tmp_path)
    try:
        out = install(rel, *OPENSHIFT)
        assert "STATUS: deployed" in out
        rel.wait_ready("the pods without fixed IDs, under Pod Security restricted")
        pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
        assert len(pods) == 1 + 2 + 3
        for p in pods:
            assert "runAsUser" not in p["spec"]["securityContext"]
            assert "fsGroup" not in p["spec"]["securityContext"]
    finally:
        rel.helm("uninstall", "o41", "--namespace", namespace, check=False)

    bad = Release(kube, "bad", namespace, tmp_path)
    try:
        install(bad, "containerSecurityContext.allowPrivilegeEscalation=true")

        def refused() -> str:
            events = kube.kubectl(
                "get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate",
                "-o", "jsonpath={.items[*].message}",
            )  # fmt: skip
            return events if "violates PodSecurity" in events else ""

        message = wait_for(refused, timeout=60, what="Pod Security to refuse the pods")
        assert 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in (
            message
        )
        assert not json.loads(
            kube.kubectl("get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=bad",
                         "-o", "json")
        )["items"]  # fmt: skip
    finally:
        bad.helm("uninstall", "bad", "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.kube
def test_an_upgrade_that_would_rename_a_release_is_refused(kube: Kube, tmp_path: Path) -> None:
    """A release installed with the old names (o41-o41-artifacts-*, made here by the
    override those releases keep) is not upgraded into new objects beside its etcd."""
    namespace = f"o41-rename-{uuid.uuid4().hex[:6]}"
    rel = Release(kube, "o41", namespace, tmp_path)
    try:
        rel.helm(
            "install", "o41", str(CHART), "--namespace", namespace, "--create-namespace",
            "--set", "etcd.persistence.enabled=false",
            "--set", "fullnameOverride=o41-o41-artifacts",
        )  # fmt: skip
        done = rel.helm(
            "upgrade", "o41", str(CHART), "--namespace", namespace,
            "--set", "etcd.persistence.enabled=false",
        check=False)  # fmt: skip
        assert done.returncode != 0
        assert "upgrade with --set fullnameOverride=o41-o41-artifacts" in done.stderr
        kept = rel.helm(
            "upgrade", "o41", str(CHART), "--namespace", namespace, "--reuse-values",
        )  # fmt: skip
        assert "STATUS: deployed" in kept.stdout
        assert rel.get("statefulset", "o41-o41-artifacts-etcd")["metadata"]["name"]
    finally:
        rel.helm("uninstall", "o41", "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
