"""How well a device's roofline prices the ops of a measured trace: every top-level operator
the host's main thread ran in a profiled step, its measured time against its price on the
roofline, per call, per op and per class of op (docs/benchmarks.md, "Per-op prediction on this
CPU").

An op is priced as a whole: an operator inside another belongs to its outermost one (the
waterfall's *unit*: ``aten::linear`` holds its ``aten::t`` and ``aten::addmm``), so nothing is
counted twice. Its FLOPs are those of the ops with a FLOP formula it holds, its bytes its own
inputs and outputs (``op_costs.cost``). It is priced as its parts ran in the trace (``_price``):
the longest of its FLOPs on the matmul curve (at the size of the matmuls it runs as: an
attention's are head-sized), its bytes on the memory curve (an op without FLOPs that allocates
its output: the cold curve, as a step's elementwise ops find their operands) and the
elementwise functions it computes at the profile's math rates; an attention's softmax besides;
and per operator it dispatched, what one costs in a profiled step (``traced_launch_us``: the
profiler's record beside the dispatch). Its class (``CLASSES``) says which target it is held
to: a matmul (it holds FLOPs: matmul, attention, convolution), memory-bound (no FLOPs, bytes
moved), or a view (nothing moved: priced at its operators' cost, held to no target).

A trace without shapes prices nothing and says so (``unpriced``); so does an op whose recorded
shapes do not fit it. ``fastest_of_steps`` keeps, per op of the step, its fastest call over the
profiled steps (the same op on the same shapes each step): on a loaded machine a call that a
neighbour's burst interrupted counts less.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.analysis.breakdown import Trace, prepared
from bench.analysis.op_costs import cost, is_op
from bench.analysis.trace import STEP, name_matches
from bench.analysis.waterfall import Spans, host_spans
from bench.roofline.profile import Roofline, RooflineError


@dataclass(frozen=True)
class OpClass:
    """A class of op: its name, the largest |priced / measured - 1| in percent a call may miss
    by and still be within the target (None: held to none), and what it holds."""

    name: str
    target_pct: float | None
    description: str


CLASSES = (
    OpClass("matmul", 15.0, "holds FLOPs: matmul, attention, convolution"),
    OpClass("memory_bound", 30.0, "no FLOPs, bytes moved: elementwise, normalisation, copies"),
    OpClass("view", None, "moves nothing: priced at its operators' cost"),
)
CLASS = {c.name: c for c in CLASSES}
CALL_COLUMNS = [
    "step",
    "op",
    "op_class",
    "measured_us",
    "priced_us",
    "bound",
    "flops",
    "bytes",
    "precision",
    "ops_inside",
    "error_pct",
]
OP_COLUMNS = [
    "op",
    "op_class",
    "calls",
    "ops_per_call",
    "measured_us",
    "priced_us",
    "error_pct",
    "median_abs_error_pct",
]
SUMMARY_COLUMNS = [
    "op_class",
    "calls",
    "measured_us",
    "priced_us",
    "error_pct",
    "median_abs_error_pct",
    "target_pct",
    "within_target_pct",
]
NO_SHAPES = "the trace has no shapes (record_shapes=False): no op can be priced"


@dataclass(frozen=True)
class OpAccuracy:
    """Per call (CALL_COLUMNS), per op (OP_COLUMNS), per class (SUMMARY_COLUMNS), and what
    could not be priced, in words."""

    calls: pd.DataFrame
    ops: pd.DataFrame
    summary: pd.DataFrame
    unpriced: tuple[str, ...]


def _main_units(ev: pd.DataFrame, spans: Spans) -> np.ndarray:
    """The spans that are units (outermost operators) on the thread that carries the profiled
    steps, started inside one of them."""
    t = spans.table
    steps = ev[name_matches(ev["name"], STEP)]
    if steps.empty:
        return np.zeros(0, dtype=int)
    own = spans.unit == np.arange(len(t))
    on_main = (t["tid"] == steps["tid"].iloc[0]).to_numpy() & (t["step"] >= 0).to_numpy()
    return np.flatnonzero(own & on_main)


def _flops(spans: Spans, shapes: np.ndarray) -> pd.DataFrame:
    """Per unit that holds ops with a FLOP formula: their FLOPs summed (NaN where one is
    unknown) and the precision of the first."""
    names = spans.table["name"].astype(str).to_numpy()
    rows = np.flatnonzero(spans.flop_op)
    costs = [cost(names[i], shapes[i]) for i in rows]
    per_op = pd.DataFrame(
        {
            "unit": spans.unit[rows],
            "flops": [c.flops for c in costs],
            "precision": [c.precision for c in costs],
            "size": [c.matmul_size for c in costs],
            "softmax": [c.softmax for c in costs],
        }
    )
    g = per_op.groupby("unit")
    known = g["flops"].count() == g.size()
    return pd.DataFrame(
        {
            "flops": g["flops"].sum().where(known),
            "precision": g["precision"].first(),
            "size": g["size"].first(),
            "softmax": g["softmax"].sum(),
        }
    )


def _math(spans: Spans, shapes: np.ndarray, ops) -> pd.Series:
    """Per unit, the elementwise functions it computed: ((op, elements), ...) of the spans
    inside it (itself included) that ``ops`` names."""
    names = spans.table["name"].astype(str).to_numpy()
    rows = np.flatnonzero(np.isin(names, list(ops)) & (spans.unit >= 0))
    found: dict[int, list] = {}
    for i in rows:
        elements = cost(names[i], shapes[i]).elements if shapes[i] else np.nan
        found.setdefault(int(spans.unit[i]), []).append((names[i], elements))
    return pd.Series({u: tuple(v) for u, v in found.items()}, dtype=object)


def _units(ev: pd.DataFrame, math_ops=()) -> pd.DataFrame:
    """Each unit of the main thread's steps: step, op, measured_us, flops, bytes, precision,
    op_class (NaN flops or bytes: its shapes did not fit it), ``size`` (FLOPs of one matmul
    it runs as, NaN: its own), ``softmax`` (an attention's scores), ``ops_inside``: the
    operators it dispatched, itself included (each pays a dispatch and the profiler's
    record), ``in_place`` (it writes an input, allocating nothing) and ``math``: the
    elementwise functions of ``math_ops`` it computed (``_math``)."""
    spans = host_spans(ev)
    t = spans.table
    raw = t["shapes"].to_numpy(object) if "shapes" in t else np.full(len(t), None)
    shapes = np.array([s if isinstance(s, str) else None for s in raw], dtype=object)
    units = _main_units(ev, spans)
    names = t["name"].astype(str).to_numpy()[units]
    fl = _flops(spans, shapes).reindex(units)
    holds = np.isin(units, spans.unit[spans.flop_op])
    precision = [p if isinstance(p, str) else None for p in fl["precision"]]
    costs = [cost(n, s) for n, s in zip(names, shapes[units], strict=True)]
    nbytes = np.array([c.nbytes for c in costs])
    all_names = t["name"].astype(str)
    is_operator = all_names.map(is_op).to_numpy(bool) & (t["cat"] == "cpu_op").to_numpy()
    inside = np.bincount(spans.unit[is_operator & (spans.unit >= 0)], minlength=len(t))
    kind = np.where(holds, "matmul", np.where(nbytes > 0, "memory_bound", "view"))
    math_of = _math(spans, shapes, math_ops)
    return pd.DataFrame(
        {
            "step": t["step"].to_numpy()[units],
            "op": names,
            "op_class": kind,
            "measured_us": t["dur"].to_numpy(float)[units],
            "flops": np.where(holds, fl["flops"].to_numpy(float), 0.0),
            "size": fl["size"].to_numpy(float),
            "softmax": np.where(holds, fl["softmax"].to_numpy(float), 0.0),
            "bytes": nbytes,
            "precision": precision,
            "ops_inside": inside[units],
            "in_place": [c.in_place for c in costs],
            "math": [math_of.get(u, ()) for u in units],
        }
    )


def _priced(units: pd.DataFrame, roofline: Roofline) -> tuple[pd.DataFrame, list[str]]:
    """The units priced on ``roofline`` (CALL_COLUMNS), and what kept some from a price."""
    prices, problems = [], []
    for unit in units.itertuples(False):
        price = (np.nan, None)
        if (
            np.isfinite(unit.flops)
            and np.isfinite(unit.bytes)
            and (unit.precision or not unit.flops)
        ):
            try:
                price = _price(roofline, unit)
            except RooflineError as e:
                problems.append(str(e))
        prices.append(price)
    us, bound = zip(*prices, strict=True) if prices else ((), ())
    out = units.assign(priced_us=list(us), bound=list(bound))
    out.loc[(out["flops"] == 0) & (out["bytes"] == 0), "bound"] = "launch"  # a view
    out["error_pct"] = 100 * (out["priced_us"] / out["measured_us"] - 1)
    unknown = out[out["priced_us"].isna()]
    if len(unknown):
        ops = ", ".join(sorted(set(unknown["op"]))[:5])
        problems.append(f"{len(unknown)} of {len(out)} calls not priced (shapes unread): {ops}")
    return out[out["priced_us"].notna()].reset_index(drop=True)[CALL_COLUMNS], problems


def _price(roofline: Roofline, unit) -> tuple[float, str]:
    """(microseconds, bound) of a unit (a row of ``_units``) as its parts ran in the trace:
    the longest of its FLOPs on the matmul curve (read at the size of one matmul it runs as:
    an attention's head), its bytes on the memory curve (an op without FLOPs that allocates
    its output: the cold curve, its operands out of cache, as in a step) and the elementwise
    functions it computes at the profile's rates ("math"); then an attention's softmax at the
    exponential's rate, and one traced operator's cost per operator it dispatched."""
    flops, nbytes = unit.flops, unit.bytes
    size = unit.size if np.isfinite(unit.size) else None
    c = roofline.compute_us(flops, unit.precision or "fp32", size) if flops > 0 else 0.0
    cold = not flops and not unit.in_place
    m = roofline.memory_us(nbytes, cold) if nbytes > 0 else 0.0
    math_us = sum(roofline.math_us(op, n) for op, n in unit.math if np.isfinite(n))
    body, _, bound = max((c, 2, "compute"), (m, 1, "memory"), (math_us, 0, "math"))
    body += roofline.math_us("aten::exp", unit.softmax)
    return body + unit.ops_inside * roofline.traced_launch_us, bound


def fastest_of_steps(calls: pd.DataFrame) -> pd.DataFrame:
    """``calls`` (CALL_COLUMNS) with each op's k-th call of a step at its fastest over the steps
    (the first step's row, its measured time the least of the k-th calls', its error again),
    where every step ran the same ops in the same order; else ``calls`` as they are."""
    if calls.empty:
        return calls
    k = calls.groupby("step").cumcount()
    same = (
        calls.groupby(k)["op"].nunique().eq(1).all() and calls["step"].value_counts().nunique() == 1
    )
    if not same:
        return calls
    first = calls[calls["step"] == calls["step"].min()].reset_index(drop=True)
    out = first.assign(measured_us=calls.groupby(k)["measured_us"].min().to_numpy())
    out["error_pct"] = 100 * (out["priced_us"] / out["measured_us"] - 1)
    return out


def per_op(calls: pd.DataFrame) -> pd.DataFrame:
    """Per op name and class (OP_COLUMNS): calls, operators dispatched per call, measured and
    priced time, the time-weighted error (priced over measured, totals), the median of the
    calls' |error|; most time first."""
    g = calls.assign(abs_error=calls["error_pct"].abs()).groupby(["op", "op_class"])
    out = g.agg(
        calls=("op", "size"),
        ops_per_call=("ops_inside", "mean"),
        measured_us=("measured_us", "sum"),
        priced_us=("priced_us", "sum"),
        median_abs_error_pct=("abs_error", "median"),
    ).reset_index()
    out["error_pct"] = 100 * (out["priced_us"] / out["measured_us"] - 1)
    return out.sort_values("measured_us", ascending=False).reset_index(drop=True)[OP_COLUMNS]


def summary(calls: pd.DataFrame) -> pd.DataFrame:
    """Per class of ``CLASSES`` present (SUMMARY_COLUMNS): the time-weighted error, the median
    |error| of a call, and the share of calls within the class's target."""
    rows = []
    for c in CLASSES:
        sub = calls[calls["op_class"] == c.name]
        if sub.empty:
            continue
        err = sub["error_pct"].abs()
        rows.append(
            {
                "op_class": c.name,
                "calls": len(sub),
                "measured_us": sub["measured_us"].sum(),
                "priced_us": sub["priced_us"].sum(),
                "error_pct": 100 * (sub["priced_us"].sum() / sub["measured_us"].sum() - 1),
                "median_abs_error_pct": err.median(),
                "target_pct": c.target_pct,
                "within_target_pct": (
                    100 * (err <= c.target_pct).mean() if c.target_pct is not None else np.nan
                ),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def op_accuracy(trace: Trace, roofline: Roofline) -> OpAccuracy:
    """Every top-level op of ``trace``'s profiled steps on the host's main thread, priced alone
    on ``roofline`` against its measured time: per call, per op, per class."""
    ev = prepared(trace)
    if "shapes" not in ev or ev["shapes"].isna().all():
        empty = pd.DataFrame(columns=CALL_COLUMNS)
        return OpAccuracy(empty, per_op(empty), summary(empty), (NO_SHAPES,))
    calls, problems = _priced(_units(ev, roofline.math_Gelems), roofline)
    return OpAccuracy(calls, per_op(calls), summary(calls), tuple(dict.fromkeys(problems)))
