"""The usage page's test bed: the real placement app in-process on an embedded store,
seeded with a known counter history (the usage tests, bench/usage_page.py; ``FakeReviewer``
also for tests/placement/test_writes.py and bench/capacity.py).

The stand-ins are the token reviewer (test tokens map to namespaces) and the Kubernetes
view (Organizations and Locations put in directly); the records are written to the store
exactly as ``Usage`` merges them (each into its hour's and its day's key), hours in the
past included.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from o41.kube.location_record import LocationRecord
from o41.kube.locations import Location, read_location
from o41.state import Store
from o41.state.memory import MemoryStore
from o41.webhook.app import Settings, make_app
from o41.webhook.cluster.view import Cluster, OrganizationView, View
from o41.webhook.http.store import STORE
from o41.webhook.identity import auth
from o41.webhook.usage.counters import hour, period_prefix

ORG = "ml"
EMPTY_ORG = "quiet"
TOKENS = {
    "token-team-a": auth.Caller("team-a", "default"),
    "token-team-b": auth.Caller("team-b", "default"),
}


class FakeReviewer:
    """Accepts the test tokens only."""

    async def review(self, token: str) -> auth.Caller | None:
        return TOKENS.get(token)


def hours_ago(n: int) -> str:
    return hour(time.time() - n * 3600)


def record(kind: str, when: str, dims: dict[str, str | None], **counts: int) -> dict[str, Any]:
    """A counter record as the store holds it (unknown dimensions are "")."""
    return {
        "kind": kind,
        "hour": when,
        "dims": {k: v or "" for k, v in dims.items()},
        "counts": counts,
    }


def write(
    when: str,
    place: tuple[str | None, str | None, str],
    rule: str,
    location: tuple[str, str, str],
    versions: int,
    size: int,
) -> dict[str, Any]:
    cloud, region, source = place
    name, loc_cloud, loc_region = location
    return record(
        "write",
        when,
        {
            "cloud": cloud,
            "region": region,
            "source": source,
            "rule": rule,
            "location": name,
            "locationCloud": loc_cloud,
            "locationRegion": loc_region,
        },
        versions=versions,
        bytes=size,
    )


def begin(
    when: str,
    place: tuple[str | None, str | None, str],
    rule: str,
    location: str,
    begins: int,
    warnings: int,
) -> dict[str, Any]:
    cloud, region, source = place
    return record(
        "begin",
        when,
        {"cloud": cloud, "region": region, "source": source, "rule": rule, "location": location},
        begins=begins,
        warnings=warnings,
    )


def read(
    when: str,
    reader: tuple[str | None, str | None, str],
    locality: str,
    location: tuple[str, str, str],
    reads: int,
    size: int,
) -> dict[str, Any]:
    cloud, region, source = reader
    name, loc_cloud, loc_region = location
    return record(
        "read",
        when,
        {
            "cloud": cloud,
            "region": region,
            "source": source,
            "locality": locality,
            "location": name,
            "locationCloud": loc_cloud,
            "locationRegion": loc_region,
        },
        reads=reads,
        bytes=size,
    )


EAST = ("ml-aws-east", "aws", "us-east-1")
CENTRAL = ("ml-gcp-central", "gcp", "us-central1")
TB, GB = 10**12, 10**9


def history() -> list[dict[str, Any]]:
    """The seeded history of ``ORG``: this hour, 30 h, 10 days and 40 days ago.

    Last 24 h (default prices): us-west-2 sends 1.2 TB to us-east-1 ($24), westeurope
    500 GB to the aws fallback ($43.50, the most: where a location pays), an unknown place
    2 GB to the fallback ($0.18); reads: 800 GB gcp→aws ($72), 100 GB cross-region in aws
    ($2), 1 GB unknown→gcp ($0.12), 2 TB local.
    """
    now, day_ago, days_10, days_40 = hours_ago(0), hours_ago(30), hours_ago(240), hours_ago(960)
    west, europe = ("aws", "us-west-2", "env"), ("azure", "westeurope", "metadata")
    home = ("aws", "us-east-1", "skypilot")
    unknown: tuple[str | None, str | None, str] = (None, None, "none")
    return [
        begin(now, west, "cloud", EAST[0], 40, 0),
        write(now, west, "cloud", EAST, 40, 12 * TB // 10),
        begin(now, europe, "fallback", EAST[0], 5, 5),
        write(now, europe, "fallback", EAST, 5, 500 * GB),
        begin(now, unknown, "fallback", EAST[0], 3, 3),
        write(now, unknown, "fallback", EAST, 3, 2 * GB),
        begin(now, home, "region", EAST[0], 100, 0),
        write(now, home, "region", EAST, 100, 3 * TB),
        read(now, ("gcp", "us-central1", "skypilot"), "cross-cloud", EAST, 10, 800 * GB),
        read(now, west, "cross-region", EAST, 4, 100 * GB),
        read(now, home, "local", EAST, 50, 2 * TB),
        read(now, unknown, "cross-cloud", CENTRAL, 1, GB),
        # outside 24 h, inside 7 d: us-west-2 becomes the costliest place
        write(day_ago, west, "cloud", EAST, 10, 3 * TB),
        # inside 30 d only
        write(days_10, home, "region", EAST, 7, 7 * GB),
        # outside every window
        write(days_40, europe, "fallback", EAST, 1, 9 * TB),
    ]


def location(name: str, cloud: str, region: str, created: str) -> Location:
    obj = {
        "metadata": {"name": name, "uid": name, "creationTimestamp": created},
        "spec": {"organization": ORG, "cloud": cloud, "region": region, "backend": {"s3": {}}},
    }
    return read_location(obj, LocationRecord(name, name, ready=True, ready_since=created))


class NoSecrets:
    """Locations without credentials (the usage page opens no bucket)."""

    async def credentials(self, location: Location) -> Mapping[str, str] | None:
        return None


def seeded_app(
    records: list[dict[str, Any]] | None = None, *, store: Store | None = None
) -> web.Application:
    """The placement app with an embedded store (``store``, or a new one) holding
    ``records`` for ``ORG``."""
    view = View()
    app = make_app(
        Settings(usage_interval=3600),
        FakeReviewer(),
        store=store or MemoryStore(),
        cluster=Cluster(view, NoSecrets()),
    )
    view.organizations[ORG] = OrganizationView(
        ORG, frozenset({"team-a"}), EAST[0], {"aws": EAST[0], "gcp": CENTRAL[0]}, True
    )
    view.organizations[EMPTY_ORG] = OrganizationView(
        EMPTY_ORG, frozenset({"team-a"}), None, {}, False
    )
    view.put_location(location(*EAST, "2026-01-01T00:00:00Z"))
    view.put_location(location(*CENTRAL, "2026-01-02T00:00:00Z"))
    view.synced.set()
    seed = history() if records is None else records

    async def seeded(app: web.Application) -> None:
        for key, value in stored(seed):
            await app[STORE].put(key, value)

    app.on_startup.append(seeded)  # after the cleanup contexts: the store is there
    return app


def stored(records: list[dict[str, Any]], org: str = ORG) -> list[tuple[bytes, bytes]]:
    """The keys and values ``records`` (hourly) are in the store once flushed: each in its
    hour's key and, added up by kind and dimensions, in its day's."""
    found: list[tuple[bytes, bytes]] = []
    days: dict[tuple[str, str], dict[str, Any]] = {}
    for i, r in enumerate(records):
        digest = hashlib.sha256(f"{i}".encode()).hexdigest()[:24]
        found.append((period_prefix("hour", r["hour"], org) + digest.encode(), dumps(r)))
        kind_dims = json.dumps([r["kind"], sorted(r["dims"].items())])
        day = days.setdefault(
            (r["hour"][:10], kind_dims),
            {"kind": r["kind"], "day": r["hour"][:10], "dims": r["dims"], "counts": {}},
        )
        for name, n in r["counts"].items():
            day["counts"][name] = day["counts"].get(name, 0) + n
    for (when, kind_dims), day in days.items():
        digest = hashlib.sha256(kind_dims.encode()).hexdigest()[:24]
        found.append((period_prefix("day", when, org) + digest.encode(), dumps(day)))
    return found


def dumps(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def bearer(token: str = "token-team-a") -> dict[str, str]:  # noqa: S107 - a test token
    return {"Authorization": f"Bearer {token}"}
