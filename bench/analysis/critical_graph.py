"""One profiled step of every rank as one graph of what waited for what (docs/analysis.md,
"Critical path").

Each rank's step is cut into lanes that run one thing at a time (``critical_lanes.py``): each
host thread (its outermost ops), each GPU stream (its kernels), each of gloo's worker threads
(its collectives); here they are joined. A node is a moment on a lane; consecutive nodes of a
lane are joined by the lane's edge, whose weight is the work done between them (an op, a
kernel: its duration) or nothing (a gap, or the thread blocked on something). Edges across
lanes say what a node could not happen before:

- a kernel starts after its launch (the host's launch call with the kernel's correlation id);
- a host thread blocked on the device (``cuda*Synchronize``) resumes after the last kernel that
  ended by then; blocked on a gloo collective (``breakdown.blocking_waits``), after that
  collective ends;
- a gloo collective starts on its worker thread after the host thread issued it (the host's
  moment at the collective's start);
- a collective ends after its last member arrives: call k of a step on every rank is one call
  (issue order, as the sequence extractor matches them), and its end on rank r depends on each
  member's start with the weight ``T_r`` = its end less the last member's start: the transfer
  after everyone is there. A rank's wait for a slow peer so points at the peer's work.

A node's time is the latest of its predecessors' times plus their edges' weights, plus its own
slack: the delay nothing in the trace explains (Python between ops, a launch's latency, the
device idle). With the measured slack the recurrence gives back every measured time; with
other weights (``critical_path.what_if``) it gives the step those weights would make.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bench.analysis.critical_lanes import COMM, IDLE, OVERHEAD, GraphError, Lane, RankSteps


@dataclass
class Graph:
    """A step's nodes and edges over every rank read (arrays, one row per node or edge)."""

    step: int
    ranks: list[int]
    time: np.ndarray  # per node: the measured time (us)
    node_rank: np.ndarray
    node_lane: np.ndarray  # index into lanes
    slack_category: np.ndarray  # what a node's own delay is (object)
    src: np.ndarray  # per edge
    dst: np.ndarray
    weight: np.ndarray
    category: np.ndarray  # object
    label: np.ndarray  # object
    op: np.ndarray  # object: a collective's op, else ""
    edge_rank: np.ndarray
    lanes: list[str]
    start: int  # the step's first node (the earliest rank's step start)
    end: int  # the step's last node (after every rank's last)
    notes: list[str] = field(default_factory=list)

    @property
    def slack(self) -> np.ndarray:
        """Each node's delay beyond its latest predecessor's time plus weight (>= 0)."""
        ready = np.full(len(self.time), -np.inf)
        np.maximum.at(ready, self.dst, self.time[self.src] + self.weight)
        out = self.time - ready
        out[~np.isfinite(out)] = 0.0  # sources
        return np.maximum(out, 0.0)


# -- every rank's lanes joined -----------------------------------------------------------------
_SLACK = {"host": OVERHEAD, "device": IDLE, "comm": OVERHEAD}


class _Nodes:
    """Node ids of lanes laid end to end, and the edge columns being filled."""

    def __init__(self) -> None:
        self.time: list[np.ndarray] = []
        self.rank: list[np.ndarray] = []
        self.lane: list[np.ndarray] = []
        self.slack: list[np.ndarray] = []
        self.count = 0
        self.edges: dict[str, list] = {k: [] for k in _EDGE_COLUMNS}

    def add(self, times, rank: int, lane: int, slack: str) -> int:
        first = self.count
        times = np.atleast_1d(np.asarray(times, dtype=float))
        self.time.append(times)
        self.rank.append(np.full(len(times), rank))
        self.lane.append(np.full(len(times), lane))
        self.slack.append(np.full(len(times), slack, dtype=object))
        self.count += len(times)
        return first

    def edge(self, src, dst, weight, category="", label="", op="", rank=-1) -> None:
        for k, v in zip(_EDGE_COLUMNS, (src, dst, weight, category, label, op, rank), strict=True):
            self.edges[k].append(v)


_EDGE_COLUMNS = ("src", "dst", "weight", "category", "label", "op", "rank")


def _node(lane: Lane, t: float) -> int:
    i = int(np.searchsorted(lane.times, t))
    i = min(max(i, 0), len(lane.times) - 1)
    if i > 0 and abs(lane.times[i - 1] - t) < abs(lane.times[i] - t):
        i -= 1
    return lane.first + i


def step_graph(per_rank: list[RankSteps], step: int) -> Graph:
    """The ranks' lanes of one step joined into one graph, their collectives matched call by
    call (GraphError: ranks whose calls do not match)."""
    nodes, lanes, notes = _Nodes(), [], []
    starts, ends = [], []
    for rs in per_rank:
        start = nodes.add(rs.window[0], rs.rank, -1, IDLE)
        starts.append(start)
        last = []
        for lane in rs.lanes:
            lane.first = nodes.add(lane.times, rs.rank, len(lanes), _SLACK[lane.kind])
            lanes.append(f"rank {rs.rank} {lane.name}")
            if len(lane.times) == 0:
                continue
            ids = lane.first + np.arange(len(lane.times))
            for k in range(len(lane.weight)):
                nodes.edge(
                    ids[k], ids[k + 1], lane.weight[k], lane.category[k], lane.label[k],
                    lane.op[k], rs.rank,
                )  # fmt: skip
            nodes.edge(start, ids[0], 0.0, rank=rs.rank)
            last.append((lane.times[-1], ids[-1]))
        end = nodes.add(max(t for t, _ in last), rs.rank, -1, IDLE)
        for _, i in last:
            nodes.edge(i, end, 0.0, rank=rs.rank)
        ends.append(end)
        for sl, st, dl, dt, w, cat, lab, op in rs.edges:
            nodes.edge(_node(rs.lanes[sl], st), _node(rs.lanes[dl], dt), w, cat, lab, op, rs.rank)
    _match_calls(per_rank, step, nodes, notes)
    times = np.concatenate(nodes.time)
    final = nodes.add(times[ends].max(), -1, -1, IDLE)
    for e in ends:
        nodes.edge(e, final, 0.0)
    ed = nodes.edges
    return Graph(
        step=step,
        ranks=[rs.rank for rs in per_rank],
        time=np.concatenate(nodes.time),
        node_rank=np.concatenate(nodes.rank),
        node_lane=np.concatenate(nodes.lane),
        slack_category=np.concatenate(nodes.slack),
        src=np.asarray(ed["src"], dtype=np.int64),
        dst=np.asarray(ed["dst"], dtype=np.int64),
        weight=np.asarray(ed["weight"], dtype=float),
        category=np.asarray(ed["category"], dtype=object),
        label=np.asarray(ed["label"], dtype=object),
        op=np.asarray(ed["op"], dtype=object),
        edge_rank=np.asarray(ed["rank"], dtype=np.int64),
        lanes=lanes,
        start=int(min(starts, key=lambda i: times[i])),
        end=final,
        notes=notes,
    )


def _match_calls(per_rank: list[RankSteps], step: int, nodes: _Nodes, notes: list) -> None:
    """Call k of the step on every rank is one call: its end on each rank depends on every
    member's start, weighted by the transfer after the last one arrived."""
    counts = {rs.rank: len(rs.calls) for rs in per_rank}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"rank {r} {n}" for r, n in sorted(counts.items()))
        raise GraphError(
            f"step {step}: the ranks' collectives do not match ({said} calls; a hang or a "
            "rank that left early): python -m bench.hang diagnoses it"
        )
    ordered = {rs.rank: sorted(rs.calls, key=lambda c: c["start"]) for rs in per_rank}
    lanes = {rs.rank: rs.lanes for rs in per_rank}
    skewed = 0
    for k in range(next(iter(counts.values()), 0)):
        calls = {r: ordered[r][k] for r in ordered}
        ops = {c["op"] for c in calls.values()}
        if len(ops) > 1:
            raise GraphError(
                f"step {step}, call #{k}: the ranks issued different ops {sorted(ops)}"
            )
        begins = {r: _node(lanes[r][c["lane"]], c["start"]) for r, c in calls.items()}
        last = max(c["start"] for c in calls.values())
        for r, c in calls.items():
            transfer = c["end"] - last
            if transfer < 0:
                skewed += 1
            end = _node(lanes[r][c["lane"]], c["end"])
            for m in calls:
                nodes.edge(begins[m], end, max(transfer, 0.0), COMM, c["op"], c["op"], r)
    if skewed:
        notes.append(
            f"step {step}: {skewed} collective ends came before their last member's start "
            "(clocks of different hosts differ): their transfer taken as 0"
        )
