"""Request bodies: one strict model each, parsed in one place, so that every refusal of a
body names every wrong field the same way."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from o41.core.jsonlimits import MAX_CONTAINERS, TooDeep, check_depth
from o41.webhook.http.errors import problem


class Model(BaseModel):
    """Strict: JSON types as declared (``size: "5"`` or ``size: true`` is refused, not
    converted), so a client's mistake is named instead of guessed at."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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
