"""Who may use an organization: a caller's namespace must be one of its namespaces. Every
route of the placement API is scoped so, and names artifacts by the same pattern."""

from __future__ import annotations

from aiohttp import web

from o41.webhook.http.errors import problem
from o41.webhook.http.view import VIEW, OrganizationView

ARTIFACT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"


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
