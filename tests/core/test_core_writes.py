"""The write's rules (``o41.core.writes``): examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.organization import LocationFacts
from o41.core.parts import MAX_PARTS, MIN_PART_SIZE, PART_SIZE, composite_crc32, part_count
from o41.core.places import SOURCES, Locality, Place, locality
from o41.core.writes import (
    SINGLE,
    CommitRefused,
    Declared,
    Held,
    HeldPart,
    WriteRefused,
    check_commit,
    check_parts,
    etags_problem,
    normal_place,
    signs_locally,
    upload_plan,
    writable,
    writable_places,
)

facts = st.builds(
    LocationFacts,
    name=st.sampled_from(["a", "b", "c", "d"]),
    cloud=st.sampled_from(["aws", "gcp"]),
    region=st.sampled_from(["r1", "r2"]),
    retired=st.booleans(),
    ready=st.booleans(),
    unfinished=st.booleans(),
)


@given(st.lists(facts, unique_by=lambda f: f.name), st.sets(st.sampled_from(["a", "b", "c", "d"])))
def test_only_ready_unretired_finished_unexcluded_locations_take_writes(
    locations: list[LocationFacts], exclude: set[str]
) -> None:
    takes = [
        loc
        for loc in locations
        if loc.ready and not loc.retired and not loc.unfinished and loc.name not in exclude
    ]
    assert list(writable(locations, exclude).values()) == takes  # in their order
    assert writable_places(locations) == {(g.cloud, g.region) for g in writable(locations).values()}


def test_a_retired_or_unfinished_location_takes_no_write() -> None:
    ready = LocationFacts("a", "aws", "r", ready=True)
    assert list(writable([ready])) == ["a"]
    assert not writable([LocationFacts("a", "aws", "r", retired=True, ready=True)])
    assert not writable([LocationFacts("a", "aws", "r", unfinished=True, ready=True)])
    assert not writable([LocationFacts("a", "aws", "r")])
    assert not writable([ready], exclude={"a"})


@given(
    st.one_of(st.none(), st.sampled_from(["aws", "gcp"])),
    st.one_of(st.none(), st.text("ab-1", min_size=1, max_size=5)),
    st.sampled_from(SOURCES),
)
def test_a_region_without_a_cloud_is_dropped(
    cloud: str | None, region: str | None, source: str
) -> None:
    place = normal_place(cloud, region, source)  # type: ignore[arg-type]
    assert place.cloud == cloud
    assert place.region == (region if cloud else None)


@given(st.integers(0, 5 * 1024**4))
def test_the_plan_cuts_any_size_into_allowed_parts(size: int) -> None:
    plan = upload_plan(size)
    if size <= PART_SIZE:
        assert plan == SINGLE
    else:
        assert plan.multipart and plan.part_size is not None
        assert plan.part_size >= MIN_PART_SIZE and plan.parts <= MAX_PARTS
        assert plan.parts == part_count(size, plan.part_size)
        assert (plan.parts - 1) * plan.part_size < size <= plan.parts * plan.part_size


@pytest.mark.parametrize(
    ("size", "part_size", "crc32", "why"),
    [
        (100, None, ["AAAAAA=="], "crc32 needs partSize"),
        (None, 16 * 2**20, None, "partSize needs size"),
        (100 * 2**20, 1024, None, "at least 5 MiB"),
        (100 * 2**20, 50 * 2**20, ["AAAAAA=="], "are 2 parts"),
        (100 * 2**20, 50 * 2**20, ["AAAAAA==", "nope"], "crc32 of part 2"),
    ],
)
def test_a_plan_that_cannot_be_served_is_refused(
    size: int | None, part_size: int | None, crc32: list[str] | None, why: str
) -> None:
    with pytest.raises(WriteRefused, match=why):
        upload_plan(size, part_size, crc32)


def test_the_client_chosen_part_size_is_kept() -> None:
    plan = upload_plan(11 * 2**20, 5 * 2**20, ["AAAAAA=="] * 3)
    assert (plan.multipart, plan.parts, plan.part_size) == (True, 3, 5 * 2**20)
    assert etags_problem(3, ["a", "b", "c"]) is None
    assert "3 parts" in (etags_problem(3, ["a"]) or "")


@given(
    st.integers(0, 10**6),
    st.one_of(st.none(), st.integers(0, 10**6)),
    st.sampled_from([None, "0" * 32, "1" * 32]),
    st.sampled_from([None, "0" * 32, "1" * 32]),
)
def test_a_commit_is_accepted_exactly_when_what_is_known_agrees(
    held_size: int, declared_size: int | None, held_md5: str | None, declared_md5: str | None
) -> None:
    declared, held = Declared(declared_size, declared_md5), Held(held_size, held_md5)
    agrees = (declared_size is None or declared_size == held_size) and (
        held_md5 is None or declared_md5 is None or held_md5 == declared_md5
    )
    if agrees:
        assert check_commit("v", declared, held) == held
    else:
        with pytest.raises(CommitRefused):
            check_commit("v", declared, held)


def test_commit_examples() -> None:
    with pytest.raises(CommitRefused, match="not in the bucket"):
        check_commit("v", Declared(), None)
    with pytest.raises(CommitRefused, match="holds 3 bytes"):
        check_commit("v", Declared(size=4), Held(3))
    parts = ["AAAAAA==", "AAAAAQ=="]
    assert check_commit("v", Declared(crc32=parts), Held(3, crc32=composite_crc32(parts)))
    with pytest.raises(CommitRefused, match="a part was damaged"):
        check_commit("v", Declared(crc32=parts), Held(3, crc32=composite_crc32(parts[:1])))


def test_only_keys_in_the_secret_sign_locally() -> None:
    assert signs_locally("s3", {"accessKeyId": "x", "secretAccessKey": "y"})
    assert signs_locally("gcs", {"serviceAccount.json": "{}"})
    assert not signs_locally("gcs", {})  # ambient identity: IAM signBlob per URL
    assert not signs_locally("s3", None)  # a role: credentials refreshed over the network
    assert signs_locally("azure_blob", {"accountKey": "k"})


@given(
    st.sampled_from(["aws", "gcp", None]),
    st.sampled_from(["r1", "r2", None]),
    st.sampled_from(["aws", "gcp"]),
    st.sampled_from(["r1", "r2"]),
)
def test_locality_is_local_only_in_the_same_cloud_and_region(
    cloud: str | None, region: str | None, to_cloud: str, to_region: str
) -> None:
    how_far = locality(normal_place(cloud, region, "env"), to_cloud, to_region)
    reader = Place(cloud, region if cloud else None, "env")
    if reader.cloud != to_cloud:
        assert how_far == Locality.CROSS_CLOUD
    elif reader.region != to_region:
        assert how_far == Locality.CROSS_REGION
    else:
        assert how_far == Locality.LOCAL


def test_parts_are_checked_against_what_their_writer_recorded() -> None:
    recorded = ["AAAAAA==", "AAAAAQ==", "AAAAAg=="]
    size = 2 * PART_SIZE + 10
    fine = [HeldPart(1, PART_SIZE, "AAAAAA=="), HeldPart(3, 10), HeldPart(2, PART_SIZE)]
    check_parts("v", size, PART_SIZE, recorded, fine)  # missing or unchecked: not refused here
    with pytest.raises(CommitRefused, match=r"part 2 of 3 .* has CRC32 AAAAAw== in the bucket"):
        check_parts("v", size, PART_SIZE, recorded, [HeldPart(2, PART_SIZE, "AAAAAw==")])
    with pytest.raises(CommitRefused, match=r"part 3 of 3 .* is 11 bytes .* part 3 is 10 bytes"):
        check_parts("v", size, PART_SIZE, recorded, [HeldPart(3, 11)])
