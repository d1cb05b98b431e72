"""``make demo``: the product's main job on the local stack, then everything stopped.

An organization with locations in three clouds and regions (on the stand-ins), writes
from several places and reads across them, showing where each write went and why, and
how far each read travelled.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from o41.testbed.kube import apply, kubectl
from o41.testbed.stack import Stack

API = "artifacts.o41.io/v1alpha1"
ORG = "ml"
TEAM = "team-a"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="o41-demo-") as tmp:
        work = Path(tmp)
        stack = Stack(work / "stack")
        try:
            say("starting the local stack: control plane, etcd, storage stand-ins")
            stack.start()
            print(f"up in {time.monotonic() - started:.1f} s")
            _main_job(stack, work)
        finally:
            say("stopping every process by its pid")
            stack.stop()
    print(f"demo done in {time.monotonic() - started:.1f} s")
    return 0


def _main_job(stack: Stack, work: Path) -> None:
    plane, s3, gcs, azure = stack.control_plane, stack.s3, stack.gcs, stack.azure
    assert plane and s3 and gcs and azure and stack.state_store
    kubeconfig = plane.kubeconfig
    print(kubectl(kubeconfig, "get", "nodes"))

    say("the CRDs, the operator (admission webhook on 127.0.0.1) and the placement service")
    stack.start_product()
    print(f"placement service on {stack.endpoint}, its state in the 3-member etcd")

    say(f"an organization {ORG!r} and four locations in three clouds")
    apply(
        kubeconfig,
        {
            "apiVersion": API,
            "kind": "Organization",
            "metadata": {"name": ORG},
            "spec": {"namespaces": [TEAM]},
        },
    )
    locations = {
        "aws-us-east-1": ("aws", "us-east-1", {"s3": {"endpoint": s3.endpoint}}, "creds-s3"),
        "aws-us-west-2": ("aws", "us-west-2", {"s3": {"endpoint": s3.endpoint}}, "creds-s3"),
        "gcp-us-central1": (
            "gcp",
            "us-central1",
            {"gcs": {"endpoint": gcs.endpoint, "project": gcs.project}},
            "creds-gcs",
        ),
        "azure-westeurope": (
            "azure",
            "westeurope",
            {"azureBlob": {"accountUrl": azure.account_url}},
            "creds-azure",
        ),
    }
    for name, (cloud, region, backend, secret) in locations.items():
        apply(
            kubeconfig,
            {
                "apiVersion": API,
                "kind": "Location",
                "metadata": {"name": name},
                "spec": {
                    "organization": ORG,
                    "cloud": cloud,
                    "region": region,
                    "backend": backend,
                    "credentials": {"secretName": secret},
                },
            },
        )
        kubectl(kubeconfig, "wait", "--for=condition=Ready", f"location/{name}", "--timeout=60s")
    kubectl(
        kubeconfig,
        "wait",
        "--for=jsonpath={.status.takesWrites}=true",
        f"organization/{ORG}",
        "--timeout=60s",
    )
    print(kubectl(kubeconfig, "get", "locations"))
    print(kubectl(kubeconfig, "get", "organizations"))

    kubectl(kubeconfig, "create", "namespace", TEAM)
    token_file = work / "token"
    for _ in range(100):  # the ServiceAccount appears when the controller-manager sees it
        token = kubectl(kubeconfig, "-n", TEAM, "create", "token", "default", check=False)
        if token:
            break
        time.sleep(0.1)
    token_file.write_text(token.strip())

    from o41.client.artifacts import Artifacts
    from o41.core.places import Place

    logging.getLogger("o41").setLevel(logging.ERROR)  # the table below shows the warnings

    checkpoint = work / "checkpoint.bin"
    checkpoint.write_bytes(os.urandom(2 * 1024 * 1024))
    say("writes from several places (the rule that matched, and the warning if any)")
    writers = [
        Place("aws", "us-west-2", "env"),
        Place("aws", "eu-west-1", "skypilot"),
        Place("gcp", "us-central1", "metadata"),
        Place("nebius", "eu-north1", "skypilot"),
        Place(None, None, "none"),
    ]
    versions = []
    for place in writers:
        client = Artifacts(stack.endpoint, str(token_file), place)
        written = client.write(ORG, "checkpoint", checkpoint)
        where = f"{place.cloud or '?'}/{place.region or '?'} ({place.source})"
        print(
            f"  from {where:<32} -> {written.location:<18} rule={written.rule:<8} "
            f"{'WARNING: ' + written.warning if written.warning else ''}"
        )
        versions.append(written)

    say("reads from other places (how far each one travelled)")
    readers = [
        Place("aws", "us-west-2", "env"),
        Place("aws", "us-east-1", "env"),
        Place("gcp", "us-central1", "env"),
    ]
    for reader in readers:
        client = Artifacts(stack.endpoint, str(token_file), reader)
        for written in versions[:3]:
            got = client.read(ORG, "checkpoint", written.version, work / "out.bin")
            print(
                f"  {reader.cloud}/{reader.region:<12} reads {written.version[:12]}… from "
                f"{got.location:<18} {got.locality}"
            )

    say("what to look at next")
    print("  make dev-up && source .dev/env && kubectl get locations   # the stack, kept up")
    print("  docs/operator.md, docs/placement.md                       # how it decides")
    print("  make test                                                 # the whole suite")
