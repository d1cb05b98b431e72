"""The usage answers as pure functions: examples, and properties over random histories."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from o41.core.usage import (
    GB,
    PriceError,
    Prices,
    PriceTable,
    Record,
    Saving,
    Tally,
    best_new_location,
    by_source,
    human_bytes,
    in_span,
    in_window,
    money,
    override_prices,
    read_flows,
    records_from,
    report,
    savings_sentence,
    window_hours,
    window_span,
    writer_places,
)
from o41.webhook.usage.prices import DEFAULT_PRICES


def approx(count: int, size: int, cost: float) -> Tally:
    """A Tally whose cost compares approximately (float sums)."""
    return Tally(count, size, cast(float, pytest.approx(cost)))


PRICES = PriceTable(
    as_of="2026-01-01",
    currency="USD",
    clouds={"aws": Prices(0.02, 0.09), "gcp": Prices(0.01, 0.12)},
    default=Prices(0.03, 0.10),
)
NOW = "2026-03-10T12"


def write(
    cloud: str | None,
    region: str | None,
    source: str,
    rule: str,
    to: tuple[str, str],
    versions: int,
    size: int,
    hour: str = NOW,
) -> Record:
    dims = {"cloud": cloud or "", "region": region or "", "source": source, "rule": rule}
    dims |= {"location": f"{to[0]}-{to[1]}", "locationCloud": to[0], "locationRegion": to[1]}
    return Record("write", hour, dims, {"versions": versions, "bytes": size})


def read(
    cloud: str | None, region: str | None, locality: str, to: tuple[str, str], n: int, size: int
) -> Record:
    dims = {"cloud": cloud or "", "region": region or "", "source": "env", "locality": locality}
    dims |= {"location": "x", "locationCloud": to[0], "locationRegion": to[1]}
    return Record("read", NOW, dims, {"reads": n, "bytes": size})


def begin(cloud: str | None, region: str | None, source: str, begins: int, warnings: int) -> Record:
    dims = {"cloud": cloud or "", "region": region or "", "source": source, "rule": "fallback"}
    return Record("begin", NOW, dims, {"begins": begins, "warnings": warnings})


def test_egress_is_charged_by_the_sender_and_unknown_is_never_free() -> None:
    assert PRICES.per_gb("aws", "us-east-1", "aws", "us-east-1") == 0
    assert PRICES.per_gb("aws", "us-east-1", "aws", "us-west-2") == 0.02
    assert PRICES.per_gb("aws", "us-east-1", "gcp", "us-central1") == 0.09
    assert PRICES.per_gb("gcp", "us-central1", "aws", "us-east-1") == 0.12
    assert PRICES.per_gb("nebius", "eu-north1", "aws", "us-east-1") == 0.10  # default
    assert PRICES.per_gb(None, None, "aws", "us-east-1") == 0.10  # unknown: cross-cloud
    assert PRICES.per_gb("aws", None, "aws", "us-east-1") == 0.02  # unknown region


def test_an_override_replaces_only_what_it_names() -> None:
    table = override_prices(
        {"asOf": "2026-06-01", "clouds": {"aws": {"internet": 0.05}, "nebius": {"internet": 0}}},
        PRICES,
    )
    assert table.as_of == "2026-06-01" and table.currency == "USD"
    assert table.of("aws") == Prices(0.02, 0.05)
    assert table.of("gcp") == PRICES.of("gcp")
    assert table.of("nebius") == Prices(0.03, 0.0)  # unnamed fields from the default
    assert override_prices({}, PRICES) == PRICES


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ([], "mapping"),
        ({"cloud": {}}, "unknown fields ['cloud']"),
        ({"clouds": {"aws": {"internet": -1}}}, "clouds.aws.internet"),
        ({"clouds": {"aws": {"internet": "cheap"}}}, "clouds.aws.internet"),
        ({"clouds": {"aws": {"egress": 1}}}, "clouds.aws has unknown fields"),
        ({"clouds": {"AWS": {}}}, "lower-case"),
        ({"default": {"interRegion": float("nan")}}, "default.interRegion"),
    ],
)
def test_a_wrong_override_names_the_field(data: Any, named: str) -> None:
    with pytest.raises(PriceError, match=named.replace("[", r"\[").replace("]", r"\]")):
        override_prices(data, PRICES)


def test_the_default_table_prices_the_three_clouds_and_is_dated() -> None:
    assert {"aws", "gcp", "azure"} <= set(DEFAULT_PRICES.clouds)
    assert DEFAULT_PRICES.as_of and DEFAULT_PRICES.sources
    for p in [*DEFAULT_PRICES.clouds.values(), DEFAULT_PRICES.default]:
        assert 0 < p.inter_region < p.internet < 1


def test_windows_count_whole_hours_back_from_now() -> None:
    assert window_hours(NOW, "24h") == ("2026-03-09T13", NOW)
    assert window_hours(NOW, "7d") == ("2026-03-03T13", NOW)
    assert window_hours("2026-03-01T00", "24h") == ("2026-02-28T01", "2026-03-01T00")
    with pytest.raises(ValueError, match="24h, 7d, 30d"):
        window_hours(NOW, "1y")
    old, inside = (
        write("aws", "a", "env", "region", ("aws", "a"), 1, 1, "2026-03-09T12"),
        write("aws", "a", "env", "region", ("aws", "a"), 1, 1, "2026-03-09T13"),
    )
    assert in_window([old, inside], *window_hours(NOW, "24h")) == [inside]


def test_damaged_records_are_skipped() -> None:
    good = {"kind": "write", "hour": NOW, "dims": {"cloud": "aws"}, "counts": {"bytes": 3}}
    found = records_from(
        [good, None, {"kind": "write"}, {**good, "counts": {"bytes": -1, "versions": True}}]
    )
    assert [r.counts for r in found] == [{"bytes": 3}, {}]
    assert found[0].dim("region") is None and found[0].dim("cloud") == "aws"


def test_writer_places_sort_by_bytes_that_left_the_region() -> None:
    records = [
        write("aws", "us-east-1", "skypilot", "region", ("aws", "us-east-1"), 100, 3000 * GB),
        write("aws", "us-west-2", "env", "cloud", ("aws", "us-east-1"), 40, 1200 * GB),
        write("azure", "westeurope", "metadata", "fallback", ("aws", "us-east-1"), 5, 500 * GB),
        begin("azure", "westeurope", "metadata", 5, 5),
        begin(None, None, "none", 3, 3),
    ]
    places = writer_places(records, PRICES)
    assert [(p.cloud, p.region, p.source) for p in places] == [
        ("aws", "us-west-2", "env"),
        ("azure", "westeurope", "metadata"),
        ("aws", "us-east-1", "skypilot"),
        (None, None, "none"),  # began, never committed
    ]
    west, europe, home, unknown = places
    assert west.by_rule == {"cloud": approx(40, 1200 * GB, 24.0)}
    assert west.left_region == approx(40, 1200 * GB, 24.0)
    assert europe.left_region.cost == pytest.approx(50.0)  # azure priced at the default
    assert (europe.begins, europe.warnings) == (5, 5)
    assert home.left_region == Tally() and home.written.bytes == 3000 * GB
    assert unknown.written == Tally() and unknown.warnings == 3


def test_the_sentence_names_where_a_location_pays() -> None:
    places = writer_places(
        [
            write("aws", "us-west-2", "env", "fallback", ("gcp", "us-central1"), 9, 1200 * GB),
            write("aws", "us-west-2", "skypilot", "fallback", ("gcp", "us-central1"), 1, 22 * GB),
            write("gcp", "europe-west4", "env", "cloud", ("gcp", "us-central1"), 1, 5000 * GB),
        ],
        PRICES,
    )
    saving = best_new_location(places)
    assert saving is not None
    # both sources of us-west-2 add up; the gcp place moved more bytes but cost less ($50)
    assert (saving.cloud, saving.region, saving.kept.bytes) == ("aws", "us-west-2", 1222 * GB)
    assert savings_sentence(saving, places) == (
        "A location in aws/us-west-2 would have kept 1.2 TB local, about $110 over this window."
    )


def test_the_sentence_when_a_location_exists_or_nothing_left_or_the_place_is_unknown() -> None:
    left = [write("aws", "us-west-2", "env", "cloud", ("aws", "us-east-1"), 1, 50 * GB)]
    places = writer_places(left, PRICES)
    saving = best_new_location(places, locations={("aws", "us-west-2")})
    assert saving is not None and saving.has_location
    assert "left the region although a location is there" in savings_sentence(saving, places)

    home = writer_places(
        [write("aws", "us-east-1", "env", "region", ("aws", "us-east-1"), 1, GB)], PRICES
    )
    assert best_new_location(home) is None
    assert "stayed in its writer's region" in savings_sentence(None, home)
    assert savings_sentence(None, []) == "No writes were committed in this window."

    lost = writer_places(
        [write(None, None, "none", "fallback", ("aws", "us-east-1"), 2, 3 * GB)], PRICES
    )
    assert best_new_location(lost) is None  # a location cannot help an unknown place
    assert savings_sentence(None, lost) == (
        "3.0 GB came from writers with an unknown cloud or region (about $0.30): no location "
        "can keep those local; set O41_ARTIFACTS_CLOUD and O41_ARTIFACTS_REGION for those jobs."
    )


def test_reads_make_a_matrix_from_reader_cloud_to_location_cloud() -> None:
    reads = read_flows(
        [
            read("gcp", "us-central1", "cross-cloud", ("aws", "us-east-1"), 10, 800 * GB),
            read("aws", "us-west-2", "cross-region", ("aws", "us-east-1"), 4, 100 * GB),
            read("aws", "us-east-1", "local", ("aws", "us-east-1"), 50, 2000 * GB),
            read(None, None, "cross-cloud", ("gcp", "us-central1"), 1, GB),
            read("gcp", "us-east1", "", ("gcp", "us-central1"), 1, GB),  # no locality: judged
        ],
        PRICES,
    )
    m = reads.matrix
    assert m[("gcp", "aws")] == approx(10, 800 * GB, 72.0)
    assert m[("aws", "aws")] == approx(54, 2100 * GB, 2.0)
    assert m[("unknown", "gcp")] == approx(1, GB, 0.12)
    assert m[("gcp", "gcp")] == approx(1, GB, 0.01)
    assert set(reads.cross_region) == {"aws", "gcp"}
    assert reads.cross_region["aws"] == approx(4, 100 * GB, 2.0)
    assert reads.cross_cloud.bytes == 801 * GB
    assert list(reads.by_locality) == ["local", "cross-region", "cross-cloud"]


def test_writes_by_source_show_the_unknown_places() -> None:
    places = writer_places(
        [
            write(None, None, "none", "fallback", ("aws", "us-east-1"), 3, 2 * GB),
            write("aws", "us-east-1", "env", "region", ("aws", "us-east-1"), 1, GB),
            write("aws", "eu-west-1", "env", "cloud", ("aws", "us-east-1"), 1, GB),
            begin(None, None, "none", 4, 4),
        ],
        PRICES,
    )
    rows = by_source(places)
    assert [r.source for r in rows] == ["env", "none"]
    assert (rows[0].written.count, rows[0].fallback.count) == (2, 0)
    assert (rows[1].begins, rows[1].warnings, rows[1].fallback.bytes) == (4, 4, 2 * GB)


def test_units_and_money_are_short() -> None:
    assert [human_bytes(n) for n in (0, 999, 1000, 1_234_567, 12 * 10**11, 250 * 10**12)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.2 MB",
        "1.2 TB",
        "250 TB",
    ]
    assert [money(x) for x in (0, 0.001, 4.2, 109.9, 12345.6)] == [
        "$0.00",
        "<$0.01",
        "$4.20",
        "$110",
        "$12,346",
    ]
    assert money(4.2, "EUR") == "4.20 EUR"


def test_the_report_keeps_only_the_window() -> None:
    records = [
        write("aws", "us-west-2", "env", "cloud", ("aws", "us-east-1"), 1, GB, NOW),
        write("aws", "us-west-2", "env", "cloud", ("aws", "us-east-1"), 1, GB, "2026-03-01T00"),
    ]
    day = report(records, prices=PRICES, now_hour=NOW, window="24h")
    week = report(records, prices=PRICES, now_hour=NOW, window="30d")
    assert (day.written.count, week.written.count) == (1, 2)
    assert not report([], prices=PRICES, now_hour=NOW).records
    assert day.written.as_json("versions") == {"versions": 1, "bytes": GB, "cost": 0.02}


# --- properties ------------------------------------------------------------------------

clouds = st.sampled_from([None, "aws", "gcp", "azure", "nebius"])
regions = st.sampled_from([None, "r1", "r2"])
sources = st.sampled_from(["env", "skypilot", "metadata", "none"])
located = st.tuples(st.sampled_from(["aws", "gcp", "nebius"]), st.sampled_from(["r1", "r2"]))
counts = st.integers(min_value=0, max_value=10**13)


@st.composite
def records(draw: st.DrawFn) -> Record:
    cloud, region = draw(clouds), draw(regions)
    if cloud is None:
        region = None
    kind = draw(st.sampled_from(["begin", "write", "read"]))
    if kind == "begin":
        return begin(cloud, region, draw(sources), draw(counts), draw(counts))
    to = draw(located)
    if kind == "write":
        rule = draw(st.sampled_from(["region", "cloud", "fallback"]))
        return write(cloud, region, draw(sources), rule, to, draw(counts), draw(counts))
    locality = draw(st.sampled_from(["local", "cross-region", "cross-cloud"]))
    return read(cloud, region, locality, to, draw(counts), draw(counts))


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), max_size=30))
def test_totals_are_conserved_across_groupings(history: list[Record]) -> None:
    rep = report(history, prices=PRICES, now_hour=NOW, window="24h")
    writes = [r for r in history if r.kind == "write"]
    reads = [r for r in history if r.kind == "read"]
    written = sum(r.count("bytes") for r in writes)
    assert rep.written.bytes == written == sum(s.written.bytes for s in rep.sources)
    assert sum(sum(t.bytes for t in p.by_rule.values()) for p in rep.places) == written
    assert sum(p.begins for p in rep.places) == sum(r.count("begins") for r in history)
    assert rep.left_region.bytes <= written
    # only bytes that left a region cost anything
    assert rep.written.cost == pytest.approx(rep.left_region.cost)
    read_bytes = sum(r.count("bytes") for r in reads)
    assert rep.reads.total.bytes == read_bytes
    assert sum(t.bytes for t in rep.reads.by_locality.values()) == read_bytes
    assert sum(t.bytes for t in rep.reads.cross_region.values()) == (
        rep.reads.by_locality.get("cross-region", Tally()).bytes
    )
    if rep.saving is not None:
        assert 0 < rep.saving.kept.bytes <= rep.left_region.bytes
        assert all(
            rep.saving.kept.cost >= p.left_region.cost - 1e-9
            for p in rep.places
            if p.region is not None
        )


def test_a_span_reads_whole_days_daily_and_the_first_partial_day_hourly() -> None:
    span = window_span(NOW, "7d", hourly_since="2026-02-24T12")  # hourly kept 14 days
    assert (span.first_hour, span.last_hour) == ("2026-03-03T13", NOW)  # the whole 168 h
    assert span.hours == tuple(f"2026-03-03T{h:02}" for h in range(13, 24))
    assert span.days == tuple(f"2026-03-{d:02}" for d in range(4, 11))  # today's so far
    # 30 days back is no longer kept hourly: the window starts with the next whole day
    month = window_span(NOW, "30d", hourly_since="2026-02-24T12")
    assert (month.first_hour, month.hours) == ("2026-02-09T00", ())  # not 2026-02-08T13
    assert month.days[0] == "2026-02-09" and month.days[-1] == "2026-03-10"
    assert len(month.days) == 30
    # a window starting at midnight reads days only; no hourly_since: hours only
    assert window_span("2026-03-10T23", "24h", hourly_since="2026-03-01T00").days == ("2026-03-10",)
    hourly = window_span(NOW, "24h")
    assert len(hourly.hours) == 24 and hourly.days == ()


def test_daily_records_count_in_the_days_of_their_span() -> None:
    aws = {"cloud": "aws"}
    raw = [
        {"kind": "write", "day": "2026-03-10", "dims": aws, "counts": {"bytes": 5}},
        {"kind": "write", "hour": "2026-03-10T03", "dims": aws, "counts": {"bytes": 1}},
        {"kind": "write", "day": "2026-03-02", "dims": aws, "counts": {"bytes": 7}},
        {"kind": "write", "hour": "2026-03-03T20", "dims": aws, "counts": {"bytes": 2}},
    ]
    records = records_from(raw)
    assert [r.daily for r in records] == [True, False, True, False]
    assert (records[0].hour, records[1].hour) == ("2026-03-10", "2026-03-10T03")
    span = window_span(NOW, "7d", hourly_since="2026-02-24T12")
    # the day's record, not the hour already in it; the first day's hour, not its day
    assert sum(r.count("bytes") for r in in_span(records, span)) == 5 + 2


def test_the_net_sentence_says_what_reads_and_storage_changed() -> None:
    saving = Saving("gcp", "us-central1", Tally(3, 500 * GB, 43.5), False, -18.96, 0.08)
    assert savings_sentence(saving, []) == (
        "A location in gcp/us-central1 would have kept 500 GB local, about $24.62 over this "
        "window (net of $18.96 more egress on reads and $0.08 less storage)."
    )
    left = writer_places(
        [write("gcp", "us-central1", "env", "fallback", ("aws", "us-east-1"), 1, 100 * GB)],
        PRICES,
    )
    assert savings_sentence(None, left, none_pays=True) == (
        "100 GB written left its writer's region (about $12.00), but no new location would "
        "have saved money over this window: the reads of those versions would then cross "
        "further."
    )
