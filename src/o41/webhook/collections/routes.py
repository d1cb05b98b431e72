"""The collections' routes on an app, and their lifecycle: the engine and the quota start
with the state store, and buffered eventual writes are written out before it closes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

from aiohttp import web

from o41.collections.engine import Engine
from o41.webhook import telemetry
from o41.webhook.cluster.view import VIEW
from o41.webhook.collections import websocket
from o41.webhook.collections.operations import ROUTE, USAGE_ROUTE, handle, usage
from o41.webhook.collections.quota import Quota
from o41.webhook.collections.service import COLLECTIONS, Collections, Options
from o41.webhook.http.store import COLLECTIONS_STORE, STORE

__all__ = ["COLLECTIONS", "Options", "setup"]


def setup(app: web.Application, options: Options | None = None) -> None:
    """Add the collections' routes to ``app``; their state store, once started, is
    ``app[COLLECTIONS_STORE]`` when the app has one apart (the hub's ``--collections-etcd``),
    else ``app[STORE]``. On shutdown, buffered eventual writes are written out before the
    store closes (the app's earlier cleanup contexts close after this one)."""
    holder = Collections(options or Options.from_environment())
    app[COLLECTIONS] = holder
    app.router.add_post(ROUTE, handle)
    app.router.add_get(websocket.WS_ROUTE, websocket.websocket)
    app.router.add_get(USAGE_ROUTE, usage)

    async def shutdown(app: web.Application) -> None:
        """Idle WebSockets close now; busy ones right after their answer."""
        holder.closing = True
        await holder.close_idle(0, b"the service is shutting down: reconnect")

    app.on_shutdown.append(shutdown)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        o = holder.options
        store = app[COLLECTIONS_STORE] if COLLECTIONS_STORE in app else app[STORE]
        holder.engine = Engine(
            store,
            flush_interval=o.flush_interval,
            max_batch=o.max_batch,
            max_buffer=o.max_buffer,
            max_wait=o.max_wait,
            owners=o.owners,
            owner_ttl=o.owner_ttl,
        )
        holder.quota = Quota(store, o.limits)
        telemetry.ENGINE.follow(holder.engine)
        loop = asyncio.get_running_loop()
        sweeper = loop.create_task(websocket.close_idle(holder))
        counter = loop.create_task(holder.quota.run())
        listeners = app[VIEW].trust_listeners if VIEW in app else []
        listener = functools.partial(_recheck_soon, loop, holder)
        listeners.append(listener)  # a revoked token's sockets close within the watch's delay
        yield
        listeners.remove(listener)
        sweeper.cancel()
        counter.cancel()
        await holder.engine.close()

    app.cleanup_ctx.append(lifecycle)


_RECHECKS: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)


def _recheck_soon(loop: asyncio.AbstractEventLoop, holder: Collections) -> None:
    task = loop.create_task(websocket.recheck(holder))
    _RECHECKS.add(task)
    task.add_done_callback(_RECHECKS.discard)
