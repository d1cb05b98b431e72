"""A Location whose S3 keys the store refuses, as a user sees it through kubectl.

The S3 stand-in (versitygw) checks every signature, as S3 does: a wrong secret is
``SignatureDoesNotMatch``, an unknown key ``InvalidAccessKeyId``. The Location is then
``Ready=False`` with reason ``BadCredentials`` and a message that says what to fix (never
the key itself), it creates no bucket, and once the Secret is fixed it becomes Ready
without a restart.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest

from testbed.kube import Kube, kubectl_binary
from testbed.product import NAMESPACE
from testbed.stores import VersityStore

from fixtures.operator import Operator
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores]


def _kubectl(kube: Kube, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kube.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _apply(kube: Kube, obj: dict[str, Any]) -> None:
    _kubectl(kube, "apply", "-f", "-", stdin=json.dumps(obj))


def _secret(kube: Kube, name: str, access: str, secret: str) -> None:
    _apply(
        kube,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "stringData": {"accessKeyId": access, "secretAccessKey": secret},
        },
    )


def _ready(kube: Kube, loc: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(_kubectl(kube, "get", "location", loc, "-o", "json")).get(
        "status", {}
    )
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})


def _columns(kube: Kube, loc: str) -> dict[str, str]:
    """The columns exactly as `kubectl get location -o wide` prints them."""
    header, row = _kubectl(kube, "get", "location", loc, "-o", "wide").splitlines()[:2]
    names = header.split()
    starts = [header.index(n) for n in names]
    ends = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def _buckets(s3: VersityStore) -> set[str]:
    return {b["Name"] for b in s3.client().list_buckets()["Buckets"]}


@pytest.mark.parametrize(
    ("wrong", "code"),
    [("secretAccessKey", "SignatureDoesNotMatch"), ("accessKeyId", "InvalidAccessKeyId")],
)
def test_wrong_s3_keys_are_bad_credentials_until_the_secret_is_fixed(
    operator: Operator, kube: Kube, s3: VersityStore, wrong: str, code: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    org, loc, secret_name = f"org-{tag}", f"aws-keys-{tag}", f"creds-s3-wrong-{tag}"
    bad = "O41WRONG" + uuid.uuid4().hex.upper()
    keys = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key, wrong: bad}
    _secret(kube, secret_name, keys["accessKeyId"], keys["secretAccessKey"])
    _apply(
        kube,
        {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": org},
            "spec": {"namespaces": ["default"]},
        },
    )
    before = _buckets(s3)
    _apply(
        kube,
        {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Location",
            "metadata": {"name": loc},
            "spec": {
                "organization": org,
                "cloud": "aws",
                "region": "us-east-1",
                "backend": {"s3": {"endpoint": s3.endpoint}},
                "credentials": {"secretName": secret_name},
            },
        },
    )

    ready = wait_for(
        lambda: (c := _ready(kube, loc)).get("reason") == "BadCredentials" and c,
        60,
        f"location {loc} to be BadCredentials",
    )
    assert ready["status"] == "False"
    assert code in ready["message"]  # what the store said...
    assert "Fix accessKeyId/secretAccessKey in the Secret" in ready["message"]  # ...what to do
    shown = _kubectl(kube, "get", "location", loc, "-o", "json")
    assert bad not in shown and s3.secret_key not in shown  # never a credential
    assert (_columns(kube, loc)["READY"], _columns(kube, loc)["REASON"]) == (
        "False",
        "BadCredentials",
    )
    events = json.loads(
        _kubectl(kube, "get", "events", "-A", f"--field-selector=involvedObject.name={loc}",
                 "-o", "json")
    )["items"]  # fmt: skip
    assert any(e["reason"] == "BadCredentials" and code in e["message"] for e in events)
    assert _buckets(s3) == before  # refused keys created nothing

    # The fix the message asks for, and nothing else: the operator picks it up by itself.
    _secret(kube, secret_name, s3.access_key, s3.secret_key)
    wait_for(lambda: _ready(kube, loc).get("status") == "True", 120, f"location {loc} Ready")
    assert _columns(kube, loc)["READY"] == "True"
    assert len(_buckets(s3) - before) == 1
