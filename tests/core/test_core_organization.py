"""Organization rules without any cluster: examples, and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.organization import (
    Effective,
    LocationFacts,
    Picks,
    Refused,
    check_delete,
    check_organization_delete,
    check_picks,
    check_retire,
    effective,
)


def loc(name: str, cloud: str = "aws", region: str = "us-east-1", **kw: bool) -> LocationFacts:
    kw.setdefault("ready", True)
    return LocationFacts(name, cloud, region, **kw)


def test_first_location_added_becomes_fallback_and_cloud_default() -> None:
    got = effective([loc("a"), loc("b", "gcp", "us-central1"), loc("c")])
    assert got.fallback == "a"
    assert dict(got.cloud_defaults) == {"aws": "a", "gcp": "b"}
    assert got.takes_writes


def test_no_location_no_fallback_no_writes() -> None:
    assert effective([]) == Effective(None, {}, False)


def test_fallback_not_ready_yet_takes_no_writes() -> None:
    got = effective([loc("a", ready=False)])
    assert got.fallback == "a" and not got.takes_writes


def test_user_pick_wins_and_stays() -> None:
    locations = [loc("a"), loc("b")]
    got = effective(locations, Picks(fallback="b", cloud_defaults={"aws": "b"}))
    assert (got.fallback, dict(got.cloud_defaults)) == ("b", {"aws": "b"})


def test_adding_locations_never_moves_the_fallback() -> None:
    now = effective([loc("z")])
    # a location sorted earlier by name arrives later: what is in force stays
    assert effective([loc("a"), loc("z")], current=now).fallback == "z"


def test_retired_or_unfinished_location_loses_its_roles() -> None:
    now = Effective("a", {"aws": "a"}, True)
    got = effective([loc("a", retired=True), loc("b")], current=now)
    assert (got.fallback, dict(got.cloud_defaults)) == ("b", {"aws": "b"})
    got = effective([loc("a", unfinished=True, ready=False), loc("b")], current=now)
    assert got.fallback == "b"


def test_retiring_the_fallback_is_refused_with_what_to_do() -> None:
    with pytest.raises(Refused, match="make another location the fallback first"):
        check_retire("a", "ml", Effective("a", {}, True))
    check_retire("b", "ml", Effective("a", {}, True))


def test_only_unfinished_locations_can_be_deleted() -> None:
    check_delete(loc("a", unfinished=True, ready=False))
    with pytest.raises(Refused, match=r"retired, never deleted.*spec.retired: true"):
        check_delete(loc("a", ever_ready=True))
    with pytest.raises(Refused, match="setup has not failed"):
        check_delete(loc("a", ready=False))


def test_a_location_that_was_ever_ready_is_never_deleted() -> None:
    """Even when its setup fails later: it may hold versions."""
    with pytest.raises(Refused, match="it has been Ready, so it may hold versions"):
        check_delete(loc("a", ready=False, unfinished=True, ever_ready=True))


def test_an_organization_with_locations_is_not_deleted() -> None:
    check_organization_delete("ml", [])
    with pytest.raises(Refused) as refused:
        check_organization_delete("ml", ["b", "a"])
    assert str(refused.value).startswith(
        "organization 'ml' cannot be deleted: 2 Location(s) belong to it ('a', 'b')"
    )
    assert "retired, never deleted" in str(refused.value)
    with pytest.raises(Refused, match=r"and 2 more"):
        check_organization_delete("ml", [f"l{i}" for i in range(7)])


@pytest.mark.parametrize(
    ("picks", "message"),
    [
        (Picks(fallback="missing"), "does not exist"),
        (Picks(fallback="other"), "belongs to organization 'team-b'"),
        (Picks(fallback="old"), "is retired"),
        (Picks(fallback="pending"), "is not Ready"),
        (Picks(cloud_defaults={"gcp": "a"}), "must be in that cloud"),
    ],
)
def test_picks_must_name_usable_locations(picks: Picks, message: str) -> None:
    known = {
        "a": ("ml", loc("a")),
        "other": ("team-b", loc("other")),
        "old": ("ml", loc("old", retired=True)),
        "pending": ("ml", loc("pending", ready=False)),
    }
    with pytest.raises(Refused, match=message):
        check_picks("ml", picks, known)


def test_good_picks_pass() -> None:
    known = {"a": ("ml", loc("a")), "g": ("ml", loc("g", "gcp", "us-central1"))}
    check_picks("ml", Picks(fallback="g", cloud_defaults={"aws": "a", "gcp": "g"}), known)


facts = st.builds(
    LocationFacts,
    name=st.sampled_from([f"l{i}" for i in range(10)]),
    cloud=st.sampled_from(["aws", "gcp", "azure", "r2"]),
    region=st.sampled_from(["r1", "r2"]),
    retired=st.booleans(),
    ready=st.booleans(),
    unfinished=st.booleans(),
)
names = st.none() | st.sampled_from([f"l{i}" for i in range(12)])


@given(
    locations=st.lists(facts, max_size=10, unique_by=lambda f: f.name),
    pick=names,
    current=names,
    default_picks=st.dictionaries(st.sampled_from(["aws", "gcp", "azure", "r2"]), names),
)
def test_exactly_one_fallback_never_retired(
    locations: list[LocationFacts],
    pick: str | None,
    current: str | None,
    default_picks: dict[str, str | None],
) -> None:
    picks = Picks(pick, {k: v for k, v in default_picks.items() if v})
    got = effective(locations, picks, Effective(current, {}, False))
    by_name = {f.name: f for f in locations}
    if any(f.eligible for f in locations):
        assert got.fallback in by_name
        assert by_name[got.fallback].eligible  # never retired, never unfinished
    else:
        assert got.fallback is None and not got.takes_writes
    assert got.takes_writes == (got.fallback is not None and by_name[got.fallback].ready)
    for cloud, name in got.cloud_defaults.items():
        assert by_name[name].cloud == cloud and by_name[name].eligible
    # every cloud with an eligible location has a default
    assert set(got.cloud_defaults) == {f.cloud for f in locations if f.eligible}
    # applying the rules again changes nothing: what is in force is stable
    assert effective(locations, picks, got) == got
