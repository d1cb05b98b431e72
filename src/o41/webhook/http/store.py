"""The app's state store (etcd, or the embedded one), which every capability keeps its
records in: its key lives here, below them all, so that none owns another's store."""

from __future__ import annotations

from aiohttp import web

from o41.state import Store

STORE: web.AppKey[Store] = web.AppKey("store")
