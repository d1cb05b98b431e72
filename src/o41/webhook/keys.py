"""The application's typed keys (``web.AppKey``), shared by its route modules."""

from __future__ import annotations

from aiohttp import web

from o41.state import Store

STORE: web.AppKey[Store] = web.AppKey("store", Store)
