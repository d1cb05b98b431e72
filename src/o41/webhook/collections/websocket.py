"""The collections' WebSocket: many operations over one connection, answered in order
(see ``o41.webhook.collections`` for the messages). Its token is checked again every
``RECHECK`` seconds, and the service closes it only between two operations.

A client whose token rotated (the kubelet renews a projected token, which then expires)
sends the new one in band, ``{"auth": "<token>"}``: accepted when it names the same
caller (answered ``{"status": 200}``), the connection goes on with it; else it is
answered 401 and closed. So a long-lived connection outlives the token it began with."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from o41.collections import wire
from o41.collections.checks import BadRequest, CollectionError
from o41.collections.engine import Engine
from o41.core.jsonlimits import TooDeep, check_depth
from o41.webhook import telemetry
from o41.webhook.collections.operations import engine_of, perform
from o41.webhook.collections.quota import LimitReached, Quota
from o41.webhook.collections.service import COLLECTIONS as COLLECTIONS  # its tests read it here
from o41.webhook.collections.service import RECONNECT, Collections
from o41.webhook.http.errors import problem
from o41.webhook.identity import auth

log = logging.getLogger("o41.webhook.collections")  # its name is a log field: kept

WS_ROUTE = "/v1/collections"
RECHECK = 30.0  # seconds between checks of a WebSocket's token (the reviewer's cache TTL)
IDLE = 120.0  # seconds without a message before the service closes a WebSocket
MAX_MESSAGE = 1024 * 1024  # bytes: a value at the limit, base64, with room to spare
PROTOCOL = wire.PROTOCOL  # the WebSocket subprotocol (tests set another)
REFUSED = b"the token is no longer accepted: reconnect"


async def websocket(request: web.Request) -> web.WebSocketResponse:
    """Operations over one WebSocket, one at a time, answered in order; see
    ``o41.webhook.collections`` for the messages and when the service closes it."""
    engine = engine_of(request)
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
    refused: bool = False  # its token is no longer accepted: closed before its next operation

    async def serve(self, ws: web.WebSocketResponse, who: auth.Caller) -> None:
        holder = self.holder
        holder.sockets[ws] = checked = time.monotonic()
        if who.trust_domain is not None:  # the view's watch knows when such a token goes
            holder.rechecks[ws] = lambda: self.recheck(ws, who)
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
                parsed = _parse(message.data)
                renewing = isinstance(parsed, dict) and "auth" in parsed
                if self.refused or (time.monotonic() - checked > RECHECK and not renewing):
                    if self.refused or await _recheck(self.credential) != who:
                        why, running = REFUSED, False
                        break
                    checked = time.monotonic()
                answer: str | None
                if isinstance(parsed, dict) and renewing:
                    answer, accepted = await self._reauthenticate(parsed, who)
                    if not accepted:
                        with contextlib.suppress(ConnectionError):
                            await ws.send_str(answer)
                        why, running = b"the new token is not accepted: reconnect", False
                        break
                    checked = time.monotonic()
                elif isinstance(parsed, dict):
                    answer = await _perform(
                        self.engine, who.tenant, parsed, holder.quota, self.credential
                    )
                else:
                    answer = parsed
                try:
                    if answer is not None:
                        await ws.send_str(answer)
                except ConnectionError:
                    break  # the client went away while its operation ran
                holder.sockets[ws], running = time.monotonic(), False
        finally:
            telemetry.WEBSOCKETS.dec()
            holder.sockets.pop(ws, None)
            holder.rechecks.pop(ws, None)
            if ws.closed:
                pass
            elif running:  # cancelled during an operation (a shutdown that ran out of time)
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"stopped during the operation")
            else:
                await ws.close(code=RECONNECT, message=why)

    async def recheck(self, ws: web.WebSocketResponse, who: auth.Caller) -> None:
        """The view's trust changed (a service token revoked, a TrustDomain or its keys
        gone): the token is checked now, and an idle socket whose token is refused is
        closed at once; a busy one right after its answer."""
        if self.refused or await _recheck(self.credential) == who:
            return
        self.refused = True
        if self.holder.sockets.get(ws) is not None:  # idle: between two operations
            await ws.close(code=RECONNECT, message=REFUSED)

    async def _reauthenticate(self, message: dict[str, Any], who: auth.Caller) -> tuple[str, bool]:
        """A rotated token sent in band: taken when it names the same caller."""
        token = message.get("auth")
        ident = message.get("id")
        if not isinstance(token, str) or not token:
            return _refusal(ident, 400, "auth must be the new token, as text"), False
        credential = auth.Credential(token, self.credential.reviewer)
        if await _recheck(credential) != who:
            refusal = "the new token is not accepted as this connection's caller: reconnect"
            return _refusal(ident, 401, refusal), False
        self.credential = credential
        return wire.dumps({"id": ident, "status": 200, "result": {}}).decode(), True


async def _recheck(credential: auth.Credential) -> auth.Caller | None:
    """Who the token is now; None if it cannot be checked now either (the client
    reconnects, and the upgrade says why if that lasts)."""
    try:
        return await credential.check()
    except Exception:
        log.exception("checking a WebSocket's token again failed")
        return None


def _parse(data: str) -> dict[str, Any] | str:
    """A message as a JSON object, or the refusal to answer it with."""
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
    return message


async def _perform(
    engine: Engine,
    namespace: str,
    message: dict[str, Any],
    quota: Quota | None = None,
    credential: auth.Credential | None = None,
) -> str | None:
    """The answer to one operation, refusals included (the socket stays open); None for
    a quiet message that was not refused."""
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


async def recheck(holder: Collections) -> None:
    """Every socket of another cluster's or a service token's caller checked again, at
    once (the checks are offline: no round trip)."""
    await asyncio.gather(*(check() for check in list(holder.rechecks.values())))


async def close_idle(holder: Collections) -> None:
    """Close WebSockets idle for :data:`IDLE` (a client that vanished without closing
    leaves one); cheaper than a timeout on every receive."""
    while True:
        await asyncio.sleep(IDLE / 4)
        await holder.close_idle(IDLE, b"idle: reconnect")


def _text(message: dict[str, Any], what: str) -> str:
    value = message.get(what)
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be text")
    return value
