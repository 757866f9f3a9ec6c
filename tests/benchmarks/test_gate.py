"""The regression gate: reference/native ratios measured in one run against committed limits
(see gate.py), and proof that it fails when a kernel is slowed down."""

import pytest

from tests.benchmarks.gate import GATES, GateFailure, check, measure


@pytest.mark.timeout(240)
@pytest.mark.parametrize("gate", GATES, ids=[g.name for g in GATES])
def test_reference_vs_native_within_limit(ranks, gate, record_property):
    try:
        ratio = check(gate, measure(gate, ranks))
    except GateFailure as first:
        # A noisy machine can push one measurement past a limit; a slower kernel stays there.
        # Measure again, longer, and fail only if the ratio is still beyond the limit.
        print(f"re-measuring after: {first}")
        ratio = check(gate, measure(gate, ranks, rounds=9))
    record_property("ratio", ratio)
    print(f"{gate.name}: reference/native {ratio:.3f} (limit {gate.limit})")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["all_reduce 16MiB", "train step tp"])
def test_gate_fails_on_a_slowed_kernel(ranks, name):
    gate = next(g for g in GATES if g.name == name)
    # 50 ms more per call: several times the kernel's own time on this machine
    figures = measure(gate, ranks, rounds=2, slow_s=0.05)
    with pytest.raises(GateFailure, match=f"^{gate.name}: reference .* limit"):
        check(gate, figures)
