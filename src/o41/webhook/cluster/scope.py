"""Who may use an organization: a pod of this cluster by its namespace (spec.namespaces),
a pod of another cluster by its trust domain, namespace and ServiceAccount (spec.members).
Every route of the placement API is scoped so, and names artifacts by the same pattern."""

from __future__ import annotations

from aiohttp import web

from o41.webhook.cluster.view import VIEW, OrganizationView
from o41.webhook.http.errors import problem
from o41.webhook.identity.auth import Caller

ARTIFACT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"


def organization_for(app: web.Application, name: str, caller: Caller) -> OrganizationView:
    """The organization, if the caller may use it."""
    org = app[VIEW].organizations.get(name)
    if org is None:
        raise problem(
            404, f"organization {name!r} does not exist: `kubectl get organizations` lists them"
        )
    if caller.organization is not None:  # a service token: its one organization
        if caller.organization != name:
            raise problem(
                403,
                f"{caller.described()} is for organization {caller.organization!r}, not "
                f"{name!r}: ask a platform admin for a token of {name!r} "
                f"(kubectl o41 token create --org {name} --subject {caller.namespace})",
            )
    elif not org.admits(caller.trust_domain, caller.namespace, caller.service_account):
        if caller.trust_domain is None:
            fix = f"adds it to spec.namespaces of Organization {name!r}"
        else:
            fix = (
                f"adds {{trustDomain: {caller.trust_domain}, namespaces: [{caller.namespace}]}} "
                f"to spec.members of Organization {name!r}"
            )
        raise problem(
            403, f"{caller.described()} may not use organization {name!r}: an administrator {fix}"
        )
    return org
