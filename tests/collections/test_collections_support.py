"""Helpers for the collections' tests: the real service (an aiohttp app on 127.0.0.1) in a
thread of the test process or in a process of its own, and clients of it.

The only stand-in is the token reviewer (an injected interface; the real TokenReview is
tested with the placement service): test tokens map to callers of chosen namespaces.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from o41.client.collections import Client, HttpTransport
from o41.collections.engine import Engine
from o41.state import Store
from o41.webhook.collections import routes
from o41.webhook.http import errors
from o41.webhook.http.store import STORE
from o41.webhook.identity import auth
from testbed.process import LOOPBACK, free_port
from testbed.product import CollectionsProcess

T = TypeVar("T")


class Tokens:
    """Test tokens -> callers (the reviewer is injected; this is its stand-in)."""

    def __init__(self, namespaces: dict[str, str]) -> None:
        self._callers = {t: auth.Caller(ns, "test") for t, ns in namespaces.items()}
        self.down = False  # as the API server's TokenReview when it cannot answer

    async def review(self, token: str) -> auth.Caller | None:
        if self.down:
            raise ConnectionRefusedError("the API server did not answer the TokenReview")
        return self._callers.get(token)

    def grant(self, token: str, namespace: str) -> None:
        self._callers[token] = auth.Caller(namespace, "test")

    def revoke(self, token: str) -> None:
        del self._callers[token]


TOKENS = {"token-a": "team-a", "token-b": "team-b"}


class ServiceThread:
    """The collections' routes in an aiohttp app served on 127.0.0.1, on an event loop of
    its own thread (the clients under test are synchronous)."""

    def __init__(
        self,
        make_store: Callable[[], Store],
        options: routes.Options | None = None,
        tokens: dict[str, str] | None = None,
        *,
        port: int = 0,
        middlewares: list[Any] | None = None,
        shutdown_timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._make_store = make_store
        self._ssl = ssl_context  # serve https
        self._options = options or routes.Options()
        self.tokens = Tokens(tokens or TOKENS)
        self._port = port
        self._middlewares = middlewares or []
        self._shutdown_timeout = shutdown_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.app: web.Application | None = None
        self.url = ""

    def start(self) -> ServiceThread:
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        app = web.Application(
            middlewares=[errors.json_errors, *self._middlewares, auth.middleware(self.tokens)]
        )
        app[STORE] = self._make_store()
        routes.setup(app, self._options)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=self._shutdown_timeout)
        await self._runner.setup()
        port = self._port or free_port()
        await web.TCPSite(self._runner, LOOPBACK, port, ssl_context=self._ssl).start()
        scheme = "https" if self._ssl else "http"
        self.app, self.port, self.url = app, port, f"{scheme}://{LOOPBACK}:{port}"

    @property
    def engine(self) -> Engine:
        assert self.app is not None
        engine = self.app[routes.COLLECTIONS].engine
        assert engine is not None
        return engine

    @property
    def store(self) -> Store:
        assert self.app is not None
        return self.app[STORE]

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def client(
        self, token: str = "token-a", compute: str = "job-1", *, websocket: bool = True
    ) -> Client:
        return Client(HttpTransport(self.url, token=token, websocket=websocket), compute)

    def stop(self) -> None:
        if self._loop.is_closed():
            return  # stopped already
        if self._runner is not None:
            store = self.store
            self.run(self._runner.cleanup())
            self.run(store.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class ServiceProcess(CollectionsProcess):
    """``python -m o41.webhook.collections`` as a process of its own, to be killed."""

    def __init__(self, etcd: list[str], log: Path, *extra: str) -> None:
        super().__init__(etcd, log, extra)

    def client(self, compute: str = "job-1") -> Client:
        return Client(HttpTransport(self.url, token="unused"), compute)
