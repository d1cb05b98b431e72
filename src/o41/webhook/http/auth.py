"""Who is calling: a pod, by its ServiceAccount token, checked with a TokenReview.

The namespace a request acts in comes from the token, never from the request: that is
what keeps a pod out of another namespace's organizations and collections. Results are
cached briefly (a pod makes many calls; a TokenReview is an API round trip).
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

from o41.webhook.http.errors import problem

log = logging.getLogger("o41.webhook.auth")  # its name is a log field: kept
RETRY_AFTER = 5  # seconds: what a caller is told to wait when its token cannot be checked


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated pod (or, with authentication off, the local user)."""

    namespace: str
    service_account: str
    pod: str | None = None


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
        return await self.reviewer.review(self.token)


CREDENTIAL: web.RequestKey[Credential] = web.RequestKey("credential", Credential)


class KubernetesTokenReviewer:
    """TokenReview through the Kubernetes API, with a short cache."""

    def __init__(self, api: Any, ttl: float = 30.0, audiences: list[str] | None = None) -> None:
        self._api = api
        self._ttl = ttl
        self._audiences = audiences
        self._cache: dict[str, tuple[float, Caller | None]] = {}

    async def review(self, token: str) -> Caller | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await asyncio.to_thread(self._review, token)
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


async def review(reviewer: TokenReviewer, token: str) -> Caller | None:
    """Who ``token`` is (None: refused). A TokenReview that cannot be made now (the
    Kubernetes API away or failing) is a 503 with ``Retry-After``, never a 500 nor a
    refusal: the token may well be good."""
    try:
        return await reviewer.review(token)
    except web.HTTPException:
        raise
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


def middleware(reviewer: TokenReviewer, *, required: bool = True) -> Any:
    """Authenticate every request but the public ones; 401 with what to do otherwise."""

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
            raise problem(
                401,
                "the token was not accepted: use a current ServiceAccount token of this cluster",
            )
        request[CALLER] = found
        request[CREDENTIAL] = Credential(token, reviewer)
        return await handler(request)

    return authenticate
