"""Who is calling: a pod, by its ServiceAccount token.

A token of this cluster is checked with a TokenReview (it sees revocation); a token of
another cluster's issuer (a TrustDomain) is verified offline against that issuer's keys
(``o41.webhook.identity.tokens``). The tenant a request acts as, (trust domain, namespace),
comes from the token, never from the request: that is what keeps a pod out of another
tenant's organizations and collections. Results are cached briefly (a pod makes many
calls; a TokenReview is an API round trip).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from o41.core.service_tokens import DOMAIN as SERVICE_DOMAIN
from o41.core.service_tokens import tenant_of
from o41.core.trust import KeysUnavailable, TokenRefused
from o41.webhook import telemetry
from o41.webhook.http.errors import Details, problem
from o41.webhook.identity.tokens import TokenVerifier

log = logging.getLogger("o41.webhook.auth")  # its name is a log field: kept
RETRY_AFTER = 5  # seconds: what a caller is told to wait when its token cannot be checked


TENANT_SEPARATOR = ":"  # in neither a namespace nor a trust domain's name (DNS labels)


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated pod (or, with authentication off, the local user); of this
    cluster when ``trust_domain`` is None."""

    namespace: str  # a service token's subject (a VM) in trust domain vm.o41
    service_account: str
    pod: str | None = None
    trust_domain: str | None = None
    organization: str | None = None  # a service token's one organization; None: any

    @property
    def tenant(self) -> str:
        """What its data is keyed by: the namespace for this cluster's pods (as before
        there were other clusters: no migration), ``<trust domain>:<namespace>`` for
        another cluster's, so ``ml`` of two clusters never share a key, and
        ``vm.o41.<organization>:<subject>`` for a service token, so one subject in two
        organizations never shares one either."""
        if self.trust_domain is None:
            return self.namespace
        if self.organization is not None:
            return tenant_of(self.organization, self.namespace)
        return f"{self.trust_domain}{TENANT_SEPARATOR}{self.namespace}"

    def described(self) -> str:
        """How a refusal names it."""
        if self.trust_domain is None:
            return f"namespace {self.namespace!r}"
        if self.organization is not None:
            return f"the service token of {self.namespace!r}"
        return f"namespace {self.namespace!r} of trust domain {self.trust_domain!r}"


CALLER: web.RequestKey[Caller] = web.RequestKey("caller", Caller)


def caller(request: web.Request) -> Caller:
    """The authenticated caller of ``request`` (set by the authentication middleware)."""
    return request[CALLER]


class TokenReviewer(Protocol):
    async def review(self, token: str) -> Caller | None: ...


@dataclass(frozen=True, slots=True)
class Credential:
    """The token a request came with and who checks it: a connection that outlives the
    request (a WebSocket) checks it again, so a revoked or expired token stops working."""

    token: str
    reviewer: TokenReviewer

    async def check(self) -> Caller | None:
        try:
            return await self.reviewer.review(self.token)
        except TokenRefused:  # expired since, its key gone: no longer who it was
            return None


CREDENTIAL: web.RequestKey[Credential] = web.RequestKey("credential", Credential)


class KubernetesTokenReviewer:
    """TokenReview through the Kubernetes API, with a short cache."""

    def __init__(self, api: Any, ttl: float = 30.0, audiences: list[str] | None = None) -> None:
        self._api = api
        self._ttl = ttl
        self._audiences = audiences
        self._cache: dict[bytes, tuple[float, Caller | None]] = {}
        self._asked: dict[bytes, asyncio.Future[Caller | None]] = {}  # under way

    async def review(self, token: str) -> Caller | None:
        key = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]  # reviewed, so parsed, before: not parsed again (issue 41)
        if token.count(".") == 2:  # a JWT's parts are measured before anyone parses them
            TokenVerifier.parse(token)  # Malformed: answered so, the API never asked
        asked = self._asked.get(key)
        if asked is None:  # one review a token at a time: concurrent requests share it
            asked = self._asked[key] = asyncio.ensure_future(self._ask(key, token))
        return await asyncio.shield(asked)  # a request that goes away leaves it to the rest

    async def _ask(self, key: bytes, token: str) -> Caller | None:
        """The API's review of ``token``, cached. The one review of a token under way is
        shared: a pod's 32 concurrent requests whose cached review had just expired made
        32 TokenReviews in threads, about 20 ms of CPU each (issue 41)."""
        try:
            found = await asyncio.to_thread(self._review, token)
        finally:
            del self._asked[key]
        now = time.monotonic()
        if len(self._cache) > 10_000:  # bounded: drop what expired
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + self._ttl, found)
        return found

    def _review(self, token: str) -> Caller | None:
        from kubernetes import client

        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        review = client.AuthenticationV1Api(self._api).create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(**spec))
        )
        status = review.status
        if not status or not status.authenticated or not status.user:
            return None
        # system:serviceaccount:<namespace>:<name>
        parts = (status.user.username or "").split(":")
        if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            return None
        extra = status.user.extra or {}
        pods: list[str] = extra.get("authentication.kubernetes.io/pod-name") or []
        pod = pods[0] if pods else None
        return Caller(namespace=parts[2], service_account=parts[3], pod=pod)


class NoAuthentication:
    """Everyone is ``namespace`` (local runs and demos only; never in a cluster)."""

    def __init__(self, namespace: str = "default") -> None:
        self._caller = Caller(namespace=namespace, service_account="local")

    async def review(self, token: str) -> Caller | None:
        return self._caller


class Verifier(Protocol):
    """Another cluster's tokens (``o41.webhook.identity.tokens.TokenVerifier``)."""

    def issues(self, token: str) -> bool: ...

    async def verify(self, token: str) -> Any: ...  # who it names, or raises TokenRefused


class Authenticator:
    """Tokens of trusted other issuers and the service's own tokens verified offline;
    every other token goes to this cluster's TokenReview, so a token of another cluster
    that no TrustDomain names, sent as if it were local, is refused by this cluster's
    API server."""

    def __init__(
        self, local: TokenReviewer, remote: Verifier, service: Verifier | None = None
    ) -> None:
        self._local, self._remote, self._service = local, remote, service

    async def review(self, token: str) -> Caller | None:
        if self._service is not None and self._service.issues(token):
            issued = await self._service.verify(token)
            return Caller(issued.subject, "", None, SERVICE_DOMAIN, issued.organization)
        if not self._remote.issues(token):
            return await self._local.review(token)
        subject = await self._remote.verify(token)
        if subject.namespace is None or subject.service_account is None:
            return None  # not a pod's token: VMs get tokens the service issues
        return Caller(
            subject.namespace, subject.service_account, subject.pod_name, subject.trust_domain
        )


def refused(e: TokenRefused) -> web.HTTPException:
    """A refused token as its answer: 401 with the reason, the trust domain, the claim
    and the fix; 503 when it is the keys that are missing (our side, not the token)."""
    details: Details = {"reason": e.reason, "trustDomain": e.trust_domain, "claim": e.claim}
    telemetry.TOKENS_REFUSED.labels(e.reason, e.trust_domain or "").inc()
    if isinstance(e, KeysUnavailable):
        return problem(503, str(e), headers={"Retry-After": str(RETRY_AFTER)}, **details)
    return problem(401, str(e), headers={"WWW-Authenticate": "Bearer"}, **details)


async def review(reviewer: TokenReviewer, token: str) -> Caller | None:
    """Who ``token`` is (None: refused). A TokenReview that cannot be made now (the
    Kubernetes API away or failing) is a 503 with ``Retry-After``, never a 500 nor a
    refusal: the token may well be good."""
    try:
        return await reviewer.review(token)
    except web.HTTPException:
        raise
    except TokenRefused as e:
        raise refused(e) from None
    except Exception as e:
        log.warning("a TokenReview failed: %s: %s", type(e).__name__, e)
        raise problem(
            503,
            "the token could not be checked now: the Kubernetes API did not answer the "
            f"TokenReview ({type(e).__name__}); try again in {RETRY_AFTER} s",
            headers={"Retry-After": str(RETRY_AFTER)},
        ) from None


PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/metrics", "/usage"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


NOT_ACCEPTED = "the token was not accepted: use a current ServiceAccount token of this cluster"


def middleware(
    reviewer: TokenReviewer, *, required: bool = True, not_accepted: str = NOT_ACCEPTED
) -> Any:
    """Authenticate every request but the public ones; 401 with what to do otherwise
    (``not_accepted``: what a token the reviewer did not accept is told)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not token and required:
            raise problem(
                401,
                "missing bearer token: send the pod's ServiceAccount token as "
                "'Authorization: Bearer <token>'",
            )
        found = await review(reviewer, token)
        if found is None:
            raise problem(401, not_accepted)
        request[CALLER] = found
        request[CREDENTIAL] = Credential(token, reviewer)
        return await handler(request)

    return authenticate
