"""The service's health checks: ``/healthz`` (the process answers) and ``/readyz`` (it
has listed the cluster's Organizations and Locations), and what they answer; and the
API's refusal while the view is still loading."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from o41 import __version__
from o41.webhook.cluster.view import VIEW
from o41.webhook.http import errors
from o41.webhook.http.answers import json_answer


class Health(TypedDict):
    status: str
    version: NotRequired[Annotated[str, Field(description="The service's, on /healthz.")]]


async def healthz(request: web.Request) -> web.Response:
    up: Health = {"status": "ok", "version": __version__}
    return json_answer(up)


async def readyz(request: web.Request) -> web.Response:
    """Ready once the view has listed Organizations and Locations."""
    if not request.app[VIEW].synced.is_set():
        raise errors.problem(503, "not ready: the view of the cluster is still loading")
    ready: Health = {"status": "ready"}
    return json_answer(ready)


#: Seconds a client is told to wait while the view loads (it takes about one).
LOADING_RETRY_AFTER = 1


@web.middleware
async def until_synced(request: web.Request, handler: Any) -> web.StreamResponse:
    """The API answers only from a whole view of the cluster. A service just started
    listens before it has listed Locations and their records: answered then, a begin
    would say no location takes writes (409) and a read that the organization is unknown.
    A client that reaches it early (a Service that still routes to it, a direct address)
    gets a 503 with ``Retry-After``, which it waits out and retries."""
    if request.path.startswith("/v1/") and not request.app[VIEW].synced.is_set():
        raise errors.problem(
            503,
            "the service is starting: its view of the cluster is still loading; retry shortly",
            headers={"Retry-After": str(LOADING_RETRY_AFTER)},
        )
    answer: web.StreamResponse = await handler(request)
    return answer
