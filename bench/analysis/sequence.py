"""The communication sequence of a job: each rank's collective calls in the order it issued them,
with what a replay needs to issue them again (op, dtype, element count, process group) and how
long each took in the trace.

GPU (NCCL) traces: a call is the ``record_param_comms`` op that launched a communication kernel
(the kernel's launch has its correlation id, and the op encloses the launch on the same
thread). Its arguments say what it was (``Collective name``, ``In msg nelems``, ``dtype``, the
process group; torch/csrc/profiler/util.cpp, ``saveNcclMeta``). Older PyTorch recorded none
of that (HolisticTraceAnalysis's ``sampled_rank`` traces, of April 2023), only the
``nccl:<op>`` annotation inside it with the input's shape and type, which is read instead. A
launch inside an ``nccl:<op>`` annotation and no ``record_param_comms`` (``_allgather_base``
in those traces) is a call too: leaving it out would make the replay skip a collective.

CPU (gloo) traces: a call is a ``gloo:<op>`` span, the op's own run on one of gloo's threads,
ordered by when the op that issued it (``c10d::allreduce_`` on the caller's thread) began; by
its own start where the trace has no such op. Gloo names no group: each call is taken to be on
all the ranks of the job, or on the one group whose members are exactly the ranks traced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench.analysis.reader import ISSUE_NAME, TraceError
from bench.analysis.sequence_groups import gloo_group
from bench.analysis.sequence_groups import span as _span
from bench.analysis.trace import Trace, common_steps, name_matches, prepared, step_windows
from bench.analysis.trace_folder import load_trace_dir
from parallel_kernels.facts import ITEM_BYTES, OPS, POINT_TO_POINT, TORCH_DTYPE, op_name

SEQUENCE_COLUMNS = [
    "rank",
    "step",
    "index",
    "op",
    "dtype",
    "count",
    "out_count",
    "nbytes",
    "group",
    "group_ranks",
    "group_size",
    "group_known",
    "traced_us",
    "ts",
]

_RPC = re.compile(r"^record_param_comms$")
_NCCL_ANNOTATION = re.compile(r"^nccl:")


class SequenceError(ValueError):
    """A folder whose communication sequence cannot be extracted; one line, naming it."""


def _op_of(name) -> str | None:
    return None if pd.isna(name) else op_name(str(name))


def _ranks(text, start, stride, size) -> tuple:
    """``Process Group Ranks`` as a tuple. Kineto lists at most 30 ranks, then ``...``
    (``kTruncatLength``, torch/csrc/profiler/util.cpp); the rest follow from the group's
    first rank and stride where the ranks are evenly spaced (``Global rank stride`` > 0)."""
    items = text if isinstance(text, list) else str(text).strip("[] ").split(",")
    listed = [int(r) for r in items if str(r).strip().lstrip("-").isdigit()]
    truncated = isinstance(text, str) and "..." in text
    if truncated and size and start is not None and stride and stride > 0:
        return tuple(range(start, start + stride * size, stride))
    return tuple(listed)


def _group(label, world: int) -> tuple[str, tuple, int, bool]:
    """(group, group_ranks, group_size, group_known) of a call's ``comm_group`` label."""
    g = {} if label is None else json.loads(label)
    if g.get("name") is None:
        return "0", tuple(range(world)), world, False
    size = g.get("size")
    ranks = _ranks(g.get("ranks", "[]"), g.get("start"), g.get("stride"), size)
    if not ranks and size == world:  # the default group, where an old PyTorch lists none
        ranks = tuple(range(world))
    return str(g["name"]), ranks, int(size if size is not None else len(ranks)), True


def _enclosing(spans: pd.DataFrame, points: pd.DataFrame) -> dict:
    """For each point (a kernel launch), the innermost span of each kind enclosing it on the
    same thread: {point index: {kind: span index}}. Spans of one thread nest (a thread's
    record_function ranges open and close as a stack), so one sweep in time order finds them.
    """
    out: dict = {}
    for key, pts in points.groupby(["pid", "tid"], observed=True, sort=False):
        sp = spans[(spans["pid"] == key[0]) & (spans["tid"] == key[1])]
        items = sorted(
            [
                (s, 0, -e, i, k)
                for s, e, i, k in zip(
                    sp["ts"], sp["ts"] + sp["dur"], sp.index, sp["span"], strict=True
                )
            ]
            + [(t, 1, 0.0, i, "") for t, i in zip(pts["ts"], pts.index, strict=True)]
        )
        stack: list = []
        for t, is_point, neg_end, i, kind in items:
            while stack and stack[-1][0] < t:  # ended before t
                stack.pop()
            if not is_point:
                stack.append((-neg_end, i, kind))
                continue
            found: dict = {}
            for end, j, k in reversed(stack):
                if end >= t:
                    found.setdefault(k, j)
            out[i] = found
    return out


def _gpu_calls(ev: pd.DataFrame) -> pd.DataFrame:
    kernels = ev[(ev["kind"] == "comm") & (ev["stream"] >= 0)]
    # as trace.comm_bytes_from_launch: the launch is the host event with the kernel's
    # correlation id
    launches = ev[(ev["stream"] < 0) & (ev["correlation"] >= 0)].drop_duplicates("correlation")
    launch_index = pd.Series(launches.index, index=launches["correlation"].to_numpy())
    launch_of = kernels["correlation"].map(launch_index)
    host = ((ev["stream"] < 0) & (ev["cat"] != "gpu_user_annotation")).to_numpy()
    spans = pd.concat(
        [
            ev[host & name_matches(ev["name"], _RPC)].assign(span="rpc"),
            ev[host & name_matches(ev["name"], _NCCL_ANNOTATION)].assign(span="ann"),
        ]
    )
    points = ev.loc[launch_of.dropna().astype(int).unique()]
    found = _enclosing(spans, points)
    rows: dict = {}  # the call's event index -> its row
    for k, launch in zip(kernels.index, launch_of, strict=True):
        src = found.get(int(launch), {}) if pd.notna(launch) else {}
        call = src.get("rpc", src.get("ann", k))
        row = rows.get(call)
        if row is None:
            rows[call] = _gpu_call(ev, src, k, launch)
        else:
            row["traced_us"] += ev.at[k, "dur"]
    return pd.DataFrame(list(rows.values()))


def _gpu_call(ev: pd.DataFrame, src: dict, kernel, launch) -> dict:
    """One call's row from its record_param_comms op and/or nccl:<op> annotation, the first
    of them that says each thing; a kernel with neither is a call of its own, issued at its
    launch."""
    rpc, ann = src.get("rpc"), src.get("ann")
    call = rpc if rpc is not None else ann
    if call is None:
        call = int(launch) if pd.notna(launch) else kernel
    op = _op_of(ev.at[rpc, "comm_name"]) if rpc is not None else None
    op = op or (op_name(str(ev.at[ann, "name"])) if ann is not None else None)
    op = op or op_name(str(ev.at[kernel, "name"]))
    count, dtype = np.nan, None
    for s in (rpc, ann):
        if s is not None and pd.notna(ev.at[s, "comm_count"]):
            count, dtype = ev.at[s, "comm_count"], ev.at[s, "comm_dtype"]
            break
    return {
        "step": ev.at[kernel, "step"],
        "op": op,
        "raw_dtype": dtype,
        "count": count,
        "out_count": ev.at[rpc, "comm_out_count"] if rpc is not None else np.nan,
        "label": ev.at[rpc, "comm_group"] if rpc is not None else np.nan,
        "traced_us": ev.at[kernel, "dur"],
        "ts": ev.at[call, "ts"],
    }


def _issued_at(spans: pd.DataFrame, ev: pd.DataFrame) -> np.ndarray:
    """When each gloo span's call was issued: the start of the earliest op not yet matched that
    issued a collective with the span's element count among its first two arguments'
    (``c10d::allreduce_`` on the caller's thread) and began before the span, one of the same
    op first (gloo runs some calls as another op: FSDP's reduce-scatter as an all-reduce of
    its input); the span's own start where no op matches (a trace recorded without shapes).
    gloo's threads take calls first in, first out, but a thread descheduled between taking a
    call and starting its span lets the next call's span start first (on a loaded machine,
    DDP's buckets can be traced out of order on one rank), so the spans' starts alone do not
    give the order."""
    issue = ev[name_matches(ev["name"], ISSUE_NAME) & ev["comm_count"].notna()]
    issue = issue.sort_values("ts", kind="stable")
    pending, end_of = [], {}  # (ts, op, counts) in issue order
    for i, tid, ts, dur in zip(issue.index, issue["tid"], issue["ts"], issue["dur"], strict=True):
        op = op_name(str(ev.at[i, "name"]))
        if op in OPS and ts >= end_of.get(tid, -np.inf):  # an op inside another issues nothing
            pending.append((ts, op, {ev.at[i, "comm_count"], ev.at[i, "comm_out_count"]}))
            end_of[tid] = ts + dur
    out = spans["ts"].to_numpy(dtype=float).copy()
    ops = spans["name"].astype(str).map(op_name).to_numpy()
    counts = spans["comm_count"].to_numpy(dtype=float)
    for k in np.argsort(out, kind="stable"):
        sized = [j for j, (ts, _, n) in enumerate(pending) if ts <= out[k] and counts[k] in n]
        same = [j for j in sized if pending[j][1] == ops[k]]
        if sized:
            out[k] = pending.pop((same or sized)[0])[0]
    return out


def _cpu_calls(ev: pd.DataFrame) -> pd.DataFrame:
    comm = ev[ev["kind"] == "comm"]
    return pd.DataFrame(
        {
            "step": comm["step"],
            "op": comm["name"].astype(str).map(op_name),
            "raw_dtype": comm["comm_dtype"],
            "count": comm["comm_count"],
            "out_count": np.nan,
            "label": np.nan,
            "traced_us": comm["dur"],
            "ts": _issued_at(comm, ev),
        }
    )


def trace_sequence(trace: Trace) -> pd.DataFrame:
    """One rank's collective calls in issue order, one row per call (SEQUENCE_COLUMNS)."""
    ev = prepared(trace)
    calls = _gpu_calls(ev) if trace.is_gpu else _cpu_calls(ev)
    if calls.empty:
        return pd.DataFrame(columns=SEQUENCE_COLUMNS)
    calls = calls.sort_values("ts", kind="stable").reset_index(drop=True)
    calls["rank"] = trace.rank
    calls["step"] = calls["step"].astype(int)
    calls["index"] = calls.groupby("step").cumcount()
    spelled = calls["raw_dtype"].astype(object)
    calls["dtype"] = spelled.map(lambda d: None if pd.isna(d) else TORCH_DTYPE.get(d, str(d)))
    calls["count"] = pd.array(calls["count"].round(), dtype="Int64")
    calls["out_count"] = calls["out_count"].astype(float)
    item = calls["dtype"].map(ITEM_BYTES).astype(float)
    calls["nbytes"] = calls["count"].astype(float) * item
    world = trace.world_size
    labels = [None if pd.isna(lab) else lab for lab in calls["label"]]
    groups = {lab: _group(lab, world) for lab in set(labels)}
    cols = ["group", "group_ranks", "group_size", "group_known"]
    parts = [groups[lab] for lab in labels]
    for n, col in enumerate(cols):
        calls[col] = [p[n] for p in parts]
    calls["group_size"] = calls["group_size"].astype(int)
    calls["group_known"] = calls["group_known"].astype(bool)
    calls["traced_us"] = calls["traced_us"].astype(float)
    return calls[SEQUENCE_COLUMNS]


def _fmt_call(rank: int, call: tuple | None, k: int) -> str:
    if call is None:
        return f"rank {rank} issued no call #{k}"
    op, count, dtype = call
    return f"rank {rank} {op} {'?' if count is None else count} {dtype or '?'}"


def first_disagreement(calls: pd.DataFrame) -> str | None:
    """Where the ranks' calls first differ: per step and group, each rank's list of (op, count,
    dtype) in order must be the same (point-to-point calls aside: the two ranks of a pair issue
    send and recv). None when they agree."""
    c = calls[~calls["op"].isin(POINT_TO_POINT)].sort_values(
        ["step", "rank", "index"], kind="stable"
    )
    ranks_read = set(c["rank"])
    for (step, group), g in c.groupby(["step", "group"], sort=True):
        members = sorted(ranks_read & set(g["group_ranks"].iloc[0])) or sorted(ranks_read)
        lists = {
            r: [
                (op, None if pd.isna(n) else int(n), d)
                for op, n, d in zip(sub["op"], sub["count"], sub["dtype"], strict=True)
            ]
            for r, sub in g.groupby("rank")
        }
        ref = members[0]
        want = lists.get(ref, [])
        for r in members[1:]:
            got = lists.get(r, [])
            for k in range(max(len(want), len(got))):
                a = want[k] if k < len(want) else None
                b = got[k] if k < len(got) else None
                if a != b:
                    return (
                        f"step {step}, group {group}, call #{k}: "
                        f"{_fmt_call(ref, a, k)}, {_fmt_call(r, b, k)}"
                    )
    return None


@dataclass
class JobSequence:
    """A job's communication sequence, as job_sequence read it from a folder of traces."""

    calls: pd.DataFrame  # SEQUENCE_COLUMNS, every rank read, the steps kept
    world_size: int
    ranks: list[int]  # ranks whose traces were read
    assumed_spmd: bool  # traces of only some ranks: the others assumed to issue the same calls
    steps: list[int]  # the steps kept
    notes: list[str] = field(default_factory=list)

    @property
    def ranks_needed(self) -> int:
        """Ranks a replay must launch: the highest rank of any call's group, plus one."""
        return 1 + max(max(r) for r in self.calls["group_ranks"] if len(r))


def _kept_steps(traces: list, steps: int | None, notes: list[str]) -> list[int]:
    if not any(len(step_windows(prepared(t))) for t in traces):
        notes.append("no ProfilerStep in the traces: each rank's whole trace is one step (-1)")
        return [-1]
    common = common_steps(traces)
    if steps is not None and steps < len(common):
        common = common[:steps]
    elif steps is not None and steps > len(common):
        notes.append(f"asked for {steps} steps: {len(common)} are in every rank's trace")
    return common


def job_sequence(trace_dir, steps: int | None = None) -> JobSequence:
    """Every rank's sequence of a folder of per-rank traces; ``steps=K`` keeps the first K
    profiler steps present in every rank's trace (None: all of them). Raises SequenceError
    (one line, naming the folder or file) for a folder without traces, a trace without any
    collective, or ranks whose sequences disagree (``first_disagreement``)."""
    folder = Path(trace_dir)
    if steps is not None and steps < 1:
        raise SequenceError(f"{folder}: steps must be at least 1, got {steps}")
    try:
        ts = load_trace_dir(folder)
    except TraceError as e:
        raise SequenceError(str(e)) from None
    notes = list(ts.problems)
    seqs = []
    for t in ts.traces:
        seq = trace_sequence(t)
        if seq.empty:
            raise SequenceError(f"{t.path}: no collective call in the trace")
        seqs.append(seq)
    kept = _kept_steps(ts.traces, steps, notes)
    if not kept:
        raise SequenceError(f"{folder}: no profiler step is in every rank's trace")
    calls = pd.concat(seqs, ignore_index=True)
    outside = int((calls["step"] < 0).sum())
    if outside and kept != [-1]:
        notes.append(f"{outside} calls outside every profiler step left out")
    partial = sorted(set(calls["step"]) - set(kept) - {-1})
    if partial and steps is None:
        notes.append(f"steps {_span(partial)} are not in every rank's trace: left out")
    calls = calls[calls["step"].isin(kept)].reset_index(drop=True)
    if calls.empty:
        raise SequenceError(f"{folder}: no collective call in the steps kept ({_span(kept)})")
    why = first_disagreement(calls)
    if why is not None:
        raise SequenceError(f"{folder}: the ranks' calls disagree at {why}")
    world = ts.traces[0].world_size
    ranks = [t.rank for t in ts.traces]
    calls = gloo_group(calls, ts.traces, ranks, world, notes)
    involved = {r for g in calls["group_ranks"] for r in g}
    others = sorted(involved - set(ranks))
    if others:
        notes.append(
            f"traces of ranks {_span(ranks)} of {world}: ranks {_span(others)} "
            "assumed to issue the same calls (SPMD)"
        )
    _group_notes(calls, ts.traces[0].backend, world, notes)
    return JobSequence(
        calls=calls,
        world_size=world,
        ranks=ranks,
        assumed_spmd=bool(others),
        steps=kept,
        notes=notes,
    )


def _group_notes(calls: pd.DataFrame, backend: str | None, world: int, notes: list) -> None:
    unknown = calls[~calls["group_known"] & (calls["group_size"] == world)]
    if len(unknown) and backend == "gloo":
        notes.append(f"gloo traces do not name the group: each call replayed on all {world} ranks")
    elif len(unknown):
        notes.append(
            f"{len(unknown)} calls name no process group (older PyTorch records "
            f"none): each replayed on all {world} ranks"
        )
    short = calls[calls["group_known"] & (calls["group_ranks"].map(len) < calls["group_size"])]
    for group in pd.unique(short["group"]):
        notes.append(
            f"group {group}: the trace lists only some of its ranks (Kineto cuts "
            "the list at 30, and they are not evenly spaced)"
        )
    p2p = int(calls["op"].isin(POINT_TO_POINT).sum())
    if p2p:
        notes.append(
            f"{p2p} point-to-point calls (send/recv): the trace does not say the "
            "peer; not compared across ranks"
        )


__all__ = ["JobSequence", "SequenceError", "first_disagreement", "job_sequence"]
