"""Which roofline a plan prices its ops on, and its calibration by measured steps of the model.

The target's profile: ``--device-profile FILE`` where given; else a GPU's stated profile
(``bench.roofline.datasheet``), or this host's measured one for ``--device cpu``
(``bench.roofline.measure``, measured once per host and cached). A measured run of the model
(``--compute RUN``, or a CPU plan's calibration launch) calibrates it: each precision's DDP
point of one micro-batch, its ops priced on the roofline of the device it ran on, fits one
factor on the efficiencies (``op_prices.fit_scale``), which the target's profile then takes,
as the fitted rates took the ratio of the peaks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pandas as pd

from bench.plan.memory import Counting, step_ops
from bench.plan.op_mix import COMPUTE, OpMix
from bench.plan.op_prices import Pricing, fit_scale, fit_with_micro, priced
from bench.plan.rates import Rate, computation_ms
from bench.plan.request import PlanRequest
from bench.roofline.profile import Roofline, RooflineError
from bench.runfolder.peaks import PRECISIONS
from bench.runfolder.points import RunFolderError
from bench.runfolder.schema import read_meta
from parallel_kernels.compiling import EAGER, compiles
from parallel_kernels.compiling import MODES as COMPILE_MODES
from parallel_kernels.float8 import FP8


def target_roofline(request: PlanRequest) -> Roofline | None:
    """The profile the plan's ops are priced on; None for a GPU the datasheets do not state
    (its computation is then the peak times an assumed MFU)."""
    if request.device_profile is not None:
        return request.device_profile
    if request.device.gpu_name:
        from bench.roofline.datasheet import datasheet_profile

        return datasheet_profile(request.device.gpu_name)
    from bench.roofline.measure import host_profile

    return host_profile("cpu")


def check_precisions(roofline: Roofline, precisions: tuple[str, ...]) -> None:
    """A one-line ValueError where the profile has no figures for a precision planned."""
    for p in precisions:
        try:
            roofline.precision(p)
        except RooflineError as e:
            raise ValueError(f"the roofline of {roofline.source}: {e}") from None


def stated(roofline: Roofline, precisions: tuple[str, ...]) -> dict[str, Rate]:
    """Each precision's rate: the profile as it is, its ops priced one by one."""
    pricing = Pricing(roofline, 1.0, f"roofline: {roofline.source}")
    return {p: _rate(pricing, p) for p in precisions}


def _rate(pricing: Pricing, precision: str) -> Rate:
    peak = pricing.roofline.peak_tflops[pricing.roofline.precision(precision)]
    return Rate(peak, 0.0, pricing.source, pricing=pricing)


def lever_key(precision: str, mode: str) -> str:
    """The rates' key of a point at ``precision`` compiled as ``mode``: the precision alone
    where eager (``calibration.Target.rate_for``)."""
    return f"{precision}, compile={mode}" if compiles({"compile": mode}) else precision


def row_levers(row) -> tuple[str, str]:
    """(precision, compile) of a results row: fp8 where its matmuls were float8, else the
    sweep's value where that names a precision (a precision sweep), else its matmuls'; its
    ``compile`` column (off where the run predates it)."""
    value, matmuls = str(row["value"]), str(row.get("matmul_precision", "") or "")
    mode = str(row.get("compile") or EAGER)
    mode = mode if mode in COMPILE_MODES else EAGER
    if matmuls == FP8:
        return FP8, mode
    return (value if value in PRECISIONS else matmuls or "fp32"), mode


def row_ops(row, gpu: bool, accum: int = 1) -> OpMix:
    """The ops of a results row of DDP (its model, samples per replica, precision and compile,
    ``row_levers``) in ``accum`` micro-batches, the optimiser's step once (``gpu``:
    foreach)."""
    micro = int(row["batch_per_replica"]) // accum
    precision, mode = row_levers(row)
    of = Counting(str(row["model"]), False, None, precision, gpu, mode)
    ops = step_ops(of, micro)
    return ops.of(("optimiser",)).plus(ops.of(COMPUTE), accum)


def row_scale(row, roofline: Roofline, gpu: bool) -> float:
    """The factor on ``roofline``'s efficiencies that a results row of DDP in one micro-batch
    gives: its measured computation over its ops, the optimiser's step among them."""
    return fit_scale(row_ops(row, gpu), computation_ms(row), roofline)


def calibrated_rates(
    ones: pd.DataFrame,
    target: Roofline,
    measured_on: Roofline,
    where: str,
    gpu: bool,
    accumulated: Mapping[str, tuple[int, float]] | None = None,
) -> dict[str, Rate]:
    """Per precision of ``ones`` (DDP points of one micro-batch, a row each), ``target``'s
    profile at the factor its row gives on ``measured_on`` (the profile of the device they ran
    on; ``gpu``: a GPU's), and where ``accumulated`` has the precision (the micro-batches of
    the same samples accumulated, and their step's difference), the cost of a micro-batch
    beyond its ops (``op_prices.fit_with_micro``)."""
    out = {}
    for _, row in ones.iterrows():
        precision, mode = row_levers(row)
        p = lever_key(precision, mode)
        scale, micro = row_scale(row, measured_on, gpu), 0.0
        if p in (accumulated or {}):
            a, delta = accumulated[p]
            one, many = row_ops(row, gpu), row_ops(row, gpu, a)
            scale, micro = fit_with_micro(one, many, a, computation_ms(row), delta, measured_on)
        about = f"roofline calibrated by {where} (efficiencies x{scale:.3g} of {target.source}"
        about += f"; {micro:.2f} ms per micro-batch beyond its ops)" if micro else ")"
        out[p] = replace(_rate(Pricing(target, scale, about), precision), micro_ms=micro)
    return out


def run_roofline(run: Path, target: Roofline, gpu_name: str) -> tuple[Roofline, bool]:
    """The profile of the device ``run`` ran on (the target's where it is the target's GPU,
    this host's for a CPU, else the datasheet's), and whether it is a GPU's."""
    try:
        meta = read_meta(run)
    except RunFolderError as e:
        raise ValueError(f"--compute {run}: {e}") from None
    name = str(meta.get("device_name", ""))
    if meta.get("device") != "cuda":
        from bench.roofline.measure import host_profile

        return host_profile("cpu"), False
    if name == gpu_name:
        return target, True
    from bench.roofline.datasheet import datasheet_profile

    profile = datasheet_profile(name)
    if profile is None:
        raise ValueError(f"--compute {run}: no roofline for {name!r}, the GPU it ran on")
    return profile, True


def ckpt_ratio(
    model: str, micro_batch: int, precision: str, rate: Rate, mode: str = "full"
) -> float:
    """A micro-batch checkpointed in ``mode``: its computation over a plain one's, as their ops
    price on the rate's roofline with its cost per micro-batch (its recomputation: what
    ``rates.ckpt_factor`` measures against)."""
    on, off = (
        priced(
            step_ops(Counting(model, ckpt, None, precision), micro_batch).of(COMPUTE), rate.pricing
        )
        for ckpt in (mode, "off")
    )
    return (on.total_ms + rate.micro_ms) / (off.total_ms + rate.micro_ms)


def priced_optimiser_ms(model: str, micro_batch: int, precision: str, pricing: Pricing) -> float:
    """AdamW's step over the whole model, as its ops price."""
    ops = step_ops(Counting(model, False, None, precision), micro_batch)
    return priced(ops.of(("optimiser",)), pricing).total_ms
