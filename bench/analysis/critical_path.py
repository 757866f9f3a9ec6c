"""The critical path of a profiled step across ranks: the longest path of the step's graph
(``critical_graph.py``), its breakdown, and each step's path over a folder of traces
(docs/analysis.md, "Critical path").

The graph holds every node's measured time; the critical path is the chain of binding
predecessors back from the step's end: at each node, the predecessor whose time plus edge
weight is the latest (the one it waited for), its own slack the delay nothing explains. Its
length is the step's (first start to last end, every rank), and its time splits exactly into
the edges' categories and the nodes' slack: computation, communication (after the last member
arrived), launch and CPU overhead, idle, data loading, memory copies. A rank that waits for a
slow peer is off the path: the path runs through the peer's work. HolisticTraceAnalysis finds
the longest path of one rank's graph; this one is every rank's. What making one thing faster
would save is ``critical_what_if.py``'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.analysis.critical_graph import (
    CATEGORIES,
    COMM,
    IDLE,
    LAUNCH,
    OVERHEAD,
    Graph,
    GraphError,
    rank_graphs,
    step_graph,
)
from bench.analysis.trace_folder import load_trace_dir

PATH_COLUMNS = ["step", "rank", "start_us", "end_us", "dur_us", "category", "label", "op"]


def _incoming(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Edges sorted by destination, and each node's first edge in that order (CSR)."""
    order = np.argsort(g.dst, kind="stable")
    first = np.searchsorted(g.dst[order], np.arange(len(g.time) + 1))
    return order, first


def critical_path(g: Graph) -> pd.DataFrame:
    """The path's segments, first to last (PATH_COLUMNS): each edge's work and each node's
    slack on it, with the rank they belong to."""
    order, first = _incoming(g)
    slack = g.slack
    rows = []
    node = g.end
    while True:
        edges = order[first[node] : first[node + 1]]
        t = g.time[node]
        if len(edges) == 0:
            break
        ready = g.time[g.src[edges]] + g.weight[edges]
        e = edges[int(np.argmax(ready))]
        if slack[node] > 0:
            why = OVERHEAD if g.category[e] == LAUNCH else g.slack_category[node]
            rows.append((g.node_rank[node], t - slack[node], t, why, "", ""))
        if g.weight[e] > 0:
            s = g.time[g.src[e]]
            rows.append((g.edge_rank[e], s, s + g.weight[e], g.category[e], g.label[e], g.op[e]))
        node = g.src[e]
    if g.time[node] > g.time[g.start]:  # the path's rank began its step after the first rank
        later = (g.node_rank[node], g.time[g.start], g.time[node], IDLE, "later step start", "")
        rows.append(later)
    columns = ["rank", "start_us", "end_us", "category", "label", "op"]
    path = pd.DataFrame(rows[::-1], columns=columns)
    path.insert(0, "step", g.step)
    path.insert(4, "dur_us", path["end_us"] - path["start_us"])
    return path[PATH_COLUMNS]


def path_summary(g: Graph, path: pd.DataFrame) -> dict:
    """The path's length, its time per category and per rank, the rank that sets the step,
    and its top operators and calls with their share."""
    length = float(g.time[g.end] - g.time[g.start])
    by_cat = path.groupby("category")["dur_us"].sum()
    by_rank = path[path["rank"] >= 0].groupby("rank")["dur_us"].sum()
    # the rank whose own work sets the step: a collective's transfer is every member's, and
    # idle time nobody's
    mine = (path["rank"] >= 0) & ~path["category"].isin([COMM, IDLE])
    own = path[mine].groupby("rank")["dur_us"].sum()
    work = path[(path["label"] != "") & (path["category"] != IDLE)]
    top = work.groupby("label")["dur_us"].sum().sort_values(ascending=False).head(10)
    return {
        "step": g.step,
        "ranks": g.ranks,
        "length_us": length,
        "categories_us": {c: float(by_cat.get(c, 0.0)) for c in CATEGORIES},
        "ranks_us": {int(r): float(v) for r, v in by_rank.items()},
        "setting_rank": int(own.idxmax()) if len(own) else None,
        "comm_share_pct": 100.0 * float(by_cat.get(COMM, 0.0)) / length if length > 0 else 0.0,
        "top": [
            {"label": k, "us": float(v), "share_pct": 100.0 * float(v) / length}
            for k, v in top.items()
        ],
        "notes": g.notes,
    }


# -- a folder of traces ------------------------------------------------------------------------
@dataclass
class StepPath:
    graph: Graph
    path: pd.DataFrame  # PATH_COLUMNS
    summary: dict  # path_summary


LAST_STEPS = 5  # steps a folder's path is made for by default: its last ones (warmed up)


def folder_paths(
    folder, steps: list[int] | None = None, last: int | None = LAST_STEPS
) -> tuple[list[StepPath], list[str]]:
    """Each step's critical path over a folder of per-rank traces (``steps``, else the ``last``
    steps every rank holds, else all of them), and what was wrong with the folder. Each trace
    is reduced to those steps' lanes as it is read (memory bounded by the largest file).
    Raises TraceError or GraphError with one line."""
    reduce = functools.partial(rank_graphs, steps=steps, last=None if steps else last)
    ts = load_trace_dir(folder, reduce=reduce)
    paths, problems = _paths(ts.traces, steps, str(folder))
    return paths, list(ts.problems) + problems


def trace_paths(traces: list, steps: list[int] | None = None) -> list[StepPath]:
    """``folder_paths`` of traces already read (one per rank)."""
    graphs = [rank_graphs(t, steps=steps, last=None if steps else LAST_STEPS) for t in traces]
    return _paths(graphs, steps, "the traces")[0]


def _paths(ranks: list, steps: list[int] | None, where: str) -> tuple[list[StepPath], list[str]]:
    problems = []
    common = sorted(set.intersection(*(set(r.steps) for r in ranks)))
    if not common:
        raise GraphError(f"{where}: no profiler step is in every rank's trace")
    if common == [-1]:
        problems.append("no ProfilerStep in the traces: each rank's whole trace is one step (-1)")
    wanted = steps or common
    absent = sorted(set(wanted) - set(common))
    if absent:
        raise GraphError(f"{where}: step {absent[0]} is not in every rank's trace ({common})")
    world = ranks[0].world_size
    out = []
    for step in wanted:
        g = step_graph([r.steps[step] for r in ranks], step)
        if len(ranks) < world:
            g.notes.append(
                f"the path covers ranks {', '.join(str(r.rank) for r in ranks)} of {world}: "
                "the others' work is not in it, and a collective's time after its last traced "
                "member arrived counts as communication though it may hold a wait for them"
            )
        path = critical_path(g)
        out.append(StepPath(g, path, path_summary(g, path)))
    return out, problems


def path_bars(sp: StepPath, origin_us: float) -> pd.DataFrame:
    """The path's segments as timeline bars (``timeline.TIMELINE_COLUMNS``, lane ``path``), in
    ms from ``origin_us``, for the report's step timeline."""
    p = sp.path[sp.path["rank"] >= 0]
    return pd.DataFrame(
        {
            "rank": p["rank"].astype(int),
            "step": sp.graph.step,
            "lane": "path",
            "start_ms": (p["start_us"] - origin_us) / 1e3,
            "end_ms": (p["end_us"] - origin_us) / 1e3,
            "label": p["category"],
            "op": p["op"],
            "bytes": np.nan,
        }
    )
