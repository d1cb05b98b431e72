"""The operator's readiness: ``GET /readyz`` (``--readiness``) answers 200 only when

- its start-up is done (kopf ran every start-up handler: the records are loaded),
- its admission webhook server accepts connections (unless ``--no-webhook``), and
- its watches have delivered what the API server holds: every Location and Organization
  the API server lists (made more than :data:`GRACE` seconds ago) is in the operator's
  indexes, which kopf fills from its watches. Checked with one list of each until it first
  holds; kopf keeps its watches up itself from then on.

Otherwise 503 with what is missing, as JSON. kopf's own ``--liveness`` endpoint stays the
liveness probe; kopf has no readiness of its own, hence this small server. The chart's
readiness probe calls it, so the webhook's Service (failurePolicy Fail) sends the API
server's admission calls only to an operator that can answer them from its indexes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

#: Objects younger than this may not be in the indexes yet: their watch event is on its way.
GRACE = 30.0

Lister = Callable[[str], list[dict[str, Any]]]


def missing(
    listed: Iterable[Mapping[str, Any]], indexed: Collection[str], now: float, grace: float = GRACE
) -> list[str]:
    """The names of the objects listed (made more than ``grace`` seconds before ``now``)
    that are not in ``indexed``."""
    out = []
    for obj in listed:
        meta = obj.get("metadata") or {}
        created = meta.get("creationTimestamp")
        when = dt.datetime.fromisoformat(created).timestamp() if created else 0.0
        if now - when > grace and meta.get("name") not in indexed:
            out.append(str(meta.get("name")))
    return sorted(out)


@dataclass
class Readiness:
    """What ``/readyz`` checks. ``started`` is kopf's ready flag (its start-up handlers
    ran); ``indexes`` each watched plural's names, as the indexes hold them now."""

    started: threading.Event
    webhook: tuple[str, int] | None
    lister: Lister
    indexes: dict[str, Callable[[], Collection[str]]] = field(default_factory=dict)
    watches_synced: bool = False
    grace: float = GRACE

    async def problems(self) -> list[str]:
        found = []
        if not self.started.is_set():
            return ["the operator's start-up has not finished"]
        if self.webhook is not None and not await _accepts(*self.webhook):
            found.append(f"the admission webhook does not accept connections on {self.webhook}")
        if not self.watches_synced:
            found += await self._watches()
            self.watches_synced = not found
        return found

    async def _watches(self) -> list[str]:
        if not self.indexes:
            return ["the watches' indexes are not set up yet"]
        found = []
        now = dt.datetime.now(dt.UTC).timestamp()
        for plural, names in self.indexes.items():
            try:
                listed = await asyncio.to_thread(self.lister, plural)
            except Exception as e:  # the API server is away
                found.append(f"could not list {plural} ({type(e).__name__})")
                continue
            absent = missing(listed, names(), now, self.grace)
            if absent:
                shown = ", ".join(absent[:5]) + (" ..." if len(absent) > 5 else "")
                found.append(f"the watch of {plural} has not delivered {len(absent)}: {shown}")
        return found


async def _accepts(host: str, port: int) -> bool:
    target = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # noqa: S104 - a target
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(target, port), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def app(readiness: Readiness, path: str) -> web.Application:
    async def readyz(request: web.Request) -> web.Response:
        problems = await readiness.problems()
        if problems:
            return web.json_response({"status": "not ready", "problems": problems}, status=503)
        return web.json_response({"status": "ready"})

    served = web.Application()
    served.router.add_get(path, readyz)
    return served


async def serve(readiness: Readiness, endpoint: str) -> web.AppRunner:
    """Serve ``/readyz`` at ``endpoint`` (``http://HOST:PORT/PATH``); stop it with
    ``await runner.cleanup()``."""
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme != "http" or not url.hostname or not url.port:
        raise ValueError(f"--readiness must be http://HOST:PORT/PATH, not {endpoint!r}")
    runner = web.AppRunner(app(readiness, url.path or "/readyz"), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port).start()
    return runner
