"""kopf handlers: thin, they hand the object and the shared state to the module that acts.

- Start-up: the shared state in kopf's memo (``o41.operator.state``), the operator's
  records loaded before any handler or index sees a Location, the copying of the placement
  service's version counts into status (``o41.operator.versions``).
- Location: set up its bucket and check it stays reachable (``o41.operator.buckets``).
- Organization: keep the fallback and cloud defaults in force whenever a Location or the
  Organization changes (``o41.operator.organizations``).
- TrustDomain: fetch its issuer's keys into the operator's record, and again every
  spec.refreshInterval (``o41.operator.trust``).

The indexes are in ``o41.operator.index``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import kopf

from o41.kube.api import GROUP, VERSION
from o41.operator import buckets, events, organizations, telemetry, trust, versions
from o41.operator.cluster import Cluster, operator_namespace
from o41.operator.index import LocationsIndex, OrganizationsIndex, TrustDomainsIndex
from o41.operator.state import Shared, put, shared

CHECK_INTERVAL = float(os.environ.get("O41_LOCATION_CHECK_INTERVAL", "60"))


@kopf.on.startup()
async def start(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Before any handler or index sees a Location, know what the operator recorded; and
    this cluster's own issuer, which no TrustDomain may name."""
    state = put(memo, Shared.around(Cluster(operator_namespace())))
    found = await asyncio.to_thread(state.records.load)
    logger.info("loaded %d location records from namespace %s", found, state.cluster.namespace)
    await trust.configure(state.trust, memo.get(trust.SETTINGS), state.cluster, logger)
    memo["counts_task"] = asyncio.create_task(
        versions.copy_counts(state.cluster, state.counts, versions.INTERVAL)
    )


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("counts_task")
    if task is not None:
        task.cancel()
    with contextlib.suppress(TypeError):  # a start-up that failed put no shared state
        shared(memo).checks.shutdown(wait=False, cancel_futures=True)


# --- Location: the bucket -----------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "locations")
@kopf.on.create(GROUP, VERSION, "locations")
@kopf.on.update(GROUP, VERSION, "locations", field="spec")
@telemetry.reconciled("locations")
def set_up_bucket(
    body: kopf.Body,
    patch: kopf.Patch,
    retry: int,
    logger: kopf.Logger,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Create or adopt the bucket; on failure say why in status and retry with backoff.
    The outcome goes to the operator's record first, then to status (an output)."""
    buckets.SetUp(shared(memo), body, patch, retry, logger).run()


@kopf.on.field(GROUP, VERSION, "locations", field="spec.retired")
def retired_changed(old: Any, new: Any, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """An Event when a location is retired or taken back into service."""
    if bool(old) == bool(new):
        return
    cluster = shared(memo).cluster
    if new:
        message = "no new writes go here; its versions stay readable"
        events.post(cluster, body, type="Normal", reason="Retired", message=message)
    else:
        events.post(
            cluster, body, type="Normal", reason="Reactivated", message="takes writes again"
        )


@kopf.timer(
    GROUP, VERSION, "locations", interval=CHECK_INTERVAL, initial_delay=CHECK_INTERVAL, idle=0
)
@telemetry.reconciled("locations")
async def check_bucket(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """A bucket that was Ready can break later: show it, and when it recovers. In the
    checks' own pool (``o41.operator.state.CHECKS_AT_ONCE``), not kopf's workers."""
    state = shared(memo)
    await asyncio.get_running_loop().run_in_executor(
        state.checks, buckets.check, state, body, patch
    )


# --- Organization: fallback and cloud defaults --------------------------------------------


@kopf.on.event(GROUP, VERSION, "locations")  # type: ignore[arg-type]  # indexes by name
@telemetry.reconciled("locations")
async def location_changed(
    name: str,
    uid: str,
    type: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    locations_by_organization: LocationsIndex,
    organizations_by_name: OrganizationsIndex,
    **_: Any,
) -> None:
    state = shared(memo)
    telemetry.LOCATIONS.follow(state, locations_by_organization)
    if type == "DELETED":
        state.records.forget(uid)
        state.counts.forget(name)
    else:
        state.counts.seen(name, status)
    org = spec.get("organization")
    if org:
        await organizations.reconcile(state, org, locations_by_organization, organizations_by_name)


@kopf.on.event(GROUP, VERSION, "organizations")  # type: ignore[arg-type]  # indexes by name
@telemetry.reconciled("organizations")
async def organization_changed(
    name: str,
    type: str | None,
    memo: kopf.Memo,
    locations_by_organization: LocationsIndex,
    organizations_by_name: OrganizationsIndex,
    **_: Any,
) -> None:
    state = shared(memo)
    telemetry.LOCATIONS.follow(state, locations_by_organization)
    if type == "DELETED":
        state.organizations.forget(name)
        return
    await organizations.reconcile(state, name, locations_by_organization, organizations_by_name)


# --- TrustDomain: its issuer's keys --------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, "trustdomains")
@kopf.on.create(GROUP, VERSION, "trustdomains")
@kopf.on.update(GROUP, VERSION, "trustdomains", field="spec")  # type: ignore[arg-type]  # indexes
@telemetry.reconciled("trustdomains")
async def fetch_trust_domain_keys(
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    memo: kopf.Memo,
    trust_domains_by_issuer: TrustDomainsIndex,
    **_: Any,
) -> None:
    """Fetch the keys now; a failure shows in status and the timer retries."""
    state = shared(memo)
    refresh = trust.Refresh(
        state.cluster, state.trust, body, patch, logger, trust_domains_by_issuer
    )
    await refresh.run(scheduled=False)


@kopf.timer(  # type: ignore[arg-type]  # kopf passes indexes by name
    GROUP, VERSION, "trustdomains", interval=trust.TICK, initial_delay=trust.TICK, idle=0
)
@telemetry.reconciled("trustdomains")
async def refresh_trust_domain_keys(
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    memo: kopf.Memo,
    trust_domains_by_issuer: TrustDomainsIndex,
    **_: Any,
) -> None:
    """Every spec.refreshInterval (sooner after a failure): rotations reach the record; an
    issuer's owner gone, the next oldest TrustDomain naming it is fetched for."""
    state = shared(memo)
    refresh = trust.Refresh(
        state.cluster, state.trust, body, patch, logger, trust_domains_by_issuer
    )
    await refresh.run(scheduled=True)


@kopf.on.event(GROUP, VERSION, "trustdomains")
async def trust_domain_changed(uid: str, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A deleted TrustDomain's state goes with it (its record: the garbage collector)."""
    if type == "DELETED":
        shared(memo).trust.forget(uid)
