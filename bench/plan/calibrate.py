"""The computation's rate from profiled steps of the model: what ``--compute`` reads, and the
short runs the planner makes where it plans for this machine.

Two DDP runs of the model (``bench/run.py --sweep precision``; the planner's on the plan's
ranks here, so that the computation is measured beside the ranks' communication, as it will
run), one batch per replica ``B``: ``B`` samples in one micro-batch, and ``B / a`` in each of
``a`` accumulated ones. A step's computation (the analyser's ``compute_ms``: the main thread's
work less its collectives) of ``a`` micro-batches of ``m`` samples is ``a (c + k m) + o``
(``c``: what a micro-batch costs whatever its size, launches and Python; ``k m``: its FLOPs at
the rate ``R``; ``o``: the optimiser step), so the pair gives ``c = (T_a - T_1) / (a - 1)`` and
``R = F / (T_1 - c - o)``, ``F`` the rank's FLOPs per step (the harness's count) and ``o``
AdamW's traffic (``timing.ADAMW_BYTES_PER_PARAM``). One run gives ``R`` with ``c = 0``. Another
device's rate is this one's times the ratio of the two devices' peaks at the precision.

Activation checkpointing costs a host more than its recomputation's FLOPs at that rate: the
forward's launches and Python again, the checkpoint's own bookkeeping (llama:tiny on this CPU,
8 samples: 27 % more computation checkpointed, where its FLOPs at the rate said 10 %). On a CPU
plan with checkpointed configurations one more short run (``--sweep activation_checkpointing``,
off and on interleaved in one launch, DDP, the plan's first precision, the same micro-batch
and ranks) measures the ratio of the two computations, and the rate's ``ckpt_factor`` is
that ratio over the one the rate predicts: a checkpointed micro-batch's predicted computation
is multiplied by it (``timing.compute_profile``). A host's cost, taken for its plans only.

FSDP does computation of its own that the model's FLOPs do not count: per unit, the copies into
and out of its collectives' buffers (an all-gather's input and its output into the unit's
parameters, a reduce-scatter's input from the gradients) and its hooks. On a CPU plan one more
short run (``--sweep sharding_strategy``, each FSDP implementation the plan holds, the plan's
first precision, the same micro-batch and ranks) measures it: a configuration's computation per
step less DDP's in the first run (``fsdp_ms``). It is the host's cost, and taken for this
host's plans only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.plan.launch import run_bench

BUDGET = ["--max-point-s", "4", "--rounds", "1", "--warmup-steps", "3", "--profile-steps", "1"]


@dataclass(frozen=True)
class Rate:
    tflops: float  # the model's FLOPs per second in a step's computation, TFLOP/s
    micro_ms: float  # the cost of a micro-batch whatever its size (c)
    source: str
    # "implementation strategy" -> FSDP's own computation per step beyond the model's, ms
    # (``fsdp_extra``); empty: none counted
    fsdp_ms: dict = field(default_factory=dict, hash=False)
    # a checkpointed micro-batch's computation over what its FLOPs at this rate say
    # (``ckpt_factor``); 1: none measured
    ckpt_factor: float = 1.0

    def fsdp_extra_ms(self, impl: str, strategy: str) -> float:
        """FSDP's own computation per step of ``impl`` at ``strategy``: its calibrated figure,
        else the highest of the implementation's (a strategy not run in the calibration,
        HYBRID_SHARD at fewer than 4 ranks), else none."""
        if f"{impl} {strategy}" in self.fsdp_ms:
            return self.fsdp_ms[f"{impl} {strategy}"]
        own = [ms for key, ms in self.fsdp_ms.items() if key.split(" ")[0] == impl]
        return max(own, default=0.0)


def _read(run: Path) -> pd.DataFrame:
    results = run / "results.csv"
    if not results.is_file():
        raise ValueError(f"--compute {run}: not a run folder (no results.csv)")
    df = pd.read_csv(results, keep_default_na=False)
    ok = df[df["status"] == "ok"]
    if ok.empty or "flops_per_step" not in ok:
        raise ValueError(f"--compute {run}: no ok point with its FLOPs")
    return ok


def _accum(run: Path) -> int:
    """A run's gradient accumulation, from its points record's knobs."""
    import json

    first = (run / "points.jsonl").read_text().splitlines()[0]
    return int(json.loads(first)["knobs"].get("grad_accum", 1))


def _computation_ms(row) -> float:
    """A results row's computation per step: the analyser's, else (no traces) the step."""
    try:
        value = float(row["compute_ms"])
    except (KeyError, TypeError, ValueError):
        value = math.nan
    return value if value > 0 else float(row["step_ms_median"])


def fit_rates(runs: list[Path], optimiser_ms: float) -> dict[str, Rate]:
    """Per precision, the rate and per-micro-batch cost the runs give."""
    tables = {r: _read(r) for r in runs}
    by_accum = sorted(tables, key=_accum)
    one, many = by_accum[0], by_accum[-1]
    a = _accum(many)
    rates = {}
    for _, row in tables[one].iterrows():
        precision = str(row["value"])
        t1 = _computation_ms(row)
        c = 0.0
        match = tables[many][tables[many]["value"].astype(str) == precision]
        if a > 1 and not match.empty:
            c = max(0.0, (_computation_ms(match.iloc[0]) - t1) / (a - 1))
        compute_ms = t1 - c - optimiser_ms
        if compute_ms <= 0:
            compute_ms = t1 - c
        tflops = float(row["flops_per_step"]) / (compute_ms / 1e3) / 1e12
        how = (
            f"{precision}: {t1:.1f} ms of computation per step of {row['batch_per_replica']} "
            f"samples in {one}"
        )
        if c:
            how += f", {c:.2f} ms per micro-batch from {many}"
        rates[precision] = Rate(tflops, c, how)
    if not rates or any(not math.isfinite(r.tflops) for r in rates.values()):
        raise ValueError(f"--compute {', '.join(map(str, runs))}: no rate could be fitted")
    return rates


def collectives_run(out: Path, ranks: int, timeout_s: float = 600) -> Path:
    """A short ``--sweep message_size`` run on ``ranks`` ranks here of the collectives the
    schedules price (all-reduce, all-gather, reduce-scatter; native, 4 KiB to 16 MiB: 15 s on
    2 ranks), whose fit prices a CPU plan's communication as this machine runs it. The link
    presets are GPU fabrics: a CPU plan of llama:tiny at 2 ranks priced its DDP step's
    all-reduces at 0.06 ms on them, where gloo took 5.7 ms."""
    run = out / "collectives"
    args = [
        "--sweep",
        "message_size",
        "--collectives",
        "all_reduce,all_gather,reduce_scatter",
        "--impl",
        "native",
        "-b",
        "4K",
        "-e",
        "16M",
        "-f",
        "4",
    ]
    return _launch_here(args, ranks, run, "the collectives", timeout_s)


def _launch_here(args: list[str], ranks: int, run: Path, what: str, timeout_s: float) -> Path:
    """A calibration run of ``bench/run.py`` on ``ranks`` ranks here into ``run``, or the
    ValueError that says why it failed (one line)."""
    args = [*args, "--nproc-per-node", str(ranks), "--no-report", "--out", str(run)]
    failure = run_bench(args, timeout_s)
    if failure:
        raise ValueError(f"the calibration run of {what} failed: {failure}")
    return run


def calibration_runs(
    model: str,
    precisions: tuple[str, ...],
    per_replica: int,
    out: Path,
    ranks: int = 1,
    timeout_s: float = 600,
) -> list[Path]:
    """The two short DDP runs on ``ranks`` ranks here (one when a micro-batch cannot split):
    ``per_replica`` samples in one micro-batch, and in 4 (or 2) accumulated ones."""
    splits = [a for a in (4, 2) if per_replica % a == 0 and per_replica // a >= 1]
    plans = [(per_replica, 1)] + ([(per_replica // splits[0], splits[0])] if splits else [])
    runs = []
    for micro, accum in plans:
        run = out / f"accum{accum}"
        args = [
            "--sweep",
            "precision",
            "--values",
            ",".join(precisions),
            "--model",
            model,
            "--impl",
            "native",
            "--batch-size",
            str(micro),
            "--option",
            f"grad_accum={accum}",
            "--interleave",
            "off",
            *BUDGET,
        ]
        runs.append(_launch_here(args, ranks, run, model, timeout_s))
    return runs


FSDP_CALIBRATED = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")  # HYBRID_SHARD needs 4 ranks


def fsdp_run(
    model: str,
    impls: list[str],
    precision: str,
    per_replica: int,
    out: Path,
    ranks: int,
    timeout_s: float = 600,
) -> Path:
    """The FSDP implementations' short run on ``ranks`` ranks here, at the DDP calibration's
    one micro-batch of ``per_replica`` samples and ``precision``."""
    args = [
        "--sweep",
        "sharding_strategy",
        "--values",
        ",".join(FSDP_CALIBRATED),
        "--model",
        model,
        "--impl",
        ",".join(impls),
        "--batch-size",
        str(per_replica),
        "--option",
        f"precision={precision}",
        "--interleave",
        "off",
        *BUDGET,
    ]
    return _launch_here(args, ranks, out / "fsdp", f"{model}'s FSDP", timeout_s)


def fsdp_extra(fsdp: Path, ddp: Path, precision: str) -> dict[str, float]:
    """Per FSDP point of the run (keyed "implementation strategy"), its computation per step
    less DDP's at the same micro-batch and precision (``ddp``: the one-micro-batch calibration
    run), at least 0."""
    base = _read(ddp)
    base = base[base["value"].astype(str) == precision]
    if base.empty:
        raise ValueError(f"the calibration run {ddp}: no {precision} point to compare FSDP with")
    ddp_ms = _computation_ms(base.iloc[0])
    return {
        f"{row['impl']} {row['value']}": max(0.0, _computation_ms(row) - ddp_ms)
        for _, row in _read(fsdp).iterrows()
    }


def ckpt_run(
    model: str, precision: str, per_replica: int, out: Path, ranks: int, timeout_s: float = 600
) -> Path:
    """DDP with activation checkpointing off and on, interleaved in one launch on ``ranks``
    ranks here, at the DDP calibration's one micro-batch of ``per_replica`` samples and
    ``precision``: what the machine does meanwhile falls on both alike. Three profiled steps
    each: the ratio is of the analyser's computation, which one step leaves noisy."""
    args = [
        "--sweep",
        "activation_checkpointing",
        "--values",
        "off,on",
        "--model",
        model,
        "--impl",
        "native",
        "--batch-size",
        str(per_replica),
        "--option",
        f"precision={precision}",
        "--interleave",
        "on",
        *BUDGET,
        "--profile-steps",
        "3",
    ]
    return _launch_here(args, ranks, out / "checkpointing", f"{model}'s checkpointing", timeout_s)


def ckpt_factor(run: Path, rate: Rate, optimiser_ms: float, recompute: float) -> float:
    """The checkpointed step's computation over the plain one's in ``run`` (``ckpt_run``; the
    optimiser's step, ``optimiser_ms``, left out of both as ``fit_rates`` leaves it out), over
    the ratio ``rate`` predicts for them: ``(recompute F / R + c) / (F / R + c)``, ``F`` the
    plain micro-batch's FLOPs (the harness's count), ``recompute`` the checkpointed
    micro-batch's FLOPs over the plain one's (the planner's count, its recomputation
    included)."""
    rows = _read(run)
    by = {str(v): r for v, r in zip(rows["value"], rows.to_dict("records"), strict=True)}
    if not {"off", "on"} <= set(by):
        raise ValueError(f"the calibration run {run}: no ok point with checkpointing off and on")
    off, on = (_computation_ms(by[v]) for v in ("off", "on"))
    o = optimiser_ms if min(off, on) > optimiser_ms else 0.0
    measured = (on - o) / (off - o)
    flops_ms = float(by["off"]["flops_per_step"]) / (rate.tflops * 1e12) * 1e3
    predicted = (recompute * flops_ms + rate.micro_ms) / (flops_ms + rate.micro_ms)
    return measured / predicted
