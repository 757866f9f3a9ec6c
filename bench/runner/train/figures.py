"""A visit's figures, one rank's (times summarised, the state it holds, rates), and the point's
figures from its ranks' as the column table says."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bench.runfolder import columns
from bench.runfolder.column import MAX, MEAN, RANKS
from bench.runner.measure import flops
from bench.runner.measure.profiling import peak_rss_bytes
from bench.runner.measure.timing import summarize_times
from bench.runner.measure.trained import trained_tensors
from bench.runner.train.candidate import Candidate
from parallel_kernels.float8 import EMULATED, converts, emulates


@dataclass(frozen=True)
class Timed:
    """A visit's timed steps on this rank."""

    times: np.ndarray  # each step's first start to last end, ms
    skew: np.ndarray  # last end - first end per step, ms
    stop: str  # why the timing stopped
    data_ms: float  # median time to put a step's data onto the device
    nvml_util_pct: float


def visit_figures(c: Candidate, timed: Timed) -> dict:
    """This rank's figures of the candidate's visit, its times pooled with the earlier
    rounds'."""
    point, visit, trainer = c.point, c.visit, c.trainer
    pooled = np.concatenate([visit.prior_times, timed.times])
    skews = np.concatenate([visit.prior_skew, timed.skew])
    medians = [*visit.prior_medians, float(np.median(timed.times))]
    held = state_bytes(trainer.opt)
    expected_state = point.figures.get("state_bytes_expected")
    return {
        **summarize_times(pooled, skews),
        "comm_bytes_expected": point.figures.get("comm_bytes_expected"),
        **dict(zip(("param_mb", "grad_mb", "optim_mb"), (b / 2**20 for b in held), strict=True)),
        "state_mb": sum(held) / 2**20,
        "state_mb_expected": np.nan if expected_state is None else expected_state / 2**20,
        "peak_rss_mb": (peak_rss_bytes() or np.nan) / 2**20,
        "samples_ms": [float(t) for t in timed.times],  # this visit's, for samples.csv
        "skew_ms": [float(t) for t in timed.skew],  # kept by the runner for next rounds
        "data_ms": timed.data_ms,
        "nvml_util_pct": timed.nvml_util_pct,
        "params": point.figures["params"],
        "grad_bytes": point.figures["grad_bytes"],
        "loss": float(trainer.last_loss),
        "batch_per_replica": point.batch_per_replica,
        "grad_accum": trainer.accum,
        # total samples over total timed time (a mean rate), not one over the median step
        "samples_per_s": trainer.samples_per_step * len(pooled) / (pooled.sum() / 1e3),
        "steps": len(pooled),
        "stop": timed.stop,
        "rounds": len(medians),
        # how far apart the rounds' medians are: drift between rounds, when it is large
        "round_spread_pct": 100 * (max(medians) / min(medians) - 1) if len(medians) > 1 else np.nan,
        **_untimed(point, trainer.device),
    }


def _untimed(point, device: torch.device) -> dict:
    """The row's ``untimed`` where its step times are not its configuration's: fp8 emulated."""
    emulated = converts(point.knobs["precision"]) and emulates(device)
    return {"untimed": EMULATED} if emulated else {}


def state_bytes(opt: torch.optim.Optimizer) -> tuple[int, int, int]:
    """Bytes of parameters, of gradients and of optimiser state this rank holds (its shards),
    over the parameters the optimiser trains (a wrapper may swap others into its modules)."""
    held = {"param": 0, "grad": 0, "optim": 0}
    for kind, t in trained_tensors(opt):
        if kind != "optim" or t.dim() > 0:  # not the optimiser's step counts
            held[kind] += t.numel() * t.element_size()
    return held["param"], held["grad"], held["optim"]


def aggregate(per_rank: list[dict]) -> dict:
    """The point's figures from the ranks', as the column table says: times from the timing
    all-reduce are already cross-rank, breakdowns are averaged, memory takes the largest rank,
    ratios are made again from the averages, and a per-rank column lists every rank's."""
    ranks = [r for r in per_rank if r]
    out = dict(ranks[0])
    for how, reduce in ((MEAN, np.nanmean), (MAX, np.nanmax)):
        for key in columns.by_ranks(columns.TRAINING, how):
            if key not in out:  # a visit that was not profiled: the runner carries them over
                continue
            vals = [np.nan if r.get(key) is None else r[key] for r in ranks]
            out[key] = float(reduce(vals)) if not np.all(np.isnan(vals)) else np.nan
    for key in columns.by_ranks(columns.TRAINING, RANKS):
        if key in out:  # each rank's own figure, by rank: a pipeline's stages side by side
            out[key] = ";".join(_figure(r.get(key)) for r in ranks)
    out.update(flops.utilisation(out))  # mfu_pct from the ranks' aggregated figures
    if "comm_ms" not in out:
        return out
    comm = out["comm_ms"]
    out["compute_comm_ratio"] = out["compute_ms"] / comm if comm and comm > 0 else np.nan
    out["overlap_pct"] = 100.0 * out["overlap_ms"] / comm if comm and comm > 0 else np.nan
    return out


def _figure(value) -> str:
    """A rank's figure in a per-rank list: four significant digits, empty where it has none."""
    return "" if value is None or not np.isfinite(value) else f"{value:.4g}"
