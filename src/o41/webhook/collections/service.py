"""The collections service as an app holds it (``COLLECTIONS``): its options, its engine
and quota once the state store exists, and its open WebSockets, which only it closes."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from o41.collections.engine import Engine
from o41.webhook.collections.quota import Limits, Quota

RECONNECT = 4000  # close code: the operation in flight, if any, was not run; send it again


@dataclass
class Options:
    """How eventual writes are buffered and how long a wait may last (see the engine), and
    the limits per namespace and per token (:mod:`o41.webhook.collections.quota`)."""

    flush_interval: float = 0.05
    max_batch: int = 100
    max_buffer: int = 10_000
    max_wait: float = 25.0
    # a replica may own collections and answer their strong reads (off unless
    # O41_COLLECTIONS_OWNERS=1: a replica from before the owners writes without their
    # guard, so they are turned on once every replica runs a version that writes it)
    owners: bool = False
    owner_ttl: int = 5  # seconds: an owner's lease (a dead owner holds others' writes)
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_environment(cls, limits: Limits | None = None) -> Options:
        """From the environment; ``limits``: the defaults of the limits' variables."""
        env = os.environ
        return cls(
            flush_interval=float(env.get("O41_COLLECTIONS_FLUSH_INTERVAL", cls.flush_interval)),
            max_batch=int(env.get("O41_COLLECTIONS_MAX_BATCH", cls.max_batch)),
            max_buffer=int(env.get("O41_COLLECTIONS_MAX_BUFFER", cls.max_buffer)),
            max_wait=float(env.get("O41_COLLECTIONS_MAX_WAIT", cls.max_wait)),
            owners=env.get("O41_COLLECTIONS_OWNERS", "0") == "1",
            owner_ttl=int(env.get("O41_COLLECTIONS_OWNER_TTL", cls.owner_ttl)),
            limits=Limits.from_environment(env, limits),
        )


@dataclass
class Collections:
    """The app's engine (made once the state store exists, at start-up) and its open
    WebSockets, each with when it last answered (None while it runs an operation)."""

    options: Options
    engine: Engine | None = field(default=None)
    quota: Quota | None = field(default=None)
    sockets: dict[web.WebSocketResponse, float | None] = field(default_factory=dict)
    # the sockets of other clusters' and service tokens' callers, and what checks each
    # again when the view's trust changed (``websocket.recheck``)
    rechecks: dict[web.WebSocketResponse, Callable[[], Awaitable[None]]] = field(
        default_factory=dict
    )
    closing: bool = False

    async def close_idle(self, idle_for: float, why: bytes) -> None:
        """Close the WebSockets that have been idle ``idle_for`` seconds: between two
        operations, so that the client knows its next one was not run."""
        now = time.monotonic()
        for ws, since in list(self.sockets.items()):
            if since is not None and now - since >= idle_for:
                await ws.close(code=RECONNECT, message=why)


COLLECTIONS: web.AppKey[Collections] = web.AppKey("collections")
