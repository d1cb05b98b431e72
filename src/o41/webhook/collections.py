"""The distributed collections over HTTP: ``POST /v1/collections/{compute}/{kind}/{name}/{op}``.

The body is a JSON object of the operation's arguments (values base64, keys in their
canonical text: see :mod:`o41.collections.keys`); the answer is a JSON object. The
namespace is the authenticated caller's (its ServiceAccount token), never the request's:
two namespaces with the same compute and collection names share nothing.

Refusals are JSON errors: 400 bad name, key or argument; 409 a barrier's parties differ;
413 a value over the limit; 503 etcd cannot answer now (a write that failed this way may or
may not have been applied) or too many eventual writes wait for etcd. Waits (barrier,
lock) are bounded per request (``max_wait``, 25 s); the client comes back for more.

``python -m o41.webhook.collections`` serves the collections alone (tests, benchmarks),
without authentication: everyone is ``--namespace``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from o41.collections.checks import CollectionError
from o41.collections.engine import Engine
from o41.state import StoreUnavailable, open_store
from o41.webhook import auth, errors
from o41.webhook.errors import problem
from o41.webhook.keys import STORE

log = logging.getLogger(__name__)

ROUTE = "/v1/collections/{compute}/{kind}/{name}/{op}"


@dataclass
class Options:
    """How eventual writes are buffered and how long a wait may last (see the engine)."""

    flush_interval: float = 0.05
    max_batch: int = 100
    max_buffer: int = 10_000
    max_wait: float = 25.0

    @classmethod
    def from_environment(cls) -> Options:
        env = os.environ
        return cls(
            flush_interval=float(env.get("O41_COLLECTIONS_FLUSH_INTERVAL", cls.flush_interval)),
            max_batch=int(env.get("O41_COLLECTIONS_MAX_BATCH", cls.max_batch)),
            max_buffer=int(env.get("O41_COLLECTIONS_MAX_BUFFER", cls.max_buffer)),
            max_wait=float(env.get("O41_COLLECTIONS_MAX_WAIT", cls.max_wait)),
        )


@dataclass
class Collections:
    """The app's engine; made once the state store exists (at start-up)."""

    options: Options
    engine: Engine | None = field(default=None)


COLLECTIONS: web.AppKey[Collections] = web.AppKey("collections", Collections)


def setup(app: web.Application, options: Options | None = None) -> None:
    """Add the collections' routes to ``app``; its state store is ``app[STORE]`` once
    started. On shutdown, buffered eventual writes are written out before the store closes
    (the app's earlier cleanup contexts close after this one)."""
    holder = Collections(options or Options.from_environment())
    app[COLLECTIONS] = holder
    app.router.add_post(ROUTE, handle)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        o = holder.options
        holder.engine = Engine(
            app[STORE],
            flush_interval=o.flush_interval,
            max_batch=o.max_batch,
            max_buffer=o.max_buffer,
            max_wait=o.max_wait,
        )
        yield
        await holder.engine.close()

    app.cleanup_ctx.append(lifecycle)


async def handle(request: web.Request) -> web.Response:
    who = auth.caller(request)
    engine = request.app[COLLECTIONS].engine
    if engine is None:
        raise problem(503, "the collections are starting: try again")
    body = await request.read()
    try:
        args = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError):
        raise problem(400, "the body must be a JSON object of the operation's arguments") from None
    if not isinstance(args, dict):
        raise problem(400, "the body must be a JSON object of the operation's arguments")
    if "value" in args:
        try:
            args["value"] = base64.b64decode(args["value"], validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise problem(400, "value must be base64 text") from None
    m = request.match_info
    try:
        result = await engine.call(who.namespace, m["compute"], m["kind"], m["name"], m["op"], args)
    except CollectionError as e:
        raise problem(e.status, str(e)) from None
    except StoreUnavailable as e:
        raise problem(503, f"the state store cannot answer now: {e}") from None
    return web.json_response(_encode(result))


def _encode(result: dict[str, Any]) -> dict[str, Any]:
    value = result.get("value")
    if isinstance(value, bytes):
        result["value"] = base64.b64encode(value).decode()
    items = result.get("items")
    if items is not None:
        result["items"] = [[k, base64.b64encode(v).decode()] for k, v in items]
    return result


# serve the collections alone (tests, benchmarks)


def make_app(
    store_endpoints: list[str], namespace: str, options: Options, store_timeout: float = 5.0
) -> web.Application:
    app = web.Application(
        middlewares=[
            errors.json_errors,
            auth.middleware(auth.NoAuthentication(namespace), required=False),
        ]
    )

    async def state(app: web.Application) -> AsyncIterator[None]:
        app[STORE] = open_store(store_endpoints or None, timeout=store_timeout)
        yield
        await app[STORE].close()

    app.cleanup_ctx.append(state)
    setup(app, options)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m o41.webhook.collections", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--etcd", default="", help="comma-separated etcd client URLs")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--flush-interval", type=float, default=Options.flush_interval)
    parser.add_argument("--max-batch", type=int, default=Options.max_batch)
    parser.add_argument("--max-buffer", type=int, default=Options.max_buffer)
    parser.add_argument("--store-timeout", type=float, default=5.0, help="seconds per etcd call")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = Options(args.flush_interval, args.max_batch, args.max_buffer)
    app = make_app(
        [e for e in args.etcd.split(",") if e], args.namespace, options, args.store_timeout
    )

    async def announce(app: web.Application) -> None:
        print(f"listening on http://{args.host}:{args.port}", flush=True)

    app.on_startup.append(announce)
    web.run_app(
        app, host=args.host, port=args.port, access_log=None, print=None, handle_signals=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
