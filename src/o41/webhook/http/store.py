"""The app's state store (etcd, or the embedded one), which every capability keeps its
records in, and the collections' own store when they have one apart (the hub's
``--collections-etcd``): their keys live here, below them all, so that none owns another's
store."""

from __future__ import annotations

from aiohttp import web

from o41.state import Store

STORE: web.AppKey[Store] = web.AppKey("store")

#: The collections' store when it is not :data:`STORE` (a second etcd, so a job that floods
#: its collections does not load the index's); absent: the collections use :data:`STORE`.
COLLECTIONS_STORE: web.AppKey[Store] = web.AppKey("collections_store")
