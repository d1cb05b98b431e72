"""The control plane is real: kubectl round-trips objects, kwok runs a Deployment's pods."""

from __future__ import annotations

import json

import pytest

from testbed.kube import Kube

pytestmark = pytest.mark.kube

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.o41.io"},
    "spec": {
        "group": "smoke.o41.io",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_version_is_the_pinned_release(kube: Kube) -> None:
    version = json.loads(kube.kubectl("version", "-o", "json"))["serverVersion"]
    assert version["gitVersion"].startswith("v1.37.")
    assert (version["major"], version["minor"]) == ("1", "37")


def test_kubectl_round_trips_namespace_configmap_and_crd(kube: Kube) -> None:
    kube.kubectl("create", "namespace", "smoke")
    kube.kubectl("-n", "smoke", "create", "configmap", "greeting", "--from-literal=hello=world")
    got = json.loads(kube.kubectl("-n", "smoke", "get", "configmap", "greeting", "-o", "json"))
    assert got["data"] == {"hello": "world"}

    kube.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/widgets.smoke.o41.io", "--timeout=60s")
    widget = {
        "apiVersion": "smoke.o41.io/v1",
        "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "smoke"},
        "spec": {"size": 3},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(widget))
    got = json.loads(kube.kubectl("-n", "smoke", "get", "widget", "w1", "-o", "json"))
    assert got["spec"] == {"size": 3}

    # the structural schema is enforced by the API server
    widget["spec"] = {"size": 0}
    widget["metadata"]["name"] = "w2"  # type: ignore[index]
    out = kube.kubectl("apply", "-f", "-", input=json.dumps(widget), check=False)
    assert out == ""
    assert "w2" not in kube.kubectl("-n", "smoke", "get", "widgets", "-o", "name")


def test_deployment_becomes_available_on_kwok_nodes(kube: Kube) -> None:
    kube.kubectl("create", "namespace", "smoke-deploy")
    kube.kubectl(
        "-n",
        "smoke-deploy",
        "create",
        "deployment",
        "web",
        "--image=example.invalid/web:1",
        "--replicas=2",
    )
    kube.kubectl(
        "-n",
        "smoke-deploy",
        "wait",
        "--for=condition=Available",
        "deployment/web",
        "--timeout=90s",
    )
    pods = json.loads(kube.kubectl("-n", "smoke-deploy", "get", "pods", "-o", "json"))["items"]
    assert len(pods) == 2
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    assert all(p["spec"]["nodeName"].startswith("kwok-node-") for p in pods)
