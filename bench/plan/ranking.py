"""The ranking stage: each configuration with its memory and its step, one row of plan.csv,
ranked: those that fit by predicted step first, then those that do not fit, then those
without a prediction. A row also gets its throughput, its MFU and the command that runs it."""

from __future__ import annotations

import math

import pandas as pd

from bench.plan.calibration import Target
from bench.plan.families import FAMILIES
from bench.plan.space import Config
from bench.plan.step_time import StepTime
from bench.plan.tracked import Tracked

MiB_PER_GiB = 1024
MFU_PRECISION = {"fp8": "bf16"}  # the peak a precision's MFU is against, where not its own


def ranked_rows(
    configs: list[Config], figures: list[Tracked], times: list[StepTime], target: Target
) -> pd.DataFrame:
    """plan.csv's rows: one per configuration (with its memory stage's ``figures`` and its time
    stage's ``times``, in the configurations' order), ranked."""
    rows = [row(c, t, s, target) for c, t, s in zip(configs, figures, times, strict=True)]
    return rank(pd.DataFrame(rows))


def row(c: Config, t: Tracked, step: StepTime, target: Target) -> dict:
    """One configuration's row: what it is, its memory and whether it fits, its step."""
    precision = c.knobs["precision"]
    flops = c.step_flops(t.flops)
    # MFU counts the model's FLOPs, not checkpointing's recomputation
    again = c.step_flops(t.recompute_flops)
    model_flops = flops - again
    out = {
        "config": c.label,
        "family": c.family,
        "strategy": c.strategy,
        "impl": c.impl,
        "activation_checkpointing": c.knobs["activation_checkpointing"],
        "precision": precision,
        "compile": c.knobs.get("compile", "off"),
        "micro_batch": c.micro_batch,
        "grad_accum": int(c.knobs["grad_accum"]),
        "world_size": c.world_size,
        "tp_degree": c.tp_degree,
        "peak_mem_gib": t.peak_mib / MiB_PER_GiB,
        **{f"{k}_gib": v / MiB_PER_GiB for k, v in t.parts_mib.items()},
        "allowance_gib": target.allowance_gib,
        "device_mem_gib": target.device.memory_gib,
        "memory_how": t.how,
        "flops_per_rank": flops,
        # the runner's column of that name: what checkpointing recomputes, per step per rank
        "recompute_flops_per_step": again,
        "error": t.error,
    }
    out["fits"] = bool(
        math.isfinite(t.peak_mib)
        and out["peak_mem_gib"] + target.allowance_gib <= target.device.memory_gib
    )
    out.update(step.columns())
    step_s = out.get("step_ms", math.nan) / 1e3
    # an fp8 row's MFU against the bf16 peak, as the runner and torchtitan report float8 runs
    peak = target.peak_tflops(MFU_PRECISION.get(precision, precision))
    out["samples_per_s"] = target.global_batch / step_s if step_s > 0 else math.nan
    out["mfu_pct"] = 100.0 * model_flops / step_s / (peak * 1e12) if step_s > 0 else math.nan
    out["compute_source"] = target.rate_for(c.knobs).source
    out["command"] = c.command(gpus_per_node=target.topology.gpus_per_node)
    # a family's columns of its own (a pipeline's degree, schedule and most loaded stage)
    out.update(FAMILIES[c.family].columns(c.knobs, c.world_size))
    if t.pipeline is not None:
        out.update(t.pipeline.columns())
    return out


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
