"""``make demo``: bring up the local stack, show each part working, and stop it all."""

from __future__ import annotations

import tempfile
import time
import urllib.request
from pathlib import Path

from o41.testbed.stack import Stack

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _round_trip(put_url: str, get_url: str, body: bytes, headers: dict[str, str]) -> bytes:
    put = urllib.request.Request(put_url, data=body, method="PUT", headers=headers)  # noqa: S310
    with _DIRECT.open(put, timeout=10):
        pass
    with _DIRECT.open(get_url, timeout=10) as r:
        data: bytes = r.read()
        return data


def run() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="o41-demo-") as tmp:
        stack = Stack(Path(tmp))
        try:
            say("starting the local stack (control plane, etcd, storage stand-ins)")
            stack.start()
            print(f"up in {time.monotonic() - started:.1f} s")
            _show(stack)
        finally:
            say("stopping every process by its pid")
            stack.stop()
    print(f"demo done in {time.monotonic() - started:.1f} s")
    return 0


def _show(stack: Stack) -> None:
    plane = stack.control_plane
    assert plane is not None and stack.s3 and stack.gcs and stack.azure and stack.state_store
    say("the control plane: a real kube-apiserver with kwok nodes")
    print(plane.kubectl("version"))
    print(plane.kubectl("get", "nodes", "-o", "wide"))
    crds = Path(__file__).resolve().parents[3] / "crds"
    if crds.is_dir():
        say("the product's CRDs")
        print(plane.kubectl("apply", "--server-side", "-f", str(crds)))
        print(plane.kubectl("api-resources", "--categories=o41"))

    body = b"checkpoint step 1000\n"
    say("S3 stand-in (moto): presigned PUT then GET")
    s3 = stack.s3.client()
    s3.create_bucket(Bucket="demo")
    put = s3.generate_presigned_url("put_object", Params={"Bucket": "demo", "Key": "k"})
    get = s3.generate_presigned_url("get_object", Params={"Bucket": "demo", "Key": "k"})
    got = _round_trip(put, get, body, {"Content-Type": "application/octet-stream"})
    print(f"read back {got!r}")

    say("GCS stand-in (fake-gcs-server): V4-signed PUT then GET")
    import datetime as dt

    bucket = stack.gcs.client().create_bucket("demo")
    blob = bucket.blob("k")
    creds = stack.gcs.signing_credentials()
    ttl = dt.timedelta(minutes=5)
    put = blob.generate_signed_url(version="v4", method="PUT", expiration=ttl, credentials=creds)
    get = blob.generate_signed_url(version="v4", method="GET", expiration=ttl, credentials=creds)
    print(f"read back {_round_trip(put, get, body, {})!r}")

    say("Azure stand-in (Azurite): SAS PUT then GET; Azurite checks the signature")
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    stack.azure.client().create_container("demo")
    sas = generate_blob_sas(
        stack.azure.account_name,
        "demo",
        "k",
        account_key=stack.azure.account_key,
        permission=BlobSasPermissions(read=True, create=True, write=True),
        expiry=dt.datetime.now(dt.UTC) + ttl,
    )
    url = f"{stack.azure.account_url}/demo/k?{sas}"
    print(f"read back {_round_trip(url, url, body, {'x-ms-blob-type': 'BlockBlob'})!r}")

    say("etcd state store: three members; kill the leader, writes go on")
    leader = stack.state_store.leader()
    print(f"leader is member {leader}; killing pid {stack.state_store.kill(leader)}")
    stack.state_store.wait_healthy()
    print(f"new leader is member {stack.state_store.leader()}")

    say("what to look at next")
    print("  make dev-up && source .dev/env && kubectl get nodes   # the same stack, kept running")
    print("  make test                                             # the whole suite")
