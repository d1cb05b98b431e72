"""When an operator start sets a Location up again: only when its own record does not say
it is set up at the Location's current generation (``o41.operator.buckets.already_set_up``).
tests/operator/test_operator.py shows a restart on the test bed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.kube.location_record import LocationRecord, parse
from o41.operator.buckets import already_set_up

READY_SINCE = "2026-01-01T00:00:00Z"
SET_UP = LocationRecord("uid-a", "a", ready=True, ready_since=READY_SINCE, set_up=3)


def shown(status: str = "True", generation: int | None = 3) -> dict[str, Any]:
    ready: dict[str, Any] = {"type": "Ready", "status": status, "reason": "BucketReady"}
    if generation is not None:
        ready["observedGeneration"] = generation
    return {"conditions": [ready], "observedGeneration": generation}


def test_a_location_set_up_at_its_generation_and_shown_ready_is_left_to_the_checks() -> None:
    assert already_set_up(SET_UP, 3, shown())


@pytest.mark.parametrize(
    ("record", "generation", "status", "why"),
    [
        (SET_UP, 4, shown(generation=4), "the spec changed since (generation 4)"),
        (SET_UP.with_(ready=False), 3, shown(), "the check found the bucket broken"),
        (SET_UP.with_(set_up=None), 3, shown(), "set up by an operator before the field"),
        (SET_UP.with_(creating_bucket="o41-a-0123"), 3, shown(), "a creation under way"),
        (SET_UP, 3, {}, "status wiped: a setup writes it again"),
        (SET_UP, 3, shown("False"), "status says not Ready"),
        (SET_UP, 3, shown(generation=2), "status from an older generation"),
        (SET_UP, None, shown(), "no generation to compare"),
    ],
)
def test_anything_else_is_set_up_again(
    record: LocationRecord, generation: int | None, status: dict[str, Any], why: str
) -> None:
    assert not already_set_up(record, generation, status), why


@given(generation=st.integers(min_value=1, max_value=10**6))
def test_a_forged_status_never_skips_a_setup_the_record_does_not_vouch_for(
    generation: int,
) -> None:
    """Status is user-writable: Ready True at the right generation, with a record that
    never saw a setup succeed, still gets the setup."""
    unready = LocationRecord("uid-a", "a")
    assert not already_set_up(unready, generation, shown(generation=generation))
    other = SET_UP.with_(set_up=generation + 1)
    assert not already_set_up(other, generation, shown(generation=generation))


@pytest.mark.parametrize("stored", ["", "x", "-1", "3.0", " 3"])
def test_a_recorded_generation_that_is_not_a_number_counts_as_none(stored: str) -> None:
    configmap = SET_UP.configmap("o41-system")
    configmap["data"]["setUpGeneration"] = stored
    record = parse(configmap)
    assert record is not None and record.set_up is None


def test_the_generation_round_trips_through_the_configmap() -> None:
    assert parse(SET_UP.configmap("o41-system")) == SET_UP
    assert "setUpGeneration" not in LocationRecord("u", "a").configmap("ns")["data"]
