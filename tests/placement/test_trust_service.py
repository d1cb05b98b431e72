"""Pods of another cluster through the placement service (issue 31, points 1, 2 and 6 at
the HTTP level): the real app in-process, on the embedded store and the stand-in bucket,
with cluster B's TrustDomain and the operator's record of its keys put in its view, and
B's tokens signed with a real RSA key. This cluster's pods are the test reviewer's tokens.

What a user sees is asserted: the status, the JSON refusal (reason, trust domain, claim,
the fix), the bytes read back, what a collection holds for whom."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from o41.client.artifacts import Artifacts
from o41.collections.keys import encode_key
from o41.collections.wire import PROTOCOL
from o41.core.places import Place
from o41.core.service_tokens import Issued, issuer_for
from o41.kube.api import TrustDomainSpec
from o41.kube.service_tokens import new_signing_key, sign, signing_key
from o41.kube.trust_keys import issuer_of_token
from o41.kube.trust_record import TrustRecord
from o41.state.memory import MemoryStore
from o41.webhook.app import Settings, make_app
from o41.webhook.cluster.view import Cluster, View, Watcher, organization_source
from o41.webhook.collections.websocket import REFUSED as SOCKET_REFUSED
from o41.webhook.identity.trusted import TrustDomainSource
from testbed.issuer import Issuer, rsa_key
from testbed.locations import ORG, Keys, location
from testbed.process import free_port
from testbed.standin_bucket import Storage
from testbed.usage import FakeReviewer

LOCAL = "token-team-a"  # the test reviewer's token of namespace team-a here
UID = "uid-cluster-b"
PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}


def issuer_b() -> Issuer:
    # nothing listens there: a fetch the service tries fails at once, on this machine
    return Issuer(f"https://127.0.0.1:{free_port()}/cluster-b")


def iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


@dataclass
class Hub:
    url: str
    storage: Storage
    view: View
    b: Issuer
    tmp: Path
    key: bytes = b""  # the service's token key, once a test made a service token

    def trust_b(
        self,
        *,
        fetched: datetime | None = None,
        record_issuer: str | None = None,
        stale_after: int = 86400,
    ) -> None:
        """TrustDomain cluster-b, and the operator's record of its keys."""
        spec = TrustDomainSpec(issuer=self.b.url, stale_after=stale_after)
        self.view.trust.put_source(TrustDomainSource("cluster-b", UID, spec))
        self.view.trust.put_record(
            TrustRecord(
                UID,
                "cluster-b",
                record_issuer or self.b.url,
                self.b.jwks(),
                iso(fetched or datetime.now(UTC)),
            )
        )

    def client(self, token: str, cloud: str, region: str) -> Artifacts:
        path = self.tmp / f"token-{hashlib.sha256(token.encode()).hexdigest()[:8]}"
        path.write_text(token)
        return Artifacts(self.url, str(path), place=Place(cloud, region, "env"), timeout=30)

    async def call(self, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession(headers=headers) as s,
            s.request(method, self.url + path, json=body) as r,
        ):
            answer = await r.json(content_type=None)
            return r.status, {**answer, "_headers": dict(r.headers)}


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    storage = Storage()
    bucket_server = TestServer(storage.app(), host="127.0.0.1")
    await bucket_server.start_server()
    storage.url = str(bucket_server.make_url("")).rstrip("/")
    view = View()
    places = [("east", "aws", "us-east-1"), ("gcp-eu", "gcp", "europe-west4")]
    for n, (name, cloud, region) in enumerate(places, start=1):
        view.put_location(location(name, cloud, region, n))
    # team-a of this cluster, and team-a of cluster B: the same name, two tenants
    member = {"trustDomain": "cluster-b", "namespaces": ["team-a", "eval"]}
    spec = {"namespaces": ["team-a"], "members": [member]}
    view.put_organization(organization_source({"metadata": {"name": ORG}, "spec": spec}))
    view.synced.set()
    app = make_app(
        Settings(usage_interval=3600),
        FakeReviewer(),
        store=MemoryStore(),
        cluster=Cluster(view, Keys()),
        buckets=storage.opener,
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Hub(str(server.make_url("")).rstrip("/"), storage, view, issuer_b(), tmp_path)
    finally:
        await server.close()
        await bucket_server.close()


async def test_a_pod_of_cluster_b_writes_and_a_pod_here_reads_it_cross_cloud(
    hub: Hub, tmp_path: Path
) -> None:
    hub.trust_b()
    data = os.urandom(200_000)
    path = tmp_path / "model"
    path.write_bytes(data)
    writer = hub.client(hub.b.token("team-a", "trainer"), "gcp", "europe-west4")
    written = await asyncio.to_thread(writer.write, ORG, "m", path)
    assert (written.location, written.rule, written.warning) == ("gcp-eu", "region", None)

    out = tmp_path / "back"
    got = await asyncio.to_thread(
        hub.client(LOCAL, "aws", "us-east-1").read, ORG, "m", written.version, out
    )
    assert (got.location, got.locality, out.read_bytes()) == ("gcp-eu", "cross-cloud", data)
    status, usage = await hub.call(LOCAL, "GET", f"/v1/usage?organization={ORG}&records=true")
    assert status == 200, usage
    kinds = {(r["kind"], r["dims"].get("cloud")) for r in usage["records"]}
    assert {("write", "gcp"), ("read", "aws")} <= kinds


async def test_team_a_of_two_clusters_are_two_tenants(hub: Hub) -> None:
    hub.trust_b()
    here, there = LOCAL, hub.b.token("team-a", "trainer")
    config = "/v1/collections/job/dict/config"
    lr = encode_key("lr")

    def value(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    status, _ = await hub.call(here, "POST", f"{config}/set", {"key": lr, "value": value("1")})
    assert status == 200
    status, answer = await hub.call(there, "POST", f"{config}/get", {"key": lr})
    assert (status, answer.get("value")) == (200, None), answer
    status, _ = await hub.call(there, "POST", f"{config}/set", {"key": lr, "value": value("2")})
    assert status == 200
    for token, expected in ((here, "1"), (there, "2")):
        status, answer = await hub.call(token, "POST", f"{config}/get", {"key": lr})
        assert (status, answer.get("value")) == (200, value(expected)), answer

    # a write begun by team-a of B cannot be committed by team-a here
    begin = {"organization": ORG, "artifact": "x", "size": 1, "place": PLACE}
    status, began = await hub.call(there, "POST", "/v1/writes", begin)
    assert status == 201, began
    status, answer = await hub.call(here, "POST", f"/v1/writes/{began['version']}/commit", {})
    assert status == 403, answer
    assert answer["error"] == f"write {began['version']!r} began in another namespace"


async def test_membership_is_by_trust_domain_namespace_and_service_account(hub: Hub) -> None:
    hub.trust_b()
    body = {"organization": ORG, "artifact": "x", "size": 1, "place": PLACE}
    status, answer = await hub.call(hub.b.token("research"), "POST", "/v1/writes", body)
    assert status == 403
    assert answer["error"] == (
        "namespace 'research' of trust domain 'cluster-b' may not use organization 'ml': an "
        "administrator adds {trustDomain: cluster-b, namespaces: [research]} to spec.members "
        "of Organization 'ml'"
    )
    spec = {
        "namespaces": ["team-a"],
        "members": [
            {"trustDomain": "cluster-b", "namespaces": ["eval"], "serviceAccounts": ["runner"]}
        ],
    }
    hub.view.put_organization(organization_source({"metadata": {"name": ORG}, "spec": spec}))
    status, _ = await hub.call(hub.b.token("eval", "runner"), "POST", "/v1/writes", body)
    assert status == 201
    status, answer = await hub.call(hub.b.token("eval", "intruder"), "POST", "/v1/writes", body)
    assert status == 403, answer


def hs256_with_public_key(b: Issuer) -> str:
    """The old attack: HMAC with the issuer's public key (PEM) as the secret."""
    header = {"alg": "HS256", "kid": b.kid, "typ": "JWT"}
    body = b.claims("team-a")
    segments = [_b64(json.dumps(header).encode()), _b64(json.dumps(body).encode())]
    signing = ".".join(segments).encode()
    secret = b.key.as_pem(private=False)
    return ".".join([*segments, _b64(hmac.new(secret, signing, hashlib.sha256).digest())])


def alg_none(b: Issuer) -> str:
    header = {"alg": "none", "kid": b.kid}
    body = b.claims("team-a")
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(body).encode())}."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def refusals(hub: Hub, reason: str) -> float:
    """``o41_tokens_refused_total{reason, trust_domain="cluster-b"}`` on /metrics."""
    async with aiohttp.ClientSession() as s, s.get(hub.url + "/metrics") as r:
        text = await r.text()
    series = f'o41_tokens_refused_total{{reason="{reason}",trust_domain="cluster-b"}} '
    found = [line for line in text.splitlines() if line.startswith(series)]
    return float(found[0].split()[-1]) if found else 0.0


REFUSED: dict[str, tuple[Callable[[Issuer], str], str, str]] = {
    "wrong audience": (lambda b: b.token("team-a", audience="vault"), "WrongAudience", "aud"),
    "the API server's audience": (
        lambda b: b.token("team-a", audience=["o41", "https://kubernetes.default.svc"]),
        "ApiServerAudience",
        "aud",
    ),
    "alg none": (alg_none, "AlgorithmNotAllowed", "alg"),
    "HS256 with the public key": (hs256_with_public_key, "AlgorithmNotAllowed", "alg"),
    "expired": (lambda b: b.token("team-a", lifetime=-600), "Expired", "exp"),
    "nbf in the future": (
        lambda b: b.token("team-a", nbf=int(datetime.now(UTC).timestamp()) + 3600),
        "NotYetValid",
        "nbf",
    ),
    "an unknown kid": (
        lambda b: Issuer(b.url, "rotated-away", rsa_key()).token("team-a"),
        "UnknownKey",
        "kid",
    ),
    "a key B does not publish": (
        lambda b: Issuer(b.url, b.kid, rsa_key()).token("team-a"),
        "BadSignature",
        "kid",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_each_refusal_names_the_trust_domain_the_claim_and_the_fix(
    hub: Hub, case: str
) -> None:
    hub.trust_b()
    make, reason, claim = REFUSED[case]
    before = await refusals(hub, reason)
    status, answer = await hub.call(make(hub.b), "GET", f"/v1/organizations/{ORG}/artifacts")
    assert await refusals(hub, reason) == before + 1  # counted by reason and trust domain
    assert status == 401, answer
    assert (answer["reason"], answer["trustDomain"], answer["claim"]) == (
        reason,
        "cluster-b",
        claim,
    )
    assert "cluster-b" in answer["error"] and answer["_headers"]["WWW-Authenticate"] == "Bearer"


async def test_a_token_of_an_issuer_no_trust_domain_names_goes_to_this_clusters_review(
    hub: Hub,
) -> None:
    """B's token while no TrustDomain names B: this cluster's TokenReview (here, the test
    reviewer) does not know it, so it is a plain 401 (a token of B replayed as a local one)."""
    status, answer = await hub.call(
        hub.b.token("team-a"), "GET", f"/v1/organizations/{ORG}/artifacts"
    )
    assert status == 401
    assert "current ServiceAccount token of this cluster" in answer["error"]


async def test_stale_keys_and_keys_of_another_issuer_are_not_used(hub: Hub) -> None:
    token = hub.b.token("team-a")
    hub.trust_b(fetched=datetime.now(UTC) - timedelta(hours=2), stale_after=3600)
    status, answer = await hub.call(token, "GET", f"/v1/organizations/{ORG}/artifacts")
    assert (status, answer["reason"]) == (503, "KeysUnavailable"), answer
    assert "stale" in answer["error"] and answer["_headers"]["Retry-After"]

    # a record the operator made for another issuer (a TrustDomain deleted and made again
    # under the same name): its keys are not B's; the fetch of B's own fails (nothing there)
    hub.trust_b(record_issuer="https://127.0.0.1:1/someone-else")
    status, answer = await hub.call(token, "GET", f"/v1/organizations/{ORG}/artifacts")
    assert (status, answer["reason"]) == (503, "KeysUnavailable"), answer

    hub.trust_b()  # a fresh fetch of B's own keys: accepted again
    status, answer = await hub.call(token, "GET", f"/v1/organizations/{ORG}/artifacts")
    assert status == 200, answer


async def test_a_trust_domain_naming_this_clusters_own_issuer_is_ignored(
    hub: Hub, tmp_path: Path
) -> None:
    """This cluster's tokens always go to its TokenReview (which sees revocation), even
    when a TrustDomain names this cluster's issuer; the service reads that issuer from
    its own ServiceAccount token."""
    own = tmp_path / "token"
    own.write_text(hub.b.token("o41-system", "placement") + "\n")
    hub.view.trust.local_issuer = issuer_of_token(own)
    assert hub.view.trust.local_issuer == hub.b.url
    hub.trust_b()
    listing = f"/v1/organizations/{ORG}/artifacts"
    status, answer = await hub.call(hub.b.token("team-a"), "GET", listing)
    assert status == 401, answer
    assert "current ServiceAccount token of this cluster" in answer["error"]
    assert issuer_of_token(tmp_path / "absent") is None


def service_token(
    hub: Hub, subject: str = "sky-llama", organization: str = ORG, **changes: Any
) -> tuple[str, Issued]:
    """A token as `kubectl o41 token create` makes it, with the service's key (set up
    once per hub) and its record in the service's view."""
    tokens = hub.view.service_tokens
    if tokens.issuer is None:
        tokens.issuer = issuer_for("o41-system")
        hub.key = new_signing_key()
        tokens.use_key(hub.key)
    now = int(datetime.now(UTC).timestamp())
    fields: dict[str, Any] = {"created": now, "expires": now + 3600, **changes}
    issued = Issued(os.urandom(8).hex(), organization, subject, **fields)
    tokens.records[issued.id] = issued
    return sign(signing_key(hub.key), "o41-system", issued), issued


async def test_a_vm_with_a_service_token_uses_its_one_organization_until_revoked(
    hub: Hub, tmp_path: Path
) -> None:
    token, issued = service_token(hub)
    path = tmp_path / "vm"
    path.write_bytes(b"from a VM")
    written = await asyncio.to_thread(
        hub.client(token, "gcp", "europe-west4").write, ORG, "vm-model", path
    )
    assert written.location == "gcp-eu"

    hub.view.organizations["other"] = hub.view.organizations[ORG]
    status, answer = await hub.call(token, "GET", "/v1/organizations/other/artifacts")
    assert status == 403
    assert answer["error"] == (
        "the service token of 'sky-llama' is for organization 'ml', not 'other': ask a "
        "platform admin for a token of 'other' (kubectl o41 token create --org other "
        "--subject sky-llama)"
    )

    # its collections are its own tenant: not team-a's here, whatever the names
    config = "/v1/collections/job/dict/config"
    lr = encode_key("lr")
    set_lr = {"key": lr, "value": base64.b64encode(b"1").decode()}
    assert (await hub.call(token, "POST", f"{config}/set", set_lr))[0] == 200
    status, answer = await hub.call(LOCAL, "POST", f"{config}/get", {"key": lr})
    assert (status, answer.get("value")) == (200, None)

    del hub.view.service_tokens.records[issued.id]  # kubectl o41 token revoke
    status, answer = await hub.call(token, "GET", f"/v1/organizations/{ORG}/artifacts")
    assert (status, answer["reason"], answer["claim"]) == (401, "Revoked", "jti"), answer
    assert "was revoked" in answer["error"] and "kubectl o41 token create" in answer["error"]


async def test_service_tokens_expired_forged_or_recorded_otherwise_are_refused(hub: Hub) -> None:
    listing = f"/v1/organizations/{ORG}/artifacts"
    now = int(datetime.now(UTC).timestamp())
    expired, _ = service_token(hub, created=now - 7200, expires=now - 3600)
    status, answer = await hub.call(expired, "GET", listing)
    assert (status, answer["reason"]) == (401, "Expired"), answer

    token, issued = service_token(hub)
    forger = new_signing_key()  # a key of its own, the same claims
    forged = sign(signing_key(forger), "o41-system", issued)
    status, answer = await hub.call(forged, "GET", listing)
    assert (status, answer["reason"]) == (401, "BadSignature"), answer

    # a record saying another subject: the token is not the one recorded
    hub.view.service_tokens.records[issued.id] = Issued(
        issued.id, ORG, "someone-else", issued.expires, issued.created
    )
    status, answer = await hub.call(token, "GET", listing)
    assert (status, answer["reason"]) == (401, "Revoked"), answer


async def test_a_service_token_lasting_400_days_is_refused_where_it_is_taken(hub: Hub) -> None:
    """Issue 37, point 5: the 30-day cap is the service's, not only the CLI's: a token
    signed with the service's key for 400 days (minted by hand) is refused."""
    now = int(datetime.now(UTC).timestamp())
    token, _ = service_token(hub, created=now, expires=now + 400 * 86400)
    status, answer = await hub.call(token, "GET", f"/v1/organizations/{ORG}/artifacts")
    assert (status, answer["reason"], answer["claim"]) == (401, "LifetimeTooLong", "exp"), answer
    assert "lasts 400 days; at most 30 are accepted" in answer["error"]
    month, _ = service_token(hub, created=now, expires=now + 30 * 86400)
    assert (await hub.call(month, "GET", f"/v1/organizations/{ORG}/artifacts"))[0] == 200


async def test_a_deleted_trust_domains_open_websockets_are_closed(hub: Hub) -> None:
    """Issue 37, point 8: when the watch sees cluster B's TrustDomain deleted, a socket
    of B's pod is closed then, not at its next periodic check (30 s later); this
    cluster's pods' sockets stay open."""
    hub.trust_b()
    url = hub.url.replace("http", "ws", 1) + "/v1/collections"
    op = {"id": 1, "compute": "job", "kind": "counter", "name": "n", "op": "add", "args": {"n": 1}}
    async with aiohttp.ClientSession() as s:
        sockets = [
            await s.ws_connect(url, headers={"Authorization": f"Bearer {t}"}, protocols=(PROTOCOL,))
            for t in (hub.b.token("team-a", "trainer"), LOCAL)
        ]
        for ws in sockets:
            await ws.send_str(json.dumps(op))
            assert json.loads((await ws.receive(timeout=10)).data)["status"] == 200
        watcher = Watcher(None, hub.view, asyncio.get_running_loop())
        gone = {"metadata": {"name": "cluster-b", "uid": UID}}
        watcher._apply("trustdomains", "DELETED", gone)  # as the watch's event applies it
        closed = await sockets[0].receive(timeout=10)
        assert (closed.type, closed.extra) == (aiohttp.WSMsgType.CLOSE, SOCKET_REFUSED.decode())
        await sockets[1].send_str(json.dumps({**op, "id": 2}))
        assert json.loads((await sockets[1].receive(timeout=10)).data)["status"] == 200
        for ws in sockets:
            await ws.close()
