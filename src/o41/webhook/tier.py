"""The collections tier: the service in collections-only mode, in a workload cluster, so a
job's collections live near the job (issue 40): ``python -m o41.webhook --serve
collections``.

What it serves is the hub's collections, unchanged (the routes, the WebSocket, quotas,
operation ids, leases and fencing, metrics), on its own etcd (``--etcd``, TLS with the
``O41_ETCD_*`` files), with ``/healthz`` and ``/readyz`` (ready when that etcd answers a
read). Who calls is a pod of *this* cluster, by its token and this cluster's TokenReview
(``--audience`` honoured); its tenant is its namespace. Nothing of an artifact: no watch of
Locations, Organizations or TrustDomains, no buckets, no background passes; an artifacts
route answers 404 saying that artifacts go to the hub.

It needs one permission of the Kubernetes API, and only that one::

    # ClusterRole
    rules:
      - apiGroups: ["authentication.k8s.io"]
        resources: ["tokenreviews"]
        verbs: ["create"]
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from o41.state import Store, open_store
from o41.webhook import telemetry
from o41.webhook.app import MAX_BODY, kubernetes_client, metrics_listener
from o41.webhook.collections import routes as collections
from o41.webhook.collections.operations import ROUTE as COLLECTIONS_ROUTE
from o41.webhook.health import Health, healthz
from o41.webhook.http import errors, request_ids
from o41.webhook.http.answers import json_answer
from o41.webhook.http.settings import SETTINGS, Settings
from o41.webhook.http.store import STORE
from o41.webhook.identity import auth
from o41.webhook.telemetry import metrics

log = logging.getLogger("o41.webhook")

__all__ = ["NOT_HERE", "make_collections_app"]

COLLECTIONS_PREFIX = COLLECTIONS_ROUTE.split("{", 1)[0]  # /v1/collections/
READY_KEY = b"/o41/collections-tier/ready"  # read, never written: a read proves etcd answers
READY_TIMEOUT = 2.0  # seconds: a probe is answered within its kubelet's timeout

NOT_HERE = (
    "this is a collections tier: it serves this cluster's collections (/v1/collections/...) "
    "and nothing of artifacts; send artifact calls to the hub ($O41_ARTIFACTS_ENDPOINT), "
    "and collections here ($O41_COLLECTIONS_ENDPOINT)"
)
OTHER_CLUSTER = (
    "the token was not accepted by this cluster's TokenReview: a collections tier takes "
    "the tokens of its own cluster's pods only (a projected ServiceAccount token, audience "
    "as --audience says); a pod of another cluster uses its own cluster's tier or the hub"
)


def make_collections_app(
    settings: Settings,
    reviewer: auth.TokenReviewer | None = None,
    *,
    store: Store | None = None,
) -> web.Application:
    """The collections tier. ``reviewer`` overrides how tokens are checked (the default
    follows ``settings.authentication``: this cluster's TokenReview, or none); ``store``
    is used instead of the settings' etcd (and left open)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    if reviewer is None:
        if settings.authentication == "none":
            reviewer = auth.NoAuthentication()
        else:
            reviewer = _ClusterReviewer(settings)
            app.cleanup_ctx.append(reviewer.context)
    required = settings.authentication != "none"
    app.middlewares.append(telemetry.middleware)  # first: it sees the status answered
    app.middlewares.extend(
        [
            errors.json_errors,
            artifacts_elsewhere,  # before authentication: a misrouted call learns why at once
            auth.middleware(reviewer, required=required, not_accepted=OTHER_CLUSTER),
        ]
    )
    request_ids.setup(app)  # the outermost middleware: ids in headers, logs, error bodies
    app.cleanup_ctx.append(_state_store(store))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if settings.metrics_address is not None:
        app.cleanup_ctx.append(metrics_listener)
    elif settings.tls is None:  # a cluster-internal port: /metrics beside the API
        app.add_routes(metrics.routes)
    else:
        log.warning("/metrics is not served: the API port is TLS; use --metrics-port")
    collections.setup(app)  # its engine starts after the store, and stops before it
    return app


def _state_store(given: Store | None) -> Callable[[web.Application], AsyncIterator[None]]:
    """The tier's etcd (``settings.etcd_endpoints``), or ``given`` (left open)."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        store = given or open_store(
            settings.etcd_endpoints or None, timeout=settings.store_timeout, tls=settings.etcd_tls
        )
        app[STORE] = telemetry.instrumented(store)
        yield
        if given is None:
            await store.close()

    return context


async def readyz(request: web.Request) -> web.Response:
    """Ready while the store answers a read (a majority of etcd's members, as a strong
    collection operation needs); there is no view of the cluster to wait for."""
    try:
        await asyncio.wait_for(request.app[STORE].get(READY_KEY), READY_TIMEOUT)
    except Exception as e:  # the store away, slow or without a majority: not ready
        raise errors.problem(
            503, f"not ready: the state store did not answer a read ({type(e).__name__})"
        ) from None
    ready: Health = {"status": "ready"}
    return json_answer(ready)


@web.middleware
async def artifacts_elsewhere(request: web.Request, handler: auth.Handler) -> web.StreamResponse:
    """An API path the tier does not serve (an artifacts route) is a 404 that says where
    it goes, rather than aiohttp's bare "Not Found"."""
    unmatched = isinstance(request.match_info.http_exception, web.HTTPNotFound)
    path = request.path
    if unmatched and path.startswith("/v1/") and not path.startswith(COLLECTIONS_PREFIX):
        raise errors.problem(404, NOT_HERE)
    return await handler(request)


class _ClusterReviewer:
    """This cluster's TokenReview (``auth.KubernetesTokenReviewer``) with the Kubernetes
    client made when the app starts and closed when it stops: tokens of other clusters,
    of TrustDomains or the hub's service tokens are not this tier's to take."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._reviewer: auth.KubernetesTokenReviewer | None = None

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        api = await asyncio.to_thread(kubernetes_client, self._settings)
        self._reviewer = auth.KubernetesTokenReviewer(
            api, audiences=self._settings.audiences or None
        )
        yield
        self._reviewer = None
        await asyncio.to_thread(api.close)

    async def review(self, token: str) -> auth.Caller | None:
        if self._reviewer is None:
            raise RuntimeError("the Kubernetes client is not made yet")  # a 503 by auth.review
        return await self._reviewer.review(token)
