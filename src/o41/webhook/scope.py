"""What every route of the placement API shares: the strict request model, the artifact
name's pattern, and the organization a caller's namespace may use."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from o41.webhook.errors import problem
from o41.webhook.keys import VIEW
from o41.webhook.view import OrganizationView

ARTIFACT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"


class Model(BaseModel):
    """Strict: JSON types as declared (``size: "5"`` or ``size: true`` is refused, not
    converted), so a client's mistake is named instead of guessed at."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def organization_for(app: web.Application, name: str, namespace: str) -> OrganizationView:
    """The organization, if the caller's namespace may use it."""
    org = app[VIEW].organizations.get(name)
    if org is None:
        raise problem(
            404, f"organization {name!r} does not exist: `kubectl get organizations` lists them"
        )
    if namespace not in org.namespaces:
        raise problem(
            403,
            f"namespace {namespace!r} may not use organization {name!r}: an administrator "
            f"adds it to spec.namespaces of Organization {name!r}",
        )
    return org
