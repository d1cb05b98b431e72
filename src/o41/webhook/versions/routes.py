"""The versions' routes: list an organization's artifacts and an artifact's versions,
resolve a reference, list, move and delete tags."""

from __future__ import annotations

from aiohttp import web

from o41.webhook.http.answers import json_answer
from o41.webhook.http.bodies import parse
from o41.webhook.http.errors import problem
from o41.webhook.identity.auth import caller
from o41.webhook.versions import listing, refs
from o41.webhook.versions import tags as tagging
from o41.webhook.versions.tags import TagIn

routes = web.RouteTableDef()


def page(request: web.Request) -> tuple[str | None, int | None]:
    """A listing's ``?cursor=`` and ``?limit=``."""
    q = request.query
    raw = q.get("limit")
    limit = None
    if raw is not None:
        if not raw.isascii() or not raw.isdigit() or len(raw) > 6:
            raise problem(400, f"limit must be a whole number, not {raw[:20]!r}")
        limit = int(raw)
    cursor = q.get("cursor") or None
    if cursor is not None and len(cursor) > 2000:
        raise problem(400, "the cursor is damaged: pass the 'next' of the previous page as it was")
    return cursor, limit


@routes.get("/v1/organizations/{organization}/artifacts")
async def artifacts(request: web.Request) -> web.Response:
    """An organization's artifacts, by name, a page at a time."""
    cursor, limit = page(request)
    return json_answer(
        await listing.list_artifacts(
            request.app,
            caller(request),
            request.match_info["organization"],
            cursor,
            limit,
        )
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/versions")
async def list_versions(request: web.Request) -> web.Response:
    """An artifact's versions, newest first, a page at a time."""
    cursor, limit = page(request)
    m = request.match_info
    return json_answer(
        await listing.list_versions(
            request.app,
            caller(request),
            m["organization"],
            m["artifact"],
            cursor,
            limit,
        )
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/tags")
async def tags(request: web.Request) -> web.Response:
    """An artifact's tags and the versions they point at."""
    m = request.match_info
    return json_answer(
        await tagging.list_tags(request.app, caller(request), m["organization"], m["artifact"])
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/tags/{tag}")
async def resolve(request: web.Request) -> web.Response:
    """The version a tag (or ``latest``, or an id) names, without a download."""
    m = request.match_info
    return json_answer(
        await refs.describe(
            request.app, caller(request), m["organization"], m["artifact"], m["tag"]
        )
    )


@routes.put("/v1/organizations/{organization}/artifacts/{artifact}/tags/{tag}")
async def move_tag(request: web.Request) -> web.Response:
    """Point a tag at a version; compare-and-set when the body says what it expects."""
    body: TagIn = await parse(request, TagIn)
    m = request.match_info
    return json_answer(
        await tagging.move_tag(
            request.app,
            caller(request),
            m["organization"],
            m["artifact"],
            m["tag"],
            body,
        )
    )


@routes.delete("/v1/organizations/{organization}/artifacts/{artifact}/tags/{tag}")
async def delete_tag(request: web.Request) -> web.Response:
    """Delete a tag; with ``?expected=VERSION``, only if it points there."""
    m = request.match_info
    return json_answer(
        await tagging.delete_tag(
            request.app,
            caller(request),
            m["organization"],
            m["artifact"],
            m["tag"],
            request.query.get("expected") or None,
        )
    )
