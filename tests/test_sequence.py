"""The communication sequence (bench/analysis/sequence.py): each rank's collective calls in
issue order, on HolisticTraceAnalysis's NCCL traces and on gloo traces of a real DDP sweep."""

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch.distributed as dist

from bench.analysis.collective_calls import collective_calls, collective_summary, wait_split
from bench.analysis.sequence import (
    SEQUENCE_COLUMNS,
    SequenceError,
    first_disagreement,
    job_sequence,
    trace_sequence,
)
from bench.analysis.trace import load_trace
from parallel_kernels.models import wide_mlp
from tests.kineto_writer import gpu_step_events, write_trace
from tests.shared_runs import DDP_SWEEP_MB

REPO = Path(__file__).resolve().parents[1]
HTA = REPO / "tests" / "data" / "hta"


@pytest.mark.unit
def test_nccl_calls_match_the_collectives_table_and_the_trace():
    trace = load_trace(HTA / "nccl_data.json.gz")
    seq = trace_sequence(trace)
    assert list(seq.columns) == SEQUENCE_COLUMNS
    # per op, calls and bytes as the analyser's collectives table counts them (from kernels)
    table = collective_summary(wait_split(collective_calls(trace)), trace.world_size)
    mine = seq.groupby("op").agg(calls=("op", "size"), bytes=("nbytes", "sum"))
    theirs = table.set_index("collective")[["calls", "bytes"]]
    assert mine.sort_index().to_dict() == theirs.sort_index().to_dict()
    assert mine["calls"].to_dict() == {"all_reduce": 15, "broadcast": 6}
    # the calls are the record_param_comms ops that launched a kernel, in order: the raw JSON's
    # sizes (its "wait" ops launch none)
    with gzip.open(HTA / "nccl_data.json.gz") as f:
        raw = json.load(f)["traceEvents"]
    rpc = sorted(
        (
            e
            for e in raw
            if e.get("name") == "record_param_comms" and e["args"]["Collective name"] != "wait"
        ),
        key=lambda e: e["ts"],
    )
    assert seq["count"].tolist() == [e["args"]["In msg nelems"] for e in rpc]
    assert seq["out_count"].tolist() == [e["args"]["Out msg nelems"] for e in rpc]
    assert (seq["group"] == "0").all() and seq["group_known"].all()
    assert set(seq["group_ranks"]) == {(0, 1)} and (seq["group_size"] == 2).all()
    assert set(seq.loc[seq["op"] == "all_reduce", "dtype"]) == {"float32"}
    assert seq.groupby("step")["index"].apply(list).to_dict() == {
        s: list(range(7)) for s in (4, 5, 6)
    }
    assert (seq["traced_us"] > 0).all() and seq["ts"].is_monotonic_increasing


# What the two sampled_rank traces hold, per step, read off their JSON: (op, count, dtype).
SAMPLED = {
    0: {
        551: [
            ("all_to_all", 384, "int64"),
            ("all_to_all", 419430400, "uint8"),
            ("all_reduce", 19618307, "float32"),
            ("all_reduce", 26955536, "float32"),
            ("all_gather", 16777216, "int8"),
        ],
        552: [
            ("all_to_all", 419430400, "uint8"),
            ("all_to_all", 2846720, "int32"),
            ("all_reduce", 26258430, "float32"),
            ("all_reduce", 5716654, "float32"),
            ("all_gather", 16777216, "int8"),
        ],
    },
    1: {
        551: [
            ("all_to_all", 339738624, "uint8"),
            ("all_to_all", 2846720, "int32"),
            ("all_reduce", 19618307, "float32"),
            ("all_reduce", 26258430, "float32"),
            ("all_gather", 16777216, "int8"),
        ],
        552: [
            ("all_to_all", 384, "int64"),
            ("all_reduce", 19618307, "float32"),
            ("all_to_all", 394073856, "uint8"),
            ("all_reduce", 5716654, "float32"),
            ("all_gather", 16777216, "int8"),
        ],
    },
}


@pytest.mark.unit
def test_sampled_ranks_sequences_and_where_they_first_differ(tmp_path):
    """Old PyTorch: record_param_comms says nothing, the nccl:<op> annotation does; the
    _allgather_base calls have no record_param_comms at all and are kept. The two ranks of the
    128-rank job issue different sequences from the first call of the first step."""
    calls = pd.concat(
        [trace_sequence(load_trace(HTA / f"sampled_rank-{r}.json.gz")) for r in (0, 1)],
        ignore_index=True,
    )
    got = {
        r: {
            s: list(zip(g["op"], g["count"], g["dtype"], strict=True))
            for s, g in sub.groupby("step")
        }
        for r, sub in calls.groupby("rank")
    }
    assert got == SAMPLED
    assert not calls["group_known"].any() and (calls["group_size"] == 128).all()
    assert set(calls["group_ranks"]) == {tuple(range(128))}
    expected = "step 551, group 0, call #0: rank 0 all_to_all 384 int64, rank 1 all_to_all "
    expected += "339738624 uint8"
    assert first_disagreement(calls) == expected
    for r in (0, 1):
        shutil.copy(HTA / f"sampled_rank-{r}.json.gz", tmp_path)
    with pytest.raises(SequenceError) as e:
        job_sequence(tmp_path)
    assert str(e.value) == f"{tmp_path}: the ranks' calls disagree at {expected}"


def ddp_buckets(cap_mb: float) -> list[int]:
    """Elements per DDP bucket of wide_mlp, by torch's own assignment: parameters in reverse
    order, as DDP rebuilds its buckets after the first step in the order gradients came."""
    params = list(wide_mlp().parameters())[::-1]
    groups, _ = dist._compute_bucket_assignment_by_size(params, [int(cap_mb * 1024 * 1024)])
    return [sum(params[i].numel() for i in g) for g in groups]


@pytest.mark.e2e
@pytest.mark.timeout(600)  # as test_timeline.py's: either may make the shared sweep
def test_gloo_ddp_issues_one_all_reduce_per_bucket(ddp_sweep):
    """PyTorch's DDP on gloo, two traced steps of each bucket size of the shared sweep
    (conftest.py's ``ddp_sweep``): its native points."""
    lines = (ddp_sweep / "points.jsonl").read_text().splitlines()
    points = [p for p in map(json.loads, lines) if p["impl"] == "native"]
    assert sorted(p["knobs"]["bucket_cap_mb"] for p in points) == list(DDP_SWEEP_MB)
    for point in points:
        seq = job_sequence(ddp_sweep / "traces" / point["id"])
        params = point["figures"]["params"]
        calls = seq.calls
        assert seq.ranks == [0, 1] and not seq.assumed_spmd and len(seq.steps) == 2
        assert set(calls["op"]) == {"all_reduce"} and set(calls["dtype"]) == {"float32"}
        assert not calls["group_known"].any() and set(calls["group_ranks"]) == {(0, 1)}
        assert "gloo traces do not name the group: each call replayed on all 2 ranks" in seq.notes
        assert first_disagreement(calls) is None  # the two ranks agree
        buckets = ddp_buckets(point["knobs"]["bucket_cap_mb"])
        for (_, _), g in calls.groupby(["rank", "step"]):
            assert g["count"].tolist() == buckets
            assert g["count"].sum() == params
            assert (g["nbytes"] == 4 * g["count"]).all()
        per_step = len(buckets)
        assert per_step == {1: 3, 25: 2, 100: 1}[point["knobs"]["bucket_cap_mb"]]
        if per_step == 1:
            assert calls["count"].tolist() == [params] * 4


@pytest.mark.unit
def test_first_disagreement_names_the_first_difference():
    def call(rank, index, op, count, dtype="float32", step=3, group="0"):
        return {
            "rank": rank,
            "step": step,
            "index": index,
            "op": op,
            "dtype": dtype,
            "count": count,
            "group": group,
            "group_ranks": (0, 1),
            "ts": float(index),
        }

    def first(calls):
        return first_disagreement(pd.DataFrame(calls))

    same = [call(r, i, "all_reduce", 1000) for r in (0, 1) for i in range(6)]
    assert first(same) is None
    head = "step 3, group 0, call #5: rank 0 all_reduce 1000 float32, "
    assert (
        first([*same[:-1], call(1, 5, "all_reduce", 999)]) == head + "rank 1 all_reduce 999 float32"
    )
    assert first(same[:-1]) == head + "rank 1 issued no call #5"
    # another group and step: compared apart; a send/recv pair is not a disagreement
    other = [
        *same,
        call(0, 6, "broadcast", 8, "int64", group="1"),
        call(1, 6, "broadcast", 8, "int32", group="1"),
        call(0, 0, "send", 4, step=4),
        call(1, 0, "recv", 4, step=4),
    ]
    assert (
        first(other)
        == "step 3, group 1, call #0: rank 0 broadcast 8 int64, rank 1 broadcast 8 int32"
    )


@pytest.mark.unit
def test_folder_errors_and_a_missing_rank(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SequenceError, match=f"^{empty}: no trace files"):
        job_sequence(empty)
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 100.0,
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 1.0,
            "dur": 50.0,
        },
    ]
    meta = {"distributedInfo": {"rank": 0, "world_size": 1, "backend": "gloo"}}
    path = write_trace(quiet / "rank0.1.pt.trace.json", events, meta)
    with pytest.raises(SequenceError) as e:
        job_sequence(quiet)
    assert str(e.value) == f"{path}: no collective call in the trace"
    # rank 0 of 2 alone: rank 1 assumed to issue the same calls; steps=2 keeps the first two
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(HTA / "nccl_data.json.gz", half)
    seq = job_sequence(half, steps=2)
    assert seq.world_size == 2 and seq.ranks == [0] and seq.assumed_spmd
    assert seq.steps == [4, 5] and set(seq.calls["step"]) == {4, 5} and len(seq.calls) == 14
    assert "traces of ranks 0 of 2: ranks 1 assumed to issue the same calls (SPMD)" in seq.notes
    assert job_sequence(half, steps=5).steps == [4, 5, 6]


@pytest.mark.unit
def test_nccl_kernels_without_a_record_are_calls_of_unknown_size(tmp_path):
    """A kernel whose launch is in no record_param_comms nor nccl:<op> stands for itself: the
    replay must not skip it, though the trace says neither its size nor its group."""
    meta = {"distributedInfo": {"rank": 0, "world_size": 4, "backend": "nccl"}}
    trace = load_trace(write_trace(tmp_path / "t.pt.trace.json", gpu_step_events(2, 8), meta))
    seq = trace_sequence(trace)
    assert seq["op"].tolist() == ["all_reduce"] * 4 and seq["step"].tolist() == [0, 0, 1, 1]
    assert seq["count"].isna().all() and not seq["group_known"].any()
    assert (seq["traced_us"] == 3.0).all()


@pytest.mark.unit
def test_gloo_spans_started_out_of_order_keep_the_order_they_were_issued(tmp_path):
    """gloo's two threads take calls first in, first out, but one descheduled between taking
    its call and starting its span lets the next call's span start first (a loaded machine
    traced DDP's buckets so on one rank). The ops that issued them, on the caller's thread, say
    the order; a span with no issuing op (no shapes recorded) keeps its own start."""

    def op(name, ts, dur, tid, dims, types):
        args = {"Input Dims": dims, "Input type": types}
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts,
                "dur": dur, "args": args}  # fmt: skip

    def span(name, ts, dur, tid, n):
        return {**op(name, ts, dur, tid, [[n]], ["float"]), "cat": "user_annotation"}

    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
            "ts": 0.0, "dur": 1000.0}  # fmt: skip
    events = [
        step,
        op("c10d::allreduce_", 10.0, 2.0, 1, [[[300]], [], []], ["TensorList", "", ""]),
        op("c10d::allreduce_", 20.0, 2.0, 1, [[[200]], [], []], ["TensorList", "", ""]),
        # an all-gather names its output first; its span lists the input
        op("c10d::_allgather_base_", 30.0, 2.0, 1, [[400], [200], []], ["float", "float", ""]),
        span("gloo:all_reduce", 60.0, 50.0, 8, 300),  # the first call's thread started late
        span("gloo:all_reduce", 40.0, 10.0, 9, 200),
        span("gloo:all_gather", 55.0, 10.0, 9, 200),
        span("gloo:broadcast", 50.0, 1.0, 9, 7),  # no issuing op: its own start
        # gloo runs FSDP's reduce-scatter as an all-reduce of its input
        op("c10d::_reduce_scatter_base_", 35.0, 2.0, 1, [[100], [200], []], ["float"] * 2 + [""]),
        span("gloo:all_reduce", 70.0, 5.0, 9, 200),
    ]
    meta = {"distributedInfo": {"rank": 0, "world_size": 2, "backend": "gloo"}}
    seq = trace_sequence(load_trace(write_trace(tmp_path / "t.pt.trace.json", events, meta)))
    assert seq["op"].tolist() == [*["all_reduce"] * 2, "all_gather", "all_reduce", "broadcast"]
    assert seq["count"].tolist() == [300, 200, 200, 200, 7]
    assert seq["traced_us"].tolist() == [50.0, 10.0, 10.0, 5.0, 1.0]
    assert seq["ts"].tolist() == [10.0, 20.0, 30.0, 35.0, 50.0]
