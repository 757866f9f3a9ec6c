"""Predictions at other scales: larger worlds, other links, a faster device.

Weak scaling: every rank keeps its batch, so its computation is the profile's (divided by the
device speed-up); communication grows with the world size as the collectives' algorithms say.
Scaling efficiency is the step's computation alone over the predicted step (1 when
communication is entirely hidden).

For each world size the data-parallel choices are compared: DDP at several bucket sizes, and
FSDP's sharding strategies (the optimiser step shrinks to 1/n of the parameters when they are
sharded, so what follows backward is scaled by the share of optimiser state a rank holds). The
recommendation is the fastest of each, with its predicted margin over PyTorch's defaults (DDP's
25 MB buckets after a first bucket of 1 MiB, FSDP's FULL_SHARD), and the memory each choice
holds per rank.

With fitted collectives every prediction is also a range: the step simulated again with every
collective at the low, then at the high, end of its 95 % interval (``comm.py``'s bootstrap;
each call's interval from the same refitted alpha-beta pairs). The step cannot shorten when a
collective lengthens, so the two ends bracket it. A link's figures are given, not measured: no
range (NaN).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from bench.model import schedule as sch
from bench.model.comm import FitError, load_runs
from bench.model.compute import ComputeProfile, pooled
from bench.model.links import LinkCosts, parse_link
from bench.model.predict import case_of, compute_profiles, ddp, fsdp, overlap_share
from bench.model.runs import check_compatible, read_collectives_runs, read_training_runs
from bench.runfolder.points import PointRecord
from parallel_kernels.fsdp_layout import zero_state_bytes

BUCKETS_MB = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0)
# DistributedDataParallel left at its defaults: 25 MB buckets after a first one of 1 MiB.
DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel's own default, whatever our knob table says
DEFAULT_DDP = "ddp default (25 MB, first bucket 1 MiB)"
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
DEFAULT_SHARDING = "FULL_SHARD"


def _row(n, choice, tl: sch.Timeline, compute_ms: float, psi: int, sharding: str) -> dict:
    m = tl.metrics()
    return {
        "world_size": n,
        "choice": choice,
        "step_ms": m["step_ms"],
        "exposed_comm_ms": m["exposed_comm_ms"],
        "comm_ms": m["comm_ms"],
        "overlap_pct": m["overlap_pct"],
        "scaling_efficiency_pct": 100.0 * compute_ms / m["step_ms"]
        if m["step_ms"]
        else float("nan"),
        "state_mb_per_rank": zero_state_bytes(psi, n, sharding) / 2**20,
    }


def predict_scales(
    prof: ComputeProfile,
    *,
    point: PointRecord,
    comm,
    world_sizes: list[int],
    share: float = 1.0,
    speedup: float = 1.0,
    buckets_mb: tuple[float, ...] = BUCKETS_MB,
) -> pd.DataFrame:
    """One row per (world size, choice): DDP at each bucket size, FSDP per sharding, with
    ``step_ms_low``/``step_ms_high``, the step at either end of the collectives' intervals."""
    args = (prof, point, world_sizes, share, speedup, buckets_mb)
    table = _predict(comm, *args)
    ends = comm.interval_ends()  # None: the costs have no interval
    table["step_ms_low"] = _predict(ends[0], *args)["step_ms"] if ends else math.nan
    table["step_ms_high"] = _predict(ends[1], *args)["step_ms"] if ends else math.nan
    return table


def _predict(comm, prof, point, world_sizes, share, speedup, buckets_mb) -> pd.DataFrame:
    prof = prof.scaled(speedup)
    psi = sum(prof.grad_bytes) // 4
    rows = []
    # The measured DDP point's record: its implementation's facts and the model's shapes.
    base = replace(case_of(point), knobs={}, defaults={})
    for n in world_sizes:
        base = replace(base, world=n)
        default = replace(base, knobs={"bucket_cap_mb": DEFAULT_BUCKET_MB}, first_bucket_mb=1.0)
        ddp_choices = [(DEFAULT_DDP, default)]
        ddp_choices += [
            (f"ddp bucket_cap_mb={mb:g}", replace(base, knobs={"bucket_cap_mb": mb}))
            for mb in buckets_mb
        ]
        for name, case in ddp_choices:
            tl = sch.simulate(ddp(case, prof, comm, n), share=share)
            rows.append(_row(n, name, tl, prof.total_ms, psi, "NO_SHARD"))
        for sharding in SHARDINGS:
            # native fully_shard: its reductions do not block computation
            case = replace(
                base,
                schedule="fsdp",
                facts={**base.facts, "reduce_blocks": False},
                knobs={"sharding_strategy": sharding},
            )
            held = zero_state_bytes(psi, n, sharding) / zero_state_bytes(psi, n, "NO_SHARD")
            # the optimiser steps over the rank's share of the state
            p = replace(prof, after_ms=prof.after_ms * held) if sharding != "NO_SHARD" else prof
            tl = sch.simulate(fsdp(case, p, comm, n), share=share)
            rows.append(_row(n, f"fsdp {sharding}", tl, p.total_ms, psi, sharding))
    return pd.DataFrame(rows)


def recommend(table: pd.DataFrame) -> pd.DataFrame:
    """Per world size: the fastest bucket size and sharding, and their margin over the
    defaults (positive: faster than the default by that many ms). With ranges: each one's
    step at the intervals' ends, the margin's least and greatest over the central costs and
    both ends, and whether the recommendation is still the fastest at both ends."""
    out = []
    ends = ("step_ms_low", "step_ms_high")
    for n, g in table.groupby("world_size"):
        for family, default in (("ddp", DEFAULT_DDP), ("fsdp", f"fsdp {DEFAULT_SHARDING}")):
            fam = g[g["choice"].str.startswith(family + " ")]
            best = fam.loc[fam["step_ms"].idxmin()]
            ref = fam[fam["choice"] == default].iloc[0]
            margins = [ref[c] - best[c] for c in ("step_ms", *ends)]
            ranged = not any(math.isnan(m) for m in margins)
            out.append(
                {
                    "world_size": n,
                    "family": family,
                    "recommended": best["choice"],
                    "step_ms": best["step_ms"],
                    "step_ms_low": best["step_ms_low"],
                    "step_ms_high": best["step_ms_high"],
                    "default": default,
                    "default_step_ms": ref["step_ms"],
                    "default_step_ms_low": ref["step_ms_low"],
                    "default_step_ms_high": ref["step_ms_high"],
                    "margin_ms": margins[0],
                    "margin_ms_low": min(margins) if ranged else math.nan,
                    "margin_ms_high": max(margins) if ranged else math.nan,
                    "margin_pct": 100.0 * margins[0] / ref["step_ms"],
                    "best_at_both_ends": all(best[c] == fam[c].min() for c in ends)
                    if ranged
                    else math.nan,
                    "state_mb_per_rank": best["state_mb_per_rank"],
                }
            )
    return pd.DataFrame(out)


def load_compute(collectives: list[Path], compute: Path, *, model: str | None = None):
    """(computation profile, a DDP point's record, the run's meta) for a what-if: the DDP
    points of ``compute`` (native ones if any, of ``model`` or the model with the most gradient
    bytes) pooled into one profile, from the collectives' machine."""
    meta, _ = read_collectives_runs(collectives)
    runs = read_training_runs([compute])
    check_compatible(meta, collectives[0], runs)
    run_dir, run_meta, ok, records = runs[0]
    points = ok[
        [
            records[p].schedule == "ddp" and records[p].knobs.get("comm_hook") in (None, "none")
            for p in ok["point"]
        ]
    ]
    if points.empty:
        raise FitError(f"--compute {run_dir} has no ok DDP points (run --sweep bucket_cap_mb)")
    model = model or points.sort_values("grad_bytes")["model"].iloc[-1]
    points = points[points["model"] == model]
    if points.empty:
        raise FitError(f"--compute {run_dir} has no ok DDP points of model {model}")
    native = [records[p].impl_facts["native"] for p in points["point"]]
    if any(native):
        points = points[native]
    profiles = compute_profiles(run_dir, run_meta, points)
    prof = pooled(list({id(p): p for p in profiles.values()}.values()), f"{run_dir.name}: {model}")
    return prof, records[points["point"].iloc[0]], run_meta


def link_costs(link: str | None, collectives: list[Path], run_meta: dict):
    """(collective costs, what they assume, overlap share): a link's, with NCCL's algorithms
    and free overlap, or without one the collectives fitted on this machine."""
    if link:
        costs = LinkCosts(parse_link(link))
        return costs, costs.link.describe() + "; NCCL algorithms", 1.0
    costs = load_runs(collectives)
    about = f"fitted {costs.backend} collectives of {', '.join(map(str, collectives))}"
    if costs.interval_ends() is None:
        about += " (no samples.csv: no range)"
    return costs, about, overlap_share(run_meta)
