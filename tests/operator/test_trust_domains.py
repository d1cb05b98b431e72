"""TrustDomains end to end: the operator of cluster A fetches the keys of cluster B, a second
control plane whose service account issuer is its own URL (so it serves its discovery
document and JWKS there, as a real cluster behind a public issuer does).

What a platform admin sees is what is asserted: ``kubectl get trustdomain`` (Ready, Reason,
Keys), the Ready condition's message, the Events, and the operator's record (the ConfigMap
the placement service trusts). The operator fetches every 2 s on the test bed
(``O41_TRUST_REFRESH_INTERVAL``), so a change at B shows within seconds; no fixed sleep.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from joserfc import jws
from joserfc.jwk import import_key

from o41.kube.trust_record import TrustRecord, parse, record_name
from testbed.kube import SELF, ControlPlane, Kube, bin_dir, kubectl_binary
from testbed.process import LOOPBACK, free_port
from testbed.product import NAMESPACE

from fixtures.operator import Operator
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores]  # the session's operator needs the stores

API = "artifacts.o41.io/v1alpha1"


@pytest.fixture(scope="module")
def plane_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Cluster B: its issuer is its API server's URL; anonymous discovery not allowed yet."""
    plane = ControlPlane(tmp_path_factory.mktemp("cluster-b"), bin_dir(), nodes=0, issuer=SELF)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def anonymous_discovery(plane: ControlPlane) -> int:
    """The HTTP status B's discovery document gets without credentials."""
    context = ssl.create_default_context(cafile=str(plane.ca_cert))
    url = f"{plane.server_url}/.well-known/openid-configuration"
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def public_b(plane_b: ControlPlane) -> Iterator[ControlPlane]:
    """B lets anyone read its discovery document and keys (the binding the docs ask for),
    for this test only: its authorizer has taken the binding in before and out after."""
    plane_b.allow_public_issuer_discovery()
    wait_for(lambda: anonymous_discovery(plane_b) == 200, 30, "anonymous discovery allowed")
    try:
        yield plane_b
    finally:
        plane_b.deny_public_issuer_discovery()
        wait_for(lambda: anonymous_discovery(plane_b) == 403, 30, "anonymous discovery denied")


class Hub:
    """Cluster A, where the operator runs, as its admin uses kubectl."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.made: list[str] = []

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl_binary(), f"--kubeconfig={self.kube.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def apply(self, name: str, **spec: Any) -> str:
        body = {"apiVersion": API, "kind": "TrustDomain", "metadata": {"name": name}, "spec": spec}
        done = self.kubectl("apply", "-f", "-", input=json.dumps(body))
        assert done.returncode == 0, done.stderr
        self.made.append(name)
        return name

    def delete_made(self) -> None:
        """What the test made goes (one issuer, one TrustDomain: the next test's would be
        refused), its record with it (the garbage collector)."""
        for name in self.made:
            done = self.kubectl("delete", "trustdomain", name, "--ignore-not-found", "--wait")
            assert done.returncode == 0, done.stderr

    def get(self, name: str) -> dict[str, Any]:
        done = self.kubectl("get", "trustdomain", name, "-o", "json")
        assert done.returncode == 0, done.stderr
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    def ready(self, name: str, status: str, reason: str, timeout: float = 60) -> dict[str, Any]:
        """The Ready condition, once it has this status and reason for the current spec."""

        def check() -> dict[str, Any] | None:
            td = self.get(name)
            for c in td.get("status", {}).get("conditions", []):
                if (
                    c["type"] == "Ready"
                    and (c["status"], c["reason"]) == (status, reason)
                    and c.get("observedGeneration") == td["metadata"]["generation"]
                ):
                    return dict(c)
            return None

        return wait_for(check, timeout, f"TrustDomain {name} Ready={status} {reason}")

    def columns(self, name: str) -> dict[str, str]:
        """`kubectl get trustdomain NAME` as its admin reads it (column by column: an
        empty one, KEYS before any fetch, is "")."""
        done = self.kubectl("get", "trustdomain", name)
        assert done.returncode == 0, done.stderr
        header, row = done.stdout.splitlines()[:2]
        starts = [
            i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")
        ]
        bounds = [*starts[1:], None]
        return {n: row[a:b].strip() for n, a, b in zip(header.split(), starts, bounds, strict=True)}

    def record(self, name: str) -> TrustRecord | None:
        uid = self.get(name)["metadata"]["uid"]
        done = self.kubectl("get", "configmap", record_name(uid), "-n", NAMESPACE, "-o", "json")
        return parse(json.loads(done.stdout)) if done.returncode == 0 else None

    def event_reasons(self, name: str) -> list[str]:
        done = self.kubectl(
            "get", "events", "-n", "default", "--field-selector",
            f"involvedObject.name={name}", "-o", "json",
        )  # fmt: skip
        return [e["reason"] for e in json.loads(done.stdout)["items"]]


@pytest.fixture
def hub(operator: Operator, kube: Kube) -> Iterator[Hub]:
    made = Hub(kube)
    try:
        yield made
    finally:
        made.delete_made()


def unique() -> str:
    return f"cluster-b-{uuid.uuid4().hex[:6]}"


def ca_of(plane: ControlPlane) -> str:
    return Path(plane.ca_cert).read_text()


def jwks_of(plane: ControlPlane) -> dict[str, Any]:
    return plane.get("/openid/v1/jwks")


def test_a_cluster_found_by_discovery_is_ready_with_its_keys(
    hub: Hub, public_b: ControlPlane
) -> None:
    name = hub.apply(unique(), issuer=public_b.server_url, caBundle=ca_of(public_b))
    ready = hub.ready(name, "True", "KeysFetched")
    published = jwks_of(public_b)
    kids = [k["kid"] for k in published["keys"]]
    assert ready["message"] == (
        f"1 key(s) fetched from OIDC discovery at {public_b.server_url}: {kids[0]}"
    )
    shown = hub.columns(name)
    assert shown["NAME"] == name and shown["ISSUER"] == public_b.server_url
    assert (shown["READY"], shown["REASON"]) == ("True", "KeysFetched")
    assert json.loads(shown["KEYS"]) == kids
    status = hub.get(name)["status"]
    assert status["keyIds"] == kids and status["lastFetched"]

    # the record the service trusts holds B's published keys, bound to this TrustDomain
    record = hub.record(name)
    assert record is not None
    assert (record.trust_domain, record.issuer) == (name, public_b.server_url)
    assert dict(record.jwks) == published
    assert record.fetched() is not None

    # and they are B's signing keys: a token B mints for the audience o41 verifies
    token = public_b.kubectl("create", "token", "default", "--audience=o41").strip()
    key = import_key(dict(record.jwks["keys"][0]))
    claims = json.loads(jws.deserialize_compact(token, key, algorithms=["RS256"]).payload)
    assert claims["iss"] == public_b.server_url and claims["aud"] == ["o41"]

    assert "KeysFetched" in wait_for(lambda: hub.event_reasons(name), 30, "the KeysFetched Event")


def test_an_issuer_without_public_discovery_is_forbidden_with_the_binding_to_make(
    hub: Hub, plane_b: ControlPlane
) -> None:
    name = hub.apply(unique(), issuer=plane_b.server_url, caBundle=ca_of(plane_b))
    ready = hub.ready(name, "False", "Forbidden")
    message = ready["message"]
    assert message.startswith(
        f"TrustDomain {name!r}: {plane_b.server_url}/.well-known/openid-configuration answered 403"
    )
    assert (
        "--clusterrole=system:service-account-issuer-discovery --group=system:unauthenticated"
        in message
    )
    assert "or give the keys inline in spec.keys.jwks" in message
    assert message.endswith("No keys were ever fetched: this domain's tokens are refused "
                            "(503) until a fetch succeeds")  # fmt: skip
    assert hub.columns(name)["REASON"] == "Forbidden"
    assert hub.record(name) is None  # nothing to trust
    assert "Forbidden" in wait_for(lambda: hub.event_reasons(name), 30, "a Forbidden Event")


def test_without_the_ca_bundle_the_issuer_is_a_tls_error(hub: Hub, public_b: ControlPlane) -> None:
    name = hub.apply(unique(), issuer=public_b.server_url)
    message = hub.ready(name, "False", "TLSError")["message"]
    assert f"the TLS certificate of {LOOPBACK}:{public_b.api_port} could not be verified" in (
        message
    )
    assert "put the CA that signed it in spec.caBundle (PEM)" in message
    assert hub.record(name) is None


def test_an_issuer_spelled_otherwise_than_the_tokens_is_a_mismatch(
    hub: Hub, public_b: ControlPlane
) -> None:
    """A trailing slash is another issuer: tokens' iss would never match it."""
    spelled = public_b.server_url + "/"
    name = hub.apply(unique(), issuer=spelled, caBundle=ca_of(public_b))
    message = hub.ready(name, "False", "IssuerMismatch")["message"]
    assert (
        f"names issuer {public_b.server_url!r}, not spec.issuer {spelled!r}: spec.issuer must "
        "be exactly the tokens' iss claim (a trailing slash counts)"
    ) in message
    assert hub.record(name) is None


def test_an_unreachable_issuer_keeps_the_last_good_keys(hub: Hub, public_b: ControlPlane) -> None:
    name = hub.apply(unique(), issuer=public_b.server_url, caBundle=ca_of(public_b))
    hub.ready(name, "True", "KeysFetched")
    published = jwks_of(public_b)
    public_b.stop_api_server()
    try:
        message = hub.ready(name, "False", "Unreachable")["message"]
        assert f"could not reach {public_b.server_url}/.well-known/openid-configuration" in (
            message
        )
        last = hub.record(name)
        assert last is not None and dict(last.jwks) == published
        assert f"The last good keys (fetched at {last.fetched_at}) serve until" in message
        assert hub.columns(name)["REASON"] == "Unreachable"
        assert hub.get(name)["status"]["keyIds"] == [k["kid"] for k in published["keys"]]
    finally:
        public_b.start_api_server()
    hub.ready(name, "True", "KeysFetched")  # and back once B is


def test_inline_keys_are_ready_without_any_network(hub: Hub, plane_b: ControlPlane) -> None:
    """An issuer the hub cannot reach: its keys pasted from `kubectl get --raw
    /openid/v1/jwks` there. Nothing listens at the issuer URL; it is never asked."""
    published = jwks_of(plane_b)
    nowhere = f"https://{LOOPBACK}:{free_port()}"
    name = hub.apply(unique(), issuer=nowhere, keys={"jwks": json.dumps(published)})
    ready = hub.ready(name, "True", "KeysFetched")
    assert ready["message"].endswith(f"fetched from spec.keys.jwks: {published['keys'][0]['kid']}")
    record = hub.record(name)
    assert record is not None and dict(record.jwks) == published and record.issuer == nowhere
