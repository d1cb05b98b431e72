"""An in-memory view of Organizations and Locations, kept fresh by a Kubernetes watch.

No request waits on the Kubernetes API: handlers read this view. The watch runs in a
thread (the kubernetes client is synchronous) and hands whole objects to the event loop.

Nothing here decides from a field users can write. Whether a location takes writes comes
from the operator's record of it (a ConfigMap in the operator's namespace that only the
operator may write, ``o41.kube.location_record``), never from its status; an organization's
fallback and cloud defaults are computed here with the organization rules from the specs
and these locations (its status is only a hint of what is in force, and the rules keep a
hint only when it names an eligible location of that same organization).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from o41.core.organization import Effective, Picks, effective
from o41.core.retention import Rule, rules_of
from o41.kube.api import GROUP, VERSION
from o41.kube.location_record import PREFIX, SELECTOR, LocationRecord, parse
from o41.kube.locations import Location, read_location
from o41.kube.service_tokens import PREFIX as TOKEN_PREFIX
from o41.kube.service_tokens import SELECTOR as TOKEN_SELECTOR
from o41.kube.service_tokens import parse_record as parse_token_record
from o41.kube.trust_record import PREFIX as TRUST_PREFIX
from o41.kube.trust_record import SELECTOR as TRUST_SELECTOR
from o41.kube.trust_record import parse as parse_trust_record
from o41.webhook.identity.service_tokens import ServiceTokens
from o41.webhook.identity.trusted import TrustedDomains, trust_domain_source

log = logging.getLogger("o41.webhook.view")  # its name is a log field: kept


@dataclass(frozen=True, slots=True)
class Member:
    """Namespaces of another cluster (a TrustDomain), and perhaps only some of their
    ServiceAccounts (empty: any)."""

    trust_domain: str
    namespaces: frozenset[str]
    service_accounts: frozenset[str] = frozenset()

    def admits(self, trust_domain: str, namespace: str, service_account: str) -> bool:
        return (
            trust_domain == self.trust_domain
            and namespace in self.namespaces
            and (not self.service_accounts or service_account in self.service_accounts)
        )


def members_of(spec: Mapping[str, Any]) -> tuple[Member, ...]:
    return tuple(
        Member(
            str(m.get("trustDomain") or ""),
            frozenset(m.get("namespaces") or ()),
            frozenset(m.get("serviceAccounts") or ()),
        )
        for m in spec.get("members") or ()
        if isinstance(m, Mapping)
    )


@dataclass(frozen=True, slots=True)
class OrganizationView:
    name: str
    namespaces: frozenset[str]
    fallback: str | None
    cloud_defaults: Mapping[str, str]
    takes_writes: bool
    retention: tuple[Rule, ...] = ()  # spec.retention: the platform engineer's, never a user's
    members: tuple[Member, ...] = ()  # spec.members: other clusters' namespaces

    def admits(self, trust_domain: str | None, namespace: str, service_account: str) -> bool:
        """May pods of ``namespace`` (of this cluster when ``trust_domain`` is None) use it?"""
        if trust_domain is None:
            return namespace in self.namespaces
        return any(m.admits(trust_domain, namespace, service_account) for m in self.members)


@dataclass(frozen=True, slots=True)
class OrganizationSource:
    """What an Organization object says: its spec, and its status as a mere hint."""

    name: str
    namespaces: frozenset[str]
    picks: Picks
    hint: Effective
    retention: tuple[Rule, ...] = ()
    members: tuple[Member, ...] = ()


def organization_source(obj: Mapping[str, Any]) -> OrganizationSource:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return OrganizationSource(
        name=obj["metadata"]["name"],
        namespaces=frozenset(spec.get("namespaces") or ()),
        picks=Picks(spec.get("fallback"), dict(spec.get("cloudDefaults") or {})),
        hint=Effective(status.get("fallback"), dict(status.get("cloudDefaults") or {})),
        retention=rules_of(spec.get("retention")),
        members=members_of(spec),
    )


def organization_view(
    source: OrganizationSource, locations: tuple[Location, ...]
) -> OrganizationView:
    """The fallback and defaults in force, by the organization rules: from its spec, its
    own locations and their records; status can only choose among what the rules allow."""
    in_force = effective([loc.facts for loc in locations], source.picks, source.hint)
    return OrganizationView(
        source.name,
        source.namespaces,
        in_force.fallback,
        dict(in_force.cloud_defaults),
        in_force.takes_writes,
        source.retention,
        source.members,
    )


@dataclass
class View:
    """What the service knows of the cluster; updated by ``Watcher``, read by handlers."""

    locations: dict[str, Location] = field(default_factory=dict)
    organizations: dict[str, OrganizationView] = field(default_factory=dict)
    records: dict[str, LocationRecord] = field(default_factory=dict)  # by Location uid
    trust: TrustedDomains = field(default_factory=TrustedDomains)  # other clusters' issuers
    service_tokens: ServiceTokens = field(default_factory=ServiceTokens)  # VMs' tokens
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    # called when a service token's record, a TrustDomain or its keys changed: what holds
    # a token past its request (a WebSocket) checks it again (issue 37: a revoked token's
    # socket kept working until its next periodic check)
    trust_listeners: list[Callable[[], None]] = field(default_factory=list)
    # each organization's locations, sorted; every begin reads them, few events change them
    _by_organization: dict[str, tuple[Location, ...]] = field(
        default_factory=dict, init=False, repr=False
    )
    _names: dict[str, set[str]] = field(default_factory=dict, init=False, repr=False)
    _sources: dict[str, OrganizationSource] = field(default_factory=dict, init=False, repr=False)

    def trust_changed(self) -> None:
        for listener in self.trust_listeners:
            listener()

    def put_location(self, location: Location) -> None:
        """Add or replace it; its organization's view follows (the organization is
        immutable, so a location never moves between two)."""
        before = self.locations.get(location.name)
        if before is not None and before.organization != location.organization:
            self.drop_location(location.name)  # deleted and made again, unseen between
        self.locations[location.name] = location
        self._names.setdefault(location.organization, set()).add(location.name)
        self._by_organization.pop(location.organization, None)
        self._refresh(location.organization)

    def drop_location(self, name: str) -> None:
        gone = self.locations.pop(name, None)
        if gone is not None:
            self._names.get(gone.organization, set()).discard(name)
            self._by_organization.pop(gone.organization, None)
            self._refresh(gone.organization)

    def put_record(self, record: LocationRecord) -> None:
        self.records[record.uid] = record
        self._rerecord(record.uid)

    def drop_record(self, uid: str) -> None:
        self.records.pop(uid, None)
        self._rerecord(uid)

    def _rerecord(self, uid: str) -> None:
        """Records change rarely (a setup, a check's verdict): a scan is fine."""
        for location in [v for v in self.locations.values() if v.uid == uid]:
            self.put_location(location.recorded(self.records.get(uid)))

    def put_organization(self, source: OrganizationSource) -> None:
        self._sources[source.name] = source
        self._refresh(source.name)

    def drop_organization(self, name: str) -> None:
        self._sources.pop(name, None)
        self.organizations.pop(name, None)

    def _refresh(self, organization: str) -> None:
        source = self._sources.get(organization)
        if source is not None:
            view = organization_view(source, self.locations_of(organization))
            self.organizations[organization] = view

    def locations_of(self, organization: str) -> tuple[Location, ...]:
        """In the order they were added, as placement's rules want them."""
        found = self._by_organization.get(organization)
        if found is None:
            mine = [self.locations[n] for n in self._names.get(organization, ())]
            found = tuple(sorted(mine, key=lambda v: (v.created, v.name)))
            self._by_organization[organization] = found
        return found


class Credentials(Protocol):
    """Where a location's credentials come from (``Secrets``, or a test's dict)."""

    async def credentials(self, location: Location) -> Mapping[str, str] | None: ...


@dataclass(frozen=True)
class Cluster:
    """What the service knows of the cluster: the view, and the locations' credentials.
    ``make_app`` watches the cluster for them unless it is given one."""

    view: View
    secrets: Credentials


VIEW: web.AppKey[View] = web.AppKey("view")
SECRETS: web.AppKey[Credentials] = web.AppKey("secrets")
KUBE_API: web.AppKey[Any] = web.AppKey("kube_api")  # the Kubernetes client, once started


class Secrets:
    """Locations' credentials, read from the operator's namespace and cached briefly."""

    def __init__(self, api: Any, namespace: str, ttl: float = 60.0) -> None:
        self._api, self._namespace, self._ttl = api, namespace, ttl
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}
        self._reading: dict[str, asyncio.Future[dict[str, str]]] = {}  # reads under way

    async def credentials(self, location: Location) -> dict[str, str] | None:
        """The location's Secret data (the same object until the cache refreshes it)."""
        secret = location.credentials_secret
        return await self.read(secret) if secret else None

    async def read(self, name: str) -> dict[str, str]:
        hit = self._cache.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        reading = self._reading.get(name)
        if reading is None:  # one read a Secret at a time: the begins waiting share it
            reading = self._reading[name] = asyncio.ensure_future(self._fresh(name))
        return await asyncio.shield(reading)

    async def _fresh(self, name: str) -> dict[str, str]:
        """The Secret read again, cached. Concurrent begins share the read: each read of
        its own made a new data object, so each opened the location's bucket again
        (``o41.webhook.buckets.Buckets`` keeps an open bucket by that object)."""
        try:
            data = await asyncio.to_thread(self._read, name)
        finally:
            del self._reading[name]
        self._cache[name] = (time.monotonic() + self._ttl, data)
        return data

    def _read(self, name: str) -> dict[str, str]:
        import base64

        from kubernetes import client

        secret = client.CoreV1Api(self._api).read_namespaced_secret(name, self._namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


KINDS = ("locations", "organizations", "records", "trustdomains", "trustrecords", "tokens")


class Watcher:
    """List and watch Locations, Organizations, TrustDomains and the operator's records
    of them (ConfigMaps of ``namespace``) in threads; apply each change on the event
    loop."""

    def __init__(
        self,
        api: Any,
        view: View,
        loop: asyncio.AbstractEventLoop,
        namespace: str = "o41-system",
    ) -> None:
        self._api, self._view, self._loop, self._namespace = api, view, loop, namespace
        self._stop = threading.Event()
        self._listed: set[str] = set()

    def start(self) -> None:
        for kind in KINDS:
            threading.Thread(
                target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True
            ).start()

    def stop(self) -> None:
        self._stop.set()

    def _apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        self._change(kind, event, obj)
        if kind in ("tokens", "trustdomains", "trustrecords") and event != "ADDED":
            self._view.trust_changed()

    def _change(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        view = self._view
        if kind == "records":
            record = parse(obj) if event != "DELETED" else None
            if record is not None:
                view.put_record(record)
            elif name.startswith(PREFIX):
                view.drop_record(name.removeprefix(PREFIX))
        elif kind == "trustrecords":
            keys = parse_trust_record(obj) if event != "DELETED" else None
            if keys is not None:
                view.trust.put_record(keys)
            elif name.startswith(TRUST_PREFIX):
                view.trust.drop_record(name.removeprefix(TRUST_PREFIX))
        elif kind == "tokens":
            issued = parse_token_record(obj) if event != "DELETED" else None
            if issued is not None:
                view.service_tokens.records[issued.id] = issued
            elif name.startswith(TOKEN_PREFIX):
                view.service_tokens.records.pop(name.removeprefix(TOKEN_PREFIX), None)
        elif kind == "trustdomains":
            source = trust_domain_source(obj) if event != "DELETED" else None
            if source is not None:
                view.trust.put_source(source)
            else:
                view.trust.drop_source(name)
        elif kind == "locations":
            if event == "DELETED":
                view.drop_location(name)
            else:
                view.put_location(read_location(obj, view.records.get(obj["metadata"]["uid"])))
        elif event == "DELETED":
            view.drop_organization(name)
        else:
            view.put_organization(organization_source(obj))

    def _listed_all(self, kind: str) -> None:
        self._listed.add(kind)
        if self._listed == set(KINDS):
            self._view.synced.set()

    def _lister(self, kind: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        from kubernetes import client

        if kind in ("records", "trustrecords", "tokens"):
            core = client.CoreV1Api(self._api)
            selector = {"records": SELECTOR, "trustrecords": TRUST_SELECTOR}.get(
                kind, TOKEN_SELECTOR
            )
            return core.list_namespaced_config_map, (self._namespace,), {"label_selector": selector}
        objects = client.CustomObjectsApi(self._api)
        return objects.list_cluster_custom_object, (GROUP, VERSION, kind), {}

    def _run(self, kind: str) -> None:
        from kubernetes import watch

        plain = self._api.sanitize_for_serialization  # models -> the API's own dicts
        lister, args, kwargs = self._lister(kind)
        while not self._stop.is_set():
            try:
                listed: dict[str, Any] = plain(lister(*args, **kwargs))
                names = {o["metadata"]["name"] for o in listed["items"]}
                for obj in listed["items"]:
                    self._loop.call_soon_threadsafe(self._apply, kind, "ADDED", obj)
                self._loop.call_soon_threadsafe(self._forget_missing, kind, names)
                self._loop.call_soon_threadsafe(self._listed_all, kind)
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    lister,
                    *args,
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                    **kwargs,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._loop.call_soon_threadsafe(
                            self._apply, kind, event["type"], plain(event["object"])
                        )
            except Exception as e:  # API restarts, 410 Gone: list again
                if self._stop.is_set():
                    return
                if kind == "trustdomains" and getattr(e, "status", None) == 404:
                    # no TrustDomain CRD (a chart older than the service): none to trust,
                    # which must not keep the service from being ready
                    self._loop.call_soon_threadsafe(self._forget_missing, kind, set())
                    self._loop.call_soon_threadsafe(self._listed_all, kind)
                    self._stop.wait(30.0)
                    continue
                log.warning("watch of %s broke (%s); listing again", kind, e)
                self._stop.wait(1.0)

    def _forget_missing(self, kind: str, names: set[str]) -> None:
        self._forget(kind, names)
        if kind in ("tokens", "trustdomains", "trustrecords"):
            self._view.trust_changed()  # a re-list may have missed a deletion's event

    def _forget(self, kind: str, names: set[str]) -> None:
        view = self._view
        if kind == "records":
            for uid in [u for u in view.records if PREFIX + u not in names]:
                view.drop_record(uid)
        elif kind == "trustrecords":
            for uid in [u for u in view.trust.records if TRUST_PREFIX + u not in names]:
                view.trust.drop_record(uid)
        elif kind == "tokens":
            tokens = view.service_tokens.records
            for token_id in [t for t in tokens if TOKEN_PREFIX + t not in names]:
                del tokens[token_id]
        elif kind == "trustdomains":
            for gone in set(view.trust.sources) - names:
                view.trust.drop_source(gone)
        elif kind == "locations":
            for gone in set(view.locations) - names:
                view.drop_location(gone)
        else:
            for gone in set(view.organizations) - names:
                view.drop_organization(gone)
