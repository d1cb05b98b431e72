"""The distributed collections over HTTP, one operation per request or many over a WebSocket.

``POST /v1/collections/{compute}/{kind}/{name}/{op}``: the body is a JSON object of the
operation's arguments (values base64, keys in their canonical text: see
:mod:`o41.collections.keys`); the answer is a JSON object.

``GET /v1/collections`` upgraded to a WebSocket carries the same operations without
HTTP's cost per request (half the service's CPU per operation): each text message is
``{"id", "compute", "kind", "name", "op", "args"}`` and is answered, in order, by
``{"id", "status": 200, "result"}`` or ``{"id", "status", "error"}`` with the status the
POST would have had. A message with ``"quiet": true`` is answered only when refused (a
lock's early release: the client does not wait for it, and an answer would only wake it
up); a client knows the service takes quiet messages when it chose the subprotocol
:data:`PROTOCOL` at the upgrade (a WebSocket ping is answered after every message before
it, so a client that must know reads up to its pong). The token is checked at the
upgrade and again every :data:`RECHECK` seconds. The service closes a WebSocket only
between operations, with :data:`RECONNECT` (idle, token no longer accepted, shutting
down): a close in place of an answer means the operation was not run, and the client
sends it again on a new connection.

The namespace is the authenticated caller's (its ServiceAccount token), never the
request's: two namespaces with the same compute and collection names share nothing.

``GET /v1/collections/usage``: the caller's namespace's bytes and entries, counted now,
and the limits (:mod:`o41.webhook.quota`).

Refusals: 400 bad name, key or argument, or a body nested too deep; 409 a barrier's
parties differ; 413 a value over the limit; 429 the namespace's quota (what to do) or the
token's rate (with ``Retry-After``; over the WebSocket ``retry_after``); 503 etcd cannot
answer now (a write that failed this way may or may not have been applied) or too many
eventual writes wait for etcd. Waits (barrier, lock) are bounded
per request (``max_wait``, 25 s); the client comes back for more.

``python -m o41.webhook.collections`` serves the collections alone (tests, benchmarks),
without authentication: everyone is ``--namespace``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from o41.collections import wire
from o41.collections.checks import BadRequest, CollectionError, Full, Unavailable
from o41.collections.engine import Engine
from o41.jsonlimits import TooDeep, check_depth
from o41.state import EtcdTls, StoreFull, StoreUnavailable, open_store, store_settings
from o41.webhook import auth, errors, telemetry
from o41.webhook.errors import problem
from o41.webhook.keys import COLLECTIONS as COLLECTIONS  # its tests read it here
from o41.webhook.keys import STORE
from o41.webhook.quota import FREEING, LimitReached, Limits, Quota, cost, sent

log = logging.getLogger(__name__)

ROUTE = "/v1/collections/{compute}/{kind}/{name}/{op}"
WS_ROUTE = "/v1/collections"
USAGE_ROUTE = "/v1/collections/usage"
RECHECK = 30.0  # seconds between checks of a WebSocket's token (the reviewer's cache TTL)
IDLE = 120.0  # seconds without a message before the service closes a WebSocket
RECONNECT = 4000  # close code: the operation in flight, if any, was not run; send it again
MAX_MESSAGE = 1024 * 1024  # bytes: a value at the limit, base64, with room to spare
PROTOCOL = wire.PROTOCOL  # the WebSocket subprotocol (tests set another)


@dataclass
class Options:
    """How eventual writes are buffered and how long a wait may last (see the engine), and
    the limits per namespace and per token (:mod:`o41.webhook.quota`)."""

    flush_interval: float = 0.05
    max_batch: int = 100
    max_buffer: int = 10_000
    max_wait: float = 25.0
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
    closing: bool = False

    async def close_idle(self, idle_for: float, why: bytes) -> None:
        """Close the WebSockets that have been idle ``idle_for`` seconds: between two
        operations, so that the client knows its next one was not run."""
        now = time.monotonic()
        for ws, since in list(self.sockets.items()):
            if since is not None and now - since >= idle_for:
                await ws.close(code=RECONNECT, message=why)


def setup(app: web.Application, options: Options | None = None) -> None:
    """Add the collections' routes to ``app``; its state store is ``app[STORE]`` once
    started. On shutdown, buffered eventual writes are written out before the store closes
    (the app's earlier cleanup contexts close after this one)."""
    holder = Collections(options or Options.from_environment())
    app[COLLECTIONS] = holder
    app.router.add_post(ROUTE, handle)
    app.router.add_get(WS_ROUTE, websocket)
    app.router.add_get(USAGE_ROUTE, usage)

    async def shutdown(app: web.Application) -> None:
        """Idle WebSockets close now; busy ones right after their answer."""
        holder.closing = True
        await holder.close_idle(0, b"the service is shutting down: reconnect")

    app.on_shutdown.append(shutdown)

    async def sweep() -> None:
        """Close WebSockets idle for :data:`IDLE` (a client that vanished without closing
        leaves one); cheaper than a timeout on every receive."""
        while True:
            await asyncio.sleep(IDLE / 4)
            await holder.close_idle(IDLE, b"idle: reconnect")

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        o = holder.options
        holder.engine = Engine(
            app[STORE],
            flush_interval=o.flush_interval,
            max_batch=o.max_batch,
            max_buffer=o.max_buffer,
            max_wait=o.max_wait,
        )
        holder.quota = Quota(app[STORE], o.limits)
        telemetry.ENGINE.follow(holder.engine)
        loop = asyncio.get_running_loop()
        sweeper, counter = loop.create_task(sweep()), loop.create_task(holder.quota.run())
        yield
        sweeper.cancel()
        counter.cancel()
        await holder.engine.close()

    app.cleanup_ctx.append(lifecycle)


async def handle(request: web.Request) -> web.Response:
    """One operation, POSTed; refusals are answered by ``errors`` with their status."""
    body = await request.read()
    try:
        check_depth(body, what="the body")
        args = json.loads(body) if body else {}
    except TooDeep as e:
        raise problem(400, str(e)) from None
    except (ValueError, UnicodeDecodeError):
        raise problem(400, "the body must be a JSON object of the operation's arguments") from None
    m = request.match_info
    where = (m["compute"], m["kind"], m["name"], m["op"])
    engine, quota = _engine(request), request.app[COLLECTIONS].quota
    caller = auth.caller(request).namespace, request[auth.CREDENTIAL].token
    result = await perform(engine, caller[0], *where, args, quota, caller[1])
    return web.json_response(result)


async def perform(
    engine: Engine,
    namespace: str,
    compute: str,
    kind: str,
    name: str,
    op: str,
    args: object,
    quota: Quota | None = None,
    token: str = "",
) -> dict[str, Any]:
    """One operation of ``namespace``'s caller (holding ``token``), as either route
    received it: its answer, JSON-ready; a refusal raises :class:`CollectionError` with
    the status to answer. ``quota``: the limits, checked in memory (no etcd round trip)."""
    if not isinstance(args, dict):
        raise BadRequest("the arguments must be a JSON object")
    if "value" in args:
        try:
            args["value"] = base64.b64decode(args["value"], validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise BadRequest("value must be base64 text") from None
    if quota is not None:
        quota.take(token, sent(args))
        more = cost(namespace, compute, kind, name, op, args)
        if more:
            if not quota.fits(namespace, more):
                await quota.admit(namespace, more)
        elif (kind, op) in FREEING:
            quota.freed(namespace)
    labels = telemetry.collection_labels(engine.operations(), kind, op, args)
    start, outcome = time.perf_counter(), "refused"
    try:
        result = await engine.call(namespace, compute, kind, name, op, args)
        outcome = "ok"
    except StoreFull as e:
        outcome = "unavailable"
        raise Full(str(e)) from None
    except StoreUnavailable as e:
        outcome = "unavailable"
        raise Unavailable(f"the state store cannot answer now: {e}") from None
    finally:
        telemetry.collection_done(labels, outcome, time.perf_counter() - start)
    return _encode(result)


def _engine(request: web.Request) -> Engine:
    engine = request.app[COLLECTIONS].engine
    if engine is None:
        raise problem(503, "the collections are starting: try again")
    return engine


async def websocket(request: web.Request) -> web.WebSocketResponse:
    """Operations over one WebSocket, one at a time, answered in order; see the module
    docstring for the messages and when the service closes it."""
    engine = _engine(request)
    ws = web.WebSocketResponse(
        max_msg_size=MAX_MESSAGE, compress=False, autoping=True, protocols=(PROTOCOL,)
    )
    if not ws.can_prepare(request).ok:
        raise problem(
            400,
            f"GET {WS_ROUTE} is the collections' WebSocket: send 'Upgrade: websocket', or POST "
            "one operation to /v1/collections/{compute}/{kind}/{name}/{op}",
        )
    await ws.prepare(request)
    session = _Session(engine, request.app[COLLECTIONS], request[auth.CREDENTIAL])
    await session.serve(ws, auth.caller(request))
    return ws


@dataclass
class _Session:
    """One WebSocket's operations: its token is checked again every ``RECHECK`` seconds,
    and a shutdown closes it only between two operations (``holder.sockets``)."""

    engine: Engine
    holder: Collections
    credential: auth.Credential

    async def serve(self, ws: web.WebSocketResponse, who: auth.Caller) -> None:
        holder = self.holder
        holder.sockets[ws] = checked = time.monotonic()
        why, running = b"the service is shutting down: reconnect", False
        telemetry.WEBSOCKETS.inc()
        telemetry.WEBSOCKETS_OPENED.inc()
        try:
            while not holder.closing:
                message = await ws.receive()
                if message.type is WSMsgType.BINARY:
                    await ws.close(
                        code=WSCloseCode.UNSUPPORTED_DATA, message=b"send operations as JSON text"
                    )
                    break
                if message.type is not WSMsgType.TEXT or ws.closed:
                    break  # closed by the client, broken, or closing: not run, it resends
                holder.sockets[ws], running = None, True  # nobody closes it until it answered
                if time.monotonic() - checked > RECHECK:
                    if await _recheck(self.credential) != who:
                        why, running = b"the token is no longer accepted: reconnect", False
                        break
                    checked = time.monotonic()
                answer = await _answer(
                    self.engine, who.namespace, message.data, holder.quota, self.credential
                )
                try:
                    if answer is not None:
                        await ws.send_str(answer)
                except ConnectionError:
                    break  # the client went away while its operation ran
                holder.sockets[ws], running = time.monotonic(), False
        finally:
            telemetry.WEBSOCKETS.dec()
            holder.sockets.pop(ws, None)
            if ws.closed:
                pass
            elif running:  # cancelled during an operation (a shutdown that ran out of time)
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"stopped during the operation")
            else:
                await ws.close(code=RECONNECT, message=why)


async def _recheck(credential: auth.Credential) -> auth.Caller | None:
    """Who the token is now; None if it cannot be checked now either (the client
    reconnects, and the upgrade says why if that lasts)."""
    try:
        return await credential.check()
    except Exception:
        log.exception("checking a WebSocket's token again failed")
        return None


async def _answer(
    engine: Engine,
    namespace: str,
    data: str,
    quota: Quota | None = None,
    credential: auth.Credential | None = None,
) -> str | None:
    """The answer to one WebSocket message, refusals included (the socket stays open);
    None for a quiet message that was not refused."""
    try:
        check_depth(data, what="the message")
        message = wire.loads(data)
    except TooDeep as e:
        return _refusal(None, 400, str(e))
    except ValueError:
        message = None
    if not isinstance(message, dict):
        return _refusal(
            None, 400, "each message must be a JSON object: id, compute, kind, name, op, args"
        )
    ident = message.get("id")
    try:
        compute, kind, name, op = (_text(message, f) for f in ("compute", "kind", "name", "op"))
        args = message.get("args", {})
        token = "" if credential is None else credential.token
        result = await perform(engine, namespace, compute, kind, name, op, args, quota, token)
    except LimitReached as e:
        return _refusal(ident, e.status, str(e), e.retry_after)
    except CollectionError as e:
        return _refusal(ident, e.status, str(e))
    except Exception:
        log.exception("unexpected error on a collections WebSocket")
        return _refusal(ident, 500, "internal error; it has been logged")
    if message.get("quiet") is True:
        return None
    return wire.dumps({"id": ident, "status": 200, "result": result}).decode()


def _refusal(ident: object, status: int, error: str, retry_after: int | None = None) -> str:
    answer: dict[str, Any] = {"id": ident, "status": status, "error": error}
    if retry_after is not None:
        answer["retry_after"] = retry_after  # seconds, as the POST's Retry-After
    return json.dumps(answer)


async def usage(request: web.Request) -> web.Response:
    """``GET /v1/collections/usage``: the caller's namespace's collections (keys and values
    as etcd stores them), counted at most a second ago, with the limits that apply."""
    quota = request.app[COLLECTIONS].quota
    if quota is None:
        raise problem(503, "the collections are starting: try again")
    quota.take(request[auth.CREDENTIAL].token, 0)  # a rate refusal is errors' 429
    return web.json_response(await namespace_usage(quota, auth.caller(request).namespace))


async def namespace_usage(quota: Quota, namespace: str) -> dict[str, Any]:
    """What ``namespace`` holds and the limits, from a count at most a second old."""
    found = quota.namespaces.get(namespace)
    if found is None or found.counted_at is None or time.monotonic() - found.counted_at > 1:
        found = await quota.count(namespace)  # at most one count a second: it reads it all
    if found.counted_at is None or time.monotonic() - found.counted_at > quota.limits.recount:
        raise Unavailable("the state store cannot answer now: try again")
    limits = quota.limits
    return {
        "namespace": namespace,
        "bytes": found.bytes,
        "entries": found.entries,
        "counted": {  # the count alone; bytes and entries add this replica's writes since
            "bytes": found.counted_bytes,
            "entries": found.counted_entries,
            "secondsAgo": round(time.monotonic() - found.counted_at, 3),
        },
        "limits": limits.public(),
        "accuracy": (
            "bytes and entries: keys and values as etcd stores them, counted at most 1 s "
            "ago (plus this replica's writes since); the limits are checked per service "
            f"replica against a count at most {limits.recount:g} s old plus that "
            "replica's writes since"
        ),
    }


def _text(message: dict[str, Any], what: str) -> str:
    value = message.get(what)
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be text")
    return value


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
    parser = argparse.ArgumentParser(prog="python -m o41.webhook.collections", description=__doc__)
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


if __name__ == "__main__":
    sys.exit(main())
