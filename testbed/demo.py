"""``make demo``: the product's main job on the local stack, then everything stopped.

An organization with locations in three clouds and an S3-compatible one (on the
stand-ins), writes from several places and reads across them (where each write went and
why, how far each read travelled, the bytes read back compared with those written), a
bucket that breaks under a write (the write lands elsewhere: it costs money, not the
run), the spec's two collections examples, and the usage page's two answers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from testbed import examples
from testbed.kube import apply, kubectl, service_account_token
from testbed.stack import Stack

ORG = examples.ORGANIZATION
TEAM = "team-a"
LOCATIONS = ["aws-us-east-1", "aws-us-west-2", "gcp-us-central1", "azure-westeurope"]


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


class _Warnings(logging.Handler):
    """The client's warnings (a retry, a fallback), kept for the demo to print."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


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
    assert stack.endpoint is not None
    endpoint = stack.endpoint
    print(f"placement service on {endpoint}, its state in the 3-member etcd")

    say(f"an organization {ORG!r} and four locations in three clouds")
    objects = examples.objects(s3, gcs, azure, namespaces=[TEAM], only=LOCATIONS)
    for obj in objects:  # one at a time: the first Location to be Ready is the fallback
        apply(kubeconfig, obj)
        if obj["kind"] == "Location":
            ready = f"location/{obj['metadata']['name']}"
            kubectl(kubeconfig, "wait", "--for=condition=Ready", ready, "--timeout=60s")
    kubectl(
        kubeconfig,
        "wait",
        "--for=jsonpath={.status.takesWrites}=true",
        f"organization/{ORG}",
        "--timeout=60s",
    )
    print(kubectl(kubeconfig, "get", "locations"))
    print(kubectl(kubeconfig, "get", "organizations"))

    token_file = work / "token"
    token_file.write_text(service_account_token(kubeconfig, TEAM))

    from o41.client.artifacts import Artifacts
    from o41.core.places import Place

    warnings = _Warnings()
    o41_log = logging.getLogger("o41")
    o41_log.setLevel(logging.WARNING)
    o41_log.propagate = False  # the demo prints what the client warns about, once
    o41_log.addHandler(warnings)

    checkpoint = work / "checkpoint.bin"
    checkpoint.write_bytes(os.urandom(2 * 1024 * 1024))
    written_sha = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    say("writes from several places (the rule that matched, and the warning if any)")
    print(
        "  (each writer's place is SET BY THE DEMO, as O41_ARTIFACTS_CLOUD/REGION would set it;\n"
        "   a pod detects its own from env, SkyPilot or the cloud's metadata: docs/place.md)"
    )
    writers = [
        Place("aws", "us-west-2", "env"),
        Place("aws", "eu-west-1", "env"),
        Place("gcp", "us-central1", "env"),
        Place("nebius", "eu-north1", "env"),
        Place(None, None, "none"),
    ]
    versions = []
    for place in writers:
        client = Artifacts(endpoint, str(token_file), place)
        written = client.write(ORG, "checkpoint", checkpoint)
        where = f"{place.cloud}/{place.region} (set by the demo)" if place.cloud else "unknown"
        print(
            f"  from {where:<36} -> {written.location:<18} rule={written.rule:<8} "
            f"{'WARNING: ' + written.warning if written.warning else ''}"
        )
        versions.append(written)
    warnings.seen.clear()

    say("reads from other places (how far each one travelled), the bytes checked")
    readers = [
        Place("aws", "us-west-2", "env"),
        Place("aws", "us-east-1", "env"),
        Place("gcp", "us-central1", "env"),
    ]
    verified = 0
    for reader in readers:
        client = Artifacts(endpoint, str(token_file), reader)
        for written in versions[:3]:
            out = work / "out.bin"
            got = client.read(ORG, "checkpoint", written.version, out)
            same = hashlib.sha256(out.read_bytes()).hexdigest() == written_sha
            verified += same
            print(
                f"  {reader.cloud}/{reader.region:<12} reads {written.version[:12]}… from "
                f"{got.location:<18} {got.locality:<13} "
                f"{'bytes verified' if same else 'BYTES DIFFER'}"
            )
    reads = len(readers) * 3
    print(
        f"  verified: {verified} of {reads} reads gave back exactly the {checkpoint.stat().st_size}"
        f" bytes written (sha256 {written_sha[:16]}…)"
    )
    if verified != reads:
        raise SystemExit("the bytes read back differ from those written")

    _broken_bucket(endpoint, token_file, checkpoint, warnings, gcs)
    _collections(endpoint, token_file, checkpoint)
    _usage(endpoint, token_file)

    say("what to look at next")
    print("  make dev-up && source .dev/env && kubectl apply -f .dev/examples.yaml")
    print("                                                  # the stack kept up, Locations on it")
    print("  docs/operator.md, docs/placement.md             # how it decides")
    print("  README.md, 'Install on your cluster'            # the chart on a real cluster")
    print("  make test                                       # the whole suite")


def _broken_bucket(
    endpoint: str, token_file: Path, checkpoint: Path, warnings: _Warnings, gcs: Any
) -> None:
    """The GCS stand-in stops: a write from GCP, whose location it is, still lands."""
    from o41.client.artifacts import Artifacts
    from o41.core.places import Place

    say("a bucket breaks: the GCS stand-in is stopped, then a writer in gcp/us-central1 writes")
    gcs.stop()
    client = Artifacts(endpoint, str(token_file), Place("gcp", "us-central1", "env"))
    written = client.write(ORG, "checkpoint", checkpoint)
    for seen in warnings.seen:
        print(f"  client: {seen}")
    warnings.seen.clear()
    print(
        f"  the write landed in {written.location} (rule={written.rule}) instead of "
        "gcp-us-central1: its upload failed, so the client began again without that location"
    )
    print(
        "  it costs money (the bytes left GCP for another cloud), not the run: "
        f"version {written.version[:12]}… is committed"
    )


def _collections(endpoint: str, token_file: Path, checkpoint: Path) -> None:
    """The spec's two examples (docs/collections.md), as written, on this stack's etcd."""
    from o41 import sky
    from o41.client.artifacts import Artifacts
    from o41.core.places import Place

    say("the collections: the spec's two examples, on the 3-member etcd")
    transport = sky.HttpTransport(endpoint, token_file=str(token_file))
    sky.configure(sky.Client(transport, compute="demo-job"))
    artifacts = Artifacts(endpoint, str(token_file), Place("aws", "us-east-1", "env"))
    written_by: list[str] = []

    def write_checkpoint() -> None:
        written_by.append(artifacts.write(ORG, "checkpoint", checkpoint).version)

    @sky.function
    def save_checkpoint(step: int, model: Any) -> list[Any]:
        checkpoints = sky.registry("checkpoints")
        checkpoints.register(step, model)
        return checkpoints.list()

    @sky.function
    def worker_step(batch: list[int]) -> None:
        processed = sky.counter("processed")
        processed.add(len(batch))
        with sky.lock("checkpoint"):
            write_checkpoint()

    try:
        sky.counter("processed").reset()
        for step in (100, 200):
            listed = save_checkpoint(step, {"step": step, "loss": round(1 / step, 4)})
        print(f"  save_checkpoint(100, …), save_checkpoint(200, …) -> list() = {listed}")
        print(f"  registry lookup(200) = {sky.registry('checkpoints').lookup(200)}")
        batches = [list(range(n)) for n in (32, 32, 16)]
        pods = [threading.Thread(target=worker_step, args=(b,)) for b in batches]
        for pod in pods:
            pod.start()
        for pod in pods:
            pod.join()
        print(
            f"  worker_step on 3 threads (batches of 32, 32, 16): counter 'processed' = "
            f"{sky.counter('processed').get()}, {len(written_by)} checkpoints written one at a "
            "time under sky.lock('checkpoint')"
        )
    finally:
        sky.configure(None)


def _usage(endpoint: str, token_file: Path) -> None:
    """The usage page's URL and its two answers, from /v1/usage (the page's JSON)."""
    from o41.client.artifacts import Artifacts
    from o41.core.places import Place

    say("the usage page: where a new location pays, and what crosses clouds")
    url = f"{endpoint}/usage?{urllib.parse.urlencode({'organization': ORG})}"
    token = token_file.read_text().strip()
    asked = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    with urllib.request.urlopen(asked, timeout=10) as page:  # noqa: S310 - loopback
        html = page.read()
        print(f"  {url}   (answers {page.status}, {page.headers.get_content_type()})")
    if f"<h1>Usage of {ORG}</h1>".encode() not in html:
        raise SystemExit(f"the usage page is not {ORG}'s")
    print(
        f"  (open while the demo runs, with a token of namespace {TEAM}; `make dev-up` keeps"
        " one up: $O41_ARTIFACTS_ENDPOINT/usage)"
    )
    client = Artifacts(endpoint, str(token_file), Place(None, None, "none"))
    report = client.call("GET", f"/v1/usage?{urllib.parse.urlencode({'organization': ORG})}")
    print(f"  1. which places write to the fallback or another region: {report['summary']}")
    for place in report["writes"]["places"]:
        left = place["leftRegion"]
        if not left["versions"]:
            continue
        where = f"{place['cloud']}/{place['region']}" if place["cloud"] else "unknown place"
        rules = ", ".join(f"{r} {n['versions']}" for r, n in sorted(place["byRule"].items()))
        print(
            f"       {where} ({place['source']}): {left['versions']} of "
            f"{place['written']['versions']} versions left its region, {_mb(left['bytes'])}, "
            f"${left['cost']:.4f} (by rule: {rules})"
        )
    reads = report["reads"]
    print("  2. bytes that cross clouds on reads:")
    for locality, n in sorted(reads["byLocality"].items()):
        print(f"       {locality:<13} {n['reads']} reads, {_mb(n['bytes'])}, ${n['cost']:.4f}")
    for cell in reads["matrix"]:
        if cell["readerCloud"] != cell["locationCloud"]:
            print(
                f"       readers in {cell['readerCloud']} <- locations in {cell['locationCloud']}:"
                f" {cell['reads']} reads, {_mb(cell['bytes'])}"
            )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
