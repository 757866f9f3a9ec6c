"""The replay's columns (python -m bench.replay's results.csv), one table of ``Column`` rows
beside the sweeps' in ``columns.py``."""

from __future__ import annotations

from bench.runfolder.column import DERIVED, POINT, RAN_ON, TIMED, Column, col

# A replay (python -m bench.replay): a row per collective of a traced step, per way of costing
# it (replayed with an implementation, or priced on a link), and a row per step with the totals.
REPLAY: tuple[Column, ...] = (
    col("sweep", "", POINT, True, "replay"),
    col(
        "source",
        "",
        POINT,
        True,
        "replayed (run here) or priced (a link's alpha-beta costs, or "
        "this machine's fitted ones; not run)",
    ),
    col("impl", "", POINT, True, "replayed: native or reference; priced: empty", report=3),
    col(
        "link",
        "",
        POINT,
        True,
        "priced: the link preset, alpha=..,beta=.., or fitted:<run>",
        report=4,
    ),
    col("kind", "", POINT, True, "call (one collective) or step (the step's totals)"),
    col("step", "", POINT, True, "the traced profiler step", report=1),
    col("index", "", POINT, True, "the call's place in its step (calls in issue order)", report=2),
    col(
        "op",
        "",
        POINT,
        True,
        "all_reduce, broadcast, all_gather, reduce_scatter, all_to_all",
        report=5,
    ),
    col("dtype", "", POINT, True, "element type", report=6),
    col("count", "", POINT, True, "elements of a rank's input"),
    col(
        "size_bytes",
        "B",
        POINT,
        True,
        "S, nccl-tests' size of the call (all-gather: its output)",
        report=7,
    ),
    col("group_size", "ranks", POINT, True, "ranks of the call's process group", report=8),
    col(
        "traced_us",
        "us",
        TIMED,
        True,
        "the call's traced time: its shortest duration across the "
        "ranks traced (the transfer, without waiting for a late rank); a step: the sum",
        report=9,
    ),
    col(
        "time_us",
        "us",
        TIMED,
        True,
        "replayed: median over repetitions of the shortest "
        "duration across ranks (as traced_us); priced: the model's time; a step: the sum",
        report=10,
    ),
    col(
        "busbw_GBps", "GB/s", DERIVED, True, "S / time_us x the collective's bus factor", report=11
    ),
    col(
        "wrong",
        "",
        POINT,
        True,
        "replayed: elements differing from the exact result, all ranks",
        report=12,
    ),
    col(
        "status",
        "",
        POINT,
        True,
        "ok, error (the backend's message in error), or unsupported",
        report=13,
    ),
    col("error", "", POINT, True, "why the call was not replayed"),
    col("group", "", POINT, False, "the process group's name in the trace"),
    col("group_ranks", "", POINT, False, "its ranks"),
    col("traced_us_max", "us", TIMED, False, "the call's longest traced duration across ranks"),
    col(
        "time_us_max",
        "us",
        TIMED,
        False,
        "replayed: median over repetitions of the longest duration across ranks",
    ),
    col("traced_busbw_GBps", "GB/s", DERIVED, False, "busbw of traced_us"),
    col("reps", "", POINT, False, "replayed: timed repetitions of the step"),
    col("point", "", POINT, False, "the row's id"),
    *RAN_ON,
)
