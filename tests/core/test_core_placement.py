"""Placement rules: examples from the spec, and properties that hold for any input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.organization import LocationFacts
from o41.core.placement import PlacementRefused, Rule, place_write
from o41.core.places import Locality, Place, locality

LOCATIONS = [
    LocationFacts("aws-east", "aws", "us-east-1", ready=True),
    LocationFacts("aws-west", "aws", "us-west-2", ready=True),
    LocationFacts("gcp-central", "gcp", "us-central1", ready=True),
    LocationFacts("nebius-north", "nebius", "eu-north1", ready=True),
]
DEFAULTS = {"aws": "aws-east", "gcp": "gcp-central", "nebius": "nebius-north"}


def place(cloud: str | None, region: str | None, source: str = "env") -> Place:
    return Place(cloud, region, source)  # type: ignore[arg-type]


def choose(p: Place, **kw: object) -> tuple[str, Rule, str | None]:
    kw.setdefault("fallback", "aws-east")
    kw.setdefault("cloud_defaults", DEFAULTS)
    locations = kw.pop("locations", LOCATIONS)
    got = place_write(p, locations, **kw)  # type: ignore[arg-type]
    return got.location, got.rule, got.warning


def test_region_match_is_free_and_silent() -> None:
    assert choose(place("aws", "us-west-2")) == ("aws-west", Rule.REGION, None)


def test_other_region_of_a_cloud_goes_to_its_default() -> None:
    assert choose(place("aws", "eu-west-1")) == ("aws-east", Rule.CLOUD, None)


def test_cloud_with_unknown_region_goes_to_its_default() -> None:
    assert choose(place("gcp", None, "metadata")) == ("gcp-central", Rule.CLOUD, None)


def test_s3_compatible_tag_matches_skypilot_names() -> None:
    assert choose(place("nebius", "eu-north1", "skypilot"))[:2] == ("nebius-north", Rule.REGION)


@pytest.mark.parametrize("p", [place("azure", "westeurope"), place(None, None, "none")])
def test_no_match_goes_to_fallback_with_a_warning(p: Place) -> None:
    location, rule, warning = choose(p)
    assert (location, rule) == ("aws-east", Rule.FALLBACK)
    assert warning is not None and "fallback 'aws-east'" in warning


def test_unknown_place_warning_says_so() -> None:
    warning = choose(place(None, None, "none"))[2]
    assert warning is not None and "unknown place" in warning


def test_excluded_region_moves_down_to_cloud_default_then_fallback() -> None:
    p = place("aws", "us-west-2")
    assert choose(p, exclude={"aws-west"})[:2] == ("aws-east", Rule.CLOUD)
    assert choose(p, exclude={"aws-west", "aws-east"}, fallback="gcp-central")[:2] == (
        "gcp-central",
        Rule.FALLBACK,
    )


def test_unwritable_locations_are_passed_over() -> None:
    locations = [
        LocationFacts("aws-east", "aws", "us-east-1", ready=True),
        LocationFacts("aws-west", "aws", "us-west-2", retired=True, ready=True),
    ]
    got = choose(place("aws", "us-west-2"), locations=locations, cloud_defaults={"aws": "aws-east"})
    assert got[:2] == ("aws-east", Rule.CLOUD)


def test_no_fallback_refuses_with_what_to_do() -> None:
    with pytest.raises(PlacementRefused, match=r"no fallback location yet.*add a Location"):
        choose(place("aws", "us-east-1"), fallback=None)


def test_nothing_left_refuses_and_names_the_exclusions() -> None:
    with pytest.raises(PlacementRefused, match="excluded: aws-east, aws-west"):
        choose(place("aws", "us-west-2"), exclude={"aws-east", "aws-west"})


def test_locality() -> None:
    assert locality(place("aws", "us-east-1"), "aws", "us-east-1") is Locality.LOCAL
    assert locality(place("aws", "us-west-2"), "aws", "us-east-1") is Locality.CROSS_REGION
    assert locality(place("gcp", "us-central1"), "aws", "us-east-1") is Locality.CROSS_CLOUD
    assert locality(place(None, None, "none"), "aws", "us-east-1") is Locality.CROSS_CLOUD


def test_place_rejects_inconsistent_values() -> None:
    with pytest.raises(ValueError, match="lower-case"):
        place("AWS", "us-east-1")
    with pytest.raises(ValueError, match="must name its cloud"):
        place(None, "us-east-1")


clouds = st.sampled_from(["aws", "gcp", "azure", "nebius"])
regions = st.sampled_from(["r1", "r2", "r3"])
candidates = st.lists(
    st.builds(
        LocationFacts,
        name=st.sampled_from([f"loc{i}" for i in range(8)]),
        cloud=clouds,
        region=regions,
        retired=st.booleans(),
        ready=st.booleans(),
        unfinished=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda c: c.name,
)


@given(
    locations=candidates,
    cloud=st.none() | clouds,
    region=st.none() | regions,
    data=st.data(),
)
def test_a_placement_is_always_usable_and_the_first_rule_that_matches(
    locations: list[LocationFacts], cloud: str | None, region: str | None, data: st.DataObject
) -> None:
    names = [c.name for c in locations]
    p = place(cloud, region if cloud else None)
    fallback = data.draw(st.none() | st.sampled_from(names)) if names else None
    exclude = set(data.draw(st.lists(st.sampled_from(names)))) if names else set()
    defaults = {
        c.cloud: c.name for c in locations if data.draw(st.booleans(), label=f"default {c.name}")
    }
    usable = {c.name for c in locations if c.writable and c.name not in exclude}
    try:
        got = place_write(p, locations, fallback=fallback, cloud_defaults=defaults, exclude=exclude)
    except PlacementRefused:
        region_hit = any(
            c.name in usable and (c.cloud, c.region) == (p.cloud, p.region) for c in locations
        )
        assert fallback is None or (
            fallback not in usable and not region_hit and defaults.get(cloud or "") not in usable
        )
        return
    assert got.location in usable
    by_name = {c.name: c for c in locations}
    chosen = by_name[got.location]
    if got.rule is Rule.REGION:
        assert (chosen.cloud, chosen.region) == (p.cloud, p.region)
    else:  # no usable location in the writer's region was skipped
        assert not any(
            c.name in usable and (c.cloud, c.region) == (p.cloud, p.region) for c in locations
        )
    if got.rule is Rule.CLOUD:
        assert defaults[chosen.cloud] == got.location and chosen.cloud == p.cloud
    if got.rule is Rule.FALLBACK:
        assert got.location == fallback and got.warning
    else:
        assert got.warning is None
