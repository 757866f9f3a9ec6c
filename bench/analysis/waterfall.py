"""Where MFU goes: each profiled step of a rank, from the device's peak down to the achieved
MFU, partitioned into the parts of ``PARTS`` (docs/analysis.md, "The MFU waterfall").

The step window, idle time and exposed communication are ``breakdown.py``'s. The rest of the
window, the computation, is attributed instant by instant: on CPU traces to the innermost op
the main thread is in, on GPU traces to the compute kernel running (the latest started where
streams overlap), which takes its launching op's shapes (same correlation id). Each instant
then belongs to the op's *unit*, the outermost operator around it (``aten::linear`` holds its
``aten::addmm``), and the unit's class says which part it is: inside the optimiser's step,
recomputed (a forward op, one autograd records, run inside a backward node: activation
checkpointing), a matmul (its unit holds an op with a FLOP formula) or memory-bound (every
other unit); time outside any unit (an annotation's or autograd node's own time) is ``other``.
A matmul's time splits into ``ideal`` (its FLOPs at the roofline's peak at their precision)
and ``matmul_loss`` (the rest). The parts are measured each on its own, so that their sum
against the step window checks the attribution (``closure_pct``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.analysis import interval_sets as iv
from bench.analysis.breakdown import Trace, breakdown, cpu_compute, prepared
from bench.analysis.op_costs import cost, is_op
from bench.analysis.trace import device_windows, intervals_of, step_windows
from bench.roofline.profile import Roofline, RooflineError

PARTS = (
    "ideal",
    "matmul_loss",
    "memory_bound",
    "recompute",
    "optimizer",
    "exposed_comm",
    "idle",
    "other",
)
STEP_COLUMNS = [
    "rank",
    "step",
    "step_us",
    *(f"{p}_us" for p in PARTS),
    "matmul_us",
    "sum_us",
    "closure_pct",
    "model_flops",
    "mfu_pct",
    "unpriced",
]
CLASS_COLUMNS = [
    "rank",
    "op",
    "part",
    "calls",
    "time_us",
    "flops",
    "bytes",
    "roofline_us",
    "loss_us",
    "roofline_pct",
]
# The spans of the host's time line an instant can be attributed through.
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")  # torch.optim's profiler hook's span
BACKWARD_NODE = re.compile(r"^autograd::engine::evaluate_function: ")


@dataclass(frozen=True)
class Waterfall:
    """One rank's waterfall: per step (STEP_COLUMNS), per op class (CLASS_COLUMNS), and what
    it could not price, in words."""

    steps: pd.DataFrame
    classes: pd.DataFrame
    unpriced: tuple[str, ...]


@dataclass(frozen=True)
class Spans:
    """The host spans, sorted by thread then start, each with its place in its thread's
    nesting and what its chain of enclosing spans says."""

    table: pd.DataFrame  # the events, reindexed 0..n-1
    parent: np.ndarray  # index of the enclosing span, -1 for none
    unit: np.ndarray  # index of the outermost operator of the chain, -1 for none
    optimizer: np.ndarray  # inside the optimiser's step
    recompute: np.ndarray  # a recorded forward op inside a backward node
    flop_op: np.ndarray  # an op with a FLOP formula and none around it


def _nesting(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent, depth) of spans sorted by thread, start, longer first: a thread's spans open
    and close as a stack."""
    parent = np.full(len(ts), -1)
    depth = np.zeros(len(ts), dtype=int)
    stack: list[int] = []
    last = None
    for i in range(len(ts)):
        if tid[i] != last:
            stack, last = [], tid[i]
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        depth[i] = len(stack)
        stack.append(i)
    return parent, depth


def host_spans(ev: pd.DataFrame) -> Spans:
    """The host's spans and the facts of their chains, inherited level by level."""
    host = ev[(ev["stream"] < 0) & ev["cat"].isin(HOST_CATS)].copy()
    host["end"] = host["ts"] + host["dur"]
    host["tid_code"] = host["tid"].cat.codes if hasattr(host["tid"], "cat") else host["tid"]
    host = host.sort_values(["tid_code", "ts", "end"], ascending=[True, True, False])
    host = host.reset_index(drop=True)
    names = host["name"].astype(str).to_numpy()
    parent, depth = _nesting(
        host["tid_code"].to_numpy(), host["ts"].to_numpy(float), host["end"].to_numpy(float)
    )
    op = np.array([is_op(n) for n in names]) & (host["cat"] == "cpu_op").to_numpy()
    matmul = op & np.array(
        [cost(n, None).matmul if o else False for n, o in zip(names, op, strict=True)]
    )
    n = len(host)
    unit = np.where(op, np.arange(n), -1)
    opt = np.array([bool(OPTIMIZER_STEP.match(x)) for x in names], dtype=bool)
    bwd = np.array([bool(BACKWARD_NODE.match(x)) for x in names], dtype=bool)
    matmul_above = np.zeros(n, dtype=bool)
    for d in range(1, int(depth.max(initial=0)) + 1):
        i = np.flatnonzero(depth == d)
        p = parent[i]
        unit[i] = np.where(unit[p] >= 0, unit[p], unit[i])
        opt[i] |= opt[p]
        bwd[i] |= bwd[p]
        matmul_above[i] = matmul_above[p] | matmul[p]
    seq = host["seq"].to_numpy() if "seq" in host else np.full(n, -1)
    recompute = np.zeros(n, dtype=bool)
    has_unit = unit >= 0
    recompute[has_unit] = bwd[has_unit] & (seq[unit[has_unit]] >= 0)
    return Spans(host, parent, unit, opt, recompute, matmul & ~matmul_above)


def _owners_nested(spans: Spans, tid, points: np.ndarray) -> np.ndarray:
    """The innermost span of thread ``tid`` open at each point (-1: none): the last span to
    start by the point, or the first of its enclosing spans still open (a span open at the
    point began before that last one, so encloses it)."""
    rows = np.flatnonzero((spans.table["tid"] == tid).to_numpy())
    if len(rows) == 0:
        return np.full(len(points), -1)
    ts = spans.table["ts"].to_numpy(float)
    end = spans.table["end"].to_numpy(float)
    k = rows[0] + np.searchsorted(ts[rows], points, side="right") - 1
    k = np.where(k >= rows[0], k, -1)
    while True:
        closed = (k >= 0) & (end[np.clip(k, 0, None)] <= points)
        if not closed.any():
            return k
        k[closed] = spans.parent[k[closed]]


def _owners_latest(start: np.ndarray, end: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Of intervals sorted by start, the latest started open at each point (-1: none)."""
    k = np.searchsorted(start, points, side="right") - 1
    done = (k < 0) | (end[np.clip(k, 0, None)] > points)
    while not done.all():
        k = np.where(done, k, k - 1)
        done = (k < 0) | (end[np.clip(k, 0, None)] > points)
    return k


def _segments(busy: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the pieces of a canonical union ``busy`` cut at every time of
    ``cuts``."""
    points = np.unique(np.concatenate([busy.ravel(), cuts]))
    lo, hi = points[:-1], points[1:]
    mid = (lo + hi) / 2
    k = np.searchsorted(busy[:, 0], mid, side="right") - 1
    inside = (k >= 0) & (busy[np.clip(k, 0, None), 1] > mid) if len(busy) else k > 0
    return lo[inside], hi[inside]


def _unit_costs(spans: Spans, roofline: Roofline | None) -> tuple[pd.DataFrame, list[str]]:
    """Per unit (its span index): flops, ideal_us, priced, matmul, bytes."""
    t = spans.table
    names = t["name"].astype(str).to_numpy()
    shapes = t["shapes"].astype(object).to_numpy() if "shapes" in t else np.full(len(t), None)
    problems: list[str] = []
    flop_rows = np.flatnonzero(spans.flop_op)
    flops = np.zeros(len(t))
    ideal = np.zeros(len(t))
    priced = np.ones(len(t), dtype=bool)
    for i in flop_rows:
        c = cost(names[i], shapes[i] if isinstance(shapes[i], str) else None)
        flops[i] = c.flops
        peak = np.nan
        if roofline is not None and c.precision is not None:
            try:
                peak = roofline.peak_tflops[roofline.precision(c.precision)]
            except RooflineError as e:
                problems.append(str(e))
        ideal[i] = c.flops / (peak * 1e6)
        priced[i] = np.isfinite(ideal[i])
    units = np.unique(spans.unit[spans.unit >= 0])
    owner = spans.unit[flop_rows]
    out = pd.DataFrame(index=units)
    out["flops"] = pd.Series(flops[flop_rows], index=owner).groupby(level=0).sum(min_count=1)
    out["ideal_us"] = pd.Series(ideal[flop_rows], index=owner).groupby(level=0).sum(min_count=1)
    out["priced"] = pd.Series(priced[flop_rows], index=owner).groupby(level=0).all()
    out["matmul"] = out["priced"].notna()
    out["flops"] = out["flops"].where(out["matmul"], 0.0)
    out["priced"] = out["priced"].fillna(True).astype(bool)
    out["bytes"] = [
        cost(names[u], shapes[u] if isinstance(shapes[u], str) else None).nbytes for u in units
    ]
    out["op"] = names[units]
    return out, problems


def _attributed(trace: Trace, ev: pd.DataFrame, spans: Spans, windows) -> pd.DataFrame:
    """The computation's pieces: start, end, the span each is attributed through."""
    cuts = windows[["start", "end"]].to_numpy(float).ravel()
    if trace.is_gpu:
        dev = ev[(ev["stream"] >= 0) & (ev["kind"] == "compute")].sort_values("ts")
        start = dev["ts"].to_numpy(float)
        end = start + dev["dur"].to_numpy(float)
        busy = iv.union(np.column_stack([start, end]))
        lo, hi = _segments(busy, np.concatenate([cuts, start, end]))
        kernel = _owners_latest(start, end, (lo + hi) / 2)
        corr = dev["correlation"].to_numpy()[kernel]
        by_corr = pd.Series(np.arange(len(spans.table)), index=spans.table["correlation"]).loc[
            lambda s: s.index >= 0
        ]
        by_corr = by_corr[~by_corr.index.duplicated()]
        span = pd.Series(corr).map(by_corr).fillna(-1).astype(int).to_numpy()
    else:
        busy = cpu_compute(ev)
        main = ev.loc[ev["kind"] == "compute", "tid"]
        t = spans.table
        on_main = t[t["tid"] == main.iloc[0]] if len(main) else t.iloc[:0]
        bounds = np.concatenate([on_main["ts"], on_main["end"]]).astype(float)
        lo, hi = _segments(busy, np.concatenate([cuts, bounds]))
        mid = (lo + hi) / 2
        span = _owners_nested(spans, main.iloc[0], mid) if len(main) else np.full(len(mid), -1)
    return pd.DataFrame({"start": lo, "end": hi, "span": span})


def _classify(pieces: pd.DataFrame, spans: Spans, units: pd.DataFrame) -> pd.DataFrame:
    """Each piece's unit, part, and ideal time (its unit's, pro rata of the unit's time)."""
    s = pieces["span"].to_numpy()
    ok = s >= 0
    unit = np.where(ok, spans.unit[np.clip(s, 0, None)], -1)
    has = unit >= 0
    part = np.full(len(s), "other", dtype=object)
    matmul = units["matmul"].reindex(unit).fillna(False).to_numpy(bool)
    part[has & ~matmul] = "memory_bound"
    part[has & matmul] = "matmul"
    part[has & spans.recompute[np.clip(s, 0, None)]] = "recompute"
    part[has & spans.optimizer[np.clip(s, 0, None)]] = "optimizer"
    out = pieces.assign(unit=unit, part=part, length=pieces["end"] - pieces["start"])
    unit_time = out[has].groupby("unit")["length"].sum()
    share = out["length"] / out["unit"].map(unit_time)
    out["ideal_us"] = np.where(part == "matmul", share * out["unit"].map(units["ideal_us"]), 0.0)
    out["flops"] = np.where(part == "matmul", share * out["unit"].map(units["flops"]), 0.0)
    out["priced"] = (part != "matmul") | out["unit"].map(units["priced"]).fillna(False)
    return out


def _device_rest(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """GPU traces: per step, the device's busy time outside computation and communication:
    copies (memcpy, memset: memory-bound) and the rest (other)."""
    dev = (ev["stream"] >= 0).to_numpy()
    kind = ev["kind"].to_numpy()
    u = {k: iv.union(intervals_of(ev, dev & (kind == k))) for k in ("compute", "comm", "memory")}
    hidden = iv.union(np.vstack([u["compute"], u["comm"]]))
    copies = iv.subtract(u["memory"], hidden)
    rest = iv.subtract(iv.union(intervals_of(ev, dev)), iv.union(np.vstack([hidden, copies])))
    rows = []
    for step, lo, hi in windows[["step", "start", "end"]].itertuples(index=False):
        rows.append(
            {
                "step": step,
                "copies_us": iv.length(iv.window(copies, lo, hi)),
                "device_other_us": iv.length(iv.window(rest, lo, hi)),
            }
        )
    return pd.DataFrame(rows, columns=["step", "copies_us", "device_other_us"])


def _unpriced(ev: pd.DataFrame, roofline: Roofline | None, units: pd.DataFrame) -> list[str]:
    out = []
    if "shapes" not in ev or ev["shapes"].isna().all():
        out.append(
            "the trace has no shapes (record_shapes=False): no FLOPs, so no ideal/matmul_loss "
            "split and no MFU; no bytes, so no bandwidth figures"
        )
    elif not units["priced"].all():
        ops = sorted(set(units.loc[~units["priced"], "op"]))
        out.append(f"matmul FLOPs not priced for {', '.join(ops[:5])}: no ideal/matmul_loss split")
    if roofline is None:
        out.append("no device profile: no peak, so no ideal/matmul_loss split and no MFU")
    return out


def waterfall(trace: Trace, roofline: Roofline | None) -> Waterfall:
    """The waterfall of one rank's trace against ``roofline`` (None: no profile; then only
    the unpriced parts)."""
    ev = prepared(trace)
    windows = step_windows(ev)
    if windows.empty:
        return Waterfall(
            pd.DataFrame(columns=STEP_COLUMNS), pd.DataFrame(columns=CLASS_COLUMNS), ()
        )
    if trace.is_gpu:
        windows = device_windows(ev, windows)
    spans = host_spans(ev)
    units, problems = _unit_costs(spans, roofline)
    pieces = _classify(_attributed(trace, ev, spans, windows), spans, units)
    unpriced = tuple(dict.fromkeys(_unpriced(ev, roofline, units) + problems))
    steps = _step_table(trace, ev, windows, pieces)
    if (steps["matmul_loss_us"] < 0).any():
        unpriced += (
            "matmul ops ran faster than the roofline's peak at their precision (matmul_loss < "
            "0): the peak is wrong for them, or they ran at another (TF32 for fp32)",
        )
    steps = steps.assign(unpriced="; ".join(unpriced))
    return Waterfall(steps, _class_table(trace.rank, pieces, units, roofline), unpriced)


def _step_table(trace: Trace, ev, windows: pd.DataFrame, pieces: pd.DataFrame) -> pd.DataFrame:
    """Per step: each part measured on its own, their sum and how far it is from the step."""
    bd = breakdown(trace).set_index("step")
    starts = windows["start"].to_numpy(float)
    idx = np.searchsorted(starts, pieces["start"].to_numpy(float), side="right") - 1
    pieces = pieces.assign(step=windows["step"].to_numpy()[np.clip(idx, 0, None)])
    by = pieces.groupby(["step", "part"])["length"].sum().unstack(fill_value=0.0)
    part = lambda name: by.get(name, 0.0)  # noqa: E731
    out = pd.DataFrame(index=windows["step"].to_numpy())
    out["step_us"] = bd["window_us"]
    out["matmul_us"] = part("matmul")
    priced = pieces.groupby("step")["priced"].all()
    ideal = pieces.groupby("step")["ideal_us"].sum()
    out["ideal_us"] = ideal.where(priced.reindex(ideal.index, fill_value=True))
    out["matmul_loss_us"] = out["matmul_us"] - out["ideal_us"]
    rest = _device_rest(ev, windows).set_index("step") if trace.is_gpu else None
    out["memory_bound_us"] = part("memory_bound") + (rest["copies_us"] if rest is not None else 0)
    out["recompute_us"] = part("recompute")
    out["optimizer_us"] = part("optimizer")
    out["exposed_comm_us"] = bd["exposed_comm_us"]
    out["idle_us"] = bd["idle_us"]
    out["other_us"] = part("other") + (rest["device_other_us"] if rest is not None else 0)
    out = out.fillna({c: 0.0 for c in out.columns if c not in ("ideal_us", "matmul_loss_us")})
    shown = ["matmul_us", "memory_bound_us", "recompute_us", "optimizer_us"]
    out["sum_us"] = out[[*shown, "exposed_comm_us", "idle_us", "other_us"]].sum(axis=1)
    out["closure_pct"] = 100 * (out["sum_us"] - out["step_us"]) / out["step_us"]
    out["model_flops"] = pieces.groupby("step")["flops"].sum().where(priced)
    out["mfu_pct"] = 100 * out["ideal_us"] / out["step_us"]
    out = out.rename_axis("step").reset_index().assign(rank=trace.rank, unpriced="")
    return out[STEP_COLUMNS]


def _class_table(rank: int, pieces, units: pd.DataFrame, roofline: Roofline | None):
    """Per op class (the unit's name) and part: its time against its roofline time (FLOPs at
    the peak for a matmul, bytes at the bandwidth for the rest), the loss, largest first."""
    p = pieces[pieces["unit"] >= 0]
    p = p.assign(op=p["unit"].map(units["op"]))
    g = p.groupby(["op", "part"])
    out = g.agg(calls=("unit", "nunique"), time_us=("length", "sum"), flops=("flops", "sum"))
    out["ideal_us"] = g["ideal_us"].sum(min_count=1).where(g["priced"].all())
    unit_bytes = p.drop_duplicates("unit").assign(b=lambda d: d["unit"].map(units["bytes"]))
    out["bytes"] = unit_bytes.groupby(["op", "part"])["b"].sum(min_count=1)
    bw = roofline.memory_GBps * 1e3 if roofline else np.nan
    matmul = out.index.get_level_values("part") == "matmul"
    out["roofline_us"] = np.where(matmul, out["ideal_us"], out["bytes"] / bw)
    out["loss_us"] = out["time_us"] - out["roofline_us"]
    out["roofline_pct"] = 100 * out["roofline_us"] / out["time_us"]
    out = out.reset_index().assign(rank=rank)
    return out.sort_values("loss_us", ascending=False, na_position="last")[CLASS_COLUMNS]
