"""The MFU waterfall's columns of a point's row (results.csv's ``wf_*``): where a rank's
profiled steps went, from the device's peak down to the achieved MFU (``waterfall.py``,
docs/analysis.md "The MFU waterfall"), each part averaged over the profiled steps, in ms.

The roofline is the device's own: on the CPU this host's measured profile (measured once per
host and cached, ``bench.roofline.measure.host_profile``: the running side may measure), on a
GPU the datasheet's stated profile of the GPU torch names. A part that cannot be priced (a
trace without shapes, a device without a profile) is an empty cell, never zero, and
``wf_unpriced`` says why; a waterfall that fails costs the point its cells, never its row.
"""

from __future__ import annotations

import functools
import math

import torch

from bench.analysis.trace import Trace
from bench.roofline.profile import Roofline

# Each column, and the waterfall step table's column it is the mean of: the parts (they add
# up to the traced step, ``window_ms``) and the matmuls' time unsplit (ideal + matmul_loss
# where priced), which keeps the sum where the split cannot be made.
PARTS_MS = {
    "wf_ideal_ms": "ideal_us",
    "wf_matmul_loss_ms": "matmul_loss_us",
    "wf_matmul_ms": "matmul_us",
    "wf_memory_bound_ms": "memory_bound_us",
    "wf_recompute_ms": "recompute_us",
    "wf_optimizer_ms": "optimizer_us",
    "wf_exposed_comm_ms": "exposed_comm_us",
    "wf_idle_ms": "idle_us",
    "wf_other_ms": "other_us",
}


@functools.cache
def device_roofline(device: torch.device) -> tuple[Roofline | None, str]:
    """(this device's roofline or None, what it is or why there is none), once per process:
    the host's measured profile on the CPU, the datasheet's on a GPU."""
    if device.type != "cuda":
        from bench.roofline.measure import host_profile  # measures once per host

        roofline = host_profile("cpu")
    else:
        from bench.roofline.datasheet import datasheet_profile

        name = torch.cuda.get_device_name(device)
        roofline = datasheet_profile(name)
        if roofline is None:
            return None, f"no datasheet profile for {name}"
    return roofline, f"{roofline.device} ({roofline.source})"


def empty(why: str, profile: str = "") -> dict:
    """The columns of a rank whose waterfall could not be made: empty cells, and why."""
    return {**dict.fromkeys(PARTS_MS, math.nan), "wf_profile": profile, "wf_unpriced": why}


def waterfall_columns(trace: Trace, device: torch.device) -> dict:
    """One rank's ``wf_*`` columns: the mean over its profiled steps of each part, in ms (NaN
    where any step could not price it), the roofline used and what could not be priced."""
    try:
        from bench.analysis.waterfall import waterfall  # op costs import torch's op tables

        roofline, profile = device_roofline(device)
        w = waterfall(trace, roofline)
    except Exception as e:  # noqa: BLE001  (a trace we misread costs the cells, not the point)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        return empty(f"waterfall failed: {type(e).__name__}: {first}")
    shown = profile if roofline else ""
    if w.steps.empty:
        return empty("no profiled step in the trace", shown)
    mean = w.steps[list(PARTS_MS.values())].astype(float).mean(skipna=False)
    unpriced = list(w.unpriced) + ([] if roofline else [profile])
    return {
        **{col: float(mean[us]) / 1e3 for col, us in PARTS_MS.items()},
        "wf_profile": shown,
        "wf_unpriced": "; ".join(unpriced),
    }
