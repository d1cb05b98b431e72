"""A TrustDomain's keys: fetched (``o41.kube.trust_keys``) when it is created, changed or
resumed, then every ``spec.refreshInterval``; the last good ones kept in the operator's
record (``o41.kube.trust_record``, a ConfigMap of its namespace), which is what the placement
service trusts. One fetch for all the service's replicas. Status (Ready, the kids, when)
only shows what happened: no key is ever taken from it.

A failed fetch leaves the record untouched, so the last good keys serve on until
``spec.staleAfter`` past their fetch (the service's rule); Ready says why it failed and,
once the keys are past that limit, ``Stale``. Called by the kopf handlers of
``o41.operator.handlers``.

One issuer is one trust domain: of the TrustDomains naming an issuer (two made at the
same instant both pass admission), the oldest owns it (``o41.core.trust.issuer_owners``,
the rule the service applies on its own); the others are never fetched for and show
Ready=False ``Conflict``, naming the owner.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from o41.core.addresses import Network
from o41.core.admission import own_issuer_named
from o41.core.trust import IssuerClaim, issuer_conflict
from o41.kube.api import TrustDomainSpec
from o41.kube.locations import condition
from o41.kube.trust_keys import KeyFetchFailed, fetch_keys
from o41.kube.trust_record import TrustRecord, issuer_claim, parse, record_name
from o41.operator import events
from o41.operator.cluster import Cluster
from o41.operator.model import with_condition


def _override(raw: str | None) -> float | None:
    """``O41_TRUST_REFRESH_INTERVAL``: seconds between fetches of every TrustDomain,
    whatever its spec says (the CRD's floor is 60 s): tests, and debugging. Unset: each
    TrustDomain's spec.refreshInterval."""
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0.5 <= seconds <= 86400:
        raise ValueError(
            f"O41_TRUST_REFRESH_INTERVAL must be seconds from 0.5 to 86400, not {raw!r}"
        )
    return seconds


REFRESH_OVERRIDE = _override(os.environ.get("O41_TRUST_REFRESH_INTERVAL"))
SETTINGS = "trust-settings"  # the memo's key of what ``python -m o41.operator`` was given
RETRY_FIRST = 15.0  # seconds after a failed fetch, doubling up to the refresh interval
TICK = min(REFRESH_OVERRIDE or RETRY_FIRST, RETRY_FIRST)  # the timer's interval


@dataclass
class Attempt:
    at: float  # time.monotonic() of the last fetch, failed or not
    failures: int = 0  # failed fetches in a row


@dataclass
class TrustDomains:
    """Per TrustDomain (by uid): a lock (one fetch at a time: its handlers and its timer),
    the last attempt, and the record this operator last wrote. All go with it (``forget``).
    For all: this cluster's own issuer (no TrustDomain may name it) and the networks beyond
    the public ones keys may be fetched from (the chart's trustDomains.allowedNetworks)."""

    own_issuer: str | None = None
    allowed: tuple[Network, ...] = ()
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    attempts: dict[str, Attempt] = field(default_factory=dict)
    records: dict[str, TrustRecord] = field(default_factory=dict)

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    def due(self, uid: str, refresh_interval: float, now: float) -> bool:
        """A fetch is due: none yet; ``refresh_interval`` since the last good one; or,
        after failures, ``RETRY_FIRST`` doubling per failure (at most the interval)."""
        last = self.attempts.get(uid)
        if last is None:
            return True
        wait = interval = REFRESH_OVERRIDE or refresh_interval
        if last.failures and REFRESH_OVERRIDE is None:
            wait = min(interval, RETRY_FIRST * 2 ** (last.failures - 1))
        return now - last.at >= wait or now < last.at

    def attempted(self, uid: str, ok: bool, now: float) -> None:
        failures = 0 if ok else (self.attempts.get(uid) or Attempt(now)).failures + 1
        self.attempts[uid] = Attempt(now, failures)

    def forget(self, uid: str) -> None:
        self.attempts.pop(uid, None)
        self.records.pop(uid, None)
        lock = self.locks.get(uid)
        if lock is not None and not lock.locked():
            del self.locks[uid]


@dataclass(frozen=True)
class Given:
    """What the operator was told: this cluster's issuer (``--own-issuer``; None: learnt
    at start, ``o41.kube.trust_keys.own_issuer``) and the networks beyond the public ones keys
    may be fetched from (``--trust-allowed-networks``)."""

    own_issuer: str | None = None
    allowed: tuple[Network, ...] = ()


async def configure(
    domains: TrustDomains, given: Given | None, cluster: Cluster, logger: kopf.Logger
) -> None:
    """At start: what it was given, and this cluster's own issuer, learnt."""
    given = given or Given()
    domains.allowed = given.allowed
    issuer, source = await asyncio.to_thread(cluster.own_issuer, given.own_issuer)
    domains.own_issuer = issuer
    if issuer is not None:
        logger.info("this cluster's issuer is %s (%s): no TrustDomain may name it", issuer, source)
    else:
        logger.warning(
            "this cluster's issuer is unknown (%s): a TrustDomain naming it is not refused; "
            "give it with --own-issuer (O41_OWN_ISSUER)",
            source,
        )


# --- what a fetch's outcome shows: plain functions, tested without a cluster --------------


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    reason: str
    message: str
    record: TrustRecord | None = None  # the record to write (a successful fetch only)


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def source_of(spec: TrustDomainSpec) -> str:
    if spec.keys.jwks is not None:
        return "spec.keys.jwks"
    if spec.keys.jwks_url is not None:
        return spec.keys.jwks_url
    return f"OIDC discovery at {spec.issuer}"


def fetched(
    name: str, uid: str, spec: TrustDomainSpec, jwks: Mapping[str, Any], now: dt.datetime
) -> Outcome:
    record = TrustRecord(uid, name, spec.issuer, dict(jwks), fetched_at=rfc3339(now))
    kids = record.key_ids()
    return Outcome(
        True,
        "KeysFetched",
        f"{len(kids)} key(s) fetched from {source_of(spec)}: {', '.join(kids)}",
        record,
    )


def failed(
    spec: TrustDomainSpec, error: KeyFetchFailed, last: TrustRecord | None, now: dt.datetime
) -> Outcome:
    """Why the fetch failed, and what that means for the last good keys: none ever (the
    domain's tokens are refused), serving until staleAfter, or past it (``Stale``)."""
    when = last.fetched() if last is not None and last.jwks.get("keys") else None
    if when is None:
        return Outcome(
            False,
            error.reason,
            f"{error.message}. No keys were ever fetched: this domain's tokens are refused "
            "(503) until a fetch succeeds",
        )
    until = when + dt.timedelta(seconds=spec.stale_after)
    if now >= until:
        return Outcome(
            False,
            "Stale",
            f"the last good keys, fetched at {rfc3339(when)}, are older than spec.staleAfter "
            f"({spec.stale_after} s): this domain's tokens are refused (503) until a fetch "
            f"succeeds. The last fetch failed ({error.reason}): {error.message}",
        )
    return Outcome(
        False,
        error.reason,
        f"{error.message}. The last good keys (fetched at {rfc3339(when)}) serve until "
        f"{rfc3339(until)} (spec.staleAfter)",
    )


def set_ready(
    patch: kopf.Patch, status: Mapping[str, Any], generation: int | None, outcome: Outcome
) -> bool:
    """Show the outcome as the Ready condition (kept as is when it says the same); True
    when its status or reason changed (an Event is due)."""
    current = condition(status)
    value = "True" if outcome.ok else "False"
    shown = (current.get("status"), current.get("reason"), current.get("message"))
    if shown == (value, outcome.reason, outcome.message) and (
        current.get("observedGeneration") == generation
    ):
        return False
    patch.status["conditions"] = with_condition(
        status.get("conditions"),
        kind="Ready",
        status=outcome.ok,
        reason=outcome.reason,
        message=outcome.message,
        generation=generation,
    )
    return (current.get("status"), current.get("reason")) != (value, outcome.reason)


# --- the record: read once, then this operator's; written on every good fetch ------------


def read_record(cluster: Cluster, uid: str, issuer: str) -> TrustRecord | None:
    """The record as stored, if it is this TrustDomain's (its uid and issuer)."""
    configmap = cluster.read_configmap(record_name(uid))
    record = parse(configmap) if configmap is not None else None
    return record if record is not None and record.issuer == issuer else None


def save_record(cluster: Cluster, record: TrustRecord) -> None:
    body = record.configmap(cluster.namespace)
    patch = {
        "metadata": {k: body["metadata"][k] for k in ("labels", "annotations", "ownerReferences")},
        "data": body["data"],
    }
    name = record_name(record.uid)
    if not cluster.patch_configmap(name, patch) and not cluster.create_configmap(body):
        cluster.patch_configmap(name, patch)  # made meanwhile


# --- one refresh ---------------------------------------------------------------------------


@dataclass
class Refresh:
    """One fetch of a TrustDomain's keys and what it shows: record, status, Events."""

    cluster: Cluster
    domains: TrustDomains
    body: kopf.Body
    patch: kopf.Patch
    logger: kopf.Logger
    claims: Mapping[str, Iterable[IssuerClaim]]  # by issuer: the TrustDomains naming it

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"]["uid"])

    @property
    def generation(self) -> int | None:
        generation: int | None = self.body.get("metadata", {}).get("generation")
        return generation

    async def run(self, *, scheduled: bool) -> None:
        """Fetch now (``scheduled``: only when due, from the timer)."""
        try:
            spec = TrustDomainSpec.model_validate(dict(self.body.get("spec") or {}))
        except ValidationError as e:  # the CRD's schema refuses these: a drift, say so
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            message = f"spec.{where}: {first['msg']}: fix the TrustDomain"
            await asyncio.to_thread(self.show, Outcome(False, "InvalidSpec", message))
            return
        ignored = self.ignored(spec)
        if ignored is not None:  # nothing fetched for it
            await asyncio.to_thread(self.show, ignored)
            return
        async with self.domains.lock(self.uid):
            if scheduled and not self.domains.due(
                self.uid, spec.refresh_interval, time.monotonic()
            ):
                return
            last = await self.last_record(spec)
            try:
                jwks = await fetch_keys(spec, trust_domain=self.name, allowed=self.domains.allowed)
            except KeyFetchFailed as e:
                self.domains.attempted(self.uid, False, time.monotonic())
                self.logger.warning("keys not fetched (%s): %s", e.reason, e.message)
                await asyncio.to_thread(self.show, failed(spec, e, last, now()))
                return
            outcome = fetched(self.name, self.uid, spec, jwks, now())
            assert outcome.record is not None
            try:
                await asyncio.to_thread(save_record, self.cluster, outcome.record)
            except Exception as e:  # the API server is away: not fetched until recorded
                self.domains.attempted(self.uid, False, time.monotonic())
                message = (
                    f"keys fetched but not recorded in the operator's namespace "
                    f"({type(e).__name__}); the service goes on with the last recorded ones. "
                    "Retried shortly"
                )
                self.logger.warning("%s", message)
                await asyncio.to_thread(self.show, Outcome(False, "RecordNotWritten", message))
                return
            self.domains.attempted(self.uid, True, time.monotonic())
            self.domains.records[self.uid] = outcome.record
            await asyncio.to_thread(self.show, outcome, last)

    def ignored(self, spec: TrustDomainSpec) -> Outcome | None:
        """Why the service ignores this TrustDomain (by its own rules: status only says
        so): it names this cluster's own issuer (admitted before that was refused), or
        another, older TrustDomain owns its issuer."""
        if spec.issuer == self.domains.own_issuer:
            return Outcome(False, "OwnIssuer", own_issuer_named(self.name, spec.issuer))
        mine = issuer_claim(self.body)
        conflict = issuer_conflict(mine, self.claims.get(mine.issuer, ())) if mine else None
        return Outcome(False, "Conflict", conflict) if conflict is not None else None

    async def last_record(self, spec: TrustDomainSpec) -> TrustRecord | None:
        """The last good keys: as this operator wrote them, else as stored (a restart)."""
        mine = self.domains.records.get(self.uid)
        if mine is not None and mine.issuer == spec.issuer:
            return mine
        try:
            stored = await asyncio.to_thread(read_record, self.cluster, self.uid, spec.issuer)
        except Exception as e:  # the API server is away: as if there were none
            self.logger.warning("could not read the record of the keys (%s)", type(e).__name__)
            return None
        if stored is not None:
            self.domains.records[self.uid] = stored
        return stored

    def show(self, outcome: Outcome, before: TrustRecord | None = None) -> None:
        """Status (and an Event on a change of Ready, or of the keys)."""
        status = self.body.status
        if outcome.record is not None:
            self.patch.status["keyIds"] = outcome.record.key_ids()
            self.patch.status["lastFetched"] = outcome.record.fetched_at
        self.patch.status["observedGeneration"] = self.generation
        changed = set_ready(self.patch, status, self.generation, outcome)
        if changed:
            events.post(
                self.cluster,
                self.body,
                type="Normal" if outcome.ok else "Warning",
                reason=outcome.reason,
                message=outcome.message,
            )
        new = outcome.record.key_ids() if outcome.record is not None else None
        old = before.key_ids() if before is not None and before.jwks.get("keys") else None
        if new is not None and old is not None and new != old and not changed:
            events.post(
                self.cluster,
                self.body,
                type="Normal",
                reason="KeysRotated",
                message=f"the issuer's keys are now {', '.join(new)} (were {', '.join(old)})",
            )


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
