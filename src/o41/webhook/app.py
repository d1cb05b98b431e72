"""The placement service's app factory: settings in, ``web.Application`` out.

Resources live in ``cleanup_ctx`` (the state store, the Kubernetes view, the usage
flusher), so tests and ``python -m o41.webhook`` build the very same app.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from o41 import __version__
from o41.state import EtcdTls, open_store
from o41.webhook import auth, collections, errors, placement, usage_page
from o41.webhook.batching import PutBatcher
from o41.webhook.counts import VersionCounts
from o41.webhook.keys import STORE
from o41.webhook.usage import Usage
from o41.webhook.view import Secrets, View, Watcher

MAX_BODY = 1024 * 1024  # requests are small JSON; uploads go straight to the bucket


@dataclass(frozen=True)
class Settings:
    etcd_endpoints: list[str] = field(default_factory=list)  # empty: the embedded store
    etcd_tls: EtcdTls | None = None  # for https:// endpoints
    kubeconfig: str | None = None  # None: in-cluster, else $KUBECONFIG
    secrets_namespace: str = "o41-system"
    authentication: Literal["tokenreview", "none"] = "tokenreview"
    audiences: list[str] = field(default_factory=list)
    usage_interval: float = 5.0
    store_timeout: float = 5.0
    metrics_address: tuple[str, int] | None = None  # None: /metrics on the service's port


SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
KUBE_API: web.AppKey[Any] = web.AppKey("kube_api", object)


def kubernetes_client(settings: Settings) -> Any:
    from kubernetes import client, config

    if settings.kubeconfig:
        return config.new_client_from_config(config_file=settings.kubeconfig)  # type: ignore[no-untyped-call]
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


async def state_store(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    app[STORE] = open_store(
        settings.etcd_endpoints or None, timeout=settings.store_timeout, tls=settings.etcd_tls
    )
    app[placement.BATCHER] = PutBatcher(app[STORE])
    usage = Usage(app[STORE], settings.usage_interval)
    app[placement.USAGE] = usage
    flusher = asyncio.create_task(usage.run())
    yield
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    with contextlib.suppress(Exception):
        await usage.flush()
    await app[STORE].close()


async def cluster_view(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    api = kubernetes_client(settings)
    app[KUBE_API] = api
    app[placement.SECRETS] = Secrets(api, settings.secrets_namespace)
    loop = asyncio.get_running_loop()
    watcher = Watcher(api, app[placement.VIEW], loop, settings.secrets_namespace)
    watcher.start()
    counts = VersionCounts(app[STORE], api, settings.secrets_namespace, settings.usage_interval)
    app[placement.COUNTS] = counts
    shower = asyncio.create_task(counts.run())
    yield
    shower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await shower
    with contextlib.suppress(Exception):
        await counts.flush()
    watcher.stop()


async def metrics_listener(app: web.Application) -> AsyncIterator[None]:
    """``/metrics`` on ``settings.metrics_address``, a port of its own (docs/chart.md)."""
    address = app[SETTINGS].metrics_address
    assert address is not None
    runner = web.AppRunner(usage_page.metrics_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, *address).start()
    yield
    await runner.cleanup()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "version": __version__})


async def readyz(request: web.Request) -> web.Response:
    """Ready once the view has listed Organizations and Locations."""
    if not request.app[placement.VIEW].synced.is_set():
        raise errors.problem(503, "not ready: the view of the cluster is still loading")
    return web.json_response({"status": "ready"})


async def openapi(request: web.Request) -> web.Response:
    from o41.webhook.openapi import document

    return web.json_response(document())


def make_app(settings: Settings, reviewer: auth.TokenReviewer | None = None) -> web.Application:
    """The service. ``reviewer`` overrides how tokens are checked (the default follows
    ``settings.authentication``)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[placement.VIEW] = View()
    app[placement.BUCKETS] = {}
    app[placement.LEASES] = placement.PendingLease()
    if reviewer is None:
        if settings.authentication == "none":
            reviewer = auth.NoAuthentication()
        else:
            reviewer = _LazyReviewer(app, settings.audiences)
    required = settings.authentication != "none"  # a laptop's requests carry no token
    app.middlewares.extend([errors.json_errors, auth.middleware(reviewer, required=required)])
    app.cleanup_ctx.extend([state_store, cluster_view])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app.add_routes(placement.routes)
    usage_page.setup(app, reviewer, metrics=settings.metrics_address is None)
    if settings.metrics_address is not None:
        app.cleanup_ctx.append(metrics_listener)
    collections.setup(app)
    return app


class _LazyReviewer:
    """TokenReview with the app's Kubernetes client, which exists only once it started."""

    def __init__(self, app: web.Application, audiences: list[str]) -> None:
        self._app, self._audiences = app, audiences
        self._reviewer: auth.KubernetesTokenReviewer | None = None

    async def review(self, token: str) -> auth.Caller | None:
        if self._reviewer is None:
            self._reviewer = auth.KubernetesTokenReviewer(
                self._app[KUBE_API], audiences=self._audiences or None
            )
        return await self._reviewer.review(token)
