"""The critical path of a profiled step across ranks, and what making one thing faster would
save (docs/analysis.md, "Critical path").

The step's graph (``critical_graph.py``) holds every node's measured time; the critical path is
the chain of binding predecessors back from the step's end: at each node, the predecessor
whose time plus edge weight is the latest (the one it waited for), its own slack the delay
nothing explains. Its length is the step's (first start to last end, every rank), and its time
splits exactly into the edges' categories and the nodes' slack: computation, communication
(after the last member arrived), launch and CPU overhead, idle, data loading, memory copies.
A rank that waits for a slow peer is off the path: the path runs through the peer's work.
HolisticTraceAnalysis finds the longest path of one rank's graph; this one is every rank's.

What-if: the graph's edge weights changed (``compute=0.8x``, ``all_reduce=0.5x``,
``link=2x``, ``rank1=1.0x-of-rank0``) and every node's time recomputed in topological order
as the latest predecessor's time plus weight, plus the node's measured slack: the step those
durations would make, on the schedule the trace shows.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.analysis.critical_graph import Graph, step_graph
from bench.analysis.critical_lanes import (
    CATEGORIES,
    COMM,
    COMPUTE,
    DATA,
    IDLE,
    LAUNCH,
    OVERHEAD,
    GraphError,
    rank_graphs,
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


# -- what-if -----------------------------------------------------------------------------------
_CHANGE = re.compile(
    r"^(?P<what>[a-z_][a-z0-9_]*)=(?P<factor>\d+(?:\.\d+)?)x(?:-of-rank(?P<of>\d+))?$"
)
_TARGETS = {"compute": COMPUTE, "comm": COMM, "overhead": OVERHEAD, "data": DATA}


@dataclass(frozen=True)
class Change:
    """One what-if: the edges it picks take ``factor`` times their time (``link=2x``: a link
    twice as fast, communication half the time); ``rankN=Fx-of-rankM``: rank N's computation
    takes F times rank M's."""

    spec: str
    what: str
    factor: float
    of_rank: int | None = None


def parse_change(spec: str) -> Change:
    """``compute=0.8x``, ``all_reduce=0.5x``, ``link=2x``, ``overhead=0.5x``, ``rank1=2x``,
    ``rank1=1.0x-of-rank0``; ValueError with one line otherwise."""
    m = _CHANGE.match(spec.strip())
    if not m:
        raise ValueError(
            f"--what-if {spec!r}: expected NAME=FACTORx (compute, comm, link, overhead, data, "
            "an op such as all_reduce, or rankN; rankN=1.0x-of-rankM)"
        )
    what, factor = m["what"], float(m["factor"])
    of = int(m["of"]) if m["of"] else None
    if of is not None and not what.startswith("rank"):
        raise ValueError(f"--what-if {spec!r}: -of-rankM goes with a rank (rank1=1.0x-of-rank0)")
    if what == "link":
        if factor <= 0:
            raise ValueError(f"--what-if {spec!r}: a link's speed-up must be above 0")
        return Change(spec, "comm", 1.0 / factor)
    return Change(spec, what, factor, of)


def _rank_of(what: str) -> int | None:
    m = re.fullmatch(r"rank(\d+)", what)
    return int(m[1]) if m else None


def _factors(g: Graph, change: Change) -> tuple[np.ndarray, np.ndarray]:
    """Per edge and per node: what the change multiplies its weight and slack by."""
    edge = np.ones(len(g.weight))
    node = np.ones(len(g.time))
    rank = _rank_of(change.what)
    if rank is not None:
        if rank not in g.ranks:
            raise GraphError(f"--what-if {change.spec}: rank {rank} is not in the traces")
        mine = g.edge_rank == rank
        work = mine & (g.category != COMM)
        factor = change.factor
        if change.of_rank is not None:
            if change.of_rank not in g.ranks:
                raise GraphError(f"--what-if {change.spec}: rank {change.of_rank} is not traced")
            theirs = (g.edge_rank == change.of_rank) & (g.category != COMM)
            factor *= g.weight[theirs].sum() / max(g.weight[work].sum(), 1e-9)
        edge[work] = factor
        node[(g.node_rank == rank) & (g.slack_category == OVERHEAD)] = factor
        return edge, node
    if change.what in _TARGETS:
        cat = _TARGETS[change.what]
        edge[g.category == cat] = change.factor
        node[g.slack_category == cat] = change.factor
        return edge, node
    picked = g.op == change.what
    if not picked.any():
        known = sorted({o for o in g.op if o})
        raise GraphError(
            f"--what-if {change.spec}: no {change.what!r} in the step (its collectives: "
            f"{', '.join(known) or 'none'}; or compute, comm, link, overhead, data, rankN)"
        )
    edge[picked] = change.factor
    return edge, node


def replay(g: Graph, weight: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """Every node's time with these weights and slacks: the latest predecessor's time plus
    weight, plus the node's slack, in topological order (Kahn's, over the graph's edges). The
    sources (each rank's step start) stay where they were."""
    n = len(g.time)
    out_order = np.argsort(g.src, kind="stable")
    out_first = np.searchsorted(g.src[out_order], np.arange(n + 1)).tolist()
    out_order, dst, w = out_order.tolist(), g.dst.tolist(), weight.tolist()
    indegree = np.bincount(g.dst, minlength=n).tolist()
    ready = [-np.inf] * n
    time = g.time.tolist()
    stack = [v for v in range(n) if indegree[v] == 0]
    sources = set(stack)
    placed = 0
    while stack:
        v = stack.pop()
        if v not in sources:
            time[v] = ready[v] + slack[v]
        placed += 1
        tv = time[v]
        for e in out_order[out_first[v] : out_first[v + 1]]:
            d = dst[e]
            if tv + w[e] > ready[d]:
                ready[d] = tv + w[e]
            indegree[d] -= 1
            if indegree[d] == 0:
                stack.append(d)
    if placed < n:
        raise GraphError(f"step {g.step}: the graph has a cycle ({n - placed} nodes unplaced)")
    return np.asarray(time)


def what_if(g: Graph, changes: list[Change]) -> dict:
    """The step with ``changes`` applied together: its length and the gain over the measured."""
    weight, slack = g.weight.copy(), g.slack
    for change in changes:
        edge, node = _factors(g, change)
        weight, slack = weight * edge, slack * node
    time = replay(g, weight, slack)
    before = float(g.time[g.end] - g.time[g.start])
    after = float(time[g.end] - g.time[g.start])
    return {
        "what_if": ", ".join(c.spec for c in changes),
        "step_us": before,
        "predicted_us": after,
        "saves_us": before - after,
        "saves_pct": 100.0 * (before - after) / before if before > 0 else 0.0,
    }


def candidates(g: Graph) -> list[Change]:
    """The changes a report weighs: each collective op and all communication twice as fast,
    computation and overhead 20 % faster, and each rank as fast as the fastest."""
    ops = sorted({o for o in g.op if o})
    out = [parse_change(f"{op}=0.5x") for op in ops] if len(ops) > 1 else []  # else the link's
    out += [parse_change(s) for s in ("link=2x", "compute=0.8x", "overhead=0.8x")]
    if DATA in set(g.category):
        out.append(parse_change("data=0.5x"))
    work = pd.Series(g.weight[g.category != COMM]).groupby(g.edge_rank[g.category != COMM]).sum()
    work = work[work.index >= 0]
    if len(work) > 1:
        fastest = int(work.idxmin())
        out += [
            parse_change(f"rank{r}=1.0x-of-rank{fastest}")
            for r in work.index
            if r != fastest and work[r] > work[fastest] * 1.02
        ]
    return out


def best_changes(g: Graph, k: int = 3) -> pd.DataFrame:
    """The ``k`` candidate changes that would save the most, each alone."""
    rows = [what_if(g, [c]) for c in candidates(g)]
    df = pd.DataFrame(rows, columns=["what_if", "step_us", "predicted_us", "saves_us", "saves_pct"])
    return df.sort_values("saves_us", ascending=False, kind="stable").head(k).reset_index(drop=True)


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
