"""NVML's GPU utilisation, sampled while the timed steps run: a second opinion beside the
utilisation computed from the trace's kernels.

NVML reports the fraction of time in its last sample period during which any kernel ran, so it
counts the same thing as |union of kernels| / window, by other means. ``torch.cuda.utilization``
asks NVML (package nvidia-ml-py, the ``gpu`` extra) and maps CUDA_VISIBLE_DEVICES itself.
Without CUDA or without NVML the figure is NaN: absent, never zero.
"""

from __future__ import annotations

import math
import threading

import torch


class NvmlSampler:
    """``with NvmlSampler(device) as s: ...`` then ``s.mean_pct``."""

    def __init__(self, device: torch.device, interval_s: float = 0.02) -> None:
        self.device, self.interval_s = device, interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = device.type == "cuda" and self._probe()

    def _probe(self) -> bool:
        try:
            torch.cuda.utilization(self.device)
        except Exception:  # noqa: BLE001  (no pynvml, no driver access: no second opinion)
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(float(torch.cuda.utilization(self.device)))

    def __enter__(self) -> NvmlSampler:
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    @property
    def mean_pct(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else math.nan
