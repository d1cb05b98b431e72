"""A TrustDomain's public keys (its issuer's JWKS), fetched: by OIDC discovery, from a JWKS
URL, or parsed from the inline JWKS. The operator calls it on its timer and writes what it
got to its record (``o41.kube.trust_record``); the placement service calls it for an unknown
kid's one refetch. Shared, so it imports neither of them.

What is trusted is narrow on purpose: TLS verified with the TrustDomain's CA bundle (or
the system roots), no proxy from the environment (a proxy could serve any keys), no
redirect to anything but https, at most 1 MiB of body, and only public RS256 or ES256
keys that joserfc can parse (``o41.core.jwks``). Every failure is one
:class:`KeyFetchFailed` whose ``reason`` is what the TrustDomain's Ready condition shows
and whose message names the TrustDomain, what failed and the fix.

Where it connects is narrow too (``o41.core.addresses``): every URL, each redirect hop
included, is checked before it is asked, and every address a name resolves to is checked
by the connector's resolver before the connection is made (so a name that resolves to a
metadata address, at once or on the second lookup, is refused, never connected to).

This cluster's own issuer (``own_issuer``), which no TrustDomain may name, is here too:
the operator and the service learn it the same way.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import socket
import ssl
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, RSAKey, import_key

from o41.core.addresses import (
    AddressNotAllowed,
    Network,
    address_refusal,
    check_url,
    refused_message,
)
from o41.core.jsonlimits import TooDeep, check_depth
from o41.core.jwks import NotAJwks, as_jwks, parse_jwks, private_key_ids, signing_keys
from o41.kube.api import TrustDomainSpec

MAX_BODY = 1024 * 1024  # bytes: a JWKS of a few keys is a few KiB
MAX_REDIRECTS = 3
TIMEOUT = 10.0  # seconds for the whole fetch (discovery and JWKS)
DISCOVERY = "/.well-known/openid-configuration"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# the API server answers 406 to a JWKS request that does not accept jwk-set+json
ACCEPT = "application/json, application/jwk-set+json"
ANONYMOUS_FIX = (
    "In that cluster, let anyone read the issuer's public keys: kubectl create "
    "clusterrolebinding service-account-issuer-discovery-public "
    "--clusterrole=system:service-account-issuer-discovery --group=system:unauthenticated; "
    "or give the keys inline in spec.keys.jwks (kubectl get --raw /openid/v1/jwks there)"
)


class KeyFetchFailed(Exception):
    """The keys could not be had; ``reason`` is a CamelCase code (``REASONS``)."""

    REASONS: ClassVar[tuple[str, ...]] = (
        "Forbidden",
        "TLSError",
        "IssuerMismatch",
        "Unreachable",
        "BadResponse",
        "NoUsableKeys",
        "AddressNotAllowed",
    )

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _who(trust_domain: str | None) -> str:
    return f"TrustDomain {trust_domain!r}" if trust_domain else "the trust domain"


def ssl_context(spec: TrustDomainSpec, trust_domain: str | None = None) -> ssl.SSLContext:
    """Verify the issuer with spec.caBundle, else with the system's roots."""
    if not spec.ca_bundle:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=spec.ca_bundle)
    except (ssl.SSLError, ValueError) as e:
        raise KeyFetchFailed(
            "TLSError",
            f"{_who(trust_domain)}: spec.caBundle holds no usable PEM certificate ({e}): "
            "give the PEM text (-----BEGIN CERTIFICATE-----...) of the CA that signed the "
            "issuer's certificate",
        ) from None


def usable_keys(jwks: object, where: str, trust_domain: str | None = None) -> dict[str, Any]:
    """The JWKS of the public RS256/ES256 keys that ``jwks`` (found at ``where``) holds;
    others are dropped. A private key or no usable key at all is an error."""
    who = _who(trust_domain)
    try:
        found = as_jwks(jwks)
    except NotAJwks as e:
        raise KeyFetchFailed("BadResponse", f"{who}: {where} {e}") from None
    private = private_key_ids(found)
    if private:
        raise KeyFetchFailed(
            "NoUsableKeys",
            f"{who}: {where} holds private key material (key {private[0]!r}): nothing of it "
            "is used; publish only public keys, and replace the leaked one at the issuer",
        )
    keys = []
    for entry in signing_keys(found):
        try:
            key = import_key(entry)
        except (JoseError, ValueError, TypeError, KeyError):  # not a key after all
            continue
        if isinstance(key, RSAKey | ECKey) and not key.is_private:
            keys.append(entry)
    if not keys:
        raise KeyFetchFailed(
            "NoUsableKeys",
            f"{who}: {where} has no usable key among its {len(found['keys'])}: tokens are "
            "verified with RS256 (kty RSA) or ES256 (kty EC, crv P-256) public keys that "
            "have a kid and are for signatures; check the issuer's keys",
        )
    return {"keys": keys}


async def fetch_keys(
    spec: TrustDomainSpec,
    *,
    timeout: float = TIMEOUT,  # noqa: ASYNC109 - a bound callers rely on, not a cancel scope
    trust_domain: str | None = None,
    allowed: Iterable[Network] = (),
    resolver: AbstractResolver | None = None,
) -> dict[str, Any]:
    """The issuer's usable public keys as a JWKS (``{"keys": [...]}``), or
    :class:`KeyFetchFailed`. ``trust_domain`` (the TrustDomain's name) is for messages;
    ``allowed``: the networks beyond the public ones that may be connected to (the chart's
    ``trustDomains.allowedNetworks``); ``resolver``: the names' lookup (aiohttp's default)."""
    who = _who(trust_domain)
    if spec.keys.jwks is not None:
        try:
            inline = parse_jwks(spec.keys.jwks)
        except NotAJwks as e:
            raise KeyFetchFailed("BadResponse", f"{who}: spec.keys.jwks {e}") from None
        return usable_keys(inline, "spec.keys.jwks", trust_domain)
    fetch = _Fetch(spec, who, ssl_context(spec, trust_domain), tuple(allowed), resolver)
    try:
        return await asyncio.wait_for(fetch.run(trust_domain), timeout)
    except TimeoutError:
        raise KeyFetchFailed(
            "Unreachable",
            f"{who}: {fetch.url or spec.issuer} did not answer within {timeout:.0f} s: check "
            "that the issuer is up and reachable from this cluster",
        ) from None


class _CheckedResolver(AbstractResolver):
    """The connector's lookup of names: every address a name resolves to is checked
    (``o41.core.addresses``) before aiohttp may connect to any; one refused address
    refuses the name. aiohttp does not ask a resolver for an address literal: those are
    checked per URL (``_Fetch.check``)."""

    def __init__(self, fetch: _Fetch, inner: AbstractResolver | None) -> None:
        self.fetch = fetch
        self.owned = inner is None
        self.inner = inner if inner is not None else aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        for entry in found:
            refusal = address_refusal(ipaddress.ip_address(entry["host"]), self.fetch.allowed)
            if refusal is not None:
                resolved = replace(refusal, address=f"{refusal.address} (what {host} resolves to)")
                message = refused_message(self.fetch.who, self.fetch.url, resolved)
                raise KeyFetchFailed("AddressNotAllowed", message)
        return found

    async def close(self) -> None:
        if self.owned:
            await self.inner.close()


class _Fetch:
    """One fetch: discovery (unless spec.keys.jwksURL), then the JWKS."""

    def __init__(
        self,
        spec: TrustDomainSpec,
        who: str,
        context: ssl.SSLContext,
        allowed: tuple[Network, ...] = (),
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.spec, self.who, self.context = spec, who, context
        self.allowed, self.resolver = allowed, resolver
        self.url = ""  # the URL being fetched, for messages

    async def run(self, trust_domain: str | None) -> dict[str, Any]:
        resolver = _CheckedResolver(self, self.resolver)
        connector = aiohttp.TCPConnector(ssl=self.context, limit=2, resolver=resolver)
        try:
            # trust_env=False: no proxy and no .netrc from the environment
            async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
                url = self.spec.keys.jwks_url
                if url is None:
                    url = await self.discover(session)
                jwks = await self.get_json(session, url, "JWKS")
        finally:
            await resolver.close()
        return usable_keys(jwks, f"the JWKS at {url}", trust_domain)

    def check(self, url: str) -> None:
        """The URL's host by its text (an address literal never reaches the resolver)."""
        try:
            check_url(self.who, url, self.allowed)
        except AddressNotAllowed as e:
            raise KeyFetchFailed("AddressNotAllowed", str(e)) from None

    async def discover(self, session: aiohttp.ClientSession) -> str:
        issuer = self.spec.issuer
        # OIDC Discovery 1.0, 4: a trailing "/" of the issuer is removed before appending
        doc = await self.get_json(session, issuer.rstrip("/") + DISCOVERY, "discovery document")
        if not isinstance(doc, dict):
            raise KeyFetchFailed(
                "BadResponse", f"{self.who}: the discovery document at {self.url} is not an object"
            )
        if doc.get("issuer") != issuer:
            raise KeyFetchFailed(
                "IssuerMismatch",
                f"{self.who}: the discovery document at {self.url} names issuer "
                f"{shown(doc.get('issuer'))}, not spec.issuer {issuer!r}: spec.issuer must be "
                "exactly the tokens' iss claim (a trailing slash counts). Make a new "
                "TrustDomain with that issuer (spec.issuer cannot change), then delete this one",
            )
        jwks_uri = doc.get("jwks_uri")
        if not isinstance(jwks_uri, str) or urlsplit(jwks_uri).scheme != "https":
            raise KeyFetchFailed(
                "BadResponse",
                f"{self.who}: the discovery document at {self.url} gives jwks_uri "
                f"{shown(jwks_uri)}, not an https URL: give the JWKS URL in "
                "spec.keys.jwksURL, or the keys in spec.keys.jwks",
            )
        return jwks_uri

    async def get_json(self, session: aiohttp.ClientSession, url: str, what: str) -> Any:
        """GET ``url`` (https only, redirects to https only), at most MAX_BODY of JSON."""
        for _ in range(MAX_REDIRECTS + 1):
            self.url = url
            if urlsplit(url).scheme != "https":
                raise KeyFetchFailed(
                    "BadResponse",
                    f"{self.who}: the {what} would be fetched from {url}, which is not https: "
                    "keys are only taken over verified TLS; serve them over https",
                )
            self.check(url)
            try:
                async with session.get(
                    url, allow_redirects=False, headers={"Accept": ACCEPT}
                ) as response:
                    if response.status in REDIRECTS and "Location" in response.headers:
                        url = urljoin(url, response.headers["Location"])
                        continue
                    self.check_status(response.status, what)
                    body = await self.read(response, what)
            except aiohttp.ClientConnectorCertificateError as e:
                raise KeyFetchFailed(
                    "TLSError",
                    f"{self.who}: the TLS certificate of {urlsplit(url).netloc} could not be "
                    f"verified ({e.certificate_error}): put the CA that signed it in "
                    "spec.caBundle (PEM)",
                ) from None
            except aiohttp.ClientSSLError as e:
                raise KeyFetchFailed(
                    "TLSError",
                    f"{self.who}: TLS with {urlsplit(url).netloc} failed ({e}): the issuer "
                    "must serve https with a certificate that spec.caBundle (or the system "
                    "roots) verifies",
                ) from None
            except (aiohttp.ClientConnectionError, OSError) as e:
                raise KeyFetchFailed(
                    "Unreachable",
                    f"{self.who}: could not reach {url} ({type(e).__name__}: {e}): check the "
                    "issuer URL and that this cluster can reach it",
                ) from None
            except aiohttp.ClientError as e:
                raise KeyFetchFailed(
                    "BadResponse", f"{self.who}: {url} answered badly ({type(e).__name__}: {e})"
                ) from None
            try:
                check_depth(body, max_depth=16, what=f"the {what}", max_containers=10000)
                return json.loads(body)
            except (TooDeep, ValueError) as e:
                raise KeyFetchFailed(
                    "BadResponse",
                    f"{self.who}: the {what} at {url} is not JSON ({shown(str(e))}): is this "
                    "the issuer's URL?",
                ) from None
        raise KeyFetchFailed(
            "BadResponse",
            f"{self.who}: more than {MAX_REDIRECTS} redirects from {url}: give the final URL "
            "(spec.keys.jwksURL)",
        )

    def check_status(self, status: int, what: str) -> None:
        if status in (401, 403):
            raise KeyFetchFailed(
                "Forbidden",
                f"{self.who}: {self.url} answered {status}: the issuer does not let this "
                f"operator read its {what} without credentials. {ANONYMOUS_FIX}",
            )
        if status != 200:
            raise KeyFetchFailed(
                "BadResponse",
                f"{self.who}: {self.url} answered {status}, not 200, for the {what}: check "
                "spec.issuer (or spec.keys.jwksURL)",
            )

    async def read(self, response: aiohttp.ClientResponse, what: str) -> bytes:
        if (response.content_length or 0) > MAX_BODY:
            raise self.too_big(what)
        body = await response.content.read(MAX_BODY + 1)
        while len(body) <= MAX_BODY:
            more = await response.content.read(MAX_BODY + 1 - len(body))
            if not more:
                return body
            body += more
        raise self.too_big(what)

    def too_big(self, what: str) -> KeyFetchFailed:
        return KeyFetchFailed(
            "BadResponse",
            f"{self.who}: the {what} at {self.url} is larger than {MAX_BODY // 1024} KiB: "
            "is this the issuer's URL?",
        )


def shown(value: object, limit: int = 80) -> str:
    """A value of the issuer's for a message, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- this cluster's own issuer: no TrustDomain may name it ----------------------------------

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def issuer_of_token(token_file: Path = SERVICE_ACCOUNT_TOKEN) -> str | None:
    """The ``iss`` of this pod's own ServiceAccount token (ours: read, not verified), or
    None outside a pod."""
    try:
        payload = token_file.read_text().strip().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (OSError, IndexError, ValueError, binascii.Error):
        return None
    iss = claims.get("iss") if isinstance(claims, dict) else None
    return iss if isinstance(iss, str) and iss else None


def api_get_json(api: Any, path: str, accept: str = "application/json") -> dict[str, Any]:
    """GET a raw path of the API server with the client's credentials (kubectl get --raw);
    a status other than 200 is an ApiException, as the typed calls raise."""
    from kubernetes.client.exceptions import ApiException

    request = api.param_serialize(
        "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"]
    )
    answer = api.call_api(*request)
    body = answer.read()
    if answer.status != 200:
        raise ApiException(status=answer.status, reason=body[:200].decode(errors="replace"))
    found = json.loads(body)
    if not isinstance(found, dict):
        raise ValueError(f"{path} did not answer a JSON object")  # noqa: TRY004 - a bad answer
    return found


def own_issuer(
    given: str | None, api: Any | None, token_file: Path = SERVICE_ACCOUNT_TOKEN
) -> tuple[str | None, str]:
    """This cluster's issuer and where it was learnt: ``given`` (``--own-issuer``,
    ``O41_OWN_ISSUER``), else this pod's own token, else the API server's discovery
    document (asked with ``api``'s credentials: a process outside a pod). ``(None, why)``
    when none tells it."""
    if given:
        return given, "given (--own-issuer, O41_OWN_ISSUER)"
    found = issuer_of_token(token_file)
    if found is not None:
        return found, f"the iss of this pod's ServiceAccount token ({token_file})"
    if api is None:
        return None, "not in a pod, and no API server to ask"
    try:
        issuer = api_get_json(api, DISCOVERY).get("issuer")
    except Exception as e:  # the API server away or forbidding: say so, go on without
        return None, f"the API server's {DISCOVERY} did not answer ({type(e).__name__}: {e})"
    if isinstance(issuer, str) and issuer:
        return issuer, f"the API server's {DISCOVERY}"
    return None, f"the API server's {DISCOVERY} names no issuer"
