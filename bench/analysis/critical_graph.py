"""One profiled step of every rank as one graph of what waited for what: the graph the critical
path is the longest path of (docs/analysis.md, "Critical path").

Each rank's step is cut into lanes that run one thing at a time: each host thread (its
outermost ops), each GPU stream (its kernels), each of gloo's worker threads (its collectives).
A node is a moment on a lane; consecutive nodes of a lane are joined by the lane's edge, whose
weight is the work done between them (an op, a kernel: its duration) or nothing (a gap, or the
thread blocked on something). Edges across lanes say what a node could not happen before:

- a kernel starts after its launch (the host's launch call with the kernel's correlation id);
- a host thread blocked on the device (``cuda*Synchronize``) resumes after the last kernel that
  ended by then; blocked on a gloo collective (``breakdown.blocking_waits``), after that
  collective ends;
- a gloo collective starts on its worker thread after the host thread issued it (the host's
  moment at the collective's start);
- a collective ends after its last member arrives: call k of a step on every rank is one call
  (issue order, as the sequence extractor matches them), and its end on rank r depends on each
  member's start with the weight ``T_r`` = its end less the last member's start: the transfer
  after everyone is there. A rank's wait for a slow peer so points at the peer's work;
- a point-to-point send and its receive are a call of two members, matched per (sender,
  receiver) pair in issue order within the step: the receive ends after the send started,
  and the send after the receive was posted (gloo hands the data over once both sides are
  there). Each starts where the host called into the library (``c10d::send``, ``c10d::recv_``:
  the peer is its argument, a rank of its group, mapped to the job's by the trace's groups)
  and ends where gloo's span of it ends. A pipeline stage blocked in a receive so points at
  the previous stage's work.

The first three kinds are in one rank's trace and are found as its lanes are cut
(``rank_graphs``, while a folder is read); the last joins the ranks (``step_graph``).

A node's time is the latest of its predecessors' times plus their edges' weights, plus its own
slack: the delay nothing in the trace explains (Python between ops, a launch's latency, the
device idle). With the measured slack the recurrence gives back every measured time; with
other weights (``critical_what_if.what_if``) it gives the step those weights would make.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bench.analysis.breakdown import blocking_waits
from bench.analysis.trace import (
    GLOO_SPAN,
    Trace,
    name_matches,
    nesting_depth,
    prepared,
    step_windows,
)
from parallel_kernels.facts import PIPELINE_SCHEDULE_SPAN, POINT_TO_POINT, op_name

COMPUTE = "computation"
COMM = "communication"
WAIT = "waiting for a peer"
OVERHEAD = "launch and CPU overhead"
IDLE = "idle"
DATA = "data loading"
MEMORY = "memory copies"
CATEGORIES = (COMPUTE, COMM, WAIT, OVERHEAD, IDLE, DATA, MEMORY)
LAUNCH = "launch"  # a launch edge's mark: a kernel's delay after it is launch overhead

DATA_LOADING = re.compile(r"^enumerate\(DataLoader\)")
HOST_SYNC = re.compile(r"^cuda(Stream|Device|Event)Synchronize$")
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
# spans that hold a step's work without being work: the step itself, a pipeline's schedule
CONTAINERS = re.compile(rf"^(?:ProfilerStep#\d+|{re.escape(PIPELINE_SCHEDULE_SPAN)})$")


class GraphError(ValueError):
    """A step that cannot be made a graph; one line, naming what is wrong."""


@dataclass
class Lane:
    rank: int
    name: str  # "thread 123", "stream 7", "gloo thread 9"
    kind: str  # host, device, comm
    times: np.ndarray  # node times, sorted
    weight: np.ndarray  # work between node i and i + 1 (0: a gap or a wait)
    category: np.ndarray  # of that work (object)
    label: np.ndarray  # the op or kernel doing it (object)
    op: np.ndarray  # a collective's op name, else "" (object)
    first: int = 0  # id of the lane's first node, once placed


# -- one rank's lanes --------------------------------------------------------------------------
def _host_category(name: str, kind: str, gpu: bool) -> str:
    if DATA_LOADING.match(name):
        return DATA
    if kind == "comm_cpu" or gpu:
        return OVERHEAD  # a call into the library; on GPUs the host launches, the device works
    return COMPUTE


def _lane(rank, name, kind, times, work) -> Lane:
    """A lane whose nodes are ``times`` and whose work is the spans ``work`` (start, end,
    category, label, op, counts: is its duration the lane edge's weight?)."""
    t = np.unique(np.asarray(times, dtype=float))
    n = max(len(t) - 1, 0)
    weight = np.zeros(n)
    category = np.full(n, "", dtype=object)
    label = np.full(n, "", dtype=object)
    op = np.full(n, "", dtype=object)
    mids = (t[:-1] + t[1:]) / 2
    for s, e, cat, lab, o, counts in work:
        lo, hi = np.searchsorted(mids, s), np.searchsorted(mids, e)
        weight[lo:hi] = (t[1:] - t[:-1])[lo:hi] if counts else 0.0
        category[lo:hi], label[lo:hi], op[lo:hi] = cat, lab, o
    return Lane(rank, name, kind, t, weight, category, label, op)


@dataclass
class RankSteps:
    """What one rank contributes to a step's graph: its lanes and the edges between them, in
    (lane index, time) coordinates, placed into node ids when the ranks are joined."""

    rank: int
    window: tuple[float, float]
    lanes: list[Lane]
    edges: list[tuple]  # (src lane, src time, dst lane, dst time, weight, category, label, op)
    calls: list[dict]  # collectives in issue order: lane, start, end, op
    p2p: list[dict] = field(default_factory=list)  # sends, receives: lane, start, end, op, peers


@dataclass
class RankGraphs:
    """A trace reduced to what the critical path needs of it (``folder.load_trace_dir``'s
    ``reduce``): each of its steps' lanes and edges, without its events."""

    path: object
    rank: int
    world_size: int
    backend: str | None
    is_gpu: bool
    steps: dict[int, RankSteps]


def rank_graphs(
    trace: Trace, steps: list[int] | None = None, last: int | None = None
) -> RankGraphs:
    """One rank's profiled steps: ``steps`` (those of them it holds), else its ``last`` ones,
    else all (-1: the whole trace, where it has no steps). The events are grouped by step
    once, so that a trace of thousands of steps costs its events, not steps x events."""
    ev = prepared(trace)
    windows = step_windows(ev)
    have = windows["step"].tolist()
    if not have:
        got = {-1: rank_step(trace, -1, ev[ev["dur"] >= 0], None)}
    else:
        chosen = [k for k in have if k in steps] if steps else have[-last:] if last else have
        bounds = windows.set_index("step")
        groups = dict(list(ev[ev["step"].isin(chosen)].groupby("step")))
        empty = ev.iloc[:0]
        got = {
            k: rank_step(trace, k, groups.get(k, empty), tuple(bounds.loc[k, ["start", "end"]]))
            for k in chosen
        }
    return RankGraphs(trace.path, trace.rank, trace.world_size, trace.backend, trace.is_gpu, got)


def rank_step(
    trace: Trace, step: int, mine: pd.DataFrame, window: tuple[float, float] | None
) -> RankSteps:
    """One rank's lanes and edges for ``step``: its events ``mine`` in its host ``window`` (None:
    the whole trace, from its first event to its last)."""
    gpu = trace.is_gpu
    if window is not None:
        w0, w1 = float(window[0]), float(window[1])
    else:
        w0 = float(mine["ts"].min())
        w1 = float((mine["ts"] + mine["dur"]).max())
    device = mine[(mine["stream"] >= 0) & mine["kind"].isin(["compute", "comm", "memory"])]
    host = mine[(mine["stream"] < 0) & mine["cat"].isin(HOST_CATS)]
    host = host[~name_matches(host["name"], CONTAINERS)]
    gloo = host[name_matches(host["name"], GLOO_SPAN)]
    host = host.drop(gloo.index)
    if len(device):
        w1 = max(w1, float((device["ts"] + device["dur"]).max()))
    p2p = _is_p2p(gloo)
    step_events = _StepEvents(
        trace.rank, mine, host, gloo, gloo[~p2p], gloo[p2p], device, gpu, (w0, w1)
    )
    lanes: list[Lane] = []
    edges: list[tuple] = []
    calls: list[dict] = []
    spans = _comm_lanes(step_events, lanes, calls)
    p2p, issues = _p2p_lanes(step_events, lanes, spans, _group_ranks(trace))
    _host_lanes(step_events, lanes, edges, spans, issues)
    return RankSteps(trace.rank, (w0, w1), lanes, edges, calls, p2p)


@dataclass(frozen=True, eq=False)
class _StepEvents:
    """One rank's events of a step, sorted by the lanes they make."""

    rank: int
    events: pd.DataFrame  # every event of the step (its blocking waits are read from them)
    host: pd.DataFrame  # host threads' ops, gloo's collective spans left out
    gloo: pd.DataFrame  # gloo's spans, on its worker threads
    collectives: pd.DataFrame  # those of collectives
    p2p: pd.DataFrame  # those of sends and receives
    device: pd.DataFrame  # kernels, collectives and memory copies on GPU streams
    gpu: bool
    window: tuple[float, float]  # the step's start and end on this rank


def _comm_lanes(step: _StepEvents, lanes: list[Lane], calls: list[dict]) -> dict:
    """Device streams and gloo threads as lanes; their collectives listed with their starts
    (issue order once sorted: a stream runs its kernels in launch order, gloo's worker takes
    calls first in, first out). Returns {correlation or event index: (lane, start, end)} of
    every span."""
    rank = step.rank
    spans: dict = {}
    groups = [
        ("device", "stream", step.device, "stream"),
        ("comm", "gloo thread", step.collectives, "tid"),
    ]
    for kind, prefix, events, key in groups:
        for lane_key, sub in events.groupby(key, sort=True):
            sub = sub.sort_values("ts", kind="stable")
            s = sub["ts"].to_numpy(dtype=float)
            e = s + sub["dur"].to_numpy(dtype=float)
            work = []
            for i, (name, k) in enumerate(zip(sub["name"].astype(str), sub["kind"], strict=True)):
                is_comm = k == "comm"
                cat = COMM if is_comm else MEMORY if k == "memory" else COMPUTE
                op = op_name(name) if is_comm else ""
                work.append((s[i], e[i], cat, name, op, not is_comm))
            lane_id = len(lanes)
            lanes.append(_lane(rank, f"{prefix} {lane_key}", kind, np.concatenate([s, e]), work))
            for i, (idx, corr, k) in enumerate(
                zip(sub.index, sub["correlation"], sub["kind"], strict=True)
            ):
                spans[("corr", int(corr)) if kind == "device" else ("ev", idx)] = (
                    lane_id,
                    s[i],
                    e[i],
                )
                if k == "comm":
                    name = str(sub.at[idx, "name"])
                    calls.append({"lane": lane_id, "start": s[i], "end": e[i], "op": op_name(name)})
    return spans


def _is_p2p(spans: pd.DataFrame) -> np.ndarray:
    names = spans["name"].astype(str)
    return names.map({n: op_name(n) in POINT_TO_POINT for n in names.unique()}).to_numpy(bool)


def _group_ranks(trace: Trace) -> list[tuple[int, ...]]:
    """The job's process groups as the trace lists them (``distributedInfo``'s ``pg_config``),
    each its members' ranks in the job; none listed: the job's ranks, one group."""
    groups = [tuple(g.get("ranks") or ()) for g in trace.dist_info.get("pg_config") or ()]
    return [g for g in groups if g] or [tuple(range(trace.world_size))]


def _peer_arg(signature) -> int | None:
    """The peer a ``c10d::send``/``c10d::recv_`` names (its third argument, a rank of its
    group), from the op's recorded signature (``[dims, types, concrete]``)."""
    try:
        return int(json.loads(str(signature))[2][2])
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def _p2p_lanes(
    step: _StepEvents, lanes: list[Lane], spans: dict, groups: list[tuple[int, ...]]
) -> tuple[list[dict], list[tuple]]:
    """Each send and receive of the step as a lane of its own (its start, its end: gloo's span
    of it may overlap others on the thread that issued it), listed with the job's ranks it may
    have gone to (``peers``: (group, that rank, this rank's place in the group) each). Returns
    the list and the issues: (thread, time, span key) each."""
    rank, host = step.rank, step.host
    mine = step.p2p.sort_values("ts", kind="stable")
    calls = host[(host["kind"] == "comm_cpu") & _is_p2p(host)] if len(mine) else host.iloc[:0]
    out, issues = [], []
    for idx, name, tid, ts, dur in zip(
        mine.index, mine["name"].astype(str), mine["tid"], mine["ts"], mine["dur"], strict=True
    ):
        op = op_name(name)
        by = calls[(calls["tid"] == tid) & (calls["ts"] <= ts) & (calls["ts"] + calls["dur"] >= ts)]
        start = float(by["ts"].iloc[-1]) if len(by) else float(ts)  # where the host called it
        peer = _peer_arg(by["shapes"].iloc[-1]) if len(by) and "shapes" in by else None
        peers = {
            (g, g[peer], g.index(rank))
            for g in groups
            if peer is not None and rank in g and 0 <= peer < len(g) and g[peer] != rank
        }
        end = max(float(ts + dur), start)
        lane_id = len(lanes)
        lanes.append(_lane(rank, f"{op} {len(out)}", "comm", [start, end], []))
        lanes[-1].category[:], lanes[-1].label[:], lanes[-1].op[:] = COMM, op, op
        spans[("ev", idx)] = (lane_id, start, end)
        issues.append((tid, start, ("ev", idx)))
        out.append({"lane": lane_id, "start": start, "end": end, "op": op, "peers": peers})
    return out, issues


def _host_lanes(
    step: _StepEvents, lanes: list[Lane], edges: list[tuple], spans: dict, p2p_issues: list
) -> None:
    """Every host thread with ops in the step as a lane (its outermost ops), with the edges of
    launches, of waits on the device or a collective, and of gloo's issues (a collective's at
    its span's start on the main thread, a send's or receive's at the call that issued it)."""
    rank, host, gpu = step.rank, step.host, step.gpu
    w0, w1 = step.window
    waits = _waits(step)
    gloo = step.collectives
    main = _main_tid(host)
    issues = [(main, float(t), ("ev", i)) for t, i in zip(gloo["ts"], gloo.index, strict=True)]
    issues += p2p_issues
    lingering = {key for _, _, key in p2p_issues}
    for tid, sub in host.groupby("tid", sort=True):
        sub = sub.sort_values(["ts", "dur"], ascending=[True, False], kind="stable")
        s = sub["ts"].to_numpy(dtype=float)
        e = s + sub["dur"].to_numpy(dtype=float)
        top = nesting_depth(s, e) == 0
        names = sub["name"].astype(str).to_numpy()
        kinds = sub["kind"].to_numpy()
        work = [
            (s[i], e[i], _host_category(names[i], kinds[i], gpu), names[i], "", True)
            for i in np.flatnonzero(top)
        ]
        mine = [w for w in waits if w[0] == tid]
        work += [(lo, hi, WAIT, "wait", "", False) for _, lo, hi, _ in mine]
        launches = sub[sub["correlation"] >= 0]
        issued = [(t, key) for who, t, key in issues if who == tid]
        points = [s[top], e[top], launches["ts"], [t for t, _ in issued], [w0, w1]]
        points += [[lo, hi] for _, lo, hi, _ in mine]
        lane_id = len(lanes)
        lanes.append(_lane(rank, f"thread {tid}", "host", np.concatenate(points), _inside(work)))
        for corr, t in zip(launches["correlation"], launches["ts"], strict=True):
            to = spans.get(("corr", int(corr)))
            if to is not None:
                edges.append((lane_id, float(t), to[0], to[1], 0.0, LAUNCH, "", ""))
        for t, key in issued:
            to = spans[key]
            edges.append((lane_id, float(t), to[0], to[1], 0.0, "", "", ""))
        for _, lo, hi, key in mine:
            if key in spans:
                src = spans[key]
                edges.append((src[0], src[2], lane_id, hi, 0.0, "", "", ""))
            if key in lingering:  # gloo's span of a send or receive ends once it is waited on
                edges.append((lane_id, lo, src[0], src[2], 0.0, "", "", ""))


def _inside(work: list[tuple]) -> list[tuple]:
    """Work spans with the waits last, so that a wait inside an op overrides the op there."""
    return sorted(work, key=lambda w: w[5] is False)


def _main_tid(host: pd.DataFrame):
    return host["tid"].mode().iloc[0] if len(host) else None


def _synchronous_calls(host: pd.DataFrame, device: pd.DataFrame) -> list[tuple]:
    """Runtime calls that returned only once their own device work was done (a copy to
    pageable host memory, ``cudaMemcpy``): the host waited for that copy, and the copy for
    what its stream ran before it."""
    calls = host[(host["cat"] == "cuda_runtime") & (host["correlation"] >= 0)]
    if calls.empty or device.empty:
        return []
    done = (device["ts"] + device["dur"]).groupby(device["correlation"]).max()
    end = calls["correlation"].map(done)
    call_end = calls["ts"] + calls["dur"]
    sync = end.notna() & (end <= call_end) & (end > calls["ts"])
    return [
        (tid, float(s), float(e), ("corr", int(c)))
        for tid, s, e, c in zip(
            calls["tid"][sync],
            calls["ts"][sync],
            call_end[sync],
            calls["correlation"][sync],
            strict=True,
        )
    ]


def _waits(step: _StepEvents) -> list[tuple]:
    """(thread, start, end, the span it waited for) of each blocking wait of the step."""
    host, device, gloo = step.host, step.device, step.gloo
    out = []
    if step.gpu:
        syncs = host[name_matches(host["name"], HOST_SYNC)]
        if len(syncs) and len(device):
            d_end = (device["ts"] + device["dur"]).to_numpy(dtype=float)
            order = np.argsort(d_end)
            for tid, s, dur in zip(syncs["tid"], syncs["ts"], syncs["dur"], strict=True):
                k = np.searchsorted(d_end[order], s + dur, side="right") - 1
                if k >= 0 and d_end[order[k]] > s:
                    corr = int(device["correlation"].iloc[order[k]])
                    out.append((tid, float(s), float(s + dur), ("corr", corr)))
        out += _synchronous_calls(host, device)
        return out
    if gloo.empty:
        return out
    blocked = blocking_waits(step.events)
    main = _main_tid(host)
    done = (gloo["ts"] + gloo["dur"]).to_numpy(dtype=float)
    for lo, hi in np.vstack(
        [blocked.reshape(-1, 2), _gap_waits(host[host["tid"] == main], step.window[1], done)]
    ):
        k = np.flatnonzero((done > lo) & (done <= hi))
        if len(k):
            out.append((main, float(lo), float(hi), ("ev", gloo.index[k[np.argmax(done[k])]])))
    return out


WAKE_US = 100.0  # a blocked thread resumes this soon after what it waited for completes


def _gap_waits(thread: pd.DataFrame, end: float, done: np.ndarray) -> np.ndarray:
    """Gaps between a thread's outermost ops in which it waited for a collective, though no op
    of its own says so: a gap after a call into the collective library (``dist.all_reduce``
    blocks in ``work.wait()`` after its op returns), and a gap the thread leaves within
    ``WAKE_US`` (or a tenth of the gap) of a collective's completion (DDP's reducer waits in
    autograd's final callback, which runs no op). [gap start, gap end] each."""
    thread = thread.sort_values(["ts", "dur"], ascending=[True, False], kind="stable")
    s = thread["ts"].to_numpy(dtype=float)
    e = s + thread["dur"].to_numpy(dtype=float)
    top = np.flatnonzero(nesting_depth(s, e) == 0)
    lo, hi = e[top], np.append(s[top][1:], end)
    after_call = thread["kind"].to_numpy()[top] == "comm_cpu"
    ends = np.sort(done)
    k = np.searchsorted(ends, hi, side="right") - 1  # the last completion by the gap's end
    last = np.where(k >= 0, ends[np.clip(k, 0, None)], -np.inf)
    woken = (last > lo) & (hi - last <= np.maximum(WAKE_US, 0.1 * (hi - lo)))
    keep = (hi > lo) & (after_call | woken)
    return np.column_stack([lo[keep], hi[keep]])


# -- the step's graph --------------------------------------------------------------------------
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
    _match_p2p(per_rank, step, nodes, notes)
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
        tally = ", ".join(f"rank {r} {n}" for r, n in sorted(counts.items()))
        raise GraphError(
            f"step {step}: the ranks' collectives do not match ({tally} calls; a hang or a "
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


def _pairs(per_rank: list[RankSteps], notes: list) -> dict[tuple[int, int], tuple[list, list]]:
    """Each (sender, receiver)'s sends and the receiver's receives from it, in issue order. A
    call's peer is the rank of a group both are in whose places match on both sides (the
    send names the receiver's place, the receive the sender's), else the one traced rank it
    may go to; a call with none, or more than one, is left out, with a note."""
    traced = {rs.rank: rs for rs in per_rank}
    pairs: dict[tuple[int, int], tuple[list, list]] = {}
    lost = 0
    for rs in per_rank:
        for call in rs.p2p:
            other = "recv" if call["op"] == "send" else "send"
            found = {
                peer
                for group, peer, _ in call["peers"]
                if peer in traced
                and any(
                    c["op"] == other and (group, rs.rank, group.index(peer)) in c["peers"]
                    for c in traced[peer].p2p
                )
            }
            if not found:  # no receive answers it: the one rank it may go to, if one
                found = {peer for _, peer, _ in call["peers"] if peer in traced}
            if len(found) != 1:
                lost += 1
                continue
            peer = found.pop()
            key = (rs.rank, peer) if call["op"] == "send" else (peer, rs.rank)
            pairs.setdefault(key, ([], []))[call["op"] == "recv"].append(call)
    if lost:
        notes.append(f"{lost} sends and receives whose peer the traces do not tell: not joined")
    return pairs


def _match_p2p(per_rank: list[RankSteps], step: int, nodes: _Nodes, notes: list) -> None:
    """The k-th send from rank a to rank b and b's k-th receive from a are one call of two
    members: each one's end depends on both starts, weighted by the transfer after the later
    start (GraphError: a pair whose counts differ)."""
    lanes = {rs.rank: rs.lanes for rs in per_rank}
    skewed = 0
    for (a, b), (sends, recvs) in sorted(_pairs(per_rank, notes).items()):
        if len(sends) != len(recvs):
            raise GraphError(
                f"step {step}: rank {a} sends {len(sends)} tensors to rank {b}, which receives "
                f"{len(recvs)} (a pipeline's stages that disagree, or a hang): python -m "
                "bench.hang diagnoses it"
            )
        by_start = sorted(sends, key=lambda c: c["start"]), sorted(recvs, key=lambda c: c["start"])
        for send, recv in zip(*by_start, strict=True):
            pair = {a: send, b: recv}
            begins = [_node(lanes[r][c["lane"]], c["start"]) for r, c in pair.items()]
            last = max(send["start"], recv["start"])
            # a send is done once its data arrived: gloo's span of it lasts until it is waited
            # on, which may be long after (a stage waits for its sends at the schedule's end)
            done = {a: min(send["end"], recv["end"]), b: recv["end"]}
            for r, c in pair.items():
                transfer = done[r] - last
                skewed += transfer < 0
                end = _node(lanes[r][c["lane"]], c["end"])
                for begin in begins:
                    nodes.edge(begin, end, max(transfer, 0.0), COMM, c["op"], c["op"], r)
    if skewed:
        notes.append(
            f"step {step}: {skewed} sends or receives ended before their peer's start "
            "(clocks of different hosts differ): their transfer taken as 0"
        )
