"""The pure choice of what retention lets go (o41.core.retention): rules, and ``choose``
over an artifact's versions, with properties checked by hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from o41.core.retention import Decision, Row, choose, keep_for, rules_of

versions = st.lists(
    st.text("abcdef0123456789", min_size=4, max_size=4), unique=True, min_size=0, max_size=40
)


@st.composite
def artifacts(draw: st.DrawFn) -> tuple[list[Row], set[str], int]:
    names = draw(versions)
    marked = draw(st.sets(st.sampled_from(names))) if names else set()
    protected = draw(st.sets(st.sampled_from(names))) if names else set()
    if names and draw(st.booleans()):  # type: ignore[arg-type]
        protected.add(names[0])  # latest
    keep = draw(st.integers(1, 45))
    return [Row(v, v in marked) for v in names], protected, keep


def apply(rows: list[Row], decision: Decision) -> list[Row]:
    gone = set(decision.delete)
    back = set(decision.restore)
    return [
        Row(r.version, r.deleting and r.version not in back) for r in rows if r.version not in gone
    ]


@given(artifacts())
def test_a_protected_version_is_never_deleted(case: tuple[list[Row], set[str], int]) -> None:
    rows, protected, keep = case
    decision = choose(rows, keep, protected)
    assert not set(decision.delete) & protected
    assert set(decision.restore) <= protected


@given(artifacts())
def test_the_newest_unmarked_versions_stay_and_the_rest_go(
    case: tuple[list[Row], set[str], int],
) -> None:
    rows, protected, keep = case
    decision = choose(rows, keep, protected)
    counted = [r.version for r in rows if not r.deleting or r.version in protected]
    newest = set(counted[:keep])
    assert not set(decision.delete) & newest
    expected_gone = {
        r.version
        for r in rows
        if r.version not in protected and (r.deleting or r.version not in newest)
    }
    assert set(decision.delete) == expected_gone
    assert decision.restore == tuple(
        r.version for r in rows if r.deleting and r.version in protected
    )


@given(artifacts())
def test_a_second_pass_after_the_first_has_nothing_to_do(
    case: tuple[list[Row], set[str], int],
) -> None:
    rows, protected, keep = case
    after = apply(rows, choose(rows, keep, protected))
    again = choose(after, keep, protected)
    assert again.delete == () and again.restore == ()
    assert len(after) >= min(keep, len([r for r in rows if not r.deleting]))


@given(artifacts(), st.integers(1, 39))
def test_pages_decide_as_one_list_does(case: tuple[list[Row], set[str], int], cut: int) -> None:
    rows, protected, keep = case
    whole = choose(rows, keep, protected)
    first = choose(rows[:cut], keep, protected)
    second = choose(rows[cut:], keep, protected, first.kept)
    assert first.delete + second.delete == whole.delete
    assert first.restore + second.restore == whole.restore


def test_a_tagged_old_version_and_latest_stay() -> None:
    rows = [Row(v) for v in ["v5", "v4", "v3", "v2", "v1"]]
    decision = choose(rows, 2, {"v5", "v1"})
    assert decision.delete == ("v3", "v2")


def test_rules_first_match_wins_and_bad_entries_keep_everything() -> None:
    rules = rules_of(
        [
            {"artifacts": "ckpt-*", "keepVersions": 3},
            {"artifacts": "*", "keepVersions": 10},
            {"artifacts": "x", "keepVersions": 0},  # not a rule: left out
            {"artifacts": "../*", "keepVersions": 1},  # not a pattern
            {"artifacts": "y", "keepVersions": True},
            "z",
        ]
    )
    assert [(r.artifacts, r.keep) for r in rules] == [("ckpt-*", 3), ("*", 10)]
    assert keep_for(rules, "ckpt-7") == 3
    assert keep_for(rules, "model") == 10
    assert keep_for(rules_of(None), "model") is None  # off by default
    assert keep_for(rules_of([{"artifacts": "ckpt-*", "keepVersions": 2}]), "Ckpt-1") is None
