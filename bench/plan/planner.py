"""Every configuration of a plan -> its row: predicted memory per rank (does it fit?), step
time, throughput and MFU, ranked.

The trackings the configurations need (``scaling.py``: the fewest that stand for them all) run
in a pool of processes, each its own fake world, and their figures are assembled per row.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.plan.calibrate import Rate
from bench.plan.devices import Device
from bench.plan.space import Config
from bench.plan.step_time import Topology, predict_step
from bench.plan.tracked import Tracked
from bench.plan.trackings import Job, builds, figures, run_build, schedule

MiB_PER_GiB = 1024


@dataclass(frozen=True)
class Target:
    device: Device
    topology: Topology
    peak_tflops: Callable[[str], float]  # precision -> the device's peak
    peak_source: Callable[[str], str]
    allowance_gib: float  # memory the allocator does not see (CUDA context, NCCL buffers)
    global_batch: int
    rates: dict[str, Rate] = field(default_factory=dict)  # precision -> computation's rate


def plan_rows(
    configs: list[Config],
    target: Target,
    *,
    gpus_per_node: int,
    workers: int = 1,
    progress: Callable[[int, int, Config], None] | None = None,
) -> pd.DataFrame:
    """One row per configuration, ranked: those that fit by predicted step time first. The
    trackings run in ``workers`` processes (each its own fake world)."""
    jobs, assemble = schedule(configs)
    # A GPU target's step is tracked as a GPU runs it (AdamW foreach, NCCL's collectives).
    gpu = bool(target.device.gpu_name)
    track = functools.partial(run_build, gpus_per_node=gpus_per_node, gpu=gpu)
    groups = builds(jobs)
    got = _map(track, groups, workers, progress)
    memo = assemble(
        {
            job.key: t
            for group, ts in zip(groups, got, strict=True)
            for job, t in zip(group, ts, strict=True)
        }
    )
    rows = [_row(c, figures(c, memo), target) for c in configs]
    return rank(pd.DataFrame(rows))


def _map(fn, items: list[tuple[Job, ...]], workers: int, progress) -> list[list[Tracked]]:
    """``fn`` over ``items`` in order; in a pool of processes (``_start_method``) where there
    are enough of them to repay a worker's start."""
    if workers <= 1 or len(items) < 4 * workers:
        out = []
        with _fewer_collections():
            for i, build in enumerate(items):
                if progress:
                    progress(i, len(items), build[0].config)
                out.append(fn(build))
        return out
    with contextlib.ExitStack() as stack:
        gc.collect()
        gc.freeze()  # what is here now (torch, the models) is not scanned again, here or forked
        stack.callback(gc.unfreeze)
        pool = ProcessPoolExecutor(workers, mp_context=_start_method(), initializer=_collect_less)
        stack.enter_context(pool)
        # the builds of most steps first, so that no worker is left with a long one at the end
        order = sorted(range(len(items)), key=lambda i: -len(items[i]))
        futures = {pool.submit(fn, items[i]): i for i in order}
        for n, done in enumerate(as_completed(futures)):
            if progress:
                progress(n, len(items), items[futures[done]][0].config)
        got = {futures[f]: f.result() for f in futures}
        return [got[i] for i in range(len(items))]


# The garbage collector's first generation collected every GEN0 allocations, not every 700
# (Python's default): a tracked step allocates hundreds of thousands of short-lived objects
# (fake tensors, their metadata, pytree specs), which young collections scan again and again.
# The objects made before the pool are frozen (``gc.freeze``: torch and the models), so that
# no collection scans them again nor copies them into a worker's pages (docs/benchmarks.md,
# "Planning time").
GEN0 = 20_000


def _collect_less() -> None:
    gc.set_threshold(GEN0, *gc.get_threshold()[1:])


@contextlib.contextmanager
def _fewer_collections():
    before = gc.get_threshold()
    _collect_less()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _start_method():
    """Workers forked where this process runs one thread (they start with its imports, torch
    and the models: seconds each if spawned), spawned afresh where it runs more (a fork copies
    a lock another thread may hold: a worker could hang)."""
    tasks = Path("/proc/self/task")
    alone = tasks.is_dir() and len(list(tasks.iterdir())) == 1
    fork = alone and "fork" in multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if fork else "spawn")


def _row(c: Config, t: Tracked, target: Target) -> dict:
    accum = int(c.knobs["grad_accum"])
    tp = int(c.knobs.get("tp_degree") or 1)
    precision = c.knobs["precision"]
    # The counter sees a TP group's ops whole (DTensor's global shapes): a rank computes 1/tp.
    flops = t.flops * accum / tp
    ckpt = c.knobs["activation_checkpointing"] == "on"
    model_flops = flops * (0.75 if ckpt else 1.0)  # MFU counts the model's, not recomputation
    peak = target.peak_tflops(precision)
    row = {
        "config": c.label,
        "family": c.family,
        "strategy": c.strategy,
        "impl": c.impl,
        "activation_checkpointing": c.knobs["activation_checkpointing"],
        "precision": precision,
        "micro_batch": c.micro_batch,
        "grad_accum": accum,
        "world_size": c.world_size,
        "tp_degree": tp,
        "peak_mem_gib": t.peak_mib / MiB_PER_GiB,
        **{f"{k}_gib": v / MiB_PER_GiB for k, v in t.parts_mib.items()},
        "allowance_gib": target.allowance_gib,
        "device_mem_gib": target.device.memory_gib,
        "memory_how": t.how,
        "flops_per_rank": flops,
        "error": t.error,
    }
    row["fits"] = bool(
        math.isfinite(t.peak_mib)
        and row["peak_mem_gib"] + target.allowance_gib <= target.device.memory_gib
    )
    rate = target.rates[precision]
    timing = predict_step(c.point(), flops, rate, target.device.bandwidth_GBps, target.topology)
    row.update(timing)
    step_s = row.get("step_ms", math.nan) / 1e3
    row["samples_per_s"] = target.global_batch / step_s if step_s > 0 else math.nan
    row["mfu_pct"] = 100.0 * model_flops / step_s / (peak * 1e12) if step_s > 0 else math.nan
    row["compute_source"] = rate.source
    row["command"] = c.command(gpus_per_node=target.topology.gpus_per_node)
    return row


def rank(df: pd.DataFrame) -> pd.DataFrame:
    """Fitting rows by predicted step first, then those that do not fit, then failures."""
    if df.empty:
        return df
    order = df.assign(
        _tier=(~df["fits"]).astype(int) + 2 * df["step_ms"].isna().astype(int)
        if "step_ms" in df
        else 2
    ).sort_values(["_tier", "step_ms" if "step_ms" in df else "config"], kind="stable")
    out = order.drop(columns="_tier").reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out
