"""The operator's shared state, kept in kopf's memo (no module globals).

``start`` runs at start-up (``@kopf.on.startup`` in ``o41.operator.handlers``) and puts one
``Shared`` in the operator's memo; kopf gives every resource handler, index and admission
handler a shallow copy of that memo, so they all reach the same ``Shared`` through
``shared(memo)``. Tests build one around a ``Cluster`` of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from o41.core.organization import Effective
from o41.operator.cluster import Cluster
from o41.operator.records import Records
from o41.operator.trust import TrustDomains
from o41.operator.versions import ShownCounts

KEY = "o41"

# The periodic bucket checks run in a pool of their own this wide: a thousand Locations due
# at once queue there (each checked later, never skipped) and leave kopf's own workers free,
# so a new Location's setup never waits behind them (kopf's six workers on two cores, shared
# by checks and setups, left a new Location not Ready within 60 s late in the test suite)
CHECKS_AT_ONCE = 2


def _checks_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=CHECKS_AT_ONCE, thread_name_prefix="o41-check")


@dataclass
class Organizations:
    """Per organization: the lock that keeps its reconciliations one at a time, and the
    fallback and defaults this operator last put in force. Both go with the organization
    (``forget``), so a long-running operator keeps none for deleted ones."""

    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    in_force: dict[str, Effective] = field(default_factory=dict)

    def lock(self, organization: str) -> asyncio.Lock:
        return self.locks.setdefault(organization, asyncio.Lock())

    def forget(self, organization: str) -> None:
        self.in_force.pop(organization, None)
        lock = self.locks.get(organization)
        if lock is not None and not lock.locked():
            del self.locks[organization]


@dataclass
class Shared:
    cluster: Cluster
    records: Records
    organizations: Organizations = field(default_factory=Organizations)
    counts: ShownCounts = field(default_factory=ShownCounts)
    trust: TrustDomains = field(default_factory=TrustDomains)
    checks: ThreadPoolExecutor = field(default_factory=_checks_pool, repr=False)

    @classmethod
    def around(cls, cluster: Cluster) -> Shared:
        return cls(cluster, Records(cluster))

    def credentials(self, spec: Mapping[str, Any]) -> dict[str, str] | None:
        """The Location's credentials Secret, read now (None: ambient identity)."""
        ref = spec.get("credentials")
        return self.cluster.read_secret(ref["secretName"]) if ref else None


def put(memo: Any, state: Shared) -> Shared:
    memo[KEY] = state
    return state


def shared(memo: Any) -> Shared:
    """The state start-up put in kopf's memo."""
    found = memo.get(KEY) if memo is not None else None
    if not isinstance(found, Shared):
        raise TypeError("the operator's start-up did not run: no shared state in the memo")
    return found
