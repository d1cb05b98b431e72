"""Events about Locations and Organizations, posted as Kubernetes posts those of
cluster-scoped objects (a Node's, a PersistentVolume's): in the namespace ``default``, the
involved object named without a namespace. So ``kubectl describe location NAME`` lists
them (it looks for events whose ``involvedObject.namespace`` is empty), and so does
``kubectl get events -n default``.

kopf's own posting puts them in the operator's namespace and names that namespace in the
involved object, which ``kubectl describe`` never shows; it is turned off
(``settings.posting.enabled``), and these are the operator's only Events. Posting is best
effort: an Event that cannot be posted is logged, never a handler's failure.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any, Literal

from o41.operator.cluster import Cluster

NAMESPACE = "default"
COMPONENT = "o41-operator"
MAX_MESSAGE = 1024  # what the API server keeps of a note, roughly; longer is cut

log = logging.getLogger(__name__)


def event_body(
    involved: Mapping[str, Any],
    *,
    type: Literal["Normal", "Warning"],
    reason: str,
    message: str,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (an object's body, or its apiVersion, kind and
    metadata name and uid)."""
    meta = involved.get("metadata") or {}
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    ref = {
        "apiVersion": involved.get("apiVersion"),
        "kind": involved.get("kind"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": NAMESPACE},
        "involvedObject": {k: v for k, v in ref.items() if v},
        "type": type,
        "reason": reason,
        "message": message,
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": os.environ.get("HOSTNAME") or socket.gethostname(),
    }


def post(
    cluster: Cluster,
    involved: Mapping[str, Any],
    *,
    type: Literal["Normal", "Warning"],
    reason: str,
    message: str,
) -> None:
    """Post one Event (synchronous: from a sync handler, or ``asyncio.to_thread``)."""
    body = event_body(involved, type=type, reason=reason, message=message)
    try:
        cluster.create_event(NAMESPACE, body)
    except Exception as e:  # the API server is away: the status still says it
        log.warning(
            "event %s about %s %s not posted: %s",
            reason,
            body["involvedObject"].get("kind"),
            body["involvedObject"].get("name"),
            e,
        )
