"""The usage page (``/usage``), its JSON (``/v1/usage``) and ``/metrics``.

The answers themselves are ``o41.core.usage``; this module reads the counters, checks who
asks and answers; ``o41.webhook.usage_html`` draws the HTML with inline SVG charts.

Who may see the page: the same callers as ``/v1/usage``, a ServiceAccount token of a
namespace listed in the organization's ``spec.namespaces``. A browser cannot send a bearer
header, so the page asks for the token once and keeps it in an HttpOnly, SameSite=Strict
cookie scoped to ``/usage``; an operator reaches it with ``kubectl port-forward``. With
``--authentication none`` (a laptop) the page opens directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from o41.core.usage import (
    DEFAULT_WINDOW,
    WINDOWS,
    Report,
    records_from,
    report,
    window_hours,
)
from o41.core.writes import writable_places
from o41.state import StoreUnavailable
from o41.webhook import auth, errors, metrics
from o41.webhook.errors import problem
from o41.webhook.keys import PRICES, REVIEWER, STORE, USAGE, VIEW
from o41.webhook.prices import load_prices
from o41.webhook.records import usage_prefix
from o41.webhook.scope import organization_for
from o41.webhook.usage import hour
from o41.webhook.usage_html import error_page, organizations, render, sign_in
from o41.webhook.view import OrganizationView

COOKIE = "o41_usage_token"
COOKIE_AGE = 3600  # a `kubectl create token` lasts an hour by default
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make form posts send Origin: null
    "Cache-Control": "no-store",
}

routes = web.RouteTableDef()
metrics_routes = web.RouteTableDef()


def setup(app: web.Application, reviewer: auth.TokenReviewer, *, metrics: bool = True) -> None:
    """Register the routes; the page checks tokens with the app's own ``reviewer``.
    ``metrics``: ``/metrics`` too (false: it is served on a port of its own, see
    :func:`metrics_app`).

    Reads the price table now, so a broken ``O41_PRICES_FILE`` stops the service at start.
    """
    app[PRICES] = load_prices()
    app[REVIEWER] = reviewer
    app.add_routes(routes)
    if metrics:
        app.add_routes(metrics_routes)


def metrics_app() -> web.Application:
    """``/metrics`` alone, for a port of its own: the counters name every organization, and
    a NetworkPolicy can keep a port, not a path, to the scrapers."""
    app = web.Application()
    app.add_routes(metrics_routes)
    return app


# --- the answers ----------------------------------------------------------------------


def window_of(request: web.Request) -> str:
    window = request.query.get("window", DEFAULT_WINDOW)
    if window not in WINDOWS:
        raise problem(400, f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    return window


async def window_records(request: web.Request, org: str, first: str, last: str) -> list[Any]:
    """The counter records of the days the window touches, every replica's, this one's
    unflushed ones included: ranges by day (keys are ``usage/<org>/<hour>/...``), so an
    old history is never read."""
    usage, store = request.app[USAGE], request.app[STORE]
    with contextlib.suppress(StoreUnavailable):
        await usage.flush()
    day, end = dt.date.fromisoformat(first[:10]), dt.date.fromisoformat(last[:10])
    days = []
    while day <= end:
        days.append(day.isoformat())
        day += dt.timedelta(days=1)
    found = await asyncio.gather(*(store.range(usage_prefix(org) + d.encode()) for d in days))
    return [json.loads(kv.value) for kvs in found for kv in kvs]


async def usage_report(request: web.Request, org: OrganizationView, window: str) -> Report:
    """Both answers for ``org`` over ``window``, from every replica's counters."""
    now = hour(time.time())
    try:
        raw = await window_records(request, org.name, *window_hours(now, window))
    except StoreUnavailable as e:
        raise errors.answered(e) from None  # mapped here: the page shows it as HTML
    active = writable_places(loc.facts for loc in request.app[VIEW].locations_of(org.name))
    return report(
        records_from(raw),
        prices=request.app[PRICES],
        now_hour=now,
        window=window,
        locations=active,
    )


@routes.get("/v1/usage")
async def usage_json(request: web.Request) -> web.Response:
    """``GET /v1/usage``: the raw records of the window and both answers, as the page
    shows them (``records`` keeps the shape earlier clients read)."""
    org = organization_for(request.app, request.query.get("organization", ""), _namespace(request))
    rep = await usage_report(request, org, window_of(request))
    return web.json_response(
        {
            "organization": org.name,
            **rep.as_json(),
            "records": [r.as_json() for r in rep.records],
        }
    )


@metrics_routes.get("/metrics")
async def metrics_text(request: web.Request) -> web.Response:
    """This replica's usage counters in the Prometheus text format."""
    body = generate_latest(metrics.METRICS.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# --- who asks ------------------------------------------------------------------------


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        charset="utf-8",
        headers=SECURITY_HEADERS,
    )


async def _caller(request: web.Request, token: str) -> auth.Caller | None:
    reviewer = request.app[REVIEWER]
    if not token and not isinstance(reviewer, auth.NoAuthentication):
        return None
    return await auth.review(reviewer, token)


def _namespace(request: web.Request) -> str:
    return auth.caller(request).namespace


def _token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get(COOKIE, "")


@routes.get("/usage")
async def page(request: web.Request) -> web.Response:
    """The usage page of one organization, or the token form, or the organization list."""
    found = await _caller(request, _token(request))
    if found is None:
        rejected = bool(_token(request))
        response = _html(sign_in(request.query, rejected=rejected), status=401)
        if rejected:
            response.del_cookie(COOKIE, path="/usage")
        return response
    request[auth.CALLER] = found
    name = request.query.get("organization", "")
    if not name:
        mine = (
            o.name
            for o in request.app[VIEW].organizations.values()
            if found.namespace in o.namespaces
        )
        return _html(organizations(sorted(mine), found.namespace))
    try:
        org = organization_for(request.app, name, found.namespace)
        window = window_of(request)
        rep = await usage_report(request, org, window)
    except web.HTTPException as e:
        return _html(error_page(e.status, _message(e)), status=e.status)
    return _html(render(org.name, rep))


@routes.post("/usage")
async def sign_in_post(request: web.Request) -> web.Response:
    """Take the pasted token, check it, keep it in a cookie and go to the page."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return _html(error_page(403, "this form is accepted from the usage page only"), 403)
    try:
        form = await request.post()
    except ValueError:  # no boundary, a broken multipart body, bytes that are not UTF-8
        return _html(error_page(400, "send the sign-in form as the usage page does"), 400)
    query = {k: str(form[k]) for k in ("organization", "window") if form.get(k)}
    target = "/usage" + (f"?{urlencode(query)}" if query else "")
    if form.get("signout"):
        response = _see_other("/usage")
        response.del_cookie(COOKIE, path="/usage")
        return response
    token = str(form.get("token", "")).strip()
    if not token or await _caller(request, token) is None:
        return _html(sign_in(query, rejected=True), status=401)
    response = _see_other(target)
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_AGE,
        path="/usage",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )
    return response


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, **SECURITY_HEADERS})


def _message(e: web.HTTPException) -> str:
    """The ``error`` of a JSON problem, for the HTML page."""
    try:
        return str(json.loads(e.text or "")["error"])
    except (ValueError, KeyError, TypeError):
        return e.reason
