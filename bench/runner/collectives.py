"""The ``message_size`` sweep: every collective, native and reference, over message sizes.

After nccl-tests: per size, warm-up iterations, then timed iterations (the slowest rank's time
per iteration, median over iterations), algbw = S / t and busbw = algbw x factor(n) in GB/s
(1e9 bytes), and ``#wrong``: elements that differ from the exact expected result, summed over
ranks, from one more run on fresh inputs. The transport's own limits are measured in the same
run (point-to-point exchange between ranks 0 and 1, memory copy on rank 0) so that busbw can be
read against them.
"""

from __future__ import annotations

import argparse
import datetime
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from bench.runfolder import columns
from bench.runfolder.folder import ours_and_native, write_meta
from bench.runner.context import RunContext, finish_run, start_run
from bench.runner.distenv import DistEnv, rank0_print, synchronize
from bench.runner.harness import root_cause
from bench.runner.timing import Budget, adaptive_steps, timed_steps
from bench.stats.intervals import median_interval, relative_half_width
from parallel_kernels.collectives import COLLECTIVES, DTYPES, IMPLS, Collective, count_wrong


@dataclass(frozen=True, kw_only=True)
class CollectivePlan:
    sizes: list[int]
    collectives: list[str]
    impls: list[str]
    dtype: str
    op: str
    iters: int  # at least this many timed iterations per size
    warmup: int
    check: bool
    # then more until the median's interval is within +-target_pct %, up to max_iters and max_s
    # seconds (the defaults: exactly ``iters``)
    max_iters: int = 0
    max_s: float = math.inf
    target_pct: float = 0.0


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)


def _median_time(fn, iters: int, device: torch.device) -> float:
    """Seconds per call of ``fn``, timed as the collectives are (``timed_steps``: warmed up,
    back to back, the slowest rank per call, the median over calls), so the limits and the
    collectives are read on the same scale."""
    fn()
    slowest, _ = timed_steps(fn, iters, device=device, group=None)
    return float(np.median(slowest)) / 1e3


def measure_limits(env: DistEnv, nbytes: int, iters: int = 10) -> dict:
    """What the transport can do, in GB/s (1e9 bytes/s), between ranks 0 and 1:
    ``p2p_GBps`` one way (0 -> 1 and 1 -> 0 in turn, the mean of the two), ``p2p_bidir_GBps``
    per direction while both send at once, and ``memcpy_GBps``, a copy on rank 0."""
    count = max(1, nbytes // 4)
    send = torch.ones(count, device=env.device)
    recv = torch.empty_like(send)
    limits = {"bytes": count * 4}
    if env.world_size > 1:

        def one_way(src: int) -> None:
            if env.rank == src:
                dist.send(send, dst=1 - src)
            elif env.rank == 1 - src:
                dist.recv(recv, src=src)

        def both_ways() -> None:
            if env.rank in (0, 1):
                works = [dist.isend(send, dst=1 - env.rank), dist.irecv(recv, src=1 - env.rank)]
                for w in works:
                    w.wait()

        t01 = _median_time(lambda: one_way(0), iters, env.device)
        t10 = _median_time(lambda: one_way(1), iters, env.device)
        limits["p2p_GBps"] = count * 4 / ((t01 + t10) / 2) / 1e9
        limits["p2p_bidir_GBps"] = count * 4 / _median_time(both_ways, iters, env.device) / 1e9
    else:
        limits["p2p_GBps"] = limits["p2p_bidir_GBps"] = float("nan")
    copies = []
    for _ in range(iters):
        t0 = time.perf_counter()
        recv.copy_(send)
        synchronize(env.device)
        copies.append(time.perf_counter() - t0)
    limits["memcpy_GBps"] = count * 4 / float(np.median(copies)) / 1e9
    return limits


def _measure(
    coll: Collective, impl: str, count: int, plan: CollectivePlan, op: str, env: DistEnv, group
) -> dict:
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    dtype = DTYPES[plan.dtype]
    inp, out, _ = coll.buffers(count, dtype, rank, n, op, env.device)
    run = coll.impl(impl)  # looked up once, not in the timed loop
    for _ in range(plan.warmup):
        run(inp, out, op, group)
    budget = Budget(
        min_steps=plan.iters, max_steps=max(plan.iters, plan.max_iters), max_s=plan.max_s,
        target_pct=plan.target_pct,
    )  # fmt: skip
    slowest, _, stop = adaptive_steps(
        lambda: run(inp, out, op, group), budget, prior=[], device=env.device, group=group
    )
    lo, hi = median_interval(slowest)
    wrong = 0
    if plan.check:
        inp, out, expected = coll.buffers(count, dtype, rank, n, op, env.device)
        run(inp, out, op, group)
        synchronize(env.device)
        wrong = count_wrong(out, expected)
    return {
        "samples_ms": [float(t) for t in slowest],
        "time_us": float(np.median(slowest)) * 1e3,
        "time_us_min": float(slowest.min()) * 1e3,
        "time_us_max": float(slowest.max()) * 1e3,
        "time_us_ci_low": lo * 1e3,
        "time_us_ci_high": hi * 1e3,
        "iters": len(slowest),
        "stop": stop,
        "wrong": wrong,
    }


def _new_group(args) -> dist.ProcessGroup:
    return dist.new_group(timeout=datetime.timedelta(seconds=args.point_timeout))


def _header(ctx: RunContext, coll: Collective, op: str, plan: CollectivePlan) -> None:
    rank0_print(
        f"\n# {coll.name}  op {op}  dtype {plan.dtype}  world size {ctx.env.world_size}"
        f"  {ctx.env.backend} on {ctx.env.device.type}"
    )
    rank0_print(
        f"# {'size':>12} {'count':>11} {'impl':>10} {'time(us)':>11} "
        f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'+-%':>6} {'iters':>6} {'#wrong':>7}"
    )


def _print_row(row: dict) -> None:
    if row["status"] != "ok":
        rank0_print(
            f"  {row['size_bytes']:>12} {row['count']:>11} {row['impl']:>10}  error: {row['error']}"
        )
        return
    rank0_print(
        f"  {row['size_bytes']:>12} {row['count']:>11} {row['impl']:>10} "
        f"{row['time_us']:>11.1f} {row['algbw_GBps']:>12.3f} {row['busbw_GBps']:>12.3f} "
        f"{_half_width(row):>6.1f} {row['iters']:>6} {row['wrong']:>7}"
    )


def _half_width(row: dict) -> float:
    """The median time's 95 % interval, as +- % of the median (the larger side); NaN, printed
    as such, without one (fewer than 6 iterations)."""
    width = relative_half_width(row["time_us"], row["time_us_ci_low"], row["time_us_ci_high"])
    return width if math.isfinite(width) else float("nan")


def _run_size(coll, impl, count, itemsize, plan, op, env, group, limits, sweep, point):
    """Measure one size on every rank and agree on the outcome: (row, failed)."""
    n = env.world_size
    result, error = None, None
    try:
        result = _measure(coll, impl, count, plan, op, env, group)
    except Exception as e:  # noqa: BLE001  (an unsupported op is an error row)
        error = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
    outcomes: list = [None] * n
    dist.all_gather_object(outcomes, (result, error))
    s_bytes = count * itemsize
    row = {
        "sweep": sweep,
        "collective": coll.name,
        "impl": impl,
        "world_size": n,
        "dtype": plan.dtype,
        "op": op,
        "size_bytes": s_bytes,
        "count": count,
        "point": point,
        "backend": env.backend,
        "device": env.device.type,
    }
    errors = [e for _, e in outcomes]
    if any(errors):
        row.update(status="error", error=root_cause(errors))
        return row, True
    t = outcomes[0][0]["time_us"]  # identical on every rank (all-reduced)

    def bus(time_us: float) -> float:  # busbw of a time (GB/s)
        return s_bytes / (time_us * 1e-6) / 1e9 * coll.busbw_factor(n) if time_us > 0 else np.nan

    algbw = s_bytes / (t * 1e-6) / 1e9 if t > 0 else float("nan")
    busbw = algbw * coll.busbw_factor(n)
    row.update(
        outcomes[0][0],
        status="ok",
        error="",
        algbw_GBps=algbw,
        busbw_GBps=busbw,
        # a longer time is a lower bandwidth: the interval's ends swap
        busbw_GBps_ci_low=bus(outcomes[0][0]["time_us_ci_high"]),
        busbw_GBps_ci_high=bus(outcomes[0][0]["time_us_ci_low"]),
        wrong=sum(o[0]["wrong"] for o in outcomes),
        busbw_frac_p2p=busbw / limits["p2p_GBps"],
    )
    return row, False


def run_collective_sweep(args: argparse.Namespace, plan: CollectivePlan, argv: list[str]) -> int:
    ctx = start_run(
        args,
        argv,
        columns.written(columns.COLLECTIVE),
    )
    env = ctx.env
    limits = measure_limits(env, min(max(plan.sizes), 64 << 20))
    rank0_print(
        f"limits ({human_bytes(limits['bytes'])} messages, ranks 0 and 1): point-to-point "
        f"{limits['p2p_GBps']:.3f} GB/s one way, {limits['p2p_bidir_GBps']:.3f} GB/s per "
        f"direction both ways at once; memory copy {limits['memcpy_GBps']:.3f} GB/s"
    )
    if env.is_main:
        ctx.meta["limits"] = limits
        ctx.meta["collective_plan"] = vars(plan)
        # what the reading side needs to know of each implementation (the table's fact)
        ctx.meta["impl_native"] = {impl: IMPLS[impl] for impl in plan.impls}
        write_meta(ctx.run_dir / "meta.json", ctx.meta)
    n = env.world_size
    itemsize = torch.empty((), dtype=DTYPES[plan.dtype]).element_size()
    for name in plan.collectives:
        coll = COLLECTIVES[name]
        op = plan.op if plan.op in coll.ops else "none"
        _header(ctx, coll, op, plan)
        # Implementations alternate size by size, so machine drift hits them alike.
        groups = {impl: _new_group(args) for impl in plan.impls}
        for size in plan.sizes:
            count = coll.align(size // itemsize, n)
            for impl in plan.impls:
                point = f"{name}-{size}-{impl}"
                if (point, 1) in ctx.skip:
                    rank0_print(f"  {size:>12} {count:>11} {impl:>10}  already done (--resume)")
                    continue
                row, failed = _run_size(
                    coll,
                    impl,
                    count,
                    itemsize,
                    plan,
                    op,
                    env,
                    groups[impl],
                    limits,
                    args.sweep,
                    point,
                )
                if failed:  # the group may hold a half-done collective: start a fresh one
                    dist.destroy_process_group(groups[impl])
                    groups[impl] = _new_group(args)
                ctx.write(row)
                _print_row(row)
        for group in groups.values():
            dist.destroy_process_group(group)
    return finish_run(ctx, lambda run: footer(run.results, limits))


def footer(df: pd.DataFrame, limits: dict) -> str:
    """nccl-tests' closing line per collective and implementation (average busbw), the best
    busbw against the measured point-to-point bandwidth, and reference/native busbw per size."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return "# no collective finished"
    lo, hi = human_bytes(ok["size_bytes"].min()), human_bytes(ok["size_bytes"].max())
    lines = [
        f"# Avg bus bandwidth over all sizes of the run ({lo} .. {hi}); best busbw as a "
        f"multiple of one-way point-to-point ({limits['p2p_GBps']:.3f} GB/s):"
    ]
    for (coll, impl), g in ok.groupby(["collective", "impl"], sort=False):
        best = g["busbw_GBps"].max()
        lines.append(
            f"#   {coll:<15} {impl:<10} avg busbw {g['busbw_GBps'].mean():8.3f} GB/s   best "
            f"{best:8.3f} GB/s = {best / limits['p2p_GBps']:.2f} x p2p   "
            f"#wrong {int(g['wrong'].sum())}"
        )
    wide = ok.pivot_table(
        index=["collective", "size_bytes"], columns="impl", values="busbw_GBps", sort=False
    )
    ours, theirs = ours_and_native(list(wide.columns), IMPLS)
    if ours and theirs:
        lines.append(f"# {ours} / {theirs} busbw per size (> 1: ours is faster):")
        for coll, g in wide.groupby(level=0, sort=False):
            ratios = "  ".join(
                f"{human_bytes(size)}: {r[ours] / r[theirs]:.2f}" for (_, size), r in g.iterrows()
            )
            lines.append(f"#   {coll:<15} {ratios}")
    failed = df[df["status"] != "ok"]
    if len(failed):
        lines.append(f"# {len(failed)} size(s) failed; see the error column")
    return "\n".join(lines)
