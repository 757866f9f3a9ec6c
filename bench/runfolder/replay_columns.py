"""The replay's columns (python -m bench.replay's results.csv), one table of ``Column`` rows
beside the sweeps' in ``columns.py``."""

from __future__ import annotations

from bench.runfolder.column import DERIVED, POINT, RAN_ON, TIMED, Column

# A replay (python -m bench.replay): a row per collective of a traced step, per way of costing
# it (replayed with an implementation, or priced on a link), and a row per step with the totals.
REPLAY: tuple[Column, ...] = (
    Column(name="sweep", ranks=POINT, contract=True, meaning="replay"),
    Column(
        name="source",
        ranks=POINT,
        contract=True,
        meaning="replayed (run here) or priced (a link's alpha-beta costs, or "
        "this machine's fitted ones; not run)",
    ),
    Column(
        name="impl",
        ranks=POINT,
        contract=True,
        meaning="replayed: native or reference; priced: empty",
        report=3,
    ),
    Column(
        name="link",
        ranks=POINT,
        contract=True,
        meaning="priced: the link preset, alpha=..,beta=.., or fitted:<run>",
        report=4,
    ),
    Column(
        name="kind",
        ranks=POINT,
        contract=True,
        meaning="call (one collective) or step (the step's totals)",
    ),
    Column(
        name="step",
        numeric=True,
        ranks=POINT,
        contract=True,
        meaning="the traced profiler step",
        report=1,
    ),
    Column(
        name="index",
        numeric=True,
        ranks=POINT,
        contract=True,
        meaning="the call's place in its step (calls in issue order)",
        report=2,
    ),
    Column(
        name="op",
        ranks=POINT,
        contract=True,
        meaning="all_reduce, broadcast, all_gather, reduce_scatter, all_to_all",
        report=5,
    ),
    Column(name="dtype", ranks=POINT, contract=True, meaning="element type", report=6),
    Column(
        name="count", numeric=True, ranks=POINT, contract=True, meaning="elements of a rank's input"
    ),
    Column(
        name="size_bytes",
        numeric=True,
        unit="B",
        ranks=POINT,
        contract=True,
        meaning="S, nccl-tests' size of the call (all-gather: its output)",
        report=7,
    ),
    Column(
        name="group_size",
        numeric=True,
        unit="ranks",
        ranks=POINT,
        contract=True,
        meaning="ranks of the call's process group",
        report=8,
    ),
    Column(
        name="traced_us",
        unit="us",
        ranks=TIMED,
        contract=True,
        meaning="the call's traced time: its shortest duration across the "
        "ranks traced (the transfer, without waiting for a late rank); a step: the sum",
        report=9,
    ),
    Column(
        name="time_us",
        unit="us",
        ranks=TIMED,
        contract=True,
        meaning="replayed: median over repetitions of the shortest "
        "duration across ranks (as traced_us); priced: the model's time; a step: the sum",
        report=10,
    ),
    Column(
        name="busbw_GBps",
        unit="GB/s",
        ranks=DERIVED,
        contract=True,
        meaning="S / time_us x the collective's bus factor",
        report=11,
    ),
    Column(
        name="wrong",
        numeric=True,
        ranks=POINT,
        contract=True,
        meaning="replayed: elements differing from the exact result, all ranks",
        report=12,
    ),
    Column(
        name="status",
        ranks=POINT,
        contract=True,
        meaning="ok, error (the backend's message in error), or unsupported",
        report=13,
    ),
    Column(name="error", ranks=POINT, contract=True, meaning="why the call was not replayed"),
    Column(name="group", ranks=POINT, meaning="the process group's name in the trace"),
    Column(name="group_ranks", ranks=POINT, meaning="its ranks"),
    Column(
        name="traced_us_max",
        unit="us",
        ranks=TIMED,
        meaning="the call's longest traced duration across ranks",
    ),
    Column(
        name="time_us_max",
        unit="us",
        ranks=TIMED,
        meaning="replayed: median over repetitions of the longest duration across ranks",
    ),
    Column(name="traced_busbw_GBps", unit="GB/s", ranks=DERIVED, meaning="busbw of traced_us"),
    Column(
        name="reps", numeric=True, ranks=POINT, meaning="replayed: timed repetitions of the step"
    ),
    Column(name="point", ranks=POINT, meaning="the row's id"),
    *RAN_ON,
)
