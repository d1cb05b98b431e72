"""Fixtures of the test bed live in tests/fixtures/, one module a part of it; and how
``make test`` splits the suite over pytest-xdist's workers."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

# Every test reads from the buckets, as before issue 39 (a test that rewrites an object
# in a bucket and reads it again must not be served the copy of an earlier read), and
# prints no progress bars; the cache's and progress's own tests turn them on (a cache in
# the test's tmp path, never the user's ~/.cache). Subprocesses inherit both.
os.environ["O41_ARTIFACTS_CACHE"] = "off"
os.environ["O41_ARTIFACTS_PROGRESS"] = "0"
# A test that stops a service expects its clients to fail soon, not to wait out a
# training job's few minutes of retries; the retries' own tests set their deadline.
os.environ.setdefault("O41_ARTIFACTS_RETRY_DEADLINE", "10")
# Hypothesis's 200 ms deadline per example is a timing assertion: on three workers beside
# etcds, kube-apiservers and a kubelet on two shared cores, one garbage collection can
# take it (and a rerun that does not is then reported "flaky"). Examples have no deadline;
# speed is measured by bench/, never asserted here.
settings.register_profile("o41", deadline=None)
settings.load_profile("o41")

pytest_plugins = [
    "fixtures.stores",
    "fixtures.kube",
    "fixtures.etcd",
    "fixtures.operator",  # after the ones it imports
    "fixtures.placement",
    "fixtures.world",
    "fixtures.node",
]

#: Tests that share the machine's one real node (a kubelet, its bridge, iptables rules and
#: cgroups, waited for machine-wide) or build the project's images: one worker runs them
#: all, one after the other, and starts them first, being the longest share.
MACHINE_WIDE = ("tests/real/", "tests/chart/test_image.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(MACHINE_WIDE))  # stable


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs the suite on three workers (``-n 3``): each test module goes
    whole to one worker (its module-scoped fixtures, a world of Locations, start once),
    and every machine-wide test to the same one."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(MACHINE_WIDE):
                return "the machine's real node"
            return nodeid.split("::", 1)[0]

    return ByModule(config, log)
