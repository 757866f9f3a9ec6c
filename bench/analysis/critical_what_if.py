"""What making one thing of a profiled step faster would save: the step's graph
(``critical_graph.py``) with its edge weights changed (``compute=0.8x``, ``all_reduce=0.5x``,
``link=2x``, ``p2p=0x``, ``rank1=1.0x-of-rank0``) and every node's time recomputed in
topological order as the latest predecessor's time plus weight, plus the node's measured
slack: the step those durations would make, on the schedule the trace shows
(docs/analysis.md, "Critical path").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.analysis.critical_graph import COMM, COMPUTE, DATA, OVERHEAD, Graph, GraphError
from parallel_kernels.facts import POINT_TO_POINT

P2P_OPS = list(POINT_TO_POINT)  # ``p2p=0.5x``: every send and receive

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
    """``compute=0.8x``, ``all_reduce=0.5x``, ``link=2x``, ``overhead=0.5x``, ``p2p=0x`` (every
    send and receive), ``rank1=2x``,
    ``rank1=1.0x-of-rank0``; ValueError with one line otherwise."""
    m = _CHANGE.match(spec.strip())
    if not m:
        raise ValueError(
            f"--what-if {spec!r}: expected NAME=FACTORx (compute, comm, link, overhead, data, "
            "p2p, an op such as all_reduce, or rankN; rankN=1.0x-of-rankM)"
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
    picked = np.isin(g.op, P2P_OPS) if change.what == "p2p" else g.op == change.what
    if not picked.any():
        known = sorted({o for o in g.op if o})
        raise GraphError(
            f"--what-if {change.spec}: no {change.what!r} in the step (its collectives: "
            f"{', '.join(known) or 'none'}; or compute, comm, link, overhead, data, p2p, rankN)"
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
    """The step with all of ``changes`` applied: its length and the gain over the measured."""
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
