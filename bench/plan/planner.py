"""Every configuration of a plan -> its row: predicted memory per rank (does it fit?), step
time, throughput and MFU, ranked.

Tracking under fake tensors (``memory.py``) is the plan's cost, so configurations share it
where the memory cannot differ, and the distinct trackings share the cores. DDP's bucket size
does not change what a rank holds (the buckets hold every gradient whatever their size);
accumulation is tracked at one micro-batch per step (the FLOPs of ``accum`` micro-batches are
``accum`` times one's; the gradients of those before the last are the tensors the last one
accumulates into); micro-batches between a layout's smallest and largest are interpolated
between those two (activations and FLOPs grow with the micro-batch). A replicated layout (DDP,
TP x DDP) is tracked at two replicas: a rank holds the same whatever their number. A sharded
layout at a world size of more than ``PROXY_WORLD`` ranks is tracked at two smaller ones and
extrapolated as ``a + b / world``: what a rank holds of sharded state falls as 1/world, the
rest (activations, a unit's gathered parameters) does not change.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import pandas as pd

from bench.plan.calibrate import Rate
from bench.plan.devices import Device
from bench.plan.memory import Tracked, failed, track
from bench.plan.space import Config
from bench.plan.timing import Topology, predict_step

MiB_PER_GiB = 1024
PROXY_WORLD = 64  # sharded layouts beyond this many ranks are tracked at two smaller worlds


@dataclass(frozen=True)
class Target:
    device: Device
    topology: Topology
    peak_tflops: Callable[[str], float]  # precision -> the device's peak
    peak_source: Callable[[str], str]
    allowance_gib: float  # memory the allocator does not see (CUDA context, NCCL buffers)
    global_batch: int
    rates: dict[str, Rate] = field(default_factory=dict)  # precision -> computation's rate


def _memory_key(c: Config) -> tuple:
    knobs = {k: v for k, v in c.knobs.items() if k not in ("bucket_cap_mb", "grad_accum")}
    return (c.strategy, c.impl, tuple(sorted(knobs.items())), c.micro_batch, c.world_size)


def _inner(c: Config) -> int:
    """Ranks of the group that does not shard with the world (a TP group, a hybrid shard)."""
    return int(c.knobs.get("tp_degree") or c.knobs.get("shard_size") or 1)


def _sharded(c: Config) -> bool:
    return c.strategy == "fsdp" or bool(c.knobs.get("dp_shard"))


def _tracked_as(c: Config) -> Config:
    """The configuration whose tracking stands for ``c``'s: FSDP1's is FSDP2's of the same
    sharding (torch's tracker cannot follow FSDP1's flat parameters, whose views are not
    leaves; both hold the same ZeRO shards of the same tensors, gathered unit by unit)."""
    return replace(c, impl="native") if c.impl == "native_fsdp1" else c


def _track_config(c: Config, gpus_per_node: int, memo: dict | None = None) -> Tracked:
    """The configuration's tracking (once per ``_memory_key`` in ``memo``)."""
    memo = {} if memo is None else memo
    key = _memory_key(_tracked_as(c))
    if key not in memo:
        memo[key] = _track_scaled(_tracked_as(c), gpus_per_node)
    got = memo[key]
    if c.impl == "native_fsdp1" and not got.error:
        return replace(got, how=f"FSDP2's figure (FSDP1 is not trackable); {got.how}")
    return got


def _track_scaled(c: Config, gpus_per_node: int) -> Tracked:
    one = replace(c, knobs={**c.knobs, "grad_accum": 1})
    try:
        point = one.point()
    except ValueError as e:
        return failed(f"{e}")
    world = c.world_size
    if not _sharded(c) and world > 2 * _inner(c):
        # replicated data parallelism: a rank holds the same whatever the number of replicas
        # (two are enough to wrap it as it will be), and a small fake world builds quickly
        got = track(one.point(world_size=2 * _inner(c)), gpus_per_node=gpus_per_node)
        return replace(got, how=f"{got.how}; at {2 * _inner(c)} ranks (replicas hold alike)")
    small = max(16, 4 * _inner(c))
    if not (world > PROXY_WORLD and world >= 4 * small):
        return track(point, gpus_per_node=gpus_per_node)
    a, b = (track(one.point(world_size=w), gpus_per_node=gpus_per_node) for w in (small, 2 * small))
    if a.error or b.error:
        return a if a.error else b
    # m(w) = A + K / w through m(s) = a and m(2s) = b: K = 2s (a - b), so
    # m(world) = a + K (1/world - 1/s) = a + (a - b)(2s / world - 2)
    at = a.plus(a.minus(b), 2 * small / world - 2)
    return replace(at, how=f"{a.how}; at {small} and {2 * small} ranks, extrapolated as a + b/n")


def plan_rows(
    configs: list[Config],
    target: Target,
    *,
    gpus_per_node: int,
    workers: int = 1,
    progress: Callable[[int, int, Config], None] | None = None,
) -> pd.DataFrame:
    """One row per configuration, ranked: those that fit by predicted step time first. The
    distinct trackings run in ``workers`` processes (each its own fake world)."""
    jobs: dict[tuple, Config] = {}
    for c in configs:
        jobs.setdefault(_memory_key(_tracked_as(c)), _tracked_as(c))
    by_layout: dict[tuple, list[tuple[int, tuple]]] = {}
    for key, c in jobs.items():
        by_layout.setdefault(key[:3] + key[4:], []).append((c.micro_batch, key))
    ends = {k for group in by_layout.values() for _, k in (min(group), max(group))}
    tracked = [k for k in jobs if k in ends]
    track_one = functools.partial(_track_scaled, gpus_per_node=gpus_per_node)
    got = _map(track_one, [jobs[k] for k in tracked], workers, progress)
    memo = dict(zip(tracked, got, strict=True))
    for group in by_layout.values():
        _interpolate(sorted(group), memo)
    rows = [_row(c, _track_config(c, gpus_per_node, memo), target) for c in configs]
    return rank(pd.DataFrame(rows))


def _interpolate(group: list[tuple[int, tuple]], memo: dict) -> None:
    """The micro-batches between a layout's smallest and largest, from those two: what a rank
    holds is its state plus activations and temporaries that grow with the micro-batch, and
    FLOPs grow with it alike (tests/test_plan.py checks one against its tracking)."""
    (lo, lo_key), (hi, hi_key) = group[0], group[-1]
    a, b = memo[lo_key], memo[hi_key]
    for m, key in group[1:-1]:
        if a.error or b.error:
            memo[key] = a if a.error else b
            continue
        between = a.plus(b.minus(a), (m - lo) / (hi - lo))
        memo[key] = replace(between, how=f"{a.how}; between micro-batches {lo} and {hi}")


def _map(fn, items: list[Config], workers: int, progress) -> list[Tracked]:
    """``fn`` over ``items`` in order; in a pool of spawned processes where there are enough
    of them to repay a worker's start (importing torch and the models: seconds)."""
    if workers <= 1 or len(items) < 4 * workers:
        out = []
        for i, c in enumerate(items):
            if progress:
                progress(i, len(items), c)
            out.append(fn(c))
        return out
    ctx = multiprocessing.get_context("spawn")  # no forked torch state in the workers
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = [pool.submit(fn, c) for c in items]
        for i, done in enumerate(as_completed(futures)):
            if progress:
                progress(i, len(items), items[futures.index(done)])
        return [f.result() for f in futures]


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
