"""The placement service's app factory: settings in, ``web.Application`` out, every
capability's routes on it.

Resources live in ``cleanup_ctx`` (the state store, the Kubernetes view, the usage
flusher), so tests and ``python -m o41.webhook`` build the very same app.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from o41.core.service_tokens import issuer_for
from o41.kube.service_tokens import SECRET as TOKEN_SECRET
from o41.kube.trust_keys import own_issuer
from o41.state import Store, open_store
from o41.webhook import telemetry
from o41.webhook.backups import backing_up
from o41.webhook.buckets import BUCKETS, Buckets, Opener
from o41.webhook.cluster.view import KUBE_API, SECRETS, VIEW, Cluster, Secrets, View, Watcher
from o41.webhook.collections import routes as collections
from o41.webhook.directories import routes as directories_routes
from o41.webhook.health import healthz, readyz, until_synced
from o41.webhook.http import errors, request_ids
from o41.webhook.http.answers import json_answer
from o41.webhook.http.settings import SETTINGS, Settings
from o41.webhook.http.store import COLLECTIONS_STORE, STORE
from o41.webhook.identity import auth
from o41.webhook.ledger import MANIFESTS, Manifests
from o41.webhook.retention import retaining
from o41.webhook.telemetry import metrics
from o41.webhook.usage import page as usage_page
from o41.webhook.usage.counters import USAGE, Usage
from o41.webhook.usage.counts import COUNTS, VersionCounts
from o41.webhook.versions import routes as versions_routes
from o41.webhook.writes import routes as writes_routes
from o41.webhook.writes.backfill import backfilling
from o41.webhook.writes.batching import BATCHER, PutBatcher
from o41.webhook.writes.pending import LEASES, PendingLease
from o41.webhook.writes.records_backfill import backfilling_records
from o41.webhook.writes.sweeper import sweeping

log = logging.getLogger("o41.webhook")

__all__ = ["Settings", "make_app", "rebuild_app"]

MAX_BODY = 1024 * 1024  # requests are small JSON; uploads go straight to the bucket


def kubernetes_client(settings: Settings) -> Any:
    from kubernetes import client, config

    if settings.kubeconfig:
        return config.new_client_from_config(config_file=settings.kubeconfig)  # type: ignore[no-untyped-call]
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def state_store(given: Store | None) -> Any:
    """The state store's context: ``given`` (the caller's, left open), or the one
    the settings name."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        store = telemetry.instrumented(
            given
            or open_store(
                settings.etcd_endpoints or None,
                timeout=settings.store_timeout,
                tls=settings.etcd_tls,
            )
        )
        app[STORE] = store
        app[BATCHER] = PutBatcher(store)
        usage = Usage(
            store,
            settings.usage_interval,
            hourly_days=settings.usage_hourly_days,
            daily_days=settings.usage_daily_days,
        )
        app[USAGE] = usage
        app[COUNTS] = VersionCounts(store, app.get(KUBE_API), settings.secrets_namespace)
        flusher = asyncio.create_task(usage.run())
        yield
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        with contextlib.suppress(Exception):
            await usage.flush()
        if given is None:
            await store.close()

    return context


async def collections_store(app: web.Application) -> AsyncIterator[None]:
    """The collections' etcd apart from the index's (``--collections-etcd``): a job that
    floods its collections loads that one, not the one every commit and read needs."""
    settings = app[SETTINGS]
    store = open_store(
        settings.collections_etcd_endpoints, timeout=settings.store_timeout, tls=settings.etcd_tls
    )
    app[COLLECTIONS_STORE] = telemetry.instrumented(store)
    yield
    await store.close()


async def cluster_view(app: web.Application) -> AsyncIterator[None]:
    """The Kubernetes view, the Secrets and the VERSIONS counts shown in the cluster."""
    settings = app[SETTINGS]
    api = kubernetes_client(settings)
    app[KUBE_API] = api
    app[SECRETS] = Secrets(api, settings.secrets_namespace)
    trust = app[VIEW].trust
    trust.allowed = settings.trust_allowed
    trust.local_issuer, source = await asyncio.to_thread(own_issuer, settings.own_issuer, api)
    if trust.local_issuer is None:  # its tokens would meet a TrustDomain naming it
        log.warning(
            "this cluster's issuer is unknown (%s): give it with --own-issuer (O41_OWN_ISSUER)",
            source,
        )
    secrets = app[SECRETS]
    assert isinstance(secrets, Secrets)
    tokens = app[VIEW].service_tokens
    tokens.issuer = issuer_for(settings.secrets_namespace)
    tokens.source = lambda: secrets.read(TOKEN_SECRET)
    loop = asyncio.get_running_loop()
    watcher = Watcher(api, app[VIEW], loop, settings.secrets_namespace)
    watcher.start()
    yield
    watcher.stop()


async def version_counts(app: web.Application) -> AsyncIterator[None]:
    """Show the commits' counts in the cluster every few seconds (after the store)."""
    settings = app[SETTINGS]
    counts = VersionCounts(
        app[STORE], app[KUBE_API], settings.secrets_namespace, settings.usage_interval
    )
    app[COUNTS] = counts
    shower = asyncio.create_task(counts.run())
    yield
    shower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await shower
    with contextlib.suppress(Exception):
        await counts.flush()


async def metrics_listener(app: web.Application) -> AsyncIterator[None]:
    """``/metrics`` on ``settings.metrics_address``, a port of its own (docs/chart.md)."""
    address = app[SETTINGS].metrics_address
    assert address is not None
    runner = web.AppRunner(metrics.metrics_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, *address).start()
    yield
    await runner.cleanup()


async def openapi(request: web.Request) -> web.Response:
    from o41.webhook.openapi import document

    return json_answer(document())


def make_app(
    settings: Settings,
    reviewer: auth.TokenReviewer | None = None,
    *,
    store: Store | None = None,
    cluster: Cluster | None = None,
    buckets: Opener | None = None,
) -> web.Application:
    """The service. ``reviewer`` overrides how tokens are checked (the default follows
    ``settings.authentication``); ``store`` is used instead of the settings' one (and left
    open), ``cluster`` instead of a watch of Kubernetes (no VERSIONS are shown then), and
    ``buckets`` opens the locations' buckets (tests: a stand-in)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[VIEW] = cluster.view if cluster else View()
    if cluster is not None:
        app[SECRETS] = cluster.secrets
        cluster.view.synced.set()  # a view handed in is whole: nothing lists it
    app[BUCKETS] = Buckets(buckets) if buckets else Buckets()
    app[MANIFESTS] = Manifests()
    app[LEASES] = PendingLease()
    if reviewer is None:
        if settings.authentication == "none":
            reviewer = auth.NoAuthentication()
        else:
            reviewer = _LazyReviewer(app, settings.audiences)
    # other clusters' tokens (TrustDomains) verified offline; every other one as before
    view = app[VIEW]
    reviewer = auth.Authenticator(reviewer, view.trust.verifier, view.service_tokens)
    required = settings.authentication != "none"  # a laptop's requests carry no token
    app.middlewares.append(telemetry.middleware)  # first: it sees the status answered
    app.middlewares.extend(
        [errors.json_errors, until_synced, auth.middleware(reviewer, required=required)]
    )
    request_ids.setup(app)  # the outermost middleware: ids in headers, logs, error bodies
    if cluster is None:
        app.cleanup_ctx.extend([cluster_view, state_store(store), version_counts])
    else:
        app.cleanup_ctx.append(state_store(store))
    app.cleanup_ctx.append(sweeping)  # aborts the uploads of expired writes
    app.cleanup_ctx.append(retaining)  # deletes the versions retention rules let go
    app.cleanup_ctx.append(backfilling)  # indexes versions committed before the index
    app.cleanup_ctx.append(backfilling_records)  # record objects of versions from before
    app.cleanup_ctx.append(backing_up)  # etcd snapshots to the backup organization
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app.add_routes(writes_routes.routes)
    app.add_routes(versions_routes.routes)
    app.add_routes(directories_routes.routes)
    usage_page.setup(app, reviewer, page=settings.usage_page)
    if settings.metrics_address is not None:
        app.cleanup_ctx.append(metrics_listener)
    elif settings.tls is None:  # a cluster-internal port: /metrics beside the API
        app.add_routes(metrics.routes)
    else:  # the TLS port is the exposed one, and /metrics names every organization
        log.warning("/metrics is not served: the API port is TLS (exposed); use --metrics-port")
    if settings.collections_etcd_endpoints:
        app.cleanup_ctx.append(collections_store)  # before the collections start on it
    collections.setup(app)
    return app


def rebuild_app(settings: Settings) -> web.Application:
    """What a rebuild from the buckets needs of the service (``o41.webhook.rebuild``):
    the view of the cluster, its Secrets, the buckets and the store; no HTTP, no passes."""
    app = web.Application()
    app[SETTINGS] = settings
    app[VIEW] = View()
    app[BUCKETS] = Buckets()
    app.cleanup_ctx.extend([cluster_view, state_store(None)])
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
