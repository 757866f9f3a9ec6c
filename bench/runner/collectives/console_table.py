"""The console's table of a ``message_size`` run, as nccl-tests prints it: a header per
collective, one line per size and implementation with the out-of-place and in-place figures
side by side, and the closing lines (average busbw, best against point-to-point,
reference/native per size)."""

from __future__ import annotations

import math

import pandas as pd

from bench.console import human_bytes
from bench.runfolder import placement
from bench.runfolder.folder import ours_and_native
from bench.runner.session.distenv import rank0_print
from bench.stats.intervals import relative_half_width
from parallel_kernels.collectives import IMPLS

UNSUPPORTED = "unsupported"  # the status of a placement the collective has no form for


_HALF = 43  # characters of one placement's columns in the console table


def header(ctx, coll, op: str, plan) -> None:
    rank0_print(
        f"\n# {coll.name}  op {op}  dtype {plan.dtype}  world size {ctx.env.world_size}"
        f"  {ctx.env.backend} on {ctx.env.device.type}"
    )
    rank0_print(
        f"# time: per call, blocks of {plan.block_calls} calls back to back, one "
        "synchronisation per block (nccl-tests' method); median over blocks, +-% its 95 % "
        "interval"
    )
    if coll.in_place_offsets is None:
        rank0_print(f"# in place: {UNSUPPORTED}, {coll.no_in_place}")
    half = f"{'time':>10} {'algbw':>8} {'busbw':>8} {'+-%':>6} {'#wrong':>7}"
    units = f"{'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6} {'':>7}"
    rank0_print(f"# {'':>12} {'':>11} {'':>10}  {'out-of-place':^{_HALF}}  {'in-place':^{_HALF}}")
    rank0_print(f"# {'size':>12} {'count':>11} {'impl':>10}  {half}  {half}")
    rank0_print(f"# {'(B)':>12} {'(elements)':>11} {'':>10}  {units}  {units}")


def _us(t: float) -> str:
    """A time as nccl-tests prints it: two decimals under 100 us, none from 10 ms."""
    return f"{t:.2f}" if t < 100 else f"{t:.1f}" if t < 10_000 else f"{t:.0f}"


def _half(row: dict | None) -> str:
    """One placement's columns: its figures, or what it is instead."""
    if row is None:
        return f"{'done (--resume)':^{_HALF}}"
    if row["status"] != "ok":
        return f"{row['status']:^{_HALF}}"
    return (
        f"{_us(row['time_us']):>10} {row['algbw_GBps']:>8.3f} {row['busbw_GBps']:>8.3f} "
        f"{_half_width(row):>6.1f} {row['wrong']:>7}"
    )


def print_line(size: int, count: int, impl: str, rows: list[dict | None]) -> None:
    """nccl-tests' line: a size's out-of-place and in-place figures side by side; errors
    below it."""
    rank0_print(f"  {size:>12} {count:>11} {impl:>10}  " + "  ".join(_half(r) for r in rows))
    for row in rows:
        if row is not None and row["status"] == "error":
            placement = "in place" if row["inplace"] else "out of place"
            rank0_print(f"  {'':>12} {'':>11} {'':>10}  {placement}: error: {row['error']}")


def _half_width(row: dict) -> float:
    """The median time's 95 % interval, as +- % of the median (the larger side); NaN, printed
    as such, without one (fewer than 6 blocks)."""
    width = relative_half_width(row["time_us"], row["time_us_ci_low"], row["time_us_ci_high"])
    return width if math.isfinite(width) else float("nan")


def footer(df: pd.DataFrame, limits: dict) -> str:
    """nccl-tests' closing line per collective and implementation (average busbw, out of place
    and in place), the best busbw of its cost rows (in place where it has that form:
    ``runfolder.placement``) against the measured point-to-point bandwidth, and
    reference/native busbw per size (cost rows)."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return "# no collective finished"
    oop, cost = ~placement.in_place(ok), placement.cost_rows(ok)
    lo, hi = human_bytes(ok["size_bytes"].min()), human_bytes(ok["size_bytes"].max())
    lines = [
        f"# Avg bus bandwidth over all sizes of the run ({lo} .. {hi}), out of place and in "
        f"place; best busbw (in place where the collective has that form) as a multiple of "
        f"one-way point-to-point "
        f"({limits['p2p_GBps']:.3f} GB/s):"
    ]
    for (coll, impl), g in ok.groupby(["collective", "impl"], sort=False):
        out, inp = g[oop[g.index]], g[~oop[g.index]]
        best = g[cost[g.index]]["busbw_GBps"].max()
        placed = f"{inp['busbw_GBps'].mean():8.3f} GB/s" if len(inp) else UNSUPPORTED
        lines.append(
            f"#   {coll:<15} {impl:<10} avg busbw {out['busbw_GBps'].mean():8.3f} GB/s, in "
            f"place {placed}   best {best:8.3f} GB/s = {best / limits['p2p_GBps']:.2f} x "
            f"p2p   #wrong {int(g['wrong'].sum())}"
        )
    wide = ok[cost].pivot_table(
        index=["collective", "size_bytes"], columns="impl", values="busbw_GBps", sort=False
    )
    ours, theirs = ours_and_native(list(wide.columns), IMPLS)
    if ours and theirs:
        lines.append(f"# {ours} / {theirs} busbw per size, cost rows (> 1: ours is faster):")
        for coll, g in wide.groupby(level=0, sort=False):
            ratios = "  ".join(  # busbw is 0 at one rank (its bus factor): no ratio
                f"{human_bytes(size)}: {r[ours] / r[theirs] if r[theirs] > 0 else math.nan:.2f}"
                for (_, size), r in g.iterrows()
            )
            lines.append(f"#   {coll:<15} {ratios}")
    failed = df[df["status"] == "error"]
    if len(failed):
        lines.append(f"# {len(failed)} size(s) failed; see the error column")
    missing = df[df["status"] == UNSUPPORTED]
    for coll, g in missing.groupby("collective", sort=False):
        lines.append(f"# {coll}: {len(g)} in-place row(s) {UNSUPPORTED}: {g['error'].iloc[0]}")
    return "\n".join(lines)
