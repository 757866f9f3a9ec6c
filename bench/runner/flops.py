"""FLOPs of a point's training step, and the peak a device reaches, for model FLOPs utilisation.

MFU as PaLM defines it (Chowdhery et al. 2022, appendix B): the model's FLOPs per second over
the devices' peak. Model FLOPs are those of the forward and backward passes the model needs,
whatever the implementation does: no activation recomputation (that would be hardware FLOPs
utilisation), no optimiser step, no communication. So they are counted on the plain model,
not the wrapped one: one count serves DDP, FSDP and tensor parallelism alike, and wrappers,
DTensors and checkpointing cannot change it. ``torch.utils.flop_counter.FlopCounterMode``
counts the matmuls, convolutions and attention (the ops it has formulas for; element-wise ops
are left out, as in the analytical counts).

The count runs on fake tensors (``FakeTensorMode``: shapes only, no memory, no arithmetic; the
mode ``torch.export`` traces with, which Hugging Face models know to skip their data-dependent
checks under), attention in its math form, whose two batched matmuls the counter knows on every
device (it has no formula for the fused CPU kernel). A model that reads its data (``.item()``,
data-dependent shapes) cannot run on fake tensors; it is counted once on the run's device with
one sample, times the batch.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench.runfolder import peaks
from bench.runfolder.points import PointRecord
from bench.runner.distenv import synchronize
from parallel_kernels.models import workload
from parallel_kernels.workload import Workload, to_device

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}  # fmt: skip
MATMUL_REPS = 10  # timed matmuls after a warm-up one; the fastest is the peak


def count_flops(wl: Workload, batch: int, device: torch.device | None = None) -> float:
    """Forward and backward FLOPs of the plain model on a micro-batch of ``batch`` samples, on
    ``device``, or None: on fake tensors."""
    fake = contextlib.nullcontext() if device else FakeTensorMode(allow_non_fake_inputs=True)
    cuda = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # the run's random state untouched
        inputs, targets = wl.batch(batch, 0)
        with fake, torch.device(device or "cpu"):
            model = wl.build()
    if device is not None:
        model = model.to(device)
        inputs, targets = to_device(inputs, device), to_device(targets, device)
    with fake, FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        wl.compute_loss(wl.forward(model, inputs), targets).backward()
    return float(counter.get_total_flops())


def micro_batch_flops(wl: Workload, batch: int, device: torch.device) -> tuple[float, str]:
    """(FLOPs of one micro-batch, where the figure comes from: ``workload`` when the workload
    states its FLOPs per sample, ``counted``, or ``uncounted: why``)."""
    if wl.flops_per_sample is not None:
        return wl.flops_per_sample * batch, "workload"
    try:
        return count_flops(wl, batch), "counted"
    except Exception:  # noqa: BLE001  (a model that reads its data: count it for real below)
        pass
    try:  # FLOPs grow linearly with the batch: one sample keeps the extra copy small
        return count_flops(wl, 1, device) * batch, "counted"
    except Exception as e:  # noqa: BLE001  (MFU is a figure of the row, not a reason to fail it)
        return math.nan, f"uncounted: {type(e).__name__}: {e}".splitlines()[0][:200]


@functools.cache
def _micro_batch(model: str, batch: int, device: torch.device) -> tuple[float, str]:
    return micro_batch_flops(workload(model), batch, device)  # once per model and batch


def step_flops(point: PointRecord, device: torch.device) -> tuple[float, str]:
    """(Model FLOPs of one optimiser step per rank, their source): every replica's
    micro-batches, shared by the step's ranks (a tensor-parallel group computes one replica's
    FLOPs together); PaLM's MFU divides the model's FLOPs by the number of devices alike."""
    micro, source = _micro_batch(point.model, point.batch_per_replica, device)
    return micro * int(point.knobs["grad_accum"]) * point.dp_size / point.world_size, source


def matmul_precision(point: PointRecord, device: torch.device) -> str:
    """The precision the point's matmuls run in: its ``precision`` knob, where fp32 on CUDA is
    TF32 when torch allows it (``torch.backends.cuda.matmul.allow_tf32``, set by
    ``torch.set_float32_matmul_precision("high")``; off by default)."""
    precision = point.knobs.get("precision", "fp32")
    if precision == "fp32" and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return precision


@functools.cache
def measured_peak(device: torch.device, precision: str) -> peaks.Peak:
    """This device's best rate on a large square matmul in ``precision``, with the threads this
    process has (once per process: every rank measures at the same time, as they train)."""
    n = 8192 if device.type == "cuda" else 1024  # large enough to be compute-bound
    gen = torch.Generator(device=device).manual_seed(0)  # random data: constant data runs
    a, b = (torch.randn(n, n, device=device, generator=gen).to(DTYPES[precision])
            for _ in range(2))  # faster on GPUs (less power drawn)  # fmt: skip
    best = math.inf
    for _ in range(MATMUL_REPS + 1):
        synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    del a, b
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the next point's memory figures start from what they did
    return peaks.Peak(2 * n**3 / best / 1e12, f"measured: {precision} matmul {n}^3")


def point_peaks(point: PointRecord, device: torch.device) -> tuple[peaks.Peak, peaks.Peak]:
    """(The peak MFU is against, the measured one): a GPU's datasheet peak at the point's
    precision where the table has it, else the measured one. Taken before the point's model
    holds memory."""
    precision = matmul_precision(point, device)
    measured = measured_peak(device, precision)
    sheet = None
    if device.type == "cuda":
        sheet = peaks.datasheet_peak(torch.cuda.get_device_name(device), precision)
    return sheet or measured, measured


def figures(point: PointRecord, device: torch.device, step_s: float,
            peak: tuple[peaks.Peak, peaks.Peak]) -> dict:  # fmt: skip
    """The row's FLOPs columns on this rank, ``step_s`` its timed steps' mean time (the mean,
    as ``samples_per_s``); ``mfu_pct`` is made from the ranks' figures (``utilisation``)."""
    flops, source = step_flops(point, device)
    used, measured = peak
    return {
        "flops_per_step": flops,
        "flops_source": source,
        "tflops_per_s": flops / step_s / 1e12,
        "peak_tflops": used.tflops,
        "peak_source": used.source,
        "peak_tflops_measured": measured.tflops,
    }


def utilisation(row: dict) -> dict:
    """``mfu_pct`` from a point's aggregated figures (empty for a row without them)."""
    if "tflops_per_s" not in row:
        return {}
    return {"mfu_pct": peaks.mfu_pct(row["tflops_per_s"], row["peak_tflops"])}
