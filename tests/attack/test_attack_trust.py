"""Attacks on the trust of other clusters' issuers (issue 37, points 2, 4 and 6), against
the real API server, the operator and placement service processes.

What a user sees is asserted: the admission refusal kubectl prints, a TrustDomain's Ready
condition, and how the service answers a token (which trust domain it names).

- Point 2: two TrustDomains of one issuer (made at the same instant, both admitted): the
  oldest owns the issuer in the operator's status and in every replica of the service.
- Point 4: issuers and JWKS URLs at link-local, metadata, loopback and private addresses
  are refused at admission (loopback is allowed on the test bed, as the chart's
  trustDomains.allowedNetworks allows it), and the operator refuses a redirect to the
  metadata address before connecting (tests/placement/test_trust_keys.py proves "before connecting"
  with every connect watched, and a lying resolver).
- Point 6: a TrustDomain naming this cluster's own issuer is refused; one admitted before
  the rule is ignored by the service, which keeps this cluster's tokens for its TokenReview.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from o41.core.trust import issuer_conflict, issuer_owners
from o41.kube.trust_record import issuer_claim
from testbed.etcd import EtcdCluster
from testbed.issuer import Issuer
from testbed.kube import IN_CLUSTER_ISSUER, Kube, kubectl_binary
from testbed.pki import Authority
from testbed.process import LOOPBACK, free_port
from testbed.product import WEBHOOK_CONFIG
from testbed.product import PlacementProcess as PlacementService

from fixtures.operator import Operator
from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

API = "artifacts.o41.io/v1alpha1"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class Admin:
    """A platform admin of the hub, with kubectl; what it made goes at the end."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.made: list[tuple[str, str]] = []

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl_binary(), f"--kubeconfig={self.kube.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def trust(self, name: str, **spec: Any) -> subprocess.CompletedProcess[str]:
        """kubectl create of a TrustDomain (create: a second one is never an update)."""
        body = {"apiVersion": API, "kind": "TrustDomain", "metadata": {"name": name}}
        done = self.kubectl("create", "-f", "-", input=json.dumps({**body, "spec": spec}))
        if done.returncode == 0:
            self.made.append(("trustdomain", name))
        return done

    def organization(self, name: str, namespaces: list[str]) -> str:
        body = {"apiVersion": API, "kind": "Organization", "metadata": {"name": name}}
        done = self.kubectl(
            "apply", "-f", "-", input=json.dumps({**body, "spec": {"namespaces": namespaces}})
        )
        assert done.returncode == 0, done.stderr
        self.made.append(("organization", name))
        return name

    def get(self, name: str) -> dict[str, Any]:
        done = self.kubectl("get", "trustdomain", name, "-o", "json")
        assert done.returncode == 0, done.stderr
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    def ready(self, name: str, status: str, reason: str, timeout: float = 60) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            for c in self.get(name).get("status", {}).get("conditions", []):
                if c["type"] == "Ready" and (c["status"], c["reason"]) == (status, reason):
                    return dict(c)
            return None

        return wait_for(check, timeout, f"TrustDomain {name} Ready={status} {reason}")

    def delete(self, kind: str, name: str) -> None:
        done = self.kubectl("delete", kind, name, "--ignore-not-found", "--wait")
        assert done.returncode == 0, done.stderr

    def delete_made(self) -> None:
        for kind, name in reversed(self.made):
            self.delete(kind, name)


@pytest.fixture
def admin(operator: Operator, kube: Kube) -> Iterator[Admin]:
    made = Admin(kube)
    try:
        yield made
    finally:
        made.delete_made()


def denied(done: subprocess.CompletedProcess[str]) -> str:
    """The refusal as kubectl prints it, after the webhook's name."""
    assert done.returncode != 0, done.stdout
    assert 'admission webhook "trustdomain-rules.' in done.stderr, done.stderr
    return done.stderr.split('" denied the request: ', 1)[1].strip()


@contextmanager
def unchecked_trust_domains(admin: Admin) -> Iterator[None]:
    """The TrustDomain webhook skips every object for a moment (an objectSelector no
    object matches): what two TrustDomains made at the same instant get, each admitted
    before the other was there to be listed, or one made before a rule existed."""
    config = json.loads(
        admin.kubectl("get", "validatingwebhookconfiguration", WEBHOOK_CONFIG, "-o", "json").stdout
    )
    (index,) = [
        i for i, w in enumerate(config["webhooks"]) if w["name"].startswith("trustdomain-rules.")
    ]
    before = config["webhooks"][index].get("objectSelector") or {}
    path = f"/webhooks/{index}/objectSelector"

    def select(selector: dict[str, Any]) -> None:
        patch = json.dumps([{"op": "add", "path": path, "value": selector}])
        done = admin.kubectl(
            "patch", "validatingwebhookconfiguration", WEBHOOK_CONFIG, "--type=json", "-p", patch
        )
        assert done.returncode == 0, done.stderr

    select({"matchLabels": {"o41.test/never": "true"}})
    try:
        yield
    finally:
        select(before)


def wait_created(admin: Admin, name: str, **spec: Any) -> None:
    """Create it once the API server has taken in the webhook's new selector."""

    def made() -> bool:
        return admin.trust(name, **spec).returncode == 0

    wait_for(made, 30, f"TrustDomain {name} created past admission")


def wait_checked_again(admin: Admin, issuer: str) -> None:
    """The webhook is back: a TrustDomain of an issuer already taken is refused again."""

    def refused() -> bool:
        done = admin.trust(unique("again"), issuer=issuer, keys={"jwks": json.dumps(
            Issuer(issuer).jwks())})  # fmt: skip
        return done.returncode != 0 and "already belongs to TrustDomain" in done.stderr

    wait_for(refused, 30, "the TrustDomain webhook checking again")


def call(url: str, token: str, path: str) -> tuple[int, dict[str, Any]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with opener.open(request, timeout=10) as answer:
            return int(answer.status), json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_answer(
    service: PlacementService, token: str, path: str, wanted: Callable[[int, str], bool]
) -> None:
    """Until the service answers ``path`` as ``wanted`` (status, error message) says."""
    last: list[tuple[int, dict[str, Any]]] = []

    def check() -> bool:
        last[:] = [call(service.url, token, path)]
        return wanted(last[0][0], str(last[0][1].get("error", "")))

    try:
        wait_for(check, 30, f"the answer of {service.url}{path}")
    except AssertionError:
        raise AssertionError(f"{service.url}{path} answered {last}") from None


@pytest.fixture
def later_replica(
    kube: Kube, state_etcd: EtcdCluster, tmp_path: Path
) -> Iterator[Callable[..., PlacementService]]:
    """Another replica of the service, started when the test says (after what it made:
    it lists the TrustDomains, where the session's replica watched them come)."""
    started: list[PlacementService] = []

    def start(**env: str) -> PlacementService:
        replica = PlacementService(
            kube.kubeconfig, state_etcd.endpoints, tmp_path / f"r{len(started)}", env=env
        )
        (tmp_path / f"r{len(started)}").mkdir()
        started.append(replica.start())
        return replica

    try:
        yield start
    finally:
        for replica in started:
            replica.stop()


# --- point 2: one issuer, one trust domain, in every replica --------------------------------


def test_two_trust_domains_of_one_issuer_the_oldest_owns_it_in_every_replica(
    admin: Admin, placement: PlacementService, later_replica: Callable[..., PlacementService]
) -> None:
    """Before: the session's replica (which watched z-... come first) answered as z-...,
    a replica started later (which lists a-... first) as a-...: one issuer, two tenants."""
    b = Issuer(f"https://{LOOPBACK}:{free_port()}/same-instant")  # keys inline: no fetch
    keys = {"jwks": json.dumps(b.jwks())}
    org = admin.organization(unique("org"), ["nobody"])
    first, second = unique("z"), unique("a")  # made first; listed first
    assert admin.trust(first, issuer=b.url, keys=keys).returncode == 0
    with unchecked_trust_domains(admin):
        wait_created(admin, second, issuer=b.url, keys=keys)
    wait_checked_again(admin, b.url)

    claims = [issuer_claim(admin.get(n)) for n in (first, second)]
    owner = issuer_owners(c for c in claims if c is not None)[b.url]
    loser = next(c for c in claims if c is not None and c.uid != owner.uid)
    # the operator: the owner's keys fetched, the other shown Conflict naming the owner
    admin.ready(owner.name, "True", "KeysFetched")
    conflict = admin.ready(loser.name, "False", "Conflict")["message"]
    assert conflict == issuer_conflict(loser, [owner])
    assert f"belongs to TrustDomain {owner.name!r}, the oldest" in conflict

    def as_domain(name: str) -> Callable[[int, str], bool]:
        return lambda status, said: status == 403 and f"trust domain {name!r} may not use" in said

    listing = f"/v1/organizations/{org}/artifacts"
    later = later_replica()
    for service in (placement, later):  # the one that watched, the one that listed
        wait_answer(service, b.token("ml"), listing, as_domain(owner.name))

    # the owner deleted: the next oldest owns the issuer, everywhere
    admin.delete("trustdomain", owner.name)
    admin.ready(loser.name, "True", "KeysFetched")
    for service in (placement, later):
        wait_answer(service, b.token("ml"), listing, as_domain(loser.name))


# --- point 4: where keys are fetched from ---------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "address", "fix"),
    [
        ({"issuer": "https://169.254.169.254"}, "169.254.169.254", "never fetched"),
        (
            {"issuer": "https://[::ffff:169.254.169.254]/x"},
            "::ffff:a9fe:a9fe (carrying 169.254.169.254)",
            "never fetched",
        ),
        (
            {
                "issuer": "https://oidc.cluster-b.example",
                "keys": {"jwksURL": "https://metadata.google.internal/computeMetadata/v1/"},
            },
            "metadata.google.internal",
            "never fetched",
        ),
        ({"issuer": "https://metadata/x"}, "metadata", "never fetched"),
        (
            {"issuer": "https://10.1.2.3:6443"},
            "10.1.2.3",
            "add 10.1.2.3/32 (or its network) to the chart's value trustDomains.allowedNetworks",
        ),
    ],
    ids=["link-local", "ipv4-mapped", "metadata-name", "metadata-short", "private"],
)
def test_issuers_and_jwks_urls_at_metadata_link_local_or_private_addresses_are_refused(
    admin: Admin, spec: dict[str, Any], address: str, fix: str
) -> None:
    name = unique("td")
    message = denied(admin.trust(name, **spec))
    assert message.startswith(f"TrustDomain {name!r}: https://"), message
    assert f" is at {address}, " in message and fix in message


class RedirectingIssuer:
    """An issuer on loopback over TLS whose discovery document redirects elsewhere."""

    def __init__(self, directory: Path, location: str) -> None:
        self.ca = Authority.create(directory)
        pair = self.ca.issue("issuer", LOOPBACK, ips=(LOOPBACK,))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(pair.cert), str(pair.key))
        self.asked: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler) -> None:
                self.asked.append(handler.path)
                handler.send_response(302)
                handler.send_header("Location", location)
                handler.send_header("Content-Length", "0")
                handler.end_headers()

            def log_message(handler, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://{LOOPBACK}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def redirecting(tmp_path: Path) -> Iterator[RedirectingIssuer]:
    issuer = RedirectingIssuer(tmp_path, "https://169.254.169.254/latest/meta-data/iam/")
    try:
        yield issuer
    finally:
        issuer.stop()


def test_the_operator_refuses_an_issuers_redirect_to_the_metadata_address(
    admin: Admin, redirecting: RedirectingIssuer
) -> None:
    """The issuer is on loopback (allowed on the test bed); its https redirect to
    169.254.169.254 is refused as the hop is checked, before anything connects there."""
    name = unique("td")
    done = admin.trust(name, issuer=redirecting.url, caBundle=redirecting.ca.cert_path.read_text())
    assert done.returncode == 0, done.stderr
    message = admin.ready(name, "False", "AddressNotAllowed")["message"]
    assert message.startswith(
        f"TrustDomain {name!r}: https://169.254.169.254/latest/meta-data/iam/ is at "
        "169.254.169.254, link-local, where clouds serve instance metadata and credentials: "
        "keys are never fetched from there"
    )
    assert "/.well-known/openid-configuration" in redirecting.asked


# --- point 6: this cluster's own issuer -----------------------------------------------------


def test_a_trust_domain_naming_this_clusters_own_issuer_is_refused(admin: Admin) -> None:
    """The operator learns the issuer as the service does (here: the API server's
    discovery document, since it runs outside a pod)."""
    name = unique("hub")
    message = denied(admin.trust(name, issuer=IN_CLUSTER_ISSUER))
    assert message.startswith(
        f"TrustDomain {name!r}: issuer {IN_CLUSTER_ISSUER!r} is this cluster's own (the iss "
        "of its service account tokens): this cluster's pods are checked by its TokenReview"
    )


def test_one_admitted_before_is_ignored_and_this_clusters_tokens_still_pass(
    admin: Admin,
    kube: Kube,
    placement: PlacementService,
    later_replica: Callable[..., PlacementService],
) -> None:
    """Before: a service outside a pod did not know its issuer, trusted such a
    TrustDomain and refused every token of this cluster (ApiServerAudience). Now it
    learns it (the API server's discovery document, or --own-issuer / O41_OWN_ISSUER);
    the operator shows the TrustDomain ignored (OwnIssuer)."""
    namespace = unique("own")
    org = admin.organization(unique("org"), [namespace])
    token = kube.token(namespace)
    fake = Issuer(IN_CLUSTER_ISSUER)  # keys that are not this cluster's
    name = unique("hub")
    with unchecked_trust_domains(admin):
        wait_created(admin, name, issuer=IN_CLUSTER_ISSUER, keys={"jwks": json.dumps(fake.jwks())})
    message = admin.ready(name, "False", "OwnIssuer")["message"]
    assert message.startswith(f"TrustDomain {name!r}: issuer {IN_CLUSTER_ISSUER!r} is this")

    told = later_replica(O41_OWN_ISSUER=IN_CLUSTER_ISSUER)
    for service in (placement, told):  # learnt from discovery; told
        wait_answer(service, token, f"/v1/organizations/{org}/artifacts", lambda s, _: s == 200)
