"""Kineto traces -> DataFrames: where the time of a training step went.

Definitions follow ``DESIGN.md`` section 4 (after HolisticTraceAnalysis's temporal breakdown and
communication-computation overlap):

GPU traces
    Kernels are communication (``^nccl``, ``ncclKernel``, ``ncclDevKernel``, ``^hccl``), memory
    (``Memcpy``/``Memset``) or computation (the rest).
CPU traces (gloo)
    gloo runs each collective on a worker thread (``gloo:all_reduce`` ...); communication is the
    union of those spans. The main thread (the one carrying ``ProfilerStep#N``) computes;
    computation is the union of its ops minus the time it spends issuing or waiting for
    collectives (``c10d::*``, ``record_param_comms``, anything named ``*wait*``).

Per rank and per step window: compute = |C|, comm = |M|, overlap = |C & M|, exposed
communication = |M - C|, idle = window - |C | M|, overlap % = overlap / comm. On GPU traces the
utilisation is |union of kernels| / window.

Every function below takes and returns DataFrames with stable column names; the command line
and the report are separate layers.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench import intervals as iv

COMM_KERNEL = re.compile(r"^nccl|ncclKernel|ncclDevKernel|^hccl")
MEMORY_KERNEL = re.compile(r"Memcpy|Memset")
# Main-thread CPU ops that issue or wait for communication rather than compute.
COMM_CPU_OP = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:)|wait", re.IGNORECASE)
GLOO_SPAN = re.compile(r"^gloo:")
STEP = re.compile(r"^ProfilerStep#(\d+)$")

DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    # record_param_comms spells dtypes as torch does
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Byte": 1,
    "Char": 1,
}

EVENT_COLUMNS = ["name", "cat", "ts", "dur", "pid", "tid", "nbytes", "correlation"]
BREAKDOWN_COLUMNS = [
    "rank",
    "step",
    "window_us",
    "compute_us",
    "comm_us",
    "memory_us",
    "overlap_us",
    "exposed_comm_us",
    "idle_us",
    "non_compute_us",
    "overlap_pct",
    "compute_comm_ratio",
    "gpu_util_pct",
    "comm_calls",
    "comm_bytes",
]


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file."""


@dataclass
class Trace:
    path: Path
    meta: dict
    events: pd.DataFrame  # complete events (ph == "X"), EVENT_COLUMNS
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)  # ts, total_allocated, bytes

    @property
    def rank(self) -> int:
        return int(self.meta.get("distributedInfo", {}).get("rank", 0))

    @property
    def is_gpu(self) -> bool:
        return bool((self.events["cat"] == "kernel").any())


def _payload_bytes(e: dict) -> float:
    """Payload of a collective event: NCCL-style metadata, else input shapes x dtype."""
    args = e.get("args") or {}
    if "In msg nelems" in args:
        size = DTYPE_BYTES.get(str(args.get("dtype")), np.nan)
        return float(args["In msg nelems"]) * size
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types:
        return np.nan
    total = 0.0
    for d, t in zip(dims, types, strict=False):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            total += float(np.prod(d)) * DTYPE_BYTES.get(t, np.nan)
    return total


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            raw = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a readable trace ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict) or "traceEvents" not in raw:
        raise TraceError(f"{path}: no traceEvents (not a Kineto trace)")
    rows, mem = [], []
    for e in raw["traceEvents"]:
        ph = e.get("ph")
        if ph == "X":
            name = e.get("name", "")
            is_comm = e.get("cat") == "kernel" and COMM_KERNEL.search(name)
            is_comm = is_comm or GLOO_SPAN.match(name) or name == "record_param_comms"
            rows.append(
                (
                    name,
                    e.get("cat", ""),
                    float(e.get("ts", 0)),
                    float(e.get("dur", 0)),
                    e.get("pid"),
                    e.get("tid"),
                    _payload_bytes(e) if is_comm else np.nan,
                    (e.get("args") or {}).get("correlation", -1),
                )
            )
        elif ph == "i" and e.get("name") == "[memory]":
            a = e.get("args", {})
            mem.append(
                (
                    float(e["ts"]),
                    a.get("Total Allocated", np.nan),
                    a.get("Bytes", np.nan),
                    a.get("Device Type", 0),
                )
            )
    meta = {k: v for k, v in raw.items() if k != "traceEvents"}
    events = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    memory = pd.DataFrame(mem, columns=["ts", "total_allocated", "bytes", "device_type"])
    return Trace(path=path, meta=meta, events=events, memory=memory)


def step_windows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per ``ProfilerStep#N``: step, start, end (microseconds)."""
    steps = events[events["name"].str.match(STEP)]
    out = pd.DataFrame(
        {
            "step": steps["name"].str.extract(STEP, expand=False).astype(int),
            "start": steps["ts"],
            "end": steps["ts"] + steps["dur"],
        }
    )
    return out.sort_values("step").reset_index(drop=True)


def classify(events: pd.DataFrame, *, gpu: bool) -> pd.DataFrame:
    """Add ``kind``: compute, comm, memory, comm_cpu (issuing/waiting) or other."""
    ev = events.copy()
    kind = np.full(len(ev), "other", dtype=object)
    names = ev["name"]
    if gpu:
        device = ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).to_numpy()
        comm = names.str.contains(COMM_KERNEL).to_numpy() & device
        memory = (
            (
                names.str.contains(MEMORY_KERNEL).to_numpy()
                | ev["cat"].isin(["gpu_memcpy", "gpu_memset"]).to_numpy()
            )
            & device
            & ~comm
        )
        kind[device] = "compute"
        kind[memory] = "memory"
        kind[comm] = "comm"
    else:
        main_tid = _main_thread(ev)
        on_main = (ev["tid"] == main_tid).to_numpy()
        ops = ev["cat"].isin(["cpu_op", "user_annotation"]).to_numpy()
        step = names.str.match(STEP).to_numpy()
        comm_cpu = names.str.contains(COMM_CPU_OP).to_numpy()
        kind[on_main & ops & ~step] = "compute"
        kind[on_main & ops & comm_cpu] = "comm_cpu"
        kind[names.str.match(GLOO_SPAN).to_numpy()] = "comm"
    ev["kind"] = kind
    return ev


def _main_thread(events: pd.DataFrame):
    steps = events[events["name"].str.match(STEP)]
    if len(steps):
        return steps["tid"].iloc[0]
    ops = events[events["cat"] == "cpu_op"]
    return ops["tid"].mode().iloc[0] if len(ops) else None


def _spans(ev: pd.DataFrame, mask) -> np.ndarray:
    sub = ev[mask]
    return iv.as_intervals(sub["ts"], sub["ts"] + sub["dur"])


def breakdown(trace: Trace) -> pd.DataFrame:
    """Per-step temporal breakdown and overlap of one rank's trace (BREAKDOWN_COLUMNS)."""
    gpu = trace.is_gpu
    ev = classify(trace.events, gpu=gpu)
    compute_all = _spans(ev, ev["kind"] == "compute")
    if not gpu:  # time the main thread spends issuing or waiting is not computation
        compute_all = iv.subtract(compute_all, _spans(ev, ev["kind"] == "comm_cpu"))
    comm_all = _spans(ev, ev["kind"] == "comm")
    memory_all = _spans(ev, ev["kind"] == "memory")
    comm_ev = ev[ev["kind"] == "comm"]
    rows = []
    for w in step_windows(ev).itertuples():
        lo, hi = w.start, w.end
        if gpu:  # GPU work lags the CPU step that launched it: use the device's own window
            lo, hi = _gpu_window(ev, w.start, w.end)
            if hi <= lo:
                continue
        c, m = iv.clip(compute_all, lo, hi), iv.clip(comm_all, lo, hi)
        mem = iv.clip(memory_all, lo, hi)
        window = hi - lo
        busy = iv.length(np.vstack([c, m, mem]))
        compute, comm = iv.length(c), iv.length(m)
        overlap = iv.length(iv.intersect(c, m))
        in_step = comm_ev[(comm_ev["ts"] >= lo) & (comm_ev["ts"] < hi)]
        rows.append(
            {
                "rank": trace.rank,
                "step": w.step,
                "window_us": window,
                "compute_us": compute,
                "comm_us": comm,
                "memory_us": iv.length(mem),
                "overlap_us": overlap,
                "exposed_comm_us": comm - overlap,
                "idle_us": window - busy,
                "non_compute_us": busy - compute,
                "overlap_pct": 100.0 * overlap / comm if comm > 0 else np.nan,
                "compute_comm_ratio": compute / comm if comm > 0 else np.nan,
                "gpu_util_pct": 100.0 * busy / window if gpu and window > 0 else np.nan,
                "comm_calls": len(in_step),
                "comm_bytes": in_step["nbytes"].sum(min_count=1),
            }
        )
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def _gpu_window(ev: pd.DataFrame, start: float, end: float) -> tuple[float, float]:
    """GPU window of a CPU step: first to last device event launched during the step.

    Device work lags the CPU, so a kernel belongs to the step whose CPU side launched it: the
    runtime call (``cudaLaunchKernel`` ...) with the same ``correlation`` id. Device events
    without a launch record fall back to their own start time.
    """
    dev = ev[ev["kind"].isin(["compute", "comm", "memory"])]
    runtime = ev[ev["cat"].isin(["cuda_runtime", "cuda_driver"]) & (ev["correlation"] != -1)]
    launch_ts = dev["correlation"].map(
        runtime.drop_duplicates("correlation").set_index("correlation")["ts"]
    )
    launch_ts = launch_ts.fillna(dev["ts"])
    inside = dev[(launch_ts >= start) & (launch_ts < end)]
    if inside.empty:
        return 0.0, 0.0
    return float(inside["ts"].min()), float((inside["ts"] + inside["dur"]).max())


def memory_peak_delta(trace: Trace) -> float:
    """Peak rise, in bytes, of the profiler's allocated-memory counter over the traced steps.

    The counter starts at zero when profiling starts, so its rise during the traced window is
    what the steps themselves allocate on top of what was already live (activations, gradients,
    temporaries, communication buffers).
    """
    mem = trace.memory
    if mem.empty:
        return np.nan
    first = mem.iloc[0]
    before = first["total_allocated"] - first["bytes"]
    return float(mem["total_allocated"].max() - before)


def summarize(steps: pd.DataFrame) -> dict:
    """Mean over steps (and ranks) of a breakdown, in the results' units (ms, %)."""
    if steps.empty:
        return {}
    m = steps.mean(numeric_only=True)
    comm = m["comm_us"]
    return {
        "compute_ms": m["compute_us"] / 1e3,
        "comm_ms": comm / 1e3,
        "overlap_ms": m["overlap_us"] / 1e3,
        "exposed_comm_ms": m["exposed_comm_us"] / 1e3,
        "idle_ms": m["idle_us"] / 1e3,
        "compute_comm_ratio": m["compute_us"] / comm if comm > 0 else np.nan,
        "overlap_pct": 100.0 * m["overlap_us"] / comm if comm > 0 else np.nan,
        "gpu_util_pct": m["gpu_util_pct"],
        "comm_calls_per_step": m["comm_calls"],
        "comm_bytes_per_step": m["comm_bytes"],
    }


def trace_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    return sorted(
        p
        for p in folder.rglob("*")
        if p.name.endswith((".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz"))
    )
