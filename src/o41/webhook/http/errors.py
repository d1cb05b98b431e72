"""Errors as JSON: every refusal says what was wrong and what to do; never a 500 for input.

Every status keeps its own meaning: :func:`problem` answers with aiohttp's exception of
that very status (found by its ``status_code``, whatever arguments its constructor wants),
or one made for a status aiohttp has no class for; aiohttp's own errors keep their headers
(a 405's ``Allow``) when the middleware rewrites them as JSON. Every refusal's body is an
:class:`Error`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Annotated

from aiohttp import hdrs, web
from pydantic import Field
from typing_extensions import TypedDict, Unpack

from o41 import logs
from o41.collections.checks import CollectionError
from o41.core.placement import PlacementRefused
from o41.core.versions import VersionRefused
from o41.core.writes import CommitRefused, WriteRefused
from o41.state import StoreFull, StoreUnavailable
from o41.storage import Reason, StorageError

log = logging.getLogger("o41.webhook.errors")  # its name is a log field: kept


def _subclasses(cls: type[web.HTTPException]) -> Iterator[type[web.HTTPException]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


# aiohttp's classes by status: web.HTTPException's own subclasses, not ours or a library's
_ERRORS: dict[int, type[web.HTTPException]] = {
    cls.status_code: cls
    for cls in _subclasses(web.HTTPException)
    if cls.__module__ == web.HTTPException.__module__ and cls.status_code >= 400
}


def _class_for(status: int) -> type[web.HTTPException]:
    cls = _ERRORS.get(status)
    if cls is None:  # a status aiohttp names no class for: one of its own
        base = web.HTTPClientError if status < 500 else web.HTTPServerError
        cls = _ERRORS[status] = type(f"HTTP{status}", (base,), {"status_code": status})
    return cls


class Details(TypedDict, total=False):
    """What a refusal may say besides its message."""

    location: Annotated[
        str,
        Field(description="A 503 of a location's bucket: the location; begin again without it."),
    ]
    reason: Annotated[
        str,
        Field(
            description="Why, in CamelCase: a location's bucket failed (a 503 of a location), "
            "or a token was refused (a 401, or a 503 when the keys to check it are missing)."
        ),
    ]
    trustDomain: Annotated[
        str | None, Field(description="A refused token's: the trust domain that issued it.")
    ]
    claim: Annotated[str | None, Field(description="A refused token's: the claim at fault.")]
    current: Annotated[
        str | None,
        Field(description="A tag's 409: the version it points at now (null: it does not exist)."),
    ]
    requestId: Annotated[
        str,
        Field(description="The request's id, as in its X-Request-Id header and its log lines."),
    ]


class Error(Details):
    """A refusal: what was wrong and what to do."""

    error: Annotated[str, Field(description="What was wrong and what to do.")]


def problem(
    status: int,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    **details: Unpack[Details],
) -> web.HTTPException:
    """An HTTP error of ``status`` with a JSON body ``{"error": message, ...}`` (an
    :class:`Error`) and ``headers`` (``Retry-After``, ``Allow``), ready to raise. Within a
    request, the body also names its ``requestId`` (``o41.webhook.http.request_ids``), as
    its log lines do."""
    if not 400 <= status <= 599:
        raise ValueError(f"not an error status: {status}")
    cls = _class_for(status)
    body: Error = {"error": message, **details}
    rid = (logs.context.get() or {}).get("request_id")
    if rid is not None:
        body["requestId"] = rid
    # past the constructors that want more (a 405's method, a 413's sizes): the base's,
    # which takes its status from the class
    error = cls.__new__(cls)
    web.HTTPException.__init__(
        error,
        headers=dict(headers or {}),
        text=json.dumps(body),
        content_type="application/json",
    )
    return error


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_KEPT = frozenset(h.lower() for h in (hdrs.ALLOW, hdrs.RETRY_AFTER, hdrs.WWW_AUTHENTICATE))


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (404, 405, 413) as JSON too, with their status and headers; a
    bug is a logged 500, with no traceback in the answer."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.content_type == "application/json" or e.status < 400:
            raise
        if isinstance(e, web.HTTPMethodNotAllowed):
            message = (
                f"{e.method} is not allowed on {request.path}: use "
                f"{', '.join(sorted(e.allowed_methods))}"
            )
        else:
            message = e.reason if e.text is None else e.text.strip()
        kept = {k: v for k, v in e.headers.items() if k.lower() in _KEPT}
        raise problem(e.status, message, headers=kept) from None
    except Exception as e:
        mapped = answer(e)
        if mapped is not None:
            raise mapped from None
        log.exception("unexpected error on %s %s", request.method, request.path)
        raise problem(500, "internal error; it has been logged") from None


# --- the service's failures as answers: the one place they are mapped --------------------


class LocationFailed(Exception):
    """A location's bucket failed a request of this write (``error``)."""

    def __init__(self, location: str, error: StorageError) -> None:
        super().__init__(f"location {location!r}: {error}")
        self.location, self.error = location, error


def answer(e: Exception) -> web.HTTPException | None:
    """The HTTP answer to a failure of the service or of a rule, None for a bug."""
    if isinstance(e, StoreFull):  # no retry helps: an administrator must free space
        return problem(507, str(e))
    if isinstance(e, StoreUnavailable):
        return problem(503, f"the state store is unavailable ({e}); retry shortly")
    if isinstance(e, CollectionError):  # a collections refusal: its status, its words
        retry_after: int | None = getattr(e, "retry_after", None)
        retry = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return problem(e.status, str(e), headers=retry)
    if isinstance(e, WriteRefused | VersionRefused):
        return problem(400, str(e))
    if isinstance(e, PlacementRefused | CommitRefused):
        return problem(409, str(e))
    if isinstance(e, LocationFailed):
        if e.error.reason == Reason.UPLOAD_INCOMPLETE:
            return problem(
                409, f"the upload is incomplete: {e.error}; upload every part, then commit"
            )
        return problem(
            503,
            f"location {e.location!r} cannot take this request now ({e.error.reason}): "
            f"{e.error}; begin again with it excluded",
            location=e.location,
            reason=e.error.reason,
        )
    return None


def answered(e: Exception) -> web.HTTPException:
    """:func:`answer`, or a 500 for what it does not know (for views that answer HTML)."""
    return answer(e) or problem(500, "internal error; it has been logged")
