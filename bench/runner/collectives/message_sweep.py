"""The ``message_size`` sweep: every collective, native and reference, over message sizes.

After nccl-tests (src/common.cu, ``BenchTime``): per size, out of place then in place (two rows,
``inplace`` False and True), warm-up calls, then blocks of calls issued back to back: a barrier,
the clock started, ``block_calls`` calls, the device synchronised once, the clock stopped, and
the block's time divided by its calls. A per-call synchronisation would add the host's round
trip to every call, which inflates small messages (and the cost model's alpha). One block is
nccl-tests' whole measurement; here each block's time per call is one sample, and blocks go on
until the median's interval is as tight as asked or the budget is spent, as for training steps
(``timing.adaptive_steps``). A block lasts from the first rank's start to the last rank's end
on a common clock; nccl-tests averages the ranks' own times (its ``-a 1``), which is shorter by
at most the ranks' start skew over ``block_calls``. algbw = S / t and busbw = algbw x factor(n)
in GB/s (1e9 bytes), and ``#wrong``: elements that differ from the exact expected result, summed
over ranks, from one more call on fresh inputs after the timed blocks. The transport's own
limits are measured in the same run (point-to-point exchange between ranks 0 and 1, memory copy
on rank 0) so that busbw can be read against them.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from bench.console import human_bytes
from bench.runfolder import columns
from bench.runfolder.folder import write_meta
from bench.runner.collectives.console_table import UNSUPPORTED, footer, header, print_line
from bench.runner.configure.config import RunConfig
from bench.runner.faults import watchdog
from bench.runner.faults.root_cause import root_cause
from bench.runner.measure.timing import (
    Budget,
    TimedStep,
    adaptive_steps,
    common_clock,
    timed_steps,
)
from bench.runner.session.context import finish_run, start_run
from bench.runner.session.distenv import DistEnv, rank0_print, synchronize
from bench.stats.intervals import median_interval
from parallel_kernels.collectives import COLLECTIVES, DTYPES, IMPLS, Collective, count_wrong

# The fewest samples whose median has a 95 % interval (order statistics: the extremes of six
# cover it with probability 1 - 2 / 2**6 = 0.97; ``bench.stats.intervals``).
MIN_BLOCKS = 6


@dataclass(frozen=True, kw_only=True)
class CollectivePlan:
    sizes: list[int]
    collectives: list[str]
    impls: list[str]
    dtype: str
    op: str
    iters: int  # at least this many timed calls per size and placement
    warmup: int
    check: bool
    # then more blocks until the median's interval is within +-target_pct %, up to max_iters
    # calls and max_s seconds (the defaults: exactly ``iters``)
    max_iters: int = 0
    max_s: float = math.inf
    target_pct: float = 0.0

    @property
    def block_calls(self) -> int:
        """Calls timed back to back as one sample: ``iters`` (nccl-tests' -n), or fewer where
        the budget would then hold fewer than MIN_BLOCKS blocks, too few for an interval."""
        return max(1, min(self.iters, max(self.iters, self.max_iters) // MIN_BLOCKS))

    def budget(self) -> Budget:
        """The timing budget in blocks: ``iters`` calls at least, ``max_iters`` at most."""
        calls = self.block_calls
        return Budget(
            min_steps=-(-self.iters // calls),
            max_steps=max(self.iters, self.max_iters) // calls,
            max_s=self.max_s,
            target_pct=self.target_pct,
        )


@dataclass(frozen=True, kw_only=True)
class MessagePoint:
    """One point of the sweep: a collective by one implementation on a message of ``size``
    bytes as asked for (``count`` elements of ``itemsize`` bytes once aligned to the ranks),
    reduced by ``op``, out of place or in place."""

    coll: Collective
    impl: str
    op: str
    size: int
    count: int
    itemsize: int
    in_place: bool = False

    @property
    def id(self) -> str:
        """The point's name in results.csv and in ``--resume``."""
        place = "-inplace" if self.in_place else ""
        return f"{self.coll.name}-{self.size}-{self.impl}{place}"

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize


def _median_time(fn, iters: int, device: torch.device) -> float:
    """Seconds per call of ``fn`` (``timed_steps``: warmed up, each call timed alone, the median
    over calls). Unlike the collectives, each call is synchronised: the limits are measured at
    the run's largest message, up to 64 MiB, where a synchronisation is negligible."""
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


def _measure(point: MessagePoint, plan: CollectivePlan, env: DistEnv, group) -> dict:
    """The point timed in blocks of calls on this rank, then checked on fresh inputs."""
    coll, count, op = point.coll, point.count, point.op
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    dtype = DTYPES[plan.dtype]
    inp, out, _ = coll.buffers(count, dtype, rank, n, op, env.device, point.in_place)
    run = coll.impl(point.impl)  # looked up once, not in the timed loop
    for _ in range(plan.warmup):
        run(inp, out, op, group)
    calls = plan.block_calls

    def block() -> None:  # nccl-tests' timed loop: no synchronisation between calls
        for _ in range(calls):
            run(inp, out, op, group)

    clock = common_clock(group, env.device)
    timed = TimedStep(step=block, device=env.device, group=group, clock=clock)
    blocks_ms, _, stop = adaptive_steps(timed, plan.budget())
    per_call = blocks_ms / calls  # ms per call, one sample per block
    lo, hi = median_interval(per_call)
    wrong = 0
    if plan.check:
        inp, out, expected = coll.buffers(count, dtype, rank, n, op, env.device, point.in_place)
        run(inp, out, op, group)
        synchronize(env.device)
        wrong = count_wrong(out, expected)
    return {
        "samples_ms": [float(t) for t in per_call],
        "time_us": float(np.median(per_call)) * 1e3,
        "time_us_min": float(per_call.min()) * 1e3,
        "time_us_max": float(per_call.max()) * 1e3,
        "time_us_ci_low": lo * 1e3,
        "time_us_ci_high": hi * 1e3,
        "iters": len(per_call) * calls,
        "block_calls": calls,
        "stop": stop,
        "wrong": wrong,
    }


def _new_group(config: RunConfig) -> dist.ProcessGroup:
    return dist.new_group(timeout=datetime.timedelta(seconds=config.point_timeout))


# Out of place, then in place, as nccl-tests times them; a placement the collective has no
# form for is a row of status UNSUPPORTED, its reason in ``error`` and no figures (not
# "n/a": pandas reads that as a missing value).
PLACEMENTS = (False, True)


def _run_size(
    point: MessagePoint, plan: CollectivePlan, env: DistEnv, group, limits: dict, sweep: str
) -> tuple[dict, bool]:
    """Measure one size and placement on every rank and agree on the outcome: (row, failed)."""
    coll, n, s_bytes = point.coll, env.world_size, point.nbytes
    row = {
        "sweep": sweep,
        "collective": coll.name,
        "impl": point.impl,
        "inplace": point.in_place,
        "world_size": n,
        "dtype": plan.dtype,
        "op": point.op,
        "size_bytes": s_bytes,
        "count": point.count,
        "point": point.id,
        "backend": env.backend,
        "device": env.device.type,
    }
    # a fact of the registry: every rank agrees
    if point.in_place and coll.in_place_offsets is None:
        row.update(status=UNSUPPORTED, error=coll.no_in_place)
        return row, False
    result, error = None, None
    try:
        watchdog.check_terminated()  # a cancelled job, or one whose launcher is lost, ends here
        result = _measure(point, plan, env, group)
    except Exception as e:  # noqa: BLE001  (an unsupported op is an error row)
        error = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
    outcomes: list = [None] * n
    dist.all_gather_object(outcomes, (result, error))
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


def _error_writer(ctx, point: MessagePoint):
    """Rank 0: what writes this point's row as an error, should the rank have to leave during
    it (``watchdog.end_now``)."""
    if not ctx.env.is_main:
        return None
    return lambda why: ctx.write(
        {
            "sweep": ctx.config.sweep,
            "collective": point.coll.name,
            "impl": point.impl,
            "inplace": point.in_place,
            "world_size": ctx.env.world_size,
            "size_bytes": point.size,
            "point": point.id,
            "status": "error",
            "error": why,
        }
    )


def run_collective_sweep(config: RunConfig, plan: CollectivePlan) -> int:
    ctx = start_run(config, columns.written(columns.COLLECTIVE))
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
    itemsize = torch.empty((), dtype=DTYPES[plan.dtype]).element_size()
    for name in plan.collectives:
        coll = COLLECTIVES[name]
        op = plan.op if plan.op in coll.ops else "none"
        header(ctx, coll, op, plan)
        # Implementations alternate size by size, so machine drift hits them alike.
        groups = {impl: _new_group(config) for impl in plan.impls}
        for size in plan.sizes:
            count = coll.align(size // itemsize, env.world_size)
            for impl in plan.impls:
                rows = [
                    _visit(
                        ctx,
                        plan,
                        MessagePoint(
                            coll=coll,
                            impl=impl,
                            op=op,
                            size=size,
                            count=count,
                            itemsize=itemsize,
                            in_place=in_place,
                        ),
                        groups,
                        limits,
                    )
                    for in_place in PLACEMENTS
                ]
                print_line(size, count, impl, rows)
        for group in groups.values():
            dist.destroy_process_group(group)
    return finish_run(ctx, lambda run: footer(run.results, limits))


def _visit(
    ctx, plan: CollectivePlan, point: MessagePoint, groups: dict, limits: dict
) -> dict | None:
    """One point: timed, checked and its row written (None where --resume skips it); a failed
    point's group is replaced."""
    if (point.id, 1) in ctx.skip:
        return None
    watchdog.point_started(_error_writer(ctx, point))
    group = groups[point.impl]
    row, failed = _run_size(point, plan, ctx.env, group, limits, ctx.config.sweep)
    if failed:  # the group may hold a half-done collective: start a fresh one
        dist.destroy_process_group(group)
        groups[point.impl] = _new_group(ctx.config)
    watchdog.write_row(lambda row=row: ctx.write(row))
    watchdog.point_done()
    return row
