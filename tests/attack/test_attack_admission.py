"""Attacks on the organization rules through fields users can write (status above all),
against the real kube-apiserver, operator and placement service.

Status is user-writable: anyone with RBAC on ``locations/status`` can write it. What
admission and placement decide from lives in the operator's record (a ConfigMap in its
namespace that only the operator may write), so forging status must change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from joserfc.jwk import RSAKey

from o41.kube.crd import ISSUER_IMMUTABLE
from o41.kube.location_record import COUNTS, LocationRecord, parse, record_name
from o41.kube.locations import read_location
from o41.webhook.cluster.view import View, organization_source
from testbed.kube import Kube, kubectl_binary
from testbed.process import free_port
from testbed.product import NAMESPACE
from testbed.product import PlacementProcess as PlacementService
from testbed.stores import S3Store

from fixtures.operator import Operator
from support import token_kubeconfig, wait_for

API = "artifacts.o41.io/v1alpha1"

F = TypeVar("F", bound=Callable[..., Any])


def on_the_bed(test: F) -> F:
    """Needs the test bed's cluster and stand-ins."""
    marked: F = pytest.mark.kube(pytest.mark.stores(test))
    return marked


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def run(kubeconfig: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


class Bed:
    """Organizations and Locations made as the administrator, with kubectl."""

    def __init__(self, kube: Kube, credentials: dict[str, str], s3: S3Store, azure: Any) -> None:
        self.kube, self.credentials, self.s3, self.azure = kube, credentials, s3, azure

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return run(self.kube.kubeconfig, *args, input=input)

    def get(self, *args: str) -> dict[str, Any]:
        done = self.kubectl("get", *args, "-o", "json")
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def organization(self, name: str, namespaces: list[str] | None = None) -> None:
        body = {
            "apiVersion": API,
            "kind": "Organization",
            "metadata": {"name": name},
            "spec": {"namespaces": namespaces or ["default"]},
        }
        done = self.kubectl("apply", "-f", "-", input=json.dumps(body))
        assert done.returncode == 0, done.stderr

    def location(self, name: str, org: str, *, bad: bool = False, **spec: Any) -> str:
        if bad:  # wrong Azure key: setup fails, the location stays unfinished
            cloud, region = "azure", "westeurope"
            backend = {"azureBlob": {"accountUrl": self.azure.account_url}}
            secret = self.credentials["azure-wrong"]
        else:
            cloud, region = "aws", "us-east-1"
            backend = {"s3": {"endpoint": self.s3.endpoint}}
            secret = self.credentials["s3"]
        body = {
            "apiVersion": API,
            "kind": "Location",
            "metadata": {"name": name},
            "spec": {
                "organization": org,
                "cloud": cloud,
                "region": region,
                "backend": backend,
                "credentials": {"secretName": secret},
                **spec,
            },
        }
        done = self.kubectl("apply", "-f", "-", input=json.dumps(body))
        assert done.returncode == 0, done.stderr
        return name

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.get("location", name).get("status") or {}
        return status

    def ready(self, name: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            status = self.status(name)
            ok = any(
                c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
            )
            return status if ok else None

        result: dict[str, Any] = wait_for(check, 60, f"location {name} to be Ready")
        return result

    def unfinished(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = wait_for(
            lambda: (lambda s: s if s.get("unfinished") else None)(self.status(name)),
            60,
            f"location {name} to be unfinished",
        )
        return result

    def discard(self, name: str) -> None:
        """Delete an unfinished location once the operator says so (it would otherwise
        retry its setup for the rest of the session)."""
        self.unfinished(name)
        done = self.kubectl("delete", "location", name, "--wait=false")
        assert done.returncode == 0, done.stderr

    def uid(self, name: str) -> str:
        return str(self.get("location", name)["metadata"]["uid"])

    def record(self, name: str) -> dict[str, str] | None:
        done = self.kubectl(
            "get", "configmap", record_name(self.uid(name)), "-n", NAMESPACE, "-o", "json"
        )
        if done.returncode != 0:
            return None
        data: dict[str, str] = json.loads(done.stdout).get("data") or {}
        return data


@pytest.fixture
def bed(
    operator: Operator, kube: Kube, credentials: dict[str, str], s3: S3Store, azure: Any
) -> Bed:
    return Bed(kube, credentials, s3, azure)


def refused_delete(name: str, why: str) -> str:
    return (
        f"location {name!r} cannot be deleted ({why}; a location that may hold versions is "
        "retired, never deleted): set spec.retired: true to stop new writes while its "
        "versions stay readable"
    )


READY_WHY = "it has been Ready, so it may hold versions"
FORGED_UNFINISHED = json.dumps(
    {"status": {"unfinished": True, "readySince": None, "conditions": None}}
)


# --- the delete guard -------------------------------------------------------------------


@on_the_bed
def test_a_status_forged_unfinished_does_not_make_a_ready_location_deletable(bed: Bed) -> None:
    """The reported attack: status says unfinished, then delete."""
    org, loc = unique("atk"), unique("atk-aws")
    bed.organization(org)
    bed.location(loc, org)
    bed.ready(loc)
    done = bed.kubectl(
        "patch", "location", loc, "--subresource=status", "--type=merge", "-p", FORGED_UNFINISHED
    )
    assert done.returncode == 0, done.stderr  # status is writable: that is the point
    assert bed.status(loc).get("unfinished") is True

    done = bed.kubectl("delete", "location", loc, "--wait=false")
    assert done.returncode != 0
    assert "location-delete" in done.stderr, done.stderr  # the operator's admission said no
    assert f"denied the request: {refused_delete(loc, READY_WHY)}" in done.stderr
    assert bed.get("location", loc)["metadata"]["name"] == loc


@on_the_bed
def test_a_removed_record_does_not_make_a_location_deletable_and_comes_back(bed: Bed) -> None:
    org, loc = unique("atk"), unique("atk-aws")
    bed.organization(org)
    bed.location(loc, org)
    bed.ready(loc)
    before = bed.record(loc)
    assert before is not None and before["ready"] == "true" and before["readySince"]
    done = bed.kubectl("delete", "configmap", record_name(bed.uid(loc)), "-n", NAMESPACE)
    assert done.returncode == 0, done.stderr
    done = bed.kubectl("delete", "location", loc, "--wait=false")
    assert done.returncode != 0
    assert "cannot be deleted" in done.stderr, done.stderr
    # the operator's periodic check puts its record back as it was
    assert wait_for(lambda: bed.record(loc), 60, "the record to be restored") == before


@on_the_bed
def test_an_unfinished_location_is_deleted_and_its_record_goes_with_it(bed: Bed) -> None:
    org, loc = unique("atk"), unique("atk-bad")
    bed.organization(org)
    bed.location(loc, org, bad=True)
    bed.unfinished(loc)
    uid = bed.uid(loc)
    record = bed.record(loc)
    assert record is not None
    assert (record["failed"], record["ready"], "readySince" in record) == ("true", "false", False)
    done = bed.kubectl("delete", "location", loc, "--wait=false")
    assert done.returncode == 0, done.stderr

    def gone() -> bool:
        return bed.kubectl("get", "configmap", record_name(uid), "-n", NAMESPACE).returncode != 0

    wait_for(gone, 60, "the garbage collector to remove the record with its Location")


# --- the same with an attacker's own ServiceAccount -------------------------------------


@pytest.fixture
def attacker(kube: Kube, tmp_path: Path) -> Iterator[Path]:
    """A ServiceAccount that may do anything to Locations and their status, and nothing to
    ConfigMaps: as a platform team's "location editor" role would be."""
    name = unique("attacker")
    kube.kubectl("create", "namespace", name)
    kube.kubectl("create", "serviceaccount", "mallory", "-n", name)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["artifacts.o41.io"],
                "resources": ["locations", "locations/status", "organizations"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": name}],
    }
    for obj in (role, binding):
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
    token = kube.kubectl("create", "token", "mallory", "-n", name, "--duration=1h").strip()
    path = token_kubeconfig(kube.kubeconfig, token, "mallory", tmp_path / "mallory.kubeconfig")
    try:
        yield path
    finally:
        kube.kubectl("delete", "clusterrolebinding,clusterrole", name, check=False)
        kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@on_the_bed
def test_an_account_with_location_and_status_rights_cannot_make_a_ready_location_deletable(
    bed: Bed, attacker: Path
) -> None:
    org, loc = unique("atk"), unique("atk-aws")
    bed.organization(org)
    bed.location(loc, org)
    bed.ready(loc)
    uid = bed.uid(loc)

    done = run(
        attacker, "patch", "location", loc, "--subresource=status", "--type=merge", "-p",
        FORGED_UNFINISHED,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the record is out of reach: neither edited, nor made anew, nor removed
    forged = json.dumps({"data": {"failed": "true", "readySince": None}})
    for args in (
        ("patch", "configmap", record_name(uid), "-n", NAMESPACE, "--type=merge", "-p", forged),
        ("create", "configmap", unique("o41-location"), "-n", NAMESPACE),
        ("delete", "configmap", record_name(uid), "-n", NAMESPACE),
    ):
        done = run(attacker, *args)
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), (args, done.stderr)

    done = run(attacker, "delete", "location", loc, "--wait=false")
    assert done.returncode != 0
    assert refused_delete(loc, READY_WHY) in done.stderr, done.stderr
    assert bed.get("location", loc)["metadata"]["uid"] == uid


@on_the_bed
def test_a_status_forged_creation_does_not_adopt_someone_elses_bucket(
    bed: Bed, operator: Operator, s3: S3Store
) -> None:
    """The write-ahead record of a bucket creation was status.creatingBucket: anyone with
    status rights could make the operator mark and use an unmarked bucket of the name."""
    org, loc = unique("atk"), unique("atk-adopt")
    theirs = f"someone-elses-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=theirs)
    bed.organization(org)
    operator.stop()  # so the forged status is there before the first setup
    try:
        bed.location(loc, org, bucket=theirs)
        forged = json.dumps({"status": {"creatingBucket": theirs}})
        done = bed.kubectl(  # taken (with a warning) even now that the schema lacks it
            "patch", "location", loc, "--subresource=status", "--type=merge", "-p", forged
        )
        assert done.returncode == 0, done.stderr
    finally:
        operator.start()

    def verdict() -> dict[str, Any] | None:
        conditions = bed.status(loc).get("conditions", [])
        ready: dict[str, Any] = next((c for c in conditions if c["type"] == "Ready"), {})
        return ready if ready.get("reason") else None

    ready = wait_for(verdict, 60, f"location {loc} to be set up or refused")
    assert (ready["status"], ready["reason"]) == ("False", "NameTaken"), ready
    with pytest.raises(Exception, match="NoSuchTagSet"):  # left untouched
        s3.client().get_bucket_tagging(Bucket=theirs)
    bed.discard(loc)


# --- organizations ---------------------------------------------------------------------


@on_the_bed
def test_an_organization_with_locations_cannot_be_deleted(bed: Bed) -> None:
    org, loc = unique("atk"), unique("atk-aws")
    bed.organization(org)
    bed.location(loc, org)
    bed.ready(loc)
    done = bed.kubectl("delete", "organization", org, "--wait=false")
    assert done.returncode != 0
    assert "organization-delete" in done.stderr, done.stderr
    assert (
        f"denied the request: organization {org!r} cannot be deleted: 1 Location(s) belong "
        f"to it ({loc!r}) and its versions live there"
    ) in done.stderr, done.stderr
    assert bed.get("organization", org)["metadata"]["name"] == org

    empty = unique("atk-empty")
    bed.organization(empty)
    done = bed.kubectl("delete", "organization", empty)
    assert done.returncode == 0, done.stderr


# --- the placement service ----------------------------------------------------------------


def begin(service: PlacementService, token: str, org: str) -> tuple[int, dict[str, Any]]:
    body = {
        "organization": org,
        "artifact": "model",
        "place": {"cloud": "azure", "region": "westeurope", "source": "env"},
        "size": 1,
    }
    request = urllib.request.Request(
        f"{service.url}/v1/writes",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def namespace_token(kube: Kube, namespace: str) -> str:
    kube.kubectl("create", "namespace", namespace)  # a new one: it must not exist yet
    return kube.token(namespace)


@on_the_bed
def test_the_placement_service_ignores_a_status_forged_ready_on_an_unfinished_location(
    bed: Bed, operator: Operator, placement: PlacementService, kube: Kube
) -> None:
    team = unique("atk-team")
    token = namespace_token(kube, team)
    org, loc = unique("atk"), unique("atk-bad")
    bed.organization(org, [team])
    bed.location(loc, org, bad=True)
    bed.unfinished(loc)
    status, answer = begin(placement, token, org)
    assert status == 409, answer

    operator.stop()  # nothing puts status back while we look
    try:
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "BucketReady",
            "message": "forged",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        forged = {"unfinished": False, "readySince": "2026-01-01T00:00:00Z", "conditions": [ready]}
        for kind, name, status_ in (
            ("location", loc, forged),
            ("organization", org, {"fallback": loc, "takesWrites": True}),
        ):
            done = bed.kubectl(
                "patch", kind, name, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": status_}),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        wait_for(
            lambda: bed.get("organization", org).get("status", {}).get("fallback") == loc,
            30,
            "the forged organization status",
        )
        status, answer = begin(placement, token, org)
    finally:
        operator.start()
    assert status == 409, answer
    assert answer["error"] == (
        f"organization {org!r} has no fallback location yet, so it takes no writes: "
        "add a Location to it and wait until the Location is Ready"
    )
    bed.discard(loc)


@on_the_bed
def test_version_counts_reach_status_without_the_service_writing_status(
    bed: Bed, placement: PlacementService, kube: Kube, tmp_path: Path
) -> None:
    team = unique("atk-team")
    token = tmp_path / "token"
    token.write_text(namespace_token(kube, team))
    org, loc = unique("atk"), unique("atk-aws")
    bed.organization(org, [team])
    bed.location(loc, org)
    bed.ready(loc)
    wait_for(
        lambda: bed.get("organization", org).get("status", {}).get("takesWrites"),
        60,
        "the organization to take writes",
    )
    data = tmp_path / "model.bin"
    data.write_bytes(b"counted")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("O41_ARTIFACTS_")},
        "O41_ARTIFACTS_CLOUD": "aws",
        "O41_ARTIFACTS_REGION": "us-east-1",
        "O41_ARTIFACTS_DMI_DIR": str(tmp_path / "no-dmi"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    closed = f"http://127.0.0.1:{free_port()}"
    for cloud in ("AWS", "GCP", "AZURE"):
        env[f"O41_ARTIFACTS_{cloud}_METADATA_URL"] = closed
    for _ in range(2):
        wrote = subprocess.run(
            [sys.executable, "-m", "o41.cli", "write", "--org", org, "--artifact", "model",
             str(data), "--json", "--endpoint", placement.url, "--token-file", str(token)],
            capture_output=True, text=True, check=False, timeout=120, env=env,
        )  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        assert json.loads(wrote.stdout)["location"] == loc

    def shown() -> int | None:
        versions = bed.status(loc).get("versions")
        return versions if versions == 2 else None

    wait_for(shown, 60, "status.versions to show both versions")
    counts = bed.get("configmap", COUNTS, "-n", NAMESPACE)["data"]
    assert counts[loc] == "2"


# --- the same rules without a cluster: what the placement service's view decides from -----


def location_obj(name: str, org: str, uid: str, created: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "creationTimestamp": created},
        "spec": {"organization": org, "cloud": "aws", "region": "us-east-1", "backend": {"s3": {}}},
        "status": status,
    }


FORGED_READY = {
    "unfinished": False,
    "readySince": "2026-01-01T00:00:00Z",
    "conditions": [{"type": "Ready", "status": "True"}],
}


def test_the_view_takes_writability_from_the_record_alone() -> None:
    obj = location_obj("a", "ml", "uid-a", "2026-01-01T00:00:00Z", **FORGED_READY)
    assert not read_location(obj).writable  # no record: no writes, whatever status says
    failed = LocationRecord("uid-a", "a", failed=True)
    assert not read_location(obj, failed).writable
    assert read_location(obj, failed).unfinished
    ready = LocationRecord("uid-a", "a", ready=True, ready_since="2026-01-01T00:00:00Z")
    assert read_location(obj, ready).writable
    # Ready now but never recorded as Ready since: not a state the operator writes
    assert not read_location(obj, LocationRecord("uid-a", "a", ready=True)).writable


def test_the_view_computes_the_fallback_and_never_takes_another_organizations() -> None:
    view = View()
    view.put_location(read_location(location_obj("mine", "ml", "u1", "2026-01-02T00:00:00Z")))
    view.put_location(read_location(location_obj("theirs", "other", "u2", "2026-01-01T00:00:00Z")))
    forged = {
        "metadata": {"name": "ml"},
        "spec": {"namespaces": ["team"]},
        "status": {"fallback": "theirs", "cloudDefaults": {"aws": "theirs"}, "takesWrites": True},
    }
    view.put_organization(organization_source(forged))
    org = view.organizations["ml"]
    assert (org.fallback, dict(org.cloud_defaults), org.takes_writes) == (
        "mine",
        {"aws": "mine"},
        False,  # mine has no record saying Ready
    )
    view.put_record(LocationRecord("u1", "mine", ready=True, ready_since="2026-01-01T00:00:00Z"))
    assert view.organizations["ml"].takes_writes
    assert view.locations["mine"].writable
    view.drop_record("u1")  # a removed record takes the writes away
    assert not view.organizations["ml"].takes_writes


def test_a_configmap_bound_to_another_uid_is_no_record() -> None:
    record = LocationRecord("uid-a", "a", ready=True, ready_since="2026-01-01T00:00:00Z")
    configmap = record.configmap("o41-system")
    assert parse(configmap) == record
    other = json.loads(json.dumps(configmap))
    other["data"]["uid"] = "uid-b"  # the data names another Location
    assert parse(other) is None
    unlabelled = json.loads(json.dumps(configmap))
    unlabelled["metadata"]["labels"] = {}
    assert parse(unlabelled) is None
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == "uid-a"


# --- TrustDomains: one issuer, one domain; no API server audience; no private key ---------


@pytest.fixture
def trust_domains(operator: Operator, kube: Kube) -> Iterator[Callable[..., Any]]:
    """``apply(name, **spec)``: kubectl apply of a TrustDomain as its admin types it; what
    was made goes at the end. Its issuer listens nowhere: the fetch fails, not the test."""
    made: list[str] = []

    def apply(name: str, **spec: Any) -> subprocess.CompletedProcess[str]:
        body = {"apiVersion": API, "kind": "TrustDomain", "metadata": {"name": name}}
        done = run(kube.kubeconfig, "apply", "-f", "-", input=json.dumps({**body, "spec": spec}))
        if done.returncode == 0:
            made.append(name)
        return done

    yield apply
    for name in made:
        run(kube.kubeconfig, "delete", "trustdomain", name, "--ignore-not-found")


def nowhere() -> str:
    return f"https://127.0.0.1:{free_port()}"


def denied(done: subprocess.CompletedProcess[str]) -> str:
    """The refusal as kubectl prints it, after the webhook's name (the chart's
    configuration, or the one the test bed's operator manages)."""
    assert done.returncode != 0, done.stdout
    assert 'admission webhook "trustdomain-rules.' in done.stderr, done.stderr
    return done.stderr.split('" denied the request: ', 1)[1].strip()


@on_the_bed
def test_an_issuer_of_another_trust_domain_is_refused(trust_domains: Callable[..., Any]) -> None:
    """Two domains of one issuer would make two tenants of each namespace there: the
    second could claim the first's pods under its own name."""
    issuer, first, second = nowhere(), unique("td"), unique("td")
    assert trust_domains(first, issuer=issuer).returncode == 0
    assert denied(trust_domains(second, issuer=issuer)) == (
        f"TrustDomain {second!r}: issuer {issuer!r} already belongs to TrustDomain {first!r}, "
        "and one issuer is one trust domain (its tenants would be two). Use TrustDomain "
        f"{first!r} (name it in the Organizations' members, edit its audiences), or delete it "
        f"before making {second!r}"
    )
    # the first is still its own to edit
    assert trust_domains(first, issuer=issuer, audiences=["o41", "batch"]).returncode == 0


@on_the_bed
def test_an_api_server_audience_is_refused(trust_domains: Callable[..., Any]) -> None:
    """Accepting it would let anyone holding a token meant for B's API server (a
    credential to B) use it here."""
    name = unique("td")
    message = denied(
        trust_domains(name, issuer=nowhere(), audiences=["o41", "https://kubernetes.default.svc"])
    )
    assert message.startswith(
        f"TrustDomain {name!r}: spec.audiences ['https://kubernetes.default.svc'] are the API "
        "server's"
    )
    assert message.endswith("Use an audience of this service instead, e.g. 'o41' (the pods "
                            "ask for it in their serviceAccountToken projection)")  # fmt: skip


@on_the_bed
def test_inline_keys_with_private_material_or_none_usable_are_refused(
    trust_domains: Callable[..., Any],
) -> None:
    private = RSAKey.generate_key(2048, parameters={"kid": "leaked"}).as_dict(private=True)
    name = unique("td")
    message = denied(trust_domains(name, issuer=nowhere(), keys={"jwks": json.dumps(
        {"keys": [private]})}))  # fmt: skip
    assert message.startswith(
        f"TrustDomain {name!r}: spec.keys.jwks holds private key material (key 'leaked' has "
        "a private member such as 'd'): give only the public keys"
    )
    hs256 = {"keys": [{"kty": "oct", "kid": "h", "alg": "HS256"}]}
    message = denied(trust_domains(name, issuer=nowhere(), keys={"jwks": json.dumps(hs256)}))
    assert "spec.keys.jwks has no usable key among its 1" in message
    message = denied(trust_domains(name, issuer=nowhere(), keys={"jwks": "not json"}))
    assert message.startswith(f"TrustDomain {name!r}: spec.keys.jwks is not JSON")


@on_the_bed
def test_the_issuer_cannot_change(trust_domains: Callable[..., Any]) -> None:
    """CEL refuses it first, the webhook too (a CRD installed without its rules)."""
    name = unique("td")
    assert trust_domains(name, issuer=nowhere()).returncode == 0
    done = trust_domains(name, issuer=nowhere())
    assert done.returncode != 0
    assert f'The TrustDomain "{name}" is invalid: spec.issuer: Invalid value:' in done.stderr
    assert ISSUER_IMMUTABLE in done.stderr, done.stderr
