"""One collection operation, as either route receives it (a POST, or a WebSocket's
message): arguments decoded, the quota checked in memory, the engine called, the answer
encoded; and the namespace's usage (``GET /v1/collections/usage``)."""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any

from aiohttp import web

from o41.collections.checks import BadRequest, Full, Unavailable
from o41.collections.engine import Engine
from o41.core.jsonlimits import TooDeep, check_depth
from o41.state import StoreFull, StoreUnavailable
from o41.webhook import telemetry
from o41.webhook.collections.answers import CollectionsUsage
from o41.webhook.collections.quota import FREEING, Quota, cost, sent
from o41.webhook.collections.service import COLLECTIONS
from o41.webhook.http.answers import json_answer
from o41.webhook.http.errors import problem
from o41.webhook.identity import auth

ROUTE = "/v1/collections/{compute}/{kind}/{name}/{op}"
USAGE_ROUTE = "/v1/collections/usage"


async def handle(request: web.Request) -> web.Response:
    """One operation, POSTed (its arguments a ``CollectionArgs`` of ``.answers``, which
    the engine checks); refusals are answered by ``errors`` with their status."""
    body = await request.read()
    try:
        check_depth(body, what="the body")
        args = json.loads(body) if body else {}
    except TooDeep as e:
        raise problem(400, str(e)) from None
    except (ValueError, UnicodeDecodeError):
        raise problem(400, "the body must be a JSON object of the operation's arguments") from None
    m = request.match_info
    where = (m["compute"], m["kind"], m["name"], m["op"])
    engine, quota = engine_of(request), request.app[COLLECTIONS].quota
    caller = auth.caller(request).tenant, request[auth.CREDENTIAL].token
    result = await perform(engine, caller[0], *where, args, quota, caller[1])
    return json_answer(result)


async def perform(
    engine: Engine,
    namespace: str,
    compute: str,
    kind: str,
    name: str,
    op: str,
    args: object,
    quota: Quota | None = None,
    token: str = "",
) -> dict[str, Any]:
    """One operation of ``namespace``'s caller (holding ``token``), as either route
    received it: its answer, JSON-ready; a refusal raises :class:`CollectionError` with
    the status to answer. ``quota``: the limits, checked in memory (no etcd round trip)."""
    if not isinstance(args, dict):
        raise BadRequest("the arguments must be a JSON object")
    if "value" in args:
        try:
            args["value"] = base64.b64decode(args["value"], validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise BadRequest("value must be base64 text") from None
    if quota is not None:
        quota.take(token, sent(args))
        more = cost(namespace, compute, kind, name, op, args)
        if more:
            if not quota.fits(namespace, more):
                await quota.admit(namespace, more)
        elif (kind, op) in FREEING:
            quota.freed(namespace)
    labels = telemetry.collection_labels(engine.operations(), kind, op, args)
    start, outcome = time.perf_counter(), "refused"
    try:
        result = await engine.call(namespace, compute, kind, name, op, args)
        outcome = "ok"
    except StoreFull as e:
        outcome = "unavailable"
        raise Full(str(e)) from None
    except StoreUnavailable as e:
        outcome = "unavailable"
        raise Unavailable(f"the state store cannot answer now: {e}") from None
    finally:
        telemetry.collection_done(labels, outcome, time.perf_counter() - start)
    return _encode(result)


def engine_of(request: web.Request) -> Engine:
    engine = request.app[COLLECTIONS].engine
    if engine is None:
        raise problem(503, "the collections are starting: try again")
    return engine


async def usage(request: web.Request) -> web.Response:
    """``GET /v1/collections/usage``: the caller's namespace's collections (keys and values
    as etcd stores them), counted at most a second ago, with the limits that apply."""
    quota = request.app[COLLECTIONS].quota
    if quota is None:
        raise problem(503, "the collections are starting: try again")
    quota.take(request[auth.CREDENTIAL].token, 0)  # a rate refusal is errors' 429
    return json_answer(await namespace_usage(quota, auth.caller(request).tenant))


async def namespace_usage(quota: Quota, namespace: str) -> CollectionsUsage:
    """What ``namespace`` holds and the limits, from a count at most a second old."""
    found = quota.namespaces.get(namespace)
    if found is None or found.counted_at is None or time.monotonic() - found.counted_at > 1:
        found = await quota.count(namespace)  # at most one count a second: it reads it all
    if found.counted_at is None or time.monotonic() - found.counted_at > quota.limits.recount:
        raise Unavailable("the state store cannot answer now: try again")
    limits = quota.limits
    return {
        "namespace": namespace,
        "bytes": found.bytes,
        "entries": found.entries,
        "counted": {  # the count alone; bytes and entries add this replica's writes since
            "bytes": found.counted_bytes,
            "entries": found.counted_entries,
            "secondsAgo": round(time.monotonic() - found.counted_at, 3),
        },
        "limits": limits.public(),
        "accuracy": (
            "bytes and entries: keys and values as etcd stores them, counted at most 1 s "
            "ago (plus this replica's writes since); the limits are checked per service "
            f"replica against a count at most {limits.recount:g} s old plus that "
            "replica's writes since"
        ),
    }


def _encode(result: dict[str, Any]) -> dict[str, Any]:
    value = result.get("value")
    if isinstance(value, bytes):
        result["value"] = base64.b64encode(value).decode()
    items = result.get("items")
    if items is not None:
        result["items"] = [[k, base64.b64encode(v).decode()] for k, v in items]
    return result
