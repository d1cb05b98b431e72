"""The net advice: where a new location pays once the reads it sends elsewhere and the
storage it holds are counted, next to the page's advice on the same counters."""

from __future__ import annotations

import pytest

from o41.core.advice import StoragePrices, best_net_location, rank_new_locations
from o41.core.organization import LocationFacts, effective
from o41.core.usage import GB, Prices, PriceTable, Record, report

PRICES = PriceTable(
    as_of="2026-01-01",
    currency="USD",
    clouds={"aws": Prices(0.02, 0.09), "gcp": Prices(0.02, 0.12)},
    default=Prices(0.02, 0.09),
)
STORAGE = StoragePrices(as_of="2026-01-01", clouds={"aws": 0.023, "gcp": 0.020}, default=0.023)
NOW = "2026-03-10T12"
EAST = LocationFacts("east", "aws", "us-east-1", ready=True, ever_ready=True)


def write(writer: tuple[str, str], to: LocationFacts, size: int) -> Record:
    dims = {"cloud": writer[0], "region": writer[1], "source": "env", "rule": "fallback"}
    dims |= {"location": to.name, "locationCloud": to.cloud, "locationRegion": to.region}
    return Record("write", NOW, dims, {"versions": 1, "bytes": size})


def read(
    reader: tuple[str, str],
    at: LocationFacts,
    size: int,
    writer: tuple[str, str] | None = None,
) -> Record:
    dims = {"cloud": reader[0], "region": reader[1], "source": "env", "locality": "cross-cloud"}
    dims |= {"location": at.name, "locationCloud": at.cloud, "locationRegion": at.region}
    if writer is not None:
        dims |= {"writerCloud": writer[0], "writerRegion": writer[1]}
    return Record("read", NOW, dims, {"reads": 1, "bytes": size})


def net(records: list[Record], locations: list[LocationFacts]) -> list[tuple[str, str, float]]:
    ranked = rank_new_locations(
        records,
        prices=PRICES,
        storage=STORAGE,
        locations=locations,
        in_force=effective(locations),
        held_hours=0,
    )
    return [(s.cloud, s.region, round(s.net, 6)) for s in ranked]


def test_a_trainer_read_where_the_fallback_is_gets_no_location_of_its_own() -> None:
    """gcp/us-central1 writes 100 GB to the fallback in aws/us-east-1, where it is read
    twice: the page names gcp/us-central1 (it would keep the writes local), but every read
    would then cross clouds from GCP. Net, the location loses 2 x 12 - 12 = $12."""
    records = [
        write(("gcp", "us-central1"), EAST, 100 * GB),
        read(("aws", "us-east-1"), EAST, 100 * GB),
        read(("aws", "us-east-1"), EAST, 100 * GB),
    ]
    page = report(records, prices=PRICES, now_hour=NOW, locations=[("aws", "us-east-1")])
    assert page.saving is not None and (page.saving.cloud, page.saving.region) == (
        "gcp",
        "us-central1",
    )
    assert net(records, [EAST]) == [("gcp", "us-central1", -12.0)]
    assert (
        best_net_location(
            records,
            prices=PRICES,
            storage=STORAGE,
            locations=[EAST],
            in_force=effective([EAST]),
            held_hours=0,
        )
        is None
    )


def test_a_trainer_read_where_it_runs_gets_its_location() -> None:
    records = [
        write(("gcp", "us-central1"), EAST, 100 * GB),
        read(("gcp", "us-central1"), EAST, 100 * GB),
    ]
    # $12 of writes and $9 of reads (aws internet) kept local
    assert net(records, [EAST]) == [("gcp", "us-central1", 21.0)]


def test_storage_is_netted_where_the_bytes_would_lie() -> None:
    records = [write(("gcp", "us-central1"), EAST, 100 * GB)]
    ranked = rank_new_locations(
        records,
        prices=PRICES,
        storage=STORAGE,
        locations=[EAST],
        in_force=effective([EAST]),
        held_hours=720,
    )
    assert len(ranked) == 1
    assert ranked[0].write_egress == pytest.approx(12.0)
    assert ranked[0].storage == pytest.approx(100 * (0.023 - 0.020))


def test_a_region_with_a_location_is_never_named_again() -> None:
    """The page keeps naming a region whose writes left it before its location was added
    (for as long as the window remembers them); the net advice places them again."""
    west = LocationFacts("west", "aws", "us-west-2", ready=True, ever_ready=True)
    records = [write(("aws", "us-west-2"), EAST, 500 * GB), write(("gcp", "x1"), EAST, GB)]
    page = report(
        records, prices=PRICES, now_hour=NOW, locations=[("aws", "us-east-1"), ("aws", "us-west-2")]
    )
    assert page.saving is not None and page.saving.has_location
    assert [(c, r) for c, r, _ in net(records, [EAST, west])] == [("gcp", "x1")]


def test_reads_follow_their_writer_when_the_counters_say_who_it_was() -> None:
    """Two writers share the fallback; only gcp's versions are read, from AWS. Without the
    writer on the read counters the reads are shared by bytes written and the advice
    turns down aws/us-west-2's location; with it, us-west-2's versions take no reads."""
    west = ("aws", "us-west-2")
    central = ("gcp", "us-central1")
    shared = [
        write(west, EAST, 100 * GB),
        write(central, EAST, 100 * GB),
        read(("aws", "us-east-1"), EAST, 100 * GB),
        read(("aws", "us-east-1"), EAST, 100 * GB),
    ]
    exact = [*shared[:2], *(read(("aws", "us-east-1"), EAST, 100 * GB, central),) * 2]
    guessed = dict(((c, r), n) for c, r, n in net(shared, [EAST]))
    known = dict(((c, r), n) for c, r, n in net(exact, [EAST]))
    assert guessed[west] == pytest.approx(2.0 - 0.02 * 100)  # half the reads follow it
    assert known[west] == pytest.approx(2.0)  # its $2 of inter-region writes
    assert known[central] == pytest.approx(12.0 - 2 * 12.0)
