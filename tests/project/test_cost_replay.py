"""bench/cost_replay.py: the trace loader refuses what it cannot read, saying where and
why; the offline optimum is a lower bound of every policy; the shipped traces show what
the advice brings."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.cost_replay import (  # noqa: E402
    SHIPPED,
    TRACES,
    Prices,
    Region,
    Replay,
    cost_of,
    net_advice,
    optimum,
    page_advice,
    region,
    run,
    simulate,
)
from bench.traces.synthetic import MIXES, generate  # noqa: E402
from bench.traces.trace import Event, TraceError, load, read_trace, write  # noqa: E402
from o41.webhook.usage.prices import DEFAULT_PRICES, STORAGE_PRICES  # noqa: E402

PRICES = Prices(DEFAULT_PRICES, STORAGE_PRICES)


def parse(text: str) -> list[Event]:
    return read_trace(io.StringIO(text), "t.csv")


def test_skystore_rows_are_read_with_or_without_a_header() -> None:
    events = parse(
        "timestamp,op,issue_region,obj_key,size\n"
        "20,GET,aws:us-east-1,a,10\n"
        "10,PUT,aws:us-west-2,a,10\n"
        "2026-01-01T00:00:00Z,write,gcp:us-central1,b,5\n"
        "30,HEAD,aws:us-east-1,a,0\n"
        "40,DELETE,aws:us-east-1,a,\n"
    )
    assert [(e.time, e.op, e.cloud, e.region, e.key, e.size) for e in events] == [
        (10.0, "write", "aws", "us-west-2", "a", 10),
        (20.0, "read", "aws", "us-east-1", "a", 10),
        (40.0, "delete", "aws", "us-east-1", "a", 0),
        (1767225600.0, "write", "gcp", "us-central1", "b", 5),
    ]


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("1,PUT,aws:us-east-1,a", "t.csv, line 2: 4 fields, expected 5"),
        ("1,POST,aws:us-east-1,a,1", "t.csv, line 2: op 'POST' is not one of"),
        ("1,PUT,us-east-1,a,1", "issue_region 'us-east-1' must be cloud:region"),
        ("1,PUT,AWS:us-east-1,a,1", "cloud 'AWS' must be lower-case"),
        ("1,PUT,aws:us-east-1,a,1.5GB", "size '1.5GB' must be a whole number of bytes"),
        ("1,PUT,aws:us-east-1,a,-1", "size -1 must be >= 0 bytes"),
        ("yesterday,PUT,aws:us-east-1,a,1", "timestamp 'yesterday' is neither seconds nor"),
        ("1,PUT,aws:us-east-1,,1", "obj_key is empty"),
    ],
)
def test_a_bad_row_stops_the_load_naming_line_and_field(row: str, says: str) -> None:
    with pytest.raises(TraceError) as e:
        parse(f"0,PUT,aws:us-east-1,a,1\n{row}\n")
    assert says in str(e.value)
    assert str(e.value).startswith("t.csv, line 2: ")


def test_a_trace_written_reads_back(tmp_path: Path) -> None:
    events = generate(MIXES["remote-eval"], days=0.5, seed=3)
    file = tmp_path / "t.csv"
    with file.open("w", newline="") as f:
        write(events, f)
    again = load(file)
    assert [(e.op, e.cloud, e.region, e.key, e.size) for e in again] == [
        (e.op, e.cloud, e.region, e.key, e.size) for e in events
    ]


def test_reads_of_what_the_trace_never_wrote_are_counted_not_priced() -> None:
    replay = Replay.of(parse("1,GET,aws:us-east-1,a,10\n2,PUT,aws:us-east-1,a,10\n"))
    assert replay.unread == 1 and len(replay.versions) == 1


REGIONS = ["aws:us-east-1", "aws:us-west-2", "gcp:us-central1", "azure:eastus"]


@st.composite
def traces(draw: st.DrawFn) -> list[Event]:
    rows = draw(
        st.lists(
            st.tuples(
                st.floats(0, 30 * 86400),
                st.sampled_from(["write", "read", "read", "delete"]),
                st.sampled_from(REGIONS),
                st.sampled_from(["a", "b", "c"]),
                st.integers(0, 50 * 10**9),
            ),
            max_size=60,
        )
    )
    return parse("".join(f"{t},{op},{r},{k},{s}\n" for t, op, r, k, s in rows))


@settings(max_examples=60, deadline=None)
@given(
    traces(),
    st.lists(st.sampled_from(REGIONS), min_size=1, max_size=3, unique=True),
    st.randoms(),
)
def test_the_optimum_is_a_lower_bound(
    events: list[Event], given_places: list[str], rng: object
) -> None:
    """No policy that puts each version at one of the candidate locations costs less than
    the optimum: not ours with or without the advice, not any random one."""
    replay = Replay.of(events)
    given_regions: list[Region] = [region(g) for g in given_places]
    candidates = replay.candidates(given_regions)
    bound = cost_of(replay, optimum(replay, candidates, PRICES), PRICES).total
    policies = [
        simulate(replay, given_regions, PRICES)[0],
        simulate(replay, given_regions[:1], PRICES)[0],
        simulate(replay, given_regions, PRICES, advice=page_advice(PRICES), every=6)[0],
        simulate(replay, given_regions, PRICES, advice=net_advice(PRICES, 168), every=6)[0],
    ]
    import random

    assert isinstance(rng, random.Random)
    policies.append({i: rng.choice(candidates) for i in range(len(replay.versions))})
    for at in policies:
        assert cost_of(replay, at, PRICES).total >= bound - 1e-9 * max(1.0, bound)


def test_the_net_advice_brings_the_shipped_traces_to_the_bound_where_placement_can() -> None:
    """After the advice's first look (the first day has no counters to go by), following
    the net advice costs within 10% of the single-copy optimum on train-local, and on
    remote-eval when the read counters name the version's writer; fan-out's readers are
    in other clouds than its writer, where placement by the writer's place cannot go."""
    results = {
        name: run(name, load(TRACES / name), [region(g) for g in given], PRICES)
        for name, given in SHIPPED.items()
    }

    def over(name: str, label: str) -> float:
        steady = results[name].steady
        return steady[label].total / steady["(d) optimum"].total - 1

    assert over("train-local.csv", "(c+) net, shared") < 0.10
    assert over("train-local.csv", "(c) writes only") > 0.10
    assert over("remote-eval.csv", "(c++) net (page)") < 0.10
    assert over("remote-eval.csv", "(c) writes only") > over("remote-eval.csv", "(b) placement")
    assert over("fan-out.csv", "(c+) net, shared") > 0.10
    for result in results.values():
        bound = result.costs["(d) optimum"].total
        assert all(c.total >= bound - 1e-6 for c in result.costs.values())
