"""The directory versions' routes: begin and commit one, list its files, read one file."""

from __future__ import annotations

from aiohttp import web

from o41.core.directories import MAX_FILES
from o41.core.jsonlimits import MAX_CONTAINERS
from o41.webhook.directories import read, write
from o41.webhook.directories.write import DirectoryBeginIn, DirectoryCommitIn
from o41.webhook.http.answers import json_answer
from o41.webhook.http.bodies import parse
from o41.webhook.http.errors import problem
from o41.webhook.identity.auth import caller
from o41.webhook.writes.bodies import again_of, reader_place

routes = web.RouteTableDef()


@routes.post("/v1/directories")
async def begin_directory(request: web.Request) -> web.Response:
    """Begin a directory version: one location for all its files, one upload per file."""
    # an object per file, and the metadata's and place's own
    body: DirectoryBeginIn = await parse(
        request, DirectoryBeginIn, containers=MAX_FILES + MAX_CONTAINERS
    )
    began = await write.begin(request.app, caller(request), body)
    return json_answer(began, status=201)


@routes.post("/v1/directories/{version}/commit")
async def commit_directory(request: web.Request) -> web.Response:
    """Make a directory version readable, once the bucket holds every file."""
    body: DirectoryCommitIn = await parse(request, DirectoryCommitIn)
    version = request.match_info["version"]
    return json_answer(await write.commit(request.app, caller(request), version, body))


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}/files")
async def list_files(request: web.Request) -> web.Response:
    """A directory version's files; ``?download=true`` signs a download of each."""
    reader = reader_place(request).place
    flag = request.query.get("download", "false")
    if flag not in ("true", "false"):
        raise problem(400, f"download must be true or false, not {flag[:20]!r}")
    m = request.match_info
    found = await read.files(
        request.app,
        caller(request),
        m["organization"],
        m["artifact"],
        m["version"],
        reader,
        download=flag == "true",
    )
    return json_answer(found)


@routes.get(
    "/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}/files/{path:.+}"
)
async def read_file(request: web.Request) -> web.Response:
    """One file of a directory version: where it lives and a download."""
    reader = reader_place(request).place
    m = request.match_info
    found = await read.read_file(
        request.app,
        caller(request),
        m["organization"],
        m["artifact"],
        m["version"],
        m["path"],
        reader,
        again=again_of(request),
    )
    return json_answer(found)
