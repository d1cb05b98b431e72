"""The collections service as an app holds it (``COLLECTIONS``): its options, its engine
and quota once the state store exists, and its open WebSockets, which only it closes."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

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
    # the collections' owners (docs/collections.md, "Owners"): "off" (the default: no
    # owner guard, nobody owns), "guard" (every write carries the guard: a rollout that
    # leads from "off" to "on" goes through it, since a replica without the guard writes
    # past an owner), "on" (the guard, and this replica may own collections)
    owners: Literal["off", "guard", "on"] = "off"
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
            owners=_owners(env.get("O41_COLLECTIONS_OWNERS", cls.owners)),
            owner_ttl=int(env.get("O41_COLLECTIONS_OWNER_TTL", cls.owner_ttl)),
            limits=Limits.from_environment(env, limits),
        )


def _owners(value: str) -> Literal["off", "guard", "on"]:
    if value not in ("off", "guard", "on"):
        raise ValueError(
            f"O41_COLLECTIONS_OWNERS={value!r}: off, guard or on (from off to on, roll out "
            "guard first: docs/collections.md, Owners)"
        )
    return value  # type: ignore[return-value]


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
