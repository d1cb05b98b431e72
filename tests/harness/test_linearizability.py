"""The linearizability checker's own tests: it accepts what is linearizable and refuses
what is not, on hand-made histories and on random histories with a known linearization."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from linearizability import MISSING, Operation, apply, check_dict, check_register


def op(
    f: str, arg: object = None, result: object = None, call: float = 0, ret: float = 1
) -> Operation:
    return Operation("k", f, arg, result, call, ret)


def test_sequential_histories() -> None:
    good = [
        op("get", result=None, call=0, ret=1),
        op("set", 1, call=2, ret=3),
        op("get", result=1, call=4, ret=5),
        op("pop", result=1, call=6, ret=7),
        op("contains", result=False, call=8, ret=9),
        op("setdefault", 2, result=2, call=10, ret=11),
        op("setdefault", 3, result=2, call=12, ret=13),
        op("delete", result=True, call=14, ret=15),
        op("delete", result=False, call=16, ret=17),
    ]
    assert check_register(good)
    stale = [
        op("set", 1, call=0, ret=1),
        op("set", 2, call=2, ret=3),
        op("get", result=1, call=4, ret=5),
    ]
    assert not check_register(stale)


def test_overlapping_operations_may_take_either_order() -> None:
    for seen in (1, 2):
        history = [
            op("set", 1, call=0, ret=1),
            op("set", 2, call=2, ret=6),
            op("get", result=seen, call=3, ret=4),
        ]
        assert check_register(history)
    invented = [
        op("set", 1, call=0, ret=1),
        op("set", 2, call=2, ret=6),
        op("get", result=3, call=3, ret=4),
    ]
    assert not check_register(invented)


def test_reads_cannot_go_back_in_time() -> None:
    # both reads overlap the write, but once one saw the new value a later one cannot
    # see the old
    history = [
        op("set", 1, call=0, ret=1),
        op("set", 2, call=2, ret=10),
        op("get", result=2, call=3, ret=4),
        op("get", result=1, call=5, ret=6),
    ]
    assert not check_register(history)


def test_two_pops_cannot_take_one_value() -> None:
    history = [
        op("set", 1, call=0, ret=1),
        op("pop", result=1, call=2, ret=5),
        op("pop", result=1, call=3, ret=4),
    ]
    assert not check_register(history)
    history[2] = op("pop", result=None, call=3, ret=4)
    assert check_register(history)


def test_unknown_outcomes_may_or_may_not_have_happened() -> None:
    lost = op("set", 7, call=1, ret=math.inf)
    assert check_register([op("set", 1, call=0, ret=0.5), lost, op("get", result=7, call=2, ret=3)])
    assert check_register([op("set", 1, call=0, ret=0.5), lost, op("get", result=1, call=2, ret=3)])
    # but not before it was called
    early = [op("get", result=7, call=0, ret=0.5), Operation("k", "set", 7, None, 1, math.inf)]
    assert not check_register(early)


def test_keys_are_checked_apart() -> None:
    history = [
        Operation("a", "set", 1, None, 0, 1),
        Operation("b", "get", None, 1, 2, 3),  # b was never written
        Operation("a", "get", None, 1, 2, 3),
    ]
    assert check_dict(history) == ["b"]


def random_history(rng: random.Random, n: int, keys: int = 1) -> list[Operation]:
    """Operations with random overlaps around known linearization points, results as a
    real register gives them: linearizable by construction."""
    points = sorted(rng.uniform(0, 100) for _ in range(n))
    state: dict[str, object] = {}
    history = []
    for i, t in enumerate(points):
        key = f"k{rng.randrange(keys)}"
        f = rng.choice(["get", "set", "delete", "pop", "contains", "setdefault"])
        arg = i if f in ("set", "setdefault") else None
        result, new = apply(state.get(key, MISSING), f, arg)
        call, ret = t - rng.uniform(0, 5), t + rng.uniform(0, 5)
        history.append(Operation(key, f, arg, result, call, ret, rng.randrange(8)))
        state[key] = new
    return history


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 60))
def test_random_linearizable_histories_pass(seed: int, n: int) -> None:
    history = random_history(random.Random(seed), n, keys=2)
    assert check_dict(history) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 60))
def test_a_read_of_a_value_never_written_fails(seed: int, n: int) -> None:
    rng = random.Random(seed)
    history = random_history(rng, n)
    reads = [o for o in history if o.f == "get"]
    if not reads:
        return
    rng.choice(reads).result = "never written"
    assert check_dict(history) == ["k0"]
