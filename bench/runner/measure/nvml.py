"""NVML's GPU utilisation, read between the timed steps: a second opinion beside the
utilisation computed from the trace's kernels.

NVML reports the fraction of time in its last sample period (1/6 s to 1 s, by the GPU) during
which any kernel ran, so it counts the same thing as |union of kernels| / window, by other
means. It is read between steps, in the untimed gap before each step's barrier, and not by a
sampling thread: a thread would take the interpreter lock from the timed steps' Python.
``torch.cuda.utilization`` asks NVML (package nvidia-ml-py, the ``gpu`` extra) and maps
CUDA_VISIBLE_DEVICES itself. Without CUDA or without NVML the figure is NaN: absent, never zero.
"""

from __future__ import annotations

import math
import time

import torch


class NvmlSampler:
    """``s.sample()`` between steps (at most once per ``interval_s``), then ``s.mean_pct``."""

    def __init__(self, device: torch.device, interval_s: float = 0.02) -> None:
        self.device, self.interval_s = device, interval_s
        self.samples: list[float] = []
        self._last = -math.inf
        self.available = device.type == "cuda" and self._probe()

    def _probe(self) -> bool:
        try:
            torch.cuda.utilization(self.device)
        except Exception:  # noqa: BLE001  (no pynvml, no driver access: no second opinion)
            return False
        return True

    def sample(self) -> None:
        now = time.monotonic()
        if self.available and now - self._last >= self.interval_s:
            self._last = now
            self.samples.append(float(torch.cuda.utilization(self.device)))

    @property
    def mean_pct(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else math.nan
