"""The usage page (``/usage``) and its JSON (``/v1/usage``).

The answers themselves are ``o41.core.usage``; this module reads the counters, checks who
asks and answers; ``o41.webhook.usage.html`` draws the HTML with inline SVG charts.

Who may see the page: the same callers as ``/v1/usage``, a ServiceAccount token of a
namespace listed in the organization's ``spec.namespaces``. A browser cannot send a bearer
header, so the page asks for the token once and keeps it in an HttpOnly, SameSite=Strict
cookie scoped to ``/usage``; an operator reaches it with ``kubectl port-forward``. With
``--authentication none`` (a laptop) the page opens directly.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from typing import Annotated, Any
from urllib.parse import urlencode

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from o41.core.advice import page_advice
from o41.core.organization import Effective
from o41.core.usage import (
    DEFAULT_WINDOW,
    WINDOWS,
    Record,
    Report,
    Span,
    merged,
    records_from,
    report,
    window_span,
)
from o41.core.writes import writable_places
from o41.state import Store, StoreUnavailable
from o41.webhook.cluster.scope import organization_for
from o41.webhook.cluster.view import VIEW, OrganizationView
from o41.webhook.http import errors
from o41.webhook.http.answers import json_answer
from o41.webhook.http.errors import problem
from o41.webhook.http.store import STORE
from o41.webhook.identity import auth
from o41.webhook.usage.answers import UsageRecordsOut, record_json, report_json
from o41.webhook.usage.cache import OpenRecords, closed
from o41.webhook.usage.counters import USAGE, Granularity, flushed, hour, periods
from o41.webhook.usage.html import error_page, organizations, render, sign_in
from o41.webhook.usage.prices import PRICES, STORAGE_PRICES, load_prices

COOKIE = "o41_usage_token"
PAGE_LIMIT, MAX_PAGE_LIMIT = 1000, 5000  # raw records per page of /v1/usage?records=true
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

REVIEWER: web.AppKey[auth.TokenReviewer] = web.AppKey("usage_reviewer")

routes = web.RouteTableDef()


def setup(app: web.Application, reviewer: auth.TokenReviewer, *, page: bool = True) -> None:
    """Register the routes; the page checks tokens with the app's own ``reviewer``.
    ``page=False``: only ``/v1/usage`` (a port exposed outside the cluster serves no
    sign-in form; docs/chart.md, "Reaching the service from outside").

    Reads the price table now, so a broken ``O41_PRICES_FILE`` stops the service at start.
    """
    app[PRICES] = load_prices()
    app[REVIEWER] = reviewer
    app.add_routes(r for r in routes if page or getattr(r, "path", "") != "/usage")


# --- the answers ----------------------------------------------------------------------


def window_of(request: web.Request) -> str:
    window = request.query.get("window", DEFAULT_WINDOW)
    if window not in WINDOWS:
        raise problem(400, f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    return window


def span_of(request: web.Request, window: str, now: float) -> Span:
    """The hours and days ``window`` reads: hourly records only where they are kept."""
    usage = request.app[USAGE]
    return window_span(hour(now), window, hourly_since=hour(now - usage.hourly_days * 86400))


Period = tuple[Granularity, str, bytes]


def _plan(org: str, span: Span) -> list[Period]:
    return periods("hour", span.hours, org) + periods("day", span.days, org)


async def _read(store: Store, plan: list[Period], parsed: OpenRecords) -> list[Record]:
    """The records of the periods of ``plan``; ``parsed``: the records already parsed at
    the same revision of their key (only the keys changed since are parsed again)."""
    found = await asyncio.gather(*(store.range(prefix) for _, _, prefix in plan))
    kept, fresh = parsed.split([kv for kvs in found for kv in kvs])
    return [*kept, *parsed.keep(fresh, _loaded([kv.value for kv in fresh]))]


async def _read_each(store: Store, plan: list[Period]) -> list[list[Record]]:
    """The records of each period of ``plan``."""
    found = await asyncio.gather(*(store.range(prefix) for _, _, prefix in plan))
    return [_parsed([kv.value for kv in kvs]) for kvs in found]


def _parsed(values: list[bytes]) -> list[Record]:
    return records_from(_loaded(values))


def _loaded(values: list[bytes]) -> list[Any]:
    """The JSON of each value; None for a damaged one."""
    try:  # one parse for all: a fifth faster than one each
        loaded: list[Any] = json.loads(b"[" + b",".join(values) + b"]")
    except ValueError:  # a damaged record: parse them one by one
        return [_loads(v) for v in values]
    if len(loaded) != len(values):  # a value that was not one JSON document
        return [_loads(v) for v in values]
    return loaded


def _loads(value: bytes) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


async def span_records(request: web.Request, org: str, span: Span) -> list[Record]:
    """The records of ``span``: every replica's, this one's unflushed ones included.
    The periods that are over are merged once and kept an hour, each period and the
    window's set of them (:class:`o41.webhook.usage.cache.ClosedPeriods`): when the window moves
    on by an hour or a day, only the new period is read. The open hour or day is read
    each time."""
    usage, store = request.app[USAGE], request.app[STORE]
    await flushed(usage)
    now = time.time()
    plan = _plan(org, span)
    over = [p for p in plan if closed(p[0], p[1], now)]
    key = (org, tuple(f"{g}:{name}" for g, name, _ in over))
    past = usage.closed.get(key, now)
    if past is None:
        parts: list[list[Record]] = []
        missing: list[Period] = []
        for g, name, prefix in over:
            one = usage.closed.get((org, (f"{g}:{name}",)), now)
            if one is None:
                missing.append((g, name, prefix))
            else:
                parts.append(one)
        for period, records in zip(missing, await _read_each(store, missing), strict=True):
            one = merged(records)
            usage.closed.put((org, (f"{period[0]}:{period[1]}",)), one, now)
            parts.append(one)
        past = merged(r for part in parts for r in part)
        usage.closed.put(key, past, now)
    current = await _read(store, [p for p in plan if p not in over], usage.open_records)
    return [*past, *current]  # the report merges them


async def usage_report(request: web.Request, org: OrganizationView, window: str) -> Report:
    """Both answers for ``org`` over ``window``, from every replica's counters; where a
    new location pays is the net advice (``o41.core.advice``)."""
    now = time.time()
    span = span_of(request, window, now)
    try:
        records = await span_records(request, org.name, span)
    except StoreUnavailable as e:
        raise errors.answered(e) from None  # mapped here: the page shows it as HTML
    facts = [loc.facts for loc in request.app[VIEW].locations_of(org.name)]
    advise = page_advice(
        prices=request.app[PRICES],
        storage=STORAGE_PRICES,
        locations=facts,
        in_force=Effective(org.fallback, org.cloud_defaults, org.takes_writes),
        held_hours=WINDOWS[window],
    )
    return report(
        records,
        prices=request.app[PRICES],
        now_hour=hour(now),
        window=window,
        locations=writable_places(facts),
        span=span,
        advise=advise,
    )


def _limit(request: web.Request) -> int:
    text = request.query.get("limit", str(PAGE_LIMIT))
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE_LIMIT:
        raise problem(400, f"limit must be a whole number from 1 to {MAX_PAGE_LIMIT}, got {text!r}")
    return limit


def _cursor(text: str, plan: list[Period]) -> tuple[int, bytes]:
    """The period index and the key a page goes on after; only a key of the caller's
    organization in this window's periods is a cursor."""
    try:
        key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, binascii.Error):
        key = b""
    for i, (_, _, prefix) in enumerate(plan):
        if key.startswith(prefix) and len(key) > len(prefix):
            return i, key
    raise problem(
        400,
        "cursor is not one of this organization's usage pages for this window: "
        "pass the `next` of the previous page, with the same organization and window",
    )


async def record_page(request: web.Request, org: str, window: str) -> UsageRecordsOut:
    """One page of the raw stored records of ``window`` (hourly for the hours before its
    first whole day, daily after), in key order, and the cursor of the next."""
    limit = _limit(request)
    now = time.time()
    span = span_of(request, window, now)
    plan = _plan(org, span)
    first, after = 0, b""
    if "cursor" in request.query:
        first, after = _cursor(request.query["cursor"], plan)
    store = request.app[STORE]
    found: list[Any] = []
    last = b""
    try:
        await flushed(request.app[USAGE])
        for i in range(first, len(plan)):
            start = after + b"\0" if i == first and after else b""
            kvs = await store.range(plan[i][2], limit=limit - len(found), start=start)
            found += kvs
            if len(found) >= limit:
                last = kvs[-1].key
                break
    except StoreUnavailable as e:
        raise errors.answered(e) from None
    return {
        "organization": org,
        "window": window,
        "from": span.first_hour,
        "to": span.last_hour,
        "records": [record_json(r) for r in records_from(json.loads(kv.value) for kv in found)],
        "next": base64.urlsafe_b64encode(last).decode().rstrip("=") if last else None,
    }


@routes.get("/v1/usage")
async def usage_json(request: web.Request) -> web.Response:
    """``GET /v1/usage``: both answers of the window, as the page shows them. With
    ``records=true``, a page of the window's raw records instead (``limit``, and the
    ``cursor`` of the previous page's ``next``)."""
    org = organization_for(request.app, request.query.get("organization", ""), auth.caller(request))
    window = window_of(request)
    raw = request.query.get("records", "false")
    if raw not in ("true", "false"):
        raise problem(400, f"records must be true or false, got {raw!r}")
    if raw == "true":
        return json_answer(await record_page(request, org.name, window))
    rep = await usage_report(request, org, window)
    return json_answer(report_json(org.name, rep))


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
    try:
        return await auth.review(reviewer, token)
    except web.HTTPUnauthorized:  # another cluster's token, refused: the sign-in form
        return None


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
            if o.admits(found.trust_domain, found.namespace, found.service_account)
        )
        return _html(organizations(sorted(mine), found.namespace))
    try:
        org = organization_for(request.app, name, found)
        window = window_of(request)
        rep = await usage_report(request, org, window)
    except web.HTTPException as e:
        return _html(error_page(e.status, _message(e)), status=e.status)
    return _html(render(org.name, rep))


class SignInForm(TypedDict, total=False):
    """The usage page's sign-in form (``application/x-www-form-urlencoded``)."""

    token: Annotated[str, Field(description="A ServiceAccount token, pasted.")]
    organization: Annotated[str, Field(description="The page to go to once signed in.")]
    window: Annotated[str, Field(description="The window to show there.")]
    signout: Annotated[str, Field(description="Not empty: sign out (forget the cookie).")]


@routes.post("/usage")
async def sign_in_post(request: web.Request) -> web.Response:
    """Take the pasted token (a :class:`SignInForm`), check it, keep it in a cookie and go
    to the page."""
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
    return _signed_in(target, token, secure=request.secure)


def _signed_in(target: str, token: str, *, secure: bool) -> web.Response:
    """Go to ``target``, keeping the checked token in the page's own cookie (HTTP only,
    same site, an hour: a `kubectl create token` lasts that long by default)."""
    response = _see_other(target)
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_AGE,
        path="/usage",
        httponly=True,
        samesite="Strict",
        secure=secure,
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
