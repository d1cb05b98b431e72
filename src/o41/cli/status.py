"""``o41 status ORGANIZATION`` (and ``kubectl o41 status``): an organization at a glance,
read from the Kubernetes API with the user's kubeconfig, as ``cmctl status`` shows a
certificate: its Ready condition, fallback and cloud defaults in force, each Location's
Ready, role, reason and last check, and the last warning Events about them.

The format is fixed (scripts and tests read it); a Location's line ends with ``last
check 5s ago``::

    Organization: ml
      Ready:         True (FallbackReady): takes writes; fallback is 'aws-east'
      Takes writes:  yes
      Fallback:      aws-east
      Cloud defaults:
        aws: aws-east
      Namespaces:    default
      Observed:      generation 1 of 1
    Locations: 1
      aws-east  aws/us-east-1  Ready=True  role=fallback,default  reason=BucketReady  ...
    Warnings: none

``o41.cli`` builds every group's parser whatever the command, ``o41 write`` on the light
install too, so the Kubernetes client and the custom resources' models are imported when
the organization is read, not with this module.

Without an organization, ``o41 status`` says where this pod's calls go (the client's
environment, ``o41.client.endpoints``) and whether the collections' endpoint answers::

    artifacts: https://o41.hub.example:8443 (the hub, $O41_ARTIFACTS_ENDPOINT)
    collections: http://tier.o41:80 (this cluster's collections tier, $O41_COLLECTIONS_ENDPOINT)
      reached: namespace 'ml' holds 3 entries, 211 bytes
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from o41.cli.common import Subcommands, fail

#: Where the operator posts Events about Locations and Organizations (cluster-scoped).
EVENTS_NAMESPACE = "default"
PROBE_TIMEOUT = 10.0  # seconds the collections' endpoint has to answer ``o41 status``
WARNINGS = 10

Body = Mapping[str, Any]


class StatusError(Exception):
    """The organization is not there, or the API server could not be read."""


def _ready(status: Body | None) -> Body:
    conditions = (status or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def _parse(when: str | None) -> dt.datetime | None:
    if not when:
        return None
    try:
        return dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None


def ago(when: str | None, now: dt.datetime) -> str:
    """``5s ago``, ``3m ago``, ``2h ago``, ``4d ago``; ``never`` for no time."""
    t = _parse(when)
    if t is None:
        return "never"
    seconds = max(0, int((now - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


@dataclass(frozen=True)
class Snapshot:
    organization: Body
    locations: list[Body]
    warnings: list[Body]


def render(snapshot: Snapshot, now: dt.datetime) -> list[str]:
    """The lines ``o41 status`` prints."""
    org = snapshot.organization
    meta, spec, status = org["metadata"], org.get("spec") or {}, org.get("status") or {}
    ready = _ready(status)
    lines = [f"Organization: {meta['name']}"]
    if ready:
        lines.append(
            f"  Ready:         {ready.get('status')} ({ready.get('reason')}): "
            f"{ready.get('message')}"
        )
    else:
        lines.append("  Ready:         Unknown (the operator has not shown a status yet)")
    lines.append(f"  Takes writes:  {'yes' if status.get('takesWrites') else 'no'}")
    lines.append(f"  Fallback:      {status.get('fallback') or 'none'}")
    defaults = status.get("cloudDefaults") or {}
    if defaults:
        lines.append("  Cloud defaults:")
        lines += [f"    {cloud}: {name}" for cloud, name in sorted(defaults.items())]
    else:
        lines.append("  Cloud defaults: none")
    lines.append(f"  Namespaces:    {', '.join(spec.get('namespaces') or []) or 'none'}")
    observed = status.get("observedGeneration")
    lines.append(
        f"  Observed:      generation {observed if observed is not None else '-'} "
        f"of {meta.get('generation', '-')}"
    )
    lines.append(f"Locations: {len(snapshot.locations)}")
    for loc in sorted(snapshot.locations, key=lambda b: str(b["metadata"]["name"])):
        lines += _location(loc, now)
    if snapshot.warnings:
        lines.append(f"Warnings: {len(snapshot.warnings)} (newest first)")
        for event in snapshot.warnings:
            involved = event.get("involvedObject") or {}
            lines.append(
                f"  {ago(_event_time(event), now)}  {involved.get('kind')}/"
                f"{involved.get('name')}  {event.get('reason')}: {event.get('message')}"
            )
    else:
        lines.append("Warnings: none")
    return lines


def _location(loc: Body, now: dt.datetime) -> list[str]:
    spec, status = loc.get("spec") or {}, loc.get("status") or {}
    ready = _ready(status)
    words = [
        f"  {loc['metadata']['name']}",
        f"{spec.get('cloud')}/{spec.get('region')}",
        f"Ready={ready.get('status', 'Unknown')}",
        f"role={status.get('role') or '-'}",
        f"reason={ready.get('reason') or '-'}",
        f"last check {ago(status.get('lastChecked'), now)}",
    ]
    if spec.get("retired"):
        words.append("retired")
    lines = ["  ".join(words)]
    if ready and ready.get("status") != "True":
        lines.append(f"    {ready.get('message')}")
    return lines


def _event_time(event: Body) -> str | None:
    found: str | None = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
    )
    return found


def newest_warnings(events: Iterable[Body], names: set[tuple[str, str]]) -> list[Body]:
    """The last :data:`WARNINGS` Warning Events about ``names`` ((kind, name)), newest first."""
    mine = [
        e
        for e in events
        if e.get("type") == "Warning"
        and (
            (e.get("involvedObject") or {}).get("kind"),
            (e.get("involvedObject") or {}).get("name"),
        )
        in names
    ]
    mine.sort(key=lambda e: _parse(_event_time(e)) or dt.datetime.min.replace(tzinfo=dt.UTC))
    return mine[::-1][:WARNINGS]


def read(organization: str, kubeconfig: str | None = None, context: str | None = None) -> Snapshot:
    """The organization, its Locations and their warnings, read now."""
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from o41.kube.api import GROUP, VERSION

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except Exception as e:  # no kubeconfig, or a broken one
        raise StatusError(f"cannot load the kubeconfig: {e}") from None
    try:
        objects = client.CustomObjectsApi(api)
        try:
            org: Body = objects.get_cluster_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, "organizations", organization
            )
        except ApiException as e:
            if e.status == 404:
                raise StatusError(f"organization {organization!r} not found") from None
            raise
        listed: Body = objects.list_cluster_custom_object(GROUP, VERSION, "locations")  # type: ignore[assignment]
        locations = [
            loc
            for loc in listed.get("items", [])
            if (loc.get("spec") or {}).get("organization") == organization
        ]
        names = {("Organization", organization)} | {
            ("Location", loc["metadata"]["name"]) for loc in locations
        }
        found = client.CoreV1Api(api).list_namespaced_event(
            EVENTS_NAMESPACE, field_selector="type=Warning"
        )
        events = api.sanitize_for_serialization(found).get("items", [])
        return Snapshot(org, locations, newest_warnings(events, names))
    except ApiException as e:
        raise StatusError(f"the API server answered {e.status}: {e.reason}") from None
    except (OSError, urllib3.exceptions.HTTPError) as e:
        raise StatusError(f"cannot reach the API server: {e}") from None
    finally:
        api.close()


def endpoints() -> tuple[list[str], bool]:
    """What ``o41 status`` says without an organization, as a pod sees it: where its
    artifacts and its collections go and why, and whether the collections' endpoint
    answered one cheap call (its namespace's usage: it also says which tenant the token
    is) or refused it; with whether it answered (True when there is nothing to reach)."""
    from o41.client.connection import ENV_ENDPOINT, Connection
    from o41.client.endpoints import collections_route
    from o41.client.errors import O41Error, ServiceError

    hub = Connection().endpoint
    lines = [
        f"artifacts: {hub} (the hub, ${ENV_ENDPOINT})"
        if hub
        else f"artifacts: no endpoint (${ENV_ENDPOINT} is not set)"
    ]
    route = collections_route(timeout=PROBE_TIMEOUT, retry_deadline=0)
    lines.append(route.described())
    if route.connection is None:
        return lines, True
    try:
        usage = route.connection.request("GET", "/v1/collections/usage")
    except ServiceError as e:  # it answered: a refusal (a token of another cluster...)
        lines.append(f"  refused ({e.status}): {e}")
        return lines, False
    except O41Error as e:
        lines.append(f"  not reached: {e}")
        return lines, False
    lines.append(
        f"  reached: namespace {usage.get('namespace')!r} holds {usage.get('entries')} "
        f"entries, {usage.get('bytes')} bytes"
    )
    return lines, True


def _status(args: argparse.Namespace) -> int:
    if args.organization is None:
        lines, reached = endpoints()
        print("\n".join(lines))
        return 0 if reached else 1
    try:
        snapshot = read(args.organization, args.kubeconfig, args.context)
    except StatusError as e:
        return fail(args, e)
    print("\n".join(render(snapshot, dt.datetime.now(dt.UTC))))
    return 0


def add(sub: Subcommands) -> None:
    """``status``."""
    status = sub.add_parser(
        "status",
        help="an organization at a glance: fallback, defaults, its Locations, warnings; "
        "without one, where this pod's artifacts and collections go",
        description="Read an Organization, its Locations and their last warning Events "
        "from the Kubernetes API (the kubeconfig of kubectl: $KUBECONFIG or ~/.kube/config) "
        "and print them. Also a kubectl plugin: kubectl o41 status ORGANIZATION. Without "
        "an organization, in a pod: where its artifacts and collections go (this cluster's "
        "collections tier, the hub, or embedded), why, and whether the collections' "
        "endpoint answers (exit status 1 when it does not).",
    )
    status.add_argument(
        "organization",
        metavar="ORGANIZATION",
        nargs="?",
        default=None,
        help="the Organization (none: this pod's endpoints)",
    )
    status.add_argument("--kubeconfig", help="the kubeconfig (default: kubectl's)")
    status.add_argument("--context", help="the kubeconfig's context (default: its current)")
    status.set_defaults(handler=_status)
