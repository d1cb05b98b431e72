"""The placement API's views: begin a write, commit it, read a version; list artifacts
and versions, move and delete tags.

Each view parses its request, calls ``o41.webhook.writes`` (which applies the rules of
``o41.core`` around the store and the bucket) and answers; failures become answers in
``o41.webhook.errors``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import ValidationError

from o41.core.directories import MAX_FILES
from o41.jsonlimits import MAX_CONTAINERS, TooDeep, check_depth
from o41.webhook import directories, versions, writes
from o41.webhook.auth import caller
from o41.webhook.directories import DirectoryBeginIn, DirectoryCommitIn
from o41.webhook.errors import problem
from o41.webhook.scope import Model
from o41.webhook.versions import TagIn
from o41.webhook.writes import BeginIn, CommitIn, PartsIn, PlaceIn

__all__ = [
    "BeginIn",
    "CommitIn",
    "DirectoryBeginIn",
    "DirectoryCommitIn",
    "PartsIn",
    "PlaceIn",
    "TagIn",
    "parse",
    "routes",
]

routes = web.RouteTableDef()


async def parse(
    request: web.Request, model: type[Model], *, containers: int = MAX_CONTAINERS
) -> Any:
    """The body as ``model``, or a 400 that names every wrong field. ``containers``: the
    most arrays and objects the body may hold."""
    if request.content_type != "application/json":
        raise problem(415, "send a JSON body with Content-Type: application/json")
    try:
        raw = await request.read()
        check_depth(raw, what="the body", max_containers=containers)
        return model.model_validate_json(raw)
    except TooDeep as e:
        raise problem(400, f"invalid request: {e}") from None
    except ValidationError as e:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
            for err in e.errors(include_url=False)
        )
        raise problem(400, f"invalid request: {fields}") from None


def reader_place(request: web.Request) -> PlaceIn:
    """The reader's place from the query (``?cloud=&region=&source=``)."""
    q = request.query
    given = {"cloud": q.get("cloud") or None, "region": q.get("region") or None}
    try:
        return PlaceIn.model_validate({**given, "source": q.get("source", "none")})
    except ValidationError as e:
        message = e.errors(include_url=False)[0]["msg"]
        raise problem(400, f"invalid place in the query: {message}") from None


@routes.post("/v1/writes")
async def begin(request: web.Request) -> web.Response:
    """Choose the location for a new version and hand out pre-signed upload requests."""
    body: BeginIn = await parse(request, BeginIn)
    began = await writes.begin(request.app, caller(request).namespace, body)
    return web.json_response(began, status=201)


@routes.get("/v1/writes/{version}")
async def progress(request: web.Request) -> web.Response:
    """A pending write and the parts its bucket holds: what a resume need not send."""
    version = request.match_info["version"]
    return web.json_response(await writes.progress(request.app, caller(request).namespace, version))


@routes.post("/v1/writes/{version}/parts")
async def resign(request: web.Request) -> web.Response:
    """Sign the upload of some parts of a pending multipart write again."""
    body: PartsIn = await parse(request, PartsIn)
    version = request.match_info["version"]
    return web.json_response(
        await writes.resign(request.app, caller(request).namespace, version, body)
    )


@routes.post("/v1/writes/{version}/commit")
async def commit(request: web.Request) -> web.Response:
    """Make a version readable, once the bucket really holds what was declared."""
    body: CommitIn = await parse(request, CommitIn)
    version = request.match_info["version"]
    return web.json_response(
        await writes.commit(request.app, caller(request).namespace, version, body)
    )


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
    return web.json_response(
        await versions.list_artifacts(
            request.app,
            caller(request).namespace,
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
    return web.json_response(
        await versions.list_versions(
            request.app,
            caller(request).namespace,
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
    return web.json_response(
        await versions.list_tags(
            request.app, caller(request).namespace, m["organization"], m["artifact"]
        )
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/tags/{tag}")
async def resolve(request: web.Request) -> web.Response:
    """The version a tag (or ``latest``, or an id) names, without a download."""
    m = request.match_info
    return web.json_response(
        await versions.describe(
            request.app, caller(request).namespace, m["organization"], m["artifact"], m["tag"]
        )
    )


@routes.put("/v1/organizations/{organization}/artifacts/{artifact}/tags/{tag}")
async def move_tag(request: web.Request) -> web.Response:
    """Point a tag at a version; compare-and-set when the body says what it expects."""
    body: TagIn = await parse(request, TagIn)
    m = request.match_info
    return web.json_response(
        await versions.move_tag(
            request.app,
            caller(request).namespace,
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
    return web.json_response(
        await versions.delete_tag(
            request.app,
            caller(request).namespace,
            m["organization"],
            m["artifact"],
            m["tag"],
            request.query.get("expected") or None,
        )
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}")
async def read(request: web.Request) -> web.Response:
    """Where a version lives, how far that is from the reader, and a download."""
    reader = reader_place(request).place
    m = request.match_info
    found = await writes.read(
        request.app,
        caller(request).namespace,
        m["organization"],
        m["artifact"],
        m["version"],
        reader,
    )
    return web.json_response(found)


# --- directory versions ------------------------------------------------------------------


@routes.post("/v1/directories")
async def begin_directory(request: web.Request) -> web.Response:
    """Begin a directory version: one location for all its files, one upload per file."""
    # an object per file, and the metadata's and place's own
    body: DirectoryBeginIn = await parse(
        request, DirectoryBeginIn, containers=MAX_FILES + MAX_CONTAINERS
    )
    began = await directories.begin(request.app, caller(request).namespace, body)
    return web.json_response(began, status=201)


@routes.post("/v1/directories/{version}/commit")
async def commit_directory(request: web.Request) -> web.Response:
    """Make a directory version readable, once the bucket holds every file."""
    body: DirectoryCommitIn = await parse(request, DirectoryCommitIn)
    version = request.match_info["version"]
    return web.json_response(
        await directories.commit(request.app, caller(request).namespace, version, body)
    )


@routes.get("/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}/files")
async def list_files(request: web.Request) -> web.Response:
    """A directory version's files; ``?download=true`` signs a download of each."""
    reader = reader_place(request).place
    flag = request.query.get("download", "false")
    if flag not in ("true", "false"):
        raise problem(400, f"download must be true or false, not {flag[:20]!r}")
    m = request.match_info
    found = await directories.files(
        request.app,
        caller(request).namespace,
        m["organization"],
        m["artifact"],
        m["version"],
        reader,
        download=flag == "true",
    )
    return web.json_response(found)


@routes.get(
    "/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}/files/{path:.+}"
)
async def read_file(request: web.Request) -> web.Response:
    """One file of a directory version: where it lives and a download."""
    reader = reader_place(request).place
    m = request.match_info
    found = await directories.read_file(
        request.app,
        caller(request).namespace,
        m["organization"],
        m["artifact"],
        m["version"],
        m["path"],
        reader,
    )
    return web.json_response(found)
