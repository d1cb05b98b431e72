"""Fetching a TrustDomain's keys (``o41.kube.trust_keys``) from issuers served on loopback over
TLS by a throwaway CA: what is fetched, what is kept of it, and each failure's reason and
message. No cluster: the second control plane's own discovery is
tests/operator/test_trust_domains.py.

Loopback is allowed here as the test bed's chart value allows it (``LOOPBACK``); where the
fetch may connect is tested with every socket's connect watched (``connects``): nothing
but loopback is ever connected to, and a name's lookup is a stub (no real DNS).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer
from joserfc.jwk import ECKey, OKPKey, RSAKey

from o41.core.addresses import parse_networks
from o41.kube.api import TrustDomainKeys, TrustDomainSpec
from o41.kube.trust_keys import MAX_BODY, KeyFetchFailed
from o41.kube.trust_keys import fetch_keys as fetch_anywhere
from testbed.pki import Authority
from testbed.process import LOOPBACK, free_port

ALLOWED = parse_networks("127.0.0.0/8")  # the test bed's trustDomains.allowedNetworks


async def fetch_keys(spec: TrustDomainSpec, **kw: Any) -> dict[str, Any]:
    """The fetch as the test bed's operator makes it: loopback allowed."""
    return await fetch_anywhere(spec, **{"allowed": ALLOWED, **kw})


Server = Callable[..., Awaitable[TestServer]]

RSA = RSAKey.generate_key(2048, parameters={"kid": "rsa-1", "use": "sig", "alg": "RS256"})
EC = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})
PUBLIC: list[dict[str, Any]] = [RSA.as_dict(private=False), EC.as_dict(private=False)]
UNUSABLE: list[dict[str, Any]] = [
    ECKey.generate_key("P-384", parameters={"kid": "p384"}).as_dict(private=False),
    OKPKey.generate_key("Ed25519", parameters={"kid": "eddsa"}).as_dict(private=False),
    {**EC.as_dict(private=False), "kid": "es384", "alg": "ES384"},
    {**RSA.as_dict(private=False), "kid": "enc", "use": "enc"},
    {k: v for k, v in RSA.as_dict(private=False).items() if k != "kid"},  # no kid
    {"kty": "RSA", "kid": "junk", "n": "!!not base64!!", "e": "AQAB"},
]


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> tuple[Authority, ssl.SSLContext]:
    ca = Authority.create(tmp_path_factory.mktemp("issuer-ca"))
    pair = ca.issue("issuer", LOOPBACK, ips=(LOOPBACK,), dns=("issuer.test", "keys.test"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return ca, context


class Issuer:
    """An OIDC issuer on loopback: its routes answer what the test sets."""

    def __init__(self, server: TestServer, ca: Authority) -> None:
        self.server, self.ca = server, ca

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def spec(self, **keys: Any) -> TrustDomainSpec:
        return TrustDomainSpec(
            issuer=self.url,
            ca_bundle=Path(self.ca.cert_path).read_text(),
            keys=TrustDomainKeys(**keys),
        )


Routes = dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


@pytest.fixture
async def issuer(
    aiohttp_server: Server, authority: tuple[Authority, ssl.SSLContext]
) -> Callable[[Routes], Awaitable[Issuer]]:
    async def make(routes: Routes) -> Issuer:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_get(path, handler)
        server = await aiohttp_server(app, host=LOOPBACK, ssl=authority[1])
        return Issuer(server, authority[0])

    return make


def discovery(
    jwks: list[dict[str, Any]] | None = None, issuer_suffix: str = "", jwks_uri: str | None = None
) -> Routes:
    async def document(request: web.Request) -> web.Response:
        base = f"https://{request.host}"
        return web.json_response(
            {"issuer": base + issuer_suffix, "jwks_uri": jwks_uri or f"{base}/openid/v1/jwks"}
        )

    async def keys(request: web.Request) -> web.Response:
        if "application/jwk-set+json" not in request.headers.get("Accept", ""):
            return web.Response(status=406)  # as the API server answers
        return web.json_response({"keys": PUBLIC if jwks is None else jwks})

    return {"/.well-known/openid-configuration": document, "/openid/v1/jwks": keys}


async def refused(spec: TrustDomainSpec, **kw: Any) -> KeyFetchFailed:
    with pytest.raises(KeyFetchFailed) as caught:
        await fetch_keys(spec, trust_domain="cluster-b", **kw)
    assert "TrustDomain 'cluster-b'" in caught.value.message
    return caught.value


async def test_discovery_fetches_the_public_signing_keys_and_drops_the_rest(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    running = await issuer(discovery(PUBLIC + UNUSABLE))
    jwks = await fetch_keys(running.spec(), trust_domain="cluster-b")
    assert jwks == {"keys": PUBLIC}


async def test_a_jwks_url_is_fetched_without_discovery(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    routes = discovery()
    del routes["/.well-known/openid-configuration"]
    running = await issuer(routes)
    jwks = await fetch_keys(running.spec(jwks_url=running.url + "/openid/v1/jwks"))
    assert [k["kid"] for k in jwks["keys"]] == ["rsa-1", "ec-1"]


async def test_an_issuer_with_a_trailing_slash_is_a_mismatch(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    """Discovery drops the slash to find the document (OIDC Discovery 4); the document's
    issuer then is not spec.issuer, which must equal the tokens' iss exactly."""
    running = await issuer(discovery())
    spec = running.spec().model_copy(update={"issuer": running.url + "/"})
    e = await refused(spec)
    assert e.reason == "IssuerMismatch"
    assert f"names issuer {running.url!r}, not spec.issuer {running.url + '/'!r}" in e.message
    assert "Make a new TrustDomain" in e.message


async def test_another_issuer_in_the_document_is_a_mismatch(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    running = await issuer(discovery(issuer_suffix="/other"))
    assert (await refused(running.spec())).reason == "IssuerMismatch"


@pytest.mark.parametrize("status", [401, 403])
async def test_an_issuer_that_wants_credentials_is_forbidden_with_the_binding_to_make(
    issuer: Callable[[Routes], Awaitable[Issuer]], status: int
) -> None:
    async def no(_: web.Request) -> web.Response:
        return web.Response(status=status)

    running = await issuer({"/.well-known/openid-configuration": no})
    e = await refused(running.spec())
    assert e.reason == "Forbidden"
    assert f"answered {status}" in e.message
    assert "--clusterrole=system:service-account-issuer-discovery" in e.message
    assert "--group=system:unauthenticated" in e.message
    assert "spec.keys.jwks" in e.message


async def test_a_certificate_of_another_ca_is_a_tls_error_naming_ca_bundle(
    issuer: Callable[[Routes], Awaitable[Issuer]], tmp_path: Path
) -> None:
    running = await issuer(discovery())
    for bundle in (None, Authority.create(tmp_path / "other").cert_path.read_text()):
        spec = running.spec().model_copy(update={"ca_bundle": bundle})
        e = await refused(spec)
        assert e.reason == "TLSError"
        assert "could not be verified" in e.message and "spec.caBundle" in e.message


async def test_a_ca_bundle_that_is_no_pem_is_a_tls_error() -> None:
    spec = TrustDomainSpec(issuer="https://127.0.0.1:9", ca_bundle="not a certificate")
    e = await refused(spec)
    assert e.reason == "TLSError" and "spec.caBundle holds no usable PEM" in e.message


async def test_nothing_listening_is_unreachable() -> None:
    spec = TrustDomainSpec(issuer=f"https://{LOOPBACK}:{free_port()}")
    e = await refused(spec)
    assert e.reason == "Unreachable" and "could not reach" in e.message


async def test_an_issuer_that_never_answers_is_unreachable_after_the_timeout(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    running = await issuer({"/.well-known/openid-configuration": hang})
    e = await refused(running.spec(), timeout=0.5)
    assert e.reason == "Unreachable" and "did not answer within" in e.message


async def test_the_environments_proxy_is_not_used(
    issuer: Callable[[Routes], Awaitable[Issuer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy could answer with any keys: none from the environment."""
    dead = f"http://{LOOPBACK}:{free_port()}"
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    running = await issuer(discovery())
    assert (await fetch_keys(running.spec()))["keys"] == PUBLIC


async def test_redirects_are_followed_to_https_only(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    async def to_https(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"https://{request.host}/openid/v1/jwks")

    async def to_http(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://{request.host}/openid/v1/jwks")

    routes = {**discovery(), "/moved": to_https, "/plain": to_http}
    running = await issuer(routes)
    assert (await fetch_keys(running.spec(jwks_url=running.url + "/moved")))["keys"] == PUBLIC
    e = await refused(running.spec(jwks_url=running.url + "/plain"))
    assert e.reason == "BadResponse" and "which is not https" in e.message


async def test_a_discovery_document_with_an_http_jwks_uri_is_refused(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    running = await issuer(discovery(jwks_uri="http://127.0.0.1:9/keys"))
    e = await refused(running.spec())
    assert e.reason == "BadResponse" and "not an https URL" in e.message


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (web.Response(status=500, text="boom"), "answered 500, not 200"),
        (web.Response(status=404), "answered 404, not 200"),
        (web.Response(text="<html>a login page</html>"), "is not JSON"),
        (web.Response(text="[" * 5000 + "]" * 5000), "is not JSON"),
        (web.Response(body=b" " * (MAX_BODY + 1)), "larger than 1024 KiB"),
        (web.json_response({"no": "keys"}), "is not a JWKS"),
    ],
    ids=["500", "404", "html", "deep", "huge", "no-keys"],
)
async def test_a_bad_answer_is_a_bad_response(
    issuer: Callable[[Routes], Awaitable[Issuer]], answer: web.Response, said: str
) -> None:
    async def handler(_: web.Request) -> web.Response:
        return answer

    running = await issuer({"/jwks": handler})
    e = await refused(running.spec(jwks_url=running.url + "/jwks"))
    assert e.reason == "BadResponse"
    assert said in e.message


async def test_a_jwks_without_a_usable_key_or_with_a_private_one_is_no_usable_keys(
    issuer: Callable[[Routes], Awaitable[Issuer]],
) -> None:
    running = await issuer(discovery(UNUSABLE))
    e = await refused(running.spec())
    assert e.reason == "NoUsableKeys" and f"among its {len(UNUSABLE)}" in e.message
    running = await issuer(discovery([*PUBLIC, RSA.as_dict(private=True)]))
    e = await refused(running.spec())
    assert e.reason == "NoUsableKeys" and "private key material (key 'rsa-1')" in e.message


async def test_inline_keys_need_no_network() -> None:
    spec = TrustDomainSpec(
        issuer=f"https://{LOOPBACK}:{free_port()}",  # nothing there: never asked
        keys=TrustDomainKeys(jwks=json.dumps({"keys": PUBLIC + UNUSABLE})),
    )
    assert await fetch_keys(spec) == {"keys": PUBLIC}
    spec = spec.model_copy(update={"keys": TrustDomainKeys(jwks="{not json")})
    e = await refused(spec)
    assert e.reason == "BadResponse" and "spec.keys.jwks is not JSON" in e.message


# --- issue 37: where the fetch connects ------------------------------------------------------


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every socket connect of the test, watched: one to an address other than loopback is
    stopped before it happens (OSError) and recorded; the test asserts there is none."""
    outside: list[Any] = []
    real, real_ex = socket.socket.connect, socket.socket.connect_ex

    def loopback(address: Any) -> bool:
        host = address[0] if isinstance(address, tuple) else str(address)
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return True  # a unix socket's path

    def connect(self: socket.socket, address: Any) -> None:
        if not loopback(address):
            outside.append(address)
            raise OSError(f"the test stopped a connect to {address}")
        real(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not loopback(address):
            outside.append(address)
            raise OSError(f"the test stopped a connect to {address}")
        return real_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return outside


class StubDns(AbstractResolver):
    """Names to addresses, as a DNS that lies would answer (a rebinding attacker's); no
    real lookup ever. Records what it was asked."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.names[host]
        ]

    async def close(self) -> None:
        pass


def test_the_connect_guard_does_stop_a_connect(connects: list[Any]) -> None:
    with socket.socket() as s, pytest.raises(OSError, match="the test stopped"):
        s.connect(("192.0.2.1", 443))  # TEST-NET-1: would leave the machine
    assert connects == [("192.0.2.1", 443)]


@pytest.mark.parametrize(
    ("target", "address"),
    [
        ("https://169.254.169.254/latest/meta-data/iam/security-credentials/", "169.254.169.254"),
        ("https://[::ffff:169.254.169.254]/", "::ffff:a9fe:a9fe (carrying 169.254.169.254)"),
        ("https://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal"),
        ("https://metadata/computeMetadata/v1/", "metadata"),
    ],
)
async def test_a_redirect_to_a_metadata_or_link_local_address_is_refused_before_connecting(
    issuer: Callable[[Routes], Awaitable[Issuer]],
    connects: list[Any],
    target: str,
    address: str,
) -> None:
    """The issuer (on loopback) answers a redirect; the hop is checked before it is asked."""

    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPFound(target)

    running = await issuer({"/jwks": moved})
    dns = StubDns({})
    spec = running.spec(jwks_url=running.url + "/jwks")
    with pytest.raises(KeyFetchFailed) as caught:
        await fetch_keys(spec, trust_domain="cluster-b", resolver=dns)
    e = caught.value
    assert e.reason == "AddressNotAllowed", e.message
    assert e.message.startswith("TrustDomain 'cluster-b': https://")
    assert f" is at {address}, " in e.message and "keys are never fetched from there" in e.message
    assert connects == [] and dns.asked == []  # neither connected nor even looked up


async def test_a_name_that_resolves_to_a_metadata_address_is_refused_before_connecting(
    issuer: Callable[[Routes], Awaitable[Issuer]], connects: list[Any]
) -> None:
    """DNS rebinding: the discovery document's name resolves to loopback (allowed here),
    the jwks_uri's name to the metadata address. The connector connects only to what its
    resolver returned, and the resolver refuses it first."""

    async def document(request: web.Request) -> web.Response:
        port = request.host.rsplit(":", 1)[1]
        return web.json_response(
            {"issuer": f"https://issuer.test:{port}", "jwks_uri": f"https://keys.test:{port}/k"}
        )

    routes = discovery()
    running = await issuer({**routes, "/.well-known/openid-configuration": document,
                            "/k": routes["/openid/v1/jwks"]})  # fmt: skip
    port = running.server.port
    keys = f"https://keys.test:{port}/k"
    dns = StubDns({"issuer.test": [LOOPBACK], "keys.test": ["169.254.169.254"]})
    spec = running.spec().model_copy(update={"issuer": f"https://issuer.test:{port}"})
    with pytest.raises(KeyFetchFailed) as caught:
        await fetch_keys(spec, trust_domain="cluster-b", resolver=dns)
    e = caught.value
    assert e.reason == "AddressNotAllowed", e.message
    assert e.message.startswith(
        f"TrustDomain 'cluster-b': {keys} is at 169.254.169.254 (what keys.test resolves "
        "to), link-local, where clouds serve instance metadata and credentials: keys are "
        "never fetched from there"
    )
    assert dns.asked == ["issuer.test", "keys.test"] and connects == []

    # one refused address among the answers refuses the name; a private one names the fix
    dns.names["keys.test"] = [LOOPBACK, "10.1.2.3"]
    e = await refused(spec, resolver=dns)
    assert e.reason == "AddressNotAllowed"
    assert "is at 10.1.2.3 (what keys.test resolves to), a private address" in e.message
    assert "add 10.1.2.3/32 (or its network) to the chart's value" in e.message
    assert connects == []

    # resolved to loopback, which the chart allows here: fetched
    dns.names["keys.test"] = [LOOPBACK]
    assert (await fetch_keys(spec, resolver=dns))["keys"] == PUBLIC


async def test_loopback_is_refused_unless_allowed(
    issuer: Callable[[Routes], Awaitable[Issuer]], connects: list[Any]
) -> None:
    running = await issuer(discovery())
    with pytest.raises(KeyFetchFailed) as caught:
        await fetch_anywhere(running.spec(), trust_domain="cluster-b")
    assert caught.value.reason == "AddressNotAllowed"
    assert f"is at {LOOPBACK}, loopback" in caught.value.message
    assert "trustDomains.allowedNetworks (O41_TRUST_ALLOWED_NETWORKS)" in caught.value.message
    assert (await fetch_keys(running.spec()))["keys"] == PUBLIC


def test_this_clusters_issuer_is_given_else_the_pods_token_else_discovery(tmp_path: Path) -> None:
    """``o41.kube.trust_keys.own_issuer``: how the operator and the service learn it (the API
    server's discovery against a real one: tests/attack/test_attack_trust.py)."""
    from o41.kube.trust_keys import own_issuer
    from testbed.issuer import Issuer as TokenIssuer

    token = tmp_path / "token"
    token.write_text(TokenIssuer("https://from.token.example").token("o41-system") + "\n")

    class Refusing:
        def param_serialize(self, *_: Any, **__: Any) -> Any:
            raise OSError("no API server here")

    given = "https://given.example"
    assert own_issuer(given, Refusing(), token) == (
        given,
        "given (--own-issuer, O41_OWN_ISSUER)",
    )
    assert own_issuer(None, Refusing(), token)[0] == "https://from.token.example"
    absent = tmp_path / "absent"
    issuer, why = own_issuer(None, Refusing(), absent)
    assert issuer is None and "did not answer (OSError: no API server here)" in why
    assert own_issuer(None, None, absent) == (None, "not in a pod, and no API server to ask")
