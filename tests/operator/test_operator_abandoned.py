"""The operator keeps each bucket's rule that aborts unfinished uploads: on versitygw,
which takes no lifecycle rules, the Location still becomes Ready and an Event says that
only the placement service aborts them (the rule itself is read back from moto in
tests/storage/test_storage_abandoned.py; the operator's setting is parsed here)."""

from __future__ import annotations

import pytest

from o41.operator.buckets import abort_uploads_after_days
from test_operator import Cluster, unique
from test_operator import cluster as cluster

from support import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.stores]


def test_a_store_without_lifecycle_rules_is_ready_with_a_warning(cluster: Cluster) -> None:
    org, loc = unique("org"), unique("aws-rule")
    cluster.organization(org)
    cluster.location(loc, org)
    cluster.ready(loc)

    def warned() -> list[str] | None:
        found = [e["message"] for e in cluster.events(loc) if e["reason"] == "HardeningSkipped"]
        return found if any("lifecycle" in m for m in found) else None

    messages = wait_for(warned, 30, "a HardeningSkipped Event about lifecycle rules")
    assert f"{cluster.s3.endpoint} takes no lifecycle rules" in " ".join(messages)


@pytest.mark.parametrize(
    ("value", "days"), [(None, 2), ("2", 2), ("7", 7), ("0", None), (" 3 ", 3)]
)
def test_the_operators_days_setting(value: str | None, days: int | None) -> None:
    env = {} if value is None else {"O41_ABORT_INCOMPLETE_UPLOADS_AFTER_DAYS": value}
    assert abort_uploads_after_days(env) == days


@pytest.mark.parametrize("value", ["-1", "two", "1.5", "3651", ""])
def test_a_bad_days_setting_says_what_to_set(value: str) -> None:
    with pytest.raises(ValueError, match="whole number of days from 0"):
        abort_uploads_after_days({"O41_ABORT_INCOMPLETE_UPLOADS_AFTER_DAYS": value})
