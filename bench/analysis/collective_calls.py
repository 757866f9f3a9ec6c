"""Collectives in traces: each call, its bytes, the time spent waiting for the slowest rank versus
moving data, and which rank the others waited for.

The k-th call of a collective on one rank is the same operation as the k-th call of it on every
other rank (collectives are issued in the same order everywhere). A collective cannot finish
before its last participant arrives, so the shortest duration of a call across ranks is the time
the data movement itself took ("transfer"); whatever a rank spent beyond that was waiting for
the slowest rank ("wait").
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from bench.analysis.trace import STEP, Trace, prepared
from parallel_kernels.facts import BUS_FACTORS, op_name, size_per_input  # the ops' facts

CALL_COLUMNS = ["rank", "step", "collective", "name", "ts", "dur", "nbytes", "seq"]
SUMMARY_COLUMNS = [
    "rank",
    "collective",
    "calls",
    "bytes",
    "total_us",
    "median_us",
    "algbw_GBps",
    "busbw_factor",
    "busbw_GBps",
    "wait_us",
    "transfer_us",
    "wait_pct",
]
STRAGGLER_COLUMNS = [
    "step",
    "slowest_rank",
    "compute_skew_us",
    "window_skew_us",
    "others_wait_us",
    "slowest_wait_us",
]


def busbw_gbps(op: str, size_bytes: float, n: int, time_us: float) -> float:
    """nccl-tests' bus bandwidth (GB/s) of ``size_bytes`` (its S) moved by ``op`` over ``n``
    ranks in ``time_us``: algbw x the bus factor; NaN for an op without a factor or a time that
    is not positive."""
    if op not in BUS_FACTORS or not np.isfinite(time_us) or time_us <= 0:
        return np.nan
    return size_bytes / (time_us * 1e-6) / 1e9 * BUS_FACTORS[op](n)


def collective_calls(trace: Trace) -> pd.DataFrame:
    """One row per collective call of one rank (CALL_COLUMNS), ``seq`` numbering the calls of
    each collective in order. On GPU traces the bytes come from the ``record_param_comms`` op
    that launched the kernel."""
    ev = prepared(trace)
    comm = ev[ev["kind"] == "comm"].copy()
    if comm.empty:
        return pd.DataFrame(columns=CALL_COLUMNS)
    comm["name"] = comm["name"].astype(str)
    comm["collective"] = comm["name"].map(op_name)
    comm["rank"] = trace.rank
    comm = comm.sort_values("ts")
    comm["seq"] = comm.groupby("collective").cumcount()
    return comm[CALL_COLUMNS].reset_index(drop=True)


def wait_split(calls: pd.DataFrame) -> pd.DataFrame:
    """Add ``transfer_us`` (the shortest duration of the same call across ranks) and
    ``wait_us`` (the rest). With a single rank there is nothing to compare: both are NaN."""
    calls = calls.copy()
    if calls.empty:
        calls["transfer_us"] = calls["wait_us"] = pd.Series(dtype=float)
        return calls
    group = calls.groupby(["collective", "seq"])["dur"]
    present = calls.groupby(["collective", "seq"])["rank"].transform("nunique")
    transfer = group.transform("min").where(present > 1)
    calls["transfer_us"] = transfer
    calls["wait_us"] = calls["dur"] - transfer
    return calls


def collective_summary(calls: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """Per rank and collective: calls, bytes, total and median time, algbw and busbw (GB/s, over
    the summed time) with the factor between them, and the wait/transfer split. A collective
    whose factor ``BUS_FACTORS`` does not know (``send_recv``, ``gather`` ...) has NaN for
    both."""
    if calls.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    rows = []
    for (rank, coll), g in calls.groupby(["rank", "collective"], sort=True):
        total, nbytes = g["dur"].sum(), g["nbytes"].sum(min_count=1)
        # algbw over S as nccl-tests sizes it: all-gather's S is the output, n x the input.
        size = nbytes * size_per_input(coll, world_size)
        algbw = size / (total * 1e-6) / 1e9 if total > 0 else np.nan
        factor = BUS_FACTORS[coll](world_size) if coll in BUS_FACTORS else np.nan
        wait = g["wait_us"].sum(min_count=1)
        rows.append(
            {
                "rank": rank,
                "collective": coll,
                "calls": len(g),
                "bytes": nbytes,
                "total_us": total,
                "median_us": g["dur"].median(),
                "algbw_GBps": algbw,
                "busbw_factor": factor,
                "busbw_GBps": busbw_gbps(coll, size, world_size, total),
                "wait_us": wait,
                "transfer_us": g["transfer_us"].sum(min_count=1),
                "wait_pct": 100 * wait / total if total > 0 else np.nan,
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def stragglers(steps: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Per step: the rank the others waited for (the one that waited least in collectives, or
    computed most when there are no collectives), how far apart the ranks' compute and step
    windows are, and how long the others waited on average."""
    if steps.empty or steps["rank"].nunique() < 2:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    compute = steps.pivot_table(index="step", columns="rank", values="compute_us")
    window = steps.pivot_table(index="step", columns="rank", values="window_us")
    if len(calls) and calls["wait_us"].notna().any():
        waits = calls.pivot_table(index="step", columns="rank", values="wait_us", aggfunc="sum")
        waits = waits.reindex(index=compute.index, columns=compute.columns)
    else:
        waits = pd.DataFrame(np.nan, index=compute.index, columns=compute.columns)
    has_wait = waits.notna().any(axis=1)
    slowest = compute.idxmax(axis=1)
    slowest[has_wait] = waits[has_wait].idxmin(axis=1)
    w = waits.to_numpy()
    pos = compute.columns.get_indexer(slowest.to_numpy())
    rows = np.arange(len(w))
    slowest_wait = w[rows, pos] if w.size else np.full(len(rows), np.nan)
    others = w.copy()
    if others.size:
        others[rows, pos] = np.nan
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step where no other rank waited
        others_mean = np.nanmean(others, axis=1) if others.size else np.full(len(rows), np.nan)
    return pd.DataFrame(
        {
            "step": compute.index.to_numpy(),
            "slowest_rank": slowest.to_numpy().astype(int),
            "compute_skew_us": (compute.max(axis=1) - compute.min(axis=1)).to_numpy(),
            "window_skew_us": (window.max(axis=1) - window.min(axis=1)).to_numpy(),
            "others_wait_us": others_mean,
            "slowest_wait_us": slowest_wait,
        }
    )[STRAGGLER_COLUMNS]


__all__ = ["STEP", "collective_calls", "collective_summary", "stragglers", "wait_split"]
