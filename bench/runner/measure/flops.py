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
one sample, times the batch. A multiply-add is 2 FLOPs (the counter's convention and PaLM's):
ResNet-50 counts 24.3 GFLOPs per 224 x 224 image forward and backward, where papers quote the
4.1 G multiply-adds of its forward pass. A workload's own ``flops_per_sample`` more than 3x
away from the count is used, with a warning naming both.

The peak is that of the precision torch runs the model's FLOPs in. An fp32 point on CUDA runs
its matmuls in TF32 where ``torch.backends.cuda.matmul.fp32_precision`` (or the legacy
``allow_tf32``, ``set_float32_matmul_precision("high")``) says so, off by default, and its cuDNN
convolutions where ``torch.backends.cudnn.conv.fp32_precision`` (legacy
``torch.backends.cudnn.allow_tf32``) does, on by default: a ResNet's fp32 point is a TF32 one.
The counter's FLOPs per op class decide which precision most of the model's FLOPs run in.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench.runfolder import peaks
from bench.runfolder.points import PointRecord
from bench.runner.measure.waterfall_columns import device_roofline
from bench.runner.session.distenv import synchronize
from parallel_kernels.checkpointing import checkpoint_mode, set_checkpointing
from parallel_kernels.facts import torch_dtype
from parallel_kernels.float8 import converts
from parallel_kernels.models import workload
from parallel_kernels.workload import Workload, stamp, to_device

MATMUL_REPS = 10  # timed matmuls per size after a warm-up one; the fastest is the peak
MATMUL_BUDGET_S = 1.0  # timed seconds per size at most: a slow precision (fp16 on a CPU) ends early
# Square matmul sizes, best of all: on CPUs the rate still grows past 1024 (here 1024^3 reached
# 0.09-0.12 TFLOP/s and 2048^3 0.14-0.21 with the same threads); 8192 is compute-bound on GPUs.
MATMUL_SIZES = {"cuda": (4096, 8192), "cpu": (512, 1024, 2048)}
STATED_OFF = 3.0  # a workload's flops_per_sample this many times off the count warns
OP_CLASSES = {"conv": "convolutions", "matmul": "matmuls"}  # the counter's ops, by class


def op_class(op: object) -> str:
    """The class of one of the counter's ops: "conv" for convolutions (forward and backward),
    "matmul" for the rest (mm, addmm, bmm, baddbmm, attention: cuBLAS or attention kernels)."""
    return "conv" if "convolution" in str(op) else "matmul"


@functools.cache
def load_counter() -> None:
    """Import what counting FLOPs imports, once per process: fake tensors and the counter's
    dispatch import torch._dynamo (1.4 CPU-s here, some 200 thousand objects), which
    ``collector.settled`` then sets aside before a point."""
    with FakeTensorMode(), FlopCounterMode(display=False):
        torch.ones(2, 2) @ torch.ones(2, 2)


def count_op_flops(
    wl: Workload, batch: int, device: torch.device | None = None, checkpointing: str = "off"
) -> dict[str, float]:
    """Forward and backward FLOPs of the plain model on a micro-batch of ``batch`` samples by
    op class (``op_class``), on ``device``, or None: on fake tensors; its blocks checkpointed
    as ``checkpointing`` says (a mode of the knob), backward's recomputation then counted."""
    fake = contextlib.nullcontext() if device else FakeTensorMode(allow_non_fake_inputs=True)
    cuda = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # the run's random state untouched
        inputs, targets = wl.batch(batch, 0)
        with fake, torch.device(device or "cpu"):
            model = set_checkpointing(stamp(wl.build(), wl), checkpointing)
    if device is not None:
        model = model.to(device)
        inputs, targets = to_device(inputs, device), to_device(targets, device)
    with fake, FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        wl.compute_loss(wl.forward(model, inputs), targets).backward()
    by_class: dict[str, float] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        by_class[op_class(op)] = by_class.get(op_class(op), 0.0) + float(n)
    return by_class


def count_flops(wl: Workload, batch: int, device: torch.device | None = None) -> float:
    """Forward and backward FLOPs of the plain model on a micro-batch of ``batch`` samples, on
    ``device``, or None: on fake tensors."""
    return float(sum(count_op_flops(wl, batch, device).values()))


@dataclass(frozen=True)
class MicroBatch:
    flops: float  # one micro-batch's model FLOPs: the workload's figure, else the count
    source: str  # what flops_source says: workload, counted, or uncounted: why
    by_class: dict[str, float] = field(default_factory=dict)  # counted FLOPs per op class


def _counted(wl: Workload, batch: int, device: torch.device) -> tuple[dict[str, float], str]:
    """(The counter's FLOPs per op class, "counted"), or ({}, "uncounted: why")."""
    try:
        return count_op_flops(wl, batch), "counted"
    except Exception:  # noqa: BLE001  (a model that reads its data: count it for real below)
        pass
    try:  # FLOPs grow linearly with the batch: one sample keeps the extra copy small
        return {k: v * batch for k, v in count_op_flops(wl, 1, device).items()}, "counted"
    except Exception as e:  # noqa: BLE001  (MFU is a figure of the row, not a reason to fail it)
        return {}, f"uncounted: {type(e).__name__}: {e}".splitlines()[0][:200]


def stated_source(wl: Workload, counted_per_sample: float) -> str:
    """``flops_source`` of a workload that states its FLOPs per sample: "workload", naming the
    counter's figure (and warning) where the two are more than ``STATED_OFF`` times apart, the
    mark of a forward-only figure or of multiply-adds counted as one FLOP."""
    stated = wl.flops_per_sample
    if not counted_per_sample > 0 or 1 / STATED_OFF <= stated / counted_per_sample <= STATED_OFF:
        return "workload"
    warnings.warn(
        f"{wl.name}: flops_per_sample is {stated:.3g}, the FLOP counter finds "
        f"{counted_per_sample:.3g} per sample ({stated / counted_per_sample:.2g}x): "
        f"flops_per_sample is forward plus backward, a multiply-add counted as 2 FLOPs "
        f"(ResNet-50: 24.3e9 per 224 x 224 image); MFU uses the stated figure",
        stacklevel=2,
    )
    return f"workload ({stated / counted_per_sample:.2g}x the counter's {counted_per_sample:.3g})"


def micro_batch_count(wl: Workload, batch: int, device: torch.device) -> MicroBatch:
    """One micro-batch's FLOPs, their source and the counter's FLOPs per op class (counted
    even where the workload states its figure: the op classes decide the peak's precision)."""
    by_class, source = _counted(wl, batch, device)
    total = sum(by_class.values()) if by_class else math.nan
    if wl.flops_per_sample is None:
        return MicroBatch(total, source, by_class)
    return MicroBatch(wl.flops_per_sample * batch, stated_source(wl, total / batch), by_class)


def micro_batch_flops(wl: Workload, batch: int, device: torch.device) -> tuple[float, str]:
    """(FLOPs of one micro-batch, where the figure comes from: ``workload`` when the workload
    states its FLOPs per sample, ``counted``, or ``uncounted: why``)."""
    count = micro_batch_count(wl, batch, device)
    return count.flops, count.source


@functools.cache
def _micro_batch(model: str, batch: int, device: torch.device) -> MicroBatch:
    return micro_batch_count(workload(model), batch, device)  # once per model and batch


def _micro_batches_per_rank(point: PointRecord) -> float:
    """Every replica's micro-batches of a step, shared by the step's ranks (a tensor-parallel
    group computes one replica's FLOPs together); PaLM's MFU divides the model's FLOPs by the
    number of devices alike."""
    return int(point.knobs["grad_accum"]) * point.dp_size / point.world_size


def step_flops(point: PointRecord, device: torch.device) -> tuple[float, str]:
    """(Model FLOPs of one optimiser step per rank, their source)."""
    micro = _micro_batch(point.model, point.batch_per_replica, device)
    return micro.flops * _micro_batches_per_rank(point), micro.source


@functools.cache
def _recomputed(model: str, batch: int, checkpointing: str, device: torch.device) -> float:
    """FLOPs a micro-batch recomputes in backward under ``checkpointing``: its count on fake
    tensors with the mode applied, less the plain count the row's FLOPs come from
    (``_micro_batch``); NaN where the model cannot run on fake tensors (the figure is the
    row's, never a reason to fail it)."""
    if checkpoint_mode(checkpointing).every == 0:
        return 0.0
    plain = _micro_batch(model, batch, device).by_class
    try:
        checkpointed = count_op_flops(workload(model), batch, checkpointing=checkpointing)
    except Exception:  # noqa: BLE001
        return math.nan
    return float(sum(checkpointed.values()) - sum(plain.values())) if plain else math.nan


def recompute_flops(point: PointRecord, device: torch.device) -> float:
    """FLOPs per step per rank that activation checkpointing recomputes (0 with it off)."""
    mode = point.knobs["activation_checkpointing"]
    micro = _recomputed(point.model, point.batch_per_replica, mode, device)
    return micro * _micro_batches_per_rank(point)


def _tf32(new: Callable[[], str], legacy: Callable[[], bool]) -> bool:
    """Whether an op class runs fp32 in TF32: the new API's setting where torch has one (2.9 and
    later; "none" inherits, and what a getter gives is resolved: only "tf32" is TF32), else the
    legacy flag. Neither may raise here: in torch 2.13 a legacy getter raises ("a mix of the
    legacy and new APIs") once the new API has set a value it cannot express."""
    try:
        return new() == "tf32"
    except (AttributeError, RuntimeError):  # torch before 2.9: no fp32_precision
        pass
    try:
        return bool(legacy())
    except RuntimeError:  # mixed settings that no getter can read: take the default, IEEE
        return False


def tf32_ops() -> dict[str, bool]:
    """Which op classes run fp32 in TF32 on CUDA now: cuBLAS's matmuls and cuDNN's
    convolutions (torch.backends.cuda.matmul, torch.backends.cudnn.conv)."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    return {
        "matmul": _tf32(lambda: cuda.matmul.fp32_precision, lambda: cuda.matmul.allow_tf32),
        "conv": _tf32(lambda: cudnn.conv.fp32_precision, lambda: cudnn.allow_tf32),
    }


def fp32_precision(by_class: dict[str, float], tf32: dict[str, bool]) -> tuple[str, str]:
    """(The peak's precision for an fp32 point on CUDA, why): tf32 where most of the counted
    FLOPs run in TF32, else fp32; a model with no count takes tf32 where any op class runs in
    TF32, the faster peak (MFU against it may be low, never impossible). A mix such as a
    vision transformer whose patch convolution runs in TF32 and its matmuls in fp32 takes the
    precision of most of its FLOPs."""
    total = sum(by_class.values())
    if not total > 0:
        used = [OP_CLASSES[op] for op, on in tf32.items() if on]
        if used:
            return "tf32", f"fp32 point, FLOPs uncounted: {' and '.join(used)} in TF32"
        return "fp32", "fp32 point: matmuls and convolutions in IEEE fp32"
    in_tf32 = sum(f for op, f in by_class.items() if tf32.get(op)) / total
    shares = ", ".join(
        f"{OP_CLASSES[op]} {100 * f / total:.3g} % in {'TF32' if tf32.get(op) else 'IEEE fp32'}"
        for op, f in sorted(by_class.items(), key=lambda kv: -kv[1])
        if f > 0
    )
    why = f"fp32 point, shares of the counted FLOPs: {shares}"
    return ("tf32" if in_tf32 > 0.5 else "fp32"), why


def peak_precision(
    point: PointRecord, device: torch.device, by_class: dict[str, float]
) -> tuple[str, str]:
    """(The precision the point's FLOPs run in, why; empty but for fp32 on CUDA): its
    ``precision`` knob, where fp32 on CUDA may be TF32 (``fp32_precision``)."""
    precision = point.knobs.get("precision", "fp32")
    if converts(precision):  # no fp8 peak in the tables: torchtitan reports float8 against bf16
        if device.type == "cuda":
            return "bf16", "fp8 point: against the bf16 peak, as torchtitan reports float8 runs"
        return "fp32", "fp8 point emulated: its matmuls run in fp32"
    if precision != "fp32" or device.type != "cuda":
        return precision, ""
    return fp32_precision(by_class, tf32_ops())


@contextlib.contextmanager
def _matmuls_in(precision: str, device: torch.device) -> Iterator[None]:
    """fp32 matmuls in TF32 for a tf32 measurement on CUDA (a conv model's fp32 point runs in
    TF32 while its matmuls need not), the setting given back after. cuBLAS reads the new API's
    value itself (``float32Precision(CUDA, MATMUL)``), so no legacy check runs in between."""
    matmul = torch.backends.cuda.matmul
    if precision != "tf32" or device.type != "cuda" or tf32_ops()["matmul"]:
        yield
        return
    new = hasattr(matmul, "fp32_precision")
    name, on = ("fp32_precision", "tf32") if new else ("allow_tf32", True)
    old = getattr(matmul, name)
    setattr(matmul, name, on)
    try:
        yield
    finally:
        setattr(matmul, name, old)


def _matmul_s(device: torch.device, precision: str, n: int) -> float:
    """The fastest of up to ``MATMUL_REPS`` timed ``n``^3 matmuls after a warm-up one, in
    ``MATMUL_BUDGET_S`` of timed matmuls at most."""
    gen = torch.Generator(device=device).manual_seed(0)  # random data: constant data runs
    a, b = (
        torch.randn(n, n, device=device, generator=gen).to(torch_dtype(precision)) for _ in range(2)
    )  # faster on GPUs (less power drawn)
    best, spent = math.inf, 0.0
    with _matmuls_in(precision, device):
        for rep in range(MATMUL_REPS + 1):
            synchronize(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            synchronize(device)
            took = time.perf_counter() - t0
            if rep or took > MATMUL_BUDGET_S:  # the warm-up, where it is all there is time for
                best, spent = min(best, took), spent + took
            if spent > MATMUL_BUDGET_S:
                break
    return best


@functools.cache
def measured_peak(device: torch.device, precision: str) -> peaks.Peak:
    """This device's best rate on square matmuls in ``precision`` over a few sizes, with the
    threads this process has (once per process: every rank measures at the same time, as they
    train). A size whose one matmul took more than an eighth of the budget is the last: the
    next, twice as large, takes eight times as long."""
    rates = {}
    for n in MATMUL_SIZES.get(device.type, MATMUL_SIZES["cuda"]):
        took = _matmul_s(device, precision, n)
        rates[n] = 2 * n**3 / took / 1e12
        if took > MATMUL_BUDGET_S / 8:
            break
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the next point's memory figures start from what they did
    best = max(rates, key=rates.get)
    sizes = ", ".join(f"{n}^3" for n in rates)
    return peaks.Peak(rates[best], f"measured: {precision} matmul {best}^3 (best of {sizes})")


def device_peak(device: torch.device, precision: str) -> peaks.Peak:
    """This device's measured peak in ``precision``: on a CPU, that of this host's roofline
    profile where it has the precision (measured once per host and read from its cache: the
    ceiling the waterfall prices against, and no matmuls on every launch), else the matmuls'
    best rate measured in this process (``measured_peak``)."""
    if device.type != "cuda":
        roofline, what = device_roofline(device)
        if roofline is not None and precision in roofline.peak_tflops:
            return peaks.Peak(
                roofline.peak_tflops[precision], f"measured: {precision} peak of {what}"
            )
    return measured_peak(device, precision)


def point_peaks(point: PointRecord, device: torch.device) -> tuple[peaks.Peak, peaks.Peak]:
    """(The peak MFU is against, the measured one): a GPU's datasheet peak at the precision
    the point's FLOPs run in where the table has it, else the measured one, which says so. The
    model is counted first (its op classes decide an fp32 point's precision, and a workload
    that sets torch's precision as it builds has done so), before it holds memory."""
    micro = _micro_batch(point.model, point.batch_per_replica, device)
    precision, why = peak_precision(point, device, micro.by_class)
    measured = device_peak(device, precision)
    used = measured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        sheet = peaks.datasheet_peak(name, precision)
        used = sheet or peaks.Peak(
            measured.tflops,
            f"{measured.source}; {name} has no "
            f"{precision} datasheet peak here: a measured peak, not "
            f"the datasheet MFU torchtitan or Lightning report",
        )
    if why:
        used = peaks.Peak(used.tflops, f"{used.source}; {why}")
    return used, measured


def figures(
    point: PointRecord, device: torch.device, step_s: float, peak: tuple[peaks.Peak, peaks.Peak]
) -> dict:
    """The row's FLOPs columns on this rank, ``step_s`` its timed steps' mean time (the mean,
    as ``samples_per_s``); ``mfu_pct`` is made from the ranks' figures (``utilisation``)."""
    flops, source = step_flops(point, device)
    used, measured = peak
    return {
        "flops_per_step": flops,
        "recompute_flops_per_step": recompute_flops(point, device),
        "flops_source": source,
        "tflops_per_s": flops / step_s / 1e12,
        "peak_tflops": used.tflops,
        "peak_source": used.source,
        "peak_tflops_measured": measured.tflops,
    }


def utilisation(row: dict) -> dict:
    """``mfu_pct`` from a point's aggregated figures (empty for a row without them); where the
    rate exceeds the peak, no figure, and ``peak_source`` says the peak cannot be right."""
    if "tflops_per_s" not in row:
        return {}
    mfu, source = peaks.checked_mfu(
        row["tflops_per_s"], row["peak_tflops"], row.get("peak_source") or ""
    )
    out = {"mfu_pct": mfu}
    if source != row.get("peak_source"):
        out["peak_source"] = source
    return out
