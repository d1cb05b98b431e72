"""The collections alone, without authentication (everyone is ``--namespace``): what tests
and benchmarks serve with ``python -m o41.webhook.collections``."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator

from aiohttp import web

from o41.state import EtcdTls, open_store, store_settings
from o41.webhook import collections as package
from o41.webhook import telemetry
from o41.webhook.collections.quota import Limits
from o41.webhook.collections.routes import setup
from o41.webhook.collections.service import Options
from o41.webhook.http import errors
from o41.webhook.http.store import STORE
from o41.webhook.identity import auth


def make_app(
    store_endpoints: list[str],
    namespace: str,
    options: Options,
    store_timeout: float = 5.0,
    tls: EtcdTls | None = None,
) -> web.Application:
    app = web.Application(
        middlewares=[
            telemetry.middleware,
            errors.json_errors,
            auth.middleware(auth.NoAuthentication(namespace), required=False),
        ]
    )

    async def state(app: web.Application) -> AsyncIterator[None]:
        app[STORE] = telemetry.instrumented(
            open_store(store_endpoints or None, timeout=store_timeout, tls=tls)
        )
        yield
        await app[STORE].close()

    app.cleanup_ctx.append(state)
    setup(app, options)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m o41.webhook.collections", description=package.__doc__
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument(
        "--etcd",
        default="",
        help="comma-separated etcd client URLs (https://: TLS, with O41_ETCD_CA_FILE, "
        "O41_ETCD_CERT_FILE and O41_ETCD_KEY_FILE)",
    )
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--flush-interval", type=float, default=Options.flush_interval)
    parser.add_argument("--max-batch", type=int, default=Options.max_batch)
    parser.add_argument("--max-buffer", type=int, default=Options.max_buffer)
    parser.add_argument("--store-timeout", type=float, default=5.0, help="seconds per etcd call")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # without authentication every client is one caller: no rate per token unless asked
    no_rate = Limits(ops_per_second=0, bytes_per_second=0)
    options = Options.from_environment(no_rate)
    options.flush_interval, options.max_batch = args.flush_interval, args.max_batch
    options.max_buffer = args.max_buffer
    try:
        endpoints, tls = store_settings(args.etcd, os.environ)
    except ValueError as e:
        parser.error(str(e))
    app = make_app(endpoints, args.namespace, options, args.store_timeout, tls)

    async def announce(app: web.Application) -> None:
        print(f"listening on http://{args.host}:{args.port}", flush=True)

    app.on_startup.append(announce)
    web.run_app(
        app, host=args.host, port=args.port, access_log=None, print=None, handle_signals=True
    )
    return 0
