"""The collective sweep's columns (``--sweep message_size``'s results.csv), one ``Column`` row
each; ``columns.py`` gathers the tables."""

from __future__ import annotations

from bench.runfolder.column import DERIVED, POINT, RAN_ON, TIMED, Column

COLLECTIVE: tuple[Column, ...] = (
    Column(name="sweep", ranks=POINT, contract=True, meaning="message_size"),
    Column(
        name="collective",
        ranks=POINT,
        contract=True,
        meaning="all_reduce, all_gather, reduce_scatter ...",
        report=1,
    ),
    Column(name="impl", ranks=POINT, contract=True, meaning="native or reference", report=6),
    Column(
        name="world_size", numeric=True, unit="ranks", ranks=POINT, contract=True, meaning="ranks"
    ),
    Column(name="dtype", ranks=POINT, contract=True, meaning="element type", report=3),
    Column(
        name="size_bytes",
        numeric=True,
        unit="B",
        ranks=POINT,
        contract=True,
        meaning="S, the whole buffer (nccl-tests' size)",
        report=4,
    ),
    Column(name="count", numeric=True, ranks=POINT, contract=True, meaning="elements", report=5),
    Column(
        name="time_us",
        unit="us",
        ranks=TIMED,
        contract=True,
        meaning="time per call: a block's time over its block_calls calls "
        "back to back (nccl-tests' method), median over blocks",
        report=8,
    ),
    Column(
        name="algbw_GBps", unit="GB/s", ranks=DERIVED, contract=True, meaning="S / time", report=9
    ),
    Column(
        name="busbw_GBps",
        unit="GB/s",
        ranks=DERIVED,
        contract=True,
        meaning="algbw x the collective's bus factor",
        report=10,
    ),
    Column(
        name="wrong",
        numeric=True,
        ranks=POINT,
        contract=True,
        meaning="elements differing from the exact result, all ranks",
        report=13,
    ),
    Column(
        name="status",
        ranks=POINT,
        contract=True,
        meaning="ok, error, or unsupported (the collective has no such form)",
        report=14,
    ),
    Column(
        name="error",
        ranks=POINT,
        contract=True,
        meaning="why the size failed, or why it is unsupported",
    ),
    Column(name="op", ranks=POINT, meaning="reduction: sum, avg or max", report=2),
    Column(
        name="inplace",
        ranks=POINT,
        meaning="False: out of place (two buffers; nccl-tests' first "
        "figure); True: in place (one buffer, laid out as nccl-tests does)",
        report=7,
    ),
    Column(name="time_us_min", unit="us", ranks=TIMED, meaning="fastest block, per call"),
    Column(name="time_us_max", unit="us", ranks=TIMED, meaning="slowest block, per call"),
    Column(
        name="busbw_frac_p2p",
        ranks=DERIVED,
        meaning="busbw / the measured point-to-point bandwidth",
    ),
    Column(
        name="time_us_ci_low",
        unit="us",
        ranks=TIMED,
        meaning="95 % interval of time_us, low end (order statistics)",
    ),
    Column(
        name="time_us_ci_high", unit="us", ranks=TIMED, meaning="95 % interval of time_us, high end"
    ),
    Column(
        name="busbw_GBps_ci_low",
        unit="GB/s",
        ranks=DERIVED,
        meaning="busbw at time_us_ci_high",
        report=11,
    ),
    Column(
        name="busbw_GBps_ci_high",
        unit="GB/s",
        ranks=DERIVED,
        meaning="busbw at time_us_ci_low",
        report=12,
    ),
    Column(
        name="iters",
        numeric=True,
        ranks=POINT,
        meaning="timed calls, all blocks (adaptive: at least -n)",
    ),
    Column(
        name="block_calls",
        numeric=True,
        ranks=POINT,
        meaning="calls per block: -n, or --max-steps / 6 if fewer",
    ),
    Column(
        name="stop", ranks=POINT, meaning="what ended the timing: target, max_steps or max_point_s"
    ),
    Column(name="point", ranks=POINT, meaning="the row's id (in-place rows end in -inplace)"),
    *RAN_ON,
)
