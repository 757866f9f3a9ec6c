"""The regression gate: reference/native ratios measured in one run against committed limits
(see gate.py), and proof that it fails when a kernel is slowed down."""

import pytest

from tests.benchmarks.gate import (
    GATES,
    GateFailure,
    check,
    decided,
    interval,
    measure,
    more,
)

pytestmark = pytest.mark.bench

MAX_ROUNDS = 15  # rounds a gate may add while its interval straddles the limit


def until_decided(gate, ranks, figures: dict, slow: float = 0.0) -> dict:
    """``figures`` with rounds of two added while the interval straddles the limit, up to
    ``MAX_ROUNDS``: a noisy machine widens the interval, a slower kernel moves it."""
    while not decided(gate, interval(figures)) and len(figures["native"]) < MAX_ROUNDS:
        extra = measure(gate, ranks, rounds=2, slow=slow, seed=len(figures["native"]))
        figures = more(figures, extra)
    return figures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("gate", GATES, ids=[g.name for g in GATES])
def test_reference_vs_native_within_limit(ranks, gate, record_property):
    figures = until_decided(gate, ranks, measure(gate, ranks))
    r = check(gate, figures)
    record_property("ratio", r.ratio)
    state = "" if decided(gate, r) else ", undecided: the interval straddles the limit"
    print(
        f"{gate.name}: reference/native {r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}] over "
        f"{len(figures['native'])} rounds (limit {gate.limit}{state})"
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["all_reduce 16MiB", "train step tp"])
def test_gate_fails_on_a_slowed_kernel(ranks, name):
    gate = next(g for g in GATES if g.name == name)
    # The reference's every iteration made four times as long (a sleep of three times its own
    # time, measured as it runs): a sleep fixed beforehand, even at three times the native
    # kernel's time measured a moment earlier, left the interval straddling the limit when the
    # load beside the test grew in between.
    figures = until_decided(gate, ranks, measure(gate, ranks, rounds=3, slow=3.0), 3.0)
    with pytest.raises(GateFailure, match=f"^{gate.name}: reference .* limit"):
        check(gate, figures)
