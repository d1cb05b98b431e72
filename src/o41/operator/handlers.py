"""kopf handlers: thin, they turn objects into facts and call the core and storage.

- Location: set up its bucket (idempotent, retried with backoff), record the outcome in
  the operator's record (``o41.operator.records``) and show it in status, check it stays
  reachable; copy the placement service's version counts into status.
- Organization: keep the fallback and cloud defaults in force, as ``o41.core.organization``
  says, whenever a Location or the Organization changes; post an Event for each change.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import kopf

from o41.api import GROUP, VERSION
from o41.core.organization import Effective, effective
from o41.location_record import LocationRecord
from o41.locations import bucket_ref
from o41.operator import versions
from o41.operator.cluster import Cluster, SecretMissing, operator_namespace
from o41.operator.model import (
    LocationEntry,
    OrganizationEntry,
    in_order,
    location_entry,
    now,
    organization_entry,
    recorded,
    role,
    with_condition,
)
from o41.operator.records import Records
from o41.storage import SetupFailed, open_bucket

CHECK_INTERVAL = float(os.environ.get("O41_LOCATION_CHECK_INTERVAL", "60"))
MAX_BACKOFF = float(os.environ.get("O41_MAX_BACKOFF", "300"))

_cluster: Cluster | None = None
_records: Records | None = None
_org_locks: dict[str, asyncio.Lock] = {}
_in_force: dict[str, Effective] = {}


def cluster() -> Cluster:
    global _cluster
    if _cluster is None:
        _cluster = Cluster(operator_namespace())
    return _cluster


def records() -> Records:
    global _records
    if _records is None:
        _records = Records(cluster())
    return _records


@kopf.on.startup()
async def load_records(logger: kopf.Logger, **_: Any) -> None:
    """Before any handler or index sees a Location, know what the operator recorded."""
    found = await asyncio.to_thread(records().load)
    logger.info("loaded %d location records from namespace %s", found, cluster().namespace)


@kopf.on.startup()
async def start_copying_counts(memo: kopf.Memo, **_: Any) -> None:
    memo["counts"] = asyncio.create_task(versions.copy_counts(cluster(), versions.INTERVAL))


@kopf.on.cleanup()
async def stop_copying_counts(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("counts")
    if task is not None:
        task.cancel()


# --- indexes: the in-memory views the handlers and the admission webhook read ------------


@kopf.index(GROUP, VERSION, "locations")
def locations_by_name(
    name: str, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[str, LocationEntry]:
    return {name: location_entry(name, meta, spec, status)}


@kopf.index(GROUP, VERSION, "organizations")
def organizations_by_name(name: str, body: kopf.Body, **_: Any) -> dict[str, OrganizationEntry]:
    return {name: organization_entry(body)}


def one(index: kopf.Index[str, Any], key: str) -> Any | None:
    values = list(index.get(key, []))
    return values[0] if values else None


def with_record(entry: LocationEntry) -> LocationEntry:
    """The entry with what the operator's record says now."""
    return replace(entry, facts=recorded(entry.facts, records().cached(entry.uid)))


def entries_of(locations: kopf.Index[str, LocationEntry], org: str) -> list[LocationEntry]:
    return [with_record(e) for key in locations for e in locations[key] if e.organization == org]


# --- Location: the bucket -----------------------------------------------------------------


def credentials_for(spec: Mapping[str, Any]) -> dict[str, str] | None:
    ref = spec.get("credentials")
    return cluster().read_secret(ref["secretName"]) if ref else None


@dataclass
class RecordCreations:
    """The storage's write-ahead record of bucket creations (``o41.storage.Creations``),
    kept in the operator's record of the Location (never in status, which a user could
    write to make the operator adopt someone else's unmarked bucket): written before the
    create call, so a restarted operator adopts the bucket an interrupted setup left
    unmarked."""

    current: LocationRecord

    def recorded(self, bucket: str) -> bool:
        return self.current.creating_bucket == bucket

    def record(self, bucket: str) -> None:
        if self.recorded(bucket):
            return
        try:
            self.current = records().save(self.current.with_(creating_bucket=bucket))
        except Exception as e:  # the API server is away: create nothing it cannot record
            raise SetupFailed(
                "RecordNotWritten",
                f"could not record in the operator's record of the Location that bucket "
                f"{bucket!r} is being created ({type(e).__name__}); the bucket is not "
                f"created until it can be.",
                retryable=True,
            ) from None


class RecordUnavailable(Exception):
    """The operator's record could not be read or written; the setup is retried."""


def _save(record: LocationRecord) -> LocationRecord:
    try:
        return records().save(record)
    except Exception as e:
        raise RecordUnavailable(
            f"could not write the operator's record of location {record.location!r} "
            f"({type(e).__name__}: {e})"
        ) from None


def _backoff(retry: int, retryable: bool) -> float:
    """Transient failures retry fast; ones that need the user (credentials, a name, a
    region) retry slowly, so a fixed Secret is still picked up without a restart."""
    base = 2 if retryable else 30
    return float(min(base * 2**retry, MAX_BACKOFF))


@kopf.on.resume(GROUP, VERSION, "locations")
@kopf.on.create(GROUP, VERSION, "locations")
@kopf.on.update(GROUP, VERSION, "locations", field="spec")
def set_up_bucket(
    name: str,
    uid: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    retry: int,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Create or adopt the bucket; on failure say why in status and retry with backoff.

    The outcome goes to the operator's record first, then to status (an output)."""
    generation = meta.get("generation")
    try:
        record = records().ensure(name, uid, status)
    except Exception as e:  # the API server is away: nothing is decided without the record
        message = f"could not read or create the operator's record ({type(e).__name__})"
        logger.warning("%s; retrying", message)
        raise kopf.TemporaryError(message, delay=_backoff(retry, retryable=True)) from None
    creations = RecordCreations(record)
    try:
        ref = bucket_ref(name, uid, spec, credentials_for(spec))
        ensured = open_bucket(ref).ensure(owner=uid, creations=creations)
    except (SetupFailed, SecretMissing) as e:
        reason, message = _why(e)
        delay = _backoff(retry, retryable=isinstance(e, SetupFailed) and e.retryable)
        try:
            record = _save(creations.current.with_(ready=False, failed=True))
        except RecordUnavailable as unrecorded:
            logger.warning("%s; retrying in %.0f s", unrecorded, delay)
            raise kopf.TemporaryError(str(unrecorded), delay=delay) from None
        patch.status["unfinished"] = record.unfinished
        patch.status["observedGeneration"] = generation
        _set_ready(patch, status, generation, ok=False, reason=reason, message=message)
        kopf.event(body, type="Warning", reason=reason, message=message)
        logger.warning("bucket setup failed (%s), retrying in %.0f s: %s", reason, delay, message)
        raise kopf.TemporaryError(message, delay=delay) from None

    done = creations.current.with_(
        ready=True,
        failed=False,
        ready_since=creations.current.ready_since or now(),
        creating_bucket=None,  # marked now: the write-ahead record has done its job
    )
    try:
        record = _save(done)
    except RecordUnavailable as e:  # not Ready until recorded: placement reads the record
        logger.warning("%s; retrying", e)
        raise kopf.TemporaryError(str(e), delay=_backoff(retry, retryable=True)) from None
    verb = "created" if ensured.created else "adopted"
    message = f"bucket {ref.bucket!r} {verb} in {spec['cloud']}/{spec['region']}"
    if not ensured.region_checked:
        message += " (this backend cannot confirm the region)"
    patch.status["bucket"] = ref.bucket
    patch.status["endpoint"] = ensured.endpoint
    patch.status["unfinished"] = False
    patch.status["readySince"] = record.ready_since
    patch.status["observedGeneration"] = generation
    became_ready = _set_ready(
        patch, status, generation, ok=True, reason="BucketReady", message=message
    )
    for warning in ensured.warnings:
        kopf.event(body, type="Warning", reason="HardeningSkipped", message=warning)
    if became_ready:
        reason = "BucketCreated" if ensured.created else "BucketAdopted"
        kopf.event(body, type="Normal", reason=reason, message=message)


@kopf.on.field(GROUP, VERSION, "locations", field="spec.retired")
def retired_changed(old: Any, new: Any, body: kopf.Body, **_: Any) -> None:
    """An Event when a location is retired or taken back into service."""
    if bool(old) == bool(new):
        return
    if new:
        kopf.event(
            body,
            type="Normal",
            reason="Retired",
            message="no new writes go here; its versions stay readable",
        )
    else:
        kopf.event(body, type="Normal", reason="Reactivated", message="takes writes again")


@kopf.timer(
    GROUP, VERSION, "locations", interval=CHECK_INTERVAL, initial_delay=CHECK_INTERVAL, idle=0
)
def check_bucket(
    name: str,
    uid: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    **_: Any,
) -> None:
    """A bucket that was Ready can break later (deleted, credentials revoked): show it,
    and show it again when it recovers. Patches and Events only on a change."""
    try:
        record = records().restore(uid)  # a removed or edited record is put back
    except Exception:  # the API server is away: go on with what this operator wrote
        record = records().cached(uid)
    if record is None or not record.ever_ready:
        return  # still being set up: set_up_bucket owns the condition
    generation = meta.get("generation")
    ref = bucket_ref(name, uid, spec, credentials_for(spec))
    try:
        open_bucket(ref).check()
    except (SetupFailed, SecretMissing) as e:
        reason, message = _why(e)
        _save(record.with_(ready=False))  # no writes go there from now on
        if _set_ready(patch, status, generation, ok=False, reason=reason, message=message):
            kopf.event(body, type="Warning", reason=reason, message=message)
        return
    if not record.ready:
        _save(record.with_(ready=True))
    # Recovered: only a Ready condition this check (or a setup) turned False. With none yet,
    # set_up_bucket's status patch is still on its way and owns the condition.
    if _ready_condition(status).get("status") == "False":
        message = f"bucket {ref.bucket!r} is reachable again"
        _set_ready(patch, status, generation, ok=True, reason="BucketReady", message=message)
        kopf.event(body, type="Normal", reason="BucketRecovered", message=message)


def _why(e: SetupFailed | SecretMissing) -> tuple[str, str]:
    return (str(e.reason) if isinstance(e, SetupFailed) else "SecretNotFound"), str(e)


def _ready_condition(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})


def _set_ready(
    patch: kopf.Patch,
    status: Mapping[str, Any],
    generation: int | None,
    *,
    ok: bool,
    reason: str,
    message: str,
) -> bool:
    """Set the Ready condition unless it already says exactly this; True if it changed
    status (so callers post an Event only for a change)."""
    current = _ready_condition(status)
    value = "True" if ok else "False"
    same = (current.get("status"), current.get("reason"), current.get("message")) == (
        value,
        reason,
        message,
    )
    if same and current.get("observedGeneration") == generation:
        return False
    patch.status["conditions"] = with_condition(
        status.get("conditions"),
        kind="Ready",
        status=ok,
        reason=reason,
        message=message,
        generation=generation,
    )
    return current.get("status") != value


# --- Organization: fallback and cloud defaults --------------------------------------------


@kopf.on.event(GROUP, VERSION, "locations")  # type: ignore[arg-type]  # indexes by name
async def location_changed(
    name: str,
    uid: str,
    type: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    locations_by_name: kopf.Index[str, LocationEntry],
    organizations_by_name: kopf.Index[str, OrganizationEntry],
    **_: Any,
) -> None:
    if type == "DELETED":
        records().forget(uid)
        versions.forget(name)
    else:
        versions.seen(name, status)
    org = spec.get("organization")
    if org:
        await reconcile_organization(org, locations_by_name, organizations_by_name)


@kopf.on.event(GROUP, VERSION, "organizations")  # type: ignore[arg-type]  # indexes by name
async def organization_changed(
    name: str,
    type: str | None,
    locations_by_name: kopf.Index[str, LocationEntry],
    organizations_by_name: kopf.Index[str, OrganizationEntry],
    **_: Any,
) -> None:
    if type == "DELETED":
        _in_force.pop(name, None)
        return
    await reconcile_organization(name, locations_by_name, organizations_by_name)


async def reconcile_organization(
    org: str,
    locations: kopf.Index[str, LocationEntry],
    organizations: kopf.Index[str, OrganizationEntry],
) -> None:
    """Bring the Organization's status and its Locations' roles in line with the rules."""
    lock = _org_locks.setdefault(org, asyncio.Lock())
    async with lock:
        entry: OrganizationEntry | None = one(organizations, org)
        if entry is None:
            return  # Locations may come first; the Organization's own event will follow
        mine = entries_of(locations, org)
        before = _in_force.get(org, entry.in_force)
        after = effective(in_order(mine), entry.picks, before)
        _in_force[org] = after
        shown = (entry.in_force, entry.locations)
        if (after, len(mine)) != shown or not entry.conditions:
            status = organization_status(after, len(mine), entry.conditions)
            await asyncio.to_thread(cluster().patch_status, "organizations", org, status)
        if after != before:
            _post_changes(entry, before, after)
        for e in mine:  # only the roles that changed: 200 locations must not mean 200 patches
            wanted = role(e.facts.name, after)
            if wanted != e.role:
                await asyncio.to_thread(
                    cluster().patch_status, "locations", e.facts.name, {"role": wanted or None}
                )


def organization_status(
    in_force: Effective, locations: int, conditions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    if in_force.takes_writes:
        reason, message = "FallbackReady", f"takes writes; fallback is {in_force.fallback!r}"
    elif in_force.fallback is None:
        reason = "NoFallback"
        message = "no location yet, so no writes: add a Location to this organization"
    else:
        reason = "FallbackNotReady"
        message = f"the fallback {in_force.fallback!r} is not Ready yet, so no writes"
    return {
        "fallback": in_force.fallback,
        "cloudDefaults": dict(in_force.cloud_defaults) or None,
        "takesWrites": in_force.takes_writes,
        "locations": locations,
        "conditions": with_condition(
            conditions,
            kind="Ready",
            status=in_force.takes_writes,
            reason=reason,
            message=message,
            generation=None,
        ),
    }


def _post_changes(entry: OrganizationEntry, before: Effective, after: Effective) -> None:
    ref = kopf.Body(dict(entry.ref))  # type: ignore[arg-type]
    if before.fallback != after.fallback:
        kopf.event(
            ref,
            type="Normal",
            reason="FallbackChanged",
            message=f"fallback is now {after.fallback!r} (was {before.fallback!r})",
        )
    for cloud in sorted(set(before.cloud_defaults) | set(after.cloud_defaults)):
        was, now_ = before.cloud_defaults.get(cloud), after.cloud_defaults.get(cloud)
        if was != now_:
            kopf.event(
                ref,
                type="Normal",
                reason="CloudDefaultChanged",
                message=f"default for {cloud} is now {now_!r} (was {was!r})",
            )
    if before.takes_writes != after.takes_writes:
        kopf.event(
            ref,
            type="Normal",
            reason="TakesWrites" if after.takes_writes else "StoppedWrites",
            message="takes writes" if after.takes_writes else "no longer takes writes",
        )
