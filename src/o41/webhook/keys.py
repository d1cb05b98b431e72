"""Every typed key (``web.AppKey``) of the service's application, in one place.

The types are named for the type checker only, so this module imports none of the route
modules and every one of them may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from o41.core.usage import PriceTable
    from o41.state import Store
    from o41.webhook.auth import TokenReviewer
    from o41.webhook.batching import PutBatcher
    from o41.webhook.collections import Collections
    from o41.webhook.counts import VersionCounts
    from o41.webhook.retention import Retention
    from o41.webhook.settings import Settings
    from o41.webhook.sweeper import Sweeper
    from o41.webhook.usage import Usage
    from o41.webhook.view import Credentials, View
    from o41.webhook.writes import Buckets, PendingLease

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
STORE: web.AppKey[Store] = web.AppKey("store")
KUBE_API: web.AppKey[Any] = web.AppKey("kube_api")
VIEW: web.AppKey[View] = web.AppKey("view")
SECRETS: web.AppKey[Credentials] = web.AppKey("secrets")
BUCKETS: web.AppKey[Buckets] = web.AppKey("buckets")
LEASES: web.AppKey[PendingLease] = web.AppKey("leases")
BATCHER: web.AppKey[PutBatcher] = web.AppKey("batcher")
USAGE: web.AppKey[Usage] = web.AppKey("usage")
COUNTS: web.AppKey[VersionCounts] = web.AppKey("counts")
PRICES: web.AppKey[PriceTable] = web.AppKey("prices")
REVIEWER: web.AppKey[TokenReviewer] = web.AppKey("usage_reviewer")
COLLECTIONS: web.AppKey[Collections] = web.AppKey("collections")
SWEEPER: web.AppKey[Sweeper] = web.AppKey("sweeper")
RETENTION: web.AppKey[Retention] = web.AppKey("retention")
