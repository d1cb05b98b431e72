"""Usage counters: by organization, writer place, place.source, rule, locality and bytes.

Counted in memory on the hot path and merged into the state store every few seconds by
compare-and-swap, so many service replicas add up. A replica that dies loses at most its
last few seconds of counters (never a version): counters are for the usage page, not
billing.

Rolled up as they are merged: each flush adds a replica's counts to the hour's record and
to the day's record of the same dimensions in one transaction, so the day always is the
sum of its hours. The keys start with the period, then the organization:

- ``usage-by-hour/<YYYY-MM-DDTHH>/<org>/<digest>``, kept ``hourly_days`` (14 by default);
- ``usage-by-day/<YYYY-MM-DD>/<org>/<digest>``, kept ``daily_days`` (400).

Retention is a periodic delete of the periods past it, one prefix per period: idempotent,
so every replica may run it, with no leader. Records of the layout before (``usage/<org>/
<hour>/<digest>``, written by a replica of an older version during a rolling upgrade)
are folded into the new keys by the same sweep, each by compare-and-swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any, Literal

from aiohttp import web

from o41.kube.locations import Location
from o41.state import Compare, Delete, KeyValue, Put, Store, StoreUnavailable
from o41.webhook.records import PREFIX
from o41.webhook.telemetry import metrics
from o41.webhook.usage.cache import ClosedPeriods, OpenRecords

log = logging.getLogger("o41.webhook.usage")  # its name is a log field: kept

Dims = tuple[tuple[str, str], ...]
Granularity = Literal["hour", "day"]

HOURLY_DAYS = 14
DAILY_DAYS = 400
SWEEP_EVERY = 600.0  # seconds between retention sweeps
_LEGACY = PREFIX + b"usage/"
_PERIOD = {"hour": 13, "day": 10}  # the length of a period's name


def hour(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H", time.gmtime(now))


def day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def rollup_prefix(granularity: Granularity) -> bytes:
    return PREFIX + f"usage-by-{granularity}/".encode()


def period_prefix(granularity: Granularity, period: str, organization: str) -> bytes:
    """The keys of one organization's records of one hour or day."""
    return rollup_prefix(granularity) + f"{period}/{organization}/".encode()


def digest_of(kind: str, dims: Dims) -> str:
    return hashlib.sha256(json.dumps([kind, dims]).encode()).hexdigest()[:24]


def _added(current: KeyValue | None, base: dict[str, Any], counts: Counter[str]) -> bytes:
    record: dict[str, Any] = json.loads(current.value) if current else {**base, "counts": {}}
    totals = record.setdefault("counts", {})
    if not isinstance(totals, dict):  # a damaged record: start its counts again
        totals = record["counts"] = {}
    for name, n in counts.items():
        totals[name] = totals.get(name, 0) + n
    return json.dumps(record, separators=(",", ":")).encode()


class Lately:
    """The reads this replica counted lately, by (tenant, organization, version, path in a
    directory version or ""): a download signed *again* for one of them (its URL expired,
    or the rest of a read that stopped) within a window is no new read. The bucket sends a
    version's bytes once in all for such a read, and the first signing counted them; a
    client could fetch the first URL as often anyway while it is valid, so this counts
    nothing less than the URL allows. Bounded: the oldest go past ``most``; a signing
    again on another replica counts again (more, never less)."""

    def __init__(self, most: int = 100_000) -> None:
        self.most = most
        self._at: OrderedDict[tuple[str, ...], float] = OrderedDict()

    def note(self, key: tuple[str, ...]) -> None:
        self._at[key] = time.monotonic()
        self._at.move_to_end(key)
        while len(self._at) > self.most:
            self._at.popitem(last=False)

    def seen(self, keys: Iterable[tuple[str, ...]], within: float) -> bool:
        now = time.monotonic()
        return any(now - self._at.get(k, float("-inf")) <= within for k in keys)


class Usage:
    def __init__(
        self,
        store: Store,
        interval: float = 5.0,
        *,
        hourly_days: int = HOURLY_DAYS,
        daily_days: int = DAILY_DAYS,
        sweep_every: float = SWEEP_EVERY,
    ) -> None:
        self._store, self._interval = store, interval
        self.hourly_days, self.daily_days = hourly_days, daily_days
        self._sweep_every = sweep_every
        self._counts: dict[tuple[str, str, Dims], Counter[str]] = defaultdict(Counter)
        self._flushing = asyncio.Lock()
        self.lately = Lately()  # reads counted lately: a download signed again is none
        self.closed = ClosedPeriods()  # the page's merges of hours and days that are over
        self.open_records = OpenRecords()  # and the parsed records of the open ones

    def add(self, organization: str, kind: str, dims: dict[str, str | None], **counts: int) -> None:
        key = (organization, kind, tuple(sorted((k, v or "") for k, v in dims.items())))
        self._counts[key].update(counts)
        metrics.observe(organization, kind, dims, counts)

    async def run(self) -> None:
        swept = 0.0
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()
            if time.monotonic() - swept >= self._sweep_every:
                swept = time.monotonic()
                try:
                    await self.sweep(time.time())
                except StoreUnavailable as e:
                    log.warning("usage retention not applied (%s); trying again later", e)

    async def flush(self) -> None:
        """Every count added before this call is in the store when it returns (or kept for
        the next flush): one flush at a time, so that a usage page's flush waits for the
        periodic one that already took the counts it must show."""
        async with self._flushing:
            pending, self._counts = self._counts, defaultdict(Counter)
            now = time.time()
            for (org, kind, dims), counts in pending.items():
                try:
                    await self._merge(org, kind, hour(now), dims, counts)
                except StoreUnavailable as e:  # keep them for the next flush
                    log.warning("usage not flushed (%s); keeping it for the next try", e)
                    self._counts[(org, kind, dims)].update(counts)

    async def _merge(
        self,
        org: str,
        kind: str,
        when: str,
        dims: Dims,
        counts: Counter[str],
        *,
        also: list[Compare] | None = None,
        delete: bytes | None = None,
        hourly: bool = True,
        daily: bool = True,
    ) -> bool:
        """Add ``counts`` to the hour's and the day's record in one transaction, by
        compare-and-swap. ``also``: guards of the same transaction, and ``delete`` a key in
        it (the fold of a record of the older layout); False when a guard of ``also``
        failed."""
        digest = digest_of(kind, dims)
        hour_key = period_prefix("hour", when, org) + digest.encode()
        day_key = period_prefix("day", when[:10], org) + digest.encode()
        targets = [
            (key, {"kind": kind, name: period, "dims": dict(dims), "counts": {}})
            for key, name, period, wanted in (
                (hour_key, "hour", when, hourly),
                (day_key, "day", when[:10], daily),
            )
            if wanted
        ]
        for _ in range(20):  # CAS loop: other replicas merge into the same keys
            current = [await self._store.get(key) for key, _ in targets]
            guards = [
                Compare(key, "mod", "==", kv.mod_revision if kv else 0)
                for (key, _), kv in zip(targets, current, strict=True)
            ]
            puts: list[Put | Delete] = [
                Put(key, _added(kv, base, counts))
                for (key, base), kv in zip(targets, current, strict=True)
            ]
            if delete is not None:
                puts.append(Delete(delete))
            result = await self._store.txn([*guards, *(also or [])], puts)
            if result.succeeded:
                return True
            if also and not all([await self._guard_holds(c) for c in also]):
                return False
        raise StoreUnavailable(f"usage key {hour_key!r} kept changing")

    async def _guard_holds(self, guard: Compare) -> bool:
        kv = await self._store.get(guard.key)
        return kv is not None and kv.mod_revision == guard.value

    # --- retention ------------------------------------------------------------------

    async def sweep(self, now: float) -> int:
        """Delete the hours and days past their retention and fold the records of the
        older layout; the number of periods deleted and records folded."""
        done = await self._fold_legacy(now)
        hourly_cut = hour(now - self.hourly_days * 86400)
        daily_cut = day(now - self.daily_days * 86400)
        for granularity, cut in (("hour", hourly_cut), ("day", daily_cut)):
            done += await self._expire(granularity, cut)  # type: ignore[arg-type]
        return done

    async def _expire(self, granularity: Granularity, cut: str) -> int:
        """Delete every period older than ``cut``, oldest first, one prefix each."""
        prefix, deleted = rollup_prefix(granularity), 0
        for _ in range(10_000):  # at most a long outage's worth of periods
            oldest = await self._store.range(prefix, limit=1)
            if not oldest:
                break
            period = oldest[0].key[len(prefix) :].split(b"/", 1)[0].decode(errors="replace")
            if period >= cut:
                break
            await self._store.delete(prefix + period.encode() + b"/", prefix=True)
            deleted += 1
        return deleted

    async def _fold_legacy(self, now: float, page: int = 500) -> int:
        """Records of ``usage/<org>/<hour>/<digest>`` into the hour and day keys."""
        folded, hourly_cut = 0, hour(now - self.hourly_days * 86400)
        daily_cut = day(now - self.daily_days * 86400)
        while True:
            found = await self._store.range(_LEGACY, limit=page)
            if not found:
                return folded
            for kv in found:
                folded += await self._fold(kv, hourly_cut, daily_cut)
            self.closed.clear()  # past periods changed

    async def _fold(self, kv: KeyValue, hourly_cut: str, daily_cut: str) -> int:
        parts = kv.key[len(_LEGACY) :].decode(errors="replace").split("/")
        try:
            record = json.loads(kv.value)
            org, when = parts[0], record["hour"]
            kind, dims = record["kind"], record["dims"]
            counts = Counter(
                {
                    str(k): v
                    for k, v in record["counts"].items()
                    if isinstance(v, int) and not isinstance(v, bool) and v >= 0
                }
            )
            ok = (
                len(parts) == 3
                and isinstance(when, str)
                and len(when) == _PERIOD["hour"]
                and isinstance(kind, str)
            )
            dims_t: Dims = tuple(sorted((str(k), str(v)) for k, v in dims.items()))
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        guard = Compare(kv.key, "mod", "==", kv.mod_revision)
        if not ok or when[:10] < daily_cut:  # damaged, or past every retention
            await self._store.txn([guard], [Delete(kv.key)])
            return 1
        folded = await self._merge(
            org,
            kind,
            when,
            dims_t,
            counts,
            also=[guard],
            delete=kv.key,
            hourly=when >= hourly_cut,
        )
        return 1 if folded else 0


def periods(
    granularity: Granularity, names: Iterable[str], organization: str
) -> list[tuple[Granularity, str, bytes]]:
    """``(granularity, period, prefix)`` for each period name, in order."""
    return [(granularity, n, period_prefix(granularity, n, organization)) for n in names]


async def flushed(usage: Usage) -> None:
    """This replica's counters in the store, when it can."""
    with contextlib.suppress(StoreUnavailable):
        await usage.flush()


USAGE: web.AppKey[Usage] = web.AppKey("usage")


def location_dims(location: Location) -> dict[str, str | None]:
    """Where a usage counter's bytes are stored: its location and that location's place."""
    return {
        "location": location.name,
        "locationCloud": location.cloud,
        "locationRegion": location.region,
    }
