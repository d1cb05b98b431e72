"""An in-memory view of Organizations and Locations, kept fresh by a Kubernetes watch.

No request waits on the Kubernetes API: handlers read this view. The watch runs in a
thread (the kubernetes client is synchronous) and hands whole objects to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from o41.api import GROUP, VERSION
from o41.core.placement import Candidate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocationView:
    name: str
    uid: str
    organization: str
    cloud: str
    region: str
    spec: Mapping[str, Any]
    ready: bool
    retired: bool
    unfinished: bool
    created: str

    @property
    def writable(self) -> bool:
        return self.ready and not self.retired and not self.unfinished

    def candidate(self) -> Candidate:
        return Candidate(self.name, self.cloud, self.region, self.writable)


@dataclass(frozen=True, slots=True)
class OrganizationView:
    name: str
    namespaces: frozenset[str]
    fallback: str | None
    cloud_defaults: Mapping[str, str]
    takes_writes: bool


def location_view(obj: Mapping[str, Any]) -> LocationView:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return LocationView(
        name=meta["name"],
        uid=meta.get("uid", ""),
        organization=spec.get("organization", ""),
        cloud=spec.get("cloud", ""),
        region=spec.get("region", ""),
        spec=spec,
        ready=ready,
        retired=bool(spec.get("retired", False)),
        unfinished=bool(status.get("unfinished", False)),
        created=meta.get("creationTimestamp", ""),
    )


def organization_view(obj: Mapping[str, Any]) -> OrganizationView:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return OrganizationView(
        name=obj["metadata"]["name"],
        namespaces=frozenset(spec.get("namespaces") or ()),
        fallback=status.get("fallback"),
        cloud_defaults=dict(status.get("cloudDefaults") or {}),
        takes_writes=bool(status.get("takesWrites", False)),
    )


@dataclass
class View:
    """What the service knows of the cluster; updated by ``Watcher``, read by handlers."""

    locations: dict[str, LocationView] = field(default_factory=dict)
    organizations: dict[str, OrganizationView] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    # each organization's locations, sorted; every begin reads them, few events change them
    _by_organization: dict[str, tuple[LocationView, ...]] = field(
        default_factory=dict, init=False, repr=False
    )

    def put_location(self, location: LocationView) -> None:
        self.locations[location.name] = location
        self._by_organization.clear()

    def drop_location(self, name: str) -> None:
        self.locations.pop(name, None)
        self._by_organization.clear()

    def locations_of(self, organization: str) -> tuple[LocationView, ...]:
        """In the order they were added, as placement's rules want them."""
        found = self._by_organization.get(organization)
        if found is None:
            mine = [v for v in self.locations.values() if v.organization == organization]
            found = tuple(sorted(mine, key=lambda v: (v.created, v.name)))
            self._by_organization[organization] = found
        return found


class Secrets:
    """Locations' credentials, read from the operator's namespace and cached briefly."""

    def __init__(self, api: Any, namespace: str, ttl: float = 60.0) -> None:
        self._api, self._namespace, self._ttl = api, namespace, ttl
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}

    async def credentials(self, location: LocationView) -> dict[str, str] | None:
        """The location's Secret data (the same object until the cache refreshes it)."""
        ref = location.spec.get("credentials")
        return await self.read(ref["secretName"]) if ref else None

    async def read(self, name: str) -> dict[str, str]:
        hit = self._cache.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        data = await asyncio.to_thread(self._read, name)
        self._cache[name] = (time.monotonic() + self._ttl, data)
        return data

    def _read(self, name: str) -> dict[str, str]:
        import base64

        from kubernetes import client

        secret = client.CoreV1Api(self._api).read_namespaced_secret(name, self._namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


class Watcher:
    """List and watch both resources in threads; apply each change on the event loop."""

    def __init__(self, api: Any, view: View, loop: asyncio.AbstractEventLoop) -> None:
        self._api, self._view, self._loop = api, view, loop
        self._stop = threading.Event()
        self._listed: set[str] = set()

    def start(self) -> None:
        for plural in ("locations", "organizations"):
            threading.Thread(
                target=self._run, args=(plural,), name=f"watch-{plural}", daemon=True
            ).start()

    def stop(self) -> None:
        self._stop.set()

    def _apply(self, plural: str, kind: str, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if plural == "locations":
            if kind == "DELETED":
                self._view.drop_location(name)
            else:
                self._view.put_location(location_view(obj))
        elif kind == "DELETED":
            self._view.organizations.pop(name, None)
        else:
            self._view.organizations[name] = organization_view(obj)

    def _listed_all(self, plural: str) -> None:
        self._listed.add(plural)
        if self._listed == {"locations", "organizations"}:
            self._view.synced.set()

    def _run(self, plural: str) -> None:
        from kubernetes import client, watch

        objects = client.CustomObjectsApi(self._api)
        while not self._stop.is_set():
            try:
                listed: dict[str, Any] = objects.list_cluster_custom_object(  # type: ignore[assignment]
                    GROUP, VERSION, plural
                )
                names = {o["metadata"]["name"] for o in listed["items"]}
                for obj in listed["items"]:
                    self._loop.call_soon_threadsafe(self._apply, plural, "ADDED", obj)
                self._loop.call_soon_threadsafe(self._forget_missing, plural, names)
                self._loop.call_soon_threadsafe(self._listed_all, plural)
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    objects.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    plural,
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._loop.call_soon_threadsafe(
                            self._apply, plural, event["type"], event["object"]
                        )
            except Exception as e:  # API restarts, 410 Gone: list again
                if self._stop.is_set():
                    return
                log.warning("watch of %s broke (%s); listing again", plural, e)
                self._stop.wait(1.0)

    def _forget_missing(self, plural: str, names: set[str]) -> None:
        if plural == "locations":
            for gone in set(self._view.locations) - names:
                self._view.drop_location(gone)
        else:
            for gone in set(self._view.organizations) - names:
                self._view.organizations.pop(gone, None)
