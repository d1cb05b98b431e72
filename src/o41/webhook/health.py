"""The service's health checks: ``/healthz`` (the process answers) and ``/readyz`` (it
has listed the cluster's Organizations and Locations), and what they answer."""

from __future__ import annotations

from typing import Annotated, NotRequired

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from o41 import __version__
from o41.webhook.cluster.view import VIEW
from o41.webhook.http import errors


class Health(TypedDict):
    status: str
    version: NotRequired[Annotated[str, Field(description="The service's, on /healthz.")]]


async def healthz(request: web.Request) -> web.Response:
    up: Health = {"status": "ok", "version": __version__}
    return web.json_response(up)


async def readyz(request: web.Request) -> web.Response:
    """Ready once the view has listed Organizations and Locations."""
    if not request.app[VIEW].synced.is_set():
        raise errors.problem(503, "not ready: the view of the cluster is still loading")
    ready: Health = {"status": "ready"}
    return web.json_response(ready)
