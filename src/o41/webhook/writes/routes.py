"""The write path's routes: begin a write, see and resume it, commit it, read a version.
Each view parses its request, calls one function of the write path and answers; failures
become answers in ``o41.webhook.http.errors``."""

from __future__ import annotations

from aiohttp import web

from o41.webhook.http.answers import json_answer
from o41.webhook.http.bodies import parse
from o41.webhook.identity.auth import caller
from o41.webhook.writes import begin as beginning
from o41.webhook.writes import commit as committing
from o41.webhook.writes import pending
from o41.webhook.writes import read as reading
from o41.webhook.writes.bodies import BeginIn, CommitIn, PartsIn, again_of, reader_place

routes = web.RouteTableDef()


@routes.post("/v1/writes")
async def begin(request: web.Request) -> web.Response:
    """Choose the location for a new version and hand out pre-signed upload requests."""
    body: BeginIn = await parse(request, BeginIn)
    began = await beginning.begin(request.app, caller(request), body)
    return json_answer(began, status=201)


@routes.get("/v1/writes/{version}")
async def progress(request: web.Request) -> web.Response:
    """A pending write and the parts its bucket holds: what a resume need not send."""
    version = request.match_info["version"]
    return json_answer(await pending.progress(request.app, caller(request), version))


@routes.post("/v1/writes/{version}/parts")
async def resign(request: web.Request) -> web.Response:
    """Sign the upload of some parts of a pending multipart write again."""
    body: PartsIn = await parse(request, PartsIn)
    version = request.match_info["version"]
    return json_answer(await pending.resign(request.app, caller(request), version, body))


@routes.post("/v1/writes/{version}/commit")
async def commit(request: web.Request) -> web.Response:
    """Make a version readable, once the bucket really holds what was declared."""
    body: CommitIn = await parse(request, CommitIn)
    version = request.match_info["version"]
    return json_answer(await committing.commit(request.app, caller(request), version, body))


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}")
async def read(request: web.Request) -> web.Response:
    """Where a version lives, how far that is from the reader, and a download."""
    reader = reader_place(request).place
    m = request.match_info
    found = await reading.read(
        request.app,
        caller(request),
        m["organization"],
        m["artifact"],
        m["version"],
        reader,
        again=again_of(request),
    )
    return json_answer(found)
