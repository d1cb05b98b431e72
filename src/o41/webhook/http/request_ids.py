"""Every request gets an id: the caller's ``X-Request-Id`` when it is sane, else a new one.

The id is answered in the ``X-Request-Id`` header of every response (errors, WebSocket
upgrades and streamed answers included), carried by every log line written while the
request is handled (``o41.logs``: with ``--log-format json`` its ``request_id`` field), and
put in every error body as ``requestId`` (``o41.webhook.http.errors.problem``). One access line
per request (logger ``o41.webhook.requests``: method, path, status, milliseconds) at INFO;
the probes' and the scrapes' at DEBUG, so a kubelet's every-10-seconds probe does not fill
the log.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from o41 import logs

HEADER = "X-Request-Id"
#: A caller's id is kept when it is 1-128 characters of letters, digits and ``._:-``
#: (a UUID, a trace id); anything else (spaces, quotes, control characters, too long) is
#: replaced by a new id, so no caller can write into another's log line or header.
SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
QUIET = frozenset({"/healthz", "/readyz", "/metrics"})
KEY = web.RequestKey("request_id", str)

log = logging.getLogger("o41.webhook.requests")
ACCESS = "%s %s %d %.1f ms"  # method, path, status, milliseconds

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_id() -> str:
    """32 random hex digits, as a UUID4's hex was (``uuid.uuid4`` took 3.7 us, this 1)."""
    return secrets.token_hex(16)


def request_id(request: web.Request) -> str | None:
    """The id of ``request`` (None before the middleware ran)."""
    return request.get(KEY)


def _given(request: web.Request) -> str | None:
    value = request.headers.get(HEADER, "")
    return value if SANE.fullmatch(value) else None


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: the id, the log context and the access line."""
    rid = _given(request) or new_id()
    request[KEY] = rid
    organization = request.match_info.get("organization")
    started = time.monotonic()
    status = 500  # what a handler that raised something other than an answer becomes
    with logs.about(request_id=rid, organization=organization):
        try:
            response = await handler(request)
        except web.HTTPException as e:
            status = e.status
            e.headers[HEADER] = rid
            raise
        else:
            status = response.status
            return response
        finally:
            level = logging.DEBUG if request.path in QUIET else logging.INFO
            if log.isEnabledFor(level):
                took = (time.monotonic() - started) * 1000
                args = (request.method, request.path, status, took)
                # log.log() but for findCaller's walk of the stack (7 us a request, issue
                # 41): the formats show no file, line or function of the caller
                log.handle(log.makeRecord(log.name, level, __file__, 0, ACCESS, args, None))


async def _header(request: web.Request, response: web.StreamResponse) -> None:
    """The id in the headers of a response a handler prepared itself (a WebSocket's
    upgrade, a streamed body), before they are sent."""
    rid = request.get(KEY)
    if rid is not None and HEADER not in response.headers:
        response.headers[HEADER] = rid


def setup(app: web.Application) -> None:
    """Request ids on ``app``: its outermost middleware and the response-prepare signal."""
    app.middlewares.insert(0, middleware)
    app.on_response_prepare.append(_header)
