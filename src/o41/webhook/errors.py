"""Errors as JSON: every refusal says what was wrong and what to do; never a 500 for input."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    401: web.HTTPUnauthorized,
    403: web.HTTPForbidden,
    404: web.HTTPNotFound,
    409: web.HTTPConflict,
    413: web.HTTPRequestEntityTooLarge,
    415: web.HTTPUnsupportedMediaType,
    422: web.HTTPUnprocessableEntity,
    429: web.HTTPTooManyRequests,
    503: web.HTTPServiceUnavailable,
    500: web.HTTPInternalServerError,
    504: web.HTTPGatewayTimeout,
}


def problem(status: int, message: str, **extra: Any) -> web.HTTPException:
    """An HTTP error with a JSON body ``{"error": message, ...}``, ready to raise."""
    body = json.dumps({"error": message, **extra})
    cls = _ERRORS.get(status, web.HTTPBadRequest)
    if cls is web.HTTPRequestEntityTooLarge:
        return web.HTTPRequestEntityTooLarge(
            max_size=extra.get("max_size", 0),
            actual_size=extra.get("actual_size", 0),
            text=body,
            content_type="application/json",
        )
    return cls(text=body, content_type="application/json")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (404, 405, 413) as JSON too; a bug is a logged 500, with no
    traceback in the answer."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.content_type == "application/json" or e.status < 400:
            raise
        raise problem(e.status, e.reason if e.text is None else e.text.strip()) from None
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        raise problem(500, "internal error; it has been logged") from None
