"""Peak throughput to measure model FLOPs utilisation (MFU) against: NVIDIA's datasheet figures
per GPU model and precision, and the MFU arithmetic. Shared by both sides: the running side
picks a point's peak, the reading side can say what a row's ``mfu_pct`` was measured against.

Every figure is a dense peak (no 2:4 structured sparsity): the datasheets print the Tensor Core
figures of Ampere and later with sparsity, marked with an asterisk; those are halved here. A
GPU absent from this table (or a precision its datasheet does not give, such as bf16 on a V100)
has no datasheet peak: its rows use the peak measured on the machine
(``bench/runner/measure/flops.py``), and say so, since that is not the MFU torchtitan or Lightning
report (both divide by a table of datasheet peaks).

An MFU above 100 % is not a figure: the model cannot compute faster than the device's peak, so
the peak is wrong (a precision torch does not run, a GPU the table mistakes for another). Such
a row has no ``mfu_pct`` and its ``peak_source`` says so, naming the peak it was against.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The precisions a peak is given for: fp32 on CUDA cores, tf32 (fp32 matmuls on Tensor Cores,
# what torch does when float32 matmul precision is "high"), bf16 and fp16 on Tensor Cores, and
# fp8 (float8 e4m3/e5m2 on the Tensor Cores of Hopper and Blackwell: twice bf16's rate, the
# datasheets' FP8 figure halved as its sparse one is), what the planner prices float8 matmuls at.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GpuPeaks:
    gpu: str  # as the datasheet names it
    pattern: str  # a regular expression matched against torch.cuda.get_device_name()
    tflops: dict[str, float]  # dense TFLOP/s per precision
    source: str  # the datasheet

    def matches(self, device_name: str) -> bool:
        return re.search(self.pattern, device_name, re.IGNORECASE) is not None


_H100 = "NVIDIA H100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h100"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/a100"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/v100"
# The HGX page gives an 8-GPU board's totals (600 TFLOPS fp32, 18 PFLOPS tf32 and 36 PFLOPS
# fp16/bf16 and 72 PFLOPS fp8 with sparsity, the same for B200 and B300): per GPU an eighth,
# Tensor Cores halved.
_HGX = "NVIDIA HGX platform specifications (8-GPU totals / 8), nvidia.com/en-us/data-center/hgx"
# The GB200 NVL72 page's "Individual Blackwell GPU Specifications", GB200 column (its GPUs run
# at up to 1200 W, the HGX B200's at 1000 W: faster figures than the B200's).
_GB200 = "NVIDIA GB200 NVL72 specifications, per GPU, nvidia.com/en-us/data-center/gb200-nvl72"

# First match wins: the more specific patterns (PCIe, NVL, the Grace superchips' G prefix) come
# before the plain name, and a plain name refuses the G before it (GH200 is not an H200).
DATASHEETS: tuple[GpuPeaks, ...] = (
    GpuPeaks(
        "GB200",
        r"GB200",
        {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
        _GB200,
    ),
    GpuPeaks(
        "B200",
        r"(?<!G)B200",
        {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        _HGX,
    ),
    # Blackwell Ultra: more fp4 and less fp64 than the B200, the same fp32, tf32 and bf16.
    # GB300 is left out: NVIDIA prints its rack's totals without tf32.
    GpuPeaks(
        "B300",
        r"(?<!G)B300",
        {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        _HGX,
    ),
    GpuPeaks(
        "H100 PCIe",
        r"H100.*PCIe",
        {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
        _H100,
    ),
    # The datasheet's H100 NVL column, per card (its first edition printed a pair of cards).
    GpuPeaks(
        "H100 NVL",
        r"H100.*NVL",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        _H100,
    ),
    GpuPeaks(
        "H100 SXM5",
        r"H100(?!.*(PCIe|NVL))",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        _H100,
    ),
    # Grace Hopper: its H100's figures are the H100 SXM5's (the GH200 datasheet's 67 TFLOPS
    # fp32, 989 tf32 and 1,979 bf16 with sparsity), whether 96 GB HBM3 or 144 GB HBM3e.
    GpuPeaks(
        "GH200",
        r"GH200",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        "NVIDIA GH200 Grace Hopper Superchip datasheet, "
        "nvidia.com/en-us/data-center/grace-hopper-superchip",
    ),
    GpuPeaks(
        "H200 NVL",
        r"(?<!G)H200.*NVL",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        _H200,
    ),
    GpuPeaks(
        "H200 SXM",
        r"(?<!G)H200(?!.*NVL)",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        _H200,
    ),
    # The datasheet gives the same peaks for the SXM4 and PCIe cards, 40 and 80 GB; "A100"
    # alone (not the RTX A1000, a workstation card).
    GpuPeaks(
        "A100", r"A100(?!\d)", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, _A100
    ),
    GpuPeaks("V100S PCIe", r"V100S", {"fp32": 16.4, "fp16": 130.0}, _V100),
    GpuPeaks("V100 PCIe", r"V100-PCIE", {"fp32": 14.0, "fp16": 112.0}, _V100),
    GpuPeaks("V100 SXM2", r"V100-SXM2", {"fp32": 15.7, "fp16": 125.0}, _V100),
    GpuPeaks(
        "L40S",
        r"L40S",
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
        "NVIDIA L40S GPU datasheet, nvidia.com/en-us/data-center/l40s",
    ),
    # The L40's Tensor Cores run tf32 at its fp32 rate (90.5 | 181 with sparsity).
    GpuPeaks(
        "L40",
        r"\bL40\b",
        {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05},
        "NVIDIA L40 GPU datasheet, nvidia.com/en-us/data-center/l40",
    ),
    GpuPeaks(
        "L4",
        r"\bL4\b",
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
        "NVIDIA L4 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/l4",
    ),
    GpuPeaks(
        "A10",
        r"\bA10\b",
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        "NVIDIA A10 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/products/a10-gpu",
    ),
    # AWS's A10G (G5 instances) has no NVIDIA datasheet: the figures AWS's partners print
    # (Baseten's A10 vs A10G table), which are GA102's arithmetic at 80 SMs and 1.71 GHz: 128
    # fp32 lanes per SM (35 TFLOPS), and the GeForce rate of fp16/bf16 Tensor Core math with
    # fp32 accumulation, 512 FLOPs per SM per clock (70 TFLOPS; tf32 half that), not the A10's.
    GpuPeaks(
        "A10G",
        r"\bA10G\b",
        {"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},
        "no NVIDIA datasheet: Baseten's A10 vs A10G table, baseten.co/blog/"
        "nvidia-a10-vs-a10g-for-ml-model-inference, = 80 SMs x 1.71 GHz",
    ),
    GpuPeaks(
        "T4",
        r"\bT4\b",
        {"fp32": 8.1, "fp16": 65.0},
        "NVIDIA T4 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/tesla-t4",
    ),
)


@dataclass(frozen=True)
class Peak:
    tflops: float
    source: str  # what results.csv's peak_source says


def datasheet_peak(device_name: str, precision: str) -> Peak | None:
    """The dense datasheet peak of the GPU ``device_name`` names, at ``precision``; None where
    the table has no such GPU or its datasheet no such precision. tf32 on a GPU without TF32
    (V100, T4) is plain fp32: torch's setting changes nothing there."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)})")
    for row in DATASHEETS:
        if row.matches(device_name):
            key = "fp32" if precision == "tf32" and "tf32" not in row.tflops else precision
            if key not in row.tflops:
                return None
            return Peak(row.tflops[key], f"datasheet: {row.gpu} {key} dense ({row.source})")
    return None


# How a row's peak_source starts where the model's rate exceeds the peak, the peak's own after.
IMPOSSIBLE = "impossible peak (the model computed faster than it, so it cannot be right): "


def mfu_pct(tflops_per_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B): the model FLOPs a
    device computed per second over its peak, in percent; NaN without both figures."""
    if not (peak_tflops > 0 and math.isfinite(tflops_per_s)):
        return math.nan
    return 100.0 * tflops_per_s / peak_tflops


def checked_mfu(tflops_per_s: float, peak_tflops: float, source: str) -> tuple[float, str]:
    """(``mfu_pct``, ``peak_source``): the MFU and the peak's source, or, where the model's rate
    exceeds the peak, NaN and a source that says the peak cannot be right and which it was."""
    mfu = mfu_pct(tflops_per_s, peak_tflops)
    if mfu > 100.0:
        return math.nan, IMPOSSIBLE + source
    return mfu, source
