"""Peak throughput to measure model FLOPs utilisation (MFU) against: NVIDIA's datasheet figures
per GPU model and precision, and the MFU arithmetic. Shared by both sides: the running side
picks a point's peak, the reading side can say what a row's ``mfu_pct`` was measured against.

Every figure is a dense peak (no 2:4 structured sparsity): the datasheets print the Tensor Core
figures of Ampere and later with sparsity, marked with an asterisk; those are halved here. A
GPU absent from this table (or a precision its datasheet does not give, such as bf16 on a V100)
has no datasheet peak: its rows use the peak measured on the machine
(``bench/runner/flops.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The precisions a peak is given for: fp32 on CUDA cores, tf32 (fp32 matmuls on Tensor Cores,
# what torch does when float32 matmul precision is "high"), bf16 and fp16 on Tensor Cores.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


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

# First match wins: the more specific patterns (PCIe, NVL) come before the plain name.
DATASHEETS: tuple[GpuPeaks, ...] = (
    GpuPeaks("H100 PCIe", r"H100.*PCIe",
             {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}, _H100),
    # H100 NVL is left out: its datasheet figures were first printed per pair of cards.
    GpuPeaks("H100 SXM5", r"H100(?!.*(PCIe|NVL))",
             {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}, _H100),
    GpuPeaks("H200 NVL", r"H200.*NVL",
             {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}, _H200),
    GpuPeaks("H200 SXM", r"H200(?!.*NVL)",
             {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}, _H200),
    # The datasheet gives the same peaks for the SXM4 and PCIe cards, 40 and 80 GB.
    GpuPeaks("A100", r"A100",
             {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, _A100),
    GpuPeaks("V100S PCIe", r"V100S", {"fp32": 16.4, "fp16": 130.0}, _V100),
    GpuPeaks("V100 PCIe", r"V100-PCIE", {"fp32": 14.0, "fp16": 112.0}, _V100),
    GpuPeaks("V100 SXM2", r"V100-SXM2", {"fp32": 15.7, "fp16": 125.0}, _V100),
    GpuPeaks("L40S", r"L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
             "NVIDIA L40S GPU datasheet, nvidia.com/en-us/data-center/l40s"),
    GpuPeaks("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
             "NVIDIA L4 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/l4"),
    # "A10" only: the A10G (AWS) has no NVIDIA datasheet, so it uses the measured peak.
    GpuPeaks("A10", r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
             "NVIDIA A10 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/products/a10-gpu"),
    GpuPeaks("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0},
             "NVIDIA T4 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/tesla-t4"),
)  # fmt: skip


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


def mfu_pct(tflops_per_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B): the model FLOPs a
    device computed per second over its peak, in percent; NaN without both figures."""
    if not (peak_tflops > 0 and math.isfinite(tflops_per_s)):
        return math.nan
    return 100.0 * tflops_per_s / peak_tflops
