"""The operator's plain functions and state, without a cluster: the Organization's status
patch replaces what it showed, kopf's memo holds the shared state, pruned with the
organization."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from o41.core.organization import Effective
from o41.operator.cluster import Cluster
from o41.operator.model import organization_status
from o41.operator.state import Organizations, Shared, put, shared


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch to status."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def test_a_cloud_whose_default_is_gone_leaves_the_status() -> None:
    """Its only gcp location retired: the status no longer names it as gcp's default."""
    shown = {"fallback": "a", "cloudDefaults": {"aws": "a", "gcp": "g"}, "takesWrites": True}
    after = Effective("a", {"aws": "a"}, True)
    patch = organization_status(after, 2, [], clouds=["aws", "gcp", "gcp"])
    status = merge_patch(shown, patch)
    assert status["cloudDefaults"] == {"aws": "a"}
    assert status["fallback"] == "a" and status["takesWrites"] is True


def test_no_default_left_removes_cloud_defaults_and_a_moved_one_replaces_it() -> None:
    shown = {"fallback": "a", "cloudDefaults": {"aws": "a"}}
    status = merge_patch(shown, organization_status(Effective(), 0, [], clouds=["aws"]))
    assert "cloudDefaults" not in status and status.get("fallback") is None
    moved = organization_status(Effective("b", {"aws": "b"}), 2, [], clouds=["aws"])
    assert merge_patch(shown, moved)["cloudDefaults"] == {"aws": "b"}


def test_the_shared_state_is_the_one_start_up_put_in_the_memo() -> None:
    memo: dict[str, Any] = {}
    with pytest.raises(TypeError, match="start-up did not run"):
        shared(memo)
    state = put(memo, Shared.around(Cluster("o41-system")))
    assert shared(dict(memo)) is state  # kopf hands each object a shallow copy


def test_a_deleted_organizations_lock_and_in_force_are_pruned() -> None:
    organizations = Organizations()

    async def reconcile_then_delete() -> None:
        async with organizations.lock("ml"):
            organizations.in_force["ml"] = Effective("a")
            organizations.forget("ml")  # deleted while a reconciliation holds the lock
            assert "ml" in organizations.locks
        organizations.forget("ml")

    asyncio.run(reconcile_then_delete())
    assert organizations.locks == {} and organizations.in_force == {}
